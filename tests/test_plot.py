"""plot.py: log.txt read as a resumed run wrote it, every kind drawn, GPT-2's lines only for
FineWeb-Edu runs, the PNG written atomically (a killed writer's temp file removed by the next);
several runs grouped into arms (seeds of one config and code), each arm's mean, sd and values, arms
compared with their seed noise (paired or Welch t-tests checked against scipy and a textbook, the
power of more seeds, the time to the baseline's final val), drawn as mean and band against steps,
tokens and time; what differs in config and every module's code (over a run's whole history,
modules imported after its start included); which runs are seeds (finished, where their arm's runs
ended, once a seed); arms named by hand (the null comparison); each arm's step time, and the
seconds to the baseline withheld when the step times do not differ beyond their spread; records of
any shape read without a traceback; a closed stdout ends quietly; one line on stderr for bad
input."""

import hashlib
import json
import os
import statistics
import sys
from pathlib import Path

import pytest
from conftest import main_error, one_line_error, run_program, run_with_stdout_closed

import plot

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def write_log(log_dir: Path, extra: str = "") -> Path:
    """A log.txt as a run writes it: train every step, val and hella every 5; extra appended."""
    lines = []
    for step in range(11):
        lines.append(f"{step} train {11 - 0.3 * step:.4f}")
        if step % 5 == 0:
            lines.append(f"{step} val {11 - 0.25 * step:.4f}")
            lines.append(f"{step} hella {0.25 + 0.002 * step:.4f}")
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "log.txt").write_text("\n".join(lines) + "\n" + extra)
    return log_dir


def write_runs(log_dir: Path, *datasets, tail: str = ""):
    """runs.jsonl: one line per run start, each naming its data; tail appended."""
    lines = [json.dumps({"step": 0, "config": {}, "data": {"dataset": d}}) for d in datasets]
    (log_dir / "runs.jsonl").write_text("".join(line + "\n" for line in lines) + tail)


def test_a_resumed_run_replaces_the_tail_and_bad_lines_are_named(tmp_path):
    # a resume from step 9 logs 9 and 10 again (no evaluation at 10 this time); a line edited
    # by hand: from step 9 on, the curves are the resumed run's alone
    log = write_log(tmp_path, "9 train 5.5\n10 train 5.25\nstep nine\n11 train 5.0\n")
    log = log / "log.txt"
    warnings = []
    series = plot.read_log(log, warnings.append)
    assert series["train"][-3:] == [(9, 5.5), (10, 5.25), (11, 5.0)]
    assert [step for step, _ in series["train"]] == list(range(12))
    assert series["hella"] == [(0, 0.25), (5, 0.26)]
    n = len(log.read_text().splitlines())
    assert [w.split(": skipped")[0] for w in warnings] == [f"{log}:{n - 1}"]
    assert "'step nine'" in warnings[0]
    assert plot.read_log(log) == series  # no warn: skipped quietly


def test_read_log_skips_a_torn_line(tmp_path):
    log = write_log(tmp_path, "11 tra") / "log.txt"
    warnings = []
    assert "tra" not in plot.read_log(log, warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith(f"{log}:")


def test_every_kind_gets_a_panel_losses_together():
    """A kind plot.py has never heard of is drawn too: a new metric needs no code."""
    series = {
        "my_metric": [(0, 1.0), (4, 2.0)],
        "hella": [(0, 0.25)],
        "val": [(0, 9.0)],
        "train": [(0, 9.5), (1, 9.0)],
    }
    fig = plot.figure(series)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss", "HellaSwag acc_norm", "my_metric"]
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["train", "val"]
    assert list(fig.axes[2].get_lines()[0].get_xdata()) == [0, 4]


def reference_lines(fig) -> dict:
    """{panel title: [y of each horizontal line]}"""
    found = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            y = line.get_ydata()
            if len(line.get_xdata()) == 2 and y[0] == y[1] and line.get_linestyle() == "--":
                found.setdefault(ax.get_title(), []).append(y[0])
    return found


def test_reference_lines_are_gpt2s_and_drawn_only_when_asked(tmp_path):
    series = plot.read_log(write_log(tmp_path) / "log.txt")
    drawn = reference_lines(plot.figure(series, plot.REFERENCES))
    assert drawn == {"loss": [3.2924], "HellaSwag acc_norm": [0.2955, 0.337]}
    assert reference_lines(plot.figure(series)) == {}


def test_references_follow_the_last_run_in_runs_jsonl(tmp_path):
    """None: GPT-2's lines for a run on FineWeb-Edu only, as the last run
    start recorded in runs.jsonl says (a torn last line does not count)."""
    log = write_log(tmp_path)

    def png(name, **kw):
        return plot.write_curves(log, tmp_path / f"{name}.png", **kw).read_bytes()

    with_lines = png("with", references=True)
    without = png("without", references=False)
    assert with_lines[:8] == PNG and with_lines != without
    assert png("no_runs_jsonl") == without
    write_runs(log, "local", "fineweb-edu", tail='{"step": 9, "da')
    assert png("fineweb") == with_lines
    write_runs(log, "fineweb-edu", "local")
    assert png("local") == without
    write_runs(log, "fineweb-edu", None)  # build-nanogpt's shards: unknown data
    assert png("unknown") == without
    (log / "runs.jsonl").write_bytes(b"\xff\xfe not json\n[1, 2]\n")
    assert png("foreign") == without


class TornFigure:
    """A figure whose PNG stops half-way, as on a full disk."""

    def savefig(self, f, **kwargs):
        f.write(PNG + b"half a plot")
        raise OSError("No space left on device")


def test_write_curves_is_atomic_and_defaults_to_curves_png(tmp_path, monkeypatch):
    log = write_log(tmp_path / "run")
    out = plot.write_curves(log)
    assert out == log / "curves.png" and out.read_bytes()[:8] == PNG
    assert sorted(os.listdir(log)) == ["curves.png", "log.txt"]  # no temp file left
    # a write that fails half-way: the last curves.png is intact, no temp file
    before = out.read_bytes()
    monkeypatch.setattr(plot, "figure", lambda series, references: TornFigure())
    with pytest.raises(OSError, match="No space left"):
        plot.write_curves(log)
    assert out.read_bytes() == before
    assert sorted(os.listdir(log)) == ["curves.png", "log.txt"]


def test_write_curves_needs_a_log_with_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="no log.txt file at .*log_dir"):
        plot.write_curves(tmp_path)
    (tmp_path / "log.txt").write_text("1 train\n")
    with pytest.raises(ValueError, match="holds no metrics yet"):
        plot.write_curves(tmp_path)


def test_main_with_one_run_draws_todays_picture_into_its_log_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "log")
    plot.main(["log"])
    assert capsys.readouterr().out == "wrote log/curves.png\n"  # no table, no comparison
    assert (tmp_path / "log" / "curves.png").read_bytes()[:8] == PNG
    assert not (tmp_path / "compare.png").exists()


# ----------------------------------------------------------------------------------------------
# several runs compared: runs.jsonl and log.txt as the trainer writes them (see SPEC in the docs)

SOURCES = {
    "train_gpt2.py": "import fineweb\n\n\nclass GPTConfig:\n    n_layer: int = 12\n",
    "fineweb.py": "def write_atomic(path, write):\n    tmp = path + '.tmp'\n",
    "plot.py": "import fineweb\n",
}


def keep(log_dir: Path, relpath: str, text: str) -> str:
    """text kept as the trainer keeps a module: code/{stem}-{sha256[:12]}{suffix}, the path."""
    data = text.encode()
    path = Path(relpath)
    kept = f"code/{path.stem}-{hashlib.sha256(data).hexdigest()[:12]}{path.suffix}"
    (log_dir / "code").mkdir(parents=True, exist_ok=True)
    (log_dir / kept).write_bytes(data)
    return kept


def write_start(
    log_dir: Path, seed=1, step=0, sources=SOURCES, git_diff=None, code_changed=None, **config
):
    """A start record appended to runs.jsonl, its modules and git diff kept under code/;
    code_changed: the trainer's list of the modules changed since the checkpoint."""
    config = {"n_layer": 12, "max_lr": 6e-4, "total_batch_size": 512, "resume": "", **config}
    record = {
        "step": step,
        "resumed_from": None,
        "config": {**config, "seed": seed, "log_dir": str(log_dir)},
        "model": {"n_layer": config["n_layer"], "n_head": 12},
        "data": {"tokenizer": {"tokenizer": "gpt2"}, "fingerprint": "f1", "dataset": "local"},
        "world_size": 1,
        "device": "cpu",
        "code": {relpath: keep(log_dir, relpath, text) for relpath, text in sources.items()},
        "git": {
            "commit": "70a0414",
            "diff": git_diff and keep(log_dir, "git.diff", git_diff),
            "untracked": [],
        },
        "time": "2026-12-02T22:40:00+00:00",
    }
    if code_changed is not None:
        record["code_changed"] = code_changed
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def write_result(log_dir: Path, status="finished", steps=10, seconds=1.0):
    """A result record appended to runs.jsonl as the trainer writes it at a run's end."""
    result = {"status": status, "steps": steps, "tokens": steps * 512, "time": steps * seconds}
    result.update(peak_memory_gb=0.5, val=3.0, bpb=None, hella=None)
    with open(log_dir / "runs.jsonl", "a") as f:
        f.write(json.dumps({"result": result}) + "\n")


