"""Exact parity with the native models: `from_hf` turns a randomly initialised GPT-2, Llama, BERT or Marian into a
Scratch model with the same logits (1e-4, fp32, eval mode) and the same `generate()` outputs: tokens of greedy,
sampling and beam search, and their scores, logits, attentions, hidden states and cache."""

import copy
import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_native import ATOL, VOCAB, bert, bert_question_answering, gpt2, llama, marian
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    Cache,
    DataCollatorWithFlattening,
    DynamicCache,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    GPT2Model,
    LlamaForQuestionAnswering,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    MistralConfig,
    MistralForCausalLM,
    MistralForQuestionAnswering,
    MistralForSequenceClassification,
    MistralForTokenClassification,
    Qwen2Config,
    Qwen2ForQuestionAnswering,
    Qwen2ForSequenceClassification,
    Qwen2ForTokenClassification,
)
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

import hf_scratch_transformer as hst
from hf_scratch_transformer import scratch_loss
from hf_scratch_transformer.conversion import from_hf, to_hf


def _ids(batch=2, length=9, seed=0):
    return torch.randint(3, VOCAB - 2, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _assert_logits_match(native, ours, **inputs):
    with torch.no_grad():
        expected, actual = native(**inputs).logits, ours(**inputs).logits
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("overrides", [{}, dict(activation_function="relu"), dict(n_inner=50),
                                       dict(tie_word_embeddings=False)], ids=str)
def test_gpt2_logits_match(overrides):
    native = gpt2(**overrides)
    ours = from_hf(native)
    assert isinstance(ours, hst.ScratchDecoderForCausalLM) and not ours.training
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    _assert_logits_match(native, ours, input_ids=ids)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    _assert_logits_match(native, ours, input_ids=ids, attention_mask=mask, position_ids=position_ids)


@pytest.mark.parametrize("overrides", [{}, dict(hidden_act="relu"), dict(tie_word_embeddings=False)], ids=str)
def test_bert_logits_match(overrides):
    native = bert(**overrides)
    ours = from_hf(native)
    assert isinstance(ours, hst.ScratchEncoderForMaskedLM)
    ids = _ids()
    token_type_ids = torch.randint(0, 2, ids.shape)
    mask = torch.ones_like(ids)
    mask[1, -4:] = 0
    _assert_logits_match(native, ours, input_ids=ids, token_type_ids=token_type_ids, attention_mask=mask)


def _packed_texts(lengths=(3, 5, 4)) -> tuple[list[torch.Tensor], dict]:
    """Texts of the given lengths, and the one row `DataCollatorWithFlattening` packs them into, its positions
    restarting at each text: input_ids, position_ids (1, sum of lengths)."""
    texts = [_ids(1, length, seed)[0] for seed, length in enumerate(lengths)]
    packed = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": text.tolist()} for text in texts])
    return texts, {"input_ids": packed["input_ids"], "position_ids": packed["position_ids"]}


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_packed_texts_give_berts_logits(attn_implementation):
    """A row of packed texts (no attention mask, positions restarting) reads as BERT reads it, with the installed
    transformers: each text on its own from 5.25 on."""
    native = bert(attn_implementation=attn_implementation)
    _, packed = _packed_texts()
    _assert_logits_match(native, from_hf(native), **packed)


@pytest.mark.parametrize("position_embedding_type", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_packed_texts_are_encoded_each_as_if_alone(attn_implementation, position_embedding_type):
    """The encoder keeps attention within each packed text, as `DataCollatorWithFlattening` means it to."""
    config = hst.ScratchEncoderConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=37,
                                      num_hidden_layers=2, max_position_embeddings=64,
                                      position_embedding_type=position_embedding_type)
    model = hst.ScratchEncoderForMaskedLM._from_config(config, attn_implementation=attn_implementation).eval()
    texts, packed = _packed_texts()
    with torch.no_grad():
        together = model(**packed).logits[0].split([len(text) for text in texts])
        alone = [model(input_ids=text[None]).logits[0] for text in texts]
    for text_together, text_alone in zip(together, alone, strict=True):
        torch.testing.assert_close(text_together, text_alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, dict(scale_embedding=False, activation_function="gelu"),
                                       dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=120),
                                       dict(tie_word_embeddings=False)], ids=str)
def test_marian_logits_match(overrides):
    native = marian(**overrides)
    ours = from_hf(native)
    assert isinstance(ours, hst.ScratchSeq2SeqForConditionalGeneration)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    _assert_logits_match(native, ours, input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5])


def test_marian_without_output_bias_adds_no_parameter():
    native = marian()
    with torch.no_grad():
        native.final_logits_bias.zero_()
    ours = from_hf(native)
    assert not ours.config.output_bias and ours.lm_head.bias is None
    _assert_logits_match(native, ours, input_ids=_ids(), decoder_input_ids=_ids(length=4))


def test_losses_match():
    ids = _ids()
    for native, inputs in [(gpt2(), {"input_ids": ids, "labels": ids}),
                           (bert(), {"input_ids": ids, "labels": torch.where(ids % 3 == 0, ids, -100)}),
                           (marian(), {"input_ids": ids, "labels": ids[:, :6].contiguous()})]:
        with torch.no_grad():
            torch.testing.assert_close(from_hf(native)(**inputs).loss, native(**inputs).loss, atol=ATOL, rtol=0)


