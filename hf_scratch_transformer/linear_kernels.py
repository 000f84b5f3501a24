"""The products a linear layer can be computed with: each the same sums as `F.linear`, by another kernel or in
another order, so results agree with it to fp32 rounding, not bit for bit. Which one a product takes on this machine
is `kernel_choice`'s job; `ScratchLinear` calls them.

- oneDNN's fp32 product (`onednn_linear`; `onednn_product` records it for autograd), IEEE fp32 sums, no
  reduced-precision accumulation;
- the BLAS on the transposed product (`transposed_linear`), faster over a few rows on some machines;
- a bf16 product through the fp32 BLAS (`widened_bf16_linear`): the same arithmetic as a bf16 one (below);
- one row as a row-by-row dot product (`row_dot`), which inductor compiles into a loop reading the weight once.
"""

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_enabled() -> bool:
    """Whether oneDNN's product may be taken now: built in, and not turned off by the user
    (`torch.backends.mkldnn.enabled = False`, `torch.backends.mkldnn.flags(enabled=False)`), as PyTorch's own ops
    honour it (a user turns oneDNN off to step around one of its bugs)."""
    return ONEDNN_AVAILABLE and torch.backends.mkldnn.enabled


def onednn_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """inputs (..., in) x weight (out, in) -> (..., out); weight may be any strided view (a transpose is free)."""
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


# oneDNN builds a kernel for each shape of product it meets and keeps the last 1024 in each of two caches (its own and
# PyTorch's ideep wrapper's, both of which hold it): about 0.5 MB a shape, where the BLAS of native models' fp32
# products keeps nothing. A server meets a new shape at almost every prompt (a new length): `hf-scratch serve` of a
# 64-wide GPT-2 grew from 497 to 714 MB over 200 requests, native GPT-2 stayed at 452; bounded at 64 shapes it stayed
# at 500, answering as fast (AVX-512 AMD EPYC, where prefill takes oneDNN). A training run whose batches come in a
# few dozen lengths reuses them: bounded at 64 it built them again and again, 8% slower a step (oneDNN forced, same
# machine). oneDNN reads each bound at its first product in the process.
ONEDNN_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches(shapes: int = 64) -> None:
    """Keep oneDNN's kernels for at most `shapes` shapes of product in this process, for one that meets new shapes
    without end (a server); a bound the user set stays. Call it before the process's first oneDNN product."""
    for variable in ONEDNN_CACHE_VARIABLES:
        os.environ.setdefault(variable, str(shapes))


def inside_torch_func() -> bool:
    """Whether a `torch.func` transform (grad, vmap, jvp, ...) is running: PyTorch's own ops have the batching and
    differentiation rules those need, so our kernels step aside. One call to functorch's interpreter stack (0.1 us,
    cheaper than inspecting each tensor: `ScratchLinear` asks at every product)."""
    return torch._C._functorch.peek_interpreter_stack() is not None


