"""Test set-up: offline hubs, caches in a temp dir, the project root importable."""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Before anything imports transformers/datasets: never wait on the network, never write to ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="gpt2-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)  # this test process's; nothing is left in /tmp
os.makedirs(os.path.join(_CACHE, "tmp"))
for key, value in {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "HF_HOME": os.path.join(_CACHE, "hf"),
    "XDG_CACHE_HOME": _CACHE,
    "MPLCONFIGDIR": os.path.join(_CACHE, "mpl"),
    "TORCHINDUCTOR_CACHE_DIR": os.path.join(_CACHE, "inductor"),
    "TOKENIZERS_PARALLELISM": "false",
    "TMPDIR": os.path.join(_CACHE, "tmp"),  # what the programs the tests start leave there (torchrun's logs) goes too
}.items():
    os.environ[key] = value
# pytest -n 2 runs two test processes on a 2-core machine: one thread each, or torch's threads fight over the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a whole module (`pytestmark = pytest.mark.usefixtures("one_thread")`), its module-scoped
    fixtures included: bit-level comparisons across runs in one process assume the same kernels and thread count (a
    reference run made with two threads differs from a resumed run with one in the last bits), and tiny models only
    lose to a second thread's synchronisation. Under `-n 2` OMP_NUM_THREADS=1 hides a missed case; `-n 0` does not."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
