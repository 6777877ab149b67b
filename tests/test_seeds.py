"""The seeds of an experiment: scripts/seeds.sh (one seed of one arm into log/ARM-SEED),
scripts/seeds.sbatch (an arm's seeds as a SLURM array) and docs/cluster.md's commands that run
them ("Seeds of an experiment"). Real runs of tiny models where running is the point: a seed, an
array task stopped and requeued, the interleaved loop ending in plot.py's comparison. The GPU
node and the cluster cannot run here: their commands run with a stand-in python that records
what each would launch, and every launch must be a valid run of its own seed and log_dir."""

import json
import os
import re
import shlex
import shutil
import signal
import sys

import pytest
from conftest import (
    ROOT,
    TINY,
    child_env,
    descendants,
    finish,
    flags,
    run_program,
    start,
    wait_for,
)

import harness
import train_gpt2

SECTION = (ROOT / "docs" / "cluster.md").read_text().split("## Seeds of an experiment")[1]
SECTION = SECTION.split("\n## ")[0]
# the section's commands: one machine, the GPU node, the SLURM cluster
ONE_MACHINE, GPU_NODE, SLURM = re.findall(r"```bash\n(.*?)```", SECTION, flags=re.S)
PLOT = ["plot.py", "log/base-*", "log/edit-*"]

# how a program that stands in for one on PATH ends
STAND_INS = {
    # python: each call one line of $CALLS, CUDA_VISIBLE_DEVICES then the arguments, tab-separated
    "python": 'line="${CUDA_VISIBLE_DEVICES-}"\n'
    'for arg in "$@"; do line+=$\'\\t\'"$arg"; done\n'
    'echo "$line" >> "$CALLS"\n',
    # srun in a job of one task: runs its command
    "srun": 'exec "$@"\n',
    # sbatch of an array of three, as the scheduler runs it: the file once for each task id
    "sbatch": 'for task in 1 2 3; do SLURM_ARRAY_TASK_ID=$task bash "$@"; done\n',
}


def checkout(tmp_path, *stand_ins):
    """A directory the documented commands run in as in the checkout's root (its scripts/ and
    plot.py; PROGRAM names its train_gpt2.py), with the stand-ins named first on PATH and this
    test's python next; its environment."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    (tmp_path / "plot.py").symlink_to(ROOT / "plot.py")
    stand_in_dir = tmp_path / "bin"
    stand_in_dir.mkdir()
    for name in stand_ins:
        (stand_in_dir / name).write_text("#!/usr/bin/env bash\n" + STAND_INS[name])
        (stand_in_dir / name).chmod(0o755)
    path = os.pathsep.join([str(stand_in_dir), os.path.dirname(sys.executable), os.environ["PATH"]])
    return child_env(PROGRAM=str(ROOT / "train_gpt2.py"), PATH=path, CALLS=str(tmp_path / "calls"))


def tiny(data_root, **overrides):
    """TINY's flags without a log_dir (seeds.sh gives it)."""
    return flags(**{**TINY, "data_root": data_root, **overrides})


def starts(log_dir):
    """The start records of runs.jsonl."""
    records = [json.loads(line) for line in (log_dir / "runs.jsonl").read_text().splitlines()]
    return [record for record in records if "config" in record]


def train_steps(log_dir):
    path = log_dir / "log.txt"
    return path.read_text().count(" train ") if path.exists() else 0


