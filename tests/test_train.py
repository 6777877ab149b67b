"""The training program, run as users run it: in this process for the loop's arithmetic (resume,
overfitting, guards, sinks), as real processes for signals, kills, DDP and bad input. Any GPT
that GPTConfig builds passes these: no number of GPT-2's is pinned here."""

import dataclasses
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    child_env,
    descendants,
    finish,
    no_position_table,
    one_line_error,
    read_log,
    run_main,
    run_program,
    sigterm_at_val_pass,
    start,
    tiny_flags,
    torchrun,
    wait_for,
)
from conftest import (
    train_tiny as train,
)

import fineweb
import harness
import plot
import train_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")

# the command line's config and presets (harness.parse_args)
TRAIN_GPT2 = (train_gpt2.TrainConfig, train_gpt2.PRESETS)


def checkpoint(log_dir, step):
    return torch.load(Path(log_dir) / f"model_{step:05d}.pt", weights_only=True)


# The entries of a checkpoint that differ between an uninterrupted run and a resumed one by
# design: the flags that say where a run writes and what it resumed, the wall-clock seconds spent
# training, and the record of the code (a run in this process imported the tests' modules too).
# Every other entry, one a fork adds included (an EMA of the weights), is equal.
DIFFER_BY_DESIGN = {"train_config.log_dir", "train_config.resume", "train_seconds", "code"}


def assert_same_state(a, b, where=""):
    # every entry of two checkpoints, recursively: tensors bit for bit, other values equal
    if where in DIFFER_BY_DESIGN:
        return
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}" if where else str(key))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}.{i}")
    elif isinstance(a, torch.Tensor):
        same = a.dtype == b.dtype and torch.equal(a, b)
        assert same, where
    else:
        assert a == b, where


OVERFIT = dict(max_steps=100, max_lr=1e-2, warmup_steps=10, eval_interval=0, ckpt_interval=0)


@pytest.fixture(scope="module")
def one_batch(char_corpus, tmp_path_factory):
    """The train losses of 100 steps on the first batch."""
    log_dir = tmp_path_factory.mktemp("one_batch")
    train(char_corpus, log_dir, overfit_batch=True, **OVERFIT)
    return read_log(log_dir)["train"]


@pytest.mark.gpt2_contract  # the rate is AdamW's at this lr (the recipe's optimizer)
def test_overfitting_one_batch_drives_the_loss_to_zero(one_batch):
    assert one_batch[99] < 0.05 * one_batch[0]


def test_overfitting_one_batch_drives_the_loss_down(char_corpus, tmp_path, one_batch):
    # the same steps on one batch and on the stream: memorising one batch goes lower, with any
    # optimizer that trains (how fast, to ~0 in 100 steps, is AdamW's: the test above)
    train(char_corpus, tmp_path, **OVERFIT)
    stream = read_log(tmp_path)["train"]
    assert one_batch[0] == stream[0]
    last = sum(one_batch[s] for s in range(90, 100)) / 10
    assert last < sum(stream[s] for s in range(90, 100)) / 10 and last < one_batch[0]


def test_overfit_batch_is_the_first_batch_on_any_number_of_ranks_and_after_a_resume(
    small_corpus, tmp_path
):
    # the first step's batch at every step: one process reads its 2 windows in 2 micro-steps,
    # two ranks one each, a resumed run the same
    overfit = dict(overfit_batch=True, max_steps=6, ckpt_interval=3)
    one = tmp_path / "one"
    train(small_corpus, one, **overfit)
    resumed = tmp_path / "resumed"
    train(small_corpus, resumed, resume=one / "model_00003.pt", **overfit)
    assert_same_state(checkpoint(one, 6), checkpoint(resumed, 6))
    assert read_log(resumed)["train"] == {s: v for s, v in read_log(one)["train"].items() if s >= 3}
    two = tmp_path / "two"
    returncode, _, err = torchrun(
        [ROOT / "train_gpt2.py"] + tiny_flags(small_corpus, two, **overfit)
    )
    assert returncode == 0, err[-3000:]
    for kind in ("train", "norm"):
        assert read_log(two)[kind] == pytest.approx(read_log(one)[kind], rel=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(shuffle=True, dropout=0.1),
        dict(optimizer="muon", shuffle=True),
        # a context where an edit keyed on length acts (a sequence-length warmup, say)
        dict(seq_len=128, batch_size=1, val_tokens=128, shuffle=True),
    ],
    ids=["in-order", "shuffled-dropout", "muon", "context-128"],
)
def test_a_resume_from_any_checkpoint_is_bit_exact(small_corpus, tmp_path, overrides):
    # 24 steps cross the small corpus's epoch boundary (17 steps an epoch)
    straight = tmp_path / "straight"
    train(small_corpus, straight, max_steps=24, ckpt_interval=8, **overrides)
    for step in (8, 16):
        resumed = tmp_path / f"from_{step}"
        source = straight / f"model_{step:05d}.pt"
        train(small_corpus, resumed, max_steps=24, ckpt_interval=8, resume=source, **overrides)
        assert_same_state(checkpoint(straight, 24), checkpoint(resumed, 24))
        mine = read_log(resumed)
        theirs = read_log(straight)
        for kind in ("train", "val", "norm", "lr"):
            assert {s: v for s, v in theirs[kind].items() if s >= step} == mine[kind], kind
    assert checkpoint(straight, 24)["loader"]["epoch"] == 1


