"""Helpers shared by test modules (conftest.py sets up the test process's own environment)."""

import os
import signal
from pathlib import Path


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


def default_stop_signals():
    """A subprocess's preexec_fn: SIGTERM, SIGINT and SIGHUP as a terminal's foreground job has them, whatever the
    test runner inherited (a suite started under nohup ignores SIGHUP, one started with `&` SIGINT)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
