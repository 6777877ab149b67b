"""The GPT-2 contract: what makes train_gpt2.py's model GPT-2 itself rather than any GPT. Parity with Hugging Face's
GPT2LMHeadModel (logits, loss, HellaSwag choices), weight import and its refusals, Hugging Face's module names, the
exact parameter and FLOP counts of the 124M shape, GPT-2's initialisation and tying, its attention, and the published
recipe's numbers (the preset, the warmup + cosine schedule).

Every test here carries the gpt2_contract marker. A research edit (RoPE, a SwiGLU MLP, QK-layernorm, another LR
schedule) changes some of these on purpose; `pytest -m "not gpt2_contract"` is the suite that must stay green then.
Hugging Face models are built randomly offline and saved to temp dirs."""

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn as nn

import hellaswag
import train_gpt2
from fineweb import get_tokenizer
from train_gpt2 import GPT, PRESETS, GPTConfig, TrainConfig, build_model, convert_hf_state_dict, get_lr, load_model

pytestmark = [pytest.mark.gpt2_contract, pytest.mark.usefixtures("one_thread")]
TINY = dict(block_size=32, vocab_size=67, n_layer=2, n_head=4, n_embd=32)
GPT2 = get_tokenizer()


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **overrides})).to(torch.float64).eval()


def randomize_(model: nn.Module, scale: float = 0.3, seed: int = 0):
    """Give every parameter (biases and LayerNorms included) a distinct, non-trivial random value, so a loader that
    drops or mangles any one of them shows up in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            p.copy_(1.0 + 0.2 * noise if ".ln_" in name and name.endswith("weight") else scale * noise)
    return model


def rand_idx(B: int, T: int, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------------------
# Hugging Face parity and weight import


def hf_tiny_config(**overrides):
    from transformers import GPT2Config

    kw = dict(vocab_size=67, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return GPT2Config(**{**kw, **overrides})


def save_hf(config, path, randomize: bool = True, seed: int = 0):
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
    return save_hf(hf_tiny_config(), path), path


def hf_loss_matches(hf, ours, idx, labels):
    """HF shifts `labels` internally; ours wants targets already aligned with the inputs."""
    with torch.no_grad():
        hf_loss = hf(idx, labels=labels).loss
        targets = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)  # targets[t] = labels[t+1]
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
    ours.chunked_loss = True  # the chunked loss is the same loss
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
    hf_sd, our_sd = hf.state_dict(), tiny_model().float().state_dict()
    assert set(convert_hf_state_dict(hf_sd, our_sd)) == set(our_sd)
    buffers = {"transformer.h.0.attn.bias": torch.ones(1, 1, 32, 32),  # HF's mask buffers (older versions): ignored
               "transformer.h.0.attn.masked_bias": torch.tensor(-1e4)}
    convert_hf_state_dict({**hf_sd, **buffers}, our_sd)
    missing = dict(hf_sd)
    del missing["transformer.h.1.ln_2.bias"]
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.ln_2\.bias"):
        convert_hf_state_dict(missing, our_sd)
    extra = {**hf_sd, "transformer.h.2.mlp.c_fc.weight": torch.zeros(32, 128)}
    with pytest.raises(ValueError, match=r"transformer\.h\.2\.mlp\.c_fc\.weight"):
        convert_hf_state_dict(extra, our_sd)
    for key, bad in {"transformer.h.0.mlp.c_fc.bias": torch.zeros(64), "transformer.wpe.weight": torch.zeros(16, 32)}.items():
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            convert_hf_state_dict({**hf_sd, key: bad}, our_sd)


def test_from_pretrained_rejects_other_layouts(tmp_path):
    save_hf(hf_tiny_config(n_inner=64), tmp_path / "inner")  # MLP width != 4 * n_embd
    with pytest.raises(ValueError, match=r"mlp\.c_fc"):
        GPT.from_pretrained(str(tmp_path / "inner"))
    save_hf(hf_tiny_config(activation_function="relu"), tmp_path / "relu")
    with pytest.raises(ValueError, match="relu"):
        GPT.from_pretrained(str(tmp_path / "relu"))
    with pytest.raises(ValueError, match="not-a-gpt2"):
        GPT.from_pretrained("not-a-gpt2")


@pytest.mark.parametrize("variant", [
    dict(tie_word_embeddings=False),  # separate lm_head: ours ties, so one of the two tables is lost
    dict(scale_attn_weights=False),  # no 1/sqrt(hs) in attention
    dict(scale_attn_by_inverse_layer_idx=True),  # extra 1/(layer+1) in attention
    dict(layer_norm_epsilon=1e-2),  # ours uses nn.LayerNorm's 1e-5
], ids=lambda v: next(iter(v)))
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
        torch.testing.assert_close(GPT.from_pretrained(str(path))(idx)[0], ref, atol=1e-4, rtol=0)
    skip_square = tuple(k for k in train_gpt2.HF_TRANSPOSED if k != "attn.c_proj.weight")
    assert len(skip_square) == 3
    monkeypatch.setattr(train_gpt2, "HF_TRANSPOSED", skip_square)
    with torch.no_grad():
        wrong = GPT.from_pretrained(str(path))(idx)[0]  # no error: every shape fits
    assert (wrong - ref).abs().max() > 1e-2
    monkeypatch.setattr(train_gpt2, "HF_TRANSPOSED", skip_square[1:] + ("attn.c_proj.weight",))
    with pytest.raises(ValueError, match=r"attn\.c_attn\.weight"):  # skipping a non-square one fails on shape
        GPT.from_pretrained(str(path))


def test_load_model_from_hf_dir(hf_tiny):
    hf, path = hf_tiny
    idx = rand_idx(1, 16)
    model, enc = load_model(str(path))
    assert enc.name == "gpt2"
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits, atol=1e-4, rtol=0)


def test_from_pretrained_and_build_model_override_dropout_only(hf_tiny):
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
    cropped = build_model(TrainConfig(block_size=16, seq_len=16, init_from=str(path)), GPT2, True)
    assert cropped.config.block_size == 16 and cropped.transformer.wpe.weight.shape == (16, 32)


# ----------------------------------------------------------------------------------------------------------
# Parameter counts, FLOPs, initialisation, tying, attention


def test_gpt2_124m_parameter_counts():
    assert GPTConfig() == GPTConfig(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)
    with torch.device("meta"):
        model, padded, untied = GPT(GPTConfig()), GPT(GPTConfig(vocab_size=50304)), GPT(GPTConfig())
        untied.lm_head.weight = nn.Parameter(torch.empty(50257, 768))
    V, T, C, L = 50257, 1024, 768, 12
    assert model.num_params() == V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C == 124_439_808
    assert model.num_params(exclude_embeddings=True) == 124_439_808 - T * C
    assert untied.num_params() - model.num_params() == V * C == 38_597_376
    assert padded.num_params() == 124_475_904


def nanogpt_param_count(V: int, C: int, L: int, bias: bool) -> int:
    """nanoGPT's get_num_params() (position table excluded, tied table once), from its layer shapes."""
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
    assert sum(isinstance(m, nn.Dropout) and m.p == 0.2 for m in model.modules()) == 1 + 3 * 6