def test_question_answering_head_gives_berts_logits_loss_and_gradients():
    """Start and end logits of a padded batch with token types (questions, then contexts), and the loss and every
    gradient, are BERT's: positions given as (B,) or (B, 1), one past the sequence and beyond (an answer outside
    the window: BERT clamps it there and counts nothing for it)."""
    native, ours = bert_question_answering()
    ids = _ids(batch=3)
    inputs = {"input_ids": ids, "token_type_ids": (torch.arange(9) >= 4).long().expand(3, 9),
              "attention_mask": (torch.arange(9)[None] < torch.tensor([9, 7, 5])[:, None]).long()}
    with torch.no_grad():
        expected, actual = native(**inputs), ours(**inputs)
    for name in ("start_logits", "end_logits"):
        assert actual[name].shape == (3, 9)
        torch.testing.assert_close(actual[name], expected[name], atol=ATOL, rtol=0)
    for starts, ends in [([1, 4, 2], [3, 6, 2]), ([[5], [9], [0]], [[7], [40], [3]])]:
        positions = {"start_positions": torch.tensor(starts), "end_positions": torch.tensor(ends)}
        losses = [model(**inputs, **positions).loss for model in (native, ours)]
        torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    for model in (native, ours):
        model.zero_grad()
        model(**inputs, **positions).loss.backward()
    torch.testing.assert_close(ours.qa_outputs.weight.grad, native.qa_outputs.weight.grad, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(ours.model.embeddings.embed_tokens.weight.grad,
                               native.bert.embeddings.word_embeddings.weight.grad, atol=1e-6, rtol=1e-4)


def test_question_answering_positions_go_together():
    """BERT gives no loss, silently, for start positions without end positions; ours says what is missing."""
    _, ours = bert_question_answering()
    with pytest.raises(ValueError, match="start_positions was given without the other"):
        ours(input_ids=_ids(), start_positions=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="end_positions was given without the other"):
        ours(input_ids=_ids(), end_positions=torch.tensor([1, 2]))


def _padded_training_batch(family: str, pad_token_id: int) -> dict:
    """A batch as the collators pad one for training (on the right), rows of 9, 6 and 3 real tokens, padding
    labelled -100: GPT-2's labels are its inputs, BERT's a third of the real tokens, Marian's targets of 4, 7 and 8
    real tokens (other lengths than their sources')."""
    ids = _ids(batch=3, length=9)
    kept = torch.arange(9)[None] < torch.tensor([9, 6, 3])[:, None]
    inputs = {"input_ids": ids.masked_fill(~kept, pad_token_id), "attention_mask": kept.long()}
    if family == "gpt2":
        inputs["labels"] = ids.masked_fill(~kept, -100)
    elif family == "bert":
        inputs["labels"] = ids.masked_fill(~kept | (ids % 3 != 0), -100)
    else:
        targets = _ids(batch=3, length=8, seed=1)
        inputs["labels"] = targets.masked_fill(torch.arange(8)[None] >= torch.tensor([4, 7, 8])[:, None], -100)
    return inputs


def _gradients_by_native_name(ours) -> dict:
    """Ours' gradients under the native model's parameter names: `to_hf` of a copy of ours holding them as weights."""
    carrier = copy.deepcopy(ours)
    with torch.no_grad():
        for weight, parameter in zip(carrier.parameters(), ours.parameters(), strict=True):
            weight.copy_(parameter.grad)
    return dict(to_hf(carrier).named_parameters())


@pytest.mark.parametrize("family", ["gpt2", "bert", "marian"])
@pytest.mark.parametrize("loss", ["our CPU cross-entropy", "F.cross_entropy"])
def test_a_padded_training_batch_gives_the_native_loss_and_gradients(family, loss, monkeypatch):
    """Trainer's batches are padded (the benchmark's rows timed only unpadded ones until 2026-11-30): the loss and
    every gradient of a padded batch are the native model's, to fp32 rounding, through our CPU cross-entropy (what
    the benchmark's sizes take; a tiny model's logits are below its `MIN_LOGITS`) and through `F.cross_entropy`."""
    if loss == "our CPU cross-entropy":
        monkeypatch.setattr(scratch_loss, "MIN_LOGITS", 0)
    native = {"gpt2": gpt2, "bert": bert, "marian": marian}[family]()
    ours = from_hf(native)
    inputs = _padded_training_batch(family, native.config.pad_token_id)
    losses = [model(**inputs).loss for model in (native, ours)]
    for value in losses:
        value.backward()
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-6)
    gradients = _gradients_by_native_name(ours)
    for name, parameter in native.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(gradients[name], parameter.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_float64_losses_are_float64():
    """A float64 model's loss is float64, as native BERT's and Marian's (`CrossEntropyLoss`); ours was rounded to fp32.
    GPT-2's goes through transformers' `ForCausalLMLoss`, whose `.float()` rounds it to fp32 (docs/native_models.md):
    ours is the float64 cross-entropy of its logits."""
    ids = _ids()
    for native, inputs in [(bert(), {"input_ids": ids, "labels": torch.where(ids % 3 == 0, ids, -100)}),
                           (marian(), {"input_ids": ids, "labels": ids[:, :6].contiguous()})]:
        native = native.double()
        with torch.no_grad():
            expected, actual = native(**inputs).loss, from_hf(native)(**inputs).loss
        assert expected.dtype == actual.dtype == torch.float64
        torch.testing.assert_close(actual, expected, atol=1e-12, rtol=0)
    native = gpt2().double()
    with torch.no_grad():
        logits, loss = native(input_ids=ids).logits, from_hf(native)(input_ids=ids, labels=ids).loss
    assert loss.dtype == torch.float64
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=0)


