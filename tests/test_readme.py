"""The README as a new user meets it: short, the quick start first, CI running its test command,
its links alive; every train_gpt2.py command of the README and docs/ a valid run at the world
size it launches, and the README's commands, run one after another, never two new runs in one
log_dir."""

import re
import shlex

import pytest
from conftest import ROOT

import harness
import train_gpt2

README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_starts_with_the_quick_start():
    lines = README.splitlines()
    assert len(lines) <= 300
    quick = lines.index("## Quick start")
    assert quick < 40
    block = README.split("## Quick start")[1].split("```bash\n")[1].split("```")[0]
    assert "pip install -r requirements.txt" in block
    assert "python train_gpt2.py --preset shakespeare_char" in block
    assert README.index(block) < len("\n".join(lines[:60]))


def test_ci_runs_exactly_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    command = "python -m pytest -q -n 3"
    assert f"pip install -r requirements-dev.txt && {command}" in README
    assert "requirements-dev.txt" in ci and command in ci


def test_the_docs_it_links_exist():
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (ROOT / link).is_file(), link


def unrolled(lines):
    """lines with each `for NAME in A B C; do` ... `done` loop written out, $NAME replaced."""
    out = []
    loop = None  # (name, values, body) of the loop being read
    for line in lines:
        start = re.fullmatch(r"\s*for (\w+) in (.*); do", line)
        if start:
            loop = (start[1], start[2].split(), [])
        elif loop and line.strip() == "done":
            name, values, body = loop
            out += [b.replace(f"${name}", v) for v in values for b in body]
            loop = None
        elif loop:
            loop[2].append(line)
        else:
            out.append(line)
    return out


def launches(text):
    """(world size, train_gpt2.py's flags) of every command in text's bash blocks that runs it:
    python (one process) or torchrun (--nnodes x --nproc_per_node), also inside bash -c '...'
    or a for loop."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    found = []
    for line in unrolled(blocks.replace("\\\n", " ").splitlines()):
        words = shlex.split(line, comments=True)
        inner = [w for w in words if "train_gpt2.py " in w]
        if inner:  # bash -c "...; exec torchrun ... train_gpt2.py ..."
            words = shlex.split(inner[0])
        if "train_gpt2.py" not in words:
            continue
        before = words[: words.index("train_gpt2.py")]
        sizes = dict(re.findall(r"--(nnodes|nproc_per_node)=(\d+)", " ".join(before)))
        world = int(sizes.get("nnodes", 1)) * int(sizes.get("nproc_per_node", 1))
        found.append((world, words[words.index("train_gpt2.py") + 1 :]))
    return found


DOCUMENTED = [
    launch
    for path in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
    for launch in launches(path.read_text())
]


@pytest.mark.parametrize(
    "world, args", DOCUMENTED, ids=[f"{w} x {' '.join(a)}" for w, a in DOCUMENTED]
)
def test_every_documented_command_starts_at_its_world_size(world, args):
    cfg = harness.parse_args(args, train_gpt2.TrainConfig, train_gpt2.PRESETS)
    assert train_gpt2.micro_steps(cfg, world) >= 1


def test_the_documented_world_sizes_include_one_node_and_several():
    assert {1, 8, 16, 32} <= {world for world, _ in DOCUMENTED}


def test_the_readmes_commands_in_order_never_start_two_runs_in_one_log_dir():
    # a new run needs a log_dir no earlier command wrote (the quick start, then the experiment,
    # then the overfit check...); --resume auto continues one
    used = set()
    for world, args in launches(README):
        cfg = harness.parse_args(args, train_gpt2.TrainConfig, train_gpt2.PRESETS)
        if cfg.resume != "auto":
            assert cfg.log_dir not in used, f"{args} reuses {cfg.log_dir}"
        used.add(cfg.log_dir)


def test_requirements_pin_every_package():
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r"):
                assert re.fullmatch(r"[\w.\[\]-]+==[\w.]+", line), f"{name}: {line}"
