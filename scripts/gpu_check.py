"""
The GPU check (docs/benchmarks.md: its stages, and the command that runs it under a hard limit):
the trainer's GPU path on one GPU, each stage's result written (a JSON line, synced) as it ends.
A stage starts only if its estimate (one H200, cold caches) fits before --deadline; one that
fails records its one-line error and the next runs. --cpu-smoke: every stage at toy sizes on a
CPU. --make-reference: gpu_reference.json made again (a CPU, fp32) after an edit of the model.
"""

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import bench  # noqa: E402
import fineweb  # noqa: E402
import plot  # noqa: E402
import train_gpt2  # noqa: E402

SEED = 1337
REFERENCE = ROOT / "scripts" / "gpu_reference.json"
# the correctness cases, the GPU's and the smoke's: a fixed batch, then 3 AdamW steps
TINY = dict(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)
CASES = {
    "gpt2-124M": dict(model=dict(vocab_size=50304), B=2, T=128, lr=1e-4, steps=3),
    "tiny": dict(model=TINY, B=2, T=32, lr=1e-4, steps=3),
}
TIGHT = (1e-3, 1e-4)  # the logits' max abs and the losses' max relative difference: fp32
LOOSE = (0.05, 5e-3)  # bf16
# B=64 x T=1024 is the recipe's micro-batch, its val pass 160 of them (10,485,760 tokens); the
# HellaSwag val split has 10,042 examples; steps: the trainer's run before its resume
SIZES = {
    "gpu": dict(
        case="gpt2-124M", T=1024, batches=[64, 32, 16], val_batches=160, hellaswag=10042, steps=20
    ),
    "cpu": dict(case="tiny", T=32, batches=[4, 2, 1], val_batches=8, hellaswag=16, steps=4),
}


@dataclasses.dataclass
class Check:
    # one run: what its stages share
    sizes: dict  # SIZES' entry
    device: str  # cuda; cpu in the smoke
    backend: str  # torch.compile's: inductor; in the smoke eager (dynamo's trace alone)
    run_dir: Path
    deadline: float  # the time.monotonic() to end by
    results: dict = dataclasses.field(default_factory=dict)  # stage name -> its result

    def config(self):
        # the case's GPTConfig, its context T (as the trainer's is --seq_len)
        model = CASES[self.sizes["case"]]["model"]
        return train_gpt2.GPTConfig(**{**model, "block_size": self.sizes["T"]})


# -----------------------------------------------------------------------------
# correctness against the CPU's float32


def run_case(case, device, amp, backend):
    # the seeded model made on the CPU, then moved: a slice of its first logits (eager), and its
    # losses on a fixed batch before and after each of the case's AdamW steps
    spec = CASES[case]
    torch.manual_seed(SEED)
    raw = train_gpt2.GPT(train_gpt2.GPTConfig(**spec["model"]))
    # the init's checksum: its weights' sum of squares
    init = sum(float(p.detach().double().square().sum()) for p in raw.parameters())
    raw.to(device)
    model = torch.compile(raw, backend=backend, dynamic=False) if backend else raw
    optimizers = raw.configure_optimizers(0.1, spec["lr"], device)
    # x, y (B, T) laid out as DataLoaderLite lays them: one window of B*T + 1 tokens
    tokens = np.random.default_rng(SEED).integers(0, 50257, spec["B"] * spec["T"] + 1)
    buf = torch.from_numpy(tokens).to(device)
    x = buf[:-1].view(spec["B"], spec["T"])
    y = buf[1:].view(spec["B"], spec["T"])
    with torch.no_grad(), torch.autocast(device, torch.bfloat16, enabled=amp):
        logits = raw(x)[0][:, -2:, :8].float().flatten().tolist()  # (B * 2 * 8,)
    losses = []
    for step in range(spec["steps"] + 1):
        with torch.autocast(device, torch.bfloat16, enabled=amp):
            _, loss = model(x, y)
        losses.append(loss.item())
        if step < spec["steps"]:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
    return dict(init=init, losses=losses, logits=logits)


