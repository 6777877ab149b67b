"""The data section of train_gpt2.py: shard discovery, the continuous token stream, DataLoaderLite (shifts,
shard boundaries, simulated ranks, wrap, shuffle, resume, errors, memory) and evaluate_val_loss.

Shards are written here, not by fineweb.py: np.save of uint16 arrays whose tokens count up (0, 1, 2, ...)
through the whole split, so a token's value is its position in the split's stream and every batch says
exactly where it was read from."""

import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import train_gpt2
from train_gpt2 import (GPT, DataLoaderLite, GPTConfig, Runtime, TokenStream, check_token_ids, evaluate_val_loss,
                        list_shards, open_shard)

# Uneven train shard sizes for windows of B*T = 2*4 = 8 tokens: shards far smaller than a window (0, 1, 3, 7),
# larger ones, and 11 shards so that indices 000002 and 000010 both exist.
SIZES = [23, 7, 0, 41, 3, 16, 1, 35, 9, 50, 12]
B, T = 2, 4


def write_split(root, split, sizes, first_index=0, prefix="x"):
    """Write consecutive `split` shards whose tokens count up from 0; return the split's whole stream."""
    root.mkdir(parents=True, exist_ok=True)
    stream = np.arange(sum(sizes), dtype=np.int64).astype(np.uint16)
    bounds = np.cumsum([0, *sizes])
    for k in reversed(range(len(sizes))):  # written last-first: the loader must sort, not trust the directory
        np.save(root / f"{prefix}_{split}_{first_index + k:06d}.npy", stream[bounds[k] : bounds[k + 1]])
    return stream


@pytest.fixture
def data(tmp_path):
    """fineweb.py's layout: one val shard (000000), then the train shards (000001, ...)."""
    write_split(tmp_path, "val", [100])
    return tmp_path, write_split(tmp_path, "train", SIZES, first_index=1)


def loaders(root, W, b=B, t=T, **kwargs):
    """One DataLoaderLite per simulated rank of a world of W."""
    return [DataLoaderLite(root, "train", b, t, process_rank=r, num_processes=W, **kwargs) for r in range(W)]


def step(ranks):
    """One step of every rank: the stream tokens it read (rank 0's window, rank 1's, ..., and the last target),
    checking on the way each batch's dtype, shapes and x/y shift, and that the ranks' windows abut."""
    xs, ys = [], []
    for loader in ranks:
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (loader.B, loader.T)
        x, y = x.reshape(-1).numpy(), y.reshape(-1).numpy()  # rows are consecutive in the stream
        np.testing.assert_array_equal(y[:-1], x[1:])
        xs.append(x)
        ys.append(y)
    for r in range(len(ranks) - 1):
        assert ys[r][-1] == xs[r + 1][0], "rank r+1's window must start where rank r's targets end"
    return np.concatenate([*xs, ys[-1][-1:]])


def read_epochs(ranks, epochs=1):
    """Step all ranks through `epochs` whole epochs (stopping at the batch that wraps, which is returned too):
    per epoch, the tokens read in order, and the number of steps."""
    out, tokens, steps, epoch = [], None, 0, ranks[0].epoch
    while True:
        got = step(ranks)
        assert len({loader.epoch for loader in ranks}) == 1, "ranks must wrap on the same step"
        if ranks[0].epoch != epoch:
            out.append((tokens, steps))
            if len(out) == epochs:
                return out, got
            tokens, steps, epoch = None, 0, ranks[0].epoch
        if tokens is None:
            tokens = got
        else:
            assert tokens[-1] == got[0], "a step must start at the previous step's last target"
            tokens = np.concatenate([tokens, got[1:]])
        steps += 1


# ----------------------------------------------------------------------------------------------------------
# Shards and the stream


def test_list_shards_by_index_and_split(data):
    root, _ = data
    (root / "notes.txt").write_text("not a shard")
    assert [p.name for p in list_shards(root, "train")] == [f"x_train_{i:06d}.npy" for i in range(1, 12)]
    assert [p.name for p in list_shards(root, "val")] == ["x_val_000000.npy"]


