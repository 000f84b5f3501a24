"""Which kernel a linear layer's products take on this machine (`linear_kernels` has the kernels), chosen from what
the machine is, timed once per process: results of one machine are not claims about another (docs/performance.md).

On CPU, PyTorch computes fp32 `F.linear` with its default BLAS (MKL in the x86 wheels); oneDNN computes the same
products. Which is faster depends on the machine: on an AVX-512 AMD EPYC oneDNN ran at twice MKL's rate, on an AVX2
AMD EPYC and on an AVX-512 Intel Xeon it is slower, and on another AVX-512 AMD EPYC MKL computed one-row products on
one thread where oneDNN used both. A product of a few rows (2 to FEW_ROWS: a decoding step of several sequences)
has a third kernel, the BLAS on the transposed product, which MKL ran in 0.33-0.58 of `F.linear`'s time over 4 rows
on an AVX2 AMD EPYC. So `fp32_kernel` times the kernels at the first fp32 product of each regime: decoding steps of
one row and of a few rows, each of a model whose weights fit in the CPU's largest cache and of a larger one (its
weights timed as a step reads them: from memory), once per weight shape (a few-row product's kernels rank by the
weight's shape as much as by the machine), prefill (more rows, no gradients: also evaluation and pipelines; these
five once per thread count) and training (more rows, gradients), on a small layer for the last two, and keeps the
answers for the process; HF_SCRATCH_CPU_KERNELS=native|onednn|transposed forces one (default: auto), for every regime
or per regime ("prefill=onednn,training=native"; a regime not named: auto).
bf16 products of many rows (under CPU autocast, or of a bf16 model) have a choice of their own (`bf16_kernel`):
PyTorch's, or the same sums of the operands widened to fp32 through the BLAS, the faster where bf16 products are
slower than fp32 ones; CUDA's products and other bf16 ones are PyTorch's own.
Traced by `torch.compile`, a product is plain `F.linear` (inductor picks its own kernels), except an fp32 CPU product
of one row (batch-1 decoding, as transformers' compiled `generate()` runs it) where the BLAS reads a weight one row
at a time slowly (`blas_reads_rows_slowly`): there it is a row dot (`compiled_as_row_dot`), which inductor turns
into a loop that reads the weight once at nearly the memory's rate, where the BLAS's matrix-vector product read it
at a third of that on an AVX-512 AMD EPYC.
"""

import contextlib
import functools
import math
import os
import pathlib
import re
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils._python_dispatch import _disable_current_modes

from .linear_kernels import (
    ONEDNN_AVAILABLE,
    PLAIN_TYPES,
    inside_torch_func,
    onednn_enabled,
    onednn_product,
    transposed_linear,
    widened_bf16_linear,
)

KERNELS_VARIABLE = "HF_SCRATCH_CPU_KERNELS"
KERNELS = ("auto", "native", "onednn", "transposed")
FEW_ROWS = 64  # up to this many rows: a decoding step, whose time goes into reading the weight
# The ways a process runs products, each with its own kernel choice: the kernels rank differently in each
# (AVX-512 AMD EPYC: oneDNN at about half the BLAS's time one row at a time, 0.78-0.93 of it over 512 rows without
# gradients, by host and hour, within noise of it with the gradient products of training; docs/performance.md).
DECODING = "decoding"  # one row (batch-1 decoding), of a model whose weights fit in the CPU's largest cache
DECODING_FROM_MEMORY = "decoding_from_memory"  # one row, of a model too large for it (below)
BATCH_DECODING = "batch_decoding"  # 2 to FEW_ROWS rows (several sequences, beams), weights in the cache
BATCH_DECODING_FROM_MEMORY = "batch_decoding_from_memory"  # 2 to FEW_ROWS rows, weights read from memory
PREFILL = "prefill"  # more rows, no gradients recorded (prefill, evaluation, pipelines)
TRAINING = "training"  # more rows, gradients recorded
REGIMES = (DECODING, DECODING_FROM_MEMORY, BATCH_DECODING, BATCH_DECODING_FROM_MEMORY, PREFILL, TRAINING)
FROM_MEMORY = (DECODING_FROM_MEMORY, BATCH_DECODING_FROM_MEMORY)
FEW_ROW_REGIMES = (DECODING, DECODING_FROM_MEMORY, BATCH_DECODING, BATCH_DECODING_FROM_MEMORY)
# A few-row product reads its weight once, at a rate that depends on the weight's shape as much as on the machine:
# on an Intel Xeon (AVX-512, 260 MiB L3), over 4 rows and GPT-2 small's weights streamed, oneDNN took 0.76-0.86 of
# F.linear's time for the 768-wide ones and 1.18 for 768 x 768, and 1.36 for the 1536 x 384 on which the regimes had
# been timed: GPT-2 small decoded at batch 8 at 0.90x the native model on F.linear, 1.17-1.26x on oneDNN. So the
# few-row regimes choose per weight shape; a weight over MAX_TIMED_WEIGHT_BYTES is timed on its first rows.
# Prefill and training (many rows: compute, not reading) are timed on one layer of TIMED_SHAPE.
TIMED_SHAPE = (1536, 384)
MAX_TIMED_WEIGHT_BYTES = 16 << 20
# A few-row product of a weight up to this many elements takes the BLAS untimed: oneDNN spends about 15 us a call
# before it reads a weight, several times the BLAS's whole product there (AMD EPYC, AVX-512: a 64 x 192 one-row
# product 17 us against 4; every timed weight of a 64- and 128-wide GPT-2 up to 512 x 128 went to the BLAS), and the
# timing of such shapes cost a tiny model's first generate() 0.5 s on a quiet machine, 3.7 s on a busy one (Intel
# Xeon, AVX-512).
UNTIMED_WEIGHT_ELEMENTS = 1 << 14
# (regime, weight shape, threads) -> the kernel `fp32_kernel` answered: a memo of the timed choices (`_timed_kernel`)
KERNEL_CHOICES: dict[tuple[str, tuple[int, int], int], str] = {}
# The kernels timed in each regime. The transposed product only over a few rows: over one row it is the same
# matrix-vector product as F.linear's, and its lead narrows with the rows (AVX2 AMD EPYC, 55 MB of weights: 0.81-0.97
# of F.linear's time over 96-512 rows, in passes that favoured it; docs/performance.md).
TIMED_KERNELS = dict.fromkeys(REGIMES, ("native", "onednn")) | dict.fromkeys(
    (BATCH_DECODING, BATCH_DECODING_FROM_MEMORY), ("native", "onednn", "transposed"))
