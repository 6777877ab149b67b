"""
Training curves: a run's log.txt drawn as one PNG, or several runs compared.

    python plot.py log                              # log/curves.png
    python plot.py log/shakespeare --out curves.png
    python plot.py log/base log/rope                # compare.png, a table, what differs

log.txt has one `step kind value` line per measured value; runs.jsonl one record per run start
(its config, its data, the train_gpt2.py it ran), the last one the run that went on.

One run: the losses (train, val) share a panel, HellaSwag (hella) has its own, and every other
kind gets one too: a new metric needs no code here.

Several runs: train and val loss, bits per byte (bpb) and HellaSwag, each run one colour, against
steps and against tokens (step x total_batch_size); a markdown table of each run's last val, bpb
and hella with its difference to the first run's; and for each run after the first, what differs
from the first in config and code.

GPT-2 124M's reference lines are drawn only when every run is on FineWeb-Edu: elsewhere they
mislead.

Imports the standard library and fineweb (its atomic write; matplotlib when it draws), never
train_gpt2, which imports this module.
"""

import argparse
import dataclasses
import difflib
import json
import sys
import time
from pathlib import Path

import fineweb

# the panel a kind is drawn on (by default its own)
PANELS = {"train": "loss", "val": "loss", "hella": "HellaSwag acc_norm"}
# GPT-2 124M's loss on FineWeb-Edu's val split, and the
# HellaSwag acc_norm of GPT-2 and GPT-3 124M (10,042 val)
REFERENCES = {
    "val": {"GPT-2 124M val": 3.2924},
    "hella": {"GPT-2 124M": 0.2955, "GPT-3 124M": 0.337},
}
# The train line's bookkeeping: drawn in a run's curves, left out of comparisons, which draw
# (and tabulate, all but the noisy train loss) every other kind the runs logged, a metric added
# to the trainer included. These kinds come first, in this order.
BOOKKEEPING = {"lr", "norm", "ms", "tok_per_s", "epoch", "mfu", "spike"}
FIRST = ["train", "val", "bpb", "hella"]
# in a comparison the train loss (every step, noisy) is thin and
# translucent, the evaluations (every few hundred steps) bold
THIN = {"lw": 1, "alpha": 0.35}
BOLD = {"lw": 2, "marker": "o", "markersize": 3}


