"""The three families as a transformers user meets them: losses, outputs, saving, tying, checkpointing, errors."""

import copy
import inspect
import warnings

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging import version
from safetensors.torch import load_file
from tiny_models import EOS, FAMILIES, PAD, VOCAB, lm_inputs, tiny_config, tiny_lm
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    DynamicCache,
    EncoderDecoderCache,
)
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput, Seq2SeqLMOutput
from transformers.utils import generic

import hf_scratch_transformer as hst
from hf_scratch_transformer import kernel_choice, scratch_attention_kernel
from hf_scratch_transformer.modeling_scratch_seq2seq import shift_tokens_right
from hf_scratch_transformer.scratch_linear import ScratchLinear

# ---------------------------------------------------------------------------------------------- registration


@pytest.mark.parametrize(
    "auto_class, config_class, model_class",
    [(auto, config, model) for config, pairs in hst.AUTO_CLASSES.items() for auto, model in pairs],
)
def test_auto_classes_build_our_models(auto_class, config_class, model_class):
    family = config_class.model_type.removeprefix("scratch_")
    values = {key: value for key, value in tiny_config(family).to_diff_dict().items() if key != "model_type"}
    config = AutoConfig.for_model(config_class.model_type, **values)
    assert type(config) is config_class
    assert type(auto_class.from_config(config)) is model_class


def test_spec_auto_mapping_is_complete():
    expected = {
        AutoModel: {hst.ScratchDecoderModel, hst.ScratchEncoderModel, hst.ScratchSeq2SeqModel},
        AutoModelForCausalLM: {hst.ScratchDecoderForCausalLM},
        AutoModelForMaskedLM: {hst.ScratchEncoderForMaskedLM},
        AutoModelForSeq2SeqLM: {hst.ScratchSeq2SeqForConditionalGeneration},
        AutoModelForSequenceClassification: {
            hst.ScratchDecoderForSequenceClassification, hst.ScratchEncoderForSequenceClassification},
        AutoModelForTokenClassification: {
            hst.ScratchDecoderForTokenClassification, hst.ScratchEncoderForTokenClassification},
        AutoModelForQuestionAnswering: {
            hst.ScratchDecoderForQuestionAnswering, hst.ScratchEncoderForQuestionAnswering},
        AutoModelForMultipleChoice: {hst.ScratchEncoderForMultipleChoice},
    }
    for auto_class, models in expected.items():
        registered = {model for pairs in hst.AUTO_CLASSES.values() for auto, model in pairs if auto is auto_class}
        assert registered == models, auto_class.__name__


# ---------------------------------------------------------------------------------------------- losses


def test_causal_lm_loss_shifts_labels_inside_and_ignores_minus_100():
    model = tiny_lm("decoder")
    inputs = lm_inputs("decoder")
    labels = inputs["labels"].clone()
    labels[0, 3] = -100
    out = model(input_ids=inputs["input_ids"], labels=labels)
    assert isinstance(out, CausalLMOutputWithPast)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_with_num_items_in_batch_is_a_sum_over_that_count(family):
    """Trainer's gradient accumulation passes the token count of the whole accumulated batch."""
    model = tiny_lm(family)
    inputs = lm_inputs(family)
    mean_loss = model(**inputs).loss
    counted = inputs["labels"][:, 1:] if family == "decoder" else inputs["labels"]
    num_items = (counted != -100).sum()
    summed = model(**inputs, num_items_in_batch=num_items * 4).loss
    torch.testing.assert_close(summed * 4, mean_loss)


def test_seq2seq_builds_decoder_inputs_from_labels_and_does_not_shift_the_loss():
    model = tiny_lm("seq2seq")
    inputs = lm_inputs("seq2seq")
    labels = inputs["labels"].clone()
    labels[1, -2:] = -100
    out = model(input_ids=inputs["input_ids"], labels=labels)
    assert isinstance(out, Seq2SeqLMOutput)
    decoder_input_ids = shift_tokens_right(labels, PAD, model.config.decoder_start_token_id)
    assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
    assert decoder_input_ids[1, -1] == PAD  # a -100 label becomes padding in the decoder input
    explicit = model(input_ids=inputs["input_ids"], decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(out.logits, explicit.logits)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1))
    torch.testing.assert_close(out.loss, expected)


@settings(max_examples=20, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6), min_size=1, max_size=3),
       pad=st.integers(0, VOCAB - 1), start=st.integers(0, VOCAB - 1))
def test_decoder_inputs_are_the_labels_shifted_right_after_the_start_token_with_padding_for_minus_100(rows, pad,
                                                                                                     start):
    """What `DataCollatorForSeq2Seq` asks the model for (labels padded with -100): the start token, then each row's
    labels but the last, -100 turned into the config's padding id (which need not be 0: Marian's is 58100)."""
    model = tiny_lm("seq2seq", pad_token_id=pad, decoder_start_token_id=start)
    width = max(len(row) for row in rows)
    labels = torch.tensor([row + [-100] * (width - len(row)) for row in rows])
    expected = [[start] + [pad if label == -100 else label for label in row[:-1]] for row in labels.tolist()]
    assert model.prepare_decoder_input_ids_from_labels(labels=labels).tolist() == expected


