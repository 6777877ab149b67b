"""Test set-up: offline hubs, caches in a temp dir, the project importable, small corpora made by
fineweb.py itself, and the trainer run as a real process or in this one."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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
# pytest -n 3 runs three test processes on a 2-core machine: one thread each
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"


def pytest_collection_modifyitems(items):
    # The slow tests first: `pytest -n 3` hands tests out in order, and a long one handed out
    # last keeps one worker busy after the other has finished.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
    curves=False,  # matplotlib's picture takes seconds on a small CPU: drawn where it is tested
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
    """A corpus of `docs` written by fineweb.py's command line (in this process: the tests of
    fineweb.py run it as a real process), as a user makes one."""
    import fineweb

    out_dir = Path(out_dir)
    text = out_dir.with_name(out_dir.name + ".txt")
    text.write_text("\n\n\n".join(docs) + "\n")
    args = ["--local", str(text), "--tokenizer", tokenizer, "--out_dir", str(out_dir)]
    if shard_size:
        args += ["--shard_size", str(shard_size)]
    fineweb.main(args)
    return out_dir


# -----------------------------------------------------------------------------
# Real processes: started as a shell starts them, waited for by what they write (a line, a file),
# never by a clock sized to one model's speed; PATIENCE only ends a test that hangs.

PATIENCE = 300  # seconds


def child_env(**extra):
    """The environment of a program a test starts: one thread, unbuffered, no torchrun
    variables inherited from a parent."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    for key in TORCHRUN_VARIABLES + ("MASTER_PORT",):
        env.pop(key, None)
    return env


def default_signals():
    """A shell's start: the stop signals at their default action (pytest-xdist ignores SIGINT)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


def command_of(program, args):
    """python PROGRAM ARGS; program: a file of the repository, or a whole command (a list)."""
    prefix = [sys.executable, str(ROOT / program)] if isinstance(program, str) else program
    return [str(a) for a in prefix] + [str(a) for a in args]


def run_program(program, args=(), timeout=PATIENCE, env=None, cwd=ROOT, preexec_fn=None):
    """python PROGRAM ARGS as a real process, to its end, its output captured; preexec_fn: its
    set-up (default_signals at least)."""
    return subprocess.run(
        command_of(program, args),
        cwd=cwd,
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=preexec_fn or default_signals,
    )


def start(program, args=(), env=None, cwd=ROOT, **popen):
    """python PROGRAM ARGS started in the background; its output goes to files (a pipe nobody
    reads would fill and stop it): finish() returns it."""
    out = tempfile.TemporaryFile("w+")
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        command_of(program, args),
        cwd=cwd,
        env=env or child_env(),
        stdout=out,
        stderr=err,
        preexec_fn=popen.pop("preexec_fn", default_signals),
        **popen,
    )
    proc.output = (out, err)
    return proc


def output(proc):
    """(stdout, stderr) of a process start() started, so far."""
    texts = []
    for f in proc.output:
        f.seek(0)
        texts.append(f.read())
    return texts


def finish(proc, timeout=PATIENCE):
    """(return code, stdout, stderr) once it has exited; past the timeout it is killed (with
    every process below it) and the test fails."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc, grace=1)
        raise AssertionError(f"still running after {timeout} s: {output(proc)}") from None
    out, err = output(proc)
    return proc.returncode, out, err


def run_with_stdout_closed(program, args):
    """python PROGRAM ARGS whose stdout's reader is gone from the start (`... | head -0`): (its
    exit status, its stderr)."""
    proc = subprocess.Popen(
        command_of(program, args),
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,
    )
    proc.stdout.close()
    _, err = proc.communicate(timeout=PATIENCE)
    return proc.returncode, err.decode()


def no_position_table(monkeypatch):
    """RoPE's or ALiBi's edit as the weights see it: GPT without its learned position table (in a
    fork without one, nothing to delete); the name of the weight it drops."""
    import train_gpt2

    build = train_gpt2.GPT.__init__

    def edited(self, config):
        build(self, config)
        if "wpe" in self.transformer:
            del self.transformer["wpe"]

    monkeypatch.setattr(train_gpt2.GPT, "__init__", edited)
    return "transformer.wpe.weight"


