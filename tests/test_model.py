"""Invariants of the model in train_gpt2.py: properties any GPT built from GPTConfig must have, whatever its
attention, MLP, norms or positions. Causality and batch isolation, the KV cache and packed rows against a full
forward pass, generation with and without the cache, the loss (padding, precision, the chunked option), dropout,
optimizer groups, errors, cropping the context, checkpoints and import hygiene.

These tests build their models with GPT(GPTConfig(...)) and touch only its interface (forward, features, generate,
lm_head, configure_optimizers, crop_block_size, num_params): a research edit that keeps GPT-2's behaviour in this
sense keeps them green. GPT-2's exact numbers, names and Hugging Face parity are in test_gpt2_contract.py.
Tiny float64 models, so "equal" can mean equal to 1e-10."""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import train_gpt2
from run_files import ChunkedCrossEntropy, load_checkpoint
from train_gpt2 import GPT, GPTConfig, KVCache, load_model

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(block_size=32, vocab_size=67, n_layer=2, n_head=4, n_embd=32)
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models lose 10x to a second thread


def tiny_model(seed: int = 0, dtype=torch.float64, scale: float = 0.0, **overrides) -> GPT:
    """A tiny GPT in eval mode; scale > 0 redraws every matrix N(0, scale) (biases and gains keep their init), so
    that attention is sharp and logits spread: a broken path shows up in them."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, **overrides})).to(dtype).eval()
    if scale:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, scale)
    return model


def rand_idx(B: int, T: int, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------
# Causality and batch rows


def test_causal_and_batch_rows_isolated():
    model = tiny_model(scale=0.3)
    idx = rand_idx(3, 24, seed=1)
    with torch.no_grad():
        base = model(idx)[0]
        future = idx.clone()
        future[:, 13:] = rand_idx(3, 11, seed=2)
        changed = model(future)[0]
        other_row = idx.clone()
        other_row[1] = rand_idx(1, 24, seed=3)[0]
        rows = model(other_row)[0]
    assert torch.equal(base[:, :13], changed[:, :13])  # changing the future leaves the past unchanged
    assert not torch.allclose(base[:, 13:], changed[:, 13:])  # the change did reach the later positions
    assert torch.equal(base[0], rows[0]) and torch.equal(base[2], rows[2])
    assert not torch.allclose(base[1], rows[1])
    with torch.no_grad():
        assert torch.allclose(model(idx[2:3])[0], base[2:3], rtol=0, atol=1e-12)  # batch size does not matter


def test_features_then_lm_head_is_forward():
    model, idx, targets = tiny_model(scale=0.2), rand_idx(2, 10), rand_idx(2, 10, seed=5)
    logits, loss = model(idx, targets)
    assert torch.equal(model(idx)[0], logits) and model(idx)[1] is None
    hidden = model.features(idx)
    assert hidden.shape == (2, 10, TINY["n_embd"])
    assert torch.equal(model.lm_head(hidden), logits)
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, TINY["vocab_size"]), targets.view(-1)),
                               rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------
# The KV cache and packed rows: the same hidden states as a full forward pass


@pytest.mark.parametrize("B, prefill", [(1, 1), (2, 7), (3, 31)])
def test_decode_logits_equal_full_forward(B, prefill):
    model = tiny_model(scale=0.3)
    T = TINY["block_size"]  # up to the last position the cache holds
    idx = rand_idx(B, T, seed=4)
    with torch.no_grad():
        full, _ = model(idx)  # (B, T, vocab)
        cache = KVCache(model.config, B, "cpu", torch.float64)
        logits, _ = model(idx[:, :prefill], kv_cache=cache)
        assert cache.pos == prefill
        torch.testing.assert_close(logits, full[:, :prefill], rtol=0, atol=1e-10)
        for t in range(prefill, T):
            logits, _ = model(idx[:, t : t + 1], kv_cache=cache)  # (B, 1, vocab)
            torch.testing.assert_close(logits[:, 0], full[:, t], rtol=0, atol=1e-10, msg=f"decode position {t}")
        assert cache.pos == T
        with pytest.raises(ValueError, match="block_size"):  # the cache is full: one more token has no position
            model(idx[:, :1], kv_cache=cache)


@pytest.mark.parametrize("B, splits", [
    (1, [1, 5]),           # a one-token prefix, then a chunk
    (2, [7, 9, 8]),        # chunk after chunk
    (3, [10, 1, 6, 1, 6]), # chunks and one-token decode steps mixed
])
def test_chunks_after_cached_positions_equal_full_forward(B, splits):
    """A chunk of T > 1 tokens after cached ones: query i may see keys up to pos + i, not just up to i."""
    model = tiny_model(scale=0.3)
    idx = rand_idx(B, sum(splits), seed=5)
    with torch.no_grad():
        full, _ = model(idx)
        cache = KVCache(model.config, B, "cpu", torch.float64)
        start = 0
        for n in splits:
            logits, _ = model(idx[:, start : start + n], kv_cache=cache)
            torch.testing.assert_close(logits, full[:, start : start + n], rtol=0, atol=1e-10,
                                       msg=f"positions {start}..{start + n - 1}")
            start += n
    assert cache.pos == start


def test_decode_logits_depend_on_the_cached_keys():
    """A decode step must attend to the cached positions: a different history gives different logits."""
    model, idx = tiny_model(scale=0.3), rand_idx(1, 8)
    outs = []
    with torch.no_grad():
        for history in (idx[:, :7], torch.flip(idx[:, :7], dims=[1])):
            cache = KVCache(model.config, 1, "cpu", torch.float64)
            model(history, kv_cache=cache)
            outs.append(model(idx[:, 7:8], kv_cache=cache)[0])
    assert not torch.allclose(outs[0], outs[1])


def test_packed_row_equals_each_sequence_alone():
    """A prefix and 3 continuations of it in one row, each continuation with its own positions and a mask that
    shows it the prefix and itself only, give the hidden states of the 3 full sequences run separately (what
    HellaSwag's packed scoring relies on)."""
    model = tiny_model(scale=0.3)
    prefix, conts = rand_idx(1, 9, seed=2)[0], [rand_idx(1, n, seed=3 + n)[0] for n in (5, 2, 7)]
    row = torch.cat([prefix, *conts])[None]  # (1, 23)
    pos = torch.cat([torch.arange(9)] + [torch.arange(9, 9 + len(c)) for c in conts])[None]
    seg = torch.cat([torch.zeros(9, dtype=torch.long)] + [torch.full((len(c),), i + 1) for i, c in enumerate(conts)])
    mask = torch.ones(23, 23, dtype=torch.bool).tril() & ((seg[None, :] == 0) | (seg[None, :] == seg[:, None]))
    with torch.no_grad():
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
        with pytest.raises(ValueError, match="position id 32 >= block_size 32"):
            model.features(row, pos=pos + 17, attn_mask=mask)
        long_row = torch.cat([row, row], dim=1)  # 46 tokens > block_size: fine, only positions must fit
        long_mask = torch.block_diag(mask, mask)
        out = model.features(long_row, pos=torch.cat([pos, pos], 1), attn_mask=long_mask[None, None])
    assert out.shape == (1, 46, TINY["n_embd"])


# ----------------------------------------------------------------------------------------------------------
# Generation


@pytest.mark.parametrize("B, prompt_len, new_tokens", [
    (1, 5, 10),   # well inside the context
    (3, 5, 10),   # rows of a batch are independent
    (2, 10, 40),  # 50 > block_size 32: the window slides past the cache's end
    (1, 31, 3),   # the prompt fills all but one position
    (2, 40, 5),   # a prompt longer than the context
])
def test_greedy_cache_equals_no_cache(B, prompt_len, new_tokens):
    model, idx = tiny_model(scale=0.3), rand_idx(B, prompt_len, seed=prompt_len)
    with_cache = model.generate(idx, new_tokens, temperature=0.0, use_cache=True)
    without = model.generate(idx, new_tokens, temperature=0.0, use_cache=False)
    assert with_cache.shape == (B, prompt_len + new_tokens)
    assert torch.equal(with_cache[:, :prompt_len], idx)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("B, prompt_len, new_tokens, top_k", [(1, 5, 15, 10), (3, 4, 12, None), (2, 4, 36, 10)])
def test_seeded_sampling_cache_equals_no_cache(B, prompt_len, new_tokens, top_k):
    model, idx = tiny_model(scale=0.3), rand_idx(B, prompt_len, seed=1)

    def sample(use_cache: bool, seed: int = 1234) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)  # the same draws on both paths
        return model.generate(idx, new_tokens, temperature=0.8, top_k=top_k, generator=g, use_cache=use_cache)

    assert torch.equal(sample(True), sample(False))
    # a vacuous pass would need every draw to ignore the seed: sampling with others takes other paths
    assert any(not torch.equal(sample(True), sample(True, seed)) for seed in range(5))