def test_list_shards_skips_fineweb_temp_files(data):
    """fineweb.py writes each shard as `.{name}.tmp.npy` and renames it; a run started while it writes, or after
    it was killed, must not read that half-written file as a shard."""
    root, _ = data
    (root / ".x_train_000012.tmp.npy").write_bytes(b"half a shard")
    assert [p.name for p in list_shards(root, "train")] == [f"x_train_{i:06d}.npy" for i in range(1, 12)]
    assert len(DataLoaderLite(root, "train", B, T).base) == sum(SIZES)


def test_token_stream_reads_across_shards(data):
    root, stream = data
    ts = TokenStream.from_split(root, "train")
    assert len(ts) == sum(SIZES)
    assert ts.read(0, len(ts)).dtype == np.uint16
    np.testing.assert_array_equal(ts.read(0, len(ts)), stream)
    # 20..33 spans shards 1 (0..22), 2 (23..29), the empty 3 and 4 (30..70)
    np.testing.assert_array_equal(ts.read(20, 14), np.arange(20, 34))
    names = ts.shards_at(20, 14)  # the empty shard 3 in between may be named too: it holds nothing to blame
    assert names[0] == "x_train_000001.npy" and names[-1] == "x_train_000004.npy" and "x_train_000002.npy" in names
    assert ts.shards_at(71, 3) == ["x_train_000005.npy"]
    assert len(ts.read(5, 0)) == 0
    for start, n in [(-1, 2), (len(ts) - 3, 4)]:
        with pytest.raises(IndexError):
            ts.read(start, n)


def test_open_shard_is_memory_mapped(data):
    root, _ = data
    tokens = open_shard(root / "x_train_000001.npy")
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
    np.testing.assert_array_equal(tokens, np.arange(23))


# ----------------------------------------------------------------------------------------------------------
# Batches: shift, continuity, ranks, wrap


def test_batch_is_a_shifted_window(data):
    root, stream = data
    loader = DataLoaderLite(root, "train", B, T)
    for k in range(3):
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (B, T)
        start = k * B * T  # the next window starts at the previous window's last target, not after it
        np.testing.assert_array_equal(x.numpy(), stream[start : start + B * T].reshape(B, T))
        np.testing.assert_array_equal(y.numpy(), stream[start + 1 : start + B * T + 1].reshape(B, T))


@pytest.mark.parametrize("W", [1, 2, 3])
def test_epoch_reads_the_concatenated_shards_without_gaps(data, W):
    """Windows straddle shards (even several tiny ones) and nothing is skipped at a shard's end: one epoch reads
    the stream from its first token up to a tail shorter than one step. (build-nanogpt's loader instead drops
    up to W*B*T tokens at the end of every shard, and fails on a shard shorter than one step.)"""
    root, stream = data
    [(tokens, steps)], _ = read_epochs(loaders(root, W))
    step_tokens = W * B * T
    assert steps == (len(stream) - 1) // step_tokens  # every step that fits is taken
    np.testing.assert_array_equal(tokens, stream[: steps * step_tokens + 1])
    assert len(stream) - len(tokens) < step_tokens


