"""Scaled dot-product attention (Vaswani et al., 2017, section 3.2) and the multi-head module around it.

Shape legend: B batch, T query length, S key length, H query heads, K key/value heads (K divides H; K < H is
grouped-query attention, K = 1 multi-query), D head size.

Two hand-written back-ends with one signature, picked by `config._attn_implementation` (transformers'
`attn_implementation`): `eager` spells the math out and can return the attention weights; `sdpa` calls
`torch.nn.functional.scaled_dot_product_attention`, except where it computes eager's math on CPU in training
(`scratch_attention_kernel.py`): with attention dropout on, where PyTorch's sdpa computes that same math and draws a
slower mask, and in a bf16 step at short sequences on a machine where PyTorch's flash kernel is the slower.
Any other name (flex, flash, kernels) is looked up in transformers' `ALL_ATTENTION_FUNCTIONS`. Masks arrive
prepared (see `scratch_masks.py`): `None`, boolean (True = attend) or additive float, broadcastable to (B, H, T, S).

Continuous batching (`generate_batch`, `transformers serve --continuous-batching`) packs every request into one row
(B = 1) and passes `cache=PagedAttentionCache`, which must receive the new keys and values before GQA repeats them and
returns each request's cached ones. Before transformers 5.24 the attention function does that: our two functions then
hand over to transformers' own (`sdpa`, `paged|eager`); from 5.24 `ScratchAttention` does it, as native layers do.
"""

import warnings
from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .scratch_attention_kernel import causal_mask, keyless_queries_zeroed, takes_eager_math
from .scratch_dropout import dropout as scratch_dropout
from .scratch_linear import ScratchLinear
from .scratch_masks import additive_from_boolean
from .scratch_positions import apply_rotary

# transformers 5.24 renamed `past_key_values` to `cache`: in model forwards (the old name a deprecated alias), in the
# output classes (`outputs.cache`; `outputs.past_key_values` a deprecated property) and in `masking_utils`. `generate()`
# passes `cache=`, as continuous batching always did. With it a paged cache is updated by the model's attention layer
# (`cache.update(key, value, layer_idx, kwargs=kwargs)`), no longer by the attention function. The family accepts both
# names on every version and returns the cache under the running version's output field name.
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"
MODEL_UPDATES_PAGED_CACHE = CACHE_FIELD == "cache"


def resolve_cache(cache, past_key_values, owner: nn.Module):
    """The cache passed as `cache` (transformers >= 5.24's name) or as `past_key_values` (the earlier one). From 5.24
    the old name warns, as native forwards do (upstream's `test_bc_cache_name_forward` asks for the warning)."""
    if past_key_values is None:
        return cache
    if cache is not None and cache is not past_key_values:
        raise ValueError("Pass the cache as `cache` or as `past_key_values`, not both.")
    if MODEL_UPDATES_PAGED_CACHE and not torch.compiler.is_compiling():
        warnings.warn(
            f"`past_key_values` is deprecated and will be removed in version 5.40.0 for "
            f"`{type(owner).__name__}.forward`. Use `cache` instead.",
            FutureWarning,
            stacklevel=3,
        )
    return past_key_values


def is_paged(cache) -> bool:
    """Continuous batching's cache, which packs every request into one row (its masks come prepared)."""
    return isinstance(cache, PagedAttentionCache)


def cache_output(cache) -> dict:
    """The keyword a `ModelOutput` of this transformers version takes the cache by."""
    return {CACHE_FIELD: cache}


