"""
One Muon step on the blocks' matrices of GPT-2 124M (12 layers of c_attn 2304x768, attn.c_proj
768x768, c_fc 3072x768 and mlp.c_proj 768x3072: 48 matrices in 4 shapes), train_gpt2.Muon
against torch.optim.Muon, on this machine's CPU: the aten ops each step calls (torch.profiler),
then each step's wall and CPU time, the two interleaved (medians of --repeats). A
measurement for docs/benchmarks.md, not a test (tests/test_muon.py checks that the two take the
same step).

    python scripts/bench_muon.py                # GPT-2 124M's matrices
    python scripts/bench_muon.py --n_embd 128   # 12 narrower layers: the cost per op shows
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train_gpt2 import GPT, GPTConfig, Muon  # noqa: E402

# ops whose output is a view of their input: they run no kernel
VIEWS = {"aten::mT", "aten::numpy_T", "aten::t", "aten::transpose", "aten::unbind"}


def count_ops(opt):
    # (aten ops the step calls, of them views, aten ops in all: with those the calls make)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    called = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    views = [e for e in called if e.name in VIEWS]
    return len(called), len(views), len(aten)


def milliseconds(opt):
    # (wall, CPU: this process's, all its threads) of one step
    wall = time.perf_counter()
    cpu = time.process_time()
    opt.step()
    return 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--n_layer", type=int, default=12)
    parser.add_argument("--n_embd", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=9, help="timed steps of each")
    args = parser.parse_args()

    # the matrices configure_optimizers gives Muon, a copy for torch's; the same random gradients
    # (the vocabulary is small: the token table is AdamW's; heads change no matrix's shape)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=args.n_layer, n_head=1, n_embd=args.n_embd))
    muon = model.configure_optimizers(0.1, 6e-4, "cpu", muon_lr=0.02)[-1]
    ours = [p.detach() for p in muon.param_groups[0]["params"]]
    theirs = [p.clone() for p in ours]
    for p, q in zip(ours, theirs):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    steps = {
        "train_gpt2.Muon": Muon(ours, lr=0.02, weight_decay=0.1),
        "torch.optim.Muon": torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1),
    }
    shapes = sorted({tuple(p.shape) for p in ours})
    print(f"{len(ours)} matrices in {len(shapes)} shapes {shapes}, torch {torch.__version__},")
    print(f"{torch.get_num_threads()} threads")

    # the first step of each (it makes the momentum buffers) from the same weights: the same step
    before = [q.clone() for q in theirs]
    for opt in steps.values():
        opt.step()
    moved = max((q - b).abs().max().item() for q, b in zip(theirs, before))
    apart = max((p - q).abs().max().item() for p, q in zip(ours, theirs))
    print(f"first step: ours - torch's up to {apart:.3g}, the step itself up to {moved:.3g}")

    ops = {name: count_ops(opt) for name, opt in steps.items()}
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, opt in steps.items():
            times[name].append(milliseconds(opt))
    print()
    print("| step | aten ops called | views | the rest | aten ops in all | wall ms | CPU ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in steps:
        called, views, every = ops[name]
        wall = [w for w, _ in times[name]]
        cpu = statistics.median(c for _, c in times[name])
        # the median, and the range: this machine's other users move the wall time most
        spread = f"{statistics.median(wall):,.1f} ({min(wall):,.1f} to {max(wall):,.1f})"
        ops_row = f"{called:,} | {views:,} | {called - views:,} | {every:,}"
        print(f"| {name} | {ops_row} | {spread} | {cpu:,.1f} |")


if __name__ == "__main__":
    main()
