"""
The plumbing of a training run, which an experiment never edits: the corpus on disk (shard names, manifest checks,
fingerprints), checkpoint files and their lineages (what a resume may change), the chunked loss (the same loss as
F.cross_entropy, computed with less memory), the spike guard, atomic writes, the run header and the metrics sink
(stdout, log.txt, wandb), the log_dir lock, stop signals, strict command lines, devices, process-group start-up
and the machine (CPU tuning, GPU peak FLOP/s).

train_gpt2.py imports this module and hands it plain data (state dicts, configs as dicts); this module never
imports train_gpt2, so the two cannot form a cycle. Importing it does nothing but define things.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import hashlib
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
import torch.nn.functional as F


class NonFiniteError(RuntimeError):
    """The loss, the gradient norm or the weights became inf/NaN."""


def check_path(path: str | os.PathLike, what: str, is_dir: bool) -> Path:
    """path, if it is there and of the right kind; else one line naming it: an empty path, missing, a symlink loop, no
    permission, a file where a directory belongs or the other way round, or not a regular file (a FIFO, which a read
    would wait on forever, a device, a socket)."""
    if not str(path):
        raise ValueError(f"{what} is an empty path")
    try:
        mode = (p := Path(path)).stat().st_mode
        if stat.S_ISDIR(mode) != is_dir:
            raise ValueError(f"{what} {path} is a {'file' if is_dir else 'directory'}, not a {'directory' if is_dir else 'file'}")
        if not is_dir and not stat.S_ISREG(mode):
            raise ValueError(f"{what} {path} is not a regular file (a FIFO, device or socket)")
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


def find_shards(data_root: str | os.PathLike, tokenizer: str = "auto") -> tuple[dict[str, list[Path]], Optional[dict], Optional[str]]:
    """({"train": [...], "val": [...]}, manifest or None, a note for the log). fineweb.py writes manifest.json last:
    with one, exactly the shards it lists (sizes checked when opened); without one, shards of a single prefix that
    another tool wrote (build-nanogpt's edufineweb_*.npy), never a corpus fineweb.py did not finish. A missing
    directory is told the fineweb.py command that makes it, in `tokenizer`'s tokens (char: the built-in corpus)."""
    try:
        root = check_path(data_root, "data directory", is_dir=True)
    except FileNotFoundError as e:
        local = f"python fineweb.py --local input.txt --out_dir {data_root}"
        raise FileNotFoundError(f"{e}; create it with `{local} --tokenizer char`" if tokenizer == "char" else
                                f"{e}; create it with `python fineweb.py` (or `{local}` for the built-in corpus)") from None
    if (root / "manifest.json").exists():
        try:
            manifest = json.loads(check_path(root / "manifest.json", "manifest", is_dir=False).read_text())
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
        shard = np.load(check_path(path, "shard", is_dir=False), mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing (manifest.json lists it); re-run fineweb.py") from None
    except ValueError as e:
        if str(e).startswith("shard "):  # check_path's: a directory, a FIFO
            raise
        raise ValueError(f"{path} is not a readable .npy shard (ValueError: {e})") from None
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
    """The checkpoint written last in log_dir that can be resumed; the ones passed over (unreadable, a dangling
    symbolic link) are named in warnings."""
    found = []
    for path in checkpoint_paths(log_dir) if log_dir.is_dir() else []:
        try:
            found.append((path.stat().st_mtime_ns, checkpoint_step(path), path))
        except OSError as e:  # a dangling symbolic link, say
            log(f"warning: skipping unusable checkpoint: {path}: {e.strerror}")
    for *_, path in sorted(found, reverse=True):
        try:
            return path, check_training_checkpoint(path, load_checkpoint(path))
        except (OSError, ValueError) as e:
            log(f"warning: skipping unusable checkpoint: {e}")
    return None, None


def find_resume_checkpoint(resume: str, log_dir: Path, rank: int, world_size: int, log) -> tuple[Optional[Path], Optional[dict]]:
    """--resume's checkpoint: '' none, 'auto' the usable one written last in log_dir (if any), else the file. Rank 0
    chooses and every rank loads that file: log_dirs on node-local disks never let ranks resume different states;
    if any rank cannot read it, every rank stops, naming that rank."""
    path, ckpt = None, None
    if rank == 0 and resume == "auto":
        path, ckpt = newest_usable_checkpoint(log_dir, log)
        if ckpt is None:
            log(f"no checkpoint in {log_dir}: starting fresh")
    elif rank == 0 and resume:
        path = Path(resume)
    if world_size > 1:
        box = [None if path is None else str(path)]
        dist.broadcast_object_list(box, src=0)  # rank 0's choice, on every rank
        path = None if box[0] is None else Path(box[0])
    error = None
    if path is not None and ckpt is None:
        try:
            ckpt = check_training_checkpoint(path, load_checkpoint(path))
        except (OSError, ValueError) as e:
            error = e
    if world_size > 1:
        errors = [None] * world_size
        dist.all_gather_object(errors, None if error is None else str(error))
        if (bad := next((r for r, e in enumerate(errors) if e), None)) is not None:
            raise ValueError(f"rank {bad} cannot resume from {path} (rank 0's choice): {errors[bad]}; every rank "
                             "needs that file: use a --log_dir all nodes share, or copy it to the same path on each")
    elif error is not None:
        raise error
    return path, ckpt


# Flags a resumed run may not change: the model (checked by its shape), the optimizer, and the batches' geometry and
# order (the loader's position counts windows of B x T + 1 tokens, in an order the seed draws). Every other flag
# may change, and does: the schedule, its values and the intervals are read at every step, and the optimizers'
# hyper-parameters (weight decay, betas, Muon's LR) are set anew from the flags after their state is loaded.
FIXED_ON_RESUME = ("optimizer", "batch_size", "seq_len", "shuffle", "seed")


def check_resumable(path: Path, ckpt: dict, model_config: dict, cfg: dict, data: dict):
    """A resume is refused in one line when the checkpoint cannot continue this run: another model (dropout aside,
    which the run sets), a step past --max_steps, a flag of FIXED_ON_RESUME changed, or other data: another
    tokenizer or vocabulary, or a corpus of another fingerprint (ckpt['model_config'] filled in with today's fields)."""
    if {**ckpt["model_config"], "dropout": 0} != {**model_config, "dropout": 0}:
        raise ValueError(f"{path} holds a model of shape {ckpt['model_config']}, this run builds {model_config}")
    if ckpt["step"] > cfg["max_steps"]:
        raise ValueError(f"--max_steps {cfg['max_steps']} is below the step of {path} ({ckpt['step']}): raise "
                         "--max_steps, or resume an earlier checkpoint with --resume PATH")
    saved = ckpt.get("train_config", {})
    if changed := next((k for k in FIXED_ON_RESUME if k in saved and saved[k] != cfg[k]), None):
        raise ValueError(f"{path} was trained with --{changed} {saved[changed]}, this run asks {cfg[changed]}: resume "
                         f"with --{changed} {saved[changed]}, or start from its weights with --init_from {path}")
    start_over = f"resume it on its own data, or start from its weights on purpose with --init_from {path}"
    tokenizer = {"tokenizer": "gpt2", "vocab": None, **ckpt.get("tokenizer", {})}  # older checkpoints: GPT-2's
    if tokenizer != data["tokenizer"]:
        what = "another vocabulary" if tokenizer["tokenizer"] == data["tokenizer"]["tokenizer"] else "another tokenizer"
        raise ValueError(f"{path} was trained with {tokenizer['tokenizer']} tokens; the data in {cfg['data_root']} has "
                         f"{what} ({data['tokenizer']['tokenizer']}), so its ids mean other text: {start_over}")
    saved_fingerprint = ckpt.get("data", {}).get("fingerprint")
    if saved_fingerprint and saved_fingerprint != data["fingerprint"]:
        raise ValueError(f"{path} was trained on other data than {cfg['data_root']} holds (corpus fingerprint "
                         f"{saved_fingerprint[:12]} there, {data['fingerprint'][:12]} here): {start_over}")


def resume_changes(saved: dict, cfg: dict) -> list[str]:
    """The flags a resumed run sets otherwise than its checkpoint's run did, as '--name old -> new' (all applied)."""
    quiet = ("resume", "log_dir", "data_root", "device", "init_from")  # where things are, not what is computed
    return [f"--{k} {saved[k]} -> {v}" for k, v in cfg.items() if k in saved and saved[k] != v and k not in quiet]


def corpus_fingerprint(manifest: Optional[dict], paths: list[Path]) -> str:
    """fineweb.py's fingerprint of a corpus, computed once as it wrote the shards (a hash of their bytes); for
    shards without one (another tool's, or an older manifest), a hash of their names and sizes."""
    if manifest and manifest.get("fingerprint"):
        return manifest["fingerprint"]
    listing = "\n".join(f"{p.name} {p.stat().st_size}" for p in sorted(paths))
    return "names-and-sizes:" + hashlib.sha256(listing.encode()).hexdigest()


def choose_lineage(log_dir: Path, path: Optional[Path], ckpt: Optional[dict], rank: int, world_size: int, log) -> dict:
    """This run's lineage {id, parent, suffix, wandb_id}, chosen by rank 0 from its log_dir and sent to every rank.
    Resuming the newest readable checkpoint of a lineage continues it (its id, file names and wandb run); a fresh run,
    or a resume from an older checkpoint (a branch), starts a new one. A log_dir's first lineage writes
    model_{step:05d}.pt, any other model_{step:05d}_{id}.pt, so that no run writes over or prunes a checkpoint of
    another lineage."""
    box = [None]
    if rank == 0:
        new_id = secrets.token_hex(4)
        lineage, suffix = {"id": new_id, "parent": None, "wandb_id": new_id}, None
        if ckpt is not None:
            suffix = (m[2] or "") if (m := CHECKPOINT.fullmatch(path.name)) else None  # None: not named as we name them
            if suffix is None or any(checkpoint_step(p) > ckpt["step"] and readable(p)
                                     for p in checkpoint_paths(path.parent, suffix)):
                lineage["parent"], suffix = {"file": str(path), "step": ckpt["step"]}, None  # a branch: a new lineage
            else:  # continue its lineage, with its file names if it lives here
                lineage = {"wandb_id": new_id, **(ckpt.get("lineage") or {"id": suffix[1:] or new_id, "parent": None})}
                suffix = suffix if path.parent.resolve() == log_dir.resolve() else None
        if suffix is None:
            taken = log_dir.is_dir() and checkpoint_paths(log_dir, "")  # another lineage holds the plain names
            suffix = f"_{lineage['id']}" if taken else ""
        box = [{**lineage, "suffix": suffix}]
        log_lineage(log_dir, path, ckpt, box[0], log)
    if world_size > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


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


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict):
    """A checkpoint's optimizer state (moments, step counts) under this run's hyper-parameters: load_state_dict alone
    would bring back the old run's weight decay, betas and LR scale too, while header.txt records the new ones."""
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
    opt.load_state_dict(state)
    for group, values in zip(opt.param_groups, hyper):
        group.update(values)


def capture_rng_state() -> dict:
    """The RNGs a run draws from (torch's, CPU and CUDA: dropout), as tensors (weights_only-loadable)."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------------------
# The chunked loss: what an experiment on the loss edits is GPT.forward's F.cross_entropy; this computes the same

class ChunkedCrossEntropy(torch.autograd.Function):
    """GPT.forward's loss with --chunked_loss: the same mean cross-entropy of the logits h @ weight.T over targets != -100,
    computed a chunk of rows at a time, so that no (N, V) tensor of logits or of their gradient ever exists. With
    `grad`, forward also makes the gradients from each chunk's softmax (backward would have to recompute the logits)
    and backward only scales them. Exact. It pays where the logits dominate: memory at large B*T, and speed on a CPU
    with GPT-2's 50k vocabulary. torch.compile unrolls the loop over chunks and its compile time grows with their
    number, so their count is bounded (max_chunks) rather than their size (at least min_rows rows each)."""

    @staticmethod
    def forward(ctx, h, weight, targets, grad: bool, max_chunks: int = 8, min_rows: int = 1024):  # h (N, C), weight (V, C)
        loss, n, chunk = 0.0, (targets != -100).sum(), max(min_rows, -(-h.size(0) // max_chunks))  # chunk: rows per chunk
        grad_h, grad_w = (torch.empty_like(h), torch.zeros_like(weight)) if grad else (None, None)
        for i in range(0, h.size(0), chunk):
            hc, tc = h[i : i + chunk], targets[i : i + chunk, None]  # (c, C), (c, 1)
            valid, tc = tc != -100, tc.clamp(min=0)  # ignored rows point at id 0, with weight 0
            z = F.linear(hc, weight)  # (c, V) logits, bf16 under autocast: softmax in fp32
            z = z.to(torch.promote_types(z.dtype, torch.float32))
            z -= z.amax(dim=1, keepdim=True)  # each row's largest logit is now 0: exp cannot overflow
            target_z, p = z.gather(1, tc), z.exp_()  # one exp over the chunk, in place
            total = p.sum(dim=1, keepdim=True)
            loss = loss + torch.where(valid, total.log() - target_z, 0).sum()  # -log softmax of each target
            if grad:
                p = p.div_(total).scatter_add_(1, tc, -valid.to(p.dtype))  # d loss / d logits: softmax - one_hot
                grad_h[i : i + chunk] = (p @ weight) * valid
                grad_w += p.t() @ (hc * valid)
        ctx.save_for_backward(grad_h, grad_w, n)
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w, n = ctx.saved_tensors
        return grad_h * (grad_loss / n), grad_w * (grad_loss / n), None, None, None, None


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


def write_header(log_dir: Path, info: dict, log):
    """Append this run's settings (info), the time, the command line and the versions to log_dir/header.txt: one
    JSON block per start or resume. First a torn last line of log.txt (an interrupted write) is dropped, said in log."""
    for name in ("log.txt", "header.txt"):  # appending to a FIFO would wait forever for a reader
        if (log_dir / name).exists() and not (log_dir / name).is_file():
            raise ValueError(f"{log_dir / name} is not a regular file; move it away, or choose another --log_dir")
    if note := repair_log(log_dir / "log.txt"):
        log(note)
    gpu = torch.cuda.get_device_name() if str(info.get("device", "")).startswith("cuda") else None
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, **info, "python": platform.python_version(),
            "torch": torch.__version__, "gpu": gpu}
    append_line(log_dir / "header.txt", json.dumps(info, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Metrics: stdout, log.txt, wandb

# How each metric reads on stdout; log.txt and wandb get every value as measured. A kind missing here needs no
# entry: it prints as `kind value`.
SHOW = {"train": "loss {:.6f}", "val": "val loss {:.4f}", "bpb": "val bpb {:.4f}", "hella": "HellaSwag acc_norm {:.4f}",
        "lr": "lr {:.4e}", "norm": "norm {:.4f}", "ms": "{:7.1f} ms", "tok_per_s": "{:9.0f} tok/s", "mfu": "MFU {:6.2%}",
        "epoch": "epoch {:.2f}"}


class Metrics:
    """The one sink of measured values. report(step, kind=value, ...) is called once, where they are measured:
    it prints them as one line (a training step's with step/total and the time left, an evaluation's marked `eval`),
    appends a `step kind value` line each to log_dir/log.txt (what plot.py and play.ipynb read) in one write, and
    sends them to wandb when it is on. Only rank 0 writes; every rank keeps `latest`."""

    def __init__(self, log_dir: str | os.PathLike, enabled: bool, echo, max_steps: int, wandb: Optional[dict] = None,
                 latest: Optional[dict] = None):
        self.path, self.enabled, self.echo, self.max_steps = Path(log_dir) / "log.txt", enabled, echo, max_steps
        self.wandb_run = start_wandb(**wandb) if enabled and wandb else None
        self.latest: dict[str, float] = dict(latest or {})  # the newest value of each kind: train() returns them
        self.clock: Optional[tuple[int, float]] = None  # (step, time) of the first step reported: the time left

    def report(self, step: int, **values: float):
        if self.enabled and "epoch" in values and int(values["epoch"]) > int(self.latest.get("epoch") or values["epoch"]):
            self.echo(f"note: epoch {int(values['epoch'])} begins after step {step}: the train split is read again")
        self.latest.update(values)
        if not self.enabled:
            return
        fields = " | ".join(SHOW.get(k, k + " {:.6g}").format(v) for k, v in values.items())
        if "train" in values:
            self.echo(f"step {step:5d}/{self.max_steps} | {fields}{self.time_left(step)}")
        else:
            self.echo(f"eval {step:5d}/{self.max_steps} | {fields}")
        append_line(self.path, "".join(f"{step} {kind} {value:.8g}\n" for kind, value in values.items()))
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def time_left(self, step: int) -> str:
        """' | 1h02m left', from the wall time per step since the first one (evaluations included), else ''."""
        now = time.time()
        if self.clock is None or step <= self.clock[0]:
            self.clock = (step, now)
            return ""
        left = (now - self.clock[1]) / (step - self.clock[0]) * (self.max_steps - 1 - step)
        return f" | {int(left // 3600)}h{int(left % 3600 // 60):02d}m left" if left >= 60 else f" | {left:.0f}s left"

    def report_samples(self, step: int, texts: list[str]):
        """Samples as text (their line breaks kept), and to wandb as a table."""
        if self.enabled:
            for i, text in enumerate(texts):
                self.echo(f"sample {i} at step {step}:\n{text}\n")
            if self.wandb_run is not None:
                import wandb

                self.wandb_run.log({"samples": wandb.Table(columns=["step", "sample"], data=[[step, t] for t in texts])},
                                   step=step)

    def finish(self):
        if self.wandb_run is not None:
            self.wandb_run.finish()


def summary(log_dir: str, result: dict, signal_name: Optional[str]) -> str:
    """What a run ends with on stdout: where it stopped or finished, its final numbers, its files, what to run next."""
    log_dir, ckpt = Path(log_dir), result.get("checkpoint")
    how = f"stopped by {signal_name} at step {result['step']}" if result["stopped"] else f"finished at step {result['step']}"
    numbers = " | ".join(SHOW[k].format(result[k]) for k in ("val", "bpb", "hella") if result.get(k) is not None)
    lines = [f"{how}{' | ' + numbers if numbers else ''}",
             f"checkpoint: {ckpt or 'none written (nothing new since the start)'}",
             f"log: {log_dir / 'log.txt'} | curves: {log_dir / 'curves.png'} (python plot.py {log_dir})"]
    if ckpt:
        lines.append(f"sample from it: python sample.py --init_from {ckpt}")
    command = " ".join(a for a in sys.argv if a) or "python train_gpt2.py ..."
    if "--resume" not in sys.argv:
        command += " --resume auto"
    lines.append(f"{'continue' if result['stopped'] else 'resume it (with a larger --max_steps)'}: python {command}")
    return "\n".join(lines)


def start_logging(cfg: dict, derived: dict, notes: list, latest: dict, master: bool, log) -> Metrics:
    """A run's start in its log_dir and on stdout: log.txt repaired and header.txt appended (rank 0), the notes and
    what the run is (size, processes, batch, epochs to read) said, and the metrics sink (with wandb when asked for,
    its config the flags and the derived values) returned."""
    if master:
        write_header(Path(cfg["log_dir"]), {"config": cfg, **derived}, log)
    for note in notes:
        if note:
            log(note)
    d = derived
    log(f"{d['num_params']:,} parameters | {d['world_size']} process(es) on {d['device']} | {d['dtype']} | compile "
        f"{d['compile']}")
    log(f"total batch {cfg['total_batch_size']:,} tokens = {cfg['batch_size']} x {cfg['seq_len']} x {d['world_size']} "
        f"ranks x {d['grad_accum_steps']} micro-steps; {d['epochs']:.2f} epochs of the train split "
        f"({d['train_tokens']:,} tokens) to read")
    wandb = dict(project=cfg["wandb_project"], name=cfg["wandb_run_name"], run_id=d["lineage"]["wandb_id"],
                 config={**cfg, **derived}) if cfg["wandb_project"] else None
    return Metrics(cfg["log_dir"], master, log, cfg["max_steps"], wandb, latest)


def start_wandb(project: str, name: str, run_id: str, config: dict):
    """The Weights & Biases run of this lineage: run_id (kept in its checkpoints) continues it after a resume."""
    import wandb  # optional dependency, imported only when asked for

    return wandb.init(project=project, name=name or None, id=run_id, resume="allow", config=config)


def append_line(path: Path, text: str):
    """Append whole lines to a log in one write; a full disk names the file. A torn line (the write cut short) is
    dropped by repair_log at the next start."""
    try:
        with open(path, "a") as f:
            f.write(text)
    except OSError as e:
        raise OSError(f"could not write {path} ({write_error(e)}); the checkpoints are intact: free some space, then "
                      "rerun with --resume auto") from None


def repair_log(path: Path) -> Optional[str]:
    """Drop a torn last line (no newline: a write cut short by a full disk or a kill) from a log; a note if one was."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return None
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
    except FileNotFoundError:
        return None
    return f"note: dropped the torn last line of {path} ({data[keep:][:60]!r}), left by an interrupted write"


# ----------------------------------------------------------------------------------------------------------
# One run per log_dir, and stopping cleanly

# Errors of flock that mean the filesystem has no locks, not that another run holds this one: NFS emulates flock with
# byte-range locks and fails without lockd (ENOLCK) or on a file not open for writing (EBADF); Lustre mounted
# without -o flock says ENOSYS; some FUSE filesystems EINVAL or EOPNOTSUPP.
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP)
LOCK_FILE = ".lock"  # in log_dir: empty, never deleted (the lock is the kernel's, not the file's existence)


