"""scripts/gpu_check.sh and gpu_check.py as a user runs them: the CPU smoke runs every stage
(toy sizes, a real torchrun run and its resume) and records each one as it ends, in a results
file that is valid line by line, and the table; a tiny deadline skips the stages cleanly and
still writes the table; a stop signal stops the trainer it started and the check, in one line;
bad flags and a torch without CUDA are one line. (The GPU's numbers need a GPU: this checks the
program, not them.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, child_env

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# the smoke's stages in order (its batch sizes are 4, 2 and 1)
STAGES = [
    "preflight",
    "correct_fp32",
    "correct_bf16",
    "correct_compiled",
    "step_B4",
    "step_B2",
    "step_B1",
    "val",
    "val_eager",
    "hellaswag",
    "sample",
    "checkpoint",
    "eval_share",
    "corpus",
    "train",
    "resume",
]


def env_for(**extra) -> dict:
    """The environment of a run: this interpreter, the caches left to gpu_check.py."""
    env = child_env(**{"PYTHON": sys.executable, **extra})
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "GPU_CHECK_OUT"):
        env.pop(key, None)
    return env


def gpu_check(*args, timeout=600, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), *map(str, args)],
        cwd=ROOT,
        env=env_for(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def runs(out: Path) -> list[Path]:
    return sorted(out.glob("run_*"))


def results(run_dir: Path) -> list[dict]:
    """results.jsonl, every line a JSON object; the first is the run's, then a stage a line."""
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert entries[0]["stage"] == "run" and all(isinstance(e, dict) for e in entries)
    return entries


def table_rows(run_dir: Path) -> list[list[str]]:
    lines = (run_dir / "table.md").read_text().splitlines()
    assert lines[2] == "| | stage | status | s | result |", lines[:3]
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines[4:]]


@pytest.mark.slow
def test_cpu_smoke_records_every_stage_and_writes_the_table(tmp_path):
    out = tmp_path / "out"
    # stage b compares with GPT-2's reference file: the contract test below runs it
    proc = gpu_check("--cpu-smoke", "--out", out, "--stages", "cde")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    [run_dir] = runs(out)
    entries = results(run_dir)
    head = entries[0]
    assert head["mode"] == "cpu" and head["compile"] == "eager"
    # the compile caches are fixed, in --out, for the next run (and the trainer's processes)
    assert head["inductor_cache"] == str(out / "inductor_cache")
    assert head["triton_cache"] == str(out / "triton_cache")
    stages = entries[1:]
    assert [e["stage"] for e in stages] == STAGES
    problems = [(e["stage"], e.get("error") or e.get("reason")) for e in stages]
    assert [e["status"] for e in stages[1:4]] == ["skipped"] * 3, problems
    stages = [stages[0]] + stages[4:]
    assert all(e["status"] == "ok" for e in stages), problems
    assert all(e["seconds"] >= 0 and e["result"]["summary"] for e in stages)
    by_name = {e["stage"]: e["result"] for e in stages}
    assert by_name["step_B4"]["attention"]["kind"] in ("flash", "efficient", "math")
    assert by_name["val"]["tokens"] == 8 * 4 * 32
    assert by_name["hellaswag"]["n"] == 16
    assert 0 < by_name["eval_share"]["share"]
    assert by_name["val_eager"]["loss"] == pytest.approx(by_name["val"]["loss"], rel=1e-5)
    assert set(by_name["eval_share"]["shares"]) == {"compiled", "eager"}
    for name in ("train", "resume"):
        assert all(by_name[name]["found"].values()), by_name[name]
    log_dir = run_dir / "train_log"
    # the trainer's checkpoints were written (found), resumed from, then removed
    assert "resumed from" in (run_dir / "resume.log").read_text()
    assert not list(log_dir.glob("model_*.pt"))
    assert len((log_dir / "runs.jsonl").read_text().splitlines()) == 2
    assert not (run_dir / "model_check.pt").exists()
    # the table: a row a stage, the same text printed at the end
    rows = table_rows(run_dir)
    assert [r[1] for r in rows] == STAGES
    assert [r[2] for r in rows] == ["ok"] + ["skipped"] * 3 + ["ok"] * (len(STAGES) - 4)
    assert proc.stdout.endswith((run_dir / "table.md").read_text())
    assert "CPU smoke" in proc.stdout


