"""fineweb.py: documents, tokens, shards, manifest, the CLI and its errors."""

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import fineweb
import launcher
from helpers import child_env, many_characters

ROOT = Path(__file__).resolve().parents[1]
EOT = 50256
ROOT_USER = os.geteuid() == 0  # root reads and writes whatever chmod says

DOCS = [
    "Hello, I'm a language model.",
    "Ünïcödé, 中文, emoji 🙂 and a literal <|endoftext|> that must stay ordinary text.",
    "  leading spaces and\ttabs\n\nand a paragraph break inside one document  ",
    "To be, or not to be, that is the question: " * 12,  # the long one: spans several small shards
    "x",
]


@pytest.fixture(scope="module")
def enc():
    return fineweb.load_tokenizer()


def expected_stream(enc, docs):
    return np.concatenate([[EOT] + enc.encode_ordinary(d) for d in docs]).astype(np.uint16)


def read_shards(out_dir):
    """(manifest, concatenated tokens, per-shard arrays) of a finished output directory."""
    manifest = json.loads((Path(out_dir) / "manifest.json").read_text())
    arrays = [np.load(Path(out_dir) / s["file"]) for s in manifest["shards"]]
    for arr, shard in zip(arrays, manifest["shards"], strict=True):
        assert arr.dtype == np.uint16 and arr.ndim == 1 and len(arr) == shard["tokens"]
    return manifest, np.concatenate(arrays), arrays