class LogDirLock:
    """Rank 0's exclusive lock on --log_dir: flock on log_dir/.lock, opened for writing (NFS needs that). The kernel
    drops the lock with its process, so a killed run never blocks --resume auto. Released when the run ends."""

    def __init__(self, log_dir: str, master: bool):
        self.path, self.master, self.fd = Path(log_dir), master, None

    def claim(self, create: bool) -> str:
        """Lock log_dir if it exists (create: make it first). If rank 0 cannot, torchrun stops the other ranks.
        Returns '' or, from the one call that took the lock file, a note that the filesystem has no locks and the
        run goes on unlocked (the caller logs it)."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--log_dir {self.path} exists and is not a directory")
        if not self.master or self.fd is not None or not (create or self.path.is_dir()):
            return ""
        self.path.mkdir(parents=True, exist_ok=True)
        self.fd, note = lock_directory(self.path, "--log_dir", "run")
        if not note:  # unlocked, another run may be saving here: its temp files are left alone (they only cost disk)
            for stale in self.path.glob(".model_*.pt.tmp*"):  # left by a run killed while saving
                stale.unlink(missing_ok=True)
        return note

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_directory(directory: Path, flag: str, user: str) -> tuple[int, str]:
    """An exclusive flock on directory/.lock, opened for writing (NFS emulates flock with byte-range locks, which need
    that; the file stays, empty). The kernel drops it with its process, so a killed program leaves no lock. Returns
    (fd, '') when taken, (fd, a note) where the filesystem has no locks and the caller goes on unlocked; raises a
    one-line ValueError naming the holder (another `user`) when it is taken."""
    lock_file = directory / LOCK_FILE
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as e:
        raise ValueError(f"{flag} {directory}: cannot open {lock_file} for writing ({e.strerror}); a {user} must be "
                         f"able to write in its {flag}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{flag} {directory} is in use by another {user} ({lock_holder(lock_file)}); wait for it, "
                         f"or choose another {flag}") from None
    except OSError as e:
        if e.errno not in NO_LOCKS:
            os.close(fd)
            raise
        return fd, (f"{flag} {directory} is not locked: its filesystem has no file locks (flock: "
                    f"{errno.errorcode.get(e.errno, e.errno)}, {e.strerror}); make sure no other {user} uses this directory")
    return fd, ""


def lock_holder(path: Path) -> str:
    """'pid N: its command line' of the process holding a flock on path, read from Linux's /proc/locks."""
    st = path.stat()
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        pid = next(line.split()[4] for line in Path("/proc/locks").read_text().splitlines() if key in line.split())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(bytes(1), b" ").decode().strip()
        return f"pid {pid}: {command if len(command) < 100 else command[:97] + '...'}"
    except (OSError, StopIteration):  # /proc/locks lists this machine's holders only
        return "a process not visible from here: on another node, or in another container"


