"""
The texture of every program, measured from its AST.

    python scripts/texture.py            # one row a program
    python scripts/texture.py FILE.py    # any Python files

statements: the ast.stmt nodes, nested ones and docstrings
    included.
lines, median, p95: lines in all; the median and the 95th
    percentile length of the non-blank ones.
params: the most parameters of one function (*args and
    **kwargs count one each, self and cls none).
nesting: the most compound statements (if, for, while,
    with, try, match, def, class) enclosing one statement;
    a statement at module level is at 0, a function's body
    at 1. An elif (or an else holding only an if) is part
    of its if, so a chain of elifs is one level.
functions: the def statements, methods and nested ones too.

tests/test_style.py imports these measures and holds every
program to its budgets.
"""

import argparse
import ast
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = [
    "train_gpt2.py",
    "fineweb.py",
    "hellaswag.py",
    "export_hf.py",
    "sample.py",
    "plot.py",
    "bench.py",
]
FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPOUND = FUNCTION + (
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    getattr(ast, "TryStar", ast.Try),  # except* (3.11)
    ast.Match,
)


def programs(root=ROOT):
    """The programs at the top, then scripts/*.py."""
    scripts = sorted((root / "scripts").glob("*.py"))
    return [root / name for name in PROGRAMS] + scripts


def statements(tree):
    return sum(isinstance(n, ast.stmt) for n in ast.walk(tree))


def line_lengths(source):
    """The length of each non-blank line."""
    return [len(line) for line in source.splitlines() if line.strip()]


def functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, FUNCTION)]


def params(function):
    """Its parameters, self or cls not counted."""
    a = function.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    bound = positional[:1] in (["self"], ["cls"])
    starred = [p for p in (a.vararg, a.kwarg) if p is not None]
    return len(positional) - bound + len(a.kwonlyargs) + len(starred)


def depths(node, depth=0):
    """(statement, depth) for each statement under node."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.stmt):
            # an except handler's or a match case's body
            yield from depths(child, depth)
            continue
        # an elif is part of its if, not a level deeper
        chained = isinstance(node, ast.If) and node.orelse == [child]
        own = depth - (chained and isinstance(child, ast.If))
        yield child, own
        yield from depths(child, own + isinstance(child, COMPOUND))


def measure(source):
    """The row of one program's measures."""
    tree = ast.parse(source)
    lengths = sorted(line_lengths(source)) or [0]
    defs = functions(tree)
    return {
        "statements": statements(tree),
        "lines": len(source.splitlines()),
        "median": statistics.median(lengths),
        "p95": lengths[int(0.95 * len(lengths))],
        "params": max(map(params, defs), default=0),
        "nesting": max((d for _, d in depths(tree)), default=0),
        "functions": len(defs),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="texture.py",
        usage=argparse.SUPPRESS,
        description="Print the texture of Python programs.",
    )
    parser.add_argument("files", nargs="*", type=Path)
    paths = parser.parse_args(argv).files or programs()
    header = list(measure(""))
    print(f"{'program':<28}" + "".join(f"{h:>11}" for h in header))
    for path in paths:
        name = path.relative_to(ROOT) if ROOT in path.parents else path
        try:
            row = measure(path.read_text()).values()
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            print(f"{str(name):<28} cannot measure: {e}")
            continue
        print(f"{str(name):<28}" + "".join(f"{v:>11g}" for v in row))


if __name__ == "__main__":
    main()
