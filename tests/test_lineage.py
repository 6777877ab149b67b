"""What a run may touch in its log_dir: only its own lineage's checkpoints (resume, overwrite, prune), one run at a
time, nothing at all when its checks fail; and what it accepts on the command line: finite numbers, whole flag
names, paths of the right kind.

Runs are tiny (vocab 64, 2 layers of width 32, 64-token steps) on numpy-made shards, in-process through
train_gpt2.main unless a test is about separate processes."""

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import launcher
import train_gpt2
from run_files import checkpoint_paths
from helpers import child_env, measured

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one torch thread for every test here
RUN = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, seq_len=16, batch_size=2,
           total_batch_size=64, warmup_steps=1, max_lr=3e-3, eval_interval=2, val_tokens=64, device="cpu",
           dtype="float32", compile="false", hellaswag_interval=0, sample_interval=0)


def flags(data, log_dir, **overrides) -> list[str]:
    return [text for k, v in {**RUN, "data_root": data, "log_dir": log_dir, **overrides}.items()
            for text in (f"--{k}", str(v))]


def names(log_dir) -> list[str]:
    return [p.name for p in checkpoint_paths(log_dir)]


def load(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def fingerprint(log_dir) -> dict:
    """Every file of log_dir with its bytes: what 'left untouched' is checked against."""
    return {p.name: p.read_bytes() for p in Path(log_dir).iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    np.save(root / "x_val_000000.npy", rng.integers(0, 64, 512).astype(np.uint16))
    np.save(root / "x_train_000001.npy", rng.integers(0, 64, 3000).astype(np.uint16))
    return root


def error_of(argv) -> str:
    """The one line a refused run ends with: main's `error: ...` (exit 1), or argparse's (exit 2, on stderr)."""
    import contextlib
    import io

    err = io.StringIO()
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(err):
        train_gpt2.main([str(a) for a in argv])
    message = exc.value.code if isinstance(exc.value.code, str) else err.getvalue().strip()
    assert exc.value.code not in (0, None) and message.count("\n") == 0, message
    return message


# ----------------------------------------------------------------------------------------------------------
# Lineages


def test_max_steps_below_the_resumed_step_is_refused_and_changes_nothing(data, tmp_path):
    log = tmp_path / "log"
    train_gpt2.main(flags(data, log, max_steps=6, ckpt_interval=2))
    before = fingerprint(log)
    message = error_of(flags(data, log, max_steps=4, ckpt_interval=2, resume="auto"))
    assert message == (f"error: --max_steps 4 is below the step of {log / 'model_00006.pt'} (6): raise --max_steps, "
                       "or resume an earlier checkpoint with --resume PATH")
    assert fingerprint(log) == before  # model_00004.pt keeps step 4's weights; nothing else written either


def test_a_branch_is_a_new_lineage_that_never_touches_the_old_one(data, tmp_path):
    """Resuming an older checkpoint branches: the new run's checkpoints get their own names, --keep_last prunes
    only them, and after a crash --resume auto continues the branch (written last), not the abandoned run."""
    log = tmp_path / "log"
    train_gpt2.main(flags(data, log, max_steps=6, ckpt_interval=2))
    old = fingerprint(log)
    assert names(log) == ["model_00002.pt", "model_00004.pt", "model_00006.pt"]
    train_gpt2.main(flags(data, log, max_steps=5, ckpt_interval=1, keep_last=1, resume=log / "model_00002.pt"))
    branch = [n for n in names(log) if n not in old]
    assert len(branch) == 1 and re.fullmatch(r"model_00005_[0-9a-f]{8}\.pt", branch[0]), names(log)
    assert all(fingerprint(log)[name] == blob for name, blob in old.items() if name.endswith(".pt"))
    lineage = load(log / branch[0])["lineage"]
    assert branch[0] == f"model_00005_{lineage['id']}.pt" and lineage["parent"]["step"] == 2
    assert lineage["id"] != load(log / "model_00006.pt")["lineage"]["id"]

    # the branch continues to step 8: auto picks the checkpoint written last, and keeps the branch's names
    messages = []
    train_gpt2.train(train_gpt2.parse_train_args(flags(data, log, max_steps=8, ckpt_interval=1, keep_last=1,
                                                         resume="auto")), log=messages.append)
    assert any(m.startswith(f"resumed from {log / branch[0]} at step 5") for m in messages), messages
    assert names(log) == ["model_00002.pt", "model_00004.pt", "model_00006.pt", f"model_00008_{lineage['id']}.pt"]
    assert all(fingerprint(log)[name] == blob for name, blob in old.items() if name.endswith(".pt"))
    assert load(log / f"model_00008_{lineage['id']}.pt")["lineage"] == lineage


def test_the_branch_equals_a_straight_run_from_the_same_checkpoint(data, tmp_path):
    """The branch's weights are those of resuming the same checkpoint in a fresh directory: lineage only names
    files, it changes no computation."""
    train_gpt2.main(flags(data, tmp_path / "a", max_steps=4, ckpt_interval=2))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model_00002.pt").write_bytes((tmp_path / "a" / "model_00002.pt").read_bytes())
    train_gpt2.main(flags(data, tmp_path / "a", max_steps=3, resume=tmp_path / "a" / "model_00002.pt"))
    train_gpt2.main(flags(data, tmp_path / "b", max_steps=3, resume="auto"))
    branch = next(p for p in checkpoint_paths(tmp_path / "a") if p.name.startswith("model_00003_"))
    a, b = load(branch)["model"], load(tmp_path / "b" / "model_00003.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_fresh_run_in_a_used_log_dir_writes_beside_the_old_checkpoints(data, tmp_path):
    log = tmp_path / "log"
    train_gpt2.main(flags(data, log, max_steps=2))
    old = fingerprint(log)
    messages = []
    train_gpt2.train(train_gpt2.parse_train_args(flags(data, log, max_steps=2, seed=7)), log=messages.append)
    assert all(fingerprint(log)[name] == blob for name, blob in old.items() if name.endswith(".pt"))
    assert len(names(log)) == 2 and any("holds other runs' checkpoints" in m for m in messages)


# ----------------------------------------------------------------------------------------------------------
# One run per log_dir


def test_a_log_dir_in_use_is_refused_naming_the_holder(data, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    fd = os.open(log / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running train_gpt2.py holds it
    try:
        message = error_of(flags(data, log, max_steps=2))
    finally:
        os.close(fd)
    assert message.startswith(f"error: --log_dir {log} is in use by another run (pid {os.getpid()}: ")
    assert message.endswith("wait for it, or choose another --log_dir") and "\n" not in message
    assert [p.name for p in log.iterdir()] == [".lock"]  # the holder's empty lock file, nothing of the refused run


@pytest.mark.slow
def test_second_process_stops_at_once_and_a_killed_run_leaves_no_lock(data, tmp_path):
    """Two processes on one log_dir: the second exits at once with one line naming the first's pid. SIGKILL of the
    first frees the directory (the kernel drops the lock): --resume auto then finishes the run."""
    log = tmp_path / "log"
    cmd = [sys.executable, "train_gpt2.py", *flags(data, log, max_steps=400, ckpt_interval=5)]
    first = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not names(log) if log.is_dir() else True:
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = launcher.run(cmd, cwd=ROOT, env=child_env(), timeout=120)
        assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
        assert f"is in use by another run (pid {first.pid}: " in second.stderr and "train_gpt2.py" in second.stderr
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    end = int(names(log)[-1][6:11]) + 2  # two steps past the newest checkpoint the killed run left
    resumed = launcher.run([*cmd, "--max_steps", str(end), "--resume", "auto"], cwd=ROOT, env=child_env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout and f"model_{end:05d}.pt" in names(log)


# ----------------------------------------------------------------------------------------------------------
# Refused runs write nothing; numbers, flags and paths


def test_a_refused_run_leaves_no_files(data, tmp_path):
    for argv in (flags(tmp_path / "no_data", tmp_path / "new_log"),  # fails on the data
                 flags(data, tmp_path / "new_log", resume=tmp_path / "missing.pt"),  # fails on the resume
                 flags(data, tmp_path / "new_log", seq_len=64)):  # fails in the argument checks
        error_of(argv)
        assert not (tmp_path / "new_log").exists()
    (tmp_path / "old_log").mkdir()
    error_of(flags(data, tmp_path / "old_log", resume=tmp_path / "missing.pt"))  # fails after claiming old_log
    assert [p.name for p in (tmp_path / "old_log").iterdir()] == [".lock"]  # empty, and it outlives no lock


FLOAT_FLAGS = [f.name for f in train_gpt2.dataclasses.fields(train_gpt2.TrainConfig) if f.type == "float"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_every_float_flag_refuses_non_finite_values(flag, value, capsys):
    with pytest.raises(SystemExit) as exc:
        train_gpt2.parse_train_args([f"--{flag}={value}"])
    assert exc.value.code == 2
    assert f"argument --{flag}: expected a finite number, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--eval", "5"], ["--shuffle_shards", "true"], ["--max_st", "3"]])
def test_flags_are_matched_exactly(argv, capsys):
    with pytest.raises(SystemExit):
        train_gpt2.parse_train_args(argv)
    assert f"unrecognized arguments: {' '.join(argv)}" in capsys.readouterr().err


def test_paths_of_the_wrong_kind(data, tmp_path):
    (tmp_path / "a_dir.pt").mkdir()
    loop = tmp_path / "loop.pt"
    loop.symlink_to(loop)
    weights_only = tmp_path / "weights.pt"
    model = train_gpt2.GPT(train_gpt2.GPTConfig(32, 64, 2, 2, 32))
    torch.save({"model": model.state_dict(), "model_config": train_gpt2.dataclasses.asdict(model.config)}, weights_only)
    (tmp_path / "a_file").write_text("x")
    cases = {
        "resume": (tmp_path / "a_dir.pt", "is a directory, not a file"),
        "init_from": (tmp_path / "a_dir.pt", "is a directory, not a file"),
        "data_root": (tmp_path / "a_file", "data directory " + str(tmp_path / "a_file") + " is a file, not a directory"),
        "hellaswag_data": (tmp_path, "is a directory, not a file"),
    }
    for flag, (path, phrase) in cases.items():
        message = error_of(flags(data, tmp_path / "log", max_steps=2, **{flag: path}))
        assert phrase in message and "\n" not in message, (flag, message)
    assert "Too many levels of symbolic links" in error_of(flags(data, tmp_path / "log", resume=loop))
    message = error_of(flags(data, tmp_path / "log", resume=weights_only))
    assert message.endswith(f"holds weights but no optimizer or loader state to resume; start from its weights with "
                            f"--init_from {weights_only}")


@pytest.mark.slow
def test_a_full_disk_while_checkpointing_is_one_line_and_loses_nothing(data, tmp_path):
    """RLIMIT_FSIZE below a checkpoint's size stands in for a full disk: the resumed run stops at its first save
    with one line; the earlier checkpoint and every other file stay as they were; no temp file is left."""
    log = tmp_path / "log"
    train_gpt2.main(flags(data, log, max_steps=2))
    before = fingerprint(log)
    size = (log / "model_00002.pt").stat().st_size

    proc = launcher.run([sys.executable, "train_gpt2.py", *flags(data, log, max_steps=4, ckpt_interval=1, resume="auto")],
                        cwd=ROOT, env=child_env(), timeout=300, file_size_limit=size // 2)  # then a write fails with EFBIG
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: could not write {log / 'model_00003.pt'} (File too large)") and "--resume auto" in last
    assert {k: v for k, v in fingerprint(log).items() if k.endswith(".pt")} == \
           {k: v for k, v in before.items() if k.endswith(".pt")}
    assert not [p for p in log.iterdir() if ".tmp" in p.name]


# ----------------------------------------------------------------------------------------------------------
# Loss spikes

SPIKE_STEP = 20  # after the guard's warm-up of 16 accepted updates


def spiking_forward(monkeypatch):
    """GPT.forward whose loss at SPIKE_STEP's first micro-batch is 100 times too large (a bad batch)."""
    original, calls = train_gpt2.GPT.forward, [0]

    def forward(self, idx, targets=None, kv_cache=None):
        logits, loss = original(self, idx, targets, kv_cache)
        if targets is not None:
            calls[0] += 1
            if calls[0] - 1 == 2 * SPIKE_STEP:  # 2 micro-steps per step
                loss = loss * 100
        return logits, loss

    monkeypatch.setattr(train_gpt2.GPT, "forward", forward)


def test_a_spike_is_skipped_and_the_run_goes_on_as_if_that_update_never_happened(data, tmp_path, monkeypatch):
    """--skip_spikes 6 with an injected spike: that update is skipped (logged as kind 'spike', counted in the final
    metrics); every later loss equals a run without the guard whose update at that step was dropped by hand."""
    common = dict(max_steps=SPIKE_STEP + 6, eval_interval=0, warmup_steps=5)
    spiking_forward(monkeypatch)
    guarded = train_gpt2.train(train_gpt2.parse_train_args(flags(data, tmp_path / "guarded", skip_spikes=6, **common)),
                               log=lambda *a: None)
    monkeypatch.undo()

    adamw_step, calls = torch.optim.AdamW.step, [0]

    def step_except_the_spike(self, *args, **kwargs):  # the reference: no guard, no spike, no update at SPIKE_STEP
        calls[0] += 1
        return None if calls[0] - 1 == SPIKE_STEP else adamw_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step_except_the_spike)
    train_gpt2.main(flags(data, tmp_path / "reference", **common))
    log, reference = measured(tmp_path / "guarded"), measured(tmp_path / "reference")
    from plot import read_log

    spikes = read_log(tmp_path / "guarded" / "log.txt")["spike"]
    assert [s for s, _ in spikes] == [SPIKE_STEP] and spikes[0][1] > 6 and guarded["skipped"] == 1
    later = [(s, v) for s, v in log["train"] if s > SPIKE_STEP]
    assert later and later == [(s, v) for s, v in reference["train"] if s > SPIKE_STEP]
    assert log["train"][:SPIKE_STEP] == reference["train"][:SPIKE_STEP]  # nothing was skipped before it