def test_float64_eager_attention_over_a_left_padded_batch_matches_the_native_model():
    """A float64 model under eager attention takes its softmax in float64, as GPT-2 does: in fp32 the float64 mask's
    minimum became -inf, the fully masked queries of left padding NaN, and the padded row NaN throughout."""
    native = gpt2(attn_implementation="eager").double()
    ours = from_hf(native)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        expected, actual = (model(input_ids=ids, attention_mask=mask).logits for model in (native, ours))
    assert not actual.isnan().any()
    torch.testing.assert_close(actual[mask.bool()], expected[mask.bool()], atol=1e-10, rtol=0)


def test_training_mode_is_kept():
    assert from_hf(gpt2().train()).training


@pytest.mark.parametrize("native_factory", [gpt2, bert, marian])
def test_dropout_sits_where_the_native_models_has_it(native_factory, monkeypatch):
    """In training mode, with `F.dropout`'s masks (what our dropout takes on CUDA; on CPU it draws its own), the
    same seed gives the native model's logits: each dropout is in the same place, called in the same order."""
    monkeypatch.setattr("hf_scratch_transformer.scratch_dropout.inside_torch_func", lambda: True)
    rates = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1) if native_factory is marian else {}
    native = native_factory(attn_implementation="eager", **rates).train()  # GPT-2 and BERT: 0.1 everywhere
    ours = from_hf(native)
    inputs = {"input_ids": _ids()} | ({"decoder_input_ids": _ids(length=4)} if native_factory is marian else {})
    logits = []
    for model in (native, ours):
        torch.manual_seed(1)
        logits.append(model(**inputs).logits)
    torch.testing.assert_close(logits[1], logits[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("native_factory", [llama, marian])
def test_flex_attention_is_kept_both_ways(native_factory):
    """A native model under `attn_implementation="flex_attention"` became ours under sdpa. Under flex, with padding
    (the decoder's on the left, the source's on the right), ours gives the native model's logits: grouped-query
    rotary attention and the three attentions of an encoder-decoder (tests/test_layers.py: sliding windows, BERT's)."""
    native = native_factory(attn_implementation="flex_attention").eval()
    ours = from_hf(native)
    assert ours.config._attn_implementation == to_hf(ours).config._attn_implementation == "flex_attention"
    ids = _ids()
    mask = torch.ones_like(ids)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if native.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :4]
        mask[1, -3:] = 0
        real = torch.ones(2, 4, dtype=torch.bool)
    else:
        mask[1, :3] = 0
        real = mask.bool()  # a padding query's row is fully masked: its output means nothing
    with torch.no_grad():
        actual, expected = ours(**inputs).logits, native(**inputs).logits
    torch.testing.assert_close(actual[real], expected[real], atol=ATOL, rtol=0)


def test_flex_attention_exports_to_gpt2_under_its_default():
    """GPT-2 has no flex: `to_hf` of a GPT-2-like model of ours under flex failed in `set_attn_implementation`."""
    native = gpt2().eval()
    ours = from_hf(native)
    ours.set_attn_implementation("flex_attention")
    exported = to_hf(ours)
    assert exported.config._attn_implementation == "sdpa"
    with torch.no_grad():
        torch.testing.assert_close(exported(_ids()).logits, native(_ids()).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("native_factory", [gpt2, marian])
def test_eager_attention_is_kept_with_its_weights(native_factory):
    """A native model loaded with `attn_implementation="eager"` returns its attention weights; so does ours
    (under sdpa, both return none)."""
    native = native_factory(attn_implementation="eager")
    ours = from_hf(native)
    assert ours.config._attn_implementation == "eager"
    ids = _ids()
    inputs = {"input_ids": ids, "output_attentions": True}
    if native.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :4]
    with torch.no_grad():
        expected, actual = native(**inputs), ours(**inputs)
    name = "decoder_attentions" if native.config.is_encoder_decoder else "attentions"
    torch.testing.assert_close(getattr(actual, name), getattr(expected, name), atol=ATOL, rtol=0)


@pytest.mark.parametrize("native_factory", [gpt2, bert, marian])
def test_eager_attention_under_bf16_autocast_gives_the_native_weights_and_logits(native_factory):
    """Under CPU autocast ours softmaxes the bf16 scores in bf16, with scaling and mask in one pass; the native eager
    attention softmaxes its scores in their dtype too (autocast leaves softmax alone on CPU): bf16 for GPT-2, fp32
    where an fp32 additive mask widened them (BERT, Marian). The same attention weights and logits to bf16 rounding
    (the projections' sums also round in another order: ours fuses Q, K and V)."""
    native = native_factory(attn_implementation="eager").eval()
    ours = from_hf(native).eval()
    ids = _ids()
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "output_attentions": True}
    inputs["attention_mask"][0, :2] = 0  # a padded row: the mask's minimum through the one-pass sum
    if native.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :4]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = native(**inputs), ours(**inputs)
    name = "decoder_attentions" if native.config.is_encoder_decoder else "attentions"
    for weights, expected_weights in zip(getattr(actual, name), getattr(expected, name), strict=True):
        torch.testing.assert_close(weights.float(), expected_weights.float(), atol=2e-2, rtol=0)
    torch.testing.assert_close(actual.logits.float(), expected.logits.float(), atol=5e-2, rtol=2e-2)


