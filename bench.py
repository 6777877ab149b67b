"""
Throughput benchmarks of this project: one command, one table, one JSON file.

    python bench.py                          # CPU defaults: a small training model, GPT-2 124M generation (2 cores: minutes)
    python bench.py --threads 1              # the same on a machine shared with other jobs (steadier ratios)
    python bench.py --quick                  # tiny sizes, well under a minute (tests/test_bench.py runs this)
    python bench.py --preset gpt2-124M       # the GPU run: 124M, B=16 and 64, T=1024, bf16, torch.compile
    python bench.py --only train,generate --batch_size 8,16 --json out/bench.json

Sections (--only picks some; explicit flags override the preset):
  train      a full training step (forward, backward, grad clip, AdamW) on random tokens: ms/step, tok/s, MFU (GPU)
  generate   greedy decoding with and without the KV cache: tok/s, the speed-up, and that the tokens are identical
  hellaswag  HellaSwag scoring on synthetic examples: examples/s, one example per forward vs hellaswag.py's batched way
  loader     DataLoaderLite over synthetic uint16 shards: tok/s of next_batch, and memory against shard size
  fineweb    fineweb.py's pipeline vs a plain one-document-at-a-time tokenizer loop: tokens/s
  compare    whole `train_gpt2.py --preset NAME` runs of an older revision (--compare_rev) and of this tree,
             alternating: median ms/step, tok/s, the speed-up and the train losses' difference. Minutes, so only
             when asked for: python bench.py --only compare
  compile    the first torch.compile'd training step (graph capture, compilation and the step) of a 1-layer model at
             B x T = 64 x 1024 rows, with F.cross_entropy and with the chunked loss at 8 and at 64 chunks (the count
             before it was bounded): seconds, each in a fresh process with an empty compile cache. Minutes on a CPU,
             so only when asked for: python bench.py --only compile

Models have random weights: speed does not depend on them. Each timed quantity is the best (or median) of
repeated runs, interleaved across the variants compared, so load from other processes hits them alike; on a
shared machine compare rows of one run (the ratios), not numbers across runs.
Importing this module does nothing but define things.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import tracemalloc
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

import fineweb
import run_files
import train_gpt2
from run_files import ChunkedCrossEntropy, peak_flops
from train_gpt2 import GPT, GPTConfig, autocast_context, flops_per_token

HERE = Path(__file__).resolve().parent
SECTIONS = ("train", "generate", "hellaswag", "loader", "fineweb", "compare", "compile")
DEFAULT_SECTIONS = SECTIONS[:-2]  # compare and compile run whole programs for minutes: only when --only names them

# ----------------------------------------------------------------------------------------------------------
# Presets: every flag's value per preset; explicit flags override them.

PRESETS = {
    # A 2-core CPU in a few minutes, most of it 124M generation without a cache: a small GPT for training
    # and HellaSwag (the GPT-2 vocabulary, so the lm_head weighs as it does for real), 124M for generation.
    "cpu": dict(device="auto", dtype="float32", compile="false",
                n_layer=4, n_head=4, n_embd=256, vocab_size=50304, block_size=256,
                batch_size="4,8", seq_len=256, warmup_steps=2, steps=5,
                gen_shape="gpt2-124M", prompt_len=16, new_tokens=256, gen_batch=1, gen_repeats=1,
                hellaswag_examples=32, hellaswag_batch=8, hellaswag_repeats=1,
                loader_tokens="2000000,20000000", loader_batch=16, loader_seq=1024,
                fineweb_mb=4.0, fineweb_workers="1,2", fineweb_repeats=2),
    # Tiny everything: checks that every section runs, in seconds. The vocabulary stays GPT-2's because
    # HellaSwag examples are real GPT-2 token ids.
    "quick": dict(device="auto", dtype="float32", compile="false",
                  n_layer=2, n_head=2, n_embd=64, vocab_size=50304, block_size=256,
                  batch_size="2,4", seq_len=64, warmup_steps=1, steps=2,
                  gen_shape="train", prompt_len=16, new_tokens=32, gen_batch=1, gen_repeats=1,
                  hellaswag_examples=8, hellaswag_batch=4, hellaswag_repeats=1,
                  loader_tokens="200000,2000000", loader_batch=16, loader_seq=1024,
                  fineweb_mb=0.3, fineweb_workers="1", fineweb_repeats=1),
    # The reference GPU run: build-nanogpt's model and batch, bf16 autocast, compiled.
    "gpt2-124M": dict(device="cuda", dtype="bfloat16", compile="true",
                      n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024,
                      batch_size="16,64", seq_len=1024, warmup_steps=5, steps=20,
                      gen_shape="gpt2-124M", prompt_len=16, new_tokens=256, gen_batch=1, gen_repeats=3,
                      hellaswag_examples=256, hellaswag_batch="8,32", hellaswag_repeats=3,
                      loader_tokens="20000000,100000000", loader_batch=64, loader_seq=1024,
                      fineweb_mb=16.0, fineweb_workers="1,4,8", fineweb_repeats=2),
}


# ----------------------------------------------------------------------------------------------------------
# Small helpers: devices, timing, tables


def resolve_device(name: str) -> str:
    """train_gpt2's device check, with a hint for the GPU-sized preset."""
    try:
        return run_files.check_device(name)
    except ValueError as e:
        raise ValueError(f"{e}; the gpt2-124M preset is sized for a GPU: on a CPU run the default or --quick") from None


def device_description(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    model = platform.processor() or platform.machine()
    try:  # the marketing name is only in /proc/cpuinfo on Linux
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model}, {torch.get_num_threads()} threads"


def synchronize(device: str):
    """Wait for queued GPU work, so a host clock measures the work and not just its launch."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable, device: str):
    """(seconds, result) of one call, GPU work included."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - t0, result


def comma_ints(text: str) -> list[int]:
    try:
        values = [int(float(v)) for v in str(text).split(",") if v.strip()]  # float(): accepts 2e6
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def format_table(title: str, columns: list[tuple[str, str, str]], rows: list[dict]) -> str:
    """A fixed-width text table: columns are (key, header with unit, format spec); None prints as '-'."""
    cells = [[("-" if row.get(key) is None else format(row[key], spec)) for key, _, spec in columns] for row in rows]
    widths = [max([len(header)] + [len(r[i]) for r in cells]) for i, (_, header, _) in enumerate(columns)]
    # the first column (a name) is left-aligned, numbers right-aligned
    line = lambda values: "  ".join(v.ljust(w) if i == 0 else v.rjust(w)  # noqa: E731
                                    for i, (v, w) in enumerate(zip(values, widths)))
    out = [title, line([h for _, h, _ in columns]), line(["-" * w for w in widths])]
    return "\n".join(out + [line(r) for r in cells])


