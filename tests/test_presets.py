"""Every preset of SPEC section 4 builds, runs forward and backward, and has the stated shape."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
)

from hf_scratch_transformer.conversion import CONVERTERS
from hf_scratch_transformer.presets import PRESETS, get_preset
from tokenizer_training.trainers import SPECIAL_TOKENS

AUTO_LM = {"decoder": AutoModelForCausalLM, "encoder": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}

# name -> fields the preset must have (SPEC section 4)
STATED = {
    "transformer-base": dict(encoder_layers=6, decoder_layers=6, hidden_size=512, num_attention_heads=8,
                             intermediate_size=2048, hidden_act="relu", norm_position="post",
                             position_embedding_type="sinusoidal", dropout=0.1, scale_embeddings=True,
                             share_embeddings=True, tie_word_embeddings=True),
    # P_drop 0.3 also on the sums of embeddings and positions (section 5.4), as the base model's 0.1
    "transformer-big": dict(hidden_size=1024, num_attention_heads=16, intermediate_size=4096, dropout=0.3,
                            embedding_dropout=0.3),
    "transformer-prenorm": dict(norm_position="pre", final_norm=True, hidden_size=512),
    "transformer-xavier": dict(norm_position="pre", share_embeddings=False, init_scheme="xavier",
                               scale_embeddings=True),
    "gpt2-small": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, max_position_embeddings=1024,
                       position_embedding_type="learned", norm_position="pre", hidden_act="gelu_tanh",
                       use_bias=True, final_norm=True, tie_word_embeddings=True),
    # minGPT's gpt-mini: 6 layers, 6 heads, 192 wide; a ReLU FFN 4 x wide
    "gpt-mini": dict(num_hidden_layers=6, num_attention_heads=6, hidden_size=192, intermediate_size=4 * 192,
                     position_embedding_type="learned", norm_position="pre", hidden_act="relu"),
    "llama-style": dict(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu", use_bias=False,
                        tie_word_embeddings=False),
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, norm_position="post",
                      position_embedding_type="learned", type_vocab_size=2, hidden_act="gelu"),
    "bert-prenorm": dict(norm_position="pre", position_embedding_type="sinusoidal", final_norm=True,
                         tie_word_embeddings=True, sparse_prediction=True),
}


def test_every_preset_is_described():
    assert set(STATED) == set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_builds_runs_and_has_the_stated_shape(name):
    config = get_preset(name)
    for field, value in STATED[name].items():
        assert getattr(config, field) == value, field
    family = PRESETS[name]["family"]
    model = AUTO_LM[family].from_config(config)
    ids = torch.randint(3, config.vocab_size, (2, 8))
    inputs = {"input_ids": ids, "labels": ids}
    if family == "seq2seq":
        inputs["labels"] = torch.randint(3, config.vocab_size, (2, 5))
    if family == "encoder":
        inputs["labels"] = torch.where(torch.rand(2, 8) < 0.3, ids, -100)
        inputs["labels"][0, 0] = ids[0, 0]
    loss = model(**inputs).loss
    loss.backward()
    assert torch.isfinite(loss)
    # `hf-scratch train` tells DDP so (ddp_find_unused_parameters=False): it no longer searches for unused ones
    assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []
    if config.tie_word_embeddings:
        target_embeddings = model.model.decoder if family == "seq2seq" else model
        assert model.get_output_embeddings().weight is target_embeddings.get_input_embeddings().weight


def test_llama_style_uses_grouped_query_attention():
    config = get_preset("llama-style")
    assert 1 < config.num_key_value_heads < config.num_attention_heads


def test_transformer_xavier_has_separate_vocabularies():
    config = get_preset("transformer-xavier")
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert model.model.encoder.get_input_embeddings() is not model.model.decoder.get_input_embeddings()


def test_transformer_base_has_about_65m_parameters():
    with torch.device("meta"):
        model = AutoModelForSeq2SeqLM.from_config(get_preset("transformer-base"))
    assert 60e6 < model.num_parameters() < 66e6


@pytest.mark.parametrize(
    "name, native",
    [("gpt2-small", lambda: GPT2LMHeadModel(GPT2Config())), ("bert-base", lambda: BertForMaskedLM(BertConfig()))],
)
def test_parameter_count_equals_the_native_model(name, native):
    with torch.device("meta"):
        ours = AUTO_LM[PRESETS[name]["family"]].from_config(get_preset(name))
        theirs = native()
    assert ours.num_parameters() == theirs.num_parameters()


@pytest.mark.parametrize(
    "name, native",
    [("gpt2-small", lambda: GPT2LMHeadModel(GPT2Config())), ("bert-base", lambda: BertForMaskedLM(BertConfig()))],
)
def test_gpt2_and_bert_presets_are_the_config_from_hf_gives_the_native_default(name, native):
    """Every field, not only the sizes the parameter count sees: a LayerNorm epsilon of another model (1e-5 for
    BERT's 1e-12) or GPT-2's <|endoftext|> id (50256) lost would change nothing a count or a forward checks."""
    with torch.device("meta"):
        model = native()
    assert get_preset(name).to_dict() == CONVERTERS[type(model).__name__].our_config(model).to_dict()


@pytest.mark.parametrize("name", sorted(name for name, preset in PRESETS.items() if preset["family"] == "seq2seq"))
def test_seq2seq_presets_take_the_ids_of_a_seq2seq_tokenizer_trained_here(name):
    """pad, bos, eos in the order `tokenizer_training` gives its special tokens, and the decoder starts at <s>, as
    `special_token_ids` of such a tokenizer says (a start at pad or eos trained the decoder on another first token)."""
    ids = {role: index for index, role in enumerate(SPECIAL_TOKENS["seq2seq"])}
    config = get_preset(name)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        ids["pad_token"], ids["bos_token"], ids["eos_token"], ids["bos_token"])


@pytest.mark.parametrize("name", sorted(name for name, preset in PRESETS.items() if preset["family"] != "seq2seq"))
@pytest.mark.parametrize("head", [AutoModelForSequenceClassification, AutoModelForTokenClassification,
                                  AutoModelForQuestionAnswering, AutoModelForMultipleChoice])
def test_every_parameter_of_a_classifier_takes_part_in_a_step(name, head):
    """`hf-scratch finetune` tells DDP so (ddp_find_unused_parameters=False); BERT's pooler too."""
    pooler = {"classifier_pooler": True} if PRESETS[name]["family"] == "encoder" else {}
    config = get_preset(name, num_hidden_layers=1, num_labels=3, pad_token_id=0, **pooler)
    if type(config) not in head._model_mapping:
        pytest.skip(f"no {head.__name__} for {config.model_type}")
    model = head.from_config(config)
    ids = torch.randint(3, config.vocab_size, (2, 3, 8) if head is AutoModelForMultipleChoice else (2, 8))
    labels = {
        AutoModelForSequenceClassification: {"labels": torch.randint(0, 3, (2,))},
        AutoModelForTokenClassification: {"labels": torch.randint(0, 3, (2, 8))},
        AutoModelForQuestionAnswering: {"start_positions": torch.tensor([1, 3]), "end_positions": torch.tensor([2, 7])},
        AutoModelForMultipleChoice: {"labels": torch.tensor([2, 0])},
    }[head]
    model(input_ids=ids, **labels).loss.backward()
    assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []


@pytest.mark.parametrize("name", ["gpt-mini", "llama-style", "bert-prenorm", "transformer-prenorm"])
def test_vocabulary_padded_to_a_multiple_of_64_still_trains(name):
    config = get_preset(name, vocab_size=8256, num_hidden_layers=1) if PRESETS[name]["family"] != "seq2seq" else (
        get_preset(name, vocab_size=8256, encoder_layers=1, decoder_layers=1))
    model = AUTO_LM[PRESETS[name]["family"]].from_config(config)
    ids = torch.randint(3, 8000, (2, 8))
    labels = torch.randint(3, 8000, (2, 5)) if PRESETS[name]["family"] == "seq2seq" else ids
    model(input_ids=ids, labels=labels).loss.backward()
    if PRESETS[name]["family"] != "encoder":
        out = model.generate(ids[:1], max_new_tokens=3, do_sample=False)
        assert out.shape[1] >= 3


def test_get_preset_returns_a_new_config_every_call():
    first, second = get_preset("gpt-mini"), get_preset("gpt-mini")
    assert first is not second
    first.vocab_size = 1
    assert get_preset("gpt-mini").vocab_size == PRESETS["gpt-mini"]["vocab_size"]


def test_get_preset_applies_overrides_and_validates():
    assert get_preset("gpt-mini", hidden_size=96, num_attention_heads=3).hidden_size == 96
    with pytest.raises(ValueError, match="hidden_size"):
        get_preset("gpt-mini", hidden_size=100)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_takes_a_small_vocabulary(name):
    """A tiny model from a preset, as with `GPT2Config(vocab_size=512)`: bos and eos past the vocabulary stay (GPT-2's
    50256), only the ids the model embeds (pad, the decoder's start) must be its tokens. A first check of the special
    ids refused `get_preset("gpt2-small", vocab_size=512)`."""
    config = get_preset(name, vocab_size=512)
    assert config.vocab_size == 512
    assert config.eos_token_id == get_preset(name).eos_token_id


def test_a_misspelt_field_is_named_with_the_field_it_resembles():
    # transformers' configs keep unknown keywords as attributes: `num_layers` would be saved and change nothing.
    with pytest.raises(ValueError, match=r"has no field num_layers \(did you mean num_hidden_layers\?\), zzz\.$"):
        get_preset("gpt-mini", num_layers=1, zzz=2)
    assert get_preset("gpt-mini", attn_implementation="eager")._attn_implementation == "eager"


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="gpt2-small"):
        get_preset("gpt5")


