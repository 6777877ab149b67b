"""Reliability of a training run: killed, stopped or restarted, it loses nothing (its final checkpoint is
bit-identical to an uninterrupted run's); a non-finite loss or gradient stops it, or skips that one update,
and never puts bad weights in a checkpoint; and nothing the project loads can run code.

Kills, signals and torchrun restarts need real processes: `train_gpt2.py` runs in a subprocess (one torch
thread) on a tiny model (2 layers of width 32, vocabulary 64) for 40 steps of 64 tokens, with a checkpoint
every 5 steps and a val loss every 10, on numpy-made shards whose train split wraps around once. The
non-finite cases patch the model in-process, which a subprocess cannot do.
"""

import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import train_gpt2
from plot import read_log
from run_files import checkpoint_paths
from train_gpt2 import GPTConfig, TrainConfig
from helpers import child_env, default_stop_signals, measured

ROOT = Path(__file__).resolve().parents[1]
STEPS = 40
RUN = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, seq_len=16, batch_size=2,
           total_batch_size=64, max_steps=STEPS, warmup_steps=5, max_lr=3e-3, ckpt_interval=5, eval_interval=10,
           val_tokens=256, device="cpu", dtype="float32", compile="false", hellaswag_interval=0, sample_interval=0)
TIMEOUT = 400  # seconds for any one process: generous, the machine may be shared
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
TRAIN_LINE = re.compile(r"^step\s+(\d+)/\d+ \| loss ", re.MULTILINE)


# ----------------------------------------------------------------------------------------------------------
# Helpers


def flags(data: Path, log_dir: Path, **overrides) -> list[str]:
    """The command-line flags of the standard run (RUN), writing to log_dir."""
    values = {**RUN, "data_root": data, "log_dir": log_dir, **overrides}
    return [text for key, value in values.items() for text in (f"--{key}", str(value))]