@pytest.mark.parametrize("W", [2, 3])
def test_ranks_read_disjoint_windows_like_one_big_batch(data, W):
    """W ranks of B rows read, step by step, exactly what one process of W*B rows reads: rank r the r-th
    B*T tokens of each step's W*B*T."""
    root, stream = data
    ranks, single = loaders(root, W), loaders(root, 1, b=W * B)[0]
    position = 0
    for _ in range(2 * (len(stream) // (W * B * T)) + 3):  # past a wrap
        together = step(ranks)
        np.testing.assert_array_equal(together, step([single]))
        assert all(loader.state_dict() == single.state_dict() for loader in ranks)  # one shared position
        if single.epoch == 0:
            np.testing.assert_array_equal(together, stream[position : position + W * B * T + 1])
            position += W * B * T


@pytest.mark.parametrize("W", [1, 2])
@pytest.mark.parametrize("spare", [0, 1, 7])
def test_wrap_starts_the_stream_again(tmp_path, W, spare):
    """3 whole steps plus `spare` tokens: the 4th step wraps to epoch 1 at the stream's first token. With
    spare=0 the stream's last token is used (as a target only); the tail left unread is `spare` < W*B*T."""
    n = 3 * W * B * T + 1 + spare
    stream = write_split(tmp_path, "train", [n // 2, n - n // 2], first_index=1)
    ranks = loaders(tmp_path, W)
    (tokens, steps), (tokens1, _) = read_epochs(ranks, epochs=2)[0]
    assert steps == 3 and ranks[0].epoch == 2
    np.testing.assert_array_equal(tokens, stream[: 3 * W * B * T + 1])
    np.testing.assert_array_equal(tokens1, tokens)  # without shuffle, every epoch is the same
    assert len(stream) - len(tokens) == spare < W * B * T


def test_reset_goes_back_to_the_start(data):
    root, stream = data
    for shuffle in (False, True):
        loader = DataLoaderLite(root, "train", B, T, shuffle=shuffle, seed=3)
        first = step([loader])
        for _ in range(30):  # into epoch 1 (24 steps per epoch)
            step([loader])
        assert loader.epoch == 1
        loader.reset()
        assert loader.epoch == 0
        np.testing.assert_array_equal(step([loader]), first)


# ----------------------------------------------------------------------------------------------------------
# Shuffling the shard order

SHUFFLE_SIZES = [16] * 12  # 12! orders: two seeds (or epochs) agreeing by chance is a 1 in 479,001,600 event


def shard_order(tokens, sizes):
    """The shard indices in the order an epoch's tokens came from them, checking that each shard was read
    whole and in order (only the last one may stop early: the epoch's tail)."""
    bounds = np.cumsum([0, *sizes])
    owner = np.searchsorted(bounds, tokens, side="right") - 1
    order = [int(owner[0])] + [int(b) for a, b in zip(owner[:-1], owner[1:]) if b != a]
    expected = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in order])[: len(tokens)]
    np.testing.assert_array_equal(tokens, expected)
    return order


@pytest.fixture
def shuffle_root(tmp_path):
    write_split(tmp_path, "train", SHUFFLE_SIZES, first_index=1)
    return tmp_path


def epoch_orders(root, epochs, W=1, **kwargs):
    ranks = loaders(root, W, b=1, **kwargs)  # windows of 4 tokens: at most 4*W of the last shard go unread
    return [shard_order(tokens, SHUFFLE_SIZES) for tokens, _ in read_epochs(ranks, epochs)[0]]


def test_no_shuffle_reads_index_order(shuffle_root):
    assert epoch_orders(shuffle_root, 2) == [list(range(12))] * 2


def test_shuffle_permutes_shards_per_epoch_reproducibly(shuffle_root):
    orders = epoch_orders(shuffle_root, 3, shuffle=True, seed=5)
    for order in orders:
        assert sorted(order) == list(range(12))  # a permutation: every shard once, whole
    assert orders[0] != list(range(12))
    assert orders[0] != orders[1] != orders[2]  # a new order every epoch
    assert epoch_orders(shuffle_root, 3, shuffle=True, seed=5) == orders  # same seed, same orders
    assert epoch_orders(shuffle_root, 1, shuffle=True, seed=6)[0] != orders[0]


@pytest.mark.parametrize("W", [2, 3])
def test_shuffle_is_identical_across_ranks(shuffle_root, W):
    """Ranks permute alike, so together they read one shuffled stream: the one a single process reads with
    W times the rows and the same seed."""
    ranks = loaders(shuffle_root, W, b=1, shuffle=True, seed=5)
    single = loaders(shuffle_root, 1, b=W, shuffle=True, seed=5)
    for _ in range(3 * 12 * 16 // (W * T)):  # about three epochs
        np.testing.assert_array_equal(step(ranks), step(single))
    assert ranks[0].epoch >= 2
    orders = epoch_orders(shuffle_root, 2, W=W, shuffle=True, seed=5)
    assert orders == epoch_orders(shuffle_root, 2, shuffle=True, seed=5)


# ----------------------------------------------------------------------------------------------------------
# Resuming: state_dict / load_state_dict


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 5, 12, 14])  # 12 steps per epoch: after 12, the next batch wraps
def test_state_dict_resumes_exactly(data, tmp_path, shuffle, k):
    root, _ = data
    W = 2
    ranks = loaders(root, W, shuffle=shuffle, seed=1)
    for _ in range(k):
        step(ranks)
    path = tmp_path / "state.pt"  # through a checkpoint file, as train() stores it
    torch.save(ranks[0].state_dict(), path)
    state = torch.load(path, weights_only=True)
    # every rank resumes from rank 0's state, as train() does
    resumed = loaders(root, W, shuffle=shuffle, seed=1)
    for loader in resumed:
        loader.load_state_dict(state)
    for _ in range(25):  # across the next wrap
        np.testing.assert_array_equal(step(resumed), step(ranks))
    assert resumed[0].epoch == ranks[0].epoch >= 1


def test_state_dict_from_other_data_is_refused(data, tmp_path):
    root, _ = data
    state = DataLoaderLite(root, "train", B, T, shuffle=True, seed=1).state_dict()
    other = tmp_path / "other"
    write_split(other, "train", [*SIZES, 1], first_index=1)  # one token more
    for loader in (DataLoaderLite(other, "train", B, T, shuffle=True, seed=1),
                   DataLoaderLite(root, "train", B, T, shuffle=False, seed=1),
                   DataLoaderLite(root, "train", B, T, shuffle=True, seed=2)):
        with pytest.raises(ValueError, match="changed since the checkpoint"):
            loader.load_state_dict(state)


# ----------------------------------------------------------------------------------------------------------
# Errors


def test_missing_directory(tmp_path):
    missing = tmp_path / "edu_fineweb10B"
    with pytest.raises(FileNotFoundError) as e:
        DataLoaderLite(missing, "train", B, T)
    assert "fineweb.py" in str(e.value) and str(missing) in str(e.value)


def test_no_shards_of_the_split(tmp_path):
    write_split(tmp_path, "val", [100])
    with pytest.raises(FileNotFoundError) as e:
        DataLoaderLite(tmp_path, "train", B, T)
    assert "'train'" in str(e.value) and "fineweb.py" in str(e.value)


@pytest.mark.parametrize("array", [np.arange(100, dtype=np.int32), np.arange(100, dtype=np.uint16).reshape(10, 10)],
                         ids=["int32", "2d"])
def test_shard_of_the_wrong_type(tmp_path, array):
    np.save(tmp_path / "x_train_000001.npy", array)
    with pytest.raises(ValueError) as e:
        DataLoaderLite(tmp_path, "train", B, T)
    assert "x_train_000001.npy" in str(e.value) and "uint16" in str(e.value)


def test_corrupt_shard(tmp_path):
    write_split(tmp_path, "train", [50, 50], first_index=1)
    garbage = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    (tmp_path / "x_train_000002.npy").write_bytes(garbage)
    with pytest.raises(ValueError, match="x_train_000002.npy is not a readable .npy shard"):
        DataLoaderLite(tmp_path, "train", B, T)
    good = tmp_path / "x_train_000001.npy"
    (tmp_path / "x_train_000002.npy").write_bytes(good.read_bytes()[:-10])  # a valid header, data cut short
    with pytest.raises(ValueError, match="x_train_000002.npy is not a readable .npy shard"):
        DataLoaderLite(tmp_path, "train", B, T)


@pytest.mark.parametrize("W", [1, 3])
def test_split_smaller_than_one_step(tmp_path, W):
    need = W * B * T + 1
    write_split(tmp_path, "train", [need - 1], first_index=1)
    with pytest.raises(ValueError) as e:
        DataLoaderLite(tmp_path, "train", B, T, process_rank=0, num_processes=W)
    assert f"holds {need - 1} tokens" in str(e.value) and f"= {need}" in str(e.value)
    write_split(tmp_path, "train", [need], first_index=1)  # exactly one step is enough
    assert len(DataLoaderLite(tmp_path, "train", B, T, process_rank=0, num_processes=W).base) == need


@pytest.mark.parametrize("shuffle", [False, True])
def test_token_id_out_of_vocab_names_the_shard(tmp_path, shuffle):
    stream = write_split(tmp_path, "train", [100] * 5, first_index=1)
    vocab = int(stream.max()) + 1  # the largest id, vocab-1, is fine
    [(tokens, _)], _ = read_epochs([DataLoaderLite(tmp_path, "train", B, T, vocab_size=vocab, shuffle=shuffle)])
    assert len(tokens) > 490
    bad = stream[200:300].copy()
    bad[50] = vocab  # the middle of shard 3: every window holding it lies inside that shard
    np.save(tmp_path / "x_train_000003.npy", bad)
    loader = DataLoaderLite(tmp_path, "train", B, T, vocab_size=vocab, shuffle=shuffle)
    with pytest.raises(ValueError) as e:
        for _ in range(100):  # reaches shard 3 within the first epoch (62 steps)
            loader.next_batch()
    message = str(e.value)
    assert f"token id {vocab} >= vocab_size {vocab}" in message and "x_train_000003.npy" in message
    assert "x_train_000002.npy" not in message and "x_train_000004.npy" not in message


def test_check_token_ids():
    tokens = np.array([0, 5, 63], dtype=np.uint16)
    check_token_ids(tokens, 64, "here")
    check_token_ids(tokens, None, "here")  # no vocabulary given: nothing to check
    with pytest.raises(ValueError, match="token id 63 >= vocab_size 63 in here"):
        check_token_ids(tokens, 63, "here")


@pytest.mark.parametrize("b, t", [(0, 4), (2, 0), (-1, 4)])
def test_batch_shape_must_be_positive(data, b, t):
    with pytest.raises(ValueError, match="must be positive"):
        DataLoaderLite(data[0], "train", b, t)


@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0)])
def test_rank_out_of_range(data, rank, world):
    with pytest.raises(ValueError, match=rf"process_rank {rank} not in \[0, {world}\)"):
        DataLoaderLite(data[0], "train", B, T, process_rank=rank, num_processes=world)


