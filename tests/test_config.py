"""Configuration: defaults resolved the native way, every impossible combination a ValueError naming the field."""

import json

import pytest
import torch
from tiny_models import FAMILIES, tiny_config
from transformers import AutoConfig, AutoModel

from hf_scratch_transformer import (
    ScratchDecoderConfig,
    ScratchDecoderForCausalLM,
    ScratchSeq2SeqConfig,
    ScratchSeq2SeqModel,
)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(hidden_size=30), "hidden_size"),
        (dict(num_key_value_heads=3), "num_key_value_heads"),
        (dict(hidden_act="tanh"), "hidden_act"),
        (dict(position_embedding_type="relative"), "position_embedding_type"),
        (dict(norm_type="batchnorm"), "norm_type"),
        (dict(norm_position="sandwich"), "norm_position"),
        (dict(init_scheme="kaiming"), "init_scheme"),
        (dict(position_embedding_type="rope", hidden_size=36, num_attention_heads=12), "rope"),
        (dict(dropout=1.5), "dropout"),
        (dict(attention_dropout=-0.1), "attention_dropout"),
        (dict(embedding_dropout=1.0), "embedding_dropout"),  # the bound itself: a rate of 1 zeroes everything
        (dict(vocab_size=0), "vocab_size"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps"),
        # the padding row of a vocabulary of 99: was an AssertionError from `nn.Embedding` when the model was built
        (dict(pad_token_id=99), "pad_token_id"),
        # Accepted until 2026-12-01: a nan epsilon made every output nan; a negative pad made the last token the
        # padding row (zero, no gradient); a float id failed at the first forward with an IndexError.
        (dict(layer_norm_eps=float("nan")), "`layer_norm_eps` must be a positive finite number, got nan"),
        (dict(initializer_range=float("inf")), "`initializer_range` must be a positive finite number, got inf"),
        (dict(pad_token_id=-1), r"`pad_token_id` \(-1\) must be a token of the vocabulary: an integer from 0 to below "
                                r"`vocab_size` \(99\)"),
        (dict(pad_token_id=1.0), r"`pad_token_id` \(1.0\) must be a token"),
        (dict(eos_token_id=-1), r"`eos_token_id` \(-1\) must be a token of the vocabulary: an integer from 0\.$"),
        (dict(eos_token_id=[2, 1.5]), r"`eos_token_id` \(\[2, 1.5\]\) must be a token"),
        (dict(bos_token_id=-2), "`bos_token_id`"),
        # transformers checks the RoPE keys, not this value: a string (`--set rope_theta=10_000`, no JSON number)
        # was a TypeError building the model, after a training command's data work; 0 gave frequencies of inf.
        (dict(position_embedding_type="rope", rope_theta="10_000"), "`rope_theta` must be a number, got '10_000'"),
        (dict(position_embedding_type="rope", rope_theta=0.0), "`rope_theta` must be a positive finite number"),
    ],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_invalid_common_knob_names_the_field(family, overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(family, **overrides)


@pytest.mark.parametrize(
    "family, overrides, field",
    [
        ("decoder", dict(num_hidden_layers=0), "num_hidden_layers"),
        ("decoder", dict(sliding_window=0), "sliding_window"),
        ("encoder", dict(type_vocab_size=-1), "type_vocab_size"),
        # a bool is an int to Python: `True` reached `nn.Embedding` and failed there with a TypeError
        ("encoder", dict(type_vocab_size=True), "type_vocab_size"),
        ("encoder", dict(classifier_dropout=2.0), "classifier_dropout"),
        ("decoder", dict(classifier_dropout=-0.5), "classifier_dropout"),
        ("encoder", dict(sliding_window=4), "sliding_window"),  # was kept, and did nothing
        ("seq2seq", dict(encoder_layers=0), "encoder_layers"),
        ("seq2seq", dict(encoder_vocab_size=50), "share_embeddings"),
        ("seq2seq", dict(decoder_start_token_id=99), "decoder_start_token_id"),  # a decoder input past the rows
        # the encoder's embeddings pad with the same id
        ("seq2seq", dict(encoder_vocab_size=50, share_embeddings=False, pad_token_id=60), "pad_token_id"),
        # generate() would build the cross-attention cache windowed too, keeping only the last encoder tokens
        ("seq2seq", dict(sliding_window=4), "sliding_window"),
        # `generate()` takes its encoder-decoder path or not from it: the other value ended in errors about inputs
        ("seq2seq", dict(is_encoder_decoder=False), "is_encoder_decoder"),
        ("decoder", dict(is_encoder_decoder=True), "is_encoder_decoder"),
        ("encoder", dict(is_encoder_decoder=True), "is_encoder_decoder"),
        ("decoder", dict(position_embedding_type="rope", rope_parameters="yarn"), "rope_parameters"),
        ("decoder", dict(position_embedding_type="rope", rope_parameters={"rope_type": "linear"}), "rope_parameters"),
        # `num_hidden_layers` is the seq2seq decoder's depth (`attribute_map`), set after the checks: 0 was accepted
        ("seq2seq", dict(num_hidden_layers=0), "decoder_layers"),
        # Another family's knob was kept as an extra attribute that did nothing: a decoder given `type_vocab_size`
        # (as its error for `token_type_ids` advises) still refused token types; an encoder kept `share_embeddings`.
        ("decoder", dict(type_vocab_size=2), "type_vocab_size.*ScratchEncoderConfig"),
        ("decoder", dict(sparse_prediction=True), "sparse_prediction"),
        ("decoder", dict(encoder_layers=2), "encoder_layers.*ScratchSeq2SeqConfig"),
        ("encoder", dict(share_embeddings=False), "share_embeddings"),
        ("encoder", dict(output_bias=True), "output_bias"),
        ("seq2seq", dict(mlm_transform=True), "mlm_transform"),
        ("seq2seq", dict(classifier_dropout=0.2), "classifier_dropout"),
    ],
)
def test_invalid_family_knob_names_the_field(family, overrides, field):
    with pytest.raises(ValueError, match=field):
        tiny_config(family, **overrides)


@pytest.mark.parametrize("family", FAMILIES)
def test_head_dim_is_accepted_when_it_is_the_one_the_model_has(family):
    # Native configs (Llama) take `head_dim`; ours derives it, and setting it failed with an AttributeError
    # ("property 'head_dim' ... has no setter") after a dump of the whole config.
    assert tiny_config(family, head_dim=8).head_dim == 8  # hidden_size 32 / 4 heads
    with pytest.raises(ValueError, match="head_dim"):
        tiny_config(family, head_dim=16)


def test_key_value_heads_resolve_to_attention_heads():
    assert tiny_config("decoder").num_key_value_heads == 4
    assert tiny_config("decoder", num_key_value_heads=1).num_key_value_heads == 1


def test_intermediate_size_defaults_to_four_times_hidden():
    assert ScratchDecoderConfig(hidden_size=64, num_attention_heads=4).intermediate_size == 256


def test_rope_theta_is_a_shorthand_for_rope_parameters(tmp_path):
    config = tiny_config("decoder", position_embedding_type="rope", rope_theta=500.0)
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 500.0}
    config.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters["rope_theta"] == 500.0


