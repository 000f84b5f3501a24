"""`generate()` with the transformers caches: the same tokens with and without the cache, left-padded batches,
a hand-written argmax loop, beam search, sampling, EOS, static caches; and the generation conformance checks
that upstream's `GenerationTesterMixin` would make (it is not in the PyPI sdist)."""

import itertools

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tiny_models import BOS, DECODER_VARIANTS, EOS, PAD, POSITION_VARIANTS, VOCAB, tiny_lm, variant_id
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig, StaticCache


def _prompt(length: int = 5, batch: int = 1, seed: int = 3) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _greedy(model, inputs: dict, **kwargs) -> torch.Tensor:
    kwargs = {"max_new_tokens": 8, "do_sample": False, "eos_token_id": None, **kwargs}
    return model.generate(**inputs, **kwargs)


# ---------------------------------------------------------------------------------------------- cache


@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=variant_id)
def test_decoder_cached_and_uncached_decoding_agree(variant):
    model = tiny_lm("decoder", **variant)
    inputs = {"input_ids": _prompt(batch=2)}
    cached = _greedy(model, inputs, max_new_tokens=10)
    assert torch.equal(cached, _greedy(model, inputs, max_new_tokens=10, use_cache=False))


@pytest.mark.parametrize("variant", POSITION_VARIANTS, ids=variant_id)
def test_seq2seq_cached_and_uncached_decoding_agree(variant):
    model = tiny_lm("seq2seq", **variant)
    inputs = {"input_ids": _prompt(batch=2)}
    assert torch.equal(_greedy(model, inputs), _greedy(model, inputs, use_cache=False))


@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=variant_id)
def test_cached_step_logits_equal_a_full_forward(variant):
    """Logits of each cached decoding step equal those of a full forward over the whole sequence."""
    model = tiny_lm("decoder", **variant)
    ids = _prompt(length=9, batch=2)
    full = model(input_ids=ids).logits
    cache = DynamicCache(config=model.config)
    prefix = model(input_ids=ids[:, :5], past_key_values=cache, use_cache=True).logits
    steps = [model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(5, 9)]
    torch.testing.assert_close(torch.cat([prefix, *steps], dim=1), full, atol=1e-5, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(variant=st.sampled_from(DECODER_VARIANTS), padding=st.lists(st.integers(0, 6), min_size=1, max_size=3),
       hole=st.booleans(), cache_implementation=st.sampled_from(["dynamic", "static"]),
       prefill_chunk_size=st.sampled_from([None, 3]), attn_implementation=st.sampled_from(["sdpa", "eager"]))
def test_generated_logits_equal_a_full_forward_over_any_padding(variant, padding, hole, cache_implementation,
                                                                prefill_chunk_size, attn_implementation):
    """Each step's logits in `generate` (left padding of any width per row, optionally a masked token inside the
    prompt, chunked prefill) equal those of one uncached forward over the whole sequence, positions from the mask."""
    model = tiny_lm("decoder", **variant, attn_implementation=attn_implementation)
    ids = _prompt(length=7, batch=len(padding))
    mask = (torch.arange(7)[None] >= torch.tensor(padding)[:, None]).long()
    if hole:
        mask[:, 5] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None,
                         return_dict_in_generate=True, output_logits=True, cache_implementation=cache_implementation,
                         prefill_chunk_size=prefill_chunk_size)
    full_mask = torch.cat([mask, torch.ones_like(out.sequences[:, 7:])], dim=1)
    positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 1)  # as `generate` makes them
    with torch.no_grad():
        full = model(input_ids=out.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False)
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full.logits[:, 6:-1], atol=1e-5, rtol=1e-5)


@settings(max_examples=50, deadline=None)
@given(variant=st.sampled_from(DECODER_VARIANTS), chunks=st.lists(st.integers(1, 6), min_size=1, max_size=5),
       padding=st.just([0]) | st.lists(st.integers(0, 3), min_size=1, max_size=2),
       cache_implementation=st.sampled_from(["dynamic", "static"]),
       attn_implementation=st.sampled_from(["sdpa", "eager"]))
@example(variant=DECODER_VARIANTS[-2], chunks=[6, 1, 5], padding=[0], cache_implementation="dynamic",
         attn_implementation="sdpa")  # chunks longer than the window, the first from position 0
@example(variant=DECODER_VARIANTS[-1], chunks=[2, 5, 1], padding=[0, 2], cache_implementation="static",
         attn_implementation="eager")
