"""
How fast GPT trains and samples here: one command, one table.

    python bench.py                      # a GPU: GPT-2 124M; a CPU: a tiny GPT
    python bench.py --preset gpt2-124M --batch_sizes 16,32,64
    python bench.py --preset tiny --threads 1 --json out/bench.json

train: the training step of train_gpt2.py on random tokens at each
batch size B (forward and backward, bf16 autocast on CUDA, float32
elsewhere; gradient clipping; AdamW): the median ms/step after the
warm-up steps, tok/s, MFU (against peak_flops: the GPUs PEAK_FLOPS
knows) and the peak memory: allocated by torch on CUDA, on a CPU the
process's resident high-water mark (so it only grows down the table).
The last column is tok/s against the first row's.

generate: greedy decoding of --new_tokens after a 16-token prompt,
with the KV cache (GPT.generate) and without (the whole window re-run
for each token): ms and tok/s, and the speed-up of the cache.

Weights are random: speed does not depend on them. On a shared
machine compare the rows of one run, not numbers across runs.
"""

import argparse
import json
import os
import re
import resource
import signal
import statistics
import sys
import time
from pathlib import Path


# a stop signal: one line on stderr, no traceback; a hard exit, as
# nothing needs cleaning up (the JSON file is written at the end)
def stop(signum, frame):
    os.write(2, f"bench.py: stopped by {signal.Signals(signum).name}\n".encode())
    os._exit(128 + signum)


if __name__ == "__main__":
    # before torch loads: its import takes seconds
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        # one the program was started ignoring (nohup) stays so
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, stop)

import torch  # noqa: E402

import fineweb  # noqa: E402
from hellaswag import pick_device  # noqa: E402
from train_gpt2 import GPT, GPTConfig  # noqa: E402

# Dense bf16 peak FLOP/s of one GPU (vendors' datasheets), MFU's
# denominator; the first name that matches wins
PEAK_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("GH200", 989e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
]


def peak_flops(device):
    # one GPU's peak FLOP/s, or None (a CPU, an unknown GPU, a MIG
    # slice, which has a share of its GPU's peak)
    if not str(device).startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    if "MIG" in name:
        return None
    return next((peak for model, peak in PEAK_FLOPS if model in name), None)


PROMPT_TOKENS = 16  # of the generation section
GEN_REPEATS = 3  # timed runs of each way to generate (the median)

PRESETS = {
    # build-nanogpt's model and batch (vocab padded to 50,304)
    "gpt2-124M": dict(
        n_layer=12,
        n_head=12,
        n_embd=768,
        vocab_size=50304,
        seq_len=1024,
        batch_sizes=[16, 32, 64],
        steps=20,
        new_tokens=256,
    ),
    # train_gpt2.py's shakespeare_char recipe (65 characters)
    "shakespeare_char": dict(
        n_layer=4,
        n_head=4,
        n_embd=128,
        vocab_size=65,
        seq_len=64,
        batch_sizes=[12, 48],
        steps=10,
        new_tokens=64,
    ),
    # a CPU in seconds: checks that everything runs
    "tiny": dict(
        n_layer=2,
        n_head=2,
        n_embd=64,
        vocab_size=512,
        seq_len=64,
        batch_sizes=[4, 8],
        steps=5,
        new_tokens=32,
    ),
}

# -----------------------------------------------------------------------------
# helpers


def synchronize(device):
    # wait for the queued GPU work: a host clock then times the work
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    if device == "mps":
        torch.mps.synchronize()


def timed(fn, device):
    # seconds of one call, its GPU work included
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def reset_peak(device):
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device):
    # torch's peak allocation on CUDA; elsewhere the process's peak RSS
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux counts KiB, macOS bytes
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def flops_per_token(model, T):
    # 6 FLOPs per weight and token (forward and backward) plus attention's;
    # an embedding table only read by lookups (the position table; the
    # token table if the head is untied) does no matmul
    head = model.lm_head.weight
    n = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and m.weight is not head:
            n -= m.weight.numel()
    c = model.config
    return 6 * n + 12 * c.n_layer * c.n_embd * T


# -----------------------------------------------------------------------------
# train: one optimizer step


