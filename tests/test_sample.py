"""sample.py as a user runs it, each run a real process: the samples of a checkpoint that
train_gpt2.py wrote (those of train_gpt2.sample_texts, seeded), --max_length counting the
prompt, a Hugging Face directory with GPT-2's tokenizer, bad input as one line on stderr, and
the stop signals (one line, no traceback; one started ignored stays ignored)."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, child_env, make_corpus, run_program, tiny_flags

import train_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")  # as the child processes run

# a play's scenes: documents with the characters of the default prompt
SCENE = """SCENE {i}.

ROMEO:
Hello, I'm a lover, and my heart is in a language of its own.

JULIET:
What's in a name? That which we call a rose by any other name would smell as sweet.

MERCUTIO:
I am hurt. A plague o' both your houses! I am sped. Is he gone, and hath nothing?
"""
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
PIPES = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def program(name, *flags):
    return run_program(name, flags)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 2-layer character model (block_size 32) trained 4 steps by train_gpt2.py."""
    root = tmp_path_factory.mktemp("sample")
    data = make_corpus(root / "play", [SCENE.format(i=i) for i in range(40)])
    flags = tiny_flags(data, root / "log", seq_len=32, max_steps=4)
    trained = run_program("train_gpt2.py", flags)
    assert trained.returncode == 0, trained.stderr
    return root / "log" / "model_00004.pt"


