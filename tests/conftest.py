"""pytest set-up: no Hub access, a fixed seed per test, one fp32 CPU kernel and one bf16 training attention kernel;
`force_choice` for the tests of those choices."""

import atexit
import gc
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (`make test` runs two workers), the cores are shared out: a worker's torch and the runs it starts
# take their share of threads, rather than each spinning up as many threads as the machine has cores.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))
# Each test process its own cache of `trust_remote_code` modules, removed at its end: transformers copies a folder's
# code under the folder's name, and two test workers (pytest-xdist) loading folders of one name would write one file
# at once; nor is the user's cache touched.
if "HF_MODULES_CACHE" not in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hf-modules-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)
# One fp32 kernel for the whole suite: on "auto" each process times the kernels, and the two processes of one test (a
# run and its resumed half) could pick different ones and differ at fp32 rounding. tests/test_linear.py covers both.
os.environ.setdefault("HF_SCRATCH_CPU_KERNELS", "onednn")
# Likewise for bf16 training attention at short sequences (tests/test_attention_kernel.py covers both), and for bf16
# products of many rows: widened to fp32, ours on any CPU (tests/test_bf16_products.py covers both).
os.environ.setdefault("HF_SCRATCH_CPU_ATTENTION", "eager")
os.environ.setdefault("HF_SCRATCH_CPU_BF16_PRODUCTS", "fp32")

import pytest
import torch
from hypothesis import settings

from hf_scratch_transformer.compiled_decoding import inductor_cache_of_its_own_when_emulating

# Run with another instruction set emulated (README's AVX2 command), the compiled tests get inductor's cache for it.
inductor_cache_of_its_own_when_emulating()

# The property tests draw the same cases on every run (hypothesis's own "ci" profile: derandomized, no example
# database), so `make test` passes or fails the same way on a clean clone as here; a new case drawn by chance once
# failed a CI run. To explore beyond them: `pytest --hypothesis-profile default` (and `--hypothesis-seed N`).
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _unfreeze_what_a_command_froze():
    """A command run in the test's process (`cli.main`) freezes what the process holds out of the garbage collector's
    reach (`hf_scratch_command.import_without_collecting`), as it may in a process that ends with the command; here
    the garbage cycles of the tests before it would then stay for the whole session."""
    yield
    gc.unfreeze()


@pytest.fixture
def force_choice(monkeypatch):
    """`force_choice(variable, clear, choice)` sets a kernel-choice variable for this test and calls `clear`, which
    forgets the process's cached choices (`kernel_choice.clear_kernel_choices`, ...), so they are made afresh;
    cleared again after the test."""
    cleared = []

    def force(variable: str, clear, choice: str) -> None:
        monkeypatch.setenv(variable, choice)
        clear()
        cleared.append(clear)

    yield force
    for clear in cleared:
        clear()
