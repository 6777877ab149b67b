#!/usr/bin/env bash
# The GPU path in one run (sized for under 8 minutes on one H200; not yet timed on one), ending in one markdown table:
#   0. a preflight that fails in seconds naming what is missing: Python, a CUDA build of torch that sees a GPU, the
#      Python modules the stages import, a C compiler and Python's headers (Triton builds with them), free GPU memory
#   1. bench.py's GPT-2 124M training step at B=16 and B=64, bf16, torch.compile: ms/step, tok/s, MFU
#   2. a 30-step `torchrun --nproc_per_node=1 train_gpt2.py --preset gpt2-124M` run on synthetic shards, with
#      validation, HellaSwag (synthetic examples) and sampling in the loop, and a checkpoint at the end
#   3. bench.py's KV-cache generation: tok/s and the speed-up over re-running the window
# with the peak GPU memory of each. Needs no network: the shards and the HellaSwag file are made here. Any failure
# stops the script with a non-zero exit and names the stage.
#
#   bash scripts/gpu_check.sh               # on a machine with a CUDA GPU
#   bash scripts/gpu_check.sh --cpu-smoke   # the same stages at toy sizes on a CPU (tests/test_gpu_check.py)
#
# Environment: PYTHON (default: python, else python3) is the interpreter with torch; GPU_CHECK_TRAIN_ARGS and
# GPU_CHECK_BENCH_ARGS add flags to the training run and to bench.py; GPU_CHECK_MIN_FREE_GB (default 40) is the
# free GPU memory the preflight asks for; GPU_CHECK_KEEP=1 keeps the work directory.
set -euo pipefail

MODE=gpu
case "${1:-}" in
    "") ;;
    --cpu-smoke) MODE=cpu ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (expected --cpu-smoke or nothing)" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGE="start"
STAGE_LOG=""
SAMPLER=""
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
export TMPDIR="$WORK"  # what the stages leave in temp dirs (torchrun's among them) goes when WORK goes

on_exit() {
    local rc=$?
    if [ -n "$SAMPLER" ]; then
        kill "$SAMPLER" 2>/dev/null || true
    fi
    if [ "$rc" -ne 0 ]; then
        {
            echo
            if [ -n "$STAGE_LOG" ] && [ -s "$STAGE_LOG" ]; then
                echo "---- last lines of $STAGE_LOG ----"
                tail -n 20 "$STAGE_LOG"
                # a launcher's traceback can bury the program's own message: its first error lines
                echo "---- first error lines ----"
                grep -iE "error|exception|failed|not available" "$STAGE_LOG" | grep -vE '^\s+File ' | head -n 5 || true
                echo "----"
            fi
            [ "$rc" -eq 124 ] && echo "gpu_check.sh: the stage ran past its time limit"
            echo "gpu_check.sh: FAILED in stage '$STAGE' (exit $rc)"
        } >&2
    fi
    if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then
        echo "gpu_check.sh: work directory kept: $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap on_exit EXIT

# The memory in use (MiB) on the GPU the stages get as cuda:0, as nvidia-smi reports it: PCI order, so that
# nvidia-smi's index and CUDA's agree, and CUDA_VISIBLE_DEVICES's first entry (an index or a UUID) when it is set.
export CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"
GPU_ID="${CUDA_VISIBLE_DEVICES:-0}"
GPU_ID="${GPU_ID%%,*}"
gpu_memory() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_ID" 2>/dev/null
}

