"""
Tokenise a corpus into uint16 .npy shards for train_gpt2.py.

    python fineweb.py  # FineWeb-Edu sample-10BT -> edu_fineweb10B/
    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char
    python fineweb.py --local input.txt --out_dir data/shakespeare
    python fineweb.py --local a.jsonl b.parquet --text_field body

Input: the hub dataset's parquet files (--repo, --files), downloaded
one at a time by huggingface_hub (its retries, resumable downloads);
with HF_HUB_OFFLINE=1 the ones downloaded already (in the hub cache,
or --download_dir) are used. Or --local files: a .txt file holds
documents separated by two or more blank lines; a .jsonl line or a
.parquet row holds one in its --text_field. --free deletes each
download once its shards are done.

Each file is tokenised on its own, in order, by a pool of --workers
processes, into shards of --shard_size tokens named
{prefix}_{split}_{file:04d}_{part:04d}.npy (np.save of a 1-D uint16
array). GPT-2: each document is <|endoftext|> then its tokens. char:
one token per character of the --local files, and each document is
followed by a blank line.

Split: the first --shard_size tokens of the first file are val (part
0 of file 0), everything after is train. If the first file holds at
most --shard_size tokens, val is about 10% of it, cut at the document
boundary nearest to 10% if one lies between 5% and 20% (else
mid-document), and the rest of it is train.

A finished file gets a done-record (.fineweb/{file:04d}.done.json:
its source, the settings, its shards and their sha256); manifest.json
comes last, and until then train_gpt2.py refuses the directory. A run
that is stopped (Ctrl-C, kill) or fails keeps its finished files: the
same command continues with the first unfinished one, and ends with
the bytes of a run that never stopped. Other settings on the same
--out_dir are refused. --overwrite builds the new corpus beside the
old one (.fineweb/staging/) and swaps it in once it is complete.
"""

import argparse
import base64
import contextlib
import ctypes
import fcntl
import fnmatch
import functools
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

import numpy as np

MANIFEST = "manifest.json"
STOP_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
)

# GPT-2's BPE from the vendored vocabulary (tiktoken's r50k_base)
GPT2_VOCAB_FILE = Path(__file__).resolve().parent / "assets" / "gpt2.tiktoken"
GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = 50256  # <|endoftext|>
GPT2_VOCAB_SIZE = 50257


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


# UTF-8 bytes of each id's text (int64); <|endoftext|> is 0.
def token_byte_lengths(enc):
    if enc.name == "char":
        texts = [c.encode("utf-8", "surrogatepass") for c in enc.chars]
    else:
        texts = [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)]
        texts[enc.eot_token] = b""
    return np.array([len(t) for t in texts], dtype=np.int64)


# -----------------------------------------------------------------------------
# Documents: each reader yields a file's texts in order (None allowed)


# documents separated by two or more blank lines (whitespace only)
def read_txt(path, text_field=None):
    lines = []
    # utf-8-sig: a byte-order mark at the start is not text
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            # a line of text after two blank ones starts a document
            if line.strip() and len(lines) > 1 and not "".join(lines[-2:]).strip():
                yield "".join(lines).strip()
                lines = []
            lines.append(line)
    yield "".join(lines).strip()


# the text field of each JSON object, one a line (blank lines allowed)
def read_jsonl(path, text_field="text"):
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            try:
                yield json.loads(line)[text_field] if line.strip() else None
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise CorpusError(
                    f"{path}:{lineno}: not a JSON object with a "
                    f"{text_field!r} field ({type(e).__name__}: {e}); "
                    "mend the line, or pick the field with --text_field"
                ) from None


# the text column of a Parquet file, read in record batches
def read_parquet(path, text_field="text"):
    import pyarrow.parquet as pq

    table = pq.ParquetFile(path)
    if text_field not in table.schema_arrow.names:
        raise CorpusError(
            f"{path}: no column {text_field!r} (columns: "
            f"{', '.join(table.schema_arrow.names[:10])}); pick one with --text_field"
        )
    for batch in table.iter_batches(batch_size=1024, columns=[text_field]):
        yield from batch.column(0).to_pylist()


