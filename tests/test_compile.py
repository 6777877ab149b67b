"""torch.compile, proven on the CPU: a compiled run trains as the eager one does, in one process and over two gloo
ranks, and the evaluations of a compiled run (val loss, HellaSwag, samples) use the plain model, so they never make
the compiled one recompile.

Tolerance: inductor fuses kernels and reorders float32 sums, so compiled and eager losses differ by rounding, which
AdamW then carries forward; over these few steps the losses agree to ~1e-6 here, and TOL leaves room for other CPUs.
A wrong graph (a dropped mask, a missed scale) moves them by 1e-2 or more."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import run_files
import train_gpt2
from helpers import child_env, measured

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
# GPT-2's vocabulary (HellaSwag needs it), everything else tiny; every evaluation twice during the run.
RUN = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=50257, batch_size=2, seq_len=16,
           total_batch_size=64, max_steps=6, warmup_steps=2, max_lr=3e-3, eval_interval=3, val_tokens=64,
           hellaswag_interval=3, hellaswag_limit=2, sample_interval=3, sample_length=8, ckpt_interval=0, device="cpu",
           dtype="float32")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compile")
    rng = np.random.default_rng(0)
    np.save(root / "x_val_000000.npy", rng.integers(0, 96, 512).astype(np.uint16))
    np.save(root / "x_train_000001.npy", rng.integers(0, 96, 4000).astype(np.uint16))
    example = {"ctx": "A man sits on a roof. He", "endings": ["climbs down.", "sings.", "flies.", "sleeps."], "label": 0}
    (root / "hs.jsonl").write_text("\n".join(json.dumps({**example, "ind": i}) for i in range(2)) + "\n")
    return root, root / "hs.jsonl"


def config(data, log_dir, **overrides) -> dict:
    root, hs = data
    return {**RUN, "data_root": str(root), "log_dir": str(log_dir), "hellaswag_data": str(hs), **overrides}


def assert_close_logs(a: dict, b: dict, tol: float = TOL):
    assert a.keys() == b.keys()
    for kind in a:
        assert [s for s, _ in a[kind]] == [s for s, _ in b[kind]], kind
        assert all(abs(x - y) <= tol for (_, x), (_, y) in zip(a[kind], b[kind])), (kind, a[kind], b[kind])


@pytest.mark.slow
def test_compiled_run_equals_eager_and_never_recompiles(data, tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = []  # compiled graphs so far, each time a training step is reported
    report = run_files.Metrics.report

    def counting_report(self, step, **values):
        if "train" in values:
            graphs.append(counters["stats"]["unique_graphs"])
        return report(self, step, **values)

    monkeypatch.setattr(run_files.Metrics, "report", counting_report)
    messages = []
    train_gpt2.train(train_gpt2.TrainConfig(**config(data, tmp_path / "compiled", compile="true")), log=messages.append)
    monkeypatch.undo()
    train_gpt2.train(train_gpt2.TrainConfig(**config(data, tmp_path / "eager", compile="false")), log=lambda *a: None)

    assert any("compile True" in m for m in messages) and sum(m.startswith("sample ") for m in messages) == 4 * 3
    compiled, eager = measured(tmp_path / "compiled"), measured(tmp_path / "eager")
    assert {"train", "val", "hella"} <= set(compiled)
    assert_close_logs(compiled, eager)
    # the first step compiled the training graphs; the evaluations at steps 0, 3 and 6 added none
    assert graphs[0] > 0 and graphs == [graphs[0]] * RUN["max_steps"], graphs
    assert counters["stats"]["unique_graphs"] == graphs[0]


@pytest.mark.slow
def test_compiled_ddp_equals_eager_single_process(data, tmp_path):
    """torchrun, 2 gloo ranks, compiled, 2 micro-steps each == one eager process with the same 64-token steps."""
    cfg = config(data, tmp_path / "ddp", compile="true", hellaswag_interval=0, sample_interval=0)
    argv = [a for k, v in cfg.items() for a in (f"--{k}", str(v))]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                           "train_gpt2.py", *argv], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout and "compile True" in proc.stdout
    train_gpt2.train(train_gpt2.TrainConfig(**{**cfg, "log_dir": str(tmp_path / "eager"), "compile": "false"}),
                     log=lambda *a: None)
    assert_close_logs(measured(tmp_path / "ddp"), measured(tmp_path / "eager"))