# ----------------------------------------------------------------------------------------------------------
# Memory: shards are memory-mapped, never copied

BIG = 20_000_000  # tokens: 40 MB of uint16


@pytest.fixture(scope="module")
def big_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    np.save(root / "x_train_000001.npy", (np.arange(BIG) % 60000).astype(np.uint16))
    return root


def test_loader_does_not_copy_the_shard(big_root):
    """numpy reports its buffers to tracemalloc, so a copy of the shard (or an int64 version of it) would show
    as a 40-160 MB peak; a memory-mapped loader allocates about one window."""
    tracemalloc.start()
    try:
        loader = DataLoaderLite(big_root, "train", 4, 1024, vocab_size=60000)
        for _ in range(5):
            x, _ = loader.next_batch()
        loader.load_state_dict({**loader.state_dict(), "position": BIG - 3 * 4096})  # the shard's end
        loader.next_batch()
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 5_000_000, f"peak {peak:,} bytes while reading a {2 * BIG:,}-byte shard"
        np.testing.assert_array_equal(x[0].numpy(), np.arange(4 * 4096, 4 * 4096 + 1024) % 60000)
        # the instrument works: reading the shard into memory does show up
        tracemalloc.reset_peak()
        whole = np.load(big_root / "x_train_000001.npy")
        assert tracemalloc.get_traced_memory()[1] >= whole.nbytes == 2 * BIG
    finally:
        tracemalloc.stop()