def test_masked_lm_loss_counts_only_labelled_positions():
    model = tiny_lm("encoder")
    ids = lm_inputs("encoder")["input_ids"]
    labels = torch.full_like(ids, -100)
    labels[:, [1, 4]] = ids[:, [1, 4]]
    out = model(input_ids=ids, labels=labels)
    assert isinstance(out, MaskedLMOutput)
    expected = torch.nn.functional.cross_entropy(out.logits[:, [1, 4]].reshape(-1, VOCAB), ids[:, [1, 4]].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


def test_sparse_prediction_gives_the_dense_loss_and_gradients():
    dense, sparse = tiny_lm("encoder"), tiny_lm("encoder", sparse_prediction=True)
    ids = lm_inputs("encoder")["input_ids"]
    labels = torch.where(torch.rand(ids.shape) < 0.4, ids, -100)
    labels[0, 0] = ids[0, 0]
    dense_out, sparse_out = dense(input_ids=ids, labels=labels), sparse(input_ids=ids, labels=labels)
    torch.testing.assert_close(sparse_out.loss, dense_out.loss)
    assert sparse_out.logits.shape == ((labels != -100).sum(), VOCAB)
    dense_out.loss.backward()
    sparse_out.loss.backward()
    torch.testing.assert_close(sparse.lm_head.weight.grad, dense.lm_head.weight.grad)
    # without labels, every position gets logits (fill-mask needs them)
    assert sparse(input_ids=ids).logits.shape == (*ids.shape, VOCAB)


def test_classification_heads_return_native_losses():
    ids = torch.randint(3, VOCAB, (3, 6))
    ids[0, -2:] = PAD
    for model_class, family in [(hst.ScratchDecoderForSequenceClassification, "decoder"),
                                (hst.ScratchEncoderForSequenceClassification, "encoder")]:
        model = model_class(tiny_config(family, num_labels=3)).eval()
        out = model(input_ids=ids, labels=torch.tensor([0, 2, 1]))
        assert out.logits.shape == (3, 3)
        torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2, 1])))
    tagger = hst.ScratchEncoderForTokenClassification(tiny_config("encoder", num_labels=5)).eval()
    labels = torch.randint(0, 5, ids.shape)
    out = tagger(input_ids=ids, labels=labels)
    assert out.logits.shape == (3, 6, 5)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits.reshape(-1, 5), labels.view(-1)))


@pytest.mark.parametrize("classifier_pooler", [False, True])
def test_multiple_choice_scores_each_choice_as_the_sequence_classifier_scores_a_sequence(classifier_pooler):
    """Each of a row's C choices gets the score a one-output sequence classifier with the same weights gives it alone
    (right padding changing nothing); the loss is the cross-entropy over each row's scores, a sum over
    `num_items_in_batch` under Trainer's gradient accumulation, -100 rows ignored."""
    config = tiny_config("encoder", num_labels=1, classifier_pooler=classifier_pooler)
    chooser = hst.ScratchEncoderForMultipleChoice(config).eval()
    scorer = hst.ScratchEncoderForSequenceClassification(config).eval()
    scorer.load_state_dict(chooser.state_dict())
    ids = torch.randint(3, VOCAB, (2, 3, 6))
    ids[0, 1, 4:] = PAD
    labels = torch.tensor([1, 2])
    with torch.no_grad():
        out = chooser(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels)
        alone = torch.stack([scorer(input_ids=choice[choice != PAD][None]).logits[0, 0]
                             for row in ids for choice in row]).view(2, 3)
        torch.testing.assert_close(out.logits, alone)
        torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
        summed = chooser(input_ids=ids, attention_mask=(ids != PAD).long(), labels=torch.tensor([1, -100]),
                         num_items_in_batch=torch.tensor(4)).loss
        torch.testing.assert_close(summed, torch.nn.functional.cross_entropy(out.logits[:1], labels[:1]) / 4)


def test_encoder_sequence_classifier_reads_the_first_token_so_right_padding_changes_nothing():
    """BERT's [CLS] position: the class logits of a right-padded row are those of the row alone."""
    model = hst.ScratchEncoderForSequenceClassification(tiny_config("encoder", num_labels=3)).eval()
    ids = torch.tensor([[5, 6, 7, PAD, PAD]])
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits
        torch.testing.assert_close(padded, model(input_ids=ids[:, :3]).logits)


@pytest.mark.parametrize("model_class", [hst.ScratchEncoderForSequenceClassification,
                                         hst.ScratchEncoderForTokenClassification,
                                         hst.ScratchDecoderForTokenClassification])
def test_the_classifier_drops_out_at_classifier_dropout_in_training_mode_only(model_class):
    """`classifier_dropout`, not `dropout`, is the rate of the classifier's input (BERT's, GPT-2's token
    classifier's): with every other rate 0, training mode changes the logits, and eval mode gives those of the same
    weights with a rate of 0."""
    ids = torch.randint(3, VOCAB, (2, 6))
    family = "decoder" if "Decoder" in model_class.__name__ else "encoder"
    models = {}
    for rate in (0.5, 0.0):
        torch.manual_seed(0)
        models[rate] = model_class(tiny_config(family, num_labels=3, dropout=0.0, classifier_dropout=rate))
    with torch.no_grad():
        trained = models[0.5].train()(input_ids=ids).logits
        evaluated, without = (models[rate].eval()(input_ids=ids).logits for rate in (0.5, 0.0))
    torch.testing.assert_close(evaluated, without, rtol=0, atol=0)
    assert not torch.allclose(trained, evaluated)


