"""
Training curves: a run's log.txt drawn as one PNG, or runs compared with their seed noise.

    python plot.py log                              # log/curves.png
    python plot.py log/shakespeare --out curves.png
    python plot.py log/base-1 log/base-2 log/rope-1 log/rope-2   # compare.png and a report
    python plot.py --json log/base-* log/rope-*     # the report as JSON (a picture only with --out)
    python plot.py --arm base log/base-[123] --arm null log/base-[456]   # arms named by hand

log.txt has one `step kind value` line per measured value (tokens and time, the tokens and the
training seconds so far, are bookkeeping); runs.jsonl one start record per process start (its
config, model, data, the kept sources of every module it imported, its git commit and diff), a
code_added line when a run imported, after its start, modules it had not recorded, and a result
record when a run ends (finished or stopped).

One run: the losses (train, val) share a panel, HellaSwag (hella) has its own, and every other
kind gets one too: a new metric needs no code here.

Several runs are grouped into arms: runs whose configs differ only in seed, log_dir and resume,
on the same data, that ran the same sources of every module (over their whole history: a resume
under other code, or a module imported after the start, which a code_added line records, makes
another run from that step) are one arm, named by its first run. `--arm NAME LOG_DIR ...`
(repeatable) makes an arm by hand, after the log_dirs grouped so: seeds 1-3 against 4-6 of one
config is the null comparison, the check of the false-positive rate at the spread seen. A run of
a named arm whose config or code differs from the arm's first run's is named in a warning line.

Which runs are an arm's seeds: a run counts when the result after its last start says it
finished, where most of the arm's finished runs ended (the same step and tokens; a time-bounded
run, --max_minutes, at the end of its budget: such runs are compared at equal training time,
not equal steps), and once a seed (the first given of a seed counts). The others are named with
why: stopped (at step 14 of 30), no result (still training, or killed), ended elsewhere, the
seed again. A run whose records are older than result records counts, with a note that its end
is not recorded. A seed is an int (never a bool): a run whose seed is not is named, and the
arms are not paired.

The report:
- each arm: n, the runs left out and why, its notes, its step time and throughput, and for each
  metric (train, val, bpb, hella, any kind a fork logs) the mean, the sample standard deviation,
  each run's final value (its last logged one) and the step it comes from;
- each arm after the first against the first (the baseline), metric by metric: the difference of
  means with its 95% confidence interval and p-value (a paired t-test when both arms ran the same
  seeds, each once, else Welch's; scipy's), in words; when no difference is found, how many seeds
  would find the observed one; and the steps, tokens and training seconds at which the arm's mean
  curve first reaches the baseline's final mean (equal compute);
- what differs from the baseline: config, data, and the code (a unified diff of each module that
  differs; a change of code at a resume or by a module imported later; the files only a git diff
  holds, named). "same code" only for runs that ran the same sources over their whole histories.
A final value beyond 1e150 (a diverged run) is not averaged or tested (its square would overflow).

Equal compute that a busy machine cannot fake: an arm's step time is the median of the ms its
runs logged at every step but the first 5 after each process start (compilation, warm-up), its
spread from the lowest run's 25th percentile to the highest run's 75th (a run slowed by a load
peak widens it). The time to the baseline's final value is given in seconds only when the two
arms' spreads do not overlap; else the seconds are withheld, and why said: the steps and tokens
stand either way.

compare.png draws each arm's counted runs as their mean curve and a band (min..max) against steps,
tokens and training seconds. --json prints {"arms": [...], "comparisons": [...]}:
- an arm: {"name", "named" (by --arm), "runs", "n", "seeds" (of the runs counted; a seed that is
  not an int: null), "left_out": [{"run", "seed", "why"}], "end": {"steps", "tokens",
  "max_minutes"} (where its runs ended; max_minutes for a time-bounded arm), "notes" (the lines the
  text prints under its header, warnings included), "step_time": {"median_ms", "low_ms",
  "high_ms", "tok_per_s", "steps", "warmup_steps"} (null: no ms logged), "metrics": {KIND:
  {"mean", "sd", "values", "steps", "n"}}, "code_changes": [{"step", "modules"}], "vs_baseline"}
  (vs_baseline: the lines the text prints of what differs from the baseline; None for it);
- a comparison: {"arm", "baseline", "metric", "test", "mean", "baseline_mean", "n", "diff",
  "ci95", "p", "seeds_needed", "steps_to_baseline", "baseline_steps", "step_ratio",
  "tokens_to_baseline", "baseline_tokens", "token_ratio", "time_to_baseline_s",
  "baseline_time_s", "time_ratio", "seconds_withheld" (why the seconds are null, or null),
  "verdict"}.

GPT-2 124M's reference lines are drawn only when every run is on FineWeb-Edu: elsewhere they
mislead.

Imports the standard library and fineweb (its atomic write, and say: a closed stdout ends the
printing quietly) at module level; matplotlib when it draws, numpy and scipy when it compares;
never harness or train_gpt2 (harness.py imports this module).
"""

import argparse
import dataclasses
import difflib
import hashlib
import io
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

# Ctrl-C while numpy loads (fineweb imports it) ends the program in one line
try:
    import fineweb
except KeyboardInterrupt:
    sys.exit(f"{Path(sys.argv[0]).name}: interrupted while starting; nothing was written")

# the panel a kind is drawn on (by default its own)
PANELS = {"train": "loss", "val": "loss", "hella": "HellaSwag acc_norm"}
# GPT-2 124M's loss on FineWeb-Edu's val split, and the
# HellaSwag acc_norm of GPT-2 and GPT-3 124M (10,042 val)
REFERENCES = {
    "val": {"GPT-2 124M val": 3.2924},
    "hella": {"GPT-2 124M": 0.2955, "GPT-3 124M": 0.337},
}
# The train line's bookkeeping: drawn in a run's curves, left out of comparisons, which draw and
# compare every other kind the runs logged, a metric added to the trainer included. These kinds
# come first, in this order.
BOOKKEEPING = {"lr", "norm", "ms", "tok_per_s", "epoch", "mfu", "spike", "tokens", "time"}
FIRST = ["train", "val", "bpb", "hella"]
# in a comparison the train loss (every step, noisy) is thin and
# translucent, the evaluations (every few hundred steps) bold
THIN = {"lw": 1, "alpha": 0.35}
BOLD = {"lw": 2, "marker": "o", "markersize": 3}
# what a comparison draws against, and the label of each axis
AXES = {"step": "step", "tokens": "tokens", "time": "training seconds"}
# the config fields that say how one run of an arm was made, not what the arm is
RUN_ONLY = {"seed", "log_dir", "resume"}
# skipped log lines named one by one; the rest counted
MAX_WARNINGS = 3
# A final value beyond LARGEST (a diverged run) is not averaged or tested: the squares a standard
# deviation and a t-test take would overflow a float (1.8e308), and a mean of values near 1e308 too
LARGEST = 1e150
# the steps after each process start that an arm's step time leaves out: compilation and warm-up
# make them slow
WARMUP_STEPS = 5
# a comparison's test: significant below ALPHA; the power of the number of seeds it suggests
ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000


