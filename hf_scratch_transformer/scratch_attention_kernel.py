"""Where the sdpa back-end computes attention on CPU in training with the eager math (two products and a softmax,
`scratch_attention.eager_attention_forward`) instead of PyTorch's `scaled_dot_product_attention`.

With attention dropout on, PyTorch's CPU flash kernel does not apply (it has no dropout): sdpa computes the math
path, as the eager back-end does, and draws its mask with `bernoulli_`, one call of the scalar generator per
element through a float, which backward keeps in the input's dtype. The eager math draws it with
`scratch_dropout.keep_mask` (2.5x cheaper) and keeps it as bool, so it is taken whenever the rate is above 0 in
training mode (GPT-2's and BERT's defaults are 0.1); both keep the (B, H, T, S) probabilities for backward. On the
AVX-512 AMD EPYC a GPT-2 training step of the benchmark went from 1.19x to 1.49x the native one in bf16 and from
1.19x to 1.30x in fp32, BERT's from 1.31x to 1.67x and 1.32x to 1.44x (docs/performance.md).

Without dropout, the other case is a bf16 step over at most EAGER_MAX_KEYS keys: sdpa's flash kernel or the eager
math, whichever this machine runs the faster.

PyTorch's CPU flash-attention kernel is slow in bf16 at short sequences, its backward above all: forward and
backward of 64 x 8 heads x 32 tokens (head size 64, causal) took 22.4 ms, against 5.0 ms for the eager math and
4.8 ms for the same kernel in fp32 (Intel Xeon, AVX-512 + AMX, 2 threads; docs/performance.md). With the scaling and
mask in one pass and the softmax in bf16 (`eager_attention_forward`), the eager math also won at 256 tokens on an
AVX-512 AMD EPYC: 8 x 6 heads took 10-14 ms against flash's 23-32. It keeps the (B, H, T, S) bf16 probabilities
for backward, which flash recomputes: at most 2 bytes x 256 per query and head, the size of the query, key, value
and output flash keeps at head size 64. The choice is timed once per process for each length in TIMED_KEYS, at the
first step over that many keys or fewer (and more than the shorter one), at that length: the least favourable to
eager up to it (its advantage grew as sequences shortened, on the Xeon and the EPYC). HF_SCRATCH_CPU_ATTENTION=
sdpa|eager forces one for every length (that choice only: with dropout there is none to make). Without dropout,
fp32, eval mode (inference: no backward) and longer sequences keep sdpa's kernel; other devices, `torch.compile`
and `torch.func` keep it with dropout too.
"""

import math
import os
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .kernel_choice import apart_from_the_caller, one_thread
from .linear_kernels import inside_torch_func

ATTENTION_VARIABLE = "HF_SCRATCH_CPU_ATTENTION"
CHOICES = ("auto", "sdpa", "eager")
TIMED_KEYS = (128, 256)  # a sequence of S keys takes the choice timed at the first length >= S
EAGER_MAX_KEYS = TIMED_KEYS[-1]
EAGER_MARGIN = 0.9  # eager must be 10% faster: on a tie, or within noise, the native kernel
CHOSEN: dict[int, str] = {}  # timed length -> "eager" or "sdpa": this process's choices (the benchmark reports them)


def timed_length(keys: int) -> int:
    """The length of TIMED_KEYS whose choice attention over `keys` (at most EAGER_MAX_KEYS) keys takes."""
    return next(length for length in TIMED_KEYS if keys <= length)


def bf16_training_kernel(keys: int) -> str:
    """"eager" or "sdpa": the kernel for bf16 CPU attention in training mode over `keys` (at most EAGER_MAX_KEYS)
    keys. HF_SCRATCH_CPU_ATTENTION=sdpa|eager forces one; auto (the default) times both once per process and timed
    length (`timed_length`). `CHOSEN.clear()` makes the choices again."""
    length = timed_length(keys)
    if length not in CHOSEN:
        choice = os.environ.get(ATTENTION_VARIABLE, "").strip().lower() or "auto"
        if choice not in CHOICES:
            raise ValueError(f"{ATTENTION_VARIABLE} must be one of {', '.join(CHOICES)}; got {choice!r}.")
        if choice == "auto":
            sdpa, eager = time_kernels(length)
            choice = "eager" if eager < EAGER_MARGIN * sdpa else "sdpa"
        CHOSEN[length] = choice
    return CHOSEN[length]