# oneDNN is taken where its time is under this fraction of the BLAS's: on a tie, or within the timing's noise, the
# native path. Prefill's timing (one forward over 512 rows, best of 5 rounds) is the steadiest, and what it measures
# is what a model gets: on an AVX-512 AMD EPYC it read 0.89-0.93 in fresh processes while whole models prefilled
# 5-14% faster with oneDNN, so at 0.9 the choice flipped from one process to the next (docs/performance.md); with
# the instruction set limited to AVX2 it read 0.97-1.07 (models tie), on an Intel Xeon oneDNN is 1.3-1.6x slower.
# Training's timing (one core, 64 rows) is the noisiest and leans towards oneDNN: on that EPYC it read 0.83-1.11
# over 3 rounds (oneDNN taken in 5 of 20 processes) and 0.89-1.36 over 8 (1 of 18), while whole models tie or lose
# with oneDNN (GPT-2 0.98 and BERT 1.06 of the BLAS's speed at the benchmark's size, nanoGPT's size 0.91 on two
# threads and 1.0 on one): oneDNN must be 20% faster there. Where its products ran at twice the BLAS's rate (the
# EPYC of 2026-11-21), it trained 1.6-2.1x faster.
ONEDNN_MARGINS = {DECODING: 0.9, DECODING_FROM_MEMORY: 0.9, BATCH_DECODING: 0.9, BATCH_DECODING_FROM_MEMORY: 0.9,
                  PREFILL: 0.95, TRAINING: 0.8}
