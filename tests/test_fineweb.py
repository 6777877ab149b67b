"""fineweb.py: documents, tokens, shards, manifest, the CLI and its errors."""

import errno
import hashlib
import itertools
import json
import os
import pickle
import signal
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
import pytest

import fineweb
import launcher
from helpers import child_env, default_stop_signals, many_characters

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


def run_main(*args, **kw):
    """fineweb.main in this process (the tokenizer is loaded already), without a progress bar."""
    return fineweb.main([str(a) for a in args] + ["--no_progress"], **kw)


def stopped(*args, **kw) -> str:
    """The one-line message of a fineweb.main run that stops."""
    with pytest.raises(SystemExit) as exc:
        run_main(*args, **kw)
    assert isinstance(exc.value.code, str) and "\n" not in exc.value.code, exc.value.code
    return exc.value.code


def files_of(directory) -> dict:
    """{name: bytes} of the files in a directory (its subdirectories: name -> None)."""
    return {p.name: None if p.is_dir() else p.read_bytes() for p in sorted(Path(directory).iterdir())
            if p.name != ".lock"}  # the lock file every run takes (run_files.lock_directory)


def listing(directory) -> list[str]:
    return sorted(files_of(directory))


def assert_same_corpus(out, ref):
    """out holds exactly ref's files, byte for byte, but for the manifest's "seconds" (time, not content)."""
    got, want = files_of(out), files_of(ref)
    assert sorted(got) == sorted(want)
    manifest, ref_manifest = (json.loads(files.pop("manifest.json")) for files in (got, want))
    assert {**manifest, "seconds": None} == {**ref_manifest, "seconds": None}
    assert got == want  # the shards


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
    arrays, crcs = fineweb.tokenize_batch(DOCS)
    assert crcs == [zlib.crc32(doc.encode()) for doc in DOCS]  # what a continued run checks skipped documents with
    for doc, arr in zip(DOCS, arrays, strict=True):
        assert arr.dtype == np.uint16
        assert arr.tolist() == [EOT] + enc.encode_ordinary(doc)
        assert EOT not in arr[1:]  # the literal text "<|endoftext|>" is not the special token


def test_pool_and_no_pool_agree(enc):
    docs = DOCS * 40
    serial = [a for arrays, _ in fineweb.tokenize_documents(docs, enc, workers=1) for a in arrays]
    pooled = [a for arrays, _ in fineweb.tokenize_documents(docs, enc, workers=2) for a in arrays]
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


