"""Invariants of any GPT that GPTConfig builds, and of the loader and the schedule: they hold
after a research edit (another activation, RoPE, an untied or soft-capped head), so none of
them pins a number of GPT-2's. GPT-2 itself is tests/test_gpt2_contract.py's."""

import collections
import dataclasses
import os

import numpy as np
import pytest
import torch

import fineweb
import train_gpt2
from train_gpt2 import GPT, DataLoaderLite, GPTConfig

CONFIG = GPTConfig(block_size=16, vocab_size=61, n_layer=2, n_head=2, n_embd=32)


# GPTConfig's choices of biases and GELU: GPT-2's (the defaults) and nanoGPT's (the quick start's)
CHOICES = {"GPT-2's": {}, "nanoGPT's": {"bias": False, "gelu_approximate": "none"}}


@pytest.fixture(params=CHOICES.values(), ids=CHOICES.keys())
def model(request):
    torch.manual_seed(0)
    return GPT(dataclasses.replace(CONFIG, **request.param)).eval()


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


def numbered_shards(lengths):
    # shard k holds k * 1000 + i at place i (each shorter than 1,000 tokens): a window's first
    # token says where it was read
    return [(k * 1000 + np.arange(n)).astype(np.uint16) for k, n in enumerate(lengths)]


def read_windows(loader, batches):
    # (shard, start) of each window of numbered_shards that the loader's next batches read, in
    # order, each checked against its shard: x its first tokens, y the same shifted by one
    found = []
    for _ in range(batches):
        x, y = loader.next_batch()
        rows = loader.B if loader.shuffle else 1
        inputs = x.reshape(rows, -1)
        targets = y.reshape(rows, -1)
        for row in range(rows):
            first = int(inputs[row, 0])
            tokens = torch.arange(first, first + inputs.size(1))
            assert torch.equal(inputs[row], tokens) and torch.equal(targets[row], tokens + 1)
            found.append(divmod(first, 1000))
    return found


def grid(lengths, n, offset):
    # (shard, start) of every window of n + 1 tokens at stride n from offset, shard by shard
    return [(k, s) for k, length in enumerate(lengths) for s in range(offset, length - n, n)]


@pytest.fixture(params=["one pool", "small pools"])
def pools(request, monkeypatch):
    # the loader's pools as they are, or of 2 shards and at most 30 windows: an epoch of the
    # tests' shards then crosses several pool boundaries
    if request.param == "small pools":
        monkeypatch.setattr(train_gpt2, "POOL_SHARDS", 2)
        monkeypatch.setattr(train_gpt2, "POOL_ROWS", 30)
    return request.param


LENGTHS = [600, 410, 970, 130, 55, 17]


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_reads_every_window_once(shuffle, pools):
    # in order: build-nanogpt's windows of B*T + 1 tokens, shard by shard; shuffled: rows of
    # T + 1 tokens, every one of the epoch's grid once, the grid moved from epoch to epoch
    loader = DataLoaderLite(numbered_shards(LENGTHS), 2, 8, shuffle=shuffle, seed=5)
    n = 8 if shuffle else 16
    stream = read_windows(loader, 500)
    offsets = []
    for epoch in range(3):
        offset = stream[0][1] % n
        expected = grid(LENGTHS, n, offset)
        read = stream[: len(expected)]
        stream = stream[len(expected) :]
        assert sorted(read) == expected, f"epoch {epoch}: a window missed or read twice"
        if not shuffle:
            assert read == expected
        offsets.append(offset)
    assert stream, "the test reads into a fourth epoch"
    assert (len(set(offsets)) > 1) == shuffle


def test_rows_of_a_shuffled_batch_come_from_all_over_the_pool(pools):
    # nanoGPT's batches: each row from its own place, not B consecutive windows of one shard
    loader = DataLoaderLite(numbered_shards(LENGTHS), 8, 8, shuffle=True, seed=5)
    shards_seen = set()
    for _ in range(20):
        rows = read_windows(loader, 1)
        shards = {k for k, _ in rows}
        starts = sorted(s for _, s in rows)
        assert len(shards) > 1 or np.diff(starts).max() > 8, "a batch of neighbouring windows"
        shards_seen.add(len(shards))
    assert max(shards_seen) > 1


