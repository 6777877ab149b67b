"""
What keeps a training run safe and recorded, so that train_gpt2.py can hold the idea alone. Its
loop calls this module in a few plain lines:

    run = harness.Run(cfg, log)            # rank 0 reads the code now, before anything slow
    with run:                              # log_dir resolved once and locked (rank 0)
        root, manifest = run.open_corpus(data_root)    # resolved once, held, its shards checked
        ckpt = run.resume()                # the checkpoint --resume names, read on every rank
        run.begin(step, device, model=..., data=...)   # the start record; stop signals only ask
        run.report(step, train=loss, ...)  # the console (rank 0), log.txt and wandb
        run.save(step, checkpoint)         # atomically, then --keep_last and curves.png
        run.stop_requested()               # Ctrl-C, SIGTERM, SIGUSR1 or SIGHUP since the last ask
        run.end(finished, step)            # the result record and a summary line

and main() is train_gpt2.py's command line: every field of its TrainConfig a flag (its comment
the --help), a bad flag or input one line, and the command that continues a stopped run. The
other programs share its devices (pick_device, out_of_memory) and checkpoint files
(read_checkpoint); plot.py reads what it writes. It knows nothing of the model beyond its
config being a dataclass and its weights a state dict: whether a checkpoint can continue under
the code (check_resumable) compares those, the optimizers' parameters and the run's batching.

A run writes into --log_dir: log.txt (`step kind value` lines), runs.jsonl (a line per start:
the config, the data, the versions, the device and the code that ran, kept in code/; a line per
end: the result; a module first imported in the loop: code_added), checkpoints
model_{step:05d}.pt and curves.png. One run holds a log_dir at a time, and writes only into an
empty one or the run it continues; a start that fails before its first step leaves nothing.

Importing this module loads torch: a program that imports it first (train_gpt2.py, sample.py,
hellaswag.py, export_hf.py, bench.py) ends Ctrl-C meanwhile in one line. Nothing else runs.
"""

import argparse
import ast
import contextlib
import dataclasses
import datetime
import hashlib
import inspect
import io
import json
import math
import os
import platform
import resource
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import tokenize
import zipfile
from pathlib import Path

# Ctrl-C while torch loads (seconds) ends the program in one line, as it does before the loop;
# so does torch failing to load (not installed, or out of memory under `ulimit -v`)
try:
    import torch
    import torch.distributed as dist

    import fineweb
    import plot
except KeyboardInterrupt:
    sys.exit(f"{Path(sys.argv[0]).name}: interrupted while loading torch; nothing was written")