def read_log(path, warn=None):
    """log.txt as {kind: [(step, value), ...]} sorted by step.

    A resumed run logs again the steps after its checkpoint:
    from the step where it starts, the earlier run's values
    are dropped (the curves are those of the run that went
    on). A line that is not `step kind value` (torn by a
    kill, edited by hand) is skipped, and warn() told its
    file:line.
    """
    series = {}
    last = -1
    text = Path(path).read_text(errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        try:
            step, kind, value = line.split()
            point = {int(step): float(value)}
        except ValueError:
            if warn is not None:
                warn(f"{path}:{number}: skipped, not 'step kind value': {line[:60]!r}")
            continue
        # A step lower than the last one is a run resumed there (or started again): what the
        # earlier run logged from that step on is not this run's history.
        if int(step) < last:
            series = {
                k: {s: v for s, v in pts.items() if s < int(step)} for k, pts in series.items()
            }
        last = int(step)
        series.setdefault(kind, {}).update(point)
    return {kind: sorted(v.items()) for kind, v in series.items() if v}


def read_metrics(log_dir, warn=None):
    """read_log of log_dir/log.txt, or an error that says what to
    give instead when there is nothing to draw."""
    log = Path(log_dir) / "log.txt"
    # is_file: reading a FIFO would hang
    if not log.is_file():
        raise FileNotFoundError(f"no log.txt file at {log}: give plot.py a training run's log_dir")
    series = read_log(log, warn)
    if not series:
        raise ValueError(f"{log} holds no metrics yet: plot it once a step is logged")
    return series


def last_run(log_dir):
    """The record of the last run start in log_dir/runs.jsonl
    (the run that went on), or None.

    A line torn by a kill (or not a run's record) is passed over.
    """
    path = Path(log_dir) / "runs.jsonl"
    # is_file: reading a FIFO would hang
    if not path.is_file():
        return None
    text = path.read_text(errors="replace")
    for line in reversed(text.splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("config"), dict):
            return record
    return None


def dataset_of(record):
    """The dataset a run record names ("fineweb-edu", "local", ...), or None."""
    data = record.get("data") if record else None
    if not isinstance(data, dict):
        return None
    return data.get("dataset")


def run_dataset(log_dir):
    """The dataset of the last run in log_dir, or None."""
    return dataset_of(last_run(log_dir))


def figure(series, references=None):
    """series drawn as a matplotlib Figure on the Agg canvas.

    references: {kind: {label: y}}, dashed lines on the kind's
    panel (REFERENCES: GPT-2's); None draws none.
    """
    # A bare Figure, no pyplot: a notebook's backend is untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = {}
    # the losses first, then every other kind by name
    for kind in sorted(series, key=lambda k: (PANELS.get(k) != "loss", k)):
        panels.setdefault(PANELS.get(kind, kind), []).append(kind)
    cols = min(len(panels), 3)
    rows = (len(panels) + cols - 1) // cols
    fig = Figure((6 * cols, 4 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (name, kinds) in enumerate(panels.items(), 1):
        ax = fig.add_subplot(rows, cols, i, title=name, xlabel="step")
        for kind in kinds:
            ax.plot(*zip(*series[kind]), label=kind)
            for label, y in (references or {}).get(kind, {}).items():
                ax.axhline(y, ls="--", label=f"{label} ({y})")
        ax.grid(alpha=0.3)
        ax.legend()
    return fig


def write_curves(log_dir, out=None, references=None, warn=None):
    """Draw log_dir/log.txt into out (default log_dir/curves.png).

    references: draw GPT-2's lines; None: for a FineWeb-Edu run.
    Written atomically: a viewer never sees half a PNG.
    """
    out = Path(log_dir) / "curves.png" if out is None else Path(out)
    series = read_metrics(log_dir, warn)
    if references is None:
        references = run_dataset(log_dir) == "fineweb-edu"
    fig = figure(series, REFERENCES if references else None)
    # the trainer and a plot.py run may write it at the same moment
    fineweb.write_atomic(out, lambda f: fig.savefig(f, format="png", dpi=100), unique=True)
    return out


def refresh(log_dir, warn, force=False):
    """write_curves during training, at most once a minute
    unless forced (a run's end): drawing takes about a second.
    A plot never stops a run (matplotlib missing, a full
    disk): warn() is told instead."""
    out = Path(log_dir) / "curves.png"
    if not force and out.exists() and time.time() - out.stat().st_mtime < 60:
        return
    try:
        write_curves(log_dir, warn=warn)
    except Exception as e:
        warn(f"warning: curves.png not updated ({type(e).__name__}: {e})")


# -----------------------------------------------------------------------------
# several runs compared


@dataclasses.dataclass
class Run:
    name: str  # the log_dir as given: the run's label in the picture and the tables
    log_dir: Path
    series: dict  # {kind: [(step, value), ...]}, as read_log returns it
    record: dict | None  # the last run start in runs.jsonl (None: not recorded)
    tokens_per_step: int | None  # its total_batch_size (None: drawn against steps only)


def read_run(log_dir, warn=None):
    """A run's metrics and its last record in runs.jsonl."""
    log_dir = Path(log_dir)
    series = read_metrics(log_dir, warn)
    record = last_run(log_dir)
    tokens_per_step = None
    if record is not None:
        tokens_per_step = record["config"].get("total_batch_size")
    if not isinstance(tokens_per_step, int):
        tokens_per_step = None
        if warn is not None:
            warn(f"{log_dir}: no total_batch_size in its runs.jsonl: drawn against steps only")
    return Run(str(log_dir), log_dir, series, record, tokens_per_step)


def draw_run(ax, run, kinds, color, x):
    """run's kinds on ax in its colour, against x: "step", or
    "tokens" (step x total_batch_size: the tokens trained on
    before the step). Labelled by the run's name, and the kind
    where the panel has two (loss: train and val)."""
    scale = 1 if x == "step" else run.tokens_per_step
    for kind in kinds:
        points = run.series.get(kind)
        if not points:
            continue
        steps = [step * scale for step, _ in points]
        values = [value for _, value in points]
        label = run.name if len(kinds) == 1 else f"{run.name} {kind}"
        style = THIN if kind == "train" else BOLD
        ax.plot(steps, values, color=color, label=label, **style)


def compared_kinds(runs):
    """The kinds some run logged, less BOOKKEEPING: FIRST's first,
    then the others by name."""
    logged = {kind for run in runs for kind in run.series} - BOOKKEEPING
    return [k for k in FIRST if k in logged] + sorted(logged - set(FIRST))


def comparison_figure(runs, references=None):
    """runs drawn together as a matplotlib Figure on the Agg canvas.

    A column per panel of the compared kinds (PANELS groups them);
    a row against steps, and a row against tokens holding the
    runs whose total_batch_size is known. Run i is colour Ci in
    every panel. references: as figure()'s.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    panels = {}
    for kind in compared_kinds(runs):
        panels.setdefault(PANELS.get(kind, kind), []).append(kind)
    if not panels:
        names = ", ".join(run.name for run in runs)
        raise ValueError(f"{names}: no metric logged yet, nothing to compare")
    rows = ["step"]
    if any(run.tokens_per_step for run in runs):
        rows.append("tokens")
    fig = Figure((6 * len(panels), 4 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    for row, x in enumerate(rows):
        for col, (title, kinds) in enumerate(panels.items()):
            index = row * len(panels) + col + 1
            ax = fig.add_subplot(len(rows), len(panels), index, title=title, xlabel=x)
            for i, run in enumerate(runs):
                if x == "tokens" and run.tokens_per_step is None:
                    continue
                draw_run(ax, run, kinds, f"C{i % 10}", x)
            for kind in kinds:
                for label, y in (references or {}).get(kind, {}).items():
                    ax.axhline(y, color="gray", ls="--", label=f"{label} ({y})")
            # 10B tokens read as 10G, not as an offset of 1e10
            if x == "tokens":
                ax.xaxis.set_major_formatter(EngFormatter())
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
    return fig


def references_for(runs):
    """GPT-2's lines (REFERENCES) when every run is on FineWeb-Edu,
    the data they were measured on; else None."""
    if all(dataset_of(run.record) == "fineweb-edu" for run in runs):
        return REFERENCES
    return None


def markdown(rows):
    """rows (the first the header) as a markdown table, its columns aligned."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        lines.append("| " + " | ".join(cells) + " |")
    rule = ["-" * width for width in widths]
    lines.insert(1, "| " + " | ".join(rule) + " |")
    return "\n".join(lines)


def table(runs):
    """Each run's last value of each compared kind but train (the
    value at the highest step that has one), its difference to the
    first run's, and that step, as a markdown table."""
    kinds = [kind for kind in compared_kinds(runs) if kind != "train"]
    header = ["run"]
    for kind in kinds:
        header += [kind, "diff", "step"]
    rows = [header]
    for run in runs:
        row = [run.name]
        for kind in kinds:
            points = run.series.get(kind)
            first_points = runs[0].series.get(kind)
            if not points:
                row += ["n/a", "", ""]
                continue
            step, value = points[-1]
            diff = ""
            if run is not runs[0] and first_points:
                diff = f"{value - first_points[-1][1]:+.4f}"
            row += [f"{value:.4f}", diff, str(step)]
        rows.append(row)
    return markdown(rows)


def value_differences(before, after, prefix=""):
    """`key: old -> new` for each key of two dicts whose values differ
    (a key one of them lacks: `not recorded`)."""
    lines = []
    keys = list(before) + [key for key in after if key not in before]
    for key in keys:
        old = before.get(key, "not recorded")
        new = after.get(key, "not recorded")
        if old != new:
            lines.append(f"{prefix}{key}: {old} -> {new}")
    return lines


def settings(record):
    """A run's config, its model's config over it (older records
    have none)."""
    merged = {**record["config"], **record.get("model", {})}
    return {k: v for k, v in merged.items() if k != "log_dir"}


def config_differences(first, run):
    """The config keys (log_dir left out: every run has its own),
    the model's (as built: an --init_from model is not the config's
    shape flags) and the data whose values differ from the first
    run's."""
    lines = value_differences(settings(first.record), settings(run.record))
    # a loss compares only on the same data: say so when it is not
    data_before = first.record.get("data") or {}
    data_after = run.record.get("data") or {}
    lines += value_differences(data_before, data_after, prefix="data.")
    if not lines:
        lines.append("same config")
    return lines


def git_commit(record):
    """The commit a run record names, or None (outside a git
    checkout, or a record older than the field)."""
    git = record.get("git")
    if not isinstance(git, dict):
        return None
    return git.get("commit")


def saved_code(run):
    """The path of the train_gpt2.py run ran, as its record names it, or None."""
    code = run.record.get("code")
    if not isinstance(code, str):
        return None
    return run.log_dir / code


def code_differences(first, run):
    """Whether run's train_gpt2.py differs from the first run's:
    "same code", or a unified diff; the git commits when they differ."""
    lines = []
    commits = [git_commit(first.record), git_commit(run.record)]
    if commits[0] != commits[1]:
        shown = [commit or "not recorded" for commit in commits]
        lines.append(f"git commit: {shown[0]} -> {shown[1]}")
    paths = [saved_code(first), saved_code(run)]
    unrecorded = [r.name for r, path in zip((first, run), paths) if path is None]
    if unrecorded:
        lines.append(f"code not recorded (runs.jsonl of {' and '.join(unrecorded)})")
        return lines
    # is_file: a file deleted since (or a FIFO) is not read
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        lines.append(f"code not compared: {' and '.join(missing)} missing")
        return lines
    before = paths[0].read_text(errors="replace").splitlines()
    after = paths[1].read_text(errors="replace").splitlines()
    if before == after:
        lines.append("same code")
        return lines
    lines.append("code differs:")
    lines += difflib.unified_diff(before, after, str(paths[0]), str(paths[1]), lineterm="")
    return lines


def differences(first, run):
    """What differs between run and the first run, in config and
    code, as lines for a terminal under a header line."""
    lines = [f"## {run.name} vs {first.name}"]
    unrecorded = [r.name for r in (first, run) if r.record is None]
    if unrecorded:
        names = " and ".join(unrecorded)
        lines.append(f"config and code not compared: no run recorded in runs.jsonl of {names}")
        return lines
    lines += config_differences(first, run)
    lines += code_differences(first, run)
    return lines


def report(runs):
    """The table, then what differs from the first run for each
    run after it: the text a comparison prints."""
    parts = [table(runs)]
    for run in runs[1:]:
        parts.append("\n".join(differences(runs[0], run)))
    return "\n\n".join(parts) + "\n"


def compare(log_dirs, out, warn=None):
    """Several runs: their curves drawn into out (atomically), the
    report printed."""
    runs = [read_run(log_dir, warn) for log_dir in log_dirs]
    fig = comparison_figure(runs, references_for(runs))
    text = report(runs)
    fineweb.write_atomic(Path(out), lambda f: fig.savefig(f, format="png", dpi=100), unique=True)
    print(text)
    return out


def check_out(out, log_dirs):
    """An error that says what to give instead, for an --out that is
    not a PNG in an existing directory, or, comparing runs, one
    inside a run's log_dir (which holds that run's files only)."""
    out = Path(out)
    # a PNG, never another file (a run's log.txt) written over
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out {out}: give a .png file")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: there is no directory {out.parent}: make it first")
    if len(log_dirs) == 1:
        return
    for log_dir in log_dirs:
        if out.parent.resolve().is_relative_to(Path(log_dir).resolve()):
            raise ValueError(
                f"--out {out} is in {log_dir}, a run's log_dir: give --out a .png outside"
                " the runs' log_dirs"
            )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="plot.py",
        usage=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Draw a run's log.txt as a PNG of its curves, or compare runs.\n\n"
            "  python plot.py LOG_DIR [--out PNG]              # LOG_DIR/curves.png\n"
            "  python plot.py LOG_DIR LOG_DIR ... [--out PNG]  # compare.png, a table, diffs"
        ),
    )
    parser.add_argument("log_dirs", nargs="+", metavar="log_dir", help="a training run's log_dir")
    parser.add_argument(
        "--out",
        metavar="PNG",
        help="the picture (default: LOG_DIR/curves.png; comparing runs, ./compare.png)",
    )
    args = parser.parse_args(argv)
    comparing = len(args.log_dirs) > 1
    out = args.out
    if out is None and comparing:
        out = "compare.png"

    def warn(message):
        print(f"plot.py: warning: {message}", file=sys.stderr)

    try:
        if out is not None:
            check_out(out, args.log_dirs)
        if comparing:
            out = compare(args.log_dirs, out, warn)
        else:
            out = write_curves(args.log_dirs[0], out, warn=warn)
    except (OSError, ValueError, ImportError) as e:
        sys.exit(f"plot.py: error: {e}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