class StopSignal:
    """SIGTERM, SIGINT (Ctrl-C), SIGHUP (a closed terminal) and SIGUSR1 (a scheduler's warning before a time limit:
    SLURM's `--signal=USR1@120`) only set `requested`: the run checks it at every step and inside evaluations,
    writes a checkpoint of where it is and ends with status 0, never a traceback. The handlers are the process's for
    the whole run, start-up and the final save included; the previous ones return. A signal the process was started
    ignoring stays ignored: `nohup` ignores SIGHUP so that a closed terminal does not end the run, and a shell's
    background job (`cmd &`) ignores SIGINT."""
    SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1") if hasattr(signal, name))

    def __enter__(self):
        self.requested = None
        self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        return self

    def _handle(self, signum, frame):
        self.requested = signal.Signals(signum).name  # e.g. "SIGTERM": true, and says which

    @contextlib.contextmanager
    def held(self):
        """The stop signals held back (blocked in this thread) for the block, then handled. What the block starts
        inherits the mask: torch.compile's C++ compiler (Triton's ptxas on a GPU) is not killed half-way by a Ctrl-C
        or a scheduler's SIGTERM sent to the whole process group, which inductor reports as "no working C++
        compiler" and the run would end in a traceback. The handler only records a request, so nothing else
        changes: the loop sees it when the block ends."""
        if not hasattr(signal, "pthread_sigmask"):  # Windows
            yield
            return
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

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