def _prefix_cache(native, batch: int, length: int = 3):
    """Keys and values of `length` virtual tokens for every layer, as PEFT's prefix tuning passes them."""
    generator = torch.Generator().manual_seed(5)
    config = native.config
    shape = (batch, config.num_attention_heads, length, config.hidden_size // config.num_attention_heads)
    cache = DynamicCache()
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(shape, generator=generator), torch.randn(shape, generator=generator), layer)
    return cache


@pytest.mark.parametrize("native_factory", [bert, gpt2])
def test_a_prefix_of_keys_and_values_gives_the_native_outputs(native_factory):
    """Prefix tuning (PEFT) hands every layer keys and values to attend to before the input's, with an attention
    mask that covers them: BERT and GPT-2 take them; the encoder used to refuse the mask, or ignore the prefix
    without one."""
    native = native_factory()
    ours = from_hf(native)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    with_prefix = torch.cat([torch.ones(2, 3, dtype=mask.dtype), mask], dim=1)
    for attention_mask in (with_prefix, None):
        with torch.no_grad():
            expected = native(input_ids=ids, attention_mask=attention_mask, past_key_values=_prefix_cache(native, 2))
            actual = ours(input_ids=ids, attention_mask=attention_mask, past_key_values=_prefix_cache(native, 2))
        kept = mask.bool() if attention_mask is not None else torch.ones_like(mask).bool()
        torch.testing.assert_close(actual.logits[kept], expected.logits[kept], atol=ATOL, rtol=0)
    with torch.no_grad():
        assert not torch.allclose(ours(input_ids=ids).logits, actual.logits, atol=1e-3)


# ---------------------------------------------------------------------------------------------- generation


def test_gpt2_greedy_and_beam_tokens_match_including_a_left_padded_batch():
    native = gpt2()
    ours = from_hf(native)
    ids = _ids(length=6)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    ids[1, :2] = 0  # pad
    for kwargs in (dict(do_sample=False), dict(num_beams=3, length_penalty=0.7, num_return_sequences=2)):
        expected = native.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, **kwargs)
        actual = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, **kwargs)
        assert torch.equal(actual, expected), kwargs


def test_marian_greedy_and_beam_tokens_match():
    native = marian()
    ours = from_hf(native)
    assert ours.generation_config.forced_eos_token_id == native.generation_config.forced_eos_token_id
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    for kwargs in (dict(num_beams=1, do_sample=False), dict(num_beams=4, length_penalty=0.6)):
        expected = native.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, **kwargs)
        actual = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, **kwargs)
        assert torch.equal(actual, expected), kwargs



def test_marian_given_encoder_outputs_give_the_native_logits_and_tokens():
    """`encoder_outputs` given as a hand-built `BaseModelOutput` or a tuple `(hidden,)`: a forward's logits and
    `generate()`'s tokens are Marian's, which are those from the source ids. Beside a tuple, as on Marian,
    `generate()` needs the ids (without them it asks for a `bos_token_id`) and searches greedily only (transformers'
    beam expansion indexes the tuple by name: TypeError)."""
    native, ours = _native_and_ours("marian", "sdpa")
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    with torch.no_grad():
        hidden = native.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    greedy, beams = dict(num_beams=1, do_sample=False), dict(num_beams=4, length_penalty=0.6)
    forms = {  # fresh each call: beam search expands the encoder output it is given in place
        "BaseModelOutput": (lambda: {"encoder_outputs": BaseModelOutput(last_hidden_state=hidden)}, [greedy, beams]),
        "tuple": (lambda: {"encoder_outputs": (hidden,), "input_ids": ids}, [greedy]),
    }
    for form, (encoder_inputs, searches) in forms.items():
        _assert_logits_match(native, ours, attention_mask=mask, decoder_input_ids=ids[:, :4], **encoder_inputs())
        for kwargs in searches:
            expected = native.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, **kwargs)
            for model in (native, ours):
                actual = model.generate(attention_mask=mask, max_new_tokens=10, **encoder_inputs(), **kwargs)
                assert torch.equal(actual, expected), (form, type(model).__name__, kwargs)


@functools.cache
def _native_and_ours(name: str, attn_implementation: str):
    """A native model with wide weights (a tiny model's greedy tokens then depend on every input) and ours from it."""
    torch.manual_seed(0)
    width = {"init_std": 0.3} if name == "marian" else {"initializer_range": 0.3}
    native = {"gpt2": gpt2, "llama": llama, "marian": marian}[name](attn_implementation=attn_implementation, **width)
    return native, from_hf(native)


