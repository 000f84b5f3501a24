"""`ScratchLinear`: `nn.Linear` whose fp32 CPU products run through oneDNN.

On CPU, PyTorch computes fp32 `F.linear` with its default BLAS, which on the AMD machines we measure on reaches
about half the speed of the same product through oneDNN (`docs/benchmarks.md`). bf16 products (autocast) already go
through oneDNN, and CUDA has its own kernels, so only fp32 on CPU takes this path; everything else, and anything
traced by `torch.compile` (inductor picks its own kernels), is plain `F.linear`. The results are the same products
in fp32 (IEEE, no reduced-precision accumulation), summed in a different order: they agree with `F.linear` to fp32
rounding, not bit for bit.
"""

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """inputs (..., in) x weight (out, in) -> (..., out); weight may be any strided view (a transpose is free)."""
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


def under_torch_func(*tensors: torch.Tensor) -> bool:
    """Whether `torch.func` transforms (grad, vmap, jvp, ...) wrap any of the tensors: PyTorch's own ops have the
    batching and differentiation rules those need, so our kernels step aside."""
    return any(torch._C._functorch.is_functorch_wrapped_tensor(tensor) for tensor in tensors)


class _OneDNNLinearFunction(torch.autograd.Function):
    """The three products of a linear layer (forward, input grad, weight grad), each through oneDNN, differentiable
    again (double backward) and with a forward-mode rule (`torch.autograd.forward_ad`), as `F.linear`."""

    @staticmethod
    def forward(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return onednn_linear(inputs, weight, bias)

    @staticmethod
    def setup_context(ctx, inputs_and_parameters, output) -> None:
        inputs, weight, bias = inputs_and_parameters
        ctx.save_for_backward(inputs, weight)
        ctx.save_for_forward(inputs, weight)
        ctx.has_bias = bias is not None

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
        # The gradient products go through this same function, so that they are differentiable in turn
        # (double backward, `torch.func.hessian`), as `F.linear`'s are.
        inputs, weight = ctx.saved_tensors
        rows_grad = grad_output.reshape(-1, grad_output.shape[-1])  # (rows, out)
        grad_inputs = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # (rows, out) x (out, in) = linear with the transposed weight (in, out) as "weight"
            grad_inputs = _OneDNNLinearFunction.apply(rows_grad, weight.t(), None).reshape(inputs.shape)
        if ctx.needs_input_grad[1]:
            # (out, rows) x (rows, in) = linear of grad^T with inputs^T (in, rows) as "weight"
            flat_inputs = inputs.reshape(-1, inputs.shape[-1])
            grad_weight = _OneDNNLinearFunction.apply(rows_grad.t(), flat_inputs.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows_grad.sum(0)
        return grad_inputs, grad_weight, grad_bias


def _takes_onednn_path(inputs: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        ONEDNN_AVAILABLE
        and not torch.compiler.is_compiling()  # first: the checks below would put guards in a traced graph
        and inputs.is_cpu
        and inputs.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and inputs.numel() > 0
        and not under_torch_func(inputs, weight)
    )


class ScratchLinear(nn.Linear):
    """Drop-in `nn.Linear` (same parameters, names and state dict) with the oneDNN fp32 CPU path."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not _takes_onednn_path(inputs, self.weight):
            return F.linear(inputs, self.weight, self.bias)
        if torch.is_grad_enabled():
            return _OneDNNLinearFunction.apply(inputs, self.weight, self.bias)
        return onednn_linear(inputs, self.weight, self.bias)
