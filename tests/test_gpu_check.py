"""scripts/gpu_check.sh: its preflight fails in seconds naming each missing thing; its CPU smoke mode runs every
stage and prints the one table; any failure exits non-zero and names the stage. (The GPU run itself needs a GPU:
this checks the script, not the GPU's numbers. What a CPU machine lacks, a GPU, nvidia-smi, a compiler, a module,
is simulated with PATH, PYTHONPATH and a sitecustomize.py.)"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
TOOLS = ("bash", "mktemp", "timeout", "tr", "sed", "tail", "head", "grep", "rm", "dirname", "cat", "sort", "sleep")
# nvidia-smi as the script calls it: 1 GiB in use before a stage, 3 GiB while it runs (one sample per 0.1 s)
FAKE_NVIDIA_SMI = """#!/bin/bash
case " $* " in
    *" -lms "*) while true; do echo 3072; sleep 0.1; done ;;
    *) echo 1024 ;;
esac
"""


def gpu_check(tmp_path, *args, path=None, **env):
    """The script as a user runs it, with this interpreter (unless PYTHON=None) and its temp files under tmp_path."""
    env = {k: v for k, v in {**child_env(), "PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env}.items()
           if v is not None}
    if path is not None:
        env["PATH"] = str(path)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)


def bin_dir(tmp_path, *extra: str, **scripts: str) -> Path:
    """A directory for PATH holding the shell tools the script uses, the `extra` commands of this machine, and
    `scripts` (name -> text): a machine that lacks everything else, a C compiler and python among them."""
    d = tmp_path / "bin"
    d.mkdir()
    for tool in TOOLS + extra:
        (d / tool).symlink_to(shutil.which(tool))
    for name, text in scripts.items():
        (d / name).write_text(text)
        (d / name).chmod(0o755)
    return d


def preflight_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("gpu_check.sh: preflight: ")]


@pytest.mark.slow
def test_cpu_smoke_runs_every_stage_and_prints_one_table(tmp_path):
    """With nvidia-smi on PATH (a fake one here), the peak GPU memory column and the per-stage line come from its
    samples; bench.py's train rows have the allocator's peak, none on a CPU."""
    fake = tmp_path / "fake_bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    proc = gpu_check(work, "--cpu-smoke", path=f"{fake}:{os.environ['PATH']}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert table[0] == "| measurement | ms/step | tok/s | MFU | peak GPU memory | notes |"
    assert table[1].startswith("| --- |")
    rows = [[cell.strip() for cell in r.split("|")[1:-1]] for r in table[2:]]
    assert [r[0].split(",")[0] for r in rows] == [
        "bench.py train step", "bench.py train step", "torchrun 3 steps", "KV-cache generation"]
    assert [r[4] for r in rows] == ["-", "-", "2.0 GiB", "2.0 GiB"]  # 3072 - 1024 MiB during the stage
    run_row = rows[2][5]
    assert "sample printed: yes" in run_row and "checkpoint: yes" in run_row and "HellaSwag acc_norm 0." in run_row
    assert "speed-up" in rows[3][5] and "tokens identical: yes" in rows[3][5]
    assert ("Peak GPU memory in use per stage (nvidia-smi every 0.25 s, less what was in use before it; the CUDA "
            "context and the allocator's cache included): bench.py train step 2.0 GiB, torchrun 3-step gpt2-124M "
            "run 2.0 GiB, bench.py KV-cache generation 2.0 GiB") in proc.stdout
    assert "CPU smoke" in proc.stdout and "total time:" in proc.stdout
    for stage in ("preflight", "synthetic data", "bench.py train step", "bench.py KV-cache generation", "torchrun 3-step"):
        assert f"[gpu_check] {stage}" in proc.stderr
    assert preflight_lines(proc) == []
    assert list(work.iterdir()) == []  # the work directory is removed
    assert not subprocess.run(["pgrep", "-f", str(fake / "nvidia-smi")], capture_output=True).stdout  # no sampler left


def test_a_failing_stage_exits_non_zero_and_is_named(tmp_path):
    proc = gpu_check(tmp_path, "--cpu-smoke", GPU_CHECK_BENCH_ARGS="--no_such_flag 1")
    assert proc.returncode != 0
    assert "FAILED in stage 'bench.py train step'" in proc.stderr
    assert "unrecognized arguments: --no_such_flag" in proc.stderr  # the stage's own message is shown
    assert "| measurement |" not in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without a GPU")
def test_the_gpu_run_without_a_gpu_fails_in_seconds_in_the_preflight(tmp_path):
    start = time.monotonic()
    proc = gpu_check(tmp_path)
    assert proc.returncode == 1 and time.monotonic() - start < 60
    assert f"gpu_check.sh: preflight: torch {torch.__version__} is a CPU-only build: install its CUDA build" in proc.stderr
    assert proc.stderr.rstrip().endswith("gpu_check.sh: FAILED in stage 'preflight' (exit 1)")
    assert "[gpu_check] synthetic data" not in proc.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the preflight's GPU lines differ on a machine with a GPU")
def test_the_preflight_names_every_missing_thing(tmp_path):
    """No `python` (python3 is used), no C compiler, a module that does not import, no Python.h: one line each,
    with what to install, besides the CPU-only torch."""
    used = tmp_path / "python3_was_used"
    path = bin_dir(tmp_path, python3=f'#!/bin/sh\n: > "{used}"\nexec "{sys.executable}" "$@"\n')
    site = tmp_path / "site"
    (site / "tiktoken").mkdir(parents=True)
    (site / "tiktoken" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'tiktoken'\", name='tiktoken')  # as if not installed\n")
    (site / "sitecustomize.py").write_text(  # Python's headers not installed
        "import sysconfig\n_paths = sysconfig.get_paths\n"
        "sysconfig.get_paths = lambda *a, **k: {**_paths(*a, **k), 'include': '/nonexistent/include'}\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = gpu_check(work, path=path, PYTHON=None, CC=None, PYTHONPATH=str(site))
    assert proc.returncode == 1 and used.exists()
    lines = preflight_lines(proc)
    assert [line.split(": ")[2].split(" ")[0] for line in lines] == ["torch", "Python", "Python", "no", "no"], lines
    assert "Python module 'tiktoken' is missing from" in lines[1] and lines[1].endswith("pip install -r requirements.txt")
    assert "Python module 'triton' is missing from" in lines[2]
    assert lines[3] == ("gpu_check.sh: preflight: no C compiler (gcc or clang) on PATH: Triton (torch.compile on "
                        "CUDA) builds with one: apt install gcc (dnf install gcc, conda install gcc), or set CC")
    assert lines[4].startswith("gpu_check.sh: preflight: no Python.h in /nonexistent/include: Triton compiles against "
                               "Python's headers: apt install python3.")
    assert "FAILED in stage 'preflight' (exit 1)" in proc.stderr and list(work.iterdir()) == []


def test_the_cpu_smoke_preflight_needs_no_compiler_and_names_a_missing_module(tmp_path):
    path = bin_dir(tmp_path)
    site = tmp_path / "site"
    (site / "tqdm").mkdir(parents=True)
    (site / "tqdm" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'tqdm'\", name='tqdm')\n")
    proc = gpu_check(tmp_path, "--cpu-smoke", path=path, PYTHONPATH=str(site))
    assert proc.returncode == 1
    assert preflight_lines(proc) == [f"gpu_check.sh: preflight: Python module 'tqdm' is missing from {sys.executable}: "
                                     "pip install -r requirements.txt"]


def test_no_python_at_all_is_one_line(tmp_path):
    proc = gpu_check(tmp_path, path=bin_dir(tmp_path), PYTHON=None)
    assert proc.returncode == 1
    assert preflight_lines(proc) == ["gpu_check.sh: preflight: no python or python3 on PATH: install Python 3.10 or "
                                     "newer, then `pip install -r requirements.txt`; or set PYTHON=/path/to/python"]
    proc = gpu_check(tmp_path, PYTHON="/no/such/python")
    assert preflight_lines(proc) == ["gpu_check.sh: preflight: PYTHON=/no/such/python is not a command: set it to the "
                                     "interpreter that has torch"]


def test_too_little_free_gpu_memory_and_a_wrong_cc_are_refused(tmp_path):
    """A GPU simulated in the preflight's torch (sitecustomize.py): 2 of 80 GiB free, below the 40 it asks for;
    and CC naming no compiler."""
    site = tmp_path / "site"
    (site / "triton").mkdir(parents=True)
    (site / "triton" / "__init__.py").write_text("")
    (site / "sitecustomize.py").write_text(
        "import torch\ntorch.version.cuda = '12.8'\ntorch.cuda.is_available = lambda: True\n"
        "torch.cuda.mem_get_info = lambda *a: (2 * 2**30, 80 * 2**30)\n"
        "torch.cuda.get_device_name = lambda *a: 'NVIDIA H100 80GB HBM3'\n")
    proc = gpu_check(tmp_path, PYTHONPATH=str(site), CC="no-such-cc")
    assert proc.returncode == 1
    assert preflight_lines(proc) == [
        "gpu_check.sh: preflight: CC=no-such-cc is not a command: Triton compiles with $CC; point it at gcc or clang, "
        "or unset it",
        "gpu_check.sh: preflight: 2.0 GiB of 80.0 GiB free on NVIDIA H100 80GB HBM3, the check needs about 40 "
        "(bench.py's 124M step at B=64, T=1024): stop what holds it (nvidia-smi lists it), or set "
        "GPU_CHECK_MIN_FREE_GB lower with GPU_CHECK_BENCH_ARGS='--batch_size 16'"]
    assert "[gpu_check] NVIDIA H100 80GB HBM3: 2.0 of 80.0 GiB free; torch " in proc.stderr


def test_unknown_argument_is_rejected(tmp_path):
    proc = gpu_check(tmp_path, "--fast")
    assert proc.returncode == 2 and "unknown argument '--fast'" in proc.stderr