# ----------------------------------------------------------------------------------------------------------
# Validation loss

VAL_T, VAL_SEQS = 16, 7  # 7 sequences: uneven over B=3 batches and over 2 or 3 ranks


@pytest.fixture(scope="module")
def tiny_gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32))


@pytest.fixture
def val_stream(tmp_path):
    """A val split over two shards (with random ids < 64) longer than the tokens evaluated."""
    tokens = np.random.default_rng(0).integers(0, 64, 150).astype(np.uint16)
    np.save(tmp_path / "x_val_000000.npy", tokens[:50])
    np.save(tmp_path / "x_val_000001.npy", tokens[50:])
    return TokenStream.from_split(tmp_path, "val"), tokens


def rt(rank=0, world=1, ddp=False):
    return Runtime(ddp=ddp, rank=rank, local_rank=rank, world_size=world, device="cpu", device_type="cpu")


def per_sequence_losses(model, tokens):
    """The direct computation: the first VAL_SEQS*T+1 tokens cut into sequences of T (targets shifted by one),
    mean cross-entropy of each sequence."""
    rows = torch.from_numpy(tokens[: VAL_SEQS * VAL_T + 1].astype(np.int64))
    x = rows[:-1].view(VAL_SEQS, VAL_T)
    y = rows[1:].unfold(0, VAL_T, VAL_T)  # y[i] = rows[i*T+1 : i*T+T+1]
    with torch.no_grad():
        logits, _ = model(x)
    return F.cross_entropy(logits.transpose(1, 2), y, reduction="none").mean(dim=1).double()  # (VAL_SEQS,)