def test_resume_auto_takes_the_newest_whole_checkpoint(small_corpus, tmp_path):
    straight = tmp_path / "straight"
    train(small_corpus, straight, max_steps=12, ckpt_interval=4)
    run = tmp_path / "run"
    train(small_corpus, run, max_steps=12, ckpt_interval=4)
    (run / "model_00012.pt").unlink()
    # model_00008.pt torn by a kill, model_00004.pt with one flipped bit
    data = bytearray((run / "model_00004.pt").read_bytes())
    data[len(data) // 2] ^= 0x10
    (run / "model_00004.pt").write_bytes(bytes(data))
    torn = (run / "model_00008.pt").read_bytes()
    (run / "model_00008.pt").write_bytes(torn[: len(torn) // 2])
    assert not harness.is_whole(run / "model_00004.pt")
    result, lines = train(small_corpus, run, max_steps=12, ckpt_interval=4, resume="auto")
    warnings = [line for line in lines if line.startswith("warning: skipping")]
    assert len(warnings) == 2 and "model_00008.pt" in warnings[0]
    assert "resumed" not in " ".join(lines)  # nothing whole left: a new run from step 0
    assert_same_state(checkpoint(straight, 12), checkpoint(run, 12))


def file_bytes(log_dir):
    # every file a run made (the lock file only names its holder)
    paths = Path(log_dir).rglob("*")
    return {p: p.read_bytes() for p in paths if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("errno", [13, 5], ids=["permission denied", "I/O error"])
def test_an_unreadable_checkpoint_stops_resume_auto_and_nothing_is_written(
    small_corpus, tmp_path, monkeypatch, errno
):
    # An unreadable checkpoint may be whole: resuming an older one (or step 0) would write over
    # it. The run stops before it writes anything, every file as it was.
    train(small_corpus, tmp_path, max_steps=12, ckpt_interval=4)
    before = file_bytes(tmp_path)
    real_zip_file = harness.zipfile.ZipFile

    def zip_file(path, *args, **kwargs):
        if Path(path).name == "model_00012.pt":
            raise OSError(errno, os.strerror(errno))
        return real_zip_file(path, *args, **kwargs)

    monkeypatch.setattr(harness.zipfile, "ZipFile", zip_file)
    with pytest.raises(ValueError, match="cannot read checkpoint .*model_00012.pt"):
        train(small_corpus, tmp_path, max_steps=16, ckpt_interval=4, resume="auto")
    assert file_bytes(tmp_path) == before


def test_a_checkpoint_that_is_not_a_file_stops_resume_auto(small_corpus, tmp_path, capsys):
    # the same from the command line: a directory where the newest checkpoint should be
    train(small_corpus, tmp_path, max_steps=8, ckpt_interval=4)
    (tmp_path / "model_00012.pt").mkdir()
    before = file_bytes(tmp_path)
    args = tiny_flags(small_corpus, tmp_path, max_steps=16, ckpt_interval=4, resume="auto")
    code, err = run_main(train_gpt2.main, args, capsys)
    one_line_error(code, err, "train_gpt2.py", "cannot read checkpoint ")
    assert "model_00012.pt" in err
    assert file_bytes(tmp_path) == before


@pytest.mark.timeout(60)  # a FIFO opened would block for good: this fails rather than hangs
def test_a_fifo_or_a_diverged_checkpoint_is_one_line_and_nothing_is_written(
    small_corpus, tmp_path, capsys
):
    # --resume auto finds a FIFO as the newest checkpoint of its log_dir; --resume and
    # --init_from name a FIFO, or a checkpoint with a NaN among its weights
    run = tmp_path / "run"
    train(small_corpus, run, max_steps=4, ckpt_interval=4)
    ckpt = checkpoint(run, 4)
    ckpt["model"]["transformer.h.1.mlp.c_fc.weight"][3, 5] = math.nan
    harness.save_checkpoint(tmp_path / "nan.pt", ckpt)
    os.mkfifo(tmp_path / "fifo.pt")
    os.mkfifo(run / "model_00012.pt")
    before = file_bytes(run)
    diverged = "nan.pt holds non-finite weights (first: transformer.h.1.mlp.c_fc.weight): its run"
    cases = [
        (
            run,
            "auto",
            "cannot read checkpoint ",
            "model_00012.pt (not a regular file): move it out",
        ),
        (tmp_path / "new", tmp_path / "fifo.pt", "cannot read checkpoint ", "fifo.pt (not a"),
        (tmp_path / "new", tmp_path / "nan.pt", "", diverged),
    ]
    for log_dir, resume, prefix, message in cases:
        for flag in ["--resume", "--init_from"] if resume != "auto" else ["--resume"]:
            argv = tiny_flags(small_corpus, log_dir, max_steps=8) + [flag, resume]
            returncode, err = run_main(train_gpt2.main, argv, capsys)
            one_line_error(returncode, err, "train_gpt2.py", message)
            assert err.startswith(f"train_gpt2.py: error: {prefix}")
    assert file_bytes(run) == before and not (tmp_path / "new").exists()


def test_a_resume_applies_this_runs_optimizer_settings(small_corpus, tmp_path):
    # Resumed with other settings, the optimizers' hyper-parameters and the LR are what a new
    # run with those settings has, whatever the optimizer (AdamW, Muon, a fork's Lion).
    train(small_corpus, tmp_path / "a", max_steps=12, ckpt_interval=6)
    settings = dict(weight_decay=0.3, beta2=0.9, max_lr=1e-3, grad_clip=0.5)
    source = tmp_path / "a" / "model_00006.pt"
    train(small_corpus, tmp_path / "b", max_steps=12, ckpt_interval=6, resume=source, **settings)
    train(small_corpus, tmp_path / "c", max_steps=12, ckpt_interval=6, **settings)

    def hyper_parameters(run):
        groups = [g for opt in checkpoint(run, 12)["optimizers"] for g in opt["param_groups"]]
        return [{k: v for k, v in g.items() if k not in ("lr", "params")} for g in groups]

    assert hyper_parameters(tmp_path / "b") == hyper_parameters(tmp_path / "c")
    assert hyper_parameters(tmp_path / "b") != hyper_parameters(tmp_path / "a")
    resumed = read_log(tmp_path / "b")["lr"]
    new = read_log(tmp_path / "c")["lr"]
    assert all(resumed[step] == new[step] for step in range(6, 12))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(batch_size=2, total_batch_size=64), "--batch_size was 4"),
        (dict(shuffle=True), "--shuffle was False"),
        (dict(n_embd=64), "its model's n_embd is 32, this one's 64"),
        (dict(max_steps=5), "past --max_steps"),
    ],
)
def test_a_resume_that_would_not_continue_the_run_is_refused(
    small_corpus, tmp_path, change, message
):
    train(small_corpus, tmp_path / "a", max_steps=6)
    source = tmp_path / "a" / "model_00006.pt"
    with pytest.raises(ValueError, match=message):
        train(small_corpus, tmp_path / "b", resume=source, **{"max_steps": 12, **change})


def test_resuming_after_an_edit_of_the_model_is_one_line(
    small_corpus, tmp_path, monkeypatch, capsys
):
    # a checkpoint of the model before an edit that keeps its config (a new weight, as RoPE or
    # a gate would add): --resume auto says so in one line, not load_state_dict's traceback
    train(small_corpus, tmp_path, max_steps=2)
    build = train_gpt2.GPT.__init__

    def edited(self, config):
        build(self, config)
        self.gate = torch.nn.Parameter(torch.zeros(1))

    monkeypatch.setattr(train_gpt2.GPT, "__init__", edited)
    argv = tiny_flags(small_corpus, tmp_path, max_steps=4, resume="auto")
    message = "its weights are not this model's (gate differs; was the model edited since?)"
    one_line_error(*run_main(train_gpt2.main, argv, capsys), "train_gpt2.py", message)
    # and so for sample.py, hellaswag.py, export_hf.py and --init_from, which load_model serves
    message = "model_00002.pt holds another model than this code builds (gate differs; was the"
    message += " model edited since?): use it with the code that made it (its run's code/ keeps"
    with pytest.raises(ValueError, match=re.escape(message)):
        train_gpt2.load_model(tmp_path / "model_00002.pt")


def untie_the_head(model):
    # its own weights (in a fork whose head is untied: tied again)
    head = model.lm_head.weight
    if head is model.transformer.wte.weight:
        model.lm_head.weight = torch.nn.Parameter(head.detach().clone())
    else:
        model.lm_head.weight = model.transformer.wte.weight


def freeze_a_weight(model):
    list(model.parameters())[-1].requires_grad_(False)


def attention_after_the_mlp(model):
    # the blocks' modules registered in another order
    for block in model.transformer.h:
        attn = block.attn
        del block.attn
        block.attn = attn


@pytest.mark.parametrize("edit", [untie_the_head, freeze_a_weight, attention_after_the_mlp])
def test_resuming_after_an_edit_of_the_parameters_is_one_line(
    small_corpus, tmp_path, monkeypatch, capsys, edit
):
    # An edit that keeps the weights' names and shapes but not the optimizers' parameters (an
    # untied head: lm_head.weight was the token table's other name): their state would go to
    # other parameters. Refused in one line before anything is written; a new run takes the
    # checkpoint's weights.
    train(small_corpus, tmp_path, max_steps=2)
    before = file_bytes(tmp_path)
    build = train_gpt2.GPT.__init__

    def edited(self, config):
        build(self, config)
        edit(self)

    monkeypatch.setattr(train_gpt2.GPT, "__init__", edited)
    argv = tiny_flags(small_corpus, tmp_path, max_steps=4, resume="auto")
    message = "resume: its optimizer state does not fit this model's parameters ("
    one_line_error(*run_main(train_gpt2.main, argv, capsys), "train_gpt2.py", message)
    assert file_bytes(tmp_path) == before
    source = tmp_path / "model_00002.pt"
    train(small_corpus, tmp_path / "new", max_steps=4, init_from=source)


def test_a_checkpoint_without_parameter_names_is_checked_by_their_number(
    small_corpus, tmp_path, monkeypatch
):
    # one written before the optimizers kept their parameters' names: a group's count is checked
    train(small_corpus, tmp_path / "a", max_steps=2)
    ckpt = checkpoint(tmp_path / "a", 2)
    for opt in ckpt["optimizers"]:
        for group in opt["param_groups"]:
            del group["param_names"]
    source = tmp_path / "old.pt"
    harness.save_checkpoint(source, ckpt)
    build = train_gpt2.GPT.__init__

    def edited(self, config):
        build(self, config)
        freeze_a_weight(self)

    monkeypatch.setattr(train_gpt2.GPT, "__init__", edited)
    message = "its optimizer state does not fit this model's parameters (a group of"
    with pytest.raises(ValueError, match=re.escape(message)):
        train(small_corpus, tmp_path / "b", max_steps=4, resume=source)


def gpt2_model(path, **extra):
    # a randomly initialised transformers GPT-2 (GPT-2's vocabulary, one small layer), saved
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_positions=32, n_layer=1, n_head=2, n_embd=32, **extra))
    model.save_pretrained(path)
    return model


