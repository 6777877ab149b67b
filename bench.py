"""
How fast GPT trains, evaluates and samples here: one command, one table.

    python bench.py                      # a GPU: GPT-2 124M; a CPU: a tiny GPT
    python bench.py --preset gpt2-124M --batch_sizes 16,32,64
    python bench.py --preset tiny --threads 1 --json out/bench.json

train: the training step of train_gpt2.py on random tokens at each
batch size B (forward and backward, bf16 autocast and torch.compile
on CUDA, float32 elsewhere; gradient clipping; AdamW): the median
ms/step after the warm-up steps, tok/s, MFU (GPT.flops_per_token
against harness.py's peak_flops, on a GPU its table knows) and the
peak memory: allocated by torch on CUDA, on a CPU the process's
resident high-water mark (so it only grows down the table). The last
column is tok/s against the first row's.

evaluate: the trainer's evaluation, each piece as it runs it, at the
largest B: the val pass (eager, as the trainer runs it, and compiled
when the steps are), and with GPT-2's vocabulary HellaSwag on
synthetic examples of its lengths and 4 samples of 32 tokens; ms a
batch (a token for samples). gpt2-124M: one GPU's share of the
recipe's evaluation on 8 GPUs.

"first s" is what a first call takes beyond a later one: a compile,
cuDNN's graphs, kernel choices; paid once a process.

generate: greedy decoding of --new_tokens after a 16-token prompt,
with the KV cache (GPT.generate) and without (the whole window re-run
for each token): ms and tok/s, and the speed-up of the cache.

Above the table: the versions, the device, the SDPA backends that
run here and the peak FLOP/s. Weights are random: speed does not
depend on them. On a shared machine compare the rows of one run, not
numbers across runs. scripts/gpu_check.py uses this file's functions.
"""

import argparse
import json
import os
import platform
import re
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

# isort: split
# first: it loads torch, and Ctrl-C meanwhile ends the program in one line
import harness

# isort: split
import numpy as np
import torch
import torch.nn.functional as F

import fineweb
import hellaswag_eval
from train_gpt2 import (
    GPT,
    DataLoaderLite,
    GPTConfig,
    ModelConfig,
    TrainConfig,
    evaluate_val_loss,
    sample_texts,
)
from train_gpt2 import PRESETS as TRAIN_PRESETS

PROMPT_TOKENS = 16  # of the generation section
MODEL_FIELDS = ModelConfig.__dataclass_fields__  # n_layer, ..., bias: a preset's model
GEN_REPEATS = 3  # timed runs of each way to generate (the median)
# common words, one GPT-2 token each: HellaSwag-shaped text of known lengths
WORDS = "the of and to in is was for on that with as by at from his her he she it they we".split()

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
        # one GPU's share of the recipe's evaluation on 8: 20 of its 160 val batches, an eighth
        # of HellaSwag's 10,042 examples
        val_batches=20,
        hellaswag=1256,
    ),
    # train_gpt2.py's shakespeare_char recipe: its model (65 characters)
    "shakespeare_char": dict(
        **{k: v for k, v in TRAIN_PRESETS["shakespeare_char"].items() if k in MODEL_FIELDS},
        vocab_size=65,
        seq_len=64,
        batch_sizes=[12, 48],
        steps=10,
        new_tokens=64,
        val_batches=2,
        hellaswag=0,  # (another vocabulary)
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
        val_batches=2,
        hellaswag=0,
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


def environment(device):
    # what the numbers were measured with: the versions, the device, each SDPA backend that runs
    # a causal forward and backward here alone, and the peak FLOP/s of MFU
    from torch.nn.attention import SDPBackend, sdpa_kernel

    found = dict(python=platform.python_version(), torch=torch.__version__)
    found.update(cuda=torch.version.cuda, device=f"CPU ({os.cpu_count()} cores)")
    if device.startswith("cuda"):
        import triton

        p = torch.cuda.get_device_properties(device)
        found["device"] = f"{p.name} ({p.total_memory / 2**30:.0f} GiB, sm {p.major}.{p.minor})"
        found["triton"] = triton.__version__
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    q = torch.randn(1, 4, 256, 64, device=device, dtype=dtype, requires_grad=True)
    found["sdpa"] = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        try:
            with warnings.catch_warnings(), sdpa_kernel([getattr(SDPBackend, name)]):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            found["sdpa"].append(name.split("_")[0].lower())
        except RuntimeError:
            pass
    found["peak_flops"] = harness.peak_flops(device)
    return found


# -----------------------------------------------------------------------------
# train: one optimizer step


def train_step(config, B, backend, device, seed):
    # (model, step): a fresh seeded model, so that the peak memory is this B's alone, and
    # train_gpt2.py's optimization step at one micro-step on random tokens; backend: that of
    # torch.compile (inductor, as training on CUDA; eager: dynamo's trace alone) or None
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    device_type = device.split(":")[0]
    (optimizer,) = model.configure_optimizers(0.1, 6e-4, device_type)
    step_model = model
    if backend:
        # a static graph for this B, as in training
        torch._dynamo.reset()
        step_model = torch.compile(model, backend=backend, dynamic=False)
    T = config.block_size
    x = torch.randint(0, config.vocab_size, (B, T), device=device)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)
    bf16 = device_type == "cuda"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, torch.bfloat16, enabled=bf16):
            _, loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return model, step


