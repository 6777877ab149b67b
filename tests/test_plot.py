"""plot.py: log.txt read as a resumed run wrote it, every kind drawn, GPT-2's lines only for a
FineWeb-Edu run, the PNG written atomically, and one line on stderr for bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def run_plot(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    argv = [sys.executable, str(ROOT / "plot.py"), *map(str, args)]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


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


def test_cli_draws_and_warns_and_never_loads_pyplot(tmp_path):
    log = write_log(tmp_path / "run", "12 tr")
    result = run_plot(log, "--out", tmp_path / "c.png")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"wrote {tmp_path / 'c.png'}\n"
    assert result.stderr.startswith(f"plot.py: warning: {log / 'log.txt'}:")
    assert result.stderr.count("\n") == 1
    # importing plot loads no matplotlib, drawing loads no pyplot
    code = (
        "import sys, plot\n"
        "before = 'matplotlib' in sys.modules\n"
        "plot.write_curves(sys.argv[1])\n"
        "print(before, 'matplotlib.pyplot' in sys.modules)\n"
    )
    argv = [sys.executable, "-c", code, str(log)]
    child = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.stdout == "False False\n", child.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "the following arguments are required: log_dir"),
        (("{d}", "--bogus"), "unrecognized arguments: --bogus"),
        (("{d}/no_such_run",), "no log.txt file at"),
        (("{d}/empty",), "holds no metrics yet"),
        (("{d}/fifo",), "no log.txt file at"),  # reading a FIFO would hang
        (("{d}/run", "--out", "{d}/no_dir/c.png"), "No such file or directory"),
        (("{d}/run", "--out", "{d}/run/log.txt"), "--out {d}/run/log.txt: give a .png file"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, args, message):
    write_log(tmp_path / "run")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.txt").write_text("")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "log.txt")
    result = run_plot(*(a.format(d=tmp_path) for a in args))
    assert result.returncode != 0
    assert result.stderr.startswith("plot.py: error: ")
    assert result.stderr.count("\n") == 1 and message.format(d=tmp_path) in result.stderr
    assert (tmp_path / "run" / "log.txt").read_text().startswith("0 "), "the log was written over"
