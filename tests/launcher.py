"""Start the project's programs as real processes without paying for `import torch` each time.

Most of the suite's time went to starting ~150 interpreters that each import torch (~3 s of CPU) before failing
on a bad flag in milliseconds. Here one warm process per test process (the zygote) imports torch and numpy once and
forks a child for each `python PROGRAM.py ARGS` a test asks for: the child gets its own cwd, environment, stdio
files, process group and resource limits, runs PROGRAM as __main__ (the project's modules are imported fresh in
it, never in the zygote) and exits with the status the interpreter would give: 0, the SystemExit code, or 1 with
the message or traceback on stderr. Anything else (torchrun, `python -c`/`-X`, signals sent mid-run, another
thread count) keeps using subprocess.

    proc = launcher.run([sys.executable, "train_gpt2.py", "--bad"], cwd=ROOT, env=child_env(), timeout=60)
"""

import atexit
import json
import os
import resource
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

_lock = threading.Lock()
_zygote: dict = {}  # {"proc": Popen, "dir": its scratch directory}, started at the first run()


def run(argv: list, cwd, env: dict, timeout: float, file_size_limit: int = 0) -> subprocess.CompletedProcess:
    """subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout), forked from the
    zygote on Linux when argv is `sys.executable SCRIPT.py ...` and env has one OpenMP thread (the zygote's own,
    fixed when torch was imported); file_size_limit > 0 sets RLIMIT_FSIZE (a write past it fails as on a full disk)."""
    argv = [str(a) for a in argv]
    if (sys.platform != "linux" or len(argv) < 2 or argv[0] != sys.executable or not argv[1].endswith(".py")
            or env.get("OMP_NUM_THREADS") != "1"):  # fork after `import torch` is only known to be safe on Linux
        return _plain(argv, cwd, env, timeout, file_size_limit)
    zygote = _start(env)
    with tempfile.TemporaryDirectory(dir=zygote["dir"]) as tmp:
        out, err, result = (os.path.join(tmp, name) for name in ("out", "err", "result.json"))
        request = {"argv": argv, "cwd": str(cwd), "env": env, "out": out, "err": err, "result": result,
                   "timeout": timeout, "fsize": file_size_limit}
        with _lock:
            zygote["proc"].stdin.write(json.dumps(request) + "\n")
            zygote["proc"].stdin.flush()
        while not os.path.exists(result):  # written (by rename) once the child has exited or was killed
            if zygote["proc"].poll() is not None:
                raise RuntimeError(f"the launcher's zygote died (exit {zygote['proc'].returncode})")
            time.sleep(0.02)
        status = json.loads(Path(result).read_text())
        stdout, stderr = (Path(p).read_text(errors="replace") for p in (out, err))
    if status["timed_out"]:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, status["returncode"], stdout, stderr)


def _plain(argv, cwd, env, timeout, file_size_limit=0):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=(lambda: _limit_file_size(file_size_limit)) if file_size_limit else None)


def _limit_file_size(size: int):
    """In the program's process: a write past `size` bytes then fails with EFBIG instead of killing it (SIGXFSZ)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def _start(env: dict) -> dict:
    with _lock:
        if not _zygote:
            scratch = tempfile.mkdtemp(prefix="launcher-")
            _zygote.update(dir=scratch, proc=subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                                              env=env, cwd=scratch, text=True))
            atexit.register(_stop)
        return _zygote


def _stop():
    _zygote["proc"].stdin.close()  # the zygote exits at the end of its input
    _zygote["proc"].wait(timeout=30)
    shutil.rmtree(_zygote["dir"], ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------
# The zygote (this file run as a script) and the children it forks

def _serve():
    import numpy  # noqa: F401  (what every program imports first; the project's own modules stay unimported)
    import torch  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters it forks are reaped by the kernel
    for line in sys.stdin:
        if os.fork() == 0:
            _wait_for_child(json.loads(line))
    # end of input: the test process is done


def _wait_for_child(request: dict):
    """In a waiter forked per request: fork the program with pipes for stdout and stderr (files would fall under
    its RLIMIT_FSIZE), copy them to request's files until both close, killing the program's process group at the
    timeout; then write {returncode, timed_out} to request["result"] by rename, and exit."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # waitpid needs it
    pipes = [os.pipe(), os.pipe()]
    pid = os.fork()
    if pid == 0:
        for fd, (read, write) in zip((1, 2), pipes):
            os.dup2(write, fd)
            os.close(read)
            os.close(write)
        _exec_program(request)
    files = {read: open(path, "wb") for (read, _), path in zip(pipes, (request["out"], request["err"]))}
    for _, write in pipes:
        os.close(write)
    deadline, timed_out = time.monotonic() + request["timeout"], False
    while files:
        if not timed_out and time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            timed_out = True
        for read in select.select(list(files), [], [], 0.1)[0]:
            if data := os.read(read, 1 << 16):
                files[read].write(data)
            else:  # closed: the program (and whatever it started) is done with it
                files.pop(read).close()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    with open(request["result"] + ".tmp", "w") as f:
        json.dump({"returncode": status, "timed_out": timed_out}, f)
    os.rename(request["result"] + ".tmp", request["result"])
    os._exit(0)


def _exec_program(request: dict):
    """Become `python PROGRAM.py ARGS` (in the forked child) and exit as the interpreter would."""
    os.setpgid(0, 0)  # its own group: a timeout kills the program and whatever it started
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    sys.stdin = open(os.devnull)  # not the zygote's, which may hold later requests in its buffer
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read TMPDIR again
    if request["fsize"]:
        _limit_file_size(request["fsize"])
    program = os.path.abspath(request["argv"][1])
    sys.argv, sys.path[0] = [request["argv"][1], *request["argv"][2:]], os.path.dirname(program)
    code = 0
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as e:  # as the interpreter treats it: None is 0, an int is the status, else print it and 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # the traceback from the program's own frame on, as the interpreter prints it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != program:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


if __name__ == "__main__":
    _serve()