def bench_train(model, step, B, steps, warmup, device):
    # one row: the first step (compilation, the allocator, kernel choices), then the median of
    # `steps` after `warmup` more
    T = model.config.block_size
    reset_peak(device)
    first = timed(step, device)
    for _ in range(warmup):
        timed(step, device)
    times = [timed(step, device) for _ in range(steps)]
    seconds = statistics.median(times)
    tok_per_s = B * T / seconds
    peak = harness.peak_flops(device)
    mfu = None
    if peak:
        mfu = model.flops_per_token(T) * tok_per_s / peak
    return {
        "run": f"train B={B}",
        "shape": f"{B} x {T}",
        "first_s": max(first - seconds, 0.0),
        "ms": seconds * 1000,
        "tok_per_s": tok_per_s,
        "mfu": mfu,
        "peak_mib": peak_mib(device),
    }


def train_row(config, B, args, device):
    # a batch too big for the GPU is a row that says so
    try:
        backend = "inductor" if args.compile == "true" else None
        model, step = train_step(config, B, backend, device, args.seed)
        return bench_train(model, step, B, args.steps, args.warmup, device)
    except torch.cuda.OutOfMemoryError:
        pass
    # (out of the except: its traceback holds the step's tensors)
    torch.cuda.empty_cache()
    return {"run": f"train B={B}: out of memory", "shape": f"{B} x {config.block_size}"}


# -----------------------------------------------------------------------------
# evaluate: the trainer's val pass, HellaSwag and samples


def forward_mfu(model, T, tok_per_s, device):
    # a forward pass's MFU: a third of a training step's FLOPs a token, at context T
    peak = harness.peak_flops(device)
    return model.flops_per_token(T) / 3 * tok_per_s / peak if peak else None


def bench_val(config, B, batches, backend, device, seed):
    # evaluate_val_loss over `batches` windows of random tokens, through the model compiled with
    # backend or the eager one; its first batch apart
    torch.manual_seed(seed)
    raw = GPT(config).to(device)
    model = raw
    if backend:
        # a graph of its own, as the trainer's eval mode gets one
        torch._dynamo.reset()
        model = torch.compile(raw, backend=backend, dynamic=False)
    T = config.block_size
    shard = np.random.default_rng(seed).integers(0, config.vocab_size, batches * B * T + 1)
    loader = DataLoaderLite([shard.astype(np.uint16)], B, T, device=device)
    amp = torch.bfloat16 if device.startswith("cuda") else None
    reset_peak(device)
    first = timed(lambda: evaluate_val_loss(model, loader, 1, amp), device)
    seconds = timed(lambda: evaluate_val_loss(model, loader, batches, amp), device)
    row = {"run": f"val, {'compiled' if backend else 'eager'}", "shape": f"{B} x {T}"}
    row.update(first_s=max(first - seconds / batches, 0.0), seconds=seconds)
    row.update(ms=seconds * 1000 / batches, tok_per_s=batches * B * T / seconds)
    row.update(mfu=forward_mfu(raw, T, row["tok_per_s"], device), peak_mib=peak_mib(device))
    return row


def synthetic_examples(n, block_size, seed):
    # HellaSwag-shaped examples of about its lengths, a word a token (assumed: the split is not
    # here): a third with contexts of 20-50 tokens and endings of 8-25, the rest 60-140 and
    # 15-50; rows of 107 tokens on average, 30 to 192; scaled down to fit a shorter block_size
    scale = min(block_size / 256, 1.0)
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(n):
        ctx, ending = ((20, 50), (8, 25)) if i % 3 == 0 else ((60, 140), (15, 50))
        texts = []
        for lo, hi in [ctx] + [ending] * 4:
            words = rng.choice(WORDS, rng.integers(max(1, int(lo * scale)), int(hi * scale) + 1))
            texts.append(" ".join(words) + ".")
        examples.append(dict(ctx=texts[0].capitalize(), endings=texts[1:], label=i % 4))
    return examples