def test_a_sequence_fed_through_the_cache_in_any_chunks_gives_the_full_forwards_logits(
        variant, chunks, padding, cache_implementation, attn_implementation):
    """A left-padded batch fed through a dynamic or static cache in chunks of any sizes (a prefill cut anywhere, then
    several tokens at once, as assisted decoding feeds them), also chunks longer than a sliding window, has at every
    step the logits of one uncached forward over the whole sequence."""
    model = tiny_lm("decoder", **variant, attn_implementation=attn_implementation)
    length = max(padding) + sum(chunks)
    mask = (torch.arange(length)[None] >= torch.tensor(padding)[:, None]).long()
    ids = _prompt(length=length, batch=len(padding)).masked_fill(mask == 0, PAD)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if cache_implementation == "static":
        cache = StaticCache(config=model.config, max_cache_len=length + 3)  # free slots until the end, as generate's
    else:
        cache = DynamicCache(config=model.config)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        stepped, start = [], 0
        for end in itertools.accumulate([max(padding) + chunks[0], *chunks[1:]]):
            # Unpadded, the stack counts the positions on from the cache's length itself
            chunk_positions = positions[:, start:end] if any(padding) else None
            stepped.append(model(input_ids=ids[:, start:end], attention_mask=mask[:, :end],
                                 position_ids=chunk_positions, cache=cache, use_cache=True).logits)
            start = end
    real = mask.bool()  # a padding query's logits are any
    torch.testing.assert_close(torch.cat(stepped, dim=1)[real], full[real], atol=1e-5, rtol=1e-5)


def test_generate_returns_the_native_cache_classes():
    decoder_out = tiny_lm("decoder").generate(_prompt(), max_new_tokens=2, return_dict_in_generate=True)
    assert isinstance(decoder_out.past_key_values, DynamicCache)
    seq2seq_out = tiny_lm("seq2seq").generate(_prompt(), max_new_tokens=2, return_dict_in_generate=True)
    assert isinstance(seq2seq_out.past_key_values, EncoderDecoderCache)
    assert seq2seq_out.past_key_values.self_attention_cache.get_seq_length() == seq2seq_out.sequences.shape[1] - 1


def test_sliding_window_cache_keeps_only_the_window():
    model = tiny_lm("decoder", position_embedding_type="rope", sliding_window=4)
    out = model.generate(_prompt(length=6), max_new_tokens=6, return_dict_in_generate=True, do_sample=False)
    keys = out.past_key_values.layers[0].keys
    assert keys.shape[-2] < out.sequences.shape[1]


def test_gqa_cache_stores_only_the_key_value_heads():
    model = tiny_lm("decoder", num_key_value_heads=1)
    out = model.generate(_prompt(), max_new_tokens=2, return_dict_in_generate=True)
    assert out.past_key_values.layers[0].keys.shape[1] == 1


# ---------------------------------------------------------------------------------------------- padding


@pytest.mark.parametrize("variant", DECODER_VARIANTS, ids=variant_id)
def test_left_padded_batch_gives_each_prompts_tokens(variant):
    model = tiny_lm("decoder", **variant)
    prompts = [_prompt(length=6, seed=1)[0], _prompt(length=3, seed=2)[0]]
    width = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.full((width - len(p),), PAD), p]) for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([[width - len(p)] for p in prompts])).long()
    batch = _greedy(model, {"input_ids": ids, "attention_mask": mask})
    for row, prompt in enumerate(prompts):
        alone = _greedy(model, {"input_ids": prompt[None]})
        assert torch.equal(batch[row, width:], alone[0, len(prompt):]), row


@pytest.mark.parametrize("variant", POSITION_VARIANTS, ids=variant_id)
def test_right_padded_source_batch_gives_each_sources_tokens(variant):
    model = tiny_lm("seq2seq", **variant)
    sources = [_prompt(length=6, seed=1)[0], _prompt(length=3, seed=2)[0]]
    ids = torch.stack([torch.cat([s, torch.full((6 - len(s),), PAD)]) for s in sources])
    batch = _greedy(model, {"input_ids": ids, "attention_mask": (ids != PAD).long()})
    for row, source in enumerate(sources):
        assert torch.equal(batch[row], _greedy(model, {"input_ids": source[None]})[0]), row


# ---------------------------------------------------------------------------------------------- strategies