def test_failed_run_keeps_its_finished_shards_and_records_where_they_end(tmp_path, enc):
    import run_files

    every = DOCS * 300  # more than a batch (fineweb.BATCH_DOCS): the first batches are written before the error

    def docs():
        yield from every
        raise fineweb.CorpusError("boom")

    with pytest.raises(fineweb.CorpusError, match="boom"):
        fineweb.run_pipeline(docs(), tmp_path, "p", 2000, enc)
    record = fineweb.read_progress(tmp_path)
    shards = record["shards"]
    assert len(shards) >= 3 and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [s["file"] for s in shards] + [run_files.FINEWEB_INCOMPLETE])  # no temp file, no unrecorded shard
    for s in shards:
        data = (tmp_path / s["file"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (s["bytes"], s["sha256"])
    # The record says where the finished tokens end: documents[:d], then skip_tokens of document d.
    d, skip = record["documents"], record["skip_tokens"]
    finished = np.concatenate([np.load(tmp_path / s["file"]) for s in shards])
    assert np.array_equal(finished, np.concatenate([expected_stream(enc, every[:d]), expected_stream(enc, [every[d]])[:skip]]))
    checksum = 0  # of the documents before d: a CRC-32 of their CRC-32s
    for doc in every[:d]:
        checksum = zlib.crc32(zlib.crc32(doc.encode()).to_bytes(4, "little"), checksum)
    assert record["checksum"] == checksum
    with pytest.raises(ValueError, match="holds an unfinished fineweb.py output"):
        run_files.find_shards(tmp_path)  # the trainer still refuses it


def test_shards_carry_their_sha256_and_the_manifest_a_fingerprint(tmp_path, enc):
    manifest = fineweb.run_pipeline(DOCS * 3, tmp_path, "p", 40, enc)
    lines = []
    for s in manifest["shards"]:
        assert s["sha256"] == hashlib.sha256((tmp_path / s["file"]).read_bytes()).hexdigest()
        lines.append(f"{s['file']} {s['tokens']} {s['sha256']}")
    assert manifest["fingerprint"] == hashlib.sha256("\n".join(lines).encode()).hexdigest()
    assert len(manifest["shards"]) > 3


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


def test_interrupt_just_after_the_manifest_leaves_a_finished_corpus(tmp_path, monkeypatch):
    import run_files

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n\n".join(DOCS))
    real = fineweb.write_manifest

    def then_interrupt(out_dir, manifest):
        real(out_dir, manifest)
        raise KeyboardInterrupt

    monkeypatch.setattr(fineweb, "write_manifest", then_interrupt)
    out = tmp_path / "out"
    assert stopped("--local", corpus, "--out_dir", out, "--shard_size", 16).startswith("fineweb.py: interrupted")
    monkeypatch.undo()
    splits, manifest, _ = run_files.find_shards(out)  # the manifest is the commit point: the trainer takes it
    assert len(splits["train"]) == len(manifest["shards"]) - 1 > 2
    message = stopped("--local", corpus, "--out_dir", out, "--shard_size", 16)  # nothing to continue
    assert "already holds a finished corpus (manifest.json); pass --overwrite to replace it" in message


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
    before = listing(out)
    assert len(before) > 3

    proc = run_cli("--local", b, "--out_dir", out, "--prefix", "x")
    assert_error(proc, "already holds a finished corpus (manifest.json); pass --overwrite to replace it, or choose "
                       "another --out_dir")
    proc = run_cli("--local", b, "--out_dir", out, "--prefix", "y", "--overwrite")
    assert_error(proc, "holds shards with another prefix")
    assert listing(out) == before  # nothing touched

    fineweb.main(["--local", str(b), "--out_dir", str(out), "--prefix", "x", "--overwrite",
                  "--workers", "1", "--no_progress"])
    manifest, stream, _ = read_shards(out)
    assert listing(out) == ["manifest.json", "x_train_000001.npy", "x_val_000000.npy"]
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


def test_cli_full_disk_then_the_same_command_finishes(tmp_path):
    # RLIMIT_FSIZE caps each file the child writes, root's too: input.txt's val shard (~82 kB) fits, its train
    # shard (~600 kB) fails part-way, as on a full disk. A small corpus's shards are written together at the end,
    # so none was finished.
    out = tmp_path / "out"
    args = ["--local", ROOT / "input.txt", "--out_dir", out, "--workers", "1"]
    proc = launcher.run([sys.executable, str(ROOT / "fineweb.py"), *args, "--no_progress"], cwd=ROOT, env=child_env(),
                        timeout=120, file_size_limit=200_000)  # the write fails with EFBIG instead of killing the process
    assert_error(proc, f"cannot write {out}/input_train_000001.npy (File too large); free some space; no shard was "
                       f"finished: rerun the same command to start again")
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    manifest = run_main(*args)
    assert [hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()[:16] for s in manifest["shards"]] == [
        "7a756ad351abc096", "955c2300c3dd94ba"]  # as test_input_txt_yields_val_and_train_with_default_shard_size
    assert listing(out) == ["input_train_000001.npy", "input_val_000000.npy", "manifest.json"]


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


def test_malformed_jsonl_mid_stream_keeps_the_shards_and_the_fixed_file_continues(tmp_path, monkeypatch):
    # In-process (the tokenizer is already loaded) but through main() and a real pool: the reader's error, raised
    # while batches are in flight, must still come back as the one-line exit message.
    path = tmp_path / "c.jsonl"
    # More batches than are in flight with 2 workers: some are tokenised and written before the reader fails.
    n_good = fineweb.BATCH_DOCS * (2 * fineweb.IN_FLIGHT_PER_WORKER + 2) + 100
    good = "".join(json.dumps({"text": d}) + "\n" for d in (DOCS * n_good)[:n_good])
    path.write_text(good + '{"text": "cut off\n' + good)
    out, ref = tmp_path / "out", tmp_path / "ref"
    written = []
    real_write = fineweb.ShardWriter._write

    def spy(self, tokens):
        real_write(self, tokens)
        written.append(self.shards[-1]["file"])

    monkeypatch.setattr(fineweb.ShardWriter, "_write", spy)
    args = ["--local", path, "--workers", "2", "--shard_size", "5000"]
    message = stopped(*args, "--out_dir", out)
    kept = fineweb.read_progress(out)["shards"]
    assert message.startswith(f"fineweb.py: error: {path}:{n_good + 1}: malformed JSON line (")
    assert message.endswith(f"); {len(kept)} finished shards kept in {out}: rerun the same command to continue")
    assert len(kept) > 2 and [s["file"] for s in kept] == written[: len(kept)]
    assert all((out / s["file"]).is_file() for s in kept)
    # The line is mended; the documents before it are unchanged, so the same command continues.
    path.write_text(good + '{"text": "cut off"}\n' + good)
    run_main(*args, "--out_dir", out)
    run_main(*args, "--out_dir", ref)
    assert_same_corpus(out, ref)


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
# Continuing a stopped run


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """A .jsonl of 6,000 numbered documents (~270k tokens: six batches of fineweb.BATCH_DOCS, 27 shards of
    MANY_SHARD tokens) and the output of an uninterrupted run of many_args on it."""
    d = tmp_path_factory.mktemp("many")
    path = d / "many.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i}: {DOCS[i % len(DOCS)]}"}) + "\n" for i in range(6000)))
    run_main(*many_args(path, d / "ref"))
    return path, d / "ref"


