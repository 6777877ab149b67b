"""The model section of train_gpt2.py: HF parity, parameter counts, tying, attention, loss, init, errors,
cropping, tokenizer, generation, checkpoints and import hygiene. Tiny float64 models unless a test is about
the 124M shape; Hugging Face models are built randomly offline and saved to temp dirs."""

import copy
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
from train_gpt2 import (GPT, ChunkedCrossEntropy, GPTConfig, KVCache, TrainConfig, build_model, convert_hf_state_dict,
                        get_tokenizer, load_checkpoint, load_model)

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(block_size=32, vocab_size=67, n_layer=2, n_head=4, n_embd=32)
GPT2 = get_tokenizer()  # the tokenizer build_model is told the data uses


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box they lose 10x to contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(seed: int = 0, dtype=torch.float64, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).to(dtype).eval()


def randomize_(model: nn.Module, scale: float = 0.3, seed: int = 0):
    """Give every parameter (biases and LayerNorms included) a distinct, non-trivial random value, so a
    loader that drops or mangles any one of them shows up in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            if ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(scale * noise)
    return model


def rand_idx(B: int, T: int, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------
# Hugging Face parity


def hf_tiny_config(**overrides):
    from transformers import GPT2Config

    kw = dict(vocab_size=67, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return GPT2Config(**{**kw, **overrides})


def save_hf(config, path: Path, randomize: bool = True, seed: int = 0):
    """A random GPT2LMHeadModel saved with save_pretrained; returns it in eval mode (no dropout)."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    hf = GPT2LMHeadModel(config).eval()
    if randomize:
        randomize_(hf, seed=seed)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_tiny")
    hf = save_hf(hf_tiny_config(), path)
    return hf, path


def hf_loss_matches(hf, ours, idx, labels):
    """HF shifts `labels` internally; ours wants targets already aligned with the inputs."""
    with torch.no_grad():
        hf_loss = hf(idx, labels=labels).loss
        # targets[t] = labels[t + 1]; the last position has no next token
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        _, loss_full = ours(idx, targets)
        _, loss_cut = ours(idx[:, :-1].contiguous(), labels[:, 1:].contiguous())  # one position shorter
    assert loss_full.item() == pytest.approx(hf_loss.item(), abs=1e-5)
    assert loss_cut.item() == pytest.approx(hf_loss.item(), abs=1e-5)


def test_hf_parity_tiny(hf_tiny):
    hf, path = hf_tiny
    ours = GPT.from_pretrained(str(path))
    assert ours.config == GPTConfig(**TINY)
    assert ours.lm_head.weight is ours.transformer.wte.weight
    idx = rand_idx(3, 32)
    with torch.no_grad():
        ref = hf(idx).logits
        logits, _ = ours(idx)
    assert ref.abs().max() > 1.0  # random, large weights: the comparison below is not trivially small
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    hf_loss_matches(hf, ours, idx, idx)
    labels = idx.clone()
    labels[0, 20:] = -100  # padded tail
    labels[2, 5] = -100
    hf_loss_matches(hf, ours, idx, labels)


@pytest.mark.slow
def test_hf_parity_124m(tmp_path):
    from transformers import GPT2Config

    hf = save_hf(GPT2Config(), tmp_path, randomize=False)  # HF's own init: realistic scales for 12 layers
    ours = GPT.from_pretrained(str(tmp_path))
    assert ours.config == GPTConfig()
    assert ours.num_params() == 124_439_808
    idx = rand_idx(2, 24, vocab=50257)
    with torch.no_grad():
        ref = hf(idx).logits
        logits, _ = ours(idx)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)
    hf_loss_matches(hf, ours, idx, idx)


def test_convert_checks_key_set_and_shapes(hf_tiny):
    hf, _ = hf_tiny
    hf_sd, our_sd = hf.state_dict(), tiny_model(dtype=torch.float32).state_dict()
    assert set(convert_hf_state_dict(hf_sd, our_sd)) == set(our_sd)

    # HF's attention mask buffers (older versions) are not weights: ignored
    buffers = {
        "transformer.h.0.attn.bias": torch.ones(1, 1, 32, 32),
        "transformer.h.0.attn.masked_bias": torch.tensor(-1e4),
    }
    convert_hf_state_dict({**hf_sd, **buffers}, our_sd)

    missing = dict(hf_sd)
    del missing["transformer.h.1.ln_2.bias"]
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.ln_2\.bias"):
        convert_hf_state_dict(missing, our_sd)

    extra = {**hf_sd, "transformer.h.2.mlp.c_fc.weight": torch.zeros(32, 128)}
    with pytest.raises(ValueError, match=r"transformer\.h\.2\.mlp\.c_fc\.weight"):
        convert_hf_state_dict(extra, our_sd)

    wrong_shapes = {"transformer.h.0.mlp.c_fc.bias": torch.zeros(64), "transformer.wpe.weight": torch.zeros(16, 32)}
    for key, bad in wrong_shapes.items():
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            convert_hf_state_dict({**hf_sd, key: bad}, our_sd)