# stage NAME SECONDS CMD...: run CMD under a time limit, its output in a log that a failure shows the end of.
# With nvidia-smi on PATH the GPU's memory in use is sampled every 0.25 s meanwhile; gpu_memory.tsv gets the
# stage's name, the MiB in use before it and the most in use during it.
stage() {
    STAGE="$1"
    local limit="$2" rc=0 before=""
    shift 2
    STAGE_LOG="$WORK/$(echo "$STAGE" | tr -c 'a-zA-Z0-9\n' '_').log"
    echo "[gpu_check] $STAGE (limit ${limit}s)" >&2
    if command -v nvidia-smi >/dev/null && before="$(gpu_memory | head -n 1)" && [ -n "$before" ]; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_ID" -lms 250 \
            >"$STAGE_LOG.memory" 2>/dev/null &
        SAMPLER=$!
    fi
    timeout --kill-after=30 "$limit" "$@" >"$STAGE_LOG" 2>&1 || rc=$?
    if [ -n "$SAMPLER" ]; then
        kill "$SAMPLER" 2>/dev/null || true
        wait "$SAMPLER" 2>/dev/null || true
        SAMPLER=""
        printf '%s\t%s\t%s\n' "$STAGE" "$before" "$(sort -n "$STAGE_LOG.memory" | tail -n 1)" >>"$WORK/gpu_memory.tsv"
    fi
    return "$rc"
}

# Sizes: the GPU run as the issue asks; the CPU smoke at toy sizes with the same stages and checks.
if [ "$MODE" = gpu ]; then
    DEVICE=cuda MAX_STEPS=30 LIMIT_BENCH=360 LIMIT_GENERATE=180 LIMIT_TRAIN=360 TRAIN_TOKENS=2100000 VAL_TOKENS=70000
    BENCH_ARGS=(--preset gpt2-124M)  # B=16 and 64, T=1024, bf16, compiled; generation: 124M, 16 + 256 tokens
    TRAIN_ARGS=(--total_batch_size 65536 --batch_size 16 --warmup_steps 5 --eval_interval 15 --val_tokens 65536
                --hellaswag_interval 15 --hellaswag_limit 64 --sample_interval 15 --ckpt_interval 30)
else
    DEVICE=cpu MAX_STEPS=3 LIMIT_BENCH=240 LIMIT_GENERATE=240 LIMIT_TRAIN=240 TRAIN_TOKENS=20000 VAL_TOKENS=2000
    BENCH_ARGS=(--quick --device cpu)
    TRAIN_ARGS=(--n_layer 2 --n_head 2 --n_embd 64 --block_size 64 --seq_len 64  # a toy model, not the preset's 124M
                --total_batch_size 512 --batch_size 4 --warmup_steps 1 --max_lr 1e-2 --eval_interval 2
                --val_tokens 256 --hellaswag_interval 2 --hellaswag_limit 8 --sample_interval 2 --ckpt_interval 3)
fi
read -r -a EXTRA_TRAIN <<<"${GPU_CHECK_TRAIN_ARGS:-}"
read -r -a EXTRA_BENCH <<<"${GPU_CHECK_BENCH_ARGS:-}"
cd "$ROOT"

# ---------------------------------------------------------------------------------------------------------
# Preflight: all that the stages need, each missing thing named with how to get it, in seconds rather than after
# minutes of compiling. Its lines go to stderr; anything missing exits 1 here.
STAGE="preflight"
echo "[gpu_check] preflight" >&2
if [ -z "${PYTHON:-}" ]; then
    PYTHON="$(command -v python || command -v python3 || true)"
    if [ -z "$PYTHON" ]; then
        echo "gpu_check.sh: preflight: no python or python3 on PATH: install Python 3.10 or newer, then" \
             "\`pip install -r requirements.txt\`; or set PYTHON=/path/to/python" >&2
        exit 1
    fi
elif ! command -v "$PYTHON" >/dev/null; then
    echo "gpu_check.sh: preflight: PYTHON=$PYTHON is not a command: set it to the interpreter that has torch" >&2
    exit 1
fi
timeout 120 "$PYTHON" - "$MODE" "${GPU_CHECK_MIN_FREE_GB:-40}" <<'EOF' >&2
import importlib, os, shutil, sys, sysconfig
from pathlib import Path

mode, min_free_gb = sys.argv[1], float(sys.argv[2])
try:
    import torch