MANY_SHARD = 10_000


def many_args(corpus, out, *more):
    return ["--local", corpus, "--out_dir", out, "--shard_size", MANY_SHARD, "--workers", "1", *more]


def fail_reader_at(monkeypatch, document: int, error: BaseException):
    """The .jsonl reader raises `error` when it reaches document `document` (counted from the file's first)."""
    real = fineweb.iter_jsonl_documents

    def reader(path, text_field="text", tell=None):
        for i, doc in enumerate(real(path, text_field, tell)):
            if i == document:
                raise error
            yield doc

    monkeypatch.setitem(fineweb.READERS, ".jsonl", reader)


def fail_after_shard(monkeypatch, index: int):
    """KeyboardInterrupt right after shard `index` is on disk, before the progress record lists it."""
    real = fineweb.ShardWriter._write

    def write(self, tokens):
        real(self, tokens)
        if len(self.shards) - 1 == index:
            raise KeyboardInterrupt

    monkeypatch.setattr(fineweb.ShardWriter, "_write", write)


def kept(n, where):
    """How a stopped run's message ends."""
    return f"; {n} finished shard{'s' if n != 1 else ''} kept in {where}: rerun the same command to continue"


def assert_progress_matches(out, ref):
    """The finished shards of a stopped run are the reference's first shards, as the progress record says."""
    record = fineweb.read_progress(out)
    ref_manifest = json.loads((ref / "manifest.json").read_text())
    assert record["shards"] and [{k: s[k] for k in fineweb.SHARD_KEYS} for s in record["shards"]] == (
        ref_manifest["shards"][: len(record["shards"])])
    for s in record["shards"]:
        assert (out / s["file"]).read_bytes() == (ref / s["file"]).read_bytes()
    return record


@pytest.mark.parametrize("stops, workers", [
    ([("document", 1500)], 1),  # in the second batch: the shards of the first are finished
    ([("document", 5500)], 2),  # in a pool, with 4 batches in flight: the first two are written
    ([("shard", 1), ("shard", 3)], 1),  # right after a shard's file is written, before its record: twice
    ([("document", 1100), ("shard", 9), ("document", 4000)], 1),  # three stops, each continued
])
def test_a_stopped_run_continues_to_the_bytes_of_an_uninterrupted_one(tmp_path, monkeypatch, many, stops, workers):
    corpus, ref = many
    out = tmp_path / "out"
    for kind, where in stops:
        with monkeypatch.context() as patch:
            if kind == "document":
                fail_reader_at(patch, where, KeyboardInterrupt())
            else:
                fail_after_shard(patch, where)
            message = stopped(*many_args(corpus, out, "--workers", workers))
        record = assert_progress_matches(out, ref)
        n = len(record["shards"])
        assert message == f"fineweb.py: interrupted (SIGINT){kept(n, out)}"
        if kind == "shard":
            assert n == where  # shard `where` is on disk but not in the record: the continued run writes it again
    run_main(*many_args(corpus, out))  # --workers 1: the number of workers is not a setting that must match
    assert_same_corpus(out, ref)


def test_a_stopped_char_run_continues_to_the_same_bytes(tmp_path, monkeypatch, many):
    corpus, _ = many
    out, ref = tmp_path / "out", tmp_path / "ref"
    with monkeypatch.context() as patch:
        fail_after_shard(patch, 4)  # (the reader is also the char tokenizer's first pass, so stop the writer)
        stopped(*many_args(corpus, out, "--tokenizer", "char"))
    record = fineweb.read_progress(out)
    assert len(record["shards"]) == 4 and record["skip_tokens"] > 0
    assert record["settings"]["vocab"] == fineweb.corpus_characters(fineweb.iter_documents([corpus]))
    run_main(*many_args(corpus, out, "--tokenizer", "char"))
    run_main(*many_args(corpus, ref, "--tokenizer", "char"))
    assert_same_corpus(out, ref)