def test_pools_are_read_one_after_another(monkeypatch):
    # with pools of 2 shards, the shards an epoch has begun and not finished are 2 at most
    monkeypatch.setattr(train_gpt2, "POOL_SHARDS", 2)
    loader = DataLoaderLite(numbered_shards(LENGTHS), 2, 8, shuffle=True, seed=3)
    stream = read_windows(loader, 200)
    offset = stream[0][1] % 8
    expected = grid(LENGTHS, 8, offset)
    windows = collections.Counter(k for k, _ in expected)
    read = collections.Counter()
    for k, _ in stream[: len(expected)]:
        read[k] += 1
        begun = [s for s in read if read[s] < windows[s]]
        assert len(begun) <= 2
    assert read == windows


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("sizes", [[600, 410, 970, 130], [40]], ids=["shards", "fewer windows"])
def test_the_world_reads_what_one_process_reads(shuffle, world, sizes, pools):
    # rank r takes the r-th of every `world` batches: together, across epoch and pool
    # boundaries too, the ranks read exactly one process's batches; with fewer windows than
    # ranks (one or two of 40 tokens), a step reads on into the next epochs
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
    assert torch.equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loader_without_a_window_is_refused_in_one_line(shuffle):
    what = "T \\+ 1 tokens on every grid" if shuffle else "B x T \\+ 1 tokens"
    with pytest.raises(ValueError, match=f"no window of {what}"):
        DataLoaderLite(token_shards([15]), 2, 8, shuffle=shuffle)


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loader_state_resumes_mid_epoch_and_across_epochs(shuffle, pools):
    # a state saved at any batch, on a rank of several too, continues with the same batches
    shards = token_shards([700, 500, 90, 260])
    straight = DataLoaderLite(shards, 2, 4, 1, 3, shuffle, seed=3)
    batches = [straight.next_batch()[0] for _ in range(200)]
    assert straight.epochs_read() > 2
    for saved_at in (0, 1, 57, 90, 131, 199):
        loader = DataLoaderLite(shards, 2, 4, 1, 3, shuffle, seed=3)
        for _ in range(saved_at):
            loader.next_batch()
        state = loader.state_dict()
        again = DataLoaderLite(shards, 2, 4, 1, 3, shuffle, seed=3)
        again.load_state_dict(state)
        for x in batches[saved_at:]:
            assert torch.equal(again.next_batch()[0], x)


def open_files():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_the_loader_holds_open_only_its_pools_shards(tmp_path, monkeypatch):
    # 40 shard files read shuffled in pools of 3: never more than 3 files open, none before
    # the first batch, and the pools of every epoch read
    monkeypatch.setattr(train_gpt2, "POOL_SHARDS", 3)
    shards = []
    for k, tokens in enumerate(token_shards([70 + 7 * k for k in range(40)])):
        np.save(tmp_path / f"shard_{k:02d}.npy", tokens)
        shards.append(train_gpt2.Shard(tmp_path / f"shard_{k:02d}.npy", len(tokens)))
    before = open_files()
    loader = DataLoaderLite(shards, 2, 8, shuffle=True, seed=1)
    assert open_files() == before
    most = 0
    while loader.epochs_read() < 2:
        loader.next_batch()
        most = max(most, open_files() - before)
    assert 1 <= most <= 3
    # (what the files hold: the same batches as from the arrays)
    arrays = [np.load(tmp_path / f"shard_{k:02d}.npy") for k in range(40)]
    loader = DataLoaderLite(shards, 2, 8, shuffle=True, seed=1)
    same = DataLoaderLite(arrays, 2, 8, shuffle=True, seed=1)
    for _ in range(100):
        assert torch.equal(loader.next_batch()[1], same.next_batch()[1])


def test_sample_texts_continue_the_prompt():
    enc = fineweb.CharTokenizer("\n abcdefghij")
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=enc.n_vocab, n_layer=1, n_head=2, n_embd=16))
    texts = train_gpt2.sample_texts(model, enc, "abc", 3, 20, seed=1)
    assert len(texts) == 3 and all(t.startswith("abc") and len(t) == 23 for t in texts)
    assert texts == train_gpt2.sample_texts(model, enc, "abc", 3, 20, seed=1)
    with pytest.raises(ValueError, match="prompt"):
        train_gpt2.sample_texts(model, enc, "", 1, 5)
