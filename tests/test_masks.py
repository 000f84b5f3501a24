"""`scratch_masks`: a decoding step over an unpadded dynamic cache, and unpadded cross-attention, need no mask;
every case where keys must stay hidden still gets one, and the shortcut gives the general path's outputs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import DECODER_VARIANTS, PAD, POSITION_VARIANTS, VOCAB, tiny_config, tiny_lm
from transformers import DynamicCache, StaticCache
from transformers.masking_utils import create_masks_for_generate

from hf_scratch_transformer import scratch_masks
from hf_scratch_transformer.scratch_masks import (
    build_cross_attention_mask,
    build_self_attention_mask,
    mask_for_generate,
)
from hf_scratch_transformer.scratch_positions import ScratchAlibiBias

HIDDEN = 32


def _decoding_mask(past: int = 5, padded: bool = False, cache: str = "dynamic", implementation: str = "sdpa",
                   **overrides):
    config = tiny_config("decoder", **overrides)
    config._attn_implementation = implementation
    if cache == "dynamic":
        past_key_values = DynamicCache(config=config)
    else:
        past_key_values = StaticCache(config=config, max_cache_len=16)
    keys = torch.zeros(1, config.num_key_value_heads, past, config.head_dim)
    for layer in range(config.num_hidden_layers):
        past_key_values.update(keys, keys, layer)
    attention_mask = torch.ones(1, past + 1, dtype=torch.long)
    attention_mask[0, 0] = 0 if padded else 1
    return build_self_attention_mask(config, torch.zeros(1, 1, HIDDEN), attention_mask, past_key_values,
                                     torch.tensor([[past]]), is_causal=True, alibi=None)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_decoding_step_over_an_unpadded_dynamic_cache_has_no_mask(implementation):
    assert _decoding_mask(implementation=implementation) is None


@pytest.mark.parametrize("case", [dict(padded=True), dict(cache="static")])
def test_decoding_steps_with_hidden_keys_keep_a_mask(case):
    mask = _decoding_mask(**case)
    assert mask is not None and not bool(mask.all())


def test_sliding_window_takes_the_general_path():
    assert _decoding_mask(sliding_window=3) is not None  # masking_utils sizes the window's keys


def test_cross_attention_mask_only_with_padding():
    config = tiny_config("seq2seq")
    config._attn_implementation = "sdpa"
    decoder_states, encoder_states = torch.zeros(2, 3, HIDDEN), torch.zeros(2, 4, HIDDEN)
    assert build_cross_attention_mask(config, decoder_states, encoder_states, torch.ones(2, 4)) is None
    padded = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    mask = build_cross_attention_mask(config, decoder_states, encoder_states, padded)
    assert mask is not None and not bool(mask[1, ..., 2:].any())


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_shortcut_gives_the_general_paths_logits(family, monkeypatch):
    """The same cached decoding step, once through the shortcut and once with it disabled."""
    model = tiny_lm(family)
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    decoder_ids = ids[:, :3] if family == "seq2seq" else ids

    def step():
        inputs = {"input_ids": ids} if family == "seq2seq" else {}
        first = model(**inputs, **{"decoder_input_ids" if family == "seq2seq" else "input_ids": decoder_ids},
                      use_cache=True)
        next_ids = first.logits[:, -1:].argmax(-1)
        key = "decoder_input_ids" if family == "seq2seq" else "input_ids"
        mask_key = "decoder_attention_mask" if family == "seq2seq" else "attention_mask"
        return model(**inputs, **{key: next_ids, mask_key: torch.ones(2, decoder_ids.shape[1] + 1)},
                     past_key_values=first.past_key_values, use_cache=True).logits

    with torch.no_grad():
        shortcut = step()
        monkeypatch.setattr(scratch_masks, "_every_key_visible", lambda config, mask: False)
        general = step()
    torch.testing.assert_close(shortcut, general, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_given_positions_that_restart_keep_packed_sequences_apart(implementation):
    """Given position ids that restart mark packed sequences (`masking_utils` masks across them, without a cache);
    the stack's own positions never restart, so only given ones are searched."""
    model = tiny_lm("decoder", attn_implementation=implementation)
    first, second = torch.randint(3, VOCAB, (1, 3)), torch.randint(3, VOCAB, (1, 4))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        packed = model(input_ids=torch.cat([first, second], 1), position_ids=positions, use_cache=False).logits
        alone = model(input_ids=second).logits
    torch.testing.assert_close(packed[:, 3:], alone, atol=1e-5, rtol=1e-5)


