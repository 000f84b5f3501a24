"""pytest set-up: no Hub access, a fixed seed per test."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