@pytest.mark.parametrize("model_class", [hst.ScratchEncoderForSequenceClassification,
                                         hst.ScratchEncoderForTokenClassification, hst.ScratchEncoderForMaskedLM,
                                         hst.ScratchEncoderForQuestionAnswering,
                                         hst.ScratchDecoderForSequenceClassification, hst.ScratchDecoderForCausalLM,
                                         hst.ScratchDecoderForTokenClassification,
                                         hst.ScratchDecoderForQuestionAnswering])
def test_heads_name_past_key_values_and_attend_to_a_prefix(model_class):
    """PEFT's prefix tuning gives `past_key_values` to a head whose forward names it, and otherwise to the trunk,
    feeding the classifier the trunk's second output (BERT's pooler output, which ours lacks): every head names it."""
    assert "past_key_values" in inspect.signature(model_class.forward).parameters
    family = "decoder" if "Decoder" in model_class.__name__ else "encoder"
    config = tiny_config(family, num_labels=3)
    model = model_class(config).eval()
    ids = torch.randint(3, VOCAB, (2, 6))
    prefix = DynamicCache()
    for layer in range(config.num_hidden_layers):
        prefix.update(torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8), layer)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids))[0]  # logits (start logits: QA)
        prefixed = model(input_ids=ids, attention_mask=torch.ones(2, 9, dtype=ids.dtype), past_key_values=prefix)[0]
    assert prefixed.shape == plain.shape and not torch.allclose(prefixed, plain, atol=1e-4)


# transformers 5.24 renamed the forwards' `past_key_values` to `cache` (the old name deprecated until 5.40).
CACHE_RENAMED = version.parse(transformers.__version__) >= version.parse("5.24")


def _forward_with_the_cache_named(family: str, model, name: str):
    """(the last forward's output, the cache given) after passing the cache as `name`: a prefill and a decoding
    step for the decoder and the seq2seq decoder, a prefix of keys and values for the encoder (prefix tuning)."""
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    config = model.config
    if family == "encoder":
        cache = DynamicCache()
        for layer in range(config.num_hidden_layers):
            cache.update(*torch.randn(2, 2, 4, 3, 8, generator=torch.Generator().manual_seed(layer)), layer)
        return model(input_ids=ids, attention_mask=torch.ones(2, 9, dtype=ids.dtype), **{name: cache}), cache
    if family == "decoder":
        cache = DynamicCache(config=config)
        model(input_ids=ids[:, :4], use_cache=True, **{name: cache})
        return model(input_ids=ids[:, 4:], use_cache=True, **{name: cache}), cache
    cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    model(input_ids=ids, decoder_input_ids=ids[:, :4], use_cache=True, **{name: cache})
    return model(input_ids=ids, decoder_input_ids=ids[:, 4:], use_cache=True, **{name: cache}), cache


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cache_goes_by_either_name(family):
    """Every head takes the cache as `cache` (5.24's name, which `generate()` passes) and as `past_key_values`, with
    the same logits, and returns it under the running version's output field. The old name warns from 5.24 only, as
    native forwards do."""
    model = tiny_lm(family)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new, new_cache = _forward_with_the_cache_named(family, model, "cache")
        renamed_warnings = len(caught)
        old, old_cache = _forward_with_the_cache_named(family, model, "past_key_values")
    deprecations = [str(w.message) for w in caught[renamed_warnings:] if issubclass(w.category, FutureWarning)]
    assert renamed_warnings == 0, [str(w.message) for w in caught]
    assert bool(deprecations) == CACHE_RENAMED, deprecations
    assert all("`past_key_values` is deprecated" in message and "Use `cache`" in message for message in deprecations)
    torch.testing.assert_close(new.logits, old.logits)
    if family != "encoder":  # a bidirectional stack makes no cache
        field = "cache" if CACHE_RENAMED else "past_key_values"
        assert getattr(new, field) is new_cache and getattr(old, field) is old_cache
        assert new_cache.get_seq_length() == 6
    inputs = {"input_ids": torch.tensor([[5, 6]])}
    if family == "seq2seq":
        inputs["decoder_input_ids"] = torch.tensor([[5]])
    with pytest.raises(ValueError, match="not both"):
        model(**inputs, cache=DynamicCache(), past_key_values=DynamicCache())


def test_decoder_classifier_reads_the_last_real_token_of_left_and_right_padded_rows():
    model = hst.ScratchDecoderForSequenceClassification(tiny_config("decoder", num_labels=2)).eval()
    ids = torch.tensor([[5, 6, 7, PAD, PAD]])
    alone = model(input_ids=ids[:, :3]).logits
    torch.testing.assert_close(model(input_ids=ids, attention_mask=(ids != PAD).long()).logits, alone)
    left = torch.tensor([[PAD, PAD, 5, 6, 7]])
    mask = (left != PAD).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() passes them: the row's own from its first token
    torch.testing.assert_close(model(input_ids=left, attention_mask=mask, position_ids=positions).logits, alone)