def test_generation_feeds_one_token_per_step_with_the_cache():
    model = tiny_model()
    lengths = []
    features = model.features
    model.features = lambda idx, *a, **k: (lengths.append(idx.size(1)), features(idx, *a, **k))[1]
    model.generate(rand_idx(2, 5), 10, temperature=0, use_cache=True)
    assert lengths == [5] + [1] * 9
    lengths.clear()
    model.generate(rand_idx(2, 5), 3, temperature=0, use_cache=False)
    assert lengths == [5, 6, 7]


def test_top_k_one_is_greedy():
    model, idx = tiny_model(scale=0.3), rand_idx(3, 6)
    greedy = model.generate(idx, 30, temperature=0)
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        assert torch.equal(model.generate(idx, 30, temperature=1.3, top_k=1, generator=gen), greedy)


class FavourIds(nn.Module):
    """Wraps a head so that the ids >= start get the largest logits: unmasked, they always win."""

    def __init__(self, head: nn.Module, start: int):
        super().__init__()
        self.head, self.start = head, start

    def forward(self, h):
        logits = self.head(h).clone()
        logits[..., self.start :] += 1e3
        return logits


def test_vocab_limit_is_never_exceeded():
    model, limit = tiny_model(), 50
    model.lm_head = FavourIds(model.lm_head, limit)
    idx = rand_idx(3, 4, vocab=limit)
    assert (model.generate(idx, 10, temperature=0)[:, 4:] >= limit).all()  # unmasked: the padded ids win
    for kwargs in (dict(temperature=0), dict(temperature=1.0), dict(temperature=2.0, top_k=5)):
        for use_cache in (True, False):
            gen = torch.Generator().manual_seed(0)
            out = model.generate(idx, 30, vocab_limit=limit, generator=gen, use_cache=use_cache, **kwargs)
            assert out.shape == (3, 34)
            assert out.max().item() < limit, kwargs