def test_a_small_corpus_stopped_before_its_shards_starts_again(tmp_path, monkeypatch, many):
    # A corpus that fits in one shard is split when it ends: until then no shard is finished.
    corpus, _ = many
    args = many_args(corpus, tmp_path / "out", "--shard_size", "1_000_000")
    fail_reader_at(monkeypatch, 2000, KeyboardInterrupt())
    message = stopped(*args)
    assert message.endswith("; no shard was finished: rerun the same command to start again")
    monkeypatch.undo()
    manifest = run_main(*args)
    run_main(*many_args(corpus, tmp_path / "ref", "--shard_size", "1_000_000"))
    assert manifest["small_corpus_split"]["at_document_boundary"]
    assert_same_corpus(tmp_path / "out", tmp_path / "ref")


def test_a_full_disk_after_some_shards_keeps_them(tmp_path, monkeypatch, many):
    import run_files

    corpus, ref = many
    out = tmp_path / "out"
    real = run_files.atomic_write

    def disk_fills(path, write):
        if path.name.endswith("_000004.npy"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, write)

    monkeypatch.setattr(run_files, "atomic_write", disk_fills)
    assert stopped(*many_args(corpus, out)) == (
        f"fineweb.py: error: cannot write {out}/many_train_000004.npy (No space left on device); free some space; "
        f"4 finished shards kept in {out}: rerun the same command to continue")
    monkeypatch.undo()
    assert_progress_matches(out, ref)
    run_main(*many_args(corpus, out))
    assert_same_corpus(out, ref)


def stop_many(monkeypatch, corpus, out, document=1500):
    with monkeypatch.context() as patch:
        fail_reader_at(patch, document, KeyboardInterrupt())
        stopped(*many_args(corpus, out))
    return fineweb.read_progress(out)


@pytest.mark.parametrize("change, difference", [
    (["--shard_size", "7000"], "shard_size 10000 there, 7000 here"),
    (["--tokenizer", "char"], 'tokenizer "gpt2" there, "char" here'),
    (["--dataset_name", "fineweb-edu"], 'dataset "local" there, "fineweb-edu" here'),
    (["--local", "{other}", "--prefix", "many"], "source.files"),  # the same documents in another file
    (["--text_field", "body"], None),  # the first document has no such field: refused before anything else
])
def test_continuing_with_other_settings_is_refused(tmp_path, monkeypatch, many, change, difference):
    corpus, _ = many
    out = tmp_path / "out"
    stop_many(monkeypatch, corpus, out)
    before = files_of(out)
    other = tmp_path / "other.jsonl"
    other.write_bytes(corpus.read_bytes())
    message = stopped(*many_args(corpus, out, *(a.format(other=other) for a in change)))
    if difference:
        assert message.startswith(f"fineweb.py: error: {out} holds an unfinished run with other settings ({difference}")
        assert message.endswith("; pass --overwrite to start over, or use the same command to continue")
    assert files_of(out) == before


def test_continuing_after_a_finished_shard_changed_is_refused(tmp_path, monkeypatch, many):
    corpus, ref = many
    out = tmp_path / "out"
    stop_many(monkeypatch, corpus, out)
    shard = out / "many_train_000002.npy"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # one bit of the last token
    shard.write_bytes(bytes(data))
    assert stopped(*many_args(corpus, out)) == (
        f"fineweb.py: error: cannot continue the unfinished run in {out}: {shard} changed after it was written (its "
        f"sha256 is not the progress record's); pass --overwrite to start over")
    shard.write_bytes(shard.read_bytes()[:-2])
    assert "has 20,126 bytes, the progress record says 20,128" in stopped(*many_args(corpus, out))
    shard.unlink()
    assert f"{shard} is missing" in stopped(*many_args(corpus, out))
    run_main(*many_args(corpus, out, "--overwrite"))
    assert_same_corpus(out, ref)


