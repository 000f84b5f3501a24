"""transformers' compiled decoding on a CPU: `generate(..., cache_implementation="static", compile_config=...)`.

transformers compiles `generate()`'s decoding step on accelerators only, unless the `CompileConfig` allows every
device (`_compile_all_devices`, a switch it keeps private). On a CPU that is where our models decode fastest: traced,
a one-row product is a row dot (`scratch_linear.row_dot`) that inductor turns into one loop reading the weight at
nearly the memory's rate, where the BLAS reads a row slowly: 1.6-1.9x as fast as eager decoding once compiled (AVX2
and AVX-512 AMD EPYC); elsewhere the products stay the BLAS's (an AVX-512 Intel Xeon: 1.4-1.7x the native model's
eager decoding; docs/serving.md, "Faster decoding on a CPU").
"""

from transformers import CompileConfig


def cpu_compile_config() -> CompileConfig:
    """A `CompileConfig` under which `generate()` with a static cache compiles its decoding step on a CPU too, in
    inductor's default mode (transformers' default, "reduce-overhead", means CUDA graphs) with its C++ wrapper: the
    code that calls the step's kernels and products is C++ rather than Python, about 0.2 ms of a 2-3 ms token
    (1.08-1.10x the Python wrapper's rate, GPT-2 and Marian at 6 x 384 on an AVX-512 Intel Xeon; the same kernels,
    the same results). It costs compile time once per step shape: 10 s against 6 for a new maximum length (the
    first call about 19 s either way, 4.5 s against 4.1 from inductor's on-disk cache)."""
    config = CompileConfig(mode=None, options={"cpp_wrapper": True})  # torch.compile takes a mode or options
    config._compile_all_devices = True
    return config
