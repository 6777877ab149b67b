"""run_files.py, the plumbing of a run, on its own: the log_dir lock (and filesystems without locks), the GPU peak
FLOP/s table behind MFU, torchrun's variables and which GPU a process takes (with train_gpt2.setup_distributed, which
uses those two), and the stop signals. CUDA is simulated (torch.cuda's functions monkeypatched), so this runs on any
CPU machine."""

import errno
import fcntl
import os
import signal

import pytest
import torch

import fineweb
import run_files
import train_gpt2
from helpers import stop_signals_at_default
from run_files import LOCK_FILE, PEAK_BF16_FLOPS, LogDirLock, cuda_device, gpu_model, mfu_note, peak_flops, torchrun_env


# ----------------------------------------------------------------------------------------------------------
# The log_dir lock


def hold(path) -> int:
    """An fd holding path's exclusive flock, as a running train_gpt2.py holds log_dir/.lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_the_lock_is_a_file_opened_for_writing_and_a_second_claim_is_refused_naming_the_holder(tmp_path):
    log = tmp_path / "log"
    first = LogDirLock(log, master=True)
    assert first.claim(create=False) == "" and not log.exists()  # nothing to lock yet, nothing made
    assert first.claim(create=True) == ""
    assert [p.name for p in log.iterdir()] == [LOCK_FILE]
    assert os.fstat(first.fd).st_ino == (log / LOCK_FILE).stat().st_ino
    assert fcntl.fcntl(first.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR  # NFS: an exclusive lock needs write
    with pytest.raises(ValueError) as e:
        LogDirLock(log, master=True).claim(create=True)
    assert str(e.value).startswith(f"--log_dir {log} is in use by another run (pid {os.getpid()}: ")
    first.release()
    second = LogDirLock(log, master=True)
    assert second.claim(create=False) == ""  # the lock went with its holder; the file stays and is reused
    second.release()
    other_rank = LogDirLock(log, master=False)  # only rank 0 locks
    assert other_rank.claim(create=True) == "" and other_rank.fd is None


def test_a_lock_held_by_hand_is_named_by_lock_holder(tmp_path):
    fd = hold(tmp_path / LOCK_FILE)
    try:
        assert run_files.lock_holder(tmp_path / LOCK_FILE).startswith(f"pid {os.getpid()}: ")
    finally:
        os.close(fd)
    assert run_files.lock_holder(tmp_path / LOCK_FILE).startswith("a process not visible from here")


@pytest.mark.parametrize("code", ["ENOLCK", "ENOSYS", "EBADF", "EINVAL", "EOPNOTSUPP"])
def test_a_filesystem_without_locks_runs_unlocked_with_one_note(tmp_path, monkeypatch, code):
    """NFS without lockd (ENOLCK), a flock emulated on a read-only fd (EBADF), Lustre without -o flock (ENOSYS),
    FUSE (EINVAL, EOPNOTSUPP): the run goes on; the note says so once; another run's temp files are left alone."""
    def no_locks(fd, operation):
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    log = tmp_path / "log"
    log.mkdir()
    (log / ".model_00002.pt.tmp77").write_bytes(b"another run may be writing this")
    lock = LogDirLock(log, master=True)
    note = lock.claim(create=False)
    assert note == (f"--log_dir {log} is not locked: its filesystem has no file locks (flock: "
                    f"{errno.errorcode[getattr(errno, code)]}, "
                    f"{os.strerror(getattr(errno, code))}); make sure no other run uses this directory")
    assert lock.claim(create=True) == ""  # said once; the run keeps its fd until release
    assert (log / ".model_00002.pt.tmp77").exists()
    lock.release()
    assert lock.fd is None


def test_other_flock_errors_still_stop_the_run(tmp_path, monkeypatch):
    def busy(fd, operation):
        raise BlockingIOError(errno.EWOULDBLOCK, "Resource temporarily unavailable")

    monkeypatch.setattr(fcntl, "flock", busy)
    lock = LogDirLock(tmp_path, master=True)
    with pytest.raises(ValueError, match="is in use by another run"):
        lock.claim(create=False)
    assert lock.fd is None

    def broken(fd, operation):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", broken)
    with pytest.raises(OSError, match="Input/output error"):
        lock.claim(create=False)
    assert lock.fd is None


