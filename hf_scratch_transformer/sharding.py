"""FSDP2 for both entry points, as Accelerate does it on GPUs, plus what our models need under it (see
docs/distributed.md). No model file imports this module.

- `shard_on_cpu`: Accelerate joins CPU processes (gloo) as MULTI_CPU and drops the FSDP plugin of an FSDP launch
  without a word, so the run would be plain DDP. The state is switched to FSDP as `AcceleratorState` does it on
  GPUs, so that `prepare`, `save_state` / `load_state` (sharded checkpoints), `clip_grad_norm_` and
  `get_state_dict` run Accelerate's own FSDP2 code. GPU launches never need it.
- `share_embedding_modules`: one module per tied embedding matrix before wrapping (FSDP2 refuses a matrix shared
  between two units).
- `tie_state_dict` and `own_class`: a final `save_pretrained` that stores a tied matrix once and names the model's
  own class in `auto_map`, not torch's `FSDP<Class>`.
- `ShardedTrainer`: the same for `Trainer`, mixed into its class.
"""

import contextlib

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env
from torch.distributed.fsdp import FSDPModule


def fsdp_launched_on_cpu(accelerator) -> bool:
    """An FSDP launch (ACCELERATE_USE_FSDP, or `fsdp` in TrainingArguments) whose processes Accelerate joined on CPU."""
    return accelerator.distributed_type == DistributedType.MULTI_CPU and parse_flag_from_env("ACCELERATE_USE_FSDP")


def shard_on_cpu(accelerator, plugin_kwargs: dict | None = None) -> None:
    """Switch the (process-wide) Accelerate state of CPU processes to FSDP, with a plugin read from the launcher's
    FSDP_* variables (or `plugin_kwargs`) and the run's mixed precision."""
    plugin = FullyShardedDataParallelPlugin(**(plugin_kwargs or {}))
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP  # the state is shared by every Accelerator object
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def share_embedding_modules(model: torch.nn.Module) -> None:
    """One module per tied embedding matrix, as T5 and BART have (`shared`), before FSDP wraps the model.
    Accelerate's FSDP2 gives the input embeddings, the output embeddings and the final norm one unit of their own;
    a tied matrix that another module also holds (the encoder's token embeddings, tied to the decoder's under
    `share_embeddings`) would be left to the root unit, which torch refuses at the first forward ("shared with a
    parameter already managed by another FSDP group"). Both stacks hold the input embedding module itself instead:
    it computes the same, and the state dict keeps its names."""
    shared = model.get_input_embeddings()
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if module is not shared and isinstance(module, torch.nn.Embedding) and module.weight is shared.weight:
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent), attribute, shared)


def tie_state_dict(state_dict: dict, model: torch.nn.Module) -> dict:
    """FSDP's gathered state dict has a tensor of its own for every name, tied ones included: the names of one
    parameter share one tensor again, so that `save_pretrained` stores a tied matrix once, as without FSDP."""
    names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    for first, *others in names.values():
        for name in others:
            if first in state_dict and name in state_dict:
                state_dict[name] = state_dict[first]
    return state_dict


@contextlib.contextmanager
def own_class(model: torch.nn.Module):
    """FSDP2 turns a sharded module's class into `FSDP<Class>`, which torch defines: `save_pretrained` would copy
    torch's FSDP sources into the folder and point `auto_map` at them (transformers strips the prefix from
    `architectures` only). The model has its own class back while it is saved."""
    sharded = type(model)
    if issubclass(sharded, FSDPModule):
        model.__class__ = next(cls for cls in sharded.__mro__ if not issubclass(cls, FSDPModule))
    try:
        yield model
    finally:
        model.__class__ = sharded


class ShardedTrainer:
    """Mix into a `Trainer` class: FSDP in CPU processes too, the embedding modules shared before wrapping, and a
    final `save_model` with the full weights (Trainer saves none with SHARDED_STATE_DICT; checkpoints stay
    sharded), the tied matrix once and the model's own class."""

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        if self.accelerator.distributed_type == DistributedType.MULTI_CPU and (
                self.args.fsdp_plugin_args is not None or parse_flag_from_env("ACCELERATE_USE_FSDP")):
            shard_on_cpu(self.accelerator, self.args.fsdp_plugin_args)
            self.is_fsdp_enabled = True
        if self.is_fsdp_enabled:
            share_embedding_modules(self.model)

    def save_model(self, output_dir=None, _internal_call=False):
        if not self.is_fsdp_enabled or _internal_call:
            return super().save_model(output_dir, _internal_call)
        plugin = self.accelerator.state.fsdp_plugin
        sharded = plugin.state_dict_type
        plugin.set_state_dict_type("FULL_STATE_DICT")
        try:
            return super().save_model(output_dir, _internal_call)
        finally:
            plugin.set_state_dict_type(sharded)

    def _save(self, output_dir=None, state_dict=None):
        if self.is_fsdp_enabled and state_dict:
            state_dict = tie_state_dict(state_dict, self.model)
        with own_class(self.model):
            return super()._save(output_dir, state_dict)
