"""The data section of train_gpt2.py: finding the shards (manifest.json or not), windows, DataLoaderLite (in order
and shuffled, over simulated ranks, exactly-once epochs, resume), the errors, memory, and evaluate_val_loss.

Shards are written here, not by fineweb.py: np.save of uint16 arrays whose tokens count up (0, 1, 2, ...) through
the whole split, so a token's value is its position in the split and every batch says where it was read from."""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from run_files import find_shards, open_shard
from train_gpt2 import GPT, DataLoaderLite, GPTConfig, evaluate_val_loss, windows

# Uneven train shard sizes for windows of B*T + 1 = 9 tokens: shards smaller than a window (0, 1, 3, 7),
# larger ones, and 11 shards so that indices 000002 and 000010 both exist.
SIZES = [23, 7, 0, 41, 3, 16, 1, 35, 9, 50, 12]
B, T = 2, 4


def write_split(root, split, sizes, first_index=0, prefix="x"):
    """Write consecutive `split` shards whose tokens count up from 0; return their paths in index order."""
    root.mkdir(parents=True, exist_ok=True)
    stream = np.arange(sum(sizes), dtype=np.int64).astype(np.uint16)
    bounds = np.cumsum([0, *sizes])
    for k in reversed(range(len(sizes))):  # written last-first: the reader must sort, not trust the directory
        np.save(root / f"{prefix}_{split}_{first_index + k:06d}.npy", stream[bounds[k] : bounds[k + 1]])
    return [root / f"{prefix}_{split}_{first_index + k:06d}.npy" for k in range(len(sizes))]


@pytest.fixture
def data(tmp_path):
    """fineweb.py's layout: one val shard (000000), then the train shards (000001, ...)."""
    write_split(tmp_path, "val", [100])
    return tmp_path, write_split(tmp_path, "train", SIZES, first_index=1)


def loaders(paths, W, **kwargs):
    """One DataLoaderLite per simulated rank of a world of W."""
    return [DataLoaderLite(paths, B, T, rank=r, world=W, **kwargs) for r in range(W)]


def window_starts(x: torch.Tensor, y: torch.Tensor) -> int:
    """The first token of a batch's window, after checking its shape, dtype and the x/y shift."""
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (B, T)
    flat_x, flat_y = x.reshape(-1).numpy(), y.reshape(-1).numpy()
    np.testing.assert_array_equal(flat_y[:-1], flat_x[1:])  # rows are consecutive: the targets are the next tokens
    np.testing.assert_array_equal(flat_x, np.arange(flat_x[0], flat_x[0] + B * T))  # one window, no gap
    return int(flat_x[0])


def expected_windows(sizes=SIZES, offset=0) -> list[int]:
    """Every window's first token, in order: windows of B*T+1 tokens at stride B*T inside each shard, the grid
    starting `offset` tokens into each shard."""
    starts = np.cumsum([0, *sizes])
    return [int(starts[k] + s) for k, n in enumerate(sizes) for s in range(offset, n - B * T, B * T)]


# ----------------------------------------------------------------------------------------------------------
# Finding shards


def test_shards_are_found_by_index_and_split_and_temp_files_are_not_shards(data):
    root, paths = data
    (root / "notes.txt").write_text("not a shard")
    splits, manifest, note = find_shards(root)
    assert splits["train"] == paths and [p.name for p in splits["val"]] == ["x_val_000000.npy"]
    assert manifest is None and "no manifest.json" in note and "1 val, 11 train" in note


def write_manifest(root, paths_by_split, **extra):
    shards = [{"file": p.name, "split": split, "tokens": len(np.load(p))}
              for split, paths in paths_by_split.items() for p in paths]
    (root / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257, "shards": shards, **extra}))


