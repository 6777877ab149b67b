"""The texture of every program, measured from its AST with scripts/texture.py's measures (one
place for each): ruff's format and lint, statement budgets, line lengths, parameters, returned
tuples, nesting, no tuple packing or walrus, imports that run one way, and an import that does
nothing. Each failure names the file, line and function to fix.

The statement budgets are the GPT-2 contract as shipped (-m "not gpt2_contract" skips them, so a
researcher's edit that grows a file keeps the rest of the suite green); the others always run."""

import ast
import importlib.util
import os
import statistics
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("texture", ROOT / "scripts" / "texture.py")
texture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(texture)

PROGRAMS = [str(path.relative_to(ROOT)) for path in texture.programs()]
BUDGETS = {
    "train_gpt2.py": 600,
    "fineweb.py": 330,
    "hellaswag.py": 180,
    "export_hf.py": 100,
    "bench.py": 250,
}
MEDIAN_LINE = 60
MAX_PARAMS = 8
MAX_RETURNED = 5
MAX_NESTING = 6
# the library modules train_gpt2.py imports: they never import it back at module level
LIBRARIES = ["fineweb.py", "hellaswag.py", "plot.py"]
LAZY = {"transformers", "wandb", "matplotlib", "tqdm"}  # only inside the functions that use them
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@cache
def parsed(name: str) -> ast.Module:
    path = ROOT / name
    assert path.is_file(), f"{name} is missing: the texture checks measure every program"
    return ast.parse(path.read_text(), filename=name)


@cache
def nodes(name: str) -> list[ast.AST]:
    """Every node of a program, in the order of its lines."""
    found = [n for n in ast.walk(parsed(name)) if hasattr(n, "lineno")]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def where(name: str, node: ast.AST) -> str:
    """file:line, and the innermost function (or class) around node."""
    scopes = [
        n
        for n in nodes(name)
        if isinstance(n, texture.FUNCTION + (ast.ClassDef,))
        and n.lineno <= node.lineno <= n.end_lineno
        and n is not node
    ]
    if not scopes:
        return f"{name}:{node.lineno}"
    inner = scopes[-1]
    scope = f"class {inner.name}" if isinstance(inner, ast.ClassDef) else f"{inner.name}()"
    return f"{name}:{node.lineno} in {scope}"


def report(problems: list[str], fix: str) -> str:
    return f"{len(problems)} to fix ({fix}):\n  " + "\n  ".join(problems)


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
# budgets: the GPT-2 contract as shipped


@pytest.mark.gpt2_contract
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_statement_budget(name):
    tree = parsed(name)
    count = texture.statements(tree)
    defs = [n for n in tree.body if isinstance(n, texture.FUNCTION + (ast.ClassDef,))]
    biggest = sorted(defs, key=texture.statements, reverse=True)[:5]
    sizes = ", ".join(f"{n.name} {texture.statements(n)} (line {n.lineno})" for n in biggest)
    assert count <= BUDGETS[name], (
        f"{name} has {count} statements, its budget is {BUDGETS[name]}: simplify or cut "
        f"{count - BUDGETS[name]}; the biggest definitions: {sizes}"
    )


# ----------------------------------------------------------------------------------------------
# texture: every program


@pytest.mark.parametrize("name", PROGRAMS)
def test_median_line_length(name):
    source = (ROOT / name).read_text()
    lengths = texture.line_lengths(source)
    median = statistics.median(lengths or [0])
    numbered = [(len(line), i) for i, line in enumerate(source.splitlines(), 1)]
    longest = ", ".join(f"{name}:{i} ({n})" for n, i in sorted(numbered, reverse=True)[:8])
    assert median <= MEDIAN_LINE, (
        f"{name}: the median non-blank line is {median} characters, more than {MEDIAN_LINE}: "
        f"one statement per line, no long one-liners; the longest lines: {longest}"
    )


@pytest.mark.parametrize("name", PROGRAMS)
def test_function_parameters(name):
    problems = [
        f"{where(name, f)}: {f.name}() takes {texture.params(f)} parameters"
        for f in sorted(texture.functions(parsed(name)), key=lambda f: f.lineno)
        if texture.params(f) > MAX_PARAMS
    ]
    fix = f"at most {MAX_PARAMS}; pass a config or split the function"
    assert not problems, report(problems, fix)


@pytest.mark.parametrize("name", PROGRAMS)
def test_returned_tuples(name):
    problems = [
        f"{where(name, n)}: returns a tuple of {len(n.value.elts)}"
        for n in nodes(name)
        if isinstance(n, ast.Return)
        and isinstance(n.value, ast.Tuple)
        and len(n.value.elts) > MAX_RETURNED
    ]
    fix = f"at most {MAX_RETURNED} values; return a dict or a dataclass"
    assert not problems, report(problems, fix)


@pytest.mark.parametrize("name", PROGRAMS)
def test_nesting(name):
    """Depth as scripts/texture.py defines it: the compound statements around a statement, def
    and class included, an elif part of its if (build-nanogpt's train_gpt2.py: 5)."""
    problems = [
        f"{where(name, n)}: {type(n).__name__} nested {depth} deep"
        for n, depth in texture.depths(parsed(name))
        if depth > MAX_NESTING
    ]
    fix = f"at most {MAX_NESTING}; move the inner block into a function or return early"
    assert not problems, report(problems, fix)


@pytest.mark.parametrize("name", PROGRAMS)
def test_no_tuple_packing_or_walrus(name):
    problems = []
    for n in nodes(name):
        targets = getattr(n, "targets", [])
        packed = isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)
        if packed and any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):
            problems.append(f"{where(name, n)}: `a, b = x, y`: one assignment per line")
        if isinstance(n, ast.NamedExpr):
            problems.append(f"{where(name, n)}: `:=`: assign on the line above")
    assert not problems, report(problems, "build-nanogpt's texture")


# ----------------------------------------------------------------------------------------------
# imports run one way


def imports(tree: ast.AST, module_level: bool) -> list[tuple[str, int]]:
    """(top-level module name, line) of each import; module_level: not those in functions."""
    found = []
    for child in ast.iter_child_nodes(tree):
        if module_level and isinstance(child, texture.FUNCTION):
            continue
        if isinstance(child, ast.Import):
            found += [(a.name.split(".")[0], child.lineno) for a in child.names]
        elif isinstance(child, ast.ImportFrom) and child.level == 0:
            found.append((child.module.split(".")[0], child.lineno))
        found += imports(child, module_level)
    return found


@pytest.mark.parametrize("name", LIBRARIES)
def test_libraries_never_import_train_gpt2_at_module_level(name):
    lines = [line for module, line in imports(parsed(name), True) if module == "train_gpt2"]
    assert not lines, (
        f"{name}:{lines[0]} imports train_gpt2 at module level: train_gpt2 imports {name}; "
        "import it inside the function that needs it (hellaswag's main())"
    )


def test_train_gpt2_imports_only_hellaswag_fineweb_plot_of_the_project():
    project = {path.stem for path in ROOT.glob("*.py")} | {"scripts", "run_files"}
    other = project - {"hellaswag", "fineweb", "plot"}
    found = imports(parsed("train_gpt2.py"), False)
    others = [f"train_gpt2.py:{line} imports {m}" for m, line in found if m in other]
    assert not others, report(others, "of the project it imports only hellaswag, fineweb, plot")


def test_train_gpt2_imports_heavy_libraries_lazily():
    found = imports(parsed("train_gpt2.py"), True)
    eager = [f"train_gpt2.py:{line} imports {m}" for m, line in found if m in LAZY]
    assert not eager, report(eager, "import it inside the function that uses it")


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