def test_greedy_generate_equals_a_hand_written_argmax_loop():
    model = tiny_lm("decoder", position_embedding_type="rope")
    ids = _prompt()
    expected = ids
    for _ in range(8):
        next_token = model(input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, next_token], dim=1)
    assert torch.equal(_greedy(model, {"input_ids": ids}), expected)


def test_seq2seq_greedy_generate_equals_a_hand_written_argmax_loop():
    model = tiny_lm("seq2seq")
    source = _prompt()
    expected = torch.tensor([[model.config.decoder_start_token_id]])
    for _ in range(8):
        next_token = model(input_ids=source, decoder_input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)
        expected = torch.cat([expected, next_token], dim=1)
    assert torch.equal(_greedy(model, {"input_ids": source}), expected)


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_beam_search_with_length_penalty_and_several_sequences(family):
    model = tiny_lm(family, position_embedding_type="rope")
    inputs = {"input_ids": _prompt(batch=2)}
    kwargs = dict(num_beams=4, num_return_sequences=3, length_penalty=0.6, max_new_tokens=6, do_sample=False,
                  early_stopping=True, output_scores=True, return_dict_in_generate=True)
    out = model.generate(**inputs, **kwargs)
    assert out.sequences.shape[0] == 6
    assert out.sequences_scores.shape == (6,)
    uncached = model.generate(**inputs, **kwargs, use_cache=False)
    assert torch.equal(out.sequences, uncached.sequences)
    # the best beam scores at least as well as greedy's sequence under the same length penalty
    assert torch.all(out.sequences_scores.view(2, 3)[:, 0] >= out.sequences_scores.view(2, 3)[:, 1])


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
@pytest.mark.parametrize("sampling", [dict(temperature=0.7), dict(top_k=5), dict(top_p=0.8), dict(top_k=10, top_p=0.9)])
def test_sampling_is_reproducible_and_cache_independent(family, sampling):
    model = tiny_lm(family)
    inputs = {"input_ids": _prompt(batch=2)}
    runs = []
    for use_cache in (True, True, False):
        torch.manual_seed(7)
        runs.append(model.generate(**inputs, do_sample=True, max_new_tokens=8, use_cache=use_cache, **sampling))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_top_k_one_is_greedy():
    model = tiny_lm("decoder")
    inputs = {"input_ids": _prompt()}
    assert torch.equal(model.generate(**inputs, do_sample=True, top_k=1, max_new_tokens=8), _greedy(model, inputs))


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_generation_stops_at_eos(family):
    model = tiny_lm(family)
    inputs = {"input_ids": _prompt()}
    free = _greedy(model, inputs, max_new_tokens=12)
    start = inputs["input_ids"].shape[1] if family == "decoder" else 1
    stop_token = free[0, start + 3].item()
    first = (free[0, start:] == stop_token).nonzero()[0].item()
    stopped = _greedy(model, inputs, max_new_tokens=12, eos_token_id=stop_token)
    assert stopped.shape[1] == start + first + 1
    assert stopped[0, -1] == stop_token


def test_max_new_tokens_is_honoured():
    out = _greedy(tiny_lm("decoder"), {"input_ids": _prompt(length=4)}, max_new_tokens=5)
    assert out.shape == (1, 9)


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_generating_past_the_absolute_positions_names_the_generation_lengths(family):
    """A short prompt with too many new tokens runs out of learned positions part-way: the error must point at the
    length asked of `generate()`, not only tell the user to shorten an input of 5 tokens. Prompt-lookup decoding
    (transformers) verifies drafts past `max_length`, so even a `max_length` within the table can run out."""
    model = tiny_lm(family, position_embedding_type="learned")  # 64 positions
    with pytest.raises(ValueError, match=r"reaches position 64.*`max_new_tokens`"):
        _greedy(model, {"input_ids": _prompt()}, max_new_tokens=70)
    if family == "decoder":
        repetitive = torch.cat([_prompt(length=20)] * 3, dim=1)
        with pytest.raises(ValueError, match="`prompt_lookup_num_tokens`"):
            _greedy(model, {"input_ids": repetitive}, max_length=64, prompt_lookup_num_tokens=10)


