"""Every program as a user starts it, stopped at a moment of its start: Ctrl-C while a library
loads (torch, numpy, transformers, matplotlib, ...), or torch failing to load (out of memory under
`ulimit -v`), ends it in one line on stderr in its own name, never a traceback. The Ctrl-C comes
exactly as the module is first imported (an import hook installed by sitecustomize raises
KeyboardInterrupt there), so each case is the same every run."""

import resource

import pytest
from conftest import child_env, default_signals, run_program, tiny_flags, train_tiny

# Ctrl-C as the module INTERRUPT_AT is first imported, in every process that has it on its path
SITECUSTOMIZE = """
import os
import sys


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("INTERRUPT_AT"):
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, Interrupt())
"""


@pytest.fixture(scope="module")
def checkpoint(small_corpus, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("run") / "log"
    train_tiny(small_corpus, log_dir, max_steps=1)
    return log_dir / "model_00001.pt"


# (program, its arguments, the module being imported when Ctrl-C comes)
STARTS = [
    ("train_gpt2.py", ["{train}"], "torch"),
    ("fineweb.py", ["--local", "{text}", "--out_dir", "{tmp}/corpus"], "numpy"),
    ("fineweb.py", ["--local", "{text}", "--out_dir", "{tmp}/corpus"], "tqdm"),
    ("plot.py", ["{log}"], "fineweb"),
    ("plot.py", ["{log}", "--out", "{tmp}/curves.png"], "matplotlib"),
    ("sample.py", ["--init_from", "{ckpt}"], "torch"),
    ("sample.py", ["--init_from", "gpt2"], "transformers"),
    ("hellaswag.py", ["--model", "{ckpt}"], "torch"),
    ("hellaswag.py", ["--model", "{ckpt}", "--data", "{tmp}/hs.parquet"], "pyarrow"),
    ("export_hf.py", ["{ckpt}", "{tmp}/hf"], "torch"),
    ("export_hf.py", ["{ckpt}", "{tmp}/hf"], "transformers"),
    ("export_hf.py", ["{ckpt}", "{tmp}/hf"], "safetensors"),
    ("bench.py", ["--device", "cpu"], "torch"),
]


def arguments(args, small_corpus, checkpoint, tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("Some text.\n" * 20)
    (tmp_path / "hs.parquet").write_bytes(b"")
    names = dict(text=text, tmp=tmp_path, log=checkpoint.parent, ckpt=checkpoint)
    out = []
    for arg in args:
        if arg == "{train}":
            out += tiny_flags(small_corpus, tmp_path / "log", max_steps=2)
        else:
            out.append(arg.format(**names))
    return out


@pytest.mark.parametrize("program, args, module", STARTS, ids=[f"{p} at {m}" for p, _, m in STARTS])
def test_ctrl_c_while_a_program_starts_is_one_line(
    small_corpus, checkpoint, tmp_path, program, args, module
):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = child_env(PYTHONPATH=str(tmp_path / "site"), INTERRUPT_AT=module)
    before = sorted(p.name for p in checkpoint.parent.iterdir())
    proc = run_program(program, arguments(args, small_corpus, checkpoint, tmp_path), env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[0].startswith(f"{program}: ") and (
        "interrupted" in lines[0] or "stopped" in lines[0]
    )
    # nothing half-made: no output of the program (a corpus begun is kept, its files done: the
    # same command continues it), the run it read as it was
    if (tmp_path / "corpus").exists():
        assert "run the same command to continue" in lines[0]
    assert not (tmp_path / "hf").exists()
    assert not (tmp_path / "log").exists() and not (tmp_path / "curves.png").exists()
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == before


def little_memory():
    """A shell's start, with 300 MB of address space: too little to map libtorch."""
    default_signals()
    resource.setrlimit(resource.RLIMIT_AS, (300 * 2**20, resource.RLIM_INFINITY))


@pytest.mark.parametrize(
    "program", ["train_gpt2.py", "sample.py", "hellaswag.py", "export_hf.py", "bench.py"]
)
def test_torch_that_does_not_load_is_one_line(program):
    proc = run_program(program, ["--help"], preexec_fn=little_memory)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"{program}: error: torch does not load (")
    assert "give the process more memory (ulimit -v)" in lines[0]
