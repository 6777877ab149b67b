"""
Tokenise a corpus into uint16 .npy shards for train_gpt2.py.

    python fineweb.py  # FineWeb-Edu sample-10BT -> edu_fineweb10B/
    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char
    python fineweb.py --local input.txt --out_dir data/shakespeare
    python fineweb.py --local a.jsonl b.parquet --text_field body

Input: the hub dataset's parquet files (--repo, --files), downloaded one at a time by
huggingface_hub (its retries, resumable downloads); with HF_HUB_OFFLINE=1 the ones downloaded
already (in the hub cache, or --download_dir) are used. Or --local files: a .txt file holds
documents separated by two or more blank lines; a .jsonl line or a .parquet row holds one in its
--text_field. --free deletes each download once its shards are done.

Each file is tokenised on its own, in order, into shards of --shard_size tokens named
{prefix}_{split}_{file:04d}_{part:04d}.npy (np.save of a 1-D uint16 array). --workers processes
read the file's slices themselves (.parquet rows, .txt/.jsonl bytes cut where a document or line
starts) and send back their tokens; this process puts them in order and writes the shards.
GPT-2: each document is <|endoftext|> then its tokens. char: one token per character of the
--local files, and each document is followed by a blank line.

Split: the first --shard_size tokens of the first file are val (part 0 of file 0), everything
after is train. If the first file holds at most --shard_size tokens, val is about 10% of it, cut
at the document boundary nearest to 10% if one lies between 5% and 20% (else mid-document), and
the rest of it is train.

A finished file gets a done-record (.fineweb/{file:04d}.done.json: its source, the settings, its
shards and their sha256); manifest.json comes last, and until then train_gpt2.py refuses the
directory. A run that is stopped (Ctrl-C, kill) or fails keeps its finished files: the same
command continues with the first unfinished one, and ends with the bytes of a run that never
stopped. A rerun first checks every shard already written (size, sha256) and tokenises a file
whose shards changed again. Other settings on the same --out_dir are refused. --overwrite builds
the new corpus beside the old one (.fineweb/staging/) and swaps it in once it is complete.

Read top to bottom, the pipeline comes first, what a data researcher changes: the tokenizers, the
sources, their documents, the tokens of a document, the shards, and the run that ties them. The
machinery below it (slices, worker processes, done-records and manifest, atomic writes and locks,
the checks train_gpt2.py makes of a corpus) needs no change for another source, tokenizer or
shard layout.
"""

import argparse
import base64
import collections
import contextlib
import ctypes
import fcntl
import fnmatch
import functools
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import re
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

# Ctrl-C while numpy loads ends the program in one line
try:
    import numpy as np
except KeyboardInterrupt:
    sys.exit(f"{Path(sys.argv[0]).name}: interrupted while starting; nothing was written")

MANIFEST = "manifest.json"
# the lock file of a corpus's readers: training runs share it, fineweb.py takes it alone to
# change a finished corpus
READERS = ".readers.lock"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)

# GPT-2's BPE from the vendored vocabulary (tiktoken's r50k_base)
GPT2_VOCAB_FILE = Path(__file__).resolve().parent / "assets" / "gpt2.tiktoken"
GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256  # <|endoftext|>
GPT2_VOCAB_SIZE = 50257

# A worker's unit of work: about 1 MiB of input (~250k GPT-2 tokens, a tenth of a second of
# one core), so a stop waits little and a few slices per worker in flight hold little memory.
SLICE_BYTES = 2**20
SLICES_AHEAD = 2  # per worker, submitted beyond the one awaited
# A shard's tokens are held in memory until it is written: at most 2 GB (10x the default)
SHARD_SIZE_MAX = 10**9
CHUNK_BYTES = 2**20  # what verify_shard reads at a time (it stays in the CPU cache)


class CorpusError(Exception):
    """Bad input or output, told to the user in one line."""


# -----------------------------------------------------------------------------
# Tokenizers


# The GPT-2 encoding, built offline from the vendored vocabulary.
@functools.lru_cache(maxsize=None)
def get_tokenizer(vocab_file=GPT2_VOCAB_FILE):
    import tiktoken

    data = Path(vocab_file).read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_VOCAB_SHA256:
        raise ValueError(
            f"{vocab_file} is not the GPT-2 vocabulary (sha256 mismatch); restore it from git"
        )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=(
            r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++"""
            r"""| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
        ),
        mergeable_ranks={
            base64.b64decode(t): int(r) for t, r in (line.split() for line in data.splitlines())
        },
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


# one token per character (chars sorted): id i is chars[i]
class CharTokenizer:
    name = "char"
    eot_token = None  # documents end with a blank line instead

    def __init__(self, chars):
        if not chars or list(chars) != sorted(set(chars)):
            raise ValueError(
                "a CharTokenizer's vocabulary must be a non-empty string "
                "of sorted, unique characters"
            )
        self.chars = chars
        self.n_vocab = len(chars)
        self.ids = {c: i for i, c in enumerate(chars)}

    def encode(self, text, **ignored):
        try:
            return [self.ids[c] for c in text]
        except KeyError as e:
            raise ValueError(
                f"character {e.args[0]!r} is not in the vocabulary of {self.n_vocab} characters"
            ) from None

    encode_ordinary = encode

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)


# What tokenizer_from_manifest needs to rebuild enc.
def tokenizer_info(enc):
    return {"tokenizer": enc.name, "vocab": getattr(enc, "chars", None)}


# The tokenizer a manifest (or a tokenizer_info dict) names.
def tokenizer_from_manifest(info):
    kind = info.get("tokenizer", "gpt2")
    if kind not in ("gpt2", "char") or (kind == "char") != isinstance(info.get("vocab"), str):
        raise ValueError(
            f"manifest tokenizer {kind!r}: expected 'gpt2', or 'char' with its 'vocab' string"
        )
    return make_tokenizer(info.get("vocab"))


# GPT-2's tokenizer for vocab None, else the CharTokenizer of vocab
@functools.lru_cache(maxsize=None)
def make_tokenizer(vocab):
    return get_tokenizer() if vocab is None else CharTokenizer(vocab)


# UTF-8 bytes of each id's text (int64); <|endoftext|> is 0.
def token_byte_lengths(enc):
    if enc.name == "char":
        texts = [c.encode("utf-8", "surrogatepass") for c in enc.chars]
    else:
        texts = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
        texts[enc.eot_token] = b""
    return np.array([len(t) for t in texts], dtype=np.int64)


# -----------------------------------------------------------------------------
# Sources: a dataset's files on the hub, or local ones