def a_wider_mlp(monkeypatch):
    build = train_gpt2.MLP.__init__

    def edited(self, config):
        build(self, config)
        self.c_fc = torch.nn.Linear(config.n_embd, 8 * config.n_embd)
        self.c_proj = torch.nn.Linear(8 * config.n_embd, config.n_embd)

    monkeypatch.setattr(train_gpt2.MLP, "__init__", edited)


@pytest.mark.parametrize("edit", [no_position_table, a_wider_mlp])
def test_init_from_gpt2_into_a_model_that_cannot_take_its_weights_is_one_line(
    gpt2_corpus, tmp_path, monkeypatch, capsys, quiet_transformers, edit
):
    # GPT-2's weights into an edited model that has no place for one of them: the model is said
    # to be edited, naming a weight it and GPT-2 do not share (the first such, in a fork that
    # differs more), not the directory to be other than GPT-2. A directory that is not GPT-2
    # still is.
    gpt2 = gpt2_model(tmp_path / "gpt2").state_dict()
    gpt2_model(tmp_path / "relu", activation_function="relu")
    edit(monkeypatch)
    argv = tiny_flags(gpt2_corpus, tmp_path / "run", max_steps=2, init_from=tmp_path / "gpt2")
    code, err = run_main(train_gpt2.main, argv, capsys)
    message = f"{tmp_path / 'gpt2'}: this edited model cannot take GPT-2's weights ("
    one_line_error(code, err, "train_gpt2.py", message)
    named = re.search(r"GPT-2's weights \((\S+) differs\)", err).group(1)
    config = train_gpt2.GPTConfig(block_size=32, n_layer=1, n_head=2, n_embd=32)
    ours = train_gpt2.GPT(config).state_dict()  # (edited)
    assert named in ours or named in gpt2, named
    if named in ours and named in gpt2:
        theirs = gpt2[named].t() if named.endswith(train_gpt2.HF_TRANSPOSED) else gpt2[named]
        assert ours[named].shape != theirs.shape, named
    argv = tiny_flags(gpt2_corpus, tmp_path / "run", max_steps=2, init_from=tmp_path / "relu")
    message = f"{tmp_path / 'relu'}: not GPT-2"
    one_line_error(*run_main(train_gpt2.main, argv, capsys), "train_gpt2.py", message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("prompt", ["\u20ac", "x" * 16])
def test_a_bad_sample_prompt_is_refused_before_the_run_writes(char_corpus, tmp_path, prompt):
    # a character the data's tokenizer lacks, or no room in the context (seq_len 16) for a token
    with pytest.raises(ValueError, match="^--sample_prompt"):
        train(char_corpus, tmp_path / "run", max_steps=2, sample_interval=2, sample_prompt=prompt)
    assert not (tmp_path / "run").exists()


def test_a_resume_onto_other_data_is_refused(small_corpus, char_corpus, tmp_path):
    train(small_corpus, tmp_path / "a", max_steps=6)
    source = tmp_path / "a" / "model_00006.pt"
    with pytest.raises(ValueError, match="resume: "):
        train(char_corpus, tmp_path / "b", max_steps=12, resume=source)


def test_a_run_never_writes_over_or_prunes_checkpoints_it_does_not_continue(small_corpus, tmp_path):
    runs = tmp_path / "runs"
    train(small_corpus, runs / "other", max_steps=16, ckpt_interval=16)
    later_checkpoint = runs / "other" / "model_00016.pt"
    log_dir = runs / "a"
    train(small_corpus, log_dir, max_steps=12, ckpt_interval=4)
    before = file_bytes(log_dir)
    # a new run: refused, and the line names a free directory
    free = f"{log_dir}-2 is free"
    with pytest.raises(
        ValueError, match=f"holds another run .checkpoints up to model_00012.pt.*{free}"
    ):
        train(small_corpus, log_dir, max_steps=12)
    # an older checkpoint of its own: the later ones would be written over
    with pytest.raises(ValueError, match="up to model_00012.pt, past step 4 .*--resume auto"):
        train(small_corpus, log_dir, max_steps=12, resume=log_dir / "model_00004.pt")
    # another run's checkpoint, even from a later step: --keep_last would delete this run's
    with pytest.raises(ValueError, match="holds another run"):
        train(small_corpus, log_dir, max_steps=20, keep_last=1, resume=later_checkpoint)
    assert file_bytes(log_dir) == before
    # the same checkpoint into a new log_dir branches off cleanly, the old one untouched
    train(small_corpus, f"{log_dir}-2", resume=log_dir / "model_00004.pt", max_steps=12)
    assert file_bytes(log_dir) == before


def test_a_new_run_is_refused_where_another_logged_and_a_failed_start_leaves_nothing(
    small_corpus, tmp_path
):
    # a run killed before its first checkpoint left only its log: a new run does not append to
    # it (plot.py would take it for a resume); --resume auto starts that run again
    log_dir = tmp_path / "a"
    train(small_corpus, log_dir, max_steps=2, ckpt_interval=0)
    for path in log_dir.glob("model_*.pt"):
        path.unlink()
    (tmp_path / "a-2").mkdir()  # taken: the next free name is a-3
    with pytest.raises(ValueError, match=f"holds another run .log.txt.*{tmp_path / 'a-3'} is free"):
        train(small_corpus, log_dir, max_steps=2)
    train(small_corpus, log_dir, max_steps=2, resume="auto")
    # a start that fails makes no directory
    with pytest.raises(ValueError, match="no shards"):
        train(tmp_path / "no-data", tmp_path / "new" / "log", max_steps=2)
    assert not (tmp_path / "new").exists()


def test_a_run_draws_its_curves_unless_told_not_to(small_corpus, tmp_path):
    # (the tests' runs draw none: matplotlib takes seconds a picture on a small CPU)
    train(small_corpus, tmp_path / "drawn", max_steps=2, curves=True)
    assert (tmp_path / "drawn" / "curves.png").read_bytes().startswith(b"\x89PNG")
    train(small_corpus, tmp_path / "not", max_steps=2, curves=False)
    assert not (tmp_path / "not" / "curves.png").exists()


def test_each_start_records_its_config_code_versions_and_device(small_corpus, tmp_path):
    train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2)
    (tmp_path / "model_00004.pt").unlink()
    train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2, resume="auto")
    lines = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    runs = [line for line in lines if "result" not in line]
    assert [r["step"] for r in runs] == [0, 2]
    assert runs[1]["resumed_from"].endswith("model_00002.pt")
    assert runs[0]["config"]["max_steps"] == 4 and runs[0]["data"]["dataset"] == "local"
    assert runs[0]["model"] == checkpoint(tmp_path, 2)["model_config"]
    assert runs[0]["device"] == "cpu" and runs[0]["versions"]["torch"] == torch.__version__
    # the source of every module of the checkout it imported, kept once for both starts
    assert runs[0]["code"] == runs[1]["code"]
    for name in ("train_gpt2.py", "harness.py", "fineweb.py", "plot.py", "hellaswag_eval.py"):
        assert (tmp_path / runs[0]["code"][name]).read_bytes() == (ROOT / name).read_bytes()
    if runs[0]["git"] is not None:  # a git checkout: its commit, and its diff if any
        assert len(runs[0]["git"]["commit"]) == 40