def _assert_same_generation(expected, actual, path="out"):
    """Equal ids, close floats, one cache class of one length, through `generate()`'s dict outputs."""
    if isinstance(expected, Cache):
        assert type(actual) is type(expected), path
        assert actual.get_seq_length() == expected.get_seq_length(), path
    elif isinstance(expected, torch.Tensor):
        if expected.is_floating_point():
            torch.testing.assert_close(actual, expected, atol=ATOL, rtol=1e-4, msg=path)
        else:
            assert torch.equal(actual, expected), path
    elif isinstance(expected, ModelOutput | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected), path
        names = expected.keys() if isinstance(expected, ModelOutput) else range(len(expected))
        for name in names:
            _assert_same_generation(expected[name], actual[name], f"{path}.{name}")
    else:
        assert actual == expected, path


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["gpt2", "llama", "marian"]), attn_implementation=st.sampled_from(["eager", "sdpa"]),
       padding=st.lists(st.integers(0, 7), min_size=1, max_size=3), seed=st.integers(0, 99),
       strategy=st.sampled_from([dict(do_sample=False), dict(do_sample=True, top_k=5),
                                 dict(num_beams=3, num_return_sequences=2, length_penalty=0.5, early_stopping=True),
                                 dict(num_beams=2, do_sample=True, early_stopping="never")]),
       processors=st.sampled_from([{}, dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.3),
                                   dict(min_new_tokens=4, eos_token_id=[2, 5])]),
       cache_implementation=st.sampled_from([None, "static"]), with_internals=st.booleans())
def test_generate_gives_the_native_models_outputs(name, attn_implementation, padding, seed, strategy, processors,
                                                  cache_implementation, with_internals):
    """Left-padded prompts (right-padded sources), whole rows of padding included, through greedy, sampling (same
    seed), beam and beam-sample search with logits processors, dynamic or static caches: the same sequences, scores,
    logits, beam indices, attentions and hidden states as the native model, and its cache class."""
    native, ours = _native_and_ours(name, attn_implementation)
    ids = _ids(batch=len(padding), length=7, seed=seed)
    kept = torch.arange(7)[None] < 7 - torch.tensor(padding)[:, None]
    if name != "marian":
        kept = kept.flip(-1)  # decoder-only prompts are padded on the left
    ids = ids.masked_fill(~kept, native.config.pad_token_id)
    internals = dict(output_attentions=True, output_hidden_states=True) if with_internals else {}
    outputs = []
    for model in (native, ours):
        torch.manual_seed(seed)
        outputs.append(model.generate(
            input_ids=ids, attention_mask=kept.long(), max_new_tokens=6, cache_implementation=cache_implementation,
            return_dict_in_generate=True, output_scores=True, output_logits=True, **strategy, **processors,
            **internals))
    _assert_same_generation(*outputs)


@pytest.mark.parametrize("cache_implementation", [None, "static", "sliding_window"])
def test_windowed_generation_gives_the_native_mistral_outputs(cache_implementation):
    """A sliding window of 4 over a left-padded batch of 9-token prompts, through greedy, beam and seeded sampling,
    with each cache that keeps a window (a static one rolls its window's layers): Mistral's sequences, scores and
    logits. Eager attention differs from Mistral's only at padding whose window holds only padding (a query row
    with no key: nothing reads it), so sdpa here; Mistral records no attentions."""
    torch.manual_seed(0)
    native = MistralForCausalLM(MistralConfig(**llama(initializer_range=0.3).config.to_dict(), sliding_window=4))
    ours = from_hf(native.eval())
    ids = _ids(batch=3, length=9)
    mask = (torch.arange(9)[None] >= torch.tensor([[0], [3], [6]])).long()
    ids = ids.masked_fill(mask == 0, native.config.pad_token_id)
    for strategy in (dict(do_sample=False), dict(num_beams=3, num_return_sequences=2), dict(do_sample=True)):
        outputs = []
        for model in (native, ours):
            torch.manual_seed(1)
            outputs.append(model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=8, cache_implementation=cache_implementation,
                return_dict_in_generate=True, output_scores=True, output_logits=True, **strategy))
        _assert_same_generation(*outputs)


# ---------------------------------------------------------------------------------------------- saving


@pytest.mark.parametrize("native_factory, auto_class", [(gpt2, AutoModelForCausalLM), (bert, AutoModelForMaskedLM),
                                                        (marian, AutoModelForSeq2SeqLM)])
def test_converted_model_survives_save_and_reload(native_factory, auto_class, tmp_path):
    native = native_factory()
    from_hf(native).save_pretrained(tmp_path)
    reloaded = auto_class.from_pretrained(tmp_path).eval()
    ids = _ids()
    inputs = {"input_ids": ids} if auto_class is not AutoModelForSeq2SeqLM else {
        "input_ids": ids, "decoder_input_ids": ids[:, :4]}
    _assert_logits_match(native, reloaded, **inputs)


LABELS = {0: "O", 1: "B-PER", 2: "I-PER"}
BERT_HEADS = {BertForSequenceClassification: AutoModelForSequenceClassification,
              BertForTokenClassification: AutoModelForTokenClassification,
              BertForQuestionAnswering: AutoModelForQuestionAnswering}


def _token_head(native_class, **overrides):
    labels = dict(id2label=LABELS, label2id={label: i for i, label in LABELS.items()})
    if native_class is BertForQuestionAnswering:  # two outputs: the start and end logits
        labels = {}
    return native_class(BertConfig(**bert(**overrides).config.to_dict() | labels)).eval()