except ImportError as e:
    sys.exit(f"gpu_check.sh: preflight: {sys.executable} cannot import torch ({e}): pip install -r requirements.txt "
             "(on a GPU machine, the CUDA build of the torch it pins: pytorch.org gives the --index-url)")
problems = []
version = torch.__version__.split("+")[0]
if mode == "gpu" and torch.version.cuda is None:
    problems.append(f"torch {torch.__version__} is a CPU-only build: install its CUDA build, pip install "
                    f"torch=={version} --index-url https://download.pytorch.org/whl/cuXXX (pytorch.org: the cuXXX "
                    "your driver supports)")
elif mode == "gpu" and not torch.cuda.is_available():
    problems.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: does `nvidia-smi` list one? "
                    f"(the driver, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
# What the stages import: bench.py and train_gpt2.py, with what they load on the way (tokenizer, HellaSwag, plots).
missing = []
sys.path.insert(0, os.getcwd())
for name in ["numpy", "tiktoken", "tqdm", "matplotlib"] + ["triton"] * (mode == "gpu") + ["bench", "train_gpt2"]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in missing:
            missing.append(e.name)
            how = "it comes with torch's CUDA wheels; else pip install triton" if e.name == "triton" else \
                "pip install -r requirements.txt"
            problems.append(f"Python module {e.name!r} is missing from {sys.executable}: {how}")
    except Exception as e:  # a broken install, or a broken edit of the project's own files
        problems.append(f"import {name} fails: {type(e).__name__}: {e}")
if mode == "gpu":  # torch.compile on CUDA runs Triton, which builds C modules at the first compile
    cc = os.environ.get("CC")
    if cc and not shutil.which(cc):
        problems.append(f"CC={cc} is not a command: Triton compiles with $CC; point it at gcc or clang, or unset it")
    elif not cc and not (shutil.which("gcc") or shutil.which("clang")):
        problems.append("no C compiler (gcc or clang) on PATH: Triton (torch.compile on CUDA) builds with one: "
                        "apt install gcc (dnf install gcc, conda install gcc), or set CC")
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        problems.append(f"no Python.h in {include}: Triton compiles against Python's headers: apt install "
                        f"python{sys.version_info.major}.{sys.version_info.minor}-dev (dnf install python3-devel)")
    if torch.version.cuda is not None and torch.cuda.is_available():
        (free, total), name = torch.cuda.mem_get_info(), torch.cuda.get_device_name()
        if free < min_free_gb * 2**30:
            problems.append(f"{free / 2**30:.1f} GiB of {total / 2**30:.1f} GiB free on {name}, the check needs "
                            f"about {min_free_gb:g} (bench.py's 124M step at B=64, T=1024): stop what holds it "
                            "(nvidia-smi lists it), or set GPU_CHECK_MIN_FREE_GB lower with "
                            "GPU_CHECK_BENCH_ARGS='--batch_size 16'")
        print(f"[gpu_check] {name}: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free; torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}; {sys.executable}")
for problem in problems:
    print(f"gpu_check.sh: preflight: {problem}")
sys.exit(1 if problems else 0)
EOF

# ---------------------------------------------------------------------------------------------------------
# Synthetic data: uint16 shards of Zipf-distributed ids from a 2,000-token subset of GPT-2's vocabulary (so the
# loss has something to learn and must fall), and HellaSwag-shaped examples of short English words.
stage "synthetic data" 120 "$PYTHON" - "$WORK" "$TRAIN_TOKENS" "$VAL_TOKENS" <<'EOF'
import json, sys
from pathlib import Path
import numpy as np

work, train_tokens, val_tokens = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(1337)
ids = rng.permutation(50256)[:2000]  # no <|endoftext|> among them
p = 1.0 / np.arange(1, len(ids) + 1)
data = work / "data"
data.mkdir()
for name, n in (("syn_val_000000.npy", val_tokens), ("syn_train_000001.npy", train_tokens)):
    np.save(data / name, ids[rng.choice(len(ids), size=n, p=p / p.sum())].astype(np.uint16))
