"""sample.py: the samples of a checkpoint that train_gpt2.py wrote are train_gpt2.sample_texts'
(seeded, in any process); the default is a number of new tokens, --max_length counts the prompt;
a Hugging Face directory brings GPT-2's tokenizer; bad input, a model it cannot sample and an
absurd size are one line on stderr (through main(), in this process)."""

import math
import os
import re

import pytest
import torch
from conftest import (
    cases,
    make_corpus,
    one_line_error,
    run_main,
    run_program,
    run_with_stdout_closed,
    tiny_config,
)

import harness
import sample
import train_gpt2

# one thread, as the child process runs; transformers quiet, as main() has it
pytestmark = pytest.mark.usefixtures("one_thread", "quiet_transformers")

# a play's scenes: documents with the characters of the default prompt
SCENE = """SCENE {i}.

ROMEO:
Hello, I'm a lover, and my heart is in a language of its own.

JULIET:
What's in a name? That which we call a rose by any other name would smell as sweet.

MERCUTIO:
I am hurt. A plague o' both your houses! I am sped. Is he gone, and hath nothing?
"""
PROMPT = "Hello, I'm a language model,"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A 2-layer character model (block_size 32) trained 4 steps by train_gpt2.py."""
    root = tmp_path_factory.mktemp("sample")
    data = make_corpus(root / "play", [SCENE.format(i=i) for i in range(40)])
    train_gpt2.train(tiny_config(data, root / "log", seq_len=32, max_steps=4), log=lambda *a: None)
    return root / "log" / "model_00004.pt"


@pytest.fixture(scope="module")
def model(checkpoint):
    model, enc = train_gpt2.load_model(checkpoint)
    assert enc.name == "char" and model.config.block_size == 32
    return model, enc


def samples(stdout):
    """The texts of `sample i: TEXT` lines (a text may hold newlines)."""
    parts = re.split(r"^sample (\d+): ", stdout, flags=re.M)
    assert parts[0] == "" and parts[1::2] == [str(i) for i in range(len(parts) // 2)], stdout
    # print's newline ends each text
    return [text[:-1] for text in parts[2::2]]


def sample_main(argv, capsys):
    """sample.main(argv) in this process: the samples it prints."""
    sample.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert err == "", err
    return samples(out)


def test_the_default_is_new_tokens_and_max_length_counts_the_prompt(checkpoint, model, capsys):
    model, enc = model
    texts = sample_main(["--init_from", checkpoint, "--device", "cpu"], capsys)
    # 5 samples of the prompt and 100 new tokens (a character model: a token a character), past
    # block_size (32) the window slides
    assert len(texts) == 5 and all(len(t) == len(PROMPT) + 100 for t in texts)
    # what training prints as its samples: seed 42, top-k 50, temperature 1
    assert texts == train_gpt2.sample_texts(model, enc, PROMPT, 5, 100)
    assert len(set(texts)) > 1  # the samples of one run differ from each other
    # the course's demo: 30 tokens a sample, the prompt's included
    texts = sample_main(["--init_from", checkpoint, "--max_length", 30], capsys)
    assert texts == train_gpt2.sample_texts(model, enc, PROMPT, 5, 30 - len(PROMPT))


def test_seed_and_temperature_0(checkpoint, model, capsys):
    model, enc = model
    flags = ["--init_from", checkpoint, "--prompt", "ROMEO:", "--max_new_tokens", 40]
    seeded = sample_main(flags + ["--num_samples", 3, "--seed", 7], capsys)
    assert all(len(t) == 46 and t.startswith("ROMEO:") for t in seeded)
    assert seeded == train_gpt2.sample_texts(model, enc, "ROMEO:", 3, 40, seed=7)
    assert seeded != train_gpt2.sample_texts(model, enc, "ROMEO:", 3, 40, seed=8)
    # greedy: every sample the same, as top-k 1 at any temperature and seed
    greedy = sample_main(flags + ["--temperature", 0, "--num_samples", 3], capsys)
    assert len(set(greedy)) == 1
    assert greedy[:1] == train_gpt2.sample_texts(model, enc, "ROMEO:", 1, 40, top_k=1, seed=3)


def test_the_command_line_in_its_own_process(checkpoint, model):
    # the plumbing: a real process prints what this process samples with the same seed
    model, enc = model
    flags = ["--init_from", checkpoint, "--prompt", "JULIET:", "--max_new_tokens", 20]
    proc = run_program("sample.py", flags + ["--num_samples", 2, "--seed", 5])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert samples(proc.stdout) == train_gpt2.sample_texts(model, enc, "JULIET:", 2, 20, seed=5)


def test_a_closed_stdout_ends_the_printing_quietly(checkpoint):
    # `sample.py ... | head -1`: the reader is gone before the samples are printed; exit 0 and
    # nothing on stderr, as train_gpt2.py does (no BrokenPipeError's traceback)
    flags = ["--init_from", checkpoint, "--max_new_tokens", 20]
    returncode, err = run_with_stdout_closed("sample.py", flags)
    assert returncode == 0 and err == "", err[-2000:]


@pytest.mark.gpt2_contract  # GPT-2's weights, imported: a model edit changes what loads
def test_a_hugging_face_directory_samples_gpt2_tokens(tmp_path, capsys):
    """A GPT2LMHeadModel directory brings GPT-2's tokenizer; an empty prompt is <|endoftext|>
    alone, one token of --max_length."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_positions=32, n_embd=8, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    flags = ["--init_from", tmp_path / "hf", "--prompt", "", "--max_length", 4]
    texts = sample_main(flags + ["--num_samples", 2], capsys)
    model, enc = train_gpt2.load_model(tmp_path / "hf")
    assert len(texts) == 2 and all(t.startswith("<|endoftext|>") for t in texts)
    # 4 tokens: <|endoftext|> and 3 sampled ones
    assert texts == train_gpt2.sample_texts(model, enc, "", 2, 3)


