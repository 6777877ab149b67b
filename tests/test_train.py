"""The training side of train_gpt2.py: the LR schedule's wiring, one-batch overfitting, gradient accumulation, DDP
parity, bit-exact resume, log and checkpoint formats, the presets and the command line.

Runs are tiny (vocab 96, 2 layers of width 32, sequences of 16) on numpy-made shards whose token stream
repeats a fixed random 24-token pattern with 5% noise, so the loss has something to learn. Everything runs
in-process through train() or main() unless the test is about a real process (torchrun, the exit status
and stderr of the script)."""

import dataclasses
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import launcher
import run_files
import train_gpt2
from fineweb import get_tokenizer
from plot import read_log
from train_gpt2 import TrainConfig, get_lr, parse_train_args, train
from helpers import child_env, measured

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one torch thread for every test here
VOCAB = 96
MODEL = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=VOCAB)
OFFLINE = dict(hellaswag_interval=0, sample_interval=0, device="cpu", dtype="float32", compile="false")
LOG_LINE = re.compile(r"^(\d+) ([a-z_]+) (\S+)$")


# ----------------------------------------------------------------------------------------------------------
# Helpers


def make_shards(root: Path, train_sizes=(6000, 6000), val_size=4096, vocab=VOCAB, seed=0) -> Path:
    """fineweb.py-style uint16 shards: tmp_val_000000.npy, then tmp_train_000001.npy, ...; a repeating
    24-token pattern with 5% uniform noise (learnable, but not trivially)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pattern = rng.permutation(vocab)[:24]

    def tokens(n: int) -> np.ndarray:
        seq = np.resize(pattern, n)
        noisy = rng.random(n) < 0.05
        return np.where(noisy, rng.integers(0, vocab, n), seq).astype(np.uint16)

    np.save(root / "tmp_val_000000.npy", tokens(val_size))
    for i, n in enumerate(train_sizes, start=1):
        np.save(root / f"tmp_train_{i:06d}.npy", tokens(n))
    return root


def settings(data_root, log_dir, **overrides) -> dict:
    """A tiny, fast, offline run as TrainConfig keyword arguments."""
    base = dict(data_root=str(data_root), log_dir=str(log_dir), **MODEL, batch_size=4, seq_len=16,
                total_batch_size=64, max_steps=4, warmup_steps=2, max_lr=3e-3, eval_interval=2, val_tokens=256,
                ckpt_interval=0, **OFFLINE)
    base.update(overrides)
    return base


def flags(**kv) -> list[str]:
    """--key value pairs as the command line spells them (booleans as true/false)."""
    out = []
    for key, value in kv.items():
        out += [f"--{key}", ("true" if value else "false") if isinstance(value, bool) else str(value)]
    return out


def run_train(log=None, **kv) -> dict:
    """train() on TrainConfig(**kv), collecting log messages into `log` (a list) if given."""
    messages = log if log is not None else []
    return train(TrainConfig(**kv), log=messages.append)


def weights(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def final_checkpoint(log_dir) -> Path:
    paths = run_files.checkpoint_paths(log_dir)
    assert paths, f"no checkpoint in {log_dir}"
    return paths[-1]


def headers(log_dir) -> list[dict]:
    """The JSON blocks of header.txt, one per start or resume."""
    text, out, pos = (Path(log_dir) / "header.txt").read_text(), [], 0
    decoder = json.JSONDecoder()
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        block, pos = decoder.raw_decode(text, pos)
        out.append(block)
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over every entry of every tensor (a tensor may be empty: all of it left out as a
    zero-gradient entry, e.g. a LayerNorm bias on the keys)."""
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    return max(((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()), default=0.0)


@functools.lru_cache(maxsize=None)
def zero_gradient_entries() -> dict:
    """{state-dict key: bool mask} of the entries whose true gradient is zero for every input, found by one float64
    backward pass of a fresh MODEL on a batch holding every token and position: those entries get rounding noise
    (~1e-16 of the largest gradient) where every other entry gets a real gradient. The key third of c_attn.bias
    is one (softmax ignores a shift shared by all of a query's scores), and so is any edit's equivalent (a
    LayerNorm bias on the keys). In fp32 the noise (~1e-9) depends on the summation order, and AdamW divides it
    by its own RMS, moving those entries by up to ~lr either way: two correct runs differ there, and only there."""
    torch.manual_seed(0)
    model = train_gpt2.GPT(train_gpt2.GPTConfig(**MODEL)).double()
    T = MODEL["block_size"]
    idx = torch.randperm(VOCAB * 2).remainder(VOCAB)[: VOCAB * 2 // T * T].view(-1, T)
    _, loss = model(idx, idx.roll(1, dims=1))
    loss.backward()
    params = model.state_dict(keep_vars=True)
    grads = {k: torch.zeros_like(v) if v.grad is None else v.grad for k, v in params.items()}
    top = max(g.abs().max().item() for g in grads.values())
    return {k: g.abs() < 1e-10 * top for k, g in grads.items()}


def without_zero_gradient_entries(state: dict) -> dict:
    """The state dict with zero_gradient_entries() left out (each tensor flattened to its compared entries)."""
    masks = zero_gradient_entries()
    assert masks.keys() == state.keys()
    return {k: v[~masks[k]] for k, v in state.items()}


def assert_logs_close(a: dict, b: dict, atol: float):
    """read_log results with the same kinds and steps and values within atol."""
    assert a.keys() == b.keys()
    for kind in a:
        assert [s for s, _ in a[kind]] == [s for s, _ in b[kind]], kind
        for (step, x), (_, y) in zip(a[kind], b[kind]):
            assert abs(x - y) <= atol, (kind, step, x, y)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    """Two short train shards (100 + 150 tokens): a 64-token step wraps the epoch every 3 steps and reads
    across the shard boundary."""
    return make_shards(tmp_path_factory.mktemp("small_shards"), train_sizes=(100, 150))


# ----------------------------------------------------------------------------------------------------------
# Learning-rate schedule


def test_lr_decay_steps_is_decoupled_from_max_steps(data, tmp_path):
    """The lr the last update used (stored in the checkpoint's optimizer) follows --lr_decay_steps, not
    --max_steps; without it, the decay ends at max_steps. Whatever the schedule's shape, it has reached min_lr by
    its decay_steps and not before."""
    max_lr, min_lr = 3e-3, 3e-4
    run_train(**settings(data, tmp_path / "a", max_steps=5, warmup_steps=1, lr_decay_steps=12, eval_interval=0))
    run_train(**settings(data, tmp_path / "b", max_steps=5, warmup_steps=1, lr_decay_steps=4, eval_interval=0))
    run_train(**settings(data, tmp_path / "c", max_steps=5, warmup_steps=1, eval_interval=0))
    used = {run: torch.load(final_checkpoint(tmp_path / run), weights_only=True)["optimizer"]["param_groups"]
            for run in "abc"}
    assert [g["lr"] for g in used["a"]] == pytest.approx([get_lr(4, max_lr, min_lr, 1, 12)] * 2, rel=1e-12)
    assert [g["lr"] for g in used["b"]] == pytest.approx([min_lr] * 2, rel=1e-12)  # step 4 of a 4-step decay
    assert [g["lr"] for g in used["c"]] == pytest.approx([get_lr(4, max_lr, min_lr, 1, 5)] * 2, rel=1e-12)
    assert used["a"][0]["lr"] > min_lr and used["c"][0]["lr"] > min_lr


# ----------------------------------------------------------------------------------------------------------
# Optimization sanity


def test_overfit_one_batch(data, tmp_path):
    """One fixed batch of 4 x 32 tokens is memorised: the loss goes from ~ln(96) to below 0.05."""
    messages = []
    cfg = settings(data, tmp_path, batch_size=4, seq_len=32, total_batch_size=128, max_steps=120, warmup_steps=5,
                   max_lr=1e-2, weight_decay=0.0, eval_interval=0, overfit_batch=True)
    metrics = run_train(messages, **cfg)
    losses = [v for _, v in read_log(tmp_path / "log.txt")["train"]]
    assert len(losses) == 120
    assert losses[0] > 4.0  # ~ln(96) = 4.56 at initialisation
    assert metrics["train"] < 0.05, losses[-10:]
    assert min(losses[:100]) < 0.05  # well within the budget, not just at the very end
    # a control: the same run on fresh batches cannot memorise the 5% noise
    normal = run_train(**{**cfg, "log_dir": str(tmp_path / "normal"), "overfit_batch": False, "max_steps": 60})
    assert normal["train"] > 0.1


# ----------------------------------------------------------------------------------------------------------
# Gradient accumulation and DDP


def test_gradient_accumulation_equals_one_big_batch(data, tmp_path):
    """4 micro-steps of B=2 give the update of one step of B=8 (same 128 tokens, fp32)."""
    common = dict(seq_len=16, total_batch_size=128, max_steps=2, warmup_steps=1, eval_interval=2)
    big = run_train(**settings(data, tmp_path / "big", batch_size=8, **common))
    acc = run_train(**settings(data, tmp_path / "acc", batch_size=2, **common))
    assert headers(tmp_path / "big")[0]["grad_accum_steps"] == 1
    assert headers(tmp_path / "acc")[0]["grad_accum_steps"] == 4
    big_w, acc_w = without_zero_gradient_entries(weights(big["checkpoint"])), without_zero_gradient_entries(weights(acc["checkpoint"]))
    assert max_abs_diff(big_w, acc_w) < 1e-6
    assert_logs_close(measured(tmp_path / "big"), measured(tmp_path / "acc"), 2e-6)
    assert acc["val"] == pytest.approx(big["val"], abs=1e-6)
    # the tolerance means something: a different batch (32 tokens, no accumulation) lands elsewhere
    other = run_train(**settings(data, tmp_path / "other", batch_size=2, **{**common, "total_batch_size": 32}))
    assert max_abs_diff(weights(big["checkpoint"]), weights(other["checkpoint"])) > 1e-4


def test_total_batch_must_divide_over_the_world(data, tmp_path):
    """total_batch_size divisible by B*T but not by B*T*world is refused before anything runs."""
    cfg = TrainConfig(**settings(data, tmp_path, batch_size=2, seq_len=16, total_batch_size=96))  # 3 x 32
    lock = run_files.LogDirLock(cfg.log_dir, master=True)
    with pytest.raises(ValueError, match="world_size"):
        train_gpt2.set_up(cfg, False, 0, 2, "cpu", lock, log=lambda *a: None)  # as rank 0 of 2
    assert not (tmp_path / "log.txt").exists()


@pytest.mark.slow
def test_ddp_two_processes_match_one(data, tmp_path):
    """torchrun with 2 gloo ranks (B=2, 2 micro-steps each) = one process with the same 128-token steps,
    both with accumulation (B=2 x 4) and without (B=8): train and val losses, and the final weights."""
    common = dict(seq_len=16, total_batch_size=128, max_steps=4, warmup_steps=1, eval_interval=2, val_tokens=256)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train_gpt2.py",
           *flags(**settings(data, tmp_path / "ddp", batch_size=2, **common))]
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout and "2 x 16 x 2 ranks x 2 micro-steps" in proc.stdout
    header = headers(tmp_path / "ddp")
    assert len(header) == 1 and header[0]["world_size"] == 2 and header[0]["grad_accum_steps"] == 2
    ddp_log = measured(tmp_path / "ddp")
    assert [s for s, _ in ddp_log["train"]] == [0, 1, 2, 3] and [s for s, _ in ddp_log["val"]] == [0, 2, 4]
    ddp_weights = weights(final_checkpoint(tmp_path / "ddp"))
    for name, batch_size in (("accum", 2), ("wide", 8)):
        single = run_train(**settings(data, tmp_path / name, batch_size=batch_size, **common))
        assert_logs_close(ddp_log, measured(tmp_path / name), 1e-5)
        single_weights = without_zero_gradient_entries(weights(single["checkpoint"]))
        assert max_abs_diff(without_zero_gradient_entries(ddp_weights), single_weights) < 1e-5
    ddp_ckpt = torch.load(final_checkpoint(tmp_path / "ddp"), weights_only=True)
    assert ddp_ckpt["val_loss"] == pytest.approx(single["val"], abs=1e-5)
    assert ddp_ckpt["step"] == 4


# ----------------------------------------------------------------------------------------------------------
# Resume


def test_resume_continues_bit_identically(small_data, tmp_path):
    """2N steps straight == N steps + `--resume auto` to 2N: the same log.txt, bit-identical weights and
    optimizer state. The data wraps epochs mid-run with shuffled shard order, so the loader state matters."""
    N = 4
    common = settings(small_data, tmp_path / "straight", batch_size=2, total_batch_size=64, warmup_steps=2,
                      eval_interval=2, lr_decay_steps=2 * N, shuffle=True)
    train_gpt2.main(flags(**{**common, "max_steps": 2 * N}))
    resumed = {**common, "log_dir": str(tmp_path / "resumed")}
    train_gpt2.main(flags(**{**resumed, "max_steps": N}))
    first_half = (tmp_path / "resumed" / "log.txt").read_text()
    train_gpt2.main(flags(**{**resumed, "max_steps": 2 * N, "resume": "auto"}))

    resumed_text = (tmp_path / "resumed" / "log.txt").read_text()
    assert resumed_text.startswith(first_half)  # appended, never truncated
    resumed_lines = [ln for ln in resumed_text.splitlines() if ln.split()[1] in measured.KINDS]
    straight_lines = [ln for ln in (tmp_path / "straight" / "log.txt").read_text().splitlines()
                      if ln.split()[1] in measured.KINDS]
    assert resumed_lines == straight_lines  # no step missing, none repeated, the same values (timings aside)
    a = torch.load(final_checkpoint(tmp_path / "straight"), weights_only=True)
    b = torch.load(final_checkpoint(tmp_path / "resumed"), weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(pa[k], pb[k]) for k in ("exp_avg", "exp_avg_sq", "step"))
    assert a["train_loader"] == b["train_loader"] and b["train_loader"]["epoch"] >= 2  # read across epochs
    assert a["epoch"] == b["epoch"] >= 2
    assert b["step"] == 2 * N and b["val_loss"] == a["val_loss"]
    blocks = headers(tmp_path / "resumed")
    assert len(blocks) == 2  # header.txt appended: one block per start
    assert blocks[0]["resumed_from"] is None
    assert Path(blocks[1]["resumed_from"]).name == f"model_{N:05d}.pt"


def test_resume_auto_skips_an_unreadable_newest_checkpoint(data, tmp_path):
    """A truncated newest checkpoint is skipped with a warning; the run continues from the one before it
    (written mid-run, its step's evaluations not yet logged) and ends where the uninterrupted run ended."""
    cfg = settings(data, tmp_path, batch_size=2, total_batch_size=64, max_steps=6, eval_interval=3, ckpt_interval=3)
    run_train(**cfg)
    assert [p.name for p in run_files.checkpoint_paths(tmp_path)] == ["model_00003.pt", "model_00006.pt"]
    expected_weights, expected_log = weights(tmp_path / "model_00006.pt"), measured(tmp_path)
    newest = tmp_path / "model_00006.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    messages = []
    metrics = run_train(messages, **{**cfg, "resume": "auto"})
    warnings = [m for m in messages if m.startswith("warning:")]
    assert len(warnings) == 1 and "model_00006.pt" in warnings[0], messages
    assert any(m.startswith("resumed from") and "model_00003.pt" in m and "step 3" in m for m in messages), messages
    assert metrics["step"] == 6
    got = weights(tmp_path / "model_00006.pt")
    assert all(torch.equal(got[k], expected_weights[k]) for k in got)
    assert measured(tmp_path) == expected_log  # steps 3..6 re-logged with the same values


def test_sigterm_saves_a_checkpoint_that_resumes_exactly(data, tmp_path):
    """SIGTERM during step 1 finishes that step, checkpoints (before step 2's evaluation) and returns;
    `resume auto` then reproduces the uninterrupted run's log.txt and weights."""
    cfg = settings(data, tmp_path / "straight", batch_size=2, max_steps=5, eval_interval=2)
    straight = run_train(**cfg)
    handler = signal.getsignal(signal.SIGTERM)

    def log(message: str):
        if message.startswith("step     1/5 | loss"):
            os.kill(os.getpid(), signal.SIGTERM)

    cut = {**cfg, "log_dir": str(tmp_path / "cut")}
    stopped = train(TrainConfig(**cut), log=log)
    assert stopped.get("stopped") is True and stopped["step"] == 2
    assert signal.getsignal(signal.SIGTERM) == handler  # the previous handler is back
    assert [p.name for p in run_files.checkpoint_paths(tmp_path / "cut")] == ["model_00002.pt"]
    assert [s for s, _ in read_log(tmp_path / "cut" / "log.txt")["train"]] == [0, 1]
    resumed = run_train(**{**cut, "resume": "auto"})
    assert measured(tmp_path / "cut") == measured(tmp_path / "straight")
    a, b = weights(straight["checkpoint"]), weights(resumed["checkpoint"])
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_auto_without_checkpoint_starts_fresh(data, tmp_path):
    messages = []
    fresh = run_train(**settings(data, tmp_path / "plain"))
    auto = run_train(messages, **settings(data, tmp_path / "auto", resume="auto"))
    assert any("starting fresh" in m for m in messages), messages
    assert not any(m.startswith("resumed from") for m in messages)
    a, b = weights(fresh["checkpoint"]), weights(auto["checkpoint"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert measured(tmp_path / "plain") == measured(tmp_path / "auto")


def test_resume_of_a_finished_run_changes_nothing(data, tmp_path):
    """Resuming a run that already reached max_steps trains nothing, logs nothing and keeps the final
    checkpoint as it was (weights and its val_loss)."""
    cfg = settings(data, tmp_path, max_steps=4, eval_interval=2)
    done = run_train(**cfg)
    before = torch.load(done["checkpoint"], weights_only=True)
    log_before = (tmp_path / "log.txt").read_text()
    again = run_train(**{**cfg, "resume": "auto"})
    after = torch.load(again["checkpoint"], weights_only=True)
    assert (tmp_path / "log.txt").read_text() == log_before
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    assert after["step"] == 4
    assert after["val_loss"] == before["val_loss"] == done["val"]


def test_resume_with_another_model_shape_is_refused(data, tmp_path):
    run_train(**settings(data, tmp_path, max_steps=2, eval_interval=0))
    with pytest.raises(ValueError, match="shape"):
        run_train(**settings(data, tmp_path, max_steps=4, eval_interval=0, n_embd=64, resume="auto"))


# ----------------------------------------------------------------------------------------------------------
# Log, header and checkpoint formats


def test_log_header_and_checkpoint_contents(data, tmp_path):
    cfg = settings(data, tmp_path, max_steps=5, eval_interval=2, ckpt_interval=2, keep_last=2)
    metrics = run_train(**cfg)

    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert lines and all(LOG_LINE.match(line) for line in lines), lines
    log = read_log(tmp_path / "log.txt")
    assert set(log) == {"train", "val", "bpb", "lr", "norm", "ms", "tok_per_s", "epoch"}  # no MFU: a CPU has no peak
    assert [s for s, _ in log["train"]] == [0, 1, 2, 3, 4]
    assert [s for s, _ in log["val"]] == [0, 2, 4, 5]  # every eval_interval, and at the end
    assert log["train"][-1][1] == pytest.approx(metrics["train"], abs=1e-6)
    assert log["val"][-1][1] == pytest.approx(metrics["val"], abs=1e-6)
    assert log["val"][-1][1] < log["val"][0][1]

    (header,) = headers(tmp_path)
    assert header["config"] == dataclasses.asdict(TrainConfig(**cfg))
    assert header["world_size"] == 1 and header["grad_accum_steps"] == 1

    # --keep_last 2: of 2, 4 and the final 5, the newest two remain
    assert [p.name for p in run_files.checkpoint_paths(tmp_path)] == ["model_00004.pt", "model_00005.pt"]
    assert Path(metrics["checkpoint"]) == tmp_path / "model_00005.pt"
    ckpt = torch.load(metrics["checkpoint"], map_location="cpu", weights_only=True)
    for key in ("model", "optimizer", "model_config", "train_config", "step", "train_loader", "rng", "val_loss"):
        assert key in ckpt, key
    assert type(ckpt["model_config"]) is dict and type(ckpt["train_config"]) is dict
    assert ckpt["model_config"] == dataclasses.asdict(train_gpt2.GPTConfig(**MODEL))
    assert ckpt["train_config"] == dataclasses.asdict(TrainConfig(**cfg))
    assert ckpt["step"] == 5 and ckpt["val_loss"] == metrics["val"]
    assert {s["step"].item() for s in ckpt["optimizer"]["state"].values()} == {5.0}  # after the 5th update

    # the final checkpoint holds the weights after the last update: they reproduce the final val loss,
    # and they differ from the step-4 weights
    model, _ = train_gpt2.load_model(metrics["checkpoint"])
    val_shards = [run_files.open_shard(data / "tmp_val_000000.npy")]
    val = train_gpt2.evaluate_val_loss(model, val_shards, cfg["val_tokens"], 4, 16, "float32")
    assert val == pytest.approx(metrics["val"], abs=1e-6)
    assert max_abs_diff(weights(tmp_path / "model_00004.pt"), ckpt["model"]) > 1e-6


def test_zero_val_tokens_never_logs_nan(data, tmp_path):
    """--val_tokens 0 with evaluation on must be refused, not logged as a NaN val loss."""
    cfg = settings(data, tmp_path, max_steps=2, eval_interval=1, val_tokens=0)
    try:
        metrics = run_train(**cfg)
    except ValueError as e:
        assert "val_tokens" in str(e)
        return
    assert metrics["val"] is not None and math.isfinite(metrics["val"])
    assert all(math.isfinite(v) for _, v in read_log(tmp_path / "log.txt")["val"])


# ----------------------------------------------------------------------------------------------------------
# Presets and the command line


def test_explicit_flags_override_a_preset():
    """A preset replaces the defaults; a flag wins over both, wherever it stands on the command line."""
    shk = parse_train_args(["--max_lr", "1e-3", "--preset", "shakespeare", "--n_layer", "2"])
    assert shk.max_lr == 1e-3 and shk.n_layer == 2
    assert (shk.n_embd, shk.vocab_size, shk.data_root, shk.device) == (128, 50257, "data/shakespeare", "auto")
    for name, preset in train_gpt2.PRESETS.items():
        cfg = parse_train_args(["--preset", name])
        assert cfg == TrainConfig(**preset)
        assert parse_train_args(["--preset", name, "--max_steps", "5"]) == dataclasses.replace(cfg, max_steps=5)


def test_every_field_is_a_flag_typed_by_its_default_and_documented(capsys):
    """The whole flag mechanism: a TrainConfig field is a flag of its name, its type its default's, its help the
    comment on its line; a field of another type is refused with the reason."""
    with pytest.raises(SystemExit):
        parse_train_args(["-h"])
    usage = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"--{f.name}" in usage and type(f.default) in (bool, int, float, str), f.name
    assert "micro-batch B: sequences per forward pass per process" in usage  # batch_size's comment
    assert parse_train_args(["--max_lr", "3e-4", "--shuffle", "yes", "--seed", "7"]).max_lr == 3e-4
    with pytest.raises(SystemExit):
        parse_train_args(["--seed", "7.5"])  # an int flag takes ints only
    assert "invalid int value: '7.5'" in capsys.readouterr().err


def test_a_field_without_a_flag_type_is_refused(monkeypatch):
    @dataclasses.dataclass
    class WithTuple(TrainConfig):
        betas: tuple = (0.9, 0.95)  # the two betas at once

    monkeypatch.setattr(train_gpt2, "TrainConfig", WithTuple)
    with pytest.raises(TypeError, match=r"TrainConfig.betas: default \(0.9, 0.95\) has no flag type"):
        parse_train_args([])


@pytest.mark.parametrize("text, value", [("true", True), ("false", False), ("1", True), ("0", False)])
def test_booleans_take_a_value(text, value):
    assert parse_train_args(["--overfit_batch", text]).overfit_batch is value
    assert parse_train_args(["--shuffle", text]).shuffle is value


def test_lr_decay_steps_zero_means_max_steps():
    assert parse_train_args([]).lr_decay_steps == 0
    assert parse_train_args(["--lr_decay_steps", "40"]).lr_decay_steps == 40


# Each case: argv (data paths filled in by the test), expected exit status, a phrase of the message.
CLI_ERRORS = {
    "unknown flag": (["--bogus", "1"], 2, "unrecognized arguments"),
    "bool without value": (["--overfit_batch"], 2, "expected one argument"),
    "bool not a bool": (["--overfit_batch", "maybe"], 2, "true or false"),
    "bad preset": (["--preset", "gpt3"], 2, "invalid choice"),
    "not divisible": (["--total_batch_size", "100"], 2, "divisible"),
    "seq_len > block_size": (["--seq_len", "64"], 2, "exceeds --block_size"),
    "zero batch": (["--batch_size", "0"], 2, "--batch_size must be positive"),
    "negative steps": (["--max_steps", "-3"], 2, "--max_steps must be positive"),
    "negative decay steps": (["--lr_decay_steps", "-1"], 2, "--lr_decay_steps must be >= 0"),
    "missing data": (["--data_root", "{missing}"], 1, "fineweb.py"),
    "vocab too small": (["--vocab_size", "50"], 1, "vocab_size"),
    "val split too short": (["--val_tokens", "8192"], 1, "val_tokens"),
    "missing resume file": (["--resume", "{missing}/model_00001.pt"], 1, "does not exist"),
}


def cli_case(name: str, data: Path, tmp_path: Path) -> list[str]:
    argv, _, _ = CLI_ERRORS[name]
    base = flags(**settings(data, tmp_path / "log", max_steps=2))
    return base + [a.replace("{missing}", str(tmp_path / "missing")) for a in argv]


def one_line_message(code, stderr: str) -> str:
    """What the user reads last: sys.exit's message, or argparse's final `prog: error: ...` line."""
    if isinstance(code, str):
        return code
    return stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("name", list(CLI_ERRORS))
def test_cli_errors_in_process(name, data, tmp_path, capsys):
    """main() turns each mistake into SystemExit with a one-line message (no other exception escapes)."""
    _, status, phrase = CLI_ERRORS[name]
    with pytest.raises(SystemExit) as exc:
        train_gpt2.main(cli_case(name, data, tmp_path))
    code = exc.value.code
    assert code not in (0, None)
    assert (1 if isinstance(code, str) else code) == status
    message = one_line_message(code, capsys.readouterr().err)
    assert "error" in message and phrase in message and "\n" not in message


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        train_gpt2.main(["-h"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--preset" in out
    assert all(f"--{f.name}" in out for f in dataclasses.fields(TrainConfig))


@pytest.mark.slow
def test_cli_errors_as_processes(data, tmp_path):
    """The real script, one case of each kind (argparse, config validation, a failure inside the run):
    the exit status, no traceback, the message as the last line of stderr; and `-h` exits 0. The cases run
    at once (each is mostly interpreter and torch start-up); the in-process test above covers them all."""
    script = [sys.executable, "train_gpt2.py"]
    cases = {name: cli_case(name, data, tmp_path / name.replace(" ", "_"))
             for name in ("unknown flag", "not divisible", "missing data")}
    cases["-h"] = ["-h"]
    procs = {name: subprocess.Popen(script + argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for name, argv in cases.items()}
    results = {name: (p.communicate(timeout=540), p.returncode) for name, p in procs.items()}
    (out, err), rc = results.pop("-h")
    assert rc == 0 and "--preset" in out and not err
    for name, ((out, err), rc) in results.items():
        _, status, phrase = CLI_ERRORS[name]
        assert rc == status, (name, rc, err[-2000:])
        assert "Traceback" not in err, (name, err[-2000:])
        last = err.strip().splitlines()[-1]
        assert "error" in last and phrase in last, (name, last)


@pytest.mark.slow
def test_shakespeare_preset_val_loss_falls(tmp_path):
    """fineweb.py --local input.txt, then --preset shakespeare (the GPT-2 vocabulary, a 4-layer model),
    shortened: the val loss falls well below its start (~ln 50257 = 10.8)."""
    data = tmp_path / "shakespeare"
    prep = launcher.run([sys.executable, "fineweb.py", "--local", "input.txt", "--out_dir", str(data), "--workers", "1",
                         "--no_progress"], cwd=ROOT, env=child_env(), timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    argv = ["--preset", "shakespeare", *flags(data_root=data, log_dir=tmp_path / "log", max_steps=30, eval_interval=10,
                                             val_tokens=2048, batch_size=4, seq_len=64, total_batch_size=256,
                                             warmup_steps=5, sample_interval=0, compile="false")]
    cfg = parse_train_args(argv)
    assert (cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.max_lr, cfg.hellaswag_interval) == (4, 128, 50257, 3e-3, 0)
    train_gpt2.main(argv)
    val = read_log(tmp_path / "log" / "log.txt")["val"]
    assert [s for s, _ in val] == [0, 10, 20, 30]
    assert val[0][1] > 10.0
    assert val[-1][1] < val[0][1] - 2.5, val
    assert headers(tmp_path / "log")[0]["config"]["n_layer"] == 4


def test_wandb_is_imported_only_when_asked_and_runs_disabled(data, tmp_path, monkeypatch):
    """--wandb_project works with WANDB_MODE=disabled (offline machines, CI); without it wandb is never imported."""
    import sys

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    sys.modules.pop("wandb", None)
    run_train(**settings(data, tmp_path / "plain", max_steps=1))
    assert "wandb" not in sys.modules
    metrics = run_train(**settings(data, tmp_path / "wb", max_steps=2, wandb_project="gpt2-test"))
    assert "wandb" in sys.modules and metrics["step"] == 2


# ----------------------------------------------------------------------------------------------------------
# Muon


def test_muon_takes_the_blocks_matrices_and_resumes_bit_identically(small_data, tmp_path):
    """--optimizer muon: Muon updates the blocks' 2-D weights (its own peak LR, the shared schedule), AdamW the
    embeddings, head, biases and gains; 2N steps straight == N steps + --resume auto to 2N, both optimizers' states
    included. A checkpoint of one optimizer is refused by the other."""
    N = 3
    common = settings(small_data, tmp_path / "straight", batch_size=2, total_batch_size=64, warmup_steps=1,
                      eval_interval=0, lr_decay_steps=2 * N, optimizer="muon", muon_lr=0.02)
    straight = run_train(**{**common, "max_steps": 2 * N})
    resumed = {**common, "log_dir": str(tmp_path / "resumed")}
    run_train(**{**resumed, "max_steps": N})
    run_train(**{**resumed, "max_steps": 2 * N, "resume": "auto"})
    a, b = torch.load(straight["checkpoint"], weights_only=True), torch.load(final_checkpoint(tmp_path / "resumed"),
                                                                            weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for key in ("optimizer", "muon"):
        for pa, pb in zip(a[key]["state"].values(), b[key]["state"].values()):
            assert all(torch.equal(pa[k], pb[k]) for k in pa)
    model = train_gpt2.GPT(train_gpt2.GPTConfig(**MODEL))
    adamw, muon = model.configure_optimizers(0.1, 3e-3, "cpu", muon_lr=0.02)
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    names = {name for name, p in model.named_parameters() if id(p) in in_muon}
    assert names == {n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2}
    assert muon.param_groups[0]["lr_scale"] == pytest.approx(0.02 / 3e-3)
    assert len(a["muon"]["state"]) == len(names) and len(a["optimizer"]["state"]) == len(list(model.parameters())) - len(names)
    lr_used = a["muon"]["param_groups"][0]["lr"]  # the last step's: the schedule's value scaled to Muon's peak
    assert lr_used == pytest.approx(get_lr(2 * N - 1, 0.02, 0.002, 1, 2 * N), rel=1e-9)
    with pytest.raises(ValueError, match="was trained with --optimizer muon, this run asks adamw"):
        run_train(**{**resumed, "max_steps": 3 * N, "resume": "auto", "optimizer": "adamw"})