words = ("the a man woman dog ball house runs jumps then red blue under over river tree car walks sits "
         "looks at with and of in on big small old new green slowly quickly").split()
say = lambda lo, hi: " ".join(rng.choice(words, size=int(rng.integers(lo, hi + 1))))
with open(work / "hellaswag.jsonl", "w") as f:
    for _ in range(64):
        example = {"ctx": say(6, 12).capitalize(), "endings": [say(2, 6) + "." for _ in range(4)],
                   "label": int(rng.integers(4))}
        f.write(json.dumps(example) + "\n")
print(f"{train_tokens} train + {val_tokens} val tokens in {data}; 64 HellaSwag examples")
EOF

# ---------------------------------------------------------------------------------------------------------
# bench.py's two sections as two stages, so that each has its own peak GPU memory.
stage "bench.py train step" "$LIMIT_BENCH" \
    "$PYTHON" bench.py "${BENCH_ARGS[@]}" --only train --json "$WORK/bench_train.json" "${EXTRA_BENCH[@]}"

stage "bench.py KV-cache generation" "$LIMIT_GENERATE" \
    "$PYTHON" bench.py "${BENCH_ARGS[@]}" --only generate --json "$WORK/bench_generate.json" "${EXTRA_BENCH[@]}"

# ---------------------------------------------------------------------------------------------------------
stage "torchrun ${MAX_STEPS}-step gpt2-124M run" "$LIMIT_TRAIN" \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 train_gpt2.py --preset gpt2-124M \
    --data_root "$WORK/data" --log_dir "$WORK/log" --device "$DEVICE" \
    --max_steps "$MAX_STEPS" --hellaswag_data "$WORK/hellaswag.jsonl" "${TRAIN_ARGS[@]}" "${EXTRA_TRAIN[@]}"
cp "$STAGE_LOG" "$WORK/train_stdout.txt"

# ---------------------------------------------------------------------------------------------------------
# Checks of the run and of bench's results, then the one table (stdout). A failed check exits 1.
stage "checks and summary" 120 "$PYTHON" - "$WORK" "$MAX_STEPS" "$MODE" <<'EOF'
import json, math, statistics, sys
from pathlib import Path

work, max_steps, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
problems = []
log = {}  # kind -> [(step, value)]
for line in (work / "log" / "log.txt").read_text().splitlines():
    step, kind, value = line.split()
    log.setdefault(kind, []).append((int(step), float(value)))
for kind in ("train", "val", "hella"):
    if kind not in log:
        problems.append(f"log.txt has no '{kind}' lines")
train = [v for _, v in log.get("train", [])]
if len(train) != max_steps:
    problems.append(f"{len(train)} train losses logged, expected {max_steps}")
if train and not (math.isfinite(train[-1]) and train[-1] < train[0]):
    problems.append(f"the last train loss {train[-1]} is not finite and below the first {train[0]}")
stdout = (work / "train_stdout.txt").read_text()
sampled = "sample 0 at step" in stdout
if not sampled:
    problems.append("no sample was printed")
ckpt = work / "log" / f"model_{max_steps:05d}.pt"
if not ckpt.is_file():
    problems.append(f"no checkpoint {ckpt.name}")

