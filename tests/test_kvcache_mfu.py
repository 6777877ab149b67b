"""The KV cache and packed rows are exact (float64), generation with and without the cache agrees, and the MFU
arithmetic is right."""

import pytest
import torch

import train_gpt2
from train_gpt2 import GPT, GPTConfig, KVCache, flops_per_token, peak_flops

SMALL = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, block_size=24)


def small_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**SMALL)).to(torch.float64).eval()


def prompt(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------
# Generation with and without the cache


@pytest.mark.parametrize("B, prompt_len, new_tokens", [
    (1, 5, 10),   # well inside the context
    (3, 5, 10),   # rows of a batch are independent
    (1, 10, 40),  # 50 > block_size 24: the window slides past the cache's end
    (2, 10, 40),
    (1, 23, 3),   # the prompt fills all but one position
])
def test_greedy_cache_equals_no_cache(B, prompt_len, new_tokens):
    model, idx = small_model(), prompt(B, prompt_len)
    with_cache = model.generate(idx, new_tokens, temperature=0.0, use_cache=True)
    without = model.generate(idx, new_tokens, temperature=0.0, use_cache=False)
    assert with_cache.shape == (B, prompt_len + new_tokens)
    assert torch.equal(with_cache[:, :prompt_len], idx)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("B, prompt_len, new_tokens", [(1, 5, 15), (3, 4, 12), (2, 10, 40)])
def test_seeded_sampling_cache_equals_no_cache(B, prompt_len, new_tokens):
    model, idx = small_model(), prompt(B, prompt_len)

    def sample(use_cache: bool) -> torch.Tensor:
        g = torch.Generator().manual_seed(1234)  # the same draws on both paths
        return model.generate(idx, new_tokens, temperature=0.8, top_k=10, generator=g, use_cache=use_cache)

    with_cache, without = sample(True), sample(False)
    assert torch.equal(with_cache, without)
    # guard against a vacuous pass: sampling with another seed takes another path
    other = model.generate(idx, new_tokens, temperature=0.8, top_k=10,
                           generator=torch.Generator().manual_seed(99), use_cache=True)
    assert not torch.equal(with_cache, other)


# ----------------------------------------------------------------------------------------------------------
# The cache itself: prefill + one-token decode steps reproduce a full forward pass


@pytest.mark.parametrize("B, prefill", [(1, 1), (2, 7), (3, 23)])
def test_decode_logits_equal_full_forward(B, prefill):
    model = small_model()
    T = SMALL["block_size"]  # up to the last position the cache holds
    idx = prompt(B, T)
    full, _ = model(idx)  # (B, T, vocab)
    cache = KVCache(model.config, B, "cpu", torch.float64)
    logits, _ = model(idx[:, :prefill], kv_cache=cache)
    assert cache.pos == prefill
    torch.testing.assert_close(logits, full[:, :prefill], rtol=0, atol=1e-10)
    for t in range(prefill, T):
        logits, _ = model(idx[:, t : t + 1], kv_cache=cache)  # (B, 1, vocab)
        torch.testing.assert_close(logits[:, 0], full[:, t], rtol=0, atol=1e-10, msg=f"decode position {t}")
    assert cache.pos == T
    with pytest.raises(ValueError):  # the cache is full: one more token has no position
        model(idx[:, :1], kv_cache=cache)


def test_decode_logits_depend_on_the_cached_keys():
    """A decode step must attend to the cached positions: a different history gives different logits."""
    model, idx = small_model(), prompt(1, 8)
    outs = []
    for history in (idx[:, :7], torch.flip(idx[:, :7], dims=[1])):
        cache = KVCache(model.config, 1, "cpu", torch.float64)
        model(history, kv_cache=cache)
        outs.append(model(idx[:, 7:8], kv_cache=cache)[0])
    assert not torch.allclose(outs[0], outs[1])


# ----------------------------------------------------------------------------------------------------------
# MFU arithmetic


def test_flops_per_token_gpt2_124m():
    with torch.device("meta"):  # shapes only: no 124M parameters allocated or initialised
        model = GPT(GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768))
    assert model.num_params() == 124_439_808  # OpenAI's GPT-2 small, tied token table counted once
    N = model.num_params(exclude_embeddings=True)
    assert N == 124_439_808 - 1024 * 768 == 123_653_376  # the position table is a lookup, not a matmul
    # 6N = 741,920,256 (weight matmuls, forward + backward);
    # 12 * L * H * Q * T = 12 * 12 * 12 * 64 * 1024 = 113,246,208 (attention scores and values)
    assert 6 * N == 741_920_256
    assert flops_per_token(model, 1024) == 855_166_464
    assert isinstance(flops_per_token(model, 1024), int)


def test_mfu_of_a_known_run():
    """The units: 1.5M tok/s of 124M training on 8 A100s is about half their bf16 peak, a plausible MFU."""
    with torch.device("meta"):
        model = GPT(GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768))
    flops = flops_per_token(model, 1024)
    mfu = flops * 1.5e6 / (8 * train_gpt2.PEAK_BF16_FLOPS["A100"])
    assert mfu == pytest.approx(855_166_464 * 1.5e6 / 2.496e15)
    assert 0.5 < mfu < 0.53


