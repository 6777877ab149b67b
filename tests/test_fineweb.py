"""fineweb.py: readers, tokenizers, shards and manifest, continuing, --overwrite,
the hub offline, signals, and the one-line errors of the command line."""

import errno
import fcntl
import hashlib
import json
import os
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fineweb  # noqa: E402

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


def write_parquet(path, docs, field="text"):
    pq.write_table(pa.table({field: docs, "id": list(range(len(docs)))}), path)
    return path


def gpt2_stream(docs):
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
    """{relative path: bytes} of every file under directory but the lock."""
    root = Path(directory)
    paths = [p for p in root.rglob("*") if p.is_file() and p.name != ".lock"]
    return {str(p.relative_to(root)): p.read_bytes() for p in paths}


def run_main(*args):
    """fineweb.main in this process: returns the manifest."""
    return fineweb.main([str(a) for a in args])


def refused(*args):
    """The one-line message of an in-process fineweb.main that stops."""
    with pytest.raises(SystemExit) as exc:
        run_main(*args)
    assert isinstance(exc.value.code, str) and "\n" not in exc.value.code
    return exc.value.code


def child_env(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    env.pop("HF_ENDPOINT", None)
    return env


def cli(tmp_path, *args, timeout=120):
    """fineweb.py as a real process (offline, its caches in tmp_path)."""
    command = [sys.executable, "fineweb.py", *map(str, args)]
    return subprocess.run(
        command,
        cwd=ROOT,
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def default_signals():
    # what a shell gives a command it starts (pytest-xdist ignores SIGINT)
    for sig in fineweb.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def start(tmp_path, *args, program=("fineweb.py",), preexec_fn=default_signals, **popen):
    """fineweb.py (or python's other program) started as a real process, as a shell starts it."""
    command = [sys.executable, *program, *map(str, args)]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
        **popen,
    )


def wait_for(path, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.01)


def one_line_error(proc, message):
    """The process failed with exactly one line on stderr, containing message."""
    assert proc.returncode not in (0, None), proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


# -----------------------------------------------------------------------------
# Documents


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


BAD_INPUTS = [
    ("missing.txt", None, [], "missing.txt: no such .txt, .jsonl or .parquet file"),
    ("c.csv", "text\n", [], "c.csv: no such .txt, .jsonl or .parquet file"),
    ("c.jsonl", '{"text": "ok"}\n{"text": "cut\n', [], "c.jsonl:2: not a JSON object"),
    ("c.jsonl", '{"body": "x"}\n', [], "c.jsonl:1: not a JSON object with a 'text' field"),
    ("c.parquet", "parquet", ["--text_field", "body"], "no column 'body' (columns: text, id)"),
    ("c.parquet", b"PAR1 not really", [], "c.parquet: ArrowInvalid:"),
    ("c.txt", b"ok\n\xff\xfe\n", [], "c.txt: UnicodeDecodeError:"),
    ("c.txt", "\n \n\n", [], "the first file holds no documents"),
    ("c.txt", "text", ["--shard_size", "0"], "--shard_size and --workers must be positive"),
    ("c.txt", "text", ["--workers", "two"], "argument --workers: invalid int value"),
    ("c.txt", "text", ["--out", "x"], "unrecognized arguments: --out"),
]


@pytest.mark.parametrize("name, content, extra, message", BAD_INPUTS)
def test_bad_input_is_one_line_on_stderr(tmp_path, name, content, extra, message):
    path = tmp_path / name
    if content == "parquet":
        write_parquet(path, ["x"])
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    out = tmp_path / "out"
    proc = cli(tmp_path, "--local", path, "--out_dir", out, "--workers", 1, *extra)
    one_line_error(proc, message)
    assert not list(out.glob("*.npy")) and not (out / "manifest.json").exists()


def test_char_tokenizer_needs_local_files(tmp_path):
    proc = cli(tmp_path, "--tokenizer", "char", "--out_dir", tmp_path / "out")
    one_line_error(proc, "--tokenizer char needs --local files")
    assert proc.returncode == 2 and not (tmp_path / "out").exists()


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


def test_each_file_is_cut_into_its_own_shards(tmp_path, capsys):
    docs = [make_docs(40, seed) for seed in range(3)]
    inputs = [
        write_txt(tmp_path / "a.txt", docs[0]),
        write_jsonl(tmp_path / "b.jsonl", docs[1]),
        write_parquet(tmp_path / "c.parquet", docs[2]),
    ]
    out = tmp_path / "out"
    manifest = run_main("--local", *inputs, "--out_dir", out, "--shard_size", 500, "--workers", 2)
    assert manifest == fineweb.load_corpus(out)
    shards = manifest["shards"]
    assert shards[0]["file"] == "edufineweb_val_0000_0000.npy" and shards[0]["split"] == "val"
    assert all(s["split"] == "train" for s in shards[1:])
    for index, file_docs in enumerate(docs):
        mine = [s for s in shards if s["file"].split("_")[2] == f"{index:04d}"]
        names = [s["file"].split("_", 2)[2] for s in mine]
        assert names == [f"{index:04d}_{part:04d}.npy" for part in range(len(mine))]
        assert all(s["tokens"] == 500 for s in mine[:-1]) and 0 < mine[-1]["tokens"] <= 500
        ids = np.concatenate([np.load(out / s["file"]) for s in mine])
        assert np.array_equal(ids, gpt2_stream(file_docs))  # <|endoftext|> + each document
    lines = []
    for s in shards:
        assert s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
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
    assert record["settings"]["shard_size"] == 500
    assert "done (" in capsys.readouterr().out


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
    # the bytes of the earlier fineweb.py: the same np.save of the same tokens
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


def test_first_file_of_one_shard_is_split_and_others_are_train(tmp_path):
    first = make_docs(30, 1)
    second = make_docs(30, 2)
    inputs = [write_jsonl(tmp_path / "a.jsonl", first), write_jsonl(tmp_path / "b.jsonl", second)]
    manifest = run_main("--local", *inputs, "--out_dir", tmp_path / "out", "--workers", 1)
    assert [s["split"] for s in manifest["shards"]] == ["val", "train", "train"]
    val = manifest["shards"][0]["tokens"]
    lengths = [len(gpt2_stream([d])) for d in first]
    assert val in np.cumsum(lengths)  # at a document boundary
    assert 0.05 <= val / sum(lengths) <= 0.2


def test_char_vocabulary_of_all_files_and_its_limit(tmp_path):
    a = write_txt(tmp_path / "a.txt", ["héllo wörld", "zz top"])
    b = write_jsonl(tmp_path / "b.jsonl", ["日本 語", "ok\tok"])
    manifest = run_main("--local", a, b, "--tokenizer", "char", "--out_dir", tmp_path / "out")
    assert manifest["vocab"] == "".join(sorted(set("héllo wörld" + "zz top日本 語ok\tok\n")))
    _, ids = read_corpus(tmp_path / "out")
    text = fineweb.CharTokenizer(manifest["vocab"]).decode(ids)
    assert text == "héllo wörld\n\nzz top\n\n日本 語\n\nok\tok\n\n"
    many = tmp_path / "many.txt"
    many.write_text("".join(chr(c) for c in range(0x20000, 0x20000 + 70_000)))
    message = refused("--local", many, "--tokenizer", "char", "--out_dir", tmp_path / "x")
    assert "distinct characters, more than the 65,536 ids" in message
    assert not (tmp_path / "x").exists()


def test_load_corpus(tmp_path):
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
    (nano / ".fineweb").mkdir()  # fineweb.py's, without its manifest yet
    with pytest.raises(ValueError, match="is unfinished: rerun the same fineweb.py command"):
        fineweb.load_corpus(nano)


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
    assert "finished already, nothing to do" in capsys.readouterr().out
    others = [
        ["--shard_size", 300],
        ["--tokenizer", "char"],
        ["--prefix", "other"],
        ["--text_field", "id"],
        ["--dataset_name", "mine"],
    ]
    for other in others:
        message = refused("--local", a, b, "--out_dir", out, *other)
        assert message.startswith(f"fineweb.py: error: {out} holds a corpus made with another")
        assert message.endswith("; use --overwrite to rebuild, or another --out_dir")
    assert "another sources" in refused("--local", a, "--out_dir", out, "--shard_size", 400)
    assert files_of(out) == before
    shard = out / "edufineweb_train_0001_0001.npy"
    shard.write_bytes(shard.read_bytes()[:-2])
    message = refused(*args)
    assert f"a shard of {b} in {out} changed on disk; use --overwrite" in message
    shard.write_bytes(before["edufineweb_train_0001_0001.npy"])
    os.utime(a, ns=(0, 10**18))
    assert f"{a} changed since it was tokenised; use --overwrite" in refused(*args)


def test_one_run_per_out_dir(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(5))
    out = tmp_path / "out"
    out.mkdir()
    with open(out / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        message = refused("--local", a, "--out_dir", out)
    assert message == f"fineweb.py: error: another fineweb.py run is writing {out}"


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

    def swap(out_dir, staging):
        calls = []

        def replace(src, dst):
            if len(calls) == renames:
                raise KeyboardInterrupt("SIGKILL")
            calls.append(src)
            real_replace(src, dst)

        monkeypatch.setattr(fineweb.os, "replace", replace)
        try:
            real_swap(out_dir, staging)
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
    assert "stopped (SIGKILL)" in refused(*new, "--out_dir", out, "--overwrite")
    monkeypatch.undo()
    if renames:
        with pytest.raises(ValueError, match="is unfinished"):
            fineweb.load_corpus(out)
    run_main(*new, "--out_dir", out)  # any run on out_dir completes the swap
    assert files_of(out) == {**files_of(tmp_path / "ref"), "notes.txt": b"mine"}


# -----------------------------------------------------------------------------
# Stop signals and workers


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """6 files of ~90k tokens each, and the corpus of an uninterrupted run."""
    d = tmp_path_factory.mktemp("many")
    inputs = [write_jsonl(d / f"f{i}.jsonl", make_docs(800, i, (80, 120))) for i in range(6)]
    args = ["--local", *inputs, "--shard_size", 40_000, "--workers", 2]
    run_main(*args, "--out_dir", d / "ref")
    return args, d / "ref"


@pytest.mark.slow
def test_sigterm_then_the_same_command_equals_an_uninterrupted_run(tmp_path, many):
    args, ref = many
    out = tmp_path / "out"
    proc = start(tmp_path, *args, "--out_dir", out)
    wait_for(out / ".fineweb" / "0001.done.json", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    done = len(list((out / ".fineweb").glob("*.done.json")))
    assert proc.returncode == 1 and 2 <= done < 6
    assert err.strip().splitlines() == [
        f"fineweb.py: stopped (SIGTERM); {done} of 6 files done and kept; "
        "run the same command to continue"
    ]
    with pytest.raises(ValueError, match="is unfinished"):
        fineweb.load_corpus(out)
    proc = cli(tmp_path, *args[:-1], 1, "--out_dir", out)  # --workers may differ
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"{done + 1}/6 ")  # the first unfinished file
    assert files_of(out) == files_of(ref)


@pytest.mark.slow
def test_ctrl_c_to_the_process_group_stops_and_hangup_under_nohup_does_not(tmp_path, many):
    args, ref = many
    out = tmp_path / "int"
    proc = start(tmp_path, *args, "--out_dir", out, start_new_session=True)
    wait_for(out / ".fineweb" / "0000.done.json", proc)
    os.killpg(proc.pid, signal.SIGINT)  # the workers get it too, and ignore it
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and err.startswith("fineweb.py: stopped (SIGINT); ")
    assert len(err.strip().splitlines()) == 1, err
    out = tmp_path / "hup"

    def nohup():
        default_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = start(tmp_path, *args, "--out_dir", out, start_new_session=True, preexec_fn=nohup)
    wait_for(out / ".fineweb" / "0000.done.json", proc)
    os.killpg(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert files_of(out) == files_of(ref)


def test_a_failed_overwrite_leaves_the_old_corpus_as_it_was(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_docs(20, 1))
    out = tmp_path / "out"
    run_main("--local", a, "--out_dir", out, "--workers", 1)
    old = files_of(out)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    message = refused("--local", a, bad, "--out_dir", out, "--overwrite", "--workers", 1)
    assert message.startswith(f"fineweb.py: error: {bad}:2: not a JSON object")
    now = {k: v for k, v in files_of(out).items() if not k.startswith(".fineweb/staging/")}
    assert now == old and fineweb.load_corpus(out)["sources"] == [str(a)]


@pytest.fixture(scope="module")
def pair(many):
    """The first two of many's files, and the corpus of an uninterrupted run."""
    args, ref = many
    args = [*args[:3], *args[-4:]]
    run_main(*args, "--out_dir", ref.parent / "pair")
    return args, ref.parent / "pair"


# fineweb.main with a SIGTERM raised as the main thread calls the function argv[1] from
# argv[2] (qualified names in threading or multiprocessing: the pool's code) for the
# argv[3]-th time, as a signal reaches Python there, after a pause there (as on a busy
# machine) while the pool's threads go on
SIGNAL_AT_CALL = """
import signal, sys, time
import fineweb

calls = []

def signal_at(frame, event, arg):
    names = [frame.f_code.co_qualname, frame.f_back.f_code.co_qualname]
    pool = any(m in frame.f_code.co_filename for m in ("threading", "multiprocessing"))
    if event == "call" and pool and names == sys.argv[1:3]:
        calls.append(names)
    if len(calls) == int(sys.argv[3]):
        sys.settrace(None)
        time.sleep(0.2)
        signal.raise_signal(signal.SIGTERM)

sys.settrace(signal_at)
fineweb.main(sys.argv[4:])
"""


def group_left(leader):
    """The live processes (zombies aside) of the process group that leader leads."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        if fields[2] == str(leader) and fields[0] != "Z":
            left.append(stat.parent.name)
    return left


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    "call",
    [
        "Pool._repopulate_pool Pool.__init__ 1",  # the pool starting its workers
        "IMapIterator.__init__ Pool.imap 1",  # a file's documents fed to it
        "Condition.wait IMapIterator.next 1",  # waiting for a document's tokens
        "Condition.__exit__ IMapIterator.next 1",  # got them: a run stopped here hung
        "Pool._terminate_pool Finalize.__call__ 1",  # the pool ended
    ],
)
def test_a_stop_signal_inside_the_pools_code_stops_the_run(tmp_path, pair, call):
    args, ref = pair
    out = tmp_path / "out"
    program = ("-c", SIGNAL_AT_CALL, *call.split())
    proc = start(tmp_path, *args, "--out_dir", out, program=program, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"fineweb.py went on for 60 s after a SIGTERM at the call of {call}")
    assert proc.returncode == 1 and err.startswith("fineweb.py: stopped (SIGTERM); "), err
    assert len(err.strip().splitlines()) == 1, err
    assert not group_left(proc.pid)  # no worker outlives it
    proc = cli(tmp_path, *args, "--out_dir", out)
    assert proc.returncode == 0, proc.stderr
    assert files_of(out) == files_of(ref)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_schedulers_sigterm_to_the_process_group_stops_the_run(tmp_path, many):
    # the workers get it too (as from Slurm or systemd), and leave it to the parent
    args, ref = many
    out = tmp_path / "out"
    proc = start(tmp_path, *args, "--out_dir", out, start_new_session=True)
    wait_for(out / ".fineweb" / "0000.done.json", proc)
    deadline = time.monotonic() + 30
    while not list(out.glob("*_train_0001_*.npy")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)  # mid-file
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and err.startswith("fineweb.py: stopped (SIGTERM); "), err
    assert len(err.strip().splitlines()) == 1, err
    assert not group_left(proc.pid)
    proc = cli(tmp_path, *args, "--out_dir", out)
    assert proc.returncode == 0, proc.stderr
    assert files_of(out) == files_of(ref)


@pytest.mark.slow
def test_a_stopped_overwrite_leaves_the_old_corpus_and_the_same_command_finishes(tmp_path, many):
    args, ref = many
    out = tmp_path / "out"
    run_main(*args[:2], "--out_dir", out, "--workers", 1)  # the old corpus: one file
    (out / "notes.txt").write_text("mine")
    old = files_of(out)
    proc = start(tmp_path, *args, "--out_dir", out, "--overwrite")
    wait_for(out / ".fineweb" / "staging" / ".fineweb" / "0001.done.json", proc)
    proc.send_signal(signal.SIGTERM)
    outs, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and err.startswith("fineweb.py: stopped (SIGTERM); "), err
    kept = {k: v for k, v in files_of(out).items() if not k.startswith(".fineweb/staging/")}
    assert kept == old and len(fineweb.load_corpus(out)["sources"]) == 1
    proc = cli(tmp_path, *args, "--out_dir", out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert not proc.stdout.startswith("1/6")  # the finished files were kept
    assert files_of(out) == {**files_of(ref), "notes.txt": b"mine"}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_kill_9_of_the_parent_leaves_no_worker(tmp_path, many):
    args, _ = many
    out = tmp_path / "out"
    proc = start(tmp_path, *args, "--out_dir", out, start_new_session=True)
    wait_for(out / ".fineweb" / "0000.done.json", proc)
    deadline = time.monotonic() + 30
    # it and its two workers
    while len(group_left(proc.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(group_left(proc.pid)) >= 3
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_left(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
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
    proc = cli(tmp_path, "--out_dir", out, "--shard_size", 700, "--workers", 2, "--free")
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
    out = tmp_path / "out"
    repo = ["--repo", "someone/corpus", "--files", "data/*.parquet"]
    proc = cli(tmp_path, *repo, "--download_dir", download, "--out_dir", out, "--shard_size", 700)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"] == "someone/corpus" and len(manifest["sources"]) == 2
    run_main("--local", *parquets[:2], "--out_dir", tmp_path / "local", "--shard_size", 700)
    assert manifest["fingerprint"] == fineweb.load_corpus(tmp_path / "local")["fingerprint"]
    proc = cli(tmp_path, *repo, "--out_dir", tmp_path / "none")  # nothing downloaded
    one_line_error(proc, "set 'HF_HUB_OFFLINE=0'")
    assert not (tmp_path / "none").exists()
    proc = cli(
        tmp_path, *repo[:2], "--files", "*.txt", "--download_dir", download, "--out_dir", out
    )
    one_line_error(proc, "no files of someone/corpus match '*.txt'")


# -----------------------------------------------------------------------------
# The module


def test_import_does_nothing_and_help_states_the_rules(capsys):
    code = (
        "import sys, fineweb\n"
        "heavy = {'torch', 'tiktoken', 'huggingface_hub', 'pyarrow', 'tqdm', 'train_gpt2'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    with pytest.raises(SystemExit) as exc:
        fineweb.main(["-h"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "two or more blank lines" in text and "--local input.txt --tokenizer char" in text
    assert "the same command" in text and "--overwrite" in text
