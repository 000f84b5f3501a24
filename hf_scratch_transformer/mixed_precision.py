"""Whether bf16 mixed precision helps on this machine: the rates of bf16 and fp32 matrix products, measured, and the
refusal or warning that both training entry points give where bf16 would slow a CPU run down (docs/training.md,
"Precision"). No model file imports this module.
"""

import math
import time
import warnings
from collections.abc import Callable

import torch

from hf_scratch_transformer.kernel_choice import one_thread

# Below this fraction of fp32's rate, bf16 products are emulated (no bf16 instructions: AVX2 CPUs at 0.007-0.02, an
# AVX-512 Xeon without BF16 at 0.18) and autocast makes training several times slower: refused. At or above it, the
# CPU has bf16 instructions but may still run them slower than fp32 (AVX-512 BF16 without AMX: an Intel Xeon's
# one-core check read 0.38-0.64 from run to run, so a threshold of 0.5 refused or warned by the moment there): a
# warning. Our models' products of many rows run widened to fp32 there (`kernel_choice.bf16_kernel`).
BF16_MIN_SPEED = 0.25


def matmul_gflops(dtype: torch.dtype, size: int = 256, product: Callable = torch.mm, runs: int = 3,
                  device: torch.device | str = "cpu") -> float:
    """GFLOP/s of `product` on two square `size` matrices of `dtype` on `device`: the best of `runs` after a
    warm-up. Raises what the kernel raises where it does not exist for `dtype`."""
    # Random, not constant, matrices: a GPU multiplies constant ones faster. A generator of its own leaves the
    # caller's random stream (a training run's) as it was.
    generator = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator, device=device).to(dtype) for _ in range(2))
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    product(a, b)
    seconds = math.inf
    for _ in range(runs):
        synchronize()
        start = time.perf_counter()
        product(a, b)
        synchronize()
        seconds = min(seconds, time.perf_counter() - start)
    return 2 * size**3 / seconds / 1e9


def one_core_product_rates() -> tuple[float, float]:
    """GFLOP/s of bf16 and of fp32 products on one CPU core, what `--bf16` decides by (`slow_bf16_refusal`, and the
    benchmark's bf16 rows): the kernels' speed, not the machine's load of the moment. With all threads, a parallel
    fp32 product on a busy machine ran 85x slower (2.1 against 181 GFLOP/s beside another process's products), where
    an emulated bf16 one, serial, did not, which made bf16 look native on an AVX2 CPU."""
    with one_thread():
        return matmul_gflops(torch.bfloat16), matmul_gflops(torch.float32)


def bf16_is_native(bf16: float, fp32: float) -> bool:
    """Whether the CPU has bf16 instructions, from `one_core_product_rates`: emulated products run far below
    BF16_MIN_SPEED of fp32's rate."""
    return bf16 >= BF16_MIN_SPEED * fp32


def slow_bf16_refusal(mixed_precision: str, device: torch.device | str, force: bool, option: str) -> str | None:
    """The error to stop a run with that asks for bf16 mixed precision (by `option`) on a CPU whose bf16 products
    are slow: without AVX-512 BF16 or AMX, PyTorch computes them about 100x slower than fp32 on an AVX2 CPU and about
    5x slower on an older AVX-512 one, so autocast would slow training down. Times both on one core (0.1 s) and
    names the rates; None where bf16 is fast, not asked for, or not on CPU. With `force` it warns instead and
    returns None. Where bf16 products run at BF16_MIN_SPEED of fp32's rate or more but still slower (AVX-512 BF16
    without AMX: an Intel Xeon at 0.55-0.59x, where our models trained 0.85-0.96x as fast in bf16 as in fp32, their
    products widened to fp32: `kernel_choice.bf16_kernel`), the run goes on with a warning that names the rates:
    bf16 still takes less memory (0.78-0.80 of fp32's peak in training there)."""
    if mixed_precision != "bf16" or torch.device(device).type != "cpu":
        return None
    distributed = torch.distributed.is_initialized()
    main = not distributed or torch.distributed.get_rank() == 0
    measured = list(one_core_product_rates()) if main else [None, None]
    if distributed:
        # The main process's timing decides for every process of a launched run (and warns once): each timing its
        # own, they could decide apart near a threshold, and another process refusing alone stopped the run without
        # a word, since only the main process prints errors.
        torch.distributed.broadcast_object_list(measured, src=0)
    bf16, fp32 = measured
    if bf16 >= fp32:
        return None
    rates = (f"bf16 matrix products run at {bf16:.1f} GFLOP/s here, fp32 at {fp32:.1f} ({fp32 / bf16:.1f}x "
             f"faster)")
    if bf16_is_native(bf16, fp32):
        if main:
            warnings.warn(f"bf16 mixed precision will likely train slower than fp32 on this CPU "
                          f"({torch.backends.cpu.get_cpu_capability()}; bf16 products not faster than fp32 ones): "
                          f"{rates}. It still takes less memory; for speed, train in fp32 (without {option}).",
                          stacklevel=2)
        return None
    reason = (f"bf16 mixed precision would slow training down on this CPU ({torch.backends.cpu.get_cpu_capability()}"
              f"; bf16 products not native, or slow): {rates}. Train in fp32 (without {option})")
    if force:
        if main:
            warnings.warn(f"{reason}; training in bf16 anyway, as --force-bf16 asks.", stacklevel=2)
        return None
    return f"{reason}, or add --force-bf16 to train in bf16 anyway."
