"""What a long run needs to keep every result and tell the truth about itself: a resume applies the flags it is given
(or refuses them in one line), a checkpoint knows its data (tokenizer, vocabulary, corpus fingerprint), a stop
request at any moment (start-up, evaluation, a checkpoint write, the final save) ends with the newest state on disk,
logs are whole lines, the epochs are said, val loss comes with bits per byte, the console is for people, wandb keeps
one run per lineage, and on several nodes rank 0 chooses the checkpoint every rank resumes.

Tiny runs in-process through train() (the model of test_train.py, one torch thread), unless a test is about ranks."""

import dataclasses
import json
import math
import os
import signal
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import fineweb
import run_files
import train_gpt2
from helpers import measured, stop_signals_at_default
from plot import read_log
from test_train import headers, make_shards, run_train, settings, weights
from train_gpt2 import GPT, GPTConfig, TrainConfig, get_lr

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_shards(tmp_path_factory.mktemp("shards"))


def final(log_dir) -> dict:
    return torch.load(run_files.checkpoint_paths(log_dir)[-1], map_location="cpu", weights_only=True)


def write_corpus(root: Path, train: np.ndarray, val: np.ndarray, manifest: dict) -> Path:
    """Shards and a manifest.json as fineweb.py writes them, with a fingerprint of their bytes."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, split, tokens in (("c_val_000000.npy", "val", val), ("c_train_000001.npy", "train", train)):
        np.save(root / name, tokens.astype(np.uint16))
        entries.append({"file": name, "split": split, "tokens": len(tokens),
                        "sha256": __import__("hashlib").sha256((root / name).read_bytes()).hexdigest()})
    listing = "\n".join(f"{e['file']} {e['tokens']} {e['sha256']}" for e in entries)
    fingerprint = __import__("hashlib").sha256(listing.encode()).hexdigest()
    (root / "manifest.json").write_text(json.dumps({**manifest, "shards": entries, "fingerprint": fingerprint}))
    return root


# ----------------------------------------------------------------------------------------------------------
# A resume tells the truth: what it may change is applied, the rest is refused in one line


def test_resume_applies_new_optimizer_hyperparameters(data, tmp_path):
    """--weight_decay and --beta2 live in the optimizer's param groups, which its state_dict would bring back: the
    resumed run's optimizer runs with the new values, header.txt and the checkpoint record them, and the update
    differs from a resume that keeps the old ones."""
    common = settings(data, tmp_path / "a", max_steps=3, eval_interval=0)
    for name in ("a", "b"):
        run_train(**{**common, "log_dir": str(tmp_path / name)})
    messages = []
    run_train(messages, **{**common, "max_steps": 6, "resume": "auto", "weight_decay": 0.5, "beta2": 0.99})
    run_train(**{**common, "log_dir": str(tmp_path / "b"), "max_steps": 6, "resume": "auto"})
    assert "resumed with other settings (applied): --max_steps 3 -> 6, --beta2 0.95 -> 0.99, --weight_decay 0.1 -> 0.5" \
        in messages, messages
    ckpt = final(tmp_path / "a")
    decay, no_decay = ckpt["optimizer"]["param_groups"]
    assert (decay["weight_decay"], no_decay["weight_decay"], tuple(decay["betas"])) == (0.5, 0.0, (0.9, 0.99))
    assert ckpt["train_config"]["weight_decay"] == headers(tmp_path / "a")[-1]["config"]["weight_decay"] == 0.5
    a, b = weights(run_files.checkpoint_paths(tmp_path / "a")[-1]), weights(run_files.checkpoint_paths(tmp_path / "b")[-1])
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_resume_applies_new_muon_lr(data, tmp_path):
    common = settings(data, tmp_path, max_steps=2, eval_interval=0, optimizer="muon", muon_lr=0.02)
    run_train(**common)
    run_train(**{**common, "max_steps": 3, "resume": "auto", "muon_lr": 0.01})
    group = final(tmp_path)["muon"]["param_groups"][0]
    assert group["lr_scale"] == pytest.approx(0.01 / common["max_lr"])
    assert group["lr"] == pytest.approx(0.01 / common["max_lr"] * get_lr(2, common["max_lr"], common["max_lr"] / 10, 2, 3))


def test_resume_applies_a_new_schedule_and_new_intervals(data, tmp_path):
    """The LR of every resumed step follows the new --max_lr/--lr_decay_steps; evaluations the new interval."""
    common = settings(data, tmp_path, max_steps=3, eval_interval=3)
    run_train(**common)
    run_train(**{**common, "max_steps": 8, "resume": "auto", "max_lr": 1e-3, "lr_decay_steps": 10, "eval_interval": 2})
    log = read_log(tmp_path / "log.txt")
    for step, lr in log["lr"][3:]:
        assert lr == pytest.approx(get_lr(step, 1e-3, 1e-4, common["warmup_steps"], 10), rel=1e-6)
    assert [s for s, _ in log["val"]] == [0, 3, 4, 6, 8]


def test_resume_applies_a_new_dropout(data, tmp_path):
    run_train(**settings(data, tmp_path, max_steps=2, eval_interval=0))
    run_train(**settings(data, tmp_path, max_steps=3, eval_interval=0, resume="auto", dropout=0.1))
    assert final(tmp_path)["model_config"]["dropout"] == 0.1


@pytest.mark.parametrize("flag, value", [("batch_size", 2), ("seq_len", 8), ("seed", 7), ("shuffle", True),
                                         ("optimizer", "muon")])
def test_resume_refuses_what_would_change_the_data_order_or_the_optimizer(data, tmp_path, flag, value):
    run_train(**settings(data, tmp_path, max_steps=2, eval_interval=0))
    old = TrainConfig(**settings(data, tmp_path))
    with pytest.raises(ValueError, match=rf"was trained with --{flag} {getattr(old, flag)}, this run asks {value}: "
                                         rf"resume with --{flag} {getattr(old, flag)}, or start from its weights"):
        run_train(**settings(data, tmp_path, max_steps=4, eval_interval=0, resume="auto", **{flag: value}))


# ----------------------------------------------------------------------------------------------------------
# A checkpoint knows its data


def char_corpus(root: Path, vocab: str, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    return write_corpus(root, rng.integers(0, len(vocab), 4000), rng.integers(0, len(vocab), 1024),
                        {"tokenizer": "char", "vocab": vocab, "vocab_size": len(vocab)})


def test_another_vocabulary_or_corpus_is_refused_by_resume_and_init_from(tmp_path):
    """A character corpus rebuilt with one character swapped (the same vocabulary size) means other text by the
    same ids: --resume and --init_from refuse it. Shards of the same sizes but other tokens: --resume refuses them
    (fineweb.py's fingerprint), and says how to start from the weights on purpose."""
    run = dict(n_layer=1, n_head=1, n_embd=16, block_size=16, batch_size=2, seq_len=16, total_batch_size=32,
               max_steps=2, warmup_steps=1, eval_interval=0, val_tokens=64, hellaswag_interval=0, sample_interval=0,
               device="cpu", dtype="float32", compile="false")
    first = char_corpus(tmp_path / "abc", "\n abcdefg")
    run_train(data_root=str(first), log_dir=str(tmp_path / "log"), **run)
    ckpt = run_files.checkpoint_paths(tmp_path / "log")[-1]
    swapped = char_corpus(tmp_path / "abx", "\n abcdefx")
    with pytest.raises(ValueError, match="has another vocabulary .* so its ids mean other text: resume it on its own"):
        run_train(data_root=str(swapped), log_dir=str(tmp_path / "log"), resume="auto", **{**run, "max_steps": 3})
    with pytest.raises(ValueError, match="--init_from .* another vocabulary"):
        run_train(data_root=str(swapped), log_dir=str(tmp_path / "fresh"), init_from=str(ckpt), **run)
    other = char_corpus(tmp_path / "other", "\n abcdefg", seed=1)
    with pytest.raises(ValueError, match=rf"trained on other data than {other} holds .* --init_from {ckpt}"):
        run_train(data_root=str(other), log_dir=str(tmp_path / "log"), resume="auto", **{**run, "max_steps": 3})
    fine = run_train(data_root=str(other), log_dir=str(tmp_path / "branch"), init_from=str(ckpt), **run)
    assert fine["step"] == 2  # on purpose, from the weights: allowed


# ----------------------------------------------------------------------------------------------------------
# Stop requests at any moment end with the newest state on disk


def stop_when(monkeypatch, module, name, calls: int = 1, sig=signal.SIGTERM):
    """Send this process `sig` inside the calls-th call of module.name (then let the call finish)."""
    original, count = getattr(module, name), [0]

    def wrapper(*args, **kwargs):
        count[0] += 1
        if count[0] == calls:
            os.kill(os.getpid(), sig)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("straight")
    run_train(**settings(data, log_dir, max_steps=5, eval_interval=2, ckpt_interval=2))
    return log_dir


def assert_resumes_to(log_dir: Path, straight: Path, data: Path):
    run_train(**settings(data, log_dir, max_steps=5, eval_interval=2, ckpt_interval=2, resume="auto"))
    assert measured(log_dir) == measured(straight)
    a, b = weights(run_files.checkpoint_paths(log_dir)[-1]), weights(run_files.checkpoint_paths(straight)[-1])
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_during_start_up_ends_cleanly_before_the_first_step(data, tmp_path, monkeypatch):
    stop_when(monkeypatch, run_files, "write_header", sig=signal.SIGHUP)
    messages = []
    with stop_signals_at_default():  # SIGHUP's default action even in a suite started under nohup (which ignores it)
        result = run_train(messages, **settings(data, tmp_path, max_steps=5))
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    assert result["stopped"] and result["step"] == 0 and result["checkpoint"] is None
    assert "stopped by SIGHUP at step 0" in messages[-1] and "checkpoint: none written" in messages[-1]
    assert run_files.checkpoint_paths(tmp_path) == []


def test_a_signal_during_an_evaluation_cuts_it_short_and_resumes_it(data, tmp_path, monkeypatch, straight):
    """SIGTERM in the middle of step 4's val loss (a long evaluation): it stops at the next batch, the checkpoint
    is of step 4 with its evaluation not done, and --resume auto evaluates it and ends as the straight run."""
    # read_window's calls: 16 val windows at steps 0 and 2, one batch per training step: step 4's val loss starts at 37
    stop_when(monkeypatch, train_gpt2, "read_window", calls=37 + 5)
    messages = []
    result = run_train(messages, **settings(data, tmp_path, max_steps=5, eval_interval=2, ckpt_interval=2))
    monkeypatch.undo()
    assert result["stopped"] and result["step"] == 4
    ckpt = final(tmp_path)
    assert ckpt["step"] == 4 and ckpt["evals_done"] is False
    assert [s for s, _ in read_log(tmp_path / "log.txt")["val"]] == [0, 2]  # step 4's val never logged half-done
    assert_resumes_to(tmp_path, straight, data)


@pytest.mark.parametrize("which", [1, 2], ids=["periodic save", "final save"])
def test_a_signal_during_a_checkpoint_write_keeps_it_whole(data, tmp_path, monkeypatch, straight, which):
    """SIGTERM while a checkpoint is written: the write finishes (the signal only asks), the run stops at the next
    step boundary with a checkpoint of it, or (the final save) simply ends, finished; exit status 0 either way."""
    stop_when(monkeypatch, run_files, "atomic_write", calls={1: 1, 2: 3}[which])
    result = run_train(**settings(data, tmp_path, max_steps=5, eval_interval=2, ckpt_interval=2))
    monkeypatch.undo()
    if which == 1:
        assert result["stopped"] and result["step"] == 2 and final(tmp_path)["step"] == 2
        assert_resumes_to(tmp_path, straight, data)
    else:
        assert not result["stopped"] and final(tmp_path)["step"] == 5 and final(tmp_path)["evals_done"]
        assert measured(tmp_path) == measured(straight)


# ----------------------------------------------------------------------------------------------------------
# Whole log lines, the end of the data, epochs


def test_a_torn_last_line_is_dropped_at_resume_with_a_note(data, tmp_path):
    run_train(**settings(data, tmp_path, max_steps=2, eval_interval=1))
    with open(tmp_path / "log.txt", "a") as f:
        f.write("2 train 4.51")  # a write cut short: no newline
    messages = []
    run_train(messages, **settings(data, tmp_path, max_steps=3, eval_interval=1, resume="auto"))
    assert any(m.startswith(f"note: dropped the torn last line of {tmp_path / 'log.txt'} (b'2 train 4.51')")
               for m in messages), messages
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert all(len(line.split()) == 3 for line in lines) and "2 train 4.51" not in lines
    assert [s for s, _ in read_log(tmp_path / "log.txt")["train"]] == [0, 1, 2]


def test_a_dangling_symbolic_link_among_checkpoints_is_skipped_with_a_warning(data, tmp_path):
    run_train(**settings(data, tmp_path, max_steps=2, eval_interval=0))
    (tmp_path / "model_00009.pt").symlink_to(tmp_path / "gone.pt")  # newer by name, pointing nowhere
    messages = []
    result = run_train(messages, **settings(data, tmp_path, max_steps=3, eval_interval=0, resume="auto"))
    assert f"warning: skipping unusable checkpoint: {tmp_path / 'model_00009.pt'}: No such file or directory" in messages
    assert f"resumed from {tmp_path / 'model_00002.pt'} at step 2" in messages and result["step"] == 3


def test_the_epochs_are_said_and_recorded(tmp_path):
    """At start: the tokens the run reads against the train split's (epochs); a note when an epoch begins; the
    epoch in log.txt at every step and in the checkpoint."""
    data = make_shards(tmp_path / "small", train_sizes=(200, 200))  # 6 windows of 65 tokens, 4 per step of 256
    messages = []
    run_train(messages, **settings(data, tmp_path / "log", max_steps=4, eval_interval=0, batch_size=4, seq_len=16,
                                    total_batch_size=128))
    assert any("1.33 epochs of the train split (384 tokens) to read" in m for m in messages), messages
    notes = [m for m in messages if m.startswith("note: epoch")]
    assert notes == ["note: epoch 1 begins after step 2: the train split is read again"], notes
    epochs = [e for _, e in read_log(tmp_path / "log" / "log.txt")["epoch"]]
    assert epochs == pytest.approx([2 / 6, 4 / 6, 1.0, 8 / 6], abs=1e-6)  # read after each step
    assert final(tmp_path / "log")["epoch"] == pytest.approx(8 / 6)


# ----------------------------------------------------------------------------------------------------------
# Bits per byte


@pytest.mark.parametrize("tokenizer", ["gpt2", "char"])
def test_bits_per_byte_equal_an_independent_computation_on_a_known_text(tmp_path, tokenizer):
    """bpb = the val targets' summed loss in bits over their UTF-8 bytes, <|endoftext|> counting 0 bytes: computed
    here from scratch (per-token log-probabilities of the known text, the text's own bytes) and by the trainer."""
    text = (Path(__file__).resolve().parents[1] / "input.txt").read_text()[:6000]
    enc = fineweb.get_tokenizer() if tokenizer == "gpt2" else fineweb.CharTokenizer("".join(sorted(set(text))))
    ids = [enc.eot_token] * (tokenizer == "gpt2") + enc.encode_ordinary(text)
    T, n = 16, (len(ids) - 1) // 16 // 2 * 16  # val_tokens: whole windows of T, half the text
    shard = np.array(ids, dtype=np.uint16)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=T, vocab_size=enc.n_vocab, n_layer=1, n_head=1, n_embd=16)).eval()
    loss = train_gpt2.evaluate_val_loss(model, [shard], n, 4, T, "float32")
    bpb = loss * n / (math.log(2) * train_gpt2.val_bytes([shard], n, T, fineweb.token_byte_lengths(enc)))
    targets = torch.tensor(ids[1 : n + 1])
    with torch.no_grad():
        logits = torch.cat([model(torch.tensor([ids[i : i + T]]))[0][0] for i in range(0, n, T)])
    bits = -logits.double().log_softmax(-1)[torch.arange(n), targets].sum().item() / math.log(2)
    target_text = enc.decode([t for t in targets.tolist() if t != enc.eot_token])
    assert bpb == pytest.approx(bits / len(target_text.encode("utf-8")), rel=1e-5)