def _static_cache(config, past: int, max_cache_len: int = 16) -> StaticCache:
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    keys = torch.zeros(1, config.num_key_value_heads, past, config.head_dim)
    for layer in range(config.num_hidden_layers):
        cache.update(keys, keys, layer)
    return cache


@settings(max_examples=30, deadline=None)
@given(past=st.integers(0, 12), padding=st.integers(0, 4), query=st.integers(1, 3),
       implementation=st.sampled_from(["sdpa", "eager"]), alibi=st.booleans())
def test_generate_passes_a_static_cache_the_2d_mask_that_builds_transformers_mask(past, padding, query,
                                                                                   implementation, alibi):
    """Over a static cache `generate()` asks the model for its mask (`create_masks_for_generate`); ours is the 2D mask
    padded to the cache's length, a shape fixed for the whole generation, from which the stack builds the mask that
    transformers' 4D one gives: the same keys hidden, for any padding, cache fill and query length."""
    config = tiny_config("decoder", position_embedding_type="alibi" if alibi else "learned")
    config._attn_implementation = implementation
    cache = _static_cache(config, past)
    attention_mask = torch.ones(1, past + query, dtype=torch.long)
    attention_mask[0, : min(padding, past)] = 0
    embeds = torch.zeros(1, query, HIDDEN)
    ours = mask_for_generate(config, torch.empty(1, query, 0), attention_mask, cache)
    assert ours.shape == (1, 16) and torch.equal(ours[:, : past + query], attention_mask)
    assert not ours[:, past + query :].any()
    transformers_mask = create_masks_for_generate(config, torch.empty(1, query, 0), attention_mask, cache)
    bias = ScratchAlibiBias(config.num_attention_heads) if alibi else None
    built = build_self_attention_mask(config, embeds, ours, cache, None, is_causal=True, alibi=bias)
    expected = build_self_attention_mask(config, embeds, transformers_mask, cache, None, is_causal=True, alibi=bias)
    torch.testing.assert_close(built, expected, atol=0, rtol=0)


def test_generate_of_transformers_before_5_24_passes_the_cache_as_past_key_values():
    """transformers 5.23's `generate()` calls `create_masks_for_generate(..., past_key_values=cache)`."""
    config = tiny_config("decoder")
    config._attn_implementation = "sdpa"
    cache, attention_mask = _static_cache(config, 5), torch.ones(1, 6, dtype=torch.long)
    by_new_name = mask_for_generate(config, torch.empty(1, 1, 0), attention_mask, cache=cache)
    by_old_name = mask_for_generate(config, torch.empty(1, 1, 0), attention_mask, past_key_values=cache)
    assert by_new_name.shape == (1, 16) and torch.equal(by_old_name, by_new_name)


def test_generate_without_a_mask_over_a_static_cache_leaves_it_to_the_stack():
    """A decoder's steps in an encoder-decoder `generate()` come without a mask: none is built outside the step."""
    config = tiny_config("seq2seq")
    config._attn_implementation = "sdpa"
    assert mask_for_generate(config, torch.empty(1, 1, 0), None, _static_cache(config, 3)) is None


@pytest.mark.parametrize("case", [dict(sliding_window=3), dict(implementation="flex_attention")])
def test_generate_takes_transformers_mask_for_a_sliding_window_or_another_back_end(case):
    """A sliding window's keys move along the cache (a 2D mask of fixed length cannot follow them); other back-ends
    may want a mask object of their own."""
    config = tiny_config("decoder", **{key: value for key, value in case.items() if key != "implementation"})
    config._attn_implementation = case.get("implementation", "sdpa")
    cache = _static_cache(config, 5)
    mask = mask_for_generate(config, torch.empty(1, 1, 0), torch.ones(1, 6, dtype=torch.long), cache)
    assert not isinstance(mask, torch.Tensor) or mask.dim() == 4


