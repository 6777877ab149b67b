"""
Pre-tokenise a text corpus with the GPT-2 tokenizer (or one token per character) into uint16 .npy shards
for train_gpt2.py.

    python fineweb.py                          # FineWeb-Edu sample-10BT (streamed) -> edu_fineweb10B/
    python fineweb.py --local input.txt        # the built-in Shakespeare corpus -> data/input/
    python fineweb.py --local a.jsonl b.parquet --out_dir data/mine --prefix mine
    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char

Every document becomes <|endoftext|> followed by its tokens (with --tokenizer char: its characters followed
by a blank line); the token stream is cut into shards of --shard_size tokens named
{prefix}_{split}_{index:06d}.npy. Shard 000000 is the validation split, the rest are train; a document may span
any number of shards and the last shard holds the remainder. A corpus that fits in one shard is split in two
instead (see --help). manifest.json, written last, lists the shards. A run that fails or is stopped (Ctrl-C,
SIGTERM, a dead worker) removes what it wrote.

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
from concurrent.futures import ProcessPoolExecutor
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

# Workers get batches of whole documents: big enough that inter-process overhead is noise, small enough
# that a few batches per worker are in flight.
BATCH_CHARS = 1 << 18
BATCH_DOCS = 1024
IN_FLIGHT_PER_WORKER = 2  # batches submitted ahead per worker: keeps workers busy, bounds memory

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


def iter_txt_documents(path: str | os.PathLike, chunk_chars: int = 1 << 20) -> Iterator[str]:
    """Documents of a text file: separated by two or more blank lines, surrounding whitespace trimmed."""
    # Read in large chunks and split with a regex: a Python loop over lines costs ~20% of tokenising time.
    parts: list[str] = []  # the current document so far
    tail = ""  # whitespace at the end of what was read: it may begin a separator, so it joins the next chunk
    lines = 0
    try:
        # utf-8-sig: a byte-order mark at the very start is not text; universal newlines: \r\n and \r read as \n
        with open(path, encoding="utf-8-sig") as f:
            while chunk := f.read(chunk_chars):
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


def iter_jsonl_documents(path: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """The text field of each JSON object, one per line (blank lines allowed)."""
    with open(path, "rb") as f:  # bytes, decoded line by line, so an error names the exact line
        for lineno, raw in enumerate(f, 1):
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


def iter_parquet_documents(path: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """The text column of a Parquet file, read in record batches (never the whole file at once)."""
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
    for batch in pf.iter_batches(batch_size=1024, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text


def iter_hub_documents(dataset: str, name: Optional[str], split: str, text_field: str = "text") -> Iterator[str]:
    """Stream a Hugging Face dataset (no multi-GB download before the first token)."""
    from datasets import load_dataset  # heavy; only when the hub is used

    try:
        rows = load_dataset(dataset, name=name, split=split, streaming=True)
    except Exception as e:  # network, auth, unknown name: one line is more useful than a deep traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CorpusError(
            f"could not open {dataset} (name={name}, split={split}): {type(e).__name__}: {first}"
        ) from None
    for i, row in enumerate(rows):
        text = _text_of(row, text_field, f"{dataset} row {i}")
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
    for path in paths:
        reader = READERS[Path(path).suffix.lower()]
        docs = reader(path) if reader is iter_txt_documents else reader(path, text_field)
        for doc in docs:
            if doc and not doc.isspace():  # it would add a lone <|endoftext|> and nothing to learn
                yield doc


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


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stop_signals_blocked():
    """Hold Ctrl-C and SIGTERM back while pool workers may start: a worker inherits the mask, so those signals
    wait until _init_worker has set its handlers (else Python's default SIGINT handler in a spawned worker, or
    the parent's handler in a forked one, prints a traceback). The parent still sees them, just after this."""
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; no traceback per worker
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


def tokenize_batch(docs: list[str]) -> list[np.ndarray]:
    """Pool task: encode a batch of documents with this process's tokenizer."""
    global _WORKER_ENCODING
    if _WORKER_ENCODING is None:  # called outside a pool (tests, workers=1)
        _WORKER_ENCODING = load_tokenizer()
    return encode_documents(_WORKER_ENCODING, docs)


def tokenize_documents(
    docs: Iterable[str], enc, workers: int = 1, start_method: Optional[str] = None
) -> Iterator[list[np.ndarray]]:
    """Token arrays of the documents, in order, one list per batch; workers > 1 uses a process pool.

    A worker that dies (out-of-memory killer, kill -9) raises BrokenProcessPool here at once: an executor notices
    a lost worker, where multiprocessing.Pool would wait forever for its task.
    """
    batches = batch_documents(docs)
    if workers == 1:  # no pool: no start-up cost, and errors surface with their own traceback
        for batch in batches:
            yield encode_documents(enc, batch)
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
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
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
    """Packs token arrays into shards of shard_size tokens; a document may span any number of shards."""

    def __init__(self, out_dir: str | os.PathLike, prefix: str, shard_size: int):
        if shard_size < 1:
            raise ValueError("shard_size must be positive")
        self.out_dir = Path(out_dir)
        self.prefix = prefix
        self.shard_size = shard_size
        self.shards: list[dict] = []  # {"file", "split", "tokens"} per shard written
        self.docs = 0
        self.tokens = 0
        self.small_split: Optional[dict] = None  # set when a one-shard corpus was split into val + train
        self._buf = np.empty(min(shard_size, 1 << 20), dtype=DTYPE)  # grows to shard_size when needed
        self._fill = 0
        # Where documents start, for the val/train cut of a small corpus: only while the corpus may still be
        # small and only where the cut may fall (None once a full shard is written).
        self._doc_starts: Optional[array.array] = array.array("q")

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
        write_file(self.out_dir / name, lambda f: save_npy(f, tokens))
        self.shards.append({"file": name, "split": "val" if index == 0 else "train", "tokens": int(len(tokens))})


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
        what = "free some space or choose another --out_dir" if full else "choose another --out_dir"
        raise CorpusError(f"cannot write {path} ({e.strerror or e}); {what}") from None


def find_outputs(out_dir: str | os.PathLike, prefix: str) -> tuple[list[Path], list[Path]]:
    """(files of ours: shards with this prefix, their temp files, the manifest; shards with other prefixes)."""
    out_dir = Path(out_dir)
    ours, others = [], []
    if not out_dir.is_dir():
        return ours, others
    for path in sorted(out_dir.iterdir()):
        m = _run_files().SHARD_NAME.fullmatch(path.name)
        if m:
            (ours if m["prefix"] == prefix else others).append(path)
        elif path.name in (MANIFEST, _run_files().FINEWEB_INCOMPLETE) or (
            path.name.startswith((f".{prefix}_", f".{MANIFEST}.tmp")) and ".tmp" in path.name  # left by a killed run
        ):
            ours.append(path)
    return ours, others


def remove_outputs(out_dir: str | os.PathLike, prefix: str) -> int:
    """Delete this prefix's shards, temp files and the manifest in out_dir; returns how many."""
    ours, _ = find_outputs(out_dir, prefix)
    for path in ours:
        path.unlink(missing_ok=True)
    return len(ours)


def check_out_dir(out_dir: str | os.PathLike, prefix: str, overwrite: bool) -> list[Path]:
    """Refuse a directory we cannot write in or that holds another corpus; returns the old files that overwrite
    will delete."""
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
    ours, others = find_outputs(out_dir, prefix)
    if others:
        raise CorpusError(
            f"{out_dir} holds shards with another prefix (e.g. {others[0].name}); one directory holds one "
            f"corpus, so choose another --out_dir"
        )
    if ours and not overwrite:
        raise CorpusError(
            f"{out_dir} already holds {len(ours)} file(s) from an earlier run (e.g. {ours[0].name}); "
            f"pass --overwrite to replace them, or choose another --out_dir"
        )
    return ours


def write_manifest(out_dir: str | os.PathLike, manifest: dict) -> Path:
    """manifest.json beside the shards, written atomically and last: its presence means the run finished."""
    path = Path(out_dir) / MANIFEST
    write_file(path, lambda f: f.write((json.dumps(manifest, indent=2) + "\n").encode()))
    return path


def dataset_name(source: dict) -> str:
    """The manifest's "dataset": "fineweb-edu" for the hub's FineWeb-Edu (plots draw GPT-2's reference lines only
    for it), another hub dataset's name, or "local"."""
    if source.get("type") != "hub":
        return "local"
    return "fineweb-edu" if source.get("dataset") == DEFAULT_DATASET else str(source.get("dataset"))


def build_manifest(writer: ShardWriter, enc, source: dict) -> dict:
    """What a reader needs to trust the shards: tokenizer, dtype, files and their token counts, origin.
    tokenizer_from_manifest(manifest) rebuilds the tokenizer."""
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
        "dataset": dataset_name(source),
        "source": source,
        "shard_size": writer.shard_size,
        "small_corpus_split": writer.small_split,
        "total_documents": writer.docs,
        "total_tokens": writer.tokens,
        "shards": writer.shards,
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
) -> dict:
    """Tokenise docs into shards plus manifest.json in out_dir (assumed clear); returns the manifest.

    On any failure or interrupt this prefix's shards, temp files and manifest are deleted, so a directory never
    holds a partial corpus (found by name, so a file cut short mid-rename goes too).
    """
    writer = ShardWriter(out_dir, prefix, shard_size)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(unit="tok", unit_scale=True, desc=f"tokenizing -> {prefix}", smoothing=0.1)
    t0 = time.perf_counter()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / _run_files().FINEWEB_INCOMPLETE).touch()  # train_gpt2.py refuses the dir until the manifest
    stream = tokenize_documents(docs, enc, workers, start_method)
    try:
        for arrays in stream:
            for tokens in arrays:
                writer.add(tokens)
            if bar is not None:
                bar.update(sum(len(a) for a in arrays))
                bar.set_postfix_str(f"{writer.docs / (time.perf_counter() - t0):,.0f} docs/s", refresh=False)
        writer.close()
        manifest = build_manifest(writer, enc, source or {})
        manifest["seconds"] = round(time.perf_counter() - t0, 3)
        write_manifest(out_dir, manifest)
        (Path(out_dir) / _run_files().FINEWEB_INCOMPLETE).unlink()
    except BaseException:
        remove_outputs(out_dir, prefix)
        raise
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
    parser = argparse.ArgumentParser(
        prog="fineweb.py",
        description="Tokenise a corpus with GPT-2 (or by character) into uint16 .npy shards (shard 000000 = val, "
                    "the rest = train).",
        allow_abbrev=False,  # --out must not silently mean --out_dir
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
            f"dtype, per-shard token counts, source), each written atomically, the manifest last. An --out_dir "
            f"that already holds shards or a manifest is refused unless --overwrite is given. A run that fails or "
            f"is stopped (Ctrl-C, SIGTERM, a killed worker, a full disk) removes what it wrote.",
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
    out.add_argument("--overwrite", action="store_true",
                     help="delete this prefix's shards and the manifest in --out_dir first")
    run = parser.add_argument_group("run")
    run.add_argument("--workers", type=_positive_int, default=available_cpus(),
                     help="tokenizer processes; 1 = no pool (default: CPUs available, %(default)s)")
    run.add_argument("--start_method", choices=multiprocessing.get_all_start_methods(),
                     help="multiprocessing start method (default: the platform's)")
    run.add_argument("--no_progress", action="store_true", help="no progress bar")
    return parser


@contextlib.contextmanager
def interrupts_raise():
    """SIGTERM raises KeyboardInterrupt as Ctrl-C does, so both clean up alike; a second signal is ignored rather
    than cutting the clean-up short. The previous handlers come back on exit."""

    def handler(signum, frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.local:
        prefix = args.prefix or re.sub(r"[^A-Za-z0-9_-]+", "_", Path(args.local[0]).stem) or "corpus"
        out_dir = args.out_dir or HERE / "data" / prefix
        source = {"type": "local", "files": None, "text_field": args.text_field}  # files: once they are checked
        describe = ", ".join(args.local)
    else:
        prefix = args.prefix or DEFAULT_PREFIX
        out_dir = args.out_dir or DEFAULT_OUT_DIR
        source = {"type": "hub", "dataset": args.dataset, "name": args.name, "split": args.split,
                  "text_field": args.text_field}
        describe = f"{args.dataset} ({args.name}, {args.split})"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", prefix):
        parser.error(f"--prefix {prefix!r}: use letters, digits, '.', '_' and '-' (no path separators)")
    if args.tokenizer == "char" and not args.local:
        parser.error("--tokenizer char needs --local files (its vocabulary is read from them before tokenising)")

    try:
        with interrupts_raise():
            if args.local:
                check_local_files(args.local)
                source["files"] = [str(Path(p).resolve()) for p in args.local]
                docs = iter_documents(args.local, args.text_field)
            else:
                docs = iter_hub_documents(args.dataset, args.name or None, args.split, args.text_field)
            stale = check_out_dir(out_dir, prefix, args.overwrite)
            # Read one document before loading the tokenizer and starting the pool: a wrong field, a bad first
            # line or an empty corpus then fails at once.
            first = next(docs, None)
            if first is None:
                raise CorpusError(f"no documents in {describe} (empty, or only blank text)")
            docs = itertools.chain([first], docs)
            chars = None
            if args.tokenizer == "char":  # a first pass, before old files are removed: a bad line fails here
                chars = corpus_characters(iter_documents(args.local, args.text_field))
                print(f"char tokenizer: {len(chars)} distinct characters")
            if stale:
                print(f"--overwrite: removed {remove_outputs(out_dir, prefix)} old file(s) from {out_dir}")
            print(f"tokenizing {describe} -> {out_dir}/{prefix}_*.npy with {args.workers} worker(s)")
            manifest = run_pipeline(docs, out_dir, prefix, args.shard_size, load_tokenizer(chars), args.workers,
                                    args.start_method, source, progress=not args.no_progress)
    except CorpusError as e:
        raise SystemExit(f"fineweb.py: error: {e}") from None
    except BrokenProcessPool:
        raise SystemExit("fineweb.py: error: a tokenizer worker died (killed by a signal, e.g. the out-of-memory "
                         "killer?); the shards written so far were removed; rerun, with fewer --workers if memory "
                         "is short") from None
    except OSError as e:  # a file that became unreadable mid-run, say: still one line
        where = f"{e.filename}: " if e.filename else ""
        raise SystemExit(f"fineweb.py: error: {where}{e.strerror or e}") from None
    except KeyboardInterrupt as e:
        raise SystemExit(f"fineweb.py: interrupted ({e.args[0] if e.args else 'SIGINT'}); the shards written so "
                         f"far were removed") from None

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
          f"manifest: {Path(out_dir) / MANIFEST}")
    return manifest


if __name__ == "__main__":
    main()