def test_seeds_sh_trains_a_seed_into_log_arm_seed(small_corpus, tmp_path):
    env = checkout(tmp_path)
    # the seed and log_dir it is given win over any among the flags
    args = ["base", 3, *tiny(small_corpus, seed=7, log_dir="elsewhere")]
    result = run_program(["scripts/seeds.sh"], args, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "finished at step 12" in result.stdout
    [record] = starts(tmp_path / "log" / "base-3")
    assert record["config"]["seed"] == 3
    assert record["config"]["log_dir"] == "log/base-3"
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["base-3"]
    assert not (tmp_path / "elsewhere").exists()


def test_an_edit_in_its_own_checkout_runs_its_code_into_this_checkouts_log(small_corpus, tmp_path):
    # docs: `git worktree add ../edit`, edit it, PROGRAM=../edit/train_gpt2.py scripts/seeds.sh
    edit = tmp_path / "edit"
    edit.mkdir()
    for module in ROOT.glob("*.py"):
        shutil.copy(module, edit)
    edited = (edit / "train_gpt2.py").read_text() + "# the edit\n"
    (edit / "train_gpt2.py").write_text(edited)
    here = tmp_path / "here"
    here.mkdir()
    env = checkout(here)
    env["PROGRAM"] = "../edit/train_gpt2.py"
    result = run_program(["scripts/seeds.sh"], ["edit", 1, *tiny(small_corpus)], env=env, cwd=here)
    assert result.returncode == 0, result.stderr
    [record] = starts(here / "log" / "edit-1")
    kept = here / "log" / "edit-1" / record["code"]["train_gpt2.py"]
    assert kept.read_text() == edited
    assert not (edit / "log").exists()


def test_seeds_sh_without_a_seed_says_how_to_call_it(tmp_path):
    result = run_program(["scripts/seeds.sh"], ["base"], env=checkout(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "usage: scripts/seeds.sh ARM SEED [train_gpt2.py flags...]\n"
    assert not (tmp_path / "log").exists()


def test_an_array_task_trains_its_seed_and_its_requeue_continues_it(small_corpus, tmp_path):
    # The body of scripts/seeds.sbatch as SLURM runs array task 2 (its variables set), stopped
    # the way --signal=USR1@120 stops it: SIGUSR1 to the job step (the trainer), not to the
    # batch shell. The task run again (a requeue, the same job id) continues seed 2.
    env = checkout(tmp_path, "srun")
    env.update(
        SLURM_JOB_ID="4243",
        SLURM_ARRAY_JOB_ID="4240",
        SLURM_ARRAY_TASK_ID="2",
        SLURM_ARRAY_TASK_MIN="1",
        SLURM_ARRAY_TASK_MAX="3",
        SLURM_ARRAY_TASK_COUNT="3",
        SLURM_JOB_NAME="seeds.sbatch",
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURM_RESTART_COUNT="0",
    )
    body = ["bash", "scripts/seeds.sbatch"]
    args = ["base", *tiny(small_corpus, max_steps=10**5, ckpt_interval=0)]
    log_dir = tmp_path / "log" / "base-2"

    def stopped(proc, after):
        wait_for(lambda: train_steps(log_dir) >= after, proc)
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGUSR1)
        returncode, out, err = finish(proc)
        assert returncode == 0, err[-3000:]
        assert "SIGUSR1: stopped at step" in out
        return harness.find_checkpoints(log_dir)[-1][0]

    first = stopped(start(body, args, env=env, cwd=tmp_path), after=3)
    env["SLURM_RESTART_COUNT"] = "1"
    second = stopped(start(body, args, env=env, cwd=tmp_path), after=first + 3)
    assert second > first
    records = starts(log_dir)
    assert [r["config"]["seed"] for r in records] == [2, 2]
    assert [r["config"]["log_dir"] for r in records] == ["log/base-2"] * 2
    assert records[1]["step"] == first
    assert records[1]["resumed_from"].endswith(f"model_{first:05d}.pt")
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == ["base-2"]


@pytest.mark.slow
def test_the_interleaved_seeds_of_the_docs_end_in_plots_comparison(small_corpus, tmp_path):
    # docs' loop on one machine as written, with two seeds and a tiny model
    commands = ONE_MACHINE.replace("for seed in 1 2 3;", "for seed in 1 2;")
    shortened = "--preset shakespeare_char --max_steps 500 --eval_interval 25"
    assert commands.count(shortened) == 2 and "for seed in 1 2;" in commands
    commands = commands.replace(shortened, shlex.join(tiny(small_corpus)))
    result = run_program(["bash", "-c", commands], env=checkout(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for arm in ("base", "edit"):
        runs = f"log/{arm}-1: 2 runs (log/{arm}-1, log/{arm}-2), seeds 1, 2"
        assert runs in result.stdout
    assert "## log/edit-1 vs log/base-1" in result.stdout
    assert "2 vs 2 seeds, paired" in result.stdout
    assert "optimizer: adamw -> muon" in result.stdout
    assert (tmp_path / "compare.png").is_file()


def launched(commands, tmp_path):
    """(CUDA_VISIBLE_DEVICES, arguments) of each python the commands start, in order."""
    env = checkout(tmp_path, "python", "srun", "sbatch")
    del env["PROGRAM"]  # the program as a user's commands name it: train_gpt2.py of the root
    result = run_program(["bash", "-c", commands], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    calls = [line.split("\t") for line in (tmp_path / "calls").read_text().splitlines()]
    return [(call[0], call[1:]) for call in calls]


@pytest.mark.parametrize("form", ["one machine", "GPU node", "SLURM"])
def test_the_documented_seeds_launch_valid_runs_of_their_own_seeds(form, tmp_path):
    commands = {"one machine": ONE_MACHINE, "GPU node": GPU_NODE, "SLURM": SLURM}[form]
    *runs, (_, plot) = launched(commands, tmp_path)
    assert plot == PLOT
    seeds = {"base": [], "edit": []}
    log_dirs = []
    for gpu, (program, *args) in runs:
        assert program == "train_gpt2.py"
        cfg = harness.parse_args(args, train_gpt2.TrainConfig, train_gpt2.PRESETS)
        assert train_gpt2.micro_steps(cfg, 1) >= 1
        arm, seed = re.fullmatch(r"log/(base|edit)-(\d+)", cfg.log_dir).groups()
        assert cfg.seed == int(seed)
        seeds[arm].append(cfg.seed)
        log_dirs.append(cfg.log_dir)
        # a val point every few steps: a curve, not two or three points
        assert cfg.max_steps // cfg.eval_interval + 1 >= 20
        assert cfg.optimizer == ("muon" if arm == "edit" else "adamw")
        assert cfg.resume == ("auto" if form == "SLURM" else "")
    assert len(set(log_dirs)) == len(runs)
    assert sorted(seeds["base"]) == sorted(seeds["edit"]) and len(seeds["base"]) >= 3
    gpus = [gpu for gpu, _ in runs]
    if form == "one machine":
        # interleaved: base-1, edit-1, base-2, edit-2, ...
        assert log_dirs == [f"log/{arm}-{s}" for s in seeds["base"] for arm in ("base", "edit")]
    if form == "GPU node":
        assert sorted(gpus) == [str(i) for i in range(8)]
    else:
        assert set(gpus) == {""}
    if form == "SLURM":
        assert "#SBATCH --array=1-3\n" in (ROOT / "scripts" / "seeds.sbatch").read_text()