def check_layout(manifest, prefix, shard_size):
    """Names {prefix}_{split}_{index:06d}.npy, shard 0 val, full shards then the remainder, counts add up."""
    shards = manifest["shards"]
    assert [s["file"] for s in shards] == [
        f"{prefix}_{'val' if i == 0 else 'train'}_{i:06d}.npy" for i in range(len(shards))
    ]
    assert [s["split"] for s in shards] == ["val"] + ["train"] * (len(shards) - 1)
    assert sum(s["tokens"] for s in shards) == manifest["total_tokens"]
    if manifest["small_corpus_split"] is None:
        assert all(s["tokens"] == shard_size for s in shards[:-1])
        assert 0 < shards[-1]["tokens"] <= shard_size
        assert len(shards) == -(-manifest["total_tokens"] // shard_size)


def max_boundaries_crossed(lengths, shard_size):
    """The most shard boundaries that fall strictly inside one document."""
    start, most = 0, 0
    for n in lengths:
        end = start + n
        most = max(most, (end - 1) // shard_size - start // shard_size)
        start = end
    return most


# ----------------------------------------------------------------------------------------------------------
# Documents


def test_txt_documents_are_separated_by_two_blank_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(
        b"\n\nfirst doc line 1\nline 2\n\nsame doc after one blank line\n"
        b"\n  \t\n"  # a blank line and a whitespace-only line: two blank lines end the document
        b"second doc\r\n\r\n\r\n\r\n"  # CRLF, three blank lines
        b"third doc\n\n\n\n\n"
        b"   \n\n\n"  # nothing but whitespace: no document
    )
    assert list(fineweb.iter_documents([path])) == [
        "first doc line 1\nline 2\n\nsame doc after one blank line",
        "second doc",
        "third doc",
    ]


def test_txt_documents_do_not_depend_on_read_chunks(tmp_path):
    # The reader splits large chunks with a regex; separators and blank lines straddle chunk edges here.
    path = tmp_path / "c.txt"
    path.write_text("a b\n\n c\n \n\t\n\n d\n\n\ne\n  \n")
    for chunk_chars in (1, 2, 3, 5, 1 << 20):
        assert list(fineweb.iter_txt_documents(path, chunk_chars)) == ["a b\n\n c", "d", "e"]


def test_txt_without_a_gap_is_one_document(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a\nb\n\nc\n")
    assert list(fineweb.iter_documents([path])) == ["a\nb\n\nc"]


def test_input_txt_gives_one_document_per_play():
    docs = list(fineweb.iter_documents([ROOT / "input.txt"]))
    assert 5 <= len(docs) <= 20
    assert min(len(d) for d in docs) > 50_000  # whole plays, not lines or scenes
    assert docs[0].startswith("ALL'S WELL THAT ENDS WELL")
    assert all("by William Shakespeare" in d[:200] for d in docs)


def test_byte_order_mark_at_the_start_of_a_file_is_not_text(tmp_path):
    bom = "\ufeff"
    txt, jsonl = tmp_path / "a.txt", tmp_path / "b.jsonl"
    txt.write_text(bom + "first\n\n\n" + bom + "second keeps its mark")  # elsewhere U+FEFF is ordinary text
    jsonl.write_text(bom + '{"text": "one"}\n' + json.dumps({"text": bom + "two"}) + "\n")
    assert list(fineweb.iter_documents([txt, jsonl])) == ["first", bom + "second keeps its mark", "one", bom + "two"]
    assert list(fineweb.iter_txt_documents(txt, chunk_chars=1)) == ["first", bom + "second keeps its mark"]


def test_jsonl_and_parquet_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "one", "id": 1}\n\n{"text": ""}\n{"text": null}\n{"text": "two"}\n')
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.table({"content": ["three", None, "four"]}), parquet)
    assert list(fineweb.iter_documents([jsonl])) == ["one", "two"]  # empty and null texts are skipped
    assert list(fineweb.iter_documents([parquet], text_field="content")) == ["three", "four"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.jsonl", '{"text": "ok"}\n{"text": "ok"\n', "a.jsonl:2: malformed JSON line"),
        ("a.jsonl", '{"body": "ok"}\n', "a.jsonl:1: no field 'text' (fields: 'body')"),
        ("a.jsonl", '["text"]\n', "a.jsonl:1: expected a JSON object"),
        ("a.jsonl", '{"text": 3}\n', "field 'text' is int, not a string"),
        ("a.txt", b"ok\n\xff\xfe\n", "a.txt: not UTF-8 text"),
        ("a.csv", "text\nok\n", "unknown file type '.csv'"),
    ],
)
def test_reader_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(fineweb.CorpusError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        list(fineweb.iter_documents([path]))


def test_batches_keep_order_and_whole_documents():
    docs = ["a" * 10, "b" * 300, "c", "d" * 50, "e"]
    batches = list(fineweb.batch_documents(docs, max_chars=100, max_docs=3))
    assert [d for b in batches for d in b] == docs
    assert batches[0] == ["a" * 10, "b" * 300]  # a document is never cut


# ----------------------------------------------------------------------------------------------------------
# Tokens


def test_tokenize_batch_is_eot_then_ordinary_tokens(enc):
    arrays = fineweb.tokenize_batch(DOCS)
    for doc, arr in zip(DOCS, arrays, strict=True):
        assert arr.dtype == np.uint16
        assert arr.tolist() == [EOT] + enc.encode_ordinary(doc)
        assert EOT not in arr[1:]  # the literal text "<|endoftext|>" is not the special token


def test_pool_and_no_pool_agree(enc):
    docs = DOCS * 40
    serial = [a for b in fineweb.tokenize_documents(docs, enc, workers=1) for a in b]
    pooled = [a for b in fineweb.tokenize_documents(docs, enc, workers=2) for a in b]
    assert len(serial) == len(pooled) == len(docs)
    assert all(np.array_equal(a, b) for a, b in zip(serial, pooled, strict=True))


# ----------------------------------------------------------------------------------------------------------
# Shards


@pytest.mark.parametrize("shard_size, crossings", [(20, 1), (12, 2), (10, 3)])
def test_shard_writer_conserves_tokens(tmp_path, shard_size, crossings):
    rng = np.random.default_rng(0)
    lengths = [7, 25, 4, 9]  # 45 tokens; the 25-token document crosses `crossings` shard boundaries
    assert max_boundaries_crossed(lengths, shard_size) == crossings
    docs = [np.concatenate([[EOT], rng.integers(0, EOT, n - 1)]).astype(np.uint16) for n in lengths]
    writer = fineweb.ShardWriter(tmp_path, "t", shard_size)
    for d in docs:
        writer.add(d)
    shards = writer.close()
    arrays = [np.load(tmp_path / s["file"]) for s in shards]
    assert np.array_equal(np.concatenate(arrays), np.concatenate(docs))
    assert [len(a) for a in arrays] == [shard_size] * (45 // shard_size) + [45 % shard_size]
    assert [s["tokens"] for s in shards] == [len(a) for a in arrays]
    assert writer.docs == 4 and writer.tokens == 45 and writer.small_split is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(s["file"] for s in shards)  # no temp files


def test_document_longer_than_two_shards(tmp_path):
    writer = fineweb.ShardWriter(tmp_path, "t", 4)
    writer.add(np.array([EOT, 1, 2], np.uint16))
    writer.add(np.array([EOT] + list(range(10, 21)), np.uint16))  # 12 tokens: shards 0..3
    shards = writer.close()
    assert [s["tokens"] for s in shards] == [4, 4, 4, 3]
    assert np.concatenate([np.load(tmp_path / s["file"]) for s in shards]).tolist() == (
        [EOT, 1, 2, EOT] + list(range(10, 21))
    )


@pytest.mark.parametrize("crossings", [1, 2, 3])
def test_pipeline_conserves_tokens_across_boundaries(tmp_path, enc, crossings):
    lengths = [1 + len(enc.encode_ordinary(d)) for d in DOCS]
    total = sum(lengths)
    shard_size = next(s for s in range(total - 1, 0, -1) if max_boundaries_crossed(lengths, s) == crossings)
    manifest = fineweb.run_pipeline(DOCS, tmp_path, "p", shard_size, enc, source={"type": "test"})
    got, stream, _ = read_shards(tmp_path)
    assert got == manifest
    assert np.array_equal(stream, expected_stream(enc, DOCS))
    check_layout(manifest, "p", shard_size)
    assert manifest["total_documents"] == len(DOCS) and manifest["total_tokens"] == total
    assert (manifest["tokenizer"], manifest["vocab_size"], manifest["eot_token"], manifest["dtype"]) == (
        "gpt2", 50257, EOT, "uint16")


def test_exactly_one_shard_is_a_small_corpus_and_one_more_token_is_not(tmp_path):
    doc = np.array([EOT] + list(range(1, 20)), np.uint16)  # 20 tokens
    one = fineweb.ShardWriter(tmp_path / "one", "t", 20)
    one.add(doc)
    assert [s["tokens"] for s in one.close()] == [2, 18]  # 10% of 20, mid-document
    two = fineweb.ShardWriter(tmp_path / "two", "t", 19)
    two.add(doc)
    assert [s["tokens"] for s in two.close()] == [19, 1]


def test_small_corpus_val_size():
    def val_size(*doc_lengths):  # documents of these lengths, back to back
        starts = np.cumsum([0, *doc_lengths[:-1]])
        return fineweb.small_corpus_val_size(sum(doc_lengths), starts)

    assert val_size(100) == 10  # one document: cut at 10%
    assert val_size(12, 88) == 12  # boundary at 12% is within 5-20%
    assert val_size(7, 2, 91) == 9  # the boundary nearest to 10%
    assert val_size(30, 70) == 10  # 30% is outside the window
    assert val_size(2) == 1  # the smallest corpus still splits
    with pytest.raises(fineweb.CorpusError, match="at least 2"):
        val_size(1)


def test_small_corpus_cuts_where_a_document_starts_whatever_its_tokens(tmp_path):
    # Boundaries are where add() was called, not where an <|endoftext|> id is: the char tokenizer has none.
    writer = fineweb.ShardWriter(tmp_path, "t", 1000)
    for n in (11, 89):
        writer.add(np.full(n, 7, np.uint16))
    assert [s["tokens"] for s in writer.close()] == [11, 89]
    assert writer.small_split["at_document_boundary"]


def test_empty_writer_refuses(tmp_path):
    with pytest.raises(fineweb.CorpusError, match="no documents"):
        fineweb.ShardWriter(tmp_path, "t", 10).close()
    assert not any(tmp_path.iterdir())


def test_failed_run_leaves_no_partial_corpus(tmp_path, enc):
    def docs():
        yield from DOCS * 5
        raise fineweb.CorpusError("boom")

    with pytest.raises(fineweb.CorpusError, match="boom"):
        fineweb.run_pipeline(docs(), tmp_path, "p", 16, enc)
    assert not any(tmp_path.iterdir())


def test_input_txt_yields_val_and_train_with_default_shard_size(tmp_path, capsys):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    manifest = fineweb.main(["--local", str(ROOT / "input.txt"), "--out_dir", str(tmp_path),
                             "--workers", "1", "--no_progress"])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored
    assert [s["file"] for s in manifest["shards"]] == ["input_val_000000.npy", "input_train_000001.npy"]
    # The GPT-2 shards are byte for byte those of the earlier fineweb.py (np.save, before the char tokenizer).
    assert [hashlib.sha256((tmp_path / s["file"]).read_bytes()).hexdigest()[:16] for s in manifest["shards"]] == [
        "7a756ad351abc096", "955c2300c3dd94ba"]
    assert (manifest["tokenizer"], manifest["eot_token"], manifest["dataset"]) == ("gpt2", EOT, "local")
    assert "vocab" not in manifest
    split = manifest["small_corpus_split"]
    assert split["at_document_boundary"]  # val is the first play
    assert 0.05 <= split["val_tokens"] / manifest["total_tokens"] <= 0.2
    assert 5 <= manifest["total_documents"] <= 20
    out = capsys.readouterr().out
    assert "small corpus" in out and "done: " in out


def test_hub_path_streams_a_local_dataset_offline(tmp_path, enc):
    # The FineWeb code path (datasets.load_dataset, streaming) on a dataset directory: no network needed.
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "ds"
    data.mkdir()
    pq.write_table(pa.table({"text": DOCS, "id": list(range(len(DOCS)))}), data / "train.parquet")
    out = tmp_path / "out"
    manifest = fineweb.main(["--dataset", str(data), "--name", "", "--split", "train", "--out_dir", str(out),
                             "--shard_size", "40", "--workers", "1", "--no_progress"])
    assert manifest["source"] == {"type": "hub", "dataset": str(data), "name": "", "split": "train",
                                  "text_field": "text"}
    assert manifest["dataset"] == str(data)  # a hub dataset other than FineWeb-Edu: its name
    _, stream, _ = read_shards(out)
    assert np.array_equal(stream, expected_stream(enc, DOCS))


def test_manifest_dataset_names_fineweb_edu():
    assert fineweb.dataset_name({"type": "hub", "dataset": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT"}) == (
        "fineweb-edu")
    assert fineweb.dataset_name({"type": "hub", "dataset": "HuggingFaceFW/fineweb"}) == "HuggingFaceFW/fineweb"
    assert fineweb.dataset_name({"type": "local", "files": []}) == "local"


def test_interrupt_just_after_the_manifest_leaves_nothing(tmp_path, enc, monkeypatch):
    real = fineweb.write_manifest

    def then_interrupt(out_dir, manifest):
        real(out_dir, manifest)
        raise KeyboardInterrupt

    monkeypatch.setattr(fineweb, "write_manifest", then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        fineweb.run_pipeline(DOCS, tmp_path, "p", 16, enc)
    assert not any(tmp_path.iterdir())  # shards and the manifest are found by name and removed


# ----------------------------------------------------------------------------------------------------------
# The char tokenizer


def char_stream(docs):
    """What --tokenizer char writes: each document's characters, then a blank line."""
    return "".join(d + "\n\n" for d in docs)


def test_gpt2_tokenizer_known_ids_and_roundtrip():
    enc = fineweb.get_tokenizer()
    assert enc.encode("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257
    assert enc.encode(" the") == [262] and enc.encode("\n") == [198] and enc.encode("!") == [0]
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.decode([50256]) == "<|endoftext|>"
    for text in ["", "Hello, world!", "naïve café — 日本語 🤖", "  two  spaces\n\ttab\r\n", "it's we'll they've"]:
        assert enc.decode(enc.encode(text)) == text


def test_gpt2_tokenizer_needs_no_network(monkeypatch):
    import tiktoken
    import tiktoken.load

    def no_network(*args, **kwargs):
        raise AssertionError("get_tokenizer tried to fetch or look up a remote encoding")

    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", no_network)
    enc = fineweb.get_tokenizer.__wrapped__(fineweb.GPT2_VOCAB_FILE)  # uncached: really builds it
    assert enc.encode(" the") == [262]


def test_gpt2_tokenizer_rejects_a_corrupted_vocab(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    data = bytearray(fineweb.GPT2_VOCAB_FILE.read_bytes())
    i = data.index(b" ", 1000) - 1  # a base64 character of some token
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="vocab|sha256"):
        fineweb.get_tokenizer(bad)
    with pytest.raises((ValueError, FileNotFoundError, OSError)):
        fineweb.get_tokenizer(tmp_path / "absent.tiktoken")


def test_char_tokenizer_and_tokenizer_from_manifest():
    tg = fineweb
    tok = tg.CharTokenizer("\n ab")
    assert (tok.name, tok.n_vocab, tok.eot_token, tok.chars) == ("char", 4, None, "\n ab")
    assert tok.encode_ordinary("ab a\n") == [2, 3, 1, 2, 0] == tok.encode("ab a\n", allowed_special="all")
    assert tok.decode(np.array([2, 3, 0], np.uint16)) == "ab\n"
    assert pickle.loads(pickle.dumps(tok)).encode_ordinary("ba") == [3, 2]  # pool workers receive it pickled
    with pytest.raises(ValueError, match="character 'c' is not in the vocabulary"):
        tok.encode_ordinary("abc")
    with pytest.raises(ValueError, match="token id 4 is not in 0..3"):
        tok.decode([4])
    for chars in ("ba", "aa", ""):
        with pytest.raises(ValueError, match="sorted, unique"):
            tg.CharTokenizer(chars)
    assert tg.tokenizer_from_manifest({"tokenizer": "gpt2"}) is tg.get_tokenizer()
    assert tg.tokenizer_from_manifest({}) is tg.get_tokenizer()  # manifests from before the key existed
    assert tg.tokenizer_from_manifest({"tokenizer": "char", "vocab": "ab"}).chars == "ab"
    for info in ({"tokenizer": "char"}, {"tokenizer": "bpe"}):
        with pytest.raises(ValueError, match="expected 'gpt2', or 'char'"):
            tg.tokenizer_from_manifest(info)


def test_char_input_txt_has_77_characters_and_splits_at_a_play(tmp_path):
    manifest = fineweb.main(["--local", str(ROOT / "input.txt"), "--tokenizer", "char", "--out_dir", str(tmp_path),
                             "--workers", "1", "--no_progress"])
    vocab = manifest["vocab"]
    assert (manifest["tokenizer"], manifest["vocab_size"], len(vocab), manifest["eot_token"]) == ("char", 77, 77, None)
    assert list(vocab) == sorted(set(vocab)) and "\n" in vocab
    _, stream, _ = read_shards(tmp_path)
    docs = list(fineweb.iter_documents([ROOT / "input.txt"]))
    tok = fineweb.tokenizer_from_manifest(manifest)
    assert tok.decode(stream) == char_stream(docs)
    assert manifest["small_corpus_split"]["at_document_boundary"]
    assert manifest["small_corpus_split"]["val_tokens"] == len(char_stream(docs[:1]))  # val is the first play


def test_cli_char_round_trips_with_spawned_workers(tmp_path):
    path = tmp_path / "c.jsonl"  # .jsonl: documents are taken as they are, surrounding whitespace included
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 3))
    out = tmp_path / "out"
    proc = run_cli("--local", path, "--out_dir", out, "--tokenizer", "char", "--shard_size", "300",
                   "--workers", 2, "--start_method", "spawn", "--no_progress")
    assert proc.returncode == 0, proc.stderr
    manifest, stream, _ = read_shards(out)
    check_layout(manifest, "c", 300)
    assert manifest["vocab"] == "".join(sorted(set(char_stream(DOCS))))
    assert (manifest["dataset"], manifest["eot_token"]) == ("local", None)
    assert manifest["vocab_size"] == len(manifest["vocab"])
    assert fineweb.load_tokenizer(manifest["vocab"]).decode(stream) == char_stream(DOCS * 3)


def test_char_small_corpus_cuts_at_a_document_start(tmp_path):
    docs = ["a" * 12, "b" * 86]  # with their blank lines: 14 + 88 characters, a boundary at 13.7%
    manifest = fineweb.run_pipeline(docs, tmp_path, "p", 1000, fineweb.load_tokenizer("\nab"))
    assert manifest["small_corpus_split"] == {"val_tokens": 14, "train_tokens": 88, "at_document_boundary": True}


def test_char_refuses_more_characters_than_uint16_holds(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text(many_characters(70_000))
    with pytest.raises(SystemExit) as exc:
        fineweb.main(["--local", str(path), "--tokenizer", "char", "--out_dir", str(tmp_path / "out")])
    assert exc.value.code.startswith("fineweb.py: error: the corpus has 67,953 distinct characters, more than the "
                                     "65,536 ids of a uint16 shard")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------
# CLI, end to end


def run_cli(*args, cwd=ROOT):
    return launcher.run([sys.executable, str(ROOT / "fineweb.py"), *args], cwd=cwd, env=child_env(), timeout=120)


def assert_error(proc, message, code=1):
    """Nonzero exit, no traceback, and the message on the last stderr line."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fineweb.py: error: ") and message in last, proc.stderr


def test_cli_txt_with_spawn(tmp_path, enc):
    path = tmp_path / "c.txt"
    path.write_text("\n\n\n".join(DOCS) + "\n")
    out = tmp_path / "out"
    proc = run_cli("--local", path, "--out_dir", out, "--workers", 2, "--start_method", "spawn")
    assert proc.returncode == 0, proc.stderr
    assert "small corpus" in proc.stdout and "done: 5 documents" in proc.stdout
    manifest, stream, _ = read_shards(out)
    expected = expected_stream(enc, [d.strip() for d in DOCS])
    assert np.array_equal(stream, expected)
    assert [s["file"] for s in manifest["shards"]] == ["c_val_000000.npy", "c_train_000001.npy"]
    assert manifest["source"]["files"] == [str(path.resolve())]


def test_cli_jsonl_and_parquet(tmp_path, enc):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl, parquet = tmp_path / "c.jsonl", tmp_path / "c.parquet"
    jsonl.write_text("".join(json.dumps({"content": d, "n": i}) + "\n" for i, d in enumerate(DOCS * 3)))
    pq.write_table(pa.table({"content": DOCS * 2, "id": list(range(10))}), parquet, row_group_size=3)
    out = tmp_path / "out"
    proc = run_cli("--local", jsonl, parquet, "--out_dir", out, "--workers", 2, "--shard_size", "1_00",
                   "--text_field", "content", "--prefix", "mix")
    assert proc.returncode == 0, proc.stderr
    manifest, stream, _ = read_shards(out)
    assert np.array_equal(stream, expected_stream(enc, DOCS * 5))  # files in the order given
    check_layout(manifest, "mix", 100)
    assert len(manifest["shards"]) > 3 and manifest["total_documents"] == 25


def test_cli_refuses_to_mix_corpora_and_overwrite_replaces(tmp_path, enc):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n\n\n".join(DOCS))
    b.write_text("a different corpus")
    out = tmp_path / "out"
    fineweb.main(["--local", str(a), "--out_dir", str(out), "--prefix", "x", "--shard_size", "16",
                  "--workers", "1", "--no_progress"])
    before = sorted(p.name for p in out.iterdir())
    assert len(before) > 3

    proc = run_cli("--local", b, "--out_dir", out, "--prefix", "x")
    assert_error(proc, "pass --overwrite to replace them, or choose another --out_dir")
    proc = run_cli("--local", b, "--out_dir", out, "--prefix", "y", "--overwrite")
    assert_error(proc, "holds shards with another prefix")
    assert sorted(p.name for p in out.iterdir()) == before  # nothing touched

    fineweb.main(["--local", str(b), "--out_dir", str(out), "--prefix", "x", "--overwrite",
                  "--workers", "1", "--no_progress"])
    manifest, stream, _ = read_shards(out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "x_train_000001.npy", "x_val_000000.npy"]
    assert np.array_equal(stream, expected_stream(enc, ["a different corpus"]))


def test_cli_manifest_alone_blocks_too(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / "c.txt").write_text("text")
    assert_error(run_cli("--local", tmp_path / "c.txt", "--out_dir", tmp_path), "pass --overwrite")


@pytest.mark.parametrize(
    "name, content, extra, message",
    [
        (None, None, [], "missing.txt: no such file"),
        ("c.csv", "text\n", [], "unknown file type '.csv'"),
        ("c.txt", "\n  \n\n", [], "no documents in"),
        ("c.jsonl", "", [], "no documents in"),
        ("c.jsonl", '{"body": "x"}\n', [], "c.jsonl:1: no field 'text'"),
        ("c.jsonl", "{not json}\n", [], "c.jsonl:1: malformed JSON line"),
        ("c.parquet", None, ["--text_field", "body"], "no column 'body' (columns: 'text')"),
    ],
)
def test_cli_input_errors(tmp_path, name, content, extra, message):
    if name is None:
        path = tmp_path / "missing.txt"
    elif name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / name
        pq.write_table(pa.table({"text": ["x"]}), path)
    else:
        path = tmp_path / name
        path.write_text(content)
    out = tmp_path / "out"
    assert_error(run_cli("--local", path, "--out_dir", out, *extra), message)
    assert not out.exists()


def make_path(tmp_path, kind):
    """A path of the given wrong kind in tmp_path."""
    path = tmp_path / f"{kind}.txt"
    if kind == "dir":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling":
        path.symlink_to("nowhere.txt")
    elif kind == "in_a_file":
        (tmp_path / "a_file").write_text("x")
        path = tmp_path / "a_file" / "sub"
    return path


@pytest.mark.parametrize(
    "kind, message",
    [
        ("dir", "dir.txt is a directory; name the files in it"),
        ("loop", "loop.txt: cannot use it ("),  # (Too many levels of symbolic links)
        ("dangling", "dangling.txt: a symbolic link to nowhere.txt, which does not exist"),
        ("in_a_file", "a_file/sub: cannot use it ("),  # (Not a directory)
    ],
)
def test_cli_local_path_of_the_wrong_kind(tmp_path, kind, message):
    out = tmp_path / "out"
    assert_error(run_cli("--local", make_path(tmp_path, kind), "--out_dir", out), message)
    assert not out.exists()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("loop", "--out_dir {path}: cannot use it ("),
        ("dangling", "--out_dir {path}: a symbolic link to nowhere.txt"),
        ("in_a_file", "--out_dir {path}: cannot use it ("),
    ],
)
def test_cli_out_dir_of_the_wrong_kind(tmp_path, kind, message):
    (tmp_path / "c.txt").write_text("text")
    path = make_path(tmp_path, kind)
    assert_error(run_cli("--local", tmp_path / "c.txt", "--out_dir", path), message.format(path=path))


@pytest.mark.skipif(ROOT_USER, reason="root reads a file whatever its mode")
def test_cli_unreadable_local_file(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("text")
    path.chmod(0)
    assert_error(run_cli("--local", path, "--out_dir", tmp_path / "out"), "secret.txt: cannot read it (")


@pytest.mark.skipif(ROOT_USER, reason="root writes in a directory whatever its mode")
def test_cli_read_only_out_dir(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert_error(run_cli("--local", ROOT / "input.txt", "--out_dir", out), f"no permission to write in {out}")
        assert not any(out.iterdir())
    finally:
        out.chmod(0o755)


def test_cli_full_disk_removes_what_was_written(tmp_path):
    # RLIMIT_FSIZE caps each file the child writes, root's too: input.txt's val shard (~82 kB) fits, its train
    # shard (~600 kB) fails part-way, as on a full disk.
    out = tmp_path / "out"
    proc = launcher.run([sys.executable, str(ROOT / "fineweb.py"), "--local", str(ROOT / "input.txt"), "--out_dir",
                         str(out), "--workers", "1", "--no_progress"], cwd=ROOT, env=child_env(), timeout=120,
                        file_size_limit=200_000)  # the write fails with EFBIG instead of killing the process
    assert_error(proc, f"cannot write {out}/input_train_000001.npy (File too large); free some space")
    assert not any(out.iterdir())  # the val shard was written, then removed; no temp file


@pytest.mark.parametrize(
    "args, message",
    [
        (["--local", "{c}", "--out", "{out}"], "unrecognized arguments: --out"),  # no prefix abbreviations
        (["--local", "{c}", "--out_dir", ""], "argument --out_dir: empty path"),
        (["--local", ""], "argument --local: empty path"),
        (["--tokenizer", "char"], "--tokenizer char needs --local files"),
    ],
)
def test_cli_argument_errors(tmp_path, args, message):
    (tmp_path / "c.txt").write_text("text")
    args = [a.format(c=tmp_path / "c.txt", out=tmp_path / "out") for a in args]
    assert_error(run_cli(*args), message, code=2)
    assert not (tmp_path / "out").exists()


def test_malformed_jsonl_mid_stream_reports_line_and_cleans_up(tmp_path, monkeypatch):
    # In-process (the tokenizer is already loaded) but through main() and a real pool: the reader's error, raised
    # while batches are in flight, must still come back as the one-line exit message.
    path = tmp_path / "c.jsonl"
    # More batches than are in flight with 2 workers: some are tokenised and written before the reader fails.
    n_good = fineweb.BATCH_DOCS * (2 * fineweb.IN_FLIGHT_PER_WORKER + 2) + 100
    good = "".join(json.dumps({"text": d}) + "\n" for d in (DOCS * n_good)[:n_good])
    path.write_text(good + '{"text": "cut off\n' + good)
    out = tmp_path / "out"
    written = []
    real_write = fineweb.ShardWriter._write

    def spy(self, tokens):
        real_write(self, tokens)
        written.append(self.shards[-1]["file"])

    monkeypatch.setattr(fineweb.ShardWriter, "_write", spy)
    with pytest.raises(SystemExit) as exc:
        fineweb.main(["--local", str(path), "--out_dir", str(out), "--workers", "2", "--shard_size", "5000",
                      "--no_progress"])
    message = exc.value.code
    assert message.startswith(f"fineweb.py: error: {path}:{n_good + 1}: malformed JSON line (")
    assert "\n" not in message
    assert len(written) > 2  # shards were written...
    assert not any(out.iterdir())  # ...and removed: no partial corpus without a manifest


@pytest.mark.parametrize("flag", ["--shard_size", "--workers"])
@pytest.mark.parametrize("value", ["0", "-3", "ten"])
def test_cli_rejects_non_positive_numbers(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exc:
        fineweb.main(["--local", str(ROOT / "input.txt"), "--out_dir", str(tmp_path), flag, value])
    assert exc.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())


def test_cli_help_states_the_rules():
    proc = run_cli("-h")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "separated by two or more consecutive blank lines" in text
    assert "If the whole corpus fits in one shard" in text
    assert "--overwrite" in text and "edu_fineweb10B" in text


# ----------------------------------------------------------------------------------------------------------
# Stopped runs: signals and dead workers


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """input.txt 30 times (~33 MB): seconds of tokenising, time to stop a run midway."""
    path = tmp_path_factory.mktemp("big") / "big.txt"
    path.write_text("\n\n\n".join([(ROOT / "input.txt").read_text()] * 30))
    return path


def start_run(corpus, out, *args):
    """fineweb.py with 2 workers in a session of its own (a signal to its group is a terminal's Ctrl-C), returned
    once it has written a shard."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "fineweb.py"), "--local", str(corpus), "--out_dir", str(out),
                             "--shard_size", "100_000", "--workers", "2", "--no_progress", *args], cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("*.npy")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def assert_stopped_cleanly(proc, out, message, within=30):
    """The run ends within `within` seconds, non-zero, with exactly one line on stderr, and leaves nothing."""
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {within} s later")
    assert proc.returncode != 0
    assert err.strip().splitlines() == [err.strip()] and err.startswith(message), err
    assert not any(out.iterdir())


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_stopping_a_run_removes_its_shards(tmp_path, big_corpus, how):
    out = tmp_path / "out"
    proc = start_run(big_corpus, out)
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)  # the parent only, as `kill` does
    else:
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, workers too, as a terminal does
    assert_stopped_cleanly(proc, out, f"fineweb.py: interrupted ({'SIGTERM' if how == 'SIGTERM' else 'SIGINT'}); "
                                      f"the shards written so far were removed")


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_worker_ends_the_run(tmp_path, big_corpus, start_method):
    if start_method not in fineweb.multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start_method} here")
    out = tmp_path / "out"
    proc = start_run(big_corpus, out, "--start_method", start_method)
    workers = [p for p in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(p.cmdline())]
    workers[0].kill()  # SIGKILL, as the out-of-memory killer does
    assert_stopped_cleanly(proc, out, "fineweb.py: error: a tokenizer worker died (killed by a signal")


def test_a_run_killed_outright_is_refused_by_the_trainer(tmp_path, big_corpus):
    """kill -9 leaves shards and no manifest; the marker fineweb.py made at its start stays too, so train_gpt2.py
    refuses the partial corpus (and fineweb.py --overwrite clears it)."""
    import run_files

    out = tmp_path / "out"
    proc = start_run(big_corpus, out)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert list(out.glob("*.npy")) and not (out / "manifest.json").exists()
    with pytest.raises(ValueError, match="has no manifest.json and holds an unfinished fineweb.py output"):
        run_files.find_shards(out)
    ours, _ = fineweb.find_outputs(out, "big")
    assert out / run_files.FINEWEB_INCOMPLETE in ours  # what --overwrite removes


def test_import_has_no_side_effects_and_no_torch():
    code = "import sys, fineweb; assert 'torch' not in sys.modules and 'train_gpt2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
