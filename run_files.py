"""
The plumbing of a training run, which an experiment never edits: the corpus on disk (shard names, manifest
checks), checkpoint files and their lineages, the spike guard, atomic writes, the run header, the log_dir lock,
stop signals, strict command lines, devices, process-group start-up and the machine (CPU tuning, GPU peak FLOP/s).

train_gpt2.py imports this module and hands it plain data (state dicts, configs as dicts); this module never
imports train_gpt2, so the two cannot form a cycle. Importing it does nothing but define things.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import math
import os
import platform
import re
import secrets
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist


class NonFiniteError(RuntimeError):
    """The loss, the gradient norm or the weights became inf/NaN."""


def check_path(path: str | os.PathLike, what: str, is_dir: bool) -> Path:
    """path, if it is there and of the right kind; else one line naming it: missing, a symlink loop, no permission,
    a file where a directory belongs or the other way round."""
    try:
        if stat.S_ISDIR((p := Path(path)).stat().st_mode) != is_dir:
            raise ValueError(f"{what} {path} is a {'file' if is_dir else 'directory'}, not a {'directory' if is_dir else 'file'}")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None
    if not os.access(p, os.R_OK | (os.X_OK if is_dir else 0)):
        raise ValueError(f"{what} {path}: permission denied")
    return p


# ----------------------------------------------------------------------------------------------------------
# The corpus on disk: fineweb.py writes these names and this manifest, the trainer reads them

SHARD_NAME = re.compile(r"(?P<prefix>[^.].*)_(?P<split>val|train)_(?P<index>\d{6})\.npy")  # [^.]: not a temp file
FINEWEB_INCOMPLETE = ".fineweb_incomplete"  # made before fineweb.py's first shard, removed after manifest.json


def shard_name(prefix: str, index: int) -> str:
    """Shard 000000 is val, the rest train."""
    return f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.npy"


def find_shards(data_root: str | os.PathLike) -> tuple[dict[str, list[Path]], Optional[dict], Optional[str]]:
    """({"train": [...], "val": [...]}, manifest or None, a note for the log). fineweb.py writes manifest.json last:
    with one, exactly the shards it lists (sizes checked when opened); without one, shards of a single prefix that
    another tool wrote (build-nanogpt's edufineweb_*.npy), never a corpus fineweb.py did not finish."""
    try:
        root = check_path(data_root, "data directory", is_dir=True)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; create it with `python fineweb.py` (or `python fineweb.py --local input.txt "
                                f"--out_dir {data_root}` for the built-in corpus)") from None
    if (root / "manifest.json").exists():
        try:
            manifest = json.loads((root / "manifest.json").read_text())
            manifest["sizes"] = {root / x["file"]: x["tokens"] for x in manifest["shards"]}
            return {s: [root / x["file"] for x in manifest["shards"] if x["split"] == s] for s in ("train", "val")}, \
                manifest, None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{root}/manifest.json is not fineweb.py's manifest ({e}); re-run fineweb.py") from None
    if partial := sorted(p.name for p in root.iterdir() if p.name == FINEWEB_INCOMPLETE or p.name[0] == "."
                         and ".tmp" in p.name):  # fineweb.py's marker, or its temp files: it was killed mid-run
        raise ValueError(f"{root} has no manifest.json and holds an unfinished fineweb.py output ({partial[0]}); "
                         f"finish it by running the fineweb.py command that made it again (it continues where it stopped)")
    found = sorted((int(m["index"]), m["split"], m["prefix"], p) for p in root.iterdir() if (m := SHARD_NAME.fullmatch(p.name)))
    if len(prefixes := sorted({prefix for _, _, prefix, _ in found})) > 1:
        raise ValueError(f"{root} holds shards of {len(prefixes)} corpora (prefixes {', '.join(prefixes)}); "
                         "keep one corpus per directory")
    splits = {s: [p for _, split, _, p in found if split == s] for s in ("train", "val")}
    if missing := next((s for s in splits if not splits[s]), None):
        raise FileNotFoundError(f"no '{missing}' shards (*_{missing}_*.npy) in {root}; run fineweb.py to make them")
    return splits, None, (f"no manifest.json in {root}: using the {len(found)} shards found there ({prefixes[0]}_*: "
                          f"{len(splits['val'])} val, {len(splits['train'])} train), as another tool wrote them")


def open_shard(path: Path, tokens: Optional[int] = None) -> np.ndarray:
    """Memory-map one shard (pages are read on demand, never the whole shard); `tokens`: its size per the manifest."""
    try:
        shard = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing (manifest.json lists it); re-run fineweb.py") from None
    except Exception as e:
        raise ValueError(f"{path} is not a readable .npy shard ({type(e).__name__}: {e})") from None
    if shard.dtype != np.uint16 or shard.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D uint16 token array as fineweb.py writes, got {shard.dtype} {shard.shape}")
    if tokens is not None and len(shard) != tokens:
        raise ValueError(f"{path} holds {len(shard)} tokens, manifest.json says {tokens}; re-run fineweb.py")
    return shard


# ----------------------------------------------------------------------------------------------------------
# Checkpoint files and lineages

CHECKPOINT = re.compile(r"model_(\d+)(_[0-9a-f]{8})?\.pt")  # model_{step:05d}[_{lineage}].pt


def checkpoint_step(path: Path) -> int:
    return int(CHECKPOINT.fullmatch(path.name)[1])


def checkpoint_paths(log_dir: str | os.PathLike, suffix: Optional[str] = None) -> list[Path]:
    """Checkpoint files of log_dir (only one lineage's: suffix '' for plain names, '_{id}' for the others), by step."""
    found = [p for p in Path(log_dir).glob("model_*.pt") if (m := CHECKPOINT.fullmatch(p.name)) and suffix in (None, m[2] or "")]
    return sorted(found, key=checkpoint_step)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint of train_gpt2.py: plain tensors and dicts, loaded without running any code, memory-mapped."""
    path = check_path(path, "checkpoint", is_dir=False)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated file, not a torch file, or pickled objects weights_only refuses
        raise ValueError(f"{path} is not a readable checkpoint of this script ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint of this script (no 'model' / 'model_config' entries)")
    return ckpt


def check_training_checkpoint(path: Path, ckpt: dict) -> dict:
    if not {"optimizer", "train_loader", "rng", "step"} <= set(ckpt):
        raise ValueError(f"{path} holds weights but no optimizer or loader state to resume; start from its weights "
                         f"with --init_from {path}")
    return ckpt


def readable(path: Path) -> bool:
    try:
        return bool(load_checkpoint(path))
    except (OSError, ValueError):
        return False


def newest_usable_checkpoint(log_dir: Path, log) -> tuple[Optional[Path], Optional[dict]]:
    """The checkpoint written last in log_dir that can be resumed; the ones passed over are named in warnings."""
    for path in sorted(checkpoint_paths(log_dir) if log_dir.is_dir() else [], reverse=True,
                       key=lambda p: (p.stat().st_mtime_ns, checkpoint_step(p))):
        try:
            return path, check_training_checkpoint(path, load_checkpoint(path))
        except (OSError, ValueError) as e:
            log(f"warning: skipping unusable checkpoint: {e}")
    return None, None


def find_resume_checkpoint(resume: str, log_dir: Path, log) -> tuple[Optional[Path], Optional[dict]]:
    """--resume's checkpoint: '' none, 'auto' the usable one written last in log_dir (if any), else the file."""
    if resume == "auto":
        path, ckpt = newest_usable_checkpoint(log_dir, log)
        if ckpt is None:
            log(f"no checkpoint in {log_dir}: starting fresh")
        return path, ckpt
    return (Path(resume), check_training_checkpoint(Path(resume), load_checkpoint(resume))) if resume else (None, None)


def check_resumable(path: Path, ckpt: dict, model_config: dict, max_steps: int, optimizers: int):
    """A resume is refused in one line when the checkpoint cannot continue this run: another model shape, a step past
    --max_steps, another optimizer."""
    if ckpt["model_config"] != model_config:
        raise ValueError(f"{path} holds a model of shape {ckpt['model_config']}, this run builds {model_config}")
    if ckpt["step"] > max_steps:
        raise ValueError(f"--max_steps {max_steps} is below the step of {path} ({ckpt['step']}): raise --max_steps, "
                         "or resume an earlier checkpoint with --resume PATH")
    if (ckpt.get("muon") is None) != (optimizers == 1):
        raise ValueError(f"{path} was trained with another --optimizer; resume it with the same one")


def choose_lineage(log_dir: Path, path: Optional[Path], ckpt: Optional[dict], ddp: bool, log) -> dict:
    """This run's lineage {id, parent, suffix}. Resuming the newest readable checkpoint of a lineage continues it
    (its id and file names); a fresh run, or a resume from an older checkpoint (a branch), starts a new one. A
    log_dir's first lineage writes model_{step:05d}.pt, any other model_{step:05d}_{id}.pt, so that no run writes
    over or prunes a checkpoint of another lineage."""
    ids = [secrets.token_hex(4)]
    if ddp:
        dist.broadcast_object_list(ids, src=0)  # rank 0's, on every rank
    lineage = {"id": ids[0], "parent": None}
    if ckpt is not None:
        suffix = (m[2] or "") if (m := CHECKPOINT.fullmatch(path.name)) else None  # None: not named as we name them
        if suffix is None or any(checkpoint_step(p) > ckpt["step"] and readable(p) for p in checkpoint_paths(path.parent, suffix)):
            lineage["parent"] = {"file": str(path), "step": ckpt["step"]}  # a branch: a new lineage
        else:  # continue its lineage, with its file names if it lives here
            lineage = ckpt.get("lineage") or {"id": suffix[1:] or ids[0], "parent": None}
            if path.parent.resolve() == log_dir.resolve():
                log_lineage(log_dir, path, ckpt, lineage := {**lineage, "suffix": suffix}, log)
                return lineage
    taken = log_dir.is_dir() and checkpoint_paths(log_dir, "")  # another lineage holds the plain names
    lineage["suffix"] = f"_{lineage['id']}" if taken else ""
    log_lineage(log_dir, path, ckpt, lineage, log)
    return lineage


def log_lineage(log_dir: Path, path: Optional[Path], ckpt: Optional[dict], lineage: dict, log):
    branch = f"; a new lineage {lineage['id']} branches from it" if ckpt and lineage["parent"] else ""
    log(f"resumed from {path} at step {ckpt['step']}{branch}" if ckpt else f"lineage {lineage['id']} starts")
    if lineage["suffix"]:
        log(f"note: {log_dir} holds other runs' checkpoints: this run writes model_NNNNN{lineage['suffix']}.pt")


def save_checkpoint(log_dir: Path, step: int, lineage: dict, state: dict, keep_last: int) -> Path:
    """model_{step:05d}[_{lineage}].pt in log_dir, written atomically, with the lineage recorded; then this lineage's
    oldest beyond keep_last (0: keep all) are pruned. Non-finite weights are refused."""
    path = log_dir / f"model_{step:05d}{lineage['suffix']}.pt"
    if not all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point()):
        raise NonFiniteError(f"refusing to checkpoint non-finite weights at step {step}")
    state = {**state, "lineage": {k: v for k, v in lineage.items() if k != "suffix"}}
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except (OSError, RuntimeError) as e:  # a full disk, most often (torch wraps the OSError in a RuntimeError)
        raise OSError(f"could not write {path} ({write_error(e)}); earlier checkpoints are intact: free some space, then "
                      "rerun with --resume auto") from None
    if keep_last:  # the oldest checkpoints of this lineage only
        for old in checkpoint_paths(log_dir, lineage["suffix"])[:-keep_last]:
            old.unlink(missing_ok=True)
    return path