# the dataset's files that match pattern, sorted: as the hub lists them, or offline
# (HF_HUB_OFFLINE=1) those downloaded already (into the hub cache, or download_dir)
def hub_files(repo, pattern, download_dir):
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.utils import logging

    logging.set_verbosity_error()  # not a warning per file offline
    if constants.HF_HUB_OFFLINE:
        root = snapshot_download(
            repo, repo_type="dataset", allow_patterns=pattern, local_dir=download_dir
        )
        names = [p.relative_to(root).as_posix() for p in Path(root).rglob("*")]
    else:
        names = HfApi().list_repo_files(repo, repo_type="dataset")
    names = [n for n in fnmatch.filter(names, pattern) if n[0] != "."]
    if not names:
        raise CorpusError(f"no files of {repo} match {pattern!r}")
    return sorted(names)


# the absolute paths of --local's files, refused before any work when one is of a kind we
# cannot read, missing, or not a regular file (a FIFO, a device), or when a file comes twice (by
# its name, a link or a hard link): its text would be in the corpus twice, the val split's in
# the train split too
def check_local(paths):
    seen = {}  # {(device, inode): the path given first}
    for path in paths:
        if Path(path).suffix.lower() not in (".txt", ".jsonl", ".parquet") or file_problem(path):
            raise CorpusError(f"{path}: no such .txt, .jsonl or .parquet file")
        info = os.stat(path)
        first = seen.get((info.st_dev, info.st_ino))
        if first is not None:
            same = "is given twice" if first == path else f"and {first} are the same file"
            raise CorpusError(f"{path} {same}: give each input once")
        seen[(info.st_dev, info.st_ino)] = path
    return [os.path.abspath(path) for path in paths]


# -----------------------------------------------------------------------------
# Documents: a slice of a file (.txt, .jsonl or .parquet) as its texts


# Documents separated by two or more blank lines (whitespace only): a line of text after two
# blank ones starts a document. Each document stripped.
def txt_documents(text):
    lines = text.split("\n")
    docs = []
    first = 0  # the current document's first line
    blank = 0  # blank lines just before line i
    for i, line in enumerate(lines):
        if line.strip() and blank >= 2:
            docs.append("\n".join(lines[first:i]).strip())
            first = i
        blank = 0 if line.strip() else blank + 1
    docs.append("\n".join(lines[first:]).strip())
    return docs


# the text field of each JSON object, one a line (blank lines allowed); a bad line is named by
# its number in the file
def jsonl_documents(path, text, start, text_field):
    docs = []
    for number, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            docs.append(json.loads(line)[text_field])
        except (ValueError, KeyError, TypeError, IndexError) as e:
            lineno = lines_before(path, start) + number + 1
            raise CorpusError(
                f"{path}:{lineno}: not a JSON object with a "
                f"{text_field!r} field ({type(e).__name__}: {e}); "
                "mend the line, or pick the field with --text_field"
            ) from None
    return docs


# the text column of rows [start, stop) of a .parquet file, read in record batches
def parquet_documents(path, start, stop, text_field):
    import pyarrow.parquet as pq

    with open_file(path) as f:
        table = pq.ParquetFile(f)
        sizes = [table.metadata.row_group(i).num_rows for i in range(table.num_row_groups)]
        firsts = np.cumsum([0] + sizes)  # each group's first row, and the file's end
        groups = [i for i in range(len(sizes)) if firsts[i] < stop and firsts[i + 1] > start]
        row = firsts[groups[0]] if groups else start  # the first row of the batch read
        docs = []
        batches = table.iter_batches(
            batch_size=1024, row_groups=groups, columns=[text_field], use_threads=False
        )
        for batch in batches:
            lo = max(start - row, 0)
            hi = min(stop - row, batch.num_rows)
            if hi > lo:
                docs += batch.column(0).slice(lo, hi - lo).to_pylist()
            row += batch.num_rows
            if row >= stop:
                break
    return docs


# A slice's documents, in order; those without visible text (or not text: null, a number) are
# left out.
def read_slice(path, start, stop, text_field):
    suffix = Path(path).suffix.lower()
    try:
        if suffix == ".parquet":
            docs = parquet_documents(path, start, stop, text_field)
        elif suffix == ".txt":
            docs = txt_documents(read_text(path, start, stop))
        else:
            docs = jsonl_documents(path, read_text(path, start, stop), start, text_field)
    except (ValueError, OSError) as e:  # not Parquet, unreadable
        raise CorpusError(f"{path}: {type(e).__name__}: {e}") from None
    return [doc for doc in docs if isinstance(doc, str) and doc.strip()]


# a file's documents, in order (its slices read one after another, here)
def read_documents(path, text_field="text"):
    for _, start, stop in plan_slices(path, text_field):
        yield from read_slice(path, start, stop, text_field)


# -----------------------------------------------------------------------------
# Tokens: a document's ids; the char vocabulary


# GPT-2: [<|endoftext|>] + the document's tokens (build-nanogpt's); char: the document's characters,
# then a blank line's
def encode_document(vocab, doc):
    enc = make_tokenizer(vocab)
    if vocab is None:
        return np.array([enc.eot_token] + enc.encode_ordinary(doc), dtype=np.uint16)
    return np.array(enc.encode(doc + "\n\n"), dtype=np.uint16)


# A slice's tokens (uint16) and each of its documents' token counts (int64), in a worker. One
# document at a time on the worker's main thread: tiktoken there runs faster than in
# encode_ordinary_batch's threads, and processes already use every core (docs/benchmarks.md).
def encode_slice(path, start, stop, text_field, vocab):
    try:
        docs = read_slice(path, start, stop, text_field)
        arrays = [encode_document(vocab, doc) for doc in docs]
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        return np.concatenate([np.empty(0, dtype=np.uint16)] + arrays), lengths
    except MemoryError:
        raise CorpusError(out_of_memory(path, start, stop)) from None


# a slice's distinct characters, sorted, in a worker
def slice_chars(path, start, stop, text_field):
    try:
        return "".join(sorted(set("".join(read_slice(path, start, stop, text_field)))))
    except MemoryError:
        raise CorpusError(out_of_memory(path, start, stop)) from None


# what a worker out of memory on a slice says: where, and what to do (a slice holds whole
# documents, so a huge one is a single document)
def out_of_memory(path, start, stop):
    if Path(path).suffix.lower() == ".parquet":
        where = f"rows {start:,} to {stop:,}"
    else:
        where = f"bytes {start:,} to {stop:,} ({(stop - start) / 2**20:,.1f} MB)"
    return (
        f"{path}: out of memory tokenising {where}, whole documents: give each worker more"
        " memory (fewer --workers), or cut a document that large into smaller ones"
    )


# the char vocabulary: the sorted distinct characters of the files' documents and of the blank line
# that ends each document
def char_vocab(pool, paths, text_field, stop):
    jobs = (job + (text_field,) for path in paths for job in plan_slices(path, text_field))
    chars = set("\n")
    for found in in_order(pool, slice_chars, jobs, stop):
        chars.update(found)
    if len(chars) > 2**16:
        raise CorpusError(
            f"the corpus has {len(chars):,} distinct characters, more than "
            "the 65,536 ids of a uint16 shard; use --tokenizer gpt2"
        )
    return "".join(sorted(chars))