def test_a_manifest_decides_which_shards_and_checks_their_sizes(data):
    root, paths = data
    write_manifest(root, {"val": [root / "x_val_000000.npy"], "train": paths[:5]})
    np.save(root / "other_train_000001.npy", np.zeros(100, np.uint16))  # not listed: not read
    splits, manifest, note = find_shards(root)
    assert splits["train"] == paths[:5] and note is None and manifest["sizes"][paths[0]] == SIZES[0]
    loader = DataLoaderLite(splits["train"], B, T, sizes=manifest["sizes"])
    assert [Path(shard.filename).name for shard in loader.shards] == [p.name for p in paths[:5]]
    original = np.load(paths[0])
    np.save(paths[0], np.zeros(5, np.uint16))  # the shard changed after fineweb.py wrote the manifest
    with pytest.raises(ValueError, match=r"x_train_000001.npy holds 5 tokens, manifest.json says 23; re-run fineweb.py"):
        DataLoaderLite(splits["train"], B, T, sizes=manifest["sizes"])
    np.save(paths[0], original)
    paths[1].unlink()
    with pytest.raises(FileNotFoundError, match="x_train_000002.npy is missing"):
        DataLoaderLite(splits["train"], B, T, sizes=manifest["sizes"])
    (root / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="manifest.json is not fineweb.py's manifest"):
        find_shards(root)


@pytest.mark.parametrize("leftover", [".x_train_000012.npy.tmp123", ".fineweb_incomplete"])
def test_an_unfinished_fineweb_output_is_refused(data, leftover):
    """No manifest, and a temp file of fineweb.py's: it was killed mid-run, so the shards are a partial corpus."""
    root, _ = data
    (root / leftover).write_bytes(b"half a shard")
    with pytest.raises(ValueError, match=r"has no manifest.json and holds an unfinished fineweb.py output"):
        find_shards(root)


def test_shards_of_two_corpora_are_refused(data):
    root, _ = data
    write_split(root, "train", [10], first_index=1, prefix="other")
    with pytest.raises(ValueError, match="holds shards of 2 corpora"):
        find_shards(root)


def test_missing_and_wrong_kinds_of_data_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; create it with `python fineweb.py`"):
        find_shards(tmp_path / "missing")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ValueError, match="a_file is a file, not a directory"):
        find_shards(tmp_path / "a_file")
    with pytest.raises(FileNotFoundError, match="no 'train' shards"):
        find_shards(tmp_path)


def test_open_shard_is_memory_mapped_and_checks_its_type(data, tmp_path):
    _, paths = data
    tokens = open_shard(paths[0])
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16
    np.testing.assert_array_equal(tokens, np.arange(23))
    np.save(tmp_path / "bad.npy", np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="expected a 1-D uint16 token array"):
        open_shard(tmp_path / "bad.npy")
    (tmp_path / "torn.npy").write_bytes(b"\x93NUMPY not really")
    with pytest.raises(ValueError, match="torn.npy is not a readable .npy shard"):
        open_shard(tmp_path / "torn.npy")


def test_windows_cover_each_shard_without_gaps():
    got = windows([10, 3, 9], 4)  # windows of 5 tokens at stride 4
    assert got.tolist() == [[0, 0], [0, 4], [2, 0], [2, 4]]  # shard 1 (3 tokens) holds none; tails are unread
    assert windows([], 4).shape == (0, 2)


# ----------------------------------------------------------------------------------------------------------
# Batches: in order, ranks, epochs


def read_all(ranks, steps):
    """`steps` steps of every rank: the windows' first tokens in the order the world read them."""
    return [window_starts(*loader.next_batch()) for _ in range(steps) for loader in ranks]