def _token_head_outputs(model, **inputs) -> list[torch.Tensor]:
    """A token classifier's logits; a question-answering head's start and end logits."""
    with torch.no_grad():
        output = model(**inputs)
    return [output[name] for name in ("logits", "start_logits", "end_logits") if name in output]


@pytest.mark.parametrize("overrides", [{}, dict(hidden_act="relu", type_vocab_size=1)], ids=str)
@pytest.mark.parametrize("native_class", BERT_HEADS, ids=lambda native_class: native_class.__name__)
def test_berts_task_heads_convert_both_ways(native_class, overrides, tmp_path):
    """BERT's sequence classifier (its pooler: ours with `classifier_pooler`), token classifier and question-answering
    head become ours with the same outputs (a padded batch with token types) and the classifiers' labels, and `to_hf`
    gives BERT's class back with the same tensors, which a plain Auto class loads once saved."""
    native = _token_head(native_class, **overrides)
    ours = from_hf(native)
    assert type(ours).__name__ == native_class.__name__.replace("Bert", "ScratchEncoder")
    ids = _ids()
    inputs = dict(input_ids=ids, token_type_ids=torch.randint(0, native.config.type_vocab_size, ids.shape),
                  attention_mask=(torch.arange(9) < torch.tensor([[9], [5]])).long())
    expected = _token_head_outputs(native, **inputs)
    for actual, reference in zip(_token_head_outputs(ours, **inputs), expected, strict=True):
        torch.testing.assert_close(actual, reference, atol=ATOL, rtol=0)
    if native_class is not BertForQuestionAnswering:
        assert ours.config.id2label == LABELS
    back = to_hf(ours)
    assert type(back) is native_class and back.config.id2label == native.config.id2label
    assert back.state_dict().keys() == native.state_dict().keys()
    for key, tensor in native.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    back.save_pretrained(tmp_path)
    reloaded = BERT_HEADS[native_class].from_pretrained(tmp_path).eval()
    assert type(reloaded) is native_class
    for actual, reference in zip(_token_head_outputs(reloaded, **inputs), expected, strict=True):
        torch.testing.assert_close(actual, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("num_labels, problem_type, labels", [
    (3, None, torch.tensor([2, 0])),
    (1, None, torch.tensor([0.5, -1.0])),  # one label: regression, on both sides
    (3, "multi_label_classification", torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])),
], ids=["single-label", "regression", "multi-label"])
def test_berts_sequence_classifier_converts_with_its_loss(num_labels, problem_type, labels):
    """The converted classifier keeps BERT's `problem_type`, so the same labels give the same loss, and its gradient
    reaches the pooler as BERT's does."""
    native = BertForSequenceClassification(BertConfig(**bert().config.to_dict() | dict(
        num_labels=num_labels, problem_type=problem_type)))
    native.eval()
    ours = from_hf(native)
    assert ours.config.problem_type == problem_type and ours.config.classifier_pooler
    ids = _ids()
    expected, actual = native(input_ids=ids, labels=labels), ours(input_ids=ids, labels=labels)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    torch.testing.assert_close(ours.pooler.dense.weight.grad, native.bert.pooler.dense.weight.grad, atol=ATOL, rtol=0)


def _choice_inputs(type_vocab_size: int) -> dict:
    """Two rows of three choices, 9 tokens each (B, C, T), some choices padded, with token types and labels."""
    ids = _ids(batch=6).view(2, 3, 9)
    lengths = torch.tensor([[9, 5, 7], [3, 9, 9]])[..., None]  # (B, C, 1)
    return dict(input_ids=ids, attention_mask=(torch.arange(9) < lengths).long(),
                token_type_ids=torch.randint(0, type_vocab_size, ids.shape), labels=torch.tensor([2, 0]))


@pytest.mark.parametrize("overrides", [{}, dict(hidden_act="relu", type_vocab_size=1)], ids=str)
def test_berts_multiple_choice_head_converts_both_ways(overrides, tmp_path):
    """BERT's multiple-choice head (its pooler and one score per choice) becomes ours with the same scores, loss and
    pooler gradient over padded choices with token types; `to_hf` gives BERT's class back with the same tensors,
    which `AutoModelForMultipleChoice` loads once saved, and ours exports without token types too."""
    native = BertForMultipleChoice(bert(**overrides).config).eval()
    ours = from_hf(native)
    assert type(ours) is hst.ScratchEncoderForMultipleChoice and ours.config.classifier_pooler
    inputs = _choice_inputs(native.config.type_vocab_size)
    expected, actual = native(**inputs), ours(**inputs)
    assert actual.logits.shape == (2, 3)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    torch.testing.assert_close(ours.pooler.dense.weight.grad, native.bert.pooler.dense.weight.grad, atol=ATOL, rtol=0)
    back = to_hf(ours)
    assert type(back) is BertForMultipleChoice
    assert back.state_dict().keys() == native.state_dict().keys()
    for key, tensor in native.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    back.save_pretrained(tmp_path)
    reloaded = AutoModelForMultipleChoice.from_pretrained(tmp_path).eval()
    assert type(reloaded) is BertForMultipleChoice
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected.logits, atol=ATOL, rtol=0)
    untyped = hst.ScratchEncoderForMultipleChoice(hst.ScratchEncoderConfig(**ours.config.to_dict() | dict(
        type_vocab_size=0))).eval()
    inputs.pop("token_type_ids")
    with torch.no_grad():
        torch.testing.assert_close(to_hf(untyped)(**inputs).logits, untyped(**inputs).logits, atol=ATOL, rtol=0)