# ----------------------------------------------------------------------------------------------------------
# The console


def test_the_console_shows_progress_evaluations_samples_and_a_summary(tmp_path):
    data = char_corpus(tmp_path / "data", "\n abcdefg")
    messages = []
    run_train(messages, **settings(data, tmp_path / "log", max_steps=4, eval_interval=2, sample_interval=4,
                                    sample_prompt="\n", sample_length=5))
    steps = [m for m in messages if m.startswith("step ")]
    assert [m.split(" | ")[0] for m in steps] == ["step     0/4", "step     1/4", "step     2/4", "step     3/4"]
    assert all(" ms | " in m and " tok/s | " in m for m in steps) and steps[-1].endswith(" left")
    assert [m.split(" | ")[0] for m in messages if m.startswith("eval ")] == ["eval     0/4", "eval     2/4", "eval     4/4"]
    samples = [m for m in messages if m.startswith("sample ")]
    assert [m.split(":")[0] for m in samples] == [f"sample {i} at step {s}" for s in (0, 4) for i in range(4)]
    assert samples[4].startswith("sample 0 at step 4:\n") and "\\n" not in samples[4]  # text, not a repr
    summary = messages[-1].splitlines()
    assert summary[0].startswith("finished at step 4 | val loss ") and " | val bpb " in summary[0]
    assert summary[1] == f"checkpoint: {tmp_path / 'log' / 'model_00004.pt'}"
    assert f"log: {tmp_path / 'log' / 'log.txt'} | curves: {tmp_path / 'log' / 'curves.png'}" in summary[2]
    assert summary[3] == f"sample from it: python sample.py --init_from {tmp_path / 'log' / 'model_00004.pt'}"
    assert summary[4].startswith("resume it (with a larger --max_steps): python ") and "--resume auto" in summary[4]