READERS = {".txt": read_txt, ".jsonl": read_jsonl, ".parquet": read_parquet}


# a file's documents, by its extension; those without visible text
# (or not text: null, a number) are skipped
def read_documents(path, text_field="text"):
    try:
        for doc in READERS[Path(path).suffix.lower()](path, text_field):
            if isinstance(doc, str) and doc.strip():
                yield doc
    except (ValueError, OSError) as e:  # not UTF-8, not Parquet, unreadable
        raise CorpusError(f"{path}: {type(e).__name__}: {e}") from None


# the absolute paths of --local's files, refused before any work
# when one is missing or of a kind we cannot read
def check_local(paths):
    for path in paths:
        if Path(path).suffix.lower() not in READERS or not os.path.isfile(path):
            raise CorpusError(f"{path}: no such .txt, .jsonl or .parquet file")
    return [os.path.abspath(path) for path in paths]


# the char vocabulary: the sorted distinct characters of the files'
# documents and of the blank line that ends each document
def char_vocab(paths, text_field):
    chars = set("\n")
    for path in paths:
        for doc in read_documents(path, text_field):
            chars.update(doc)
    if len(chars) > 2**16:
        raise CorpusError(
            f"the corpus has {len(chars):,} distinct characters, more than "
            "the 65,536 ids of a uint16 shard; use --tokenizer gpt2"
        )
    return "".join(sorted(chars))


# the dataset's files that match pattern, sorted: as the hub lists
# them, or offline (HF_HUB_OFFLINE=1) those downloaded already (into
# the hub cache, or download_dir)
def hub_files(repo, pattern, download_dir):
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.utils import logging

    logging.set_verbosity_error()  # not a warning per file offline
    if constants.HF_HUB_OFFLINE:
        root = snapshot_download(
            repo,
            repo_type="dataset",
            allow_patterns=pattern,
            local_dir=download_dir,
        )
        names = [p.relative_to(root).as_posix() for p in Path(root).rglob("*")]
    else:
        names = HfApi().list_repo_files(repo, repo_type="dataset")
    names = [n for n in fnmatch.filter(names, pattern) if n[0] != "."]
    if not names:
        raise CorpusError(f"no files of {repo} match {pattern!r}")
    return sorted(names)


# -----------------------------------------------------------------------------
# Tokenising a file into shards


# pool worker set-up: die with the parent (even on its kill -9), and
# leave stop signals to it: Ctrl-C, a hangup or a scheduler's SIGTERM
# reach the whole process group, and a worker killed with a task in
# hand would leave the pool waiting for its result
def init_worker(parent):
    if sys.platform.startswith("linux"):
        # prctl(PR_SET_PDEATHSIG, SIGKILL)
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


# GPT-2's tokenizer for vocab None, else the CharTokenizer of vocab
@functools.lru_cache(maxsize=None)
def make_tokenizer(vocab):
    return get_tokenizer() if vocab is None else CharTokenizer(vocab)


# GPT-2: [<|endoftext|>] + the document's tokens (build-nanogpt's);
# char: the document's characters, then a blank line's
def encode_document(vocab, doc):
    enc = make_tokenizer(vocab)
    if vocab is None:
        return np.array([enc.eot_token] + enc.encode_ordinary(doc), dtype=np.uint16)
    return np.array(enc.encode(doc + "\n\n"), dtype=np.uint16)