def test_a_torn_log_line_is_not_joined_to_the_next_record(small_corpus, tmp_path):
    train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2)
    (tmp_path / "model_00004.pt").unlink()
    with open(tmp_path / "log.txt", "a") as f:
        f.write("3 tra")  # a full disk, or a kill, mid-line
    with open(tmp_path / "runs.jsonl", "a") as f:
        f.write('{"step": 9')
    train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2, resume="auto")
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert "3 tra" in lines
    assert all(len(line.split()) == 3 for line in lines if line != "3 tra")
    records = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert json.loads(records[-2])["step"] == 2 and "result" in json.loads(records[-1])


def test_keep_last_prunes_only_this_log_dirs_older_checkpoints(small_corpus, tmp_path):
    train(small_corpus, tmp_path / "a", max_steps=4, ckpt_interval=2)
    source = tmp_path / "a" / "model_00002.pt"
    train(small_corpus, tmp_path / "b", max_steps=12, ckpt_interval=2, keep_last=2, resume=source)
    assert [s for s, _ in harness.find_checkpoints(tmp_path / "b")] == [10, 12]
    assert source.exists()


def poisoned_forward(monkeypatch, step, factor):
    # multiply the loss of every training forward of one step (of a new run) by `factor`,
    # however many micro-steps a step has: the step in progress is the one after the last whose
    # train loss was reported
    done = {"steps": 0}
    report = harness.Metrics.report
    forward = train_gpt2.GPT.forward

    def counting(self, step_reported, **values):
        if "train" in values:
            done["steps"] = step_reported + 1
        return report(self, step_reported, **values)

    def poisoned(self, *args, **kwargs):
        logits, loss = forward(self, *args, **kwargs)
        if torch.is_grad_enabled() and loss is not None and done["steps"] == step:
            loss = loss * factor
        return logits, loss

    monkeypatch.setattr(harness.Metrics, "report", counting)
    monkeypatch.setattr(train_gpt2.GPT, "forward", poisoned)


def test_a_non_finite_loss_stops_the_run_or_is_skipped(small_corpus, tmp_path, monkeypatch):
    poisoned_forward(monkeypatch, 5, math.nan)
    with pytest.raises(ValueError, match="non-finite loss nan .* at step 5"):
        train(small_corpus, tmp_path / "a", max_steps=8)
    monkeypatch.undo()
    poisoned_forward(monkeypatch, 5, math.nan)
    train(small_corpus, tmp_path / "b", max_steps=8, skip_nonfinite=True)
    log = read_log(tmp_path / "b")
    assert math.isnan(log["train"][5]) and all(math.isfinite(log["train"][s]) for s in (6, 7))


