"""Attention masks, built once per stack and shared by all its layers.

The padding / causal / sliding-window patterns come from `transformers.masking_utils`, because they must agree
with the cache classes (`DynamicCache`, sliding-window and static layers size the key axis) and with what
`generate()` passes in. The functions return what the attention back-end wants: `None` when sdpa can use its
`is_causal` fast path or when nothing is masked, a boolean (batch, 1, q_len, kv_len) mask for sdpa, an additive
float mask for eager. ALiBi is folded into that same mask here, as an additive float bias per head, so the
attention functions stay unaware of it.

Masks given by the user are checked against the inputs (SPEC section 10) before anything reads them.
"""

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    create_masks_for_generate,
    create_sliding_window_causal_mask,
)

from .scratch_positions import ScratchAlibiBias

# The back-ends that add a float `attention_mask` to the scores, and with it the ALiBi bias.
ALIBI_IMPLEMENTATIONS = ("eager", "sdpa", "paged|eager")


def check_padding_mask(
    name: str,
    mask: torch.Tensor | None,
    batch_size: int,
    length: int,
    scores_shape: tuple[int, int, int, int],
    cache_length: int | None = None,
) -> None:
    """A 2D mask must be (batch, length), or (batch, cache_length) over a static cache, which holds that many keys
    (`mask_for_generate`). A prepared 4D mask reaches attention as it is (as in transformers), so it must broadcast
    to the attention scores, `scores_shape` = (batch, heads, queries, keys)."""
    if mask is None:
        return
    if mask.dim() == 4:
        if any(size not in (1, full) for size, full in zip(mask.shape, scores_shape, strict=True)):
            raise ValueError(
                f"`{name}` given as a 4D mask must broadcast to (batch_size, num_heads, query_length, key_length) = "
                f"{tuple(scores_shape)}, got {tuple(mask.shape)}."
            )
        return
    # Not while compiling or exporting: a static cache's `length` is a tensor there, unreadable (data-dependent).
    if mask.dim() != 2 or mask.shape[0] != batch_size or (
        not torch.compiler.is_compiling() and mask.shape[1] not in (length, cache_length)
    ):
        static = f" or (batch_size, {cache_length}), the static cache's length" if cache_length is not None else ""
        raise ValueError(
            f"`{name}` must have shape (batch_size, {length}) = ({batch_size}, {length}) to match the inputs "
            f"(past and current tokens){static}, got {tuple(mask.shape)}."
        )


