"""Invariants of any GPT that GPTConfig builds, and of the loader and the schedule: they hold
after a research edit (another activation, RoPE, an untied or soft-capped head), so none of
them pins a number of GPT-2's. GPT-2 itself is tests/test_gpt2_contract.py's."""

import dataclasses

import numpy as np
import pytest
import torch

import fineweb
import train_gpt2
from train_gpt2 import GPT, DataLoaderLite, GPTConfig

CONFIG = GPTConfig(block_size=16, vocab_size=61, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(CONFIG).eval()


def test_a_position_sees_only_itself_and_what_precedes_it(model):
    # (the past's logits equal to float32 rounding: a model may compute a row in a batch whose
    # make-up depends on the changed token, a mixture of experts' gathered rows; a leak moves
    # them by orders of magnitude more)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 12))
    logits, _ = model(idx)
    tolerance = 1e-6 * logits.abs().max().item()
    for t in range(12):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % CONFIG.vocab_size
        other, _ = model(changed)
        past = (logits[:, :t] - other[:, :t]).abs().max().item() if t else 0.0
        assert past <= tolerance, f"position {t} leaked backwards ({past:.3g})"
        assert not torch.allclose(logits[:, t:], other[:, t:])


def test_rows_of_a_batch_are_independent(model):
    idx = torch.randint(0, CONFIG.vocab_size, (3, 10))
    together, _ = model(idx)
    for row in range(3):
        alone, _ = model(idx[row : row + 1])
        torch.testing.assert_close(together[row : row + 1], alone)


def test_the_loss_is_the_mean_cross_entropy_of_the_logits_ignoring_minus_100(model):
    # up to a term that does not depend on the targets (an auxiliary loss, a mixture of
    # experts' load balancing): two sets of targets differ in loss as in cross-entropy
    idx = torch.randint(0, CONFIG.vocab_size, (2, 10))
    logits, _ = model(idx)

    def both(targets):
        _, loss = model(idx, targets)
        picked = logits[targets != -100].log_softmax(-1)
        return loss, -picked.gather(1, targets[targets != -100][:, None]).mean()

    targets = torch.randint(0, CONFIG.vocab_size, (2, 10))
    targets[0, :4] = -100
    others = torch.randint(0, CONFIG.vocab_size, (2, 10))
    others[1, 3:] = -100
    loss, expected = both(targets)
    other_loss, other_expected = both(others)
    torch.testing.assert_close(loss - other_loss, expected - other_expected)
    assert (loss - expected).abs() < 1.0  # an added term, not another loss


def test_an_evaluation_gets_the_logits_with_the_loss(model):
    # what a metric computed from the logits at val time (an accuracy) reads beside the loss
    idx = torch.randint(0, CONFIG.vocab_size, (2, 10))
    targets = torch.randint(0, CONFIG.vocab_size, (2, 10))
    logits, loss = model(idx, targets, return_logits=True)
    assert torch.equal(logits, model(idx)[0]) and torch.equal(loss, model(idx, targets)[1])
    assert model(idx, targets)[0] is None  # a training step keeps no logits


def ids(config, shape, endoftext):
    # random ids; with endoftext, GPT-2's <|endoftext|> every 5 tokens: what a model that reads
    # the ids themselves (a document mask at <|endoftext|>) sees in training and sampling
    idx = torch.randint(0, min(config.vocab_size, 50257), shape)
    if endoftext:
        idx[:, 3::5] = 50256
    return idx


# a small vocabulary, and GPT-2's (padded) with <|endoftext|> among the ids
CACHE_CASES = [
    (CONFIG, False),
    (GPTConfig(block_size=16, vocab_size=50304, n_layer=2, n_head=2, n_embd=32), True),
]


@pytest.mark.parametrize("config, endoftext", CACHE_CASES, ids=["small vocab", "endoftext"])
def test_the_kv_cache_samples_what_the_whole_window_does(config, endoftext):
    # greedy decoding with the cache equals re-running the window, also past block_size
    torch.manual_seed(0)
    model = GPT(config).eval()
    prompt = ids(config, (2, 5), endoftext)
    cached = model.generate(prompt, 20, temperature=0)
    idx = prompt
    for _ in range(20):
        logits, _ = model(idx[:, -config.block_size :])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, idx)


@pytest.mark.parametrize("config, endoftext", CACHE_CASES, ids=["small vocab", "endoftext"])
def test_a_cache_fed_any_number_of_tokens_gives_the_whole_windows_logits(config, endoftext):
    # a prompt, then 3 tokens, 1, then 4: each call's logits are those of the full forward
    torch.manual_seed(0)
    model = GPT(config).eval()
    idx = ids(config, (2, 13), endoftext)
    full, _ = model(idx)
    cache = train_gpt2.KVCache(config.n_layer)
    start = 0
    for n in (5, 3, 1, 4):
        logits, _ = model(idx[:, start : start + n], kv_cache=cache)
        torch.testing.assert_close(logits, full[:, start : start + n])
        start += n