# how many of the n tokens of a first file that fits in one shard
# are val: about 10%, at the document start nearest to 10% if one
# lies between 5% and 20%, else mid-document (1 token at least)
def small_val_size(n, starts):
    if n < 2:
        raise CorpusError("the first file holds no documents; val and train need some")
    target = min(max(round(n / 10), 1), n - 1)
    near = [s for s in starts if max(-(-n // 20), 1) <= s <= min(n // 5, n - 1)]
    return min(near, key=lambda s: abs(s - target), default=target)


# write(f) into a temp file beside path, fsync, rename over path: path is then
# the whole new file, or what it was. A failed write (a full disk) leaves no
# temp file behind, and its OSError names path. The temp name is fixed (a
# rerun writes over what a killed run left), or with unique, the process's
# own: for a file two programs may write at once.
def write_atomic(path, write, unique=False):
    tmp = path.with_name(f".{path.name}.tmp{os.getpid() if unique else ''}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise OSError(f"cannot write {path}: {e}") from None
    finally:
        tmp.unlink(missing_ok=True)  # (gone already once renamed)


# the next part of file `index` (val if it is the first of all),
# added to its shard entries
def save_shard(target, prefix, index, shards, tokens):
    split = "val" if index == len(shards) == 0 else "train"
    path = target / f"{prefix}_{split}_{index:04d}_{len(shards):04d}.npy"
    write_atomic(path, lambda f: np.save(f, tokens))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    shards.append(
        {
            "file": path.name,
            "split": split,
            "tokens": len(tokens),
            "sha256": sha256,
            "bytes": path.stat().st_size,
        }
    )


# build-nanogpt's packing, per file: parts of size tokens, the last
# one the remainder (a document may span parts); returns their entries.
# A stop signal is taken between documents.
def write_shards(target, index, stream, settings, stop):
    size = settings["shard_size"]
    pending = [np.empty(0, dtype=np.uint16)]  # tokens not in a shard
    count = 0
    shards = []
    for tokens in stream:
        stop.check()
        pending.append(tokens)
        count += len(tokens)
        # a full shard is written once there are more tokens
        while count > size:
            joined = np.concatenate(pending)
            save_shard(target, settings["prefix"], index, shards, joined[:size])
            pending = [joined[size:]]
            count -= size
    # a first file that fits in one shard: pending holds its documents
    starts = np.cumsum([len(tokens) for tokens in pending])
    cut = small_val_size(count, starts) if index == 0 and not shards else 0
    for tokens in np.split(np.concatenate(pending), [cut]):
        if len(tokens):
            save_shard(target, settings["prefix"], index, shards, tokens)
    return shards


# -----------------------------------------------------------------------------
# The output directory: done-records, manifest, --overwrite's swap


# target's done-records, in file order (names {file:04d}.done.json)
def read_records(target):
    return [json.loads(p.read_text()) for p in sorted(target.glob(".fineweb/*.done.json"))]


# why target's finished corpus or files are not what these settings
# make (other settings, a source or a shard changed since), or None
def check_corpus(target, settings):
    records = read_records(target)
    # the first setting that differs, in the manifest or in a record
    made = [r["settings"] for r in records] + [
        json.loads(p.read_text()) for p in target.glob(MANIFEST)
    ]
    key = next((k for old in made for k in settings if old.get(k) != settings[k]), None)
    if key:
        return f"{target} holds a corpus made with another {key}"
    for record in records:
        st = os.stat(record["source"]) if record["mtime_ns"] else None
        if st and [st.st_size, st.st_mtime_ns] != [record["size"], record["mtime_ns"]]:
            return f"{record['source']} changed since it was tokenised"
        sizes = [(target / s["file"]).stat().st_size for s in record["shards"]]
        if sizes != [s["bytes"] for s in record["shards"]]:
            return f"a shard of {record['source']} in {target} changed on disk"
    return None


# manifest.json from the done-records: the shards, val first, and a
# fingerprint over their sha256s
def write_manifest(target, settings):
    shards = [s for record in read_records(target) for s in record["shards"]]
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


# put staging's finished corpus in place of out_dir's; each step may
# be cut short and redone: the old manifest goes first (out_dir is
# unfinished from then on), the new one comes last
def swap_in(out_dir, staging):
    new = json.loads((staging / MANIFEST).read_text())
    keep = {s["file"] for s in new["shards"]}
    old = {s["file"] for r in read_records(out_dir) for s in r["shards"]}
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in old - keep:
        (out_dir / name).unlink(missing_ok=True)
    for path in (out_dir / ".fineweb").glob("*.done.json"):
        if int(path.name[:-10]) >= len(new["sources"]):  # the rest are replaced
            path.unlink()
    for path in [*staging.glob("*.npy"), *(staging / ".fineweb").glob("*.json")]:
        os.replace(path, out_dir / path.relative_to(staging))
    os.replace(staging / MANIFEST, out_dir / MANIFEST)
    shutil.rmtree(staging)


def verify_shard(path, entry, vocab_size):
    """None, or why path is not the shard entry describes: its sha256 (when recorded) and
    every id below vocab_size."""
    tokens = np.load(path, mmap_mode="r")
    if (
        entry.get("sha256")
        and hashlib.sha256(Path(path).read_bytes()).hexdigest() != entry["sha256"]
    ):
        return f"{path} changed since fineweb.py wrote it (its sha256 differs)"
    if len(tokens) and int(tokens.max()) >= vocab_size:
        return f"{path} holds token id {int(tokens.max())}, past the vocabulary of {vocab_size}"
    return None


def load_corpus(data_root):
    """The manifest of the finished corpus in data_root, or a one-line
    ValueError saying what to do. build-nanogpt's shards without a
    manifest get one made up (GPT-2 tokens, dataset None, a "note")."""
    root = Path(data_root)
    if (root / MANIFEST).is_file():
        return json.loads((root / MANIFEST).read_text())
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
            {"file": p.name, "split": s, "tokens": len(np.load(p, mmap_mode="r")), "sha256": None}
            for p, s in found
        ],
        "fingerprint": hashlib.sha256(
            "\n".join(f"{p.name} {p.stat().st_size}" for p, _ in found).encode()
        ).hexdigest(),
        "note": f"no {MANIFEST} in {root}: its {len(found)} shards read as GPT-2 tokens",
    }


# -----------------------------------------------------------------------------
# The command line

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
    ("--workers", dict(type=int, default=os.cpu_count(), help="processes (%(default)s)")),
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
    if min(args.shard_size, args.workers) < 1:
        parser.error("--shard_size and --workers must be positive")
    return args


# A stop signal ends the run as Ctrl-C does, by a KeyboardInterrupt, but
# never inside the pool's code or tqdm's: raised there, it can leave one
# of their locks taken, and the pool then waits for good. While held, a
# signal waits for check() or the hold's end.
class StopSignals:
    def __init__(self):
        self.name = None  # the signal that asked
        self.holding = False

    def handle(self, signum, frame):
        # a second signal must not cut the clean-up short
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self.name = signal.Signals(signum).name
        if not self.holding:
            raise KeyboardInterrupt(self.name)

    def check(self):
        if self.name:
            raise KeyboardInterrupt(self.name)

    @contextlib.contextmanager
    def held(self):
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        self.check()


# path's documents into target's shards, by a pool of workers, in order.
# Called held: the pool starts, works and is gone (its objects freed)
# within the hold. At the end, or on a stop or an error, its feed ends,
# and its workers finish what they hold and exit: none is killed, as one
# killed holding a lock would leave the pool waiting for good.
def tokenize_file(path, target, index, settings, workers, desc, stop):
    from tqdm import tqdm

    ending = threading.Event()
    docs = read_documents(path, settings["text_field"])
    docs = itertools.takewhile(lambda doc: not ending.is_set(), docs)
    encode = functools.partial(encode_document, settings["vocab"])
    # on Linux fork, for prctl's tie to us
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
    with context.Pool(workers, init_worker, (os.getpid(),)) as pool:
        try:
            stream = pool.imap(encode, docs, chunksize=16)
            stream = tqdm(stream, desc=desc, unit="doc", disable=None)
            return write_shards(target, index, stream, settings, stop)
        finally:
            ending.set()
            pool.close()
            pool.join()


# tokenise each file not done yet into target, then write its
# done-record; last, the manifest
def build(args, target, settings, stop):
    from huggingface_hub import hf_hub_download

    (target / ".fineweb").mkdir(parents=True, exist_ok=True)
    for index, source in enumerate(settings["sources"]):
        record_file = target / ".fineweb" / f"{index:04d}.done.json"
        if record_file.exists():
            continue
        # a hub file: downloaded, or found in the cache or download_dir (offline)
        path = (
            source
            if args.local
            else hf_hub_download(
                args.repo, source, repo_type="dataset", local_dir=args.download_dir
            )
        )
        stat = os.stat(path)
        desc = f"{index + 1}/{len(settings['sources'])} {Path(source).name}"
        # a stop signal during the download ends it at once; from here on,
        # it waits for the next document
        with stop.held():
            shards = tokenize_file(path, target, index, settings, args.workers, desc, stop)
        record = {
            "source": source,
            "size": stat.st_size,
            "mtime_ns": None if args.local is None else stat.st_mtime_ns,
            "settings": settings,
            "shards": shards,
        }
        write_atomic(record_file, lambda f: f.write(json.dumps(record, indent=1).encode()))
        print(f"{desc}: {sum(s['tokens'] for s in shards):,} tokens")
        # the hub cache's link and its blob, or a --download_dir file
        if args.free and not args.local:
            for file in {os.path.realpath(path), os.path.abspath(path)}:
                os.remove(file)
    write_manifest(target, settings)


# the sources and settings, then under out_dir's lock: finish a swap
# cut short, refuse what the settings would not make, build, swap in;
# state tells main where the files go and how many there are
def run(args, state, stop):
    sources = (
        check_local(args.local)
        if args.local
        else hub_files(args.repo, args.files, args.download_dir)
    )
    state["files"] = len(sources)
    # the dataset recorded: FineWeb-Edu, another repo's id, or local
    name = "fineweb-edu" if args.repo == "HuggingFaceFW/fineweb-edu" else args.repo
    settings = {
        "tokenizer": args.tokenizer,
        "vocab": char_vocab(sources, args.text_field) if args.tokenizer == "char" else None,
        "dataset": args.dataset_name or ("local" if args.local else name),
        "repo": None if args.local else args.repo,
        "prefix": args.prefix,
        "shard_size": args.shard_size,
        "text_field": args.text_field,
        "sources": sources,
    }
    out_dir = Path(
        args.out_dir or (f"data/{Path(args.local[0]).stem}" if args.local else "edu_fineweb10B")
    )
    staging = out_dir / ".fineweb" / "staging"
    staging.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CorpusError(f"another fineweb.py run is writing {out_dir}") from None
        except OSError:
            print(f"warning: {out_dir} has no file locks; run one fineweb.py at a time")
        if (staging / MANIFEST).is_file():  # an --overwrite stopped while swapping
            swap_in(out_dir, staging)
        state["target"] = staging if args.overwrite else out_dir
        problem = check_corpus(state["target"], settings)
        if problem and not args.overwrite:
            raise CorpusError(f"{problem}; use --overwrite to rebuild, or another --out_dir")
        if problem:  # an earlier --overwrite's, with other settings
            shutil.rmtree(staging)
        done = (out_dir / MANIFEST).is_file() and not args.overwrite
        if not done:
            build(args, state["target"], settings, stop)
        if args.overwrite:
            swap_in(out_dir, staging)
    manifest = json.loads((out_dir / MANIFEST).read_text())
    print(
        f"{out_dir}: {'finished already, nothing to do' if done else 'done'} "
        f"({manifest['tokens']:,} tokens, {len(manifest['shards'])} shards)"
    )
    return manifest


# the command line; returns the manifest
def main(argv=None):
    args = parse_args(argv)
    state = {"target": None, "files": 0}
    # a stop signal ignored at start (as nohup's SIGHUP) stays ignored;
    # the old handlers come back after
    stop = StopSignals()
    old = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in [sig for sig in STOP_SIGNALS if old[sig] != signal.SIG_IGN]:
        signal.signal(sig, stop.handle)
    try:
        return run(args, state, stop)
    except KeyboardInterrupt as e:
        done = len(read_records(state["target"])) if state["target"] else 0
        sys.exit(
            f"fineweb.py: stopped ({e}); {done} of {state['files']} files done and kept; "
            "run the same command to continue"
        )
    except Exception as e:
        # an OSError names its file (write_atomic's, a full disk's)
        reason = e if isinstance(e, (CorpusError, OSError)) else f"{type(e).__name__}: {e}"
        sys.exit(f"fineweb.py: error: {str(reason).splitlines()[0]}")
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, old[sig])


if __name__ == "__main__":
    main()