def test_from_pretrained_rejects_other_layouts(tmp_path):
    save_hf(hf_tiny_config(n_inner=64), tmp_path / "inner")  # MLP width != 4 * n_embd
    with pytest.raises(ValueError, match=r"mlp\.c_fc"):
        GPT.from_pretrained(str(tmp_path / "inner"))
    save_hf(hf_tiny_config(activation_function="relu"), tmp_path / "relu")
    with pytest.raises(ValueError, match="relu"):
        GPT.from_pretrained(str(tmp_path / "relu"))


@pytest.mark.parametrize(
    "variant",
    [
        dict(tie_word_embeddings=False),  # separate lm_head: ours ties, so one of the two tables is lost
        dict(scale_attn_weights=False),  # no 1/sqrt(hs) in attention
        dict(scale_attn_by_inverse_layer_idx=True),  # extra 1/(layer+1) in attention
        dict(layer_norm_epsilon=1e-2),  # ours uses nn.LayerNorm's 1e-5
    ],
    ids=lambda v: next(iter(v)),
)
def test_from_pretrained_never_loads_a_different_model_silently(tmp_path, variant):
    """A saved HF GPT-2 whose config our architecture cannot express must be refused, not mis-loaded."""
    hf = save_hf(hf_tiny_config(**variant), tmp_path)
    if variant.get("tie_word_embeddings") is False:
        assert hf.lm_head.weight is not hf.transformer.wte.weight
    try:
        ours = GPT.from_pretrained(str(tmp_path))
    except ValueError:
        return  # refused loudly: fine
    idx = rand_idx(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


def test_untransposed_square_matrix_is_caught_only_by_logits(hf_tiny, monkeypatch):
    """attn.c_proj is C x C, so forgetting its transpose passes every shape check; only the logits see it."""
    hf, path = hf_tiny
    w = hf.transformer.h[0].attn.c_proj.weight
    assert w.shape[0] == w.shape[1] and not torch.allclose(w, w.t())
    idx = rand_idx(2, 32)
    with torch.no_grad():
        ref = hf(idx).logits
        good = GPT.from_pretrained(str(path))(idx)[0]
    torch.testing.assert_close(good, ref, atol=1e-4, rtol=0)

    skip_square = tuple(k for k in train_gpt2.HF_TRANSPOSED if k != "attn.c_proj.weight")
    assert len(skip_square) == 3
    monkeypatch.setattr(train_gpt2, "HF_TRANSPOSED", skip_square)
    wrong_model = GPT.from_pretrained(str(path))  # no error: every shape fits
    with torch.no_grad():
        wrong = wrong_model(idx)[0]
    assert (wrong - ref).abs().max() > 1e-2
    # the same loader with the transpose restored matches; skipping a non-square one fails on shape
    monkeypatch.setattr(train_gpt2, "HF_TRANSPOSED", skip_square[1:] + ("attn.c_proj.weight",))
    assert "attn.c_attn.weight" not in train_gpt2.HF_TRANSPOSED
    with pytest.raises(ValueError, match=r"attn\.c_attn\.weight"):
        GPT.from_pretrained(str(path))


def test_load_model_from_hf_dir(hf_tiny):
    hf, path = hf_tiny
    idx = rand_idx(1, 16)
    with torch.no_grad():
        torch.testing.assert_close(load_model(str(path))[0](idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------------------------------------
# Parameter counts and weight tying


def test_gpt2_124m_parameter_counts():
    assert GPTConfig() == GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)
    with torch.device("meta"):
        model = GPT(GPTConfig())
        padded = GPT(GPTConfig(vocab_size=50304))
        untied = GPT(GPTConfig())
        untied.lm_head.weight = nn.Parameter(torch.empty(50257, 768))
    assert model.transformer.wte.weight.is_meta
    V, T, C, L = 50257, 1024, 768, 12
    assert model.num_params() == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C == 124_439_808
    assert model.num_params(exclude_embeddings=True) == 124_439_808 - T * C
    assert untied.num_params() - model.num_params() == V * C == 38_597_376
    assert padded.num_params() == 124_475_904


def test_tied_weights_and_optimizer_groups():
    model = tiny_model(dtype=torch.float32)
    wte = model.transformer.wte.weight
    assert model.lm_head.weight is wte
    (opt,) = model.configure_optimizers(0.1, 6e-4, "cpu")  # AdamW alone unless Muon is asked for
    assert isinstance(opt, torch.optim.AdamW)
    assert len(opt.param_groups) == 2
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    for group in opt.param_groups:
        assert group["lr"] == 6e-4 and group["betas"] == (0.9, 0.95) and group["eps"] == 1e-8
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    held = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(held) == len(set(held))  # nothing twice: the tied table is held once
    assert set(held) == {id(p) for p in model.parameters()}  # every parameter somewhere
    assert sum(id(p) == id(wte) for p in decay["params"]) == 1
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.num_params()
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} == {
        n for n, p in model.named_parameters() if n.endswith("weight") and ".ln_" not in n and "ln_f" not in n
    }


def test_tied_gradient_is_sum_of_both_uses():
    tied = randomize_(tiny_model(), scale=0.1)
    untied = copy.deepcopy(tied)
    untied.lm_head.weight = nn.Parameter(untied.transformer.wte.weight.detach().clone())
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    idx, targets = rand_idx(2, 16, seed=1), rand_idx(2, 16, seed=2)
    loss_t, loss_u = tied(idx, targets)[1], untied(idx, targets)[1]
    assert loss_t.item() == loss_u.item()
    loss_t.backward()
    loss_u.backward()
    g_embed, g_head = untied.transformer.wte.weight.grad, untied.lm_head.weight.grad
    assert g_embed.abs().max() > 0 and g_head.abs().max() > 0
    torch.testing.assert_close(tied.transformer.wte.weight.grad, g_embed + g_head, atol=1e-12, rtol=0)
    assert not torch.allclose(tied.transformer.wte.weight.grad, g_head)  # the embedding path really counts


# ----------------------------------------------------------------------------------------------------------
# nanoGPT's dropout and bias


def nanogpt_param_count(V: int, C: int, L: int, bias: bool) -> int:
    """nanoGPT's get_num_params() (position table excluded, tied table once), from its layer shapes: per block
    c_attn C x 3C, attn c_proj C x C, c_fc C x 4C, mlp c_proj 4C x C (+ 3C, C, 4C, C biases) and two LayerNorms
    (C gains + C biases each); ln_f; the token table V x C."""
    matrices = C * 3 * C + C * C + C * 4 * C + 4 * C * C
    linear_biases, norm = (3 * C + C + 4 * C + C, 2 * C) if bias else (0, C)
    return V * C + L * (matrices + linear_biases + 2 * norm) + norm


@pytest.mark.parametrize("bias, expected", [(True, 10_672_512), (False, 10_646_784)])  # nanoGPT: 10.67M, 10.65M
def test_experiment_d_builds_with_nanogpts_parameter_count(bias, expected):
    config = GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=bias)
    with torch.device("meta"):
        model = GPT(config)
    assert model.num_params(exclude_embeddings=True) == nanogpt_param_count(65, 384, 6, bias) == expected
    assert model.num_params() == expected + 256 * 384
    names = [n for n, _ in model.named_parameters()]
    assert any(n.endswith("bias") for n in names) == bias
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.2 for m in model.modules()) == 1 + 3 * 6


