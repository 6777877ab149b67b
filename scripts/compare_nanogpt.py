"""
train_gpt2.py against nanoGPT's train.py, side by side, on nanoGPT's character split of our
input.txt, downloading nothing; both final models scored on nanoGPT's whole val.bin by the same
code. A measurement for docs/benchmarks.md, not a test.

    python scripts/compare_nanogpt.py --nanogpt ../nanoGPT            # 3 seeds x 2000 iterations
    python scripts/compare_nanogpt.py --nanogpt ../nanoGPT --iters 30 --seeds 1   # a smoke run
    python scripts/compare_nanogpt.py --nanogpt ../nanoGPT --step_only    # the bare step only

--nanogpt is a checkout of karpathy/nanoGPT; nothing is written into it. In --out: data/ (what
nanoGPT's data/shakespeare_char/prepare.py makes of input.txt: the sorted characters, the first
90% train.bin, the last 10% val.bin, meta.pkl; and the same two token streams as our corpus, one
shard each), then per seed K nanogpt_K/ and ours_K/ (each run's output) and their console lines
(nanogpt_K.console.txt, ours_K.console.txt).

Both sides run nanoGPT README's CPU settings: 4 layers x 4 heads x 128, block 64, batch 12,
dropout 0, float32, no compile, max_iters = lr_decay_iters = --iters; the LR 1e-3 -> 1e-4 with
100 warmup steps, beta2 0.99, weight decay 0.1 and gradient clipping at 1 of nanoGPT's
config/train_shakespeare_char.py (our shakespeare_char preset's peak LR, 2e-3, is set to 1e-3).
The runs of a seed start together, one thread each; nanoGPT seeds torch with 1337 (it has no
flag: a wrapper adds the seed's number), ours --seed 1337 + K. nanoGPT saves out_dir/ckpt.pt at
its evaluations (--eval_interval --iters with --always_save_checkpoint: the model after --iters
steps); ours writes model_{iters}.pt. ms/iter is the median interval between a run's
consecutive step lines as they reach this script: the same clock for both, the whole loop.

First, the bare training step of each model on one thread (forward, backward, clipping, AdamW;
float32, the same random batch), in rounds that each model takes a turn in: ours as the preset
builds it (nanoGPT's choices: no biases, the exact GELU), ours as GPT-2 (biases, the tanh GELU),
nanoGPT's GPT as its train.py builds it (no biases) and with biases. A ratio is paired by round.
"""

import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import fineweb  # noqa: E402
import train_gpt2  # noqa: E402

LAYERS = 4
HEADS = 4
WIDTH = 128
BLOCK = 64
BATCH = 12
WARMUP = 100
MAX_LR = 1e-3
BETA2 = 0.99

# nanoGPT's train.py, run with the seed of this comparison's run: it seeds torch with
# torch.manual_seed(1337 + rank) and has no flag for it, so the seed number is added to what it
# asks for. argv: the number, then train.py's own arguments; run in the nanoGPT checkout.
NANOGPT_WRAPPER = """
import runpy
import sys
import torch

seed = int(sys.argv.pop(1))
manual_seed = torch.manual_seed
torch.manual_seed = lambda s: manual_seed(s + seed)
sys.argv[0] = "train.py"
runpy.run_path("train.py", run_name="__main__")
"""