def test_peak_flops_table_and_override(monkeypatch):
    assert train_gpt2.PEAK_BF16_FLOPS["A100"] == 312e12
    assert train_gpt2.PEAK_BF16_FLOPS["H100"] == 989e12
    assert peak_flops("cpu") is None  # no MFU on a CPU
    assert peak_flops("mps") is None
    assert peak_flops("cpu", 1e12) == 1e12  # an explicit peak always wins
    assert peak_flops("cuda", 123e12) == 123e12
    for name, expected in [("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12),
                           ("NVIDIA GeForce RTX 4090", 165e12), ("Some Unknown GPU", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, _n=name: _n)
        assert peak_flops("cuda") == expected, name


def test_peak_flops_l40s_is_not_an_l4(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA L40S")
    assert peak_flops("cuda") == 362e12


# ----------------------------------------------------------------------------------------------------------
# Chunks after cached positions, repeated rows, features


@pytest.mark.parametrize("B, splits", [
    (1, [1, 5]),           # a one-token prefix, then a chunk
    (2, [7, 9, 8]),        # chunk after chunk, up to block_size
    (3, [10, 1, 6, 1, 6]), # chunks and one-token decode steps mixed
])
def test_chunks_after_cached_positions_equal_full_forward(B, splits):
    """A chunk of T > 1 tokens after cached ones: query i may see keys up to pos + i, not just up to i."""
    model = small_model()
    idx = prompt(B, sum(splits))
    full, _ = model(idx)  # (B, T, vocab)
    cache = KVCache(model.config, B, "cpu", torch.float64)
    start = 0
    for n in splits:
        logits, _ = model(idx[:, start : start + n], kv_cache=cache)
        torch.testing.assert_close(logits, full[:, start : start + n], rtol=0, atol=1e-10,
                                   msg=f"positions {start}..{start + n - 1}")
        start += n
    assert cache.pos == start


def test_packed_row_equals_each_sequence_alone():
    """A prefix and 3 continuations of it in one row, each continuation with its own positions and a mask that
    shows it the prefix and itself only, give the hidden states of the 3 full sequences run separately."""
    model = small_model()
    prefix, conts = prompt(1, 9, seed=2)[0], [prompt(1, n, seed=3 + n)[0] for n in (5, 2, 7)]
    row = torch.cat([prefix, *conts])[None]  # (1, 23)
    pos = torch.cat([torch.arange(9)] + [torch.arange(9, 9 + len(c)) for c in conts])[None]
    seg = torch.cat([torch.zeros(9, dtype=torch.long)] + [torch.full((len(c),), i + 1) for i, c in enumerate(conts)])
    mask = torch.ones(23, 23, dtype=torch.bool).tril() & ((seg[None, :] == 0) | (seg[None, :] == seg[:, None]))
    packed = model.features(row, pos=pos, attn_mask=mask[None, None])[0]  # (23, C)
    start = 9
    for c in conts:
        alone = model.features(torch.cat([prefix, c])[None])[0]  # (9 + len(c), C)
        torch.testing.assert_close(packed[:9], alone[:9], rtol=0, atol=1e-10)
        torch.testing.assert_close(packed[start : start + len(c)], alone[9:], rtol=0, atol=1e-10)
        start += len(c)
    with pytest.raises(ValueError, match="both pos and attn_mask"):
        model.features(row, pos=pos)
    with pytest.raises(ValueError, match="no kv_cache"):
        model.features(row, kv_cache=KVCache(model.config, 1, "cpu", torch.float64), pos=pos, attn_mask=mask)
    with pytest.raises(ValueError, match="position id 24 >= block_size 24"):
        model.features(row, pos=pos + 9, attn_mask=mask)
    long_row = torch.cat([row, row], dim=1)  # 46 tokens > block_size: fine, only positions must fit
    long_mask = torch.block_diag(mask, mask)
    assert model.features(long_row, pos=torch.cat([pos, pos], 1), attn_mask=long_mask[None, None]).shape == (1, 46, 32)


def test_features_then_lm_head_is_forward():
    model, idx = small_model(), prompt(2, 10)
    targets = prompt(2, 10, seed=5)
    logits, loss = model(idx)[0], model(idx, targets)[1]
    assert model(idx, targets)[0] is None  # with targets, forward makes the loss without keeping the logits
    hidden = model.features(idx)
    assert hidden.shape == (2, 10, SMALL["n_embd"])
    assert torch.equal(model.lm_head(hidden), logits)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.view(-1, SMALL["vocab_size"]),
                                                                       targets.view(-1)), rtol=0, atol=1e-12)
    cache = KVCache(model.config, 2, "cpu", torch.float64)  # with a cache, features advances it as forward does
    model.features(idx[:, :6], kv_cache=cache)
    torch.testing.assert_close(model.lm_head(model.features(idx[:, 6:], kv_cache=cache)), logits[:, 6:],
                               rtol=0, atol=1e-10)
    assert cache.pos == 10