def test_a_locked_run_removes_stale_temp_files(tmp_path):
    (tmp_path / ".model_00002.pt.tmp77").write_bytes(b"left by a run killed while saving")
    lock = LogDirLock(tmp_path, master=True)
    assert lock.claim(create=False) == "" and not (tmp_path / ".model_00002.pt.tmp77").exists()
    lock.release()


def test_a_lock_file_that_cannot_be_opened_for_writing_is_one_line(tmp_path):
    (tmp_path / LOCK_FILE).mkdir()
    lock = LogDirLock(tmp_path, master=True)
    with pytest.raises(ValueError) as e:
        lock.claim(create=False)
    assert str(e.value) == (f"--log_dir {tmp_path}: cannot open {tmp_path / LOCK_FILE} for writing (Is a directory); "
                            "a run must be able to write in its --log_dir")
    assert lock.fd is None
    if os.geteuid() != 0:  # root opens any file for writing
        (tmp_path / LOCK_FILE).rmdir()
        (tmp_path / LOCK_FILE).touch(mode=0o444)
        with pytest.raises(ValueError, match=r"for writing \(Permission denied\)"):
            lock.claim(create=False)


# ----------------------------------------------------------------------------------------------------------
# Peak FLOP/s by exact GPU model


# The names torch.cuda.get_device_name() reports (nvidia-smi's product names), each with its dense bf16 peak.
NAMES = [("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA A100-SXM4-40GB", 312e12), ("NVIDIA A100-PCIE-40GB", 312e12),
         ("NVIDIA A100 80GB PCIe", 312e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
         ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12),
         ("NVIDIA GH200 480GB", 989e12), ("NVIDIA H800", 989e12), ("NVIDIA A10G", 125e12), ("NVIDIA A10", 125e12),
         ("NVIDIA L4", 121e12), ("NVIDIA L40", 181e12), ("NVIDIA L40S", 362e12), ("NVIDIA GeForce RTX 4090", 165e12),
         ("NVIDIA GeForce RTX 3090", 71e12), ("NVIDIA B200", 2250e12),
         # not in the table: MFU is off rather than wrong
         ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", None), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None),
         ("NVIDIA GeForce RTX 4090 D", None), ("NVIDIA GeForce RTX 3090 Ti", None), ("NVIDIA H20", None),
         ("NVIDIA RTX A1000", None), ("Tesla V100-SXM2-16GB", None), ("NVIDIA GB200", None), ("Some Unknown GPU", None)]


@pytest.mark.parametrize("name, expected", NAMES)
def test_peak_flops_of_each_gpu_name(monkeypatch, name, expected):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    assert peak_flops("cuda") == expected
    assert (gpu_model(name) is None) == (expected is None)
    note = mfu_note("cuda", peak_flops("cuda"))
    assert (note == "") == (expected is not None)
    if expected is None:
        assert note.startswith(f"no MFU on {name!r}: ") and note.endswith("pass --peak_flops (FLOP/s of one GPU or "
                                                                          "slice) to see it")
        assert ("MIG slice" in note) == ("MIG" in name)


def test_peak_flops_override_and_devices_without_a_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Unknown GPU")
    assert peak_flops("cpu") is None and peak_flops("mps") is None  # no MFU on a CPU
    assert mfu_note("cpu", None) == "" and mfu_note("mps", None) == ""  # nothing to say there
    assert peak_flops("cpu", 1e12) == 1e12  # an explicit peak always wins
    assert peak_flops("cuda", 123e12) == 123e12 and mfu_note("cuda", 123e12) == ""
    assert set(model for _, model in run_files.GPU_MODELS) == set(PEAK_BF16_FLOPS)  # no model without a peak


# ----------------------------------------------------------------------------------------------------------
# torchrun's variables and which GPU a process takes