except (ImportError, OSError, MemoryError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    sys.exit(
        f"{Path(sys.argv[0]).name}: error: torch does not load ({reason}): give the process more"
        " memory (ulimit -v), or install it (pip install -r requirements.txt)"
    )

# the checkout: the modules of a run's code that its record keeps
ROOT = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# Devices and memory


def pick_device(name):
    # the torch device --device names (auto: cuda, else mps, else cpu), or one ValueError line
    # saying this machine lacks it
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if name not in ("cpu", "mps", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise ValueError(f"--device {name}: not cpu, cuda, cuda:N or mps")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this torch sees no CUDA GPU")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: this torch sees no Apple GPU")
    return name


def device_name(device):
    # what a record calls the device: the GPU's model, or cpu / mps
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return device


# Dense bf16 peak FLOP/s of one GPU, from the vendors' datasheets: the denominator of MFU. The
# first name found in torch.cuda.get_device_name() wins.
PEAK_BF16_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("GH200", 989e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("RTX 6000 Ada", 364e12),
    ("RTX A6000", 155e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("MI300X", 1307e12),
]


def peak_flops(device):
    # one GPU's dense bf16 peak FLOP/s, or None: a CPU, a GPU not in the table or a MIG slice
    # (a share of its GPU) logs no MFU rather than a wrong one
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    if "MIG" in name:
        return None
    for model, flops in PEAK_BF16_FLOPS:
        if model in name:
            return flops
    return None


def peak_memory_gb(device):
    # this process's peak memory: the GPU's allocations on CUDA, else its largest resident size
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
    return rss * (1 if sys.platform == "darwin" else 1024) / 2**30


def out_of_memory(error):
    # whether a RuntimeError says a tensor did not fit: torch.OutOfMemoryError (a GPU's), the
    # CPU's and MPS's allocators ("can't allocate memory"), a size past int64 ("overflowed")
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "memory" in text or "overflow" in text


def check_fits(n_params, device):
    # A new model too big for this device, refused before it is built: built for real it would
    # fill memory until the kernel's OOM killer ends the run without a word. Training takes 16
    # bytes a parameter at least (float32 weights and gradients, and AdamW's two moments).
    if device.startswith("cuda"):
        where = "GPU"
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        where = "machine"
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 16 * n_params > memory:
        raise ValueError(
            f"a model of {n_params:,} parameters does not fit in memory: it takes"
            f" {16 * n_params / 2**30:,.0f} GB to train (16 bytes a parameter), this {where} has"
            f" {memory / 2**30:,.0f} GB: lower --n_layer or --n_embd"
        )


# -----------------------------------------------------------------------------
# Checkpoint files


def find_checkpoints(log_dir):
    # (step, path) of every model_{step}.pt in log_dir, by step
    paths = Path(log_dir).glob("model_*.pt")
    return sorted((int(p.stem[6:]), p) for p in paths if p.stem[6:].isdigit())


def is_whole(path):
    # torch.save writes a zip file: it is whole if every record matches its stored CRC-32, so a
    # torn, truncated or bit-flipped file fails (torch.load itself checks none of that). A file
    # that cannot be read at all (permissions, an I/O error) is not known to be damaged: its
    # OSError goes to the caller, which stops rather than write over what it could not read.
    # Nor is a path that is not a regular file, which is never opened: a FIFO would block for
    # good, a device read for ever.
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError("not a regular file")
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (zipfile.BadZipFile, EOFError):
        return False


def read_checkpoint(path):
    # a checkpoint of train_gpt2.py as a dict, checked whole before torch reads it (plain data
    # only), or one ValueError line
    try:
        whole = is_whole(path)
        ckpt = torch.load(path, map_location="cpu", weights_only=True) if whole else None
    except OSError as e:
        raise ValueError(f"cannot read checkpoint {path} ({e.strerror or e})") from None
    except Exception as e:
        raise ValueError(f"{path} is not a train_gpt2.py checkpoint ({e})") from None
    if not whole:
        raise ValueError(f"{path} is damaged, or not a checkpoint (fails its CRC-32 check)")
    keys = {"model", "model_config", "step"}
    if not isinstance(ckpt, dict) or not keys <= ckpt.keys() or not isinstance(ckpt["model"], dict):
        raise ValueError(f"{path} is not a train_gpt2.py checkpoint")
    # An older layout brought to this one's: its tokenizer at the top level (now the data's), no
    # count of its tokens (each of its steps took --total_batch_size).
    if "tokenizer" in ckpt:
        data = ckpt.get("data") if isinstance(ckpt.get("data"), dict) else {}
        ckpt["data"] = {"tokenizer": ckpt.pop("tokenizer"), **data}
    if "tokens" not in ckpt and isinstance(ckpt.get("train_config"), dict):
        ckpt["tokens"] = ckpt["step"] * ckpt["train_config"].get("total_batch_size", 0)
    return ckpt


def check_model_files(source):
    # A model named by a path that is not a checkpoint: what transformers would open there must be
    # plain files or directories (a FIFO or a device would hang it), or one ValueError line.
    path = Path(source)
    entries = [path, *path.iterdir()] if path.is_dir() else [path]
    for entry in entries:
        if entry.exists() and not entry.is_file() and not entry.is_dir():
            raise ValueError(
                f"{entry} is not a regular file (a FIFO or a device?): a model is a .pt"
                " checkpoint, or a Hugging Face directory of plain files"
            )


def save_checkpoint(path, checkpoint):
    # atomically, as fineweb.py writes its shards: under a temporary name, flushed to disk, then
    # renamed, so that a crash at any moment leaves the whole file or none. torch's zip writer
    # reports a failed write (most often a full disk) as a RuntimeError.
    try:
        fineweb.write_atomic(Path(path), lambda f: torch.save(checkpoint, f))
    except RuntimeError as e:
        raise OSError(f"cannot write {path} (is the disk full?): {e}") from None


def choose_checkpoint(resume, log_dir, log):
    # The checkpoint --resume names: auto, the highest step in log_dir whose file is whole (a
    # damaged one is skipped with a warning, and later written over); a path; or none ('').
    # A checkpoint that cannot be read stops the run: it may be whole, and a run that skipped
    # it would write over it.
    if resume != "auto":
        return Path(resume) if resume else None
    for _, path in reversed(find_checkpoints(log_dir)):
        try:
            whole = is_whole(path)
        except OSError as e:
            raise ValueError(
                f"cannot read checkpoint {path} ({e.strerror or e}): move it out of the log_dir"
                " (or make it readable), then run again (nothing was written)"
            ) from None
        if whole:
            return path
        log(f"warning: skipping {path}: damaged (fails its CRC-32 check)")
    return None


# -----------------------------------------------------------------------------
# Whether a checkpoint can continue under this code: the same model, parameters, optimizers,
# batches and data (train_gpt2.py's resume and load_model ask), and finite weights


def check_finite(model, source):
    # A model whose run diverged (a NaN or an inf among its weights) computes NaN: HellaSwag's
    # argmin would pick ending 0, a sample would be one token over and over, an export would
    # blame its architecture. Every loader (resume, load_model, from_pretrained) refuses it so.
    # Its parameters only: a buffer may hold -inf on purpose (a fork's attention mask).
    for name, w in model.named_parameters():
        if not torch.isfinite(w).all():
            raise ValueError(
                f"{source} holds non-finite weights (first: {name}): its run diverged before it"
                " was saved; use an earlier checkpoint"
            )


def weight_differing(model, state):
    # The name of the first weight the model and a state dict do not share in name and shape, or
    # None: a model edited since the checkpoint (RoPE, another MLP, ...) named in one line, not
    # in load_state_dict's list of every key.
    theirs = {name: tuple(w.shape) for name, w in state.items()}
    mine = {name: tuple(w.shape) for name, w in model.state_dict().items()}
    differ = sorted(theirs.keys() ^ mine.keys()) or [n for n in mine if mine[n] != theirs[n]]
    return differ[0] if differ else None


def parameter_differing(optimizers, saved):
    # What differs between the optimizers' parameters and the checkpoint's, or None. An edit can
    # keep the weights' names and shapes and still add, drop or move a parameter (an untied head:
    # lm_head.weight was the token table's other name); each parameter from there on would take
    # another's state. The groups' parameter names (torch keeps them) are compared; for a
    # checkpoint or an optimizer without them, each group's number of parameters.
    groups = [group for opt in optimizers for group in opt.param_groups]
    saved_groups = [group for opt in saved for group in opt["param_groups"]]
    if len(groups) != len(saved_groups):
        return f"{len(saved_groups)} optimizer groups, this run's {len(groups)}"
    for group, their_group in zip(groups, saved_groups):
        mine = group.get("param_names")
        theirs = their_group.get("param_names")
        if mine is None or theirs is None:
            mine = group["params"]
            theirs = their_group["params"]
            if len(mine) != len(theirs):
                return f"a group of {len(theirs)} parameters, this run's {len(mine)}"
            continue
        differ = sorted(set(mine) ^ set(theirs)) or [a for a, b in zip(mine, theirs) if a != b]
        if differ:
            return f"{differ[0]} differs"
    return None


def check_resumable(ckpt, model, optimizers, cfg, data):
    # Refuse, in one line, a resume whose model, batches or data would not be the checkpoint's;
    # every other flag of this run applies from the resumed step on. Any model whose config is a
    # dataclass: its fields that are also the run's (cfg's) are flags.
    fix = "(a new run from its weights: --init_from)"
    missing = {"train_config", "optimizers", "loader", "data", "spike_history"} - ckpt.keys()
    if missing:
        raise ValueError(f"resume: an older train_gpt2.py wrote it (no {min(missing)}) {fix}")
    saved = ckpt["train_config"]
    for name in ("batch_size", "seq_len", "total_batch_size", "shuffle", "seed", "optimizer"):
        if saved.get(name) != getattr(cfg, name):
            raise ValueError(f"resume: --{name} was {saved.get(name)} {fix}")
    # every field of the model's config, one the checkpoint predates at its default (--init_from
    # would bring the checkpoint's model, not this one: the way on is its flag, or a new run)
    ours = dataclasses.asdict(model.config)
    theirs = {f.name: f.default for f in dataclasses.fields(model.config)}
    theirs.update(ckpt["model_config"])
    flags = [f.name for f in dataclasses.fields(cfg)]
    for name, value in theirs.items():
        if name != "dropout" and ours.get(name) != value:
            way = f"resume with --{name} {value}, or " if name in flags else ""
            raise ValueError(
                f"resume: its model's {name} is {value}, this one's {ours.get(name)}: {way}train"
                " this model from scratch in a new --log_dir"
            )
    # the same config, other weights
    differ = weight_differing(model, ckpt["model"])
    if differ:
        raise ValueError(
            f"resume: its weights are not this model's ({differ} differs; was the model edited"
            " since?): a new run goes in a new --log_dir"
        )
    # the same weights, other parameters in the optimizers
    differ = parameter_differing(optimizers, ckpt["optimizers"])
    if differ:
        raise ValueError(
            f"resume: its optimizer state does not fit this model's parameters ({differ}; was the"
            " model edited since?): a new run from its weights: --init_from CHECKPOINT,"
            " in a new --log_dir"
        )
    # the same parameters, another optimizer (a fork's Lion would take AdamW's moments for its
    # momentum); a checkpoint before the class was recorded is not known
    for opt, saved in zip(optimizers, ckpt["optimizers"]):
        theirs = saved.get("kind")
        if theirs is not None and theirs != type(opt).__name__:
            raise ValueError(
                f"resume: its optimizer state is {theirs}'s, this run's optimizer is"
                f" {type(opt).__name__} {fix}"
            )
    if ckpt["data"] != data:
        raise ValueError(f"resume: its data (tokenizer, corpus) differs {fix}")
    # a shuffled run's place in its data counts rows since rows were drawn each on its own (an
    # older train_gpt2.py's counted windows of B x T: read as rows, the run would go on
    # elsewhere in the data)
    if cfg.shuffle and ckpt["loader"].get("order") != "rows":
        raise ValueError(
            f"resume: its shuffled data order is an older train_gpt2.py's (windows of B x T) {fix}"
        )
    if cfg.max_steps < ckpt["step"]:
        raise ValueError(f"resume: it is at step {ckpt['step']}, past --max_steps {fix}")


# -----------------------------------------------------------------------------
# The log_dir: one run at a time, and nothing another run made written over


def free_log_dir(log_dir):
    # the first of LOG_DIR-2, LOG_DIR-3, ... that does not exist: a directory to offer a new run
    n = 2
    while Path(f"{log_dir}-{n}").exists():
        n += 1
    return f"{log_dir}-{n}"


def lock_log_dir(log_dir, log):
    # One run per log_dir: an exclusive flock on log_dir/.lock (fineweb.take_lock), which names
    # its holder for the refusal. Returns the open lock file (None where the filesystem has no
    # locks) and what was made for it: log_dir and its missing parents (outermost first), and
    # the lock file, which a start that fails removes again.
    made = []
    try:
        for directory in reversed([log_dir, *log_dir.parents]):
            if not directory.is_dir():
                directory.mkdir()
                made.append(directory)
        if not os.path.lexists(log_dir / ".lock"):
            made.append(log_dir / ".lock")
        lock = fineweb.take_lock(log_dir / ".lock")
    except BlockingIOError:
        holder = (log_dir / ".lock").read_text().strip() or "another process"
        raise ValueError(
            f"{log_dir} is in use by another run ({holder}): pass another --log_dir"
            f" ({free_log_dir(log_dir)} is free)"
        ) from None
    except fineweb.NoLocks as e:
        log(f"warning: no file locks in {log_dir} ({e.strerror}): keep other runs out of it")
        return None, made
    except OSError as e:
        remove_made(made)
        raise ValueError(
            f"cannot use --log_dir {log_dir} ({e.strerror}: {e.filename}): pass a directory"
            " that can be made and written"
        ) from None
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    return lock, made


def remove_made(made):
    # what a start that failed made (files, and directories outermost first), removed in reverse
    # order: a directory only if empty (what else is in it was not this start's)
    for path in reversed(made):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()
        else:
            path.unlink(missing_ok=True)


def check_log_dir(log_dir, start_step, continues, resume):
    # A run writes only into an empty log_dir or into the run it continues (it resumed from one
    # of its checkpoints): never over what another run made. Refused in one line that names a
    # free directory. --resume auto with no whole checkpoint starts its log_dir's run again.
    checkpoints = find_checkpoints(log_dir)
    later = [path for step, path in checkpoints if step > start_step]
    free = free_log_dir(log_dir)
    if continues and later and resume != "auto":
        raise ValueError(
            f"{log_dir} holds checkpoints up to {later[-1].name}, past step {start_step} where"
            f" this run resumes: continue from the newest with --resume auto, or pass a new"
            f" --log_dir ({free} is free)"
        )
    made = [name for name in ("log.txt", "runs.jsonl") if (log_dir / name).exists()]
    for name in made:
        # the run appends to them: a FIFO or a device there would block it or take its records
        if not (log_dir / name).is_file():
            raise ValueError(f"{log_dir / name} is not a regular file: move it out of the log_dir")
    if not continues and resume != "auto" and (checkpoints or made):
        held = f"checkpoints up to {checkpoints[-1][1].name}" if checkpoints else made[0]
        raise ValueError(
            f"{log_dir} holds another run ({held}), which this one does not continue: pass a"
            f" new --log_dir ({free} is free), or continue that run with --resume auto"
        )


def open_lines(path):
    # path opened to append whole lines (write_lines): a last line torn by a kill is ended first,
    # so that the next record is not joined to it (check_log_dir has refused a special file)
    f = open(path, "ab", buffering=0)
    if f.tell() > 0:
        with open(path, "rb") as old:
            old.seek(-1, os.SEEK_END)
            if old.read(1) != b"\n":
                write_lines(f, "\n")
    return f


def write_lines(f, text):
    # text (whole lines) at the end of f, an open_lines file: all of it, or on a failed write (a
    # full disk) none of it, what was written cut off again; the error names the file
    end = os.lseek(f.fileno(), 0, os.SEEK_END)
    data = memoryview(text.encode())
    try:
        while data:
            data = data[f.write(data) :]
    except OSError as e:
        os.ftruncate(f.fileno(), end)
        raise OSError(f"cannot write {f.name}: {e.strerror or e}") from None


# -----------------------------------------------------------------------------
# The record: the code that ran, and each start and end in runs.jsonl


def read_code(known=()):
    # {name: source} of every module imported from this checkout and not in `known`, read now:
    # the code this run runs. A module is the checkout's if its file is inside it as imported or
    # with its links resolved (a link in the checkout to a file elsewhere, or one from elsewhere
    # into it); the packages of an environment inside it (a .venv) are not. Its name is its path
    # in the checkout: the real one, or else the link's.
    prefixes = {sys.prefix, sys.base_prefix}
    environments = {Path(p) for p in prefixes} | {Path(p).resolve() for p in prefixes}

    def inside(path):
        return path.is_relative_to(ROOT) and not any(path.is_relative_to(e) for e in environments)

    # torch alone brings over a thousand modules from a few hundred directories: each directory
    # is looked at once, and only the files of one inside the checkout
    directories = {}
    code = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        # (a module made in memory may name a relative file of its own)
        if not (file.endswith(".py") and os.path.isabs(file)):
            continue
        directory = os.path.dirname(file)
        if directory not in directories:
            as_imported = Path(os.path.normpath(directory))
            directories[directory] = inside(as_imported) or inside(as_imported.resolve())
        if not directories[directory]:
            continue
        real = Path(file).resolve()
        path = real if inside(real) else Path(os.path.normpath(file))
        if not inside(path):
            continue
        name = path.relative_to(ROOT).as_posix()
        if name not in known:
            code[name] = real.read_bytes()
    return dict(sorted(code.items()))


def git_state(modules):
    # {commit, diff, untracked} of the git checkout this file is in: `git diff HEAD` as plain
    # text (no colour, external diff driver or textconv, whatever the user's git config says)
    # and the modules git does not track; None outside a checkout or without git
    git = ["git", "-c", "core.quotepath=off"]
    diff = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "HEAD"]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], cwd=ROOT, capture_output=True)
        changes = subprocess.run([*git, *diff], cwd=ROOT, capture_output=True, timeout=60)
        tracked = subprocess.run([*git, "ls-files", "-z", *modules], cwd=ROOT, capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode or changes.returncode or tracked.returncode:
        return None
    tracked = set(tracked.stdout.decode().split("\0"))
    return {
        "commit": commit.stdout.decode().strip(),
        "diff": changes.stdout,
        "untracked": [name for name in modules if name not in tracked],
    }


def kept_name(name, data):
    # where a module's source (or the git diff) is kept in log_dir: code/{name}-{its hash}, so
    # equal names mean equal bytes (mylib/attn.py: code/mylib.attn-0123456789ab.py)
    stem, dot, suffix = name.rpartition(".")
    stem = stem.replace("/", ".") if dot else name
    suffix = f".{suffix}" if dot else ""
    return f"code/{stem}-{hashlib.sha256(data).hexdigest()[:12]}{suffix}"


def append_record(log_dir, record):
    # one line of runs.jsonl, appended whole or not at all
    with open_lines(log_dir / "runs.jsonl") as f:
        write_lines(f, json.dumps(record) + "\n")


def record_result(log_dir, status, steps, device):
    # The run's end, appended to runs.jsonl as {"result": {...}}: finished or stopped, its steps,
    # the last value of every kind of log.txt (as logged there: tokens, time, val, bpb, hella,
    # a fork's metric) but the bookkeeping, and its peak memory. Returned as a summary line.
    series = plot.read_log(log_dir / "log.txt")
    result = {
        "status": status,
        "steps": steps,
        "tokens": None,
        "time": None,
        "peak_memory_gb": round(peak_memory_gb(device), 3),
        "val": None,
        "bpb": None,
        "hella": None,
    }
    for kind, points in series.items():
        if kind not in plot.BOOKKEEPING - {"tokens", "time"}:
            result[kind] = int(points[-1][1]) if kind == "tokens" else points[-1][1]
    append_record(log_dir, {"result": result})
    shown = [
        f"{k} {v}" for k, v in result.items() if v is not None and k not in ("status", "steps")
    ]
    return f"{status} at step {steps}: " + " | ".join(shown)


# -----------------------------------------------------------------------------
# Stop signals

# SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (schedulers), SIGHUP (a closed terminal) ask a run to stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class StopSignal:
    # During the loop the stop signals only ask: the run ends at its step's end with a
    # checkpoint, also when asked twice. They are blocked in this thread too, so that processes
    # started meanwhile (torch.compile's compilers) inherit them blocked: Ctrl-C to the whole
    # process group stops the run, never a compiler halfway. SIGINT and SIGHUP stay ignored if
    # the program was started ignoring them (nohup, a shell's background job); SIGTERM and
    # SIGUSR1 are a scheduler's, and always ask.

    def __init__(self, log):
        self.log = log
        self.name = None  # the signal that asked
        self.told = False  # whether the console has been told

    def __enter__(self):
        self.previous = {}
        for sig in STOP_SIGNALS:
            kept_ignored = sig in (signal.SIGINT, signal.SIGHUP)
            if kept_ignored and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self.previous[sig] = signal.signal(sig, self.handle)
        signal.pthread_sigmask(signal.SIG_BLOCK, self.previous)
        return self

    def handle(self, signum, frame):
        self.name = self.name or signal.Signals(signum).name

    def requested(self):
        # a signal sent while blocked waits as pending: take it now
        for sig in signal.sigpending() & set(self.previous):
            signal.sigwait([sig])
            self.handle(sig, None)
        if self.name and not self.told:
            self.told = True
            self.log(f"{self.name}: the run stops at the end of this step, with a checkpoint")
        return self.name is not None

    def work_done(self):
        # The run's work is done (its last checkpoint and result written): from here on a stop
        # signal asks for nothing. One whose default would end the process (SIGTERM, SIGUSR1,
        # SIGHUP) is ignored once given back, until the process ends: a scheduler's SIGTERM at
        # the job's end, as the run's memory is freed, leaves exit status 0. (A handler of
        # Python's, SIGINT's KeyboardInterrupt, comes back as it was.)
        for sig, handler in self.previous.items():
            if handler == signal.SIG_DFL:
                self.previous[sig] = signal.SIG_IGN

    def __exit__(self, *exc):
        # a request still pending asks for nothing now (the run has ended): taken, not delivered
        # to the handler given back
        for sig in signal.sigpending() & set(self.previous):
            signal.sigwait([sig])
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.previous)


