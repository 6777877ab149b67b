"""tests/launcher.py must be indistinguishable from subprocess.run for what the suite checks: exit status, stdout,
stderr (messages and tracebacks), cwd, environment, a file-size limit, a timeout, worker processes, and the
project's modules imported afresh in each program."""

import subprocess
import sys
import textwrap

import pytest

import launcher
from helpers import child_env

PROGRAM = textwrap.dedent('''
    import os, sys, tempfile
    print("argv", sys.argv[1:], "cwd", os.getcwd() == sys.argv[1], "env", os.environ.get("LAUNCHER_TEST"))
    print("tmp", tempfile.gettempdir() == os.environ["TMPDIR"], "path0", sys.path[0] == os.path.dirname(__file__))
    print("fresh", "train_gpt2" not in sys.modules, "main", __name__, "stdin", repr(sys.stdin.read()))
    sys.stdout.flush()
    how = sys.argv[2]
    if how == "message":
        sys.exit("error: a clear message")
    if how == "code":
        sys.exit(3)
    if how == "raise":
        raise KeyError("deep in a library")
    if how == "big":
        with open(os.path.join(sys.argv[1], "big.bin"), "wb") as f:
            f.write(bytes(5000))
    if how == "sleep":
        import time; time.sleep(60)
    if how == "pool":
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(2) as pool:
            print("pool", sorted(pool.map(abs, [-2, -1])))
    print("stderr line", file=sys.stderr)
''')


@pytest.mark.parametrize("how", ["ok", "message", "code", "raise", "big", "pool"])
def test_same_as_subprocess(tmp_path, how):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = {**child_env(), "LAUNCHER_TEST": "x", "TMPDIR": str(tmp_path)}
    results = []
    for run in (launcher.run, launcher._plain):
        (tmp_path / "big.bin").unlink(missing_ok=True)
        proc = run([sys.executable, str(script), str(tmp_path), how], cwd=tmp_path, env=env, timeout=60,
                   **({"file_size_limit": 1000} if how == "big" else {}))
        results.append((proc.returncode, proc.stdout, proc.stderr.replace(str(script), "PROG")))
    assert results[0] == results[1]
    code, out, err = results[0]
    assert "cwd True env x" in out and "tmp True path0 True" in out and "fresh True main __main__ stdin ''" in out
    assert code == {"ok": 0, "message": 1, "code": 3, "raise": 1, "big": 1, "pool": 0}[how]
    if how == "raise":
        assert "Traceback" in err and "KeyError: 'deep in a library'" in err
    if how == "big":
        assert "File too large" in err  # the limit is the program's, not its stdout's
    if how == "pool":
        assert "pool [1, 2]" in out


def test_timeout_kills_the_program(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run([sys.executable, str(script), str(tmp_path), "sleep"], cwd=tmp_path, env=child_env(), timeout=2)