# ---------------------------------------------------------------------------------------------- static cache


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
@pytest.mark.parametrize("variant", POSITION_VARIANTS, ids=variant_id)
def test_static_cache_gives_the_dynamic_caches_tokens(family, variant):
    model = tiny_lm(family, **variant)
    inputs = {"input_ids": _prompt(batch=2)}
    assert torch.equal(_greedy(model, inputs, cache_implementation="static"), _greedy(model, inputs))


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_a_static_cache_generation_may_use_every_absolute_position(family):
    """The check of each step's last position (made before a static cache's step, which may run compiled) lets the
    steps reach the table's last position, 63 of 64, as the dynamic cache does: one new token more than the
    positions, since the last token generated is never fed back."""
    model = tiny_lm(family, position_embedding_type="learned")  # 64 positions
    fed = 5 if family == "decoder" else 1  # the prompt, or the decoder's start token
    inputs = {"input_ids": _prompt()}
    static = _greedy(model, inputs, max_new_tokens=65 - fed, cache_implementation="static")
    assert static.shape[-1] == 65 and torch.equal(static, _greedy(model, inputs, max_new_tokens=65 - fed))


def test_static_cache_with_left_padding():
    model = tiny_lm("decoder", position_embedding_type="rope")
    ids = torch.cat([torch.full((1, 2), PAD), _prompt(length=4)], dim=1)
    mask = (ids != PAD).long()
    static = _greedy(model, {"input_ids": ids, "attention_mask": mask}, cache_implementation="static")
    assert torch.equal(static[0, 6:], _greedy(model, {"input_ids": _prompt(length=4)})[0, 4:])


def test_static_cache_object_can_be_passed_in():
    model = tiny_lm("decoder")
    cache = StaticCache(config=model.config, max_cache_len=32)
    out = model.generate(_prompt(), past_key_values=cache, max_new_tokens=5, do_sample=False)
    assert torch.equal(out, _greedy(model, {"input_ids": _prompt()}, max_new_tokens=5))


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_a_static_cache_too_small_for_the_generation_is_refused_by_name(family):
    """Past its last slot transformers' cache raised IndexError from `index_copy_` (a device-side assert on a GPU),
    native models too; a cache that holds every token the steps feed in (all but the last generated) is enough."""
    model = tiny_lm(family)
    inputs = {"input_ids": _prompt()}
    fed = 5 + 8 - 1 if family == "decoder" else 1 + 8 - 1  # the prompt (seq2seq: the start token) and 7 new tokens
    config = model.config.get_text_config(decoder=True)

    def cache(length: int):
        static = StaticCache(config=config, max_cache_len=length)
        if family == "seq2seq":  # the cross-attention cache holds the 5 source tokens
            return EncoderDecoderCache(static, StaticCache(config=config, max_cache_len=5))
        return static

    assert torch.equal(_greedy(model, inputs, past_key_values=cache(fed)), _greedy(model, inputs))
    with pytest.raises(ValueError, match=f"holds {fed - 1} tokens .max_cache_len. and this decoding step needs {fed}"):
        _greedy(model, inputs, past_key_values=cache(fed - 1))


# ---------------------------------------------------------------------------------------------- conformance


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_dict_outputs_with_scores_logits_and_hidden_states(family):
    model = tiny_lm(family, attn_implementation="eager")
    prompt = _prompt(batch=2)
    out = model.generate(input_ids=prompt, max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                         output_scores=True, output_logits=True, output_attentions=True, output_hidden_states=True)
    assert len(out.scores) == len(out.logits) == 4
    assert out.scores[0].shape == (2, VOCAB)
    # greedy picks the argmax of each step's scores
    new_tokens = out.sequences[:, -4:]
    assert torch.equal(torch.stack(out.scores, 1).argmax(-1), new_tokens)
    attentions = out.attentions if family == "decoder" else out.decoder_attentions
    assert len(attentions) == 4 and len(attentions[0]) == 2