def test_generate_rejects_bad_sampling_arguments():
    model = tiny_model()
    with pytest.raises(ValueError):
        model.generate(rand_idx(1, 3), 2, temperature=-1.0)
    with pytest.raises(ValueError):
        model.generate(rand_idx(1, 3), 2, top_k=0)
    assert torch.equal(model.generate(rand_idx(1, 3), 0), rand_idx(1, 3))


# ----------------------------------------------------------------------------------------------------------
# Loss


def test_zero_logits_give_log_vocab_for_any_padding():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every logit 0: the loss of any target is log(vocab)
    idx, targets = rand_idx(2, 8), rand_idx(2, 8, seed=1)
    flat_order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    for n_ignored in range(16):
        t = targets.clone().view(-1)
        t[flat_order[:n_ignored]] = -100
        logits, loss = model(idx, t.view(2, 8))
        assert torch.count_nonzero(logits) == 0
        assert loss.item() == pytest.approx(math.log(67), abs=1e-6)


def test_padding_never_changes_the_mean():
    model = tiny_model(scale=0.2)
    long, short = rand_idx(1, 12, seed=1)[0], rand_idx(1, 7, seed=2)[0]
    total, count = 0.0, 0  # each sequence alone: summed next-token losses
    for seq in (long, short):
        logits = model(seq[None, :-1])[0][0]
        total += -F.log_softmax(logits, dim=-1).gather(1, seq[1:, None]).sum().item()
        count += len(seq) - 1
    expected = total / count
    for pad_id in (0, 66):  # padded to one batch: pad inputs are arbitrary ids, their targets -100
        idx, targets = torch.full((2, 11), pad_id), torch.full((2, 11), -100)
        idx[0], targets[0] = long[:-1], long[1:]
        idx[1, :6], targets[1, :6] = short[:-1], short[1:]
        assert model(idx, targets)[1].item() == pytest.approx(expected, abs=1e-9)
    assert expected != pytest.approx(model(idx, torch.where(targets == -100, 0, targets))[1].item(), abs=1e-3)