def test_the_spike_guard_skips_an_outlying_update(small_corpus, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    train(small_corpus, clean, max_steps=24, ckpt_interval=20, skip_spikes=4.0)
    # each step's z-score is logged once 16 updates are known; none of them is a spike
    z_clean = read_log(clean)["spike"]
    assert min(z_clean) == 16 and max(z_clean.values()) < 4.0
    poisoned_forward(monkeypatch, 20, 1e4)
    spiked = tmp_path / "spiked"
    train(small_corpus, spiked, max_steps=24, ckpt_interval=21, skip_spikes=4.0)
    z = read_log(spiked)["spike"]
    assert [s for s, value in z.items() if value > 4.0] == [20]
    # step 20's update was skipped: after it, the weights are those from before it
    before = checkpoint(clean, 20)["model"]
    after = checkpoint(spiked, 21)["model"]
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_bits_per_byte_match_an_independent_count(small_corpus, tmp_path):
    train(small_corpus, tmp_path, max_steps=6)
    log = read_log(tmp_path)
    manifest = json.loads((small_corpus / "manifest.json").read_text())
    enc = fineweb.tokenizer_from_manifest(manifest)
    val = [s for s in manifest["shards"] if s["split"] == "val"][0]
    tokens = torch.from_numpy(np.load(small_corpus / val["file"]).astype("int64"))
    # the targets of val_tokens (128) from the start of the val split, as UTF-8
    text_bytes = len(enc.decode(tokens[1:129].tolist()).encode("utf-8"))
    # (log.txt keeps 6 significant digits)
    expected = log["val"][6] * 128 / (math.log(2) * text_bytes)
    assert log["bpb"][6] == pytest.approx(expected, rel=1e-5)


def test_samples_are_printed_from_the_prompt(small_corpus, tmp_path):
    _, lines = train(small_corpus, tmp_path, max_steps=2, sample_interval=2, sample_prompt="Do")
    samples = [line for line in lines if line.startswith("sample ")]
    assert len(samples) == 8 and all(line.split(": ", 1)[1].startswith("Do") for line in samples)


def test_init_from_a_checkpoint_starts_a_new_run_from_its_weights(small_corpus, tmp_path):
    train(small_corpus, tmp_path / "a", max_steps=6)
    source = tmp_path / "a" / "model_00006.pt"
    # (its shape is the checkpoint's: --n_layer 5 is not applied)
    _, lines = train(small_corpus, tmp_path / "b", max_steps=3, init_from=source, n_layer=5)
    assert f"note: --init_from {source} brings its own n_layer 2 (not the flags')" in lines
    assert read_log(tmp_path / "b")["val"][0] == pytest.approx(read_log(tmp_path / "a")["val"][6])
    assert checkpoint(tmp_path / "b", 3)["step"] == 3
    # runs.jsonl records the model as built, and plot.py compares that
    record = json.loads((tmp_path / "b" / "runs.jsonl").read_text().splitlines()[0])
    assert record["config"]["n_layer"] == 5 and record["model"]["n_layer"] == 2
    runs = [plot.read_run(tmp_path / name) for name in "ab"]
    differences = plot.config_differences(*runs)
    assert "max_steps: 6 -> 3" in differences and not any("n_layer" in d for d in differences)


def test_a_shuffled_checkpoint_of_the_window_order_is_not_resumed_as_rows(small_corpus, tmp_path):
    # before rows were drawn each on its own, a shuffled run's loader counted windows of B x T:
    # its place in the data means another place now
    train(small_corpus, tmp_path / "a", max_steps=2, shuffle=True)
    ckpt = checkpoint(tmp_path / "a", 2)
    del ckpt["loader"]["order"]
    harness.save_checkpoint(tmp_path / "old.pt", ckpt)
    with pytest.raises(ValueError, match="its shuffled data order is an older train_gpt2.py's"):
        train(small_corpus, tmp_path / "b", max_steps=4, shuffle=True, resume=tmp_path / "old.pt")


def test_a_checkpoint_of_the_previous_version_still_gives_its_weights(small_corpus, tmp_path):
    # its model_config held a bias flag, and it had no optimizers/loader in this form: its
    # weights still load (sample.py, export_hf.py, --init_from), its resume is refused
    train(small_corpus, tmp_path / "a", max_steps=2)
    ckpt = checkpoint(tmp_path / "a", 2)
    old = {key: ckpt[key] for key in ("model", "step", "train_config")}
    old["tokenizer"] = ckpt["data"]["tokenizer"]
    old.update(model_config={**ckpt["model_config"], "bias": True}, data={"fingerprint": "x"})
    path = tmp_path / "old.pt"
    harness.save_checkpoint(path, old)
    model, enc = train_gpt2.load_model(path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ckpt["model"].items())
    with pytest.raises(ValueError, match="resume: "):
        train(small_corpus, tmp_path / "b", max_steps=4, resume=path)
    train(small_corpus, tmp_path / "c", max_steps=2, init_from=path)


def test_a_metric_is_logged_to_6_digits_and_a_count_exactly(tmp_path):
    lines = []
    metrics = harness.Metrics(tmp_path, 19073, 0, None, lines.append)
    metrics.report(1233, val=3.14159265, tokens=646971392)
    assert lines == ["step  1233/19073 | val 3.14159 | tokens 646971392"]
    assert (tmp_path / "log.txt").read_text() == "1233 val 3.14159\n1233 tokens 646971392\n"


def test_wandb_gets_every_metric_and_a_resume_continues_its_run(
    small_corpus, tmp_path, monkeypatch
):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # what the run hands to wandb's own Run.log (which then writes it)
    handed = []
    log = wandb.Run.log

    def recorded(self, data, step=None, commit=None):
        handed.extend((step, kind, value) for kind, value in data.items())
        return log(self, data, step=step, commit=commit)

    monkeypatch.setattr(wandb.Run, "log", recorded)
    run = tmp_path / "run"
    train(small_corpus, run, max_steps=6, ckpt_interval=3, wandb_project="test")
    # every metric of log.txt, at its step (log.txt keeps 6 significant digits)
    logged = [line.split() for line in (run / "log.txt").read_text().splitlines()]
    assert [(int(step), kind) for step, kind, _ in logged] == [(s, k) for s, k, _ in handed]
    assert all(float(v) == pytest.approx(h[2], rel=1e-5) for (*_, v), h in zip(logged, handed))
    wandb_id = checkpoint(run, 6)["wandb_id"]
    (run / "model_00006.pt").unlink()
    train(small_corpus, run, max_steps=6, ckpt_interval=3, wandb_project="test", resume="auto")
    assert checkpoint(run, 6)["wandb_id"] == wandb_id
    offline = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and all(d.name.endswith(wandb_id) for d in offline)


# ---------------------------------------------------------------------------------------------
# Real processes: stop signals, kills, DDP, the command line


def train_steps(log_dir):
    path = Path(log_dir) / "log.txt"
    return path.read_text().count(" train ") if path.exists() else 0


def stopped_with_a_checkpoint(log_dir, sig, proc):
    """A run that sig stopped: exit 0, no traceback, a checkpoint after its last step, and the
    command that continues it; returns that command."""
    returncode, out, err = finish(proc)
    assert returncode == 0, err
    assert "Traceback" not in err
    last = max(read_log(log_dir)["train"])
    assert [s for s, _ in harness.find_checkpoints(log_dir)] == [last + 1]
    assert f"stopped at step {last + 1}" in out
    assert f"{sig}: the run stops at the end of this step" in out
    return shlex.split(out.split("to continue: ")[1].splitlines()[0])


# SIGTERM: the test after this one; SIGINT as Ctrl-C sends it, to the whole process group (to the
# trainer alone, `kill -INT`, it takes the same path)
@pytest.mark.parametrize("sig", ["SIGHUP", "SIGUSR1", "SIGINT-group"])
def test_a_stop_signal_ends_the_run_with_a_checkpoint_and_exit_0(char_corpus, tmp_path, sig):
    group = sig.endswith("-group")
    signum = getattr(signal, sig.removesuffix("-group"))
    args = tiny_flags(char_corpus, tmp_path, max_steps=10**5, ckpt_interval=0)
    proc = start("train_gpt2.py", args, start_new_session=group)
    wait_for(lambda: train_steps(tmp_path) >= 3, proc)
    # sent twice: a second request changes nothing; Ctrl-C reaches the whole process group
    for _ in range(2):
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    command = stopped_with_a_checkpoint(tmp_path, sig.removesuffix("-group"), proc)
    assert command[-2:] == ["--resume", "auto"]


def test_sigterm_ends_the_run_and_the_printed_command_continues_it(char_corpus, tmp_path):
    log_dir = tmp_path / "a log dir with 'quotes' and spaces"
    args = tiny_flags(char_corpus, log_dir, max_steps=10**5, ckpt_interval=0)
    proc = start("train_gpt2.py", args)
    wait_for(lambda: train_steps(log_dir) >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    command = stopped_with_a_checkpoint(log_dir, "SIGTERM", proc)
    assert command[2:] == args + ["--resume", "auto"]
    stopped_at = harness.find_checkpoints(log_dir)[-1][0]
    # continued, its own command names --resume once, with the same flags
    assert harness.continue_command(command[2:], ROOT / "train_gpt2.py") == shlex.join(command)
    again = start("train_gpt2.py", command[2:])
    wait_for(lambda: len((log_dir / "runs.jsonl").read_text().splitlines()) == 2, again)
    wait_for(lambda: max(read_log(log_dir)["train"]) > stopped_at + 2, again)
    again.send_signal(signal.SIGTERM)
    assert finish(again)[0] == 0
    assert harness.find_checkpoints(log_dir)[-1][0] > stopped_at


def test_stop_requests_at_any_moment_leave_whole_checkpoints(small_corpus, tmp_path):
    # SIGTERM every 0.3 s from a moment in the run (torch's import, set-up, steps, the final
    # save, after it): during the run it stops with a checkpoint and exit 0; before training
    # starts or after it ends, the signal's default action ends the program. Either way every
    # checkpoint left is whole and nothing half-written remains.
    for i, delay in enumerate([0.5, 1.5, 3.0, 4.5]):
        log_dir = tmp_path / str(i)
        args = tiny_flags(small_corpus, log_dir, max_steps=40, ckpt_interval=5)
        proc = start("train_gpt2.py", args)
        time.sleep(delay)
        while proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        returncode, _, err = finish(proc)
        assert returncode in (0, -signal.SIGTERM), err
        assert "Traceback" not in err
        for _, path in harness.find_checkpoints(log_dir):
            assert harness.is_whole(path)
        assert not list(log_dir.glob(".*.tmp*")), "a temporary file was left"


def test_kill_9_resumes_from_the_last_whole_checkpoint(small_corpus, tmp_path):
    straight = tmp_path / "straight"
    train(small_corpus, straight, max_steps=40, ckpt_interval=4)
    killed = tmp_path / "killed"
    proc = start("train_gpt2.py", tiny_flags(small_corpus, killed, max_steps=40, ckpt_interval=4))
    wait_for(lambda: (killed / "model_00012.pt").exists(), proc)
    proc.kill()
    proc.wait()
    assert not (killed / "model_00040.pt").exists(), "finished before the kill"
    train(small_corpus, killed, max_steps=40, ckpt_interval=4, resume="auto")
    assert_same_state(checkpoint(straight, 40), checkpoint(killed, 40))


def compilers(pids):
    names = []
    for pid in pids:
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    return [n for n in names if n in ("cc1plus", "g++", "gcc", "c++", "cc", "ld", "as")]


@pytest.mark.slow
def test_sigterm_while_compiling_stops_after_the_step_and_the_resume_under_torchrun_is_eager(
    small_corpus, tmp_path
):
    # The one compile test (a cold compile takes tens of seconds on a CPU). SLURM's SIGTERM (and
    # Ctrl-C's SIGINT) reaches the whole process group: the trainer and the processes
    # torch.compile starts (the C++ compiler; on a GPU machine its workers too, which inherit
    # the same blocked signals). The compile and the step finish, a checkpoint of step 1 is
    # written, exit 0, no traceback. --resume auto then continues it on the GPU's path:
    # torchrun, DDP (gloo, one rank), torch.compile (inductor) of the wrapped model, every
    # loss (train and val) the eager run's.
    # (an empty cache: a cold compile; no worker pool to start: the compilers run from the
    # trainer's process; scalar C++ kernels, which compile in three quarters of the time of
    # vectorised ones: a GPU compiles Triton kernels, neither of these)
    cache = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env = child_env(TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_VEC_ISA_OK="0", **cache)
    log_dir = tmp_path / "compiled"
    # no val pass before step 0: the first compile is the training step's
    args = tiny_flags(small_corpus, log_dir, compile="true", max_steps=4, eval_interval=0)
    proc = start("train_gpt2.py", args, env, start_new_session=True)
    # the moment a C++ compiler runs (killing it halfway is what the stop signals must not do)
    wait_for(lambda: compilers(descendants(proc.pid)), proc, timeout=300)
    assert train_steps(log_dir) == 0, "step 0 ended before the signal: nothing was tested"
    os.killpg(proc.pid, signal.SIGTERM)
    returncode, out, err = finish(proc, timeout=300)
    assert returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "SIGTERM: stopped at step 1" in out
    assert [s for s, _ in harness.find_checkpoints(log_dir)] == [1]

    flags = tiny_flags(small_corpus, log_dir, compile="true", max_steps=4, eval_interval=2)
    returncode, _, err = torchrun([ROOT / "train_gpt2.py", *flags, "--resume", "auto"], 1, env)
    assert returncode == 0, err[-3000:]
    assert [s for s, _ in harness.find_checkpoints(log_dir)] == [1, 4]
    train(small_corpus, tmp_path / "eager", max_steps=4, eval_interval=2)
    eager = read_log(tmp_path / "eager")
    compiled = read_log(log_dir)
    assert sorted(compiled["train"]) == [0, 1, 2, 3] and sorted(compiled["val"]) == [2, 4]
    for kind in ("train", "val"):
        for step, value in compiled[kind].items():
            assert value == pytest.approx(eager[kind][step], abs=1e-4), (kind, step)


def test_a_run_started_with_nohup_trains_through_hangups(small_corpus, tmp_path):
    # nohup starts it with SIGHUP ignored: a closed terminal never ends the run
    nohup = [shutil.which("nohup"), sys.executable, str(ROOT / "train_gpt2.py")]
    args = tiny_flags(small_corpus, tmp_path, max_steps=30, ckpt_interval=0)
    proc = subprocess.Popen(nohup + args, cwd=tmp_path, env=child_env(), stdout=subprocess.DEVNULL)
    time.sleep(1)
    proc.send_signal(signal.SIGHUP)  # while torch loads
    wait_for(lambda: train_steps(tmp_path) >= 3, proc)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=120) == 0
    assert max(read_log(tmp_path)["train"]) == 29


@pytest.mark.slow
def test_ddp_over_two_ranks_equals_one_process_and_resumes_bit_exactly(small_corpus, tmp_path):
    # with dropout: its random numbers are each window's, whichever rank reads it; three val
    # batches: rank 0 scores two, rank 1 one, and the val loss is still their mean
    run = dict(max_steps=12, ckpt_interval=6, dropout=0.1, val_tokens=3 * 4 * 16)
    one = tmp_path / "one"
    train(small_corpus, one, **run)

    def two_ranks(log_dir, **overrides):
        flags = tiny_flags(small_corpus, log_dir, **run, **overrides)
        returncode, _, err = torchrun([ROOT / "train_gpt2.py"] + flags)
        assert returncode == 0, err[-3000:]

    two = tmp_path / "two"
    two_ranks(two)
    mine = read_log(two)
    theirs = read_log(one)
    for kind in ("train", "val", "norm"):
        for step, value in theirs[kind].items():
            assert mine[kind][step] == pytest.approx(value, rel=1e-5, abs=1e-6), (kind, step)
    resumed = tmp_path / "resumed"
    two_ranks(resumed, resume=two / "model_00006.pt")
    assert_same_state(checkpoint(two, 12), checkpoint(resumed, 12))


@pytest.mark.slow
def test_a_signal_to_every_process_of_a_torchrun_launch_ends_it_with_exit_0(small_corpus, tmp_path):
    # SLURM's --signal=USR1 reaches every process of a job step. torchrun started with SIGUSR1
    # ignored (docs/cluster.md's command) leaves it to the ranks: they stop after the same step
    # with a checkpoint and exit 0, and so torchrun exits 0 (a clean end for the scheduler)
    launcher = ["bash", "-c", 'trap "" USR1; exec "$@"', "torchrun", sys.executable, "-m"]
    launcher += ["torch.distributed.run", "--standalone", "--local-addr=127.0.0.1"]
    launcher += ["--nproc_per_node=2", ROOT / "train_gpt2.py"]
    args = tiny_flags(small_corpus, tmp_path, max_steps=10**5, ckpt_interval=0)
    proc = start(launcher, args, start_new_session=True)
    wait_for(lambda: train_steps(tmp_path) >= 2, proc)
    for pid in [proc.pid] + descendants(proc.pid):
        os.kill(pid, signal.SIGUSR1)
    returncode, out, err = finish(proc)
    assert returncode == 0, err[-3000:]
    last = max(read_log(tmp_path)["train"])
    assert [s for s, _ in harness.find_checkpoints(tmp_path)] == [last + 1]
    assert "SIGUSR1: stopped at step" in out


# rank 1 starts late; rank 0 says when it begins to wait for it in the rendezvous
LATE_RANK_1 = """
import os, runpy, sys, time

if os.environ["RANK"] == "1":
    time.sleep(600)
import torch.distributed as dist

join = dist.init_process_group


def announce_then_join(*args, **kwargs):
    open(os.environ["WAITING_FILE"], "w").close()
    return join(*args, **kwargs)


dist.init_process_group = announce_then_join
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as python PROGRAM has it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_rank_waiting_for_its_peers_ends_on_sigterm(small_corpus, tmp_path):
    # before the loop a stop signal's default action is right: nothing is written yet. A rank
    # in the rendezvous ends at once, and torchrun ends the launch (no SIGKILL needed)
    program = tmp_path / "late_rank_1.py"
    program.write_text(LATE_RANK_1)
    waiting = tmp_path / "waiting"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    launcher += ["--local-addr=127.0.0.1", "--nproc_per_node=2", program, ROOT / "train_gpt2.py"]
    env = child_env(WAITING_FILE=str(waiting))
    proc = start(launcher, tiny_flags(small_corpus, tmp_path / "log"), env, start_new_session=True)
    wait_for(waiting.exists, proc)
    rank_0 = [
        pid
        for pid in descendants(proc.pid)
        if b"late_rank_1" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    os.kill(min(rank_0), signal.SIGTERM)
    returncode, _, err = finish(proc, timeout=60)
    assert returncode != 0
    assert not (tmp_path / "log").exists()


def test_without_evaluation_the_val_split_may_hold_less_than_a_batch(small_corpus, tmp_path):
    manifest = fineweb.load_corpus(small_corpus)
    val_tokens = sum(s["tokens"] for s in manifest["shards"] if s["split"] == "val")
    B = val_tokens // 16 + 1  # a batch of B x 16 tokens: more than the val split
    sizes = dict(batch_size=B, total_batch_size=B * 16, val_tokens=B * 16, max_steps=2)
    result, _ = train(small_corpus, tmp_path, eval_interval=0, **sizes)
    assert result["step"] == 2 and sorted(read_log(tmp_path)["train"]) == [0, 1]


def test_a_field_whose_default_is_negative_takes_negative_values():
    # a researcher's "-1: off" (an <|endoftext|> id to mask at, say); TrainConfig's own numbers
    # stay >= 0
    field = ("eot_id", int, dataclasses.field(default=-1))
    Fork = dataclasses.make_dataclass(
        "Fork", [field], bases=(train_gpt2.TrainConfig,), kw_only=True
    )
    assert Fork().eot_id == -1 and Fork(eot_id=50256).eot_id == 50256
    with pytest.raises(ValueError, match="--eot_id must be a finite number >= 0, got inf"):
        Fork(eot_id=math.inf)
    with pytest.raises(ValueError, match="--max_steps must be a finite number >= 0, got -1"):
        Fork(max_steps=-1)


BAD_INPUTS = [
    (["--nope", "1"], "unrecognized arguments"),
    (["--max_lr", "nan"], "finite"),
    (["--n_embd", "30", "--n_head", "4"], "multiple of --n_head"),
    (["--n_head", "0"], "--n_head must be > 0"),
    (["--seq_len", "0"], "--seq_len must be > 0"),
    (["--batch_size", "0"], "--batch_size must be > 0"),
    (["--shuffle", "maybe"], "--shuffle"),
    (["--gelu_approximate", "erf"], "--gelu_approximate must be tanh or none"),
    (["--device", "tpu"], "--device"),
    (["--device", "cuda"], "no CUDA"),
    (["--data_root", "no/such/dir"], "fineweb.py"),
    (["--resume", "no/such/model.pt"], "cannot read checkpoint"),
    (["--resume", "{tmp}/foreign.pt"], "not a train_gpt2.py checkpoint"),
    (["--resume", "{tmp}/text.pt"], "damaged, or not a checkpoint"),
    (["--resume", "{tmp}/old.pt"], "an older train_gpt2.py wrote it"),
    (["--init_from", "no/such/model.pt"], "cannot read checkpoint"),
    (["--init_from", "no/such/dir"], "no/such/dir: no such directory"),
    (["--val_tokens", "1280000"], "pass --val_tokens"),
    (["--total_batch_size", "96"], "multiple of --batch_size x --seq_len"),
    (["--total_batch_size", "0"], "--total_batch_size must be > 0"),
    (["--optimizer", "muon", "--muon_lr", "0"], "--optimizer muon needs --muon_lr > 0"),
    (["--n_embd", "1000000", "--n_head", "10"], "does not fit in memory"),
    (["--log_dir", "{tmp}/busy"], "in use by another run (pid "),
    # counts past what any run needs: a typo, refused before anything runs
    (["--total_batch_size", str(2**100)], "--total_batch_size must be below 2**63"),
    (["--total_batch_size", str(2**30)], "micro-batches of --batch_size x --seq_len a step: at"),
    (["--sample_length", "1000000000"], "--sample_length must be at most 2,048 tokens"),
    (["--n_layer", "100000"], "--n_layer must be at most 1,024 (GPT-3 175B has 96)"),
    (["--weight_decay", "1e300"], "AdamW scales the weights by 1 - lr x weight_decay"),
    # a log_dir that cannot be one, and special files where the run writes its records
    (["--log_dir", "{tmp}/text.pt"], "cannot use --log_dir {tmp}/text.pt (File exists"),
    (
        ["--log_dir", "{tmp}/loop/sub"],
        "cannot use --log_dir {tmp}/loop/sub (File exists: {tmp}/loop)",
    ),
    (["--log_dir", "{tmp}/fifo", "--resume", "auto"], "{tmp}/fifo/log.txt is not a regular file"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, small_corpus):
    tmp_path = tmp_path_factory.mktemp("bad")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    (tmp_path / "text.pt").write_text("not a checkpoint")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "log.txt")
    # a checkpoint of the version before the rewrite: its weights, no optimizers or loader
    train(small_corpus, tmp_path / "a", max_steps=1)
    ckpt = checkpoint(tmp_path / "a", 1)
    old = {key: ckpt[key] for key in ("model", "model_config", "step")}
    old["tokenizer"] = ckpt["data"]["tokenizer"]
    harness.save_checkpoint(tmp_path / "old.pt", old)
    # a log_dir another run holds: its lock file names it
    busy = tmp_path / "busy"
    lock, _ = harness.lock_log_dir(busy, print)
    yield tmp_path
    lock.close()


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_that_says_what_to_do(small_corpus, bad_files, capsys, args, message):
    args = [a.format(tmp=bad_files) for a in args]
    argv = tiny_flags(small_corpus, bad_files / "log") + args
    returncode, err = run_main(train_gpt2.main, argv, capsys)
    one_line_error(returncode, err, "train_gpt2.py", message.format(tmp=bad_files))
    assert not (bad_files / "log").exists(), "a failed start left a log_dir"


def flip_a_byte(root):
    shard = sorted(root.glob("*_train_*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))


def truncate_a_shard(root):
    shard = sorted(root.glob("*_train_*.npy"))[0]
    shard.write_bytes(shard.read_bytes()[:-10])


def fifo_for_a_shard(root):
    shard = sorted(root.glob("*_train_*.npy"))[0]
    shard.unlink()
    os.mkfifo(shard)


def damage_the_manifest(root):
    manifest = root / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])


def nanogpt_shards_past_the_vocabulary(root):
    # build-nanogpt's layout: no manifest, read as GPT-2 tokens; one id past GPT-2's 50,257
    for path in list(root.iterdir()):
        if path.is_file():
            path.unlink()
    shutil.rmtree(root / ".fineweb", ignore_errors=True)
    tokens = (np.arange(4000) % 50000).astype("uint16")
    np.save(root / "edufineweb_val_000000.npy", tokens)
    tokens[1234] = 60000
    np.save(root / "edufineweb_train_000001.npy", tokens)


BAD_DATA = [
    (flip_a_byte, "changed since fineweb.py wrote it (its sha256 differs); rerun fineweb.py"),
    (truncate_a_shard, "changed since fineweb.py wrote it ("),
    (fifo_for_a_shard, "not a regular file"),
    (damage_the_manifest, "manifest.json is damaged"),
    (nanogpt_shards_past_the_vocabulary, "holds token id 60000"),
]


@pytest.mark.parametrize("damage, message", BAD_DATA, ids=[d.__name__ for d, _ in BAD_DATA])
def test_data_that_changed_is_found_before_training_reads_it(
    small_corpus, tmp_path, capsys, damage, message
):
    root = tmp_path / "data"
    shutil.copytree(small_corpus, root)
    damage(root)
    argv = tiny_flags(root, tmp_path / "log")
    one_line_error(*run_main(train_gpt2.main, argv, capsys), "train_gpt2.py", message)
    assert not (tmp_path / "log").exists()


def test_shards_without_a_manifest_are_read_as_gpt2_tokens_and_the_run_says_so(
    small_corpus, tmp_path
):
    root = tmp_path / "data"
    shutil.copytree(small_corpus, root)
    (root / "manifest.json").unlink()
    shutil.rmtree(root / ".fineweb")
    _, lines = train(root, tmp_path / "log", max_steps=1, eval_interval=0)
    assert any(line.startswith("note: no manifest.json in") for line in lines), lines


@pytest.mark.parametrize(
    "data, message",
    [(["--hellaswag_data", "no/such.jsonl"], "no/such.jsonl"), ([], "--hellaswag_data FILE")],
    ids=["missing file", "offline, not cached"],
)
def test_hellaswag_data_out_of_reach_is_one_line(gpt2_corpus, tmp_path, capsys, data, message):
    args = tiny_flags(gpt2_corpus, tmp_path / "log") + ["--hellaswag_interval", "5"] + data
    one_line_error(*run_main(train_gpt2.main, args, capsys), "train_gpt2.py", message)


def test_a_bad_flag_is_one_line_from_the_real_program(small_corpus, tmp_path):
    proc = run_program("train_gpt2.py", tiny_flags(small_corpus, tmp_path) + ["--n_head", "0"])
    one_line_error(proc.returncode, proc.stderr, "train_gpt2.py", "--n_head must be > 0")


def test_a_stop_during_the_val_pass_ends_it_early_with_a_checkpoint(
    small_corpus, tmp_path, monkeypatch
):
    # SIGTERM at the start of step 6's val pass (TINY evaluates every 6 steps): the pass ends
    # at its next batch, nothing more is evaluated, and step 6's checkpoint is written
    evaluate = train_gpt2.evaluate_val_loss

    def val_with_a_signal(model, loader, steps, amp, stop):
        if stop is not None and loader is not None and model.training is True:
            os.kill(os.getpid(), signal.SIGTERM)
        return evaluate(model, loader, steps, amp, stop)

    monkeypatch.setattr(train_gpt2, "evaluate_val_loss", val_with_a_signal)
    result, lines = train(small_corpus, tmp_path, max_steps=12, eval_interval=6, ckpt_interval=0)
    assert result["stopped"] and result["step"] == 0
    assert "SIGTERM: the run stops at the end of this step, with a checkpoint" in lines
    assert not (tmp_path / "log.txt").exists() or "val" not in read_log(tmp_path)
    # (at step 0 there is nothing to save; the next start begins again)
    assert harness.find_checkpoints(tmp_path) == []


def test_a_stop_during_a_later_val_pass_checkpoints_that_step(small_corpus, tmp_path, monkeypatch):
    sigterm_at_val_pass(monkeypatch, 2)  # step 6's pass
    result, lines = train(small_corpus, tmp_path, max_steps=12, eval_interval=6, ckpt_interval=0)
    assert result["stopped"] and result["step"] == 6
    assert sorted(read_log(tmp_path)["val"]) == [0]
    assert [s for s, _ in harness.find_checkpoints(tmp_path)] == [6]
    assert f"saved {tmp_path / 'model_00006.pt'}" in lines


def test_resume_auto_says_when_init_from_is_not_applied(small_corpus, tmp_path):
    train(small_corpus, tmp_path / "a", max_steps=2)
    source = tmp_path / "a" / "model_00002.pt"
    train(small_corpus, tmp_path / "b", max_steps=4, ckpt_interval=2, init_from=source)
    (tmp_path / "b" / "model_00004.pt").unlink()
    _, lines = train(small_corpus, tmp_path / "b", max_steps=4, init_from=source, resume="auto")
    assert f"note: --init_from {source} not applied: the run goes on from" in " ".join(lines)


def test_mfu_is_logged_against_the_gpus_peak(small_corpus, tmp_path, monkeypatch):
    # the table: a known GPU's dense bf16 peak; a MIG slice or an unknown GPU: none
    names = {
        "NVIDIA H100 80GB HBM3": 989e12,
        "NVIDIA H100 PCIe": 756e12,
        "NVIDIA A100-SXM4-80GB": 312e12,
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb": None,
        "NVIDIA L40S": 362e12,
        "NVIDIA GeForce RTX 4090": 165e12,
        "Tesla V100-SXM2-16GB": None,
    }
    for name, peak in names.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        assert harness.peak_flops("cuda:0") == peak, name
    assert harness.peak_flops("cpu") is None
    # the loop's MFU: the step's FLOPs over its time and the peak (here a made-up CPU peak)
    monkeypatch.setattr(harness, "peak_flops", lambda device: 1e12)
    train(small_corpus, tmp_path, max_steps=3)
    log = read_log(tmp_path)
    config = train_gpt2.GPTConfig(**checkpoint(tmp_path, 3)["model_config"])
    per_token = train_gpt2.GPT(config).flops_per_token(16)
    for step, mfu in log["mfu"].items():
        assert mfu == pytest.approx(per_token * log["tok_per_s"][step] / 1e12, rel=1e-4)


def import_fork(path, monkeypatch):
    """A researcher's copy of train_gpt2.py, imported in this process as the module it is."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, path.stem, module)
    spec.loader.exec_module(module)
    return module


def test_a_forks_new_field_without_a_comment_is_a_flag(tmp_path, capsys, monkeypatch):
    # a researcher's field, no comment: --help lists it (empty help) and it parses
    source = (ROOT / "train_gpt2.py").read_text()
    anchor = "    wandb_project: str = "
    assert anchor in source
    fork = tmp_path / "my_train.py"
    fork.write_text(source.replace(anchor, "    my_scale: float = 0.5\n" + anchor, 1))
    my_train = import_fork(fork, monkeypatch)
    assert (
        harness.parse_args(["--my_scale", "2"], my_train.TrainConfig, my_train.PRESETS).my_scale
        == 2.0
    )
    with pytest.raises(SystemExit) as exit:
        harness.parse_args(["--help"], my_train.TrainConfig, my_train.PRESETS)
    assert exit.value.code == 0 and "--my_scale" in capsys.readouterr().out


def test_a_forks_field_that_ruff_wraps_keeps_its_comment_as_help(tmp_path, capsys, monkeypatch):
    # A researcher's fields with long comments, laid out by ruff: the value in parentheses with
    # its comment inside them, a comment after the opening parenthesis. Each comment is still
    # its flag's --help.
    source = (ROOT / "train_gpt2.py").read_text()
    anchor = "    wandb_project: str = "
    assert anchor in source
    ema = "decay of the EMA of the weights that val and the samples use (0: no EMA)"
    cap = "logit soft-cap: cap x tanh(logits / cap), as Gemma 2 does (0: no cap at all)"
    fields = f"    ema_decay: float = 0.999  # {ema}\n"
    fields += f"    logit_cap: float = (  # {cap}\n        30.0\n    )\n"
    fork = tmp_path / "my_train.py"
    fork.write_text(source.replace(anchor, fields + anchor, 1))
    config = ["--config", ROOT / "pyproject.toml", "--no-cache"]
    proc = run_program([sys.executable, "-m", "ruff", "format", *config, fork], [])
    assert proc.returncode == 0, proc.stderr
    assert f"    ema_decay: float = (\n        0.999  # {ema}\n    )\n" in fork.read_text()
    # the fork, imported in this process: its --help reads its own source
    my_train = import_fork(fork, monkeypatch)
    with pytest.raises(SystemExit) as exit:
        harness.parse_args(["--help"], my_train.TrainConfig, my_train.PRESETS)
    assert exit.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"--ema_decay EMA_DECAY {ema} (default: 0.999)" in text
    assert f"--logit_cap LOGIT_CAP {cap} (default: 30.0)" in text


def test_a_model_field_added_in_one_place_reaches_the_model_and_its_checkpoints(
    small_corpus, tmp_path, capsys, monkeypatch
):
    # A fork adds one field to ModelConfig and uses it in MLP, nothing else: it is a flag, the
    # trained model has it and its checkpoint loads with it. A checkpoint that predates the
    # field was made at its default: resuming it with another value is refused in one line.
    train(small_corpus, tmp_path / "before", max_steps=2)
    source = (ROOT / "train_gpt2.py").read_text()
    field = "    dropout: float = 0.0  #"
    use = "4 * config.n_embd"
    assert field in source
    if source.count(use) != 2:
        # (a fork that replaced GPT-2's MLP, SwiGLU say: this test's field has no place in it)
        pytest.skip("the field goes into GPT-2's MLP (4 * config.n_embd), which this fork changed")
    source = source.replace(field, "    mlp_ratio: int = 4  # MLP width / n_embd\n" + field, 1)
    fork = tmp_path / "my_train.py"
    fork.write_text(source.replace(use, "config.mlp_ratio * config.n_embd"))
    my_train = import_fork(fork, monkeypatch)
    argv = tiny_flags(small_corpus, tmp_path / "run", max_steps=2) + ["--mlp_ratio", "2"]
    cfg = harness.parse_args(argv, my_train.TrainConfig, my_train.PRESETS)
    my_train.train(cfg, log=lambda line: None)
    model, _ = my_train.load_model(tmp_path / "run" / "model_00002.pt")
    assert model.config.mlp_ratio == 2 and model.transformer.h[0].mlp.c_fc.out_features == 64
    resume = tiny_flags(small_corpus, tmp_path / "before", max_steps=4, resume="auto")
    code, err = run_main(my_train.main, resume + ["--mlp_ratio", "2"], capsys)
    refusal = "resume: its model's mlp_ratio is 4, this one's 2: resume with --mlp_ratio 4, or"
    one_line_error(code, err, "my_train.py", refusal)


def test_a_closed_stdout_ends_the_printing_not_the_run(small_corpus, tmp_path):
    # `train_gpt2.py ... | head -1`: the run goes on to its final checkpoint and exits 0
    command = [sys.executable, str(ROOT / "train_gpt2.py")]
    command += tiny_flags(small_corpus, tmp_path, max_steps=8)
    proc = subprocess.Popen(
        command, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert err == b""
    assert [s for s, _ in harness.find_checkpoints(tmp_path)] == [6, 8]


def test_help_lists_every_flag_and_says_what_auto_means_here(capsys):
    with pytest.raises(SystemExit) as exit:
        train_gpt2.main(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for field in train_gpt2.dataclasses.fields(train_gpt2.TrainConfig):
        assert f"--{field.name}" in out
    assert "On this machine: no CUDA GPU" in " ".join(out.split())


@pytest.mark.parametrize("preset", sorted(train_gpt2.PRESETS))
def test_every_preset_is_a_valid_run(preset):
    cfg = harness.parse_args(["--preset", preset, "--max_steps", "7"], *TRAIN_GPT2)
    assert cfg.max_steps == 7 and cfg.total_batch_size % (cfg.batch_size * cfg.seq_len) == 0