def make_data(input_txt, data):
    # nanoGPT's split of input_txt as its prepare.py makes it (data/nanogpt: train.bin, val.bin,
    # meta.pkl), and our corpus of the same two token streams (data/ours: a shard each, a
    # manifest). Returns the characters (id i is chars[i]).
    text = Path(input_txt).read_text(encoding="utf-8")
    chars = "".join(sorted(set(text)))
    ids = {c: i for i, c in enumerate(chars)}
    n = len(text)
    train = np.array([ids[c] for c in text[: int(n * 0.9)]], dtype=np.uint16)
    val = np.array([ids[c] for c in text[int(n * 0.9) :]], dtype=np.uint16)
    nanogpt = data / "nanogpt"
    nanogpt.mkdir(parents=True)
    train.tofile(nanogpt / "train.bin")
    val.tofile(nanogpt / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": ids}
    with open(nanogpt / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    write_corpus(data / "ours", chars, {"val": val, "train": train})
    return chars


def write_corpus(out_dir, chars, splits):
    # a corpus train_gpt2.py reads: a .npy shard per split and the manifest fineweb.py would
    # write for them (char tokenizer), checked as train_gpt2.py checks it
    out_dir.mkdir(parents=True)
    shards = []
    for split, tokens in splits.items():
        name = f"nanogpt_{split}_0000_0000.npy"
        np.save(out_dir / name, tokens)
        sha256 = hashlib.sha256((out_dir / name).read_bytes()).hexdigest()
        shards.append({"file": name, "split": split, "tokens": len(tokens), "sha256": sha256})
    fingerprint = "\n".join(f"{s['file']} {s['tokens']} {s['sha256']}" for s in shards)
    manifest = {
        "tokenizer": "char",
        "vocab": chars,
        "dataset": "nanoGPT's shakespeare_char split of input.txt",
        "sources": ["input.txt"],
        "vocab_size": len(chars),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "fingerprint": hashlib.sha256(fingerprint.encode()).hexdigest(),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    import fineweb

    for entry in fineweb.load_corpus(out_dir)["shards"]:
        problem = fineweb.verify_shard(out_dir / entry["file"], entry, len(chars))
        assert problem is None, problem


def nanogpt_command(nanogpt_data, out_dir, iters, seed):
    # nanoGPT README's CPU command, its final model saved, float32
    flags = [
        "config/train_shakespeare_char.py",
        "--device=cpu",
        "--compile=False",
        "--eval_iters=20",
        "--log_interval=1",
        f"--block_size={BLOCK}",
        f"--batch_size={BATCH}",
        f"--n_layer={LAYERS}",
        f"--n_head={HEADS}",
        f"--n_embd={WIDTH}",
        f"--max_iters={iters}",
        f"--lr_decay_iters={iters}",
        "--dropout=0.0",
        "--dtype=float32",
        f"--eval_interval={iters}",
        "--always_save_checkpoint=True",
        f"--dataset={nanogpt_data}",
        f"--out_dir={out_dir}",
    ]
    return [sys.executable, "-c", NANOGPT_WRAPPER, str(seed)] + flags


def our_command(corpus, log_dir, iters, seed):
    # the shakespeare_char preset at nanoGPT's settings, evaluated and saved at the end only
    flags = {
        "data_root": corpus,
        "log_dir": log_dir,
        "seed": 1337 + seed,
        "max_steps": iters,
        "max_lr": MAX_LR,
        "warmup_steps": WARMUP,
        "beta2": BETA2,
        "dropout": 0.0,
        "eval_interval": iters,
        "ckpt_interval": iters,
        "sample_interval": 0,
        "curves": "false",
        "device": "cpu",
        "compile": "false",
    }
    argv = [sys.executable, str(ROOT / "train_gpt2.py"), "--preset", "shakespeare_char"]
    for name, value in flags.items():
        argv += [f"--{name}", str(value)]
    return argv


def start(argv, cwd, log_path):
    # the process and a thread that keeps its console lines with the time each arrived
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []

    def read():
        with open(log_path, "w") as log:
            for line in proc.stdout:
                lines.append((time.perf_counter(), line))
                log.write(line)

    reader = threading.Thread(target=read)
    reader.start()
    return proc, reader, lines


def ms_per_iter(lines, is_step):
    # the median interval between consecutive step lines, in ms
    stamps = [t for t, line in lines if is_step(line)]
    return statistics.median(np.diff(stamps) * 1000) if len(stamps) > 2 else float("nan")


def nanogpt_step_line(line):
    return line.startswith("iter ")


def our_step_line(line):
    return line.startswith("step ") and "| train " in line


def load_nanogpt_model(nanogpt, ckpt_path):
    # nanoGPT's model, built by its model.py from its checkpoint
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(nanogpt) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ckpt = torch.load(ckpt_path, map_location="cpu")
    # (it prints its number of parameters)
    with contextlib.redirect_stdout(io.StringIO()):
        model = module.GPT(module.GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    return model


@torch.no_grad()
def val_loss(model, val):
    # The mean loss over every target of val (uint16 ids): windows of BLOCK + 1 tokens at
    # stride BLOCK (consecutive windows share a token), the last one shorter if that is what is
    # left. model(x, y) returns (anything, the mean loss of y), as both GPTs do.
    model.eval()
    windows = [val[s : s + BLOCK + 1] for s in range(0, len(val) - 1, BLOCK)]
    # batches of 64 windows, the last window alone
    whole = windows[:-1]
    batches = [whole[i : i + 64] for i in range(0, len(whole), 64)] + [windows[-1:]]
    total = 0.0
    for batch in batches:
        tokens = torch.from_numpy(np.stack(batch).astype(np.int64))
        x = tokens[:, :-1].contiguous()
        y = tokens[:, 1:].contiguous()
        _, loss = model(x, y)
        total += loss.item() * y.numel()
    return total / (len(val) - 1)


def train_step_ms(nanogpt, rounds=15, steps=10):
    # ms of a bare training step of each model (see the docstring): the median of each round's
    # steps, the models taking turns in every round (a machine's drift is shared by a round)
    spec = importlib.util.spec_from_file_location("nanogpt_model", Path(nanogpt) / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    vocab = 65  # tiny Shakespeare's characters
    shape = dict(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, block_size=BLOCK, vocab_size=vocab)

    def ours(**choices):
        model = train_gpt2.GPT(train_gpt2.GPTConfig(**shape, **choices))
        optimizer = model.configure_optimizers(0.1, MAX_LR, "cpu", beta2=BETA2)[0]
        return model, optimizer

    def nanogpt_model(bias):
        # (its configure_optimizers prints what it made)
        with contextlib.redirect_stdout(io.StringIO()):
            model = module.GPT(module.GPTConfig(dropout=0.0, bias=bias, **shape))
            optimizer = model.configure_optimizers(0.1, MAX_LR, (0.9, BETA2), "cpu")
        return model, optimizer

    # ours as the preset builds it (nanoGPT's choices: no biases, the exact GELU) and as GPT-2
    preset = train_gpt2.PRESETS["shakespeare_char"]
    makers = {
        "ours": lambda: ours(bias=preset["bias"], gelu_approximate=preset["gelu_approximate"]),
        "ours as GPT-2": lambda: ours(bias=True, gelu_approximate="tanh"),
        "nanoGPT (no biases)": lambda: nanogpt_model(False),
        "nanoGPT (biases)": lambda: nanogpt_model(True),
    }
    x = torch.randint(0, vocab, (BATCH, BLOCK))
    y = torch.randint(0, vocab, (BATCH, BLOCK))
    times = {name: [] for name in makers}
    rounds_ms = {name: [] for name in makers}
    names = list(makers)
    for r in range(rounds):
        # each round starts with another model: none is always first after the building
        for name in names[r % len(names) :] + names[: r % len(names)]:
            make = makers[name]
            torch.manual_seed(0)
            model, optimizer = make()
            for step in range(steps + 3):
                t0 = time.perf_counter()
                _, loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                # (the first steps allocate the optimizer's state)
                if step >= 3:
                    times[name].append(time.perf_counter() - t0)
            rounds_ms[name].append(statistics.median(times[name][-steps:]) * 1000)
    return rounds_ms


def speed_ratio(ours_ms, theirs_ms):
    # our speed over theirs (their time over ours), a round's pair each: the geometric mean and
    # its 95% confidence interval (a t-interval of the log ratios, scipy)
    logs = np.log(np.array(theirs_ms) / np.array(ours_ms))
    interval = stats.ttest_1samp(logs, 0.0).confidence_interval()
    return np.exp(logs.mean()), np.exp(interval.low), np.exp(interval.high)


def mean_sd(values):
    sd = f"{statistics.stdev(values):.4f}" if len(values) > 1 else "-"
    return f"{statistics.mean(values):.4f} ± {sd}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT")
    parser.add_argument("--iters", type=int, default=2000, help="iterations of each run")
    parser.add_argument("--seeds", type=int, default=3, help="runs of each side")
    parser.add_argument("--out", default="out/compare_nanogpt", help="a new or empty directory")
    parser.add_argument("--step_only", action="store_true", help="the bare step's timing only")
    args = parser.parse_args()
    nanogpt = Path(args.nanogpt).resolve()
    if not (nanogpt / "train.py").is_file() or not (nanogpt / "model.py").is_file():
        parser.error(f"--nanogpt {args.nanogpt}: no train.py and model.py there")
    out = Path(args.out).resolve()
    # (--step_only writes nothing)
    if out.exists() and not out.is_dir() and not args.step_only:
        parser.error(f"--out {args.out} is a file: pass a new directory")
    if out.is_dir() and any(out.iterdir()) and not args.step_only:
        parser.error(f"--out {args.out} holds files already: pass a new directory")
    owner = fineweb.claimed_by(out)
    if owner and not args.step_only:
        parser.error(f"--out {args.out} is inside {owner}: pass a directory outside it")
    if out.is_relative_to(nanogpt) and not args.step_only:
        parser.error(f"--out {args.out} is inside --nanogpt: nothing is written into the checkout")
    if args.iters < 1 or args.seeds < 1:
        parser.error("--iters and --seeds must be at least 1")

    torch.set_num_threads(1)
    print(f"the bare train step, float32, 1 thread ({BATCH} x {BLOCK}, {LAYERS}x{HEADS}x{WIDTH})")
    rounds_ms = train_step_ms(nanogpt)
    step_ms = {name: statistics.median(ms) for name, ms in rounds_ms.items()}
    for name, ms in step_ms.items():
        speed = ""
        if name != "ours":
            ratio, low, high = speed_ratio(rounds_ms["ours"], rounds_ms[name])
            speed = f"  ours at {ratio:.3f}x its speed (95% CI {low:.3f}-{high:.3f})"
        print(f"  {name:20s} {ms:7.2f} ms{speed}")
    print(f"  (the median of {len(rounds_ms['ours'])} rounds; a ratio: paired by round)")
    if args.step_only:
        return

    chars = make_data(ROOT / "input.txt", out / "data")
    val = np.fromfile(out / "data" / "nanogpt" / "val.bin", dtype=np.uint16)
    results = {"nanoGPT": [], "ours": []}
    for seed in range(args.seeds):
        print(f"seed {seed}: both sides, {args.iters} iterations", flush=True)
        nanogpt_dir = out / f"nanogpt_{seed}"
        our_dir = out / f"ours_{seed}"
        nanogpt_argv = nanogpt_command(out / "data" / "nanogpt", nanogpt_dir, args.iters, seed)
        our_argv = our_command(out / "data" / "ours", our_dir, args.iters, seed)
        runs = {
            "nanoGPT": start(nanogpt_argv, nanogpt, out / f"nanogpt_{seed}.console.txt"),
            "ours": start(our_argv, ROOT, out / f"ours_{seed}.console.txt"),
        }
        for side, (proc, reader, lines) in runs.items():
            proc.wait()
            reader.join()
            if proc.returncode:
                tail = "".join(line for _, line in lines[-20:])
                sys.exit(f"{side}'s run of seed {seed} failed:\n{tail}")
        nanogpt_model = load_nanogpt_model(nanogpt, nanogpt_dir / "ckpt.pt")
        our_model, enc = train_gpt2.load_model(our_dir / f"model_{args.iters:05d}.pt")
        assert enc.chars == chars, "our corpus's characters are not nanoGPT's"
        for side, model, is_step in [
            ("nanoGPT", nanogpt_model, nanogpt_step_line),
            ("ours", our_model, our_step_line),
        ]:
            loss = val_loss(model, val)
            ms = ms_per_iter(runs[side][2], is_step)
            results[side].append((loss, ms))
            print(f"  {side:8s} val {loss:.4f}  {ms:.1f} ms/iter", flush=True)

    print(f"\n{args.seeds} seed(s) x {args.iters} iterations; val: nanoGPT's whole val.bin")
    print("| side | final val loss (mean ± sd) | ms/iter (median of seeds) | bare step ms |")
    print("| --- | --- | --- | --- |")
    bare = {"nanoGPT": step_ms["nanoGPT (no biases)"], "ours": step_ms["ours"]}
    for side, rows in results.items():
        losses = [loss for loss, _ in rows]
        ms = statistics.median(m for _, m in rows)
        print(f"| {side} | {mean_sd(losses)} | {ms:.1f} | {bare[side]:.2f} |")
    if args.seeds > 1:
        ours = [loss for loss, _ in results["ours"]]
        theirs = [loss for loss, _ in results["nanoGPT"]]
        test = stats.ttest_ind(ours, theirs, equal_var=False)
        print(f"Welch's t-test, ours - nanoGPT: t = {test.statistic:.3f}, p = {test.pvalue:.4f}")


if __name__ == "__main__":
    main()