def stage_correct(check, variant):
    # variant: fp32 (TF32 off), bf16 (autocast), compiled (bf16 autocast, torch.compile); the
    # GPU against the reference file, the smoke against this CPU's fp32 (the file's numbers are
    # GPT-2's: tests/test_gpu_check.py compares them under gpt2_contract)
    case = check.sizes["case"]
    if check.device == "cuda":
        ref = json.loads(REFERENCE.read_text())["cases"][case]
        torch.set_float32_matmul_precision("highest" if variant == "fp32" else "high")
    else:
        ref = run_case(case, "cpu", False, None)
    backend = check.backend if variant == "compiled" else None
    got = run_case(case, check.device, variant != "fp32", backend)
    logits = max(abs(a - b) for a, b in zip(got["logits"], ref["logits"]))
    losses = max(abs(a - b) / b for a, b in zip(got["losses"], ref["losses"]))
    tolerances = TIGHT if variant == "fp32" else LOOSE
    result = dict(losses=got["losses"], logits_abs=logits, losses_rel=losses)
    if logits > tolerances[0] or losses > tolerances[1]:
        result["problem"] = f"out of tolerance {tolerances}"
    return result


# -----------------------------------------------------------------------------
# the training step and evaluation's pieces, each first call timed apart


def stage_step(check, B):
    # bench.py's step; then its SDPA kernel, from the op names of one more step's profile
    if check.device == "cuda":
        torch.set_float32_matmul_precision("high")  # the trainer's TF32
    model, step = bench.train_step(check.config(), B, check.backend, check.device, SEED)
    row = bench.bench_train(model, step, B, 10, 2, check.device)  # 10 timed after 2 more
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    names = " ".join(event.key for event in prof.key_averages())
    kernel = re.search(r"scaled_dot_product_(?:attention_)?(cudnn|flash|efficient|math)", names)
    return dict(row, attention=kernel.group(1) if kernel else "none seen")


def stage_val(check):
    # bench.py's val pass over the recipe's val tokens, eager (the trainer's way) and compiled
    # (its first batch: the eval-mode compile)
    B = check.sizes["batches"][0]
    batches = check.sizes["val_batches"]
    result = dict(tokens=batches * B * check.sizes["T"])
    for way, backend in [("eager", None), ("compiled", check.backend)]:
        row = bench.bench_val(check.config(), B, batches, backend, check.device, SEED)
        result[f"{way}_s"] = row["seconds"]
        result[f"{way}_first_s"] = row["first_s"]
        result[f"{way}_peak_mib"] = row["peak_mib"]
    # the trainer's pass must not raise the run's memory peak above the training step's
    step = check.results.get(f"step_B{B}")
    if check.device == "cuda" and step and result["eager_peak_mib"] > step["peak_mib"]:
        result["problem"] = "the eager pass's memory peak is above the training step's"
    return result


def stage_hellaswag(check):
    return bench.bench_hellaswag(check.config(), check.sizes["hellaswag"], check.device, SEED)


def stage_samples(check):
    return bench.bench_samples(check.config(), check.device, SEED)


def stage_eval_share(check):
    # The recipe on 8 GPUs (TrainConfig's defaults; max_steps of one B=64 micro-step a GPU): val
    # and HellaSwag split over the ranks, the samples on rank 0 while the others wait, the first
    # calls and HellaSwag's rendering once a process; and the same with val compiled.
    recipe = train_gpt2.TrainConfig()
    found = check.results
    intervals = [recipe.eval_interval, recipe.hellaswag_interval, recipe.sample_interval]
    counts = [len(range(0, recipe.max_steps, n)) + 1 if n else 0 for n in intervals]
    step_ms = found[f"step_B{check.sizes['batches'][0]}"]["ms"]
    result = dict(evaluations=counts, train_s=recipe.max_steps * step_ms / 1000)
    result["val_s"] = counts[0] * found["val"]["eager_s"] / 8
    result["hellaswag_s"] = counts[1] * found["hellaswag"]["seconds"] / 8
    result["samples_s"] = counts[2] * found["samples"]["seconds"]
    result["once_s"] = found["hellaswag"]["first_s"] + found["hellaswag"]["prepare_s"]
    result["once_s"] += found["val"]["eager_first_s"] + found["samples"]["first_s"]
    evaluation = result["val_s"] + result["hellaswag_s"] + result["samples_s"] + result["once_s"]
    result["share"] = evaluation / (evaluation + result["train_s"])
    # val compiled instead: its passes, and its eval-mode compile once a process
    evaluation += counts[0] * found["val"]["compiled_s"] / 8 + found["val"]["compiled_first_s"]
    evaluation -= result["val_s"] + found["val"]["eager_first_s"]
    result["share_val_compiled"] = evaluation / (evaluation + result["train_s"])
    return result