def late(kind):  # the median over the last two thirds of the steps: compilation and warm-up left out
    values = [v for s, v in log.get(kind, []) if s >= max_steps // 3]
    return statistics.median(values) if values else None

bench = {name: json.loads((work / f"bench_{name}.json").read_text()) for name in ("train", "generate")}
for name, results in bench.items():
    if results["failures"]:
        problems.append(f"bench.py --only {name}: {results['failures']}")
gen = bench["generate"]["sections"]["generate"]
if not gen["identical"]:
    print("note: KV-cache and no-cache tokens differ (bf16 rounds differently per kernel shape)", file=sys.stderr)

# Peak GPU memory per stage, from nvidia-smi's samples (gpu_memory.tsv: stage, MiB before, most MiB during).
stage_peak = {}
if (work / "gpu_memory.tsv").is_file():
    for line in (work / "gpu_memory.tsv").read_text().splitlines():
        name, before, peak = (line.split("\t") + ["", ""])[:3]
        if before.strip().isdigit() and peak.strip().isdigit():
            stage_peak[name] = max(0, int(peak) - int(before)) / 1024

def fmt(value, spec):
    return "-" if value is None else format(value, spec)

def gib(value):
    return fmt(value, ".1f") + " GiB" * (value is not None)

run_stage = f"torchrun {max_steps}-step gpt2-124M run"
rows = []
for r in bench["train"]["sections"]["train"]["rows"]:  # torch.cuda.max_memory_allocated at this B
    rows.append((f"bench.py train step, B={r['batch_size']}, T={r['seq_len']}",
                 fmt(r["ms_per_step"], ".1f"), fmt(r["tokens_per_s"], ",.0f"), fmt(r["mfu"], ".1%"),
                 gib(r["peak_mem_gb"]), "" if r["peak_mem_gb"] is None else "torch.cuda.max_memory_allocated"))
hella = log.get("hella", [(0, None)])[-1][1]
try:  # the run's dtype and compile flag, as train_gpt2.py recorded them (the first JSON block of header.txt)
    header = json.JSONDecoder().raw_decode((work / "log" / "header.txt").read_text())[0]
except (OSError, ValueError):
    header = {}
rows.append((f"torchrun {max_steps} steps, --preset gpt2-124M, {header.get('dtype', '?')}, compile "
             f"{str(header.get('compile', '?')).lower()}", fmt(late("ms"), ".1f"), fmt(late("tok_per_s"), ",.0f"),
             fmt(late("mfu"), ".1%"), gib(stage_peak.get(run_stage)),
             f"loss {train[0]:.3f} -> {train[-1]:.3f}; val {fmt(log.get('val', [(0, None)])[-1][1], '.3f')}; "
             f"HellaSwag acc_norm {fmt(hella, '.3f')} (synthetic: ran, not meaningful); "
             f"sample printed: {'yes' if sampled else 'no'}; checkpoint: {'yes' if ckpt.is_file() else 'no'}"))
kv = gen["rows"][1]
rows.append((f"KV-cache generation, {gen['prompt_len']} + {gen['new_tokens']} tokens, batch {gen['batch']}",
             fmt(kv["ms_per_step"], ".1f"), fmt(kv["tokens_per_s"], ",.1f"), "-",
             gib(stage_peak.get("bench.py KV-cache generation")),
             f"speed-up {gen['speedup']:.2f}x over no cache; tokens identical: {'yes' if gen['identical'] else 'no'}"))

print(f"\n**gpu_check.sh** ({'GPU' if mode == 'gpu' else 'CPU smoke, toy sizes'}): {bench['train']['device']}, "
      f"torch {bench['train']['torch']}\n")
print("| measurement | ms/step | tok/s | MFU | peak GPU memory | notes |")
print("| --- | ---: | ---: | ---: | ---: | --- |")
for row in rows:
    print("| " + " | ".join(row) + " |")
stages = ("bench.py train step", run_stage, "bench.py KV-cache generation")
if any(s in stage_peak for s in stages):
    print("\nPeak GPU memory in use per stage (nvidia-smi every 0.25 s, less what was in use before it; the CUDA "
          "context and the allocator's cache included): " + ", ".join(f"{s} {gib(stage_peak.get(s))}" for s in stages))
else:
    print("\nPeak GPU memory: no nvidia-smi here, so only what bench.py's allocator reports (none on a CPU)")
if problems:
    sys.exit("checks failed: " + "; ".join(problems))
EOF
cat "$STAGE_LOG"
STAGE="total time"
echo
echo "total time: ${SECONDS} s"
if [ "$MODE" = gpu ] && [ "$SECONDS" -gt 480 ]; then
    echo "WARNING: gpu_check.sh took ${SECONDS} s, over its 8-minute budget" >&2
fi