# ----------------------------------------------------------------------------------------------------------
# wandb, offline: read back what was logged


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: a 7-byte header (':W&B', a magic number, a version), then 32 KiB
    blocks of LevelDB-style records (crc 4 bytes, length 2, type 1: 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, parts = path.read_bytes(), 7, []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # the rest of the block is padding
            pos += left
            continue
        parts.append(data[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@pytest.mark.slow
def test_wandb_keeps_one_run_per_lineage_with_its_config_and_samples(tmp_path, monkeypatch):
    """--wandb_project/--wandb_run_name, offline: the run's config holds the flags and the derived values (parameters,
    gradient accumulation, dtype, device, world size, the data's manifest); metrics and samples are logged; a resumed
    run continues the same wandb run (its id is kept with the lineage), a fresh one in the same log_dir does not."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    data = char_corpus(tmp_path / "data", "\n abcdefg")
    common = settings(data, tmp_path / "log", max_steps=2, eval_interval=2, sample_interval=2, sample_length=3,
                      wandb_project="gpt2-test", wandb_run_name="tiny", sample_prompt="\n")
    run_train(**common)
    run_train(**{**common, "max_steps": 3, "resume": "auto"})
    run_train(**{**common, "log_dir": str(tmp_path / "log"), "max_steps": 1})  # a fresh lineage beside it
    continued = torch.load(tmp_path / "log" / "model_00003.pt", weights_only=True)["lineage"]["wandb_id"]
    runs = {p: p.stem.removeprefix("run-") for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")}
    assert sorted(runs.values()).count(continued) == 2 and len(set(runs.values())) == 2  # resumed: the same run
    records = [list(wandb_records(p)) for p in sorted(runs, key=lambda p: p.parent.name) if runs[p] == continued]
    first = next(r.run for r in records[0] if r.WhichOneof("record_type") == "run")
    config = {item.key: json.loads(item.value_json) for item in first.config.update}
    assert first.display_name == "tiny" and config["max_lr"] == common["max_lr"]
    for key in ("num_params", "grad_accum_steps", "dtype", "device", "world_size", "data"):
        assert key in config, key
    assert config["num_params"] > 0 and config["world_size"] == 1 and config["dtype"] == "float32"
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
               for r in records[0] + records[1] if r.WhichOneof("record_type") == "history"]
    assert any("samples/_type" in h for h in history) and any("val" in h and "bpb" in h for h in history)
    assert any("train" in h and h["_step"] == "2" for h in history)  # the resumed run's step, in the same run


# ----------------------------------------------------------------------------------------------------------
# Several nodes: rank 0 chooses the checkpoint, every rank loads it or every rank stops


def _rank_worker(rank, world, port, cfgs, unreadable, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if rank in unreadable:  # this "node" does not see rank 0's disk
        load = run_files.load_checkpoint
        run_files.load_checkpoint = lambda path: (_ for _ in ()).throw(
            FileNotFoundError(f"checkpoint {path} does not exist")) if "node0" in str(path) else load(path)
    try:
        result = train_gpt2.train(TrainConfig(**cfgs[rank]), log=lambda *a: None)
        Path(out, f"rank{rank}.json").write_text(json.dumps({"step": result["step"], "val": result["val"]}))
    except ValueError as e:
        Path(out, f"rank{rank}.json").write_text(json.dumps({"error": str(e)}))


@pytest.mark.slow
@pytest.mark.parametrize("unreadable", [(), (1,)], ids=["every rank reads it", "rank 1 cannot"])
def test_multi_node_resume_follows_rank_0(data, tmp_path, unreadable):
    """Node-local log_dirs: rank 0's holds a checkpoint, rank 1's is empty. --resume auto resumes rank 0's choice on
    every rank (never a fresh start on one rank); a rank that cannot read it stops the run, named, on every rank."""
    node0 = tmp_path / "node0"
    run_train(**settings(data, node0, max_steps=2, eval_interval=0, batch_size=2, total_batch_size=128))
    cfgs = [settings(data, tmp_path / f"node{r}", max_steps=4, eval_interval=2, batch_size=2, total_batch_size=128,
                     resume="auto") for r in range(2)]
    port = 29000 + os.getpid() % 1000
    torch.multiprocessing.spawn(_rank_worker, args=(2, port, cfgs, unreadable, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if unreadable:
        assert all(r["error"].startswith(f"rank 1 cannot resume from {node0 / 'model_00002.pt'} (rank 0's choice)")
                   for r in results), results
    else:
        assert results[0] == results[1] and results[0]["step"] == 4
        assert "resumed_from" in headers(node0)[-1] and headers(node0)[-1]["resumed_from"].endswith("model_00002.pt")
    assert not (tmp_path / "node1").exists()  # rank 1 writes nothing, wherever its log_dir points
