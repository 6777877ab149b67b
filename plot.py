"""
Training curves: a run's log.txt drawn as one PNG.

    python plot.py log                    # log/curves.png
    python plot.py log/shakespeare --out curves.png

log.txt has one `step kind value` line per measured value.
The losses (train, val) share a panel, HellaSwag (hella)
has its own, and every other kind gets one too: a new
metric needs no code here. GPT-2 124M's reference lines
are drawn for a run on FineWeb-Edu only (the last line of
runs.jsonl names the run's data): elsewhere they mislead.

Imports the standard library and fineweb (its atomic write;
matplotlib when it draws), never train_gpt2, which imports
this module.
"""

import argparse
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


def run_dataset(log_dir):
    """The data of the last run in log_dir/runs.jsonl, or None.

    The last line that is a run's record counts: a line torn
    by a kill (or not a run's) is passed over.
    """
    path = Path(log_dir) / "runs.jsonl"
    # is_file: reading a FIFO would hang
    text = path.read_text(errors="replace") if path.is_file() else ""
    for line in reversed(text.splitlines()):
        try:
            return json.loads(line)["data"]["dataset"]
        except (ValueError, KeyError, TypeError):
            continue
    return None


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
    log = Path(log_dir) / "log.txt"
    out = Path(log_dir) / "curves.png" if out is None else Path(out)
    if not log.is_file():
        raise FileNotFoundError(f"no log.txt file at {log}: give plot.py a training run's log_dir")
    series = read_log(log, warn)
    if not series:
        raise ValueError(f"{log} holds no metrics yet: plot it once a step is logged")
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


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="plot.py",
        usage=argparse.SUPPRESS,
        description="Draw a run's log.txt as a PNG of its curves.",
    )
    parser.add_argument("log_dir", help="a training run's log_dir")
    parser.add_argument("--out", help="the PNG (default LOG_DIR/curves.png)")
    args = parser.parse_args(argv)
    # a PNG, never another file (the run's log.txt) written over
    if args.out and not args.out.lower().endswith(".png"):
        parser.error(f"--out {args.out}: give a .png file")
    try:
        out = write_curves(
            args.log_dir,
            args.out,
            warn=lambda message: print(f"plot.py: warning: {message}", file=sys.stderr),
        )
    except (OSError, ValueError, ImportError) as e:
        sys.exit(f"plot.py: error: {e}")
    except KeyboardInterrupt:
        sys.exit(f"plot.py: stopped; {args.out or 'curves.png'} is as it was")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