def samples(stdout):
    """The texts of `sample i: TEXT` lines (a text may hold newlines)."""
    parts = re.split(r"^sample (\d+): ", stdout, flags=re.M)
    assert parts[0] == "" and parts[1::2] == [str(i) for i in range(len(parts) // 2)], stdout
    # print's newline ends each text
    return [text[:-1] for text in parts[2::2]]


def test_the_demo_defaults_are_sample_texts_of_the_checkpoint(checkpoint):
    proc = program("sample.py", "--init_from", checkpoint, "--device", "cpu")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    texts = samples(proc.stdout)
    # 5 sequences of 30 tokens, the prompt's included (a character model: a token a character)
    prompt = "Hello, I'm a language model,"
    assert len(texts) == 5 and all(len(t) == 30 and t.startswith(prompt) for t in texts)
    # what training prints as its samples: seed 42, top-k 50, temperature 1
    model, enc = train_gpt2.load_model(checkpoint)
    assert enc.name == "char" and model.config.block_size == 32
    assert texts == train_gpt2.sample_texts(model, enc, prompt, 5, 30 - len(prompt))


def test_a_seed_gives_the_same_text_in_any_process(checkpoint):
    flags = ["--init_from", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", 40]
    proc = program("sample.py", *flags, "--num_samples", 3, "--seed", 7)
    assert proc.returncode == 0, proc.stderr
    texts = samples(proc.stdout)
    # past block_size (32) the window slides: 6 + 40 characters
    assert all(len(t) == 46 and t.startswith("ROMEO:") for t in texts)
    assert len(set(texts)) > 1  # the samples of one run differ from each other
    # this process draws the same with seed 7, other text with seed 8
    model, enc = train_gpt2.load_model(checkpoint)
    assert texts == train_gpt2.sample_texts(model, enc, "ROMEO:", 3, 40, seed=7)
    assert texts != train_gpt2.sample_texts(model, enc, "ROMEO:", 3, 40, seed=8)


def test_temperature_0_is_greedy(checkpoint):
    flags = ["--init_from", checkpoint, "--prompt", "JULIET:", "--max_length", 20]
    proc = program("sample.py", *flags, "--temperature", 0, "--num_samples", 3)
    assert proc.returncode == 0, proc.stderr
    texts = samples(proc.stdout)
    assert len(texts) == 3 and len(set(texts)) == 1 and len(texts[0]) == 20
    # top-k 1 at any temperature draws the likeliest token too
    model, enc = train_gpt2.load_model(checkpoint)
    assert texts[:1] == train_gpt2.sample_texts(model, enc, "JULIET:", 1, 13, top_k=1, seed=3)


@pytest.mark.gpt2_contract  # GPT-2's weights, imported: a model edit changes what loads
def test_a_hugging_face_directory_samples_gpt2_tokens(tmp_path):
    """A GPT2LMHeadModel directory brings GPT-2's tokenizer; an empty prompt is <|endoftext|>
    alone, one token of --max_length."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_positions=32, n_embd=8, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    flags = ["--init_from", tmp_path / "hf", "--prompt", "", "--max_length", 4]
    proc = program("sample.py", *flags, "--num_samples", 2)
    assert proc.returncode == 0, proc.stderr
    texts = samples(proc.stdout)
    model, enc = train_gpt2.load_model(tmp_path / "hf")
    assert len(texts) == 2 and all(t.startswith("<|endoftext|>") for t in texts)
    # 4 tokens: <|endoftext|> and 3 sampled ones
    assert texts == train_gpt2.sample_texts(model, enc, "", 2, 3)


def test_bad_input_is_one_line(checkpoint, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model\n")
    torch.save({"weights": [1, 2]}, tmp_path / "foreign.pt")
    cases = [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--max_length", 10, "--max_new_tokens", 3], "not allowed with argument"),
        (["--temperature", -0.5], "--temperature must be >= 0"),
        (["--prompt", "ROMEO:", "--max_length", 6], "the prompt is 6 tokens: --max_length 6"),
        (["--prompt", "a" * 40, "--max_new_tokens", 2], "the prompt must be 1 to 31 tokens"),
        (["--prompt", "\N{EURO SIGN}", "--max_new_tokens", 2], "is not in the vocabulary"),
        (["--init_from", tmp_path / "notes.txt"], "not a checkpoint (.pt)"),
        (["--init_from", tmp_path / "gone" / "model.pt"], "no such file or directory"),
        (["--init_from", tmp_path / "foreign.pt"], "not a train_gpt2.py checkpoint"),
    ]
    procs = []
    for flags, _ in cases:
        argv = [sys.executable, "sample.py", "--init_from", checkpoint, *flags]
        argv = [str(a) for a in argv]
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=child_env(), text=True, **PIPES))
    for proc, (flags, expected) in zip(procs, cases):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode != 0 and out == "", (flags, out)
        assert err.count("\n") == 1 and err.startswith("sample.py: error: "), (flags, err)
        assert expected in err, (flags, err)


def start(flags, ignored=()):
    """sample.py started with every stop signal at its default, but `ignored` ignored, as a
    shell starts a job; returned once its handlers are in (its SigCgt has SIGTERM), with torch
    still to import."""

    def preexec():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    argv = [sys.executable, "sample.py", *map(str, flags)]
    proc = subprocess.Popen(argv, cwd=ROOT, env=child_env(), text=True, preexec_fn=preexec, **PIPES)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        caught = int(re.search(r"SigCgt:\s*([0-9a-f]+)", status).group(1), 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return proc
        time.sleep(0.005)
    raise AssertionError("sample.py never caught its stop signals")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_stop_signals_end_it_in_one_line(checkpoint):
    # while torch imports
    importing = start(["--init_from", checkpoint])
    importing.send_signal(signal.SIGINT)
    # while sampling (or still loading: any moment is the same)
    sampling = start(["--init_from", checkpoint, "--max_new_tokens", 10**7, "--num_samples", 1])
    time.sleep(3)
    sampling.send_signal(signal.SIGTERM)
    # SIGHUP ignored from the start (nohup): the run goes on to its samples
    nohup = start(["--init_from", checkpoint, "--num_samples", 2], ignored=[signal.SIGHUP])
    nohup.send_signal(signal.SIGHUP)
    for proc, sig in ((importing, signal.SIGINT), (sampling, signal.SIGTERM)):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig and out == ""
        assert err == f"sample.py: stopped by {sig.name}\n"
    out, err = nohup.communicate(timeout=120)
    assert nohup.returncode == 0 and err == "" and len(samples(out)) == 2
