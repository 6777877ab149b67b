"""run_files.py, the plumbing of a run, on its own: the GPU peak FLOP/s table behind MFU."""

import pytest
import torch

from run_files import PEAK_BF16_FLOPS, peak_flops


def test_peak_flops_table_and_override(monkeypatch):
    assert PEAK_BF16_FLOPS["A100"] == 312e12 and PEAK_BF16_FLOPS["H100"] == 989e12
    assert peak_flops("cpu") is None  # no MFU on a CPU
    assert peak_flops("mps") is None
    assert peak_flops("cpu", 1e12) == 1e12  # an explicit peak always wins
    assert peak_flops("cuda", 123e12) == 123e12
    for name, expected in [("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA H100 80GB HBM3", 989e12),
                           ("NVIDIA GeForce RTX 4090", 165e12), ("NVIDIA L40S", 362e12), ("Some Unknown GPU", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, _n=name: _n)
        assert peak_flops("cuda") == expected, name