def progress(message: str):
    print(f"[bench] {message}", flush=True)  # stdout: stderr holds errors only


def model_config(args, shape: str) -> GPTConfig:
    """The model of the train section ('train': the --n_layer... flags) or GPT-2 124M with its real vocab."""
    if shape == "gpt2-124M":
        return GPTConfig()  # the defaults are GPT-2 124M
    return GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=args.vocab_size,
                     block_size=args.block_size)


def shape_text(config: GPTConfig, model: Optional[GPT] = None) -> str:
    params = f" ({model.num_params() / 1e6:.1f}M params)" if model is not None else ""
    return (f"n_layer={config.n_layer} n_head={config.n_head} n_embd={config.n_embd} vocab={config.vocab_size} "
            f"block={config.block_size}{params}")


# ----------------------------------------------------------------------------------------------------------
# train: one full optimizer step


def bench_train(args, device: str) -> dict:
    """ms/step and tok/s of forward + backward + clip + AdamW, per batch size; MFU where the peak is known."""
    config = model_config(args, "train")
    T, dtype, use_compile = args.seq_len, args.dtype, args.compile == "true"
    peak = peak_flops(device, args.peak_flops)
    rows, shape = [], ""
    for B in args.batch_size:
        progress(f"train: B={B} T={T} {dtype} compile={use_compile}")
        torch.manual_seed(args.seed)
        model = GPT(config).to(device)  # a fresh model per B: the peak memory is this B's alone
        shape = shape_text(config, model)
        (optimizer,) = model.configure_optimizers(weight_decay=0.1, learning_rate=6e-4, device_type=device)
        if use_compile:
            torch._dynamo.reset()  # forget the previous B's graphs: no recompile limits, no shapes marked dynamic
        # dynamic=False: one static graph for this (B, T), as in training, instead of a slower dynamic-shape one
        step_model = torch.compile(model, dynamic=False) if use_compile else model
        g = torch.Generator().manual_seed(args.seed)
        x = torch.randint(0, config.vocab_size, (B, T), generator=g).to(device)
        y = torch.randint(0, config.vocab_size, (B, T), generator=g).to(device)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

        def step():
            # The step of train_gpt2.train without grad accumulation: what a micro-batch costs end to end.
            optimizer.zero_grad(set_to_none=True)
            with autocast_context(device, dtype):
                _, loss = step_model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            return loss

        times = []
        for i in range(args.warmup_steps + args.steps):  # warm-up: compilation, allocator, kernel choice
            seconds, loss = timed(step, device)
            if i >= args.warmup_steps:
                times.append(seconds)
        if not torch.isfinite(loss):
            raise RuntimeError(f"train: non-finite loss {loss.item()} at B={B}")
        seconds = statistics.median(times)  # median: one step stalled by another process does not count
        tok_per_s = B * T / seconds
        flops_tok = flops_per_token(model, T)
        rows.append({"batch_size": B, "seq_len": T, "tokens_per_step": B * T, "ms_per_step": seconds * 1e3,
                     "ms_per_step_min": min(times) * 1e3, "tokens_per_s": tok_per_s,
                     "mfu": flops_tok * tok_per_s / peak if peak else None,
                     "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                     "flops_per_token": flops_tok})
        del model, optimizer, step_model, x, y
    return {"model": shape, "dtype": dtype, "compile": use_compile, "peak_flops": peak, "steps": args.steps,
            "warmup_steps": args.warmup_steps, "rows": rows}


def format_train(r: dict) -> str:
    title = (f"train step (forward+backward+clip+AdamW, median of {r['steps']} after {r['warmup_steps']} warm-up): "
             f"{r['model']}, {r['dtype']}, compile {str(r['compile']).lower()}")
    columns = [("batch_size", "B", "d"), ("seq_len", "T", "d"), ("tokens_per_step", "tokens/step", ",d"),
               ("ms_per_step", "ms/step", ".1f"), ("tokens_per_s", "tok/s", ",.0f"), ("mfu", "MFU", ".1%"),
               ("peak_mem_gb", "peak mem GiB", ".2f")]
    return format_table(title, columns, r["rows"])


# ----------------------------------------------------------------------------------------------------------
# generate: the KV cache against re-running the whole sequence


def bench_generate(args, device: str) -> dict:
    """Greedy decoding of new_tokens after a prompt_len prompt, with and without the KV cache."""
    config = model_config(args, args.gen_shape)
    torch.manual_seed(args.seed)
    model = GPT(config).to(device).eval()
    vocab = min(config.vocab_size, fineweb.GPT2_VOCAB_SIZE)
    g = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, vocab, (args.gen_batch, args.prompt_len), generator=g).to(device)
    progress(f"generate: {args.prompt_len}-token prompt + {args.new_tokens} new, batch {args.gen_batch}, "
             f"{config.n_layer} layers x {config.n_embd}")

    def run(use_cache: bool, n: int):
        with autocast_context(device, args.dtype):
            return model.generate(prompt, n, temperature=0.0, use_cache=use_cache, vocab_limit=vocab)

    for use_cache in (True, False):  # warm-up: allocator, kernel choice, lazy initialisation
        run(use_cache, 2)
    best, outputs = {False: float("inf"), True: float("inf")}, {}
    for _ in range(args.gen_repeats):  # interleaved, best of: load elsewhere hits both paths alike
        for use_cache in (False, True):
            seconds, outputs[use_cache] = timed(lambda: run(use_cache, args.new_tokens), device)
            best[use_cache] = min(best[use_cache], seconds)
    identical = torch.equal(outputs[False], outputs[True])
    new = args.gen_batch * args.new_tokens
    rows = [{"path": name, "new_tokens": new, "seconds": best[c], "tokens_per_s": new / best[c],
             "ms_per_step": best[c] * 1e3 / args.new_tokens, "speedup": best[False] / best[c]}
            for name, c in (("no cache", False), ("KV cache", True))]
    return {"model": shape_text(config, model), "dtype": args.dtype, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens, "batch": args.gen_batch, "repeats": args.gen_repeats,
            "speedup": best[False] / best[True], "identical": identical,
            # the cache covers the whole run only while the sequence fits the context
            "fits_block": args.prompt_len + args.new_tokens <= config.block_size, "rows": rows}


def format_generate(r: dict) -> str:
    title = (f"generation (greedy, prompt {r['prompt_len']} + {r['new_tokens']} new tokens, batch {r['batch']}, "
             f"best of {r['repeats']}): {r['model']}, {r['dtype']}")
    columns = [("path", "path", "s"), ("new_tokens", "new tokens", "d"), ("seconds", "seconds", ".2f"),
               ("tokens_per_s", "tok/s", ",.1f"), ("ms_per_step", "ms/step", ".1f"), ("speedup", "speed-up", ".2f")]
    note = (f"KV cache speed-up {r['speedup']:.2f}x; outputs token-identical: {'yes' if r['identical'] else 'NO'}"
            + ("" if r["fits_block"] else "; prompt + new tokens exceed block_size, so the window slides"))
    return format_table(title, columns, r["rows"]) + "\n" + note


# ----------------------------------------------------------------------------------------------------------
# hellaswag: scoring throughput, the straightforward way vs hellaswag.py's

WORDS = (
    "the a man woman person people dog ball house runs jumps quickly slowly then red blue under over river "
    "mountain cooks paints guitar plays water tree green small large bright opens closes window door kitchen "
    "knife bread slices carefully finally begins stops laughs camera shows continues while holding his her "
    "their onto into towards around several times again shown talking about using pieces wood floor wall"
).split()  # every one a single GPT-2 token after its space, so word counts are token counts
HELLASWAG_CONTEXT, HELLASWAG_ENDING = (60, 100), (15, 30)  # default token lengths (--hellaswag_context/_ending)


def synthetic_hellaswag(n: int, seed: int, context=HELLASWAG_CONTEXT, ending=HELLASWAG_ENDING) -> list[dict]:
    """Random-word examples whose context and ending token lengths are uniform over the (lo, hi) ranges given.
    Speed depends on lengths (padding, the shared context, the lm_head), not on words."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    return [{"ind": i, "ctx": "The " + words(rng.randint(*context) - 2) + ".",  # "The", words, ".": that many tokens
             "endings": [words(rng.randint(*ending) - 1) + "." for _ in range(4)],  # after a " "
             "label": rng.randrange(4)} for i in range(n)]


def bench_hellaswag(args, device: str) -> dict:
    """examples/s of the straightforward scoring (one example per forward, every row whole, logits everywhere)
    against hellaswag.py's default (packed rows, batched) at each --hellaswag_batch, same model and
    examples, and whether they agree. The model is the train section's shape."""
    config = model_config(args, "train")
    if config.vocab_size < fineweb.GPT2_VOCAB_SIZE:
        raise ValueError(f"hellaswag needs the GPT-2 vocabulary (>= {fineweb.GPT2_VOCAB_SIZE}), the model has {config.vocab_size}")
    longest = args.hellaswag_context[1] + args.hellaswag_ending[1]
    if config.block_size < longest:
        raise ValueError(f"hellaswag needs --block_size >= {longest} (the longest context + ending), got {config.block_size}")
    sizes = [1] + list(args.hellaswag_batch)  # the reference first: one example per forward
    lengths = f"context {'-'.join(map(str, args.hellaswag_context))}, endings {'-'.join(map(str, args.hellaswag_ending))} tokens"
    progress(f"hellaswag: {args.hellaswag_examples} synthetic examples ({lengths}), batch sizes {sizes}, "
             f"{config.n_layer} layers x {config.n_embd}")
    result = {"model": shape_text(config), "dtype": args.dtype, "repeats": args.hellaswag_repeats, "lengths": lengths}
    import hellaswag

    torch.manual_seed(args.seed)
    model = GPT(config).to(device).eval()
    # Count the tokens each way sends through the blocks and through lm_head: their matmul FLOPs (attention's
    # T^2 terms left out) show what the speed-up can be when the forward pass is compute-bound.
    tokens = {"blocks": 0, "head": 0}
    for name, module in (("blocks", model.transformer.h[0]), ("head", model.lm_head)):
        module.register_forward_hook(lambda m, inputs, out, name=name: tokens.update(
            {name: tokens[name] + inputs[0].numel() // config.n_embd}))
    flops_per = {"blocks": 2 * config.n_layer * 12 * config.n_embd ** 2, "head": 2 * config.vocab_size * config.n_embd}
    examples = synthetic_hellaswag(args.hellaswag_examples, args.seed, args.hellaswag_context, args.hellaswag_ending)
    autocast_dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    runs = [(b, i == 0) for i, b in enumerate(sizes)]  # (batch size, is the reference)

    def score(run, subset=examples):
        batch_size, reference = run
        return hellaswag.score_examples(model, subset, device, enc=fineweb.get_tokenizer(), batch_size=batch_size,
                                        autocast_dtype=autocast_dtype, packed=not reference)

    for run in runs:  # warm-up: allocator, kernel choice, the tokenizer's first load
        score(run, examples[: run[0]])
    best, results, flops = [float("inf")] * len(runs), [None] * len(runs), [0] * len(runs)
    for _ in range(args.hellaswag_repeats):  # interleaved, best of
        for i, run in enumerate(runs):
            tokens.update(blocks=0, head=0)
            seconds, results[i] = timed(lambda: score(run), device)
            best[i], flops[i] = min(best[i], seconds), sum(tokens[k] * flops_per[k] for k in tokens)
    ref_sum, ref_mean, _ = results[0]
    n, rows = len(examples), []
    for (batch_size, reference), seconds, f, (sum_loss, mean_loss, _) in zip(runs, best, flops, results):
        rows.append({"method": "one at a time, full logits (reference)" if reference else "packed rows, batched",
                     "batch_size": batch_size, "examples": n, "seconds": seconds, "examples_per_s": n / seconds,
                     "gflop_per_example": f / n / 1e9, "flop_ratio": flops[0] / f,
                     "speedup": best[0] / seconds, "max_loss_diff": (sum_loss - ref_sum).abs().max().item(),
                     # both predictions: acc (total loss) and acc_norm (mean loss per token)
                     "same_predictions": torch.equal(sum_loss.argmin(1), ref_sum.argmin(1))
                     and torch.equal(mean_loss.argmin(1), ref_mean.argmin(1))})
    return {**result, "model": shape_text(config, model),
            "same_predictions": all(row["same_predictions"] for row in rows), "rows": rows}


def format_hellaswag(r: dict) -> str:
    title = (f"HellaSwag scoring (synthetic examples: {r['lengths']}; best of {r['repeats']}): "
             f"{r['model']}, {r['dtype']}")
    columns = [("method", "method", "s"), ("batch_size", "examples/forward", "d"), ("examples", "examples", "d"),
               ("seconds", "seconds", ".2f"), ("examples_per_s", "examples/s", ".2f"),
               ("gflop_per_example", "GFLOP/example", ".1f"), ("flop_ratio", "FLOP ratio", ".2f"), ("speedup", "speed-up", ".2f"),
               ("max_loss_diff", "max loss diff", ".1e"), ("same_predictions", "same predictions", "")]
    rows = [{**row, "same_predictions": "yes" if row["same_predictions"] else "NO"} for row in r["rows"]]
    return format_table(title, columns, rows)


# ----------------------------------------------------------------------------------------------------------
# loader: DataLoaderLite speed and memory


def rss_bytes() -> tuple[Optional[int], Optional[int]]:
    """(resident set, its anonymous part) of this process. Mapped shard pages are resident but file-backed:
    the kernel can drop them at will, so only the anonymous part is memory the loader really holds."""
    try:
        import psutil
    except ImportError:
        return None, None
    info = psutil.Process().memory_info()
    shared = getattr(info, "shared", None)  # Linux: file-backed and shared pages
    return info.rss, (info.rss - shared if shared is not None else None)


def bench_loader(args, device: str) -> dict:
    """One epoch of next_batch over a synthetic shard per size: tok/s, and memory against the shard's size."""
    B, T = args.loader_batch, args.loader_seq
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        for n_tokens in args.loader_tokens:
            if n_tokens < B * T + 1:
                raise ValueError(f"--loader_tokens {n_tokens} is less than one batch of {B} x {T} + 1 tokens")
            root = Path(tmp) / f"n{n_tokens}"
            root.mkdir()
            rng = np.random.default_rng(args.seed)
            shard = [root / run_files.shard_name("bench", 1)]
            np.save(shard[0], rng.integers(0, fineweb.GPT2_VOCAB_SIZE, n_tokens, dtype=np.uint16))
            del rng
            progress(f"loader: {n_tokens:,}-token shard, B={B} T={T}")
            batches = (n_tokens - 1) // (B * T)  # one epoch: every token read once

            # Pass 1, timed, nothing else: tracing and RSS sampling would slow next_batch down (and
            # sampling would count in the traced peak), so each has its own pass over the same epoch.
            loader = train_gpt2.DataLoaderLite(shard, B, T, vocab_size=fineweb.GPT2_VOCAB_SIZE)
            t0 = time.perf_counter()
            for _ in range(batches):
                loader.next_batch()
            seconds = time.perf_counter() - t0
            del loader

            # Pass 2: the peak of Python/numpy allocations (numpy reports its buffers to tracemalloc).
            tracemalloc.start()
            loader = train_gpt2.DataLoaderLite(shard, B, T, vocab_size=fineweb.GPT2_VOCAB_SIZE)
            for _ in range(batches):
                loader.next_batch()
            traced_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            del loader

            # Pass 3: the resident set, sampled after every batch, from before the loader exists.
            rss0, anon0 = rss_bytes()
            peak_rss, peak_anon = rss0, anon0
            loader = train_gpt2.DataLoaderLite(shard, B, T, vocab_size=fineweb.GPT2_VOCAB_SIZE)
            for _ in range(batches):
                x, y = loader.next_batch()
                if rss0 is not None:
                    rss, anon = rss_bytes()
                    peak_rss = max(peak_rss, rss)
                    peak_anon = max(peak_anon, anon) if anon is not None else None
            del loader, x, y
            shard_bytes = 2 * n_tokens
            rows.append({"shard_tokens": n_tokens, "shard_mb": shard_bytes / 1e6, "batches": batches,
                         "tokens_per_s": batches * B * T / seconds, "ms_per_batch": seconds * 1e3 / batches,
                         "traced_peak_mb": traced_peak / 1e6, "traced_vs_shard": traced_peak / shard_bytes,
                         "rss_delta_mb": (peak_rss - rss0) / 1e6 if rss0 is not None else None,
                         "anon_delta_mb": (peak_anon - anon0) / 1e6 if anon0 is not None else None})
    return {"batch_size": B, "seq_len": T, "batch_mb": (B * T + 1) * 8 / 1e6, "rows": rows}


def format_loader(r: dict) -> str:
    title = (f"DataLoaderLite (B={r['batch_size']}, T={r['seq_len']}, one epoch of next_batch over a synthetic "
             f"uint16 shard; a batch is {r['batch_mb']:.2f} MB of int64, x and y views of it)")
    columns = [("shard_tokens", "shard tokens", ",d"), ("shard_mb", "shard MB", ".1f"), ("batches", "batches", "d"),
               ("tokens_per_s", "tok/s", ",.0f"), ("ms_per_batch", "ms/batch", ".3f"),
               ("traced_peak_mb", "traced peak MB", ".2f"), ("traced_vs_shard", "traced/shard", ".2%"),
               ("anon_delta_mb", "anon RSS +MB", ".1f"), ("rss_delta_mb", "RSS +MB", ".1f")]
    note = ("traced: tracemalloc peak (Python and numpy allocations); anon RSS: memory the process holds; "
            "RSS also counts the shard's memory-mapped pages, which the kernel reclaims at will")
    return format_table(title, columns, r["rows"]) + "\n" + note


# ----------------------------------------------------------------------------------------------------------
# fineweb: tokenizing throughput


def make_corpus(src: Path, dest: Path, mb: float) -> Path:
    """src repeated (or cut) to about mb megabytes, the copies separated like documents (two blank lines)."""
    text = src.read_text(encoding="utf-8").strip("\n")
    copies = round(mb * 1e6 / len(text.encode("utf-8")))
    body = "\n\n\n".join([text] * copies) if copies else text[: int(mb * 1e6)]  # input.txt is ASCII: chars = bytes
    dest.write_text(body + "\n", encoding="utf-8")
    return dest


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (a pool's workers are joined when it closes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def bench_fineweb(args, device: str) -> dict:
    """tokens/s of fineweb.run_pipeline (end to end, per worker count) against a plain encode loop."""
    import fineweb

    enc = fineweb.load_tokenizer()
    source = HERE / "input.txt"
    with tempfile.TemporaryDirectory(prefix="bench-fineweb-") as tmp:
        corpus = make_corpus(source, Path(tmp) / "corpus.txt", args.fineweb_mb)
        docs = list(fineweb.iter_documents([corpus]))
        progress(f"fineweb: {corpus.stat().st_size / 1e6:.1f} MB, {len(docs)} documents, workers {args.fineweb_workers}")

        # Tokens are counted as fineweb writes them: <|endoftext|> + the document's tokens.
        def baseline() -> int:  # what fineweb replaces: documents already in memory, one encode call each
            return sum(1 + len(enc.encode_ordinary(doc)) for doc in docs)

        def threaded() -> int:  # tiktoken's own thread pool (tiktoken 0.14 keeps the GIL: no help)
            return sum(1 + len(ids) for ids in enc.encode_ordinary_batch(docs))

        def pipeline(workers: int) -> Callable[[], int]:
            def run() -> int:  # end to end: read the .txt, tokenize, write shards and manifest (pool start-up included)
                out = Path(tempfile.mkdtemp(dir=tmp))
                manifest = fineweb.run_pipeline(fineweb.iter_documents([corpus]), out, "bench",
                                                fineweb.DEFAULT_SHARD_SIZE, enc, workers=workers)
                return manifest["total_tokens"]
            return run

        methods = [("baseline: encode_ordinary loop", baseline), ("encode_ordinary_batch (8 threads)", threaded)]
        methods += [(f"fineweb pipeline, workers={w}", pipeline(w)) for w in args.fineweb_workers]
        best = {name: (float("inf"), float("inf"), 0) for name, _ in methods}
        for _ in range(args.fineweb_repeats):  # interleaved, best of
            for name, fn in methods:
                t0, c0 = time.perf_counter(), cpu_seconds()
                tokens = fn()
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu), tokens)
        corpus_bytes = corpus.stat().st_size
    counts = {tokens for _, _, tokens in best.values()}
    if len(counts) != 1:
        raise RuntimeError(f"fineweb: the methods counted different numbers of tokens: {best}")
    rows = [{"method": name, "tokens": tokens, "seconds": wall, "cpu_seconds": cpu, "tokens_per_s": tokens / wall}
            for name, (wall, cpu, tokens) in best.items()]
    for row in rows:
        row["vs_baseline"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {"corpus_mb": corpus_bytes / 1e6, "documents": len(docs), "repeats": args.fineweb_repeats,
            "cpus": fineweb.available_cpus(), "rows": rows}


def format_fineweb(r: dict) -> str:
    title = (f"fineweb.py tokenizing (input.txt repeated to {r['corpus_mb']:.1f} MB, {r['documents']} documents, "
             f"{r['cpus']} CPUs, best of {r['repeats']})")
    columns = [("method", "method", "s"), ("tokens", "tokens", ",d"), ("seconds", "wall s", ".2f"),
               ("cpu_seconds", "CPU s", ".2f"), ("tokens_per_s", "tok/s (wall)", ",.0f"),
               ("vs_baseline", "vs baseline", ".2f")]
    note = "CPU s adds the pool workers' CPU time: wall time is what you wait for, CPU time what it costs"
    return format_table(title, columns, r["rows"]) + "\n" + note


# ----------------------------------------------------------------------------------------------------------
# compare: whole training runs of train_gpt2.py, an older revision against this tree

# bf16 keeps 8 significant bits (rounding error up to 2^-9, 0.2%, per value), and a run's rounding errors compound
# through the steps: on the shakespeare preset a bf16-autocast run's train loss is 1.5e-6 from fp32's at step 0 and
# 1.5e-5 at step 1, growing from there. 2e-2 is a loose bound that a real change of the computation (a wrong loss
# scale, a missing term) exceeds and rounding should not; with bf16 it is reported, never failed on.
COMPARE_BF16_RTOL = 2e-2


def git_commit(repo: Path, rev: str) -> str:
    """The full commit id of rev in repo; a one-line ValueError when git or the revision is missing."""
    if shutil.which("git") is None:
        raise ValueError(f"--compare_rev {rev}: git is not on PATH (compare reads the old revision with git archive)")
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()
        raise ValueError(f"--compare_rev {rev}: no such commit in {repo}" + (f" ({why[-1]})" if why else ""))
    return proc.stdout.strip()


def tree_label(repo: Path) -> str:
    """'this tree (HEAD abc1234)', '+ changes' when tracked files differ from HEAD."""
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"this tree (HEAD {head.stdout.strip()}{' + changes' if dirty else ''})"


def export_revision(repo: Path, commit: str, dest: Path):
    """The files of commit under dest, as `git archive` writes them: no network, no worktree to unregister."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")


def parse_train_stdout(text: str) -> tuple[list[dict], str]:
    """train_gpt2.py's step lines (`step N | loss L | ... | X ms | Y tok/s [| MFU Z]`, fields found by their
    label or unit, in any order) as dicts, and the autocast dtype its header lines name ('unknown' if none)."""
    steps, dtype = [], "unknown"
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if not re.fullmatch(r"step\s+\d+(/\d+)?", fields[0]):  # step N, or step N/total
            found = re.search(r"\b(bfloat16|float16|float32)\b", line)
            if found and not steps:  # the header, printed before the first step
                dtype = found.group(1)
            continue
        row = {"step": int(fields[0].split()[1].split("/")[0])}
        for f in fields[1:]:
            if f.startswith("loss "):
                row["loss"] = float(f.split()[1])
            elif f.endswith(" ms"):
                row["ms"] = float(f.split()[0])
            elif f.endswith(" tok/s"):
                row["tok_per_s"] = float(f.split()[0])
        if {"loss", "ms", "tok_per_s"} <= row.keys():  # not a skipped non-finite step
            steps.append(row)
    return steps, dtype


def run_trainer(tree: Path, label: str, args, data: Path, log_dir: Path, env: dict) -> dict:
    """One `train_gpt2.py --preset` run in tree, a fresh process: its step lines, dtype and wall time."""
    n = args.compare_steps
    cmd = [sys.executable, "train_gpt2.py", "--preset", args.compare_preset, "--data_root", str(data),
           "--log_dir", str(log_dir), "--max_steps", str(n), "--eval_interval", "0", "--sample_interval", "0",
           "--hellaswag_interval", "0", "--ckpt_interval", str(n), *shlex.split(args.compare_args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.compare_timeout)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:]
        raise RuntimeError(f"{label}: train_gpt2.py exited {proc.returncode}: {tail[0] if tail else 'no output'}")
    steps, dtype = parse_train_stdout(proc.stdout)
    if [s["step"] for s in steps] != list(range(n)):
        raise RuntimeError(f"{label}: expected step lines 0..{n - 1} on stdout, parsed {[s['step'] for s in steps]}")
    return {"steps": steps, "dtype": dtype, "seconds": seconds}


def bench_compare(args, device: str) -> dict:
    """ms/step of whole `train_gpt2.py --preset` runs, --compare_rev against this tree, and their train losses."""
    commit = git_commit(HERE, args.compare_rev)
    env = dict(os.environ)  # both trees run with the caller's environment, threads included
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    threads = f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}" if "OMP_NUM_THREADS" in env else "torch's default threads"
    old_label = args.compare_rev if commit.startswith(args.compare_rev) else f"{args.compare_rev} ({commit[:7]})"
    labels = {"old": old_label, "new": tree_label(HERE)}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        tmp = Path(tmp)
        trees = {"old": tmp / "old", "new": HERE}
        export_revision(HERE, commit, trees["old"])
        # One tokenisation by this tree's fineweb.py feeds both: the shard format is the old one.
        data = tmp / "data"
        proc = subprocess.run([sys.executable, str(HERE / "fineweb.py"), "--local", str(HERE / "input.txt"),
                               "--out_dir", str(data), "--no_progress"], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"fineweb.py failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        runs = {"old": [], "new": []}
        for r in range(args.compare_repeats):  # alternating, ABBA: drifting load hits both alike
            for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                progress(f"compare: run {r + 1}/{args.compare_repeats} of {labels[name]}: --preset "
                         f"{args.compare_preset} --max_steps {args.compare_steps} {args.compare_args}".rstrip())
                runs[name].append(run_trainer(trees[name], labels[name], args, data, tmp / f"log_{name}_{r}", env))

    rows = []
    for name in ("old", "new"):
        timed = [s for run in runs[name] for s in run["steps"][args.compare_skip:]]
        rows.append({"tree": labels[name], "dtype": runs[name][0]["dtype"], "timed_steps": len(timed),
                     "ms_per_step": statistics.median(s["ms"] for s in timed),
                     "ms_per_step_min": min(s["ms"] for s in timed),
                     "tokens_per_s": statistics.median(s["tok_per_s"] for s in timed),
                     "run_seconds": statistics.median(run["seconds"] for run in runs[name]),
                     "final_loss": runs[name][0]["steps"][-1]["loss"],
                     "losses": [s["loss"] for s in runs[name][0]["steps"]]})
    for row in rows:
        row["speedup"] = rows[0]["ms_per_step"] / row["ms_per_step"]

    def loss_diffs(pairs) -> tuple[float, float]:  # (max abs, max relative) over every step of every pair of runs
        d = [(abs(x["loss"] - y["loss"]), abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), abs(y["loss"]), 1e-12))
             for a, b in pairs for x, y in zip(a["steps"], b["steps"])]
        return max((v[0] for v in d), default=0.0), max((v[1] for v in d), default=0.0)

    abs_diff, rel_diff = loss_diffs([(a, b) for a in runs["old"] for b in runs["new"]])
    repeat_diff = max(loss_diffs([(runs[k][0], run) for run in runs[k][1:]])[0] for k in runs)
    fp32 = all(row["dtype"] == "float32" for row in rows)  # an exact comparison is only meaningful in fp32
    rtol = args.compare_rtol if fp32 else COMPARE_BF16_RTOL
    return {"rev": args.compare_rev, "commit": commit, "preset": args.compare_preset, "steps": args.compare_steps,
            "skip": args.compare_skip, "repeats": args.compare_repeats, "extra_args": args.compare_args,
            "threads": threads, "speedup": rows[1]["speedup"], "max_abs_loss_diff": abs_diff,
            "max_rel_loss_diff": rel_diff, "repeat_loss_diff": repeat_diff, "rtol": rtol, "enforced": fp32,
            "losses_match": rel_diff <= rtol, "rows": rows}


def format_compare(r: dict) -> str:
    extra = f" {r['extra_args']}" if r["extra_args"] else ""
    title = (f"whole training runs (train_gpt2.py --preset {r['preset']} --max_steps {r['steps']}{extra}; "
             f"{r['repeats']} alternating runs each, median ms/step of steps {r['skip']}..{r['steps'] - 1}; "
             f"{r['threads']})")
    columns = [("tree", "tree", "s"), ("dtype", "dtype", "s"), ("timed_steps", "steps timed", "d"),
               ("ms_per_step", "ms/step", ".1f"), ("ms_per_step_min", "min ms", ".1f"),
               ("tokens_per_s", "tok/s", ",.0f"), ("speedup", "speed-up", ".2f"),
               ("run_seconds", "run s", ".1f"), ("final_loss", "final loss", ".6f")]
    kind = "fp32" if r["enforced"] else "bf16 or unknown dtype: reported, not enforced"
    note = (f"speed-up {r['speedup']:.2f}x; train losses over {r['steps']} steps: max |diff| {r['max_abs_loss_diff']:.2e}"
            f" (relative {r['max_rel_loss_diff']:.1e}), tolerance {r['rtol']:.0e} relative ({kind}): "
            f"{'same' if r['losses_match'] else 'DIFFERENT'}")
    if r["repeat_loss_diff"]:
        note += f"; repeated runs of one tree differ by up to {r['repeat_loss_diff']:.2e} themselves"
    return format_table(title, columns, r["rows"]) + "\n" + note + "\nrun s: a whole process, start-up and checkpoint included"


# ----------------------------------------------------------------------------------------------------------
# compile: the cost of the first compiled step, against the chunked loss's number of chunks

COMPILE_CASES = (("F.cross_entropy (the default loss)", 0), ("chunked loss, at most 8 chunks (--chunked_loss)", 8),
                 ("chunked loss, 64 chunks of 1,024 rows (before the bound)", 64))


def compile_case(max_chunks: int, B: int, T: int, n_embd: int, vocab: int) -> dict:
    """In this process: a compiled 1-layer GPT's first training step (forward and backward) on (B, T) tokens, cold,
    then a second one; max_chunks 0 is GPT.forward's default loss, 8 its --chunked_loss, others the chunked loss at
    that bound (64 at B*T = 65,536 rows is the chunk count of 1,024-row chunks, as before the bound)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=T, vocab_size=vocab, n_layer=1, n_head=1, n_embd=n_embd))
    model.chunked_loss = max_chunks == 8

    def loss_of(x, y):
        if max_chunks in (0, 8):
            return model(x, y)[1]
        return ChunkedCrossEntropy.apply(model.features(x).flatten(0, 1), model.lm_head.weight, y.flatten(), True,
                                         max_chunks)

    step = torch.compile(loss_of)
    x, y = torch.randint(0, vocab, (B, T)), torch.randint(0, vocab, (B, T))
    seconds = []
    for _ in range(2):
        t0 = time.perf_counter()
        step(x, y).backward()
        seconds.append(time.perf_counter() - t0)
    return {"first_s": seconds[0], "second_s": seconds[1]}


def bench_compile(args, device: str) -> dict:
    """compile_case for each loss, each in a fresh process with an empty inductor cache (a cold start)."""
    B, T, C, V = 64, 1024, 64, 8192  # the gpt2-124M batch's rows; width and vocabulary do not change the graph's size
    rows = []
    for label, max_chunks in COMPILE_CASES:
        progress(f"compile: {label}")
        with tempfile.TemporaryDirectory(prefix="bench-compile-") as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            if args.threads:
                env["OMP_NUM_THREADS"] = str(args.threads)
            code = f"import bench, json; print(json.dumps(bench.compile_case({max_chunks}, {B}, {T}, {C}, {V})))"
            proc = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{label}: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
        chunks = 1 if max_chunks == 0 else min(max_chunks, B * T // 1024)
        rows.append({"loss": label, "chunks": chunks, **json.loads(proc.stdout.strip().splitlines()[-1])})
    for row in rows:
        row["vs_default"] = row["first_s"] / rows[0]["first_s"]
    return {"B": B, "T": T, "n_embd": C, "vocab": V, "rows": rows}


def format_compile(r: dict) -> str:
    title = (f"first compiled training step, cold (1-layer GPT, width {r['n_embd']}, vocab {r['vocab']:,}, "
             f"B x T = {r['B']} x {r['T']}; each in a fresh process with an empty compile cache)")
    columns = [("loss", "loss", "s"), ("chunks", "chunks", "d"), ("first_s", "first step s", ".1f"),
               ("second_s", "second step s", ".2f"), ("vs_default", "first vs default", ".2f")]
    return format_table(title, columns, r["rows"])


BENCHES = {"train": (bench_train, format_train), "generate": (bench_generate, format_generate),
           "hellaswag": (bench_hellaswag, format_hellaswag), "loader": (bench_loader, format_loader),
           "fineweb": (bench_fineweb, format_fineweb), "compare": (bench_compare, format_compare),
           "compile": (bench_compile, format_compile)}


# ----------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = run_files.Parser(prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--preset", choices=sorted(PRESETS), default="cpu", help="sizes of every section; flags override them")
    add("--quick", action="store_true", help="the same as --preset quick: tiny sizes, seconds")
    add("--only", default=",".join(DEFAULT_SECTIONS),
        help=f"comma-separated sections to run, of {','.join(SECTIONS)} (default: all but compare and compile)")
    add("--json", default="bench.json", help="where to write the results (atomically)")
    add("--device", choices=["auto", "cpu", "cuda"], help="auto: cuda if available, else cpu")
    add("--dtype", choices=["float32", "bfloat16"], help="autocast dtype of train, generate and hellaswag")
    add("--compile", choices=["true", "false"], help="torch.compile the training step")
    add("--seed", type=int, default=1337, help="seed of weights, tokens and synthetic data")
    add("--threads", type=int, default=0, help="CPU threads of torch (0: its default, one per core). On a machine "
        "shared with other jobs, 1 avoids threads waiting at every op for a sibling that was descheduled")
    g = p.add_argument_group("train")
    g.add_argument("--n_layer", type=int)
    g.add_argument("--n_head", type=int)
    g.add_argument("--n_embd", type=int)
    g.add_argument("--vocab_size", type=int)
    g.add_argument("--block_size", type=int)
    g.add_argument("--batch_size", type=comma_ints, help="micro-batch sizes B, e.g. 16,64")
    g.add_argument("--seq_len", type=int, help="sequence length T")
    g.add_argument("--warmup_steps", type=int, help="untimed steps first (compilation, allocator)")
    g.add_argument("--steps", type=int, help="timed steps; the median counts")
    g.add_argument("--peak_flops", type=run_files.finite_float, default=0.0,
                   help="peak FLOP/s for MFU (0: look up the GPU; none on CPU)")
    g = p.add_argument_group("generate and hellaswag (hellaswag scores the train section's model shape)")
    g.add_argument("--gen_shape", choices=["gpt2-124M", "train"], help="generation model: GPT-2 124M or the train flags' shape")
    g.add_argument("--prompt_len", type=int, help="prompt tokens")
    g.add_argument("--new_tokens", type=int, help="tokens to generate")
    g.add_argument("--gen_batch", type=int, help="sequences generated at once")
    g.add_argument("--gen_repeats", type=int, help="timed runs of each path; the fastest counts")
    g.add_argument("--hellaswag_examples", type=int, help="synthetic examples scored per run")
    g.add_argument("--hellaswag_batch", type=comma_ints, help="examples per forward of the batched runs, e.g. 8,32")
    g.add_argument("--hellaswag_context", type=comma_ints, default=HELLASWAG_CONTEXT,
                   help="LO,HI: context token lengths of the synthetic examples (LO >= 2)")
    g.add_argument("--hellaswag_ending", type=comma_ints, default=HELLASWAG_ENDING, help="LO,HI: ending token lengths")
    g.add_argument("--hellaswag_repeats", type=int, help="timed runs per batch size; the fastest counts")
    g = p.add_argument_group("loader and fineweb")
    g.add_argument("--loader_tokens", type=comma_ints, help="synthetic shard sizes in tokens, e.g. 2e6,2e7")
    g.add_argument("--loader_batch", type=int, help="B of the loader")
    g.add_argument("--loader_seq", type=int, help="T of the loader")
    g.add_argument("--fineweb_mb", type=run_files.finite_float, help="corpus size in MB (input.txt repeated)")
    g.add_argument("--fineweb_workers", type=comma_ints, help="worker counts of the pipeline runs")
    g.add_argument("--fineweb_repeats", type=int, help="runs per method; the fastest counts")
    g = p.add_argument_group("compare (whole train_gpt2.py runs; not in the default sections)")
    g.add_argument("--compare_rev", default="6f26f28", help="the older revision (any git commit-ish of this repo)")
    g.add_argument("--compare_preset", default="shakespeare", help="the train_gpt2.py --preset both trees run")
    g.add_argument("--compare_steps", type=int, default=20, help="--max_steps of every run")
    g.add_argument("--compare_skip", type=int, default=3, help="first steps of a run left out of the timing (warm-up)")
    g.add_argument("--compare_repeats", type=int, default=3, help="runs of each tree, alternating")
    g.add_argument("--compare_args", default="", help="more train_gpt2.py flags for both, e.g. '--dtype float32' "
                   "(write --compare_args='--flag value' when it is a single flag)")
    g.add_argument("--compare_rtol", type=run_files.finite_float, default=1e-5,
                   help="fp32 tolerance of the train losses' relative difference; over it, bench exits 1")
    g.add_argument("--compare_timeout", type=run_files.finite_float, default=3600, help="seconds one run may take")
    return p


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = build_parser()
    known = parser.parse_known_args(argv)[0]
    preset = "quick" if known.quick else known.preset
    if known.quick and known.preset not in ("cpu", "quick"):
        parser.error("--quick and --preset both choose the sizes; pass one of them")
    parser.set_defaults(**{k: (comma_ints(v) if k in ("batch_size", "hellaswag_batch", "loader_tokens", "fineweb_workers") else v)
                           for k, v in PRESETS[preset].items()})
    args = parser.parse_args(argv)
    args.preset = preset
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in SECTIONS]
    if unknown or not args.only:
        parser.error(f"--only: unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    positive = ["n_layer", "n_head", "n_embd", "vocab_size", "block_size", "seq_len", "steps", "prompt_len",
                "new_tokens", "gen_batch", "gen_repeats", "hellaswag_examples",
                "hellaswag_repeats", "loader_batch", "loader_seq", "fineweb_repeats"]
    for name in positive:
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    for name, least in (("hellaswag_context", 2), ("hellaswag_ending", 1)):  # context: at least "The" and "."
        lo_hi = getattr(args, name)
        if len(lo_hi) != 2 or not least <= lo_hi[0] <= lo_hi[1]:
            parser.error(f"--{name} must be LO,HI with {least} <= LO <= HI, got {','.join(map(str, lo_hi))}")
    if args.warmup_steps < 0 or args.threads < 0 or args.peak_flops < 0 or args.fineweb_mb <= 0:
        parser.error("--warmup_steps, --threads and --peak_flops must be >= 0, --fineweb_mb > 0")
    if args.n_embd % args.n_head:
        parser.error(f"--n_embd ({args.n_embd}) must be divisible by --n_head ({args.n_head})")
    if args.seq_len > args.block_size:
        parser.error(f"--seq_len ({args.seq_len}) exceeds --block_size ({args.block_size})")
    if args.gen_shape == "train" and args.prompt_len >= args.block_size:
        parser.error(f"--prompt_len ({args.prompt_len}) must be shorter than --block_size ({args.block_size})")
    if "compare" in args.only:
        if not 0 <= args.compare_skip < args.compare_steps or args.compare_repeats <= 0:
            parser.error("--compare_skip must be in [0, --compare_steps) and --compare_repeats positive, got "
                         f"{args.compare_skip}, {args.compare_steps}, {args.compare_repeats}")
        if args.compare_rtol < 0 or args.compare_timeout <= 0:
            parser.error("--compare_rtol must be >= 0 and --compare_timeout positive")
        try:
            shlex.split(args.compare_args)
        except ValueError as e:
            parser.error(f"--compare_args {args.compare_args!r}: {e}")
    blocked = next((p for p in Path(args.json).parents if p.exists() and not p.is_dir()), None)
    if blocked:  # found now, not after minutes of benchmarking
        parser.error(f"--json {args.json}: {blocked} is a file, not a directory")
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    """Run the selected sections, print their tables, write the JSON; exit 1 if a section failed or a check
    (identical tokens, same HellaSwag predictions in float32) did not hold."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        device = resolve_device(args.device)
        if "compare" in args.only:
            git_commit(HERE, args.compare_rev)  # a missing revision is found now, not after the other sections
    except ValueError as e:
        sys.exit(f"bench.py: error: {e}")
    if device == "cuda":  # as train_gpt2 trains: TF32 for any fp32 matmul left outside autocast
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    now = datetime.datetime.now(datetime.timezone.utc)
    header = (f"bench.py --preset {args.preset} | {device_description(device)} | torch {torch.__version__} | "
              f"{now:%Y-%m-%d %H:%M} UTC")
    results = {"header": header, "device": device_description(device), "torch": torch.__version__,
               "python": platform.python_version(), "date": now.isoformat(timespec="seconds"), "preset": args.preset,
               "args": {k: v for k, v in vars(args).items()}, "sections": {}}
    tables, failures = [], []
    for name in SECTIONS:
        if name not in args.only:
            continue
        bench, fmt = BENCHES[name]
        t0 = time.perf_counter()
        try:
            r = bench(args, device)
        except Exception as e:  # one broken section must not hide the others' numbers
            traceback.print_exc()
            r = {"error": f"{type(e).__name__}: {e}"}
            failures.append(f"{name}: {r['error']}")
        r["section_seconds"] = time.perf_counter() - t0
        results["sections"][name] = r
        tables.append(f"{name}: FAILED ({r['error']})" if "error" in r else fmt(r))
        # bf16 rounding differs between kernels of different shapes, so exact agreement is checked in float32 only
        if name == "generate" and "error" not in r and not r["identical"] and args.dtype == "float32":
            failures.append("generate: KV-cache and no-cache outputs differ")
        if name == "hellaswag" and "error" not in r and not r["same_predictions"] and args.dtype == "float32":
            failures.append("hellaswag: batched and one-at-a-time predictions differ")
        if name == "compare" and "error" not in r and r["enforced"] and not r["losses_match"]:
            failures.append(f"compare: fp32 train losses differ by {r['max_rel_loss_diff']:.1e} relative "
                            f"(tolerance {r['rtol']:.0e})")
    results["failures"] = failures
    print(header)
    print("=" * len(header))
    print("\n\n".join(tables))
    times = ", ".join(f"{name} {r['section_seconds']:.0f} s" for name, r in results["sections"].items())
    try:  # after the tables: a full disk loses the file, not the numbers
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        run_files.atomic_write(Path(args.json), lambda f: f.write(json.dumps(results, indent=1).encode() + b"\n"))
    except OSError as e:
        sys.exit(f"bench.py: error: could not write {args.json} ({run_files.write_error(e)}); the tables above are the results")
    print(f"\nwall time: {times}; wrote {args.json}")
    if failures:
        sys.exit("bench.py: " + "; ".join(failures))
    return results


if __name__ == "__main__":
    main()