def test_overrides_take_the_keywords_the_configs_take():
    # SPEC section 3: `rope_theta` is RoPE's shorthand and `rope_parameters` its native form; a seq2seq
    # `num_hidden_layers` is the decoder's depth. All three were refused as "no field".
    assert get_preset("llama-style", rope_theta=500000.0).rope_parameters["rope_theta"] == 500000.0
    linear = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert get_preset("llama-style", rope_parameters=linear).rope_parameters["rope_type"] == "linear"
    assert get_preset("transformer-base", num_hidden_layers=2).decoder_layers == 2


def test_rope_settings_for_a_preset_without_rope_are_named():
    # The config drops them (configs saved with other position types carry defaults): given here they would do nothing.
    with pytest.raises(ValueError, match="rope_theta.*position_embedding_type='rope'"):
        get_preset("gpt-mini", rope_theta=500000.0)
    assert get_preset("gpt-mini", position_embedding_type="rope", rope_theta=5e5).rope_parameters["rope_theta"] == 5e5


@pytest.mark.parametrize(
    "name, native",
    [("gpt2-small", lambda: GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=24, n_head=2))),
     ("bert-base", lambda: BertForMaskedLM(BertConfig(num_hidden_layers=1, hidden_size=24, num_attention_heads=2,
                                                      intermediate_size=48)))],
)
def test_gpt2_and_bert_presets_drop_out_where_the_native_models_do(name, native):
    # GPT-2 and BERT have no dropout inside the MLP; the presets applied `dropout` there too (activation_dropout
    # None), so training from them was regularised differently from the native models they reproduce.
    from hf_scratch_transformer.conversion import from_hf

    rates = ("dropout", "attention_dropout", "embedding_dropout", "activation_dropout_rate")
    converted = from_hf(native()).config
    preset = get_preset(name)
    assert {rate: getattr(preset, rate) for rate in rates} == {rate: getattr(converted, rate) for rate in rates}