class Run:
    """A command started in the repository root whose stdout and stderr are collected as they come: a test
    can watch it while it runs."""

    def __init__(self, cmd: list[str], env: Optional[dict] = None, new_session: bool = False):
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env or child_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=default_stop_signals,
                                     start_new_session=new_session)  # a group of its own: a terminal's Ctrl-C
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._out = bytearray()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        """Everything printed so far (reads what waits in the pipe; never blocks)."""
        while not self.proc.stdout.closed:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._out += chunk
        return self._out.decode(errors="replace")

    def wait_for(self, condition, what: str, timeout: float = TIMEOUT):
        """Poll until condition() holds; fail if the run ends first or the time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            exited = self.proc.poll() is not None
            if exited and not condition():
                pytest.fail(f"the run exited ({self.proc.returncode}) before {what}:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout} s:\n{self.output()[-4000:]}")
            self.output()  # keep the pipe drained: a full pipe would block the run
            time.sleep(0.005)

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Wait for the exit status, collecting the output."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                tail = self.output()[-4000:]
                self.stop()
                pytest.fail(f"still running after {timeout} s: {' '.join(map(str, self.cmd))}\n{tail}")
            self.output()
            time.sleep(0.02)
        self.output()
        return self.proc.returncode

    def stop(self):
        """SIGKILL the process if it is still running, and its descendants (torchrun starts each worker in a
        session of its own, so they are found by parentage, not by process group); reap it."""
        if self.proc.poll() is None:
            try:
                family = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                family = []
            self.proc.kill()
            for child in family:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.wait(timeout=60)
        self.proc.stdout.close()


class Runs:
    """The runs a test starts; whatever is still running when the test ends is killed."""

    def __init__(self):
        self.started: list[Run] = []

    def start(self, cmd: list[str], **kwargs) -> Run:
        self.started.append(Run(cmd, **kwargs))
        return self.started[-1]

    def train(self, *args) -> Run:
        return self.start([sys.executable, "train_gpt2.py", *map(str, args)])

    def stop_all(self):
        for run in self.started:
            run.stop()


@pytest.fixture
def runs():
    started = Runs()
    yield started
    started.stop_all()


@pytest.fixture(scope="module")
def module_runs():
    started = Runs()
    yield started
    started.stop_all()


def checkpoints(log_dir: Path) -> list[str]:
    return [p.name for p in checkpoint_paths(log_dir)] if log_dir.is_dir() else []


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_state(path: Path, expected_path: Path):
    """Two checkpoints with bit-identical weights and optimizer state, at the same step and data position."""
    got, expected = load(path), load(expected_path)
    assert got["model"].keys() == expected["model"].keys()
    differ = [k for k in expected["model"] if not torch.equal(got["model"][k], expected["model"][k])]
    assert not differ, f"weights differ from the uninterrupted run's: {differ}"
    for i, state in expected["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(got["optimizer"]["state"][i][key], value), f"optimizer state {i}.{key} differs"
    assert (got["step"], got["train_loader"]) == (expected["step"], expected["train_loader"])


def trained_steps(text: str) -> list[int]:
    """The steps whose training line ('step N/total | loss ...') the output shows."""
    return [int(m) for m in TRAIN_LINE.findall(text)]


def wait_stopped(pid: int, timeout: float = 30):
    """After SIGSTOP: wait until the kernel reports the process stopped (so it prints nothing more)."""
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.001)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """fineweb.py-style uint16 shards, ids < 64: val 1024 tokens, train 2000 (the 40 x 64 tokens of a run
    wrap around it once, so the loader's epoch is part of what a resume must restore)."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    np.save(root / "x_val_000000.npy", rng.integers(0, 64, 1024).astype(np.uint16))
    np.save(root / "x_train_000001.npy", rng.integers(0, 64, 2000).astype(np.uint16))
    return root


class Reference:
    """An uninterrupted run, started once per module and awaited only when a test needs its result, so it
    overlaps with the test's own runs."""

    def __init__(self, run: Run, log_dir: Path):
        self.run, self.log_dir = run, log_dir

    def final(self) -> Path:
        assert self.run.finish() == 0, self.run.output()[-4000:]
        return self.log_dir / f"model_{STEPS:05d}.pt"

    def log(self) -> dict:
        self.final()
        return measured(self.log_dir)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory, module_runs) -> Reference:
    log_dir = tmp_path_factory.mktemp("reference")
    return Reference(module_runs.train(*flags(data, log_dir)), log_dir)


@pytest.fixture(scope="module")
def reference_ddp(data, tmp_path_factory, module_runs) -> Reference:
    log_dir = tmp_path_factory.mktemp("reference_ddp")
    cmd = [*TORCHRUN, "--standalone", "train_gpt2.py", *flags(data, log_dir)]
    return Reference(module_runs.start(cmd), log_dir)


# ----------------------------------------------------------------------------------------------------------
# SIGKILL: nothing lost


def test_sigkill_at_any_moment_then_resume_auto_loses_nothing(data, reference, runs, tmp_path):
    """SIGKILL at an arbitrary moment after the first checkpoint (mid-step, mid-evaluation or mid-save),
    then the same command with --resume auto: the final checkpoint is bit-identical to the uninterrupted
    run's, log.txt holds the same values for every step, and --keep_last 2 leaves exactly two checkpoints."""
    log_dir = tmp_path / "log"
    args = flags(data, log_dir, keep_last=2)
    run = runs.train(*args)
    run.wait_for(lambda: checkpoints(log_dir), "the first checkpoint")
    delay = random.uniform(0.0, 0.5)
    time.sleep(delay)
    os.kill(run.pid, signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL, f"the run ended before the kill ({delay=:.3f} s): nothing was tested"
    at_kill = checkpoints(log_dir)
    assert 1 <= len(at_kill) <= 3, at_kill  # keep_last prunes right after each save
    assert f"model_{STEPS:05d}.pt" not in at_kill

    resumed = runs.train(*args, "--resume", "auto")
    assert resumed.finish() == 0, resumed.output()[-4000:]
    assert f"resumed from {log_dir / at_kill[-1]} at step {int(at_kill[-1][6:11])}" in resumed.output()
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference.final())
    assert measured(log_dir) == reference.log()  # every step and evaluation, the same values
    assert checkpoints(log_dir) == [f"model_{STEPS - 5:05d}.pt", f"model_{STEPS:05d}.pt"]