def test_continuing_from_a_returned_cache_equals_one_long_generation():
    model = tiny_lm("decoder", position_embedding_type="rope")
    prompt = _prompt()
    first = model.generate(input_ids=prompt, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    continued = model.generate(input_ids=first.sequences, past_key_values=first.past_key_values,
                               max_new_tokens=4, do_sample=False)
    assert torch.equal(continued, _greedy(model, {"input_ids": prompt}))


def test_seq2seq_continuing_from_a_returned_cache():
    model = tiny_lm("seq2seq")
    source = _prompt()
    first = model.generate(input_ids=source, max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    continued = model.generate(input_ids=source, decoder_input_ids=first.sequences,
                               past_key_values=first.past_key_values, max_new_tokens=4, do_sample=False)
    assert torch.equal(continued, _greedy(model, {"input_ids": source}))


@pytest.mark.parametrize("cache", [DynamicCache, lambda config: StaticCache(config=config, max_cache_len=16)])
def test_seq2seq_given_a_decoder_only_cache_names_the_cache_it_needs(cache):
    """An encoder-decoder keeps its self- and cross-attention keys apart (`EncoderDecoderCache`). Given one plain
    cache, as a decoder-only model takes it, the decoder failed deep in its cross-attention with "'DynamicCache'
    object has no attribute 'cross_attention_cache'"; native Marian stores both kinds in it (logits 5 apart)."""
    model = tiny_lm("seq2seq")
    ids = _prompt()
    with pytest.raises(ValueError, match="`EncoderDecoderCache`.*got a (DynamicCache|StaticCache)"):
        _greedy(model, {"input_ids": ids}, past_key_values=cache(config=model.config))
    with pytest.raises(ValueError, match="`EncoderDecoderCache`"):
        model(input_ids=ids, decoder_input_ids=ids[:, :2], past_key_values=cache(config=model.config), use_cache=True)
    given = EncoderDecoderCache(DynamicCache(), DynamicCache())
    assert torch.equal(_greedy(model, {"input_ids": ids}, past_key_values=given), _greedy(model, {"input_ids": ids}))


def test_one_padded_source_serves_several_decoder_rows():
    """One source with its mask and several decoder prompts (scoring candidate translations): the encoder output
    broadcasts over the decoder's rows, as in Marian. With a mask ours refused it: "`encoder_attention_mask` must
    have shape (batch_size, 7) = (2, 7) ..., got (1, 7)"; the other way round it named that mask too."""
    model = tiny_lm("seq2seq")
    source = _prompt(length=7)
    mask = torch.ones_like(source)
    mask[:, -2:] = 0
    source = source.masked_fill(mask == 0, PAD)
    targets = torch.cat([torch.full((2, 1), BOS), _prompt(length=3, batch=2, seed=4)], dim=1)
    one = {"input_ids": source, "attention_mask": mask}
    repeated = {"input_ids": source.expand(2, -1), "attention_mask": mask.expand(2, -1)}
    torch.testing.assert_close(model(**one, decoder_input_ids=targets).logits,
                               model(**repeated, decoder_input_ids=targets).logits)
    greedy = [_greedy(model, inputs, decoder_input_ids=targets) for inputs in (one, repeated)]
    assert torch.equal(*greedy)
    # Two sources and one decoder row: a shape error from inside cross-attention (Marian's too), now named.
    with pytest.raises(ValueError, match="`decoder_input_ids` hold 1 sequences and the encoder output 2"):
        model(**repeated, decoder_input_ids=targets[:1])


def test_seq2seq_continuing_from_a_returned_cache_runs_only_what_it_lacks():
    """`decoder_input_ids` holding a returned cache's tokens and more (a next turn) give the uncached logits: without
    a `decoder_attention_mask`, transformers fed them whole on top of the cache (the cached prefix twice; greedy's
    tokens from a tiny model hid it, its logits were 0.1 off). Native Marian does the same."""
    model = tiny_lm("seq2seq")
    source = _prompt()
    first = model.generate(input_ids=source, max_new_tokens=3, do_sample=False, eos_token_id=None,
                           return_dict_in_generate=True)
    kwargs = dict(input_ids=source, decoder_input_ids=torch.cat([first.sequences, _prompt(length=2)], dim=1),
                  max_new_tokens=3, do_sample=False, eos_token_id=None, return_dict_in_generate=True,
                  output_logits=True)
    continued = model.generate(**kwargs, past_key_values=first.past_key_values)
    uncached = model.generate(**kwargs, use_cache=False)
    torch.testing.assert_close(torch.stack(continued.logits), torch.stack(uncached.logits), atol=1e-5, rtol=1e-5)
    assert continued.past_key_values.get_seq_length() == continued.sequences.shape[1] - 1


def test_seq2seq_assistant_continues_its_cache_without_running_it_again():
    """An assistant drafts each round from its cache, cropped to the accepted tokens, and the whole sequence: it
    ran all of it again on top of the cache (drafts from a corrupt cache, fewer of them accepted)."""
    model = tiny_lm("seq2seq")
    assistant = tiny_lm("seq2seq")
    assistant.generation_config.update(assistant_confidence_threshold=0.0, num_assistant_tokens=4,
                                       num_assistant_tokens_schedule="constant")
    reach = []  # the cached and new decoder tokens of each of the assistant's forwards

    def record(_, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.24 names it `cache`
        reach.append(cache.get_seq_length() + kwargs["decoder_input_ids"].shape[1])

    assistant.register_forward_pre_hook(record, with_kwargs=True)
    out = _greedy(model, {"input_ids": _prompt()}, max_new_tokens=12, assistant_model=assistant)
    assert torch.equal(out, _greedy(model, {"input_ids": _prompt()}, max_new_tokens=12))
    assert max(reach) < out.shape[1]


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_generate_from_inputs_embeds(family):
    model = tiny_lm(family)
    ids = _prompt()
    embeds = model.get_input_embeddings()(ids)
    from_embeds = model.generate(inputs_embeds=embeds, max_new_tokens=5, do_sample=False)
    from_ids = _greedy(model, {"input_ids": ids}, max_new_tokens=5)
    new_tokens = from_ids[:, ids.shape[1]:] if family == "decoder" else from_ids
    assert torch.equal(from_embeds, new_tokens)


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_logits_to_keep(family):
    model = tiny_lm(family)
    ids = _prompt(length=6)
    inputs = {"input_ids": ids} if family == "decoder" else {"input_ids": ids, "decoder_input_ids": ids}
    full = model(**inputs).logits
    torch.testing.assert_close(model(**inputs, logits_to_keep=1).logits, full[:, -1:])
    torch.testing.assert_close(model(**inputs, logits_to_keep=torch.tensor([0, 2])).logits, full[:, [0, 2]])


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_assisted_decoding_matches_greedy(family):
    model, assistant = tiny_lm(family), tiny_lm(family, num_hidden_layers=1) if family == "decoder" else (
        tiny_lm(family, decoder_layers=1))
    inputs = {"input_ids": _prompt()}
    assisted = _greedy(model, inputs, assistant_model=assistant)
    assert torch.equal(assisted, _greedy(model, inputs))


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_early_exit_self_speculation_drafts_with_the_first_layers_and_matches_greedy(family):
    """`assistant_early_exit=1` drafts with the model's own first layer (it lowers `config.num_hidden_layers` while
    drafting, as Llama's stack honours), then verifies with all of them: greedy's tokens."""
    model = tiny_lm(family)
    inputs = {"input_ids": _prompt()}
    layers = model.model.layers if family == "decoder" else model.model.decoder.layers
    calls = [0, 0]
    hooks = [layer.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, layer in enumerate(layers)]
    early_exit = _greedy(model, inputs, assistant_early_exit=1)
    for hook in hooks:
        hook.remove()
    assert torch.equal(early_exit, _greedy(model, inputs))
    assert calls[0] > calls[1]  # the drafts ran the first layer only


def test_prompt_lookup_decoding_matches_greedy():
    model = tiny_lm("decoder")
    ids = torch.cat([_prompt(length=4)] * 3, dim=1)
    assert torch.equal(_greedy(model, {"input_ids": ids}, prompt_lookup_num_tokens=3),
                       _greedy(model, {"input_ids": ids}))


def test_seq2seq_chunked_prefill_is_refused_by_name():
    """transformers' chunked prefill cuts `attention_mask` to the decoder's length, but on an encoder-decoder that
    mask is the source's: Marian then silently attends to the source's padding. Ours refuses, naming the option
    (it said that an `encoder_attention_mask` nobody passed had the wrong shape)."""
    model = tiny_lm("seq2seq")
    ids = _prompt(batch=2, length=6)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        _greedy(model, {"input_ids": ids, "attention_mask": mask}, prefill_chunk_size=2)


def test_chunked_prefill_from_inputs_embeds_is_refused_by_name():
    """transformers' chunked prefill splits `input_ids` and passes `inputs_embeds` whole with the first chunk's mask
    and positions: native GPT-2 and Llama fail on mismatched sizes inside the embeddings, as ours did."""
    model = tiny_lm("decoder")
    ids = _prompt(batch=2, length=6)
    embeds = model.get_input_embeddings()(ids)
    for inputs in ({"inputs_embeds": embeds}, {"input_ids": ids, "inputs_embeds": embeds}):
        with pytest.raises(ValueError, match="prefill_chunk_size.*inputs_embeds"):
            _greedy(model, inputs, prefill_chunk_size=2)


def test_generation_config_ships_the_token_ids(tmp_path):
    model = tiny_lm("seq2seq")
    model.save_pretrained(tmp_path)
    config = GenerationConfig.from_pretrained(tmp_path)
    assert (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (BOS, EOS, PAD)
