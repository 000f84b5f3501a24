"""transformers' compiled decoding on a CPU: `generate(..., cache_implementation="static", compile_config=...)`.

transformers compiles `generate()`'s decoding step on accelerators only, unless the `CompileConfig` allows every
device (`_compile_all_devices`, a switch it keeps private). On a CPU that is where our models decode fastest: traced,
a one-row product is a row dot (`linear_kernels.row_dot`) that inductor turns into one loop reading the weight at
nearly the memory's rate, where the BLAS reads a row slowly: 1.6-1.9x as fast as eager decoding once compiled (AVX2
and AVX-512 AMD EPYC); elsewhere the products stay the BLAS's (an AVX-512 Intel Xeon: 1.4-1.7x the native model's
eager decoding; docs/serving.md, "Faster decoding on a CPU").
Also, for runs that emulate another instruction set, an inductor cache of their own
(`inductor_cache_of_its_own_when_emulating`).
"""

import os
import re
import tempfile
import warnings

import torch
from packaging.version import Version
from transformers import CompileConfig

# The inductor of PyTorch 2.11 and 2.12 writes a CPU decoding step that does not compile (its bounds check on the
# positions, for a static cache of a second length with absolute positions; with either wrapper), and 2.11's
# `torch.compiler.is_exporting()` is true under torch.compile, so one-row products keep the BLAS: compiled CPU decoding
# is tested from 2.13 (docs/testing.md, "Which versions").
FIRST_SOUND_CPU_INDUCTOR = Version("2.13")


def cpu_inductor_is_sound() -> bool:
    """Whether this PyTorch compiles our CPU decoding steps as tested (`FIRST_SOUND_CPU_INDUCTOR`)."""
    return Version(torch.__version__).release >= FIRST_SOUND_CPU_INDUCTOR.release


def cpu_compile_config() -> CompileConfig:
    """A `CompileConfig` under which `generate()` with a static cache compiles its decoding step on a CPU too, in
    inductor's default mode (transformers' default, "reduce-overhead", means CUDA graphs) with its C++ wrapper: the
    code that calls the step's kernels and products is C++ rather than Python, about 0.2 ms of a 2-3 ms token
    (1.08-1.10x the Python wrapper's rate, GPT-2 and Marian at 6 x 384 on an AVX-512 Intel Xeon; the same kernels,
    the same results). It costs compile time once per step shape: 10 s against 6 for a new maximum length (the
    first call about 19 s either way, 4.5 s against 4.1 from inductor's on-disk cache)."""
    if not cpu_inductor_is_sound():
        warnings.warn(f"PyTorch {torch.__version__}'s inductor fails to compile some CPU decoding steps (a static "
                      "cache of a second length, absolute positions): compiled "
                      f"decoding on a CPU is tested from PyTorch {FIRST_SOUND_CPU_INDUCTOR}.", stacklevel=2)
    config = CompileConfig(mode=None, options={"cpp_wrapper": True})  # torch.compile takes a mode or options
    config._compile_all_devices = True
    return config


# Set to emulate another instruction set (the docs' AVX2 runs on an AVX-512 host), inductor compiles for that set
# too, but its on-disk cache does not tell those kernels from the machine's own: a kernel compiled one way and reused
# the other gave nan or 1e12 losses in compiled training steps and corrupted the heap (docs/performance.md).
EMULATED_ISA_VARIABLE = "ATEN_CPU_CAPABILITY"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def inductor_cache_of_its_own_when_emulating() -> str | None:
    """Under ATEN_CPU_CAPABILITY, point inductor at a cache for that instruction set (`<temp>/torchinductor_avx2`),
    unless TORCHINDUCTOR_CACHE_DIR names a folder other than inductor's default (which inductor writes into the
    variable itself, at an import of ours); returns the folder set, else None. Inductor reads the variable at each
    compile, so this works any time before the first one; the benchmark and the test suite call it."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = os.environ.get(EMULATED_ISA_VARIABLE, "").strip().lower()
    if not capability or os.environ.get(INDUCTOR_CACHE_VARIABLE) not in (None, "", default_cache_dir()):
        return None
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{re.sub(r'[^a-z0-9]+', '_', capability)}")
    os.environ[INDUCTOR_CACHE_VARIABLE] = folder
    return folder
