"""Whether an input check can read a tensor's values (the range checks of SPEC section 10)."""

import torch
from torch._subclasses.fake_tensor import FakeTensor

from .linear_kernels import inside_torch_func


def values_unreadable(tensor: torch.Tensor) -> bool:
    """Whether a check must leave `tensor`'s values unread: there are none (an empty tensor, a meta one, a fake one
    or any under `FakeTensorMode`, where native models run for shape and memory estimates: reading one failed with
    "Tensor.item() cannot be called on meta tensors" or a DataDependentOutputException), or reading one would break
    the graph being compiled or a `torch.func` transform (vmap refuses to read one: per-sample gradients,
    `vmap(grad(loss))`, failed there)."""
    return (
        torch.compiler.is_compiling()
        or inside_torch_func()
        or tensor.numel() == 0
        or tensor.is_meta
        or isinstance(tensor, FakeTensor)
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    )