# -----------------------------------------------------------------------------
# the trainer under torchrun


def run_logged(check, argv, name):
    # argv to its end, its output in run_dir/name; `timeout` stops it at the deadline (SIGTERM,
    # then SIGKILL 10 s later); a failure is told by its last error line
    left = max(check.deadline - time.monotonic(), 1)
    with open(check.run_dir / name, "w") as f:
        argv = ["timeout", "-k", "10", f"{left:.0f}", *map(str, argv)]
        code = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
    lines = (check.run_dir / name).read_text(errors="replace").splitlines() or ["no output"]
    errors = [line for line in lines if ": error: " in line or "Error" in line]
    if code in (124, 137):
        raise TimeoutError(f"stopped at the deadline; its output: {name}")
    if code:
        raise RuntimeError(f"exit {code}: {(errors or lines)[-1].strip()[:300]}")
    return "\n".join(lines)


def stage_train(check, resume):
    # torchrun train_gpt2.py --preset gpt2-124M on one rank, 2 micro-steps of stage step's first
    # B, on input.txt in GPT-2's tokens (its first 100,000 val): 20 steps (4 in the smoke),
    # every evaluation at the half and at the end, a checkpoint at the end; resume: half as many
    # steps more from it
    B = check.sizes["batches"][0]
    steps = check.sizes["steps"]
    every = steps // 2
    T = check.sizes["T"]
    data = check.run_dir / "corpus"
    if not resume:
        argv = ["fineweb.py", "--local", "input.txt", "--out_dir", data, "--shard_size", 100000]
        run_logged(check, [sys.executable, *argv], "fineweb.log")
        examples = bench.synthetic_examples(100 if check.device == "cuda" else 8, T, SEED)
        lines = "".join(json.dumps(example) + "\n" for example in examples)
        (check.run_dir / "hellaswag.jsonl").write_text(lines)
    log_dir = check.run_dir / "train_log"
    flags = dict(data_root=data, log_dir=log_dir, max_steps=steps + every * resume)
    flags.update(total_batch_size=2 * B * T, val_tokens=B * T, eval_interval=every)
    flags.update(hellaswag_interval=every, sample_interval=every, resume="auto" if resume else "")
    flags.update(hellaswag_data=check.run_dir / "hellaswag.jsonl")
    if check.device == "cpu":
        # toy sizes, and no curves.png (matplotlib's picture takes seconds of a small CPU)
        flags.update(batch_size=B, seq_len=T, n_layer=2, n_head=2, n_embd=32, curves="false")
    # the rendezvous on the loopback: a GPU box offline may not resolve its own hostname
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr=127.0.0.1"]
    argv += ["--nproc_per_node=1", "train_gpt2.py", "--preset", "gpt2-124M"]
    argv += [f"--{k}={v}" for k, v in flags.items()]
    t0 = time.monotonic()
    output = run_logged(check, argv, "resume.log" if resume else "train.log")
    series = plot.read_log(log_dir / "log.txt")
    ms = [v for s, v in series["ms"] if s >= steps * resume]
    result = dict(wall_s=time.monotonic() - t0, first_step_s=ms[0] / 1000)
    result["loop_ms"] = statistics.median(ms[1:])
    # against stage step's, twice (the loop's 2 micro-steps)
    result["overhead"] = result["loop_ms"] / (2 * check.results[f"step_B{B}"]["ms"]) - 1
    seen = dict(val="val" in series, hella="hella" in series, sample="sample 0: " in output)
    seen.update(resumed="resumed from" in output or not resume)
    missing = [name for name, ok in seen.items() if not ok]
    if missing:
        result["problem"] = f"no {', '.join(missing)} in its output"
    return result


# -----------------------------------------------------------------------------
# the reference, the stages, their records and the table


def make_reference():
    # every case in float32 on the CPU: the numbers the GPU runs are held to
    cases = {name: {**spec, **run_case(name, "cpu", False, None)} for name, spec in CASES.items()}
    made = dict(torch=torch.__version__, python=sys.version.split()[0], dtype="float32")
    text = json.dumps({"made_with": made, "cases": cases}, indent=1) + "\n"
    fineweb.write_atomic(REFERENCE, lambda f: f.write(text.encode()))