# Where ATen's capability is AVX2 (no AVX-512), prefill needs 15%: on an AVX2-only AMD EPYC (2026-11-25) prefill's
# timing read oneDNN at 0.94-1.16 of the BLAS's time in fresh processes (0.88-0.96 timed again in one process) while
# whole models prefilled 5% slower with oneDNN (GPT-2 and BERT, forced each way); an AVX-512 EPYC limited to AVX2
# read 0.94-1.07, models tied. The AVX-512 EPYC's 0.78-0.93, with models 5-14% faster, overlaps that range: the
# timing alone cannot tell the two apart, the capability can. Decoding needs 20% there: its timing read 1.00-1.37 in
# fresh processes timing it first, but 0.87 in one of six timing it after prefill (as the benchmark and batched
# `generate()` do), while whole-model decoding gained nothing sure with oneDNN (forced each way, interleaved: 0.91-1.03
# of the BLAS's time a token at 384 wide in three processes, 1.10 at 192); the AVX-512 EPYC's oneDNN ran one-row
# products at half the BLAS's time, and at 0.67-0.71 of it limited to AVX2 (`TIMED_ROUNDS`), clearing either margin.
# Training read 1.05-1.29 there (the BLAS).
AVX2_ONEDNN_MARGINS = ONEDNN_MARGINS | {PREFILL: 0.85, DECODING: 0.8}
# A decoding step reads each of the model's weights once. Where they fit in the CPU's largest cache they come from it,
# step after step; where they do not, every step reads them from memory, and the kernels rank differently: on the
# AVX2-only AMD EPYC (32 MiB L3) oneDNN took 1.15-1.45x the BLAS's time for one-row products with a weight in cache,
# and 0.72-0.96 of it over 55 MB of weights in turn (MKL keeps a one-row product on one thread, oneDNN uses both);
# whole models decoded with oneDNN forced at 1.14-1.20 of the BLAS's time a token with 7-17 MB of weights, 0.97 with
# 27 MB, 0.85-0.93 with 55 MB and 0.80 with 494 MB (GPT-2 124M; 0.60 at batch 8; docs/performance.md). So a model
# tells its layers how many bytes of weights a step reads (`mark_working_set`), and a model larger than the cache
# decodes in its own regime, timed over weights streamed from memory.
DEFAULT_CACHE_BYTES = 32 << 20  # where the cache's size cannot be read (no Linux sysfs): a server CPU's L3
CACHE_SIZES = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def last_level_cache_bytes() -> int:
    """The size in bytes of the largest cache of the CPU the process runs on (Linux sysfs), else DEFAULT_CACHE_BYTES."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for size_file in CACHE_SIZES.glob("index*/size"):
        try:
            match = re.fullmatch(r"(\d+)\s*([KMG]?)", size_file.read_text().strip().upper())
        except OSError:
            continue
        if match:
            sizes.append(int(match[1]) * units[match[2]])
    return max(sizes, default=DEFAULT_CACHE_BYTES)


def regime_of(inputs: torch.Tensor, working_set: int = 0) -> str:
    """The regime of a product of these inputs (..., in) under the current grad mode, in a model whose few-row
    forward reads `working_set` bytes of weights (0: not known, taken as fitting in the cache)."""
    elements, width = inputs.numel(), inputs.shape[-1]
    if elements > FEW_ROWS * width:
        return TRAINING if torch.is_grad_enabled() else PREFILL
    from_memory = working_set > last_level_cache_bytes()
    if elements <= width:  # one row (or none)
        return DECODING_FROM_MEMORY if from_memory else DECODING
    return BATCH_DECODING_FROM_MEMORY if from_memory else BATCH_DECODING


def fp32_kernel(regime: str, /, shape: tuple[int, int] = TIMED_SHAPE) -> str:
    """"native", "onednn" or "transposed": the kernel for fp32 CPU products of a regime (one of REGIMES), with a weight
    of this shape (out, in) in a few-row regime (FEW_ROW_REGIMES; prefill and training have one choice for every
    shape, timed on TIMED_SHAPE). HF_SCRATCH_CPU_KERNELS=native|onednn|transposed forces one (for every regime, or
    per regime: `kernel_setting`); auto (the default) times the regime's TIMED_KERNELS once per process, at the first
    product of each regime and shape, on one core for training and once per thread count (`torch.set_num_threads`)
    for the others, whose kernels compare differently on one thread and on several (see `time_kernels`), and takes
    the fastest of those that beat the BLAS's `F.linear` by their margin (`kernel_margin`), else `F.linear`. The
    answers are kept in KERNEL_CHOICES; `clear_kernel_choices()` makes them again."""
    key = (regime, shape, torch.get_num_threads())  # a torch.Size finds its tuple's entry
    kernel = KERNEL_CHOICES.get(key)
    if kernel is None:
        threads, shape = key[2], tuple(shape)
        if regime in FEW_ROW_REGIMES:  # a tall weight timed on its first rows: its product splits by rows
            out_features, in_features = shape
            timed_rows = max(1, min(out_features, MAX_TIMED_WEIGHT_BYTES // (4 * in_features)))
            kernel = _timed_kernel(regime, (timed_rows, in_features), threads)
        else:
            kernel = _timed_kernel(regime, TIMED_SHAPE, 1 if regime == TRAINING else threads)
        KERNEL_CHOICES[regime, shape, threads] = kernel
    return kernel


@functools.cache
def _timed_kernel(regime: str, shape: tuple[int, int], threads: int, /) -> str:  # positional: the cache's keys
    choice = kernel_setting(regime)
    if choice == "onednn" and not ONEDNN_AVAILABLE:
        return "native"
    if choice != "auto":
        return choice
    if regime in FEW_ROW_REGIMES and shape[0] * shape[1] <= UNTIMED_WEIGHT_ELEMENTS:
        return "native"
    candidates = timed_kernels(regime)
    if candidates == ["native"]:
        return "native"
    seconds = time_kernels(regime, shape=shape)
    faster = [kernel for kernel in candidates
              if kernel == "native" or seconds[kernel] < kernel_margin(regime, kernel) * seconds["native"]]
    return min(faster, key=seconds.__getitem__)


def timed_kernels(regime: str) -> list[str]:
    """The regime's TIMED_KERNELS this process may take (`onednn_enabled`): a choice made while oneDNN is turned off
    is made without it, and kept."""
    return [kernel for kernel in TIMED_KERNELS[regime] if kernel != "onednn" or onednn_enabled()]


# The transposed product is the BLAS too, so its timing is as steady as the BLAS's own: taken where 10% faster (a tie
# keeps F.linear, whose sums are the native models' to the bit).
TRANSPOSED_MARGIN = 0.9


def kernel_margin(regime: str, kernel: str) -> float:
    """The fraction of `F.linear`'s time a kernel must come under to be taken for a regime, on this CPU."""
    return onednn_margin(regime) if kernel == "onednn" else TRANSPOSED_MARGIN


