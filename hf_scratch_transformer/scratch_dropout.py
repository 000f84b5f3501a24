"""Dropout (Srivastava et al., 2014) as every Scratch layer applies it, with a faster mask on CPU.

On CPU, `F.dropout` draws its mask with `bernoulli_`, one call of the generator per element through a float, and
keeps the scaled mask in the input's dtype for backward: 4.3 ms for an 8 x 256 x 384 tensor and 5.0 ms with
backward, the same with and without AVX-512 (the generator is scalar code). A Marian training step calls it 17
times. `keep_mask` takes 32 random bits per element, two from each 64-bit draw of the same generator, and compares
them with a threshold: 1.6 ms, 3.1 ms with backward, which keeps a bool mask (1 byte an element; F.dropout keeps
2 or 4). Each element is kept with probability 1 - p to 2^-33 (`bernoulli_`'s float: 2^-24), independently, from
`torch.manual_seed`'s generator: seeded runs are reproducible, with other masks than F.dropout's. Elsewhere (CUDA,
`torch.compile`, `torch.func` transforms, p = 1) it is `F.dropout`.
"""

import torch
from torch import nn

from .linear_kernels import inside_torch_func


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A CPU bool tensor of `shape`, each element True with probability 1 - p (0 < p < 1)."""
    count = shape.numel()
    # random_(lowest int64, None) draws all 64 bits (random_() alone leaves the sign bit 0); each is two int32s.
    bits = torch.empty((count + 1) // 2, dtype=torch.int64, device="cpu").random_(-(2**63), None)
    threshold = min(round(p * 2**32) - 2**31, 2**31 - 1)  # P(bits >= threshold) = 1 - p, bits uniform in int32
    return bits.view(torch.int32)[:count].view(shape) >= threshold


def dropout(inputs: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero each element with probability p and scale the rest by 1 / (1 - p) when training; the input itself when
    not (eval, or p = 0). A function of the module's `training` flag and a rate, as in transformers' Llama, not a
    module call: a forward calls it about 13 times, and a module call costs more than the dropout it skips
    (docs/nanogpt.md); the layers call it in training mode only (between a decoding step's products every call costs:
    docs/performance.md, "Python between the products"). The rate is the `p` of an `nn.Dropout` the layer holds and
    never calls, so that what switches dropout off by setting `p = 0` on every `nn.Dropout` (TRL's
    `disable_dropout_in_model`, on by default in its DPO and reward trainers) reaches ours, as it reaches GPT-2's and
    BERT's."""
    if not training or p == 0:
        return inputs
    if inputs.is_cpu and 0 < p < 1 and not torch.compiler.is_compiling() and not inside_torch_func():
        # where() keeps only the bool mask for backward; the scalar product keeps nothing.
        return inputs.where(keep_mask(inputs.shape, p), 0) * (1 / (1 - p))
    return nn.functional.dropout(inputs, p, training=True)
