"""What a run records and how it ends, as the edit-and-rerun loop needs it: the code read at the
start (every module of the checkout it imported; an edit made after the launch is not taken for
the run's), a resume under other code, the result record, tokens and training time, a
time-bounded run, a preset that makes its own data. And the harness around the loop: a branch's
start checkpoint, stop signals once the work is done, Ctrl-C while torch loads, thousands of
shards under a small open-file limit."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    ROOT,
    child_env,
    finish,
    read_log,
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


def records(log_dir):
    """runs.jsonl's lines: (start records, result records)."""
    lines = [json.loads(line) for line in (Path(log_dir) / "runs.jsonl").read_text().splitlines()]
    return [r for r in lines if "result" not in r], [r["result"] for r in lines if "result" in r]


# -----------------------------------------------------------------------------
# the record of the code


# A researcher's launcher in a checkout: it imports a module of their own (which git does not
# track), then runs the trainer, which reads the code first and then makes the preset data: at
# that moment it waits until the test has edited both files, as the next experiment would.
DRIVER = """
import sys
import time
from pathlib import Path

import harness
import mymodule
import train_gpt2

make_data = harness.make_preset_data


def wait_for_the_edit(data_root, preset_data):
    Path("started").touch()
    while not Path("edited").exists():
        time.sleep(0.01)
    make_data(data_root, preset_data)


harness.make_preset_data = wait_for_the_edit
train_gpt2.main(sys.argv[1:])
"""


def git(checkout, *args):
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args]
    subprocess.run(command, cwd=checkout, check=True, capture_output=True)


def test_a_run_keeps_the_code_it_read_at_its_start_of_every_module_it_imported(
    small_corpus, tmp_path
):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    modules = ["train_gpt2.py", "harness.py", "fineweb.py", "hellaswag_eval.py", "plot.py"]
    for name in modules:
        shutil.copy(ROOT / name, checkout)
    (checkout / "mymodule.py").write_text("SCALE = 1.0\n")
    (checkout / "driver.py").write_text(DRIVER)
    git(checkout, "init", "-q")
    git(checkout, "add", *modules)
    git(checkout, "commit", "-q", "-m", "baseline")
    # a user's git config that colours diffs, and an uncommitted edit before the launch
    git(checkout, "config", "color.ui", "always")
    with open(checkout / "hellaswag_eval.py", "a") as f:
        f.write("# an edit before the launch\n")
    original = {p.name: p.read_bytes() for p in checkout.glob("*.py")}

    args = tiny_flags(small_corpus, tmp_path / "a", max_steps=2)
    driver = [sys.executable, checkout / "driver.py"]
    proc = start(driver, args, cwd=checkout)
    wait_for(lambda: (checkout / "started").exists(), proc)
    for name in ("train_gpt2.py", "mymodule.py"):
        with open(checkout / name, "a") as f:
            f.write("# the next experiment's edit, made while this run starts\n")
    (checkout / "edited").touch()
    returncode, _, err = finish(proc)
    assert returncode == 0, err

    [start_record], _ = records(tmp_path / "a")
    code = start_record["code"]
    assert set(code) == set(original), code
    for name, data in original.items():
        assert (tmp_path / "a" / code[name]).read_bytes() == data, name
    git_record = start_record["git"]
    assert git_record["untracked"] == ["driver.py", "mymodule.py"]
    diff = (tmp_path / "a" / git_record["diff"]).read_bytes()
    assert b"+# an edit before the launch" in diff and b"\x1b[" not in diff

    # the next run, launched after the edits: plot.py tells the two apart, module by module
    (checkout / "edited").unlink()
    proc = start(driver, tiny_flags(small_corpus, tmp_path / "b", max_steps=2), cwd=checkout)
    wait_for(lambda: (checkout / "started").exists(), proc)
    (checkout / "edited").touch()
    assert finish(proc)[0] == 0
    runs = [plot.read_run(tmp_path / name) for name in "ab"]
    text = "\n".join(plot.code_differences(*runs))
    assert "same code" not in text
    assert "+# the next experiment's edit" in text
    assert "mymodule" in text and "train_gpt2" in text