def onednn_margin(regime: str) -> float:
    """The fraction of the BLAS's time oneDNN must come under to be taken for a regime, on this CPU."""
    avx2_only = torch.backends.cpu.get_cpu_capability() == "AVX2"
    return (AVX2_ONEDNN_MARGINS if avx2_only else ONEDNN_MARGINS)[regime]


def kernel_setting(regime: str, /) -> str:
    """HF_SCRATCH_CPU_KERNELS for a regime: "auto" (unset), or a kernel of KERNELS, given for every regime ("native")
    or per regime ("decoding=onednn,training=native"; a regime not named is "auto"); anything else is an error
    naming it."""
    setting = os.environ.get(KERNELS_VARIABLE, "").strip().lower()
    if "=" not in setting:
        choices = dict.fromkeys(REGIMES, setting or "auto")
    else:
        pairs = [part.partition("=") for part in setting.split(",") if part.strip()]
        choices = dict.fromkeys(REGIMES, "auto") | {name.strip(): kernel.strip() for name, _, kernel in pairs}
        if set(choices) != set(REGIMES):
            raise ValueError(f"{KERNELS_VARIABLE} can name the regimes {', '.join(REGIMES)}; got {setting!r}.")
    if not set(choices.values()) <= set(KERNELS):
        raise ValueError(f"{KERNELS_VARIABLE} must be one of {', '.join(KERNELS)} (for every regime, or per regime "
                         f"as decoding=onednn,training=native); got {setting!r}.")
    return choices[regime]


def clear_kernel_choices() -> None:
    """Forget the process's choices: the next products choose again (after HF_SCRATCH_CPU_KERNELS changed)."""
    KERNEL_CHOICES.clear()
    _timed_kernel.cache_clear()
    _row_read_seconds.cache_clear()
    bf16_kernel.cache_clear()


# Until a process's first parallel region the thread count is the process's (OpenMP's, after it each thread's own):
# timings of two Python threads that overlap restore the count from before the first
_one_thread = threading.Lock()
_one_thread_users = 0
_threads_before = 1


@contextlib.contextmanager
def one_thread():
    """Timings on one core. What differs between two kernels is their code for a core; and while the machine is
    busy, a parallel product whose threads wait for each other runs several times slower (about one scheduler
    time slice per product), which would decide by the load of the moment. A second thread's timing that began
    inside the first's took its 1 for the count to restore, and left the process on one thread for good."""
    global _one_thread_users, _threads_before
    with _one_thread:
        if _one_thread_users == 0:
            _threads_before = torch.get_num_threads()
        _one_thread_users += 1
        torch.set_num_threads(1)
    try:
        yield
    finally:
        with _one_thread:
            _one_thread_users -= 1
            torch.set_num_threads(_threads_before)  # each: where the count is each thread's, its own


@contextlib.contextmanager
def apart_from_the_caller():
    """A timing runs inside the forward whose product first needed it, apart from the caller's contexts:
    - its gradients keep their saved tensors as plain autograd does: under non-reentrant gradient checkpointing
      (transformers' and TRL's default) the checkpoint's saved-tensor hooks took the timing's tensors for the layer's,
      and its recomputation, which times nothing, failed with a CheckpointError. Only the innermost hooks apply:
      identity ones shadow the checkpoint's;
    - the caller's dispatch and torch-function modes do not see it: a `FlopCounterMode` around a first training step
      counted 2.05 GFLOP for a 15 MFLOP step, and under `FakeTensorMode` the kernels were timed on fake tensors, an
      answer the process kept."""
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor), \
            _disable_current_modes(), torch._C.DisableTorchFunction():
        yield


