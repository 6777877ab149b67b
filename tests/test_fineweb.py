"""fineweb.py: slices and readers, tokenizers, shards and manifest at any --workers, reruns that
continue and repair, --overwrite, the hub offline, stop signals and dead workers, and the one-line
errors (in this process through fineweb.main; as a real process where the process is the point)."""

import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    PATIENCE,
    ROOT,
    child_env,
    command_of,
    default_signals,
    descendants,
    finish,
    group_left,
    main_error,
    one_line_error,
    output,
    run_program,
    start,
    wait_for,
)

import fineweb
import harness

EOT = 50256
WORDS = (
    "the of and a to in is was he for it with as his on be at by this had not are but "
    "from or have an they which one you were her all she there would their we him been "
    "has when who will more no if out so said what up its about into than them can only"
).split()


def make_docs(n, seed=0, words=(5, 60)):
    """n documents of sentences of random words, each with a paragraph break."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        body = " ".join(rng.choice(WORDS, rng.integers(*words)))
        tail = " ".join(rng.choice(WORDS, 5))
        docs.append(f"Doc {seed}-{i}: {body.capitalize()}.\n\n{tail}.")
    return docs


def write_txt(path, docs):
    path.write_text("\n\n\n".join(docs) + "\n")
    return path


def write_jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def write_parquet(path, docs, field="text", row_group_size=None):
    table = pa.table({field: docs, "id": list(range(len(docs)))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def gpt2_stream(docs):
    """tiktoken per document, <|endoftext|> before each, concatenated: a file's tokens."""
    enc = fineweb.get_tokenizer()
    ids = [t for d in docs for t in [EOT] + enc.encode_ordinary(d)]
    return np.array(ids, dtype=np.uint16)


def read_corpus(out_dir):
    """(manifest, the shards' tokens concatenated in manifest order)."""
    manifest = json.loads((Path(out_dir) / "manifest.json").read_text())
    arrays = [np.load(Path(out_dir) / s["file"]) for s in manifest["shards"]]
    for arr, shard in zip(arrays, manifest["shards"]):
        assert arr.dtype == np.uint16 and arr.ndim == 1 and len(arr) == shard["tokens"]
    return manifest, np.concatenate(arrays)


def files_of(directory):
    """{relative path: bytes} of every file under directory but the locks (empty files)."""
    root = Path(directory)
    locks = (".lock", ".readers.lock")
    paths = [p for p in root.rglob("*") if p.is_file() and p.name not in locks]
    return {str(p.relative_to(root)): p.read_bytes() for p in paths}


def run_main(*args):
    """fineweb.main in this process: returns the manifest."""
    return fineweb.main([str(a) for a in args])


def hub_env(tmp_path):
    """A real process's environment, offline, its hub cache in tmp_path."""
    return child_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """fineweb.main in this process gives back the signal handlers it took and ends its
    workers, however it ends."""
    handlers = [signal.getsignal(sig) for sig in fineweb.STOP_SIGNALS]
    yield
    assert [signal.getsignal(sig) for sig in fineweb.STOP_SIGNALS] == handlers
    assert not multiprocessing.active_children()


@pytest.fixture
def small_slices(monkeypatch):
    """Slices of a few hundred bytes: every file is read by many workers' jobs."""
    monkeypatch.setattr(fineweb, "SLICE_BYTES", 300)


# -----------------------------------------------------------------------------
# Documents and slices


def test_txt_documents_are_separated_by_two_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(
        b"\xef\xbb\xbf\n\nfirst doc line 1\nline 2\n\nsame doc after one blank line\n"
        b"\n  \t\n"  # a blank line and a whitespace-only one end the document
        b"second doc\r\n\r\n\r\n\r\n"  # CRLF, three blank lines
        b"third doc\n\n\n\n\n   \n\n\n"  # trailing whitespace only: no document
    )
    assert list(fineweb.read_documents(path)) == [
        "first doc line 1\nline 2\n\nsame doc after one blank line",
        "second doc",
        "third doc",
    ]


def reference_txt(path):
    """The .txt rule read line by line as a text file reads (universal newlines, a BOM dropped):
    a line of text after two blank ones starts a document."""
    docs = []
    lines = []
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            if line.strip() and len(lines) > 1 and not "".join(lines[-2:]).strip():
                docs.append("".join(lines).strip())
                lines = []
            lines.append(line)
    docs.append("".join(lines).strip())
    return [d for d in docs if d]


def random_txt(path, seed):
    """Lines of text, blank lines of all kinds, every line end, a BOM: the rule's corners."""
    rng = np.random.default_rng(seed)
    pieces = ["word and word", "é 日本 🤖", "", " ", "\t", "\u00a0", "\x0c", "\u3000 x"]
    ends = ["\n", "\r\n", "\r"]
    text = "\ufeff" if seed % 2 else ""
    for _ in range(600):
        text += pieces[rng.integers(len(pieces))] + ends[rng.integers(len(ends))]
    path.write_bytes(text.encode())
    return path


@pytest.mark.parametrize("slice_bytes", [40, 300, 2**20])
def test_slices_read_the_documents_of_the_whole_file(tmp_path, monkeypatch, slice_bytes):
    monkeypatch.setattr(fineweb, "SLICE_BYTES", slice_bytes)
    for seed in range(4):
        path = random_txt(tmp_path / f"{seed}.txt", seed)
        assert list(fineweb.read_documents(path)) == reference_txt(path)
    docs = make_docs(60, 1) + ["", " \n ", "last"]
    jsonl = write_jsonl(tmp_path / "d.jsonl", docs)
    assert list(fineweb.read_documents(jsonl)) == [d for d in docs if d.strip()]
    # rows: groups of 7 rows, and one group of many slices' bytes cut into row ranges
    parquet = write_parquet(tmp_path / "d.parquet", docs + [None] * 3, row_group_size=7)
    big = write_parquet(tmp_path / "big.parquet", docs * 5)
    assert list(fineweb.read_documents(parquet)) == [d for d in docs if d.strip()]
    assert list(fineweb.read_documents(big)) == [d for d in docs if d.strip()] * 5
    # the slices tile each file: bytes or rows, in order, none empty
    for path, end in [(jsonl, jsonl.stat().st_size), (big, len(docs) * 5)]:
        slices = list(fineweb.plan_slices(path, "text"))
        assert [s[1] for s in slices] == [0] + [s[2] for s in slices[:-1]]
        assert slices[-1][2] == end and all(s[1] < s[2] for s in slices)
        assert len(slices) > 1 or slice_bytes == 2**20


def test_input_txt_holds_one_document_per_play():
    docs = list(fineweb.read_documents(ROOT / "input.txt"))
    assert len(docs) == 8 and min(len(d) for d in docs) > 50_000
    assert all(d.splitlines()[2] == "by William Shakespeare" for d in docs)


def test_jsonl_and_parquet_read_their_text_field(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text(
        '{"text": " one ", "id": 1}\n\n{"text": ""}\n{"text": null}\n{"text": "two"}\n'
    )
    parquet = write_parquet(tmp_path / "b.parquet", ["three", None, " ", "four"] * 700, "body")
    assert list(fineweb.read_documents(jsonl)) == [" one ", "two"]  # as they are
    docs = list(fineweb.read_documents(parquet, "body"))
    assert docs == ["three", "four"] * 700  # across record batches of 1024 rows


GOOD = "".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(30))