def write_run(
    root: Path, name: str, seed=1, val=None, steps=10, seconds=1.0, status="finished", **start
) -> Path:
    """A run as the trainer writes it: each step's train, ms and tok_per_s (seconds a step, or a
    list of each step's), tokens (512 a step) and time (through the step) in log.txt, val {step:
    value} (default: {steps: 3.0}), one start and its result at steps (status None: none, the run
    still training or killed)."""
    log_dir = root / name
    val = {steps: 3.0} if val is None else val
    if not isinstance(seconds, list):
        seconds = [seconds] * steps
    lines = []
    time = 0.0
    for step in range(steps + 1):
        if step in val:
            lines.append(f"{step} val {val[step]}")
        if step < steps:
            time += seconds[step]
            lines.append(f"{step} train {4 - step / 10:.4f}")
            lines.append(f"{step} ms {seconds[step] * 1000:.6g}")
            lines.append(f"{step} tok_per_s {512 / seconds[step]:.6g}")
            lines.append(f"{step} tokens {(step + 1) * 512}")
            lines.append(f"{step} time {time:.6g}")
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "log.txt").write_text("".join(line + "\n" for line in lines))
    write_start(log_dir, seed, **start)
    if status is not None:
        write_result(log_dir, status, steps, time / max(steps, 1))
    return log_dir


def resume_run(log_dir: Path, seed, step, steps=10, **start) -> dict:
    """log_dir's run (write_run's) as stopped at step and resumed there (--resume auto) to its end
    at steps: its result says stopped, then a start at step and a result at steps."""
    lines = (log_dir / "runs.jsonl").read_text().splitlines()
    # its finished result dropped
    (log_dir / "runs.jsonl").write_text("".join(line + "\n" for line in lines[:-1]))
    write_result(log_dir, "stopped", step)
    record = write_start(log_dir, seed, step=step, resume="auto", **start)
    write_result(log_dir, steps=steps)
    return record


def json_of(argv, capsys) -> dict:
    """plot.py --json argv's stdout, which holds the JSON alone."""
    plot.main(["--json", *map(str, argv)])
    return json.loads(capsys.readouterr().out)


def report_of(argv, capsys) -> str:
    """The report plot.py argv prints, without drawing (plot.compare with no picture)."""
    plot.compare(list(map(str, argv)), None, False)
    return capsys.readouterr().out


def arms_of(result) -> dict:
    return {arm["name"]: arm["runs"] for arm in result["arms"]}


def comparison(result, metric="val", arm=None) -> dict:
    rows = [row for row in result["comparisons"] if row["metric"] == metric]
    rows = [row for row in rows if arm is None or row["arm"] == arm]
    assert len(rows) == 1, rows
    return rows[0]


# Student's sleep data (Cushny and Peebles 1905): extra hours of sleep of 10 patients under
# two drugs. R's t.test(extra ~ group, data = sleep, paired = TRUE): t = -4.0621, df = 9,
# p = 0.002833, 95% CI of the mean difference -2.4598858..-0.7001142 (drug 1 minus drug 2);
# unpaired (Welch): t = -1.8608, df = 17.776, p = 0.07939, CI -3.3654832..0.2054832.
DRUG_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def sleep_runs(root, paired):
    """Drug 1 as the baseline's seeds 1-10, drug 2 as the arm's (another n_layer; seeds 1-10
    again if paired, else 11-20), the metric val_hours (of no known direction), interleaved."""
    dirs = []
    for i, (one, two) in enumerate(zip(DRUG_1, DRUG_2)):
        first = write_run(root, f"d1-{i}", seed=i + 1, val={}, steps=2)
        add_metric(first, "val_hours", {2: one})
        second = write_run(root, f"d2-{i}", i + 1 if paired else i + 11, val={}, steps=2, n_layer=6)
        add_metric(second, "val_hours", {2: two})
        dirs += [first, second]
    return dirs


def add_metric(log_dir: Path, kind: str, points: dict):
    with open(log_dir / "log.txt", "a") as f:
        f.write("".join(f"{step} {kind} {value}\n" for step, value in points.items()))


