"""
HellaSwag scoring speed: examples/s batched vs one example (4 rows) per forward, same model, same examples.

    python scripts/bench_hellaswag.py                  # GPT-2 124M shape, random weights, 40 examples, CPU
    python scripts/bench_hellaswag.py --device cuda --batch_sizes 1 8 32

`bench_rows()` returns the table as dicts for a later bench.py. The model is random (no download): speed does
not depend on the weights. The synthetic examples have HellaSwag-like lengths (contexts of ~25-110 tokens,
endings of ~10-45), since padding and the lm_head cost both depend on them.
"""

from __future__ import annotations

import argparse
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


def synthetic_examples(n: int, seed: int = 0) -> list[dict]:
    """Random-word examples with HellaSwag-like lengths (about 1.2 tokens per word)."""
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    examples = []
    for i in range(n):
        ctx, endings = words(20, 90).capitalize() + ".", [words(8, 35) + "." for _ in range(4)]
        examples.append({"ind": i, "ctx": ctx, "endings": endings, "label": rng.randrange(4)})
    return examples


def time_scoring(model, examples, device: str, batch_size: int, autocast_dtype) -> float:
    """Seconds to score all examples once (rendering included, as evaluate does it)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    hellaswag.score_examples(model, examples, device, batch_size=batch_size, autocast_dtype=autocast_dtype)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_rows(
    n_examples: int = 40,
    batch_sizes: tuple[int, ...] = (1, 8),
    device: str = "cpu",
    dtype: str = "float32",
    repeats: int = 2,
    config: GPTConfig | None = None,
    seed: int = 0,
) -> list[dict]:
    """One row per batch size: best-of-`repeats` seconds, examples/s, and the speed-up over the first size."""
    torch.manual_seed(seed)
    model = GPT(config or GPTConfig()).to(device).eval()
    examples = synthetic_examples(n_examples, seed)
    autocast_dtype = torch.bfloat16 if dtype == "bfloat16" else None
    for batch_size in batch_sizes:  # warm-up: allocator, kernel selection, lazy imports
        time_scoring(model, examples[: min(len(examples), batch_size)], device, batch_size, autocast_dtype)
    best = {b: float("inf") for b in batch_sizes}
    for _ in range(repeats):  # interleaved, so a burst of load elsewhere hits every size alike
        for batch_size in batch_sizes:
            best[batch_size] = min(best[batch_size], time_scoring(model, examples, device, batch_size, autocast_dtype))
    base = n_examples / best[batch_sizes[0]]
    rows = []
    for batch_size in batch_sizes:
        rate = n_examples / best[batch_size]
        rows.append(
            dict(
                name=f"hellaswag_bs{batch_size}",
                device=device,
                dtype=dtype,
                threads=torch.get_num_threads(),
                batch_size=batch_size,
                examples=n_examples,
                seconds=best[batch_size],
                examples_per_s=rate,
                speedup=rate / base,
            )
        )
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'batch_size':>10} {'examples':>8} {'seconds':>8} {'examples/s':>10} {'speed-up':>8}"]
    for r in rows:
        cells = f"{r['batch_size']:>10} {r['examples']:>8} {r['seconds']:>8.2f} {r['examples_per_s']:>10.2f}"
        lines.append(f"{cells} {r['speedup']:>7.2f}x")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--examples", type=int, default=40, help="synthetic examples to score")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8], help="examples per forward; first = baseline")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=2, help="timed passes per batch size (best counts)")
    args = p.parse_args(argv)
    rows = bench_rows(args.examples, tuple(args.batch_sizes), args.device, args.dtype, args.repeats)
    print(f"GPT-2 124M shape (random weights), {args.device} {args.dtype}, {torch.get_num_threads()} threads")
    print(format_table(rows))


if __name__ == "__main__":
    main()