def test_decoder_classifier_reads_embeddings_at_the_last_token_their_mask_keeps():
    """Embeddings show no padding id: a right-padded row was read at its last position, its padding (GPT-2 does so,
    with a warning), so PEFT's prompt tuning, which passes embeddings and a mask, classified a padded row otherwise
    than the row alone. The mask's last kept token is each row's end."""
    model = hst.ScratchDecoderForSequenceClassification(tiny_config("decoder", num_labels=2)).eval()
    ids = torch.tensor([[5, 6, 7, PAD, PAD], [8, 9, 10, 11, 12]])
    mask = (ids != PAD).long()
    embeds = model.get_input_embeddings()(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(model(inputs_embeds=embeds, attention_mask=mask).logits, expected)
        alone = model(inputs_embeds=embeds[:1, :3], attention_mask=mask[:1, :3]).logits
    torch.testing.assert_close(expected[:1], alone)


def test_decoder_classifier_reads_embeddings_after_cached_tokens_at_the_last_token_their_mask_keeps():
    """With keys of earlier tokens in the cache (PEFT's prefix tuning passes them so), the 2D mask covers those first:
    the embeddings' own columns are its last ones, whose last kept token is each row's end."""
    model = hst.ScratchDecoderForSequenceClassification(tiny_config("decoder", num_labels=2)).eval()
    ids = torch.tensor([[5, 6, 7, PAD, PAD], [8, 9, 10, 11, 12]])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.randint(3, VOCAB, (2, 4)), cache=cache, use_cache=True)
        mask = torch.cat([torch.ones(2, 4, dtype=torch.long), (ids != PAD).long()], dim=1)
        expected = model(input_ids=ids, attention_mask=mask, cache=copy.deepcopy(cache)).logits
        embeds = model.get_input_embeddings()(ids)
        actual = model(inputs_embeds=embeds, attention_mask=mask, cache=copy.deepcopy(cache)).logits
    torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("inputs", ["input_ids", "inputs_embeds"])
def test_decoder_classifier_without_a_padding_token_refuses_a_batch(inputs):
    """As GPT-2: with no `pad_token_id` a row's end is unknown. Embeddings were read at the last position, the
    padding of any shorter row."""
    model = hst.ScratchDecoderForSequenceClassification(tiny_config("decoder", num_labels=2, pad_token_id=None))
    ids = torch.randint(3, VOCAB, (2, 5))
    given = {"input_ids": ids} if inputs == "input_ids" else {"inputs_embeds": model.get_input_embeddings()(ids)}
    with pytest.raises(ValueError, match="needs `config.pad_token_id` to find each end"):
        model(**given)
    assert model(**{name: value[:1] for name, value in given.items()}).logits.shape == (1, 2)  # one row: its end


# ---------------------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_and_attentions_are_returned(family):
    model = tiny_lm(family, attn_implementation="eager")
    inputs = lm_inputs(family)
    out = model(**inputs, output_hidden_states=True, output_attentions=True)
    batch, length = inputs["input_ids"].shape
    if family == "seq2seq":
        target = inputs["labels"].shape[1]
        assert len(out.encoder_hidden_states) == len(out.decoder_hidden_states) == 3
        assert out.encoder_attentions[0].shape == (batch, 4, length, length)
        assert out.decoder_attentions[0].shape == (batch, 4, target, target)
        assert out.cross_attentions[0].shape == (batch, 4, target, length)
        return
    assert len(out.hidden_states) == 3  # embeddings + 2 layers
    assert len(out.attentions) == 2
    weights = out.attentions[0]
    assert weights.shape == (batch, 4, length, length)
    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, 4, length))
    if family == "decoder":
        assert torch.all(weights.triu(1) == 0), "a causal model must not attend to later tokens"


@pytest.mark.parametrize("family", FAMILIES)
def test_return_dict_false_gives_tuples(family):
    model = tiny_lm(family)
    out = model(**lm_inputs(family), return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[1], model(**lm_inputs(family)).logits)


HEAD_CLASSES = [
    (family, cls) for family, classes in (
        ("decoder", (hst.ScratchDecoderForCausalLM, hst.ScratchDecoderForSequenceClassification,
                     hst.ScratchDecoderForTokenClassification, hst.ScratchDecoderForQuestionAnswering)),
        ("encoder", (hst.ScratchEncoderForMaskedLM, hst.ScratchEncoderForSequenceClassification,
                     hst.ScratchEncoderForTokenClassification, hst.ScratchEncoderForQuestionAnswering)),
        ("seq2seq", (hst.ScratchSeq2SeqModel, hst.ScratchSeq2SeqForConditionalGeneration)),
    ) for cls in classes
]


@pytest.mark.parametrize("family, model_class", HEAD_CLASSES, ids=lambda value: getattr(value, "__name__", value))
def test_return_dict_false_in_the_config_gives_tuples(family, model_class):
    # The heads read the inner stack's output by name: with `config.return_dict=False` that output was a tuple
    # too, and the forward failed with "'tuple' object has no attribute 'last_hidden_state'" (BERT asks its stack
    # for a dict; Llama and GPT-2 fail the same way).
    torch.manual_seed(0)
    model = model_class(tiny_config(family)).eval()
    inputs = {"input_ids": lm_inputs(family)["input_ids"]}
    if family == "seq2seq":
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :4]
    expected = model(**inputs).to_tuple()
    model.config.return_dict = False
    out = model(**inputs)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], expected[0])


# ---------------------------------------------------------------------------------------------- saving


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned", "rope", "alibi"])
def test_save_and_reload_gives_the_same_outputs_and_keeps_weights_tied(family, position_embedding_type, tmp_path):
    model = tiny_lm(family, position_embedding_type=position_embedding_type)
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in stored, "a tied weight is stored once"
    assert not any("inv_freq" in key or "slopes" in key for key in stored), "computed tables are not stored"
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert reloaded.get_output_embeddings().weight is reloaded.model.decoder.get_input_embeddings().weight if (
        family == "seq2seq") else reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    inputs = lm_inputs(family)
    torch.testing.assert_close(reloaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)