def test_no_bias_model_trains_and_has_no_biases():
    model = tiny_model(bias=False).train()
    assert all(m.bias is None for m in model.modules() if isinstance(m, (nn.Linear, nn.LayerNorm)))
    loss = model(rand_idx(2, 8), rand_idx(2, 8, seed=1))[1]
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5])
def test_dropout_must_be_a_probability_below_one(dropout):
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(**TINY, dropout=dropout)


def test_dropout_is_active_in_training_and_off_in_eval():
    model = randomize_(tiny_model(dropout=0.3), scale=0.2)
    plain = tiny_model()
    plain.load_state_dict(model.state_dict())  # the same weights, no dropout
    idx = rand_idx(2, 16)
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(idx)[0], model(idx)[0])
        for name, m in model.named_modules():  # attention weights alone: dropped by the kernel, via dropout_p
            if isinstance(m, nn.Dropout) and not name.endswith("attn_dropout"):
                m.p = 0.0
        assert not torch.equal(model(idx)[0], model(idx)[0])
        model.eval()
        assert torch.equal(model(idx)[0], model(idx)[0])
        assert torch.equal(model(idx)[0], plain(idx)[0])


def test_from_pretrained_and_build_model_override_dropout_only(hf_tiny, tmp_path):
    hf, path = hf_tiny
    ours = GPT.from_pretrained(str(path), dropout=0.1)
    assert ours.config == GPTConfig(**TINY, dropout=0.1)
    idx = rand_idx(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)  # parity unchanged
        assert not torch.equal(ours.train()(idx)[0], ours(idx)[0])
    with pytest.raises(TypeError, match="bias"):  # GPT-2's weights have biases: no such option
        GPT.from_pretrained(str(path), bias=False)
    cfg = dict(block_size=32, seq_len=32, init_from=str(path))
    with pytest.raises(ValueError, match="--bias false: .* has biases"):
        build_model(TrainConfig(**cfg, bias=False), GPT2, True)
    model = build_model(TrainConfig(**cfg, dropout=0.2), GPT2, True)
    assert model.config.dropout == 0.2 and {m.p for m in model.modules() if isinstance(m, nn.Dropout)} == {0.2}
    args = train_gpt2.parse_train_args(["--dropout", "0.1", "--bias", "false"])
    assert (args.dropout, args.bias) == (0.1, False)
    no_bias = build_model(dataclasses.replace(args, **TINY, seq_len=32), GPT2, False)
    assert no_bias.config.bias is False and not any(n.endswith("bias") for n, _ in no_bias.named_parameters())