def test_the_code_read_is_every_module_of_the_checkout_as_imported(tmp_path, monkeypatch):
    # a checkout holding a package, a virtual environment and a link to a file outside it (kept:
    # it is imported as the checkout's); a link outside it to its package; modules imported
    # through each, and one made in memory
    checkout = tmp_path / "checkout"
    (checkout / "mylib").mkdir(parents=True)
    (checkout / "mylib" / "attn.py").write_text("A = 1\n")
    (checkout / "train_gpt2.py").write_text("B = 2\n")
    (checkout / ".venv" / "lib").mkdir(parents=True)
    (checkout / ".venv" / "lib" / "dep.py").write_text("C = 3\n")
    (tmp_path / "other.py").write_text("D = 4\n")
    (checkout / "other.py").symlink_to(tmp_path / "other.py")
    (tmp_path / "linked").symlink_to(checkout / "mylib")
    monkeypatch.setattr(harness, "ROOT", checkout)
    monkeypatch.setattr(sys, "prefix", str(checkout / ".venv"))
    files = {
        "the_trainer": checkout / "train_gpt2.py",
        "attn": checkout / "mylib" / "attn.py",
        "attn_through_the_link": tmp_path / "linked" / "attn.py",
        "dep": checkout / ".venv" / "lib" / "dep.py",
        "other": checkout / "other.py",
        "in_memory": "mylib/attn.py",
    }
    for name, file in files.items():
        module = types.ModuleType(name)
        module.__file__ = str(file)
        monkeypatch.setitem(sys.modules, name, module)

    found = harness.read_code()
    assert found == {
        "mylib/attn.py": b"A = 1\n",
        "other.py": b"D = 4\n",
        "train_gpt2.py": b"B = 2\n",
    }
    assert list(harness.read_code(known={"train_gpt2.py", "other.py"})) == ["mylib/attn.py"]


# A launcher that imports a module of the checkout that is a link to a file outside it, and
# imports another one first inside the loop (at the second val), both scaling the val loss.
LATE_DRIVER = """
import sys

import linked
import train_gpt2

evaluate = train_gpt2.evaluate_val_loss
calls = []


def evaluate_then_import(*args):
    calls.append(1)
    loss = evaluate(*args)
    if len(calls) >= 2 and loss is not None:
        import late

        loss = loss * late.SCALE * linked.SCALE
    return loss


train_gpt2.evaluate_val_loss = evaluate_then_import
train_gpt2.main(sys.argv[1:])
"""


def test_modules_through_links_and_imported_late_are_code_that_ran(small_corpus, tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ["train_gpt2.py", "harness.py", "fineweb.py", "hellaswag_eval.py", "plot.py"]:
        shutil.copy(ROOT / name, checkout)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "linked.py").write_text("SCALE = 1.0\n")
    (checkout / "linked.py").symlink_to(tmp_path / "outside" / "linked.py")
    (checkout / "late.py").write_text("SCALE = 1.0\n")
    (checkout / "driver.py").write_text(LATE_DRIVER)
    driver = [sys.executable, checkout / "driver.py"]
    log_dir = tmp_path / "run"
    args = tiny_flags(small_corpus, log_dir, max_steps=4, eval_interval=2, ckpt_interval=2)
    returncode, _, err = finish(start(driver, args, cwd=checkout))
    assert returncode == 0, err

    # the linked module kept with its source at the start, the late one at the checkpoint of
    # the step that first imported it, both in the checkpoints' record of the code
    lines = [json.loads(line) for line in (log_dir / "runs.jsonl").read_text().splitlines()]
    code = lines[0]["code"]
    assert (log_dir / code["linked.py"]).read_text() == "SCALE = 1.0\n"
    assert "late.py" not in code
    [added] = [line for line in lines if "code_added" in line]
    assert added["step"] == 2 and list(added["code_added"]) == ["late.py"]
    assert (log_dir / added["code_added"]["late.py"]).read_text() == "SCALE = 1.0\n"
    kept = torch.load(log_dir / "model_00002.pt", weights_only=True)["code"]
    assert {"linked.py", "late.py"} <= kept.keys()

    # both changed before a resume: it says so, though neither is imported yet when it starts
    (tmp_path / "outside" / "linked.py").write_text("SCALE = 2.0\n")
    (checkout / "late.py").write_text("SCALE = 3.0\n")
    (log_dir / "model_00004.pt").unlink()
    proc = start(driver, args + ["--resume", "auto"], cwd=checkout)
    returncode, out, err = finish(proc)
    assert returncode == 0, err
    assert "note: the code differs from" in out and "(late.py, linked.py)" in out
    starts, _ = records(log_dir)
    assert starts[-1]["code_changed"] == ["late.py", "linked.py"]

    # two runs that differ only in the late module (its scale of the val loss): never one arm
    # of "same code" in plot.py's comparison
    (tmp_path / "outside" / "linked.py").write_text("SCALE = 1.0\n")
    for name, scale in [("one", "1.0"), ("two", "2.0")]:
        (checkout / "late.py").write_text(f"SCALE = {scale}\n")
        flags = tiny_flags(small_corpus, tmp_path / name, max_steps=4, eval_interval=2)
        assert finish(start(driver, flags, cwd=checkout))[0] == 0
    compared = run_program("plot.py", [tmp_path / "one", tmp_path / "two", "--json"])
    assert compared.returncode == 0, compared.stderr
    arms = json.loads(compared.stdout)["arms"]
    differs = arms[1]["vs_baseline"]
    assert len(arms) == 2 and "code differs:" in differs and "+SCALE = 2.0" in differs