def test_resume_auto_skips_a_torn_newest_checkpoint_and_a_temp_file(data, reference, runs, tmp_path):
    """A killed run whose newest checkpoint is cut short (a copy interrupted, a disk that filled up) and
    that left the temp file of a save in progress (what a kill inside atomic_write leaves): --resume auto
    prints a warning naming the torn file, resumes from the newest readable checkpoint, and ends where the
    uninterrupted run ends."""
    log_dir = tmp_path / "log"
    args = flags(data, log_dir, keep_last=2)
    run = runs.train(*args)
    run.wait_for(lambda: "model_00010.pt" in checkpoints(log_dir), "the second checkpoint")
    os.kill(run.pid, signal.SIGKILL)
    assert run.finish() == -signal.SIGKILL
    good = checkpoint_paths(log_dir)[-1]
    step = int(good.stem.split("_")[1])
    assert step < STEPS
    blob = good.read_bytes()
    torn = log_dir / f"model_{step + 5:05d}.pt"
    torn.write_bytes(blob[: len(blob) // 2])
    (log_dir / f".{torn.name}.tmp{run.pid}").write_bytes(blob[: len(blob) // 3])

    resumed = runs.train(*args, "--resume", "auto")
    assert resumed.finish() == 0, resumed.output()[-4000:]
    out = resumed.output()
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "skipping unusable checkpoint" in warnings[0] and torn.name in warnings[0], out
    assert f"resumed from {good} at step {step}" in out
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference.final())
    assert measured(log_dir) == reference.log()
    assert checkpoints(log_dir) == [f"model_{STEPS - 5:05d}.pt", f"model_{STEPS:05d}.pt"]


# ----------------------------------------------------------------------------------------------------------
# SIGTERM / SIGINT: a clean stop


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_signal_checkpoints_the_current_step_and_exits_cleanly(sig, data, reference, runs, tmp_path):
    """SIGTERM (a scheduler's pre-emption), SIGINT (Ctrl-C) or SIGHUP (a closed terminal) mid-run: the step in progress finishes, a
    checkpoint of it is written, the process says so and exits 0; no further step is trained. The run is
    frozen with SIGSTOP while the signal is sent, so the test knows which step it was in: the last one
    printed (s) or the next (s + 1). --resume auto then ends bit-identical to the uninterrupted run."""
    log_dir = tmp_path / "log"
    run = runs.train(*flags(data, log_dir))
    run.wait_for(lambda: max(trained_steps(run.output()), default=-1) >= 7, "step 7")
    os.kill(run.pid, signal.SIGSTOP)
    wait_stopped(run.pid)
    s = max(trained_steps(run.output()))  # the stopped process printed nothing after this
    os.kill(run.pid, sig)
    os.kill(run.pid, signal.SIGCONT)
    t0 = time.monotonic()
    assert run.finish() == 0, run.output()[-4000:]
    seconds = time.monotonic() - t0
    out = run.output()
    last = max(trained_steps(out))
    assert last in (s, s + 1), (s, last)  # at most the step in progress, nothing after it
    saved = log_dir / f"model_{last + 1:05d}.pt"
    assert f"stopped by {sig.name} at step {last + 1}" in out and f"checkpoint: {saved}" in out
    assert f"continue: python train_gpt2.py {' '.join(map(str, flags(data, log_dir)))} --resume auto" in out
    assert checkpoints(log_dir)[-1] == saved.name and load(saved)["step"] == last + 1
    assert max(step for step, _ in read_log(log_dir / "log.txt")["train"]) == last
    assert seconds < 120, f"{seconds:.0f} s from the signal to the exit"  # a step and a save, on a busy machine

    resumed = runs.train(*flags(data, log_dir), "--resume", "auto")
    assert resumed.finish() == 0, resumed.output()[-4000:]
    assert f"resumed from {saved} at step {last + 1}" in resumed.output()
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference.final())
    assert measured(log_dir) == reference.log()


@pytest.mark.slow
def test_ctrl_c_while_the_first_step_compiles_saves_after_that_step_and_resumes(data, runs, tmp_path):
    """Ctrl-C to the whole process group (the trainer and torch.compile's compile workers) while the first step is
    being compiled: the compile and the step finish, a checkpoint of step 1 is written, exit 0 without a
    traceback; the same command with --resume auto trains the rest."""
    log_dir = tmp_path / "log"
    args = flags(data, log_dir, compile="true", max_steps=4, warmup_steps=1, eval_interval=0)
    cold = {**child_env(), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    run = runs.start([sys.executable, "train_gpt2.py", *args], env=cold, new_session=True)
    # a child process (inductor's C++ compiler, its compile workers) is the compile at work
    run.wait_for(lambda: psutil.Process(run.pid).children(recursive=True), "the first step's compile")
    assert trained_steps(run.output()) == [], "step 0 ended before the signal: nothing was tested"
    os.killpg(run.pid, signal.SIGINT)
    assert run.finish() == 0, run.output()[-4000:]
    out = run.output()
    assert "Traceback" not in out and trained_steps(out) == [0], out[-4000:]
    assert "stopped by SIGINT at step 1" in out and checkpoints(log_dir) == ["model_00001.pt"]

    resumed = runs.train(*args, "--resume", "auto")
    assert resumed.finish() == 0, resumed.output()[-4000:]
    assert trained_steps(resumed.output()) == [1, 2, 3] and checkpoints(log_dir)[-1] == "model_00004.pt"


@pytest.mark.skipif(shutil.which("nohup") is None, reason="no nohup on PATH")
def test_a_run_started_with_nohup_trains_through_hangups(data, reference, runs, tmp_path):
    """`nohup python train_gpt2.py ...` asks that a closed terminal not end the run: SIGHUP while torch loads and
    again mid-run changes nothing, and the run ends as the uninterrupted one."""
    log_dir = tmp_path / "log"
    run = runs.start(["nohup", sys.executable, "-X", "importtime", "train_gpt2.py", *map(str, flags(data, log_dir))])
    run.wait_for(lambda: "| torch" in run.output(), "torch's import")
    os.kill(run.pid, signal.SIGHUP)
    run.wait_for(lambda: max(trained_steps(run.output()), default=-1) >= 7, "step 7")
    os.kill(run.pid, signal.SIGHUP)
    assert run.finish() == 0, run.output()[-4000:]
    assert "stopped" not in run.output() and max(trained_steps(run.output())) == STEPS - 1
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference.final())
    assert measured(log_dir) == reference.log()


@pytest.mark.parametrize("program", ["train_gpt2.py", "sample.py", "hellaswag.py"])
def test_a_signal_while_starting_is_one_line_without_a_traceback(program, data, runs, tmp_path):
    """Ctrl-C (or SIGTERM, SIGHUP) while the program still imports torch: the trainer ends with status 0 saying it
    stopped before training started (nothing written), sample.py and hellaswag.py with one line; no traceback."""
    args = {"train_gpt2.py": flags(data, tmp_path / "log"), "sample.py": ["--init_from", tmp_path / "none.pt"],
            "hellaswag.py": ["--model", tmp_path / "none.pt"]}[program]
    run = runs.start([sys.executable, "-X", "importtime", program, *map(str, args)])
    run.wait_for(lambda: "| torch" in run.output() or "torch._C" in run.output(), "torch's import")  # mid-import
    os.kill(run.pid, signal.SIGINT)
    status, out = run.finish(), run.output()
    lines = [line for line in out.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in out and (status, lines) == ((0, ["SIGINT: stopped before training started"]) if program == "train_gpt2.py" else
                                                          (1, [f"{program}: interrupted"])), out[-3000:]
    assert not (tmp_path / "log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_torchrun_passes_a_stop_signal_to_every_rank_which_saves_then_resumes_identical(sig, data, reference_ddp, runs, tmp_path):
    """SIGTERM to torchrun (a scheduler ending the job; or SIGUSR1, SLURM's warning, which torchrun passes on when
    told to, as the README says): torchrun sends it to both workers, which finish their step, write a checkpoint of
    it and exit 0; then torchrun itself re-raises the signal (its own SignalException traceback, not the
    trainer's). The same command with --resume auto ends as the uninterrupted run."""
    log_dir = tmp_path / "log"
    handled = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"] if sig == signal.SIGUSR1 else []
    cmd = [*TORCHRUN, *handled, "--standalone", "train_gpt2.py", *flags(data, log_dir)]
    run = runs.start(cmd)
    run.wait_for(lambda: max(trained_steps(run.output()), default=-1) >= 7, "step 7")
    os.kill(run.pid, sig)
    run.finish()
    out = run.output()
    stopped = re.search(rf"stopped by {sig.name} at step (\d+)", out)
    assert stopped, out[-4000:]
    assert checkpoints(log_dir)[-1] == f"model_{int(stopped[1]):05d}.pt"
    tracebacks = out.count("Traceback")
    assert tracebacks == out.count("torch.distributed.elastic.multiprocessing.api.SignalException") <= 1, out[-6000:]
    resumed = runs.start([*TORCHRUN, "--standalone", "train_gpt2.py", *flags(data, log_dir), "--resume", "auto"])
    assert resumed.finish() == 0, resumed.output()[-4000:]
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference_ddp.final())
    assert measured(log_dir) == reference_ddp.log()


# ----------------------------------------------------------------------------------------------------------
# torchrun: a worker dies, the group restarts and resumes


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1], ids=["rank0", "rank1"])
def test_torchrun_restarts_after_a_worker_dies_and_ends_identical(victim, data, reference_ddp, runs, tmp_path):
    """torchrun --max-restarts=1 with --resume auto: SIGKILL one worker (rank 0, which writes the
    checkpoints, or rank 1) at an arbitrary moment after the first checkpoint. torchrun stops the other
    worker, starts both again, they resume from the newest checkpoint and finish: the final checkpoint is
    bit-identical to an uninterrupted 2-process run's."""
    log_dir = tmp_path / "log"
    cmd = [*TORCHRUN, "--standalone", "--max-restarts=1", "train_gpt2.py", *flags(data, log_dir), "--resume", "auto"]
    run = runs.start(cmd)
    run.wait_for(lambda: checkpoints(log_dir), "the first checkpoint")
    time.sleep(random.uniform(0.0, 0.5))
    children = [(p, p.environ()) for p in psutil.Process(run.pid).children()]
    workers = {int(env["RANK"]): p for p, env in children if "RANK" in env}
    assert sorted(workers) == [0, 1], children
    workers[victim].kill()
    assert run.finish(timeout=180) == 0, run.output()[-6000:]  # a hang is a failure too (a good run: ~15 s)
    out = run.output()
    assert out.count("starting fresh") == 1 and out.count("resumed from") == 1, out[-6000:]
    assert re.search(rf"resumed from {re.escape(str(log_dir))}/model_\d{{5}}\.pt at step \d+", out)
    assert_same_state(log_dir / f"model_{STEPS:05d}.pt", reference_ddp.final())
    assert measured(log_dir) == reference_ddp.log()


# ----------------------------------------------------------------------------------------------------------
# Non-finite loss or gradient (in-process: the model is patched to produce one)

NAN_STEP = 7  # the step whose first micro-batch is poisoned
SHORT = dict(max_steps=12, ckpt_interval=5, eval_interval=0, val_tokens=0)  # checkpoints at 5, 10 and 12


def poison(monkeypatch, kind: str, grad_accum: int = 2) -> dict:
    """Patch GPT.forward so that step NAN_STEP goes wrong: "loss" returns a NaN loss, "grad" a finite loss
    whose gradient is infinite, "weight" writes a NaN into the token table. Returns {step: a copy of the
    state dict at the step's first forward}, filled in as training runs."""
    original = train_gpt2.GPT.forward
    calls, snapshots = [0], {}

    def forward(self, idx, targets=None, kv_cache=None):
        if targets is None:  # evaluation or sampling: not a training step
            return original(self, idx, targets, kv_cache)
        step, micro = divmod(calls[0], grad_accum)
        calls[0] += 1
        if micro == 0:
            snapshots[step] = {k: v.detach().clone() for k, v in self.state_dict().items()}
        if step == NAN_STEP and micro == 0 and kind == "weight":
            with torch.no_grad():
                self.transformer.wte.weight[3, 5] = float("nan")
        logits, loss = original(self, idx, targets, kv_cache)
        if step == NAN_STEP and micro == 0:
            if kind == "loss":
                loss = loss * float("nan")
            elif kind == "grad":
                loss.register_hook(lambda grad: grad * float("inf"))
        return logits, loss

    monkeypatch.setattr(train_gpt2.GPT, "forward", forward)
    return snapshots


def all_finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in load(path)["model"].values())


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_nonfinite_step_stops_the_run_naming_step_and_last_good_checkpoint(kind, data, tmp_path, monkeypatch):
    """A NaN loss, or a finite loss with an infinite gradient, at step 7: the run exits with an error (not
    a traceback) that names the step and the last good checkpoint, before any update with it, and writes
    no checkpoint after it."""
    poison(monkeypatch, kind)
    with pytest.raises(SystemExit) as exc:
        train_gpt2.main(flags(data, tmp_path, **SHORT))
    message = str(exc.value.code)
    assert message.startswith("error: non-finite loss"), message
    assert f"at step {NAN_STEP};" in message and f"last good checkpoint: {tmp_path / 'model_00005.pt'}" in message
    assert ("grad norm" in message) and ("--skip_nonfinite true" in message)
    assert checkpoints(tmp_path) == ["model_00005.pt"]
    assert all_finite(tmp_path / "model_00005.pt")


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_skip_nonfinite_skips_exactly_that_update(kind, data, tmp_path, monkeypatch):
    """With --skip_nonfinite true the poisoned step's update is skipped (the weights after it equal those
    before it; AdamW counts one step fewer), the skip is logged, and training runs to the end."""
    snapshots = poison(monkeypatch, kind)
    messages = []
    metrics = train_gpt2.train(TrainConfig(**{**RUN, **SHORT, "data_root": str(data), "log_dir": str(tmp_path),
                                              "skip_nonfinite": True}), log=messages.append)
    assert metrics["step"] == SHORT["max_steps"] and not metrics.get("stopped")
    skipped = [m for m in messages if "update skipped" in m]
    assert len(skipped) == 1 and skipped[0].startswith(f"step {NAN_STEP:5d} | non-finite"), messages
    before, after = snapshots[NAN_STEP], snapshots[NAN_STEP + 1]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the skipped step changed nothing
    assert not all(torch.equal(snapshots[NAN_STEP - 1][k], before[k]) for k in before)  # other steps do update
    final = load(metrics["checkpoint"])
    assert all(float(s["step"]) == SHORT["max_steps"] - 1 for s in final["optimizer"]["state"].values())
    assert all(all_finite(tmp_path / name) for name in checkpoints(tmp_path))