def test_checkpoints_keep_dropout_and_bias_and_old_ones_still_load(tmp_path):
    model = randomize_(tiny_model(dtype=torch.float32, dropout=0.1, bias=False), scale=0.2)
    path = tmp_path / "new.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config)}, path)
    assert load_model(str(path))[0].config == model.config
    built = build_model(TrainConfig(init_from=str(path), block_size=32, seq_len=32, dropout=0.0), GPT2, False)
    assert built.config == dataclasses.replace(model.config, dropout=0.0)  # bias as saved, this run's dropout
    old = tiny_model(dtype=torch.float32)  # a checkpoint written before GPTConfig had dropout and bias
    old_config = {k: v for k, v in dataclasses.asdict(old.config).items() if k not in ("dropout", "bias")}
    torch.save({"model": old.state_dict(), "model_config": old_config}, tmp_path / "old.pt")
    loaded, _ = load_model(str(tmp_path / "old.pt"))
    assert loaded.config == GPTConfig(**TINY) and (loaded.config.dropout, loaded.config.bias) == (0.0, True)
    idx = rand_idx(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], old(idx)[0])


# ----------------------------------------------------------------------------------------------------------
# Attention: causality, isolation, reference, KV cache


def test_causal_and_batch_rows_isolated():
    model = randomize_(tiny_model())
    idx = rand_idx(3, 24, seed=1)
    with torch.no_grad():
        base = model(idx)[0]
        future = idx.clone()
        future[:, 13:] = rand_idx(3, 11, seed=2)
        changed = model(future)[0]
        other_row = idx.clone()
        other_row[1] = rand_idx(1, 24, seed=3)[0]
        rows = model(other_row)[0]
    assert torch.equal(base[:, :13], changed[:, :13])
    assert not torch.allclose(base[:, 13:], changed[:, 13:])  # the change did reach the later positions
    assert torch.equal(base[0], rows[0]) and torch.equal(base[2], rows[2])
    assert not torch.allclose(base[1], rows[1])
    with torch.no_grad():
        assert torch.equal(model(idx[2:3])[0], base[2:3])  # batch size does not matter either