def test_rope_scaling_types_are_accepted():
    config = tiny_config(
        "decoder", position_embedding_type="rope", rope_parameters={"rope_type": "linear", "factor": 2.0}
    )
    assert config.rope_parameters["rope_type"] == "linear"


def test_partial_rotary_factor_is_refused_with_a_scaled_rope_type():
    """These models rotate the whole head. A scaled type's tables then cover part of it, and the first forward failed
    on their shapes ("size of tensor a (8) must match ... b (4)"), native Llama alike; the default type ignores the
    factor, as native Llama does, so that one is kept."""
    scaled = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        tiny_config("decoder", position_embedding_type="rope", rope_parameters=scaled, partial_rotary_factor=0.5)
    config = tiny_config("decoder", position_embedding_type="rope", partial_rotary_factor=0.5)
    assert ScratchDecoderForCausalLM(config)(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, config.vocab_size)


@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned", "alibi"])
@pytest.mark.parametrize("family", FAMILIES)
def test_only_rope_configs_have_rope_parameters(family, position_embedding_type, tmp_path):
    """As on native configs: transformers (and its common tests) takes a config with `rope_parameters` for RoPE."""
    config = tiny_config(family, position_embedding_type=position_embedding_type)
    assert not hasattr(config, "rope_parameters")
    config.save_pretrained(tmp_path)
    assert "rope" not in (tmp_path / "config.json").read_text()
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert not hasattr(reloaded, "rope_parameters")
    assert reloaded.to_diff_dict() == config.to_diff_dict()