DECODER_CLASSIFIERS = {  # native classifier: its config, from the language model's of tiny_native
    GPT2ForSequenceClassification: lambda: gpt2().config,
    LlamaForSequenceClassification: lambda: llama(attention_bias=True).config,
    MistralForSequenceClassification: lambda: MistralConfig(**llama().config.to_dict() | dict(sliding_window=4)),
    Qwen2ForSequenceClassification: lambda: Qwen2Config(**llama().config.to_dict()),
}


@pytest.mark.parametrize("native_class", DECODER_CLASSIFIERS, ids=lambda native_class: native_class.__name__)
def test_decoder_classifiers_convert_both_ways(native_class):
    """GPT-2's, Llama's, Mistral's and Qwen2's sequence classifiers become ours (the last token other than padding of
    each row, left- and right-padded rows, the labels, `problem_type`, the loss) and `to_hf` gives the native class
    back with the same tensors (Qwen2's as Llama's, which computes it)."""
    config = DECODER_CLASSIFIERS[native_class]()
    config.update(dict(id2label=LABELS, label2id={label: i for i, label in LABELS.items()},
                       problem_type="single_label_classification"))
    native = native_class(config).eval()
    ours = from_hf(native)
    assert type(ours) is hst.ScratchDecoderForSequenceClassification and ours.config.id2label == LABELS
    ids = _ids(batch=3)
    ids[1, 6:] = 0  # right-padded
    ids[2, :3] = 0  # left-padded
    inputs = dict(input_ids=ids, attention_mask=(ids != 0).long(), labels=torch.tensor([2, 0, 1]))
    with torch.no_grad():
        expected, actual = native(**inputs), ours(**inputs)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)
    back = to_hf(ours)
    expected_class = LlamaForSequenceClassification if native_class is Qwen2ForSequenceClassification else native_class
    assert type(back) is expected_class and back.config.id2label == LABELS
    assert back.config.problem_type == "single_label_classification"
    for key, tensor in native.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key


DECODER_TOKEN_HEADS = {  # native head: its config, from the language model's of tiny_native, and its family's head
    GPT2ForTokenClassification: lambda: gpt2(classifier_dropout=0.3).config,
    LlamaForTokenClassification: lambda: llama(attention_bias=True).config,
    MistralForTokenClassification: lambda: MistralConfig(**llama().config.to_dict() | dict(sliding_window=4)),
    Qwen2ForTokenClassification: lambda: Qwen2Config(**llama().config.to_dict()),
    GPT2ForQuestionAnswering: lambda: gpt2().config,
    LlamaForQuestionAnswering: lambda: llama().config,
    MistralForQuestionAnswering: lambda: MistralConfig(**llama().config.to_dict() | dict(sliding_window=4)),
    Qwen2ForQuestionAnswering: lambda: Qwen2Config(**llama().config.to_dict()),
}


@pytest.mark.parametrize("native_class", DECODER_TOKEN_HEADS, ids=lambda native_class: native_class.__name__)
def test_decoder_token_classifiers_and_question_answerers_convert_both_ways(native_class, tmp_path):
    """GPT-2's, Llama's, Mistral's and Qwen2's token classifiers and question answerers become ours with the same
    outputs over a padded batch, the same loss and gradients (the labels, and the classifier's dropout rate, kept:
    GPT-2's default, 0.1, written out); `to_hf` gives the native class back (Qwen2's as Llama's, which computes it)
    with the same tensors (and zero biases where Llama's has one for attention only, or Qwen2's for q, k and v), Llama's
    question answerer's trunk under its own name (`transformer`), and the saved folder loads with the plain Auto
    class."""
    config = DECODER_TOKEN_HEADS[native_class]()
    answers = "QuestionAnswering" in native_class.__name__
    if not answers:
        config.update(dict(id2label=LABELS, label2id={label: i for i, label in LABELS.items()}))
    native = native_class(config).eval()
    ours = from_hf(native)
    expected_ours = hst.ScratchDecoderForQuestionAnswering if answers else hst.ScratchDecoderForTokenClassification
    assert type(ours) is expected_ours
    ids = _ids(batch=3)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right-padded
    labels = dict(start_positions=torch.tensor([1, 4, 9]), end_positions=torch.tensor([3, 4, 9])) if answers else {
        "labels": torch.randint(0, 3, ids.shape).masked_fill(mask == 0, -100)}
    expected, actual = native(input_ids=ids, attention_mask=mask, **labels), ours(input_ids=ids, attention_mask=mask,
                                                                                    **labels)
    for name in ("start_logits", "end_logits") if answers else ("logits",):
        torch.testing.assert_close(actual[name], expected[name], atol=ATOL, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    native_head = "qa_outputs" if answers else "classifier" if native_class is GPT2ForTokenClassification else "score"
    torch.testing.assert_close(ours.get_parameter(f"{'qa_outputs' if answers else 'classifier'}.weight").grad,
                               native.get_parameter(f"{native_head}.weight").grad, atol=ATOL, rtol=0)
    if not answers:
        assert ours.config.id2label == LABELS
        assert ours.config.classifier_dropout == (0.3 if native_class is GPT2ForTokenClassification else 0.1)
    back = to_hf(ours)
    assert type(back).__name__ == native_class.__name__.replace("Qwen2", "Llama")
    for key, tensor in native.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    if not answers:
        assert back.config.id2label == LABELS
        assert back.config.classifier_dropout == ours.config.classifier_dropout
    back.save_pretrained(tmp_path)
    auto_class = AutoModelForQuestionAnswering if answers else AutoModelForTokenClassification
    reloaded = auto_class.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(back) and native.state_dict().keys() <= reloaded.state_dict().keys()
    with torch.no_grad():
        again = reloaded(input_ids=ids, attention_mask=mask)
    for name in ("start_logits", "end_logits") if answers else ("logits",):
        torch.testing.assert_close(again[name], expected[name], atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_class", [hst.ScratchEncoderForSequenceClassification,
                                         hst.ScratchEncoderForTokenClassification,
                                         hst.ScratchEncoderForQuestionAnswering])