def capture_rng_state() -> dict:
    """The RNGs a run draws from (torch's, CPU and CUDA: dropout), as tensors (weights_only-loadable)."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------------------
# Updates that would derail a run

class SpikeGuard:
    """Skips an update whose loss or grad norm lies more than z standard deviations above the mean of the last
    `window` accepted ones (after `warmup` of them), llm.c's rule (z = 0: off): one bad batch does not derail a
    run. Its history goes into checkpoints, so a resumed run decides alike."""

    def __init__(self, z: float, window: int = 128, warmup: int = 16):
        self.z, self.window, self.warmup, self.history, self.skipped = z, window, warmup, [], 0  # history: (loss, norm)

    def spike(self, loss: float, norm: float) -> Optional[float]:
        """The larger z-score of (loss, norm) if it is over the threshold (skip the update), else None (the pair
        joins the history)."""
        past = np.array(self.history)  # (n, 2)
        if self.z > 0 and len(past) >= self.warmup:
            score = float(((np.array([loss, norm]) - past.mean(0)) / (past.std(0) + 1e-8)).max())
            if score > self.z:
                self.skipped += 1
                return score
        self.history = (self.history + [(loss, norm)])[-self.window :]
        return None

    def state_dict(self) -> dict:
        return {"history": self.history, "skipped": self.skipped}

    def load_state_dict(self, state: dict):
        self.history, self.skipped = state["history"], state["skipped"]


def check_nonfinite(skip: bool, log_dir: str, suffix: str, step: int, loss: float, norm: float, log):
    """A non-finite loss or grad norm stops the run, naming the last good checkpoint (skip: the update is skipped)."""
    if not skip:
        good = checkpoint_paths(log_dir, suffix)
        raise NonFiniteError(f"non-finite loss {loss} / grad norm {norm} at step {step}; last good checkpoint: "
                             f"{good[-1] if good else 'none'} (lower --max_lr, or pass --skip_nonfinite true)")
    log(f"step {step:5d} | non-finite loss {loss} / grad norm {norm}: update skipped")


# ----------------------------------------------------------------------------------------------------------
# Files written whole: atomic writes, the run header

def write_error(e: BaseException) -> str:
    """Why a write failed, in a few words: the OSError's own text (also inside the error that torch.save or
    safetensors raise around it), else the last line of the message."""
    cause = e if isinstance(e, OSError) else e.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return (str(e).strip().splitlines() or [type(e).__name__])[-1]


def atomic_write(path: Path, write):
    """write(f) into a temp file beside `path`, fsync, then rename: a crash never leaves a truncated file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_header(log_dir: Path, info: dict):
    """Append this run's settings (info), the time, the command line and the versions to log_dir/header.txt: one
    JSON block per start or resume."""
    gpu = torch.cuda.get_device_name() if str(info.get("device", "")).startswith("cuda") else None
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, **info, "python": platform.python_version(),
            "torch": torch.__version__, "gpu": gpu}
    with open(log_dir / "header.txt", "a") as f:
        f.write(json.dumps(info, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Metrics: stdout, log.txt, wandb

# How each metric reads on stdout; log.txt and wandb get every value as measured. A kind missing here needs no
# entry: it prints as `kind value`.
SHOW = {"train": "loss {:.6f}", "val": "val loss {:.4f}", "hella": "HellaSwag acc_norm {:.4f}", "lr": "lr {:.4e}",
        "norm": "norm {:.4f}", "ms": "{:7.1f} ms", "tok_per_s": "{:9.0f} tok/s", "mfu": "MFU {:6.2%}"}


class Metrics:
    """The one sink of measured values. report(step, kind=value, ...) is called once, where they are measured:
    it prints them as one line, appends a `step kind value` line each to log_dir/log.txt (what plot.py and
    play.ipynb read) and sends them to wandb when it is on. Only rank 0 writes; every rank keeps `latest`."""

    def __init__(self, log_dir: str | os.PathLike, enabled: bool, echo, wandb_project: str = "", config: Optional[dict] = None):
        self.path, self.enabled, self.echo = Path(log_dir) / "log.txt", enabled, echo
        self.wandb_run = start_wandb(wandb_project, config or {}) if enabled and wandb_project else None
        self.latest: dict[str, float] = {}  # the newest value of each kind: train() returns them

    def report(self, step: int, **values: float):
        self.latest.update(values)
        if self.enabled:
            self.echo(f"step {step:5d} | " + " | ".join(SHOW.get(k, k + " {:.6g}").format(v) for k, v in values.items()))
            with open(self.path, "a") as f:  # appended: a resumed run continues the same file
                f.writelines(f"{step} {kind} {value:.8g}\n" for kind, value in values.items())
            if self.wandb_run is not None:
                self.wandb_run.log(values, step=step)

    def finish(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()


def start_wandb(project: str, config: dict):
    """A Weights & Biases run in `project`, its config recorded."""
    import wandb  # optional dependency, imported only when asked for

    return wandb.init(project=project, config=config, resume="allow")


# ----------------------------------------------------------------------------------------------------------
# One run per log_dir, and stopping cleanly

class LogDirLock:
    """Rank 0's exclusive lock on --log_dir: flock on the directory itself, so no file is made and the lock dies
    with its process (a killed run never blocks --resume auto). Released when the run ends."""

    def __init__(self, log_dir: str, master: bool):
        self.path, self.master, self.fd = Path(log_dir), master, None

    def claim(self, create: bool):
        """Lock log_dir if it exists (create: make it first). If rank 0 cannot, torchrun stops the other ranks."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--log_dir {self.path} exists and is not a directory")
        if self.master and self.fd is None and (create or self.path.is_dir()):
            self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.release()
                raise ValueError(f"--log_dir {self.path} is in use by another run ({lock_holder(self.path)}); wait for "
                                 "it, or choose another --log_dir") from None
            for stale in self.path.glob(".model_*.pt.tmp*"):  # left by a run killed while saving
                stale.unlink(missing_ok=True)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_holder(path: Path) -> str:
    """'pid N: its command line' of the process holding a flock on path, read from Linux's /proc/locks."""
    st = path.stat()
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        pid = next(line.split()[4] for line in Path("/proc/locks").read_text().splitlines() if key in line.split())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(bytes(1), b" ").decode().strip()
        return f"pid {pid}: {command if len(command) < 100 else command[:97] + '...'}"
    except (OSError, StopIteration):
        return "another process"


class StopSignal:
    """Set by SIGTERM/SIGINT; the loop checks it after each step, saves a checkpoint and exits cleanly."""

    def __enter__(self):
        self.requested, self.previous = False, {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------------------------------------
# Command lines: strict, and one line when wrong

class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage of ~50 flags would bury it) and no abbreviations (a prefix of
    one flag would silently set another)."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see -h)\n")


def str2bool(text: str) -> bool:
    if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")


def finite_float(text: str) -> float:
    if not math.isfinite(value := float(text)):  # "nan" and "inf" parse as floats; no setting here means them
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# ----------------------------------------------------------------------------------------------------------
# Processes and the machine

def check_device(device: str) -> str:
    """--device as torch wants it: auto resolved (cuda > mps > cpu), a clear error for a device this machine lacks."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ValueError(f"--device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    if (device.startswith("cuda") and not torch.cuda.is_available()) or (device == "mps" and not mps):
        raise ValueError(f"--device {device}: {'CUDA' if device != 'mps' else 'MPS'} is not available on this machine "
                         "(use --device cpu)")
    return device


def init_process_group(backend: str, rank: int, world: int):
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt not in (None, "0") and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After a torchrun restart the agent's shared store still holds the dead attempt's addresses (gloo then
        # connects to them, pytorch/pytorch#135712): rendezvous under a key prefix of this attempt instead.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
        dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{attempt}/", store), rank=rank, world_size=world)
    else:
        dist.init_process_group(backend)


def any_rank(flag: bool, world_size: int, device) -> bool:
    """True on every rank if it is True on any: ranks that decide alike stop, skip or fail at the same step instead
    of leaving the others waiting forever in the next collective."""
    if world_size == 1:
        return flag
    t = torch.tensor([flag], dtype=torch.long, device=device)
    dist.all_reduce(t)
    return bool(t.item())


def keep_freed_memory():
    """On glibc, stop handing big freed blocks back to the OS: otherwise every CPU step maps its large buffers (the
    logits, the gradients) afresh and page-faults them in again, a large part of a small model's step."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: big blocks come from the heap, and stay there for the next step
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never shrink the heap
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        pass


def default_dtype(device_type: str) -> str:
    """--dtype auto: bf16 autocast on CUDA and on CPUs that compute in bf16 natively (AVX512-BF16, AMX; Linux's
    /proc/cpuinfo says), float32 elsewhere: emulated bf16 is many times slower than fp32."""
    if device_type == "cuda":
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text().split() if device_type == "cpu" else []
    except OSError:
        flags = []
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


# Dense bf16 tensor-core peak per GPU, from the vendors' datasheets (SXM parts).
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "H800": 989e12, "A10G": 125e12,
                   "L4": 121e12, "L40S": 362e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "B200": 2250e12}


def peak_flops(device_type: str, override: float = 0.0) -> Optional[float]:
    """Peak bf16 FLOP/s of this device: the override, else a lookup by GPU name, else None (MFU not shown)."""
    if override > 0 or device_type != "cuda":
        return override or None
    matches = [key for key in PEAK_BF16_FLOPS if key in torch.cuda.get_device_name()]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None  # the longest: "L40S" before "L4"