@pytest.fixture
def sleep(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make(paired):
        root = tmp_path / ("paired" if paired else "welch")
        dirs = sleep_runs(root, paired)
        return [d.relative_to(tmp_path) for d in dirs]

    return make


def test_a_paired_comparison_is_students_and_scipys(sleep, capsys):
    from scipy import stats

    dirs = sleep(paired=True)
    result = json_of(dirs, capsys)
    assert arms_of(result) == {
        "paired/d1-0": [str(d) for d in dirs[::2]],
        "paired/d2-0": [str(d) for d in dirs[1::2]],
    }
    row = comparison(result, "val_hours")
    assert row["test"] == "paired" and row["arm"] == "paired/d2-0"
    assert row["baseline"] == "paired/d1-0"
    # the textbook's numbers (drug 2 minus drug 1)
    assert row["diff"] == pytest.approx(1.58)
    assert row["ci95"] == pytest.approx([0.7001142, 2.4598858], abs=1e-6)
    assert row["p"] == pytest.approx(0.002833, abs=1e-6)
    # and scipy's on the same numbers
    expected = stats.ttest_rel(DRUG_2, DRUG_1)
    assert row["p"] == pytest.approx(expected.pvalue, rel=1e-12)
    assert row["ci95"] == pytest.approx(list(expected.confidence_interval(0.95)), rel=1e-12)
    # a metric of no known direction: higher or lower, never better
    assert "val_hours -0.0 vs" not in row["verdict"]
    assert row["verdict"].startswith("val_hours 2.3300 vs 0.7500: higher by 1.5800 (95% CI")
    assert "p = 0.0028; 10 vs 10 seeds, paired)" in row["verdict"]


def test_a_welch_comparison_when_the_seeds_differ(sleep, capsys):
    from scipy import stats

    dirs = sleep(paired=False)
    row = comparison(json_of(dirs, capsys), "val_hours")
    assert row["test"] == "welch"
    assert row["diff"] == pytest.approx(1.58)
    assert row["ci95"] == pytest.approx([-0.2054832, 3.3654832], abs=1e-6)
    assert row["p"] == pytest.approx(0.07939, abs=1e-5)
    expected = stats.ttest_ind(DRUG_2, DRUG_1, equal_var=False)
    assert row["p"] == pytest.approx(expected.pvalue, rel=1e-12)
    assert row["ci95"] == pytest.approx(list(expected.confidence_interval(0.95)), rel=1e-12)
    # not significant at 0.05: no difference claimed, and how many seeds would tell
    assert row["verdict"].startswith("val_hours 2.3300 vs 0.7500: no difference beyond seed noise")
    assert "(p = 0.079;" in row["verdict"] and "10 vs 10 seeds, welch" in row["verdict"]
    assert f"about {row['seeds_needed']} seeds per arm would detect" in row["verdict"]
    # the normal approximation n = (z_0.975 + z_0.8)^2 (sd1^2 + sd2^2) / diff^2 (22.7 here);
    # the t distribution's heavier tails ask a seed or two more
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    spread = statistics.variance(DRUG_1) + statistics.variance(DRUG_2)
    approximation = z**2 * spread / 1.58**2
    assert approximation < row["seeds_needed"] <= approximation + 3
    assert (
        "the observed difference" in row["verdict"] and "80% power at alpha 0.05" in row["verdict"]
    )


def test_seeds_needed_is_the_textbooks_power():
    # Cohen's tables: a two-sample t-test at alpha 0.05 (two-sided) finds d = 1 with 80% power
    # with 17 a group, d = 0.5 with 64; a paired one finds d_z = 0.5 with 34 pairs
    assert plot.seeds_needed(1.0, 1.0, 1.0, paired=False) == 17
    assert plot.seeds_needed(0.5, 1.0, 1.0, paired=False) == 64
    assert plot.seeds_needed(0.5, 1.0, None, paired=True) == 34
    assert plot.seeds_needed(0.0, 1.0, 1.0, paired=False) is None  # no difference to find


# the numbers: one training, two sets of seeds
BASE = {1: 3.114, 2: 3.082, 3: 3.033}


def test_a_null_is_no_difference_and_a_clear_effect_is_found(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    dirs = []
    for seed, value in BASE.items():
        dirs.append(write_run(tmp_path, f"base-{seed}", seed, val={10: value}))
    # the same training (same config and code), other seeds: one arm
    for seed, value in {4: 3.071, 5: 3.102, 6: 3.049}.items():
        dirs.append(write_run(tmp_path, f"base-{seed}", seed, val={10: value}))
    # another learning rate on seeds 1-3: better on every seed by 0.15-0.16
    for seed, value in {1: 2.950, 2: 2.930, 3: 2.880}.items():
        dirs.append(write_run(tmp_path, f"lr-{seed}", seed, val={10: value}, max_lr=1e-3))
    # another on seeds 7-9: the same distribution as the baseline's
    for seed, value in {7: 3.060, 8: 3.110, 9: 3.085}.items():
        dirs.append(write_run(tmp_path, f"null-{seed}", seed, val={10: value}, max_lr=3e-4))
    result = json_of([d.name for d in dirs], capsys)
    assert [arm["n"] for arm in result["arms"]] == [6, 3, 3]
    base = result["arms"][0]["metrics"]["val"]
    values = [3.114, 3.082, 3.033, 3.071, 3.102, 3.049]
    assert base["values"] == values
    assert base["mean"] == pytest.approx(statistics.fmean(values))
    assert base["sd"] == pytest.approx(statistics.stdev(values))
    # 6 baseline seeds vs 3: not the same set, so Welch
    better = comparison(result, "val", "lr-1")
    assert better["test"] == "welch" and better["p"] < 0.05 and better["diff"] < 0
    assert ": better by " in better["verdict"]
    null = comparison(result, "val", "null-7")
    assert null["p"] > 0.05
    assert ": no difference beyond seed noise (p = " in null["verdict"]
    # on the same seeds the pairs show it more sharply
    paired = json_of(["base-1", "base-2", "base-3", "lr-1", "lr-2", "lr-3"], capsys)
    row = comparison(paired, "val")
    assert row["test"] == "paired" and row["p"] < better["p"]
    assert row["verdict"].startswith("val 2.9200 vs 3.0763: better by 0.1563 (95% CI 0.1")
    assert "3 vs 3 seeds, paired)" in row["verdict"]


def test_one_run_in_an_arm_gives_no_p_value(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for seed, value in BASE.items():
        write_run(tmp_path, f"base-{seed}", seed, val={10: value})
    write_run(tmp_path, "rope", 1, val={10: 3.0}, n_layer=6)
    write_run(tmp_path, "one", 1, val={10: 3.1})
    result = json_of(["one", "rope"], capsys)
    val = {"mean": 3.1, "sd": None, "values": [3.1], "steps": [10], "n": 1}
    assert result["arms"][0]["metrics"]["val"] == val
    row = comparison(result, "val")
    assert (row["test"], row["p"], row["ci95"]) == (None, None, None)
    assert row["diff"] == pytest.approx(-0.1)
    assert row["verdict"] == (
        "val 3.0000 vs 3.1000: better by 0.1000, between single runs: no p-value (the seed noise"
        " is unknown): run more seeds (--seed)"
    )
    row = comparison(json_of(["base-1", "base-2", "base-3", "rope"], capsys), "val")
    assert row["p"] is None and "rope is a single run: no p-value" in row["verdict"]


def test_the_json_holds_the_arms_and_comparisons_and_nothing_else(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for seed, value in BASE.items():
        run = write_run(tmp_path, f"base-{seed}", seed, val={0: 11.0, 10: value})
        add_metric(run, "hella", {10: 0.25 + seed / 100})
    write_run(tmp_path, "rope", 4, val={0: 11.0, 10: 3.0}, n_layer=6)
    plot.main(["--json", "base-1", "base-2", "base-3", "rope"])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert err == "" and not (tmp_path / "compare.png").exists()  # numbers only
    assert set(result) == {"arms", "comparisons"}
    base, rope = result["arms"]
    assert {"name", "runs", "n", "metrics"} <= set(base)
    assert base["name"] == "base-1" and base["runs"] == ["base-1", "base-2", "base-3"]
    assert base["n"] == 3 and base["seeds"] == [1, 2, 3]
    assert list(base["metrics"]) == ["train", "val", "hella"]  # tokens and time: bookkeeping
    assert base["metrics"]["hella"]["values"] == [0.26, 0.27, 0.28]
    assert rope["metrics"]["val"] == {
        "mean": 3.0,
        "sd": None,
        "values": [3.0],
        "steps": [10],
        "n": 1,
    }
    hella = {"mean": None, "sd": None, "values": [None], "steps": [None], "n": 0}
    assert rope["metrics"]["hella"] == hella
    assert [row["metric"] for row in result["comparisons"]] == ["train", "val"]
    for row in result["comparisons"]:
        keys = {"arm", "baseline", "metric", "test", "diff", "ci95", "p", "time_to_baseline_s"}
        assert keys <= set(row)
        assert (row["arm"], row["baseline"]) == ("rope", "base-1")
        assert row["test"] is None and row["ci95"] is None and row["p"] is None
    # what differs, as the text says it: rope's config and (the same sources) no code
    assert base["vs_baseline"] is None
    assert "n_layer: 12 -> 6" in rope["vs_baseline"] and "same code" in rope["vs_baseline"]


def test_arms_are_runs_that_differ_only_in_seed_log_dir_and_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    edited = {**SOURCES, "fineweb.py": SOURCES["fineweb.py"].replace(".tmp", ".part")}
    write_run(tmp_path, "a1", 1)
    write_run(tmp_path, "lr1", 1, max_lr=1e-3)
    write_run(tmp_path, "a2", 2)
    write_run(tmp_path, "fw", 3, sources=edited)  # another module's source: another arm
    write_run(tmp_path, "lr2", 2, max_lr=1e-3)
    # resumed (its second start names the checkpoint): the same run, the same arm
    a3 = write_run(tmp_path, "a3", 3)
    resume_run(a3, 3, step=5)
    result = json_of(["a1", "lr1", "a2", "fw", "lr2", "a3"], capsys)
    # in the order of their first runs, named by it
    assert arms_of(result) == {"a1": ["a1", "a2", "a3"], "lr1": ["lr1", "lr2"], "fw": ["fw"]}
    assert result["arms"][0]["code_changes"] == []


def test_a_log_dir_given_twice_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "a", 1)
    message = main_error(plot.main, ["a", "./a/"])
    assert message == "plot.py: error: ./a/ is given twice: give each run once"


def test_what_differs_is_every_module_the_runs_imported(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    edited = {**SOURCES, "fineweb.py": SOURCES["fineweb.py"].replace(".tmp", ".part")}
    more = {**SOURCES, "mylib/attn.py": "def attention(q, k, v):\n    pass\n"}
    base = write_run(tmp_path, "base", 1, git_diff="diff --git a/notes.md b/notes.md\n+a\n")
    write_run(tmp_path, "same", 2, git_diff="diff --git a/notes.md b/notes.md\n+b\n")
    fw = write_run(tmp_path, "fw", 1, sources=edited)
    write_run(tmp_path, "more", 1, sources=more)
    out = report_of(["base", "same", "fw", "more"], capsys)
    sections = {part.split("\n")[0]: part for part in out.split("\n\n") if part.startswith("## ")}
    assert list(sections) == ["## fw vs base", "## more vs base"]
    # base and same: one arm (their sources are the same); their git diffs differ in a file no
    # run imported, which is not code
    assert "base: 2 runs (base, same), seeds 1, 2\n" in out
    kept = {rel: keep(fw, rel, text) for rel, text in edited.items()}
    base_kept = keep(base, "fineweb.py", SOURCES["fineweb.py"])
    assert sections["## fw vs base"].split("\n")[-9:] == [
        "same config",
        "code differs:",
        f"--- base/{base_kept}",
        f"+++ fw/{kept['fineweb.py']}",
        "@@ -1,2 +1,2 @@",
        " def write_atomic(path, write):",
        "-    tmp = path + '.tmp'",
        "+    tmp = path + '.part'",
        "git diff differs in files no run imported: notes.md",
    ]
    assert sections["## more vs base"].endswith(
        "same config\ncode differs:\nmylib/attn.py: imported by more only\n"
        "git diff differs in files no run imported: notes.md"
    )
    assert "same code" not in out


def test_git_diffs_that_differ_only_in_files_no_run_imported_are_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = write_run(tmp_path, "a", 1, git_diff="diff --git a/notes.md b/notes.md\n+a\n")
    b = write_run(tmp_path, "b", 1, max_lr=1e-3)  # clean: no diff
    runs = [plot.read_run(a.name), plot.read_run(b.name)]
    assert plot.differences(*runs) == [
        "## b vs a",
        "max_lr: 0.0006 -> 0.001",
        "same code",
        "git diff differs in files no run imported: notes.md",
    ]


def test_code_changed_at_a_resume_is_shown(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    edited = {**SOURCES, "train_gpt2.py": SOURCES["train_gpt2.py"].replace("12\n", "6\n", 1)}
    write_run(tmp_path, "base", 1)
    run = write_run(tmp_path, "resumed", 1)
    # the trainer's word (code_changed); an older record without it: the kept sources say it
    resume_run(run, 1, step=5, sources=edited, code_changed=["train_gpt2.py"])
    old = write_run(tmp_path, "old", 2)
    resume_run(old, 2, step=4, sources=edited)
    result = json_of(["base", "resumed", "old"], capsys)
    assert arms_of(result) == {"base": ["base"], "resumed": ["resumed"], "old": ["old"]}
    changes = [arm["code_changes"] for arm in result["arms"]]
    assert changes == [
        [],
        [{"step": 5, "modules": ["train_gpt2.py"]}],
        [{"step": 4, "modules": ["train_gpt2.py"]}],
    ]
    # the code the resumed run ran last differs from the baseline's: the JSON says so too
    assert "code differs:" in result["arms"][1]["vs_baseline"]
    assert "-    n_layer: int = 12" in result["arms"][1]["vs_baseline"]
    assert "\ncode changed at step 5: train_gpt2.py\n" in report_of(["base", "resumed"], capsys)


def test_time_to_reach_the_baselines_final_val(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # the baseline: 1 s a step, val at steps 0, 5, 10 (drawn at 0, 5 and 10 s), final mean 2.1
    write_run(tmp_path, "base1", 1, val={0: 4.0, 5: 3.0, 10: 2.0})
    write_run(tmp_path, "base2", 2, val={0: 4.0, 5: 3.2, 10: 2.2})
    # twice as fast a step: its mean val curve (0, 4.0), (2.5, 2.5), (5.0, 1.5) reaches 2.1
    # 0.4 of the way between its last two points: at 3.5 s, 0.35 of the baseline's 10 s
    write_run(tmp_path, "fast1", 1, val={0: 4.0, 5: 2.4, 10: 1.4}, seconds=0.5, max_lr=1e-3)
    write_run(tmp_path, "fast2", 2, val={0: 4.0, 5: 2.6, 10: 1.6}, seconds=0.5, max_lr=1e-3)
    # never there
    write_run(tmp_path, "slow", 1, val={0: 4.0, 5: 3.5, 10: 2.5}, max_lr=1e-4)
    result = json_of(["base1", "base2", "fast1", "fast2", "slow"], capsys)
    fast = comparison(result, "val", "fast1")
    # at step 7, after 3,584 tokens: 0.7 of the baseline's 10 steps and 5,120 tokens
    assert fast["steps_to_baseline"] == pytest.approx(7.0)
    assert fast["step_ratio"] == pytest.approx(0.7)
    assert fast["tokens_to_baseline"] == pytest.approx(3584)
    assert fast["baseline_tokens"] == pytest.approx(5120)
    assert fast["time_to_baseline_s"] == pytest.approx(3.5)
    assert fast["time_ratio"] == pytest.approx(0.35)
    assert fast["baseline_time_s"] == pytest.approx(10.0)
    # 500 ms a step against 1000: the seconds are the arm's
    assert fast["seconds_withheld"] is None
    assert comparison(result, "val", "slow")["time_to_baseline_s"] is None
    out = report_of(["base1", "base2", "fast1", "fast2", "slow"], capsys)
    assert (
        "time: reaches base1's final val 2.1000 at step 7 (0.70 x base1's 10), 3,584 tokens (0.70"
        " x 5,120), 3.5 s (0.35 x 10.0 s)\n"
    ) in out
    assert "time: never reaches base1's final val 2.1000\n" in out


def figure_of(argv, monkeypatch):
    """The Figure main(argv) draws into its PNG."""
    drawn = []
    write_png = plot.write_png
    monkeypatch.setattr(
        plot, "write_png", lambda out, fig: drawn.append(fig) or write_png(out, fig)
    )
    plot.main(argv)
    assert len(drawn) == 1
    return drawn[0]


def test_arms_are_drawn_as_mean_and_band_against_steps_tokens_and_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # time-bounded: a2 spent its budget at step 8, a1 at 10; the curve's last point is the mean of
    # the runs' last values
    write_run(tmp_path, "a1", 1, val={0: 4.0, 5: 3.0, 10: 2.0}, max_minutes=0.1)
    write_run(tmp_path, "a2", 2, val={0: 4.0, 5: 3.2, 8: 2.6}, steps=8, max_minutes=0.1)
    old = write_metrics(tmp_path / "old", train=TRAIN, val={0: 11.0, 5: 7.0, 10: 4.6})
    write_start(old, 1, n_layer=6)  # an older log: no tokens, no time
    write_result(old)
    fig = figure_of(["a1", "a2", "old", "--out", "c.png"], monkeypatch)
    panels = [(ax.get_title(), ax.get_xlabel()) for ax in fig.axes]
    assert panels == [("loss", x) for x in ("step", "tokens", "training seconds")]
    by_steps, by_tokens, by_time = fig.axes
    lines = {line.get_label(): line for line in by_steps.get_lines()}
    assert list(lines) == ["a1 (n=2) train", "a1 (n=2) val", "old train", "old val"]
    val = lines["a1 (n=2) val"]
    assert list(val.get_xdata()) == [0, 5, 9]  # (10 + 8) / 2
    assert list(val.get_ydata()) == pytest.approx([4.0, 3.1, 2.3])
    # the band: min..max of the runs' values, one a run-group (the old run alone has none)
    assert len(by_steps.collections) == 2
    assert lines["a1 (n=2) val"].get_color() != lines["old val"].get_color()
    # tokens: what each run had trained on before the step (its log's tokens at step - 1);
    # the older log: step x total_batch_size
    tokens = {line.get_label(): list(line.get_xdata()) for line in by_tokens.get_lines()}
    assert tokens["a1 (n=2) val"] == [0, 2560, 4608]
    assert tokens["old val"] == [0, 5 * 512, 10 * 512]
    seconds = {line.get_label(): list(line.get_xdata()) for line in by_time.get_lines()}
    assert seconds.keys() == {"a1 (n=2) train", "a1 (n=2) val"}  # no time in the older log
    assert seconds["a1 (n=2) val"] == pytest.approx([0, 5.0, 9.0])


def test_many_arms_get_distinct_colours(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = [write_run(tmp_path, f"r{i}", 1, max_lr=i / 1000).name for i in range(1, 13)]
    fig = figure_of([*names, "--out", "c.png"], monkeypatch)
    colours = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    vals = [to_rgba(colour) for label, colour in colours.items() if label.endswith(" val")]
    assert len(vals) == 12 and len(set(vals)) == 12


def to_rgba(colour):
    import matplotlib.colors

    return matplotlib.colors.to_rgba(colour)


# ----------------------------------------------------------------------------------------------
# older runs: runs.jsonl's "code" a str (train_gpt2.py alone), no tokens or time in log.txt


def write_metrics(log_dir: Path, **kinds) -> Path:
    """log.txt holding {step: value} of each kind, in step order as a run writes it."""
    lines = []
    for kind, points in kinds.items():
        lines += [(step, kind, value) for step, value in points.items()]
    log_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{step} {kind} {value}\n" for step, kind, value in sorted(lines))
    (log_dir / "log.txt").write_text(text)
    return log_dir


def write_record(log_dir: Path, source=None, commit="70a0414", dataset="fineweb-edu", **config):
    """An older run start appended to runs.jsonl; source: the train_gpt2.py it ran, saved under
    code/ and named by the record's "code" str (None: older still, without code or git)."""
    config = {"n_layer": 12, "max_lr": 6e-4, "total_batch_size": 512, **config}
    record = {
        "step": 0,
        "resumed_from": None,
        "config": {**config, "log_dir": str(log_dir)},
        "data": {"tokenizer": {"tokenizer": "gpt2", "vocab": None}, "dataset": dataset},
        "world_size": 1,
    }
    if source is not None:
        record["code"] = keep(log_dir, "train_gpt2.py", source)
        record["git"] = {"commit": commit, "diff": None}
    with open(log_dir / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


TRAIN = {step: round(11 - 0.3 * step, 4) for step in range(11)}


def three_runs(root: Path):
    """log/base and log/rope (total_batch_size 512 and 1024, rope's last hella at step 5), and
    log/old: no runs.jsonl, no bpb, stopped at step 8."""
    base = write_metrics(
        root / "log/base",
        train=TRAIN,
        val={0: 11.0, 5: 7.5, 10: 4.5},
        bpb={0: 3.3, 5: 2.25, 10: 1.35},
        hella={0: 0.25, 10: 0.28},
    )
    rope = write_metrics(
        root / "log/rope",
        train=TRAIN,
        val={0: 11.0, 5: 7.0, 10: 4.2787},
        bpb={0: 3.3, 5: 2.1, 10: 1.2842},
        hella={0: 0.25, 5: 0.2711},
    )
    old = write_metrics(root / "log/old", train=TRAIN, val={0: 11.0, 5: 7.0, 8: 4.6})
    write_record(base)
    write_record(rope, total_batch_size=1024)
    return base, rope, old


def test_comparing_single_older_runs_prints_their_values_and_differences(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    three_runs(tmp_path)
    plot.main(["log/base", "log/rope", "log/old/"])
    out, err = capsys.readouterr()
    blocks = out.split("\n\n")
    assert blocks[0] == (
        "log/base: 1 run, seed ?\n"
        "log/base: its end is not recorded (no runs.jsonl, or one older than result records): its"
        " last logged values counted\n"
        "| metric | mean ± sd | values | step |\n"
        "| ------ | --------- | ------ | ---- |\n"
        "| train  | 8.0000    | 8.0000 | 10   |\n"
        "| val    | 4.5000    | 4.5000 | 10   |\n"
        "| bpb    | 1.3500    | 1.3500 | 10   |\n"
        "| hella  | 0.2800    | 0.2800 | 10   |"
    )
    assert blocks[3].split("\n")[:5] == [
        "## log/rope vs log/base",
        "train 8.0000 vs 8.0000: the same, between single runs: no p-value (the seed noise is"
        " unknown): run more seeds (--seed)",
        "val 4.2787 vs 4.5000: better by 0.2213, between single runs: no p-value (the seed noise"
        " is unknown): run more seeds (--seed)",
        "bpb 1.2842 vs 1.3500: better by 0.0658, between single runs: no p-value (the seed noise"
        " is unknown): run more seeds (--seed)",
        "hella 0.2711 vs 0.2800: worse by 0.0089, between single runs: no p-value (the seed"
        " noise is unknown): run more seeds (--seed)",
    ]
    assert "\n\n## log/old vs log/base\n" in out
    assert out.endswith("\nwrote compare.png\n")
    # the picture in the current directory, never in a run's log_dir
    assert (tmp_path / "compare.png").read_bytes()[:8] == PNG
    for run in ("base", "rope", "old"):
        assert "compare.png" not in os.listdir(tmp_path / "log" / run)
    warning = "log/old: no total_batch_size in its runs.jsonl: drawn against steps only"
    assert err == f"plot.py: warning: {warning}\n"


def test_a_metric_the_trainer_adds_is_compared_too(tmp_path, monkeypatch, capsys):
    # a researcher's new metric (val_acc, an accuracy: higher is better) gets a row and a panel
    # with no edit of plot.py; the train line's bookkeeping (lr here) gets neither
    monkeypatch.chdir(tmp_path)
    for name, acc in (("base", 0.30), ("new", 0.32)):
        run = write_metrics(
            tmp_path / "log" / name, train=TRAIN, val={10: 4.5}, val_acc={10: acc}, lr={0: 6e-4}
        )
        write_record(run, seed=1 if name == "base" else 2)
    plot.main(["log/base", "log/new"])
    out = capsys.readouterr().out
    assert "| val_acc | 0.3000    | 0.3000 |" in out
    assert "val_acc 0.3200 vs 0.3000: better by 0.0200, between single runs" in out
    assert "| lr" not in out
    fig = figure_of(["log/base", "log/new"], monkeypatch)
    assert [ax.get_title() for ax in fig.axes] == ["loss", "val_acc"] * 2  # steps, tokens


SOURCE = "import torch\n\n\nclass GPTConfig:\n    n_layer: int = 12\n    n_head: int = 12\n"


def test_what_differs_from_an_older_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {}
    for name in ("base", "rope", "same", "old", "resumed", "local", "deleted", "none", "new"):
        runs[name] = write_metrics(Path(name), val={0: 11.0})
    base_record = write_record(runs["base"], SOURCE)
    rope_source = SOURCE.replace("n_layer: int = 12", "n_layer: int = 6")
    rope_record = write_record(runs["rope"], rope_source, "1b2c3d4", n_layer=6)
    write_record(runs["same"], SOURCE)
    write_record(runs["old"])  # written before runs.jsonl recorded the code
    # a run resumed with another max_lr: its last record is the run that went on
    write_record(runs["resumed"], SOURCE)
    write_record(runs["resumed"], SOURCE, max_lr=1e-3)
    write_record(runs["local"], SOURCE, dataset="local")
    deleted = write_record(runs["deleted"], SOURCE)
    (runs["deleted"] / deleted["code"]).unlink()
    write_start(runs["new"], sources={**SOURCES, "train_gpt2.py": SOURCE}, total_batch_size=512)
    base, *others = [plot.read_run(path) for path in runs.values()]
    found = {run.name: plot.differences(base, run) for run in others}
    older = "same train_gpt2.py (an older record keeps no other module)"
    assert found.pop("rope") == [
        "## rope vs base",
        "n_layer: 12 -> 6",
        "git commit: 70a0414 -> 1b2c3d4",
        "code differs:",
        f"--- base/{base_record['code']}",
        f"+++ rope/{rope_record['code']}",
        "@@ -2,5 +2,5 @@",
        " ",
        " ",
        " class GPTConfig:",
        "-    n_layer: int = 12",
        "+    n_layer: int = 6",
        "     n_head: int = 12",
    ]
    new = found.pop("new")
    assert new[-1] == older and "n_head: not recorded -> 12" in new
    assert found == {
        "same": ["## same vs base", "same config", older],
        "old": [
            "## old vs base",
            "same config",
            "git commit: 70a0414 -> not recorded",
            "code not recorded (runs.jsonl of old)",
        ],
        "resumed": ["## resumed vs base", "max_lr: 0.0006 -> 0.001", older],
        "local": ["## local vs base", "data.dataset: fineweb-edu -> local", older],
        "deleted": [
            "## deleted vs base",
            "same config",
            f"train_gpt2.py: not compared, deleted/{deleted['code']} missing",
        ],
        "none": [
            "## none vs base",
            "config and code not compared: no run recorded in runs.jsonl of none",
        ],
    }


def test_gpt2s_lines_only_when_every_run_is_on_fineweb_edu(tmp_path):
    base, rope, old = three_runs(tmp_path)
    runs = [plot.read_run(path) for path in (base, rope)]
    assert plot.references_for(runs) == plot.REFERENCES
    arms = plot.group_arms(runs)
    drawn = reference_lines(plot.comparison_figure(arms, plot.REFERENCES))
    assert drawn == {"loss": [3.2924] * 2, "HellaSwag acc_norm": [0.2955, 0.337] * 2}
    # a run without runs.jsonl (data unknown), a run on other data
    assert plot.references_for(runs + [plot.read_run(old)]) is None
    write_record(rope, dataset="local")
    assert plot.references_for([plot.read_run(base), plot.read_run(rope)]) is None


# ----------------------------------------------------------------------------------------------
# what a run's files may hold: read as not recorded, never a traceback


@pytest.mark.parametrize(
    "line",
    [
        {"model": None},
        {"data": ["fineweb-edu"]},
        {"config": "n_layer=12"},
        {"config": {"seed": True, "total_batch_size": "512", "n_layer": [12]}},
        {"code": 5},
        {"code": {"train_gpt2.py": 5}},
        {"code": {"train_gpt2.py": "../../../etc"}},
        {"git": ["70a0414"]},
        {"git": {"commit": 7, "diff": 5, "untracked": "x"}},
        {"step": "9"},
        {"code_changed": "train_gpt2.py"},
    ],
    ids=lambda line: json.dumps(line)[:40],
)
def test_a_record_field_of_another_type_is_not_recorded(tmp_path, monkeypatch, capsys, line):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "a", 1)
    b = write_run(tmp_path, "b", 2)
    record = json.loads((b / "runs.jsonl").read_text().splitlines()[0])
    record.update(line)
    # then a resume under that record, a result, a line torn by a kill, one nested too deep
    result = {"result": {"status": "finished", "steps": 10, "val": 3.0, "config": {}}}
    tail = ["[" * 100_000, json.dumps(result), '{"step": 9, "con']
    (b / "runs.jsonl").write_text("\n".join([json.dumps(record)] * 2 + tail) + "\n")
    out = report_of(["a", "b"], capsys)
    assert "## b vs a" in out or "a: 2 runs" in out
    result = json_of(["a", "b"], capsys)
    assert len(result["comparisons"]) in (0, 2)


def test_a_result_record_is_not_a_start(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "a", 1)
    b = write_run(tmp_path, "b", 2)
    # b stopped at its end (a stop asked for at the last step): its result is not a start, and
    # the arm counts it out
    lines = (b / "runs.jsonl").read_text().splitlines()
    (b / "runs.jsonl").write_text(lines[0] + "\n")
    write_result(b, "stopped", 10)
    result = json_of(["a", "b"], capsys)
    assert arms_of(result) == {"a": ["a"]}
    assert result["arms"][0]["left_out"] == [{"run": "b", "seed": 2, "why": "stopped at step 10"}]


def test_an_unreadable_log_gets_a_few_warnings_and_a_count(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run = write_log(tmp_path / "run", "\x00\xff garbage\n" * 6229)
    plot.main(["run"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4
    assert all(line.startswith("plot.py: warning: run/log.txt:") for line in err)
    assert err[-1] == "plot.py: warning: run/log.txt: 6226 more lines skipped"
    assert (run / "curves.png").exists()


def test_drawing_prints_no_matplotlib_warnings(tmp_path, monkeypatch, capsys, recwarn):
    # names a font has no glyph for, and dollars matplotlib would read as mathtext
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "运行-🚀", 1)
    write_run(tmp_path, "$\\notacommand$", 2, max_lr=1e-3)
    add_metric(tmp_path / "运行-🚀", "acc_$x$_🚀", {10: 0.5})
    plot.main(["运行-🚀", "$\\notacommand$"])
    plot.main(["运行-🚀"])
    assert capsys.readouterr().err == ""
    assert [str(w.message) for w in recwarn] == []


def test_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path, monkeypatch):
    # .curves.png.tmpPID of a writer killed by kill -9: the next write removes it once it is
    # older than any live write; a live writer's (new) temp file is left to it
    monkeypatch.chdir(tmp_path)
    run = write_log(tmp_path / "run")
    for directory, name in ((run, "curves.png"), (tmp_path, "compare.png")):
        (directory / f".{name}.tmp4242").write_bytes(PNG + b"half")
        os.utime(directory / f".{name}.tmp4242", (1, 1))
        (directory / f".{name}.tmp4343").write_bytes(PNG)
    plot.main(["run"])
    write_log(tmp_path / "run2")
    plot.main(["run", "run2"])
    assert sorted(os.listdir(run)) == [".curves.png.tmp4343", "curves.png", "log.txt"]
    assert not (tmp_path / ".compare.png.tmp4242").exists()
    assert (tmp_path / ".compare.png.tmp4343").exists()


def test_a_failed_write_names_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "run")
    write_log(tmp_path / "run2")
    (tmp_path / "c.png").mkdir()  # where the picture would go: a directory
    message = main_error(plot.main, ["run", "run2", "--out", "c.png"])
    assert message.startswith("plot.py: error: cannot write c.png: ")
    (tmp_path / "run" / "curves.png").mkdir()
    message = main_error(plot.main, ["run"])
    assert message.startswith("plot.py: error: cannot write run/curves.png: ")
    assert sorted(p.name for p in tmp_path.rglob("*.tmp*")) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "no_such_run"], "no log.txt file at no_such_run/log.txt: give plot.py a training"),
        (["no_such_run"], "no log.txt file at no_such_run/log.txt"),
        (["empty"], "empty/log.txt holds no metrics yet: plot it once a step is logged"),
        (["run", "fifo"], "no log.txt file at fifo/log.txt"),  # reading a FIFO would hang
        (["run", "--out", "no_dir/c.png"], "--out no_dir/c.png: there is no directory no_dir"),
        (["run", "--out", "run/log.txt"], "--out run/log.txt: give a .png file"),
        (["run", "run2", "--out", "c.svg"], "--out c.svg: give a .png file"),
        (
            ["run", "run2", "--out", "run2/c.png"],
            "--out run2/c.png is in run2, a run's log_dir: give --out",
        ),
        (["lr", "lr2"], "lr, lr2: no metric logged yet, nothing to compare"),
        (["--json", "lr", "lr2"], "lr, lr2: no metric logged yet, nothing to compare"),
        (["run", "run/"], "run/ is given twice: give each run once"),
        # what plot.py did not draw: a file of the user's, another run's directory, a corpus
        (["run", "--out", "notes.png"], "--out notes.png is a file but not a PNG: give a new"),
        (["run", "--out", "other/c.png"], "--out other/c.png is inside the run in "),
        (["run", "run2", "--out", "corpus/c.png"], "--out corpus/c.png is inside the corpus "),
        (["run", "--arm", "a", "run2", "./run"], "./run is given twice: give each run once"),
        # a comparison of one run writes into no log_dir either
        (
            ["--arm", "a", "run", "--out", "run/c.png"],
            "--out run/c.png is in run, a run's log_dir: give --out",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "run")
    write_log(tmp_path / "run2")
    write_metrics(tmp_path / "lr", lr={0: 6e-4})
    write_metrics(tmp_path / "lr2", lr={0: 6e-4})
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.txt").write_text("")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "log.txt")
    (tmp_path / "notes.png").write_text("not a picture")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "runs.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / ".fineweb").mkdir(parents=True)
    before = sorted(tmp_path.rglob("*"))
    # sys.exit(message): Python prints the message on stderr and exits with status 1
    one_line_error(1, main_error(plot.main, args), "plot.py", message)
    assert sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "run" / "log.txt").read_text().startswith("0 "), "the log was written over"


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: log_dir"),
        (["run", "--bogus"], "unrecognized arguments: --bogus"),
        (["--arm", "base"], "--arm base: give the arm a name, then its log_dirs"),
        # the name forgotten: run would name the arm
        (["--arm", "run", "run2"], "--arm run: give the arm a name, then its log_dirs"),
        (["--arm", "a", "run", "--arm", "a", "run2"], "--arm a is given twice: name each arm"),
    ],
)
def test_bad_arguments_are_argparses_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "run")
    write_log(tmp_path / "run2")
    with pytest.raises(SystemExit) as exit:
        plot.main(args)
    one_line_error(exit.value.code, capsys.readouterr().err, "plot.py", message)


def test_cli_compares_runs_and_never_loads_pyplot(tmp_path):
    base, rope, old = three_runs(tmp_path)
    write_log(base, "12 tr")  # a torn line: one warning
    result = run_program("plot.py", ["log/base", "log/rope", "--out", "runs.png"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("log/base: 1 run") and result.stdout.endswith(
        "\nwrote runs.png\n"
    )
    assert "## log/rope vs log/base\n" in result.stdout
    assert "\ntotal_batch_size: 512 -> 1024\n" in result.stdout
    assert result.stderr.startswith("plot.py: warning: log/base/log.txt:")
    assert result.stderr.count("\n") == 1
    assert (tmp_path / "runs.png").read_bytes()[:8] == PNG
    # importing plot loads no matplotlib and no scipy, drawing loads no pyplot
    code = (
        "import sys, plot\n"
        "before = 'matplotlib' in sys.modules or 'scipy' in sys.modules\n"
        "plot.write_curves(sys.argv[1])\n"
        "print(before, 'matplotlib.pyplot' in sys.modules)\n"
    )
    child = run_program([sys.executable, "-c", code], [base])
    assert child.stdout == "False False\n", child.stderr


# ----------------------------------------------------------------------------------------------
# issue 49: what a run ran, over its whole history


def add_code(log_dir: Path, step: int, sources: dict):
    """A code_added line as the trainer appends it: modules the run imported after its start, first
    seen at step (a checkpoint's or the end's), kept under code/."""
    added = {relpath: keep(log_dir, relpath, text) for relpath, text in sources.items()}
    with open(log_dir / "runs.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "code_added": added}) + "\n")


def test_a_module_imported_after_the_start_is_the_runs_code_from_that_step(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    # four runs of one config: a and b import mylib/attn.py at step 5 (a lazy import of a
    # researcher's module), c imports another version of it, d never does
    attn = "def attention(q, k, v):\n    return q\n"
    edited = attn.replace("return q", "return k")
    for name, seed, source in (("a", 1, attn), ("b", 2, attn), ("c", 3, edited), ("d", 4, None)):
        run = write_run(tmp_path, name, seed)
        if source is not None:
            add_code(run, 5, {"mylib/attn.py": source})
    result = json_of(["a", "b", "c", "d"], capsys)
    assert arms_of(result) == {"a": ["a", "b"], "c": ["c"], "d": ["d"]}
    assert result["arms"][0]["code_changes"] == [{"step": 5, "modules": ["mylib/attn.py"]}]
    c, d = result["arms"][1:]
    assert "code differs:" in c["vs_baseline"] and "-    return q" in c["vs_baseline"]
    assert "+    return k" in c["vs_baseline"]
    assert "mylib/attn.py: imported by a only" in d["vs_baseline"]
    out = report_of(["a", "b", "c", "d"], capsys)
    assert "\ncode changed at step 5: mylib/attn.py\n" in out
    assert "same code" not in out


def test_same_code_means_over_the_whole_history(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    edited = {**SOURCES, "train_gpt2.py": SOURCES["train_gpt2.py"].replace("12\n", "6\n", 1)}
    write_run(tmp_path, "base", 1)
    # started under other code, resumed at step 5 under the baseline's: the same code at the end
    back = write_run(tmp_path, "back", 2, sources=edited, max_lr=1e-3)
    resume_run(back, 2, step=5, max_lr=1e-3)
    # an older resume without code: what ran before step 5 is not known
    unknown = write_run(tmp_path, "unknown", 3, max_lr=3e-4)
    lines = (unknown / "runs.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    del first["code"]
    (unknown / "runs.jsonl").write_text(json.dumps(first) + "\n" + "\n".join(lines[1:]) + "\n")
    resume_run(unknown, 3, step=5, max_lr=3e-4)
    runs = {name: plot.read_run(name) for name in ("base", "back", "unknown")}
    back_lines = plot.differences(runs["base"], runs["back"])
    assert "same code" not in back_lines
    assert "code differs before the runs' ends (the same at their ends):" in back_lines
    assert "back: code changed at step 5: train_gpt2.py" in back_lines
    unknown_lines = plot.differences(runs["base"], runs["unknown"])
    assert "same code" not in unknown_lines
    assert any(line.startswith("code not known to be the same: ") for line in unknown_lines)
    out = report_of(["base", "back", "unknown"], capsys)
    assert "same code" not in out


# ----------------------------------------------------------------------------------------------
# issue 49: which runs are seeds


def text_of(argv, capsys) -> str:
    """The report plot.py argv prints (main, drawing compare.png in the current directory)."""
    plot.main([*map(str, argv), "--out", "compare.png"])
    return capsys.readouterr().out


def test_a_run_is_a_seed_only_when_it_finished(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # the case: seed 2 of the edit stopped by SIGTERM at step 14 of 30, its last val
    # (step 10's, far higher) averaged with the step-30 values of the others; seed 3 still
    # training (or killed: no result after its start); seed 4 resumed after a stop and finished
    finals = {1: 3.10, 2: 3.08, 3: 3.12, 4: 3.09}
    for seed, value in finals.items():
        write_run(tmp_path, f"base-{seed}", seed, val={10: 3.6, 30: value}, steps=30, max_steps=30)
    write_run(tmp_path, "edit-1", 1, val={10: 3.5, 30: 3.05}, steps=30, max_steps=30, n_layer=6)
    stopped = {10: 3.55}
    write_run(
        tmp_path, "edit-2", 2, val=stopped, steps=14, status="stopped", max_steps=30, n_layer=6
    )
    write_run(tmp_path, "edit-3", 3, val={10: 3.5}, steps=12, status=None, max_steps=30, n_layer=6)
    resumed = write_run(tmp_path, "edit-4", 4, val={10: 3.5, 30: 3.04}, steps=30, max_steps=30)
    resume_run(resumed, 4, step=20, steps=30, max_steps=30, n_layer=6)
    runs = ["base-1", "base-2", "base-3", "base-4", "edit-1", "edit-2", "edit-3", "edit-4"]
    # (edit-4's first start had n_layer 12: rewritten as the edit's)
    lines = (resumed / "runs.jsonl").read_text().replace('"n_layer": 12', '"n_layer": 6')
    (resumed / "runs.jsonl").write_text(lines)
    result = json_of(runs, capsys)
    assert arms_of(result) == {"base-1": runs[:4], "edit-1": ["edit-1", "edit-4"]}
    edit = result["arms"][1]
    assert edit["left_out"] == [
        {"run": "edit-2", "seed": 2, "why": "stopped at step 14 of 30"},
        {
            "run": "edit-3",
            "seed": 3,
            "why": "no result after its start at step 0: still training, or killed",
        },
    ]
    assert edit["metrics"]["val"]["values"] == [3.05, 3.04]
    assert edit["metrics"]["val"]["steps"] == [30, 30]
    assert edit["end"] == {"steps": 30, "tokens": 30 * 512, "max_minutes": None}
    row = comparison(result, "val")
    assert row["n"] == [2, 4] and row["mean"] == pytest.approx(3.045)
    out = text_of(runs, capsys)
    assert "edit-1: 2 runs (edit-1, edit-4), seeds 1, 4\n" in out
    assert "\nleft out: edit-2 (seed 2): stopped at step 14 of 30\n" in out
    assert "\nleft out: edit-3 (seed 3): no result after its start at step 0" in out
    # the step each final value comes from
    assert "| val    | 3.0450 ± 0.0071 | 3.0500 3.0400 | 30   |" in out
    assert "2 vs 4 seeds" in row["verdict"]


def test_time_bounded_runs_are_compared_at_equal_training_time(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # --max_minutes: each run ends after the step that spends its budget, at a step its pace
    # sets (10, 8); one reached --max_steps first, before its budget was spent
    budget = {"max_minutes": 0.15, "max_steps": 12}
    write_run(tmp_path, "a1", 1, val={0: 4.0, 5: 3.0, 10: 2.0}, steps=10, **budget)
    write_run(tmp_path, "a2", 2, val={0: 4.0, 5: 3.2, 8: 2.6}, steps=8, **budget)
    write_run(tmp_path, "a3", 3, val={0: 4.0, 5: 3.0, 12: 1.8}, steps=12, seconds=0.5, **budget)
    result = json_of(["a1", "a2", "a3"], capsys)
    arm = result["arms"][0]
    assert arm["runs"] == ["a1", "a2"] and arm["metrics"]["val"]["steps"] == [10, 8]
    assert arm["end"] == {"steps": None, "tokens": None, "max_minutes": 0.15}
    why = "finished at step 12 (6,144 tokens); the arm's runs after 0.15 minutes of training"
    assert arm["left_out"] == [{"run": "a3", "seed": 3, "why": why}]
    out = text_of(["a1", "a2", "a3"], capsys)
    assert (
        "\ntime-bounded (--max_minutes 0.15): each run's final values are those at the end of its"
        " 0.15 minutes of training steps, compared at equal training time, not equal steps (the"
        " step column)\n"
    ) in out
    assert "| val    | 2.3000 ± 0.4243 | 2.0000 2.6000 | 10 8 |" in out


def test_an_arm_with_no_finished_run_is_not_compared(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "base", 1, val={10: 3.1})
    write_run(tmp_path, "edit", 1, val={5: 3.5}, steps=7, status=None, n_layer=6)
    result = json_of(["base", "edit"], capsys)
    assert result["comparisons"] == [] and result["arms"][1]["n"] == 0
    out = text_of(["base", "edit"], capsys)
    assert "edit: no run counted\nleft out: edit (seed 1): no result after its start" in out
    assert "## edit vs base\nnot compared: no run of edit counted (left out above)\n" in out


def test_a_seed_counts_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # three runs of seed 7 made an arm of "3 seeds" (p = 0.00018 against the baseline)
    for i, value in enumerate([3.100, 3.101, 3.102]):
        write_run(tmp_path, f"base-7{'abc'[i]}", 7, val={10: value})
    for seed, value in {1: 3.2, 2: 3.21, 3: 3.19}.items():
        write_run(tmp_path, f"edit-{seed}", seed, val={10: value}, n_layer=6)
    result = json_of(["base-7a", "base-7b", "base-7c", "edit-1", "edit-2", "edit-3"], capsys)
    base = result["arms"][0]
    assert base["runs"] == ["base-7a"] and base["n"] == 1 and base["seeds"] == [7]
    why = "seed 7 again: counted once, as base-7a (the first given)"
    assert base["left_out"] == [
        {"run": "base-7b", "seed": 7, "why": why},
        {"run": "base-7c", "seed": 7, "why": why},
    ]
    row = comparison(result, "val")
    assert row["p"] is None and "base-7a is a single run: no p-value" in row["verdict"]


def test_a_rerun_of_a_seed_into_the_free_log_dir_is_not_another_seed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "log"
    for seed, value in {1: 3.10, 2: 3.08, 3: 3.12}.items():
        write_run(log, f"base-{seed}", seed, val={10: value})
        write_run(log, f"edit-{seed}", seed, val={10: value - 0.05 + seed / 100}, n_layer=6)
    # seed 1 again, into the free directory the refusal named: `plot.py log/base-*` takes it in
    write_run(log, "base-1-2", 1, val={10: 3.5})
    given = ["log/base-1", "log/base-1-2", "log/base-2", "log/base-3"]
    given += ["log/edit-1", "log/edit-2", "log/edit-3"]
    out = text_of(given, capsys)
    assert "log/base-1: 3 runs (log/base-1, log/base-2, log/base-3), seeds 1, 2, 3\n" in out
    assert (
        "\nleft out: log/base-1-2 (seed 1): seed 1 again: counted once, as log/base-1 (the first"
        " given)\n"
    ) in out
    # the seeds are the same in both arms again: paired
    assert "3 vs 3 seeds, paired" in out
    # the first run of seed 1 killed: the rerun counts
    (log / "base-1" / "runs.jsonl").write_text(
        (log / "base-1" / "runs.jsonl").read_text().splitlines()[0] + "\n"
    )
    result = json_of(given, capsys)
    assert result["arms"][0]["runs"] == ["log/base-1-2", "log/base-2", "log/base-3"]
    assert result["arms"][0]["left_out"][0]["run"] == "log/base-1"


# ----------------------------------------------------------------------------------------------
# issue 49: arms named by hand


def test_the_null_comparison_is_one_command_with_shell_globs(tmp_path):
    # seeds 1-3 against 4-6 of one config and code: grouped by config they are one arm of six
    # runs; named, two arms compared (the false-positive check)
    log = tmp_path / "log"
    values = {1: 3.114, 2: 3.082, 3: 3.033, 4: 3.071, 5: 3.102, 6: 3.049}
    for seed, value in values.items():
        write_run(log, f"base-{seed}", seed, val={10: value})
    command = "python plot.py --json --arm base log/base-[123] --arm null log/base-[456]"
    command = command.replace("python plot.py", f"{sys.executable} {ROOT / 'plot.py'}")
    result = run_program(["bash", "-c", command], cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    found = json.loads(result.stdout)
    assert arms_of(found) == {
        "base": ["log/base-1", "log/base-2", "log/base-3"],
        "null": ["log/base-4", "log/base-5", "log/base-6"],
    }
    assert [arm["named"] for arm in found["arms"]] == [True, True]
    row = comparison(found, "val")
    assert (row["arm"], row["baseline"], row["test"]) == ("null", "base", "welch")
    assert row["p"] > 0.05 and "no difference beyond seed noise" in row["verdict"]
    assert found["arms"][1]["vs_baseline"] == ["same config", "same code"]
    # the text, with the picture
    command = command.replace(" --json", " --out c.png")
    result = run_program(["bash", "-c", command], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("base: 3 runs (log/base-1, log/base-2, log/base-3), seeds 1,")
    assert "\n\n## null vs base\n" in result.stdout
    assert "\nval 3.0740 vs 3.0763: no difference beyond seed noise (p = " in result.stdout
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    # without names: one arm of six, nothing compared
    plain = run_program("plot.py", ["--json", *[f"log/base-{s}" for s in values]], cwd=tmp_path)
    assert [arm["n"] for arm in json.loads(plain.stdout)["arms"]] == [6]


def test_a_named_arm_names_the_runs_that_differ_from_its_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    edited = {**SOURCES, "train_gpt2.py": SOURCES["train_gpt2.py"].replace("12\n", "6\n", 1)}
    for seed in (1, 2):
        write_run(tmp_path, f"wsd-{seed}", seed, val={10: 3.0 + seed / 100}, max_steps=10)
    # log/wsd-* sweeps in a longer run of other code that shares the prefix
    long = {10: 3.2, 20: 2.9}
    write_run(tmp_path, "wsd-long-1", 1, val=long, steps=20, max_steps=20, sources=edited)
    write_run(tmp_path, "base-1", 1, val={10: 3.05}, max_steps=10)
    argv = ["--arm", "base", "base-1", "--arm", "wsd", "wsd-1", "wsd-2", "wsd-long-1"]
    out = text_of(argv, capsys)
    assert "base: 1 run (base-1), seed 1\n" in out
    assert "wsd: 2 runs (wsd-1, wsd-2), seeds 1, 2\n" in out
    assert (
        "\nwarning: wsd-long-1 differs from wsd-1, the arm's first run: max_steps: 10 -> 20; code"
        " of train_gpt2.py\n"
    ) in out
    # it ended elsewhere: not one of the arm's seeds
    assert (
        "\nleft out: wsd-long-1 (seed 1): finished at step 20 (10,240 tokens); the arm's runs at"
        " step 10 (5,120 tokens)\n"
    ) in out
    result = json_of(argv, capsys)
    notes = result["arms"][1]["notes"]
    assert len(notes) == 1 and notes[0].startswith("warning: wsd-long-1 differs from wsd-1")
    # runs of one config and code named together: no warning
    assert result["arms"][0]["notes"] == []


# ----------------------------------------------------------------------------------------------
# issue 49: equal compute that a busy machine cannot fake


def test_seconds_are_withheld_when_the_step_times_do_not_differ_beyond_their_spread(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    steady = [0.117, 0.121] * 15
    base = {0: 4.0, 10: 3.0, 20: 2.5, 30: 2.0}
    # the baseline, its first step compiling for 30 s (a warm-up step: not its step time)
    write_run(tmp_path, "base-1", 1, val=base, steps=30, seconds=[30.0] + steady[1:])
    write_run(tmp_path, "base-2", 2, val=base, steps=30, seconds=steady)
    # the baseline again, bit for bit, its seed 2 run during a load peak (steps 10-29 slower)
    write_run(tmp_path, "again-1", 1, val=base, steps=30, seconds=steady)
    write_run(tmp_path, "again-2", 2, val=base, steps=30, seconds=steady[:10] + [0.2] * 20)
    # an edit that reaches the baseline's final val in two thirds of its steps at about the
    # same step time (122 against 119 ms): in seconds it would look faster still
    better = {0: 4.0, 10: 2.5, 20: 2.0, 30: 1.8}
    for seed in (1, 2):
        write_run(tmp_path, f"edit-{seed}", seed, val=better, steps=30, seconds=[0.12, 0.124] * 15)
    argv = ["--arm", "base", "base-1", "base-2", "--arm", "again", "again-1", "again-2"]
    argv += ["--arm", "edit", "edit-1", "edit-2"]
    result = json_of(argv, capsys)
    times = [arm["step_time"] for arm in result["arms"]]
    for found in times:
        assert found["low_ms"] <= found["median_ms"] <= found["high_ms"]
        assert found["warmup_steps"] == 5 and found["steps"] == 2 * (30 - 5)
        assert found["tok_per_s"] > 0
    # the compiling step is left out: the baseline's spread is its steady steps'
    assert times[0]["high_ms"] < 1000
    # the load peak widens the spread of the arm it fell on
    assert times[1]["high_ms"] > times[0]["high_ms"]
    for name in ("again", "edit"):
        row = comparison(result, "val", name)
        assert row["seconds_withheld"].startswith("the step times overlap within their spreads")
        assert row["time_to_baseline_s"] is None and row["time_ratio"] is None
        assert row["baseline_steps"] == 30 and row["baseline_tokens"] == 30 * 512
    edit = comparison(result, "val", "edit")
    assert edit["steps_to_baseline"] == pytest.approx(20)
    assert edit["tokens_to_baseline"] == pytest.approx(20 * 512)
    assert edit["step_ratio"] == pytest.approx(2 / 3)
    again = comparison(result, "val", "again")
    assert again["steps_to_baseline"] == pytest.approx(30) and again["step_ratio"] == 1
    out = text_of(argv, capsys)
    assert out.count("; each run's first 5 steps after a start left out\n") == 3
    assert (
        " ms median over 50 steps (spread 117.0..121.0 ms: its runs' lowest 25th to highest" in out
    )
    assert (
        "time: reaches base's final val 2.0000 at step 20 (0.67 x base's 30), 10,240 tokens (0.67"
        " x 15,360); seconds withheld: the step times overlap within their spreads (edit"
    ) in out


# ----------------------------------------------------------------------------------------------
# issue 49: no traceback on any record a run or a user can write


def test_final_values_near_the_float_limit_are_not_averaged(tmp_path):
    # a diverged run's val near 1e308: math.fsum's OverflowError was a traceback
    for seed, value in {1: 1.7e308, 2: 1.6e308, 3: 1.5e308}.items():
        write_run(tmp_path, f"base-{seed}", seed, val={0: 4.0, 10: value})
    for seed, value in {1: 1e308, 2: 1.1e308, 3: 0.9e308}.items():
        run = write_run(tmp_path, f"edit-{seed}", seed, val={0: 4.0, 10: value}, n_layer=6)
        add_metric(run, "ms", {10: 1.7e308})
    dirs = [f"base-{seed}" for seed in (1, 2, 3)] + [f"edit-{seed}" for seed in (1, 2, 3)]
    result = run_program("plot.py", [*dirs, "--out", "c.png"], cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "\nval: not compared, a final value is not finite or beyond 1e+150\n" in result.stdout
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    found = json.loads(run_program("plot.py", ["--json", *dirs], cwd=tmp_path).stdout)
    assert found["arms"][0]["metrics"]["val"]["mean"] is None
    assert comparison(found, "val")["p"] is None


def test_a_seed_that_is_not_an_int_is_named_and_not_paired(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for seed in (1, 2, 3):
        write_run(tmp_path, f"base-{seed}", seed, val={10: 3.1 + seed / 100})
    # seeds "1", true and 2.0 (hand-written records): a TypeError in the pairing was a traceback
    for name, seed in (("str", "1"), ("true", True), ("float", 2.0), ("int", 3)):
        write_run(tmp_path, f"edit-{name}", seed, val={10: 3.0 + len(name) / 100}, n_layer=6)
    dirs = ["base-1", "base-2", "base-3", "edit-str", "edit-true", "edit-float", "edit-int"]
    result = json_of(dirs, capsys)
    edit = result["arms"][1]
    assert edit["seeds"] == [None, None, None, 3] and edit["n"] == 4
    assert edit["notes"] == [
        'edit-str: seed "1" is not an integer: counted, not paired by seed',
        "edit-true: seed true is not an integer: counted, not paired by seed",
        "edit-float: seed 2.0 is not an integer: counted, not paired by seed",
    ]
    assert comparison(result, "val")["test"] == "welch"
    out = text_of(dirs, capsys)
    assert "edit-str: 4 runs (edit-str, edit-true, edit-float, edit-int), seeds ?, ?, ?, 3\n" in out


@pytest.mark.parametrize(
    "line",
    [
        {"result": "finished"},
        {"result": None},
        {"result": {"status": 1, "steps": "10"}},
        {"result": {"status": "finished", "steps": True}},
        {"result": {"status": "done", "steps": 10}},
        {"step": 5, "code_added": "mylib/attn.py"},
        {"step": "5", "code_added": {"mylib/attn.py": 5}},
        {"step": 5, "code_added": {"mylib/attn.py": "code/gone.py"}},
        {"step": 5, "code_added": []},
    ],
    ids=lambda line: json.dumps(line)[:40],
)
def test_a_result_or_code_added_line_of_another_shape_is_named(tmp_path, monkeypatch, capsys, line):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path, "a", 1)
    b = write_run(tmp_path, "b", 2)
    lines = (b / "runs.jsonl").read_text().splitlines()
    if "result" in line:
        lines[-1] = json.dumps(line)  # in place of its result
    else:
        lines.insert(1, json.dumps(line))
    (b / "runs.jsonl").write_text("".join(line + "\n" for line in lines))
    result = json_of(["a", "b"], capsys)
    out = text_of(["a", "b"], capsys)
    if "result" in line:
        assert arms_of(result) == {"a": ["a"]}
        assert result["arms"][0]["left_out"][0]["why"] == "its result record is not readable"
        assert "\nleft out: b (seed 2): its result record is not readable\n" in out
    else:
        # what b imported is not known: never the same code as a's
        assert arms_of(result) == {"a": ["a"], "b": ["b"]}
        assert "same code" not in out


def test_a_closed_stdout_ends_the_printing_quietly(tmp_path):
    # `plot.py --json ... | head -1` with the reader gone first: exit 0, nothing on stderr (a
    # BrokenPipeError was one line of error and exit 1)
    dirs = [write_run(tmp_path, f"base-{seed}", seed) for seed in (1, 2)]
    dirs.append(write_run(tmp_path, "edit-1", 1, n_layer=6))
    returncode, err = run_with_stdout_closed("plot.py", ["--json", *dirs])
    assert returncode == 0 and err == "", err
    returncode, err = run_with_stdout_closed("plot.py", [*dirs, "--out", tmp_path / "c.png"])
    assert returncode == 0 and err == "", err
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
    returncode, err = run_with_stdout_closed("plot.py", [dirs[0]])
    assert returncode == 0 and err == "", err