def test_a_tiny_deadline_skips_the_stages_and_still_writes_the_table(tmp_path):
    """Two runs in one --out: two run directories, the preflight run, every other stage
    recorded as skipped, with why."""
    out = tmp_path / "out"
    for _ in range(2):
        proc = gpu_check("--cpu-smoke", "--out", out, "--deadline", "0.5", timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(runs(out)) == 2
    for run_dir in runs(out):
        stages = results(run_dir)[1:]
        assert [e["stage"] for e in stages] == STAGES
        assert stages[0]["status"] == "ok"
        for entry in stages[1:]:
            assert entry["status"] == "skipped", entry
            assert entry["reason"].endswith("s left before the deadline"), entry
        rows = table_rows(run_dir)
        assert [r[2] for r in rows] == ["ok"] + ["skipped"] * (len(STAGES) - 1)


def test_only_the_chosen_stages_run(tmp_path):
    proc = gpu_check("--cpu-smoke", "--out", tmp_path, "--stages", "d", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = {e["stage"]: e for e in results(runs(tmp_path)[0])[1:]}
    ran = [name for name, e in entries.items() if e["status"] == "ok"]
    assert ran == ["preflight", "val", "val_eager", "hellaswag", "sample", "checkpoint"]
    # stage d builds the warm model itself; eval_share needs stage c's step
    assert entries["eval_share"]["reason"] == "needs step_B4, which did not run or failed"
    assert entries["train"]["reason"] == "not in --stages"


@pytest.mark.slow
def test_a_stop_signal_stops_the_trainer_and_the_check_in_one_line(tmp_path):
    """SIGTERM while torchrun trains: the trainer's process group is stopped, the stage is
    recorded as stopped and the rest as skipped, the table written, one line on stderr."""
    out = tmp_path / "out"
    argv = ["bash", str(SCRIPT), "--cpu-smoke", "--out", str(out), "--stages", "e"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env_for(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 240
    log = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(out.glob("run_*/train.log"))
        if found and "tokens a step" in found[0].read_text():
            log = found[0]
            break
        time.sleep(0.2)
    assert log is not None, "the trainer did not start"
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    run_dir = log.parent
    assert proc.returncode == 1
    assert stderr.splitlines() == [f"gpu_check.py: stopped by SIGTERM; what ran is in {run_dir}"]
    entries = {e["stage"]: e for e in results(run_dir)[1:]}
    assert entries["train"]["status"] == "failed"
    assert entries["train"]["error"] == "stopped by SIGTERM"
    assert entries["resume"] == dict(entries["resume"], status="skipped")
    assert entries["resume"]["reason"] == "stopped by SIGTERM"
    assert [r[1] for r in table_rows(run_dir)] == STAGES
    # nothing of the trainer's is left running
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert left.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_without_cuda_the_gpu_run_is_one_line_and_writes_nothing(tmp_path):
    proc = gpu_check("--out", tmp_path / "out", timeout=120)
    assert proc.returncode == 1
    # a CUDA build on a machine without a GPU says so differently
    why = "is a CPU-only build" if torch.version.cuda is None else "sees no CUDA GPU"
    assert proc.stderr.splitlines() == [
        f"gpu_check.py: error: torch {torch.__version__} {why}: run it on a GPU, or --cpu-smoke"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [["--deadline", "0"], ["--stages", "xyz", "--compile", "max"]],
)
def test_bad_flags_are_one_line(tmp_path, args):
    proc = gpu_check("--cpu-smoke", "--out", tmp_path, *args, timeout=120)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("gpu_check.py: error: ")
    assert not list(tmp_path.iterdir())


def test_no_python_is_one_line(tmp_path):
    proc = gpu_check("--cpu-smoke", PYTHON="no-such-python", timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "gpu_check.sh: error: no no-such-python on PATH: set PYTHON to the python that has torch"
    ]


@pytest.mark.gpt2_contract
def test_the_cpu_matches_gpt2s_reference_file(tmp_path):
    # stage b on the CPU: fp32 equals the file made on a CPU in fp32 (after an edit of the
    # model: python scripts/gpu_check.py --make-reference)
    proc = gpu_check("--cpu-smoke", "--out", tmp_path, "--stages", "b", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    entries = {e["stage"]: e for e in results(runs(tmp_path)[0])[1:]}
    for name in ("correct_fp32", "correct_bf16", "correct_compiled"):
        assert entries[name]["status"] == "ok", entries[name]
    assert entries["correct_fp32"]["result"]["logits_abs"] < 1e-4


@pytest.mark.gpt2_contract
def test_the_reference_is_the_shipped_models():
    # the file is GPT-2's (its seeded init's checksum matches this model's); after an edit of
    # the model: python scripts/gpu_check.py --make-reference
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check

    reference = json.loads((ROOT / "scripts" / "gpu_reference.json").read_text())
    case = reference["cases"]["tiny"]
    _, init = gpu_check.seeded_model(case["model"], "cpu")
    assert init == pytest.approx(case["init"], rel=1e-6)


def test_the_reference_holds_both_cases():
    """Made on a CPU in fp32 by --make-reference: 124M for the GPU, tiny for the smoke."""
    reference = json.loads((ROOT / "scripts" / "gpu_reference.json").read_text())
    assert reference["made_with"]["dtype"] == "float32"
    for name, vocab in (("gpt2-124M", 50304), ("tiny", 50304)):
        case = reference["cases"][name]
        assert case["model"]["vocab_size"] == vocab and case["steps"] == 3
        assert len(case["losses"]) == 4 and case["losses"][-1] < case["losses"][0]
        assert len(case["logits"]) == case["B"] * 2 * 8 and case["init"] > 0
    assert os.access(SCRIPT, os.X_OK)


def test_a_rank_that_ignores_sigterm_is_killed_with_its_launcher(tmp_path):
    # torchrun starts each rank in a session of its own: stop_group must reach it all the same
    import gpu_check as check

    pid_file = tmp_path / "rank.pid"
    rank = tmp_path / "stubborn.py"
    rank.write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--local-addr=127.0.0.1", "--nproc_per_node=1", str(rank), str(pid_file)]
    proc = subprocess.Popen(launcher, env=child_env(), start_new_session=True)
    deadline = time.monotonic() + 120
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the rank never started"
        time.sleep(0.2)
    rank_pid = int(pid_file.read_text())
    assert rank_pid in check.descendants(proc.pid)
    check.stop_group(proc, grace=2)
    # the rank is gone (reaped by init once the launcher died), not left holding a GPU
    while time.monotonic() < deadline:
        if not Path(f"/proc/{rank_pid}").exists():
            break
        time.sleep(0.2)
    assert not Path(f"/proc/{rank_pid}").exists()