def test_a_resume_under_other_code_goes_on_and_records_the_step(small_corpus, tmp_path):
    train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2)
    (tmp_path / "model_00004.pt").unlink()
    # the checkpoint as another train_gpt2.py wrote it (a logging fix made mid-run, say)
    path = tmp_path / "model_00002.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["code"]["train_gpt2.py"] = "code/train_gpt2-000000000000.py"
    harness.save_checkpoint(path, ckpt)
    result, lines = train(small_corpus, tmp_path, max_steps=4, ckpt_interval=2, resume="auto")
    assert not result["stopped"] and result["step"] == 4
    note = f"note: the code differs from {path}'s (train_gpt2.py): the run goes on"
    assert any(line.startswith(note) for line in lines), lines
    starts, _ = records(tmp_path)
    assert [r["step"] for r in starts] == [0, 2]
    assert "code_changed" not in starts[0] and starts[1]["code_changed"] == ["train_gpt2.py"]


# -----------------------------------------------------------------------------
# tokens, training time and the result


def test_the_result_record_holds_log_txts_last_values(small_corpus, tmp_path, monkeypatch):
    result, lines = train(small_corpus, tmp_path / "done", max_steps=12)
    log = read_log(tmp_path / "done")
    # every step logs the tokens and training seconds so far
    assert log["tokens"] == {s: (s + 1) * 128 for s in range(12)}
    times = [log["time"][s] for s in range(12)]
    assert 0 < times[0] and times == sorted(times)
    _, [record] = records(tmp_path / "done")
    assert record["status"] == "finished" and record["steps"] == 12
    assert record["peak_memory_gb"] > 0
    for kind in ("tokens", "time", "val", "bpb", "train"):
        assert record[kind] == log[kind][max(log[kind])], kind
    assert record["hella"] is None
    # one summary line, the last
    assert lines[-1].startswith("finished at step 12: tokens 1536 | time ")

    # stopped (a signal during step 6's val pass): its result too, and the resume's after it
    sigterm_at_val_pass(monkeypatch, 2)
    train(small_corpus, tmp_path / "stopped", max_steps=12, ckpt_interval=0)
    _, [record] = records(tmp_path / "stopped")
    log = read_log(tmp_path / "stopped")
    assert record["status"] == "stopped" and record["steps"] == 6
    assert record["tokens"] == 6 * 128 and record["val"] == log["val"][0]
    monkeypatch.undo()
    train(small_corpus, tmp_path / "stopped", max_steps=12, ckpt_interval=0, resume="auto")
    _, results = records(tmp_path / "stopped")
    assert [r["status"] for r in results] == ["stopped", "finished"]
    assert results[1]["tokens"] == 12 * 128 and results[1]["time"] > results[0]["time"]