# (file, its content, more flags, the one line's text); files are read in slices of 300 bytes,
# so line 31 and line 12 lie in a later slice than the first
BAD_INPUTS = [
    ("missing.txt", None, [], "missing.txt: no such .txt, .jsonl or .parquet file"),
    ("c.csv", "text\n", [], "c.csv: no such .txt, .jsonl or .parquet file"),
    ("c.jsonl", GOOD + '{"text": "cut\n', [], "c.jsonl:31: not a JSON object"),
    ("c.jsonl", '{"body": "x"}\n', [], "c.jsonl:1: not a JSON object with a 'text' field"),
    ("c.parquet", "parquet", ["--text_field", "body"], "no column 'body' (columns: text, id)"),
    ("c.parquet", b"PAR1 not really", [], "c.parquet: ArrowInvalid:"),
    ("c.txt", b"ok\n" * 11 + b"\xff\xfe\n", [], "c.txt:12: not UTF-8 (byte 0xff at offset 33)"),
    ("c.txt", "\n \n\n", [], "the first file holds no documents"),
    ("c.txt", "text", ["--out_dir", "mine"], "holds files that are not fineweb.py's"),
]


@pytest.mark.parametrize(
    "name, content, extra, message", BAD_INPUTS, ids=[c[3] for c in BAD_INPUTS]
)
def test_bad_input_is_one_line(tmp_path, small_slices, name, content, extra, message):
    path = tmp_path / name
    if content == "parquet":
        write_parquet(path, ["x"])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    # a directory of the user's, with a manifest.json of theirs
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "manifest.json").write_text('{"mine": true}')
    out = tmp_path / "out"
    extra = [str(tmp_path / a) if a == "mine" else a for a in extra]
    line = main_error(fineweb.main, ["--local", path, "--out_dir", out, "--workers", 2, *extra])
    assert line.startswith("fineweb.py: error: ") and "\n" not in line and message in line
    assert not list(out.glob("*.npy")) and not (out / "manifest.json").exists()
    assert files_of(tmp_path / "mine") == {"manifest.json": b'{"mine": true}'}


