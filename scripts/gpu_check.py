"""
The first GPU check (issue 29): one command that measures the trainer's GPU path on one GPU
and ends well inside 9 minutes on an H200, each stage's result written the moment it ends.

    python3 scripts/gpu_check.py                  # on a CUDA machine (or scripts/gpu_check.sh)
    python3 scripts/gpu_check.py --cpu-smoke      # every stage at toy sizes on a CPU (the tests)
    python scripts/gpu_check.py --make-reference  # scripts/gpu_reference.json: a CPU, fp32

Stages, in order (stages() has each one's estimated seconds on an H200):
  a  preflight: Python, torch, CUDA, Triton; the GPU; its SDPA backends; its peak FLOP/s
  b  correctness: GPT-2 124M's loss, logits and 3 AdamW steps against the CPU reference, in
     fp32 (TF32 off), bf16 autocast and compiled bf16
  c  the compiled training step at B=64, 32, 16 (T=1024): compile seconds, ms/step, tok/s,
     MFU, peak memory, the attention kernel that ran
  d  on the warm model: val loss over the recipe's 10,485,760 tokens (compiled, as the trainer
     runs it, then eager: the same loss, without the compile), HellaSwag on 10,042 synthetic
     examples, a sample, a checkpoint saved and loaded; then evaluation's share of the
     recipe's time on 8 GPUs, both ways
  e  torchrun train_gpt2.py --preset gpt2-124M on a synthetic corpus, then --resume auto
  f  the table of it all (table.md, printed)

Time: --deadline (510 s) counts from the start. A stage whose estimate is more than the time
left is skipped (recorded so, with the reason); one still running at the deadline is cut off
(an exception raised where it runs: should that be inside torch's C++, the process may abort,
and results.jsonl and table.md still hold every stage that ended). A stage that fails records
its error, and the next one runs. --stages picks groups (b to e).

Output: --out DIR, else $GPU_CHECK_OUT, else out/gpu_check (git ignores out/). Each run writes
DIR/run_{date}_{time}/results.jsonl (a JSON line a stage, appended and synced as it ends) and
table.md (rewritten after each stage). DIR keeps the compile caches (inductor_cache/ and
triton_cache/, unless TORCHINDUCTOR_CACHE_DIR or TRITON_CACHE_DIR is set) and the synthetic
corpus, so that a second run is warm (DIR/warm_torch_{version} says stage c compiled there).
The trainer's checkpoints go once stage e resumed from them; at the deadline its launcher and
ranks get SIGTERM, then SIGKILL 20 s later. Exit status 0 when no stage failed; 1 when one
failed or a stop signal stopped the run.
"""

import argparse
import dataclasses
import datetime
import functools
import gc
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

# the deadline counts from here, torch's import included
STARTED = time.monotonic()
PROG = "gpu_check.py"
ROOT = Path(__file__).resolve().parents[1]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


def stop_at_start(signum, frame):
    sys.exit(f"{PROG}: stopped by {signal.Signals(signum).name} while starting")


if __name__ == "__main__":
    # a stop request while torch loads: one line (a signal ignored at start stays so), once torch
    # has loaded (until then the signals wait, blocked: raised inside its C++ start-up, the
    # exception would abort the process)
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, stop_at_start)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

sys.path.insert(0, str(ROOT))
try:
    import numpy as np
    import torch
    import torch.nn.functional as F

    import bench
    import fineweb
    import hellaswag
    import plot
    import train_gpt2
except ImportError as e:
    sys.exit(f"{PROG}: error: {sys.executable} cannot import {e.name}: use the python with torch")

if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

SEED = 1337
PROMPT = "Hello, I'm a language model,"
# GPT-2 124M with the trainer's padded vocabulary; the smoke's toy model
GPT2_124M = dict(vocab_size=50304)
TINY = dict(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)
# the correctness cases: a fixed batch, the loss and logits, then 3 AdamW steps
CASES = {
    "gpt2-124M": dict(model=GPT2_124M, B=2, T=128, lr=1e-4, steps=3),
    "tiny": dict(model=TINY, B=2, T=32, lr=1e-4, steps=3),
}
# allowed (logits max abs, losses max relative) differences: fp32 with TF32 off, and bf16
TIGHT = (1e-3, 1e-4)
LOOSE = (0.05, 5e-3)
# common words, one GPT-2 token each: synthetic text of known lengths
WORDS = (
    "the of and to in is was for on that with as by at from his her he she it they we "
    "you this which or an be are had were not but have one all their there been would "
    "new time year people man day first two more when world city school after over "
    "under small house water river tree car dog ball road light red blue green old "
    "then now here very long part place work life hand night game home while where"
).split()