TORCHRUN_HINT = ("torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together: launch with "
                 "torchrun, or unset them all for one process")


def torchrun_env(environ) -> Optional[tuple[int, int, int, int]]:
    """(rank, local_rank, world_size, local_world) when torchrun (or a scheduler's script) started this process as a
    rank, None when RANK, LOCAL_RANK and WORLD_SIZE are all unset (one process); a partial or malformed set is refused
    naming the variable. local_world: torchrun's LOCAL_WORLD_SIZE, processes on this node that see the same GPUs;
    0 when torchrun did not start this one (no TORCHELASTIC_RUN_ID), since a scheduler may give each its own."""
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    if not (present := [name for name in names if name in environ]):
        return None
    for name in (*names, "MASTER_ADDR", "MASTER_PORT"):
        if not environ.get(name):
            raise ValueError(f"{present[0]} is set but {name} is not: {TORCHRUN_HINT}")
    for name in (*names, "MASTER_PORT"):
        if not re.fullmatch(r"[0-9]+", environ[name]):
            raise ValueError(f"{name}={environ[name]!r} is not a whole number >= 0: {TORCHRUN_HINT}")
    rank, local_rank, world_size, port = (int(environ[name]) for name in (*names, "MASTER_PORT"))
    for name, value in (("RANK", rank), ("LOCAL_RANK", local_rank)):
        if value >= world_size:
            raise ValueError(f"{name}={value} with WORLD_SIZE={world_size}: a rank is 0 to WORLD_SIZE - 1; {TORCHRUN_HINT}")
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port (1 to 65535); {TORCHRUN_HINT}")
    local_world = environ.get("LOCAL_WORLD_SIZE", "") if "TORCHELASTIC_RUN_ID" in environ else ""
    return rank, local_rank, world_size, int(local_world) if local_world.isdigit() else 0