# -----------------------------------------------------------------------------
# Metrics


class Metrics:
    # Every metric goes through report(): a line on the console, `step kind value` lines in
    # log.txt (kept open, one whole write per report) and wandb. A training step's console line
    # also says how much time is left at the pace so far.

    def __init__(self, log_dir, max_steps, time_budget, wandb_run, log):
        # (log_dir None: another rank's, whose metrics go nowhere)
        self.file = open_lines(Path(log_dir) / "log.txt") if log_dir else None
        self.max_steps = max_steps
        self.time_budget = time_budget  # seconds of training (0: none)
        self.wandb_run = wandb_run
        self.log = log
        self.first = None  # (time, step, training seconds) of the first training step reported

    def report(self, step, **values):
        # an int as it is (a count of tokens), any other number to 6 significant digits
        text = {k: str(v) if isinstance(v, int) else f"{v:.6g}" for k, v in values.items()}
        line = f"step {step:5d}/{self.max_steps} | "
        line += " | ".join(f"{k} {v}" for k, v in text.items())
        if "train" in values:
            line += f" | {self.time_left(step, values.get('time', 0.0))}"
        self.log(line)
        if self.file is not None:
            write_lines(self.file, "".join(f"{step} {k} {v}\n" for k, v in text.items()))
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def time_left(self, step, train_seconds):
        # The remaining steps at the mean pace since the first one (evaluations included); in a
        # time-bounded run, at most the training time left, at the same pace.
        now = time.time()
        if self.first is None:
            self.first = (now, step, train_seconds)
        if step == self.first[1]:
            return "eta -"
        wall = now - self.first[0]
        seconds = wall / (step - self.first[1]) * (self.max_steps - step - 1)
        if self.time_budget:
            trained = train_seconds - self.first[2]
            seconds = min(seconds, wall / trained * max(self.time_budget - train_seconds, 0))
        return f"eta {seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"

    def close(self):
        if self.file is not None:
            self.file.close()


