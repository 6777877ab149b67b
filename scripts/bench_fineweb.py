"""
How fast fineweb.py tokenises, and what its main process costs: one command, one table.

    python scripts/bench_fineweb.py                      # --workers 1 and 2, a 100 MB file
    python scripts/bench_fineweb.py --workers 1,2,4 --mb 200 --dir /tmp/bench_fineweb
    python scripts/bench_fineweb.py --other /tmp/bn/fineweb.py   # side by side with another

The input is a FineWeb-Edu-like Parquet file that this script writes (once, into --dir, reused
while its size and seed are the same): documents of a few hundred to a few thousand words
(log-normal, median 600 words: FineWeb-Edu's sample-10BT averages about 1,000 tokens a
document), paragraphs of input.txt's lines taken from random places, in row groups of 1,000 rows
(as datatrove, which wrote FineWeb-Edu, writes them), snappy-compressed.

Each program runs as a process of its own, once on that file and once on a file of one
document (its fixed cost: start-up, imports, building tokenizers), both with --workers N. From
resource.getrusage: the main process's CPU seconds (all its threads) and its workers' (children,
counted once they are reaped), each per million tokens after the fixed cost; the peak resident
memory of the main process (VmHWM) and of its largest worker (with the pages it shares with the
main process, which forked it). tokens/s is over the wall time less the fixed cost's. CPU
seconds do not depend on what else the machine runs; wall times do (the load average is
printed).

The single-core rate is tiktoken's own, measured here on the file's first 20 MB of text: one
encode_ordinary call per document on the main thread (what a worker does), and, for comparison,
encode_ordinary_batch with 1 and 2 threads.

--other SCRIPT: another tokeniser of the same file, e.g. build-nanogpt's fineweb.py, adapted to
read the file named by $BENCH_PARQUET (rows of {"text": ...}), to use $BENCH_WORKERS processes
and to write its .npy shards into $BENCH_OUT. Its tokens are counted from those shards.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fineweb  # noqa: E402

# Runs a program as its __main__ and writes what getrusage says about it and its (reaped)
# workers into the file $BENCH_REPORT.
DRIVER = """
import json, os, resource, runpy, sys, time
start = time.perf_counter()
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
wall = time.perf_counter() - start
me = resource.getrusage(resource.RUSAGE_SELF)
workers = resource.getrusage(resource.RUSAGE_CHILDREN)
# the main process's peak since exec (its ru_maxrss would count the parent's before exec)
status = open("/proc/self/status").read().split("VmHWM:")[1].split()
report = dict(
    wall=wall,
    main_cpu=me.ru_utime + me.ru_stime,
    workers_cpu=workers.ru_utime + workers.ru_stime,
    main_rss_mb=int(status[0]) / 1024,
    worker_rss_mb=workers.ru_maxrss / 1024,
)
with open(os.environ["BENCH_REPORT"], "w") as f:
    json.dump(report, f)