def read_log(path, warn=None):
    """log.txt as {kind: [(step, value), ...]} sorted by step.

    A resumed run logs again the steps after its checkpoint:
    from the step where it starts, the earlier run's values
    are dropped (the curves are those of the run that went
    on). A line that is not `step kind value` (torn by a
    kill, edited by hand) is skipped; warn() is told the
    file:line of the first few and how many more.
    """
    series = {}
    last = -1
    skipped = 0
    text = Path(path).read_text(errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        try:
            step, kind, value = line.split()
            point = {int(step): float(value)}
        except ValueError:
            skipped += 1
            if warn is not None and skipped <= MAX_WARNINGS:
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
    if warn is not None and skipped > MAX_WARNINGS:
        warn(f"{path}: {skipped - MAX_WARNINGS} more lines skipped")
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


# -----------------------------------------------------------------------------
# runs.jsonl


def field(record, key, kind):
    """record[key] when it is a kind (an int never a bool), else None: a field of another type is
    read as not recorded."""
    value = record.get(key)
    if kind is int and isinstance(value, bool):
        return None
    if isinstance(value, kind):
        return value
    return None


def strings(value):
    """value when it is a list of str, else None."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def start_record(record):
    """A start record of runs.jsonl with each field plot.py reads in the type the trainer writes; a
    field of another type (a null model, a list for data) is None, not recorded.

    code: {module's relpath: its kept path} (an older record's str is train_gpt2.py's: older_code
    says so); git: {commit, diff} (diff None: a clean checkout). older: the record has no code or
    an older record's str, so its trainer wrote no result records (a run's end is not recorded).
    added: False (a process start; code_added's are True)."""
    code = record.get("code")
    older_code = isinstance(code, str)
    older = older_code or "code" not in record
    if older_code:
        code = {"train_gpt2.py": code}
    if not isinstance(code, dict) or strings([*code, *code.values()]) is None:
        code = None
    git = field(record, "git", dict)
    if git is not None:
        diff = git.get("diff")
        if diff is not None and not isinstance(diff, str):
            git = None
        else:
            git = {"commit": field(git, "commit", str), "diff": diff}
    return {
        "step": field(record, "step", int),
        "config": field(record, "config", dict),
        "model": field(record, "model", dict),
        "data": field(record, "data", dict),
        "code": code,
        "older_code": older_code,
        "older": older,
        "git": git,
        "code_changed": strings(record.get("code_changed")),
        "added": False,
    }


def code_added(start, record):
    """The start a code_added record makes of the one before it (start): its code from the record's
    step on is start's plus the modules the run imported since, which are its code_changed. Where
    the record is not readable the code is not recorded (None): never taken for the same code."""
    added = record["code_added"]
    code = None
    changed = None
    if isinstance(added, dict) and strings([*added, *added.values()]) is not None:
        changed = sorted(added)
        if start["code"] is not None:
            code = {**start["code"], **added}
    step = field(record, "step", int)
    return {**start, "step": step, "code": code, "code_changed": changed, "added": True}


def read_records(log_dir):
    """The lines of log_dir/runs.jsonl that are JSON objects, in order; lines torn by a kill or
    nested deeper than json reads are passed over. [] without runs.jsonl."""
    path = Path(log_dir) / "runs.jsonl"
    # is_file: reading a FIFO would hang
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        # (RecursionError: a line nested deeper than json reads)
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def is_start(record):
    """Whether a line of runs.jsonl is a process start (not a result or code_added line)."""
    return "config" in record and "result" not in record and "code_added" not in record


def superseded(start, step):
    """Whether a start at step (a resume to an earlier checkpoint) drops start from the history:
    a start at or after step does, as read_log drops the steps; a code_added one at step itself
    stays (its modules ran before that step)."""
    if start["step"] is None:
        return False
    if start["added"]:
        return start["step"] > step
    return start["step"] >= step


def history_of(records):
    """The starts (start_record's) of a run's records, in order: a start at step s drops those
    superseded there; a code_added line after a start adds one (code_added's) at its step. Result
    records and lines that are neither are passed over."""
    starts = []
    for record in records:
        if "code_added" in record and starts:
            starts.append(code_added(starts[-1], record))
            continue
        if not is_start(record):
            continue
        start = start_record(record)
        if start["step"] is not None:
            starts = [s for s in starts if not superseded(s, start["step"])]
        starts.append(start)
    return starts


def result_of(records):
    """The result record after the last start of a run's records as {status, steps, tokens} (a
    field of another type None, a result not an object all None), or None when the last start has
    none after it: the run is still training, or was killed."""
    result = None
    for record in records:
        if is_start(record):
            result = None
        if "result" not in record:
            continue
        found = record["result"]
        if not isinstance(found, dict):
            found = {}
        result = {
            "status": field(found, "status", str),
            "steps": field(found, "steps", int),
            "tokens": field(found, "tokens", int),
        }
    return result


def read_history(log_dir):
    """The start records of the run in log_dir (history_of's), [] without runs.jsonl."""
    return history_of(read_records(log_dir))


def last_run(log_dir):
    """The last start record in log_dir/runs.jsonl (the run that went on), as start_record reads it,
    or None."""
    starts = read_history(log_dir)
    if not starts:
        return None
    return starts[-1]


def dataset_of(record):
    """The dataset a run record names ("fineweb-edu", "local", ...), or None."""
    if record is None or record["data"] is None:
        return None
    return field(record["data"], "dataset", str)


def run_dataset(log_dir):
    """The dataset of the last run in log_dir, or None."""
    return dataset_of(last_run(log_dir))


# -----------------------------------------------------------------------------
# pictures


def palette(n):
    """n distinct colours: matplotlib's ten, or beyond ten, n taken along a colour map (the ten
    repeat)."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    from matplotlib import colormaps

    return [colormaps["turbo"](i / (n - 1)) for i in range(n)]


def figure(series, references=None):
    """series drawn as a matplotlib Figure on the Agg canvas.

    references: {kind: {label: y}}, dashed lines on the kind's
    panel (REFERENCES: GPT-2's); None draws none.
    """
    # A bare Figure, no pyplot: a notebook's backend is untouched.
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = {}
    # the losses first, then every other kind by name
    for kind in sorted(series, key=lambda k: (PANELS.get(k) != "loss", k)):
        panels.setdefault(PANELS.get(kind, kind), []).append(kind)
    cols = min(len(panels), 3)
    rows = (len(panels) + cols - 1) // cols
    # names as written: a $ in a kind or a log_dir is not mathtext
    with matplotlib.rc_context({"text.parse_math": False}):
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


def write_png(out, fig):
    """fig written to out as a PNG, atomically: a viewer never sees half a PNG.

    The PNG is drawn into memory first, so the temp file beside out lives only while its bytes
    are written (milliseconds), not for the second matplotlib takes. Its name is this process's
    own (write_atomic's unique): the trainer and a plot.py run may write curves.png at the same
    moment. A writer killed then (kill -9) leaves its temp file, which the next write of out
    removes (write_atomic's unique).
    """
    out = Path(out)
    buffer = io.BytesIO()
    # matplotlib's own UserWarnings (a glyph its font lacks) are about the picture, not the
    # input: they would only clutter the trainer's console
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fig.savefig(buffer, format="png", dpi=100)
        except ValueError as e:
            raise ValueError(f"cannot draw {out}: {e}") from None
    fineweb.write_atomic(out, lambda f: f.write(buffer.getvalue()), unique=True)
    return out


def write_curves(log_dir, out=None, references=None, warn=None):
    """Draw log_dir/log.txt into out (default log_dir/curves.png).

    references: draw GPT-2's lines; None: for a FineWeb-Edu run.
    """
    out = Path(log_dir) / "curves.png" if out is None else Path(out)
    series = read_metrics(log_dir, warn)
    if references is None:
        references = run_dataset(log_dir) == "fineweb-edu"
    return write_png(out, figure(series, REFERENCES if references else None))


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
# several runs: what each did


@dataclasses.dataclass
class Run:
    name: str  # the log_dir as given: the run's label in the picture and the report
    log_dir: Path
    series: dict  # {kind: [(step, value), ...]}, as read_log returns it
    history: list  # its start records in runs.jsonl, as read_history returns them
    record: dict | None  # the last of them (None: not recorded)
    tokens_per_step: int | None  # its total_batch_size (None: not recorded)
    seed: int | None  # its config's seed when an int (never a bool), else None: not paired
    result: dict | None  # the result after its last start, as result_of reads it
    older: bool  # no start, or a start older than result records: its end is not recorded


def read_run(log_dir, warn=None):
    """A run's metrics and its records in runs.jsonl."""
    log_dir = Path(log_dir)
    series = read_metrics(log_dir, warn)
    records = read_records(log_dir)
    history = history_of(records)
    record = history[-1] if history else None
    config = record["config"] if record and record["config"] is not None else {}
    tokens_per_step = field(config, "total_batch_size", int)
    if tokens_per_step is not None and tokens_per_step <= 0:
        tokens_per_step = None
    # (an older log: no tokens kind)
    if tokens_per_step is None and "tokens" not in series and warn is not None:
        warn(f"{log_dir}: no total_batch_size in its runs.jsonl: drawn against steps only")
    return Run(
        name=str(log_dir),
        log_dir=log_dir,
        series=series,
        history=history,
        record=record,
        tokens_per_step=tokens_per_step,
        seed=field(config, "seed", int),
        result=result_of(records),
        older=record is None or record["older"],
    )


def points(run, kind, axis):
    """run's (step, x, value) of kind against axis: "step", or what the run had done when the value
    was measured, "tokens" or "time" (training seconds): the value of that kind logged at the step
    before (0 at step 0). An older log without tokens: step x total_batch_size; without time: no
    points."""
    logged = dict(run.series.get(axis, [])) if axis != "step" else {}
    # an older log, without the tokens kind
    per_step = run.tokens_per_step if axis == "tokens" and not logged else None
    found = []
    for step, value in run.series.get(kind, []):
        if axis == "step":
            x = step
        elif step - 1 in logged:
            x = logged[step - 1]
        elif per_step is not None:
            x = step * per_step
        elif step == 0 and logged:
            x = 0
        else:
            continue
        found.append((step, x, value))
    return found


def compared_kinds(runs):
    """The kinds some run logged, less BOOKKEEPING: FIRST's first,
    then the others by name."""
    logged = {kind for run in runs for kind in run.series} - BOOKKEEPING
    return [k for k in FIRST if k in logged] + sorted(logged - set(FIRST))


# -----------------------------------------------------------------------------
# several runs: arms


@dataclasses.dataclass
class Arm:
    name: str  # its first run's name
    given: list  # its runs, in the order given
    runs: list = dataclasses.field(default_factory=list)  # those counted: its seeds (count_runs)
    left_out: list = dataclasses.field(default_factory=list)  # [(run, why)] of the others
    end: dict | None = None  # where its finished runs ended: {steps, tokens, max_minutes}
    notes: list = dataclasses.field(default_factory=list)  # lines the report prints under it
    named: bool = False  # by --arm (else grouped by config and code)
    step_time: dict | None = None  # its runs' step time and throughput (step_time's)


def settings(record):
    """A run's config, its model's config over it (older records have none), log_dir left out; None
    when not recorded."""
    if record is None or record["config"] is None:
        return None
    merged = {**record["config"], **(record["model"] or {})}
    return {k: v for k, v in merged.items() if k != "log_dir"}


def kept_file(run, kept):
    """The bytes of a file run's record names (relative to its log_dir: code/...), or None when it
    is gone."""
    path = run.log_dir / kept
    # is_file: reading a FIFO would hang
    if not path.is_file():
        return None
    try:
        return path.read_bytes()
    except OSError:
        return None


def code_sources(run, record):
    """{module: sha256 of its kept source} of what record ran, or None when a source is not recorded
    or gone."""
    if record["code"] is None:
        return None
    sources = {}
    for module, kept in record["code"].items():
        data = kept_file(run, kept)
        if data is None:
            return None
        sources[module] = hashlib.sha256(data).hexdigest()
    return sources


def arm_key(run):
    """What makes runs one arm, as a str: over the run's history, its settings but RUN_ONLY's, its
    data and the sources of every module it ran, each state with the step where it began (the
    first's left out: where a run starts does not change it). None when some of it is not recorded:
    an arm of its own."""
    states = []
    for record in run.history:
        config = settings(record)
        sources = code_sources(run, record)
        if config is None or sources is None:
            return None
        config = {k: v for k, v in config.items() if k not in RUN_ONLY}
        state = [config, record["data"], sources]
        if states and states[-1][1:] == state:
            continue
        step = record["step"] if states else None
        states.append([step, *state])
    if not states:
        return None
    return json.dumps(states, sort_keys=True)


def group_arms(runs):
    """runs as arms: those of equal arm_key together, in the order of their first runs, each
    arm's seeds counted (count_runs)."""
    arms = []
    keys = []
    for run in runs:
        key = arm_key(run)
        if key is not None and key in keys:
            arms[keys.index(key)].given.append(run)
            continue
        keys.append(key)
        arms.append(Arm(run.name, [run]))
    for arm in arms:
        count_runs(arm)
    return arms


def last_start(run):
    """The step of run's last process start (code_added's aside), or None."""
    starts = [record for record in run.history if not record["added"]]
    if not starts:
        return None
    return starts[-1]["step"]


def unfinished(run):
    """Why run is not a finished seed, from the result after its last start: stopped, not readable,
    or none (still training, or killed); None when it finished, or when its records are older than
    result records (its end is not recorded: a note says so)."""
    if run.older:
        return None
    result = run.result
    if result is None:
        start = last_start(run)
        where = "its last start" if start is None else f"its start at step {start}"
        return f"no result after {where}: still training, or killed"
    steps = "?" if result["steps"] is None else result["steps"]
    if result["status"] == "stopped":
        max_steps = field(run.record["config"] or {}, "max_steps", int)
        of = "" if max_steps is None else f" of {max_steps}"
        return f"stopped at step {steps}{of}"
    if result["status"] != "finished" or result["steps"] is None:
        return "its result record is not readable"
    return None


def end_of(run):
    """Where a finished run ended: {steps, tokens, max_minutes}. A time-bounded run (max_minutes >
    0) that spent its budget before max_steps ended at the budget's end (its step is the machine's
    pace: not compared); any other at its step and tokens."""
    config = run.record["config"] or {}
    minutes = config.get("max_minutes")
    max_steps = field(config, "max_steps", int)
    steps = run.result["steps"]
    timed = isinstance(minutes, (int, float)) and not isinstance(minutes, bool) and minutes > 0
    if timed and (max_steps is None or steps < max_steps):
        return {"steps": None, "tokens": None, "max_minutes": minutes}
    return {"steps": steps, "tokens": run.result["tokens"], "max_minutes": None}


def same_end(a, b):
    """Whether two ends (end_of's) are one: the same budget, or the same step and, where both
    recorded them, the same tokens."""
    if a["max_minutes"] != b["max_minutes"] or a["steps"] != b["steps"]:
        return False
    if a["tokens"] is None or b["tokens"] is None:
        return True
    return a["tokens"] == b["tokens"]


def end_words(end):
    """An end (end_of's) in words: "after 5 minutes of training", "at step 30 (15,360 tokens)"."""
    if end["max_minutes"] is not None:
        return f"after {end['max_minutes']:g} minutes of training"
    words = f"at step {end['steps']}"
    if end["tokens"] is not None:
        words += f" ({end['tokens']:,} tokens)"
    return words


def count_runs(arm):
    """Which of arm's runs are its seeds (arm.runs), which are left out and why (arm.left_out),
    where its runs ended (arm.end) and the notes under it. A run counts when it finished (the result
    after its last start says so), where most of the arm's finished runs did (ties: the first
    given's) and as the first given of its seed: one seed counts once. A run whose records are older
    than result records counts, and a note says its end is not recorded."""
    why = {}
    ends = {}
    for run in arm.given:
        reason = unfinished(run)
        if reason is not None:
            why[run.name] = reason
        elif not run.older:
            ends[run.name] = end_of(run)
    # the arm's end: where most of its finished runs ended; a run that ended elsewhere (another
    # max_steps, or a time-bounded run that reached max_steps first) is not one of its seeds
    end = None
    most = 0
    for candidate in ends.values():
        count = len([found for found in ends.values() if same_end(found, candidate)])
        if count > most:
            end = candidate
            most = count
    for name, found in ends.items():
        if not same_end(found, end):
            why[name] = f"finished {end_words(found)}; the arm's runs {end_words(end)}"
    # one seed once: a rerun of a seed (into the free log_dir a refusal offers) is not another seed
    first = {}
    for run in arm.given:
        if run.name in why or run.seed is None:
            continue
        if run.seed in first:
            kept = first[run.seed].name
            why[run.name] = f"seed {run.seed} again: counted once, as {kept} (the first given)"
            continue
        first[run.seed] = run
    arm.runs = [run for run in arm.given if run.name not in why]
    arm.left_out = [(run, why[run.name]) for run in arm.given if run.name in why]
    arm.end = end
    arm.notes = arm_notes(arm)
    arm.step_time = step_time(arm)


def arm_notes(arm):
    """The lines under an arm's header: how a time-bounded arm's final values are taken, and its
    counted runs whose end is not recorded or whose seed is not an integer."""
    notes = []
    if arm.end is not None and arm.end["max_minutes"] is not None:
        minutes = f"{arm.end['max_minutes']:g}"
        notes.append(
            f"time-bounded (--max_minutes {minutes}): each run's final values are those at the end"
            f" of its {minutes} minutes of training steps, compared at equal training time, not"
            " equal steps (the step column)"
        )
    for run in arm.runs:
        if run.older:
            notes.append(
                f"{run.name}: its end is not recorded (no runs.jsonl, or one older than result"
                " records): its last logged values counted"
            )
        config = {} if run.record is None else run.record["config"] or {}
        if "seed" in config and run.seed is None:
            seed = json.dumps(config["seed"])
            notes.append(f"{run.name}: seed {seed} is not an integer: counted, not paired by seed")
    return notes


def steady_values(run, kind):
    """run's finite, positive values of kind (ms, tok_per_s) at its steps but the first
    WARMUP_STEPS after each process start (compilation and warm-up)."""
    starts = [record["step"] for record in run.history if not record["added"]]
    starts = [step for step in starts if step is not None] or [0]
    found = []
    for step, value in run.series.get(kind, []):
        warming = any(start <= step < start + WARMUP_STEPS for start in starts)
        if not warming and math.isfinite(value) and value > 0:
            found.append(value)
    return found


def step_time(arm):
    """arm's step time over its counted runs' steady steps (steady_values'): {median_ms of them all,
    low_ms..high_ms: from the lowest run's 25th percentile to the highest run's 75th (a run slowed
    by a load peak widens it), tok_per_s: the median throughput, steps, warmup_steps}; None when
    no run logged ms (or the numbers are not finite)."""
    import numpy

    pooled = []
    lows = []
    highs = []
    throughput = []
    for run in arm.runs:
        values = steady_values(run, "ms")
        throughput += steady_values(run, "tok_per_s")
        if not values:
            continue
        # (values near 1e308 overflow to inf here: not finite, so not known)
        with numpy.errstate(all="ignore"):
            low, high = numpy.percentile(values, [25, 75])
        lows.append(low)
        highs.append(high)
        pooled += values
    if not pooled:
        return None
    with numpy.errstate(all="ignore"):
        median = numpy.median(pooled)
        tokens = numpy.median(throughput) if throughput else None
    found = {
        "median_ms": number(median),
        "low_ms": number(min(lows)),
        "high_ms": number(max(highs)),
        "tok_per_s": number(tokens),
        "steps": len(pooled),
        "warmup_steps": WARMUP_STEPS,
    }
    if None in (found["median_ms"], found["low_ms"], found["high_ms"]):
        return None
    return found


def first_run(arm):
    """The run that stands for arm in what differs between arms: its first counted run, else its
    first given."""
    if arm.runs:
        return arm.runs[0]
    return arm.given[0]


def finals(arm, kind):
    """(seed, last value) of kind of each run of arm that logged it."""
    return [(run.seed, run.series[kind][-1][1]) for run in arm.runs if run.series.get(kind)]


def number(x):
    """x as a JSON number: a float, or None (null) if not finite."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def averaged(value):
    """Whether a final value takes part in means, spreads and tests: finite and at most LARGEST."""
    return math.isfinite(value) and abs(value) <= LARGEST


def summary(arm, kind):
    """{mean, sd, values, steps, n} of kind's final values in arm's counted runs: values and the
    steps they were logged at, one a run (None: not logged), sd None below 2 runs, mean and sd None
    when a value is not averaged (not finite, or beyond LARGEST)."""
    by_run = {run.name: run.series[kind][-1] for run in arm.runs if run.series.get(kind)}
    values = [value for _, value in by_run.values()]
    finite = all(averaged(v) for v in values)
    mean = statistics.fmean(values) if values and finite else None
    sd = statistics.stdev(values) if len(values) > 1 and finite else None
    return {
        "mean": number(mean),
        "sd": number(sd),
        "values": [number(by_run[run.name][1]) if run.name in by_run else None for run in arm.runs],
        "steps": [by_run[run.name][0] if run.name in by_run else None for run in arm.runs],
        "n": len(values),
    }


def code_changes(run):
    """[{step, modules}] for each start of run's history under other code than its checkpoint's (the
    trainer's code_changed, or for an older record, the modules whose kept source differs from the
    previous start's), and for each code_added record, the modules the run imported after its
    start (at the step they were first seen)."""
    changes = []
    for i, record in enumerate(run.history):
        modules = record["code_changed"]
        if modules is None and i > 0:
            before = code_sources(run, run.history[i - 1])
            after = code_sources(run, record)
            if before is not None and after is not None:
                modules = [m for m in {**before, **after} if before.get(m) != after.get(m)]
        if modules:
            changes.append({"step": record["step"], "modules": modules})
    return changes


def code_states(run):
    """The code run ran over its history: [[step, {module: sha256 of its source}]], a state for
    each start whose code differs from the one before (the first's step None: where a run starts
    does not change it); None when some of it is not recorded or its kept file is gone."""
    states = []
    for record in run.history:
        sources = code_sources(run, record)
        if sources is None:
            return None
        if states and states[-1][1] == sources:
            continue
        step = record["step"] if states else None
        states.append([step, sources])
    return states


# -----------------------------------------------------------------------------
# several runs: arms compared with their noise


def direction(kind):
    """ "lower" or "higher", whichever is better for kind, or None: lower for losses (train, val,
    bpb, *loss*), higher for accuracies (hella, *acc*)."""
    if kind in ("train", "val", "bpb") or "loss" in kind:
        return "lower"
    if kind == "hella" or "acc" in kind:
        return "higher"
    return None


def fmt(x):
    """x to 4 decimals, or to 4 significant digits where decimals would hide it."""
    if x == 0 or 1e-4 <= abs(x) < 1e5:
        return f"{x:.4f}"
    return f"{x:.4g}"


def change(kind, diff):
    """diff (arm minus baseline) in words: "better by 0.0191", "worse by", or for a kind of no known
    direction "lower by", "higher by"; "the same" when 0."""
    if diff == 0:
        return "the same"
    side = "lower" if diff < 0 else "higher"
    if direction(kind) is not None:
        side = "better" if side == direction(kind) else "worse"
    return f"{side} by {fmt(abs(diff))}"


def power(delta, n, sd, sd_base, paired):
    """The power of the two-sided t-test at ALPHA to find a true difference delta with n seeds an
    arm, at the spread seen: sd of the per-seed differences (paired), or of each arm (Welch's test,
    its degrees of freedom Welch-Satterthwaite's)."""
    from scipy import stats

    if paired:
        se = sd / math.sqrt(n)
        df = n - 1
    else:
        a = sd**2 / n
        b = sd_base**2 / n
        se = math.sqrt(a + b)
        df = (a + b) ** 2 / (a**2 / (n - 1) + b**2 / (n - 1))
    critical = stats.t.ppf(1 - ALPHA / 2, df)
    shift = delta / se
    # the chance of t beyond either critical value; the lower tail as the upper one of -shift
    # (scipy's nct.cdf there is nan for a large shift)
    return stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift)


def seeds_needed(delta, sd, sd_base, paired):
    """The fewest seeds an arm (2 to MAX_SEEDS) whose test finds a true difference delta with POWER
    at ALPHA, at the spread seen (as power()); None if MAX_SEEDS do not."""
    if delta == 0 or power(delta, MAX_SEEDS, sd, sd_base, paired) < POWER:
        return None
    # the power grows with the seeds: the fewest by bisection
    low = 2
    high = MAX_SEEDS
    while low < high:
        middle = (low + high) // 2
        if power(delta, middle, sd, sd_base, paired) >= POWER:
            high = middle
        else:
            low = middle + 1
    return low


def t_test(base, other):
    """The t-test of the final values other's runs logged against base's ((seed, value) pairs):
    paired by seed when both ran the same seeds, each once, else Welch's. (test, the difference's
    95% CI, p, the spreads power() takes), or None when the values have no spread to test."""
    from scipy import stats

    seeds = [seed for seed, _ in base]
    other_seeds = [seed for seed, _ in other]
    # pairs only of seeds recorded as ints (a seed of another type is None), each once an arm
    paired = None not in seeds + other_seeds and len(set(seeds)) == len(seeds)
    paired = paired and sorted(seeds) == sorted(other_seeds)
    base_values = [value for _, value in base]
    arm_values = [value for _, value in other]
    if paired:
        by_seed = dict(other)
        arm_values = [by_seed[seed] for seed in seeds]
        diffs = [a - b for a, b in zip(arm_values, base_values)]
        spreads = (statistics.stdev(diffs), None)
    else:
        spreads = (statistics.stdev(arm_values), statistics.stdev(base_values))
    if not any(spreads):
        return None
    # scipy warns of precision lost on values that nearly agree: the result stands
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if paired:
            result = stats.ttest_rel(arm_values, base_values)
        else:
            result = stats.ttest_ind(arm_values, base_values, equal_var=False)
        ci = result.confidence_interval(1 - ALPHA)
    return "paired" if paired else "welch", [ci.low, ci.high], float(result.pvalue), spreads


def drawable(curve):
    """curve's (step, x, value) points with an x or value beyond LARGEST made nan: matplotlib draws
    no nan (nor inf), and a sum of values near 1e308 would overflow its axis' arithmetic."""
    found = []
    for step, x, value in curve:
        if abs(x) > LARGEST:
            x = math.nan
        if abs(value) > LARGEST:
            value = math.nan
        found.append((step, x, value))
    return found


def mean_curve(runs, kind, axis):
    """An arm's curve of kind against axis: [(x, mean, min, max)] at each step every run that logged
    kind has a point at (x the runs' mean), then, when the runs end at different steps (time
    bounded), at the mean of their last points. [] when a run has no points against axis (an older
    log: no time)."""
    curves = [drawable(points(run, kind, axis)) for run in runs if run.series.get(kind)]
    if not curves or not all(curves):
        return []
    by_step = [{step: (x, value) for step, x, value in curve} for curve in curves]
    common = sorted(set.intersection(*(set(steps) for steps in by_step)))
    found = [mean_point([steps[step] for steps in by_step]) for step in common]
    lasts = [curve[-1] for curve in curves]
    if not common or any(step != common[-1] for step, _, _ in lasts):
        found.append(mean_point([(x, value) for _, x, value in lasts]))
    return found


def mean_point(pairs):
    """(mean x, mean value, min value, max value) of (x, value) pairs (a plain sum: a value of a
    diverged run, inf or nan, is drawn as matplotlib draws those)."""
    xs = [x for x, _ in pairs]
    values = [value for _, value in pairs]
    return sum(xs) / len(xs), sum(values) / len(values), min(values), max(values)


def time_to_reach(curve, target, lower):
    """The x at which curve [(x, y, ...)] first reaches target (<= if lower, else >=), interpolated
    between its points, or None if it never does."""
    previous = None
    for x, y, *_ in curve:
        if (y <= target) if lower else (y >= target):
            if previous is None:
                return x
            x0, y0 = previous
            return x0 + (target - y0) * (x - x0) / (y - y0)
        previous = (x, y)
    return None


def reach(kind, baseline, arm, target, axis):
    """{reached: the x against axis (steps, tokens, training seconds) at which arm's mean curve of
    kind first reaches target, own: the baseline's (its mean curve's last x), ratio: reached / own},
    each None where unknown (not logged, never reached, a kind of no known direction)."""
    found = {"reached": None, "own": None, "ratio": None}
    base_curve = mean_curve(baseline.runs, kind, axis)
    arm_curve = mean_curve(arm.runs, kind, axis)
    if direction(kind) is None or not base_curve or not arm_curve:
        return found
    reached = time_to_reach(arm_curve, target, direction(kind) == "lower")
    own = base_curve[-1][0]
    found.update(reached=number(reached), own=number(own))
    if reached is not None and own > 0:
        found["ratio"] = number(reached / own)
    return found


def seconds_withheld(baseline, arm):
    """Why the training seconds to the baseline's final value are not compared, or None. Seconds
    measure the arm only where its step time differs from the baseline's beyond their spreads (the
    ranges low_ms..high_ms of step_time do not overlap): within them, the machine's load (a seed
    run during a peak) can make the difference. Steps and tokens are compared either way."""
    base = baseline.step_time
    other = arm.step_time
    if base is None or other is None:
        return "the step times (ms) are not logged, so the machine's load is not known"
    if other["high_ms"] < base["low_ms"] or base["high_ms"] < other["low_ms"]:
        return None
    spreads = []
    for a, found in ((arm, other), (baseline, base)):
        spread = f"{found['low_ms']:.1f}..{found['high_ms']:.1f}"
        spreads.append(f"{a.name} {found['median_ms']:.1f} ms, spread {spread}")
    return (
        f"the step times overlap within their spreads ({'; '.join(spreads)}): the seconds would"
        " measure the machine's load as much as the arm"
    )


def time_to_baseline(kind, baseline, arm, target):
    """The equal-compute view of kind: the steps, tokens and training seconds at which arm's mean
    curve first reaches target (the baseline's final mean), the baseline's own and their ratios
    (reach's); the seconds None, and seconds_withheld saying why, where the step times do not
    differ beyond their spreads (seconds_withheld's rule)."""
    steps = reach(kind, baseline, arm, target, "step")
    tokens = reach(kind, baseline, arm, target, "tokens")
    seconds = reach(kind, baseline, arm, target, "time")
    found = {
        "steps_to_baseline": steps["reached"],
        "baseline_steps": steps["own"],
        "step_ratio": steps["ratio"],
        "tokens_to_baseline": tokens["reached"],
        "baseline_tokens": tokens["own"],
        "token_ratio": tokens["ratio"],
        "time_to_baseline_s": seconds["reached"],
        "baseline_time_s": seconds["own"],
        "time_ratio": seconds["ratio"],
        "seconds_withheld": None,
    }
    withheld = seconds_withheld(baseline, arm)
    if seconds["own"] is not None and withheld is not None:
        found.update(time_to_baseline_s=None, baseline_time_s=None, time_ratio=None)
        found["seconds_withheld"] = withheld
    return found


def compare_metric(kind, baseline, arm):
    """arm's final values of kind against baseline's: a dict of the numbers (see main's --json)
    and their verdict in words; None if one of the arms did not log kind."""
    base = finals(baseline, kind)
    other = finals(arm, kind)
    if not base or not other:
        return None
    row = {"arm": arm.name, "baseline": baseline.name, "metric": kind, "test": None}
    row.update(mean=None, baseline_mean=None, n=[len(other), len(base)], diff=None)
    row.update(ci95=None, p=None, seeds_needed=None)
    row.update(steps_to_baseline=None, baseline_steps=None, step_ratio=None)
    row.update(tokens_to_baseline=None, baseline_tokens=None, token_ratio=None)
    row.update(time_to_baseline_s=None, baseline_time_s=None, time_ratio=None)
    row.update(seconds_withheld=None)
    if not all(averaged(value) for _, value in base + other):
        largest = f"{LARGEST:.0e}"
        row["verdict"] = f"{kind}: not compared, a final value is not finite or beyond {largest}"
        return row
    base_mean = statistics.fmean(value for _, value in base)
    arm_mean = statistics.fmean(value for _, value in other)
    diff = arm_mean - base_mean
    row.update(mean=number(arm_mean), baseline_mean=number(base_mean), diff=number(diff))
    row.update(time_to_baseline(kind, baseline, arm, base_mean))
    means = f"{kind} {fmt(arm_mean)} vs {fmt(base_mean)}"
    seeds = f"{len(other)} vs {len(base)} seeds"

    # one run: its seed noise is unknown
    if len(base) < 2 or len(other) < 2:
        if len(base) == len(other):
            who = "between single runs: no p-value (the seed noise is unknown)"
        else:
            single = baseline.name if len(base) < 2 else arm.name
            who = f"{single} is a single run: no p-value (its seed noise is unknown)"
        row["verdict"] = f"{means}: {change(kind, diff)}, {who}: run more seeds (--seed)"
        return row
    tested = t_test(base, other)
    if tested is None:
        row["verdict"] = f"{means}: {change(kind, diff)}, no spread between seeds to test ({seeds})"
        return row
    test, ci, p, spreads = tested
    row.update(test=test, ci95=[number(ci[0]), number(ci[1])], p=number(p))
    if p < ALPHA:
        # the interval of the amount said: of -diff when the arm is lower
        low, high = ci
        if diff < 0:
            low, high = -ci[1], -ci[0]
        interval = f"95% CI {fmt(low)}..{fmt(high)}"
        row["verdict"] = f"{means}: {change(kind, diff)} ({interval}, p = {p:.2g}; {seeds}, {test})"
        return row
    # no difference found: how many seeds would find the one observed, if it is real
    needed = seeds_needed(abs(diff), *spreads, paired=test == "paired")
    row["seeds_needed"] = needed
    sign = "+" if diff > 0 else ""
    interval = f"95% CI {fmt(ci[0])}..{fmt(ci[1])}"
    text = f"{means}: no difference beyond seed noise"
    text += f" (p = {p:.2g}; diff {sign}{fmt(diff)}, {interval}; {seeds}, {test})"
    observed = f"the observed difference {fmt(abs(diff))}"
    odds = f"{POWER:.0%} power at alpha {ALPHA}"
    if needed is None:
        text += f": more than {MAX_SEEDS} seeds per arm would be needed to detect {observed}"
    else:
        text += f": at this spread about {needed} seeds per arm would detect {observed}"
    row["verdict"] = f"{text} with {odds}"
    return row


# -----------------------------------------------------------------------------
# several runs: the picture


def draw_arm(ax, arm, kinds, color, axis):
    """arm's kinds on ax in its colour against axis: each its mean curve, and a band from the lowest
    to the highest run. Labelled by the arm's name (and n), and the kind where the panel has two
    (loss: train and val)."""
    name = arm.name if len(arm.runs) == 1 else f"{arm.name} (n={len(arm.runs)})"
    for kind in kinds:
        curve = mean_curve(arm.runs, kind, axis)
        if not curve:
            continue
        xs, means, lows, highs = zip(*curve)
        label = name if len(kinds) == 1 else f"{name} {kind}"
        style = THIN if kind == "train" else BOLD
        ax.plot(xs, means, color=color, label=label, **style)
        if len(arm.runs) > 1:
            ax.fill_between(xs, lows, highs, color=color, alpha=0.15, lw=0)
        # a band needs two points: one (a final evaluation alone) gets a bar
        if len(arm.runs) > 1 and len(xs) == 1:
            ax.vlines(xs, lows, highs, color=color, alpha=0.5)


def comparison_figure(arms, references=None):
    """arms drawn together as a matplotlib Figure on the Agg canvas.

    A panel per group of compared kinds (PANELS groups them), four to a row, a block of such rows
    against each axis: steps, tokens (where a run knows them) and training seconds (where a run
    logged them). Arm i has one colour in every panel. references: as figure()'s."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    runs = [run for arm in arms for run in arm.given]
    panels = {}
    for kind in compared_kinds(runs):
        panels.setdefault(PANELS.get(kind, kind), []).append(kind)
    axes = ["step"]
    if any("tokens" in run.series or run.tokens_per_step for run in runs):
        axes.append("tokens")
    if any("time" in run.series for run in runs):
        axes.append("time")
    cols = min(len(panels), 4)
    block = -(-len(panels) // cols)  # rows a block
    colors = palette(len(arms))
    with matplotlib.rc_context({"text.parse_math": False}):
        fig = Figure((6 * cols, 4 * block * len(axes)), layout="constrained")
        FigureCanvasAgg(fig)
        for a, axis in enumerate(axes):
            for p, (title, kinds) in enumerate(panels.items()):
                index = a * block * cols + p + 1
                ax = fig.add_subplot(block * len(axes), cols, index, title=title)
                ax.set_xlabel(AXES[axis])
                for arm, color in zip(arms, colors):
                    draw_arm(ax, arm, kinds, color, axis)
                for kind in kinds:
                    for label, y in (references or {}).get(kind, {}).items():
                        ax.axhline(y, color="gray", ls="--", label=f"{label} ({y})")
                # 10B tokens read as 10G, not as an offset of 1e10
                if axis == "tokens":
                    ax.xaxis.set_major_formatter(EngFormatter())
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize="small")
    return fig


def references_for(runs):
    """GPT-2's lines (REFERENCES) when every run is on FineWeb-Edu,
    the data they were measured on; else None."""
    if all(dataset_of(run.record) == "fineweb-edu" for run in runs):
        return REFERENCES
    return None


# -----------------------------------------------------------------------------
# several runs: what differs in config and code


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


def config_differences(first, run):
    """The config keys (RUN_ONLY's left out: every run has its own), the model's (as built: an
    --init_from model is not the config's shape flags) and the data whose values differ from the
    first run's."""
    configs = [settings(first.record), settings(run.record)]
    if None in configs:
        unrecorded = [r.name for r, c in zip((first, run), configs) if c is None]
        return [f"config not recorded (runs.jsonl of {' and '.join(unrecorded)})"]
    before, after = [{k: v for k, v in c.items() if k not in RUN_ONLY} for c in configs]
    lines = value_differences(before, after)
    # a loss compares only on the same data: say so when it is not
    data_before = first.record["data"] or {}
    data_after = run.record["data"] or {}
    lines += value_differences(data_before, data_after, prefix="data.")
    if not lines:
        lines.append("same config")
    return lines


def git_commit(record):
    """The commit a run record names, or None (outside a git checkout, or a record older than the
    field)."""
    if record["git"] is None:
        return None
    return record["git"]["commit"]


def diff_sections(text):
    """A `git diff` as {path: its section's text}."""
    sections = {}
    path = None
    for line in text.splitlines():
        if line.startswith("diff --git "):
            path = line.rsplit(" b/", 1)[-1].strip('"')
            sections[path] = []
        if path is not None:
            sections[path].append(line)
    return {path: "\n".join(lines) for path, lines in sections.items()}


def git_differences(first, run):
    """The files whose part of the kept `git diff` differs between the runs and that no run imported
    (those are compared as code), as one line, or []."""
    texts = []
    for r in (first, run):
        git = r.record["git"]
        if git is None:
            return []
        if git["diff"] is None:
            texts.append("")
            continue
        data = kept_file(r, git["diff"])
        if data is None:
            return [f"git diff not compared: {r.log_dir / git['diff']} missing"]
        texts.append(data.decode(errors="replace"))
    before, after = [diff_sections(text) for text in texts]
    imported = {*(first.record["code"] or {}), *(run.record["code"] or {})}
    files = [f for f in {**before, **after} if before.get(f) != after.get(f)]
    others = [f for f in files if f not in imported]
    if not others:
        return []
    return [f"git diff differs in files no run imported: {', '.join(others)}"]


def code_differences(first, run):
    """Whether the code run ran (its last record's) differs from the first run's, module by
    module: "same code" only when every module has the same source, else a unified diff of each
    that differs (or that one run imported); the git commits when they differ; the files no run
    imported whose git diff differs."""
    lines = []
    commits = [git_commit(first.record), git_commit(run.record)]
    if commits[0] != commits[1]:
        shown = [commit or "not recorded" for commit in commits]
        lines.append(f"git commit: {shown[0]} -> {shown[1]}")
    codes = [first.record["code"], run.record["code"]]
    unrecorded = [r.name for r, code in zip((first, run), codes) if code is None]
    if unrecorded:
        lines.append(f"code not recorded (runs.jsonl of {' and '.join(unrecorded)})")
        return lines
    # an older record kept train_gpt2.py alone: that is all there is to compare
    older = first.record["older_code"] or run.record["older_code"]
    modules = list(codes[0]) + [module for module in codes[1] if module not in codes[0]]
    if older:
        modules = ["train_gpt2.py"]
    found = []
    unread = []
    for module in modules:
        if module not in codes[0] or module not in codes[1]:
            owner = first if module in codes[0] else run
            found.append(f"{module}: imported by {owner.name} only")
            continue
        paths = [first.log_dir / codes[0][module], run.log_dir / codes[1][module]]
        sources = [kept_file(first, codes[0][module]), kept_file(run, codes[1][module])]
        missing = [str(path) for path, source in zip(paths, sources) if source is None]
        if missing:
            unread.append(f"{module}: not compared, {' and '.join(missing)} missing")
        elif sources[0] != sources[1]:
            before, after = [source.decode(errors="replace").splitlines() for source in sources]
            found += difflib.unified_diff(before, after, str(paths[0]), str(paths[1]), lineterm="")
    if found:
        lines += ["code differs:", *found]
    elif older and not unread:
        lines.append("same train_gpt2.py (an older record keeps no other module)")
    elif not unread:
        # the same code at the runs' ends is not the same code throughout: a run resumed under
        # other code, or one that imported a module after its start, ran other code before
        lines += history_differences(first, run)
    lines += unread
    lines += git_differences(first, run)
    return lines


def history_differences(first, run):
    """["same code"] when the two runs ran the same sources of every module over their whole
    histories; else lines that say where they differ (each code change of each run), or that a
    start's code is not recorded (not known to be the same)."""
    states = [code_states(first), code_states(run)]
    unknown = [r.name for r, state in zip((first, run), states) if state is None]
    if unknown:
        names = " and ".join(unknown)
        return [f"code not known to be the same: a start of {names} has no code recorded or kept"]
    if states[0] == states[1]:
        return ["same code"]
    lines = ["code differs before the runs' ends (the same at their ends):"]
    for r in (first, run):
        for changed in code_changes(r):
            lines.append(
                f"{r.name}: code changed at step {changed['step']}: {', '.join(changed['modules'])}"
            )
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


# -----------------------------------------------------------------------------
# several runs: the report


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


def seed_text(run):
    """run's seed as the report shows it: "?" when not an int."""
    if run.seed is None:
        return "?"
    return str(run.seed)


def arm_text(arm, metrics):
    """An arm's header (its runs and seeds), the runs left out and why, its notes and code changes,
    and a table of each metric's mean ± sd, each run's value and the step it was logged at."""
    seeds = ", ".join(seed_text(run) for run in arm.runs)
    names = ", ".join(run.name for run in arm.runs)
    if not arm.runs:
        lines = [f"{arm.name}: no run counted"]
    elif len(arm.runs) == 1 and names == arm.name:
        lines = [f"{arm.name}: 1 run, seed {seeds}"]
    elif len(arm.runs) == 1:
        lines = [f"{arm.name}: 1 run ({names}), seed {seeds}"]
    else:
        lines = [f"{arm.name}: {len(arm.runs)} runs ({names}), seeds {seeds}"]
    for run, why in arm.left_out:
        lines.append(f"left out: {run.name} (seed {seed_text(run)}): {why}")
    lines += arm.notes
    line = step_time_text(arm)
    if line is not None:
        lines.append(line)
    for changed in code_changes(first_run(arm)):
        modules = ", ".join(changed["modules"])
        lines.append(f"code changed at step {changed['step']}: {modules}")
    rows = [["metric", "mean ± sd", "values", "step"]]
    for kind, stats in metrics.items():
        if stats["n"] == 0:
            continue
        values = [run.series[kind][-1][1] if run.series.get(kind) else None for run in arm.runs]
        shown = " ".join("-" if v is None else fmt(v) for v in values)
        mean = "n/a" if stats["mean"] is None else fmt(stats["mean"])
        if stats["sd"] is not None:
            mean += f" ± {fmt(stats['sd'])}"
        # the step each final value was logged at: one number when the runs agree
        steps = ["-" if step is None else str(step) for step in stats["steps"]]
        if len(set(steps)) == 1:
            steps = steps[:1]
        rows.append([kind, mean, shown, " ".join(steps)])
    text = "\n".join(lines)
    if len(rows) > 1:
        text += "\n" + markdown(rows)
    return text


def ratio_text(ratio, own):
    """The ratio in words, as " (0.70 x own)", or "" when it is not known."""
    if ratio is None:
        return ""
    return f" ({ratio:.2f} x {own})"


def time_text(row):
    """The val comparison's time to the baseline's final val in steps, tokens and training seconds
    (or why the seconds are withheld), as a line, or None."""
    if row["baseline_steps"] is None:
        return None
    base = row["baseline"]
    target = f"{base}'s final val {fmt(row['baseline_mean'])}"
    if row["steps_to_baseline"] is None:
        return f"time: never reaches {target}"
    own = f"{base}'s {row['baseline_steps']:,.0f}"
    parts = [f"step {row['steps_to_baseline']:,.0f}" + ratio_text(row["step_ratio"], own)]
    if row["tokens_to_baseline"] is not None:
        own = f"{row['baseline_tokens']:,.0f}"
        tokens = f"{row['tokens_to_baseline']:,.0f} tokens"
        parts.append(tokens + ratio_text(row["token_ratio"], own))
    if row["time_to_baseline_s"] is not None:
        own = f"{row['baseline_time_s']:.1f} s"
        seconds = f"{row['time_to_baseline_s']:.1f} s"
        parts.append(seconds + ratio_text(row["time_ratio"], own))
    text = f"time: reaches {target} at {', '.join(parts)}"
    if row["seconds_withheld"] is not None:
        text += f"; seconds withheld: {row['seconds_withheld']}"
    return text


def step_time_text(arm):
    """An arm's step time and throughput (step_time's) as a line, or None when not logged."""
    found = arm.step_time
    if found is None:
        return None
    spread = f"{found['low_ms']:.1f}..{found['high_ms']:.1f} ms"
    text = f"step time: {found['median_ms']:.1f} ms median over {found['steps']:,} steps"
    text += f" (spread {spread}: its runs' lowest 25th to highest 75th percentile)"
    if found["tok_per_s"] is not None:
        text += f", {found['tok_per_s']:,.0f} tok/s"
    return text + f"; each run's first {WARMUP_STEPS} steps after a start left out"


def report(arms, metrics, comparisons):
    """The text a comparison prints: a table for each arm, then for each arm after the first its
    verdicts, the time to the baseline's final val, and what differs from the baseline."""
    parts = [arm_text(arm, stats) for arm, stats in zip(arms, metrics)]
    for arm, rows in zip(arms[1:], comparisons):
        lines = [f"## {arm.name} vs {arms[0].name}"]
        empty = [a.name for a in (arms[0], arm) if not a.runs]
        if empty:
            lines.append(f"not compared: no run of {' and '.join(empty)} counted (left out above)")
        lines += [row["verdict"] for row in rows]
        for row in rows:
            line = time_text(row) if row["metric"] == "val" else None
            if line is not None:
                lines.append(line)
        lines += differences(first_run(arms[0]), first_run(arm))[1:]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def report_json(arms, metrics, comparisons):
    """What --json prints: {"arms": [...], "comparisons": [...]} (see main)."""
    found = []
    for i, (arm, stats) in enumerate(zip(arms, metrics)):
        names = [run.name for run in arm.runs]
        seeds = [run.seed for run in arm.runs]
        entry = {"name": arm.name, "runs": names, "n": len(names), "seeds": seeds}
        entry["named"] = arm.named
        entry["left_out"] = [
            {"run": run.name, "seed": run.seed, "why": why} for run, why in arm.left_out
        ]
        entry.update(end=arm.end, notes=arm.notes, step_time=arm.step_time)
        entry.update(metrics=stats, code_changes=code_changes(first_run(arm)))
        # what the text says differs from the baseline (its lines: config, data, "code
        # differs:" and the diff, or "same code"); the baseline's own: None
        vs_baseline = None
        if i:
            vs_baseline = differences(first_run(arms[0]), first_run(arm))[1:]
        entry["vs_baseline"] = vs_baseline
        found.append(entry)
    rows = [row for arm_rows in comparisons for row in arm_rows]
    return json.dumps({"arms": found, "comparisons": rows}, indent=1, allow_nan=False)


def named_arm(name, runs):
    """The runs given with --arm NAME as one arm, its seeds counted (count_runs), whatever their
    configs: a run whose config or code differs from the arm's first run's (beyond RUN_ONLY's) is
    named in a warning under it (a glob such as log/wsd-* sweeps in runs that share the prefix)."""
    arm = Arm(name, runs, named=True)
    count_runs(arm)
    first = runs[0]
    for run in runs[1:]:
        found = mismatch(first, run)
        if found:
            what = "; ".join(found)
            arm.notes.append(
                f"warning: {run.name} differs from {first.name}, the arm's first run: {what}"
            )
    return arm


def mismatch(first, run):
    """What makes run another arm than first (arm_key), in short: the config keys and data that
    differ, the modules whose code differs; [] when they are one arm."""
    key = arm_key(first)
    if key is not None and key == arm_key(run):
        return []
    if first.record is None or run.record is None:
        return ["config and code not recorded"]
    found = [line for line in config_differences(first, run) if line != "same config"]
    states = [code_states(first), code_states(run)]
    if None in states:
        found.append("code not recorded")
    elif states[0][-1][1] != states[1][-1][1]:
        before = states[0][-1][1]
        after = states[1][-1][1]
        modules = [m for m in {**before, **after} if before.get(m) != after.get(m)]
        found.append(f"code of {', '.join(modules)}")
    elif states[0] != states[1]:
        found.append("code before its end (a change at a resume)")
    if not found:
        found.append("config before its end (a resume under another config)")
    return found


def compare(log_dirs, out, as_json, warn=None, named=()):
    """Several runs (or one, for --json) grouped into arms, each compared with the first: the
    report (or its JSON) printed and, with out, the arms drawn into it. log_dirs are grouped by
    config and code (group_arms); named: [NAME, LOG_DIR, ...] lists, each an arm (named_arm),
    after those."""
    runs = [read_run(log_dir, warn) for log_dir in log_dirs]
    arms = group_arms(runs)
    for given in named:
        arms.append(named_arm(given[0], [read_run(log_dir, warn) for log_dir in given[1:]]))
    every = [run for arm in arms for run in arm.given]
    kinds = compared_kinds(every)
    if not kinds:
        names = ", ".join(run.name for run in every)
        raise ValueError(f"{names}: no metric logged yet, nothing to compare")
    metrics = [{kind: summary(arm, kind) for kind in kinds} for arm in arms]
    comparisons = []
    for arm in arms[1:]:
        rows = [compare_metric(kind, arms[0], arm) for kind in kinds]
        comparisons.append([row for row in rows if row is not None])
    if out is not None:
        write_png(out, comparison_figure(arms, references_for(every)))
    # through fineweb.say: a closed stdout (`plot.py --json ... | head -1`) ends the printing
    # quietly, not in a BrokenPipeError
    if as_json:
        fineweb.say(report_json(arms, metrics, comparisons))
        return
    fineweb.say(report(arms, metrics, comparisons))
    if out is not None:
        fineweb.say(f"wrote {out}")


def check_out(out, log_dirs, comparing):
    """--out resolved once (the picture goes there, whatever a link on its path comes to mean
    meanwhile), or an error that says what to give instead: not a .png; a file there that is not
    a PNG; in no directory; in a training run's log_dir or a corpus, but the one
    run drawn's; or, comparing runs, in any of their log_dirs (each holds that run's files only).
    log_dirs: resolved."""
    out = fineweb.resolved(out)
    # a PNG, never another file (a run's log.txt) written over
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out {out}: give a .png file")
    # (a directory there: the write's own error names it; a FIFO is never opened)
    if out.exists() and not out.is_dir() and not (out.is_file() and is_png(out)):
        raise ValueError(f"--out {out} is a file but not a PNG: give a new .png")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: there is no directory {out.parent}: make it first")
    above = fineweb.claimed_by(out.parent)
    drawn = not comparing and out.parent == log_dirs[0]
    if above and not drawn:
        raise ValueError(f"--out {out} is inside {above}: give a .png outside it")
    for log_dir in log_dirs if comparing else []:
        if out.parent.is_relative_to(log_dir):
            raise ValueError(
                f"--out {out} is in {log_dir}, a run's log_dir: give --out a .png outside"
                " the runs' log_dirs"
            )
    return out


def is_png(path):
    """Whether the file at path is a PNG (by its signature): what plot.py may write over."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def check_once(log_dirs):
    """An error for a log_dir given twice (it would count as two seeds)."""
    seen = []
    for log_dir in log_dirs:
        path = Path(log_dir).resolve()
        if path in seen:
            raise ValueError(f"{log_dir} is given twice: give each run once")
        seen.append(path)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="plot.py",
        usage=argparse.SUPPRESS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Draw a run's log.txt as a PNG of its curves, or compare runs: runs that differ\n"
            "only in --seed are one arm, each arm compared with the first with its seed noise.\n\n"
            "  python plot.py LOG_DIR [--out PNG]              # LOG_DIR/curves.png\n"
            "  python plot.py LOG_DIR LOG_DIR ... [--out PNG]  # compare.png and a report\n"
            "  python plot.py --json LOG_DIR ...               # the report as JSON\n"
            "  python plot.py --arm base log/base-1 log/base-2 log/base-3 \\\n"
            "                 --arm null log/base-4 log/base-5 log/base-6   # arms named by hand"
        ),
    )
    parser.add_argument(
        "log_dirs",
        nargs="*",
        metavar="log_dir",
        help="a training run's log_dir; several are grouped into arms by config and code",
    )
    parser.add_argument(
        "--arm",
        nargs="+",
        action="append",
        default=[],
        metavar=("NAME", "LOG_DIR"),
        help="these runs as one arm named NAME, whatever their configs (a run that differs is"
        " named in a warning); repeatable; after the log_dirs grouped by config and code",
    )
    parser.add_argument(
        "--out",
        metavar="PNG",
        help="the picture (default: LOG_DIR/curves.png; comparing runs, ./compare.png; with"
        " --json, none)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the arms and comparisons as JSON, only"
    )
    args = parser.parse_args(argv)
    if not args.log_dirs and not args.arm:
        parser.error("the following arguments are required: log_dir (or --arm NAME LOG_DIR ...)")
    names = []
    for arm in args.arm:
        name = arm[0]
        # a name forgotten: the first log_dir would name the arm and be left out of it (a name
        # is never a run's log_dir, so never another arm's name either)
        if len(arm) < 2 or (Path(name) / "log.txt").is_file():
            parser.error(
                f"--arm {name}: give the arm a name, then its log_dirs: --arm NAME LOG_DIR ..."
            )
        if name in names:
            parser.error(f"--arm {name} is given twice: name each arm once")
        names.append(name)
    log_dirs = args.log_dirs + [log_dir for arm in args.arm for log_dir in arm[1:]]
    comparing = len(log_dirs) > 1 or args.json or len(args.arm) > 0
    out = args.out
    if out is None and comparing and not args.json:
        out = "compare.png"

    def warn(message):
        print(f"plot.py: warning: {message}", file=sys.stderr)

    try:
        check_once(log_dirs)
        # every log_dir resolved once: read where it is now, whatever a link on its path comes to
        # mean while the runs are read (a "latest" pointer moved)
        args.log_dirs = [fineweb.resolved(log_dir) for log_dir in args.log_dirs]
        args.arm = [[arm[0], *map(fineweb.resolved, arm[1:])] for arm in args.arm]
        log_dirs = args.log_dirs + [log_dir for arm in args.arm for log_dir in arm[1:]]
        if out is not None:
            out = check_out(out, log_dirs, comparing)
        if comparing:
            compare(args.log_dirs, out, args.json, warn, args.arm)
        else:
            out = write_curves(args.log_dirs[0], out, warn=warn)
            fineweb.say(f"wrote {out}")
    except (OSError, ValueError, ImportError) as e:
        sys.exit(f"plot.py: error: {e}")
    except KeyboardInterrupt:
        sys.exit("plot.py: interrupted; what it writes is whole or not there")


if __name__ == "__main__":
    main()