def reference_attention(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Causal multi-head self-attention with scalar loops over batch, head, query and key."""
    B, T, C = x.shape
    nh = attn.n_head
    hs = C // nh
    qkv = x @ attn.c_attn.weight.t() + attn.c_attn.bias
    q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]
    y = torch.zeros(B, T, C, dtype=x.dtype)
    for b in range(B):
        for h in range(nh):
            cols = slice(h * hs, (h + 1) * hs)
            for t in range(T):
                scores = [float(q[b, t, cols] @ k[b, s, cols]) / math.sqrt(hs) for s in range(t + 1)]
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                for s in range(t + 1):
                    y[b, t, cols] += (weights[s] / total) * v[b, s, cols]
    return y @ attn.c_proj.weight.t() + attn.c_proj.bias


def test_attention_matches_scalar_reference():
    model = randomize_(tiny_model(), scale=0.5)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = attn(x)
        ref = reference_attention(attn, x)
        v = x @ attn.c_attn.weight[64:].t() + attn.c_attn.bias[64:]
        running_mean = torch.cumsum(v, dim=1) / torch.arange(1, 13, dtype=torch.float64).view(1, -1, 1)
        uniform = running_mean @ attn.c_proj.weight.t() + attn.c_proj.bias
    # the weights are large enough that attention is far from a plain running average of the values
    assert (ref - uniform).abs().max() > 0.1
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)


def test_kv_cache_prefill_and_decode_equal_full_forward():
    model = randomize_(tiny_model(), scale=0.3)
    idx = rand_idx(2, 32, seed=4)
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache(model.config, 2, "cpu", torch.float64)
        steps = [model(idx[:, :10], kv_cache=cache)[0]]
        for t in range(10, 32):
            steps.append(model(idx[:, t : t + 1], kv_cache=cache)[0])
        assert cache.pos == 32
        with pytest.raises(ValueError, match="block_size"):
            model(idx[:, :1], kv_cache=cache)  # the cache is full
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)
    with torch.no_grad():  # a chunk of several tokens may follow the cached ones too
        cache = KVCache(model.config, 2, "cpu", torch.float64)
        model(idx[:, :4], kv_cache=cache)
        chunk = model(idx[:, 4:6], kv_cache=cache)[0]
    torch.testing.assert_close(chunk, full[:, 4:6], atol=1e-10, rtol=0)


# ----------------------------------------------------------------------------------------------------------
# Loss


def test_zero_logits_give_log_vocab_for_any_padding():
    model = tiny_model()
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
    idx = rand_idx(2, 8)
    targets = rand_idx(2, 8, seed=1)
    flat_order = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    for n_ignored in range(16):
        t = targets.clone().view(-1)
        t[flat_order[:n_ignored]] = -100
        logits, loss = model(idx)[0], model(idx, t.view(2, 8))[1]
        assert torch.count_nonzero(logits) == 0
        assert loss.item() == pytest.approx(math.log(67), abs=1e-6)


def test_padding_never_changes_the_mean():
    model = randomize_(tiny_model(), scale=0.2)
    long, short = rand_idx(1, 12, seed=1)[0], rand_idx(1, 7, seed=2)[0]
    # each sequence alone: summed next-token losses
    total, count = 0.0, 0
    for seq in (long, short):
        logits = model(seq[None, :-1])[0][0]
        total += -F.log_softmax(logits, dim=-1).gather(1, seq[1:, None]).sum().item()
        count += len(seq) - 1
    expected = total / count
    # padded to one batch: pad inputs are arbitrary ids, their targets -100
    for pad_id in (0, 66):
        idx = torch.full((2, 11), pad_id)
        targets = torch.full((2, 11), -100)
        idx[0], targets[0] = long[:-1], long[1:]
        idx[1, :6], targets[1, :6] = short[:-1], short[1:]
        loss = model(idx, targets)[1]
        assert loss.item() == pytest.approx(expected, abs=1e-6)  # abs: see test_loss_keeps_model_precision
    assert expected != pytest.approx(model(idx, torch.where(targets == -100, 0, targets))[1].item(), abs=1e-3)


def test_loss_accepts_sliced_targets():
    """Targets are often a slice of the same batch (idx[:, 1:]): not contiguous, still valid."""
    model = tiny_model()
    idx = rand_idx(2, 17)
    expected = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())[1]
    loss = model(idx[:, :-1], idx[:, 1:])[1]
    assert loss.item() == expected.item()


def test_loss_keeps_model_precision():
    """The loss is taken in at least fp32 (bf16 logits are upcast); a float64 model is not rounded down."""
    model = randomize_(tiny_model(), scale=0.2)
    idx, targets = rand_idx(2, 16), rand_idx(2, 16, seed=1)
    logits, loss = model(idx)[0], model(idx, targets)[1]
    assert loss.dtype == torch.float64
    expected = F.cross_entropy(logits.view(-1, 67), targets.view(-1))
    assert abs(loss.item() - expected.item()) < 1e-12


def plain_loss(h, weight, targets):
    """The loss as it is usually written: full logits, upcast to fp32 (fp64 stays), one cross_entropy."""
    logits = F.linear(h, weight)
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets, ignore_index=-100)


def loss_and_grads(loss_fn, h, weight, targets):
    h, weight = h.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = loss_fn(h, weight, targets)
    return (loss, *torch.autograd.grad(3.0 * loss, (h, weight)))  # 3: the incoming gradient is used, not assumed 1


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("chunk", [5, 16, 37, 1024])  # ragged last chunk, even split, one exact chunk, N < chunk
def test_chunked_loss_equals_full_logits_loss(dtype, tol, chunk):
    g = torch.Generator().manual_seed(0)
    h, weight = torch.randn(37, 16, generator=g, dtype=dtype), torch.randn(53, 16, generator=g, dtype=dtype)
    targets = torch.randint(0, 53, (37,), generator=g)
    targets[[0, 5, 6, 36]] = -100  # ignored rows at a chunk's start and end
    got = loss_and_grads(lambda h, w, t: ChunkedCrossEntropy.apply(h, w, t, True, chunk), h, weight, targets)
    want = loss_and_grads(plain_loss, h, weight, targets)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert got[1][[0, 5, 6, 36]].abs().max() == 0  # an ignored row gets no gradient
    with torch.no_grad():  # evaluation: the same loss, no gradients made
        no_grad_loss = ChunkedCrossEntropy.apply(h, weight, targets, False, chunk)
        assert no_grad_loss.item() == pytest.approx(want[0].item(), abs=tol)


def test_chunked_loss_under_bf16_autocast():
    """bf16 matmuls, fp32 softmax, as the plain path under autocast; only rounding differs."""
    g = torch.Generator().manual_seed(1)
    h, weight = torch.randn(300, 32, generator=g), 0.3 * torch.randn(97, 32, generator=g)
    targets = torch.randint(0, 97, (300,), generator=g)
    targets[::7] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(lambda h, w, t: ChunkedCrossEntropy.apply(h, w, t, True, 64), h, weight, targets)
        want = loss_and_grads(plain_loss, h, weight, targets)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    for a, b in zip(got[1:], want[1:]):
        assert (a - b).abs().max() < 0.02 * b.abs().max()


def test_model_loss_and_every_gradient_equal_the_full_logits_path():
    """Through the whole model (1280 rows: a full chunk and a ragged one), gradients reach every parameter, and
    the tied table gets its lm_head share summed with its embedding share."""
    model = randomize_(tiny_model(), scale=0.2).train()
    idx, targets = rand_idx(40, 32, seed=1), rand_idx(40, 32, seed=2)
    targets[3, 5:] = -100
    loss = model(idx, targets)[1]
    got = torch.autograd.grad(loss, list(model.parameters()))
    want_loss = plain_loss(model.features(idx).flatten(0, 1), model.lm_head.weight, targets.flatten())
    want = torch.autograd.grad(want_loss, list(model.parameters()))
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


def test_loss_never_holds_full_logits():
    """No op makes, and autograd keeps, anything the size of the (rows, vocab) logits: at most a chunk of them."""
    N, C, V, chunk = 600, 8, 397, 64
    g = torch.Generator().manual_seed(0)
    h, weight = torch.randn(N, C, generator=g, requires_grad=True), torch.randn(V, C, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=g)
    for fn, bounded in ((lambda: ChunkedCrossEntropy.apply(h, weight, targets, True, chunk), True),
                        (lambda: plain_loss(h, weight, targets), False)):  # the check itself catches full logits
        saved = []
        with LargestTensor() as largest, torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t.numel()) or t, lambda t: t):
            fn().backward()
        assert (largest.numel <= chunk * V and max(saved) <= max(N * C, V * C)) == bounded


def test_chunked_loss_traces_without_a_graph_break():
    """dynamo traces the autograd.Function whole (tests/test_compile.py compares compiled training with eager)."""
    torch._dynamo.reset()
    model = randomize_(tiny_model(dtype=torch.float32), scale=0.2)
    idx, targets = rand_idx(40, 32, seed=1), rand_idx(40, 32, seed=2)
    targets[0, :7] = -100
    assert torch._dynamo.explain(model)(idx, targets).graph_break_count == 0


# ----------------------------------------------------------------------------------------------------------
# Initialisation


def test_init_statistics_and_seeding():
    config = GPTConfig(block_size=256, vocab_size=2000, n_layer=6, n_head=4, n_embd=256)
    torch.manual_seed(1234)
    model = GPT(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    assert residual_std < 0.9 * 0.02  # distinguishable within the tolerance below
    seen = set()
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            w = module.weight.detach()
            want = residual_std if name.endswith("c_proj") else 0.02
            assert w.std().item() == pytest.approx(want, rel=0.03), name
            assert abs(w.mean().item()) < 5 * want / math.sqrt(w.numel()), name
            if isinstance(module, nn.Linear) and module.bias is not None:
                assert torch.count_nonzero(module.bias) == 0, name
            seen.add(name.split(".")[-1])
        elif isinstance(module, nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0), name
            seen.add("ln")
    assert seen == {"wte", "wpe", "c_attn", "c_proj", "c_fc", "lm_head", "ln"}

    def weights(seed):
        torch.manual_seed(seed)
        return GPT(GPTConfig(**TINY)).state_dict()

    a, b, c = weights(7), weights(7), weights(8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(not torch.equal(a[k], c[k]) for k in a if k.endswith("weight") and "ln_" not in k)


# ----------------------------------------------------------------------------------------------------------
# Clear errors


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_embd=30, n_head=4),
        dict(n_layer=0),
        dict(n_head=-1),
        dict(block_size=0),
        dict(vocab_size=-5),
        dict(n_embd=0),
        dict(n_layer=2.0),
        dict(n_head=True),
    ],
)
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


def test_from_pretrained_and_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="not-a-gpt2"):
        GPT.from_pretrained("not-a-gpt2")
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing.pt"))
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a torch checkpoint\x00\xff" * 10)
    with pytest.raises(ValueError):
        load_checkpoint(garbage)
    not_ours = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), not_ours)
    with pytest.raises(ValueError):
        load_checkpoint(not_ours)


# ----------------------------------------------------------------------------------------------------------
# crop_block_size


def test_crop_block_size():
    model = randomize_(tiny_model())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params_before = {k: p for k, p in model.named_parameters() if k != "transformer.wpe.weight"}
    idx = rand_idx(2, 16)
    with torch.no_grad():
        logits_before, short_before = model(idx)[0], model(idx[:, :5])[0]
    model.crop_block_size(16)
    assert model.config == GPTConfig(**{**TINY, "block_size": 16})
    assert model.transformer.wpe.weight.shape == (16, 32)
    assert isinstance(model.transformer.wpe.weight, nn.Parameter) and model.transformer.wpe.weight.requires_grad
    after = model.state_dict()
    assert set(after) == set(before)
    for k in before:
        if k == "transformer.wpe.weight":
            assert torch.equal(after[k], before[k][:16])
        else:
            assert torch.equal(after[k], before[k]), k
    params_after = dict(model.named_parameters())
    assert all(params_after[k] is p for k, p in params_before.items())  # the same Parameter objects
    assert model.lm_head.weight is model.transformer.wte.weight
    with torch.no_grad():
        assert torch.equal(model(idx)[0], logits_before)
        assert torch.equal(model(idx[:, :5])[0], short_before)
    with pytest.raises(ValueError, match="block_size"):
        model(rand_idx(1, 17))
    for bad in (0, 17):
        with pytest.raises(ValueError):
            model.crop_block_size(bad)
    assert model.generate(idx[:, :4], 20, temperature=0).shape == (2, 24)  # slides past the new window


# ----------------------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_known_ids_and_roundtrip():
    enc = get_tokenizer()
    assert enc.encode("Hello, I'm a language model,") == [15496, 11, 314, 1101, 257, 3303, 2746, 11]
    assert enc.eot_token == 50256 and enc.n_vocab == 50257
    assert enc.encode(" the") == [262]
    assert enc.encode("\n") == [198]
    assert enc.encode("!") == [0]
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.decode([50256]) == "<|endoftext|>"
    texts = ["", "Hello, world!", "naïve café — 日本語 🤖", "  two  spaces\n\ttab\r\n", "it's we'll they've"]
    for text in texts:
        assert enc.decode(enc.encode(text)) == text


def test_tokenizer_needs_no_network(monkeypatch):
    import tiktoken
    import tiktoken.load

    def no_network(*args, **kwargs):
        raise AssertionError("get_tokenizer tried to fetch or look up a remote encoding")

    monkeypatch.setattr(tiktoken, "get_encoding", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.load, "read_file_cached", no_network)
    enc = get_tokenizer.__wrapped__(train_gpt2.GPT2_VOCAB_FILE)  # uncached: really builds it
    assert enc.encode(" the") == [262]


def test_tokenizer_rejects_a_corrupted_vocab(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    data = bytearray(train_gpt2.GPT2_VOCAB_FILE.read_bytes())
    i = data.index(b" ", 1000) - 1  # a base64 character of some token
    data[i] = ord("A") if data[i] != ord("A") else ord("B")
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="vocab|sha256"):
        get_tokenizer(bad)
    with pytest.raises((ValueError, FileNotFoundError, OSError)):
        get_tokenizer(tmp_path / "absent.tiktoken")


# ----------------------------------------------------------------------------------------------------------
# Generation


@pytest.mark.parametrize("prompt_len", [1, 5, 31, 32, 40])
def test_greedy_generation_same_with_and_without_cache(prompt_len):
    model = randomize_(tiny_model(), scale=0.3)
    idx = rand_idx(3, prompt_len, seed=prompt_len)
    with_cache = model.generate(idx, 30, temperature=0, use_cache=True)
    without = model.generate(idx, 30, temperature=0, use_cache=False)
    assert with_cache.shape == (3, prompt_len + 30)
    assert torch.equal(with_cache[:, :prompt_len], idx)
    assert torch.equal(with_cache, without)
    assert len(set(with_cache[:, prompt_len:].flatten().tolist())) > 3  # not a constant stream
    assert not torch.equal(with_cache[0], with_cache[1])


def test_generation_uses_the_cache():
    model = tiny_model()
    lengths = []
    features = model.features
    model.features = lambda idx, *a, **k: (lengths.append(idx.size(1)), features(idx, *a, **k))[1]
    model.generate(rand_idx(2, 5), 10, temperature=0, use_cache=True)
    assert lengths == [5] + [1] * 9
    lengths.clear()
    model.generate(rand_idx(2, 5), 3, temperature=0, use_cache=False)
    assert lengths == [5, 6, 7]


def test_seeded_sampling_same_with_and_without_cache():
    model = tiny_model()

    def sample(use_cache, seed=42, top_k=10):
        gen = torch.Generator().manual_seed(seed)
        return model.generate(rand_idx(2, 4), 36, temperature=0.8, top_k=top_k, generator=gen, use_cache=use_cache)

    a, b = sample(True), sample(False)
    assert a.shape == (2, 40) and torch.equal(a, b)  # 40 > block_size: the window slides
    assert torch.equal(sample(True, top_k=None), sample(False, top_k=None))
    assert not torch.equal(a, sample(True, seed=43))  # the seed matters


def test_top_k_one_is_greedy():
    model = randomize_(tiny_model(), scale=0.3)
    idx = rand_idx(3, 6)
    greedy = model.generate(idx, 30, temperature=0)
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        assert torch.equal(model.generate(idx, 30, temperature=1.3, top_k=1, generator=gen), greedy)


def test_vocab_limit_is_never_exceeded():
    model = tiny_model()
    limit = 50
    with torch.no_grad():
        # the final hidden state is a constant b; rows >= limit point along b, so their logits are largest
        b = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(b)
        model.transformer.wte.weight[limit:] = b
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
# Checkpoints


def test_load_model_roundtrip(tmp_path):
    model = randomize_(tiny_model(dtype=torch.float32), scale=0.2)
    path = tmp_path / "model_00100.pt"
    torch.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config), "step": 100}, path)
    loaded, _ = load_model(str(path))
    assert loaded.config == model.config
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    idx = rand_idx(2, 32)
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert load_checkpoint(path)["step"] == 100


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
    code = "import sys, train_gpt2, hellaswag; assert 'transformers' not in sys.modules, 'transformers imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    assert list(cwd.iterdir()) == [] and list(home.iterdir()) == []