def test_plot_counts_only_the_finished_runs_of_the_trainer_once_a_seed(
    small_corpus, tmp_path, monkeypatch
):
    # Runs of the real loop: two arms of seeds 1 and 2; in the base arm, seed 2 stopped by a
    # SIGTERM during its second val pass, and seed 1 run again into the free log_dir a refusal
    # offers. plot.py (a real process) compares the finished seeds, each once, and names the
    # others; with the arms named by hand, the same.
    run = dict(max_steps=8, eval_interval=4)
    for seed in (1, 2):
        train(small_corpus, tmp_path / f"edit-{seed}", seed=seed, max_lr=2e-3, **run)
    train(small_corpus, tmp_path / "base-1", seed=1, **run)
    train(small_corpus, tmp_path / "base-1-2", seed=1, **run)
    sigterm_at_val_pass(monkeypatch, 2)
    train(small_corpus, tmp_path / "base-2", seed=2, **run)
    monkeypatch.undo()
    base = [tmp_path / name for name in ("base-1", "base-2", "base-1-2")]
    edit = [tmp_path / "edit-1", tmp_path / "edit-2"]
    for args in ([*base, *edit], ["--arm", "base", *base, "--arm", "edit", *edit]):
        compared = run_program("plot.py", [*args, "--json"])
        assert compared.returncode == 0, compared.stderr
        arms = json.loads(compared.stdout)["arms"]
        left_out = {Path(r["run"]).name: r["why"] for r in arms[0]["left_out"]}
        assert arms[0]["seeds"] == [1] and arms[1]["seeds"] == [1, 2]
        assert left_out.keys() == {"base-2", "base-1-2"}
        assert "stopped at step 4 of 8" in left_out["base-2"]
        assert "seed 1 again" in left_out["base-1-2"]


def test_a_time_bounded_run_ends_with_its_cosine_finished(small_corpus, tmp_path):
    # 0.5 s of training, far fewer than max_steps: the last step's LR is min_lr, then the final
    # val and checkpoint; a resume with the same budget trains no further
    budget = dict(max_steps=10**6, max_minutes=0.5 / 60, warmup_steps=2, ckpt_interval=0)
    result, _ = train(small_corpus, tmp_path, **budget)
    last = result["step"]
    log = read_log(tmp_path)
    assert 2 < last < 10**6 and not result["stopped"]
    assert max(log["train"]) == last - 1
    assert log["lr"][last - 1] == pytest.approx(3e-4, rel=1e-6)
    # after the warmup the LR follows the cosine down as the training time goes by
    decay = [log["lr"][step] for step in range(2, last)]
    assert decay == sorted(decay, reverse=True) and decay[0] > decay[-1]
    assert log["time"][last - 1] >= 0.5
    assert last in log["val"]
    assert [s for s, _ in harness.find_checkpoints(tmp_path)] == [last]
    again, _ = train(small_corpus, tmp_path, **budget, resume="auto")
    assert again["step"] == last and max(read_log(tmp_path)["train"]) == last - 1
    _, results = records(tmp_path)
    assert [r["status"] for r in results] == ["finished", "finished"]


@pytest.mark.slow
def test_ranks_end_a_time_bounded_run_at_the_same_step(small_corpus, tmp_path):
    # rank 0's clock rides the step's all-reduce: were the ranks to decide apart, one would wait
    # in an all-reduce for the other for good
    args = ["train_gpt2.py"] + tiny_flags(
        small_corpus, tmp_path, max_steps=10**6, max_minutes=0.02, ckpt_interval=0
    )
    returncode, out, err = torchrun(args, timeout=180)
    assert returncode == 0, err[-3000:]
    log = read_log(tmp_path)
    last = max(log["train"])
    assert log["lr"][last] == pytest.approx(3e-4, rel=1e-6)
    assert [s for s, _ in harness.find_checkpoints(tmp_path)] == [last + 1]


# -----------------------------------------------------------------------------
# a preset makes its own data