@pytest.mark.parametrize("b", [1, 3, 100])
def test_val_loss_is_the_mean_over_val_tokens(tiny_gpt, val_stream, b):
    stream, tokens = val_stream
    expected = per_sequence_losses(tiny_gpt, tokens).mean().item()
    loss = evaluate_val_loss(tiny_gpt, stream, VAL_SEQS * VAL_T, b, VAL_T, rt(), "float32", vocab_size=64)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert tiny_gpt.training  # handed back ready to train


@pytest.mark.parametrize("W", [2, 3])
def test_val_loss_shards_sequences_over_ranks(tiny_gpt, val_stream, W):
    """Rank r scores sequences r, r+W, ...; without a process group nothing is reduced, so each rank's loss is
    the mean over its own sequences."""
    stream, tokens = val_stream
    per_seq = per_sequence_losses(tiny_gpt, tokens)
    for r in range(W):
        loss = evaluate_val_loss(tiny_gpt, stream, VAL_SEQS * VAL_T, 2, VAL_T, rt(r, W), "float32")
        assert loss == pytest.approx(per_seq[r::W].mean().item(), rel=1e-5)


@pytest.mark.parametrize("W", [2, 3])
def test_val_loss_all_reduces_sums_and_counts(tiny_gpt, val_stream, monkeypatch, W):
    """With DDP the ranks all-reduce a loss sum and a token count (not their means, which would weigh ranks
    with fewer sequences too much): summed over the simulated ranks they give the single-process loss."""
    stream, tokens = val_stream
    per_seq = per_sequence_losses(tiny_gpt, tokens)
    reduced = []
    monkeypatch.setattr(train_gpt2.dist, "all_reduce", lambda t: reduced.append(t.clone()))
    for r in range(W):
        evaluate_val_loss(tiny_gpt, stream, VAL_SEQS * VAL_T, 2, VAL_T, rt(r, W, ddp=True), "float32")
    assert len(reduced) == W and all(t.shape == (2,) for t in reduced)  # one all-reduce of (sum, count) per rank
    sums, counts = [t[0] for t in reduced], [t[1] for t in reduced]
    assert sum(c.item() for c in counts) == VAL_SEQS * VAL_T
    total = sum(s.item() for s in sums) / (VAL_SEQS * VAL_T)
    assert total == pytest.approx(per_seq.mean().item(), rel=1e-5)
    assert total != pytest.approx(np.mean([s.item() / c.item() for s, c in zip(sums, counts)]), rel=1e-9)


def test_val_tokens_must_fit(tiny_gpt, val_stream, tmp_path):
    stream, tokens = val_stream
    for val_tokens in (VAL_T * 3 + 1, VAL_T * 10):  # not a multiple of T; 160 + 1 > 150 tokens
        with pytest.raises(ValueError, match=rf"val_tokens \({val_tokens}\)"):
            evaluate_val_loss(tiny_gpt, stream, val_tokens, 2, VAL_T, rt(), "float32")
    exact = tmp_path / "exact"
    exact.mkdir()
    np.save(exact / "x_val_000000.npy", tokens[: VAL_SEQS * VAL_T + 1])  # one target more than the inputs
    evaluate_val_loss(tiny_gpt, TokenStream.from_split(exact, "val"), VAL_SEQS * VAL_T, 2, VAL_T, rt(), "float32")
    np.save(exact / "x_val_000000.npy", tokens[: VAL_SEQS * VAL_T])
    with pytest.raises(ValueError, match="must be a positive multiple of seq_len"):
        evaluate_val_loss(tiny_gpt, TokenStream.from_split(exact, "val"), VAL_SEQS * VAL_T, 2, VAL_T, rt(), "float32")


@pytest.mark.parametrize("val_tokens", [0, -VAL_T])
def test_val_tokens_must_be_positive(tiny_gpt, val_stream, val_tokens):
    """No sequences to score is an error, not a loss of 0/0 = nan written to the log."""
    with pytest.raises(ValueError):
        evaluate_val_loss(tiny_gpt, val_stream[0], val_tokens, 2, VAL_T, rt(), "float32")


def test_val_token_id_out_of_vocab(tiny_gpt, val_stream):
    with pytest.raises(ValueError, match="vocab_size 32 in the val split"):
        evaluate_val_loss(tiny_gpt, val_stream[0], VAL_SEQS * VAL_T, 2, VAL_T, rt(), "float32", vocab_size=32)