# -----------------------------------------------------------------------------
# Shards: the tokens of a file in parts of --shard_size, the first part of the first file val


# np.save's header of a 1-D uint16 array of n tokens: a shard's first bytes
def npy_header(n):
    header = io.BytesIO()
    fields = {"descr": "<u2", "fortran_order": False, "shape": (n,)}
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


# (file name, split) of part `part` of file `index`: the first part of the first file is val
def shard_name(prefix, index, part):
    split = "val" if index == part == 0 else "train"
    return f"{prefix}_{split}_{index:04d}_{part:04d}.npy", split


# how many of the n tokens of a first file that fits in one shard are val: about 10%, at the
# document start nearest to 10% if one lies between 5% and 20%, else mid-document (1 token at least)
def small_val_size(n, starts):
    if n < 2:
        raise CorpusError("the first file holds no documents; val and train need some")
    target = min(max(round(n / 10), 1), n - 1)
    near = [s for s in starts if max(-(-n // 20), 1) <= s <= min(n // 5, n - 1)]
    return min(near, key=lambda s: abs(s - target), default=target)


# the first n tokens of the arrays `parts`, and the rest (views: nothing copied)
def split_parts(parts, n):
    head = []
    for i, part in enumerate(parts):
        if len(part) >= n:
            return head + [part[:n]], [part[n:]] + parts[i + 1 :]
        head.append(part)
        n -= len(part)
    return head, []


# The next part of file `index`, added to its shard entries: the bytes np.save writes for the
# tokens of `parts`, concatenated (its header, then the tokens), written straight from the
# parts, and their sha256.
def save_shard(target, prefix, index, shards, parts):
    name, split = shard_name(prefix, index, len(shards))
    path = target / name
    tokens = sum(len(part) for part in parts)
    digest = hashlib.sha256(npy_header(tokens))
    for part in parts:
        digest.update(part.data)

    def write(f):
        f.write(npy_header(tokens))
        for part in parts:
            f.write(part.data)

    write_atomic(path, write)
    shards.append(
        {
            "file": path.name,
            "split": split,
            "tokens": tokens,
            "sha256": digest.hexdigest(),
            "bytes": path.stat().st_size,
        }
    )


# build-nanogpt's packing, per file: parts of size tokens, the last one the remainder (a document
# may span parts); returns their entries. results: each slice's tokens and its documents' token
# counts, in order.
def write_shards(target, index, results, settings):
    size = settings["shard_size"]
    pending = []  # token arrays not in a shard yet
    count = 0
    lengths = []  # documents' token counts, while the first file may fit in one shard
    shards = []
    for tokens, doc_lengths in results:
        pending.append(tokens)
        count += len(tokens)
        if index == 0 and not shards:
            lengths.append(doc_lengths)
        # a full shard is written once there are more tokens
        while count > size:
            parts, pending = split_parts(pending, size)
            save_shard(target, settings["prefix"], index, shards, parts)
            count -= size
    # a first file that fits in one shard: pending holds its documents
    starts = np.cumsum(np.concatenate([[0]] + lengths)).tolist()
    cut = small_val_size(count, starts) if index == 0 and not shards else 0
    for parts in split_parts(pending, cut):
        if sum(len(part) for part in parts):
            save_shard(target, settings["prefix"], index, shards, parts)
    return shards


# -----------------------------------------------------------------------------
# The run: each file not done yet tokenised in turn, then the manifest


# tokenise each file not done yet into target, then write its done-record; last, the manifest
def build(pool, args, target, settings, stop):
    from huggingface_hub import hf_hub_download

    for index, source in enumerate(settings["sources"]):
        record_file = target / ".fineweb" / f"{index:04d}.done.json"
        if record_file.exists():
            continue
        # a hub file: downloaded, or found in the cache or download_dir (offline); a stop
        # signal during the download ends it at once
        path = source
        if not args.local:
            with stop.at_once():
                path = hf_hub_download(
                    args.repo, source, repo_type="dataset", local_dir=args.download_dir
                )
        info = os.stat(path)
        desc = f"{index + 1}/{len(settings['sources'])} {Path(source).name}"
        shards = tokenize_file(pool, path, target, index, settings, desc, stop)
        # a file written to while it was read gives shards of neither version: not done
        after = os.stat(path)
        if [after.st_size, after.st_mtime_ns] != [info.st_size, info.st_mtime_ns]:
            raise CorpusError(
                f"{source} changed while it was tokenised: run fineweb.py again once it is"
                " written (its shards are made again)"
            )
        record = {
            "source": source,
            "size": info.st_size,
            "mtime_ns": None if args.local is None else info.st_mtime_ns,
            "settings": settings,
            "shards": shards,
        }
        write_atomic(record_file, lambda f: f.write(json.dumps(record, indent=1).encode()))
        say(f"{desc}: {sum(s['tokens'] for s in shards):,} tokens")
        if args.free and not args.local:
            free_download(path, args.repo, args.download_dir)
    write_manifest(target, settings)


# path's documents into target's shards, by the pool's workers, in order
def tokenize_file(pool, path, target, index, settings, desc, stop):
    from tqdm import tqdm

    text_field = settings["text_field"]
    jobs = (job + (text_field, settings["vocab"]) for job in plan_slices(path, text_field))
    results = in_order(pool, encode_slice, jobs, stop)
    with tqdm(desc=desc, unit="tok", unit_scale=True, disable=None) as progress:
        return write_shards(target, index, counted(results, progress), settings)


# the results, each one's tokens counted on the progress bar
def counted(results, progress):
    for tokens, lengths in results:
        progress.update(len(tokens))
        yield tokens, lengths


# --free: the hub's copy of a file done, deleted: the file in --download_dir, or the hub cache's
# link and the blob it points to in the cache. A link to a file elsewhere (the user's) loses the
# link only.
def free_download(path, repo, download_dir):
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    blob = Path(os.path.realpath(path))
    os.remove(path)
    folder = repo_folder_name(repo_id=repo, repo_type="dataset")
    blobs = Path(os.path.realpath(os.path.join(constants.HF_HUB_CACHE, folder, "blobs")))
    if download_dir is None and blob.parent == blobs:
        os.remove(blob)


# the sources and settings, then under out_dir's lock: finish a swap
# cut short, refuse what the settings would not make, check what is
# done, build, swap in; state tells main where the files go and how many there are
def run(args, pool, state, stop, wait):
    out_dir = args.out_dir or (f"data/{Path(args.local[0]).stem}" if args.local else "")
    out_dir = check_out_dir(resolved(out_dir or "edu_fineweb10B"))
    # downloads go where --download_dir means now, never into a run's log_dir or a corpus
    if args.download_dir:
        args.download_dir = resolved(args.download_dir)
        # (a new --out_dir is not a corpus yet: its own .fineweb/ comes later)
        owner = claimed_by(args.download_dir)
        if args.download_dir == out_dir or out_dir in args.download_dir.parents:
            owner = f"the corpus {out_dir}"
        if owner:
            raise CorpusError(
                f"--download_dir {args.download_dir} is inside {owner}: pick a directory outside it"
            )
    if args.local:
        sources = check_local(args.local)
    else:
        with stop.at_once():
            sources = hub_files(args.repo, args.files, args.download_dir)
    state["files"] = len(sources)
    # GPT-2's tokenizer is built here, before the first job starts a worker: they share it
    if args.tokenizer == "gpt2":
        get_tokenizer()
    vocab = None
    if args.tokenizer == "char":
        vocab = char_vocab(pool, sources, args.text_field, stop)
    # the dataset recorded: FineWeb-Edu, another repo's id, or local
    name = "fineweb-edu" if args.repo == "HuggingFaceFW/fineweb-edu" else args.repo
    settings = {
        "tokenizer": args.tokenizer,
        "vocab": vocab,
        "dataset": args.dataset_name or ("local" if args.local else name),
        "repo": None if args.local else args.repo,
        "prefix": args.prefix,
        "shard_size": args.shard_size,
        "text_field": args.text_field,
        "sources": sources,
    }
    staging = out_dir / ".fineweb" / "staging"
    # a finished corpus changes (swapped, repaired) only under its readers' lock: never while a
    # training run reads it
    with locked(out_dir, wait, stop), contextlib.ExitStack() as changing:
        new, problem = read_manifest(staging)
        swapping = not problem  # an --overwrite stopped while swapping
        held = swapping or args.overwrite
        if held:
            changing.enter_context(no_readers(out_dir))
        if swapping:
            swap_in(out_dir, staging, new)
        state["target"] = staging if args.overwrite else out_dir
        problem = check_corpus(state["target"], settings)
        if problem and not args.overwrite:
            raise CorpusError(f"{problem}; use --overwrite to rebuild, or another --out_dir")
        if problem:  # an earlier --overwrite's, with other settings
            shutil.rmtree(staging)
        if state["target"].is_dir():
            damage = find_damage(pool, state["target"], settings, stop)
            if damage and not held:
                changing.enter_context(no_readers(out_dir))
            remove_damage(damage)
        _, problem = read_manifest(out_dir)
        done = not problem and not args.overwrite
        if not done:
            build(pool, args, state["target"], settings, stop)
        if args.overwrite:
            swap_in(out_dir, staging, read_manifest(staging)[0])
        manifest, _ = read_manifest(out_dir)
    say(
        f"{out_dir}: {'finished already, its shards verified' if done else 'done'} "
        f"({manifest['tokens']:,} tokens, {len(manifest['shards'])} shards)"
    )
    return manifest


def main(argv=None, wait=False):
    """The command line; returns the manifest of the corpus made. A bad input, a stop signal or
    a failure ends it by SystemExit with its one line (the signal handlers it took given back,
    its workers ended). wait: when another fineweb.py run holds --out_dir, wait for it (as
    train_gpt2.py does, making a preset's corpus) instead of refusing."""
    args = parse_args(argv)
    state = {"target": None, "files": 0}
    # a stop signal ignored at start (as nohup's SIGHUP) stays ignored; the old handlers come back
    # after
    stop = Stop()
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in [sig for sig in STOP_SIGNALS if old[sig] != signal.SIG_IGN]:
        signal.signal(sig, stop.handle)
    pool = Pool(args.workers)
    try:
        return run(args, pool, state, stop, wait)
    except KeyboardInterrupt as e:
        sys.exit(
            f"fineweb.py: stopped ({e or 'SIGINT'}); {files_done(state)}; run the same command to"
            " continue"
        )
    except WorkerDied:
        sys.exit(
            "fineweb.py: error: a worker died (killed, or out of memory?); "
            f"{files_done(state)}: run the same command to continue"
        )
    except MemoryError:
        sys.exit(
            f"fineweb.py: error: out of memory writing shards; {files_done(state)}: run the same"
            " command with a smaller --shard_size (a shard's tokens are held until it is written)"
        )
    except Exception as e:
        # an OSError names its file (write_atomic's, a full disk's)
        reason = e if isinstance(e, (CorpusError, OSError)) else f"{type(e).__name__}: {e}"
        sys.exit(f"fineweb.py: error: {str(reason).splitlines()[0]}")
    finally:
        pool.close()
        for sig in STOP_SIGNALS:
            signal.signal(sig, old[sig])


# "N of M files done and kept", for the line a stopped or failed run ends with
def files_done(state):
    done = len(read_records(state["target"])[0]) if state["target"] else 0
    return f"{done} of {state['files']} files done and kept"


# the CPUs this process may run on (its affinity: what a scheduler or taskset gave it)
def usable_cpus():
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# (flag, argparse's options)
FLAGS = [
    ("--local", dict(nargs="+", metavar="FILE", help=".txt/.jsonl/.parquet files, in order")),
    ("--repo", dict(default="HuggingFaceFW/fineweb-edu", help="else: hub dataset (%(default)s)")),
    ("--files", dict(default="sample/10BT/*.parquet", help="its files (%(default)s)")),
    ("--download_dir", dict(help="downloads go there (default: the hub cache)")),
    ("--free", dict(action="store_true", help="delete each download once it is done")),
    ("--dataset_name", dict(help="as recorded (default: fineweb-edu, the repo, local)")),
    ("--text_field", dict(default="text", help="of .jsonl/.parquet (%(default)s)")),
    ("--tokenizer", dict(choices=("gpt2", "char"), default="gpt2", help="char: --local only")),
    ("--out_dir", dict(help="default: edu_fineweb10B, or data/{first file's stem}")),
    ("--prefix", dict(default="edufineweb", help="of shard names (%(default)s)")),
    ("--shard_size", dict(type=int, default=10**8, help="tokens (%(default)s)")),
    ("--workers", dict(type=int, default=usable_cpus(), help="processes (%(default)s)")),
    ("--overwrite", dict(action="store_true", help="rebuild beside, then swap in")),
]


# the flags, checked: a bad one is argparse's one line (exit status 2)
def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="fineweb.py",
        usage=argparse.SUPPRESS,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    for flag, options in FLAGS:
        parser.add_argument(flag, **options)
    args = parser.parse_args(argv)
    if args.tokenizer == "char" and args.local is None:
        parser.error("--tokenizer char needs --local files (for its vocabulary)")
    # the prefix starts every shard's name in --out_dir: a name, never a path out of it
    if not re.fullmatch(r"[\w.-]{1,100}", args.prefix):
        parser.error(
            f"--prefix {args.prefix!r} must be a plain name (up to 100 letters, digits, "
            "'.', '_' or '-'), not a path: shards go in --out_dir"
        )
    # counts a typo cannot take past what the machine holds
    if not 1 <= args.shard_size <= SHARD_SIZE_MAX:
        parser.error(
            f"--shard_size {args.shard_size:,} must be between 1 and {SHARD_SIZE_MAX:,} tokens: "
            "a shard's tokens are held in memory until it is written (2 bytes each)"
        )
    if not 1 <= args.workers <= usable_cpus():
        parser.error(
            f"--workers {args.workers:,} must be between 1 and {usable_cpus()}, the CPUs this "
            "process may use: more workers would only wait for them"
        )
    return args


# =============================================================================
# The machinery below keeps a run resumable, its output checked and its files whole: the pipeline
# above calls it, and a change of source, tokenizer or shard layout needs none of it.
# =============================================================================


# -----------------------------------------------------------------------------
# Slices: a file cut where a document or a line starts (bytes), or between row groups (rows)


# where the line after the one holding `offset` starts (the file's size if none)
def next_line(f, offset):
    f.seek(offset)
    f.readline()
    return f.tell()


# The first offset after `offset` where a .txt document starts: a line with visible text after
# two blank ones, both after offset (lines before it are not looked at). bytes.strip() knows only
# ASCII whitespace, a part of str.strip()'s: a line blank here is blank as text too, so a cut
# here is a cut between documents. The file's size if there is none.
def next_document(f, offset):
    next_line(f, offset)
    blank = 0
    while True:
        at = f.tell()
        line = f.readline()
        if not line or (line.strip() and blank >= 2):
            return at
        blank = 0 if line.strip() else blank + 1


# A .parquet file's slices: its row groups (datatrove, which wrote FineWeb-Edu, writes groups of
# 1,000 documents, ~5 MB), small ones gathered up to SLICE_BYTES. A group of more than 8 slices'
# bytes is cut into 8 row ranges: a worker decodes the group from its start up to its range
# (Parquet has no row index to seek by), so more ranges would cost more decoding than they gain.
def parquet_slices(path, text_field):
    import pyarrow.parquet as pq

    try:
        with open_file(path) as f:
            table = pq.ParquetFile(f)
    except (ValueError, OSError) as e:  # not Parquet, unreadable
        raise CorpusError(f"{path}: {type(e).__name__}: {e}") from None
    if text_field not in table.schema_arrow.names:
        raise CorpusError(
            f"{path}: no column {text_field!r} (columns: "
            f"{', '.join(table.schema_arrow.names[:10])}); pick one with --text_field"
        )
    start = 0  # the first row of the slice being gathered
    gathered = 0  # its bytes
    row = 0  # the first row of group i
    for i in range(table.num_row_groups):
        rows = table.metadata.row_group(i).num_rows
        size = table.metadata.row_group(i).total_byte_size
        if size > 8 * SLICE_BYTES:
            if row > start:
                yield (path, start, row)
            cuts = [row + rows * k // 8 for k in range(9)]
            for a, b in zip(cuts, cuts[1:]):
                if b > a:
                    yield (path, a, b)
            start = row + rows
            gathered = 0
        else:
            gathered += size
            if gathered >= SLICE_BYTES:
                yield (path, start, row + rows)
                start = row + rows
                gathered = 0
        row += rows
    if row > start:
        yield (path, start, row)


# path's slices, in order; planned as they are asked for (a .txt or .jsonl file is read here
# only around each cut: a line, or up to the next document)
def plan_slices(path, text_field):
    if Path(path).suffix.lower() == ".parquet":
        yield from parquet_slices(path, text_field)
        return
    cut = next_document if Path(path).suffix.lower() == ".txt" else next_line
    start = 0
    with open_file(path) as f:
        size = os.fstat(f.fileno()).st_size
        while start < size:
            stop = cut(f, start + SLICE_BYTES) if start + SLICE_BYTES < size else size
            yield (path, start, stop)
            start = stop


# the number of line ends (\n, \r\n, or \r alone, as Python's text files count them) in the
# first `stop` bytes of path: where a slice's line numbers start, for an error's message
def lines_before(path, stop):
    count = 0
    last = b""
    with open_file(path) as f:
        for chunk in iter(lambda: f.read(min(2**24, stop - f.tell())), b""):
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if last == b"\r" and chunk[:1] == b"\n":
                count -= 1
            last = chunk[-1:]
    return count


# a slice of a .txt or .jsonl file as text: UTF-8, a byte-order mark at the file's start not
# text, its line ends \n (as a text file reads them)
def read_text(path, start, stop):
    with open_file(path) as f:
        f.seek(start)
        data = f.read(stop - start)
    if start == 0 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
        start = 3
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before(path, start + e.start) + 1
        raise CorpusError(
            f"{path}:{line}: not UTF-8 (byte {data[e.start]:#04x} at offset {start + e.start}); "
            "convert the file to UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# -----------------------------------------------------------------------------
# The workers: each reads its slices itself and sends back small arrays


class WorkerDied(Exception):
    """A worker process ended in the middle of the run (kill -9, the OOM killer)."""


# Worker processes, each forked when a job first needs it (never more than the jobs in flight),
# each with a pipe of its own: job i of an in_order goes to worker i % size, which does its jobs
# in order. A worker that dies at any moment, even halfway through sending a result, only ends
# its own pipe, which result() sees. (concurrent.futures' pool shares one result pipe: a worker
# killed halfway through a result left the pool's reader waiting for the rest for good.)
class Pool:
    def __init__(self, size):
        self.size = size
        # on Linux fork, for prctl's tie to us
        self.context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
        self.workers = []  # (process, our end of its pipe)

    def submit(self, i, fn, args):
        if i % self.size == len(self.workers):
            ours, theirs = self.context.Pipe()
            process = self.context.Process(target=work, args=(theirs, os.getpid()), daemon=True)
            process.start()
            theirs.close()
            self.workers.append((process, ours))
        try:
            self.workers[i % self.size][1].send((fn, args))
        except OSError:  # its end of the pipe is gone
            raise WorkerDied() from None

    # Job i's result. A stop signal only records itself: it is looked at here, before each
    # result and every 0.2 s while one is awaited.
    def result(self, i, stop):
        pipe = self.workers[i % self.size][1]
        stop.check()
        while not pipe.poll(0.2):
            stop.check()
        try:
            done, value = pipe.recv()
        except (EOFError, OSError):
            raise WorkerDied() from None
        if not done:
            raise CorpusError(value)
        return value

    # The workers hold nothing of the run's (this process writes every file): ended at once.
    def close(self):
        for process, pipe in self.workers:
            process.kill()
            process.join()
            pipe.close()
        self.workers = []


# A worker: it dies with the parent (even on its kill -9), and leaves stop signals (a terminal's
# Ctrl-C, a scheduler's SIGTERM to the process group) to the parent, which alone ends the run.
# Each job's answer: (True, its result), or (False, the error's line).
def work(pipe, parent):
    if sys.platform.startswith("linux"):
        # prctl(PR_SET_PDEATHSIG, SIGKILL)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    while True:
        fn, args = pipe.recv()
        try:
            answer = (True, fn(*args))
        except Exception as e:
            answer = (False, str(e) if isinstance(e, CorpusError) else f"{type(e).__name__}: {e}")
        pipe.send(answer)


# fn(*job) of each job by the pool's workers, results in order: SLICES_AHEAD a worker submitted
# beyond the one awaited
def in_order(pool, fn, jobs, stop):
    jobs = enumerate(jobs)
    pending = collections.deque()
    for i, job in itertools.islice(jobs, SLICES_AHEAD * pool.size + 1):
        pool.submit(i, fn, job)
        pending.append(i)
    while pending:
        result = pool.result(pending.popleft(), stop)
        for i, job in itertools.islice(jobs, 1):
            pool.submit(i, fn, job)
            pending.append(i)
        yield result


# -----------------------------------------------------------------------------
# The output directory: done-records, manifest, repair, --overwrite's swap


# why entry is not a shard entry of a manifest, or None
def shard_entry_problem(entry):
    if not isinstance(entry, dict):
        return "a shard entry is not a JSON object"
    name = entry.get("file")
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".npy"):
        return f"shard {name!r} is not a .npy file name"
    if entry.get("split") not in ("val", "train"):
        return f"shard {name}: its split is not 'val' or 'train'"
    tokens = entry.get("tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        return f"shard {name}: its tokens are not a count"
    sha256 = entry.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and len(sha256) == 64):
        return f"shard {name}: its sha256 is not a hex digest"
    return None


# why manifest (parsed JSON) is not a corpus's manifest, or None
def manifest_problem(manifest):
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    if manifest.get("tokenizer") not in ("gpt2", "char"):
        return "its tokenizer is not 'gpt2' or 'char'"
    if (manifest["tokenizer"] == "char") != isinstance(manifest.get("vocab"), str):
        return "its vocab does not fit its tokenizer"
    if not isinstance(manifest.get("fingerprint"), str):
        return "no fingerprint"
    if not isinstance(manifest.get("sources"), list):
        return "no list of sources"
    if not isinstance(manifest.get("shards"), list) or not manifest["shards"]:
        return "no list of shards"
    for entry in manifest["shards"]:
        problem = shard_entry_problem(entry)
        if problem:
            return problem
    return None


# The problem of the done-record of file `index`, or None: a damaged one (edited, cut short)
# means its file is not done. Its shards must bear the names fineweb.py gives them: --overwrite's
# swap deletes the old ones by these names.
def record_problem(record, index):
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        return "not a done-record"
    if not isinstance(record.get("source"), str) or not isinstance(record.get("size"), int):
        return "no source, or no size"
    if not isinstance(record.get("mtime_ns"), (int, type(None))):
        return "its mtime_ns is not a number"
    if not isinstance(record.get("shards"), list):
        return "no list of shards"
    for part, entry in enumerate(record["shards"]):
        problem = shard_entry_problem(entry)
        if problem:
            return problem
        if not isinstance(entry.get("bytes"), int) or entry["sha256"] is None:
            return f"shard {entry['file']}: no bytes or no sha256"
        name, split = shard_name(record["settings"].get("prefix"), index, part)
        if entry["file"] != name or entry["split"] != split:
            return f"shard {entry['file']} is not the name of part {part} of file {index}"
    return None


# the JSON in path, or (None, why not); a FIFO or a device is not opened
def read_json(path):
    problem = file_problem(path)
    if problem:
        return None, problem
    try:
        with open(path, "rb") as f:
            return json.loads(f.read()), None
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"


# the manifest in root, or (None or what is there, why it is not a corpus's manifest)
def read_manifest(root):
    manifest, problem = read_json(root / MANIFEST)
    return manifest, problem or manifest_problem(manifest)


# the file index of a done-record at path ({file:04d}.done.json), or None
def record_index(path):
    name = path.name.removesuffix(".done.json")
    return int(name) if re.fullmatch("[0-9]+", name) else None


# target's done-records by file index: the good ones, and the paths of damaged ones with their
# problem
def read_records(target):
    records = {}
    damaged = {}
    for path in sorted(target.glob(".fineweb/*.done.json")):
        index = record_index(path)
        record, problem = read_json(path)
        if index is None:
            problem = "not a done-record's name"
        problem = problem or record_problem(record, index)
        if problem:
            damaged[path] = problem
        else:
            records[index] = record
    return records, damaged


# why target's corpus or finished files are not what these settings make (other settings, a source
# changed since), or None
def check_corpus(target, settings):
    records, _ = read_records(target)
    # the first setting that differs, in the manifest or in a record
    made = [r["settings"] for r in records.values()]
    manifest, problem = read_manifest(target)
    if not problem:
        made.append(manifest)
    key = next((k for old in made for k in settings if old.get(k) != settings[k]), None)
    if key:
        return f"{target} holds a corpus made with another {key}"
    for record in records.values():
        st = os.stat(record["source"]) if record["mtime_ns"] else None
        if st and [st.st_size, st.st_mtime_ns] != [record["size"], record["mtime_ns"]]:
            return f"{record['source']} changed since it was tokenised"
    return None


# What of target's corpus a rerun makes again, as (path, what to say) to remove, the manifest
# first (the directory is unfinished from then on): a damaged manifest or done-record, and the
# done-record of each file whose shards changed. The pool checks every shard of the done files
# (size, sha256, ids).
def find_damage(pool, target, settings, stop):
    records, damaged = read_records(target)
    present = os.path.lexists(target / MANIFEST)
    _, problem = read_manifest(target)
    vocab_size = len(settings["vocab"] or "") or GPT2_VOCAB_SIZE
    jobs = [(target / s["file"], s, vocab_size) for r in records.values() for s in r["shards"]]
    owners = [i for i, r in records.items() for _ in r["shards"]]
    bad = {}
    for index, found in zip(owners, in_order(pool, verify_shard, jobs, stop)):
        if found and index not in bad:
            bad[index] = found
    damage = []
    if present and (problem or damaged or bad):
        said = f"{target / MANIFEST} is damaged ({problem}); writing it again" if problem else None
        damage.append((target / MANIFEST, said))
    for path, why in damaged.items():
        damage.append((path, f"{path} is damaged ({why}); its file is tokenised again"))
    for index, found in bad.items():
        said = f"{found}: tokenising {records[index]['source']} again"
        damage.append((target / ".fineweb" / f"{index:04d}.done.json", said))
    return damage


# find_damage's paths removed, each said (their files are tokenised again)
def remove_damage(damage):
    for path, said in damage:
        if said:
            say(said)
        path.unlink()


# manifest.json from the done-records: the shards, val first, and a fingerprint over their sha256s
def write_manifest(target, settings):
    records, _ = read_records(target)
    shards = [s for index in sorted(records) for s in records[index]["shards"]]
    manifest = {
        **settings,
        "vocab_size": len(settings["vocab"] or "") or GPT2_VOCAB_SIZE,
        "eot_token": None if settings["vocab"] else EOT_TOKEN,
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "fingerprint": hashlib.sha256(
            "\n".join(f"{s['file']} {s['tokens']} {s['sha256']}" for s in shards).encode()
        ).hexdigest(),
    }
    write_atomic(target / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))


# Put staging's finished corpus (its manifest: new) in place of out_dir's. Each step may be cut
# short and redone: the old manifest goes first (out_dir is unfinished from then on), the new
# one comes last. What goes is fineweb.py's: the shards its done-records name, done-records.
def swap_in(out_dir, staging, new):
    keep = {s["file"] for s in new["shards"]}
    records, _ = read_records(out_dir)
    old = {s["file"] for r in records.values() for s in r["shards"]}
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in old - keep:
        (out_dir / name).unlink(missing_ok=True)
    for path in (out_dir / ".fineweb").glob("*.done.json"):
        if record_index(path) is None or record_index(path) >= len(new["sources"]):
            path.unlink()  # the rest are replaced
    for path in [*staging.glob("*.npy"), *(staging / ".fineweb").glob("*.json")]:
        os.replace(path, out_dir / path.relative_to(staging))
    os.replace(staging / MANIFEST, out_dir / MANIFEST)
    shutil.rmtree(staging)


# -----------------------------------------------------------------------------
# Files: read without blocking, written atomically, one writer at a time


# why path is no file to read, without opening it: gone, or not a regular file (a FIFO would
# block a reader for good); None if it is one
def file_problem(path):
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file"
    return None


# path opened to read, once file_problem finds it a regular file: a FIFO or a device is never
# opened. Every reader of an input goes through here.
def open_file(path):
    problem = file_problem(path)
    if problem:
        raise CorpusError(problem)
    return open(path, "rb")


# the temp files .{name}.tmp{pid} beside path that are over a minute old: their writers are gone
def remove_stale_temps(path):
    prefix = f".{path.name}.tmp"
    for other in path.parent.iterdir():
        if not other.name.startswith(prefix) or not other.name[len(prefix) :].isdigit():
            continue
        try:
            if time.time() - other.stat().st_mtime > 60:
                other.unlink()
        except FileNotFoundError:
            continue


# write(f) into a temp file beside path (its directory made if need be), fsync, rename over
# path: path is then the whole new file, or what it was. A failed write (a full disk) leaves no
# temp file behind, and its OSError names path. The temp name is fixed (a rerun writes over
# what a killed run left), or with unique, the process's own: for a file two programs may write
# at once; then the temp files of writers killed meanwhile are removed once a minute old (no
# live writer holds one that long).
def write_atomic(path, write, unique=False):
    tmp = path.with_name(f".{path.name}.tmp{os.getpid() if unique else ''}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if unique:
            remove_stale_temps(path)
        # a new file of its own: never written through a link left at the temporary's name
        tmp.unlink(missing_ok=True)
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        # (the error's own text names the temporary file: the user knows path)
        raise OSError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)  # (gone already once renamed)


# path with every link in it resolved now: a program resolves the directory it writes into (or a
# run the corpus it reads) once, when it checks it, and uses this from then on, so that a link
# moved meanwhile (a "latest" pointer) changes nothing. Relative to the working directory when
# inside it, so that messages keep the names the user gave.
def resolved(path):
    real = os.path.realpath(path)
    inside = os.path.relpath(real)
    if inside == ".." or inside.startswith("../"):
        return Path(real)
    return Path(inside)


# What path lies in (path itself or a directory above it) that no other program may write into:
# a training run's log_dir (it holds runs.jsonl) or a corpus of fineweb.py's (it holds .fineweb/);
# None if neither.
def claimed_by(path):
    path = Path(os.path.abspath(path))
    for directory in [path, *path.parents]:
        if (directory / "runs.jsonl").is_file():
            return f"the run in {directory}"
        if (directory / ".fineweb").is_dir():
            return f"the corpus {directory}"
    return None


# --out_dir, checked: a directory that is fineweb.py's (it holds .fineweb/), or new, or empty;
# never one inside a training run's log_dir or another corpus, nor one holding others' files
def check_out_dir(out_dir):
    above = claimed_by(out_dir.parent)
    if above:
        raise CorpusError(f"--out_dir {out_dir} is inside {above}: pick a directory outside it")
    if (out_dir / "runs.jsonl").is_file():
        raise CorpusError(f"--out_dir {out_dir} is a training run's log_dir: pick another")
    # (the lock files a run makes first are fineweb.py's)
    others = []
    if out_dir.is_dir() and not (out_dir / ".fineweb").is_dir():
        others = [p for p in out_dir.iterdir() if p.name not in (".lock", READERS)]
    if others:
        raise CorpusError(
            f"{out_dir} holds files that are not fineweb.py's; pick another --out_dir (a new or"
            " an empty one)"
        )
    return out_dir


# The readers' lock of the corpus in out_dir taken alone while the block runs: fineweb.py is
# about to change a finished corpus (swap in a new one, remake a damaged file). A training run
# reading it holds the lock shared: this run is refused then, and a run starting meanwhile is.
@contextlib.contextmanager
def no_readers(out_dir):
    try:
        lock = take_lock(out_dir / READERS)
    except BlockingIOError:
        raise CorpusError(
            f"a training run is reading {out_dir} (it holds {out_dir / READERS}): run this again"
            " once that run has ended, or write another --out_dir"
        ) from None
    except NoLocks:
        say(f"warning: {out_dir} has no file locks: keep training runs off it while it changes")
        lock = None
    except ValueError as e:
        raise CorpusError(str(e)) from None
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


class NoLocks(OSError):
    """A filesystem without file locks (some network filesystems)."""


# A flock on the file at path (made if missing): exclusive, or shared with other readers. The
# open file that holds it, which the kernel unlocks when it is closed or its process ends: a
# killed holder leaves no stale lock. Held by another: BlockingIOError (with wait: waited for).
# NoLocks where the filesystem has none. A FIFO or a device there is never opened.
def take_lock(path, shared=False, wait=False):
    # Its holder writes its pid into it: never through a link, which would take that into
    # another file (O_NOFOLLOW fails on a link made meanwhile too)
    if os.path.islink(path):
        raise ValueError(f"{path} is a link; remove it (a lock file has its name)")
    if os.path.lexists(path) and file_problem(path):
        raise ValueError(f"{file_problem(path)}; remove it (a lock file has its name)")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    lock = os.fdopen(fd, "a+")
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        fcntl.flock(lock, mode if wait else mode | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise
    except OSError as e:
        lock.close()
        raise NoLocks(e.errno, e.strerror) from None
    return lock


# Out_dir's lock held while the block runs: one run at a time writes out_dir. Another run
# holding it is refused, or with wait, waited for.
@contextlib.contextmanager
def locked(out_dir, wait, stop):
    try:
        (out_dir / ".fineweb").mkdir(parents=True, exist_ok=True)
        lock = take_lock(out_dir / ".lock")
    except BlockingIOError:
        if not wait:
            raise CorpusError(f"another fineweb.py run is writing {out_dir}") from None
        say(f"waiting for another fineweb.py run writing {out_dir}")
        with stop.at_once():
            lock = take_lock(out_dir / ".lock", wait=True)
    except NoLocks:
        say(f"warning: {out_dir} has no file locks; run one fineweb.py at a time")
        lock = None
    except ValueError as e:
        raise CorpusError(str(e)) from None
    except OSError as e:
        raise CorpusError(f"cannot write {out_dir}: {e.strerror or e}") from None
    try:
        yield
    finally:
        if lock is not None:
            lock.close()


# A stop signal's request. Its handler only records it: the main loop looks at it between
# results, and the run then ends as Ctrl-C ends it, by a KeyboardInterrupt. Inside at_once() (a
# download, a wait for the lock: nothing of the pool's in flight) it ends the run at once.
class Stop:
    def __init__(self):
        self.name = None  # the signal that asked
        self.immediate = False

    def handle(self, signum, frame):
        self.name = signal.Signals(signum).name
        if self.immediate:
            self.immediate = False
            raise KeyboardInterrupt(self.name)

    def check(self):
        if self.name:
            raise KeyboardInterrupt(self.name)

    @contextlib.contextmanager
    def at_once(self):
        self.check()
        self.immediate = True
        try:
            yield
        finally:
            self.immediate = False


# a line on stdout; a stdout that fails (a full disk, a closed pipe, a gone terminal) ends the
# printing, not the program: what it writes to disk (a corpus, a run's log and checkpoints) is
# what must survive
def say(line):
    try:
        print(line, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# -----------------------------------------------------------------------------
# Reading a corpus (train_gpt2.py): its manifest checked, its shards verified


# (tokens, where they start) of the .npy file open in f, at its start; a ValueError if it is
# not a 1-D uint16 array
def npy_layout(f):
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f".npy format version {version}")
    if dtype != np.dtype("<u2") or len(shape) != 1:
        raise ValueError(f"a {dtype} array of shape {shape}, not 1-D uint16")
    return shape[0], f.tell()


def verify_shard(path, entry, vocab_size):
    """None if the .npy shard at path is what entry (a manifest's shard) says: a regular file of
    entry["tokens"] uint16 tokens, of sha256 entry["sha256"] (unless that is None), every id below
    vocab_size. Else the problem, one line naming the shard (the caller says what to do). Reads
    CHUNK_BYTES at a time."""
    problem = file_problem(path)
    if problem:
        return problem
    size = os.path.getsize(path)
    digest = hashlib.sha256()
    top = 0
    try:
        with open(path, "rb") as f:
            tokens, offset = npy_layout(f)
            if tokens != entry["tokens"]:
                return f"{path} holds {tokens:,} tokens, not the {entry['tokens']:,} recorded"
            if size != offset + 2 * tokens:
                sizes = f"{size:,} bytes, expected {offset + 2 * tokens:,}"
                return f"{path} changed since fineweb.py wrote it ({sizes})"
            f.seek(0)
            digest.update(f.read(offset))
            for chunk in iter(functools.partial(f.read, CHUNK_BYTES), b""):
                if entry["sha256"] is not None:
                    digest.update(chunk)
                top = max(top, int(np.frombuffer(chunk, dtype="<u2").max()))
    except (OSError, ValueError) as e:
        return f"{path} cannot be read as a .npy shard ({e})"
    if entry["sha256"] is not None and digest.hexdigest() != entry["sha256"]:
        return f"{path} changed since fineweb.py wrote it (its sha256 differs)"
    if top >= vocab_size:
        return f"{path} holds token id {top}, not below the vocabulary's {vocab_size}"
    return None


# Every shard of a corpus checked before a run reads it (verify_shard: its sha256 against the
# manifest's, every id below the vocabulary), or a ValueError line. That reads the whole corpus
# once, so the processes of a node share it: process `rank` of `world` checks every world-th
# shard (docs/data.md: its cost).
def verify_shards(root, manifest, vocab_size, rank=0, world=1):
    for i, entry in enumerate(manifest["shards"]):
        if i % world != rank:
            continue
        problem = verify_shard(Path(root) / entry["file"], entry, vocab_size)
        if problem:
            raise ValueError(f"{problem}; rerun fineweb.py")


# the tokens of a shard of build-nanogpt's (no manifest), from its header; a one-line ValueError
# if it is not a whole .npy file of uint16 tokens
def nanogpt_tokens(path):
    problem = file_problem(path)
    if problem:
        raise ValueError(f"{problem}; make the corpus again with fineweb.py")
    try:
        with open(path, "rb") as f:
            tokens, offset = npy_layout(f)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path} is not a .npy shard ({e}); make it again with fineweb.py"
        ) from None
    size = os.path.getsize(path)
    if size != offset + 2 * tokens:
        raise ValueError(
            f"{path} is cut short ({size:,} bytes, expected {offset + 2 * tokens:,}); "
            "make it again with fineweb.py"
        )
    return tokens


def load_corpus(data_root):
    """The manifest of the finished corpus in data_root, or a one-line
    ValueError saying what to do. Its shards are checked without being
    read: each a regular file of the size its tokens make (verify_shard
    reads them). build-nanogpt's shards without a manifest get one made
    up (GPT-2 tokens, dataset None, a "note")."""
    root = Path(data_root)
    if os.path.lexists(root / MANIFEST):
        manifest, problem = read_manifest(root)
        if problem:
            raise ValueError(
                f"{root / MANIFEST} is damaged ({problem}); "
                "rerun the fineweb.py command that made it"
            )
        for entry in manifest["shards"]:
            path = root / entry["file"]
            expected = len(npy_header(entry["tokens"])) + 2 * entry["tokens"]
            problem = file_problem(path)
            if not problem and os.path.getsize(path) != expected:
                sizes = f"{os.path.getsize(path):,} bytes, expected {expected:,}"
                problem = f"{path} changed since fineweb.py wrote it ({sizes})"
            if problem:
                raise ValueError(f"{problem}; rerun fineweb.py")
        return manifest
    if (root / ".fineweb").is_dir() or (root / ".fineweb_incomplete").exists():
        raise ValueError(f"{root} is unfinished: rerun the same fineweb.py command to finish it")
    found = [(p, s) for s in ("val", "train") for p in sorted(root.glob(f"*_{s}_*.npy"))]
    if {s for _, s in found} != {"val", "train"}:
        raise ValueError(f"no shards in {root}; run fineweb.py")
    return {
        "tokenizer": "gpt2",
        "vocab": None,
        "dataset": None,
        "shards": [
            {"file": p.name, "split": s, "tokens": nanogpt_tokens(p), "sha256": None}
            for p, s in found
        ],
        "fingerprint": hashlib.sha256(
            "\n".join(f"{p.name} {p.stat().st_size}" for p, _ in found).encode()
        ).hexdigest(),
        "note": f"no {MANIFEST} in {root}: its {len(found)} shards read as GPT-2 tokens",
    }


if __name__ == "__main__":
    main()