def test_a_presets_first_run_makes_its_data_as_the_readme_command_does(tmp_path):
    # two runs of the quick start at once, from a fresh clone's directory: both go on, one
    # corpus is made, the same bytes as the documented fineweb.py command's
    make = "import harness, train_gpt2\n"
    make += "harness.make_preset_data('data/shakespeare_char', train_gpt2.PRESET_DATA)"
    env = child_env(PYTHONPATH=str(ROOT))
    procs = [start([sys.executable, "-c", make], cwd=tmp_path, env=env) for _ in range(2)]
    for proc in procs:
        returncode, _, err = finish(proc)
        assert returncode == 0, err
    fineweb.main(
        [
            "--local",
            str(ROOT / "input.txt"),
            "--tokenizer",
            "char",
            "--out_dir",
            str(tmp_path / "readme"),
        ]
    )
    made = fineweb.load_corpus(tmp_path / "data" / "shakespeare_char")
    readme = fineweb.load_corpus(tmp_path / "readme")
    assert made["fingerprint"] == readme["fingerprint"]
    for shard in readme["shards"]:
        made_shard = tmp_path / "data" / "shakespeare_char" / shard["file"]
        assert made_shard.read_bytes() == (tmp_path / "readme" / shard["file"]).read_bytes()


# -----------------------------------------------------------------------------
# the harness: a branch, the end of a job, Ctrl-C while torch loads, many shards


def test_a_branch_stopped_or_killed_before_its_first_checkpoint_continues_as_a_branch(
    small_corpus, tmp_path, monkeypatch
):
    train(small_corpus, tmp_path / "a", max_steps=4, ckpt_interval=2)
    source = tmp_path / "a" / "model_00002.pt"
    # killed as soon as its record exists
    args = tiny_flags(small_corpus, tmp_path / "b", max_steps=8, resume=source)
    proc = start("train_gpt2.py", args)
    wait_for(lambda: (tmp_path / "b" / "runs.jsonl").exists(), proc)
    proc.kill()
    finish(proc)
    # stopped during its first val pass, before any step
    sigterm_at_val_pass(monkeypatch, 1)
    result, _ = train(small_corpus, tmp_path / "c", max_steps=8, eval_interval=2, resume=source)
    assert result["stopped"] and result["step"] == 2
    monkeypatch.undo()
    # either way the log_dir holds the branch's start: --resume auto goes on from step 2, and
    # both end where the branch would have
    for name in "bc":
        _, lines = train(small_corpus, tmp_path / name, max_steps=8, resume="auto")
        assert f"resumed from {tmp_path / name / 'model_00002.pt'} at step 2" in lines
    assert read_log(tmp_path / "b")["val"][8] == read_log(tmp_path / "c")["val"][8]


def test_a_log_dir_link_moved_during_a_run_changes_where_nothing_goes(small_corpus, tmp_path):
    # --log_dir runs/latest, a link to run12; during the run the link moves to run13 (a finished
    # run), as a "latest" pointer moves before the next experiment: every write stays in run12
    runs = tmp_path / "runs"
    train(small_corpus, runs / "run13", max_steps=2)
    finished = {p: p.read_bytes() for p in (runs / "run13").rglob("*") if p.is_file()}
    (runs / "run12").mkdir()
    (runs / "latest").symlink_to("run12")
    args = tiny_flags(small_corpus, runs / "latest", max_steps=40, ckpt_interval=2)
    proc = start("train_gpt2.py", args)
    wait_for(lambda: (runs / "run12" / "model_00002.pt").exists(), proc)
    (runs / "moved").symlink_to("run13")
    os.replace(runs / "moved", runs / "latest")
    returncode, _, err = finish(proc)
    assert returncode == 0, err
    assert {p: p.read_bytes() for p in (runs / "run13").rglob("*") if p.is_file()} == finished
    assert max(s for s, _ in harness.find_checkpoints(runs / "run12")) == 40
    _, [result] = records(runs / "run12")
    assert result["status"] == "finished" and result["steps"] == 40


def copy_corpus(corpus, to):
    shutil.copytree(corpus, to)
    for lock in (".lock", fineweb.READERS):
        (to / lock).unlink(missing_ok=True)
    return to


