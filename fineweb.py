"""
Pre-tokenise a text corpus with the GPT-2 tokenizer (or one token per character) into uint16 .npy shards
for train_gpt2.py.

    python fineweb.py                          # FineWeb-Edu sample-10BT (streamed) -> edu_fineweb10B/
    python fineweb.py --local input.txt        # the built-in Shakespeare corpus -> data/input/
    python fineweb.py --local a.jsonl b.parquet --out_dir data/mine --prefix mine
    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char
    python fineweb.py --local fineweb-edu/sample/10BT/*.parquet --dataset_name fineweb-edu --out_dir edu_fineweb10B

Every document becomes <|endoftext|> followed by its tokens (with --tokenizer char: its characters followed
by a blank line); the token stream is cut into shards of --shard_size tokens named
{prefix}_{split}_{index:06d}.npy. Shard 000000 is the validation split, the rest are train; a document may span
any number of shards and the last shard holds the remainder. A corpus that fits in one shard is split in two
instead (see --help). manifest.json, written last, lists the shards with their sha256 and the corpus's fingerprint.

Nothing finished is thrown away: a run that fails or is stopped (Ctrl-C, SIGTERM, a lost connection, a dead
worker, a full disk) keeps its finished shards and a progress record, and the same command continues it, ending
with the bytes an uninterrupted run writes. --overwrite builds the new corpus beside the old one and swaps it in
once complete.

Importing this module does nothing but define things; workers are plain top-level functions, so the
`spawn` start method (macOS, Windows) works as well as `fork`.
"""

from __future__ import annotations

import argparse
import array
import base64
import codecs
import collections
import contextlib
import dataclasses
import errno
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import re
import signal
import stat
import textwrap
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError  # the builtin TimeoutError from Python 3.11
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np

HERE = Path(__file__).resolve().parent

DEFAULT_DATASET = "HuggingFaceFW/fineweb-edu"
DEFAULT_NAME = "sample-10BT"
DEFAULT_SPLIT = "train"
DEFAULT_OUT_DIR = HERE / "edu_fineweb10B"
DEFAULT_PREFIX = "edufineweb"
DEFAULT_SHARD_SIZE = 100_000_000
MANIFEST = "manifest.json"
DTYPE = np.uint16  # GPT-2 ids are < 50257 < 2**16: half the disk and RAM of int32
LOCAL_EXTENSIONS = (".txt", ".jsonl", ".parquet")
TOKENIZERS = ("gpt2", "char")
# The char tokenizer has no <|endoftext|>: each document is followed by a blank line instead.
DOC_SEPARATOR = "\n\n"

# A corpus that fits in one shard still needs a val and a train split: val takes about this fraction of it.
SMALL_VAL_FRACTION = 0.1
# ...cut at a document boundary when one lies in this window (as fractions of the corpus), else mid-document.
SMALL_VAL_WINDOW = (0.05, 0.2)

# The hub stream, when it breaks (datasets and huggingface_hub retried already): reopened where it broke this many
# times, waiting RETRY_DELAY seconds, then twice that, ... (2 + 4 + 8 + 16 + 32 s) before the run stops.
RETRIES = 5
RETRY_DELAY = 2.0
FINEWEB_INCOMPLETE_NAME = ".fineweb_incomplete"  # run_files.FINEWEB_INCOMPLETE, for --help without importing torch

# Workers get batches of whole documents: big enough that inter-process overhead is noise, small enough
# that a few batches per worker are in flight.
BATCH_CHARS = 1 << 18
BATCH_DOCS = 1024
IN_FLIGHT_PER_WORKER = 2  # batches submitted ahead per worker: keeps workers busy, bounds memory
WORKER_CHECK_SECONDS = 1.0  # how often a wait for a batch looks for a dead worker (see pool_result)

TXT_RULE = (
    "A .txt file (UTF-8) holds documents separated by two or more consecutive blank lines (lines with "
    "only whitespace); a single blank line, a paragraph break, stays inside its document. Leading and "
    "trailing whitespace of each document is trimmed. A file without such a gap is one document. "
    "input.txt is laid out this way: one document per play."
)
SMALL_RULE = (
    f"If the whole corpus fits in one shard (<= --shard_size tokens) it is split in two: val "
    f"(shard 000000) gets about {SMALL_VAL_FRACTION:.0%} of the tokens, cut at the document boundary nearest "
    f"to {SMALL_VAL_FRACTION:.0%} if one lies between {SMALL_VAL_WINDOW[0]:.0%} and {SMALL_VAL_WINDOW[1]:.0%} "
    f"of the corpus (else mid-document, at least 1 token), and train (shard 000001) gets the rest."
)


class CorpusError(ValueError):
    """A problem with the input or output directory, reported to the user as one line (no traceback)."""


# ----------------------------------------------------------------------------------------------------------
# Reading documents


_TXT_SEPARATOR = re.compile(r"\n(?:[^\S\n]*\n){2,}")  # a line's end, then two or more whitespace-only lines


def iter_txt_documents(path: str | os.PathLike, chunk_chars: int = 1 << 20, tell=None) -> Iterator[str]:
    """Documents of a text file: separated by two or more blank lines, surrounding whitespace trimmed.
    tell(n), if given, hears how many bytes of the file have been read (for a progress bar)."""
    # Read in large chunks and split with a regex: a Python loop over lines costs ~20% of tokenising time.
    parts: list[str] = []  # the current document so far
    tail = ""  # whitespace at the end of what was read: it may begin a separator, so it joins the next chunk
    lines = 0
    try:
        # utf-8-sig: a byte-order mark at the very start is not text; universal newlines: \r\n and \r read as \n
        with open(path, encoding="utf-8-sig") as f:
            while chunk := f.read(chunk_chars):
                if tell is not None:
                    tell(f.buffer.tell())  # the bytes decoded so far (and a read-ahead of a few kB)
                lines += chunk.count("\n")
                text = tail + chunk
                pos = 0
                for m in _TXT_SEPARATOR.finditer(text):
                    parts.append(text[pos : m.start()])
                    doc = "".join(parts).strip()
                    if doc:
                        yield doc
                    parts, pos = [], m.end()
                rest = text[pos:]
                body = rest.rstrip()
                if body:
                    parts.append(body)
                tail = rest[len(body) :]
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text after line {lines} ({e.reason})") from None
    doc = "".join(parts).strip()
    if doc:
        yield doc


def _text_of(row: dict, text_field: str, where: str) -> Optional[str]:
    """The text field of one record, or a CorpusError naming the record and the fields it has."""
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if text_field not in row:
        fields = ", ".join(map(repr, list(row)[:10])) or "none"
        raise CorpusError(f"{where}: no field {text_field!r} (fields: {fields}); pick one with --text_field")
    text = row[text_field]
    if text is not None and not isinstance(text, str):
        raise CorpusError(f"{where}: field {text_field!r} is {type(text).__name__}, not a string")
    return text


