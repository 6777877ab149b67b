"""Helpers shared by test modules (conftest.py sets up the test process's own environment)."""

import contextlib
import os
import signal
from pathlib import Path

import fineweb


def child_env() -> dict:
    """The environment of a program a test starts: one thread each, unbuffered output, no GPT2_DEBUG (it turns
    clean errors into tracebacks) and no torchrun variables inherited from a parent."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("GPT2_DEBUG", None)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def measured(log_dir) -> dict:
    """A run's log.txt as plot.read_log parses it, without the kinds that time the machine (ms, tok/s, MFU):
    what two runs of the same computation must agree on."""
    from plot import read_log

    return {kind: values for kind, values in read_log(Path(log_dir) / "log.txt").items() if kind in measured.KINDS}


measured.KINDS = ("train", "val", "hella", "lr", "norm")


def many_characters(n: int) -> str:
    """Code points U+0100 onwards, n of them less the surrogates (which UTF-8 cannot encode) among them."""
    return "".join(chr(c) for c in range(0x100, 0x100 + n) if not 0xD800 <= c < 0xE000)


def default_stop_signals() -> dict:
    """Every stop signal at its default action, as a terminal's foreground job has them, whatever the test runner
    inherited (a suite started under nohup ignores SIGHUP, one started with `&` SIGINT); returns the handlers it
    replaced. fineweb.STOP_SIGNALS is the trainer's set too (test_run_files checks). A subprocess's preexec_fn."""
    return {sig: signal.signal(sig, signal.SIG_DFL) for sig in fineweb.STOP_SIGNALS}


@contextlib.contextmanager
def stop_signals_at_default():
    """default_stop_signals() in the test process for the block; the previous handlers come back after it."""
    previous = default_stop_signals()
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