def test_our_task_heads_export_without_token_types_or_an_mlm_transform(model_class):
    """No head reads BERT's MLM transform, so ours exports with or without one; without token types BERT gets one
    zero row, which converts back to none. A pre-norm encoder has no BERT and is refused, by name."""
    config = from_hf(bert()).config.to_dict() | dict(type_vocab_size=0, mlm_transform=False, num_labels=3,
                                                     classifier_pooler=True)
    ours = model_class(hst.ScratchEncoderConfig(**config)).eval()
    native = to_hf(ours)
    assert not native.bert.embeddings.token_type_embeddings.weight.any()
    back = from_hf(native)
    assert back.config.type_vocab_size == 0 and back.state_dict().keys() == ours.state_dict().keys()
    for key, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    ids = _ids()
    for actual, reference in zip(_token_head_outputs(native, input_ids=ids), _token_head_outputs(ours, input_ids=ids),
                                 strict=True):
        torch.testing.assert_close(actual, reference, atol=ATOL, rtol=0)
    prenorm = model_class(hst.ScratchEncoderConfig(**config | dict(norm_position="pre")))
    with pytest.raises(ValueError, match=r"as Bert\w+: `norm_position='pre'` \(needs 'post'\)\n"):
        to_hf(prenorm)


# ---------------------------------------------------------------------------------------------- refusals


def test_unsupported_models_and_options_are_refused():
    with pytest.raises(ValueError, match="GPT2Model; supported: GPT2LMHeadModel"):
        from_hf(GPT2Model(gpt2().config))  # a bare stack: only the LM heads convert
    with pytest.raises(ValueError, match=r"as BertForSequenceClassification: `classifier_pooler=False` \(needs True\)"):
        to_hf(hst.ScratchEncoderForSequenceClassification(from_hf(bert()).config))  # BERT's pools [CLS] first
    with pytest.raises(ValueError, match=r"BertForQuestionAnswering: num_labels=3 \(start and end logits: 2\)"):
        from_hf(BertForQuestionAnswering(_token_head(BertForTokenClassification).config))  # three labels
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        from_hf(gpt2(scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match="relative position"):
        from_hf(bert(position_embedding_type="relative_key"))
    with pytest.raises(ValueError, match="head counts"):
        from_hf(marian(decoder_attention_heads=2))


@pytest.mark.parametrize("make_native, fragments", [
    (lambda: gpt2(activation_function="quick_gelu", add_cross_attention=True),
     ["activation_function='quick_gelu'", "add_cross_attention=True"]),
    (lambda: bert(hidden_act="gelu_10", is_decoder=True), ["hidden_act='gelu_10'", "a BERT decoder"]),
    (lambda: marian(activation_function="quick_gelu", decoder_attention_heads=2),
     ["activation_function='quick_gelu'", "head counts"]),
], ids=["gpt2", "bert", "marian"])
def test_an_unknown_activation_is_refused_with_the_other_problems(make_native, fragments):
    """Every problem in one error, as for the Llama family: the activation was refused on its own, first or alone."""
    with pytest.raises(ValueError, match="Cannot convert this") as error:
        from_hf(make_native())
    for fragment in fragments:
        assert fragment in str(error.value)


def test_one_row_of_token_types_serves_the_whole_batch():
    """BERT adds its token-type embeddings by broadcasting, so one row (or a 1D one) serves every sequence, as
    `position_ids` of one row do; ours refused it: "`token_type_ids` must have shape (2, 7) ..., got (1, 7)"."""
    torch.manual_seed(0)
    native = bert()
    ours = from_hf(native)
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    types = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    with torch.no_grad():
        expected = native(input_ids=ids, token_type_ids=types.expand(2, -1)).logits
        for given in (types[None], types):
            torch.testing.assert_close(ours(input_ids=ids, token_type_ids=given).logits, expected, atol=ATOL, rtol=0)
            torch.testing.assert_close(native(input_ids=ids, token_type_ids=given).logits, expected, atol=ATOL, rtol=0)
    refused = torch.zeros(3, 7, dtype=torch.long)  # neither the batch's rows nor one row: still named
    with pytest.raises(ValueError, match=r"`token_type_ids` must have shape \(2, 7\)"):
        ours(input_ids=ids, token_type_ids=refused)