# -----------------------------------------------------------------------------
# The run


class Run:
    # One training run's harness, on every rank; rank 0 alone logs, holds log_dir and writes
    # there. Created at the program's start, it reads the code before anything slow (an edit
    # made meanwhile for the next experiment is not this run's); entered once the ranks have
    # met, it resolves log_dir (once: a link moved later changes nothing) and locks it; left, it
    # gives back what it took (the signals, the locks, the process group). A start that fails
    # before its first step or checkpoint (a full disk, a bad flag found late, out of memory in
    # the first step) leaves nothing it made: its rerun starts clean.

    def __init__(self, cfg, log):
        self.cfg = cfg
        self.master = os.environ.get("RANK", "0") == "0"
        self.log = log if self.master else lambda *args: None
        self.sources = read_code() if self.master else None  # {module: its source}
        self.git = git_state(list(self.sources)) if self.master else None
        self.log_dir = None
        self.lock = None
        self.corpus_lock = None
        self.made = []  # what this start made in log_dir, in order (a failed start removes it)
        self.grown = {}  # the files it appends to that were there: {path: their size}
        self.started = False  # a step or a checkpoint done: from here on all is the run's
        self.resumed_from = None  # the checkpoint's path
        self.ckpt = None  # its contents, until begin() has used them
        self.kept = None  # where each module's source is kept in log_dir (rank 0's)
        self.wandb_run = None
        self.wandb_id = None
        self.metrics = None
        self.stop = None
        self.device = "cpu"

    def __enter__(self):
        self.log_dir = fineweb.resolved(self.cfg.log_dir)
        corpus = fineweb.claimed_by(self.log_dir)
        if corpus and corpus.startswith("the corpus"):
            raise ValueError(
                f"--log_dir {self.log_dir} is in {corpus}: pass a directory of its own"
            )
        if self.master:
            self.lock, self.made = lock_log_dir(self.log_dir, self.log)
        return self

    def hold_corpus(self, data_root):
        # The corpus the run reads, resolved once (a --data_root link repointed later changes
        # nothing) and held with a shared lock for the run's length: fineweb.py changes no corpus
        # a run holds, and a run does not start on one that fineweb.py is changing. Every rank
        # holds it (each node may read a copy of its own).
        root = fineweb.resolved(data_root)
        if not root.is_dir():
            return root  # (load_corpus says what to do)
        lock = root / fineweb.READERS
        try:
            self.corpus_lock = fineweb.take_lock(lock, shared=True)
        except BlockingIOError:
            raise ValueError(
                f"fineweb.py is changing {root} (it holds {lock}): run again once it has finished"
            ) from None
        except OSError as e:
            # no locks on this filesystem, or a corpus this user cannot write (a shared dataset)
            self.log(
                f"warning: cannot lock {root} ({e.strerror}): keep fineweb.py from changing it"
                " while this run reads it"
            )
        return root

    def open_corpus(self, data_root):
        # (root, manifest) of the corpus the run reads: held (hold_corpus), its manifest checked,
        # and every shard checked against it before training reads it; the processes of a node
        # share the check (each node checks its own copy).
        root = self.hold_corpus(data_root)
        manifest = fineweb.load_corpus(root)
        if "note" in manifest:
            self.log(f"note: {manifest['note']}")
        vocab_size = fineweb.tokenizer_from_manifest(manifest).n_vocab
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        t0 = time.time()
        fineweb.verify_shards(root, manifest, vocab_size, local_rank, local_world)
        checked = f"{len(manifest['shards'])} shards of {root} checked against manifest.json"
        self.log(f"{checked} ({time.time() - t0:.1f} s)")
        return root, manifest

    def resume(self):
        # The checkpoint --resume names, read on every rank (rank 0 chooses), or None. One of
        # this log_dir's continues its run (its wandb run too); another's starts a branch.
        chosen = [None]
        if self.master:
            chosen = [choose_checkpoint(self.cfg.resume, self.log_dir, self.log)]
        if dist.is_initialized():
            dist.broadcast_object_list(chosen)
        self.resumed_from = chosen[0]
        if self.resumed_from is None:
            return None
        self.ckpt = read_checkpoint(self.resumed_from)
        return self.ckpt

    def continues(self):
        # whether the run goes on from a checkpoint of its own log_dir
        path = self.resumed_from
        return path is not None and path.resolve().parent == self.log_dir.resolve()

    def begin(self, step, device, **record):
        # The run starts at `step` (0, or its checkpoint's) on `device`; record: what the start
        # record keeps besides the config and the code (the model as built, the data). Rank 0
        # checks that log_dir holds nothing another run made, keeps a branch's start
        # checkpoint, opens wandb and writes the start record. From here on a stop signal only
        # asks (stop_requested).
        self.device = device
        if self.resumed_from is not None:
            self.log(f"resumed from {self.resumed_from} at step {step}")
            if self.cfg.init_from != "scratch":
                note = f"note: --init_from {self.cfg.init_from} not applied: the run goes on from"
                self.log(f"{note} {self.resumed_from}")
        if self.master:
            self.start_record(step, record)
        self.ckpt = None  # (its memory is the model's and optimizers' now)
        log_dir = self.log_dir if self.master else None
        time_budget = self.cfg.max_minutes * 60
        self.metrics = Metrics(log_dir, self.cfg.max_steps, time_budget, self.wandb_run, self.log)
        self.stop = StopSignal(self.log).__enter__()

    def start_record(self, step, record):
        check_log_dir(self.log_dir, step, self.continues(), self.cfg.resume)
        for name in ("runs.jsonl", "log.txt"):
            path = self.log_dir / name
            if path.exists():
                self.grown[path] = path.stat().st_size
            else:
                self.made.append(path)
        # the code as read at the start, and any module of this checkout imported since; a
        # module the checkpoint's run imported late (not imported yet here) as it is on disk now
        saved = {}
        if self.ckpt is not None:
            saved = self.ckpt.get("code") or {}
        self.sources.update(read_code(self.sources))
        for name in saved.keys() - self.sources.keys():
            if (ROOT / name).is_file():
                self.sources[name] = (ROOT / name).read_bytes()
        self.kept = {name: kept_name(name, source) for name, source in self.sources.items()}
        # A resume under other code than its checkpoint's (a logging fix mid-run) goes on, said
        # in one line and recorded with this start's step. (A checkpoint older than the code's
        # record: not known.)
        changed = []
        if saved:
            kept = self.kept
            changed = sorted(n for n in kept.keys() | saved.keys() if kept.get(n) != saved.get(n))
        if changed:
            self.log(
                f"note: the code differs from {self.resumed_from}'s ({', '.join(changed)}): the"
                f" run goes on under this code, and runs.jsonl records that it changed at step"
                f" {step}"
            )
        # A branch (a resume from another run's checkpoint) starts with a checkpoint of its own,
        # before anything else is written: stopped or killed at any moment, --resume auto
        # continues it.
        if self.ckpt is not None and not self.continues():
            config = dataclasses.asdict(self.cfg)
            self.ckpt.update(train_config=config, code=self.kept, wandb_id=None)
            path = self.log_dir / f"model_{step:05d}.pt"
            self.made.append(path)
            save_checkpoint(path, self.ckpt)
        if self.cfg.wandb_project:
            import wandb

            continued = self.ckpt.get("wandb_id") if self.continues() else None
            self.wandb_run = wandb.init(
                project=self.cfg.wandb_project,
                id=continued,
                resume="allow",
                config=dataclasses.asdict(self.cfg),
            )
            self.wandb_id = self.wandb_run.id
        start = {
            "step": step,
            "resumed_from": self.resumed_from and str(self.resumed_from),
            "config": dataclasses.asdict(self.cfg),
            **record,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "device": device_name(self.device),
        }
        if changed:
            start["code_changed"] = changed
        start["code"] = self.keep_code(self.sources)
        git = self.git
        if git is not None:
            diff = self.keep_file("git.diff", git["diff"]) if git["diff"] else None
            git = {"commit": git["commit"], "diff": diff, "untracked": git["untracked"]}
        start["git"] = git
        start["versions"] = {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        }
        start["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        append_record(self.log_dir, start)

    def keep_file(self, name, data):
        # data kept once in log_dir's code/ (kept_name), noted as made if this start wrote it
        kept = kept_name(name, data)
        path = self.log_dir / kept
        if not path.exists():
            if not path.parent.exists():
                self.made.append(path.parent)
            self.made.append(path)
            fineweb.write_atomic(path, lambda f: f.write(data))
        return kept

    def keep_code(self, sources):
        # {module: where its source is kept}: every module of the checkout the run imported
        return {name: self.keep_file(name, data) for name, data in sources.items()}

    def keep_late_code(self, step):
        # Modules of the checkout first imported since the start (inside the loop, say): kept,
        # part of the checkpoints' code from here on, and recorded in runs.jsonl as a change of
        # the run's code at this step (plot.py compares runs by it).
        added = read_code(self.sources)
        if not added:
            return
        self.sources.update(added)
        kept = self.keep_code(added)
        self.kept.update(kept)
        append_record(self.log_dir, {"step": step, "code_added": kept})
        self.log(
            f"note: {', '.join(added)} first imported since the start: kept, as of step {step}"
        )

    def report(self, step, **values):
        # every metric, through one call: the console (rank 0), log.txt and wandb
        self.metrics.report(step, **values)
        if "train" in values:
            self.started = True

    def stop_requested(self):
        # whether a stop signal has asked this process to stop
        return self.stop.requested()

    def save(self, step, checkpoint, last=False):
        # checkpoint (plain data and tensors) as log_dir/model_{step:05d}.pt with the run's code
        # and wandb id, atomically; then --keep_last's pruning and curves.png (drawn at most
        # once a minute, and at the last). Every rank waits for the file.
        if self.master:
            self.keep_late_code(step)
            checkpoint.update(code=self.kept, wandb_id=self.wandb_id)
            path = self.log_dir / f"model_{step:05d}.pt"
            save_checkpoint(path, checkpoint)
            self.started = True
            self.log(f"saved {path}")
            # --keep_last: only this log_dir's older checkpoints go
            keep_last = self.cfg.keep_last
            for s, old in find_checkpoints(self.log_dir)[: -keep_last or None]:
                if keep_last and s < step:
                    old.unlink()
        if dist.is_initialized():
            dist.barrier()  # nobody races ahead (or exits) before the file exists
        if self.master and self.cfg.curves:
            plot.refresh(self.log_dir, self.log, force=last)

    def end(self, finished, step):
        # the run's end, finished or stopped: a result record for scripts, and a summary line
        if not finished:
            asked = self.stop.name or "a stop request on another rank"
            self.log(f"{asked}: stopped at step {step}")
        if self.master:
            self.keep_late_code(step)
            status = "finished" if finished else "stopped"
            self.log(record_result(self.log_dir, status, step, self.device))
        if self.wandb_run is not None:
            self.wandb_run.finish()
        self.stop.work_done()

    def __exit__(self, kind, error, traceback):
        if self.metrics is not None:
            self.metrics.close()
        if self.lock is not None:
            self.lock.close()
        if self.corpus_lock is not None:
            self.corpus_lock.close()
        # a start that failed: what it wrote goes, what was there is as it was
        if self.master and kind is not None and not self.started:
            for path, size in self.grown.items():
                os.truncate(path, size)
            remove_made(self.made)
        if dist.is_initialized():
            dist.destroy_process_group()
        # the signals last: from here to the command line's end a stop asks for nothing more
        if self.stop is not None:
            self.stop.__exit__()


def make_preset_data(data_root, preset_data):
    # A preset's corpus of input.txt (preset_data: {data_root: fineweb.py's flags}) is made on its
    # first run, by fineweb.py's code with the README's flags (the same bytes); a process making
    # it meanwhile is waited for.
    if data_root not in preset_data or (Path(data_root) / fineweb.MANIFEST).exists():
        return
    input_txt = ROOT / "input.txt"
    flags = preset_data[data_root]
    fineweb.main(["--local", str(input_txt), *flags, "--out_dir", data_root], wait=True)


# -----------------------------------------------------------------------------
# The command line: each field of the config a flag, checked before anything runs


# At most this many micro-batches a step (on one process), tokens a printed sample, and layers
# (GPT-3 175B has 96): a typo past them would hang a run in one step, one sample, or in counting
# the model's parameters, a module at a time, before it is built.
MAX_MICRO_STEPS = 2**16
MAX_SAMPLE_LENGTH = 2048
MAX_LAYERS = 1024


def check_flags(cfg):
    # What holds for any TrainConfig, checked before anything runs and before its recipe's own
    # checks (train_gpt2.py's TrainConfig); the first bad flag is a ValueError line. Every number
    # finite, and >= 0 unless its default is not (a -1 meaning "off"); an integer within the
    # int64 that torch and numpy count in (a field a fork adds is checked so too); no empty path.
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if type(value) not in (int, float):
            continue
        if not math.isfinite(value) or value < 0 <= field.default:
            raise ValueError(f"--{field.name} must be a finite number >= 0, got {value}")
        if type(value) is int and abs(value) >= 2**63:
            raise ValueError(f"--{field.name} must be below 2**63 (an int64), got {value}")
    if not (cfg.data_root and cfg.log_dir and cfg.init_from):
        raise ValueError("--data_root, --log_dir and --init_from must not be empty")


def check_typos(cfg):
    # After the recipe's checks (sizes > 0): the bounds a typo cannot pass, a step of hours, a
    # sample a stop request waits for, a model whose parameters take minutes to count
    micro_batches = cfg.total_batch_size // (cfg.batch_size * cfg.seq_len)
    if micro_batches > MAX_MICRO_STEPS:
        raise ValueError(
            f"--total_batch_size {cfg.total_batch_size:,} is {micro_batches:,} micro-batches"
            f" of --batch_size x --seq_len a step: at most {MAX_MICRO_STEPS:,} (more is a"
            " typo: one step would take hours)"
        )
    if cfg.sample_length > MAX_SAMPLE_LENGTH:
        raise ValueError(
            f"--sample_length must be at most {MAX_SAMPLE_LENGTH:,} tokens: the samples are"
            " a glance at the model, and a stop request waits for them"
        )
    if cfg.n_layer > MAX_LAYERS:
        raise ValueError(
            f"--n_layer must be at most {MAX_LAYERS:,} (GPT-3 175B has 96): more is a typo,"
            " and counting its parameters would take minutes"
        )


def true_or_false(text):
    # a bool flag takes true or false (anything else: argparse's one-line error)
    return ["false", "true"].index(text.lower()) == 1


def field_helps(config_class):
    # {field: its --help}, the comments within each field's statement in the config's source
    # file, however the formatter lays it out: `x: float = (` with the value and its comment on
    # the next line, a comment after the opening parenthesis, or after the closing one
    with tokenize.open(inspect.getsourcefile(config_class)) as f:
        source = f.read()
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string[1:].strip()
    configs = [cls.__name__ for cls in config_class.__mro__]
    helps = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name not in configs:
            continue
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                lines = range(field.lineno, field.end_lineno + 1)
                helps[field.target.id] = " ".join(comments[n] for n in lines if n in comments)
    return helps


def program_of(config_class):
    # the program a config is the command line of: the file that defines it (train_gpt2.py, or
    # a researcher's copy)
    return Path(inspect.getsourcefile(config_class))


def parse_args(argv, config_class, presets):
    # --preset NAME replaces the config's defaults; then every field is a flag, typed by its
    # annotation and documented by its comment (if any), so explicit flags override the preset
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--preset", choices=sorted(presets))
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    defaults.update(presets.get(first.parse_known_args(argv)[0].preset, {}))
    helps = field_helps(config_class)
    gpus = torch.cuda.device_count()
    here = "no CUDA GPU: auto is cpu (or mps), float32, not compiled"
    here = f"{gpus} CUDA GPU(s): auto is cuda, bfloat16, compiled" if gpus else here
    parser = argparse.ArgumentParser(
        prog=program_of(config_class).name,
        usage=argparse.SUPPRESS,
        description="Train GPT-2 (README.md has the recipes).",
        epilog=f"On this machine: {here}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--preset", choices=sorted(presets), help="a recipe; flags override it")
    for field in dataclasses.fields(config_class):
        kind = field.type if isinstance(field.type, type) else type(field.default)
        kind = true_or_false if kind is bool else kind
        parser.add_argument(
            f"--{field.name}", type=kind, default=defaults[field.name], help=helps.get(field.name)
        )
    args = vars(parser.parse_args(argv))
    args.pop("preset")
    try:
        cfg = config_class(**args)
    except ValueError as e:
        parser.error(str(e))
    return cfg


def continue_command(argv, program):
    # the command that continues a stopped run, shell-quoted: its flags (less --resume), then
    # --resume auto; under torchrun, on one node (several: each with its own flags)
    launcher = (
        ["torchrun", "--standalone", f"--nproc_per_node={os.environ['LOCAL_WORLD_SIZE']}"]
        if "LOCAL_WORLD_SIZE" in os.environ
        else ["python"]
    )
    args = iter(argv)
    kept = []
    for arg in args:
        if arg == "--resume":
            next(args, None)  # and its value
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join(launcher + [os.path.relpath(program), *kept, "--resume", "auto"])


def main(train, config_class, presets, argv=None):
    # The command line of train(cfg, log): its flags parsed, its failures one line on stderr, its
    # stop told with the command that continues it.
    argv = sys.argv[1:] if argv is None else argv
    program = program_of(config_class)
    try:
        cfg = parse_args(argv, config_class, presets)
        result = train(cfg, log=fineweb.say)
    except RuntimeError as e:
        # a GPU's out of memory, or the CPU allocator's, at any step
        if not out_of_memory(e):
            raise
        sys.exit(
            f"{program.name}: error: out of memory: lower --batch_size (gradient accumulation"
            " keeps --total_batch_size), or the model's size"
        )
    except (ValueError, OSError) as e:
        sys.exit(f"{program.name}: error: {' '.join(str(e).split())}")
    except KeyboardInterrupt:
        sys.exit(f"{program.name}: interrupted outside the training loop; checkpoints as they were")
    # The run's work is done, its last checkpoint and record written: a stop signal from here on
    # (a scheduler's, at the job's end) changes nothing, and the exit status stays 0.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if result["stopped"] and os.environ.get("RANK", "0") == "0":
        fineweb.say(f"to continue: {continue_command(argv, program)}")