def test_sampling_is_seeded_and_keeps_out_of_padded_ids(model):
    prompt = torch.randint(0, CONFIG.vocab_size, (3, 4))

    def draw(seed, **kw):
        generator = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 12, generator=generator, vocab_limit=50, **kw)

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))
    assert int(draw(3)[:, 4:].max()) < 50
    # extreme temperatures stay well defined: near 0 is greedy, huge is uniform-ish
    greedy = model.generate(prompt, 12, temperature=0, vocab_limit=50)
    assert torch.equal(draw(4, temperature=1e-30), greedy)
    assert int(draw(5, temperature=1e30)[:, 4:].max()) < 50
    assert draw(6, top_k=1).equal(greedy)


def test_eval_mode_is_deterministic_with_dropout():
    torch.manual_seed(0)
    model = GPT(dataclasses.replace(CONFIG, dropout=0.5))
    idx = torch.randint(0, 61, (2, 8))
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


@pytest.mark.parametrize("muon_lr", [0.0, 0.02])
def test_every_parameter_is_in_one_group_and_only_matrices_decay(model, muon_lr):
    optimizers = model.configure_optimizers(0.1, 1e-3, "cpu", muon_lr=muon_lr)
    seen = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                assert id(p) not in seen, "a parameter is in two groups"
                seen[id(p)] = group["weight_decay"] > 0
    for p in model.parameters():
        assert id(p) in seen, "a parameter is in no group"
        assert seen[id(p)] == (p.dim() >= 2), "decay on 2-D weights only"
    assert len(optimizers) == (2 if muon_lr else 1)


def test_lr_warms_up_linearly_then_decays_to_min_at_the_end():
    lrs = [train_gpt2.get_lr(s, 1.0, 0.1, 10, 100) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert np.allclose(np.diff(lrs[:10]), 0.1)
    assert all(a >= b for a, b in zip(lrs[9:100], lrs[10:100]))
    assert lrs[100:] == [0.1] * 20


def token_shards(lengths, seed=0):
    # shards of documents: <|endoftext|> then random ids, as fineweb.py writes GPT-2's
    rng = np.random.default_rng(seed)
    shards = []
    for n in lengths:
        ids = rng.integers(0, 50000, n).astype(np.uint16)
        ids[rng.choice(n, n // 40, replace=False)] = 50256
        shards.append(ids)
    return shards


def read_epochs(loader, epochs):
    # the x batches a loader gives until it has read `epochs` epochs
    batches = []
    while loader.epochs_read() < epochs:
        batches.append(loader.next_batch()[0])
    return batches


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_reads_every_window_once(shuffle):
    shards = token_shards([600, 410, 970])
    loader = DataLoaderLite(shards, 2, 8, shuffle=shuffle, seed=5)
    first = [x.numpy().tobytes() for x in read_epochs(loader, 1)]
    assert len(set(first)) == len(first), "a window read twice in one epoch"
    # the epoch covers the data: a shard leaves at most a window's worth at each end unread
    assert len(first) * 16 > sum(map(len, shards)) - 3 * 2 * 17
    second = [x.numpy().tobytes() for x in read_epochs(loader, 2)]
    assert len(set(second)) == len(second)
    # in order, every epoch reads the same windows; shuffled, on a moved grid, others
    assert (set(first) == set(second)) != shuffle


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("sizes", [[600, 410, 970], [40]], ids=["shards", "fewer windows"])
def test_the_world_reads_what_one_process_reads(shuffle, world, sizes):
    # rank r takes the r-th of every `world` batches: together, across epoch boundaries too,
    # the ranks read exactly one process's batches; with fewer windows than ranks (one or two
    # of 40 tokens), a step reads on into the next epochs
    shards = token_shards(sizes, seed=1)
    one = DataLoaderLite(shards, 2, 8, shuffle=shuffle, seed=5)
    ranks = [DataLoaderLite(shards, 2, 8, r, world, shuffle, seed=5) for r in range(world)]
    for _ in range(150):
        for loader in ranks:
            x, y = loader.next_batch()
            expected_x, expected_y = one.next_batch()
            assert torch.equal(x, expected_x) and torch.equal(y, expected_y)
    assert one.epochs_read() > 2
    # targets are the inputs shifted by one token
    assert torch.equal(x.flatten()[1:], y.flatten()[:-1])


def test_a_loader_without_a_window_is_refused_in_one_line():
    with pytest.raises(ValueError, match="no window of B x T \\+ 1 tokens"):
        DataLoaderLite(token_shards([16]), 2, 8)


def test_a_loader_state_resumes_mid_epoch_and_across_epochs():
    shards = token_shards([700, 500])
    loader = DataLoaderLite(shards, 2, 4, shuffle=True, seed=3)
    for _ in range(90):
        loader.next_batch()
    state = loader.state_dict()
    expected = [loader.next_batch()[0] for _ in range(120)]
    again = DataLoaderLite(shards, 2, 4, shuffle=True, seed=3)
    again.load_state_dict(state)
    for x in expected:
        assert torch.equal(again.next_batch()[0], x)


def test_sample_texts_continue_the_prompt():
    enc = fineweb.CharTokenizer("\n abcdefghij")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=16))
    texts = train_gpt2.sample_texts(model, enc, "abc", 3, 20, seed=1)
    assert len(texts) == 3 and all(t.startswith("abc") and len(t) == 23 for t in texts)
    assert texts == train_gpt2.sample_texts(model, enc, "abc", 3, 20, seed=1)
    with pytest.raises(ValueError, match="prompt"):
        train_gpt2.sample_texts(model, enc, "", 1, 5)