def bench_hellaswag(config, n, device, seed):
    # hellaswag_eval.evaluate as the trainer runs it (the plain model, bf16 autocast on CUDA) on n
    # synthetic examples, rendered once: the first pass with its first calls (cuDNN's graphs,
    # one a row width), then ms a batch of the second
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    examples = synthetic_examples(n, config.block_size, seed)
    t0 = time.perf_counter()
    prepared = hellaswag_eval.prepare(examples, fineweb.get_tokenizer(), config.block_size)
    prepare_s = time.perf_counter() - t0
    amp = torch.bfloat16 if device.startswith("cuda") else None
    reset_peak(device)
    first = timed(
        lambda: hellaswag_eval.evaluate(model, prepared, device, autocast_dtype=amp), device
    )
    seconds = timed(
        lambda: hellaswag_eval.evaluate(model, prepared, device, autocast_dtype=amp), device
    )
    batches = -(-4 * n // hellaswag_eval.BATCH_ROWS)
    tokens = (prepared["start"] + prepared["count"]).sum().item()  # the rows' lengths
    row = {"run": "HellaSwag", "shape": f"{4 * n:,} rows of {tokens / 4 / n:.0f}"}
    row.update(first_s=max(first - seconds, 0.0), seconds=seconds, prepare_s=prepare_s)
    row.update(ms=seconds * 1000 / batches, tok_per_s=tokens / seconds)
    row["mfu"] = forward_mfu(model, tokens / 4 / n, row["tok_per_s"], device)
    return row


def bench_samples(config, device, seed):
    # train_gpt2.sample_texts as the trainer draws them on rank 0 (the plain model, float32)
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    recipe = TrainConfig()
    prompt = recipe.sample_prompt
    length = recipe.sample_length
    enc = fineweb.get_tokenizer()
    first = timed(lambda: sample_texts(model, enc, prompt, 4, length), device)
    seconds = timed(lambda: sample_texts(model, enc, prompt, 4, length), device)
    row = {"run": "samples", "shape": f"4 x {length}", "first_s": max(first - seconds, 0.0)}
    row["seconds"] = seconds
    row.update(ms=seconds * 1000 / length, tok_per_s=4 * length / seconds, mfu=None)
    return row


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
    ("first_s", "first s", "{:.2f}"),
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
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    p.add_argument("--new_tokens", type=int, help="tokens generated")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    # Every number checked before torch uses it: torch.set_num_threads(100000) ends the process
    # in a segmentation fault, and a typo's billion steps would run for days.
    cores = os.cpu_count()
    if not 0 <= args.threads <= cores:
        p.error(f"--threads must be 0 (torch's choice) to {cores}, this machine's CPUs")
    if args.batch_sizes and max(args.batch_sizes) > 4096:
        p.error("--batch_sizes must be 1 to 4,096 rows each: GPT-2's logits there take 400 GB")
    if args.seq_len is not None and not 1 <= args.seq_len <= 65536:
        p.error("--seq_len must be 1 to 65,536: a row's logits at GPT-2's vocabulary take 13 GB")
    if args.steps is not None and not 1 <= args.steps <= 10000:
        p.error("--steps must be 1 to 10,000: a median of dozens is steady, more runs for hours")
    if not 0 <= args.warmup <= 10000:
        p.error("--warmup must be 0 to 10,000: a few steps warm up, more run for hours")
    if args.new_tokens is not None and not 1 <= args.new_tokens <= 65536:
        p.error(
            "--new_tokens must be 1 to 65,536: without the cache each token re-runs the window,"
            " so more would run for hours"
        )
    if not 0 <= args.seed < 2**63:
        p.error("--seed must be 0 to 2**63 - 1")
    try:
        args.device = harness.pick_device(args.device)
    except ValueError as e:
        p.error(str(e))
    if args.json:
        args.json = check_json(p, args.json)
    return args


def check_json(parser, path):
    # --json names a file to write, or to replace: never a directory, a FIFO or a device (the
    # rename would put a file in its place), nor a path through a file; a file there only if it
    # is bench.py's own results, and never in a training run's log_dir or a corpus (a record or
    # a checkpoint replaced). Returns the path resolved: the write goes there, whatever a link on
    # it comes to point at meanwhile.
    path = fineweb.resolved(path)
    above = fineweb.claimed_by(path.parent)
    if above:
        parser.error(f"--json {path} is inside {above}: name a file elsewhere")
    if path.is_file() and not is_results(path):
        parser.error(f"--json {path} is a file but not bench.py's results: name a new file")
    if path.is_dir():
        parser.error(f"--json {path} is a directory: name a file in it")
    if path.exists() and not path.is_file():
        parser.error(f"--json {path} is not a regular file (a FIFO or a device?): name a file")
    # the nearest directory on its path that is there: made down to the file if missing
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        parser.error(
            f"--json {path}: {parent} is a file, not a directory: name a file in a directory"
        )
    return path


def is_results(path):
    # whether the file at path is what bench.py writes: a JSON object with its rows and
    # environment (read only when small, as such a file is)
    if path.stat().st_size > 2**24:
        return False
    try:
        results = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(results, dict) and {"rows", "environment"} <= results.keys()


def run(args):
    # the results dict; the preset fills the flags not given
    device = args.device
    # on a machine shared with other jobs: fewer threads, steadier
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.json:
        # made now: a bad path fails before minutes of benchmarks
        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"--json {args.json}: cannot make its directory: {e}") from None
    default = "gpt2-124M" if device.startswith("cuda") else "tiny"
    preset = PRESETS[args.preset or default]
    for key in ("batch_sizes", "seq_len", "steps", "new_tokens"):
        if getattr(args, key) is None:
            setattr(args, key, preset[key])
    # the preset's model fields (n_layer, ...), the rest GPTConfig's defaults (GPT-2's)
    shape = {k: v for k, v in preset.items() if k in MODEL_FIELDS}
    config = GPTConfig(block_size=args.seq_len, vocab_size=preset["vocab_size"], **shape)
    # auto: compiled on CUDA
    if args.compile == "auto":
        args.compile = "true" if device.startswith("cuda") else "false"
    if device.startswith("cuda"):
        # TF32 for what autocast leaves in float32, as in training
        torch.set_float32_matmul_precision("high")
    found = environment(device)
    train = [train_row(config, B, args, device) for B in args.batch_sizes]
    add_ratios(train)
    # evaluation at the largest B (the recipe's micro-batch, on a GPU); HellaSwag and the samples
    # in GPT-2's tokens
    B = max(args.batch_sizes)
    evaluate = [bench_val(config, B, preset["val_batches"], None, device, args.seed)]
    if args.compile == "true":
        evaluate.append(bench_val(config, B, preset["val_batches"], "inductor", device, args.seed))
    if preset["hellaswag"]:
        evaluate.append(bench_hellaswag(config, preset["hellaswag"], device, args.seed))
        evaluate.append(bench_samples(config, device, args.seed))
    generate, same = bench_generate(config, args, device)
    add_ratios(generate)
    return {
        "preset": args.preset or default,
        "device": device,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "environment": found,
        "config": vars(config),
        "compile": args.compile,
        "dtype": "bfloat16" if device.startswith("cuda") else "float32",
        "steps": args.steps,
        "warmup": args.warmup,
        "same_tokens": same,
        "rows": train + evaluate + generate,
    }