@pytest.mark.parametrize("first, second", [("50GB", "20KB"), ("20KB", "50GB")],
                         ids=["sharded-over-one", "one-over-sharded"])
def test_saving_again_in_another_layout_leaves_no_stale_weights(first, second, tmp_path):
    """transformers removes the shards of an earlier save only: a sharded save over one `model.safetensors` left that
    file, which `from_pretrained` reads first (the earlier weights, without a word, on the Hub too), and a single file
    over shards left their index (`hf-scratch publish` then asked for the deleted shards)."""
    tiny_lm("decoder").save_pretrained(tmp_path, max_shard_size=first)
    model = tiny_lm("decoder", initializer_range=0.5)
    model.save_pretrained(tmp_path, max_shard_size=second)
    files = {path.name for path in tmp_path.glob("model*.safetensors*")}
    if second == "20KB":
        assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    else:
        assert files == {"model.safetensors"}
    inputs = lm_inputs("decoder")
    torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(tmp_path)(**inputs).logits, model(**inputs).logits)


def test_untied_head_stays_untied_after_reload(tmp_path):
    model = tiny_lm("decoder", tie_word_embeddings=False)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight is not reloaded.model.get_input_embeddings().weight
    torch.testing.assert_close(reloaded.lm_head.weight, model.lm_head.weight)


def test_seq2seq_shares_encoder_and_decoder_embeddings_after_reload(tmp_path):
    model = tiny_lm("seq2seq")
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    encoder, decoder = reloaded.model.encoder, reloaded.model.decoder
    assert encoder.get_input_embeddings().weight is decoder.get_input_embeddings().weight


def _seq2seq_embedding_weights(model):
    """(encoder embeddings, decoder embeddings, output head) of a seq2seq LM."""
    stacks = model.model.encoder, model.model.decoder
    return *(stack.get_input_embeddings().weight for stack in stacks), model.lm_head.weight


SHARING_AND_TYING = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("share_embeddings, tie_word_embeddings", SHARING_AND_TYING)
def test_seq2seq_sharing_and_head_tying_are_independent(share_embeddings, tie_word_embeddings, tmp_path):
    """fairseq's `--share-all-embeddings` and `--share-decoder-input-output-embed`: each knob works without the
    other, after `from_pretrained` (head class and base model) as after construction."""
    model = tiny_lm("seq2seq", share_embeddings=share_embeddings, tie_word_embeddings=tie_word_embeddings)
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert ("model.encoder.embeddings.embed_tokens.weight" in stored) is not share_embeddings
    assert ("lm_head.weight" in stored) is not tie_word_embeddings
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    for loaded in (model, reloaded):
        encoder, decoder, head = _seq2seq_embedding_weights(loaded)
        assert (encoder is decoder) is share_embeddings
        assert (head is decoder) is tie_word_embeddings
    for original, loaded in zip(_seq2seq_embedding_weights(model), _seq2seq_embedding_weights(reloaded), strict=True):
        torch.testing.assert_close(loaded, original, rtol=0, atol=0)
    inputs = lm_inputs("seq2seq")
    torch.testing.assert_close(reloaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)
    base = AutoModel.from_pretrained(tmp_path)
    shared = base.encoder.get_input_embeddings().weight is base.decoder.get_input_embeddings().weight
    assert shared is share_embeddings


@pytest.mark.parametrize("share_embeddings, tie_word_embeddings", SHARING_AND_TYING)
def test_seq2seq_resize_keeps_sharing_and_head_tying(share_embeddings, tie_word_embeddings, tmp_path):
    model = tiny_lm("seq2seq", share_embeddings=share_embeddings, tie_word_embeddings=tie_word_embeddings)
    model.resize_token_embeddings(VOCAB + 5, pad_to_multiple_of=64)
    encoder, decoder, head = _seq2seq_embedding_weights(model)
    assert model.config.vocab_size == encoder.shape[0] == decoder.shape[0] == head.shape[0] == 128
    assert (encoder is decoder) is share_embeddings
    assert (head is decoder) is tie_word_embeddings
    ids = torch.tensor([[3, 120, 127]])
    assert model(input_ids=ids, labels=ids).logits.shape == (1, 3, 128)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(reloaded(input_ids=ids, labels=ids).logits, model(input_ids=ids, labels=ids).logits)


def test_base_model_loads_from_a_head_checkpoint(tmp_path):
    model = tiny_lm("decoder")
    model.save_pretrained(tmp_path)
    base = AutoModel.from_pretrained(tmp_path).eval()
    ids = lm_inputs("decoder")["input_ids"]
    torch.testing.assert_close(base(input_ids=ids).last_hidden_state, model.model(input_ids=ids).last_hidden_state)


# ---------------------------------------------------------------------------------------------- embeddings


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_token_embeddings_keeps_tying_and_updates_the_config(family):
    model = tiny_lm(family)
    model.resize_token_embeddings(VOCAB + 5, pad_to_multiple_of=64)
    assert model.config.vocab_size == 128
    assert model.get_input_embeddings().weight.shape == (128, 32)
    assert model.get_output_embeddings().weight.shape[0] == 128
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    ids = torch.tensor([[3, 120, 127]])
    labels = ids if family != "seq2seq" else ids[:, :2].contiguous()
    assert model(input_ids=ids, labels=labels).logits.shape[-1] == 128