def test_continuing_on_an_input_that_changed_is_refused(tmp_path, monkeypatch, many):
    corpus, _ = many
    changed = tmp_path / "c.jsonl"
    lines = corpus.read_text().splitlines(keepends=True)
    changed.write_text("".join(lines))
    out = tmp_path / "out"
    record = stop_many(monkeypatch, changed, out)
    d = record["documents"]
    changed.write_text("".join(lines[:10] + [json.dumps({"text": "another document"}) + "\n"] + lines[11:]))
    assert stopped(*many_args(changed, out)) == (
        f"fineweb.py: error: the first {d:,} documents of the input are not those read before (their checksum "
        f"differs): it changed since; pass --overwrite to start over")
    changed.write_text("".join(lines[:d - 1]))
    assert f"the input ended after {d - 1:,} documents, but the run had read {d:,}" in stopped(*many_args(changed, out))
    assert record["skip_tokens"] > 0  # the last finished shard ends inside document d: it is checked too
    changed.write_text("".join(lines[:d] + [json.dumps({"text": "another document"}) + "\n"] + lines[d + 1:]))
    assert f"document {d:,} of the input is not the one the last finished shard ends with" in stopped(
        *many_args(changed, out))
    changed.write_text("".join(lines))  # as it was: the same command continues
    run_main(*many_args(changed, out))


# ----------------------------------------------------------------------------------------------------------
# The hub stream: retries