# Rows of the timed product per regime: a training step's 64 rows with both gradients, a prefill's 512 rows forward
# (AVX-512 AMD EPYC, two threads, fresh processes: oneDNN at 0.78-0.84 of the BLAS's time over 512 rows, a steadier
# answer than 0.86-0.93 over 256), a decoding step's one row, or 4 for several sequences (AVX2 AMD EPYC, weights
# streamed: the transposed product at 0.37-0.44 of F.linear's time over 4 rows, 0.45-0.55 over 2 and 0.65-0.82 over
# 8, by round and process, where whole models decoded 4-69% faster with it at batch 2 to 32).
TIMED_ROWS = {TRAINING: 64, PREFILL: 512, DECODING: 1, DECODING_FROM_MEMORY: 1, BATCH_DECODING: 4,
              BATCH_DECODING_FROM_MEMORY: 4}
# Timed rounds per regime, the best one counting. A decoding round takes about 1 ms, and on two threads one busy core
# stalls oneDNN's parallel product: with one core of the AMD EPYC kept busy, 3 rounds measured oneDNN at 0.52-1.59 of
# the BLAS's time (the BLAS taken in 4 of 9 processes, AVX-512 and limited to AVX2), 20 rounds at 0.67-0.71, as quiet.
# Prefill's 5 rounds (about 3 ms each) hold its narrower margin (ONEDNN_MARGINS), training's 8 (about 5 ms each)
# narrow its spread (above).
TIMED_ROUNDS = {TRAINING: 8, PREFILL: 5, DECODING: 20, DECODING_FROM_MEMORY: 5, BATCH_DECODING: 10,
                BATCH_DECODING_FROM_MEMORY: 5}
# Decoding from memory is timed over weights twice the size of the largest cache, each read once a round (about 10 ms
# a round for 64 MiB); at most MAX_STREAMED_BYTES, whatever cache a machine reports.
MAX_STREAMED_BYTES = 256 << 20
# Batch decoding of a model that fits the cache reads each weight once a step from it: timed over weights half the
# largest cache's size (at most MAX_CACHED_BYTES), each read once a round (about 2 ms for 16 MiB: 10 rounds). One
# weight read over and over, as the one-row timing reads it, stays in the core's own caches, where the kernels rank
# otherwise: on the AVX2 AMD EPYC the transposed product took 0.7-1.3x F.linear's time over 2-8 rows there, while
# whole models of 7-27 MB (in its 32 MiB L3) decoded at batch 2-32 as fast or up to 56% faster with it.
MAX_CACHED_BYTES = 32 << 20
# Small weights are timed over at most MAX_TIMED_WEIGHTS of them: 32 MiB of 32 x 32 weights are 8192 products a kernel
# a round, whose calls cost more than their reads, and a 16-wide model's fine-tuning spent 40 s timing them at its
# first step (Intel Xeon, AVX-512; a few rows: the last batch, or evaluation's). A model of such weights reads far
# less than that a step; 256 of 128 x 128 are still 16 MiB, past any core's own caches.
MAX_TIMED_WEIGHTS = 256
# A timing stops at the first round that ends past this many seconds (the warm-up and one timed round always run).
# On a busy machine a call to oneDNN waits for a core: a tiny masked LM's 32-wide products took 100-250 us a call
# instead of 40 (Intel Xeon, AVX-512, both cores busy), and its evaluation spent 80 s timing 1024 weights a round.
TIMING_DEADLINE_SECONDS = 1.0