def stages(check):
    # (name, estimated seconds on one H200 with cold caches, run(check) -> a result dict, with
    # "problem" if it failed)
    return [
        ("preflight", 5, lambda check: bench.environment(check.device)),
        ("correct_fp32", 10, partial(stage_correct, variant="fp32")),
        ("correct_bf16", 5, partial(stage_correct, variant="bf16")),
        ("correct_compiled", 50, partial(stage_correct, variant="compiled")),
        *[(f"step_B{B}", 60, partial(stage_step, B=B)) for B in check.sizes["batches"]],
        ("val", 50, stage_val),
        ("hellaswag", 40, stage_hellaswag),
        ("samples", 5, stage_samples),
        ("eval_share", 1, stage_eval_share),
        ("train", 120, partial(stage_train, resume=False)),
        ("resume", 60, partial(stage_train, resume=True)),
    ]


def run_stage(check, name, estimate, run):
    # the stage's record: skipped (too little time left), its result, or its error in one line
    t0 = time.monotonic()
    if estimate > check.deadline - t0 and name != "preflight":
        reason = f"needs ~{estimate} s, {check.deadline - t0:.0f} s left before the deadline"
        return dict(stage=name, status="skipped", reason=reason)
    try:
        result = run(check)
    except Exception as e:
        error = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return dict(stage=name, status="failed", seconds=time.monotonic() - t0, error=error)
    check.results[name] = result
    status = "failed" if "problem" in result else "ok"
    return dict(stage=name, status=status, seconds=time.monotonic() - t0, result=result)


def row(entry):
    # the table's row of a record
    said = entry.get("error") or entry.get("reason")
    if said is None:
        said = ", ".join(f"{k} {shown(v)}" for k, v in entry["result"].items())
    return f"| {entry['stage']} | {entry['status']} | {shown(entry.get('seconds', '-'))} | {said} |"


def shown(value):
    # numbers to 4 significant digits
    if isinstance(value, list):
        return " ".join(map(shown, value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv=None):
    p = argparse.ArgumentParser(prog="gpu_check.py", usage=argparse.SUPPRESS, description=__doc__)
    p.add_argument("--out", default="out/gpu_check", help="where run_{time}/ goes")
    p.add_argument("--deadline", type=float, default=510.0, help="seconds for it all (510)")
    p.add_argument("--cpu-smoke", action="store_true", help="every stage at toy sizes on a CPU")
    p.add_argument("--make-reference", action="store_true", help="write gpu_reference.json")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.deadline
    if not 0 < args.deadline <= 3600:
        p.error("--deadline must be 0 to 3600 seconds")
    if args.make_reference:
        return make_reference()
    if not args.cpu_smoke and not torch.cuda.is_available():
        p.error(f"torch {torch.__version__} sees no CUDA GPU: run it on one, or --cpu-smoke")
    mode = "cpu" if args.cpu_smoke else "gpu"
    out = Path(args.out).resolve()
    owner = fineweb.claimed_by(out)
    if owner:
        p.error(f"--out {args.out} is inside {owner}: give a directory outside it")
    run_dir = out / time.strftime("run_%Y%m%d_%H%M%S")
    run_dir.mkdir(parents=True)
    backend = "eager" if args.cpu_smoke else "inductor"
    check = Check(SIZES[mode], "cpu" if args.cpu_smoke else "cuda", backend, run_dir, deadline)
    table = [f"gpu_check {mode}, {time.strftime('%F %T')}: {run_dir}", ""]
    table += ["| stage | status | s | result |", "| --- | --- | ---: | --- |"]
    print(table[0], flush=True)
    failed = []
    for name, estimate, run in stages(check):
        entry = run_stage(check, name, estimate, run)
        # appended and synced at once: a run stopped later keeps it
        with open(run_dir / "results.jsonl", "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        table.append(row(entry))
        print(table[-1], flush=True)
        if entry["status"] == "failed":
            failed.append(name)
    (run_dir / "table.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    if failed:
        sys.exit(f"gpu_check.py: failed: {', '.join(failed)} (see {run_dir / 'results.jsonl'})")


if __name__ == "__main__":
    main()