TORCHRUN = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_torchrun_env_of_one_process_of_torchrun_and_of_a_scheduler():
    assert torchrun_env({}) is None and torchrun_env({"MASTER_ADDR": "x", "LOCAL_WORLD_SIZE": "8"}) is None
    assert torchrun_env(TORCHRUN) == (3, 1, 4, 0)  # set by a script: nothing says who shares this node's GPUs
    assert torchrun_env({**TORCHRUN, "LOCAL_WORLD_SIZE": "2"}) == (3, 1, 4, 0)
    assert torchrun_env({**TORCHRUN, "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "gpt2"}) == (3, 1, 4, 2)


@pytest.mark.parametrize("change, message", [
    ({"LOCAL_RANK": None}, "RANK is set but LOCAL_RANK is not: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, "
                           "MASTER_ADDR and MASTER_PORT together: launch with torchrun, or unset them all for one process"),
    ({"WORLD_SIZE": None}, "RANK is set but WORLD_SIZE is not: "),
    ({"RANK": None}, "LOCAL_RANK is set but RANK is not: "),
    ({"RANK": None, "LOCAL_RANK": None}, "WORLD_SIZE is set but RANK is not: "),
    ({"MASTER_ADDR": None}, "RANK is set but MASTER_ADDR is not: "),
    ({"MASTER_ADDR": ""}, "RANK is set but MASTER_ADDR is not: "),
    ({"MASTER_PORT": None}, "RANK is set but MASTER_PORT is not: "),
    ({"RANK": "abc"}, "RANK='abc' is not a whole number >= 0: torchrun sets"),
    ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a whole number >= 0: "),
    ({"WORLD_SIZE": "4.0"}, "WORLD_SIZE='4.0' is not a whole number >= 0: "),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a whole number >= 0: "),
    ({"RANK": "4"}, "RANK=4 with WORLD_SIZE=4: a rank is 0 to WORLD_SIZE - 1; torchrun sets"),
    ({"WORLD_SIZE": "0"}, "RANK=3 with WORLD_SIZE=0: "),
    ({"RANK": "0", "LOCAL_RANK": "9"}, "LOCAL_RANK=9 with WORLD_SIZE=4: "),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port (1 to 65535); torchrun sets"),
])
def test_a_partial_or_malformed_torchrun_env_is_refused_naming_the_variable(change, message):
    env = {k: v for k, v in {**TORCHRUN, **change}.items() if v is not None}
    with pytest.raises(ValueError) as e:
        torchrun_env(env)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_cuda_device_of_one_process():
    assert cuda_device("cuda", None, 2, None) == "cuda:0"  # plain cuda is GPU 0, named
    assert cuda_device("cuda:1", None, 2, None) == "cuda:1"
    with pytest.raises(ValueError, match=r"^--device cuda:2: this process sees 2 GPUs: cuda:0 to cuda:1$"):
        cuda_device("cuda:2", None, 2, None)
    with pytest.raises(ValueError, match=r"^--device cuda:1: this process sees 1 GPU \(CUDA_VISIBLE_DEVICES=5\): cuda:0$"):
        cuda_device("cuda:1", None, 1, "5")


@pytest.mark.parametrize("local_rank, count, local_world, expected", [
    (3, 8, 8, "cuda:3"),  # torchrun --nproc_per_node=8 on an 8-GPU node
    (3, 8, 0, "cuda:3"),  # a scheduler's task that sees the whole node
    (5, 1, 0, "cuda:0"),  # SLURM --gpus-per-task=1: each task sees its own GPU as cuda:0
    (0, 1, 1, "cuda:0"),  # one torchrun per task (--nproc_per_node=1), each with its own GPU
    (1, 1, 2, "torchrun started 2 processes on this node (--nproc_per_node) but they see 1 GPU "
              "(CUDA_VISIBLE_DEVICES=0): start at most 1, one per GPU"),
    (0, 4, 8, "torchrun started 8 processes on this node"),  # every rank says so, rank 0 too
    (5, 4, 0, "LOCAL_RANK=5 but this process sees 4 GPUs (CUDA_VISIBLE_DEVICES=0): give each process all of its "
              "node's GPUs or exactly one (SLURM: --gpus-per-task=1), or start fewer processes per node"),
])
def test_cuda_device_of_a_rank(local_rank, count, local_world, expected):
    env = (local_rank, local_rank, 16, local_world)
    if expected.startswith("cuda:"):
        assert cuda_device("cuda", env, count, "0") == expected
    else:
        with pytest.raises(ValueError) as e:
            cuda_device("cuda", env, count, "0")
        assert str(e.value).startswith(expected)


def test_cuda_n_under_torchrun_is_refused():
    with pytest.raises(ValueError, match=r"^--device cuda:1 under torchrun: each rank takes its GPU from LOCAL_RANK"):
        cuda_device("cuda:1", (0, 0, 2, 2), 2, None)


# ----------------------------------------------------------------------------------------------------------
# train_gpt2.setup_distributed on simulated GPUs and a simulated process group


@pytest.fixture
def gpus(monkeypatch):
    """A machine with n GPUs as torch.cuda shows them (n set by the test), set_device and init_process_group
    recorded instead of done."""
    calls = {"set_device": [], "init": [], "n": 4}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: calls["n"] > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: calls["n"])
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls["set_device"].append(str(d)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(run_files, "init_process_group", lambda *args: calls["init"].append(args))
    for key in (*TORCHRUN, "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    return calls


def test_one_process_sets_the_gpu_it_was_given(gpus):
    assert train_gpt2.setup_distributed("cuda:2") == (False, 0, 0, 1, "cuda:2")
    assert train_gpt2.setup_distributed("cuda") == (False, 0, 0, 1, "cuda:0")
    assert train_gpt2.setup_distributed("auto") == (False, 0, 0, 1, "cuda:0")
    assert gpus["set_device"] == ["cuda:2", "cuda:0", "cuda:0"] and gpus["init"] == []
    assert train_gpt2.setup_distributed("cpu") == (False, 0, 0, 1, "cpu") and len(gpus["set_device"]) == 3
    with pytest.raises(ValueError, match="--device cuda:4: this process sees 4 GPUs"):
        train_gpt2.setup_distributed("cuda:4")
    gpus["n"] = 0
    with pytest.raises(ValueError, match="CUDA is not available"):
        train_gpt2.setup_distributed("cuda")


def test_ranks_of_torchrun_and_of_a_one_gpu_per_task_scheduler(gpus, monkeypatch):
    for key, value in {**TORCHRUN, "LOCAL_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "gpt2"}.items():
        monkeypatch.setenv(key, value)
    assert train_gpt2.setup_distributed("cuda") == (True, 3, 1, 4, "cuda:1")
    assert gpus["set_device"] == ["cuda:1"] and gpus["init"] == [("nccl", 3, 4)]
    assert train_gpt2.setup_distributed("cpu") == (True, 3, 1, 4, "cpu") and gpus["init"][-1] == ("gloo", 3, 4)

    gpus["n"] = 1  # SLURM --gpus-per-task=1: RANK etc. set from SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert train_gpt2.setup_distributed("auto") == (True, 3, 1, 4, "cuda:0")
    assert gpus["set_device"][-1] == "cuda:0"

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "gpt2")  # torchrun with 4 processes on that one GPU
    joined = len(gpus["init"])
    with pytest.raises(ValueError, match=r"torchrun started 4 processes on this node .* but they see 1 GPU "
                                         r"\(CUDA_VISIBLE_DEVICES=1\)"):
        train_gpt2.setup_distributed("cuda")
    assert len(gpus["init"]) == joined  # refused before joining the group


def test_a_malformed_torchrun_env_stops_setup_before_the_process_group(gpus, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="^RANK is set but LOCAL_RANK is not"):
        train_gpt2.setup_distributed("cpu")
    assert gpus["init"] == [] and gpus["set_device"] == []


# ----------------------------------------------------------------------------------------------------------
# Stop signals


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"])
def test_stop_signal_records_each_stop_request_and_restores_the_handler(name):
    """A scheduler's SIGTERM, Ctrl-C, a closed terminal, SLURM's `--signal=USR1@120` warning: each only asks. (The
    signals start at their default action, as at a terminal: a suite run under nohup or `&` inherits some ignored.)"""
    sig = getattr(signal, name)
    with stop_signals_at_default():
        with run_files.StopSignal() as stop:
            os.kill(os.getpid(), sig)
            assert stop.requested == name
        assert signal.getsignal(sig) == signal.SIG_DFL


def test_stop_signal_records_a_signal_and_leaves_one_started_ignored_alone():
    """A handled signal only sets `requested`; one the process was started ignoring (nohup's SIGHUP) stays ignored
    and is not recorded; every previous handler is back afterwards."""
    with stop_signals_at_default():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts a program
        with run_files.StopSignal() as stop:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.requested is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested == "SIGTERM"
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_trainer_and_the_tokeniser_stop_on_the_same_signals():
    """run_files.StopSignal (torch) and fineweb.py (no torch, so its own copy) agree on what a stop request is."""
    assert set(run_files.StopSignal.SIGNALS) == fineweb.STOP_SIGNALS