def cuda_device(device: str, env: Optional[tuple[int, int, int, int]], count: int, visible: Optional[str]) -> str:
    """'cuda:N', the GPU this process uses of the `count` it sees (visible: CUDA_VISIBLE_DEVICES, for messages).
    One process: --device cuda:N, plain cuda meaning cuda:0. A rank (env from torchrun_env): cuda:LOCAL_RANK, as
    torchrun's one process per GPU expects; or its one GPU when it sees exactly one and torchrun did not start more
    processes on this node than that (a scheduler gave each process its own: SLURM's --gpus-per-task=1, a
    CUDA_VISIBLE_DEVICES per task). Anything else would put two ranks on one GPU, or guess among several: refused."""
    seen = f"{count} GPU{'s' * (count != 1)}" + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
    if env is None:
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise ValueError(f"--device {device}: this process sees {seen}: cuda:0" + f" to cuda:{count - 1}" * (count > 1))
        return f"cuda:{index}"
    if device != "cuda":
        raise ValueError(f"--device {device} under torchrun: each rank takes its GPU from LOCAL_RANK; pass --device "
                         "cuda (or auto) and choose the GPUs with CUDA_VISIBLE_DEVICES")
    _, local_rank, _, local_world = env
    if local_world > count:
        raise ValueError(f"torchrun started {local_world} processes on this node (--nproc_per_node) but they see "
                         f"{seen}: start at most {count}, one per GPU")
    if local_rank < count or count == 1:
        return f"cuda:{local_rank if local_rank < count else 0}"
    raise ValueError(f"LOCAL_RANK={local_rank} but this process sees {seen}: give each process all of its node's GPUs "
                     "or exactly one (SLURM: --gpus-per-task=1), or start fewer processes per node")


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