def test_flops_per_token_gpt2_124m():
    with torch.device("meta"):  # shapes only
        model = GPT(GPTConfig())
    N = model.num_params(exclude_embeddings=True)
    assert N == 124_439_808 - 1024 * 768 == 123_653_376  # the position table is a lookup, not a matmul
    # 6N = 741,920,256 (weight matmuls, forward + backward); 12 * L * C * T = 113,246,208 (attention)
    assert 6 * N == 741_920_256
    assert train_gpt2.flops_per_token(model, 1024) == 855_166_464
    assert isinstance(train_gpt2.flops_per_token(model, 1024), int)
    mfu = 855_166_464 * 1.5e6 / (8 * 312e12)  # 1.5M tok/s on 8 A100s: about half their bf16 peak
    assert 0.5 < mfu < 0.53


def test_init_statistics():
    """GPT-2's init: N(0, 0.02), the residual projections (c_proj) scaled by (2 * n_layer)^-1/2, zero biases."""
    config = GPTConfig(block_size=256, vocab_size=2000, n_layer=6, n_head=4, n_embd=256)
    torch.manual_seed(1234)
    model = GPT(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
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


def test_tied_table_decays_once_and_its_gradient_is_the_sum_of_both_uses():
    tied = randomize_(tiny_model(), scale=0.1)
    (opt,) = tied.configure_optimizers(0.1, 6e-4, "cpu")
    assert sum(p is tied.transformer.wte.weight for p in opt.param_groups[0]["params"]) == 1
    untied = copy.deepcopy(tied)
    untied.lm_head.weight = nn.Parameter(untied.transformer.wte.weight.detach().clone())
    idx, targets = rand_idx(2, 16, seed=1), rand_idx(2, 16, seed=2)
    loss_t, loss_u = tied(idx, targets)[1], untied(idx, targets)[1]
    assert loss_t.item() == loss_u.item()
    loss_t.backward()
    loss_u.backward()
    g_embed, g_head = untied.transformer.wte.weight.grad, untied.lm_head.weight.grad
    assert g_embed.abs().max() > 0 and g_head.abs().max() > 0
    torch.testing.assert_close(tied.transformer.wte.weight.grad, g_embed + g_head, atol=1e-12, rtol=0)


def reference_attention(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's causal multi-head self-attention with scalar loops over batch, head, query and key."""
    B, T, C = x.shape
    nh, hs = attn.n_head, C // attn.n_head
    qkv = x @ attn.c_attn.weight.t() + attn.c_attn.bias
    q, k, v = qkv[..., :C], qkv[..., C : 2 * C], qkv[..., 2 * C :]
    y = torch.zeros(B, T, C, dtype=x.dtype)
    for b in range(B):
        for h in range(nh):
            cols = slice(h * hs, (h + 1) * hs)
            for t in range(T):
                scores = [float(q[b, t, cols] @ k[b, s, cols]) / math.sqrt(hs) for s in range(t + 1)]
                weights = [math.exp(s - max(scores)) for s in scores]
                for s in range(t + 1):
                    y[b, t, cols] += (weights[s] / sum(weights)) * v[b, s, cols]
    return y @ attn.c_proj.weight.t() + attn.c_proj.bias


def test_attention_matches_scalar_reference():
    attn = randomize_(tiny_model(), scale=0.5).transformer.h[0].attn
    x = torch.randn(2, 12, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, ref = attn(x), reference_attention(attn, x)
        v = x @ attn.c_attn.weight[64:].t() + attn.c_attn.bias[64:]
        uniform = (torch.cumsum(v, dim=1) / torch.arange(1, 13, dtype=torch.float64).view(1, -1, 1)) @ \
            attn.c_proj.weight.t() + attn.c_proj.bias
    assert (ref - uniform).abs().max() > 0.1  # far from a plain running average of the values
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)


def test_crop_block_size_keeps_the_first_rows_of_the_position_table():
    model = randomize_(tiny_model())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {k: p for k, p in model.named_parameters() if k != "transformer.wpe.weight"}
    model.crop_block_size(16)
    assert model.transformer.wpe.weight.shape == (16, 32) and isinstance(model.transformer.wpe.weight, nn.Parameter)
    after = model.state_dict()
    assert set(after) == set(before)
    for k in before:
        assert torch.equal(after[k], before[k][:16] if k == "transformer.wpe.weight" else before[k]), k
    assert all(dict(model.named_parameters())[k] is p for k, p in params.items())  # the same Parameter objects
    assert model.lm_head.weight is model.transformer.wte.weight


# ----------------------------------------------------------------------------------------------------------
# The published recipe


def test_defaults_are_the_gpt2_124M_recipe():
    cfg = train_gpt2.parse_train_args([])
    assert cfg == TrainConfig() == train_gpt2.parse_train_args(["--preset", "gpt2-124M"]) and PRESETS["gpt2-124M"] == {}
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (12, 12, 768, 1024, 0)
    assert (cfg.total_batch_size, cfg.batch_size, cfg.seq_len, cfg.max_steps) == (524288, 64, 1024, 19073)
    assert cfg.max_steps * cfg.total_batch_size == 9_999_745_024  # 10B tokens
    recipe = (cfg.max_lr, cfg.min_lr_ratio, cfg.warmup_steps, cfg.weight_decay, cfg.grad_clip, cfg.beta2)
    assert recipe == (6e-4, 0.1, 715, 0.1, 1.0, 0.95)
    assert (cfg.eval_interval, cfg.hellaswag_interval, cfg.sample_interval, cfg.ckpt_interval) == (250, 250, 250, 5000)
    assert cfg.val_tokens == 10_485_760 and cfg.chunked_loss is False
    with torch.device("meta"):  # shapes only
        model = build_model(cfg, GPT2, known_tokenizer=True)
    assert model.config.vocab_size == 50304  # 0: the data's tokenizer's, GPT-2's 50257 padded for speed


def test_get_lr_warmup_cosine_and_floor():
    max_lr, min_lr, warmup, decay = 6e-4, 6e-5, 10, 110
    lr = lambda step: get_lr(step, max_lr, min_lr, warmup, decay)  # noqa: E731
    assert lr(0) == pytest.approx(max_lr / warmup, rel=1e-12)  # step 0 already moves the weights
    assert lr(4) == pytest.approx(max_lr * 5 / warmup, rel=1e-12)
    assert lr(warmup - 1) == pytest.approx(max_lr, rel=1e-12)  # the end of the warmup
    assert lr(warmup) == pytest.approx(max_lr, rel=1e-12)  # the top of the cosine
    assert lr((warmup + decay) // 2) == pytest.approx((max_lr + min_lr) / 2, rel=1e-12)  # midpoint
    quarter = warmup + (decay - warmup) // 4
    assert lr(quarter) == pytest.approx(min_lr + (max_lr - min_lr) * (1 + math.cos(math.pi / 4)) / 2, rel=1e-12)
    last = decay - 1
    expected_last = min_lr + 0.5 * (1 + math.cos(math.pi * (last - warmup) / (decay - warmup))) * (max_lr - min_lr)
    assert lr(last) == pytest.approx(expected_last, rel=1e-12) and min_lr < lr(last) < min_lr * 1.01
    assert lr(decay) == lr(decay + 1) == lr(10 * decay) == pytest.approx(min_lr, rel=1e-12)
    values = [lr(s) for s in range(decay + 5)]  # rising in the warmup, never rising after it
    assert all(a < b for a, b in zip(values[:warmup - 1], values[1:warmup]))
    assert all(a >= b for a, b in zip(values[warmup:], values[warmup + 1:]))
    assert get_lr(0, 1e-3, 1e-4, 0, 100) == pytest.approx(1e-3, rel=1e-12)  # no warmup: starts at the peak
    assert get_lr(50, 1e-3, 1e-4, 0, 100) == pytest.approx(5.5e-4, rel=1e-12)


# ----------------------------------------------------------------------------------------------------------
# HellaSwag: our scorer picks what Hugging Face's logits pick


def hf_reference(hf, examples):
    """An independent scorer: one unpadded sequence per ending through HF, log-softmax, pick the ending tokens."""
    preds, preds_norm = [], []
    with torch.no_grad():
        for ex in examples:
            ctx = GPT2.encode_ordinary(ex["ctx"])
            sums, means = [], []
            for ending in ex["endings"]:
                end = torch.tensor(GPT2.encode_ordinary(" " + ending))
                logits = hf(torch.tensor([ctx + end.tolist()]), logits_to_keep=len(end) + 1).logits[0, :-1]
                loss = -logits.log_softmax(-1)[torch.arange(len(end)), end].sum().item()
                sums.append(loss)
                means.append(loss / len(end))
            preds.append(min(range(4), key=sums.__getitem__))
            preds_norm.append(min(range(4), key=means.__getitem__))
    return preds, preds_norm


def test_hellaswag_choices_equal_huggingface_logits(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel
    from test_hellaswag import synthetic_examples

    torch.manual_seed(0)
    # Real GPT-2 token ids need the full vocabulary; a wide init spreads the logits so there are no near-ties.
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                    initializer_range=0.2)).eval()
    hf.save_pretrained(tmp_path)
    model, enc = load_model(str(tmp_path))
    examples = synthetic_examples(50)
    ref, ref_norm = hf_reference(hf, examples)
    assert len(set(ref)) > 1 and len(set(ref_norm)) > 1 and ref != ref_norm  # the test can fail
    sum_loss, mean_loss, labels = hellaswag.score_examples(model, examples, "cpu", enc=enc, batch_size=8)
    assert sum_loss.argmin(1).tolist() == ref and mean_loss.argmin(1).tolist() == ref_norm
    assert labels.tolist() == [ex["label"] for ex in examples]
    result = hellaswag.evaluate(model, examples, "cpu", enc=enc)
    assert result["correct_norm"] == sum(p == ex["label"] for p, ex in zip(ref_norm, examples))
