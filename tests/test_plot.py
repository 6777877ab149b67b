"""plot.py: log.txt read as a resumed run wrote it, every kind drawn, GPT-2's lines only for
FineWeb-Edu runs, the PNG written atomically; several runs compared (one picture against steps and
tokens, a table of their last values, what differs in config and code); one line on stderr for bad
input."""

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import main_error, one_line_error, run_program

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
# several runs compared


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
    """A run start appended to runs.jsonl as the trainer writes it; source: the train_gpt2.py it
    ran, saved under code/ (None: an older record, without code, git, versions, device, time)."""
    config = {"n_layer": 12, "max_lr": 6e-4, "total_batch_size": 512, **config}
    record = {
        "step": 0,
        "resumed_from": None,
        "config": {**config, "log_dir": str(log_dir)},
        "data": {"tokenizer": {"tokenizer": "gpt2", "vocab": None}, "dataset": dataset},
        "world_size": 1,
    }
    if source is not None:
        name = f"code/train_gpt2-{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
        (log_dir / "code").mkdir(parents=True, exist_ok=True)
        (log_dir / name).write_text(source)
        record["device"] = "cpu"
        record["versions"] = {"python": "3.11.7", "torch": "2.13.0", "cuda": None}
        record["code"] = name
        record["git"] = {"commit": commit, "diff": None}
        record["time"] = "2026-12-02T22:40:00+00:00"
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


def table_rows(text: str) -> dict:
    """{first cell: the others joined by |} of each row of the markdown table text starts with;
    the rule under its header checked and left out."""
    lines = text.split("\n\n")[0].splitlines()
    assert set(lines[1]) == {"|", " ", "-"}
    rows = {}
    for line in lines[:1] + lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = "|".join(cells[1:])
    return rows