"""


# documents of FineWeb-Edu's lengths from input.txt's lines: log-normal word counts (median
# 600, a few hundred to a few thousand), paragraphs of 3 to 12 lines from a random place
def make_documents(n, rng, lines):
    docs = []
    for _ in range(n):
        words = int(np.clip(rng.lognormal(np.log(600), 0.7), 100, 8000))
        at = int(rng.integers(0, len(lines)))
        paragraphs = []
        while words > 0:
            size = int(rng.integers(3, 13))
            paragraph = " ".join(lines[(at + k) % len(lines)] for k in range(size))
            paragraphs.append(paragraph)
            words -= len(paragraph.split())
            at += size
        docs.append("\n\n".join(paragraphs))
    return docs


# the benchmark's Parquet file of at least `mb` MB, written once
def make_parquet(path, mb, seed):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return path
    text = (ROOT / "input.txt").read_text()
    lines = [line.strip() for line in text.splitlines() if len(line.split()) > 3]
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".tmp")
    schema = pa.schema([("text", pa.string()), ("id", pa.string()), ("url", pa.string())])
    count = 0
    with pq.ParquetWriter(tmp, schema, compression="snappy") as writer:
        while tmp.stat().st_size < mb * 10**6:
            docs = make_documents(1000, rng, lines)
            ids = [f"<urn:uuid:{seed:04d}-{count + i:09d}>" for i in range(len(docs))]
            urls = [f"https://example.org/{seed}/{count + i}" for i in range(len(docs))]
            writer.write_table(pa.table({"text": docs, "id": ids, "url": urls}, schema=schema))
            count += len(docs)
    os.replace(tmp, path)
    return path


# tiktoken's rates on the file's first `mb` MB of text: tokens per CPU second of one
# encode_ordinary per document on this thread, and of encode_ordinary_batch's threads
def single_core_rates(path, mb):
    import pyarrow.parquet as pq

    docs = []
    for batch in pq.ParquetFile(path).iter_batches(columns=["text"]):
        docs += batch.column(0).to_pylist()
        if sum(len(d) for d in docs) > mb * 10**6:
            break
    enc = fineweb.get_tokenizer()
    rates = {}
    runs = {
        "encode_ordinary, one call per document": lambda: [enc.encode_ordinary(d) for d in docs],
        "encode_ordinary_batch, 1 thread": lambda: enc.encode_ordinary_batch(docs, num_threads=1),
        "encode_ordinary_batch, 2 threads": lambda: enc.encode_ordinary_batch(docs, num_threads=2),
    }
    for name, run in runs.items():
        wall = time.perf_counter()
        cpu = time.process_time()
        tokens = sum(len(ids) for ids in run())
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
        rates[name] = {"tokens": tokens, "per_cpu_s": tokens / cpu, "per_wall_s": tokens / wall}
    return rates


# a program run by DRIVER on the file, as a process of its own: getrusage's report
def measure(command, env, report):
    env = dict(os.environ, BENCH_REPORT=str(report), **env)
    argv = [sys.executable, "-c", DRIVER, *map(str, command)]
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_fineweb.py: error: {' '.join(map(str, command))}: {proc.stderr[-2000:]}")
    return json.loads(report.read_text())


# our fineweb.py on `parquet` with `workers`: (report, tokens)
def run_ours(parquet, workers, work):
    out = work / f"ours_{parquet.stem}_{workers}"
    args = ["--local", parquet, "--out_dir", out, "--workers", workers, "--overwrite"]
    report = measure(["fineweb.py", *args], {}, work / "report.json")
    return report, fineweb.load_corpus(out)["tokens"]


# the other program on `parquet` with `workers`: (report, tokens of its shards)
def run_other(script, parquet, workers, work):
    out = work / f"other_{parquet.stem}_{workers}"
    for shard in out.glob("*.npy"):
        shard.unlink()
    out.mkdir(exist_ok=True)
    env = {"BENCH_PARQUET": str(parquet), "BENCH_WORKERS": str(workers), "BENCH_OUT": str(out)}
    report = measure([script], env, work / "report.json")
    tokens = sum(len(np.load(p, mmap_mode="r")) for p in out.glob("*.npy"))
    return report, tokens


# one row of the table: the run on the big file less the fixed cost of the 1-document run
def row(name, workers, big, small, tokens):
    wall = big["wall"] - small["wall"]
    return {
        "program": name,
        "workers": workers,
        "tokens": tokens,
        "wall_s": round(big["wall"], 2),
        "tok_per_s": tokens / wall,
        "main_cpu_s_per_M": (big["main_cpu"] - small["main_cpu"]) / tokens * 1e6,
        "workers_cpu_s_per_M": (big["workers_cpu"] - small["workers_cpu"]) / tokens * 1e6,
        "main_rss_mb": big["main_rss_mb"],
        "worker_rss_mb": big["worker_rss_mb"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated (%(default)s)")
    parser.add_argument("--mb", type=int, default=100, help="Parquet file size (%(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", default="/tmp/bench_fineweb", help="work directory")
    parser.add_argument("--other", help="another tokeniser's script (see the docstring)")
    parser.add_argument("--other_name", default="other", help="its name in the table")
    parser.add_argument("--json", help="write the figures there too")
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    parquet = make_parquet(work / f"edu_like_{args.mb}mb_{args.seed}.parquet", args.mb, args.seed)
    one = work / "one_document.parquet"
    if not one.exists():
        pq.write_table(pa.table({"text": ["One short document."]}), one)
    documents = pq.ParquetFile(parquet).metadata.num_rows
    load = [round(x, 2) for x in os.getloadavg()]
    megabytes = parquet.stat().st_size / 1e6
    print(f"{parquet}: {megabytes:.0f} MB, {documents:,} documents; load average {load}")
    rates = single_core_rates(parquet, 20)
    for name, rate in rates.items():
        cpu = rate["per_cpu_s"] / 1e6
        wall = rate["per_wall_s"] / 1e6
        print(f"tiktoken, {name}: {cpu:.2f}M tokens per CPU second ({wall:.2f}M per second)")
    single = rates["encode_ordinary, one call per document"]["per_cpu_s"]
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        small, _ = run_ours(one, workers, work)
        big, tokens = run_ours(parquet, workers, work)
        rows.append(row("fineweb.py", workers, big, small, tokens))
        if args.other:
            small, _ = run_other(args.other, one, workers, work)
            big, tokens = run_other(args.other, parquet, workers, work)
            rows.append(row(args.other_name, workers, big, small, tokens))
    print()
    print(
        "| program | workers | tokens | wall s | tok/s | of workers x single core "
        "| main CPU s/M tok | workers' CPU s/M tok | main MB | worker MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ideal = r["tok_per_s"] / (r["workers"] * single)
        print(
            f"| {r['program']} | {r['workers']} | {r['tokens']:,} | {r['wall_s']:.1f} "
            f"| {r['tok_per_s'] / 1e6:.2f}M | {ideal:.0%} | {r['main_cpu_s_per_M']:.4f} "
            f"| {r['workers_cpu_s_per_M']:.3f} | {r['main_rss_mb']:.0f} "
            f"| {r['worker_rss_mb']:.0f} |"
        )
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\nload average at the end {load}; single core: {single / 1e6:.2f}M tokens per CPU s")
    if args.json:
        figures = {"load": load, "single_core": rates, "rows": rows}
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