def test_loss_accepts_sliced_targets():
    """Targets are often a slice of the same batch (idx[:, 1:]): not contiguous, still valid."""
    model, idx = tiny_model(), rand_idx(2, 17)
    expected = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())[1]
    assert model(idx[:, :-1], idx[:, 1:])[1].item() == expected.item()


def test_loss_keeps_model_precision():
    """The loss is taken in at least fp32 (bf16 logits are upcast); a float64 model is not rounded down."""
    model = tiny_model(scale=0.2)
    idx, targets = rand_idx(2, 16), rand_idx(2, 16, seed=1)
    logits, loss = model(idx, targets)
    assert loss.dtype == torch.float64
    assert abs(loss.item() - F.cross_entropy(logits.view(-1, 67), targets.view(-1)).item()) < 1e-12
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, bf16_loss = tiny_model(dtype=torch.float32, scale=0.2)(idx, targets)
    assert bf16_loss.dtype == torch.float32


def plain_loss(h, weight, targets):
    """The loss as it is usually written: full logits, upcast to fp32 (fp64 stays), one cross_entropy."""
    logits = F.linear(h, weight)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, ignore_index=-100)


def chunked(max_chunks: int, min_rows: int):
    return lambda h, w, t: ChunkedCrossEntropy.apply(h, w, t, torch.is_grad_enabled(), max_chunks, min_rows)


def loss_and_grads(loss_fn, h, weight, targets):
    h, weight = h.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = loss_fn(h, weight, targets)
    return (loss, *torch.autograd.grad(3.0 * loss, (h, weight)))  # 3: the incoming gradient is used, not assumed 1


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("max_chunks, min_rows", [(8, 5), (8, 16), (1, 1), (64, 1024)])  # ragged, even, one, N < rows
def test_chunked_loss_equals_full_logits_loss(dtype, tol, max_chunks, min_rows):
    g = torch.Generator().manual_seed(0)
    h, weight = torch.randn(37, 16, generator=g, dtype=dtype), torch.randn(53, 16, generator=g, dtype=dtype)
    targets = torch.randint(0, 53, (37,), generator=g)
    targets[[0, 5, 6, 36]] = -100  # ignored rows at a chunk's start and end
    got = loss_and_grads(chunked(max_chunks, min_rows), h, weight, targets)
    want = loss_and_grads(plain_loss, h, weight, targets)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert got[1][[0, 5, 6, 36]].abs().max() == 0  # an ignored row gets no gradient
    with torch.no_grad():  # evaluation: the same loss, no gradients made
        assert chunked(max_chunks, min_rows)(h, weight, targets).item() == pytest.approx(want[0].item(), abs=tol)


def test_chunk_count_is_bounded_whatever_the_rows(monkeypatch):
    """torch.compile unrolls the chunk loop: the number of chunks, not their size, must stay bounded."""
    rows, linear = [], F.linear
    monkeypatch.setattr(F, "linear", lambda x, *args: rows.append(x.size(0)) or linear(x, *args))
    w = torch.randn(11, 4)
    for n, expected in ((500, [500]), (2048, [1024, 1024]), (5000, [1024] * 4 + [904]), (64 * 1024, [8192] * 8)):
        rows.clear()
        ChunkedCrossEntropy.apply(torch.randn(n, 4), w, torch.randint(0, 11, (n,)), False)
        assert rows == expected, n


def test_chunked_loss_under_bf16_autocast():
    """bf16 matmuls, fp32 softmax, as the plain path under autocast; only rounding differs."""
    g = torch.Generator().manual_seed(1)
    h, weight = torch.randn(300, 32, generator=g), 0.3 * torch.randn(97, 32, generator=g)
    targets = torch.randint(0, 97, (300,), generator=g)
    targets[::7] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(chunked(8, 64), h, weight, targets)
        want = loss_and_grads(plain_loss, h, weight, targets)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(got[1:], want[1:]):
        assert (a - b).abs().max() < 0.02 * b.abs().max()