def test_the_command_lines_errors_are_one_line_on_stderr(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text(GOOD * 2000 + "{\n")  # line 60,001, in a later slice than the first
    cpus = len(os.sched_getaffinity(0))
    cases = [
        (["--local", bad, "--out_dir", tmp_path / "out"], "c.jsonl:60001: not a JSON object"),
        (["--local", bad, "--shard_size", 0], "--shard_size 0 must be between 1 and 1,000,000,000"),
        (["--local", bad, "--shard_size", 10**10], "tokens are held in memory until it is written"),
        (["--local", bad, "--workers", 100_000], f"--workers 100,000 must be between 1 and {cpus}"),
        (["--local", bad, "--workers", "two"], "argument --workers: invalid int value"),
        (["--local", bad, "--out", "x"], "unrecognized arguments: --out"),
        (["--tokenizer", "char"], "--tokenizer char needs --local files"),
    ]
    for args, message in cases:
        proc = run_program("fineweb.py", args)
        one_line_error(proc.returncode, proc.stderr, "fineweb.py", message)
    assert not list((tmp_path / "out").glob("*.npy"))


def test_prefix_is_a_name_never_a_path(tmp_path):
    # a file of the user's where --prefix ../victim would put the val shard stays as it was
    text = write_txt(tmp_path / "a.txt", make_docs(5))
    victim = tmp_path / "d" / "victim_val_0000_0000.npy"
    victim.parent.mkdir()
    victim.write_text("mine")
    for prefix in ["../victim", "a/b"]:
        args = ["--local", text, "--prefix", prefix, "--out_dir", tmp_path / "d" / "sub"]
        proc = run_program("fineweb.py", args)
        one_line_error(proc.returncode, proc.stderr, "fineweb.py", f"--prefix {prefix!r}")
    assert victim.read_text() == "mine"
    assert files_of(tmp_path / "d") == {"victim_val_0000_0000.npy": b"mine"}


# -----------------------------------------------------------------------------
# Tokenizers


def test_gpt2_tokenizer_is_the_vendored_vocabulary(tmp_path):
    enc = fineweb.get_tokenizer()
    assert enc.encode("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    assert (enc.eot_token, enc.n_vocab) == (EOT, 50257)
    assert enc.decode(enc.encode("naïve café — 日本語 🤖\n")) == "naïve café — 日本語 🤖\n"
    bad = tmp_path / "gpt2.tiktoken"
    bad.write_bytes(fineweb.GPT2_VOCAB_FILE.read_bytes().replace(b"IQ==", b"Ig==", 1))
    with pytest.raises(ValueError, match="not the GPT-2 vocabulary"):
        fineweb.get_tokenizer(bad)


def test_char_tokenizer_and_manifest_round_trip():
    tok = fineweb.CharTokenizer("\n ab")
    assert (tok.name, tok.n_vocab, tok.eot_token) == ("char", 4, None)
    assert (
        tok.encode("ab a\n", allowed_special="all")
        == [2, 3, 1, 2, 0]
        == tok.encode_ordinary("ab a\n")
    )
    assert tok.decode(np.array([2, 3, 0], np.uint16)) == "ab\n"
    with pytest.raises(ValueError, match="character 'c' is not in the vocabulary"):
        tok.encode("abc")
    with pytest.raises(ValueError, match="sorted, unique"):
        fineweb.CharTokenizer("ba")
    info = fineweb.tokenizer_info(tok)
    assert info == {"tokenizer": "char", "vocab": "\n ab"}
    assert fineweb.tokenizer_from_manifest(info).chars == "\n ab"
    gpt2 = fineweb.get_tokenizer()
    assert fineweb.tokenizer_from_manifest(fineweb.tokenizer_info(gpt2)) is gpt2
    assert fineweb.tokenizer_from_manifest({}) is gpt2
    with pytest.raises(ValueError, match="expected 'gpt2', or 'char'"):
        fineweb.tokenizer_from_manifest({"tokenizer": "char"})


def test_token_byte_lengths():
    gpt2 = fineweb.get_tokenizer()
    lengths = fineweb.token_byte_lengths(gpt2)
    assert lengths.dtype == np.int64 and len(lengths) == 50257 and lengths[EOT] == 0
    ids = gpt2.encode("naïve café — 日本語 🤖")
    assert lengths[ids].sum() == len("naïve café — 日本語 🤖".encode())
    chars = fineweb.token_byte_lengths(fineweb.CharTokenizer("\naé日"))
    assert chars.tolist() == [1, 1, 2, 3]


# -----------------------------------------------------------------------------
# Shards, manifest, the val split


def test_shards_are_the_same_at_any_workers_and_those_of_the_reference(
    tmp_path, monkeypatch, small_slices
):
    monkeypatch.setattr(fineweb, "usable_cpus", lambda: 3)  # 3 workers on any machine
    # three kinds of files, each read in many slices; documents span shards of 700 tokens
    docs = [make_docs(40, seed) for seed in range(3)]
    inputs = [
        write_txt(tmp_path / "a.txt", docs[0]),
        write_jsonl(tmp_path / "b.jsonl", docs[1]),
        write_parquet(tmp_path / "c.parquet", docs[2], row_group_size=3),
    ]
    corpora = []
    for workers in (1, 2, 3):
        out = tmp_path / f"out{workers}"
        manifest = run_main(
            "--local", *inputs, "--out_dir", out, "--shard_size", 700, "--workers", workers
        )
        assert manifest == fineweb.load_corpus(out)
        corpora.append(files_of(out))
    assert corpora[0] == corpora[1] == corpora[2]
    # each file on its own: tiktoken per document, concatenated, cut every 700 tokens
    shards = manifest["shards"]
    for index, file_docs in enumerate(docs):
        stream = gpt2_stream(file_docs)
        assert len(stream) > 700
        mine = [s for s in shards if s["file"].split("_")[2] == f"{index:04d}"]
        assert [s["file"].split("_", 1)[1] for s in mine] == [
            f"{'val' if index == part == 0 else 'train'}_{index:04d}_{part:04d}.npy"
            for part in range(-(-len(stream) // 700))
        ]
        for part, shard in enumerate(mine):
            tokens = np.load(out / shard["file"])
            assert np.array_equal(tokens, stream[part * 700 : (part + 1) * 700])
            assert shard["tokens"] == len(tokens) and shard["split"] == (
                "val" if index == part == 0 else "train"
            )
    lines = []
    for s in shards:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
        assert s["bytes"] == (out / s["file"]).stat().st_size
        lines.append(f"{s['file']} {s['tokens']} {s['sha256']}")
    assert manifest["fingerprint"] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
    assert (manifest["tokenizer"], manifest["vocab"], manifest["dataset"]) == (
        "gpt2",
        None,
        "local",
    )
    assert manifest["tokens"] == sum(s["tokens"] for s in shards)
    records = sorted((out / ".fineweb").glob("*.done.json"))
    assert [r.name for r in records] == ["0000.done.json", "0001.done.json", "0002.done.json"]
    record = json.loads(records[1].read_text())
    assert record["source"] == str(inputs[1]) and record["size"] == inputs[1].stat().st_size
    assert record["settings"]["shard_size"] == 700


def test_input_txt_val_is_the_first_play(tmp_path):
    plays = list(fineweb.read_documents(ROOT / "input.txt"))
    manifest = run_main("--local", ROOT / "input.txt", "--out_dir", tmp_path / "gpt2")
    assert [s["file"] for s in manifest["shards"]] == [
        "edufineweb_val_0000_0000.npy",
        "edufineweb_train_0000_0001.npy",
    ]
    val = np.load(tmp_path / "gpt2" / manifest["shards"][0]["file"])
    assert np.array_equal(val, gpt2_stream(plays[:1]))  # ends where the first play ends
    assert 0.05 <= len(val) / manifest["tokens"] <= 0.2
    # the bytes of the earlier fineweb.py (one process reading, a pool encoding documents)
    digests = [s["sha256"][:16] for s in manifest["shards"]]
    assert digests == ["7a756ad351abc096", "955c2300c3dd94ba"]
    out = tmp_path / "char"
    manifest = run_main("--local", ROOT / "input.txt", "--tokenizer", "char", "--out_dir", out)
    assert manifest["vocab_size"] == len(manifest["vocab"]) == 77 and manifest["eot_token"] is None
    enc = fineweb.tokenizer_from_manifest(manifest)
    _, ids = read_corpus(out)
    assert enc.decode(ids) == "".join(play + "\n\n" for play in plays)
    assert manifest["shards"][0]["tokens"] == len(plays[0]) + 2


def test_small_val_size_rule():
    # the document start nearest 10%, if one lies between 5% and 20%
    assert fineweb.small_val_size(1000, [0, 30, 120, 190, 600]) == 120
    assert fineweb.small_val_size(1000, [0, 199, 201]) == 199
    # none there: 10%, mid-document
    assert fineweb.small_val_size(1000, [0, 40, 201, 700]) == 100
    # at least one token on each side
    assert fineweb.small_val_size(2, [0]) == 1
    assert fineweb.small_val_size(3, [0, 1]) == 1


def test_first_file_of_one_shard_is_split_and_others_are_train(tmp_path, small_slices):
    first = make_docs(30, 1)
    second = make_docs(30, 2)
    inputs = [write_jsonl(tmp_path / "a.jsonl", first), write_jsonl(tmp_path / "b.jsonl", second)]
    manifest = run_main("--local", *inputs, "--out_dir", tmp_path / "out", "--workers", 2)
    assert [s["split"] for s in manifest["shards"]] == ["val", "train", "train"]
    val = manifest["shards"][0]["tokens"]
    lengths = [len(gpt2_stream([d])) for d in first]
    assert val in np.cumsum(lengths)  # at a document boundary
    assert 0.05 <= val / sum(lengths) <= 0.2


def test_char_vocabulary_of_all_files_and_its_limit(tmp_path, small_slices):
    a = write_txt(tmp_path / "a.txt", ["héllo wörld", "zz top"])
    b = write_jsonl(tmp_path / "b.jsonl", ["日本 語", "ok\tok"])
    manifest = run_main("--local", a, b, "--tokenizer", "char", "--out_dir", tmp_path / "out")
    assert manifest["vocab"] == "".join(sorted(set("héllo wörld" + "zz top日本 語ok\tok\n")))
    _, ids = read_corpus(tmp_path / "out")
    text = fineweb.CharTokenizer(manifest["vocab"]).decode(ids)
    assert text == "héllo wörld\n\nzz top\n\n日本 語\n\nok\tok\n\n"
    many = tmp_path / "many.txt"
    many.write_text("".join(chr(c) for c in range(0x20000, 0x20000 + 70_000)))
    args = ["--local", many, "--tokenizer", "char", "--out_dir", tmp_path / "x"]
    assert "distinct characters, more than the 65,536 ids" in main_error(fineweb.main, args)
    assert not (tmp_path / "x").exists()


def test_verify_shard(tmp_path):
    tokens = np.arange(0, 50257, 7, dtype=np.uint16)
    path = tmp_path / "s.npy"
    np.save(path, tokens)
    entry = {"tokens": len(tokens), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    assert fineweb.verify_shard(path, entry, 50257) is None
    assert "holds token id 50253, not below the vocabulary's 50000" in fineweb.verify_shard(
        path, {**entry, "sha256": None}, 50000
    )
    assert "holds 7,180 tokens, not the 7,181 recorded" in fineweb.verify_shard(
        path, {**entry, "tokens": 7181}, 50257
    )
    data = path.read_bytes()
    path.write_bytes(data[:-1] + b"\x01")  # the same size
    assert fineweb.verify_shard(path, entry, 50257) == (
        f"{path} changed since fineweb.py wrote it (its sha256 differs)"
    )
    path.write_bytes(data[:-2])
    assert fineweb.verify_shard(path, entry, 50257) == (
        f"{path} changed since fineweb.py wrote it (14,486 bytes, expected 14,488)"
    )
    np.save(path, tokens.astype(np.float32))
    assert "float32 array" in fineweb.verify_shard(path, entry, 50257)
    path.unlink()
    assert fineweb.verify_shard(path, entry, 50257) == f"{path} is missing"
    os.mkfifo(path)  # never opened: it would block for good
    assert fineweb.verify_shard(path, entry, 50257) == f"{path} is not a regular file"


def shard_of(root, n):
    """The n-th shard file the manifest in root lists."""
    return root / json.loads((root / "manifest.json").read_text())["shards"][n]["file"]


def damage(root, how):
    """root's corpus damaged in one way; returns the file the error must name."""
    manifest = root / "manifest.json"
    data = json.loads(manifest.read_text())
    if how == "truncated manifest":
        manifest.write_text(manifest.read_text()[:100])
    elif how == "a list":
        manifest.write_text("[1, 2]")
    elif how == "no shards":
        manifest.write_text(json.dumps({k: v for k, v in data.items() if k != "shards"}))
    elif how == "tokens as text":
        data["shards"][1]["tokens"] = "12"
        manifest.write_text(json.dumps(data))
    elif how == "a path as a shard":
        data["shards"][1]["file"] = "../elsewhere.npy"
        manifest.write_text(json.dumps(data))
    elif how == "a shard cut short":
        shard = shard_of(root, 1)
        shard.write_bytes(shard.read_bytes()[:-2])
        return shard
    elif how == "a FIFO shard":
        shard = shard_of(root, 1)
        shard.unlink()
        os.mkfifo(shard)
        return shard
    elif how == "a missing shard":
        shard = shard_of(root, 1)
        shard.unlink()
        return shard
    return manifest


# (what is damaged, the one line's text)
DAMAGED_CORPORA = [
    ("truncated manifest", "is damaged (JSONDecodeError: "),
    ("a list", "is damaged (a JSON list, not an object)"),
    ("no shards", "is damaged (no list of shards)"),
    ("tokens as text", "is damaged (shard edufineweb_train_0000_0001.npy: its tokens are not"),
    ("a path as a shard", "is damaged (shard '../elsewhere.npy' is not a .npy file name)"),
    ("a shard cut short", "changed since fineweb.py wrote it (2,126 bytes, expected 2,128)"),
    ("a FIFO shard", "is not a regular file; rerun fineweb.py"),
    ("a missing shard", "is missing; rerun fineweb.py"),
]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished corpus of shards of 1,000 tokens."""
    root = tmp_path_factory.mktemp("finished")
    docs = write_jsonl(root / "docs.jsonl", make_docs(100, 3))
    run_main("--local", docs, "--out_dir", root / "out", "--shard_size", 1000, "--workers", 1)
    return root / "out"


@pytest.mark.parametrize("how, message", DAMAGED_CORPORA, ids=[c[0] for c in DAMAGED_CORPORA])
def test_load_corpus_of_a_damaged_corpus_is_one_line(tmp_path, finished, how, message):
    root = tmp_path / "out"
    shutil.copytree(finished, root)
    named = damage(root, how)
    with pytest.raises(ValueError) as error:
        fineweb.load_corpus(root)
    line = str(error.value)
    assert "\n" not in line and line.startswith(str(named)) and message in line
    assert "rerun" in line and "fineweb.py" in line


def test_load_corpus_of_build_nanogpts_shards(tmp_path):
    with pytest.raises(ValueError, match=f"^no shards in {tmp_path / 'missing'}; run fineweb.py$"):
        fineweb.load_corpus(tmp_path / "missing")
    nano = tmp_path / "nano"
    nano.mkdir()
    np.save(nano / "edufineweb_val_000000.npy", np.arange(10, dtype=np.uint16))
    np.save(nano / "edufineweb_train_000001.npy", np.arange(20, dtype=np.uint16))
    manifest = fineweb.load_corpus(nano)
    assert [(s["file"], s["split"], s["tokens"]) for s in manifest["shards"]] == [
        ("edufineweb_val_000000.npy", "val", 10),
        ("edufineweb_train_000001.npy", "train", 20),
    ]
    assert (manifest["tokenizer"], manifest["dataset"]) == ("gpt2", None)
    assert manifest["note"] and len(manifest["fingerprint"]) == 64
    shard = nano / "edufineweb_train_000001.npy"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"is cut short \(165 bytes, expected 168\); make it"):
        fineweb.load_corpus(nano)
    shard.write_bytes(b"")
    with pytest.raises(ValueError, match=f"^{shard} is not a .npy shard .*; make it again"):
        fineweb.load_corpus(nano)
    (nano / ".fineweb").mkdir()  # fineweb.py's, without its manifest yet
    with pytest.raises(ValueError, match="is unfinished: rerun the same fineweb.py command"):
        fineweb.load_corpus(nano)


# What is not a regular file where fineweb.py reads one: the file it becomes (a FIFO, or a link
# to a device), and what the run says. Never opened (a FIFO blocks its reader for good, a device
# never ends): an input or the lock is refused; fineweb.py's own files are made again.
NOT_FILES = [
    ("an input", "fineweb.py: error: IN: no such .txt, .jsonl or .parquet file"),
    ("a device input", "fineweb.py: error: IN: no such .txt, .jsonl or .parquet file"),
    ("the lock", "fineweb.py: error: OUT/.lock is not a regular file; remove it"),
    ("the manifest", "OUT/manifest.json is damaged (OUT/manifest.json is not a regular file)"),
    ("a done-record", "OUT/.fineweb/0000.done.json is damaged (OUT/.fineweb/0000.done.json is"),
    ("a shard", "OUT/edufineweb_train_0000_0001.npy is not a regular file: tokenising IN again"),
]


@pytest.mark.parametrize("what, message", NOT_FILES, ids=[c[0] for c in NOT_FILES])
def test_what_is_not_a_regular_file_is_never_opened(tmp_path, finished, capsys, what, message):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    source = fineweb.load_corpus(out)["sources"][0]
    args = ["--local", source, "--out_dir", out, "--shard_size", 1000, "--workers", 1]
    paths = {
        "an input": tmp_path / "in.jsonl",
        "a device input": tmp_path / "in.jsonl",
        "the lock": out / ".lock",
        "the manifest": out / "manifest.json",
        "a done-record": out / ".fineweb" / "0000.done.json",
        "a shard": out / "edufineweb_train_0000_0001.npy",
    }
    path = paths[what]
    path.unlink(missing_ok=True)
    if what == "a device input":
        path.symlink_to("/dev/zero")
    else:
        os.mkfifo(path)
    if what.endswith("input"):
        args[1] = path
    message = message.replace("OUT", str(out)).replace("IN", str(args[1]))
    if message.startswith("fineweb.py: error: "):
        assert main_error(fineweb.main, args).startswith(message)
        return
    capsys.readouterr()
    run_main(*args)
    assert message in capsys.readouterr().out
    assert files_of(out) == files_of(finished)


def test_a_lock_or_a_temporary_that_is_a_link_writes_into_no_other_file(tmp_path):
    # a lock's holder writes its pid into it, a write_atomic its bytes into the temporary: a
    # link at either name would take them into the file it points to
    mine = tmp_path / "mine.txt"
    mine.write_text("my notes")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(mine)
    a = write_txt(tmp_path / "a.txt", make_docs(5))
    error = main_error(fineweb.main, ["--local", a, "--out_dir", out])
    assert (
        error
        == f"fineweb.py: error: {out / '.lock'} is a link; remove it (a lock file has its name)"
    )
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / ".lock").symlink_to(mine)
    with pytest.raises(ValueError, match="is a link; remove it"):
        harness.lock_log_dir(log_dir, print)
    (out / ".record.json.tmp").symlink_to(mine)
    fineweb.write_atomic(out / "record.json", lambda f: f.write(b"{}"))
    assert (out / "record.json").read_bytes() == b"{}"
    assert mine.read_text() == "my notes" and not (out / ".record.json.tmp").exists()


# -----------------------------------------------------------------------------
# Reruns: a finished corpus, other settings, changed files


def test_rerun_is_a_no_op_and_other_settings_are_refused(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(30, 1))
    b = write_jsonl(tmp_path / "b.jsonl", make_docs(30, 2))
    out = tmp_path / "out"
    args = ["--local", a, b, "--out_dir", out, "--shard_size", 400, "--workers", 2]
    run_main(*args)
    before = files_of(out)
    capsys.readouterr()
    run_main(*args[:-1], 1)  # --workers may differ
    assert "finished already, its shards verified" in capsys.readouterr().out
    others = [
        ["--shard_size", 300],
        ["--tokenizer", "char"],
        ["--prefix", "other"],
        ["--text_field", "id"],
        ["--dataset_name", "mine"],
    ]
    for other in others:
        message = main_error(fineweb.main, ["--local", a, b, "--out_dir", out, *other])
        assert message.startswith(f"fineweb.py: error: {out} holds a corpus made with another")
        assert message.endswith("; use --overwrite to rebuild, or another --out_dir")
    message = main_error(fineweb.main, ["--local", a, "--out_dir", out, "--shard_size", 400])
    assert "another sources" in message
    assert files_of(out) == before
    os.utime(a, ns=(0, 10**18))
    assert f"{a} changed since it was tokenised; use --overwrite" in main_error(fineweb.main, args)


def test_a_rerun_makes_again_the_files_whose_shards_or_records_changed(tmp_path, capsys):
    inputs = [write_jsonl(tmp_path / f"{i}.jsonl", make_docs(30, i)) for i in range(3)]
    out = tmp_path / "out"
    args = ["--local", *inputs, "--out_dir", out, "--shard_size", 400, "--workers", 2]
    run_main(*args)
    before = files_of(out)
    # a byte of a shard of file 1 changed, the size the same; a shard of file 2 gone
    changed = out / "edufineweb_train_0001_0002.npy"
    data = bytearray(changed.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(data)
    (out / "edufineweb_train_0002_0000.npy").unlink()
    capsys.readouterr()
    run_main(*args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        f"{changed} changed since fineweb.py wrote it (its sha256 differs): "
        f"tokenising {inputs[1]} again",
        f"{out / 'edufineweb_train_0002_0000.npy'} is missing: tokenising {inputs[2]} again",
    ]
    assert lines[2].startswith("2/3 ") and lines[3].startswith("3/3 ")
    assert files_of(out) == before
    # a damaged done-record and manifest: the file and the manifest are made again
    (out / ".fineweb" / "0000.done.json").write_text('{"source": ')
    (out / "manifest.json").write_text("[]")
    with pytest.raises(ValueError, match="manifest.json is damaged"):
        fineweb.load_corpus(out)
    run_main(*args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(
        "manifest.json is damaged (a JSON list, not an object); writing it again"
    )
    assert "0000.done.json is damaged (JSONDecodeError: " in lines[1]
    assert lines[2].startswith("1/3 ")
    assert files_of(out) == before


def test_a_done_record_names_only_fineweb_pys_shards(tmp_path, capsys):
    # a done-record edited to name a file of the user's in out_dir: the record is damaged (its
    # file is tokenised again), and --overwrite's swap, which deletes the old corpus's shards by
    # the records' names, leaves the user's file alone
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(30, 1))
    out = tmp_path / "out"
    args = ["--local", a, "--out_dir", out, "--workers", 1]
    run_main(*args, "--shard_size", 400)
    (out / "mine.npy").write_bytes(b"mine")
    record = out / ".fineweb" / "0000.done.json"
    edited = json.loads(record.read_text())
    edited["shards"][1]["file"] = "mine.npy"
    record.write_text(json.dumps(edited))
    capsys.readouterr()
    run_main(*args, "--shard_size", 400)
    assert "0000.done.json is damaged (shard mine.npy is not the name of part 1 of file 0)" in (
        capsys.readouterr().out
    )
    record.write_text(json.dumps(edited))
    run_main(*args, "--shard_size", 500, "--overwrite")
    assert (out / "mine.npy").read_bytes() == b"mine"
    assert fineweb.load_corpus(out)["shard_size"] == 500


def test_more_shards_than_files_it_may_open(tmp_path):
    # each file fineweb.py opens is closed once read or written: with 64 files open at most, a
    # corpus of some 190 shards builds, and a rerun verifies every shard
    text = write_txt(tmp_path / "t.txt", make_docs(60, 2))
    args = ["--local", text, "--tokenizer", "char", "--shard_size", 50]
    args += ["--out_dir", tmp_path / "o"]

    def few_files():
        default_signals()
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    for _ in range(2):
        proc = run_program("fineweb.py", args, preexec_fn=few_files)
        assert proc.returncode == 0, proc.stderr
    assert "finished already, its shards verified" in proc.stdout
    assert len(fineweb.load_corpus(tmp_path / "o")["shards"]) > 2 * 64


def test_a_failed_write_names_its_file_and_a_failed_stdout_ends_only_the_printing(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(5))
    out = tmp_path / "a.jsonl" / "out"  # its directory cannot be made
    message = main_error(fineweb.main, ["--local", a, "--out_dir", out])
    assert message == f"fineweb.py: error: cannot write {out}: Not a directory"
    # stdout a pipe nobody reads any more
    read, write = os.pipe()
    os.close(read)
    args = ["--local", a, "--out_dir", tmp_path / "out"]
    pipes = dict(stdout=write, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT)
    proc = subprocess.run(command_of("fineweb.py", args), timeout=PATIENCE, **pipes)
    os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert fineweb.load_corpus(tmp_path / "out")["sources"] == [str(a)]


def test_one_run_per_out_dir(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(5))
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        message = main_error(fineweb.main, ["--local", a, "--out_dir", out])
    assert message == f"fineweb.py: error: another fineweb.py run is writing {out}"


WAIT = "import sys, fineweb; fineweb.main(sys.argv[1:], wait=True)"  # as train_gpt2.py calls it


def test_with_wait_a_run_waits_for_another_then_the_corpus_is_the_command_lines(tmp_path):
    # two processes make one corpus at once, both waiting for a run of a third's: one makes it,
    # the other finds it finished; both end well, with the bytes of the command line's corpus
    docs = write_txt(tmp_path / "docs.txt", make_docs(300, 5))
    args = ["--local", docs, "--tokenizer", "char", "--workers", 1]
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        procs = [start([sys.executable, "-c", WAIT], [*args, "--out_dir", out]) for _ in "ab"]
        for proc in procs:
            waiting = f"waiting for another fineweb.py run writing {out}\n"
            wait_for(lambda: output(proc)[0] == waiting, proc)
    ends = [finish(proc) for proc in procs]
    assert [end[0] for end in ends] == [0, 0], ends
    verified = ["finished already, its shards verified" in end[1] for end in ends]
    assert sorted(verified) == [False, True]  # one made it, the other found it made
    cli = run_program("fineweb.py", [*args, "--out_dir", tmp_path / "cli"])
    assert cli.returncode == 0, cli.stderr
    assert files_of(out) == files_of(tmp_path / "cli")


def test_a_filesystem_without_locks_is_a_warning(tmp_path, monkeypatch, capsys):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fineweb.fcntl, "flock", no_locks)
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(5))
    run_main("--local", a, "--out_dir", tmp_path / "out", "--workers", 1)
    out = capsys.readouterr().out
    assert f"warning: {tmp_path / 'out'} has no file locks; run one fineweb.py at a time" in out
    assert fineweb.load_corpus(tmp_path / "out")["tokens"] > 0


# -----------------------------------------------------------------------------
# --overwrite


def swap_cut_short_after(monkeypatch, renames):
    """swap_in stops (as a kill would) after `renames` of its renames."""
    real_swap = fineweb.swap_in
    real_replace = os.replace

    def swap(*args):
        calls = []

        def replace(src, dst):
            if len(calls) == renames:
                raise KeyboardInterrupt("SIGKILL")
            calls.append(src)
            real_replace(src, dst)

        monkeypatch.setattr(fineweb.os, "replace", replace)
        try:
            real_swap(*args)
        finally:
            monkeypatch.setattr(fineweb.os, "replace", real_replace)

    monkeypatch.setattr(fineweb, "swap_in", swap)


@pytest.mark.parametrize("renames", [0, 1, 3, 5])
def test_overwrite_swap_cut_short_is_completed_by_the_next_run(tmp_path, monkeypatch, renames):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(40, 1))
    b = write_jsonl(tmp_path / "b.jsonl", make_docs(10, 2))
    out = tmp_path / "out"
    run_main("--local", a, b, "--out_dir", out, "--shard_size", 300, "--workers", 1)
    (out / "notes.txt").write_text("mine")
    new = ["--local", a, "--shard_size", 500, "--workers", 1]
    run_main(*new, "--out_dir", tmp_path / "ref")
    swap_cut_short_after(monkeypatch, renames)
    message = main_error(fineweb.main, [*new, "--out_dir", out, "--overwrite"])
    assert "stopped (SIGKILL)" in message
    monkeypatch.undo()
    if renames:
        with pytest.raises(ValueError, match="is unfinished"):
            fineweb.load_corpus(out)
    run_main(*new, "--out_dir", out)  # any run on out_dir completes the swap
    assert files_of(out) == {**files_of(tmp_path / "ref"), "notes.txt": b"mine"}


def test_a_failed_overwrite_leaves_the_old_corpus_as_it_was(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(20, 1))
    out = tmp_path / "out"
    run_main("--local", a, "--out_dir", out, "--workers", 1)
    old = files_of(out)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    args = ["--local", a, bad, "--out_dir", out, "--overwrite", "--workers", 1]
    assert main_error(fineweb.main, args).startswith(
        f"fineweb.py: error: {bad}:2: not a JSON object"
    )
    now = {k: v for k, v in files_of(out).items() if not k.startswith(".fineweb/staging/")}
    assert now == old and fineweb.load_corpus(out)["sources"] == [str(a)]


# -----------------------------------------------------------------------------
# Stop signals and workers


def signal_at_shard(monkeypatch, n, sig=signal.SIGTERM):
    """A stop signal to this process as fineweb.py writes its n-th shard (a signal arrives
    anywhere; the handler only records it)."""
    real_save = fineweb.save_shard
    calls = []

    def save(*args):
        calls.append(args)
        if len(calls) == n:
            signal.raise_signal(sig)
        real_save(*args)

    monkeypatch.setattr(fineweb, "save_shard", save)


def test_a_stop_ends_the_run_between_slices_and_the_same_command_continues(
    tmp_path, monkeypatch, small_slices
):
    inputs = [write_jsonl(tmp_path / f"{i}.jsonl", make_docs(40, i)) for i in range(3)]
    args = ["--local", *inputs, "--shard_size", 500, "--workers", 2]
    ref = tmp_path / "ref"
    run_main(*args, "--out_dir", ref)
    whole = files_of(ref)
    out = tmp_path / "out"
    signal_at_shard(monkeypatch, 5)  # inside file 1
    message = main_error(fineweb.main, [*args, "--out_dir", out])
    assert message == (
        "fineweb.py: stopped (SIGTERM); 1 of 3 files done and kept; "
        "run the same command to continue"
    )
    with pytest.raises(ValueError, match="is unfinished"):
        fineweb.load_corpus(out)
    # a stopped --overwrite leaves the old corpus as it was
    signal_at_shard(monkeypatch, 3, signal.SIGUSR1)
    message = main_error(fineweb.main, [*args, "--out_dir", ref, "--overwrite"])
    assert message.startswith("fineweb.py: stopped (SIGUSR1); 0 of 3 files done and kept")
    monkeypatch.undo()
    kept = {k: v for k, v in files_of(ref).items() if not k.startswith(".fineweb/staging/")}
    assert kept == whole
    run_main(*args, "--out_dir", out)
    assert files_of(out) == whole


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """4 files of two slices each, and the corpus of an uninterrupted run."""
    d = tmp_path_factory.mktemp("four")
    inputs = [write_jsonl(d / f"f{i}.jsonl", make_docs(2400, i, (80, 120))) for i in range(4)]
    args = ["--local", *inputs, "--shard_size", 200_000, "--workers", 2]
    run_main(*args, "--out_dir", d / "ref")
    return args, d / "ref"


def start_fineweb(args, **popen):
    """fineweb.py as a real process, in a process group of its own (with its workers)."""
    return start("fineweb.py", args, start_new_session=True, **popen)


def mid_file(out, proc, index=1):
    """Wait until file `index` has its first shard: the run is most likely inside it."""
    wait_for(lambda: list(out.glob(f"*_{index:04d}_0000.npy")), proc)


@pytest.mark.slow
def test_sigterm_to_the_process_group_at_20_moments_ends_each_run_and_the_same_command_finishes(
    tmp_path, four
):
    # As a scheduler stops a job (Slurm, systemd: a SIGTERM to the whole process group), at 20
    # seeded moments of real runs, each run going on from where the last one stopped: each ends
    # within seconds with its one line and leaves no process behind, every file it kept is the
    # uninterrupted run's, and the same command then finishes with the uninterrupted run's bytes.
    args, ref = four
    whole = files_of(ref)
    out = tmp_path / "out"
    # an uninterrupted run: the command line's bytes are main()'s, and how long a run lasts
    proc = start_fineweb([*args, "--out_dir", out])
    wait_for(lambda: (out / ".lock").exists(), proc)
    began = time.monotonic()
    assert finish(proc)[0] == 0 and files_of(out) == whole
    length = time.monotonic() - began
    shutil.rmtree(out)
    for moment in np.random.default_rng(0).uniform(0, length, 20):
        (out / ".lock").unlink(missing_ok=True)
        proc = start_fineweb([*args, "--out_dir", out])
        wait_for(lambda: (out / ".lock").exists(), proc)  # it has begun
        time.sleep(moment)
        os.killpg(proc.pid, signal.SIGTERM)
        signalled = time.monotonic()
        returncode, _, err = finish(proc)
        assert time.monotonic() - signalled < 10
        assert not group_left(proc.pid)
        if returncode == 1:
            done = len(list((out / ".fineweb").glob("*.done.json")))
            assert err == (
                f"fineweb.py: stopped (SIGTERM); {done} of 4 files done and kept; "
                "run the same command to continue\n"
            )
            assert files_of(out).items() <= whole.items()
        else:  # finished before the signal (or ended by it once finished): a whole corpus
            assert returncode in (0, -signal.SIGTERM) and files_of(out) == whole, err
            shutil.rmtree(out)
    run_main(*args[:-1], 1, "--out_dir", out)  # --workers may differ
    assert files_of(out) == whole


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """One file of ~7 MB: 7 slices, each one's tokens far more than a pipe holds."""
    return write_jsonl(tmp_path_factory.mktemp("big") / "big.jsonl", make_docs(14000, 7, (80, 120)))


def test_a_sigterm_while_the_workers_send_their_results_ends_the_run(tmp_path, big):
    # fineweb.py stopped (SIGSTOP) while slices are in flight: its workers finish theirs and
    # block, halfway through sending the tokens. A SIGTERM to the group then, and fineweb.py
    # continued, must end in its one line. (concurrent.futures' pool, whose workers died of the
    # SIGTERM halfway through a result, waited for the rest of it for good.)
    out = tmp_path / "out"
    args = ["--local", big, "--shard_size", 200_000, "--workers", 2, "--out_dir", out]
    proc = start_fineweb(args)
    wait_for(lambda: list(out.glob("*_0000_0001.npy")), proc)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGTERM)
    os.kill(proc.pid, signal.SIGCONT)
    returncode, _, err = finish(proc, timeout=30)
    assert returncode == 1 and err == (
        "fineweb.py: stopped (SIGTERM); 0 of 1 files done and kept; run the same command to "
        "continue\n"
    )
    assert not group_left(proc.pid)


def test_a_worker_that_dies_at_any_moment_ends_the_wait_for_it():
    stop = fineweb.Stop()
    pool = fineweb.Pool(2)
    try:
        # worker 0 killed halfway through sending 8 MB, more than its pipe holds
        pool.submit(0, np.zeros, (2**22, np.uint16))
        pool.submit(1, np.zeros, (10, np.uint16))
        assert pool.workers[0][1].poll(PATIENCE)
        os.kill(pool.workers[0][0].pid, signal.SIGKILL)
        with pytest.raises(fineweb.WorkerDied):
            pool.result(0, stop)
        assert len(pool.result(1, stop)) == 10
        with pytest.raises(fineweb.WorkerDied):  # a job for it
            pool.submit(2, np.zeros, (10, np.uint16))
    finally:
        pool.close()


def test_no_more_workers_than_slices_in_flight(tmp_path, monkeypatch, small_slices):
    monkeypatch.setattr(fineweb, "usable_cpus", lambda: 8)
    started = []
    real_close = fineweb.Pool.close

    def close(pool):
        started.append(len(pool.workers))
        real_close(pool)

    monkeypatch.setattr(fineweb.Pool, "close", close)
    two = write_jsonl(tmp_path / "two.jsonl", make_docs(3, 1, (40, 41)))  # two slices
    assert len(list(fineweb.plan_slices(two, "text"))) == 2
    run_main("--local", two, "--out_dir", tmp_path / "out", "--workers", 8)
    assert started == [2]


@pytest.mark.slow
def test_ctrl_c_stops_and_a_hangup_under_nohup_does_not(tmp_path, four):
    args, ref = four
    out = tmp_path / "int"
    proc = start_fineweb([*args, "--out_dir", out])
    mid_file(out, proc)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    returncode, _, err = finish(proc)
    assert returncode == 1 and err.startswith("fineweb.py: stopped (SIGINT); "), err
    assert len(err.strip().splitlines()) == 1, err
    run_main(*args, "--out_dir", out)
    assert files_of(out) == files_of(ref)
    out = tmp_path / "hup"

    def nohup():
        default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = start_fineweb([*args, "--out_dir", out], preexec_fn=nohup)
    mid_file(out, proc)
    os.killpg(proc.pid, signal.SIGHUP)
    returncode, _, err = finish(proc)
    assert returncode == 0, err
    assert files_of(out) == files_of(ref)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_kill_9_of_a_worker_ends_the_run_in_one_line_and_the_same_command_finishes(tmp_path, four):
    args, ref = four
    out = tmp_path / "out"
    proc = start_fineweb([*args, "--out_dir", out])
    mid_file(out, proc)
    os.kill(descendants(proc.pid)[0], signal.SIGKILL)  # as the OOM killer would
    killed = time.monotonic()
    returncode, _, err = finish(proc)
    assert time.monotonic() - killed < 10
    done = len(list((out / ".fineweb").glob("*.done.json")))
    one_line_error(returncode, err, "fineweb.py", "a worker died (killed, or out of memory?); ")
    assert err.strip().endswith(
        f"{done} of 4 files done and kept: run the same command to continue"
    )
    assert not group_left(proc.pid)
    run_main(*args, "--out_dir", out)
    assert files_of(out) == files_of(ref)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_parent_leaves_no_worker(tmp_path, four):
    args, _ = four
    out = tmp_path / "out"
    proc = start_fineweb([*args, "--out_dir", out])
    mid_file(out, proc)
    assert len(group_left(proc.pid)) == 3  # it and its two workers
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + PATIENCE
    while group_left(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not group_left(proc.pid)
    with pytest.raises(ValueError, match="is unfinished"):
        fineweb.load_corpus(out)


# -----------------------------------------------------------------------------
# The hub, offline: the real huggingface_hub calls on a cache or a download dir


def hub_cache(hf_home, repo, files):
    """The hub cache's layout for a dataset: refs/main, blobs, snapshot links."""
    folder = Path(hf_home) / "hub" / f"datasets--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "blobs").mkdir()
    for name, source in files.items():
        data = Path(source).read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return folder


@pytest.fixture(scope="module")
def parquets(tmp_path_factory):
    d = tmp_path_factory.mktemp("parquets")
    return [write_parquet(d / f"{i:03d}_00000.parquet", make_docs(60, i)) for i in range(3)]


def test_hub_cache_offline_gives_the_shards_of_the_same_local_files(tmp_path, parquets):
    names = {f"sample/10BT/{p.name}": p for p in parquets}
    other = write_parquet(tmp_path / "other.parquet", make_docs(3, 9))
    names["sample/100BT/000_00000.parquet"] = other  # not matched by --files
    folder = hub_cache(tmp_path / "hf", "HuggingFaceFW/fineweb-edu", names)
    out = tmp_path / "hub"
    args = ["--out_dir", out, "--shard_size", 700, "--workers", 2, "--free"]
    proc = run_program("fineweb.py", args, env=hub_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"] == "fineweb-edu" and manifest["repo"] == "HuggingFaceFW/fineweb-edu"
    assert manifest["sources"] == [f"sample/10BT/{p.name}" for p in parquets]
    run_main("--local", *parquets, "--out_dir", tmp_path / "local", "--shard_size", 700)
    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert manifest["shards"] == local["shards"]
    assert manifest["fingerprint"] == local["fingerprint"]
    # --free: the cache's blobs of the files tokenised are gone, the rest stays
    assert len(list((folder / "blobs").iterdir())) == 1
    assert (folder / "snapshots").rglob("100BT/*.parquet")


def test_hub_download_dir_offline_and_its_errors(tmp_path, parquets):
    download = tmp_path / "dl"
    (download / "data").mkdir(parents=True)
    for p in parquets[:2]:
        shutil.copy(p, download / "data" / p.name)
    # a third file there: a link to a file of the user's, elsewhere
    mine = shutil.copy(parquets[2], tmp_path / "mine.parquet")
    (download / "data" / parquets[2].name).symlink_to(mine)
    out = tmp_path / "out"
    repo = ["--repo", "someone/corpus", "--files", "data/*.parquet"]
    args = [*repo, "--download_dir", download, "--out_dir", out, "--shard_size", 700, "--free"]
    proc = run_program("fineweb.py", args, env=hub_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"] == "someone/corpus" and len(manifest["sources"]) == 3
    # --free: the downloads are gone, and of the link only the link
    assert not list((download / "data").iterdir())
    assert Path(mine).read_bytes() == parquets[2].read_bytes()
    run_main("--local", *parquets, "--out_dir", tmp_path / "local", "--shard_size", 700)
    assert manifest["fingerprint"] == fineweb.load_corpus(tmp_path / "local")["fingerprint"]
    # nothing downloaded: huggingface_hub's own message, in one line
    proc = run_program("fineweb.py", [*repo, "--out_dir", tmp_path / "none"], env=hub_env(tmp_path))
    one_line_error(proc.returncode, proc.stderr, "fineweb.py", "set 'HF_HUB_OFFLINE=0'")
    assert not (tmp_path / "none").exists()
    args = [*repo[:2], "--files", "*.txt", "--download_dir", download, "--out_dir", out]
    message = main_error(fineweb.main, args)
    assert message == "fineweb.py: error: no files of someone/corpus match '*.txt'"


# -----------------------------------------------------------------------------
# What another program made, and what a training run reads


@pytest.mark.parametrize("how", ["by name", "through a link", "by a hard link"])
def test_one_input_given_twice_is_refused(tmp_path, how):
    # its text would be in the corpus twice: the val split's first tokens in the train split too
    a = write_txt(tmp_path / "a.txt", make_docs(20))
    again = a
    if how == "through a link":
        again = tmp_path / "b.txt"
        again.symlink_to(a)
    elif how == "by a hard link":
        again = tmp_path / "b.txt"
        os.link(a, again)
    message = main_error(fineweb.main, ["--local", a, again, "--out_dir", tmp_path / "out"])
    same = "is given twice" if again == a else f"and {a} are the same file"
    assert message == f"fineweb.py: error: {again} {same}: give each input once"
    assert not (tmp_path / "out").exists()


def test_out_of_memory_says_which_input_and_what_to_do(tmp_path, monkeypatch):
    # a worker (forked from this process: it has the patch) out of memory on a huge document
    def out_of_memory(vocab, doc):
        raise MemoryError()

    monkeypatch.setattr(fineweb, "encode_document", out_of_memory)
    a = write_txt(tmp_path / "a.txt", make_docs(5))
    message = main_error(fineweb.main, ["--local", a, "--out_dir", tmp_path / "out"])
    size = a.stat().st_size
    assert message.startswith(
        f"fineweb.py: error: {a}: out of memory tokenising bytes 0 to {size:,}"
    )
    assert "fewer --workers" in message and "cut a document that large" in message


# where --out_dir may not be: a run's log_dir or a place inside one, a place inside a corpus, a
# directory holding files that are not fineweb.py's
OUT_DIRS = [
    ("run", "--out_dir {tmp}/run is a training run's log_dir: pick another"),
    ("run/data", "--out_dir {tmp}/run/data is inside the run in {tmp}/run: pick a directory"),
    ("corpus/sub", "--out_dir {tmp}/corpus/sub is inside the corpus {tmp}/corpus: pick a"),
    ("notes", "{tmp}/notes holds files that are not fineweb.py's; pick another --out_dir"),
]


@pytest.mark.parametrize("out, message", OUT_DIRS, ids=[c[0] for c in OUT_DIRS])
def test_out_dir_is_fineweb_pys_own(tmp_path, out, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / ".fineweb").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    before = sorted(tmp_path.rglob("*"))
    a = write_txt(tmp_path / "a.txt", make_docs(5))
    error = main_error(fineweb.main, ["--local", a, "--out_dir", tmp_path / out])
    assert error.startswith(f"fineweb.py: error: {message.format(tmp=tmp_path)}")
    assert sorted(tmp_path.rglob("*")) == sorted(before + [a])


@pytest.mark.parametrize("inside", ["run/dl", "corpus/dl", "out/dl"])
def test_downloads_go_into_no_run_or_corpus(tmp_path, inside):
    # (out: the corpus this run makes, new)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / ".fineweb").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    args = ["--repo", "someone/corpus", "--download_dir", tmp_path / inside]
    error = main_error(fineweb.main, [*args, "--out_dir", tmp_path / "out"])
    owner = "the run in" if inside.startswith("run") else "the corpus"
    top = tmp_path / inside.split("/")[0]
    assert error.startswith(f"fineweb.py: error: --download_dir {tmp_path / inside} is inside")
    assert f"inside {owner} {top}: pick a directory outside it" in error
    assert sorted(tmp_path.rglob("*")) == before


def test_a_file_written_to_while_tokenised_is_made_again(tmp_path, monkeypatch):
    # its shards may hold some of each version: the file is not done, and the rerun makes it
    a = write_txt(tmp_path / "a.txt", make_docs(20))
    tokenize_file = fineweb.tokenize_file

    def written_meanwhile(pool, path, *args):
        shards = tokenize_file(pool, path, *args)
        with open(path, "a") as f:
            f.write("\n\n\nA late document.")
        return shards

    monkeypatch.setattr(fineweb, "tokenize_file", written_meanwhile)
    out = tmp_path / "out"
    error = main_error(fineweb.main, ["--local", a, "--out_dir", out, "--shard_size", 700])
    assert error == (
        f"fineweb.py: error: {a} changed while it was tokenised: run fineweb.py again once it is"
        " written (its shards are made again)"
    )
    monkeypatch.setattr(fineweb, "tokenize_file", tokenize_file)
    run_main("--local", a, "--out_dir", out, "--shard_size", 700)
    fresh = ["--out_dir", tmp_path / "fresh", "--shard_size", 700]
    run_main("--local", shutil.copy(a, tmp_path / "b.txt"), *fresh)
    ours = fineweb.load_corpus(out)
    assert ours["fingerprint"] == fineweb.load_corpus(tmp_path / "fresh")["fingerprint"]


def test_a_corpus_a_training_run_reads_is_not_changed(tmp_path, finished):
    # A run holds its corpus's readers' lock shared (here this test's, as a run takes it):
    # --overwrite, or a rerun that would make a damaged file again, is refused and changes
    # nothing; once the run has ended, both go through.
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    source = fineweb.load_corpus(out)["sources"][0]
    args = ["--local", source, "--out_dir", out, "--shard_size", 1000, "--workers", 1]
    shard_of(out, 1).write_bytes(b"damaged")
    before = files_of(out)
    reading = fineweb.take_lock(out / fineweb.READERS, shared=True)
    for extra in [["--overwrite"], []]:
        message = main_error(fineweb.main, args + extra)
        assert message == (
            f"fineweb.py: error: a training run is reading {out} (it holds"
            f" {out / fineweb.READERS}): run this again once that run has ended, or write"
            " another --out_dir"
        )
        assert files_of(out) == before
    reading.close()
    run_main(*args)
    assert files_of(out) == files_of(finished)
    run_main(*args, "--overwrite")
    assert files_of(out) == files_of(finished)


# -----------------------------------------------------------------------------
# The module


def test_import_does_nothing_and_help_states_the_rules(capsys):
    code = (
        "import sys, fineweb\n"
        "heavy = {'torch', 'tiktoken', 'huggingface_hub', 'pyarrow', 'tqdm', 'train_gpt2'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    proc = run_program([sys.executable, "-c", code])
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(SystemExit) as exc:
        fineweb.main(["-h"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "two or more blank lines" in text and "--local input.txt --tokenizer char" in text
    assert "the same command" in text and "--overwrite" in text