def test_rope_settings_of_other_position_types_are_dropped(tmp_path):
    """Configs saved before `rope_parameters` became RoPE-only stored a default one; they load without it."""
    stored = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": 500.0}
    config = tiny_config("decoder", position_embedding_type="learned", **stored)
    assert not hasattr(config, "rope_parameters") and not hasattr(config, "rope_theta")
    assert not hasattr(ScratchDecoderConfig.from_dict({**config.to_dict(), **stored}), "rope_parameters")


def test_changing_the_position_type_adds_or_removes_rope_parameters():
    config = tiny_config("decoder", position_embedding_type="learned")
    config.position_embedding_type = "rope"
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    config.position_embedding_type = "alibi"
    assert not hasattr(config, "rope_parameters")


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 500.0},
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32},
        {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
         "original_max_position_embeddings": 32},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 32},
    ],
    ids=lambda rope: rope["rope_type"],
)
def test_rope_parameters_of_every_type_survive_save_and_reload(rope_parameters, tmp_path):
    given = dict(rope_parameters)
    config = tiny_config("decoder", position_embedding_type="rope", rope_parameters=given)
    assert given == rope_parameters, "the caller's dict is not modified"
    assert config.rope_parameters["rope_type"] == rope_parameters["rope_type"]
    config.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters == config.rope_parameters


def test_seq2seq_num_hidden_layers_is_the_decoder_depth():
    config = ScratchSeq2SeqConfig(encoder_layers=3, decoder_layers=1)
    assert config.num_hidden_layers == 1
    assert config.get_text_config(decoder=True).num_hidden_layers == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_config_round_trips_through_auto_config(family, tmp_path):
    config = tiny_config(family, norm_type="rmsnorm", hidden_act="swiglu")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is type(config)
    assert loaded.to_diff_dict() == config.to_diff_dict()


@pytest.mark.parametrize(
    "family, overrides, field",
    [
        ("decoder", dict(dropout=1.5), "dropout"),
        ("decoder", dict(position_embedding_type="relative"), "position_embedding_type"),  # loaded without positions
        ("decoder", dict(norm_type="batchnorm"), "norm_type"),  # loaded with a LayerNorm
        ("decoder", dict(num_attention_heads=5), "hidden_size"),
        ("decoder", dict(pad_token_id=500), "pad_token_id"),  # an AssertionError from nn.Embedding
        ("decoder", dict(is_encoder_decoder=True), "is_encoder_decoder"),
        ("encoder", dict(type_vocab_size=-1), "type_vocab_size"),
        ("encoder", dict(sliding_window=4), "sliding_window"),
        ("decoder", dict(type_vocab_size=2), "type_vocab_size"),  # kept as an attribute, and no token types
        ("seq2seq", dict(num_hidden_layers=0), "decoder_layers"),
        ("seq2seq", dict(encoder_vocab_size=50), "share_embeddings"),
        ("seq2seq", dict(head_dim=16), "head_dim"),  # an AttributeError: "property 'head_dim' ... has no setter"
        ("decoder", dict(position_embedding_type="rope", rope_parameters={"rope_type": "linear"}), "rope_parameters"),
    ],
)
def test_from_pretrained_overrides_are_checked_as_in_the_constructor(family, overrides, field, tmp_path):
    """`from_pretrained(folder, knob=value)` (AutoConfig's and the models'): transformers set such overrides on the
    config built from the saved values, past every check, so that a model without positions or with the wrong norm
    loaded without a word."""
    tiny_config(family).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=field):
        AutoConfig.from_pretrained(tmp_path, **overrides)
    with pytest.raises(ValueError, match=field):
        AutoModel.from_pretrained(tmp_path, **overrides)