def bench_train(config, B, args, device):
    # one row: a fresh model, so the peak memory is this B's alone
    torch.manual_seed(args.seed)
    model = GPT(config).to(device)
    device_type = device.split(":")[0]
    (optimizer,) = model.configure_optimizers(0.1, 6e-4, device_type)
    step_model = model
    if args.compile == "true":
        # a static graph for this B, as in training
        torch._dynamo.reset()
        step_model = torch.compile(model, dynamic=False)
    T = config.block_size
    x = torch.randint(0, config.vocab_size, (B, T), device=device)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)
    bf16 = device_type == "cuda"

    def step():
        # train_gpt2.py's step, one micro-step
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, torch.bfloat16, enabled=bf16):
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    reset_peak(device)
    # warm-up: compilation, the allocator, kernel choices
    for _ in range(args.warmup):
        timed(step, device)
    times = [timed(step, device) for _ in range(args.steps)]
    seconds = statistics.median(times)
    tok_per_s = B * T / seconds
    peak = peak_flops(device)
    mfu = None
    if peak:
        mfu = flops_per_token(model, T) * tok_per_s / peak
    return {
        "run": f"train B={B}",
        "shape": f"{B} x {T}",
        "ms": seconds * 1000,
        "tok_per_s": tok_per_s,
        "mfu": mfu,
        "peak_mib": peak_mib(device),
    }


def train_row(config, B, args, device):
    # a batch too big for the GPU is a row that says so
    try:
        return bench_train(config, B, args, device)
    except torch.cuda.OutOfMemoryError:
        pass
    # (out of the except: its traceback holds the step's tensors)
    torch.cuda.empty_cache()
    return {"run": f"train B={B}: out of memory", "shape": f"{B} x {config.block_size}"}


# -----------------------------------------------------------------------------
# generate: the KV cache against re-running the window


@torch.no_grad()
def generate_uncached(model, idx, max_new_tokens):
    # the baseline: each new token re-runs the whole window
    for _ in range(max_new_tokens):
        window = idx[:, -model.config.block_size :]
        logits, _ = model(window)
        next_id = logits[:, -1].float().argmax(dim=-1, keepdim=True)
        idx = torch.cat((idx, next_id), dim=1)
    return idx


def bench_generate(config, args, device):
    # two rows (no cache, KV cache) and whether their tokens agree
    torch.manual_seed(args.seed)
    model = GPT(config).to(device).eval()
    shape = (1, PROMPT_TOKENS)
    prompt = torch.randint(0, config.vocab_size, shape, device=device)
    n = args.new_tokens
    ways = {
        "generate, no cache": lambda k: generate_uncached(model, prompt, k),
        "generate, KV cache": lambda k: model.generate(prompt, k, temperature=0.0),
    }
    # warm-up, and the tokens each way chose
    tokens = [fn(n) for fn in ways.values()]
    times = {name: [] for name in ways}
    reset_peak(device)
    # interleaved: load from elsewhere hits both alike
    for _ in range(GEN_REPEATS):
        for name, fn in ways.items():
            times[name].append(timed(lambda: fn(n), device))
    rows = []
    for name in ways:
        seconds = statistics.median(times[name])
        row = {"run": name, "shape": f"1 x {PROMPT_TOKENS}+{n}"}
        row["ms"] = seconds * 1000 / n  # a step: one token
        row["tok_per_s"] = n / seconds
        row["mfu"] = None
        row["peak_mib"] = peak_mib(device)
        rows.append(row)
    same = torch.equal(tokens[0], tokens[1])
    return rows, same


# -----------------------------------------------------------------------------
# the table and the command line


def add_ratios(rows):
    # tok/s against the first row's (of train, or of generation)
    for row in rows:
        if "tok_per_s" in row and "tok_per_s" in rows[0]:
            row["ratio"] = row["tok_per_s"] / rows[0]["tok_per_s"]