def test_comparing_runs_prints_their_last_values_and_differences(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    three_runs(tmp_path)
    plot.main(["log/base", "log/rope", "log/old/"])
    out, err = capsys.readouterr()
    rows = table_rows(out)
    assert rows.pop("run") == "val|diff|step|bpb|diff|step|hella|diff|step"
    # each value at the highest step that has one, minus the first run's
    assert rows == {
        "log/base": "4.5000||10|1.3500||10|0.2800||10",
        "log/rope": "4.2787|-0.2213|10|1.2842|-0.0658|10|0.2711|-0.0089|5",
        "log/old": "4.6000|+0.1000|8|n/a|||n/a||",
    }
    assert "\n\n## log/rope vs log/base\n" in out and "\n\n## log/old vs log/base\n" in out
    assert out.endswith("\nwrote compare.png\n")
    # the picture in the current directory, never in a run's log_dir
    assert (tmp_path / "compare.png").read_bytes()[:8] == PNG
    for run in ("base", "rope", "old"):
        assert "compare.png" not in os.listdir(tmp_path / "log" / run)
    warning = "log/old: no total_batch_size in its runs.jsonl: drawn against steps only"
    assert err == f"plot.py: warning: {warning}\n"


def test_a_metric_the_trainer_adds_is_compared_too(tmp_path, monkeypatch, capsys):
    # a researcher's new metric (val_acc) gets a column and a panel with no edit of plot.py; the
    # train line's bookkeeping (lr here) gets neither
    monkeypatch.chdir(tmp_path)
    for name, acc in (("base", 0.30), ("new", 0.32)):
        run = write_metrics(
            tmp_path / "log" / name, train=TRAIN, val={10: 4.5}, val_acc={10: acc}, lr={0: 6e-4}
        )
        write_record(run)
    plot.main(["log/base", "log/new"])
    rows = table_rows(capsys.readouterr().out)
    assert rows.pop("run") == "val|diff|step|val_acc|diff|step"
    assert rows["log/new"] == "4.5000|+0.0000|10|0.3200|+0.0200|10"
    runs = [plot.read_run(Path("log") / name) for name in ("base", "new")]
    titles = [ax.get_title() for ax in plot.comparison_figure(runs).axes]
    assert titles == ["loss", "val_acc"] * 2  # against steps, then tokens


SOURCE = "import torch\n\n\nclass GPTConfig:\n    n_layer: int = 12\n    n_head: int = 12\n"


def test_what_differs_from_the_first_run_in_config_and_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = {}
    for name in ("base", "rope", "same", "old", "resumed", "local", "deleted", "none"):
        runs[name] = write_metrics(Path("log") / name, val={0: 11.0})
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
    base, *others = [plot.read_run(path) for path in runs.values()]
    found = {run.name: plot.differences(base, run) for run in others}

    assert found.pop("log/rope") == [
        "## log/rope vs log/base",
        "n_layer: 12 -> 6",
        "git commit: 70a0414 -> 1b2c3d4",
        "code differs:",
        f"--- log/base/{base_record['code']}",
        f"+++ log/rope/{rope_record['code']}",
        "@@ -2,5 +2,5 @@",
        " ",
        " ",
        " class GPTConfig:",
        "-    n_layer: int = 12",
        "+    n_layer: int = 6",
        "     n_head: int = 12",
    ]
    assert found == {
        "log/same": ["## log/same vs log/base", "same config", "same code"],
        "log/old": [
            "## log/old vs log/base",
            "same config",
            "git commit: 70a0414 -> not recorded",
            "code not recorded (runs.jsonl of log/old)",
        ],
        "log/resumed": ["## log/resumed vs log/base", "max_lr: 0.0006 -> 0.001", "same code"],
        "log/local": [
            "## log/local vs log/base",
            "data.dataset: fineweb-edu -> local",
            "same code",
        ],
        "log/deleted": [
            "## log/deleted vs log/base",
            "same config",
            f"code not compared: log/deleted/{deleted['code']} missing",
        ],
        "log/none": [
            "## log/none vs log/base",
            "config and code not compared: no run recorded in runs.jsonl of log/none",
        ],
    }


def drawn_lines(ax) -> dict:
    """{label: (colour, x, y, line width, alpha)} of the lines of a panel."""
    found = {}
    for line in ax.get_lines():
        xy = (list(line.get_xdata()), list(line.get_ydata()))
        found[line.get_label()] = (line.get_color(), *xy, line.get_linewidth(), line.get_alpha())
    return found


def test_the_comparison_draws_each_run_in_one_colour_against_steps_and_tokens(tmp_path):
    runs = [plot.read_run(path) for path in three_runs(tmp_path)]
    fig = plot.comparison_figure(runs)
    panels = [(ax.get_title(), ax.get_xlabel()) for ax in fig.axes]
    titles = ["loss", "bpb", "HellaSwag acc_norm"]
    assert panels == [(t, "step") for t in titles] + [(t, "tokens") for t in titles]
    loss, bpb, hella, loss_tokens, bpb_tokens, hella_tokens = map(drawn_lines, fig.axes)
    base, rope, old = [str(run.log_dir) for run in runs]
    assert list(loss) == [
        f"{name} {kind}" for name in (base, rope, old) for kind in ("train", "val")
    ]
    # one colour a run in every panel; train thin and translucent, val bold
    assert {loss[f"{base} val"][0], loss[f"{base} train"][0], hella[base][0]} == {"C0"}
    assert {loss[f"{rope} val"][0], bpb_tokens[rope][0], hella_tokens[rope][0]} == {"C1"}
    assert loss[f"{old} val"][0] == "C2"
    assert loss[f"{base} train"][3:] == (1, 0.35)
    assert loss[f"{base} val"][3:] == (2, None)
    assert bpb[rope][1:3] == ([0, 5, 10], [3.3, 2.1, 1.2842])
    assert hella[rope][1] == [0, 5]
    # tokens: step x the run's total_batch_size; the run without one against steps only
    assert list(loss_tokens) == [
        f"{name} {kind}" for name in (base, rope) for kind in ("train", "val")
    ]
    assert loss_tokens[f"{base} val"][1] == [0, 5 * 512, 10 * 512]
    assert bpb_tokens[rope][1] == [0, 5 * 1024, 10 * 1024]
    assert loss_tokens[f"{rope} train"][1] == [step * 1024 for step in range(11)]
    assert reference_lines(fig) == {}


def test_gpt2s_lines_only_when_every_run_is_on_fineweb_edu(tmp_path):
    base, rope, old = three_runs(tmp_path)
    runs = [plot.read_run(path) for path in (base, rope)]
    assert plot.references_for(runs) == plot.REFERENCES
    drawn = reference_lines(plot.comparison_figure(runs, plot.REFERENCES))
    assert drawn == {"loss": [3.2924] * 2, "HellaSwag acc_norm": [0.2955, 0.337] * 2}
    # a run without runs.jsonl (data unknown), a run on other data
    assert plot.references_for(runs + [plot.read_run(old)]) is None
    write_record(rope, dataset="local")
    assert plot.references_for([plot.read_run(base), plot.read_run(rope)]) is None


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
        (["lr", "lr"], "lr, lr: no metric logged yet, nothing to compare"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    write_log(tmp_path / "run")
    write_log(tmp_path / "run2")
    write_metrics(tmp_path / "lr", lr={0: 6e-4})
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.txt").write_text("")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "log.txt")
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
    ],
)
def test_bad_arguments_are_argparses_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        plot.main(args)
    one_line_error(exit.value.code, capsys.readouterr().err, "plot.py", message)


def test_cli_compares_runs_and_never_loads_pyplot(tmp_path):
    base, rope, old = three_runs(tmp_path)
    write_log(base, "12 tr")  # a torn line: one warning
    result = run_program("plot.py", ["log/base", "log/rope", "--out", "runs.png"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("| run ") and result.stdout.endswith("\nwrote runs.png\n")
    assert "## log/rope vs log/base\ntotal_batch_size: 512 -> 1024\n" in result.stdout
    assert result.stderr.startswith("plot.py: warning: log/base/log.txt:")
    assert result.stderr.count("\n") == 1
    assert (tmp_path / "runs.png").read_bytes()[:8] == PNG
    # importing plot loads no matplotlib, drawing loads no pyplot
    code = (
        "import sys, plot\n"
        "before = 'matplotlib' in sys.modules\n"
        "plot.write_curves(sys.argv[1])\n"
        "print(before, 'matplotlib.pyplot' in sys.modules)\n"
    )
    child = run_program([sys.executable, "-c", code], [base])
    assert child.stdout == "False False\n", child.stderr
