"""GPT-2 as this repository ships it: Hugging Face parity, weight import of the four sizes, exact
parameter counts, module names, GPT-2's init and the published recipe. After an architecture
edit these are expected to go red; run `pytest -m "not gpt2_contract"` for the rest."""

import dataclasses

import pytest
import torch

import train_gpt2
from train_gpt2 import GPT, GPTConfig

pytestmark = pytest.mark.gpt2_contract

# OpenAI's four sizes: (n_layer, n_head, n_embd) and their parameter counts (tied head)
SIZES = {
    "gpt2": ((12, 12, 768), 124_439_808),
    "gpt2-medium": ((24, 16, 1024), 354_823_168),
    "gpt2-large": ((36, 20, 1280), 774_030_080),
    "gpt2-xl": ((48, 25, 1600), 1_557_611_200),
}


def hf_model(tmp_path, n_layer, n_head, n_embd, vocab_size=50257, n_positions=1024, **extra):
    """A randomly initialised transformers GPT2LMHeadModel saved in tmp_path."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        **extra,
    )
    model = GPT2LMHeadModel(config).eval()
    # random biases and LayerNorm gains too: a missed transpose or key cannot hide behind 0 or 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(tmp_path)
    return model


def assert_same_logits(ours, theirs, vocab_size, n_positions):
    idx = torch.randint(0, vocab_size, (2, min(n_positions, 64)))
    with torch.no_grad():
        expected = theirs(idx).logits
        logits, _ = ours.eval()(idx)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_logits_equal_huggingface_from_the_same_weights(tmp_path):
    theirs = hf_model(tmp_path, 3, 4, 64, vocab_size=211, n_positions=48)
    ours = GPT.from_pretrained(str(tmp_path))
    assert_same_logits(ours, theirs, 211, 48)
    # the loss too: HF shifts its labels inside, we take shifted targets
    idx = torch.randint(0, 211, (2, 20))
    with torch.no_grad():
        expected = theirs(idx, labels=idx).loss
        _, loss = ours(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(loss, expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIZES))
def test_each_of_the_four_sizes_imports_exactly(tmp_path, name):
    # every size's width, heads and context (one layer, a small vocabulary: quick)
    (n_layer, n_head, n_embd), _ = SIZES[name]
    theirs = hf_model(tmp_path, 1, n_head, n_embd, vocab_size=512)
    ours = GPT.from_pretrained(str(tmp_path))
    assert ours.config == GPTConfig(vocab_size=512, n_layer=1, n_head=n_head, n_embd=n_embd)
    assert_same_logits(ours, theirs, 512, 1024)


@pytest.mark.parametrize("name", list(SIZES))
def test_parameter_counts_of_the_four_sizes(name):
    (n_layer, n_head, n_embd), expected = SIZES[name]
    with torch.device("meta"):
        model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    assert sum(p.numel() for p in model.parameters()) == expected


def test_module_names_are_huggingface_keys(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        theirs = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=97))
        ours = GPT(GPTConfig(vocab_size=97, n_layer=2, n_head=2, n_embd=32))
    keys = {k for k in theirs.state_dict() if not k.endswith(".attn.bias")}
    assert keys == set(ours.state_dict())
    assert ours.lm_head.weight is ours.transformer.wte.weight


@pytest.mark.parametrize(
    "extra",
    [
        dict(activation_function="relu"),
        dict(tie_word_embeddings=False),
        dict(layer_norm_epsilon=1e-6),
        dict(n_inner=64),  # an MLP 2 x n_embd wide, not 4 x
    ],
)
def test_a_model_that_is_not_gpt2_is_refused(tmp_path, extra):
    hf_model(tmp_path, 1, 2, 32, vocab_size=97, n_positions=32, **extra)
    with pytest.raises(ValueError, match="not GPT-2"):
        GPT.from_pretrained(str(tmp_path))


def test_load_model_reads_a_huggingface_directory_with_gpt2s_tokenizer(tmp_path):
    hf_model(tmp_path, 1, 2, 32, vocab_size=50257, n_positions=32)
    model, enc = train_gpt2.load_model(tmp_path, dropout=0.1)
    assert enc.name == "gpt2" and enc.n_vocab == 50257
    assert model.config.dropout == 0.1


def test_gpt2s_init():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304))
    blocks = model.transformer.h
    assert model.transformer.wte.weight.std().item() == pytest.approx(0.02, rel=0.01)
    assert blocks[0].attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.01)
    # the residual projections: 0.02 / sqrt(2 * n_layer)
    for proj in (blocks[3].attn.c_proj, blocks[5].mlp.c_proj):
        assert proj.weight.std().item() == pytest.approx(0.02 / 24**0.5, rel=0.02)
    assert torch.all(blocks[0].mlp.c_fc.bias == 0)
    assert torch.all(blocks[0].ln_1.weight == 1) and torch.all(blocks[0].ln_1.bias == 0)


def test_the_defaults_are_the_gpt2_124m_recipe():
    cfg = train_gpt2.TrainConfig()
    assert train_gpt2.PRESETS["gpt2-124M"] == {}
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq_len) == (12, 12, 768, 1024)
    assert cfg.total_batch_size == 2**19 and cfg.batch_size == 64
    assert (cfg.max_lr, cfg.warmup_steps, cfg.max_steps) == (6e-4, 715, 19073)
    assert (cfg.weight_decay, cfg.beta2, cfg.grad_clip) == (0.1, 0.95, 1.0)
    assert cfg.max_steps * cfg.total_batch_size == pytest.approx(10e9, rel=0.001)
    assert cfg.val_tokens == 20 * 64 * 1024 * 8
    assert train_gpt2.get_lr(cfg.max_steps, 6e-4, 6e-5, 715, cfg.max_steps) == 6e-5
    # the vocabulary padded for speed: 124,475,904 parameters
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304))
    assert sum(p.numel() for p in model.parameters()) == 124_475_904
    assert dataclasses.asdict(model.config)["vocab_size"] % 128 == 0