def test_nonfinite_weights_are_never_checkpointed(data, tmp_path, monkeypatch):
    """Weights that became NaN (here written into the token table at step 7) make every later step
    non-finite; with --skip_nonfinite true those updates are skipped, and the next checkpoint is refused
    instead of written: the newest checkpoint on disk stays the last good one."""
    poison(monkeypatch, "weight")
    with pytest.raises(SystemExit) as exc:
        train_gpt2.main(flags(data, tmp_path, **SHORT, skip_nonfinite="true"))
    assert str(exc.value.code) == "error: refusing to checkpoint non-finite weights at step 10"
    assert checkpoints(tmp_path) == ["model_00005.pt"]
    assert all_finite(tmp_path / "model_00005.pt")


# ----------------------------------------------------------------------------------------------------------
# Trust: nothing loaded runs code

# Unsafe loads that are the point of a test (the unsafe way must be shown to work for the safe refusal to mean
# anything, or a test unpickles what it pickled itself): (file, enclosing function).
UNSAFE_ON_PURPOSE = {("tests/test_model.py", "test_load_checkpoint_runs_no_pickled_code"),
                     ("tests/test_fineweb.py", "test_char_tokenizer_and_tokenizer_from_manifest")}  # its own pickle


def project_sources() -> dict[str, str]:
    """The project's Python code by name: every .py file outside hidden directories (.venv, .git, caches)
    and virtual environments, and the code cells of the notebooks (IPython magics and shell lines blanked)."""
    sources = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                       and not Path(dirpath, d, "pyvenv.cfg").exists()]
        for name in filenames:
            path = Path(dirpath, name)
            if name.endswith(".py"):
                sources[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
            elif name.endswith(".ipynb"):
                cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
                for i, cell in enumerate(cells):
                    if cell["cell_type"] == "code":
                        lines = "".join(cell["source"]).splitlines()
                        code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)
                        sources[f"{path.relative_to(ROOT)} cell {i}"] = code
    return sources