class OneDNNLinearFunction(torch.autograd.Function):
    """The three products of a linear layer (forward, input grad, weight grad), each through oneDNN, differentiable
    again (double backward) and with a forward-mode rule (`torch.autograd.forward_ad`), as `F.linear`.
    A forward that takes `ctx` itself, not a `setup_context`: with one, every `apply` binds its arguments through
    `inspect.signature`, 31 us a call (136 against 105 us for 80 x 128 -> 384 on one core, AVX-512 AMD EPYC; 0.5 ms a
    step at nanoGPT's size). `setup_context` is what `torch.func` transforms need, and under them products take
    `F.linear` (`inside_torch_func`)."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        ctx.save_for_forward(inputs, weight)
        ctx.has_bias = bias is not None
        # Detached, as no copy: the op's product of more than two dimensions is a view (it computes into its output
        # reshaped to rows x out, then reshapes it back), and a custom Function's view output refuses in-place ops
        # ("Output 0 of OneDNNLinearFunction is a view and is being modified inplace") and makes FSDP2 warn of one.
        return onednn_linear(inputs, weight, bias).detach()

    @staticmethod
    def jvp(ctx, inputs_tangent, weight_tangent, bias_tangent):
        inputs, weight = ctx.saved_tensors
        tangent = 0
        if inputs_tangent is not None:
            tangent = tangent + onednn_linear(inputs_tangent, weight, None)
        if weight_tangent is not None:
            tangent = tangent + onednn_linear(inputs, weight_tangent, None)
        if bias_tangent is not None:
            tangent = tangent + bias_tangent
        return tangent

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        # When this backward is itself recorded (create_graph=True: double backward, `torch.func.hessian`), the
        # gradient products go through this same function, so that they are differentiable in turn, as `F.linear`'s
        # are; otherwise straight to the op: `Function.apply` costs about 25 us a call, 1 ms a step at nanoGPT's size.
        product = OneDNNLinearFunction.apply if torch.is_grad_enabled() else onednn_linear
        return linear_gradients(ctx, grad_output, product, grad_output.dtype)


def linear_gradients(ctx, grad_output: torch.Tensor, product: Callable, dtype: torch.dtype) -> tuple:
    """The gradients (inputs, weight, bias) of a linear layer's autograd function, whose forward saved (inputs,
    weight) and `has_bias`, from the output's gradient (..., out); each product computed by `product(inputs, weight,
    bias)` as the forward computed its own, the bias's a sum of the gradient's rows, in `dtype`."""
    inputs, weight = ctx.saved_tensors
    rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (rows, out)
    grad_inputs = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        # (rows, out) x (out, in) = linear with the transposed weight (in, out) as "weight"
        grad_inputs = product(rows_grad, weight.t(), None).reshape(inputs.shape)
    if ctx.needs_input_grad[1]:
        # (out, rows) x (rows, in) = linear of grad^T with inputs^T (in, rows) as "weight"
        flat_inputs = inputs.reshape(-1, inputs.shape[-1])
        grad_weight = product(rows_grad.t(), flat_inputs.t(), None)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = rows_grad.sum(0).to(dtype)
    return grad_inputs, grad_weight, grad_bias


def onednn_product(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`onednn_linear`, recorded for autograd where gradients are (`Function.apply` costs about 25 us a call)."""
    if torch.is_grad_enabled():
        return OneDNNLinearFunction.apply(inputs, weight, bias)
    return onednn_linear(inputs, weight, bias)


# The types oneDNN's op computes with. A tensor subclass (a quantizer's int8 or float8 weight from torchao, a DTensor,
# a fake or meta tensor) carries its own product in its `F.linear` dispatch and has no oneDNN one: an exact type
# check, not isinstance, since every subclass is an instance of torch.Tensor.
PLAIN_TYPES = (torch.Tensor, nn.Parameter)


def transposed_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear as the transposed product: weight (out, in) x rows^T (in, rows) = (out, rows), handed back in
    F.linear's layout (..., out) (a copy of rows x out values). The same sums; the BLAS runs them faster this way
    round over a few rows for most shapes (MKL, AVX2 AMD EPYC: 0.33-0.58 of F.linear's time over 4 rows in
    `time_kernels`), as it ran GPT-2's `Conv1D` (x @ W with W stored (in, out)) faster than `x @ W.T` over 8 rows on
    an AVX-512 Intel Xeon."""
    rows = inputs.reshape(-1, inputs.shape[-1]).t()  # (..., in) -> (in, rows)
    product = torch.mm(weight, rows) if bias is None else torch.addmm(bias.unsqueeze(-1), weight, rows)
    # Reshaped (a view: it splits the rows) before the copy, so that the result is the copy, not a view of it (FSDP2
    # warns of a module returning a view); one row needs no copy and stays a view.
    return product.t().reshape(*inputs.shape[:-1], weight.shape[0]).contiguous()


# bf16 products, under CPU autocast or of a bf16 model. A bf16 product (bf16 operands, fp32 sums, a bf16 result) is
# the same arithmetic as the fp32 BLAS's product of the operands widened to fp32: a product of two bf16 numbers (8
# significant bits each) is exact in fp32 (24), and both sum in fp32; only the order of the sums differs, as between
# any two kernels. Where the CPU's bf16 products are slower than its fp32 ones, the widened product is the faster
# way to the same result (`kernel_choice.bf16_kernel`).
def bf16_by_fp32_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A bf16 product through the fp32 BLAS: inputs (..., in), weight (out, in), bias (out,), bf16 values (in bf16, or
    already widened to fp32; the weight may be a strided view) -> (..., out) in bf16, the sums in fp32 (see the
    comment above)."""
    with torch.autocast("cpu", enabled=False):  # else F.linear would narrow the widened operands again
        widened_bias = None if bias is None else bias.float()
        return F.linear(inputs.float(), weight.float(), widened_bias).to(torch.bfloat16)


class _Bf16ByFp32LinearFunction(torch.autograd.Function):
    """`bf16_by_fp32_linear` with its two gradient products computed the same way; it keeps the bf16 inputs and
    weight for backward, as autocast's product does (the memory bf16 saves), and widens them again there."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        ctx.has_bias = bias is not None
        return bf16_by_fp32_linear(inputs, weight, bias)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        # Recorded (double backward), the gradient products go through this function again, as in
        # `OneDNNLinearFunction.backward`; otherwise the gradient is widened once for both products.
        recorded = torch.is_grad_enabled()
        product = _Bf16ByFp32LinearFunction.apply if recorded else bf16_by_fp32_linear
        # Widening is exact, and bf16_by_fp32_linear leaves an fp32 operand as it is; the bias's gradient is then
        # summed in fp32 and narrowed, as autocast's addmm sums its bias's.
        widened_grad = grad_output if recorded else grad_output.float()
        return linear_gradients(ctx, widened_grad, product, torch.bfloat16)


def widened_bf16_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear in bf16 (as CPU autocast computes it, or of bf16 tensors) through the fp32 BLAS: the operands narrowed
    to bf16 as autocast narrows them (a cast that autograd records: an fp32 weight gets an fp32 gradient; bf16 ones are
    left as they are), then the product."""
    operands = [None if tensor is None else tensor.to(torch.bfloat16) for tensor in (inputs, weight, bias)]
    if torch.is_grad_enabled():
        return _Bf16ByFp32LinearFunction.apply(*operands)
    return bf16_by_fp32_linear(*operands)


def row_dot(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear of one row, as a sum of products: inputs (..., in) holding one row x weight (out, in) -> (..., out)."""
    product = (weight * inputs.reshape(1, -1)).sum(-1)  # (out, in) * (1, in) -> (out,)
    return (product if bias is None else product + bias).reshape(*inputs.shape[:-1], -1)


def materialized(inputs: torch.Tensor) -> torch.Tensor:
    """`inputs` (..., in) as a product by one, (n, 1) x (1, 1): the same values (x * 1 is exact), computed by an
    extern kernel (the BLAS), whose input inductor must write out first. Traced, a row dot's input that is an
    elementwise result is otherwise inlined into the row dot's loop and computed again for every row of the weight:
    an exact GELU's erf 1536 x 384 times a layer: GPT-2 at the benchmark's size with an exact GELU took 1.98 s for
    200 compiled tokens, 1.55 with its activation written out (AVX2 AMD EPYC; docs/performance.md)."""
    one = torch.ones(1, 1, dtype=inputs.dtype, device=inputs.device)
    return torch.mm(inputs.reshape(-1, 1), one).view(inputs.shape)