def repeat_kv(hidden_states: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, K, S, D) -> (B, K * groups, S, D): each key/value head serves `groups` query heads."""
    if groups == 1:
        return hidden_states
    batch, kv_heads, seq, head_dim = hidden_states.shape
    hidden_states = hidden_states[:, :, None].expand(batch, kv_heads, groups, seq, head_dim)
    return hidden_states.reshape(batch, kv_heads * groups, seq, head_dim)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    cache=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T * scaling + mask) V. query (B, H, T, D), key/value (B, K, S, D) -> (B, T, H, D), (B, H, T, S)."""
    if cache is not None:  # a paged cache: continuous batching, which runs in eval mode (no dropout)
        return ALL_ATTENTION_FUNCTIONS["paged|eager"](
            module, query, key, value, attention_mask, scaling=scaling, cache=cache, **kwargs
        )
    if module.num_key_value_groups > 1:
        key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    scores = torch.matmul(query, key.transpose(2, 3))  # (B, H, T, S)
    bias = additive_mask(attention_mask, scores.dtype)
    # The scaling and the mask in one pass over the scores (`bias + scaling * scores`), and no pass of the mask's
    # own in backward: with the softmax below, a bf16 forward and backward of 8 x 6 heads x 256 tokens took 10-14 ms
    # where scale, masked_fill and an fp32 softmax took 23-43 (AVX-512 AMD EPYC, docs/performance.md).
    scores = scores * scaling if bias is None else torch.add(bias, scores, alpha=scaling)
    # In the scores' dtype, as native GPT-2, BERT and Marian do: PyTorch's softmax sums half-precision inputs in fp32
    # (the bf16 forward is bit-identical to an fp32 softmax rounded to bf16), and keeps for backward the probabilities
    # in that dtype, not an fp32 copy. A float64 model (or mask) softmaxes in float64: its mask's minimum stays finite.
    weights = nn.functional.softmax(scores, dim=-1).to(query.dtype)
    weights = scratch_dropout(weights, dropout, module.training)
    output = torch.matmul(weights, value)  # (B, H, T, D)
    return output.transpose(1, 2).contiguous(), weights


def additive_mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive one of `dtype` (`scratch_masks.additive_from_boolean`, 0 where a query
    attends); additive masks and `None` pass as they are. Same shape as the mask, (T, S) or (B, 1, T, S): far
    smaller than the scores."""
    if attention_mask is None or attention_mask.dtype != torch.bool:
        return attention_mask
    return additive_from_boolean(attention_mask, torch.zeros((), dtype=dtype, device=attention_mask.device), dtype)


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    cache=None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Same contract as `eager_attention_forward`, through PyTorch's fused kernel; returns no weights."""
    if cache is not None:  # a paged cache (continuous batching)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, cache=cache, **kwargs
        )
    if module.training and takes_eager_math(query, key, dropout):  # sdpa's own math, or its flash the slower here
        mask = attention_mask
        if mask is None and module.is_causal and query.shape[2] > 1:
            mask = causal_mask(query.shape[2], key.shape[2], query.device)
        output = eager_attention_forward(module, query, key, value, mask, scaling, dropout)[0]
        return keyless_queries_zeroed(output, attention_mask), None  # causality alone leaves each query a key
    if module.num_key_value_groups > 1:
        key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    # A `None` mask on a causal layer means "plain causal": let the kernel build it. With one query token
    # (decoding) there is nothing to hide.
    is_causal = module.is_causal and attention_mask is None and query.shape[2] > 1
    if isinstance(is_causal, torch.Tensor):  # shapes are tensors under `torch.jit.trace`, which sdpa refuses
        is_causal = bool(is_causal)
    output = nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=is_causal
    )
    return output.transpose(1, 2).contiguous(), None


SCRATCH_ATTENTION_FUNCTIONS: dict[str, Callable] = {
    "eager": eager_attention_forward,
    "sdpa": sdpa_attention_forward,
}