def numbered_dataset(directory, n=2500, card=True):
    """A dataset directory the hub code path reads offline: n numbered documents; its card gives the split's size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir()
    pq.write_table(pa.table({"text": [f"{i}: {DOCS[i % len(DOCS)]}" for i in range(n)]}), directory / "train.parquet",
                   row_group_size=300)
    if card:
        (directory / "README.md").write_text(
            f"---\ndataset_info:\n  features:\n  - name: text\n    dtype: string\n  splits:\n  - name: train\n"
            f"    num_examples: {n}\n---\n")
    return directory


def flaky_stream(monkeypatch, failures: list, seen: list):
    """The hub stream raises httpx.RemoteProtocolError (as huggingface_hub re-raises it after its own retries)
    when it reaches each document number in failures, in turn; seen gets the number of every document streamed."""
    import httpx

    real = fineweb.HubSource._documents

    def documents(self, rows):
        for text in real(self, rows):
            i = int(text.split(":", 1)[0])
            if failures and failures[0] == i:
                failures.pop(0)
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            seen.append(i)
            yield text

    monkeypatch.setattr(fineweb.HubSource, "_documents", documents)


def hub_args(data, out):
    return ["--dataset", data, "--name", "", "--out_dir", out, "--shard_size", MANY_SHARD, "--workers", "1"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub")
    data = numbered_dataset(d / "ds")
    run_main(*hub_args(data, d / "ref"))
    return data, d / "ref"


def test_a_broken_hub_stream_is_reopened_where_it_broke(tmp_path, monkeypatch, hub, capsys):
    data, ref = hub
    out = tmp_path / "out"
    seen, waits = [], []
    flaky_stream(monkeypatch, [1500, 1500, 2300], seen)
    run_main(*hub_args(data, out), sleep=waits.append)
    assert_same_corpus(out, ref)
    assert waits == [2.0, 4.0, 2.0]  # backoff doubles while the same break lasts, and starts over after it
    # Reopened at the stream's state saved every 1,000 documents, not at its start: documents 1000..1499 are
    # streamed again twice, 2000..2299 once.
    assert len(seen) == 2500 + 2 * 500 + 300 and seen.count(999) == 1 and seen.count(1200) == 3
    assert "reading the documents failed at document 1,500 (httpx.RemoteProtocolError: peer closed connection " \
           "without sending complete message body); retry 1/5 in 2 s" in capsys.readouterr().out


def test_a_hub_stream_that_stays_broken_stops_in_one_line_and_continues_later(tmp_path, monkeypatch, hub):
    data, ref = hub
    out = tmp_path / "out"
    waits = []
    with monkeypatch.context() as patch:
        flaky_stream(patch, [2100] * 6, [])
        message = stopped(*hub_args(data, out), sleep=waits.append)
    record = assert_progress_matches(out, ref)
    assert message == (f"fineweb.py: error: reading the documents failed at document 2,100 (httpx.RemoteProtocolError: "
                       f"peer closed connection without sending complete message body) and 5 retries did not help; "
                       f"{len(record['shards'])} finished shards kept in {out}: rerun the same command to continue")
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert record["stream"]["documents"] == 1000 and record["documents"] >= 1000  # a saved place in the stream
    seen = []
    with monkeypatch.context() as patch:
        flaky_stream(patch, [], seen)
        run_main(*hub_args(data, out))
    assert_same_corpus(out, ref)
    assert seen[0] == 0 and seen[1] == 1000  # the first document (read before the plan), then from the saved state


def test_which_errors_are_worth_a_retry():
    import httpx

    class Response:
        def __init__(self, status_code):
            self.status_code = status_code

    def http_error(status):
        error = OSError(f"{status} error")
        error.response = Response(status)
        return error

    for error in (ConnectionResetError(), TimeoutError(), OSError("read failed"), httpx.RemoteProtocolError("x"),
                  httpx.ReadTimeout("x"), http_error(503), http_error(429)):
        assert fineweb.is_transient(error), error
    offline = ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu' on the Hub (OfflineModeIsEnabled)")
    for error in (FileNotFoundError(), PermissionError(), ValueError(), fineweb.CorpusError("x"), http_error(404),
                  KeyError("text"), offline):
        assert not fineweb.is_transient(error), error


# ----------------------------------------------------------------------------------------------------------
# --overwrite: the new corpus beside the old one


def test_a_stopped_overwrite_leaves_the_old_corpus_and_the_same_command_finishes(tmp_path, monkeypatch, many):
    import run_files

    corpus, _ = many
    out, ref = tmp_path / "out", tmp_path / "ref"
    run_main(*many_args(corpus, out, "--shard_size", 7000))  # the old corpus
    (out / "notes.txt").write_text("someone's notes beside the corpus")
    old = files_of(out)
    new_args = many_args(corpus, out, "--overwrite")
    with monkeypatch.context() as patch:
        fail_reader_at(patch, 2500, KeyboardInterrupt())
        message = stopped(*new_args)
    staging = out / ".fineweb-new-many"
    assert message.endswith(f"finished shards kept in {staging} ({out} is unchanged): rerun the same command to continue")
    assert files_of(out) == {**old, staging.name: None}  # byte for byte
    assert run_files.find_shards(out)[1]["shard_size"] == 7000  # the trainer still reads the old corpus
    assert_progress_matches(staging, many[1])
    run_main(*new_args)  # continues the new corpus, then swaps it in
    run_main(*many_args(corpus, ref))
    (ref / "notes.txt").write_text("someone's notes beside the corpus")
    assert_same_corpus(out, ref)


def test_an_overwrite_cut_short_at_any_step_of_the_swap_recovers(tmp_path, monkeypatch):
    """Between any two renames of the swap, the trainer sees the old corpus, the new one, or a directory it refuses;
    the same command run again completes the swap (without tokenising again)."""
    import run_files

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 8))
    args = lambda out, size, *more: ["--local", corpus, "--out_dir", out, "--shard_size", size, "--workers", 1, *more]  # noqa: E731
    ref = tmp_path / "ref"
    run_main(*args(ref, 300))
    new = files_of(ref)
    (ref / "notes.txt").write_text("mine")
    ready = tmp_path / "ready"  # the old corpus (and a user's file), the new one complete beside it, not swapped
    run_main(*args(ready, 500))
    (ready / "notes.txt").write_text("mine")
    old = files_of(ready)
    real_swap = fineweb.finish_swap

    def no_swap(out_dir, prefix):
        if (fineweb.staging_dir(out_dir, prefix) / "manifest.json").exists():
            raise KeyboardInterrupt
        return real_swap(out_dir, prefix)

    with monkeypatch.context() as patch:
        patch.setattr(fineweb, "finish_swap", no_swap)
        stopped(*args(ready, 300, "--overwrite"))
    real_replace = os.replace
    for cut in itertools.count():
        out = tmp_path / f"cut{cut}"
        shutil.copytree(ready, out, symlinks=True)
        calls = []

        def replace(src, dst):
            if len(calls) == cut:
                raise KeyboardInterrupt
            calls.append(dst)
            real_replace(src, dst)

        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", replace)
            try:
                fineweb.finish_swap(out, "c")
                done = True
            except KeyboardInterrupt:
                done = False
        try:
            _, manifest, _ = run_files.find_shards(out)
            assert manifest is not None
            visible = {s["file"]: (out / s["file"]).read_bytes() for s in manifest["shards"]}
            assert visible in ({k: v for k, v in new.items() if k != "manifest.json"},
                               {k: v for k, v in old.items() if k.endswith(".npy")})
        except ValueError as e:
            assert "holds an unfinished fineweb.py output" in str(e)
        if done:
            break
        manifest = run_main(*args(out, 300, "--overwrite"))  # finishes the swap: nothing left to tokenise
        assert manifest == json.loads((ready / ".fineweb-new-c" / "manifest.json").read_text())
        assert_same_corpus(out, ref)
    assert cut > 10  # every shard and the manifest moved out, every new one moved in


# ----------------------------------------------------------------------------------------------------------
# Progress bar sizes, a local copy of FineWeb-Edu


def test_local_files_are_measured_in_bytes_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    txt, jsonl, parquet = tmp_path / "a.txt", tmp_path / "b.jsonl", tmp_path / "c.parquet"
    txt.write_text("\n\n\n".join(DOCS * 40))
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS * 200))
    pq.write_table(pa.table({"text": DOCS * 300}), parquet, row_group_size=100)
    paths = [txt, jsonl, parquet]
    source = fineweb.LocalSource(paths)
    assert source.total == sum(p.stat().st_size for p in paths) and source.unit == "B"
    positions = [source.bytes_read for _ in source.open()]
    assert positions == sorted(positions) and positions[-1] <= source.total  # never back, never past the end
    assert 0 < positions[len(positions) // 2] < source.total
    assert source.bytes_read == source.total  # all read


def test_the_hub_split_size_comes_from_the_dataset_card_or_is_unknown(tmp_path):
    for card, total in ((True, 700), (False, None)):
        data = numbered_dataset(tmp_path / f"ds{card}", n=700, card=card)
        source = fineweb.HubSource(str(data), None, "train")
        docs = source.open()
        assert next(docs).startswith("0: ") and source.total == total
        docs.close()


def test_a_local_copy_of_fineweb_edu_is_recorded_as_fineweb_edu(tmp_path, enc):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # The hub repository's layout: sample/10BT/*.parquet with a text column among others.
    sample = tmp_path / "fineweb-edu" / "sample" / "10BT"
    sample.mkdir(parents=True)
    for i in range(2):
        pq.write_table(pa.table({"text": DOCS, "id": [f"<urn:{i}:{j}>" for j in range(5)], "score": [3.5] * 5}),
                       sample / f"00{i}_00000.parquet")
    files = sorted(sample.glob("*.parquet"))
    manifest = run_main("--local", *files, "--dataset_name", "fineweb-edu", "--out_dir", tmp_path / "out")
    assert manifest["dataset"] == "fineweb-edu"  # plot.py draws GPT-2's reference lines for it
    assert manifest["source"]["type"] == "local" and manifest["source"]["files"] == [str(f) for f in files]
    assert np.array_equal(read_shards(tmp_path / "out")[1], expected_stream(enc, DOCS * 2))
    assert run_main("--local", *files, "--out_dir", tmp_path / "plain")["dataset"] == "local"


def test_the_marker_name_matches_run_files():
    import run_files

    assert fineweb.FINEWEB_INCOMPLETE_NAME == run_files.FINEWEB_INCOMPLETE


# ----------------------------------------------------------------------------------------------------------
# Stopped runs: signals and dead workers


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """input.txt 4 times (~4.4 MB, ~1.4M tokens in 28 shards: a second or two of tokenising, time to stop a run
    midway) and the output of an uninterrupted run of start_run's command, to compare a continued run with."""
    d = tmp_path_factory.mktemp("big")
    path = d / "big.txt"
    path.write_text("\n\n\n".join([(ROOT / "input.txt").read_text()] * 4))
    run_main(*BIG_ARGS(path, d / "ref"))
    return path, d / "ref"