def additive_from_boolean(mask: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as an additive one: `bias` where a query attends, the dtype's minimum where it
    does not (finite: a query with no key left softmaxes evenly, as native models do)."""
    return torch.where(mask, bias, torch.finfo(dtype).min)


def _combine_with_bias(mask: torch.Tensor | None, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive float mask = bias where attending, dtype's minimum where masked; (batch or 1, heads, q, kv)."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return additive_from_boolean(mask, bias, dtype)
    return mask.to(dtype) + bias


def _every_key_visible(config, attention_mask: torch.Tensor | None) -> bool:
    """No padding, and one of our attention functions, which take `None` for "attend to every key". `masking_utils`
    reaches the same answer through a longer path, and decoding asks on every step. Other back-ends may expect a
    mask object, so they take the general path."""
    return (
        not torch.compiler.is_compiling()  # the padding check below reads data
        and not torch.jit.is_tracing()  # a traced graph would keep the sample's answer for every mask
        and config._attn_implementation in ("sdpa", "eager")
        and (attention_mask is None or (attention_mask.dim() == 2 and bool(attention_mask.all())))
    )


def build_self_attention_mask(
    config,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    past_key_values: Cache | None,
    position_ids: torch.Tensor | None,
    is_causal: bool,
    alibi: ScratchAlibiBias | None,
    paged: bool = False,
):
    """Mask for the self-attention of every layer of one stack. inputs_embeds: (batch, q_len, hidden). `paged`:
    continuous batching, whose mask comes prepared for the keys its paged cache returns."""
    if alibi is not None and config._attn_implementation not in ALIBI_IMPLEMENTATIONS:
        # Flash and flex kernels, and serving engines' own attention, would drop the bias without a word.
        raise ValueError(
            f"ALiBi positions are a bias added to the attention scores through the mask, which "
            f"`attn_implementation={config._attn_implementation!r}` does not take; use one of "
            f"{', '.join(ALIBI_IMPLEMENTATIONS)}."
        )
    if paged:
        if alibi is None:
            return attention_mask
        bias = alibi.packed(attention_mask, inputs_embeds.dtype)
        return _combine_with_bias(attention_mask, bias, inputs_embeds.dtype)
    batch_size, q_len = inputs_embeds.shape[:2]
    past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
    # The keys attention will see: past and current tokens, or what a static / sliding-window cache holds.
    key_length = past_key_values.get_mask_sizes(q_len, 0)[0] if past_key_values is not None else q_len
    scores_shape = (batch_size, config.num_attention_heads, q_len, key_length)
    sliding_window = getattr(config, "sliding_window", None)
    dynamic_cache = past_key_values is None or not past_key_values.is_compileable
    # A static cache's length (`mask_for_generate`); a sliding window's keys are not the sequence's positions.
    static_length = key_length if not dynamic_cache and not sliding_window else None
    check_padding_mask("attention_mask", attention_mask, batch_size, past_length + q_len, scores_shape, static_length)
    # Where the kernel needs no mask, `masking_utils` would answer `None` through a longer path (about 20 us): one
    # new token over an unpadded dynamic cache sees every key, and sdpa's own causal flag is the whole mask of an
    # unpadded forward from position 0 whose positions cannot restart (training). Static and sliding-window caches
    # hold keys a query must not see; ALiBi adds its bias through the mask; given positions may mark packed sequences.
    plain = is_causal and alibi is None and not sliding_window and dynamic_cache
    if plain and _every_key_visible(config, attention_mask):
        from_start = past_length == 0 and position_ids is None and config._attn_implementation == "sdpa"
        if q_len == 1 or from_start:  # (past_length is a tensor while compiling: read only after the check above)
            return None
    skip_allowed = alibi is None  # ALiBi needs a materialised mask to add its bias to.
    if is_causal:
        builder = create_sliding_window_causal_mask if sliding_window else create_causal_mask
        # The cache goes by position: transformers 5.24 renamed the parameter `cache` (the old name warns).
        mask = builder(
            config, inputs_embeds, attention_mask, past_key_values, position_ids, allow_is_causal_skip=skip_allowed
        )
    else:
        # Given positions that restart mark packed sequences here too, from transformers 5.25 on (as in BERT's
        # encoder; 5.23-5.24 take the argument and let every token see every other, as their BERT does).
        mask = create_bidirectional_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            allow_is_bidirectional_skip=skip_allowed,
            position_ids=position_ids,
        )
    if alibi is None:
        return mask
    if past_key_values is not None:
        self_cache = (
            past_key_values.self_attention_cache
            if isinstance(past_key_values, EncoderDecoderCache)
            else past_key_values
        )
        kv_len, kv_offset = self_cache.get_mask_sizes(q_len, 0)
        q_offset = self_cache.get_query_offset(0)
    else:
        kv_len, kv_offset, q_offset = q_len if mask is None else mask.shape[-1], 0, 0
    bias = alibi(q_len, kv_len, q_offset, kv_offset, inputs_embeds.dtype)
    return _combine_with_bias(mask, bias, inputs_embeds.dtype)


def mask_for_generate(config, inputs_embeds, attention_mask, cache=None, position_ids=None, *, past_key_values=None,
                      **kwargs):
    """The self-attention mask `generate()` passes our forward over a static cache (as a model's
    `create_masks_for_generate`, which transformers calls at every step). transformers builds the 4D mask there,
    outside the compiled step, token after token (compiled CPU decoding ran 1.02-1.05x faster without it: Intel Xeon,
    docs/performance.md, "Compiled decoding's own overhead"). Our stack builds
    the same mask from the 2D one (`build_self_attention_mask`), inside the step where inductor fuses it, so the 2D
    mask goes on, padded to the cache's length as `masking_utils` pads it: a shape fixed for the whole generation, so
    the step compiles once. A sliding window (whose key span moves), and attention back-ends other than ours, take
    transformers' 4D mask. inputs_embeds: (batch, q_len, 0), only its sizes are read; attention_mask: (batch, past
    + q_len) or None -> (batch, cache length) or None. transformers before 5.24 passes the cache as `past_key_values`
    (transformers' function takes it by position under either name)."""
    cache = cache if cache is not None else past_key_values
    key_length, key_offset = cache.get_mask_sizes(inputs_embeds.shape[1], 0)
    padding = key_length + key_offset - (attention_mask.shape[-1] if attention_mask is not None else 0)
    if getattr(config, "sliding_window", None) or config._attn_implementation not in ("sdpa", "eager") or padding < 0:
        return create_masks_for_generate(config, inputs_embeds, attention_mask, cache, position_ids, **kwargs)
    return attention_mask if attention_mask is None else F.pad(attention_mask, (0, padding))


def build_cross_attention_mask(
    config,
    inputs_embeds: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor | None,
):
    """Mask over the encoder's tokens for every cross-attention layer: padding only. A 2D mask is the source's, one
    row per encoder output: one source may serve several decoder rows (broadcast, as in Marian)."""
    batch_size, q_len, key_length = inputs_embeds.shape[0], inputs_embeds.shape[1], encoder_hidden_states.shape[1]
    scores_shape = (batch_size, config.num_attention_heads, q_len, key_length)
    check_padding_mask(
        "encoder_attention_mask", encoder_attention_mask, encoder_hidden_states.shape[0], key_length, scores_shape
    )
    if _every_key_visible(config, encoder_attention_mask):
        return None
    return create_bidirectional_mask(
        config=config,
        inputs_embeds=inputs_embeds,
        attention_mask=encoder_attention_mask,
        encoder_hidden_states=encoder_hidden_states,
    )