def time_kernels(regime: str, repeats: int | None = None, shape: tuple[int, int] = TIMED_SHAPE) -> dict[str, float]:
    """Best seconds of each of the regime's `timed_kernels` (kernel -> seconds) for a layer with a weight of this shape
    (out, in), the kernels interleaved over `repeats` rounds (default TIMED_ROUNDS) after a warm-up round: forward and
    both gradients over TIMED_ROWS rows on one core (TRAINING), one forward (PREFILL), 5 one-row forwards (DECODING)
    or one forward of a decoding step with each of as many such weights as fill half the largest cache
    (BATCH_DECODING) or twice it (FROM_MEMORY), on the process's threads. 15-60 ms at the default 384 -> 1536, about
    150-250 ms from memory. A generator of its own leaves the global random state alone (seeded runs stay
    reproducible), whatever the caller's modes."""
    repeats = TIMED_ROUNDS[regime] if repeats is None else repeats
    generator = torch.Generator().manual_seed(0)
    training = regime == TRAINING
    # Both libraries split a training product of many rows over the threads, so their code for a core decides, timed
    # on one core (where the load of the moment matters less). Without gradients they rank differently on one
    # thread and on two (AVX-512 AMD EPYC: 512 rows, oneDNN at 0.78-0.84 of the BLAS's time on two threads, 0.92-0.95
    # on one), and a one-row product some BLAS builds leave on one thread (MKL there: 1.5x slower than oneDNN on two
    # threads, 1.08x on one): those are timed with the threads they run on; the best of the rounds, so that a busy
    # moment is not what decides.
    threads = one_thread() if training else contextlib.nullcontext()
    with threads, apart_from_the_caller(), torch.inference_mode(False), torch.set_grad_enabled(training), \
            torch.autocast("cpu", enabled=False):
        out_features, in_features = shape
        drawn = {"generator": generator, "dtype": torch.float32, "device": "cpu"}  # not the default dtype/device
        inputs = torch.randn(TIMED_ROWS[regime], in_features, **drawn, requires_grad=training)
        weight = torch.randn(out_features, in_features, **drawn, requires_grad=training)
        grad_output = torch.randn(TIMED_ROWS[regime], out_features, **drawn)
        products = {"native": F.linear, "onednn": onednn_product,  # recorded where training (grad enabled)
                    "transposed": transposed_linear}
        weights = [weight] * (5 if regime == DECODING else 1)
        if regime in (BATCH_DECODING, *FROM_MEMORY):
            weights = weights_read_once(shape, from_memory=regime in FROM_MEMORY)

        def run(kernel: str) -> None:
            if training:
                torch.autograd.grad(products[kernel](inputs, weight, None), (inputs, weight), grad_output)
            else:
                for each_weight in weights:
                    products[kernel](inputs, each_weight, None)

        return best_interleaved({kernel: functools.partial(run, kernel) for kernel in timed_kernels(regime)}, repeats)