def test_a_shared_seq2seq_vocabulary_is_one_matrix_for_both_stacks():
    """`set_input_embeddings` set the decoder's matrix alone: the encoder read the old one until `tie_weights` (logits
    9e-3 away from Marian's with the same weights); and a vocabulary shrunk below the pad id failed in the encoder's
    old module ("Padding_idx must be within num_embeddings"), where Marian's resizes. Both stacks take the one."""
    model = tiny_lm("seq2seq", pad_token_id=98)
    new = torch.nn.Embedding(VOCAB, 32, padding_idx=98)
    model.set_input_embeddings(new)
    assert model.get_encoder().get_input_embeddings() is new and model.get_decoder().get_input_embeddings() is new
    model = tiny_lm("seq2seq", pad_token_id=98)
    model.resize_token_embeddings(90)
    ids = torch.tensor([[3, 50, 89]])
    assert model(input_ids=ids, decoder_input_ids=ids).logits.shape == (1, 3, 90)
    encoder, decoder = model.get_encoder().get_input_embeddings(), model.get_decoder().get_input_embeddings()
    assert encoder.weight is decoder.weight is model.get_output_embeddings().weight


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_keeps_an_untied_head_a_scratch_linear(family):
    """transformers builds the resized head as a plain `nn.Linear`: ours lost `ScratchLinear`'s fp32 kernel choice
    until the model was saved and loaded again. It keeps the class, weights and `requires_grad` of a resize."""
    model = tiny_lm(family, tie_word_embeddings=False)
    old_head = model.get_output_embeddings()
    old_head.weight.requires_grad_(False)
    model.resize_token_embeddings(VOCAB + 5, mean_resizing=False)
    head = model.get_output_embeddings()
    assert type(head) is ScratchLinear and head is not old_head
    assert head.weight.shape == (VOCAB + 5, 32) and not head.weight.requires_grad
    torch.testing.assert_close(head.weight[:VOCAB], old_head.weight)
    ids = torch.tensor([[3, 100, 103]])
    assert model(input_ids=ids, labels=ids).logits.shape[-1] == VOCAB + 5


# ---------------------------------------------------------------------------------------------- checkpointing


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(family, use_reentrant):
    """With dropout on: the recomputed forward draws the same masks (checkpointing restores the random state)."""
    inputs = lm_inputs(family)
    rates = dict(dropout=0.1, attention_dropout=0.1, embedding_dropout=0.1)
    plain, checkpointed = tiny_lm(family, **rates).train(), tiny_lm(family, **rates).train()
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    assert checkpointed.is_activation_checkpointing
    for model in (plain, checkpointed):
        torch.manual_seed(1)
        model(**inputs).loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


# Each CPU kernel choice made on "auto" (its variable, its cache's clearing, whether it is asked in bf16)
TIMED_CHOICES = {
    "fp32-products": (kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, False),
    "bf16-products": (kernel_choice.BF16_PRODUCTS_VARIABLE, kernel_choice.clear_kernel_choices, True),
    "bf16-attention": (scratch_attention_kernel.ATTENTION_VARIABLE,
                       scratch_attention_kernel.CHOSEN.clear, True),
}


@pytest.mark.parametrize("choice", list(TIMED_CHOICES))
def test_kernels_timed_inside_a_checkpointed_layer_leave_the_checkpoint_alone(choice, force_choice):
    """A run's first training step times the kernels inside its first layer, which non-reentrant checkpointing
    (transformers' default, TRL's SFT) wraps in saved-tensor hooks: taking the timing's tensors for the layer's, its
    recomputation failed with a CheckpointError. The same gradients as without checkpointing."""
    variable, clear, bf16 = TIMED_CHOICES[choice]
    force_choice(variable, clear, "auto")
    inputs = lm_inputs("decoder", batch=4, length=40)  # rows enough for the many-row kernels
    plain, checkpointed = tiny_lm("decoder").train(), tiny_lm("decoder").train()
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for model in (checkpointed, plain):  # the checkpointed step first: it times the kernels
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = model(**inputs).loss
        loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.parametrize("choice", list(TIMED_CHOICES))
def test_kernels_timed_inside_a_counted_step_leave_the_count_alone(choice, force_choice):
    """The kernels are timed inside the forward that first needs them, which a dispatch mode may be watching: a
    `FlopCounterMode` around a first training step counted the timing's products too (2.05 GFLOP for a 15 MFLOP
    step), and `FakeTensorMode` had them timed on fake tensors. The first step counts as the second."""
    variable, clear, bf16 = TIMED_CHOICES[choice]
    force_choice(variable, clear, "auto")
    inputs = lm_inputs("decoder", batch=4, length=40)
    model = tiny_lm("decoder").train()
    counts = []
    for _ in range(2):  # the first step times the kernels
        with FlopCounterMode(display=False) as counter, torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            model(**inputs).loss.backward()
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1]