def BIG_ARGS(corpus, out):  # noqa: N802  (a constant's spelling: the command the big_corpus tests run)
    return ["--local", corpus, "--out_dir", out, "--shard_size", "50_000", "--workers", "2"]


def start_run(corpus, out, *args, prefix=()):
    """fineweb.py with 2 workers in a session of its own (a signal to its group is a terminal's Ctrl-C or hangup),
    started by `prefix` (e.g. nohup), returned once its progress record lists a finished shard."""
    proc = subprocess.Popen([*prefix, sys.executable, str(ROOT / "fineweb.py"), *map(str, BIG_ARGS(corpus, out)),
                             "--no_progress", *args], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_stop_signals)
    deadline = time.monotonic() + 120
    while not (fineweb.read_progress(out) or {}).get("shards"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def assert_stopped_keeping_its_shards(proc, out, message, within=30):
    """The run ends within `within` seconds, non-zero, with exactly one line on stderr that says how to continue,
    and its progress record lists the finished shards it kept."""
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"still running {within} s later")
    assert proc.returncode != 0
    assert err.strip().splitlines() == [err.strip()] and err.startswith(message), err
    record = fineweb.read_progress(out)
    assert kept(len(record["shards"]), out) in err
    assert record["shards"] and all((out / s["file"]).stat().st_size == s["bytes"] for s in record["shards"])
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C", "hangup", "SLURM's warning"])
def test_a_stopped_run_keeps_its_shards_and_the_same_command_finishes_it(tmp_path, big_corpus, how):
    corpus, ref = big_corpus
    out = tmp_path / "out"
    proc = start_run(corpus, out)
    name = {"SIGTERM": "SIGTERM", "Ctrl-C": "SIGINT", "hangup": "SIGHUP", "SLURM's warning": "SIGUSR1"}[how]
    if how == "SIGTERM":
        os.kill(proc.pid, signal.SIGTERM)  # the parent only, as `kill` does
    else:  # the whole group, workers too, as a terminal (or SLURM's --signal=USR1@120) does
        os.killpg(proc.pid, getattr(signal, name))
    assert_stopped_keeping_its_shards(proc, out, f"fineweb.py: interrupted ({name}); ")
    run_main(*BIG_ARGS(corpus, out))
    assert_same_corpus(out, ref)


