"""`ScratchLinear`: `nn.Linear` whose products take the fastest of its kernels on this machine (`kernel_choice`
chooses among `linear_kernels`): oneDNN's or the BLAS's fp32 product, the transposed one over a few rows, bf16 widened
to fp32 where bf16 products are slow, a row dot when compiled for one row; `F.linear` otherwise, and for every
weight that is not a plain tensor (a quantizer's, a meta or offloaded one).
"""

import itertools
import sys

import torch
import torch.nn.functional as F
from torch import nn

from .kernel_choice import compiled_as_row_dot, eager_kernel, widens_bf16
from .linear_kernels import (
    PLAIN_TYPES,
    materialized,
    onednn_product,
    row_dot,
    transposed_linear,
    widened_bf16_linear,
)


def is_torchao_weight(weight: torch.Tensor) -> bool:
    """Whether torchao quantized this weight (any of its tensor subclasses). torchao is imported by whoever
    quantized the weight; this module never imports it."""
    torchao_utils = sys.modules.get("torchao.utils")
    return torchao_utils is not None and isinstance(weight, torchao_utils.TorchAOBaseTensor)


class ScratchLinear(nn.Linear):
    """Drop-in `nn.Linear` (same parameters, names and state dict) with the faster CPU kernel (`kernel_choice`)
    for plain tensors; any other weight (a quantizer's tensor subclass, a meta or offloaded one) takes `F.linear`,
    which dispatches to whatever product that weight defines."""

    fused_sizes: tuple[int, ...] | None = None  # a fused layer's (QKV, gate | up) output sizes of its parts
    quantized_in_parts = False  # a torchao weight of a fused layer computes one product per part (`_torchao_parts`)
    working_set = 0  # bytes of fp32 weights a few-row forward of the layer's model reads (`mark_working_set`)
    # The input is an activation's output, costly to compute again: a compiled row dot reads it `materialized`.
    materializes_compiled_row = False

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # The parameters' dict: `self.weight` is a failed lookup, then nn.Module.__getattr__ (0.85 us a read in a warm
        # loop on the AVX2-only AMD EPYC, several times that between a training step's products).
        try:
            weight, bias = self._parameters["weight"], self._parameters["bias"]
        except KeyError:  # moved out by a parametrization, pruning or weight norm, which compute them when read
            weight, bias = self.weight, self.bias
        if torch.compiler.is_compiling():
            if compiled_as_row_dot(inputs, weight):
                return row_dot(materialized(inputs) if self.materializes_compiled_row else inputs, weight, bias)
        elif torch.is_autocast_enabled("cpu") or inputs.dtype == torch.bfloat16:
            if widens_bf16(inputs, weight, bias):
                return widened_bf16_linear(inputs, weight, bias)
        else:
            kernel = eager_kernel(inputs, weight, bias, self.working_set)
            if kernel == "onednn":
                return onednn_product(inputs, weight, bias)
            if kernel == "transposed":
                return transposed_linear(inputs, weight, bias)
        if self.quantized_in_parts and type(weight) not in PLAIN_TYPES and is_torchao_weight(weight):
            return torch.cat([F.linear(inputs, *part) for part in self._torchao_parts(weight)], dim=-1)
        return F.linear(inputs, weight, bias)

    def _torchao_parts(self, weight: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor | None], ...]:
        """(weight, bias) of each fused part, as the native model's separate layers: views of `weight`, made at its
        first product (slicing a torchao tensor costs about 80 us, its Python dispatch) and kept while it is the
        layer's weight; `_apply` (`to`, `half`, ...), a copy and pickling drop them."""
        cached = self.__dict__.get("_torchao_cache")
        if cached is None or cached[0] is not weight:
            ends = itertools.accumulate(self.fused_sizes)  # torchao slices by rows (aten.slice), it has no split
            rows = [slice(end - size, end) for size, end in zip(self.fused_sizes, ends, strict=True)]
            # Made as normal tensors even under `torch.inference_mode()`: there torchao's slicing fails ("Cannot set
            # version_counter for inference tensor"), and inference-mode views could not serve a later forward
            # with gradients, as the native model's weights do.
            with torch.inference_mode(False):
                parts = tuple((weight[part], None if self.bias is None else self.bias[part]) for part in rows)
            self.__dict__["_torchao_cache"] = cached = (weight, parts)
        return cached[1]

    def _apply(self, fn, recurse: bool = True):
        self.__dict__.pop("_torchao_cache", None)
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.__dict__.items() if name != "_torchao_cache"}


def mark_working_set(model: nn.Module) -> None:
    """Tell every `ScratchLinear` of `model` how many bytes of weights a forward of few rows reads: all of the model's
    linear weights as fp32, the only products with a kernel choice (no two share a weight: a tied output head shares
    its with an embedding). For an encoder-decoder this counts the encoder's too, which a decoding step does not
    read: an over-estimate that matters only near the cache's size, where the kernels tie. Models call it when built
    (`post_init`) and when resized."""
    layers = [module for module in model.modules() if isinstance(module, ScratchLinear)]
    working_set = 4 * sum(layer.weight.numel() for layer in layers)
    for layer in layers:
        layer.working_set = working_set