@pytest.fixture(scope="module")
def inputs(checkpoint, tmp_path_factory):
    """The files of the bad inputs, made once: a text file, another program's .pt, a truncated
    checkpoint, and the character model as export_hf.py writes it (a 40-token vocabulary)."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "notes.txt").write_text("not a model\n")
    torch.save({"weights": [1, 2]}, root / "foreign.pt")
    (root / "torn.pt").write_bytes(checkpoint.read_bytes()[:-1000])
    # a character model as export_hf.py writes it: a GPT2LMHeadModel of a 40-token vocabulary
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_positions=32, n_embd=8, n_layer=1, n_head=2, vocab_size=40)
    GPT2LMHeadModel(config).save_pretrained(root / "char_hf")
    # what a read would wait on for ever: a FIFO as a checkpoint, as a Hugging Face directory's
    # config.json, or in place of the directory
    os.mkfifo(root / "fifo.pt")
    os.mkfifo(root / "fifo")
    (root / "fifo_hf").mkdir()
    os.mkfifo(root / "fifo_hf" / "config.json")
    # a run that diverged: a NaN among its weights, in our checkpoint or a Hugging Face directory
    ckpt = harness.read_checkpoint(checkpoint)
    ckpt["model"]["transformer.h.0.attn.c_attn.weight"][1, 2] = math.nan
    harness.save_checkpoint(root / "nan.pt", ckpt)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=32, n_embd=8, n_layer=1, n_head=2))
    with torch.no_grad():
        hf.transformer.h[0].mlp.c_proj.weight[0, 0] = math.inf
    hf.save_pretrained(root / "nan_hf")
    return root


def out_of_memory(monkeypatch):
    # what a device says when the samples' batch does not fit
    def forward(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(train_gpt2.GPT, "forward", forward)


BAD_INPUTS = {
    "unknown flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "both lengths": (["--max_length", 10, "--max_new_tokens", 3], "not allowed with argument"),
    "no samples": (["--num_samples", 0], "--num_samples must be 1 to 1,000: they are one batch"),
    "too many samples": (["--num_samples", 10**12], "--num_samples must be 1 to 1,000: they"),
    "no new tokens": (["--max_new_tokens", 0], "--max_new_tokens must be 1 to 100,000: past"),
    "new tokens for ever": (
        ["--max_new_tokens", 10**9],
        "--max_new_tokens must be 1 to 100,000: past the model's context each token re-runs",
    ),
    "no length": (["--max_length", 0], "--max_length must be 1 to 100,000"),
    "length for ever": (["--max_length", 10**9], "--max_length must be 1 to 100,000"),
    "negative top-k": (["--top_k", -1], "--top_k must be 0 (the whole distribution) to 1,000,000"),
    "top-k past any vocabulary": (["--top_k", 10**7], "--top_k must be 0 (the whole"),
    "negative temperature": (["--temperature", -0.5], "--temperature must be 0 (greedy) or"),
    "temperature float32 takes for 0": (["--temperature", 1e-50], "a finite number >= 1e-6"),
    "temperature nan": (["--temperature", "nan"], "--temperature must be 0 (greedy) or"),
    "negative seed": (["--seed", -1], "--seed must be in 0 .. 2**63 - 1"),
    "empty init_from": (["--init_from", ""], "--init_from is empty"),
    "unknown device": (["--device", "tpu"], "--device tpu: not cpu, cuda, cuda:N or mps"),
    "absent GPU": (["--device", "cuda:99"], "--device cuda:99: this"),
    "prompt fills max_length": (
        ["--prompt", "ROMEO:", "--max_length", 6],
        "the prompt is 6 tokens: --max_length 6 leaves none to sample",
    ),
    "prompt past the context": (
        ["--prompt", "a" * 40],
        "--prompt is 40 tokens: the model's context is 32 tokens, so the prompt must be 31",
    ),
    "character the model never saw": (
        ["--prompt", "\N{EURO SIGN}"],
        "--prompt: character '\N{EURO SIGN}' is not in the vocabulary of",
    ),
    "empty prompt, no <|endoftext|>": (["--prompt", ""], "--prompt is empty, and this model"),
    "out of memory": (
        ["--num_samples", 1000],
        "--num_samples 1000 of 128 tokens do not fit in cpu's memory: lower --num_samples",
    ),
    "a text file": (["--init_from", "{inputs}/notes.txt"], "not a checkpoint (.pt), nor a"),
    "missing file": (["--init_from", "{inputs}/gone/model.pt"], "no such file or directory"),
    "another program's .pt": (["--init_from", "{inputs}/foreign.pt"], "not a train_gpt2.py"),
    "truncated checkpoint": (["--init_from", "{inputs}/torn.pt"], "is damaged, or not a"),
    "exported character model": (
        ["--init_from", "{inputs}/char_hf"],
        "not GPT-2's 50,257: load the .pt checkpoint it was exported from",
    ),
    "a FIFO checkpoint": (["--init_from", "{inputs}/fifo.pt"], "fifo.pt (not a regular file)"),
    "a FIFO": (["--init_from", "{inputs}/fifo"], "fifo is not a regular file (a FIFO or a"),
    "a FIFO in a directory": (["--init_from", "{inputs}/fifo_hf"], "config.json is not a regular"),
    "a diverged checkpoint": (
        ["--init_from", "{inputs}/nan.pt"],
        "nan.pt holds non-finite weights (first: transformer.h.0.attn.c_attn.weight): its run"
        " diverged before it was saved; use an earlier checkpoint",
    ),
    "a diverged Hugging Face model": (
        ["--init_from", "{inputs}/nan_hf"],
        "nan_hf holds non-finite weights (first: transformer.h.0.mlp.c_proj.weight)",
    ),
}
# (loading a Hugging Face GPT-2 directory into our GPT: the GPT-2 contract's)
CONTRACT = {"exported character model", "a diverged Hugging Face model"}


# a FIFO opened would block for good: this fails rather than hangs
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", cases(BAD_INPUTS, contract=CONTRACT))
def test_bad_input_is_one_line(checkpoint, inputs, capsys, monkeypatch, name):
    args, message = BAD_INPUTS[name]
    if name == "out of memory":
        out_of_memory(monkeypatch)
    before = sorted(p.name for p in inputs.iterdir())
    argv = ["--init_from", checkpoint, "--device", "cpu"] + [
        str(a).format(inputs=inputs) for a in args
    ]
    # the last --device and --init_from win, as a shell user's flags
    code, err = run_main(sample.main, argv, capsys)
    one_line_error(code, err, "sample.py", message)
    assert sorted(p.name for p in inputs.iterdir()) == before  # nothing written
