"""The README as a new user meets it: short, the quick start first, CI running its test command,
its links alive, and every train_gpt2.py command it shows a valid run."""

import re
import shlex

import pytest
from conftest import ROOT

import train_gpt2

README = (ROOT / "README.md").read_text()


def commands(text, program):
    # every `python PROGRAM ...` or `torchrun ... PROGRAM ...` line of the text's code blocks
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    joined = blocks.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line)
        if program in words:
            found.append(words[words.index(program) + 1 :])
    return found


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
    command = "python -m pytest -q -n 2"
    assert f"pip install -r requirements-dev.txt && {command}" in README
    assert "requirements-dev.txt" in ci and command in ci


def test_the_docs_it_links_exist():
    for link in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (ROOT / link).is_file(), link


@pytest.mark.parametrize("args", commands(README, "train_gpt2.py"), ids=" ".join)
def test_every_training_command_is_a_valid_run(args):
    train_gpt2.parse_args(args)


def test_requirements_pin_every_package():
    for name in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-r"):
                assert re.fullmatch(r"[\w.\[\]-]+==[\w.]+", line), f"{name}: {line}"