def iter_jsonl_documents(path: str | os.PathLike, text_field: str = "text", tell=None) -> Iterator[str]:
    """The text field of each JSON object, one per line (blank lines allowed); tell as for iter_txt_documents."""
    with open(path, "rb") as f:  # bytes, decoded line by line, so an error names the exact line
        for lineno, raw in enumerate(f, 1):
            if tell is not None and lineno % 256 == 0:
                tell(f.tell())
            if lineno == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # a byte-order mark starts the file, not the text
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not UTF-8 text ({e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: malformed JSON line ({e.msg})") from None
            text = _text_of(row, text_field, f"{path}:{lineno}")
            if text is not None:
                yield text


def iter_parquet_documents(path: str | os.PathLike, text_field: str = "text", tell=None) -> Iterator[str]:
    """The text column of a Parquet file, read in record batches (never the whole file at once); tell as for
    iter_txt_documents (the file's size times the fraction of its rows read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise CorpusError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    schema = pf.schema_arrow
    if text_field not in schema.names:
        fields = ", ".join(map(repr, schema.names[:10])) or "none"
        raise CorpusError(f"{path}: no column {text_field!r} (columns: {fields}); pick one with --text_field")
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)):
        raise CorpusError(f"{path}: column {text_field!r} is {column_type}, not a string")
    size, rows, done = os.path.getsize(path), max(pf.metadata.num_rows, 1), 0
    for batch in pf.iter_batches(batch_size=1024, columns=[text_field]):
        done += batch.num_rows
        if tell is not None:
            tell(size * done // rows)
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text


READERS = {".txt": iter_txt_documents, ".jsonl": iter_jsonl_documents, ".parquet": iter_parquet_documents}


def stat_path(path: str | os.PathLike, name: str) -> Optional[os.stat_result]:
    """os.stat(path), None if nothing is there; a broken symlink, a symlink loop or a path through a file is a
    CorpusError starting with name."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise CorpusError(f"{name}: a symbolic link to {os.readlink(path)}, which does not exist") from None
        return None
    except OSError as e:
        raise CorpusError(f"{name}: cannot use it ({e.strerror})") from None


def check_local_files(paths: Iterable[str | os.PathLike]) -> None:
    """Fail before any work if a file is missing, unreadable or of a kind we cannot read."""
    for path in paths:
        st = stat_path(path, str(path))
        if st is None:
            raise CorpusError(f"{path}: no such file")
        if stat.S_ISDIR(st.st_mode):
            raise CorpusError(f"{path} is a directory; name the files in it (e.g. --local {path}/*.txt)")
        suffix = Path(path).suffix.lower()
        if suffix not in READERS:
            raise CorpusError(f"{path}: unknown file type {suffix or '(none)'!r}; use {', '.join(LOCAL_EXTENSIONS)}")
        if not stat.S_ISREG(st.st_mode):
            raise CorpusError(f"{path}: not a regular file")
        try:
            open(path, "rb").close()
        except OSError as e:
            raise CorpusError(f"{path}: cannot read it ({e.strerror})") from None


def iter_documents(paths: Iterable[str | os.PathLike], text_field: str = "text") -> Iterator[str]:
    """Documents of local files in order, by extension; documents with no visible text are skipped."""
    paths = list(paths)
    check_local_files(paths)
    return LocalSource(paths, text_field).open()


def batch_documents(
    docs: Iterable[str], max_chars: int = BATCH_CHARS, max_docs: int = BATCH_DOCS
) -> Iterator[list[str]]:
    """Group documents into lists of about max_chars characters (a longer document is a batch alone)."""
    batch: list[str] = []
    chars = 0
    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if chars >= max_chars or len(batch) >= max_docs:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# ----------------------------------------------------------------------------------------------------------
# Sources: where documents come from, and a cursor that can start again in the middle


class LocalSource:
    """Documents of local files, in order (see iter_documents); the progress bar counts their bytes."""

    unit = "B"

    def __init__(self, paths: Iterable[str | os.PathLike], text_field: str = "text"):
        self.paths, self.text_field = [str(p) for p in paths], text_field
        self.sizes = [os.path.getsize(p) for p in self.paths]
        self.total = sum(self.sizes)  # bytes, the progress bar's end
        self.bytes_read = 0

    def open(self, state=None) -> Iterator[str]:
        """The documents from the first one on (local files have no cheaper place to start: state is unused)."""
        base = 0
        self.bytes_read = 0
        for path, size in zip(self.paths, self.sizes):
            def tell(n: int, base: int = base, size: int = size) -> None:
                self.bytes_read = base + min(n, size)

            reader = READERS[Path(path).suffix.lower()]
            docs = reader(path, tell=tell) if reader is iter_txt_documents else reader(path, self.text_field, tell)
            for doc in docs:
                if doc and not doc.isspace():  # it would add a lone <|endoftext|> and nothing to learn
                    yield doc
            base += size
            self.bytes_read = base

    def state(self) -> None:
        return None

    def transient(self, error: BaseException) -> bool:
        return False  # a local file that fails to read fails again

    def progress(self, documents: int) -> int:
        return self.bytes_read


class IterableSource:
    """Documents already at hand (a list, a generator): run_pipeline's input when it is given no cursor."""

    unit = "doc"

    def __init__(self, docs: Iterable[str]):
        self.docs, self.opened = docs, False
        self.total = len(docs) if isinstance(docs, (list, tuple)) else None

    def open(self, state=None) -> Iterator[str]:
        if self.opened and not isinstance(self.docs, (list, tuple)):
            raise RuntimeError("an iterator of documents cannot be read twice")
        self.opened = True
        return iter(self.docs)

    def state(self) -> None:
        return None

    def transient(self, error: BaseException) -> bool:
        return False

    def progress(self, documents: int) -> int:
        return documents


def is_transient(error: BaseException) -> bool:
    """Whether an error from the hub stream may go away if the stream is opened again: a dropped or timed-out
    connection, a protocol error, a server error (5xx, 429); not a missing dataset, a denied access or bad data."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(status, int):  # an HTTP error of requests, httpx or huggingface_hub
        return status in (408, 429) or status >= 500
    if "OfflineModeIsEnabled" in str(error):  # HF_HUB_OFFLINE=1: datasets raises ConnectionError, not worth a wait
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(error, OSError):  # requests' errors, a remote file's read error (fsspec)
        return True
    # httpx (huggingface_hub's HTTP client) and aiohttp are not OSErrors; matched by name, so neither is imported
    names = {f"{c.__module__.split('.')[0]}.{c.__name__}" for c in type(error).__mro__}
    return bool(names & {"httpx.TransportError", "httpx.StreamError", "aiohttp.ClientError", "urllib3.HTTPError",
                         "fsspec.FSTimeoutError"})


class HubSource:
    """A Hugging Face dataset, streamed (no multi-GB download before the first token). Its position can be saved
    (datasets' IterableDataset.state_dict), so a continued run or a retry does not stream what it read already."""

    unit = "doc"

    def __init__(self, dataset: str, name: Optional[str], split: str, text_field: str = "text"):
        self.dataset, self.name, self.split, self.text_field = dataset, name, split, text_field
        self.total: Optional[int] = None  # documents in the split, when the dataset's info says
        self._rows = None  # the IterableDataset being read

    def open(self, state: Optional[dict] = None) -> Iterator[str]:
        """The documents from the start, or from where state (of self.state()) was taken."""
        from datasets import load_dataset  # heavy; only when the hub is used

        try:
            rows = load_dataset(self.dataset, name=self.name, split=self.split, streaming=True)
        except Exception as e:  # network, auth, unknown name: one line is more useful than a deep traceback
            if is_transient(e):
                raise  # the cursor tries again
            raise CorpusError(f"could not open {self.dataset} (name={self.name}, split={self.split}): "
                              f"{type(e).__name__}: {first_line(e)}") from None
        self.total = split_size(rows, self.split)
        if state is not None:
            try:
                rows.load_state_dict(state)
            except Exception as e:  # e.g. a state saved by another version of datasets
                raise CorpusError(f"cannot restart the stream of {self.dataset} where the progress record says "
                                  f"({type(e).__name__}: {first_line(e)}); pass --overwrite to start over") from None
        self._rows = rows
        return self._documents(rows)

    def _documents(self, rows) -> Iterator[str]:
        it = iter(rows)
        try:
            for row in it:
                text = _text_of(row, self.text_field, f"{self.dataset} (split {self.split})")
                if text is not None:
                    yield text
        finally:
            it.close()  # now, not when the interpreter shuts down (datasets' generators then print errors)

    def state(self) -> Optional[dict]:
        """Where the stream is: after the rows of the documents yielded so far (a small JSON-able dict)."""
        return None if self._rows is None else self._rows.state_dict()

    def transient(self, error: BaseException) -> bool:
        return is_transient(error)

    def progress(self, documents: int) -> int:
        return documents


def split_size(rows, split: str) -> Optional[int]:
    """The number of examples in the split, if the dataset's info (its card) gives it, else None: never a guess."""
    try:
        n = rows.info.splits[split].num_examples
    except (AttributeError, KeyError, TypeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


class StreamError(CorpusError):
    """The source kept failing after its retries."""


class Cursor:
    """Iterating it yields a source's documents from a position on, counting them; a transient error (a dropped
    connection) reopens the source where it broke, after an exponential backoff (delay, 2 x delay, ...), and after
    `retries` failures in a row it raises StreamError.

    A position (position(), and `start`) is {"documents": d, "checksum": of documents 0..d-1 (see chain_crc),
    "stream": None or {"documents": k <= d, "checksum": of documents 0..k-1, "state": the source's state there}}.
    Opening at a position reads from the stream mark (or the start), skips to d and checks the skipped documents
    against the checksum: a continued run makes sure its input is the one its finished shards were made from."""

    def __init__(self, source, start: Optional[dict] = None, *, retries: int = 5, delay: float = 2.0,
                 sleep=time.sleep, on_retry=None, mark_every: int = 1000):
        start = start or {"documents": 0, "checksum": 0, "stream": None}
        mark = start.get("stream") or {"documents": 0, "checksum": 0, "state": None}
        self.source, self.retries, self.delay, self.sleep, self.on_retry = source, retries, delay, sleep, on_retry
        self.mark_every = mark_every
        self.index = start["documents"]  # documents read (or to skip to) so far
        self._target = start["checksum"]  # what the skipped documents must sum to; None once the first are read
        # Places the source can reopen at: [k, checksum of 0..k-1 (None until passed() says), state]
        self._marks = collections.deque([[mark["documents"], mark["checksum"], mark["state"]]])
        self._open = None

    def __iter__(self) -> Iterator[str]:
        failures = 0
        while True:
            try:
                docs = self._reopen()
                for doc in docs:
                    failures = 0
                    self.index += 1
                    yield doc
                    # The consumer wants the next document: the stream is now just past this one.
                    if self.index % self.mark_every == 0 and (state := self.source.state()) is not None:
                        self._marks.append([self.index, None, state])
                return
            except Exception as e:
                if not self.source.transient(e):
                    raise
                failures += 1
                where = f"{type(e).__module__.split('.')[0]}.{type(e).__name__}: {first_line(e)}".removeprefix("builtins.")
                if failures > self.retries:
                    raise StreamError(f"reading the documents failed at document {self.index:,} ({where}) and "
                                      f"{self.retries} retries did not help") from None
                wait = self.delay * 2 ** (failures - 1)
                if self.on_retry is not None:
                    self.on_retry(f"reading the documents failed at document {self.index:,} ({where}); retry "
                                  f"{failures}/{self.retries} in {wait:g} s")
                self.sleep(wait)
            finally:
                self.close()

    def _reopen(self) -> Iterator[str]:
        """The source opened at the latest mark and advanced to self.index (the skipped documents checked when
        both checksums are known: always when a run continues)."""
        k, checksum, state = self._marks[-1]
        check = checksum is not None and self._target is not None
        self._open = docs = self.source.open(state)
        for i in range(k, self.index):
            doc = next(docs, None)
            if doc is None:
                raise CorpusError(f"the input ended after {i:,} documents, but the run had read {self.index:,}: it "
                                  f"changed since; pass --overwrite to start over")
            if check:
                checksum = chain_crc(checksum, document_crc(doc))
        if check and checksum != self._target:
            raise CorpusError(f"the first {self.index:,} documents of the input are not those read before (their "
                              f"checksum differs): it changed since; pass --overwrite to start over")
        self._target = None
        return docs

    def passed(self, documents: int, checksum: int) -> None:
        """The consumer's word that documents 0..documents-1 have this checksum (see chain_crc); called for each
        document in order, it completes the marks."""
        for mark in reversed(self._marks):
            if mark[0] < documents:
                break
            if mark[0] == documents:
                mark[1] = checksum

    def position(self, documents: int, checksum: int) -> dict:
        """The position of document `documents` (its checksum passed by the consumer); forgets older marks."""
        while len(self._marks) > 1 and self._marks[1][0] <= documents:
            self._marks.popleft()
        k, mark_checksum, state = self._marks[0]
        stream = None if state is None else {"documents": k, "checksum": mark_checksum, "state": state}
        return {"documents": documents, "checksum": checksum, "stream": stream}

    def progress(self) -> int:
        """How far the source is read, in its unit (bytes of local files, documents of the hub)."""
        return self.source.progress(self.index)

    def close(self) -> None:
        if self._open is not None and hasattr(self._open, "close"):
            self._open.close()
        self._open = None


# ----------------------------------------------------------------------------------------------------------
# Tokenising


def _run_files():
    """run_files (shard names, the unfinished-output marker, atomic writes), imported on first use rather than at
    the top: it imports torch (~2 s), and every spawned worker re-imports this module."""
    import run_files

    return run_files


# The tokenizers: GPT-2's BPE, built from a vendored vocabulary file, and one token per character. train_gpt2.py,
# sample.py and hellaswag.py use the same ones: a corpus's manifest.json names its tokenizer.


GPT2_VOCAB_FILE = HERE / "assets" / "gpt2.tiktoken"  # == tiktoken's r50k_base ranks, from openai-whisper
GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT_TOKEN = 50256  # <|endoftext|>: delimits documents
GPT2_VOCAB_SIZE = 50257  # real token ids; a padded model (50304) never samples the ids above this

@functools.lru_cache(maxsize=None)
def get_tokenizer(vocab_file: str | os.PathLike = GPT2_VOCAB_FILE):
    """The GPT-2 encoding (identical to tiktoken.get_encoding('gpt2')), built offline: no download."""
    import tiktoken

    data = Path(vocab_file).read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_VOCAB_SHA256:
        raise ValueError(f"{vocab_file} is not the GPT-2 vocabulary (sha256 mismatch); restore it from git")
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN}, explicit_n_vocab=GPT2_VOCAB_SIZE)

class CharTokenizer:
    """One token per character, id i = chars[i] (`fineweb.py --tokenizer char`), with the part of tiktoken's
    interface that fineweb.py and sampling use. No <|endoftext|>: fineweb.py ends each document with a blank line."""
    name, eot_token = "char", None

    def __init__(self, chars: str):
        if not chars or list(chars) != sorted(set(chars)):
            raise ValueError("a CharTokenizer's vocabulary must be a non-empty string of sorted, unique characters")
        self.chars, self.n_vocab, self._ids = chars, len(chars), {c: i for i, c in enumerate(chars)}

    def encode(self, text: str, **special) -> list[int]:  # there are no special tokens to allow
        if unknown := set(text) - self._ids.keys():
            raise ValueError(f"character {min(unknown)!r} is not in the vocabulary of {self.n_vocab} characters")
        return [self._ids[c] for c in text]

    encode_ordinary = encode

    def decode(self, ids) -> str:
        if bad := [int(i) for i in ids if not 0 <= int(i) < self.n_vocab]:
            raise ValueError(f"token id {bad[0]} is not in 0..{self.n_vocab - 1}")
        return "".join(self.chars[int(i)] for i in ids)

def tokenizer_from_manifest(info: dict):
    """The tokenizer a fineweb.py manifest.json (or a checkpoint) names: GPT-2's, also when it names none, or a
    CharTokenizer."""
    if (kind := info.get("tokenizer", "gpt2")) == "gpt2":
        return get_tokenizer()
    if kind != "char" or not isinstance(info.get("vocab"), str):
        raise ValueError(f"manifest tokenizer {kind!r}: expected 'gpt2', or 'char' with its 'vocab' string")
    return CharTokenizer(info["vocab"])


def tokenizer_info(enc) -> dict:
    """What tokenizer_from_manifest needs to rebuild enc (checkpoints record it): its name, and a char vocabulary."""
    return {"tokenizer": enc.name, "vocab": getattr(enc, "chars", None)}


def token_byte_lengths(enc) -> np.ndarray:
    """UTF-8 bytes of each token id's text (int64, one per id); special tokens such as <|endoftext|> are 0: they
    mark document boundaries, they are not text."""
    if enc.name == "char":
        return np.array([len(c.encode("utf-8")) for c in enc.chars], dtype=np.int64)
    special = {enc.encode_single_token(t) for t in enc.special_tokens_set}
    return np.array([0 if i in special else len(enc.decode_single_token_bytes(i)) for i in range(enc.n_vocab)],
                    dtype=np.int64)


def load_tokenizer(chars: Optional[str] = None):
    """GPT-2's encoding, or a CharTokenizer over chars."""
    return get_tokenizer() if chars is None else CharTokenizer(chars)


def corpus_characters(docs: Iterable[str]) -> str:
    """The char tokenizer's vocabulary: the documents' distinct characters and DOC_SEPARATOR's, sorted."""
    chars = set(DOC_SEPARATOR)
    for doc in docs:
        chars.update(doc)
    if len(chars) > 2**16:
        raise CorpusError(f"the corpus has {len(chars):,} distinct characters, more than the 65,536 ids of a uint16 "
                          f"shard; use --tokenizer gpt2")
    return "".join(sorted(chars))


STOP_SIGNALS = {getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1") if hasattr(signal, name)}


@contextlib.contextmanager
def stop_signals_blocked():
    """Hold the stop signals back while pool workers may start: a worker inherits the mask, so those signals wait
    until _init_worker has set its handlers (else Python's default SIGINT handler in a spawned worker, or the
    parent's handler in a forked one, prints a traceback). The parent still sees them, just after this."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_WORKER_ENCODING = None  # set in each pool worker by _init_worker (spawn-safe: passed, not inherited)


def _init_worker(enc) -> None:
    """Pool worker set-up: its tokenizer, and signals left to the parent, which stops the pool and cleans up."""
    global _WORKER_ENCODING
    _WORKER_ENCODING = enc
    for sig in STOP_SIGNALS - {signal.SIGTERM}:  # Ctrl-C, a closed terminal, a scheduler's warning reach the whole
        signal.signal(sig, signal.SIG_IGN)      # process group: the parent stops the pool; no traceback per worker
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # fork copies the parent's handler; a worker just ends
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # see stop_signals_blocked


def encode_documents(enc, docs: list[str]) -> list[np.ndarray]:
    """Each document's ids as a uint16 array: <|endoftext|> then its tokens, or (a tokenizer without an
    end-of-text token: char) its tokens then DOC_SEPARATOR's."""
    out = []
    # A plain loop, not enc.encode_ordinary_batch: tiktoken 0.14's encode_ordinary keeps the GIL, so the
    # batch call's thread pool only adds overhead (about 2x slower here; `python bench.py --only fineweb` measures
    # it). Parallelism comes from the worker processes instead.
    for doc in docs:
        if enc.eot_token is None:
            try:
                ids = np.array(enc.encode_ordinary(doc + DOC_SEPARATOR), dtype=np.uint32)
            except ValueError as e:  # the vocabulary was read from these files in a first pass
                raise CorpusError(f"{e}; did an input file change during the run?") from None
        else:
            tokens = enc.encode_ordinary(doc)
            ids = np.empty(len(tokens) + 1, dtype=np.uint32)
            ids[0] = enc.eot_token
            ids[1:] = tokens
        if ids.max() >= 2**16:
            raise ValueError(f"token id {int(ids.max())} does not fit in uint16")
        out.append(ids.astype(DTYPE))
    return out


def document_crc(doc: str) -> int:
    """CRC-32 of a document's UTF-8 text: what a continued run checks the documents it skips against."""
    return zlib.crc32(doc.encode("utf-8", "surrogatepass"))


def chain_crc(checksum: int, crc: int) -> int:
    """The checksum of documents 0..i from that of 0..i-1 and document i's CRC (4 bytes: the main thread never
    touches the text, whose CRC the workers compute)."""
    return zlib.crc32(crc.to_bytes(4, "little"), checksum)


def encode_batch(enc, docs: list[str]) -> tuple[list[np.ndarray], list[int]]:
    """(encode_documents(enc, docs), each document's document_crc)."""
    return encode_documents(enc, docs), [document_crc(doc) for doc in docs]


def tokenize_batch(docs: list[str]) -> tuple[list[np.ndarray], list[int]]:
    """Pool task: encode_batch with this process's tokenizer."""
    global _WORKER_ENCODING
    if _WORKER_ENCODING is None:  # called outside a pool (tests, workers=1)
        _WORKER_ENCODING = load_tokenizer()
    return encode_batch(_WORKER_ENCODING, docs)


def pool_result(future, pool: ProcessPoolExecutor, check_every: float = WORKER_CHECK_SECONDS):
    """future.result(), looking for a dead worker while it waits. ProcessPoolExecutor notices a dead worker by
    itself unless the worker was killed while sending a result (a batch's tokens fill the pipe many times over):
    its manager thread then waits forever for the rest of that message (CPython 3.11 at least; seen here under
    load). So after each check_every seconds of waiting: if a worker has died, the others are stopped and our copy
    of the result pipe's writing end is closed; that read then ends (no writer is left) and the executor breaks
    as usual, failing this future with BrokenProcessPool. The attributes are private, hence the getattr: without
    them this is a plain future.result()."""
    while True:
        try:
            return future.result(timeout=check_every)
        except FutureTimeoutError:
            workers = list((getattr(pool, "_processes", None) or {}).values())
            if any(p.exitcode not in (None, 0) for p in workers):
                for p in workers:
                    p.kill()
                writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
                if writer is not None:
                    writer.close()


def tokenize_documents(
    docs: Iterable[str], enc, workers: int = 1, start_method: Optional[str] = None
) -> Iterator[tuple[list[np.ndarray], list[int]]]:
    """(token arrays, CRCs) of the documents, in order, one pair per batch; workers > 1 uses a process pool.

    A worker that dies (out-of-memory killer, kill -9) raises BrokenProcessPool here within a second or so: an
    executor notices a lost worker, where multiprocessing.Pool would wait forever for its task, and pool_result
    covers the case the executor misses.
    """
    batches = batch_documents(docs)
    if workers == 1:  # no pool: no start-up cost, and errors surface with their own traceback
        for batch in batches:
            yield encode_batch(enc, batch)
        return
    ctx = multiprocessing.get_context(start_method)
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(enc,))
    try:
        # Submitted in order and collected oldest first: document order is kept, and at most
        # IN_FLIGHT_PER_WORKER batches per worker are in memory. Documents are read here, in the calling thread.
        pending: collections.deque = collections.deque()
        for batch in batches:
            with stop_signals_blocked():  # submit starts the workers
                pending.append(pool.submit(tokenize_batch, batch))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                yield pool_result(pending.popleft(), pool)
        while pending:
            yield pool_result(pending.popleft(), pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # on a failure, queued batches are dropped, not tokenised


# ----------------------------------------------------------------------------------------------------------
# Writing shards


def small_corpus_val_size(n: int, doc_starts: np.ndarray) -> int:
    """How many of the n tokens of a one-shard corpus go to val (see SMALL_RULE); doc_starts: where each document
    begins."""
    if n < 2:
        raise CorpusError(f"the corpus has {n} token(s); a val and a train split need at least 2")
    target = min(max(round(n * SMALL_VAL_FRACTION), 1), n - 1)
    lo = max(math.ceil(n * SMALL_VAL_WINDOW[0]), 1)
    hi = min(math.floor(n * SMALL_VAL_WINDOW[1]), n - 1)
    starts = np.asarray(doc_starts)
    starts = starts[(starts >= lo) & (starts <= hi)]
    if len(starts):
        return int(starts[np.argmin(np.abs(starts - target))])
    return target


class ShardWriter:
    """Packs token arrays into shards of shard_size tokens; a document may span any number of shards. Each shard's
    sha256 is computed as it is written, so the corpus's fingerprint needs no second read of its 20 GB."""

    def __init__(self, out_dir: str | os.PathLike, prefix: str, shard_size: int):
        if shard_size < 1:
            raise ValueError("shard_size must be positive")
        self.out_dir = Path(out_dir)
        self.prefix = prefix
        self.shard_size = shard_size
        self.shards: list[dict] = []  # {"file", "split", "tokens", "sha256"} per shard written
        self.sizes: list[int] = []  # bytes of each shard's file
        self.docs = 0
        self.tokens = 0
        self.small_split: Optional[dict] = None  # set when a one-shard corpus was split into val + train
        # (d, s) at the last shard add() wrote: document d was being added and s of its tokens are in the shards
        self.resume_point: Optional[tuple[int, int]] = None
        self._buf = np.empty(min(shard_size, 1 << 20), dtype=DTYPE)  # grows to shard_size when needed
        self._fill = 0
        # Where documents start, for the val/train cut of a small corpus: only while the corpus may still be
        # small and only where the cut may fall (None once a full shard is written).
        self._doc_starts: Optional[array.array] = array.array("q")

    @classmethod
    def resumed(cls, out_dir: str | os.PathLike, prefix: str, shard_size: int, record: dict) -> "ShardWriter":
        """A writer after the finished shards of a progress record: add() goes on with document
        record["documents"], given without its first record["skip_tokens"] tokens (they are in the last shard)."""
        writer = cls(out_dir, prefix, shard_size)
        writer.shards = [{key: s[key] for key in SHARD_KEYS} for s in record["shards"]]
        writer.sizes = [s["bytes"] for s in record["shards"]]
        writer.docs = record["documents"]
        writer.tokens = sum(s["tokens"] for s in record["shards"])
        writer._doc_starts = None  # a full shard was written: not a small corpus
        return writer

    def add(self, tokens: np.ndarray) -> None:
        """Append one document's tokens (as encode_documents makes them)."""
        if self._doc_starts is not None and self.tokens <= SMALL_VAL_WINDOW[1] * self.shard_size:
            self._doc_starts.append(self.tokens)
        self.docs += 1
        self.tokens += len(tokens)
        pos = 0
        while pos < len(tokens):
            if self._fill == self.shard_size:
                # Flush only now that more tokens exist: a corpus of exactly one shard is still "small".
                self._write(self._buf[: self._fill])
                self._fill = 0
                self._doc_starts = None
                self.resume_point = (self.docs - 1, pos)
            take = min(len(tokens) - pos, self.shard_size - self._fill)
            if self._fill + take > len(self._buf):
                grown = np.empty(min(self.shard_size, max(2 * len(self._buf), self._fill + take)), dtype=DTYPE)
                grown[: self._fill] = self._buf[: self._fill]
                self._buf = grown
            self._buf[self._fill : self._fill + take] = tokens[pos : pos + take]
            self._fill += take
            pos += take

    def close(self) -> list[dict]:
        """Write what is buffered (the remainder, or the val/train split of a small corpus)."""
        if not self.shards:
            if self._fill == 0:
                raise CorpusError("no documents: the corpus is empty")
            data = self._buf[: self._fill]
            n_val = small_corpus_val_size(self._fill, np.frombuffer(self._doc_starts, dtype=np.int64))
            self.small_split = {
                "val_tokens": n_val,
                "train_tokens": self._fill - n_val,
                "at_document_boundary": n_val in self._doc_starts,
            }
            self._write(data[:n_val])
            self._write(data[n_val:])
        elif self._fill:
            self._write(self._buf[: self._fill])
        self._fill = 0
        return self.shards

    def _write(self, tokens: np.ndarray) -> None:
        index = len(self.shards)
        name = _run_files().shard_name(self.prefix, index)
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CorpusError(f"cannot create --out_dir {self.out_dir} ({e.strerror})") from None
        digest = _Digesting()
        write_file(self.out_dir / name, lambda f: save_npy(digest.wrap(f), tokens))
        self.shards.append({"file": name, "split": "val" if index == 0 else "train", "tokens": int(len(tokens)),
                            "sha256": digest.sha256.hexdigest()})
        self.sizes.append(digest.bytes)


SHARD_KEYS = ("file", "split", "tokens", "sha256")  # a shard's entry in manifest.json


class _Digesting:
    """Hashes and counts the bytes written through the file that wrap(f) returns (a fresh count per wrap)."""

    def wrap(self, f):
        self.f, self.sha256, self.bytes = f, hashlib.sha256(), 0
        return self

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.bytes += view.nbytes
        return self.f.write(view)


def save_npy(f, tokens: np.ndarray) -> None:
    """The bytes of np.save, written with f.write: numpy's own writer reports a full disk without its errno."""
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(tokens))
    f.write(np.ascontiguousarray(tokens).data)


def write_file(path: Path, write) -> None:
    """run_files.atomic_write (no temp file is left either way); a failure (full disk, read-only directory) is
    a CorpusError naming the file."""
    try:
        _run_files().atomic_write(path, write)
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        raise CorpusError(f"cannot write {path} ({e.strerror or e}){'; free some space' if full else ''}") from None


def corpus_fingerprint(shards: list[dict]) -> str:
    """sha256 of one line "{file} {tokens} {sha256}" per shard, in order: names the corpus's exact bytes (a
    checkpoint can record it and a trainer compare it) without reading the shards again."""
    lines = "\n".join(f"{s['file']} {s['tokens']} {s['sha256']}" for s in shards)
    return hashlib.sha256(lines.encode()).hexdigest()


# ----------------------------------------------------------------------------------------------------------
# The output directory: finished corpus, unfinished run (with its progress record), --overwrite's new corpus


def staging_dir(out_dir: str | os.PathLike, prefix: str) -> Path:
    """Where --overwrite builds the new corpus: inside --out_dir (same file system, so moving it in is a rename)."""
    return Path(out_dir) / f".fineweb-new-{prefix}"


def trash_dir(out_dir: str | os.PathLike, prefix: str) -> Path:
    """Where --overwrite moves the old corpus while it moves the new one in; removed at the end."""
    return Path(out_dir) / f".fineweb-old-{prefix}"


def find_outputs(out_dir: str | os.PathLike, prefix: str) -> tuple[list[Path], list[Path]]:
    """(files of ours: shards with this prefix, their temp files, the manifest, the unfinished-run marker; shards
    with other prefixes). Directories are neither (see staging_dir, trash_dir)."""
    out_dir = Path(out_dir)
    ours, others = [], []
    if not out_dir.is_dir():
        return ours, others
    marker = _run_files().FINEWEB_INCOMPLETE
    for path in sorted(out_dir.iterdir()):
        if path.is_dir():
            continue
        m = _run_files().SHARD_NAME.fullmatch(path.name)
        if m:
            (ours if m["prefix"] == prefix else others).append(path)
        elif path.name in (MANIFEST, marker) or (
            path.name.startswith((f".{prefix}_", f".{MANIFEST}.tmp", f".{marker}.tmp")) and ".tmp" in path.name
        ):  # temp files: left by a killed run
            ours.append(path)
    return ours, others


def check_out_dir(out_dir: str | os.PathLike, prefix: str) -> None:
    """Refuse a directory we cannot write in or that holds another corpus (what it holds of ours: plan_run)."""
    name = f"--out_dir {out_dir}"
    st = stat_path(out_dir, name)  # a file on the way (a_file/sub) is an error here
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise CorpusError(f"{name} is a file, not a directory")
    base = Path(out_dir)  # where the first write creates a file: out_dir, or the ancestor mkdir -p starts from
    while st is None:
        base = base.parent
        st = stat_path(base, name)
    if not os.access(base, os.W_OK | os.X_OK):
        raise CorpusError(f"{name}: no permission to write in {base}; choose another --out_dir")
    _, others = find_outputs(out_dir, prefix)
    if others:
        raise CorpusError(
            f"{out_dir} holds shards with another prefix (e.g. {others[0].name}); one directory holds one "
            f"corpus, so choose another --out_dir"
        )


@contextlib.contextmanager
def locked_out_dir(out_dir: str | os.PathLike):
    """Create --out_dir and hold run_files' exclusive lock on it (out_dir/.lock: the lock dies with its process), so
    two runs never write the same corpus; where the filesystem has no locks, say so and go on."""
    path = Path(out_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CorpusError(f"cannot create --out_dir {path} ({e.strerror})") from None
    try:
        fd, note = _run_files().lock_directory(path, "--out_dir", "fineweb.py")
    except ValueError as e:
        raise CorpusError(str(e)) from None
    if note:
        print(f"warning: {note}")
    try:
        yield
    finally:
        os.close(fd)


PROGRESS_VERSION = 1
PROGRESS_KEYS = {"version", "settings", "documents", "checksum", "stream", "skip_tokens", "seconds", "shards"}


def run_settings(prefix: str, shard_size: int, enc, source: dict, dataset: str) -> dict:
    """Everything that decides the bytes of the shards and the manifest: a run continues another only if these
    are equal."""
    return {"prefix": prefix, "shard_size": shard_size, "tokenizer": enc.name, "vocab": getattr(enc, "chars", None),
            "dataset": dataset, "source": source}


def progress_record(settings: dict, writer: ShardWriter, position: dict, skip_tokens: int, seconds: float) -> dict:
    """What a stopped run leaves for the next one: its settings, the finished shards (sizes and sha256), and where
    the documents they hold end (position: Cursor.position, and skip_tokens of the next document)."""
    shards = [{**s, "bytes": n} for s, n in zip(writer.shards, writer.sizes, strict=True)]
    return {"version": PROGRESS_VERSION, "settings": settings, **position, "skip_tokens": skip_tokens,
            "seconds": round(seconds, 3), "shards": shards}


def write_progress(directory: str | os.PathLike, record: dict) -> None:
    """The record goes into the unfinished-run marker (run_files.FINEWEB_INCOMPLETE), written atomically."""
    path = Path(directory) / _run_files().FINEWEB_INCOMPLETE
    write_file(path, lambda f: f.write((json.dumps(record) + "\n").encode()))


def read_progress(directory: str | os.PathLike) -> Optional[dict]:
    """The progress record in directory's marker, or None: no marker, or one without a record (an older
    fineweb.py's, or written by something else)."""
    try:
        record = json.loads((Path(directory) / _run_files().FINEWEB_INCOMPLETE).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and record.keys() >= PROGRESS_KEYS and record["version"] == PROGRESS_VERSION):
        return None
    return record


def settings_difference(old: dict, new: dict) -> Optional[str]:
    """'{key} {old value} there, {new value} here' for the first setting that differs, or None."""

    def flat(d: dict, under: str = "") -> dict:
        out = {}
        for key, value in d.items():
            out.update(flat(value, f"{under}{key}.") if isinstance(value, dict) else {f"{under}{key}": value})
        return out

    def show(value) -> str:
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."

    a, b = flat(old), flat(new)
    for key in [*b, *(k for k in a if k not in b)]:
        if a.get(key) != b.get(key):
            return f"{key} {show(a.get(key))} there, {show(b.get(key))} here"
    return None


def check_finished_shards(directory: str | os.PathLike, shards: list[dict]) -> Optional[str]:
    """None if each shard of a progress record is on disk with its size and sha256, else what is wrong."""
    for s in shards:
        path = Path(directory) / s["file"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{path} is missing"
        if size != s["bytes"]:
            return f"{path} has {size:,} bytes, the progress record says {s['bytes']:,}"
        with open(path, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != s["sha256"]:
                return f"{path} changed after it was written (its sha256 is not the progress record's)"
    return None


def finished_tail(directory: str | os.PathLike, shards: list[dict], n: int) -> np.ndarray:
    """The last n tokens of the finished shards."""
    parts = []
    for s in reversed(shards):
        if n <= 0:
            break
        arr = np.load(Path(directory) / s["file"], mmap_mode="r", allow_pickle=False)
        take = min(n, len(arr))
        parts.append(np.array(arr[len(arr) - take :]))
        n -= take
    return np.concatenate(parts[::-1]) if parts else np.empty(0, DTYPE)


def remove_files(directory: str | os.PathLike, prefix: str, keep: Iterable[str] = ()) -> None:
    """Delete this prefix's files in directory (see find_outputs) except those named in keep."""
    keep = set(keep)
    for path in find_outputs(directory, prefix)[0]:
        if path.name not in keep:
            path.unlink(missing_ok=True)


def discard_dir(directory: Path, prefix: str) -> None:
    """Remove a directory of fineweb.py's own (staging_dir, trash_dir): our files in it, then it."""
    remove_files(directory, prefix)
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise CorpusError(f"cannot remove {directory} ({e.strerror}): it holds files fineweb.py did not write; "
                          f"move them away") from None


@dataclasses.dataclass
class Plan:
    """Where a run writes (out_dir, or --overwrite's staging_dir) and the progress record it continues, if any."""
    target: Path
    resume: Optional[dict]
    notes: list[str]


def plan_run(out_dir: str | os.PathLike, prefix: str, settings: dict, overwrite: bool) -> Plan:
    """Decide from what out_dir holds (under locked_out_dir, after finish_swap): a new run, a run that continues an
    unfinished one with the same settings and intact shards, or a CorpusError saying what to do instead."""
    out_dir = Path(out_dir)
    if overwrite:
        staging = staging_dir(out_dir, prefix)
        if not staging.exists():
            return Plan(staging, None, [f"--overwrite: the new corpus is built in {staging}; {out_dir} stays as it "
                                        f"is until it is complete"])
        record = read_progress(staging)
        problem = "it has no progress record" if record is None else (
            settings_difference(record["settings"], settings) or check_finished_shards(staging, record["shards"]))
        if problem is None and record["shards"]:
            return Plan(staging, record, [f"--overwrite: continuing the new corpus in {staging} "
                                          f"({len(record['shards'])} finished shard(s))"])
        discard_dir(staging, prefix)  # an earlier --overwrite's unfinished corpus; this one starts over
        return Plan(staging, None, [f"--overwrite: starting the new corpus in {staging} afresh"
                                    + (f" ({problem})" if problem else "")])
    notes = []
    if staging_dir(out_dir, prefix).exists():
        notes.append(f"note: {staging_dir(out_dir, prefix)} holds the unfinished new corpus of an --overwrite run: "
                     f"the same --overwrite command continues it; delete it to free its space")
    ours, _ = find_outputs(out_dir, prefix)
    if not any(_run_files().SHARD_NAME.fullmatch(p.name) or p.name == MANIFEST for p in ours):
        remove_files(out_dir, prefix)  # a marker or temp files, but nothing finished to keep: begin again
        return Plan(out_dir, None, notes)
    if (out_dir / MANIFEST).exists():
        raise CorpusError(f"{out_dir} already holds a finished corpus ({MANIFEST}); pass --overwrite to replace it, "
                          f"or choose another --out_dir")
    record = read_progress(out_dir)
    if record is None:
        raise CorpusError(f"{out_dir} already holds {len(ours)} file(s) of an earlier run (e.g. {ours[0].name}) and no "
                          f"progress record to continue from; pass --overwrite to replace them, or choose another "
                          f"--out_dir")
    if not record["shards"]:  # nothing finished to keep (a small corpus's first shard, say): begin again
        remove_files(out_dir, prefix)
        return Plan(out_dir, None, notes)
    if difference := settings_difference(record["settings"], settings):
        raise CorpusError(f"{out_dir} holds an unfinished run with other settings ({difference}); pass --overwrite "
                          f"to start over, or use the same command to continue")
    if problem := check_finished_shards(out_dir, record["shards"]):
        raise CorpusError(f"cannot continue the unfinished run in {out_dir}: {problem}; pass --overwrite to start "
                          f"over")
    return Plan(out_dir, record, notes + [f"continuing the unfinished run in {out_dir}: {len(record['shards'])} "
                                          f"finished shard(s) kept, from document {record['documents']:,} on"])


def finish_swap(out_dir: str | os.PathLike, prefix: str) -> Optional[dict]:
    """Move --overwrite's finished new corpus (staging_dir) into out_dir in place of the old one; returns its
    manifest, or None if there was nothing to move. Every step can be cut short (a crash, kill -9) and run again:

    1. (while all its shards are still in staging) the unfinished-run marker is put in out_dir, so the trainer
       refuses it meanwhile; the old manifest, then the old shards, go to trash_dir;
    2. each new shard is renamed into out_dir, then the new manifest is written there and the marker removed;
    3. staging_dir loses its manifest (the swap is done) and goes, then trash_dir."""
    out_dir = Path(out_dir)
    staging, trash = staging_dir(out_dir, prefix), trash_dir(out_dir, prefix)
    if not (staging / MANIFEST).is_file():
        if trash.exists():  # step 3 was cut short
            discard_dir(trash, prefix)
        return None
    manifest_bytes = (staging / MANIFEST).read_bytes()
    manifest = json.loads(manifest_bytes)
    files = [s["file"] for s in manifest["shards"]]
    marker = out_dir / _run_files().FINEWEB_INCOMPLETE
    with stop_signals_blocked():  # Ctrl-C waits for the few renames (a kill -9 does not: then the next run redoes)
        if not marker.exists():
            write_file(marker, lambda f: f.write(b"{}\n"))
        if all((staging / name).exists() for name in files):  # step 1 (again, if cut short)
            trash.mkdir(exist_ok=True)
            old = [p for p in find_outputs(out_dir, prefix)[0] if p.name != marker.name]
            for path in sorted(old, key=lambda p: p.name != MANIFEST):  # the manifest first
                os.replace(path, trash / path.name)
        for name in files:  # step 2
            if (staging / name).exists():
                os.replace(staging / name, out_dir / name)
        write_file(out_dir / MANIFEST, lambda f: f.write(manifest_bytes))
        marker.unlink(missing_ok=True)
        (staging / MANIFEST).unlink()  # step 3
        discard_dir(staging, prefix)
        discard_dir(trash, prefix)
    return manifest


def manifest_settings(manifest: dict, prefix: str) -> dict:
    """run_settings of the run that wrote a manifest."""
    return {"prefix": prefix, "shard_size": manifest["shard_size"], "tokenizer": manifest["tokenizer"],
            "vocab": manifest.get("vocab"), "dataset": manifest["dataset"], "source": manifest["source"]}


def write_manifest(out_dir: str | os.PathLike, manifest: dict) -> Path:
    """manifest.json beside the shards, written atomically and last: its presence means the run finished."""
    path = Path(out_dir) / MANIFEST
    write_file(path, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode()))
    return path


def dataset_name(source: dict) -> str:
    """The manifest's default "dataset": "fineweb-edu" for the hub's FineWeb-Edu (plots draw GPT-2's reference
    lines only for it), another hub dataset's name, or "local" (--dataset_name names a local copy)."""
    if source.get("type") != "hub":
        return "local"
    return "fineweb-edu" if source.get("dataset") == DEFAULT_DATASET else str(source.get("dataset"))


def build_manifest(writer: ShardWriter, enc, source: dict, dataset: Optional[str] = None) -> dict:
    """What a reader needs to trust the shards: tokenizer, dtype, files with their token counts and sha256, the
    corpus fingerprint, origin. tokenizer_from_manifest(manifest) rebuilds the tokenizer."""
    if enc.eot_token is None:
        layout, vocab = f"its tokens followed by those of {DOC_SEPARATOR!r}; id i is vocab[i]", {"vocab": enc.chars}
    else:
        layout, vocab = "<|endoftext|> followed by its tokens", {}
    return {
        "tokenizer": enc.name,
        "vocab_size": enc.n_vocab,
        "eot_token": enc.eot_token,
        **vocab,
        "dtype": np.dtype(DTYPE).name,
        "format": f"npy: a 1-D array per shard; each document is {layout}",
        "dataset": dataset or dataset_name(source),
        "source": source,
        "shard_size": writer.shard_size,
        "small_corpus_split": writer.small_split,
        "total_documents": writer.docs,
        "total_tokens": writer.tokens,
        "shards": writer.shards,
        "fingerprint": corpus_fingerprint(writer.shards),
    }


def run_pipeline(
    docs: Iterable[str],
    out_dir: str | os.PathLike,
    prefix: str,
    shard_size: int,
    enc,
    workers: int = 1,
    start_method: Optional[str] = None,
    source: Optional[dict] = None,
    progress: bool = False,
    *,
    settings: Optional[dict] = None,
    resume: Optional[dict] = None,
    cursor: Optional[Cursor] = None,
) -> dict:
    """Tokenise docs into shards plus manifest.json in out_dir; returns the manifest.

    Until the manifest is written, out_dir holds the unfinished-run marker, rewritten after each shard with the
    progress record (see progress_record): a run that fails or is stopped keeps every finished shard, and one
    with the same settings continues from there (resume: that record, its shards checked; docs then start at its
    document, cursor being where they come from, positioned there). Without a cursor, docs are read from the start.
    """
    out_dir = Path(out_dir)
    source = source or {}
    settings = settings or run_settings(prefix, shard_size, enc, source, dataset_name(source))
    if cursor is None:
        if resume is not None:
            raise ValueError("continuing a run needs the cursor its documents come from")
        cursor = Cursor(IterableSource(docs))
        docs = iter(cursor)
    t0 = time.perf_counter()
    seconds_before = resume["seconds"] if resume else 0.0
    marker = out_dir / _run_files().FINEWEB_INCOMPLETE
    if resume is None:
        writer = ShardWriter(out_dir, prefix, shard_size)
        skip, checksum = 0, 0
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CorpusError(f"cannot create --out_dir {out_dir} ({e.strerror})") from None
        # The marker first: train_gpt2.py refuses the directory until the manifest is there.
        write_progress(out_dir, progress_record(settings, writer, cursor.position(0, 0), 0, 0.0))
    else:
        writer = ShardWriter.resumed(out_dir, prefix, shard_size, resume)
        skip, checksum = resume["skip_tokens"], resume["checksum"]
        remove_files(out_dir, prefix, keep=[s["file"] for s in resume["shards"]] + [marker.name])  # unrecorded work
    tokens_before = writer.tokens
    bar = None
    if progress:
        from tqdm import tqdm

        src = cursor.source
        bar = tqdm(total=src.total, initial=cursor.progress(), unit=src.unit, unit_scale=True,
                   unit_divisor=1024 if src.unit == "B" else 1000, desc=f"tokenizing -> {prefix}", smoothing=0.1)
    stream = tokenize_documents(docs, enc, workers, start_method)
    try:
        for arrays, crcs in stream:
            for tokens, crc in zip(arrays, crcs):
                index = writer.docs  # this document's number; checksum: that of the documents before it
                cursor.passed(index, checksum)
                if skip:  # the document the last finished shard ends in: the rest of it
                    tokens, skip = tokens[skip:], 0
                written = len(writer.shards)
                writer.add(tokens)
                if len(writer.shards) > written:
                    documents, skip_tokens = writer.resume_point  # documents == index: shards end inside add()
                    write_progress(out_dir, progress_record(settings, writer, cursor.position(documents, checksum),
                                                            skip_tokens, seconds_before + time.perf_counter() - t0))
                checksum = chain_crc(checksum, crc)
            if bar is not None:
                bar.update(cursor.progress() - bar.n)
                rate = (writer.tokens - tokens_before) / (time.perf_counter() - t0)
                bar.set_postfix_str(f"{writer.tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)
        writer.close()
        manifest = build_manifest(writer, enc, source, settings["dataset"])
        manifest["seconds"] = round(seconds_before + time.perf_counter() - t0, 3)
        write_manifest(out_dir, manifest)
        marker.unlink()
    finally:
        stream.close()  # stops the pool now, not whenever the generator is garbage-collected
        if bar is not None:
            bar.close()
    return manifest


# ----------------------------------------------------------------------------------------------------------
# CLI


def _positive_int(text: str) -> int:
    try:
        value = int(text)  # int() accepts 100_000_000
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return text


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects container/taskset CPU limits
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def build_parser() -> argparse.ArgumentParser:
    parser = _run_files().Parser(  # one-line errors, no abbreviations
        prog="fineweb.py",
        description="Tokenise a corpus with GPT-2 (or by character) into uint16 .npy shards (shard 000000 = val, "
                    "the rest = train).",
        epilog="\n\n".join(textwrap.fill(p, 100) for p in (
            f"Documents. {TXT_RULE} A .jsonl file holds one JSON object per line and a .parquet file a table; "
            f"the document is the --text_field value. A UTF-8 byte-order mark at the start of a file is not text. "
            f"Documents with no visible text are skipped. Each document is written as <|endoftext|> followed by its "
            f"tokens.",
            f"Tokenizers. gpt2 (default): GPT-2's BPE, 50,257 ids. char: one id per character, the vocabulary being "
            f"the corpus's distinct characters, sorted (read in a first pass, so --local only); each document is "
            f"written as its characters followed by a blank line ({DOC_SEPARATOR!r}), and the manifest records the "
            f"vocabulary.",
            f"Small corpus. {SMALL_RULE}",
            f"Output. {{prefix}}_val_000000.npy, {{prefix}}_train_000001.npy, ... and {MANIFEST} (tokenizer, "
            f"dtype, per-shard token counts and sha256, the corpus fingerprint, source), each written atomically, "
            f"the manifest last; until then the directory holds {FINEWEB_INCOMPLETE_NAME}, which the trainer "
            f"refuses.",
            f"Stopped runs. A run that fails or is stopped (Ctrl-C, SIGTERM, a lost connection, a killed worker, a "
            f"full disk, a bad document) keeps every finished shard and records its progress in "
            f"{FINEWEB_INCOMPLETE_NAME}; the same command run again checks those shards (sizes and sha256) and "
            f"continues where it stopped, ending with the same bytes as an uninterrupted run. Other settings on an "
            f"unfinished run are refused. A broken hub stream is reopened where it broke, {RETRIES} times with "
            f"growing waits, before the run stops.",
            f"--overwrite builds the new corpus in {{out_dir}}/.fineweb-new-{{prefix}}/ (room for both is needed) and "
            f"moves it in place of the old one only once it is complete: a failed or stopped --overwrite leaves the "
            f"old corpus as it was, and the same command continues it. Without --overwrite, an --out_dir holding a "
            f"finished corpus of this prefix is refused.",
        )),
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=32),
    )
    src = parser.add_argument_group("source (default: FineWeb-Edu sample-10BT from the Hugging Face hub)")
    src.add_argument("--local", nargs="+", type=_path, metavar="FILE",
                     help="local .txt, .jsonl or .parquet files, in order")
    src.add_argument("--dataset", default=DEFAULT_DATASET, help="hub dataset (default: %(default)s)")
    src.add_argument("--name", default=DEFAULT_NAME, help="hub dataset config, '' for none (default: %(default)s)")
    src.add_argument("--split", default=DEFAULT_SPLIT, help="hub dataset split (default: %(default)s)")
    src.add_argument("--text_field", default="text", help="field/column with the text (default: %(default)s)")
    out = parser.add_argument_group("output")
    out.add_argument("--tokenizer", choices=TOKENIZERS, default="gpt2",
                     help="gpt2, or char: one token per character, --local only (default: %(default)s)")
    out.add_argument("--out_dir", type=_path, help=f"default: {DEFAULT_OUT_DIR.name}/ next to this script for the "
                     "hub, data/{prefix}/ for --local")
    out.add_argument("--prefix", help=f"shard name prefix (default: {DEFAULT_PREFIX} for the hub, the first "
                     "file's name for --local)")
    out.add_argument("--shard_size", type=_positive_int, default=DEFAULT_SHARD_SIZE,
                     help="tokens per shard (default: 100_000_000)")
    out.add_argument("--dataset_name", help="the manifest's \"dataset\" (default: fineweb-edu for the hub's "
                     f"{DEFAULT_DATASET}, another hub dataset's id, local for --local); fineweb-edu for a local copy "
                     "of it makes plot.py draw GPT-2's reference lines")
    out.add_argument("--overwrite", action="store_true",
                     help="replace this prefix's corpus in --out_dir, once the new one is complete (see below)")
    run = parser.add_argument_group("run")
    run.add_argument("--workers", type=_positive_int, default=available_cpus(),
                     help="tokenizer processes; 1 = no pool (default: CPUs available, %(default)s)")
    run.add_argument("--start_method", choices=multiprocessing.get_all_start_methods(),
                     help="multiprocessing start method (default: the platform's)")
    run.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM, SIGHUP and SIGUSR1 raise KeyboardInterrupt as Ctrl-C does, so all clean up alike; a second signal
    is ignored rather than cutting the clean-up short. A signal the process was started ignoring stays ignored
    (`nohup`'s SIGHUP, a background job's SIGINT). The previous handlers come back on exit."""

    def handler(signum, frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def kept_note(target: Optional[Path], out_dir: Path) -> str:
    """What a failed or stopped run says about its work: the finished shards kept, and how to continue."""
    record = read_progress(target) if target is not None else None
    if record is None:
        return ""
    n = len(record["shards"])
    unchanged = f" ({out_dir} is unchanged)" if target != out_dir else ""
    if n == 0:
        return f"; no shard was finished{unchanged}: rerun the same command to start again"
    return f"; {n} finished shard{'s' if n != 1 else ''} kept in {target}{unchanged}: rerun the same command to continue"


def swapped_note(manifest: dict, out_dir: Path) -> str:
    return f"--overwrite: the new corpus ({len(manifest['shards'])} shards) replaced the old one in {out_dir}"


def main(argv=None, *, sleep=time.sleep) -> dict:
    """The command line; sleep: the retry backoff's wait (tests pass one that does not wait)."""
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.local:
        prefix = args.prefix or re.sub(r"[^A-Za-z0-9_-]+", "_", Path(args.local[0]).stem) or "corpus"
        out_dir = Path(args.out_dir or HERE / "data" / prefix)
        source = {"type": "local", "files": None, "text_field": args.text_field}  # files: once they are checked
        describe = ", ".join(args.local)
    else:
        prefix = args.prefix or DEFAULT_PREFIX
        out_dir = Path(args.out_dir or DEFAULT_OUT_DIR)
        source = {"type": "hub", "dataset": args.dataset, "name": args.name, "split": args.split,
                  "text_field": args.text_field}
        describe = f"{args.dataset} ({args.name}, {args.split})"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", prefix):
        parser.error(f"--prefix {prefix!r}: use letters, digits, '.', '_' and '-' (no path separators)")
    if args.tokenizer == "char" and not args.local:
        parser.error("--tokenizer char needs --local files (its vocabulary is read from them before tokenising)")
    if args.dataset_name is not None and not args.dataset_name.strip():
        parser.error("--dataset_name: empty name")

    target = None  # where shards are being written, once the pipeline starts
    cursor = None
    try:
        with interrupts_raise():
            if args.local:
                check_local_files(args.local)
                source["files"] = [str(Path(p).resolve()) for p in args.local]
                reader = LocalSource(args.local, args.text_field)
            else:
                reader = HubSource(args.dataset, args.name or None, args.split, args.text_field)
            check_out_dir(out_dir, prefix)
            # Read one document before loading the tokenizer and starting the pool: a wrong field, a bad first
            # line or an empty corpus then fails at once, before anything is written.
            cursor = Cursor(reader, retries=RETRIES, delay=RETRY_DELAY, sleep=sleep, on_retry=print)
            docs = iter(cursor)
            first = next(docs, None)
            if first is None:
                raise CorpusError(f"no documents in {describe} (empty, or only blank text)")
            chars = None
            if args.tokenizer == "char":  # a first pass, before anything is written: a bad line fails here
                chars = corpus_characters(iter_documents(args.local, args.text_field))
                print(f"char tokenizer: {len(chars)} distinct characters")
            enc = load_tokenizer(chars)
            settings = run_settings(prefix, args.shard_size, enc, source, args.dataset_name or dataset_name(source))
            with locked_out_dir(out_dir):
                manifest = finish_swap(out_dir, prefix)  # an earlier --overwrite stopped while moving files
                if manifest is not None:
                    print(swapped_note(manifest, out_dir))
                if manifest is None or not args.overwrite or manifest_settings(manifest, prefix) != settings:
                    plan = plan_run(out_dir, prefix, settings, args.overwrite)
                    for note in plan.notes:
                        print(note)
                    if plan.resume is not None:  # read again from the record's position, checking what is skipped
                        cursor.close()
                        print(f"skipping the {plan.resume['documents']:,} documents in the finished shards")
                        cursor = Cursor(reader, plan.resume, retries=RETRIES, delay=RETRY_DELAY, sleep=sleep,
                                        on_retry=print)
                        docs = iter(cursor)
                        first = next(docs, None)
                        check_partial_document(plan.target, plan.resume, enc, first)
                    target = plan.target
                    print(f"tokenizing {describe} -> {target}/{prefix}_*.npy with {args.workers} worker(s)")
                    manifest = run_pipeline(itertools.chain([first], docs), target, prefix, args.shard_size, enc,
                                            args.workers, args.start_method, source, progress=not args.no_progress,
                                            settings=settings, resume=plan.resume, cursor=cursor)
                    if target != out_dir:
                        print(swapped_note(finish_swap(out_dir, prefix), out_dir))
    except CorpusError as e:
        raise SystemExit(f"fineweb.py: error: {e}{kept_note(target, out_dir)}") from None
    except BrokenProcessPool:
        raise SystemExit(f"fineweb.py: error: a tokenizer worker died (killed by a signal, e.g. the out-of-memory "
                         f"killer?){kept_note(target, out_dir) or '; rerun'}, with fewer --workers if memory is "
                         f"short") from None
    except OSError as e:  # a file that became unreadable mid-run, say: still one line
        where = f"{e.filename}: " if e.filename else ""
        raise SystemExit(f"fineweb.py: error: {where}{e.strerror or e}{kept_note(target, out_dir)}") from None
    except KeyboardInterrupt as e:
        raise SystemExit(f"fineweb.py: interrupted ({e.args[0] if e.args else 'SIGINT'})"
                         f"{kept_note(target, out_dir)}") from None
    finally:
        if cursor is not None:
            cursor.close()  # the hub stream's generators, now rather than at interpreter exit

    split = manifest["small_corpus_split"]
    if split:
        total = manifest["total_tokens"]
        where = "at a document boundary" if split["at_document_boundary"] else "mid-document"
        print(f"small corpus: {total:,} tokens fit in one shard of {args.shard_size:,}, so it was split "
              f"{where}: val {split['val_tokens']:,} tokens ({split['val_tokens'] / total:.1%}), "
              f"train {split['train_tokens']:,}")
    n_val = sum(s["split"] == "val" for s in manifest["shards"])
    seconds = manifest["seconds"]
    print(f"done: {manifest['total_documents']:,} documents, {manifest['total_tokens']:,} tokens, "
          f"{len(manifest['shards'])} shards ({n_val} val, {len(manifest['shards']) - n_val} train) in "
          f"{seconds:.1f} s ({manifest['total_tokens'] / max(seconds, 1e-9):,.0f} tokens/s); "
          f"manifest: {out_dir / MANIFEST}")
    return manifest


def check_partial_document(directory: Path, record: dict, enc, doc: Optional[str]) -> None:
    """The document a continued run starts with must begin with the tokens the last finished shard ends with
    (record["skip_tokens"] of them): the same input, tokenised the same way."""
    if doc is None:
        raise CorpusError(f"the input ends after {record['documents']:,} documents, but the finished shards hold "
                          f"more: it changed since; pass --overwrite to start over")
    n = record["skip_tokens"]
    if n and not np.array_equal(encode_documents(enc, [doc])[0][:n], finished_tail(directory, record["shards"], n)):
        raise CorpusError(f"document {record['documents']:,} of the input is not the one the last finished shard "
                          f"ends with: the input changed since; pass --overwrite to start over")


if __name__ == "__main__":
    main()
