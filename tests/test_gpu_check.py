"""scripts/gpu_check.sh: its CPU smoke mode runs every stage and prints the one table; any failure exits non-zero
and names the stage. (The GPU run itself needs a GPU: this checks the script, not the GPU's numbers.)"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(tmp_path, *args, **env):
    """The script as a user runs it, with this interpreter and its temp files under tmp_path."""
    env = dict(child_env(), PYTHON=sys.executable, TMPDIR=str(tmp_path), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


@pytest.mark.slow
def test_cpu_smoke_runs_every_stage_and_prints_one_table(tmp_path):
    proc = gpu_check(tmp_path, "--cpu-smoke")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "| measurement | ms/step | tok/s | MFU | notes |" and table[1].startswith("| --- |")
    rows = table[2:]
    assert [r.split("|")[1].strip().split(",")[0] for r in rows] == [
        "bench.py train step", "bench.py train step", "torchrun 3 steps", "KV-cache generation"]
    run_row = rows[2]
    assert "sample printed: yes" in run_row and "checkpoint: yes" in run_row and "HellaSwag acc_norm 0." in run_row
    assert "speed-up" in rows[3] and "tokens identical: yes" in rows[3]
    assert "CPU smoke" in proc.stdout and "total time:" in proc.stdout
    for stage in ("synthetic data", "bench.py train step and KV-cache generation", "torchrun 3-step"):
        assert f"[gpu_check] {stage}" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # the work directory is removed


def test_a_failing_stage_exits_non_zero_and_is_named(tmp_path):
    proc = gpu_check(tmp_path, "--cpu-smoke", GPU_CHECK_BENCH_ARGS="--no_such_flag 1")
    assert proc.returncode != 0
    assert "FAILED in stage 'bench.py train step and KV-cache generation'" in proc.stderr
    assert "unrecognized arguments: --no_such_flag" in proc.stderr  # the stage's own message is shown
    assert "| measurement |" not in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without a GPU")
def test_the_gpu_run_without_a_gpu_fails_loudly(tmp_path):
    proc = gpu_check(tmp_path)
    assert proc.returncode != 0
    assert "FAILED in stage 'bench.py" in proc.stderr and "CUDA is not available" in proc.stderr


def test_unknown_argument_is_rejected(tmp_path):
    proc = gpu_check(tmp_path, "--fast")
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