def logged(log_dir, kind):
    """{step: value} of kind in log_dir/log.txt so far ({} before it exists)."""
    if not (Path(log_dir) / "log.txt").exists():
        return {}
    return read_log(log_dir).get(kind, {})


def val_until(args, log_dir, step):
    """train_gpt2.py ARGS as a real process, stopped (SIGTERM) once it has logged val at step."""
    proc = start("train_gpt2.py", args)
    wait_for(lambda: step in logged(log_dir, "val"), proc)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc)[0] == 0
    return {s: v for s, v in logged(log_dir, "val").items() if s <= step}


def test_a_corpus_is_not_remade_under_a_run_and_a_data_root_link_moved_changes_nothing(
    small_corpus, char_corpus, tmp_path
):
    # A run on a --data_root link to corpus a; during it, fineweb.py --overwrite of a with other
    # text is refused (the run holds a) and the link moves to corpus b: the run reads a, as a
    # run that nothing disturbed does.
    a = copy_corpus(small_corpus, tmp_path / "a")
    copy_corpus(char_corpus, tmp_path / "b")
    (tmp_path / "data").symlink_to("a")
    flags = dict(max_steps=10**5, ckpt_interval=0, eval_interval=5)
    run = tmp_path / "run"
    proc = start("train_gpt2.py", tiny_flags(tmp_path / "data", run, **flags))
    wait_for(lambda: logged(run, "train"), proc)
    other = tmp_path / "other.txt"
    other.write_text("Other text entirely, of the same alphabet.\n" * 200)
    remake = ["--local", other, "--tokenizer", "char", "--out_dir", a, "--overwrite"]
    remade = run_program("fineweb.py", remake)
    (tmp_path / "moved").symlink_to("b")
    os.replace(tmp_path / "moved", tmp_path / "data")
    # val scored 10 steps after the move and more
    moved_at = max(logged(run, "train"))
    last = (moved_at // 5 + 3) * 5
    wait_for(lambda: last in logged(run, "val"), proc)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc)[0] == 0
    assert remade.returncode == 1
    assert f"a training run is reading {a}" in remade.stderr
    assert fineweb.load_corpus(a)["fingerprint"] == fineweb.load_corpus(small_corpus)["fingerprint"]
    val = {s: v for s, v in logged(run, "val").items() if s <= last}
    assert val == val_until(tiny_flags(a, tmp_path / "alone", **flags), tmp_path / "alone", last)
    # and once the run has ended, the remake goes through
    assert run_program("fineweb.py", remake).returncode == 0


def test_a_run_does_not_start_on_a_corpus_fineweb_is_changing(small_corpus, tmp_path):
    corpus = copy_corpus(small_corpus, tmp_path / "data")
    changing = fineweb.take_lock(corpus / fineweb.READERS)
    with pytest.raises(ValueError, match=f"fineweb.py is changing {corpus} .*: run again once"):
        train(corpus, tmp_path / "run", max_steps=2)
    changing.close()
    assert not (tmp_path / "run").exists()


def test_a_log_dir_inside_a_corpus_is_refused(small_corpus, tmp_path):
    corpus = copy_corpus(small_corpus, tmp_path / "data")
    with pytest.raises(ValueError, match=f"--log_dir {corpus / 'log'} is in the corpus {corpus}"):
        train(corpus, corpus / "log", max_steps=2)
    assert not (corpus / "log").exists()


def test_a_start_that_fails_leaves_nothing_it_made(small_corpus, tmp_path, monkeypatch):
    # out of memory in the first step: the log_dir it made goes, and the same command with a
    # smaller batch starts clean; in a log_dir with a run that a resume goes on from, only what
    # this start added goes
    train(small_corpus, tmp_path / "old", max_steps=2, ckpt_interval=2)
    before = {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()}
    forward = train_gpt2.GPT.forward

    def forward_then_out_of_memory(self, idx, *args, **kwargs):
        if self.training:
            raise RuntimeError("CPU out of memory: can't allocate memory")
        return forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(train_gpt2.GPT, "forward", forward_then_out_of_memory)
    with pytest.raises(RuntimeError):
        train(small_corpus, tmp_path / "new", max_steps=2)
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError):
        train(small_corpus, tmp_path / "old", max_steps=4, ckpt_interval=2, resume="auto")
    after = {p: p.read_bytes() for p in (tmp_path / "old").rglob("*") if p.is_file()}
    assert after == before
    monkeypatch.undo()
    result, _ = train(small_corpus, tmp_path / "new", max_steps=2)
    assert result["step"] == 2


