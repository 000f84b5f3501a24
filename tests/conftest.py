"""pytest set-up: no Hub access, a fixed seed per test, one fp32 CPU kernel."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One fp32 kernel for the whole suite: on "auto" each process times the kernels, and the two processes of one test (a
# run and its resumed half) could pick different ones and differ at fp32 rounding. tests/test_linear.py covers both.
os.environ.setdefault("HF_SCRATCH_CPU_KERNELS", "onednn")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
