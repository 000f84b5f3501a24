"""`scratch_masks`: a decoding step over an unpadded dynamic cache, and unpadded cross-attention, need no mask;
every case where keys must stay hidden still gets one, and the shortcut gives the general path's outputs."""

import pytest
import torch
from tiny_models import VOCAB, tiny_config, tiny_lm
from transformers import DynamicCache, StaticCache

from hf_scratch_transformer import scratch_masks
from hf_scratch_transformer.scratch_masks import build_cross_attention_mask, build_self_attention_mask

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