def time_kernels(length: int, repeats: int = 3) -> tuple[float, float]:
    """Best seconds (sdpa, eager) of a causal bf16 forward and backward over 2 x 8 heads x `length` tokens (head
    size 64) on one core, the two interleaved after a warm-up round; about 50 ms at 128 tokens. Its own generator
    leaves the global random state alone; one core, as `kernel_choice.time_kernels`, so the machine's load does not
    decide."""
    from .scratch_attention import eager_attention_forward  # that module asks this one which to take

    generator = torch.Generator().manual_seed(0)
    shape = (2, 8, length, 64)
    best = {"sdpa": math.inf, "eager": math.inf}
    with one_thread(), apart_from_the_caller(), torch.inference_mode(False), torch.enable_grad(), \
            torch.autocast("cpu", enabled=False):
        query, key, value = (torch.randn(shape, generator=generator).bfloat16().requires_grad_() for _ in range(3))
        grad_output = torch.randn(shape, generator=generator).transpose(1, 2).bfloat16()  # eager's (B, T, H, D)
        causal = causal_mask(length, length, query.device)
        layer = SimpleNamespace(num_key_value_groups=1, training=False)
        kernels = {
            "sdpa": lambda: F.scaled_dot_product_attention(query, key, value, is_causal=True).transpose(1, 2),
            "eager": lambda: eager_attention_forward(layer, query, key, value, causal, scaling=64**-0.5)[0],
        }
        for repeat in range(repeats + 1):
            for kernel in sorted(best, reverse=repeat % 2 == 1):
                start = time.perf_counter()
                torch.autograd.grad(kernels[kernel](), (query, key, value), grad_output)
                if repeat:  # round 0 warms up
                    best[kernel] = min(best[kernel], time.perf_counter() - start)
    return best["sdpa"], best["eager"]


def causal_mask(query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
    """(T, S) bool, True where a query may attend: the last query sees every key (sdpa's `is_causal` when T = S)."""
    return torch.ones(query_length, key_length, dtype=torch.bool, device=device).tril_(key_length - query_length)


def takes_eager_math(query: torch.Tensor, key: torch.Tensor, dropout: float) -> bool:
    """Whether sdpa attention over query (B, H, T, D) and key (B, K, S, D) computes the eager math instead, on CPU:
    - with attention dropout on (training): PyTorch's CPU flash kernel has no dropout, so sdpa computes this same
      math there and draws its mask with `bernoulli_`; ours draws it with `scratch_dropout.keep_mask`, 2.5x cheaper;
    - a bf16 layer in training mode, over at most EAGER_MAX_KEYS keys, where this machine's flash kernel is slower
      at that length.
    Training mode, not gradient mode, decides: reentrant gradient checkpointing runs the forward without gradients
    and again with them, and both runs must compute (and drop out) alike. Asked in training mode only: the caller
    checks the mode, a call less per layer at every decoding step."""
    if not query.is_cpu or (dropout == 0 and query.dtype != torch.bfloat16):
        return False  # the usual fp32 step without attention dropout asks no more (each call costs, docs/nanogpt.md)
    if torch.compiler.is_compiling() or inside_torch_func():
        return False
    return dropout > 0 or (key.shape[2] <= EAGER_MAX_KEYS and bf16_training_kernel(key.shape[2]) == "eager")


def keyless_queries_zeroed(output: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The eager math's output (B, T, H, D) as PyTorch's sdpa gives it for a query that a boolean mask lets attend to
    no key (the pad positions of a left-padded causal batch): zero, and no gradient through it. The eager math's
    softmax over the masked minimum spreads such a query evenly over every key, later ones included, and in a
    left-padded causal LM the last pad position predicts the first real token: the loss and gradients moved with the
    kernel taken (the timed bf16 choice, attention dropout), where the native model's sdpa gives zeros. An additive
    mask is softmaxed alike by both, so is left as it is."""
    if mask is None or mask.dtype != torch.bool:
        return output
    keyless = ~mask.any(-1, keepdim=True)  # (..., T, 1)
    if not keyless.any():  # the usual batch: one read of the mask, no copy of the output
        return output
    return output.transpose(1, 2).masked_fill(keyless, 0).transpose(1, 2)
