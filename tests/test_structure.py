"""The shape of train_gpt2.py that its readers rely on: its size, function lengths and reading order, the plumbing in
run_files.py, how much the training loop reaches, build-nanogpt's names (`model` trains, `raw_model` evaluates and
saves), one attention call, one training loop, one metrics sink, and imports that run one way.

The structure is measured by parsing the source (ast), not by pinning line numbers; the metrics sink and the single
import are shown by running training."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import plot
import run_files
import train_gpt2
from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT / "train_gpt2.py").read_text()
TREE = ast.parse(SOURCE)
TOP = {node.name: node for node in TREE.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
PROJECT_MODULES = {"run_files", "hellaswag", "plot", "fineweb", "export_hf", "sample", "bench", "train_gpt2"}


def calls_to(name: str, tree=TREE) -> list[ast.Call]:
    """Calls whose callee's last dotted part is `name` (F.scaled_dot_product_attention -> 'scaled_dot_product_attention')."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name)]


def module_level_names(tree) -> dict[str, str]:
    """{name: 'def' | 'import'} for what a module binds at its top level."""
    names = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names[node.name] = "def"
        elif isinstance(node, ast.Assign):
            names.update({t.id: "def" for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: "import" for a in node.names})
    return names


def imports_of(path: Path, top_level_only: bool = True) -> set[str]:
    """The project modules a file imports: at its top, or (top_level_only=False) inside functions too."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found & PROJECT_MODULES - {path.stem}


# ----------------------------------------------------------------------------------------------------------
# Size, reading order, the plumbing beside it


@pytest.mark.gpt2_contract
def test_the_shipped_file_keeps_its_line_budget():
    """train_gpt2.py as this repository ships it: at most 850 lines. A fork's research edit (RoPE adds about 15) may
    spend more, so this is part of the contract, not of the invariants."""
    assert len(SOURCE.splitlines()) <= 850


def test_no_function_is_longer_than_a_screen_or_two():
    functions = [n for n in ast.walk(TREE) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    too_long = {f.name: f.end_lineno - f.lineno + 1 for f in functions if f.end_lineno - f.lineno + 1 > 80}
    assert not too_long, too_long


def test_sections_come_in_build_nanogpt_order():
    banners = re.findall(r"^# -{50,}\n# (.+)$", SOURCE, flags=re.M)
    expected = ["Configuration", "Model", "Data", "Learning-rate schedule", "Distributed set-up", "Evaluation",
                "Training", "Command line"]
    assert [next((e for e in expected if b.startswith(e)), b) for b in banners] == expected
    assert SOURCE.rstrip().endswith('if __name__ == "__main__":\n    main()')


def test_plumbing_lives_in_run_files_and_imports_run_one_way():
    """Checkpoint files, lineages, the lock, atomic writes, signals, the run header, manifest checks and CPU tuning
    are run_files.py's; train_gpt2.py keeps what an experiment edits. run_files imports no project module, so no
    two files import each other."""
    for name in ("load_checkpoint", "atomic_write", "capture_rng_state", "checkpoint_paths", "choose_lineage",
                 "LogDirLock", "StopSignal", "write_header", "find_shards", "tune_for", "peak_flops",
                 "SpikeGuard", "Metrics"):
        assert name not in TOP and hasattr(run_files, name), name
    for name in ("GPTConfig", "TrainConfig", "GPT", "DataLoaderLite", "get_lr", "setup_distributed",
                 "evaluate_val_loss", "train", "save_checkpoint", "resume", "main"):
        assert name in TOP, name
    graph = {path.stem: imports_of(path) for path in ROOT.glob("*.py")}
    assert imports_of(ROOT / "run_files.py", top_level_only=False) == set()
    assert {"run_files", "hellaswag", "plot", "fineweb"} <= graph["train_gpt2"]
    for a, deps in graph.items():
        for b in deps:
            assert a not in graph.get(b, set()), f"{a} and {b} import each other"
    # Counting imports inside functions too, one pair remains: hellaswag.py's command line (run) loads a model with
    # train_gpt2.load_model. A training run never takes that path, so it loads train_gpt2.py once (test below).
    every = {p.stem: imports_of(p, top_level_only=False) for p in ROOT.glob("*.py")}
    pairs = {tuple(sorted((a, b))) for a, deps in every.items() for b in deps if a in every.get(b, set())}
    assert pairs == {("hellaswag", "train_gpt2")}


def test_the_loop_reaches_few_names_and_uses_build_nanogpts():
    """train() reads like build-nanogpt's loop: what it calls of this project is few and named at its top; `model`
    is what trains (compiled, DDP-wrapped) and `raw_model` what evaluates and saves."""
    top = module_level_names(TREE)
    train = TOP["train"]
    used = {n.id for n in ast.walk(train) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    own = {u for u in used if top.get(u) == "def"}
    plumbing = {f"{n.value.id}.{n.attr}" for n in ast.walk(train) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id in PROJECT_MODULES}
    assert len(own) + len(plumbing) <= 15, sorted(own) + sorted(plumbing)
    assigned = {t.id for n in ast.walk(train) if isinstance(n, ast.Assign) for t in ast.walk(n) if isinstance(t, ast.Name)
                and isinstance(t.ctx, ast.Store)}
    assert {"model", "raw_model", "optimizers", "train_loader", "grad_accum_steps", "loss_accum"} <= assigned
    body = ast.get_source_segment(SOURCE, train)
    assert "raw_model.parameters()" in body and "model(x, y)" in body  # clip the weights; train through the wrapper


def test_one_attention_call_for_every_use():
    """Training, val loss, KV-cache decoding and HellaSwag's packed rows all go through this one call; no other
    file of the project calls the kernel itself."""
    assert len(calls_to("scaled_dot_product_attention")) == 1
    for path in ROOT.glob("*.py"):
        if path.name != "train_gpt2.py":
            assert "scaled_dot_product_attention" not in path.read_text(), path.name
    assert len(calls_to("attention_mask")) == 1  # chosen once per forward, in features()


def test_one_training_loop_with_its_steps_inline():
    body = ast.get_source_segment(SOURCE, TOP["train"])
    loops = [n.target.id for n in ast.walk(TREE) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)]
    assert loops.count("step") == loops.count("micro_step") == 1  # the steps, and the micro-steps inside them
    assert len(calls_to("backward")) == 1 and len(calls_to("backward", TOP["train"])) == 1
    order = ["zero_grad(", "require_backward_grad_sync", "backward()", "all_reduce(loss_accum", "clip_grad_norm_(",
             "get_lr(", ".step()", "synchronize()", "metrics.report(step, train="]
    positions = [body.index(token) for token in order]
    assert positions == sorted(positions), "build-nanogpt's order: zero grads, micro-steps, average, clip, LR, step, sync, log"


def test_the_loss_is_f_cross_entropy_unless_chunked_is_asked_for():
    forward = next(n for n in ast.walk(TOP["GPT"]) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert len(calls_to("cross_entropy", forward)) == 1 and len(calls_to("apply", forward)) == 1
    assert train_gpt2.TrainConfig().chunked_loss is False


# ----------------------------------------------------------------------------------------------------------
# One metrics sink, and one module


def make_shards(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    np.save(root / "t_val_000000.npy", rng.integers(0, 96, 2048).astype(np.uint16))
    np.save(root / "t_train_000001.npy", rng.integers(0, 96, 4096).astype(np.uint16))
    return root


def write_hellaswag(path: Path) -> Path:
    example = {"ctx": "A man sits on a roof. He", "endings": ["starts pulling up roofing.", "is a cat.",
                                                             "sings.", "flies."], "label": 0}
    path.write_text("\n".join(json.dumps({**example, "ind": i}) for i in range(3)) + "\n")
    return path


# GPT-2's vocabulary (HellaSwag needs it), everything else tiny.
RUN = dict(n_layer=1, n_head=1, n_embd=16, block_size=64, vocab_size=50257, batch_size=2, seq_len=16,
           total_batch_size=32, max_steps=4, warmup_steps=1, eval_interval=2, val_tokens=64, hellaswag_interval=2,
           sample_interval=0, ckpt_interval=0, device="cpu", dtype="float32", compile="false")


class Recorder:
    """Stands in for a wandb run: what it was sent, as (step, {kind: value})."""

    def __init__(self):
        self.calls = []

    def log(self, values: dict, step: int):
        self.calls.append((step, dict(values)))

    def finish(self):
        pass


def test_one_sink_feeds_stdout_log_and_wandb_and_a_new_metric_is_one_line(tmp_path, monkeypatch):
    """Every value is reported once, at the step it was measured, to all three sinks alike; wandb gets the
    train loss, LR, grad norm, tok/s, val loss and HellaSwag. A metric a user adds is the single marked line
    below, where its value is computed: it then shows on stdout, in log.txt, in wandb, in the returned
    metrics and in the plot."""
    recorder = Recorder()
    monkeypatch.setattr(run_files, "start_wandb", lambda **wandb: recorder)
    original = train_gpt2.evaluate

    def evaluate(cfg, step, raw_model, *args):
        done = original(cfg, step, raw_model, *args)
        metrics = args[-2]
        metrics.report(step, weight_rms=raw_model.lm_head.weight.detach().pow(2).mean().sqrt().item())  # <- the one line
        return done

    monkeypatch.setattr(train_gpt2, "evaluate", evaluate)
    messages = []
    cfg = train_gpt2.TrainConfig(data_root=str(make_shards(tmp_path / "data")), log_dir=str(tmp_path / "log"),
                                 hellaswag_data=str(write_hellaswag(tmp_path / "hs.jsonl")), wandb_project="x", **RUN)
    metrics = train_gpt2.train(cfg, log=messages.append)

    log = plot.read_log(tmp_path / "log" / "log.txt")
    lines = (tmp_path / "log" / "log.txt").read_text().splitlines()
    assert len(lines) == len({tuple(line.split()[:2]) for line in lines}), "a (step, kind) was logged twice"
    sent = [(step, kind, value) for step, values in recorder.calls for kind, value in values.items()]
    assert sorted((s, k) for s, k, _ in sent) == sorted((int(ln.split()[0]), ln.split()[1]) for ln in lines)
    for step, kind, value in sent:  # the same value in both, at the same step (log.txt keeps 8 digits)
        assert dict(log[kind])[step] == pytest.approx(value, rel=1e-7)
    assert {"train", "lr", "norm", "tok_per_s", "val", "hella"} <= set(log)
    assert [s for s, _ in log["train"]] == [0, 1, 2, 3] and [s for s, _ in log["val"]] == [0, 2, 4]
    assert [s for s, _ in log["hella"]] == [0, 2, 4] and [s for s, _ in log["weight_rms"]] == [0, 1, 2, 3, 4]
    printed = [m for m in messages if "weight_rms" in m]
    assert len(printed) == 5 and printed[0].startswith("eval     0/4 | ")
    assert metrics["weight_rms"] == pytest.approx(log["weight_rms"][-1][1], rel=1e-7)
    assert metrics["hella"] == pytest.approx(log["hella"][-1][1], rel=1e-7)
    assert plot.curves_png(tmp_path / "log")[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_training_run_loads_train_gpt2_once(tmp_path):
    """`python train_gpt2.py` with HellaSwag in the loop: hellaswag.py and plot.py are imported, and neither
    imports train_gpt2 back, so the script's classes exist once (python -X importtime lists every import)."""
    data, hs = make_shards(tmp_path / "data"), write_hellaswag(tmp_path / "hs.jsonl")
    run = {**RUN, "data_root": data, "log_dir": tmp_path / "log", "hellaswag_data": hs, "ckpt_interval": 2}
    argv = [a for k, v in run.items() for a in (f"--{k}", str(v))]
    proc = subprocess.run([sys.executable, "-X", "importtime", "train_gpt2.py", *argv], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert {"hellaswag", "plot", "run_files", "fineweb"} <= imported and "train_gpt2" not in imported
    assert "HellaSwag acc_norm" in proc.stdout and (tmp_path / "log" / "curves.png").is_file()
