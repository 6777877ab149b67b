"""The formatter and the linter of every file (ruff, pinned), imports that run one way, and an
import of train_gpt2 that does nothing."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the modules train_gpt2.py imports, and theirs: they never import it back
LIBRARIES = ["fineweb.py", "harness.py", "hellaswag_eval.py", "plot.py"]
LAZY = {"transformers", "wandb", "matplotlib", "tqdm"}  # only inside the functions that use them
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def parsed(name):
    return ast.parse((ROOT / name).read_text(), filename=name)


# ----------------------------------------------------------------------------------------------
# the formatter and the linter (ruff is pinned in requirements-dev.txt; config in pyproject.toml)


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "check"])
def test_ruff(command):
    argv = [sys.executable, "-m", "ruff", *command, "--no-cache", "--output-format", "concise"]
    result = subprocess.run([*argv, "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    fix = {"format": "run `.venv/bin/ruff format .`", "check": "fix what ruff check reports"}
    lines = (result.stdout + result.stderr).splitlines()
    shown = "\n".join(lines[:60] + [f"... {len(lines) - 60} more"] * (len(lines) > 60))
    assert result.returncode == 0, (
        f"`ruff {' '.join(command)} .` failed: {fix[command[0]]} "
        f"(pip install -r requirements-dev.txt if ruff is missing)\n{shown}"
    )


# ----------------------------------------------------------------------------------------------
# imports run one way


def imports(tree: ast.AST, module_level: bool) -> list[tuple[str, int]]:
    """(top-level module name, line) of each import; module_level: not those in functions."""
    found = []
    for child in ast.iter_child_nodes(tree):
        if module_level and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(child, ast.Import):
            found += [(a.name.split(".")[0], child.lineno) for a in child.names]
        elif isinstance(child, ast.ImportFrom) and child.level == 0:
            found.append((child.module.split(".")[0], child.lineno))
        found += imports(child, module_level)
    return found


@pytest.mark.parametrize("name", LIBRARIES)
def test_libraries_never_import_train_gpt2(name):
    lines = [line for module, line in imports(parsed(name), False) if module == "train_gpt2"]
    assert not lines, (
        f"{name}:{lines[0]} imports train_gpt2, which imports {name}: a program that needs both "
        "imports both (hellaswag.py, sample.py)"
    )


def test_the_projects_imports_run_one_way():
    # every import of one of the project's modules by another, in functions too: no circle
    project = {path.stem for path in ROOT.glob("*.py")}
    edges = {}
    for name in project:
        found = imports(parsed(f"{name}.py"), False)
        edges[name] = {module for module, _ in found if module in project and module != name}

    def circle(path):
        for module in sorted(edges[path[-1]]):
            if module in path:
                return path[path.index(module) :] + [module]
            found = circle(path + [module])
            if found:
                return found
        return None

    for name in sorted(project):
        found = circle([name])
        assert found is None, f"an import circle: {' -> '.join(found)}"


def test_train_gpt2_imports_only_its_libraries_of_the_project():
    project = {path.stem for path in ROOT.glob("*.py")} | {"scripts", "run_files"}
    other = project - {"harness", "hellaswag_eval", "fineweb"}
    found = imports(parsed("train_gpt2.py"), False)
    others = [f"train_gpt2.py:{line} imports {m}" for m, line in found if m in other]
    assert not others, f"of the project it imports harness, hellaswag_eval, fineweb: {others}"


def test_train_gpt2_imports_heavy_libraries_lazily():
    found = imports(parsed("train_gpt2.py"), True)
    eager = [f"train_gpt2.py:{line} imports {m}" for m, line in found if m in LAZY]
    assert not eager, f"import these inside the functions that use them: {eager}"


def test_importing_train_gpt2_does_nothing(tmp_path):
    """In a fresh process in an empty directory: no output, no file, no process group."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import train_gpt2\n"
        "import torch.distributed as dist\n"
        "busy = dist.is_available() and dist.is_initialized()\n"
        "sys.stdout.write(f'\\0process group: {busy}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN}
    argv = [sys.executable, "-c", code]
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"importing train_gpt2 failed:\n{result.stderr}"
    printed, _, group = result.stdout.partition("\0")
    assert printed == "" and result.stderr == "", (
        "importing train_gpt2 printed: move the work under main() "
        f"(stdout {printed!r}, stderr {result.stderr[-2000:]!r})"
    )
    assert group == "process group: False", "importing train_gpt2 initialised a process group"
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == [], f"importing train_gpt2 wrote {written} in the working directory"