def test_model_with_chunked_loss_equals_the_default_loss_and_gradients():
    """The same model with chunked_loss on (1280 rows: a full chunk and a ragged one) gives the default loss and
    every parameter's gradient, the tied table's included; forward then returns no logits."""
    model = tiny_model(scale=0.2).train()
    idx, targets = rand_idx(40, 32, seed=1), rand_idx(40, 32, seed=2)
    targets[3, 5:] = -100
    logits, want_loss = model(idx, targets)
    want = torch.autograd.grad(want_loss, list(model.parameters()))
    model.chunked_loss = True
    no_logits, loss = model(idx, targets)
    got = torch.autograd.grad(loss, list(model.parameters()))
    assert logits is not None and no_logits is None
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op makes, forward and backward."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        self.numel = max([self.numel, *sizes])
        return out


def test_chunked_loss_never_holds_full_logits():
    """No op makes, and autograd keeps, anything the size of the (rows, vocab) logits: at most a chunk of them."""
    N, C, V = 600, 8, 397
    g = torch.Generator().manual_seed(0)
    h, weight = torch.randn(N, C, generator=g, requires_grad=True), torch.randn(V, C, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=g)
    for fn, bounded in ((lambda: ChunkedCrossEntropy.apply(h, weight, targets, True, 10, 64), True),
                        (lambda: plain_loss(h, weight, targets), False)):  # the check itself catches full logits
        saved = []
        with LargestTensor() as largest, torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t.numel()) or t, lambda t: t):
            fn().backward()
        assert (largest.numel <= 64 * V and max(saved) <= max(N * C, V * C)) == bounded


def test_chunked_loss_traces_without_a_graph_break():
    """dynamo traces the model with the chunked loss whole (tests/test_compile.py compares compiled with eager)."""
    torch._dynamo.reset()
    model = tiny_model(dtype=torch.float32, scale=0.2)
    model.chunked_loss = True
    idx, targets = rand_idx(40, 32, seed=1), rand_idx(40, 32, seed=2)
    targets[0, :7] = -100
    assert torch._dynamo.explain(model)(idx, targets).graph_break_count == 0


# ----------------------------------------------------------------------------------------------------------
# Dropout, bias, optimizer groups, initialisation


def test_dropout_is_active_in_training_and_off_in_eval():
    model = tiny_model(dropout=0.3, scale=0.2)
    plain = tiny_model()
    plain.load_state_dict(model.state_dict())  # the same weights, no dropout
    idx = rand_idx(2, 16)
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(idx)[0], model(idx)[0])
        model.eval()
        assert torch.equal(model(idx)[0], model(idx)[0])
        assert torch.equal(model(idx)[0], plain(idx)[0])


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_must_be_a_probability_below_one(dropout):
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(**TINY, dropout=dropout)


def test_no_bias_model_trains_and_has_no_biases():
    model = tiny_model(bias=False).train()
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    model(rand_idx(2, 8), rand_idx(2, 8, seed=1))[1].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_optimizer_groups_decay_matrices_only_and_hold_every_parameter_once():
    model = tiny_model(dtype=torch.float32)
    (opt,) = model.configure_optimizers(0.1, 6e-4, "cpu")  # AdamW alone unless Muon is asked for
    assert isinstance(opt, torch.optim.AdamW) and len(opt.param_groups) == 2
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    for group in opt.param_groups:
        assert group["lr"] == 6e-4 and group["betas"] == (0.9, 0.95) and group["eps"] == 1e-8
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    held = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(held) == len(set(held)) == len(list(model.parameters()))  # each once (shared ones too), none left out
    assert {id(p) for p in model.parameters()} == set(held)
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params()
    (opt,) = model.configure_optimizers(0.1, 6e-4, "cpu", beta2=0.99)
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)


