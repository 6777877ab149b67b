"""sample.py and train_gpt2.sample_texts: the course's demo arithmetic (--max_length counts the prompt), the special
token in prompts, seeded reproducibility, and samples decoded with the tokenizer a checkpoint was trained with."""

import dataclasses

import pytest
import torch

import sample
import fineweb
import train_gpt2
from fineweb import get_tokenizer
from train_gpt2 import GPT, GPTConfig, sample_texts


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny model with GPT-2's vocabulary, and one with a 5-character vocabulary, saved as training saves them."""
    root = tmp_path_factory.mktemp("sample")
    torch.manual_seed(0)
    for name, vocab, tokenizer in (("bpe", 50257, {"tokenizer": "gpt2"}), ("char", 5, {"tokenizer": "char", "vocab": "\n abc"})):
        config = GPTConfig(block_size=32, vocab_size=vocab, n_layer=1, n_head=2, n_embd=16)
        torch.save({"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "tokenizer": tokenizer},
                   root / f"{name}.pt")
    return root


def test_max_length_counts_the_prompt_and_the_demo_defaults(checkpoints, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(train_gpt2, "sample_texts", lambda *args: calls.append(args) or ["x"] * args[3])
    prompt = "Hello, I'm a language model,"  # 8 GPT-2 tokens
    sample.main(["--init_from", str(checkpoints / "bpe.pt"), "--prompt", prompt, "--device", "cpu"])
    sample.main(["--init_from", str(checkpoints / "bpe.pt"), "--prompt", prompt, "--max_new_tokens", "30", "--device", "cpu"])
    (_, enc, got_prompt, n, new_tokens, top_k, temperature, seed, _), second = calls
    assert (got_prompt, n, new_tokens, top_k, temperature, seed) == (prompt, 5, 30 - 8, 50, 1.0, 42)  # the course's demo
    assert second[4] == 30 and capsys.readouterr().out.count("sample ") == 10
    with pytest.raises(SystemExit, match="the prompt is 8 tokens: --max_length 8 leaves none"):
        sample.main(["--init_from", str(checkpoints / "bpe.pt"), "--prompt", prompt, "--max_length", "8"])


def test_samples_are_seeded_and_hold_the_special_token(checkpoints):
    model, enc = train_gpt2.load_model(str(checkpoints / "bpe.pt"))
    texts = sample_texts(model, enc, "<|endoftext|>The", 3, 6, 50, 1.0, seed=42, device="cpu")
    assert texts == sample_texts(model, enc, "<|endoftext|>The", 3, 6, 50, 1.0, seed=42, device="cpu")
    assert texts != sample_texts(model, enc, "<|endoftext|>The", 3, 6, 50, 1.0, seed=43, device="cpu")
    for text in texts:
        ids = enc.encode(text, allowed_special="all")
        assert ids[0] == fineweb.EOT_TOKEN  # the prompt's <|endoftext|> went in as GPT-2's special token
    with pytest.raises(ValueError, match="need temperature >= 0"):
        sample_texts(model, enc, "The", 1, 2, 50, float("nan"), seed=0, device="cpu")


def test_a_char_checkpoint_samples_characters(checkpoints, capsys):
    sample.main(["--init_from", str(checkpoints / "char.pt"), "--prompt", "ab", "--max_new_tokens", "20", "--device", "cpu"])
    lines = capsys.readouterr().out.split("sample ")[1:]
    assert len(lines) == 5 and all(set(line.split(": ", 1)[1].rstrip("\n")) <= set("\n abc") for line in lines)
    model, enc = train_gpt2.load_model(str(checkpoints / "char.pt"))
    assert enc.name == "char" and len(sample_texts(model, enc, "ab", 1, 20, None, 1.0, 0, "cpu")[0]) == 22
    with pytest.raises(ValueError, match="smaller than the gpt2 tokenizer's"):
        sample_texts(model, get_tokenizer(), "ab", 1, 2, None, 1.0, 0, "cpu")


def test_extreme_but_finite_temperatures_sample(checkpoints):
    """A temperature so near 0 that dividing by it overflows float32 is greedy; a huge one draws near-uniformly;
    neither turns the probabilities into NaN."""
    model, enc = train_gpt2.load_model(str(checkpoints / "bpe.pt"))
    greedy = sample_texts(model, enc, "The", 2, 8, None, 0.0, seed=0, device="cpu")
    for temperature in (1e-30, 1e-300):
        assert sample_texts(model, enc, "The", 2, 8, None, temperature, seed=0, device="cpu") == greedy
    hot = sample_texts(model, enc, "The", 2, 8, None, 1e30, seed=0, device="cpu")
    assert len(hot) == 2 and hot != greedy