def report(results):
    # the results as lines for a terminal: the run, its environment, the table
    c = results["config"]
    shape = f"{c['n_layer']} layers x {c['n_embd']}, vocab {c['vocab_size']}"
    where = f"{results['device']}, torch threads {results['threads']}"
    how = f"train {results['dtype']}, compile {results['compile']}"
    found = results["environment"]
    peak = found["peak_flops"] and f"{found['peak_flops']:.3g}"
    versions = ", ".join(f"{k} {found.get(k)}" for k in ("python", "torch", "cuda", "triton"))
    agree = "yes" if results["same_tokens"] else "no"
    return [
        f"bench.py --preset {results['preset']}: {shape}; {where}; {how}",
        f"{found['device']}; {versions}; SDPA {', '.join(found['sdpa'])}; peak FLOP/s {peak}",
        markdown(results["rows"]),
        f"greedy tokens with and without the KV cache the same: {agree}",
    ]


def main(argv=None):
    args = parse_args(argv)
    try:
        results = run(args)
        # printed first: a --json that cannot be written loses none of the minutes; a closed
        # stdout (`| head`) ends the printing quietly, as in train_gpt2.py, and the file is written
        for line in report(results):
            fineweb.say(line)
        if args.json:
            text = json.dumps(results, indent=1)
            fineweb.write_atomic(Path(args.json), lambda f: f.write(text.encode()))
    except (ValueError, OSError, RuntimeError) as e:
        # one line, even for a library's multi-line message
        message = " ".join(str(e).split())
        sys.exit(f"bench.py: error: {message}")
    except KeyboardInterrupt:
        sys.exit("bench.py: interrupted; --json was not written")


if __name__ == "__main__":
    main()