def test_a_2d_mask_of_neither_the_inputs_nor_the_static_caches_length_is_refused():
    config = tiny_config("decoder")
    config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match=r"\(batch_size, 6\).* or \(batch_size, 16\), the static cache's length, got"):
        build_self_attention_mask(config, torch.zeros(1, 1, HIDDEN), torch.ones(1, 9), _static_cache(config, 5), None,
                                  is_causal=True, alibi=None)


def test_a_2d_mask_of_a_sliding_windows_length_is_refused():
    """A sliding window's cache holds the last keys, not the sequence's first positions: a 2D mask of its length
    would mark the wrong tokens, so only the inputs' length is accepted there."""
    config = tiny_config("decoder", sliding_window=4)
    config._attn_implementation = "sdpa"
    cache = _static_cache(config, 7)
    key_length = cache.get_mask_sizes(1, 0)[0]
    assert key_length != 8
    with pytest.raises(ValueError, match=r"\(batch_size, 8\).*the inputs \(past and current tokens\), got"):
        build_self_attention_mask(config, torch.zeros(1, 1, HIDDEN), torch.ones(1, key_length), cache, None,
                                  is_causal=True, alibi=None)


def _padded(rows: list[torch.Tensor], side: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rows` of ids padded to one length on `side`: ids, attention mask and positions counted over the real tokens
    (as `generate` makes them; the padding's are any)."""
    width = max(len(row) for row in rows)
    real = torch.stack([torch.arange(width) < len(row) for row in rows])
    real = real.flip(-1) if side == "left" else real
    ids = torch.full(real.shape, PAD)
    ids[real] = torch.cat(rows)
    mask = real.long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


# Each family with each position scheme and head grouping it takes; the decoder also with sliding windows.
FAMILY_VARIANTS = [("decoder", variant) for variant in DECODER_VARIANTS] + [
    (family, variant) for family in ("encoder", "seq2seq") for variant in POSITION_VARIANTS]


@settings(max_examples=30, deadline=None)
@given(case=st.sampled_from(FAMILY_VARIANTS),
       lengths=st.lists(st.tuples(st.integers(1, 7), st.integers(1, 5)), min_size=2, max_size=3),
       side=st.sampled_from(["left", "right"]), implementation=st.sampled_from(["sdpa", "eager"]))
def test_a_rows_outputs_do_not_depend_on_the_other_rows_padding(case, lengths, side, implementation):
    """Batch invariance: each row of a batch padded on either side (positions from the mask, as `generate` gives
    them) has at its real tokens the logits it has alone, for every family, position scheme and sliding window;
    a padding key attended to, or a mask broadcast over the wrong axis, moves them."""
    family, variant = case
    model = tiny_lm(family, **variant, attn_implementation=implementation)
    generator = torch.Generator().manual_seed(sum(length for pair in lengths for length in pair))
    sources = [torch.randint(3, VOCAB, (length,), generator=generator) for length, _ in lengths]
    targets = [torch.randint(3, VOCAB, (length,), generator=generator) for _, length in lengths]

    def real_logits(sources: list[torch.Tensor], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each row's logits at its real tokens (the target's for seq2seq), the rows padded into one batch."""
        ids, mask, positions = _padded(sources, side)
        inputs = dict(input_ids=ids, attention_mask=mask, position_ids=positions)
        if family == "seq2seq":
            ids, mask, positions = _padded(targets, side)
            inputs |= dict(decoder_input_ids=ids, decoder_attention_mask=mask, decoder_position_ids=positions)
        with torch.no_grad():
            logits = model(**inputs).logits
        return [row_logits[real] for row_logits, real in zip(logits, mask.bool(), strict=True)]

    batch = real_logits(sources, targets)
    for row, (source, target) in enumerate(zip(sources, targets, strict=True)):
        torch.testing.assert_close(batch[row], real_logits([source], [target])[0], atol=1e-5, rtol=1e-5,
                                   msg=lambda message, row=row: f"row {row}: {message}")