def test_from_pretrained_overrides_that_work_are_applied(tmp_path):
    ScratchSeq2SeqModel(tiny_config("seq2seq", position_embedding_type="rope")).save_pretrained(tmp_path)
    rope_parameters = {"rope_type": "default", "rope_theta": 500.0}
    config, unused = AutoConfig.from_pretrained(
        tmp_path, num_hidden_layers=3, dropout=0.3, head_dim=8, rope_parameters=rope_parameters, num_labels=5, foo=1,
        return_unused_kwargs=True,
    )
    assert (config.decoder_layers, config.encoder_layers, config.dropout) == (3, 2, 0.3)
    assert config.rope_parameters["rope_theta"] == 500.0
    assert config.num_labels == 5 and unused == {"foo": 1}
    model = AutoModel.from_pretrained(tmp_path, dropout=0.2, dtype=torch.bfloat16)
    assert model.config.dropout == 0.2 and model.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "saved, overrides, expected",
    [
        ({"rope_theta": 10000.0}, dict(rope_theta=500.0), {"rope_type": "default", "rope_theta": 500.0}),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0}), dict(rope_theta=500.0),
         {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}),
        ({"rope_theta": 500.0}, dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
         {"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0}),
    ],
)
def test_from_pretrained_takes_the_rope_shorthands_over_saved_rope_parameters(saved, overrides, expected, tmp_path):
    # SPEC section 3: `rope_theta` is accepted as a shorthand. Given to `from_pretrained` it was dropped: the saved
    # `rope_parameters` won in the constructor, and the model kept its old frequencies without a word.
    tiny_config("decoder", position_embedding_type="rope", **saved).save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path, **overrides).rope_parameters == expected


def _activation_dropout_rates(model) -> set:
    return {module.activation_dropout.p for module in model.modules() if hasattr(module, "down_proj")}


@pytest.mark.parametrize("family", FAMILIES)
def test_activation_dropout_left_unset_follows_dropout_after_saving(family, tmp_path):
    """`activation_dropout=None` means "the same as `dropout`": it was saved resolved (0.3 here), so lowering
    `dropout` in config.json or in `from_pretrained(folder, dropout=0.0)` kept the FFN's old rate."""
    AutoModel.from_config(tiny_config(family, dropout=0.3)).save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    assert json.loads(config_file.read_text())["activation_dropout"] is None
    assert _activation_dropout_rates(AutoModel.from_pretrained(tmp_path)) == {0.3}
    assert _activation_dropout_rates(AutoModel.from_pretrained(tmp_path, dropout=0.0)) == {0.0}
    config_file.write_text(config_file.read_text().replace('"dropout": 0.3', '"dropout": 0.1'))
    assert _activation_dropout_rates(AutoModel.from_pretrained(tmp_path)) == {0.1}


@pytest.mark.parametrize("family", FAMILIES)
def test_activation_dropout_set_or_saved_resolved_stays_as_it_is(family, tmp_path):
    """A rate given explicitly is kept apart from `dropout`, and folders saved with the resolved rate load the same."""
    config = tiny_config(family, dropout=0.3, activation_dropout=0.2)
    AutoModel.from_config(config).save_pretrained(tmp_path)
    assert _activation_dropout_rates(AutoModel.from_pretrained(tmp_path, dropout=0.0)) == {0.2}
    assert AutoConfig.from_pretrained(tmp_path).to_diff_dict() == config.to_diff_dict()
    config_file = tmp_path / "config.json"  # a folder saved before: `activation_dropout` equal to `dropout`
    config_file.write_text(config_file.read_text().replace('"activation_dropout": 0.2', '"activation_dropout": 0.3'))
    assert _activation_dropout_rates(AutoModel.from_pretrained(tmp_path, dropout=0.0)) == {0.3}
