"""Test set-up: offline hubs, caches in a temp dir, the project importable, small corpora made by
fineweb.py itself, and the trainer run as a real process or in this one."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # gpu_check's helpers, for the tests

# Before anything imports transformers or datasets: never wait on the network, never write to
# ~/.cache. Every program a test starts inherits this.
CACHE = tempfile.mkdtemp(prefix="gpt2-test-cache-")
atexit.register(shutil.rmtree, CACHE, ignore_errors=True)
os.makedirs(os.path.join(CACHE, "tmp"))
os.environ.update(
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    WANDB_MODE="disabled",
    HF_HOME=os.path.join(CACHE, "hf"),
    XDG_CACHE_HOME=CACHE,
    MPLCONFIGDIR=os.path.join(CACHE, "mpl"),
    TORCHINDUCTOR_CACHE_DIR=os.path.join(CACHE, "inductor"),
    TOKENIZERS_PARALLELISM="false",
    TMPDIR=os.path.join(CACHE, "tmp"),
)
# pytest -n 2 runs two test processes on a 2-core machine: one thread each
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")

# A model and batch small enough for a CPU test: any GPT that GPTConfig builds trains with them.
TINY = dict(
    n_layer=2,
    n_head=2,
    n_embd=32,
    batch_size=4,
    seq_len=16,
    total_batch_size=128,
    max_steps=12,
    warmup_steps=3,
    max_lr=3e-3,
    eval_interval=6,
    val_tokens=128,
    hellaswag_interval=0,
    sample_interval=0,
    ckpt_interval=6,
    compile="false",
    device="cpu",
)


def documents(n, seed=0):
    """n short English-like documents of different lengths (with boundaries, like real text)."""
    import random

    rng = random.Random(seed)
    words = "the a of to and in is it that was for on as with his they at be this from".split()
    words += "king queen night love sword crown river stone light dark heart time".split()
    docs = []
    for i in range(n):
        sentences = []
        for _ in range(rng.randint(2, 8)):
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 14)))
            sentences.append(sentence.capitalize() + ".")
        docs.append(f"Document {i}. " + " ".join(sentences))
    return docs


def make_corpus(out_dir, docs, tokenizer="char", shard_size=None):
    """A corpus of `docs` written by fineweb.py (in a real process), as a user makes one."""
    out_dir = Path(out_dir)
    text = out_dir.with_name(out_dir.name + ".txt")
    text.write_text("\n\n\n".join(docs) + "\n")
    args = ["--local", str(text), "--tokenizer", tokenizer, "--out_dir", str(out_dir)]
    if shard_size:
        args += ["--shard_size", str(shard_size)]
    proc = run_program("fineweb.py", args)
    assert proc.returncode == 0, proc.stderr
    return out_dir


def child_env(**extra):
    """The environment of a program a test starts: one thread, unbuffered, no torchrun
    variables inherited from a parent."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    for key in TORCHRUN_VARIABLES + ("MASTER_PORT",):
        env.pop(key, None)
    return env


def run_program(program, args, timeout=300, env=None, cwd=ROOT):
    """python PROGRAM ARGS as a real process, its output captured."""
    command = [sys.executable, str(ROOT / program)] + [str(a) for a in args]
    return subprocess.run(
        command,
        cwd=cwd,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# python -c THIS PROGRAM ARGS (or python THIS.py PROGRAM ARGS) runs PROGRAM as __main__, which
# sends itself SIGTERM the moment it starts to import torch (under torchrun: the rank named by
# SIGTERM_RANK alone); at exit it prints whether torch had loaded
SIGTERM_AT_TORCH_IMPORT = """
import atexit, os, runpy, signal, sys

class SigtermAtTorchImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)

atexit.register(lambda: print("torch loaded:", "torch" in sys.modules))
if os.environ.get("RANK", "0") == os.environ.get("SIGTERM_RANK", "0"):
    sys.meta_path.insert(0, SigtermAtTorchImport())
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as python PROGRAM has it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_with_sigterm_at_torch_import(program, args=()):
    """A stop request in the middle of torch's import: a program must take it only once torch
    has loaded (an exception raised inside torch's C++ start-up aborts the process)."""
    command = [sys.executable, "-c", SIGTERM_AT_TORCH_IMPORT, str(ROOT / program), *args]
    return subprocess.run(
        command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120
    )


def flags(**values):
    """--name value flags, in the order given."""
    out = []
    for name, value in values.items():
        out += [f"--{name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return out


def tiny_config(data_root, log_dir, **overrides):
    """A TrainConfig of the TINY shape for an in-process run."""
    import train_gpt2

    values = dict(TINY, data_root=data_root, log_dir=log_dir, **overrides)
    values = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    return train_gpt2.TrainConfig(**values)


def tiny_flags(data_root, log_dir, **overrides):
    return flags(**{**TINY, "data_root": data_root, "log_dir": log_dir, **overrides})


def read_log(log_dir):
    """log.txt as {kind: {step: value}} (every line, the last value of a step winning)."""
    series = {}
    for line in (Path(log_dir) / "log.txt").read_text().splitlines():
        step, kind, value = line.split()
        series.setdefault(kind, {})[int(step)] = float(value)
    return series


@pytest.fixture(scope="session")
def char_corpus(tmp_path_factory):
    """A character-level corpus of 60 documents (about 25k tokens; an epoch is ~40 steps)."""
    return make_corpus(tmp_path_factory.mktemp("corpus") / "char", documents(60))


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """A character-level corpus of 12 documents: the tiny model reads an epoch in a few steps."""
    return make_corpus(tmp_path_factory.mktemp("corpus") / "small", documents(12, seed=1))


@pytest.fixture(scope="session")
def gpt2_corpus(tmp_path_factory):
    """The same 60 documents in GPT-2's tokens."""
    docs = documents(60)
    return make_corpus(tmp_path_factory.mktemp("corpus") / "gpt2", docs, tokenizer="gpt2")


@pytest.fixture
def one_thread():
    """One torch thread: bit-level comparisons between runs in this process assume the same
    kernels and thread count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