def tune_for(device_type: str):
    """Speed settings no experiment changes: TF32 for any fp32 matmul left outside autocast on CUDA; on a CPU with
    glibc, big freed blocks kept in the process (otherwise every step maps its large buffers, the logits and the
    gradients, afresh and page-faults them in again: a large part of a small model's step)."""
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if device_type != "cpu":
        return
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


# Dense (no 2:4 sparsity) bf16 tensor-core peak of one GPU in FLOP/s, from the vendors' datasheets; GeForce cards at
# their rate with fp32 accumulation, which bf16 matmuls use. A10G: AWS's variant of the A10, no public datasheet.
PEAK_BF16_FLOPS = {"A100": 312e12, "A800": 312e12, "H100 SXM": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12,
                   "H800 SXM": 989e12, "H800 PCIe": 756e12, "H200 SXM": 989e12, "H200 NVL": 835e12, "GH200": 989e12,
                   "B200": 2250e12, "A10": 125e12, "A10G": 125e12, "L4": 121e12, "L40": 181e12, "L40S": 362e12,
                   "RTX 4090": 165e12, "RTX 3090": 71e12}

# torch.cuda.get_device_name() -> PEAK_BF16_FLOPS's model, matched whole (fullmatch), first match wins: a substring
# would take an H100 NVL or PCIe for an SXM part, and a GH200 for an H200.
GPU_MODELS = [(r"NVIDIA A100\b.*", "A100"),  # A100-SXM4-80GB, -SXM4-40GB, -PCIE-40GB, 80GB PCIe: one peak
              (r"NVIDIA A800\b.*", "A800"),
              (r"NVIDIA H100 NVL\b.*", "H100 NVL"),
              (r"NVIDIA H100 PCIe\b.*", "H100 PCIe"),
              (r"NVIDIA H100( \d+GB HBM3| SXM5?\b.*)", "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
              (r"NVIDIA H800 PCIe\b.*", "H800 PCIe"),
              (r"NVIDIA H800( \d+GB HBM3)?", "H800 SXM"),
              (r"NVIDIA H200 NVL\b.*", "H200 NVL"),
              (r"NVIDIA H200( \d+GB HBM3e| SXM.*)?", "H200 SXM"),  # "NVIDIA H200"
              (r"NVIDIA GH200\b.*", "GH200"),  # "NVIDIA GH200 480GB": a Grace CPU with an H100-class GPU
              (r"NVIDIA B200", "B200"),
              (r"NVIDIA A10", "A10"), (r"NVIDIA A10G", "A10G"),
              (r"NVIDIA L4", "L4"), (r"NVIDIA L40", "L40"), (r"NVIDIA L40S", "L40S"),
              (r"NVIDIA GeForce RTX 4090", "RTX 4090"), (r"NVIDIA GeForce RTX 3090", "RTX 3090")]


def gpu_model(name: str) -> Optional[str]:
    """The PEAK_BF16_FLOPS model of a GPU as torch.cuda.get_device_name() reports it; None for any other, and for a
    MIG slice ("... MIG 3g.40gb"), which has a fraction of the chip's peak."""
    if re.search(r"\bMIG\b", name):
        return None
    return next((model for pattern, model in GPU_MODELS if re.fullmatch(pattern, name.strip())), None)


def peak_flops(device_type: str, override: float = 0.0) -> Optional[float]:
    """Peak bf16 FLOP/s of this device: the override, else a lookup of the current GPU's model, else None (MFU
    not shown; mfu_note says why)."""
    if override > 0 or device_type != "cuda":
        return override or None
    model = gpu_model(torch.cuda.get_device_name())
    return PEAK_BF16_FLOPS[model] if model else None


def mfu_note(device_type: str, peak: Optional[float]) -> str:
    """Why a run on a GPU shows no MFU ('' when it does, and on a CPU or MPS, which never do)."""
    if peak or device_type != "cuda":
        return ""
    name = torch.cuda.get_device_name()
    why = "a MIG slice has a share of its GPU's peak" if re.search(r"\bMIG\b", name) else \
        "its dense bf16 peak is not in run_files.PEAK_BF16_FLOPS"
    return f"no MFU on {name!r}: {why}; pass --peak_flops (FLOP/s of one GPU or slice) to see it"
