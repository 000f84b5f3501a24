"""Continuous batching and packed sequences: what transformers' attention interface passes reaches every back-end.

`generate_batch` packs requests of different lengths into one row, runs their prompts in chunks next to other
requests' decoding steps, and keeps keys and values in a paged cache; each request must still get the tokens (and
log-probabilities) that `generate()` gives it alone. The small `max_batch_tokens` and `page_size` force chunked
prefills and requests spread over several pages.
"""

import pytest
import torch
from tiny_models import DECODER_VARIANTS, VOCAB, tiny_config, tiny_lm, variant_id
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from hf_scratch_transformer.scratch_masks import build_self_attention_mask
from hf_scratch_transformer.scratch_positions import ScratchAlibiBias

NEW_TOKENS = 10
# A wide initialisation, so that the tiny random model's greedy tokens vary and depend on positions.
WIDE = dict(initializer_range=0.5)


def _prompts(lengths=(3, 9, 5, 12), seed: int = 3) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (length,), generator=generator).tolist() for length in lengths]


def _generate_alone(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy tokens of `generate()` for one prompt, with the log-probability of each."""
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
        output_logits=True, return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(prompt):]
    logprobs = [step.log_softmax(-1)[0, token].item() for step, token in zip(out.logits, tokens, strict=True)]
    return tokens.tolist(), logprobs


@pytest.mark.filterwarnings(r"ignore:The `paged\|` prefix is no longer needed")  # transformers' own deprecation
@pytest.mark.parametrize("implementation", ["paged|sdpa", "paged|eager"])
@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=variant_id)
def test_generate_batch_gives_each_request_the_tokens_of_generate(variant, implementation):
    model = tiny_lm("decoder", **variant, **WIDE)
    prompts = _prompts()
    expected = [_generate_alone(model, prompt) for prompt in prompts]

    model.set_attn_implementation(implementation)
    outputs = model.generate_batch(
        prompts,
        generation_config=GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None),
        continuous_batching_config=ContinuousBatchingConfig(
            page_size=8, num_blocks=32, max_batch_tokens=16, return_logprobs=True
        ),
    )
    results = [outputs[f"req_{i}"] for i in range(len(prompts))]
    assert all(result.error is None for result in results), [result.error for result in results]
    assert [result.generated_tokens for result in results] == [tokens for tokens, _ in expected]
    for result, (_, logprobs) in zip(results, expected, strict=True):
        torch.testing.assert_close(torch.tensor(result.logprobs), torch.tensor(logprobs), atol=1e-4, rtol=1e-4)


def test_an_encoder_decoder_is_refused_continuous_batching_by_name():
    """Each request ended with an error about `decoder_input_ids`, which the user never passed."""
    model = tiny_lm("seq2seq")
    with pytest.raises(NotImplementedError, match="decoder-only models; ScratchSeq2SeqForConditionalGeneration is an "
                                                  "encoder-decoder"):
        model.generate_batch(_prompts(), generation_config=GenerationConfig(max_new_tokens=2, do_sample=False))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=variant_id)
def test_packed_sequences_equal_separate_forwards(variant, implementation):
    """Several sequences in one row, told apart by `position_ids` that restart at 0 (as transformers'
    `DataCollatorWithFlattening` packs them): each gets its own logits."""
    model = tiny_lm("decoder", attn_implementation=implementation, **variant, **WIDE)
    sequences = [torch.tensor(prompt) for prompt in _prompts((3, 9, 5))]
    separate = torch.cat([model(sequence[None], use_cache=False).logits[0] for sequence in sequences])
    position_ids = torch.cat([torch.arange(len(sequence)) for sequence in sequences])[None]
    packed = model(torch.cat(sequences)[None], position_ids=position_ids, use_cache=False).logits[0]
    torch.testing.assert_close(packed, separate, atol=1e-5, rtol=1e-5)


def test_packed_alibi_bias_counts_positions_within_each_request():
    """The bias comes from the block-diagonal mask alone: here two requests, the second with 2 cached keys."""
    alibi = ScratchAlibiBias(num_heads=1)
    min_value = torch.finfo(torch.float32).min
    visible = torch.tensor([
        [1, 0, 0, 0, 0, 0],  # request 0, position 0
        [1, 1, 0, 0, 0, 0],  # request 0, position 1
        [0, 0, 1, 1, 1, 0],  # request 1, position 2 (keys: positions 0, 1 cached, then 2 and 3)
        [0, 0, 1, 1, 1, 1],  # request 1, position 3
    ], dtype=torch.bool)
    mask = torch.where(visible, 0.0, min_value)[None, None]
    bias = alibi.packed(mask, torch.float32)[0, 0] / -alibi.slopes[0]
    expected = torch.tensor([[0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 2, 1, 0, 0], [0, 0, 3, 2, 1, 0]])
    assert torch.equal(bias.where(visible, 0).round().long(), expected)


@pytest.mark.parametrize("paged", [False, True])
def test_alibi_with_a_back_end_that_takes_no_bias_is_refused(paged):
    """Flash kernels (under continuous batching too) and serving engines' attention get no additive mask, so no
    ALiBi bias: refused, rather than wrong tokens."""
    config = tiny_config("decoder", position_embedding_type="alibi")
    config._attn_implementation = "flash_attention_2"
    embeds = torch.zeros(1, 4, config.hidden_size)
    with pytest.raises(ValueError, match="ALiBi positions .* `attn_implementation='flash_attention_2'`"):
        build_self_attention_mask(config, embeds, None, None, None, True, ScratchAlibiBias(4), paged=paged)


def test_a_registered_attention_function_gets_the_forward_kwargs(monkeypatch):
    """Non-default implementations come from `ALL_ATTENTION_FUNCTIONS` and receive what the caller passed to the
    model's forward, with `position_ids`: what vLLM-style engines and flash kernels rely on."""
    seen = []

    def recording_sdpa(module, query, key, value, attention_mask, **kwargs):
        seen.append(kwargs)
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)

    # What `AttentionInterface.register` does, undone after the test.
    monkeypatch.setitem(AttentionInterface._global_mapping, "scratch_recording", recording_sdpa)
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "scratch_recording", sdpa_mask)
    model = tiny_lm("decoder", position_embedding_type="rope", attn_implementation="scratch_recording", **WIDE)
    assert model._supports_attention_backend
    ids = torch.tensor([_prompts((6,))[0]])
    logits = model(ids, engine_marker="from the caller").logits
    assert len(seen) == model.config.num_hidden_layers
    assert all(kwargs["engine_marker"] == "from the caller" for kwargs in seen)
    assert torch.equal(seen[0]["position_ids"], torch.arange(6)[None])
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(logits, model(ids).logits)