def wait_for(condition, proc, timeout=PATIENCE):
    """Poll condition() while proc runs: it must come true before proc ends."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(
                f"ended (rc {proc.returncode}) before the condition: {output(proc)}"
            )
        if time.monotonic() > deadline:
            stop_group(proc, grace=1)
            raise AssertionError(f"no condition after {timeout} s: {output(proc)}")
        time.sleep(0.02)


def descendants(pid):
    """Every process below pid, read from /proc (torchrun starts each rank in a session of its
    own, so the launcher's process group does not hold them)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...", and comm may hold spaces or parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended meanwhile
        parent_of[int(stat.parent.name)] = int(fields[1])
    found = []
    below = {pid}
    while below:
        below = {child for child, parent in parent_of.items() if parent in below}
        found += below
    return found


def group_left(leader):
    """The live processes (zombies aside) of the process group that leader leads: its workers
    keep the group after the leader dies, so this finds them when descendants() cannot."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended meanwhile
        if fields[2] == str(leader) and fields[0] != "Z":
            left.append(int(stat.parent.name))
    return left


def stop_group(proc, grace=20):
    """SIGTERM to proc's process group, then SIGKILL to it and every process below it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=grace)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        pass
    for pid in descendants(proc.pid) + [proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait()


def torchrun(program_args, ranks=2, env=None, timeout=PATIENCE):
    """torchrun of program_args (a script, its flags) on `ranks` ranks: (return code, stdout,
    stderr) once it has ended; a hang kills the launcher and its ranks and fails the test."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--local-addr=127.0.0.1", f"--nproc_per_node={ranks}"]
    proc = start(launcher, program_args, env, start_new_session=True)
    return finish(proc, timeout)


def one_line_error(returncode, stderr, prefix, message=""):
    """A failure told in exactly one line on stderr, `PREFIX: error: ...` holding message."""
    lines = stderr.strip().splitlines()
    assert returncode not in (0, None), stderr
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f"{prefix}: error: "), lines[0]
    assert message in lines[0], lines[0]


def cases(names, contract=()):
    """pytest parameters of names, those in `contract` marked gpt2_contract (GPT-2 as shipped:
    an architecture edit may change what they see)."""
    return [pytest.param(n, marks=pytest.mark.gpt2_contract) if n in contract else n for n in names]


def run_main(main, argv, capsys):
    """main(argv) in this process, as a shell would see it: (exit status, stderr)."""
    with pytest.raises(SystemExit) as exit:
        main([str(a) for a in argv])
    code = exit.value.code
    err = capsys.readouterr().err
    if isinstance(code, str):  # sys.exit(message): Python prints it and exits 1
        return 1, err + code + "\n"
    return code or 0, err


def main_error(main, argv):
    """The one-line error a program's main(argv) exits with, in this process."""
    with pytest.raises(SystemExit) as exit:
        main([str(a) for a in argv])
    assert exit.value.code not in (0, None), "main() succeeded"
    return str(exit.value.code)


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


def train_tiny(data_root, log_dir, **overrides):
    """train_gpt2.train of a TINY config in this process: (its result, the lines it logged)."""
    import train_gpt2

    lines = []
    result = train_gpt2.train(tiny_config(data_root, log_dir, **overrides), log=lines.append)
    return result, lines


def sigterm_at_val_pass(monkeypatch, n):
    """The trainer in this process gets a SIGTERM at the start of its n-th val pass (from 1), as
    a scheduler sends it: the pass ends early and the run stops with a checkpoint."""
    import train_gpt2

    evaluate = train_gpt2.evaluate_val_loss
    calls = []

    def val_with_a_signal(*args):
        calls.append(1)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(*args)

    monkeypatch.setattr(train_gpt2, "evaluate_val_loss", val_with_a_signal)


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


@pytest.fixture(scope="session")
def quiet_transformers():
    """What the tools' main() asks of transformers through the environment (no progress bars or
    warnings before their one line), which a fresh process reads when it imports transformers:
    in this process it may be imported already."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


@pytest.fixture
def one_thread():
    """One torch thread: bit-level comparisons between runs in this process assume the same
    kernels and thread count."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