# the sizes of a run on a GPU, and of the CPU smoke
SIZES = {
    "gpu": dict(
        model=GPT2_124M,
        case="gpt2-124M",
        T=1024,
        batches=[64, 32, 16],
        steps=10,  # timed steps a batch size, after the first (compiling) one
        val_tokens=10_485_760,
        hella=dict(n=10_042, ctx=(60, 100), ending=(10, 40)),
        sample_length=32,
        corpus=dict(tokens=3_000_000, shard_size=600_000),
        train=dict(B=64, T=1024, total=131072, steps=20, more=10, val=524288, every=10),
        train_hella=100,
    ),
    "cpu": dict(
        model=TINY,
        case="tiny",
        T=32,
        batches=[4, 2, 1],
        steps=3,
        val_tokens=8 * 4 * 32,
        hella=dict(n=16, ctx=(6, 12), ending=(2, 6)),
        sample_length=8,
        corpus=dict(tokens=6_000, shard_size=1_000),
        train=dict(B=2, T=32, total=128, steps=2, more=2, val=256, every=2),
        train_hella=8,
    ),
}


class Stop(BaseException):
    # a stop signal or the deadline (SIGALRM), raised wherever the program is
    pass


class Skip(Exception):
    # a stage that cannot run: recorded as skipped, with this reason
    pass


def raise_stop(signum, frame):
    raise Stop("deadline" if signum == signal.SIGALRM else signal.Signals(signum).name)


@dataclasses.dataclass
class Check:
    # one run of the check: what the stages share
    mode: str  # "gpu", or "cpu" (--cpu-smoke)
    compile: str  # inductor | eager | false
    out: Path
    run_dir: Path
    deadline: float  # the time.monotonic() it must end by
    warm_cache: bool  # the compile cache holds an earlier run's work
    reference: Path
    records: list = dataclasses.field(default_factory=list)
    warm: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.sizes = SIZES[self.mode]
        self.cuda = self.mode == "gpu"
        self.device = "cuda" if self.cuda else "cpu"


# -----------------------------------------------------------------------------
# helpers


def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gib(check, reset=False):
    # the allocator's peak (GiB) since the last reset; None on a CPU
    if not check.cuda:
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


def compiled(model, mode):
    # torch.compile as the trainer calls it; eager: dynamo's trace alone (seconds on a CPU)
    if mode == "false":
        return model
    return torch.compile(model, backend=mode, dynamic=False)


def autocast(device, enabled):
    return torch.autocast(device.split(":")[0], torch.bfloat16, enabled=enabled)


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def timed(fn, *args, **kwargs):
    # (fn's result, its seconds)
    t0 = time.monotonic()
    result = fn(*args, **kwargs)
    return result, time.monotonic() - t0


def write_text(path, text):
    # atomically, as the trainer writes its checkpoints
    fineweb.write_atomic(Path(path), lambda f: f.write(text.encode()))


def synthetic_words(rng, lo, hi):
    # lo to hi words (a token each), then a full stop
    n = int(rng.integers(lo, hi + 1))
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n)) + "."


def synthetic_examples(n, ctx, ending, seed=SEED):
    # HellaSwag-shaped examples: contexts and endings of the given lengths in tokens
    rng = np.random.default_rng(seed)
    examples = []
    for _ in range(n):
        endings = [synthetic_words(rng, *ending) for _ in range(4)]
        text = synthetic_words(rng, *ctx).capitalize()
        examples.append({"ctx": text, "endings": endings, "label": int(rng.integers(4))})
    return examples


def synthetic_text(tokens, seed=SEED):
    # documents of 500 words, two blank lines apart (fineweb.py's .txt layout); the words
    # Zipf-distributed, so that the loss can fall
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    words = rng.choice(WORDS, size=tokens, p=p / p.sum())
    docs = [" ".join(words[i : i + 500]) for i in range(0, tokens, 500)]
    return "\n\n\n".join(docs) + "\n"


def fixed_batch(B, T, device, seed=SEED):
    # x, y (B, T) laid out as DataLoaderLite lays them: one window of B*T + 1 tokens
    rng = np.random.default_rng(seed)
    buf = torch.from_numpy(rng.integers(0, 50257, B * T + 1)).to(device)
    return buf[:-1].view(B, T), buf[1:].view(B, T)


# -----------------------------------------------------------------------------
# a: preflight


def sdpa_backends(device):
    # each SDPA backend that runs a causal forward and backward here, alone
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    q = torch.randn(1, 12, 256, 64, device=device, dtype=dtype, requires_grad=True)
    backends = dict(
        flash=SDPBackend.FLASH_ATTENTION,
        efficient=SDPBackend.EFFICIENT_ATTENTION,
        cudnn=SDPBackend.CUDNN_ATTENTION,
        math=SDPBackend.MATH,
    )
    found = {}
    for name, backend in backends.items():
        try:
            with warnings.catch_warnings(), sdpa_kernel([backend]):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            found[name] = True
        except RuntimeError:
            found[name] = False
    return found


