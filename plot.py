"""
Training curves: a run's log.txt, every kind of value it holds, drawn as one PNG.

    python plot.py log                      # log/curves.png
    python plot.py log/shakespeare --out curves.png

log.txt has one `step kind value` line per measured value (train_gpt2.Metrics writes them): losses (train, val)
share a panel, HellaSwag (hella) has its own, and every other kind (lr, norm, ms, tok_per_s, mfu, or one you add)
gets a panel too, so a new metric needs no code here. GPT-2 124M's reference lines (val loss 3.2924, HellaSwag
0.2955) are drawn only for a run on FineWeb-Edu (header.txt records what its manifest.json said): on other data
they would mislead.
train_gpt2.py redraws curves.png at each checkpoint; play.ipynb shows it.

Importing this module does nothing but define things. It never imports train_gpt2: a training run imports it,
and train_gpt2.py running as a script must not be loaded a second time as a module.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

from run_files import Parser, atomic_write, check_path, write_error

GPT2_124M_VAL_LOSS = 3.2924  # OpenAI's GPT-2 124M on the FineWeb-Edu val split: the loss to beat
HELLASWAG_BASELINES = {"GPT-2 124M": 0.2955, "GPT-3 124M": 0.337}  # acc_norm on the 10,042 val examples
LOSSES = ("train", "val")  # drawn together on the first panel


def read_log(path: str | os.PathLike, warn=lambda message: None) -> dict[str, list[tuple[int, float]]]:
    """Parse log.txt into {kind: [(step, value), ...]} sorted by step; the last value logged for a step wins
    (a resumed run logs again the steps after its checkpoint). A line that is not `step kind value` (cut short by
    a full disk, edited by hand) is skipped, and warn() told where."""
    series: dict[str, dict[int, float]] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            step, kind, value = line.split()
            series.setdefault(kind, {})[int(step)] = float(value)
        except ValueError:
            warn(f"warning: {path}:{lineno}: skipped, not '<step> <kind> <value>': {line[:80]!r}")
    return {kind: sorted(values.items()) for kind, values in series.items()}


def run_dataset(log_dir: str | os.PathLike) -> str | None:
    """The dataset the run's data came from ("fineweb-edu", "local", ...), as the newest block of header.txt has it."""
    import json

    path, blocks, pos = Path(log_dir) / "header.txt", [], 0
    text = path.read_text() if path.is_file() else ""
    while (pos := len(text) - len(text[pos:].lstrip())) < len(text):
        block, pos = json.JSONDecoder().raw_decode(text, pos)
        blocks.append(block)
    return blocks[-1].get("data", {}).get("dataset") if blocks else None


def curves_png(log_dir: str | os.PathLike, warn=lambda message: None) -> bytes:
    """log_dir/log.txt drawn as PNG bytes: the losses, HellaSwag, and one panel per other kind. Unreadable lines
    are skipped, each named to warn()."""
    log_path, skipped = Path(log_dir) / "log.txt", []
    try:
        check_path(log_path, "log", is_dir=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{log_path} does not exist; it is written by a training run with --log_dir {log_dir}") from None
    series = read_log(log_path, skipped.append)
    if not series:
        raise ValueError(f"{log_path} holds no metrics" + (f" ({len(skipped)} line(s) unreadable; the first: "
                                                             f"{skipped[0].split(': ', 1)[1]})" if skipped else " yet"))
    for message in skipped:
        warn(message)
    # A bare Figure on the Agg canvas: no pyplot, so no global backend switch (a notebook's plots are untouched).
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = (["loss"] if any(k in series for k in LOSSES) else []) + sorted(k for k in series if k not in LOSSES)
    references = run_dataset(log_dir) == "fineweb-edu"  # GPT-2's numbers are on FineWeb-Edu's val split
    cols = min(len(panels), 3)
    fig = Figure(figsize=(6 * cols, 4.2 * math.ceil(len(panels) / cols)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(math.ceil(len(panels) / cols), cols, squeeze=False).ravel()
    for ax, panel in zip(axes, panels):
        for kind in LOSSES if panel == "loss" else (panel,):
            if series.get(kind):
                ax.plot(*zip(*series[kind]), label=f"{kind} loss" if panel == "loss" else "ours")
        if panel == "loss" and references:
            ax.axhline(GPT2_124M_VAL_LOSS, color="red", linestyle="--", label=f"GPT-2 124M val ({GPT2_124M_VAL_LOSS})")
        if panel == "hella" and references:
            for (name, acc), color in zip(HELLASWAG_BASELINES.items(), ("red", "green")):
                ax.axhline(acc, color=color, linestyle="--", label=f"{name} ({acc})")
        ax.set(xlabel="step", title={"loss": "loss", "hella": "HellaSwag acc_norm"}.get(panel, panel))
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_curves(log_dir: str | os.PathLike, out: str | os.PathLike | None = None, warn=lambda message: None) -> Path:
    """Draw log_dir/log.txt into `out` (default log_dir/curves.png), atomically: a viewer never sees half a PNG."""
    png = curves_png(log_dir, warn)
    out = Path(log_dir) / "curves.png" if out is None else Path(out)
    try:
        atomic_write(out, lambda f: f.write(png))
    except OSError as e:  # a full disk, a directory that is not there: the old curves.png, if any, is intact
        raise OSError(f"could not write {out} ({write_error(e)})") from None
    return out


def refresh(log_dir: str | os.PathLike):
    """Redraw log_dir/curves.png during training. A plot never stops a run: a problem is reported, not raised."""
    try:
        write_curves(log_dir, warn=lambda message: print(message, file=sys.stderr))
    except Exception as e:  # matplotlib missing, a full disk: say so, and train on
        print(f"warning: curves.png not updated ({type(e).__name__}: {e})", file=sys.stderr)


def main(argv: list[str] | None = None):
    parser = Parser(prog="plot.py", description="Draw a run's log.txt as curves.png.")
    parser.add_argument("log_dir", help="the --log_dir of a training run (it holds log.txt)")
    parser.add_argument("--out", default=None, help="PNG path (default: LOG_DIR/curves.png)")
    args = parser.parse_args(argv)
    logging.getLogger("matplotlib").setLevel(logging.ERROR)  # e.g. its font cache on a full disk: not plot's error
    try:
        print(f"wrote {write_curves(args.log_dir, args.out, warn=lambda message: print(message, file=sys.stderr))}")
    except (ValueError, OSError) as e:
        sys.exit(f"plot.py: error: {e}")


if __name__ == "__main__":
    main()