def test_a_budget_longer_than_the_run_ends_at_min_lr(small_corpus, tmp_path):
    # 1,000 minutes for 12 steps: the schedule decays by the steps, which end first
    train(small_corpus, tmp_path / "budget", max_steps=12, max_minutes=1000)
    train(small_corpus, tmp_path / "steps", max_steps=12)
    lr = read_log(tmp_path / "budget")["lr"]
    assert lr == read_log(tmp_path / "steps")["lr"]
    assert lr[11] == pytest.approx(train_gpt2.get_lr(11, 3e-3, 3e-4, 3, 12), rel=1e-5)
    assert lr[11] < 3e-3 / 2


def test_a_resume_into_another_optimizer_is_refused(small_corpus, tmp_path, capsys):
    # a fork that swapped AdamW for its own Lion (the same parameters and groups)
    train(small_corpus, tmp_path / "run", max_steps=2)
    source = (ROOT / "train_gpt2.py").read_text()
    adamw = "        adamw = torch.optim.AdamW("
    assert adamw in source
    lion = "class Lion(torch.optim.AdamW):\n    pass\n\n\nclass KVCache:"
    source = source.replace("class KVCache:", lion, 1)
    fork = tmp_path / "my_train.py"
    fork.write_text(source.replace(adamw, "        adamw = Lion(", 1))
    args = tiny_flags(small_corpus, tmp_path / "run", max_steps=4, resume="auto")
    proc = run_program([sys.executable, fork], args, env=child_env(PYTHONPATH=str(ROOT)))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "my_train.py: error: resume: its optimizer state is AdamW's, this run's optimizer is"
        " Lion (a new run from its weights: --init_from)"
    )


def test_stop_signals_once_the_run_is_done_leave_exit_status_0(small_corpus, tmp_path):
    # a scheduler's SIGTERM every 20 ms from the moment the final checkpoint exists
    args = tiny_flags(small_corpus, tmp_path, max_steps=6)
    proc = start("train_gpt2.py", args)
    wait_for(lambda: (tmp_path / "model_00006.pt").exists(), proc)
    while proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    returncode, out, err = finish(proc)
    assert returncode == 0, err
    assert "to continue" not in out
    _, [result] = records(tmp_path)
    assert result["status"] == "finished"


def test_ctrl_c_while_torch_loads_is_one_line(small_corpus, tmp_path):
    proc = start("train_gpt2.py", tiny_flags(small_corpus, tmp_path, max_steps=2))
    maps = Path(f"/proc/{proc.pid}/maps")
    wait_for(lambda: "libtorch" in maps.read_text(), proc)
    proc.send_signal(signal.SIGINT)
    returncode, _, err = finish(proc)
    assert returncode == 1
    assert err == "train_gpt2.py: interrupted while loading torch; nothing was written\n"
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_thousands_of_shards_train_under_a_small_open_file_limit(tmp_path):
    # 2,001 shards of 50 GPT-2 tokens (build-nanogpt's layout: no manifest), read shuffled by
    # this process with 256 files open at most: the loader holds open only a pool's (32 at most)
    corpus = tmp_path / "many"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2001):
        split = "val" if i == 0 else "train"
        tokens = rng.integers(0, fineweb.GPT2_VOCAB_SIZE, 50, dtype=np.uint16)
        np.save(corpus / f"shard_{split}_{i:06d}.npy", tokens)

    batch = dict(batch_size=1, seq_len=16, total_batch_size=32, val_tokens=16)
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, limits[1]))
    try:
        result, _ = train(corpus, tmp_path / "log", max_steps=4, shuffle=True, **batch)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    assert result["step"] == 4