def stage_preflight(check):
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=triton_version,
        sdpa=sdpa_backends(check.device),
        peak_flops=bench.peak_flops(check.device),
    )
    where = f"CPU ({os.cpu_count()} cores)"
    if check.cuda:
        props = torch.cuda.get_device_properties(check.device)
        info.update(gpu=props.name, memory_gib=props.total_memory / 2**30)
        info.update(capability=f"{props.major}.{props.minor}")
        info.update(free_gib=torch.cuda.mem_get_info()[0] / 2**30)
        where = f"{props.name} ({info['memory_gib']:.0f} GiB, sm {info['capability']})"
    # Triton (inductor on a GPU) builds its launchers with a C compiler and Python's headers
    info["cc"] = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    info["python_h"] = (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
    sdpa = ", ".join(k for k, ok in info["sdpa"].items() if ok)
    info["summary"] = (
        f"{where}; torch {info['torch']}, CUDA {info['cuda']}, Triton {triton_version},"
        f" Python {info['python']}; SDPA: {sdpa}; peak {fmt(info['peak_flops'], '.3g')} FLOP/s"
    )
    if check.compile == "inductor" and not (info["cc"] and info["python_h"]):
        info["problem"] = f"torch.compile needs a C compiler and Python.h: {info['summary']}"
    return info


# -----------------------------------------------------------------------------
# b: correctness against the CPU reference


def seeded_model(config, device="cpu"):
    # the seeded GPT made on `device`, and its weights' sum of squares (the init's checksum)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = train_gpt2.GPT(train_gpt2.GPTConfig(**config))
    init = sum(float(p.detach().double().square().sum()) for p in model.parameters())
    return model, init


def run_case(case, device, amp, compile_mode):
    # the seeded model made on the CPU, then moved: its losses on a fixed batch before and
    # after each of the case's AdamW steps, and a slice of the first logits
    spec = CASES[case]
    raw, init = seeded_model(spec["model"])
    raw.to(device)
    model = compiled(raw, compile_mode)
    optimizers = raw.configure_optimizers(0.1, spec["lr"], device.split(":")[0])
    x, y = fixed_batch(spec["B"], spec["T"], device)
    losses = []
    for step in range(spec["steps"] + 1):
        with autocast(device, amp):
            logits, loss = model(x, y)
        losses.append(loss.item())
        if step == 0:
            first = logits[:, -2:, :8].float().flatten().tolist()  # (B * 2 * 8,)
        if step < spec["steps"]:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
    return dict(init=init, losses=losses, logits=first)


def make_reference(path):
    # every case in float32 on the CPU: the numbers the GPU runs are held to
    cases = {
        name: {**spec, **run_case(name, "cpu", False, "false")} for name, spec in CASES.items()
    }
    made = dict(torch=torch.__version__, python=platform.python_version(), dtype="float32")
    write_text(path, json.dumps({"made_with": made, "cases": cases}, indent=1) + "\n")
    return cases


def load_reference(check, case):
    # the reference file's case; or, when the file's seeded init is not this torch's (its
    # random numbers changed), the case made again on this CPU
    if "reference" in check.warm:
        return check.warm["reference"]
    try:
        ref = json.loads(check.reference.read_text())["cases"][case]
    except (OSError, ValueError, KeyError):
        raise ValueError(f"no {case} in {check.reference}: run {PROG} --make-reference") from None
    if any(ref.get(k) != v for k, v in CASES[case].items()):
        raise ValueError(f"{check.reference} is of another {case}: remake it (--make-reference)")
    init = seeded_model(CASES[case]["model"])[1]
    if abs(init - ref["init"]) > 1e-9 * ref["init"]:
        ref = {**ref, **run_case(case, "cpu", False, "false"), "remade": True}
    check.warm["reference"] = ref
    return ref


def stage_correct(check, variant):
    # variant: fp32 (TF32 off), bf16 (autocast), compiled (bf16 autocast, torch.compile)
    if variant == "compiled" and check.compile == "false":
        raise Skip("--compile false")
    case = check.sizes["case"]
    ref = load_reference(check, case)
    if check.cuda:
        # fp32: IEEE matmuls; else the trainer's TF32 for what autocast leaves in fp32
        torch.set_float32_matmul_precision("highest" if variant == "fp32" else "high")
    mode = check.compile if variant == "compiled" else "false"
    got = run_case(case, check.device, variant != "fp32", mode)
    logits = max(abs(a - b) for a, b in zip(got["logits"], ref["logits"]))
    losses = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
    tol = TIGHT if variant == "fp32" else LOOSE
    steps = " ".join(f"{v:.4f}" for v in got["losses"])
    remade = ", the reference made again on this CPU" if ref.get("remade") else ""
    result = dict(
        case=case,
        losses=got["losses"],
        logits_abs=logits,
        losses_rel=losses,
        tolerance=tol,
        reference_remade=ref.get("remade", False),
        summary=f"{case} losses {steps}: logits max abs diff {logits:.2e}, losses max rel"
        f" diff {losses:.2e} (tol {tol[0]:g}, {tol[1]:g}){remade}",
    )
    if logits > tol[0] or losses > tol[1]:
        result["problem"] = f"out of tolerance: {result['summary']}"
    return result


# -----------------------------------------------------------------------------
# c: the compiled training step


def warm_model(check):
    # the model of stages c and d, built once, compiled as the trainer compiles it
    if check.cuda:
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
    if "raw" not in check.warm:
        raw = seeded_model(check.sizes["model"], check.device)[0]
        optimizers = raw.configure_optimizers(0.1, 6e-4, check.device)
        model = compiled(raw, check.compile)
        check.warm.update(raw=raw, model=model, optimizers=optimizers)
    return check.warm


def train_step(warm, x, y, step):
    # train_gpt2.run's optimization step with one micro-step (8 GPUs x B=64: 524,288 tokens)
    model = warm["model"]
    model.zero_grad(set_to_none=True)
    with autocast(str(x.device), x.is_cuda):
        _, loss = model(x, y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(warm["raw"].parameters(), 1.0)
    loss_value = torch.stack([loss.detach(), norm]).tolist()[0]  # the trainer's host sync
    lr = train_gpt2.get_lr(step, 6e-4, 6e-5, 715, 19073)
    for opt in warm["optimizers"]:
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
    synchronize(str(x.device))
    return loss_value


def attention_kernel(model, x, y):
    # the SDPA implementation one forward ran: aten's op names, and the GPU's kernel names
    activities = [torch.profiler.ProfilerActivity.CPU]
    if x.is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        with autocast(str(x.device), x.is_cuda):
            model(x, y)
        synchronize(str(x.device))
    names = sorted({event.key for event in prof.key_averages()})
    ops = [n for n in names if "scaled_dot_product" in n]
    kinds = [k for k in ("cudnn", "flash", "efficient", "math") if any(k in n for n in ops)]
    pattern = re.compile("fmha|flash|attention|sdpa", re.I)
    kernels = [n for n in names if pattern.search(n) and not n.startswith("aten::")]
    return dict(kind=(kinds + ["none seen"])[0], ops=ops, kernels=kernels[:3])


def warm_marker(out):
    return out / f"warm_torch_{torch.__version__}"


def stage_step(check, B):
    warm = warm_model(check)
    T = check.sizes["T"]
    x, y = fixed_batch(B, T, check.device)
    peak_gib(check, reset=True)
    # the first step: dynamo traces, inductor compiles
    compile_s = timed(train_step, warm, x, y, 0)[1]
    times = [timed(train_step, warm, x, y, s)[1] for s in range(1, check.sizes["steps"] + 1)]
    ms = 1000 * statistics.median(times)
    tok_per_s = B * T / ms * 1000
    peak = bench.peak_flops(check.device)
    mfu = bench.flops_per_token(warm["raw"], T) * tok_per_s / peak if peak else None
    memory = peak_gib(check)
    if B == check.sizes["batches"][-1]:
        warm_marker(check.out).touch()  # every batch size of stage c compiled
    kernel = None
    if B == check.sizes["batches"][0]:
        # the profiler may be barred (CUPTI in a container): the step's numbers stand anyway
        try:
            kernel = attention_kernel(warm["model"], x, y)
        except Exception as e:
            kernel = dict(kind=f"unknown ({type(e).__name__})", ops=[], kernels=[])
    attention = kernel and f", attention {kernel['kind']}"
    return dict(
        B=B,
        T=T,
        compile_s=compile_s,
        ms=ms,
        tok_per_s=tok_per_s,
        mfu=mfu,
        peak_gib=memory,
        attention=kernel,
        summary=f"{B}x{T}: {ms:.1f} ms/step, {tok_per_s:,.0f} tok/s, MFU {fmt(mfu, '.1%')},"
        f" peak {fmt(memory, '.1f')} GiB, first step {compile_s:.1f} s{attention or ''}",
    )


# -----------------------------------------------------------------------------
# d: evaluation, sampling and checkpoints on the warm model


def stage_val(check, eager=False):
    # val over the recipe's tokens as the trainer scores it, through the compiled model; or,
    # to weigh the eval-mode compile against what it saves, through the eager raw model
    warm = warm_model(check)
    model = warm["raw"] if eager else warm["model"]
    B = check.sizes["batches"][0]
    T = check.sizes["T"]
    val_steps = check.sizes["val_tokens"] // (B * T)
    shard = np.random.default_rng(SEED).integers(0, 50257, val_steps * B * T + 1)
    loader = train_gpt2.DataLoaderLite([shard.astype(np.uint16)], B, T, device=check.device)
    amp = torch.bfloat16 if check.cuda else None
    # one batch first: the compile of eval mode (eager: the kernels' warm-up)
    compile_s = timed(train_gpt2.evaluate_val_loss, model, loader, 1, amp)[1]
    peak_gib(check, reset=True)
    loss, seconds = timed(train_gpt2.evaluate_val_loss, model, loader, val_steps, amp)
    memory = peak_gib(check)
    step = find_result(check, f"step_B{B}", required=False) or {}
    result = dict(
        tokens=val_steps * B * T,
        B=B,
        seconds=seconds,
        compile_s=compile_s,
        loss=loss,
        peak_gib=memory,
        summary=f"{val_steps * B * T:,} tokens at B={B}: {seconds:.1f} s (first batch"
        f" {compile_s:.1f} s), loss {loss:.3f}, peak {fmt(memory, '.1f')} GiB (training"
        f" step {fmt(step.get('peak_gib'), '.1f')})",
    )
    # issue 29: the trainer's evaluation must not raise the run's memory peak
    if not eager and memory and step.get("peak_gib") and memory > step["peak_gib"]:
        result["problem"] = f"val's memory peak is above the training step's: {result['summary']}"
    # the compiled eval graph against the eager model: the same loss, to bf16's rounding
    compiled = find_result(check, "val", required=False) if eager else None
    if compiled and abs(loss - compiled["loss"]) > 1e-3 * abs(compiled["loss"]):
        result["problem"] = f"eager val loss {loss:.5f}, compiled {compiled['loss']:.5f}"
    return result


def stage_hellaswag(check):
    warm = warm_model(check)
    spec = check.sizes["hella"]
    examples = synthetic_examples(spec["n"], spec["ctx"], spec["ending"])
    block_size = warm["raw"].config.block_size
    enc = fineweb.get_tokenizer()
    prepared, prepare_s = timed(hellaswag.prepare, examples, enc, block_size)
    # as the trainer scores it: the plain model, bf16 autocast on a GPU
    amp = torch.bfloat16 if check.cuda else None
    scores, seconds = timed(
        hellaswag.evaluate, warm["raw"], prepared, check.device, autocast_dtype=amp
    )
    width = prepared["tokens"].size(1)
    return dict(
        **scores,
        seconds=seconds,
        prepare_s=prepare_s,
        longest_row=width,
        summary=f"{scores['n']:,} examples (rows up to {width} tokens): {seconds:.1f} s,"
        f" rendered once in {prepare_s:.1f} s; acc_norm {scores['acc_norm']:.3f} (synthetic)",
    )


def stage_sample(check):
    raw = warm_model(check)["raw"]
    length = check.sizes["sample_length"]
    enc = fineweb.get_tokenizer()
    texts, seconds = timed(train_gpt2.sample_texts, raw, enc, PROMPT, 4, length)
    text = texts[0][:60].replace("\n", " ")
    summary = f"4 samples of {length} tokens: {seconds:.1f} s; {text!r}"
    return dict(seconds=seconds, text=texts[0], summary=summary)


def stage_checkpoint(check):
    # a checkpoint shaped like the trainer's, saved and loaded with its functions
    warm = warm_model(check)
    raw = warm["raw"]
    info = fineweb.tokenizer_info(fineweb.get_tokenizer())
    checkpoint = {
        "model": raw.state_dict(),
        "optimizers": [opt.state_dict() for opt in warm["optimizers"]],
        "model_config": dataclasses.asdict(raw.config),
        "train_config": dataclasses.asdict(train_gpt2.TrainConfig()),
        "step": 0,
        "val_loss": None,
        "loader": {"epoch": 0, "pos": 0},
        "spike_history": [],
        "data": {"tokenizer": info, "fingerprint": "synthetic"},
        "tokenizer": info,
        "wandb_id": None,
    }
    path = check.run_dir / "model_check.pt"
    save_s = timed(train_gpt2.save_checkpoint, path, checkpoint)[1]
    size = path.stat().st_size / 2**30
    loaded, load_s = timed(train_gpt2.load_checkpoint, path)
    path.unlink()
    result = dict(
        save_s=save_s,
        load_s=load_s,
        size_gib=size,
        summary=f"{size:.2f} GiB: saved in {save_s:.1f} s, loaded in {load_s:.1f} s",
    )
    if not torch.equal(loaded["model"]["lm_head.weight"], raw.lm_head.weight.cpu()):
        result["problem"] = "the loaded weights are not the saved ones"
    return result


def stage_eval_share(check):
    # The recipe on 8 GPUs: each GPU scores 1/8 of val and of HellaSwag at every evaluation
    # (every eval_interval steps and at the end) and trains one B=64 micro-step a step. The
    # eval-mode compile is paid once a run; with val through the eager model, not at all.
    recipe = train_gpt2.TrainConfig()
    evaluations = len(range(0, recipe.max_steps, recipe.eval_interval)) + 1
    step = find_result(check, f"step_B{check.sizes['batches'][0]}")
    val = find_result(check, "val")
    hella = find_result(check, "hellaswag")
    train_s = recipe.max_steps * step["ms"] / 1000
    variants = {"compiled": (val["seconds"], val["compile_s"])}
    eager = find_result(check, "val_eager", required=False)
    if eager:
        variants["eager"] = (eager["seconds"], 0.0)
    shares = {}
    for name, (val_s, once_s) in variants.items():
        eval_s = evaluations * (val_s + hella["seconds"]) / 8 + once_s
        shares[name] = eval_s / (eval_s + train_s)
    share = shares["compiled"]
    summary = (
        f"{evaluations} x ({val['seconds']:.1f} s val + {hella['seconds']:.1f} s HellaSwag) / 8"
        f" + {val['compile_s']:.0f} s compile vs {train_s:.0f} s of {recipe.max_steps:,}"
        f" steps: {share:.2%} of the run, {'within' if share <= 0.02 else 'over'} issue 29's"
        f" 2%; with val eager: {fmt(shares.get('eager'), '.2%')}"
    )
    return dict(
        evaluations=evaluations, train_s=train_s, shares=shares, share=share, summary=summary
    )


# -----------------------------------------------------------------------------
# e: the trainer under torchrun


def descendants(pid):
    # every process below pid, read from /proc: torchrun starts each rank in a session of its
    # own, so the launcher's process group does not hold them
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...", and comm may hold spaces or parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended meanwhile
        parent_of[int(stat.parent.name)] = int(fields[1])
    found = []
    below = {pid}
    while below:
        below = {child for child, parent in parent_of.items() if parent in below}
        found += below
    return found


def stop_group(proc, grace=20):
    # the launcher and its ranks: SIGTERM to its group (the trainer's clean stop; torchrun
    # passes it on), then SIGKILL to the group and to every process below the launcher
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=grace)
    except ProcessLookupError:
        return proc.wait()
    except subprocess.TimeoutExpired:
        pass
    for pid in descendants(proc.pid) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait()


def run_logged(check, argv, log_path):
    # argv in its own process group, its output in log_path; stopped before the deadline
    timeout = max(check.deadline - time.monotonic() - 25, 1)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            raise TimeoutError(f"stopped at the deadline; its output: {log_path}") from None
        finally:
            if proc.poll() is None:
                stop_group(proc)
    if code != 0:
        # the program's own error line in the launcher's output, else the last line
        lines = log_path.read_text(errors="replace").strip().splitlines() or ["no output"]
        own = [line for line in lines if ": error: " in line or "Error" in line]
        raise RuntimeError(f"exit {code}: {(own or lines)[-1].strip()[:300]}")
    return log_path.read_text(errors="replace")


def stage_corpus(check):
    # fineweb.py's shards of synthetic text (kept in --out for the next run), and a
    # HellaSwag file for the trainer; the trainer gets the GPU memory this process held
    check.warm.clear()
    gc.collect()
    if check.cuda:
        torch.cuda.empty_cache()
    spec = check.sizes["corpus"]
    data = check.out / f"corpus_{spec['tokens']}_{spec['shard_size']}"
    text = data.with_suffix(".txt")
    if not text.is_file():
        write_text(text, synthetic_text(spec["tokens"]))
    argv = [sys.executable, "fineweb.py", "--local", str(text), "--out_dir", str(data)]
    argv += ["--shard_size", str(spec["shard_size"]), "--workers", str(min(8, os.cpu_count()))]
    output = run_logged(check, argv, check.run_dir / "fineweb.log")
    manifest = fineweb.load_corpus(data)
    hella = check.sizes["hella"]
    examples = synthetic_examples(check.sizes["train_hella"], hella["ctx"], hella["ending"])
    lines = "".join(json.dumps(example) + "\n" for example in examples)
    write_text(check.run_dir / "hellaswag.jsonl", lines)
    return dict(
        data_root=str(data),
        shards=len(manifest["shards"]),
        summary=f"fineweb.py: {output.strip().splitlines()[-1]}",
    )


def train_argv(check, resume):
    spec = check.sizes["train"]
    flags = dict(
        data_root=find_result(check, "corpus")["data_root"],
        log_dir=check.run_dir / "train_log",
        max_steps=spec["steps"] + spec["more"] * resume,
        batch_size=spec["B"],
        seq_len=spec["T"],
        total_batch_size=spec["total"],
        warmup_steps=spec["every"],
        val_tokens=spec["val"],
        eval_interval=spec["every"],
        hellaswag_interval=spec["every"],
        hellaswag_data=check.run_dir / "hellaswag.jsonl",
        sample_interval=spec["every"],
        sample_length=check.sizes["sample_length"],
        ckpt_interval=spec["steps"],
        compile="true" if check.compile == "inductor" else "false",
        resume="auto" if resume else "",
    )
    if not check.cuda:
        flags.update(device="cpu", n_layer=2, n_head=2, n_embd=32)
    # the rendezvous on the loopback: a GPU box offline may not resolve its own hostname
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1"]
    argv += ["--nproc_per_node=1", "train_gpt2.py", "--preset", "gpt2-124M"]
    return argv + [f"--{k}={v}" for k, v in flags.items()]


def stage_train(check, resume):
    # torchrun train_gpt2.py: the loop's ms/step (log.txt) against stage c's step, and its
    # first step (dynamo and inductor) cold, then warm
    if resume:
        find_result(check, "train")
    spec = check.sizes["train"]
    log_path = check.run_dir / f"{'resume' if resume else 'train'}.log"
    output, wall = timed(run_logged, check, train_argv(check, resume), log_path)
    log = plot.read_log(check.run_dir / "train_log" / "log.txt")
    first = spec["steps"] if resume else 0
    last = spec["steps"] + spec["more"] * resume
    ms = {s: v for s, v in log["ms"] if s >= first}
    loop_ms = statistics.median(v for s, v in ms.items() if s > first)
    micro = spec["total"] // (spec["B"] * spec["T"])
    step = find_result(check, f"step_B{spec['B']}", required=False)
    # against micro x stage c's step, each with its optimizer step where the loop has one: the
    # overhead reads low by an optimizer step's share (a few ms of a 124M step)
    overhead = step and loop_ms / (micro * step["ms"]) - 1
    ckpt = check.run_dir / "train_log" / f"model_{last:05d}.pt"
    found = dict(val="val" in log, hella="hella" in log, sample="sample 0: " in output)
    found["checkpoint"] = ckpt.is_file()
    missing = ", ".join(k for k, ok in found.items() if not ok)
    cache = "warm" if resume or check.warm_cache else "cold"
    result = dict(
        wall_s=wall,
        first_step_s=ms[first] / 1000,
        loop_ms=loop_ms,
        micro_steps=micro,
        overhead=overhead,
        found=found,
        train_loss=[log["train"][0][1], log["train"][-1][1]],
        summary=f"steps {first}-{last}: {loop_ms:.1f} ms/step ({micro} x B={spec['B']}),"
        f" {fmt(overhead, '+.1%')} over stage c; first step {ms[first] / 1000:.1f} s"
        f" ({cache} cache); {wall:.0f} s in all; val, HellaSwag, sample, checkpoint:"
        f" {'missing ' + missing if missing else 'all there'}",
    )
    if missing:
        result["problem"] = f"no {missing} in the run"
    if resume:
        # the trainer's checkpoints (1.5 GB each for GPT-2 124M) go once resumed from
        for path in (check.run_dir / "train_log").glob("model_*.pt"):
            path.unlink()
    return result


# -----------------------------------------------------------------------------
# the stages, their records and the table


@dataclasses.dataclass
class Stage:
    name: str
    group: str  # a to e (f is the table)
    seconds: tuple  # estimated: on one H200 cold, on one H200 warm, in the CPU smoke
    run: object  # run(check) -> a result dict with a "summary" line


def stages(mode):
    partial = functools.partial
    steps = [
        Stage(f"step_B{B}", "c", (60 if i == 0 else 45, 25, 6), partial(stage_step, B=B))
        for i, B in enumerate(SIZES[mode]["batches"])
    ]
    return [
        Stage("preflight", "a", (0, 0, 0), stage_preflight),
        Stage("correct_fp32", "b", (15, 15, 6), partial(stage_correct, variant="fp32")),
        Stage("correct_bf16", "b", (10, 10, 3), partial(stage_correct, variant="bf16")),
        Stage("correct_compiled", "b", (60, 25, 8), partial(stage_correct, variant="compiled")),
        *steps,
        Stage("val", "d", (35, 20, 5), stage_val),
        Stage("val_eager", "d", (12, 12, 3), partial(stage_val, eager=True)),
        Stage("hellaswag", "d", (30, 30, 3), stage_hellaswag),
        Stage("sample", "d", (5, 5, 2), stage_sample),
        Stage("checkpoint", "d", (15, 15, 2), stage_checkpoint),
        Stage("eval_share", "d", (0, 0, 0), stage_eval_share),
        Stage("corpus", "e", (10, 5, 5), stage_corpus),
        Stage("train", "e", (130, 70, 30), partial(stage_train, resume=False)),
        Stage("resume", "e", (75, 75, 30), partial(stage_train, resume=True)),
    ]


def find_result(check, name, required=True):
    # an earlier stage's result if it ran well; else Skip (or None)
    for entry in check.records:
        if entry["stage"] == name and entry["status"] == "ok":
            return entry["result"]
    if required:
        raise Skip(f"needs {name}, which did not run or failed")
    return None


def describe(entry):
    return entry.get("error") or entry.get("reason") or entry["result"]["summary"]


def table(check):
    head = check.records[0]
    lines = [
        f"**gpu_check** ({'GPU' if check.cuda else 'CPU smoke, toy sizes'}), {head['started']}:"
        f" {time.monotonic() - STARTED:.0f} s of the {head['deadline_s']:g} s deadline;"
        f" compile caches {'warm' if check.warm_cache else 'cold'} at the start",
        "",
        "| | stage | status | s | result |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for entry in check.records[1:]:
        row = [entry["group"], entry["stage"], entry["status"], fmt(entry.get("seconds"), ".1f")]
        lines.append("| " + " | ".join(row + [describe(entry).replace("|", "/")]) + " |")
    return "\n".join(lines) + "\n"


def record(check, entry):
    # appended and synced at once (a command killed later keeps it), then the table
    # rewritten; a stop signal or the deadline waits until both are written
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS + (signal.SIGALRM,))
    try:
        with open(check.run_dir / "results.jsonl", "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        check.records.append(entry)
        if len(check.records) > 1:
            write_text(check.run_dir / "table.md", table(check))
            name = f"{entry['group']} {entry['stage']}"
            print(f"[gpu_check] {name}: {entry['status']}: {describe(entry)}", flush=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def attempt(check, stage, chosen, stopped):
    # the stage's record: skipped (a stop, not chosen, too little time left) or run, the
    # deadline's alarm set meanwhile (the preflight always runs)
    estimate = stage.seconds[2 if not check.cuda else 1 if check.warm_cache else 0]
    left = check.deadline - time.monotonic()
    entry = dict(stage=stage.name, group=stage.group, estimate_s=estimate)
    if stopped:
        return dict(entry, status="skipped", reason=f"stopped by {stopped}")
    if stage.group not in chosen:
        return dict(entry, status="skipped", reason="not in --stages")
    if left < estimate and stage.group != "a":
        reason = f"needs ~{estimate:.0f} s, {max(left, 0):.0f} s left before the deadline"
        return dict(entry, status="skipped", reason=reason)
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, max(left, 0))
    try:
        result = stage.run(check)
        entry.update(status="failed" if "problem" in result else "ok", result=result)
        entry.update(error=result.get("problem"))
    except Skip as e:
        entry.update(status="skipped", reason=str(e))
    except Exception as e:
        message = " ".join(str(e).split())[:300]
        entry.update(status="failed", error=f"{type(e).__name__}: {message}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return dict(entry, seconds=time.monotonic() - t0)


def run_all(check, chosen):
    # every stage in order; the deadline cuts one stage off, a stop signal ends the run
    stopped = None
    for stage in stages(check.mode):
        try:
            entry = attempt(check, stage, chosen, stopped)
        except Stop as e:
            cause = "cut off at the deadline" if str(e) == "deadline" else f"stopped by {e}"
            stopped = stopped or (None if str(e) == "deadline" else str(e))
            entry = dict(stage=stage.name, group=stage.group, status="failed", error=cause)
        record(check, entry)
    return stopped


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        usage=argparse.SUPPRESS,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", help="output directory (default $GPU_CHECK_OUT, out/gpu_check)")
    p.add_argument("--deadline", type=float, default=510.0, help="seconds for it all (510)")
    p.add_argument("--cpu-smoke", action="store_true", help="every stage at toy sizes on a CPU")
    p.add_argument("--stages", default="bcde", help="the groups to run (bcde; a and f always)")
    p.add_argument("--compile", choices=["inductor", "eager", "false"], help="torch.compile")
    p.add_argument("--make-reference", action="store_true", help="write --reference and exit")
    reference = Path(__file__).resolve().parent / "gpu_reference.json"
    p.add_argument("--reference", type=Path, default=reference, help="the CPU's numbers")
    args = p.parse_args(argv)
    if not 0 < args.deadline < 1e6 or set(args.stages) - set("abcdef"):
        p.error("--deadline takes seconds > 0, --stages letters of bcde")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.make_reference:
        for name, case in make_reference(args.reference).items():
            print(f"{name}: losses {' '.join(f'{v:.5f}' for v in case['losses'])}")
        print(f"wrote {args.reference}")
        return
    if not args.cpu_smoke and not torch.cuda.is_available():
        why = "is a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU"
        sys.exit(f"{PROG}: error: torch {torch.__version__} {why}: run it on a GPU, or --cpu-smoke")
    out = Path(args.out or os.environ.get("GPU_CHECK_OUT") or "out/gpu_check").resolve()
    stamp = datetime.datetime.now().strftime("run_%Y%m%d_%H%M%S")
    run_dir = out / stamp if not (out / stamp).exists() else out / f"{stamp}_{os.getpid()}"
    run_dir.mkdir(parents=True)
    # fixed compile caches in --out, absolute (the trainer inherits them and runs elsewhere):
    # a second run is warm
    for key, name in [("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")]:
        os.environ[key] = str(Path(os.environ.get(key) or out / f"{name}_cache").resolve())
    inductor = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    triton = os.environ["TRITON_CACHE_DIR"]
    mode = "cpu" if args.cpu_smoke else "gpu"
    compile_mode = args.compile or ("eager" if args.cpu_smoke else "inductor")
    # warm: an earlier run of this torch compiled stage c's step into these caches
    warm_cache = warm_marker(out).exists()
    deadline = STARTED + args.deadline
    check = Check(mode, compile_mode, out, run_dir, deadline, warm_cache, args.reference)
    for sig in STOP_SIGNALS + (signal.SIGALRM,):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, raise_stop)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    head = dict(stage="run", mode=mode, compile=compile_mode, deadline_s=args.deadline)
    head.update(started=started, inductor_cache=inductor, triton_cache=triton)
    record(check, dict(head, warm_cache=warm_cache, argv=sys.argv[1:]))
    print(f"[gpu_check] {mode}: results in {run_dir} (deadline {args.deadline:g} s)", flush=True)
    stopped = run_all(check, "a" + args.stages)
    # all is written: a stop signal from here on waits for the end (and dies with it)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    print(table(check), end="", flush=True)
    failed = [e["stage"] for e in check.records[1:] if e["status"] == "failed"]
    if stopped:
        sys.exit(f"{PROG}: stopped by {stopped}; what ran is in {run_dir}")
    if failed:
        sys.exit(f"{PROG}: failed: {', '.join(failed)} (see {run_dir / 'results.jsonl'})")


if __name__ == "__main__":
    main()