@pytest.mark.parametrize("family", ["encoder", "seq2seq"])
def test_gradient_checkpointing_leaves_a_bidirectional_stack_without_a_cache_warning(family, monkeypatch):
    """`merge_with_config_defaults` warns that `use_cache=True` (the config's) is incompatible with gradient
    checkpointing when a stack carries the flag: an encoder has no cache, and the warning (a logging call) broke
    `torch.compile(fullgraph=True)` of a checkpointed encoder or seq2seq training step."""
    warnings = []
    monkeypatch.setattr(generic.logger, "warning_once", warnings.append)
    model = tiny_lm(family).train()
    model.activation_checkpointing_enable()
    model(**lm_inputs(family)).loss.backward()
    assert warnings == []


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_outside_the_vocabulary_are_a_clear_error(family):
    model = tiny_lm(family)
    with pytest.raises(ValueError, match="input_ids.*vocabulary size is 99"):
        model(input_ids=torch.tensor([[3, VOCAB]]), labels=torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="input_ids"):
        model(input_ids=torch.tensor([[3, -1]]), labels=torch.tensor([[3, 4]]))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal"])
def test_input_longer_than_the_positions_is_a_clear_error(family, position_embedding_type):
    model = tiny_lm(family, position_embedding_type=position_embedding_type, max_position_embeddings=8)
    ids = torch.randint(3, VOCAB, (1, 9))
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(input_ids=ids, labels=ids)


def test_rope_and_alibi_models_take_inputs_longer_than_max_positions():
    for kind in ("rope", "alibi"):
        model = tiny_lm("decoder", position_embedding_type=kind, max_position_embeddings=8)
        assert model(input_ids=torch.randint(3, VOCAB, (1, 12))).logits.shape == (1, 12, VOCAB)


@pytest.mark.parametrize("family", FAMILIES)
def test_mask_of_the_wrong_shape_is_a_clear_error(family):
    model = tiny_lm(family)
    inputs = lm_inputs(family)
    with pytest.raises(ValueError, match="attention_mask.*shape"):
        model(**inputs, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="attention_mask.*shape"):
        model(**inputs, attention_mask=torch.ones(3, 7))


@pytest.mark.parametrize("family", FAMILIES)
def test_labels_of_the_wrong_shape_are_a_clear_error(family):
    model = tiny_lm(family)
    inputs = lm_inputs(family)
    inputs["labels"] = inputs["labels"][:, :-1]
    if family == "seq2seq":
        inputs["decoder_input_ids"] = torch.full((2, 5), EOS)
    with pytest.raises(ValueError, match="labels.*shape"):
        model(**inputs)


def test_missing_ids_and_embeddings_is_a_clear_error():
    with pytest.raises(ValueError, match="input_ids"):
        tiny_lm("decoder")(attention_mask=torch.ones(1, 3))


def test_inputs_embeds_give_the_same_outputs_as_ids():
    model = tiny_lm("decoder", scale_embeddings=True)
    ids = lm_inputs("decoder")["input_ids"]
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize("family", ["encoder", "seq2seq"])
def test_sliced_labels_are_accepted(family):
    model = tiny_lm(family)
    ids = torch.randint(3, VOCAB, (2, 9))
    labels = ids[:, :7] if family == "seq2seq" else ids[:, 2:]
    out = model(input_ids=ids[:, 2:] if family == "encoder" else ids, labels=labels)
    assert not labels.is_contiguous() and torch.isfinite(out.loss)


def test_seq2seq_resize_with_two_matrices_of_one_vocabulary():
    model = tiny_lm("seq2seq", share_embeddings=False)
    model.resize_token_embeddings(128)
    assert model.model.encoder.get_input_embeddings().weight.shape[0] == 128
    assert model.model.decoder.get_input_embeddings().weight.shape[0] == 128
    assert model.lm_head.weight is model.model.decoder.get_input_embeddings().weight
    ids = torch.tensor([[3, 127]])
    assert model(input_ids=ids, labels=ids).logits.shape == (1, 2, 128)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_seq2seq_resize_keeps_a_frozen_head_frozen(share_embeddings):
    """As transformers' resize: the new output head keeps `requires_grad` of the old one. With `share_embeddings=False`
    a frozen head came back trainable."""
    model = tiny_lm("seq2seq", share_embeddings=share_embeddings, tie_word_embeddings=False)
    model.lm_head.requires_grad_(False)
    model.model.encoder.get_input_embeddings().requires_grad_(False)
    model.resize_token_embeddings(128)
    encoder, decoder, head = _seq2seq_embedding_weights(model)
    assert encoder.shape[0] == decoder.shape[0] == head.shape[0] == model.config.vocab_size == 128
    assert not head.requires_grad and not encoder.requires_grad
    assert decoder.requires_grad is not share_embeddings


def test_seq2seq_with_two_vocabularies_refuses_resize_and_exposes_the_source_embeddings():
    model = tiny_lm("seq2seq", share_embeddings=False, encoder_vocab_size=50)
    assert model.get_input_embeddings() is model.model.encoder.get_input_embeddings()
    assert model.get_input_embeddings().weight.shape[0] == 50
    with pytest.raises(ValueError, match="separate source and target vocabularies"):
        model.resize_token_embeddings(128)


def test_seq2seq_source_token_types_do_not_reach_the_decoder():
    # A tokenizer's all-zero `token_type_ids` (BERT-style ones send them) describe the source. They were passed on
    # to the decoder too, which refused them for not matching the target's shape; Marian accepts them.
    model = tiny_lm("seq2seq")
    inputs = lm_inputs("seq2seq")
    expected = model(**inputs).logits
    token_type_ids = torch.zeros_like(inputs["input_ids"])
    torch.testing.assert_close(model(**inputs, token_type_ids=token_type_ids).logits, expected)
    with pytest.raises(ValueError, match="no token types"):  # non-zero ones are still refused, by the encoder
        model(**inputs, token_type_ids=token_type_ids + 1)


