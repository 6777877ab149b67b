"""
Throughput of fineweb.py's pipeline against a plain one-document-at-a-time tokenizer loop.

    python scripts/bench_fineweb.py                 # input.txt replicated to ~4 MB, best of 3
    python scripts/bench_fineweb.py --mb 8 --repeats 5 --workers 1 2 4

Rows (all on the same documents, tokens counted as fineweb writes them: <|endoftext|> + text):
  baseline          `enc.encode_ordinary(doc)` in a Python loop over documents already in memory;
  encode_*_batch    tiktoken's threaded `encode_ordinary_batch` on the same list (why fineweb does not use it);
  fineweb w=N       fineweb.run_pipeline end to end: read the .txt, tokenise with N processes (the pool's
                    start-up included), write shards and manifest.json.
Each row is the best of --repeats runs, taken round-robin, which filters out noise from other processes.
"CPU s" adds the pool workers' CPU time: wall time shows what you wait for, CPU time what it costs.
`measure()` returns the rows, so other scripts can import it.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fineweb  # noqa: E402  (needs ROOT on sys.path)


def make_corpus(src: Path, dest: Path, mb: float) -> Path:
    """src repeated until it is about mb megabytes, copies separated like documents (two blank lines)."""
    text = src.read_text(encoding="utf-8").strip("\n")
    copies = max(1, round(mb * 1e6 / len(text.encode("utf-8"))))
    dest.write_text("\n\n\n".join([text] * copies) + "\n", encoding="utf-8")
    return dest


def _cpu_seconds() -> float:
    """CPU time of this process plus its finished children (pool workers are joined when the pool closes)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure(
    mb: float = 4.0,
    workers: tuple[int, ...] = (1, 2),
    repeats: int = 3,
    start_method: str | None = None,
    source: Path = ROOT / "input.txt",
) -> list[dict]:
    """One row per method: tokens, seconds and cpu_seconds (best of repeats), tokens_per_s, vs_baseline."""
    enc = fineweb.load_tokenizer()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fineweb-") as tmp:
        corpus = make_corpus(source, Path(tmp) / "corpus.txt", mb)
        docs = list(fineweb.iter_documents([corpus]))

        def baseline() -> int:
            return sum(1 + len(enc.encode_ordinary(doc)) for doc in docs)

        def threaded() -> int:
            return sum(1 + len(ids) for ids in enc.encode_ordinary_batch(docs))

        def pipeline(n: int):
            def run() -> int:
                out = Path(tempfile.mkdtemp(dir=tmp))
                manifest = fineweb.run_pipeline(
                    fineweb.iter_documents([corpus]), out, "bench", fineweb.DEFAULT_SHARD_SIZE, enc,
                    workers=n, start_method=start_method,
                )
                return manifest["total_tokens"]

            return run

        methods = [("baseline: encode_ordinary loop", baseline),
                   ("encode_ordinary_batch (8 threads)", threaded)]
        methods += [(f"fineweb pipeline, workers={n}", pipeline(n)) for n in workers]
        best = {name: (float("inf"), float("inf"), 0) for name, _ in methods}
        # Round-robin over methods, fastest run of each: load from other processes drifts during a run,
        # and this way it hits every method alike.
        for _ in range(repeats):
            for name, fn in methods:
                t0, c0 = time.perf_counter(), _cpu_seconds()
                tokens = fn()
                wall, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
                best[name] = (min(best[name][0], wall), min(best[name][1], cpu), tokens)
        for name, _ in methods:
            wall, cpu, tokens = best[name]
            rows.append({"method": name, "tokens": tokens, "seconds": wall, "cpu_seconds": cpu,
                         "tokens_per_s": tokens / wall, "docs": len(docs), "corpus_bytes": corpus.stat().st_size})
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["vs_baseline"] = row["tokens_per_s"] / base
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown table of measure()'s rows."""
    lines = ["| method | tokens | wall s | CPU s | tokens/s (wall) | vs baseline |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['tokens']:,} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} "
                     f"| {r['tokens_per_s']:,.0f} | {r['vs_baseline']:.2f}x |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4.0, help="corpus size in MB (default: %(default)s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="pipeline worker counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs per method; the fastest counts")
    parser.add_argument("--start_method", choices=["fork", "spawn", "forkserver"], help="for workers > 1")
    args = parser.parse_args(argv)

    rows = measure(args.mb, tuple(args.workers), args.repeats, args.start_method)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    r = rows[0]
    print(f"corpus: input.txt x{round(r['corpus_bytes'] / (ROOT / 'input.txt').stat().st_size)} = "
          f"{r['corpus_bytes'] / 1e6:.1f} MB, {r['docs']} documents; {cpus} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; best of {args.repeats}")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