class ScratchAttention(nn.Module):
    """Multi-head attention with fused projections: one matmul makes Q, K and V for self-attention; for
    cross-attention one makes Q from the decoder and one makes K and V from the encoder output."""

    def __init__(self, config, layer_idx: int, is_causal: bool, is_cross_attention: bool = False):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal  # read by the sdpa back-ends
        self.is_cross_attention = is_cross_attention
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = nn.Dropout(config.attention_dropout)  # a rate, see `scratch_dropout`
        q_size, kv_size = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        if is_cross_attention:
            self.q_proj = ScratchLinear(config.hidden_size, q_size, bias=config.use_bias)
            self.kv_proj = ScratchLinear(config.hidden_size, 2 * kv_size, bias=config.use_bias)
            self.kv_proj.fused_sizes = (kv_size, kv_size)  # read by the Xavier initialisation
        else:
            self.qkv_proj = ScratchLinear(config.hidden_size, q_size + 2 * kv_size, bias=config.use_bias)
            self.qkv_proj.fused_sizes = (q_size, kv_size, kv_size)  # read by the Xavier initialisation
            # A torchao weight stays one product: this matrix is no larger than the FFN's, whose fp32 copy the
            # native model makes too, and one call beat three on the Xeon, AVX-512 and limited to AVX2 alike
            # (docs/quantization.md).
        self.o_proj = ScratchLinear(q_size, config.hidden_size, bias=config.use_bias)

    def _heads(self, projected: torch.Tensor) -> torch.Tensor:
        """(B, T, heads * D) -> (B, heads, T, D), a view. A fused projection's parts are then its head ranges: one view
        and one transpose for all of them (between a decoding step's products each op costs, docs/performance.md)."""
        return projected.view(*projected.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def _self_attention_states(self, hidden_states, position_embeddings, past_key_values):
        heads = self._heads(self.qkv_proj(hidden_states))  # (B, H + 2K, T, D): the queries, keys, values
        num_heads, kv_heads = self.num_heads, self.num_key_value_heads
        if position_embeddings is not None and not self._rotates_apart(heads):
            # Rotary: the queries and keys are adjacent heads, rotated in one pass (the same values and gradients,
            # half the ops: decoding 3% faster on an AVX-512 Intel Xeon, docs/performance.md "Python between the
            # products").
            cos, sin = position_embeddings
            query, key = apply_rotary(heads[:, : num_heads + kv_heads], cos, sin).split([num_heads, kv_heads], dim=1)
            value = heads[:, num_heads + kv_heads :]
        else:
            query, key, value = heads.split([num_heads, kv_heads, kv_heads], dim=1)
            if position_embeddings is not None:
                query, key = apply_rotary(query, *position_embeddings), apply_rotary(key, *position_embeddings)
        if past_key_values is not None:
            cache = (
                past_key_values.self_attention_cache
                if isinstance(past_key_values, EncoderDecoderCache)
                else past_key_values
            )
            key, value = cache.update(key, value, self.layer_idx)  # now (B, K, past + T, D)
        return query, key, value

    @staticmethod
    def _rotates_apart(heads: torch.Tensor) -> bool:
        """A compiled training step rotates the queries and keys apart, as native Llama does: with a dynamic length,
        inductor's backward fixed the strides of queries split from one rotation at the length it compiled with, and
        the next length failed an `assert_size_stride` (Trainer's `torch_compile`, tests/test_compile.py). Compiled
        decoding (no gradients) keeps the one pass."""
        return torch.compiler.is_compiling() and heads.requires_grad

    def _paged_attention_states(self, hidden_states, position_embeddings, cache, kwargs):
        """Continuous batching on transformers >= 5.24: the paged cache takes the new keys and values before GQA
        repeats them and returns each request's cached ones; it rewrites the attention kwargs in place."""
        query, key, value = self._self_attention_states(hidden_states, position_embeddings, None)
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        return query, key, value

    def _cross_attention_states(self, hidden_states, encoder_hidden_states, past_key_values):
        query = self._heads(self.q_proj(hidden_states))
        cache = past_key_values.cross_attention_cache if past_key_values is not None else None
        if cache is not None and past_key_values.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: its keys and values are computed once.
            return query, cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        key, value = self._heads(self.kv_proj(encoder_hidden_states)).chunk(2, dim=1)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
            past_key_values.is_updated[self.layer_idx] = True
        return query, key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, hidden) -> (B, T, hidden), and the weights (B, H, T, S) under eager."""
        if self.is_cross_attention:
            query, key, value = self._cross_attention_states(hidden_states, encoder_hidden_states, past_key_values)
        elif is_paged(past_key_values):
            query, key, value = self._paged_attention_states(
                hidden_states, position_embeddings, past_key_values, kwargs
            )
        else:
            query, key, value = self._self_attention_states(hidden_states, position_embeddings, past_key_values)

        implementation = self.config._attn_implementation
        attention_interface = SCRATCH_ATTENTION_FUNCTIONS.get(implementation) or (
            ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout.p if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(*hidden_states.shape[:-1], -1)  # (B, T, H * D)
        return self.o_proj(output), weights