def dotted_name(node: ast.AST) -> str:
    """'torch.load' for torch.load(...), 'eval' for eval(...); '' for anything else (model.eval() is 'model.eval')."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def calls_by_function(tree: ast.AST):
    """(enclosing function name or '', call node) for every call in the module."""
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, inner)
    yield from visit(tree, "")


def keyword_is(call: ast.Call, name: str, value) -> bool:
    return any(k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is value for k in call.keywords)


def test_every_load_is_weights_only_and_nothing_is_evaluated():
    """Every torch.load passes weights_only=True (a checkpoint is data; unpickling may run code), numpy
    never unpickles, and no code calls the exec/eval builtins. Calls are found by parsing, so a multi-line
    call counts and model.eval() does not."""
    sources = project_sources()
    assert "train_gpt2.py" in sources and any(name.startswith("tests/") for name in sources)
    problems, torch_loads = [], 0
    for name, code in sources.items():
        for function, call in calls_by_function(ast.parse(code, filename=name)):
            callee, where = dotted_name(call.func), f"{name}:{call.lineno}"
            if callee == "torch.load":
                torch_loads += 1
                if not keyword_is(call, "weights_only", True) and (name, function) not in UNSAFE_ON_PURPOSE:
                    problems.append(f"{where}: torch.load without weights_only=True")
            elif callee in ("eval", "exec", "builtins.eval", "builtins.exec"):
                problems.append(f"{where}: {callee}()")
            elif callee in ("pickle.load", "pickle.loads") and (name, function) not in UNSAFE_ON_PURPOSE:
                problems.append(f"{where}: {callee}()")
            elif callee in ("np.load", "numpy.load") and keyword_is(call, "allow_pickle", True):
                problems.append(f"{where}: np.load(allow_pickle=True)")
    assert torch_loads >= 2, "the scan found no torch.load calls: it is not looking at the code"
    assert not problems, "\n".join(problems)


PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def non_plain(value, where: str = "checkpoint") -> list[str]:
    """Paths of the entries that are not tensors, numbers, strings, None, or dicts/lists/tuples of those."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in
                ([f"{where} key {k!r}"] if not isinstance(k, (str, int)) else []) + non_plain(v, f"{where}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in non_plain(v, f"{where}[{i}]")]
    return [] if isinstance(value, PLAIN) else [f"{where}: {type(value).__name__}"]


def test_checkpoint_is_plain_data_and_its_configs_are_dicts(data, tmp_path):
    """A real checkpoint loads with weights_only=True and holds only tensors, numbers, strings and
    containers of them; the model and training configs are plain dicts that rebuild the same configs."""
    cfg = TrainConfig(**{**RUN, "max_steps": 2, "ckpt_interval": 0, "data_root": str(data), "log_dir": str(tmp_path)})
    path = train_gpt2.train(cfg, log=lambda *a: None)["checkpoint"]
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert non_plain(ckpt) == []
    assert type(ckpt["model_config"]) is dict and type(ckpt["train_config"]) is dict
    assert GPTConfig(**ckpt["model_config"]) == GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)
    assert TrainConfig(**ckpt["train_config"]) == cfg