def test_seq2seq_source_position_ids_go_to_the_encoder():
    # `position_ids` (the source's; the target's are `decoder_position_ids`) reached the decoder beside its own
    # and failed with "TypeError: ... got multiple values for keyword argument 'position_ids'".
    model = tiny_lm("seq2seq")
    inputs = lm_inputs("seq2seq")
    expected = model(**inputs).logits
    positions = torch.arange(inputs["input_ids"].shape[1]).expand_as(inputs["input_ids"])
    torch.testing.assert_close(model(**inputs, position_ids=positions).logits, expected)
    reversed_positions = model(**inputs, position_ids=positions.flip(-1)).logits
    assert not torch.allclose(reversed_positions, expected)  # the encoder reads them


def test_seq2seq_reads_given_encoder_outputs_in_every_form_without_encoding_again(monkeypatch):
    """`encoder_outputs` as the encoder returns them (what `generate()` passes at every step), as a tuple
    (`return_dict=False`) and as another output class (a native `BaseModelOutput`) all give the logits of a forward
    from the source ids, and the encoder does not run again."""
    from transformers.modeling_outputs import BaseModelOutput

    model = tiny_lm("seq2seq")
    inputs = lm_inputs("seq2seq")
    expected = model(**inputs).logits
    encoded = model.get_encoder()(input_ids=inputs["input_ids"])
    forms = {"the encoder's": encoded, "tuple": model.get_encoder()(input_ids=inputs["input_ids"], return_dict=False),
             "BaseModelOutput": BaseModelOutput(last_hidden_state=encoded.last_hidden_state)}

    def encoder_runs(*args, **kwargs):
        raise AssertionError("the encoder ran again")

    monkeypatch.setattr(model.get_encoder(), "forward", encoder_runs)
    for form, encoder_outputs in forms.items():
        given = model(encoder_outputs=encoder_outputs, labels=inputs["labels"], return_dict=True)
        torch.testing.assert_close(given.logits, expected, msg=form)
        assert given.encoder_last_hidden_state is encoded.last_hidden_state or form == "tuple", form


def test_seq2seq_loss_makes_no_cache():
    """As Marian and BART: a training step with labels fills no cache (that would copy every layer's keys)."""
    model = tiny_lm("seq2seq")
    inputs = lm_inputs("seq2seq")
    assert model(**inputs, use_cache=True).past_key_values is None
    inputs.pop("labels")
    inputs["decoder_input_ids"] = inputs["input_ids"][:, :3]
    assert model(**inputs, use_cache=True).past_key_values is not None


@pytest.mark.parametrize("head", ["ScratchDecoderForCausalLM", "ScratchDecoderForSequenceClassification"])
def test_a_loss_fills_no_cache_unless_asked(head):
    """Filling a cache copies every layer's keys and values, which a loss does not need (as seq2seq and BART)."""
    torch.manual_seed(0)
    model = getattr(hst, head)(tiny_config("decoder", num_labels=2, pad_token_id=PAD)).eval()
    ids = lm_inputs("decoder")["input_ids"]
    labels = ids if head.endswith("CausalLM") else torch.tensor([0, 1])
    plain, cached = model(input_ids=ids, labels=labels), model(input_ids=ids, labels=labels, use_cache=True)
    assert plain.past_key_values is None and cached.past_key_values.get_seq_length() == ids.shape[1]
    assert model(input_ids=ids).past_key_values is not None  # without labels, as before: the config's use_cache
    torch.testing.assert_close(plain.logits, cached.logits)
    torch.testing.assert_close(plain.loss, cached.loss)


@pytest.mark.parametrize("family", FAMILIES)
def test_per_sample_gradients_with_vmap_equal_each_samples_own(family):
    """`vmap(grad(loss))` over a batch, as per-sample gradient methods (Opacus-style) take them: the id range checks
    read a value, which vmap refuses ("calling .item() on a Tensor"), on every family; native models have none."""
    model = tiny_lm(family, dropout=0.0).eval()
    inputs = lm_inputs(family, batch=3)
    parameters = {name: parameter.detach() for name, parameter in model.named_parameters()}
    buffers = dict(model.named_buffers())

    def loss(parameters, ids, labels):
        call = {"input_ids": ids[None], "labels": labels[None]}
        return torch.func.functional_call(model, (parameters, buffers), (), call).loss

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(
        parameters, inputs["input_ids"], inputs["labels"])
    for index in range(3):
        model.zero_grad()
        model(input_ids=inputs["input_ids"][index:index + 1], labels=inputs["labels"][index:index + 1]).loss.backward()
        for name, parameter in model.named_parameters():
            torch.testing.assert_close(per_sample[name][index], parameter.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_a_seq2seq_models_input_embeddings_are_the_sources():
    """Trainer's NEFTune hooks `get_input_embeddings()`: ours gave the decoder's module (one matrix with the encoder's,
    two modules), so the noise went on the target embeddings, where Marian's goes on the source's."""
    model = tiny_lm("seq2seq").eval()
    assert model.get_input_embeddings() is model.get_encoder().get_input_embeddings()
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: seen.append(output.shape[1]))
    inputs = lm_inputs("seq2seq", length=7)
    with torch.no_grad():
        model(**inputs)
    assert seen == [7]  # the source's 7 tokens, not the 5 labels'