def test_same_seed_same_weights():
    def weights(seed):
        torch.manual_seed(seed)
        return GPT(GPTConfig(**TINY)).state_dict()

    a, b, c = weights(7), weights(7), weights(8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


# ----------------------------------------------------------------------------------------------------------
# Clear errors


@pytest.mark.parametrize("kwargs", [dict(n_embd=30, n_head=4), dict(n_layer=0), dict(n_head=-1), dict(block_size=0),
                                    dict(vocab_size=-5), dict(n_embd=0), dict(n_layer=2.0), dict(n_head=True)])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        GPTConfig(**{**TINY, **kwargs})


def test_forward_rejects_bad_lengths():
    model = tiny_model()
    with pytest.raises(ValueError, match="non-empty"):
        model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="shape"):
        model(torch.zeros(5, dtype=torch.long))
    assert model(torch.zeros(1, 32, dtype=torch.long))[0].shape == (1, 32, 67)


# ----------------------------------------------------------------------------------------------------------
# crop_block_size


def test_crop_block_size_keeps_what_fits_and_refuses_the_rest():
    model = tiny_model(scale=0.3)
    idx = rand_idx(2, 16)
    with torch.no_grad():
        logits_before, short_before = model(idx)[0], model(idx[:, :5])[0]
    model.crop_block_size(16)
    assert model.config == GPTConfig(**{**TINY, "block_size": 16})
    with torch.no_grad():
        assert torch.equal(model(idx)[0], logits_before)
        assert torch.equal(model(idx[:, :5])[0], short_before)
    with pytest.raises(ValueError, match="block_size"):
        model(rand_idx(1, 17))
    for bad in (0, 17):
        with pytest.raises(ValueError):
            model.crop_block_size(bad)
    assert model.generate(idx[:, :4], 20, temperature=0).shape == (2, 24)  # slides past the new window
    assert all(p.requires_grad for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------
# Checkpoints


def test_load_model_roundtrip(tmp_path):
    model = tiny_model(dtype=torch.float32, scale=0.2)
    path = tmp_path / "model_00100.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "step": 100}, path)
    loaded, enc = load_model(str(path))
    assert loaded.config == model.config and enc.name == "gpt2"  # no tokenizer recorded: GPT-2's
    idx = rand_idx(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert load_checkpoint(path)["step"] == 100


def test_checkpoints_keep_dropout_and_bias_and_old_ones_still_load(tmp_path):
    model = tiny_model(dtype=torch.float32, dropout=0.1, bias=False, scale=0.2)
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config)}, tmp_path / "new.pt")
    assert load_model(str(tmp_path / "new.pt"))[0].config == model.config
    old = tiny_model(dtype=torch.float32)  # a checkpoint written before GPTConfig had dropout and bias
    old_config = {k: v for k, v in dataclasses.asdict(old.config).items() if k not in ("dropout", "bias")}
    torch.save({"model": old.state_dict(), "model_config": old_config}, tmp_path / "old.pt")
    loaded, _ = load_model(str(tmp_path / "old.pt"))
    assert loaded.config == GPTConfig(**TINY) and (loaded.config.dropout, loaded.config.bias) == (0.0, True)
    idx = rand_idx(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], old(idx)[0])


def test_checkpoint_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing.pt"))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a torch checkpoint\x00\xff" * 10)
    with pytest.raises(ValueError):
        load_checkpoint(garbage)
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ValueError):
        load_checkpoint(tmp_path / "tensor.pt")


def test_load_checkpoint_runs_no_pickled_code(tmp_path):
    """weights_only=True: a checkpoint that pickles a config object (not a dict) is refused."""
    model = tiny_model(dtype=torch.float32)
    path = tmp_path / "pickled.pt"
    torch.save({"model": model.state_dict(), "model_config": model.config}, path)
    assert isinstance(torch.load(path, weights_only=False)["model_config"], GPTConfig)  # readable the unsafe way
    with pytest.raises(ValueError):
        load_checkpoint(path)


# ----------------------------------------------------------------------------------------------------------
# Import hygiene


def test_import_has_no_side_effects(tmp_path):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "HF_", "TORCH"))}
    env.update(PYTHONPATH=str(ROOT), HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    code = ("import sys, train_gpt2, hellaswag, run_files, plot; "
            "assert not {'transformers', 'tiktoken', 'matplotlib', 'wandb'} & set(sys.modules), 'heavy import'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
