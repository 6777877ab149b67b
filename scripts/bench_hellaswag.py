"""
HellaSwag scoring speed: examples/s of the straightforward method, one example per forward, against ours
(hellaswag.py's default: shared context, lm_head only where scored, batched), same model, same examples.

    python scripts/bench_hellaswag.py                  # GPT-2 124M shape, random weights, 32 examples, CPU
    python scripts/bench_hellaswag.py --threads 1 --repeats 3
    python scripts/bench_hellaswag.py --device cuda --batch_sizes 1 8 32

`bench_rows()` returns the table as dicts (bench.py calls it). The model is random (no download): speed does
not depend on the weights. The synthetic examples have exact HellaSwag-like token lengths (contexts of 60-100
tokens, endings of 15-30), since the padding, the shared context and the lm_head cost all depend on them.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repo's modules

import hellaswag  # noqa: E402
from train_gpt2 import GPT, GPTConfig  # noqa: E402

WORDS = (
    "the a man woman person people dog ball house runs jumps quickly slowly then red blue under over river "
    "mountain cooks paints guitar plays water tree green small large bright opens closes window door kitchen "
    "knife bread slices carefully finally begins stops laughs camera shows continues while holding his her "
    "their onto into towards around several times again shown talking about using pieces wood floor wall"
).split()


def synthetic_examples(
    n: int, seed: int = 0, group: int = 16, context: tuple = (60, 100), ending: tuple = (15, 30)
) -> list[dict]:
    """Random-word examples with contexts of context[0]..context[1] tokens and endings of ending[0]..ending[1]
    (every word is one GPT-2 token after its space, so the lengths are exact). Contexts come in runs of `group`
    examples of one length: evaluate batches examples of equal context length, and in the 10,042 examples of
    the val set each length is shared by many, so its batches are full; a small random sample's would not be.
    The runs' lengths are evenly spaced over the range, so that their mean does not depend on the seed."""
    rng = random.Random(seed)
    runs = math.ceil(n / group)
    lengths = [round(context[0] + (context[1] - context[0]) * (r + 0.5) / runs) for r in range(runs)]
    rng.shuffle(lengths)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    examples = []
    for i in range(n):
        ctx = "The " + words(lengths[i // group] - 2) + "."  # "The", the words, ".": that many tokens
        endings = [words(rng.randint(*ending) - 1) + "." for _ in range(4)]  # rendered after a " "
        examples.append({"ind": i, "ctx": ctx, "endings": endings, "label": rng.randrange(4)})
    return examples


def time_scoring(model, examples, device: str, batch_size: int, autocast_dtype, shared_context: bool):
    """(seconds, score_examples' result) for scoring all examples once, rendering included as evaluate does."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = hellaswag.score_examples(
        model, examples, device, batch_size=batch_size, autocast_dtype=autocast_dtype, shared_context=shared_context
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def bench_rows(
    n_examples: int = 32,
    batch_sizes: tuple[int, ...] = (1, 8),
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 2,
    config: GPTConfig | None = None,
    seed: int = 0,
) -> list[dict]:
    """One row per batch size, the first scored the straightforward way (every row whole, logits everywhere:
    the baseline), the others hellaswag.py's way: best-of-`repeats` seconds, examples/s, the speed-up over the
    baseline, and the largest loss difference from it and whether every prediction (acc and acc_norm) agrees."""
    torch.manual_seed(seed)
    model = GPT(config or GPTConfig()).to(device).eval()
    # runs of one context length longer than a batch, as in the val set: evaluate sorts each run by its longest
    # ending, so a batch's rows are padded to about their own longest ending, not to the run's
    examples = synthetic_examples(n_examples, seed, group=2 * max(batch_sizes))
    autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
    runs = [(b, i == 0) for i, b in enumerate(batch_sizes)]  # (batch size, is the baseline)

    def measure(run, subset=examples):
        batch_size, baseline = run
        return time_scoring(model, subset, device, batch_size, autocast_dtype, shared_context=not baseline)

    for run in runs:  # warm-up: allocator, kernel selection, lazy imports, the tokenizer
        measure(run, examples[: run[0]])
    best, results = [float("inf")] * len(runs), [None] * len(runs)
    for _ in range(repeats):  # interleaved, so a burst of load elsewhere hits every method alike
        for i, run in enumerate(runs):
            seconds, results[i] = measure(run)
            best[i] = min(best[i], seconds)
    ref_sum, ref_mean, _ = results[0]
    rows = []
    for (batch_size, baseline), seconds, (sum_loss, mean_loss, _) in zip(runs, best, results):
        rows.append(
            dict(
                name=f"hellaswag_{'reference' if baseline else 'ours'}_bs{batch_size}",
                method="one at a time, full logits (reference)" if baseline else "shared context, batched (ours)",
                device=device,
                dtype=dtype,
                threads=torch.get_num_threads(),
                batch_size=batch_size,
                examples=n_examples,
                seconds=seconds,
                examples_per_s=n_examples / seconds,
                speedup=best[0] / seconds,
                max_loss_diff=(sum_loss - ref_sum).abs().max().item(),
                same_predictions=torch.equal(sum_loss.argmin(1), ref_sum.argmin(1))
                and torch.equal(mean_loss.argmin(1), ref_mean.argmin(1)),
            )
        )
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table (it goes into the README as printed)."""
    columns = ("method", "examples/batch", "examples", "seconds", "examples/s", "speed-up", "max loss diff",
               "same predictions")
    lines = ["| " + " | ".join(columns) + " |", "|---|--:|--:|--:|--:|--:|--:|:-:|"]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['batch_size']} | {r['examples']} | {r['seconds']:.2f} | {r['examples_per_s']:.2f} "
            f"| {r['speedup']:.2f}x | {r['max_loss_diff']:.1e} | {'yes' if r['same_predictions'] else 'NO'} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--examples", type=int, default=32, help="synthetic examples to score")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8],
                   help="examples per forward; the first runs the reference method (the baseline), the rest ours")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=2, help="timed passes per row (best counts)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = bench_rows(args.examples, tuple(args.batch_sizes), args.device, args.dtype, args.repeats)
    print(f"GPT-2 124M shape (random weights), {args.device} {args.dtype}, {torch.get_num_threads()} threads")
    print(format_table(rows))
    if not all(r["same_predictions"] for r in rows):
        sys.exit("bench_hellaswag.py: ours and the reference method predict differently")


if __name__ == "__main__":
    main()