def weights_read_once(shape: tuple[int, int], from_memory: bool) -> tuple[torch.Tensor, ...]:
    """Distinct (out, in) weights to read once a round, as a decoding step reads a model's: as many as fill half the
    largest cache (at most MAX_CACHED_BYTES), or twice it (`from_memory`, at most MAX_STREAMED_BYTES), and at most
    MAX_TIMED_WEIGHTS. Views of one filled block, not drawn: a product's speed does not depend on the values, and
    drawing 64 MiB takes longer than the timing."""
    out_features, in_features = shape
    cache = last_level_cache_bytes()
    read = min(2 * cache, MAX_STREAMED_BYTES) if from_memory else min(cache // 2, MAX_CACHED_BYTES)
    count = min(-(-read // (4 * out_features * in_features)), MAX_TIMED_WEIGHTS)
    block = torch.full((count * out_features, in_features), 0.5, dtype=torch.float32, device="cpu")
    return block.split(out_features)  # (count x out, in) -> (out, in)s


def best_interleaved(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best seconds of each of `runs` (a name -> a call), interleaved over `repeats` rounds, the order reversed every
    other round, after a warm-up round (oneDNN builds its primitives at the first call of a shape); fewer rounds where
    they pass TIMING_DEADLINE_SECONDS (at least one timed)."""
    best = dict.fromkeys(runs, math.inf)
    deadline = time.perf_counter() + TIMING_DEADLINE_SECONDS
    for repeat in range(repeats + 1):
        for name in sorted(runs, reverse=repeat % 2 == 1):
            start = time.perf_counter()
            runs[name]()
            if repeat:
                best[name] = min(best[name], time.perf_counter() - start)
        if repeat and time.perf_counter() > deadline:
            break
    return best


def eager_kernel(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, working_set: int) -> str:
    """The kernel of an eager product ("native": F.linear, "onednn" or "transposed"; never asked while compiling: these
    checks would put guards in a graph), in a model whose few-row forward reads `working_set` bytes of weights."""
    if type(inputs) not in PLAIN_TYPES or type(weight) not in PLAIN_TYPES:
        return "native"  # a subclass (int8, DTensor, fake) carries its own product
    if inputs.dtype != torch.float32 or not inputs.is_cpu or inside_torch_func():
        return "native"  # under torch.func, also: timing the kernels there would fail (vmap forbids random draws)
    # The process's choice for this regime and weight shape (timed once, at its first product; the memo looked up
    # here first, as a call costs). Where the BLAS wins, the usual case (docs/performance.md), every product ends
    # here: the checks below cost about 1.3 us a call, 0.1 ms a forward.
    regime, shape = regime_of(inputs, working_set), weight.shape
    kernel = KERNEL_CHOICES.get((regime, shape, torch.get_num_threads()))
    if kernel is None:  # the first product of this regime and shape: timed, but not inside a trace (its products fail)
        kernel = "native" if torch.jit.is_tracing() else fp32_kernel(regime, shape)
    if kernel == "native":
        return kernel
    if not (
        (bias is None or type(bias) in PLAIN_TYPES)
        and weight.is_cpu  # not on meta (an offloaded weight whose hook did not run) or another device
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and inputs.numel() > 0
        and (kernel != "onednn" or onednn_enabled())  # turned off since chosen, or forced
        and not torch.jit.is_tracing()  # a traced graph (TorchScript, its ONNX export) keeps `aten::linear`
    ):
        return "native"
    return kernel


# Where bf16 products are slower than fp32 ones (AVX-512 BF16 without AMX: an Intel Xeon at 0.55x; AVX2, which has no
# bf16 instructions: 0.007x), the widened product (`widened_bf16_linear`) took 0.65-0.73 of autocast's time for a
# layer's forward and backward over 2048 rows on that Xeon (docs/performance.md). Where bf16 products are native and
# fast (AMX, an AVX-512 AMD EPYC) PyTorch's own should be the faster. So, as for fp32, `bf16_kernel` times both at the
# first bf16 product of many rows (a few rows would spend their time widening the weight: those keep PyTorch's) and
# keeps the answer; HF_SCRATCH_CPU_BF16_PRODUCTS=native|fp32 forces one.
BF16_PRODUCTS_VARIABLE = "HF_SCRATCH_CPU_BF16_PRODUCTS"
BF16_PRODUCTS = ("auto", "native", "fp32")
# Widening costs in proportion to the operands and the result, the product to their product: a layer of a model at
# 2048 rows spends a smaller share of its time widening than this timed one, which favours autocast's own product.
BF16_TIMED_SHAPE = (384, 384)  # small: on AVX2 autocast's round takes about 0.2 s (1.3 GFLOP/s)
BF16_TIMED_ROWS = 256
BF16_TIMED_ROUNDS = 8  # 5 rounds read the widened product at 0.70-0.85 of autocast's time on an Intel Xeon
BF16_FP32_MARGIN = 0.85  # the widened product must be 15% faster: on a tie, or within noise, autocast's own
BF16_CLEAR_LEAD = 3.0  # autocast's this many times slower (no bf16 instructions): decided after two rounds


@functools.cache
def bf16_kernel() -> str:
    """"native" (PyTorch's bf16 product) or "fp32" (`widened_bf16_linear`): the kernel for bf16 CPU products of many
    rows, under autocast or of bf16 tensors (training, and prefill: the same two kernels, which rank alike).
    HF_SCRATCH_CPU_BF16_PRODUCTS=native|fp32 forces one; auto (the default) times both once per process
    (`time_bf16_kernels`) and takes the widened product where it beats autocast's by BF16_FP32_MARGIN.
    `clear_kernel_choices()` makes the choice again."""
    choice = os.environ.get(BF16_PRODUCTS_VARIABLE, "").strip().lower() or "auto"
    if choice not in BF16_PRODUCTS:
        raise ValueError(f"{BF16_PRODUCTS_VARIABLE} must be one of {', '.join(BF16_PRODUCTS)}; got {choice!r}.")
    if choice != "auto":
        return choice
    seconds = time_bf16_kernels()
    return "fp32" if seconds["fp32"] < BF16_FP32_MARGIN * seconds["native"] else "native"


def time_bf16_kernels(repeats: int = BF16_TIMED_ROUNDS) -> dict[str, float]:
    """Best seconds of autocast's bf16 product ("native") and the widened one ("fp32"), forward and both gradients of a
    BF16_TIMED_SHAPE layer over BF16_TIMED_ROWS rows on one core (as `time_kernels` times training), interleaved
    (`best_interleaved`). Where autocast's takes BF16_CLEAR_LEAD times the other's in the first two rounds (a CPU
    without bf16 instructions, where it is 100 times slower), those answer. A generator of its own leaves the global
    random state alone."""
    generator = torch.Generator().manual_seed(0)
    with one_thread(), apart_from_the_caller(), torch.inference_mode(False), torch.enable_grad(), \
            torch.autocast("cpu", torch.bfloat16):
        out_features, in_features = BF16_TIMED_SHAPE
        drawn = {"generator": generator, "dtype": torch.float32, "device": "cpu"}  # not the default dtype/device
        inputs = torch.randn(BF16_TIMED_ROWS, in_features, **drawn, requires_grad=True)
        weight = torch.randn(out_features, in_features, **drawn, requires_grad=True)
        grad_output = torch.randn(BF16_TIMED_ROWS, out_features, **drawn).bfloat16()
        products = {"native": F.linear, "fp32": widened_bf16_linear}
        runs = {kernel: functools.partial(
            lambda product: torch.autograd.grad(product(inputs, weight, None), (inputs, weight), grad_output), product)
            for kernel, product in products.items()}
        first = best_interleaved(runs, 2)
        if first["native"] > BF16_CLEAR_LEAD * first["fp32"]:
            return first
        return best_interleaved(runs, repeats)


FLOATS_AUTOCAST_NARROWS = (torch.float32, torch.bfloat16)  # autocast leaves float64 products in float64


def widens_bf16(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether an eager bf16 product is computed widened (`widened_bf16_linear`): under bf16 CPU autocast (fp32 or bf16
    operands), or of bf16 tensors without autocast (a model loaded or cast to bf16); plain CPU tensors of many rows,
    outside `torch.func` transforms, on a CPU whose choice is "fp32" (`bf16_kernel`)."""
    if torch.is_autocast_enabled("cpu"):
        bf16 = (torch.get_autocast_dtype("cpu") == torch.bfloat16 and inputs.dtype in FLOATS_AUTOCAST_NARROWS
                and weight.dtype in FLOATS_AUTOCAST_NARROWS)
    else:
        bf16 = inputs.dtype == weight.dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16)
    return (
        bf16
        and inputs.is_cpu
        and inputs.numel() > FEW_ROWS * inputs.shape[-1]
        and type(inputs) in PLAIN_TYPES
        and type(weight) in PLAIN_TYPES
        and (bias is None or type(bias) in PLAIN_TYPES)
        and weight.is_cpu
        and not inside_torch_func()
        and bf16_kernel() == "fp32"
    )


def compiled_as_row_dot(inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the product `torch.compile` is tracing is an fp32 CPU product of one row (see the module's
    docstring), on a CPU whose BLAS reads a weight one row at a time slowly (`blas_reads_rows_slowly`). Not
    `torch.export`: an exported graph keeps its linear layers for whatever runs it. One row known from the shapes
    alone: a dynamic size gets no guard (a `mark_dynamic` dimension must not be specialized)."""
    return (
        not torch.compiler.is_exporting()
        and statically_known_true(inputs.numel() == inputs.shape[-1])
        and inputs.dtype == weight.dtype == torch.float32
        and inputs.is_cpu
        and type(weight) in PLAIN_TYPES
        and not torch.is_autocast_enabled("cpu")
        and blas_reads_rows_slowly()
    )


# Inductor's row dot reads a weight at about a plain `sum`'s rate. The BLAS's one-row product read it at a third to
# half of that on the AMD EPYCs (AVX-512: 10.3 against 31-39 GB/s; AVX2: 6.7-8.3 against 16.6-22), where compiled
# decoding with the row dot ran 1.5-2.4x as fast as the native model compiled; on an Intel Xeon (AVX-512) it reads
# at the sum's rate (47-51 against 46-51 GB/s), and compiled GPT-2 with the row dot tied or trailed the same with the
# BLAS's product (0.87-1.10 against 1.01-1.18 of the native model compiled, 2026-11-28). So the row dot is written
# only where F.linear takes ROW_DOT_MARGIN times a sum's time over the same weights.
ROW_DOT_MARGIN = 1.3


@torch.compiler.assume_constant_result  # traced: called, not traced, and its answer is a constant of the graph
def blas_reads_rows_slowly() -> bool:
    """Whether this CPU's BLAS computes a one-row fp32 product over ROW_DOT_MARGIN times slower than a plain `sum`
    reads the same weights (`time_row_reads`), timed once per process and thread count (20-60 ms)."""
    blas, plain_sum = _row_read_seconds(torch.get_num_threads())
    return blas > ROW_DOT_MARGIN * plain_sum


@functools.cache
def _row_read_seconds(threads: int, /) -> tuple[float, float]:  # positional: the cache keys on how it is called
    return time_row_reads()


def time_row_reads(repeats: int = 10) -> tuple[float, float]:
    """Best seconds of `F.linear` over one row and of `sum(-1)` over TIMED_SHAPE weights read once a round from the
    cache (`weights_read_once`), interleaved (`best_interleaved`), on the process's threads. Nothing drawn: the
    global random state stays as it was."""
    with torch.inference_mode(False), torch.no_grad(), torch.autocast("cpu", enabled=False):
        weights = weights_read_once(TIMED_SHAPE, from_memory=False)
        row = torch.full((1, TIMED_SHAPE[1]), 0.5, dtype=torch.float32, device="cpu")
        best = best_interleaved({"F.linear": lambda: [F.linear(row, weight) for weight in weights],
                                 "sum": lambda: [weight.sum(-1) for weight in weights]}, repeats)
    return best["F.linear"], best["sum"]