@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup on PATH")
def test_a_run_started_with_nohup_tokenises_through_a_hangup(tmp_path, big_corpus):
    """`nohup python fineweb.py ...` asks that a closed terminal not end the run: its workers and itself ignore
    the hangup and the corpus is the uninterrupted run's."""
    corpus, ref = big_corpus
    out = tmp_path / "out"
    proc = start_run(corpus, out, prefix=["nohup"])
    os.killpg(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert_same_corpus(out, ref)


def _die_while_sending_a_result():
    """A pool task that dies as the out-of-memory killer can catch a worker: part-way through sending its result
    (a length header promising 1 MiB, then 10 bytes), with another worker still holding the pipe open."""
    import gc
    import struct
    from multiprocessing.queues import SimpleQueue

    results = next(o for o in gc.get_objects() if isinstance(o, SimpleQueue))  # the worker's result queue
    results._writer._send(struct.pack("!i", 1 << 20) + b"x" * 10)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_while_sending_its_result_breaks_the_pool_instead_of_hanging():
    """The case ProcessPoolExecutor misses (its manager thread waits forever for the rest of the message):
    pool_result still ends with BrokenProcessPool, within a few of its checks."""
    import multiprocessing
    import threading

    pool = fineweb.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    outcome = []
    try:
        pool.submit(int).result()  # both workers started and idle
        waiter = threading.Thread(target=lambda: outcome.append(
            pytest.raises(fineweb.BrokenProcessPool, fineweb.pool_result, pool.submit(_die_while_sending_a_result),
                          pool, check_every=0.2)), daemon=True)
        waiter.start()
        waiter.join(timeout=30)
        assert outcome, "pool_result still waiting 30 s after the worker died"
    finally:
        for p in list((pool._processes or {}).values()):
            p.kill()
        pool.shutdown(wait=bool(outcome))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_worker_ends_the_run_keeping_its_shards(tmp_path, big_corpus, start_method):
    if start_method not in fineweb.multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start_method} here")
    out = tmp_path / "out"
    proc = start_run(big_corpus[0], out, "--start_method", start_method)
    workers = [p for p in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(p.cmdline())]
    workers[0].kill()  # SIGKILL, as the out-of-memory killer does
    assert_stopped_keeping_its_shards(proc, out, "fineweb.py: error: a tokenizer worker died (killed by a signal")


def test_a_run_killed_outright_is_refused_by_the_trainer_and_continued_by_the_same_command(tmp_path, big_corpus):
    """kill -9 leaves shards and no manifest; the marker fineweb.py made at its start, holding its progress
    record, stays too: train_gpt2.py refuses the partial corpus and the same command continues it."""
    import run_files

    corpus, ref = big_corpus
    out = tmp_path / "out"
    proc = start_run(corpus, out)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert list(out.glob("*.npy")) and not (out / "manifest.json").exists()
    with pytest.raises(ValueError, match="has no manifest.json and holds an unfinished fineweb.py output"):
        run_files.find_shards(out)
    assert fineweb.read_progress(out)["settings"]["shard_size"] == 50_000
    run_main(*BIG_ARGS(corpus, out))
    assert_same_corpus(out, ref)


def test_import_has_no_side_effects_and_no_torch():
    code = "import sys, fineweb; assert 'torch' not in sys.modules and 'train_gpt2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