@pytest.mark.parametrize("W", [1, 2, 3])
def test_in_order_the_world_reads_every_window_in_order(data, W):
    """Rank r takes windows r, r+W, ...: together the ranks read the split in order, and epochs follow each
    other with no window skipped at the seam (a step may straddle two epochs)."""
    _, paths = data
    order = expected_windows()
    n = len(order)
    got = read_all(loaders(paths, W), steps=(2 * n + W - 1) // W + 1)
    assert got == (order * 3)[: len(got)]


@pytest.mark.parametrize("W", [1, 3])
def test_shuffled_epochs_read_every_window_of_a_moved_grid_exactly_once(data, W):
    """Each epoch reads the windows of a grid moved by a seeded offset in [0, B*T) (new window boundaries every
    epoch), in a seeded permutation of the shards and of the windows within each, the same on every rank: over W
    ranks and 4 epochs every window of each epoch's grid is read exactly once, none crossing a shard's end."""
    _, paths = data
    ranks = loaders(paths, W, shuffle=True, seed=7)
    sizes = [ranks[0].order(e).shape[0] for e in range(4)]
    got = read_all(ranks, steps=-(-sum(sizes) // W))[: sum(sizes)]
    starts = np.cumsum([0, *SIZES])
    offsets = []
    for e, n in enumerate(sizes):
        epoch, got = got[:n], got[n:]
        shard = [int(np.searchsorted(starts, w, side="right")) - 1 for w in epoch]
        offsets.append((epoch[0] - starts[shard[0]]) % (B * T))
        assert sorted(epoch) == expected_windows(offset=offsets[-1]), e  # every window of that grid, once
        assert all(w + B * T < starts[k + 1] for w, k in zip(epoch, shard))  # B*T+1 tokens inside the shard
        assert epoch != expected_windows(offset=offsets[-1])  # permuted
        assert sum(a != b for a, b in zip(shard, shard[1:])) == len(set(shard)) - 1  # a shard's windows together
    assert len(set(offsets)) > 1  # the grid moves between epochs
    first = read_all(loaders(paths, W, shuffle=True, seed=7), steps=-(-sizes[0] // W))[: sizes[0]]
    assert first == read_all(loaders(paths, W, shuffle=True, seed=7), steps=-(-sizes[0] // W))[: sizes[0]]  # seeded
    assert first != read_all(loaders(paths, W, shuffle=True, seed=8), steps=-(-sizes[0] // W))[: sizes[0]]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 3, 11])
def test_state_dict_resumes_exactly_mid_epoch(data, shuffle, k):
    """A loader restored from another's state after k steps (here across the epoch seam too) reads the same
    windows from then on."""
    _, paths = data
    a = DataLoaderLite(paths, B, T, shuffle=shuffle, seed=3)
    for _ in range(k):
        a.next_batch()
    b = DataLoaderLite(paths, B, T, shuffle=shuffle, seed=3)
    b.load_state_dict(a.state_dict())
    for _ in range(2 * len(expected_windows())):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_state_dict_from_other_data_or_batching_is_refused(data, tmp_path):
    _, paths = data
    state = DataLoaderLite(paths, B, T, shuffle=True, seed=1).state_dict()
    other = write_split(tmp_path / "other", "train", [40, 40], first_index=1)
    for loader in (DataLoaderLite(other, B, T, shuffle=True, seed=1), DataLoaderLite(paths, B, T, shuffle=False, seed=1),
                   DataLoaderLite(paths, B, T, shuffle=True, seed=2), DataLoaderLite(paths, 1, T, shuffle=True, seed=1)):
        with pytest.raises(ValueError, match="changed since the checkpoint"):
            loader.load_state_dict(state)


def test_too_few_windows_for_the_ranks(tmp_path):
    paths = write_split(tmp_path, "train", [20])  # two windows of 9 tokens
    assert DataLoaderLite(paths, B, T, rank=1, world=2).windows == 2
    with pytest.raises(ValueError, match="2 window\\(s\\) of B x T \\+ 1 = 9 tokens, fewer than one step needs \\(one for each of 3 rank"):
        DataLoaderLite(paths, B, T, rank=0, world=3)


def test_token_id_out_of_vocab_names_the_shard(tmp_path):
    paths = write_split(tmp_path, "train", [20, 40])  # ids 0..59
    loader = DataLoaderLite(paths, B, T, vocab_size=30)
    for _ in range(3):  # ids 0..8 and 8..16 of the first shard, 20..28 of the second
        loader.next_batch()
    with pytest.raises(ValueError, match="token id 36 >= vocab_size 30 in x_train_000001.npy"):
        loader.next_batch()


@pytest.mark.parametrize("b, t, rank, world", [(0, 4, 0, 1), (2, 0, 0, 1), (2, 4, 2, 2), (2, 4, -1, 2)])
def test_bad_batch_shape_or_rank(data, b, t, rank, world):
    with pytest.raises(ValueError, match="need B, T > 0 and 0 <= rank < world"):
        DataLoaderLite(data[1], b, t, rank=rank, world=world)


# ----------------------------------------------------------------------------------------------------------
# Memory: shards are memory-mapped, never copied

BIG = 20_000_000  # tokens: 40 MB of uint16


@pytest.fixture(scope="module")
def big_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "x_train_000001.npy"
    np.save(path, (np.arange(BIG) % 60000).astype(np.uint16))
    return path


def test_loader_does_not_copy_the_shard(big_path):
    """numpy reports its buffers to tracemalloc, so a copy of the shard (or an int64 version of it) would show
    as a 40-160 MB peak; a memory-mapped loader allocates about one window (and its window index)."""
    tracemalloc.start()
    try:
        loader = DataLoaderLite([big_path], 4, 1024, vocab_size=60000, shuffle=True)
        for _ in range(5):
            x, _ = loader.next_batch()
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 5_000_000, f"peak {peak:,} bytes while reading a {2 * BIG:,}-byte shard"
        start = int(x[0, 0])
        assert torch.equal(x[0], torch.arange(start, start + 1024) % 60000)  # one window of the shard
        tracemalloc.reset_peak()  # the instrument works: reading the shard into memory does show up
        whole = np.load(big_path)
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
def val_shards(tmp_path):
    """A val split of two shards (random ids < 64): 5 + 6 windows of 17 tokens, more than the 7 evaluated."""
    tokens = np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16)
    np.save(tmp_path / "x_val_000000.npy", tokens[:90])
    np.save(tmp_path / "x_val_000001.npy", tokens[90:])
    return [open_shard(tmp_path / f"x_val_00000{i}.npy") for i in (0, 1)], tokens


def per_sequence_losses(model, tokens):
    """The direct computation: the val windows (5 in the first shard of 90 tokens, then the second shard's),
    targets shifted by one, mean cross-entropy of each."""
    starts = [s for s in range(0, 90 - VAL_T, VAL_T)] + [90 + s for s in range(0, 110 - VAL_T, VAL_T)]
    rows = torch.stack([torch.from_numpy(tokens[s : s + VAL_T + 1].astype(np.int64)) for s in starts[:VAL_SEQS]])
    with torch.no_grad():
        logits, _ = model(rows[:, :-1])
    return F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none").mean(dim=1).double()


@pytest.mark.parametrize("b", [1, 3, 100])
def test_val_loss_is_the_mean_over_val_tokens(tiny_gpt, val_shards, b):
    shards, tokens = val_shards
    loss = evaluate_val_loss(tiny_gpt, shards, VAL_SEQS * VAL_T, b, VAL_T, "float32")
    assert loss == pytest.approx(per_sequence_losses(tiny_gpt, tokens).mean().item(), rel=1e-5)
    assert tiny_gpt.training  # the model's mode is restored


@pytest.mark.parametrize("W", [2, 3])
def test_val_loss_all_reduces_sums_and_counts(tiny_gpt, val_shards, monkeypatch, W):
    """With DDP the ranks all-reduce a loss sum and a token count (not their means, which would weigh ranks
    with fewer sequences too much): summed over the simulated ranks they give the single-process loss."""
    import train_gpt2

    shards, tokens = val_shards
    reduced = []
    monkeypatch.setattr(train_gpt2.dist, "all_reduce", lambda t: reduced.append(t.clone()))
    for r in range(W):
        evaluate_val_loss(tiny_gpt, shards, VAL_SEQS * VAL_T, 2, VAL_T, "float32", rank=r, world_size=W)
    assert len(reduced) == W and all(t.shape == (2,) for t in reduced)  # one all-reduce of (sum, count) per rank
    sums, counts = [t[0] for t in reduced], [t[1] for t in reduced]
    assert sum(c.item() for c in counts) == VAL_SEQS * VAL_T
    total = sum(s.item() for s in sums) / (VAL_SEQS * VAL_T)
    assert total == pytest.approx(per_sequence_losses(tiny_gpt, tokens).mean().item(), rel=1e-5)
    assert total != pytest.approx(np.mean([s.item() / c.item() for s, c in zip(sums, counts)]), rel=1e-9)


@pytest.mark.parametrize("W", [1, 2, 3])
def test_val_loss_asks_to_stop_as_often_on_every_rank_and_stops(tiny_gpt, val_shards, monkeypatch, W):
    """should_stop() may be a collective (every rank must call it as often), asked before each batch: 7 windows over
    W ranks in batches of 2 is 4, 2 and 2 batches' worth, so every rank asks 4, 2, 2 times; True ends it with None."""
    import train_gpt2

    shards, _ = val_shards
    monkeypatch.setattr(train_gpt2.dist, "all_reduce", lambda t: None)
    asked = []
    for r in range(W):
        calls = []
        evaluate_val_loss(tiny_gpt, shards, VAL_SEQS * VAL_T, 2, VAL_T, "float32", rank=r, world_size=W,
                          should_stop=lambda: calls.append(1) is None and False)
        asked.append(len(calls))
    assert asked == [{1: 4, 2: 2, 3: 2}[W]] * W
    assert evaluate_val_loss(tiny_gpt, shards, VAL_SEQS * VAL_T, 2, VAL_T, "float32", should_stop=lambda: True) is None
    assert tiny_gpt.training


@pytest.mark.parametrize("val_tokens", [0, VAL_T * 3 + 1, VAL_T * 12])  # zero; not a multiple of T; 12 > 11 windows
def test_val_tokens_must_be_a_positive_multiple_that_fits(tiny_gpt, val_shards, val_tokens):
    shards, _ = val_shards
    with pytest.raises(ValueError, match=rf"val_tokens \({val_tokens}\) must be a positive multiple of seq_len"):
        evaluate_val_loss(tiny_gpt, shards, val_tokens, 2, VAL_T, "float32")


def test_val_token_id_out_of_vocab(val_shards):
    shards, _ = val_shards
    small = GPT(GPTConfig(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(ValueError, match="vocab_size 32 in x_val_000000.npy"):
        evaluate_val_loss(small, shards, VAL_SEQS * VAL_T, 2, VAL_T, "float32")


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_val_loss_makes_no_float64_tensor_on_mps(tiny_gpt, val_shards, device, monkeypatch):
    """MPS has no float64: there the sums are float32. Every op's output dtype is recorded; for "mps" the tensors
    stay on the CPU (the copies to the device are redirected), only the device string says mps. The loss agrees
    with the float64 sums to float32 rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dtypes(TorchDispatchMode):
        seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.seen.update(t.dtype for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor))
            return out

    to, zeros = torch.Tensor.to, torch.zeros
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: to(t, *("cpu" if x == "mps" else x for x in a), **k))
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **k: zeros(*a, **k))
    shards, tokens = val_shards
    with Dtypes() as mode:
        loss = evaluate_val_loss(tiny_gpt, shards, VAL_SEQS * VAL_T, 3, VAL_T, "float32", device=device)
    assert (torch.float64 in mode.seen) == (device == "cpu"), mode.seen
    assert loss == pytest.approx(per_sequence_losses(tiny_gpt, tokens).mean().item(), rel=1e-5)