COLUMNS = [
    ("run", "run", "{}"),
    ("shape", "B x T", "{}"),
    ("ms", "ms/step", "{:.2f}"),
    ("tok_per_s", "tok/s", "{:,.0f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("peak_mib", "peak MiB", "{:,.0f}"),
    ("ratio", "vs first", "{:.2f}x"),
]


def markdown(rows):
    # a markdown table, padded for a terminal; blank: no value
    table = [[header for _, header, _ in COLUMNS]]
    for row in rows:
        cells = []
        for key, _, spec in COLUMNS:
            value = row.get(key)
            cells.append("" if value is None else spec.format(value))
        table.append(cells)
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = []
    for cells in table:
        padded = [c.ljust(w) for c, w in zip(cells, widths)]
        lines.append("| " + " | ".join(padded) + " |")
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines.insert(1, rule)
    return "\n".join(lines)


def positive_ints(text):
    # "16,32,64" -> [16, 32, 64]
    if not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", text):
        raise argparse.ArgumentTypeError(f"expected positive integers like 16,32, got {text!r}")
    return [int(v) for v in text.split(",")]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench.py",
        usage=argparse.SUPPRESS,
        description="Benchmark GPT's training step and generation.",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="gpt2-124M on a GPU, else tiny")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    p.add_argument("--batch_sizes", type=positive_ints, help="B of each train row")
    p.add_argument("--seq_len", type=int, help="T (also the model's block_size)")
    p.add_argument("--compile", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--steps", type=int, help="timed train steps (the median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--new_tokens", type=int, help="tokens generated")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    for name in ("seq_len", "steps", "new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if min(args.warmup, args.threads) < 0 or not 0 <= args.seed < 2**63:
        p.error("--warmup, --threads must be >= 0, --seed in 0 .. 2**63 - 1")
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", args.device):
        p.error("--device must be auto, cpu, cuda, cuda:N or mps")
    if args.json and Path(args.json).is_dir():
        p.error(f"--json {args.json} is a directory: name a file in it")
    return args


def run(args):
    # the results dict; the preset fills the flags not given
    device = pick_device(args.device)
    # on a machine shared with other jobs: fewer threads, steadier
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.json:
        # made now: a bad path fails before minutes of benchmarks
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    default = "gpt2-124M" if device.startswith("cuda") else "tiny"
    preset = PRESETS[args.preset or default]
    for key in ("batch_sizes", "seq_len", "steps", "new_tokens"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    config = GPTConfig(
        block_size=args.seq_len,
        vocab_size=preset["vocab_size"],
        n_layer=preset["n_layer"],
        n_head=preset["n_head"],
        n_embd=preset["n_embd"],
    )
    # auto: compiled on CUDA
    if args.compile == "auto":
        args.compile = "true" if device.startswith("cuda") else "false"
    if device.startswith("cuda"):
        # TF32 for what autocast leaves in float32, as in training
        torch.set_float32_matmul_precision("high")
    train = [train_row(config, B, args, device) for B in args.batch_sizes]
    add_ratios(train)
    generate, same = bench_generate(config, args, device)
    add_ratios(generate)
    return {
        "preset": args.preset or default,
        "device": device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": vars(config),
        "compile": args.compile,
        "dtype": "bfloat16" if device.startswith("cuda") else "float32",
        "steps": args.steps,
        "warmup": args.warmup,
        "same_tokens": same,
        "rows": train + generate,
    }


def main(argv=None):
    args = parse_args(argv)
    try:
        results = run(args)
        if args.json:
            text = json.dumps(results, indent=1)
            fineweb.write_atomic(Path(args.json), lambda f: f.write(text.encode()))
    except (ValueError, OSError, RuntimeError) as e:
        # one line, even for a library's multi-line message
        message = " ".join(str(e).split())
        sys.exit(f"bench.py: error: {message}")
    c = results["config"]
    shape = f"{c['n_layer']} layers x {c['n_embd']}, vocab {c['vocab_size']}"
    where = f"{results['device']}, torch threads {results['threads']}"
    how = f"train {results['dtype']}, compile {results['compile']}"
    print(f"bench.py --preset {results['preset']}: {shape}; {where}; {how}")
    print(markdown(results["rows"]))
    agree = "yes" if results["same_tokens"] else "no"
    print(f"greedy tokens with and without the KV cache the same: {agree}")


if __name__ == "__main__":
    main()
