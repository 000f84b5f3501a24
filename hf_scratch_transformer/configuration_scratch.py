"""Configurations of the three Scratch families: decoder (causal LM), encoder (masked LM) and seq2seq.

`ScratchConfigBase` holds the knobs shared by all three (SPEC section 3) and validates them; each family
adds its own layer counts and options. Configs are `transformers` v5 dataclasses: typed fields, defaults
resolved in `__post_init__`, and every impossible combination rejected there with a `ValueError` that
names the field (the `@strict` validators would raise a different exception type).

This file is copied next to saved models for `trust_remote_code`: it imports only `transformers`.
"""

import dataclasses
import math
from typing import ClassVar

from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

HIDDEN_ACTS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned", "rope", "alibi")
SINUSOIDAL_LAYOUTS = ("interleaved", "split")
NORM_TYPES = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
INIT_SCHEMES = ("normal", "xavier")
# What `PreTrainedConfig` reads as RoPE settings: kept on RoPE configs only.
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling")
# Fields of transformers' own config (dtype, labels, ...), which `from_dict` handles itself.
BASE_FIELDS = {field.name for field in dataclasses.fields(PreTrainedConfig)}


def own_fields(config_class: type[PreTrainedConfig]) -> set[str]:
    """The fields a config class adds to transformers' (BASE_FIELDS): the model's knobs."""
    return {field.name for field in dataclasses.fields(config_class)} - BASE_FIELDS


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")


def _check_positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


def _check_number(name: str, value) -> None:
    # An int is a fine float (JSON writes 0.0 as 0); a bool or a string ("0.1") would fail later, naming no field.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"`{name}` must be a number, got {value!r} ({type(value).__name__}).")


def _check_positive_number(name: str, value) -> None:
    _check_number(name, value)
    if not 0 < value < math.inf:  # nan too: a `layer_norm_eps` of nan built a model whose every output was nan
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}.")


def _check_probability(name: str, value) -> None:
    _check_number(name, value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value!r}.")


# How dataclass fields of True/False knobs are typed (the second kind may be None).
_BOOL_TYPES, _OPTIONAL_BOOL_TYPES = (bool, "bool"), (bool | None, "bool | None")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}).")


def _with_rope_shorthands(config_dict: dict, overrides: dict) -> dict:
    """The saved values with the overrides. The constructor takes `rope_parameters` over the shorthands `rope_theta`
    and `rope_scaling`, so saved parameters would win over a shorthand given now: the saved ones are split into the
    shorthands instead, under the given ones."""
    shorthands = {key: overrides.pop(key) for key in ("rope_theta", "rope_scaling") if key in overrides}
    saved = config_dict.get("rope_parameters")
    if shorthands and "rope_parameters" not in overrides and isinstance(saved, dict):
        scaling = {key: value for key, value in saved.items() if key != "rope_theta"}
        shorthands = {"rope_theta": saved.get("rope_theta"), "rope_scaling": scaling, **shorthands}
        config_dict = {key: value for key, value in config_dict.items() if key != "rope_parameters"}
    return {**config_dict, **shorthands, **overrides}


class ScratchConfigBase(PreTrainedConfig):
    """Knobs shared by every Scratch family. Not registered on its own: use one of the three subclasses."""

    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]  # the names before/from 5.24
    # Auto class -> "module.Class" of every class of the family. The package registers them from this table, and
    # `save_pretrained` writes it as `auto_map` so that each head loads with `trust_remote_code=True`.
    family_auto_map: ClassVar[dict[str, str]] = {}
    # Pipeline tasks of our own that saved folders declare in `custom_pipelines` (format of `Pipeline.save_pretrained`).
    family_custom_pipelines: ClassVar[dict[str, dict]] = {}
    # What `is_encoder_decoder` must be: `generate()` picks its encoder-decoder path from it, and the other value
    # ends in errors about missing inputs that the caller never had to pass.
    family_is_encoder_decoder: ClassVar[bool] = False

    vocab_size: int = 32000
    hidden_size: int = 512
    num_attention_heads: int = 8
    # None = multi-head attention; stored resolved (as Llama does) because caches read it.
    num_key_value_heads: int | None = None
    # None = 4 * hidden_size, the paper's ratio.
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    position_embedding_type: str = "learned"
    # Sinusoid table layout: "interleaved" (sin, cos, sin, ... as in the paper) or "split" (all sines, then all
    # cosines, as tensor2tensor, fairseq and Marian store it). The same frequencies either way.
    sinusoidal_layout: str = "interleaved"
    # RoPE the native way: `rope_parameters` (a dict with `rope_type`, `rope_theta` and the scaling type's keys) feeds
    # transformers' ROPE_INIT_FUNCTIONS; `rope_theta=...` (and the legacy `rope_scaling=...`) is accepted as a
    # shorthand and folded into it by `PreTrainedConfig.__post_init__`. Not a field: the attribute exists only while
    # `position_embedding_type="rope"` (see `_take_rope_parameters`).
    norm_type: str = "layernorm"
    norm_position: str = "pre"
    layer_norm_eps: float = 1e-5
    final_norm: bool = True
    use_bias: bool = True
    dropout: float = 0.1
    attention_dropout: float = 0.0
    # Dropout on the feed-forward's hidden activation; None = `dropout` (GPT-2 and BERT have none there). Kept None
    # (also in config.json) and read through `activation_dropout_rate`, so that a later `dropout` carries over.
    activation_dropout: float | None = None
    embedding_dropout: float = 0.0
    scale_embeddings: bool = False
    # A norm over the summed embeddings, before the first block (BERT, Cramming).
    embedding_norm: bool = False
    # The output projection is the (target-side) token embedding matrix. In seq2seq this concerns the head only;
    # sharing the encoder's and decoder's embeddings is `share_embeddings`.
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    init_scheme: str = "normal"
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        # The keys of `attribute_map` (a seq2seq `num_hidden_layers` is its `decoder_layers`) would be set by the base
        # after the checks: set first, they are checked as the model reads them.
        for key in [key for key in kwargs if key in self.attribute_map]:
            setattr(self, key, kwargs.pop(key))
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        self._validate_common()
        self._refuse_other_families_knobs(kwargs)
        self._validate_family()
        self._check_special_token_ids()  # against the sizes checked above
        # Native configs (Llama) take `head_dim`; ours is derived (a property), which transformers could not set.
        head_dim = kwargs.pop("head_dim", None)
        if head_dim is not None and head_dim != self.head_dim:
            raise ValueError(
                f"`head_dim` is `hidden_size // num_attention_heads` = {self.head_dim} in these models, "
                f"got {head_dim!r}."
            )
        self._take_rope_parameters(kwargs)
        super().__post_init__(**kwargs)
        if self.position_embedding_type == "rope":
            try:  # transformers' check of the keys each `rope_type` needs, which raises KeyError
                self.validate_rope()
            except KeyError as error:
                raise ValueError(f"`rope_parameters`: {error.args[0]}") from None
            # transformers checks the keys, not this value: a string (`--set rope_theta=10_000`, no JSON number)
            # failed building the model with a TypeError, after a training command's data work; 0 or less gave
            # rotation frequencies of inf or nan.
            _check_positive_number("rope_theta", self.rope_parameters.get("rope_theta"))
            self._check_partial_rotary()

    def _check_partial_rotary(self) -> None:
        """These models apply the tables to the whole head, as native Llama and Mistral do: the default RoPE ignores
        `partial_rotary_factor` (both), "proportional" pads its tables to the head, but the other scaled types make
        tables for part of the head, on which the first forward failed (native Llama alike)."""
        rope_type, factor = self.rope_parameters["rope_type"], self.rope_parameters.get("partial_rotary_factor", 1.0)
        if factor == 1.0 or rope_type == "default":
            return
        frequencies, _ = ROPE_INIT_FUNCTIONS[rope_type](self)
        if len(frequencies) != self.head_dim // 2:
            raise ValueError(
                f"`partial_rotary_factor` {factor!r} with `rope_type` {rope_type!r} makes tables for "
                f"{2 * len(frequencies)} of each head's {self.head_dim} dimensions, and these models rotate the whole "
                "head: remove `partial_rotary_factor` (the default `rope_type` ignores it, as native Llama does)."
            )

    def _take_rope_parameters(self, kwargs: dict) -> None:
        """`rope_parameters` exists on a RoPE config only, as on native configs: transformers (and its common tests)
        takes any config that has the attribute for a rotary model. A RoPE config gets it before
        `PreTrainedConfig.__post_init__`, which folds `rope_theta` / `rope_scaling` into it and standardizes it
        (`{"rope_type": "default", "rope_theta": 10000.0}` when none is given). Other position types drop those keys,
        as they always ignored them (configs saved before this change stored a default `rope_parameters`)."""
        if self.position_embedding_type == "rope":
            rope_parameters = kwargs.pop("rope_parameters", None)
            if rope_parameters is not None and not isinstance(rope_parameters, dict):
                raise ValueError(f"`rope_parameters` must be a dict, got {rope_parameters!r}.")
            # A copy: standardizing adds keys, which must not land in the caller's dict.
            self.rope_parameters = dict(rope_parameters) if rope_parameters is not None else None
        else:
            for key in ROPE_KEYS:
                kwargs.pop(key, None)

    def __setattr__(self, key, value):
        """A change of `position_embedding_type` after construction adds the default `rope_parameters` (switching
        to RoPE) or removes them (switching away), so that the attribute exists exactly on RoPE configs."""
        super().__setattr__(key, value)
        if key != "position_embedding_type" or not getattr(self, "_post_init_done", False):
            return
        has_rope_parameters = "rope_parameters" in self.__dict__
        if value == "rope" and not has_rope_parameters:
            self.rope_parameters = None
            self.convert_rope_params_to_dict()
        elif value != "rope" and has_rope_parameters:
            del self.rope_parameters

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """`from_pretrained(folder, knob=value)`, of AutoConfig and of the models, comes here with the saved values and
        the overrides. transformers sets the overrides on the config built from the saved values, past every check
        of `__post_init__`: a `dropout` of 1.5, an unknown `position_embedding_type` (a model without positions) or
        `norm_type` loaded without a word, and `head_dim` failed with "property has no setter". Our knobs go to the
        constructor instead, with the saved values; the rest (`num_labels`, `dtype`, ...) as transformers does."""
        cls._refuse_another_model_type(config_dict.get("model_type"))
        knobs = own_fields(cls).union(*FAMILY_KNOBS.values())  # another family's: refused by the constructor
        knobs |= {"is_encoder_decoder", "head_dim", *ROPE_KEYS, *cls.attribute_map}
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in knobs}
        # Until 2026-11-29 `--set KEY=False` saved the string "False", which the models took as true: a folder saved
        # so was built and trained with the knob on. Refused as any string is, saying what loads it as trained.
        for field in dataclasses.fields(cls):
            value = {**config_dict, **overrides}.get(field.name)
            if field.type in _BOOL_TYPES + _OPTIONAL_BOOL_TYPES and isinstance(value, str) and value:
                raise ValueError(
                    f"`{field.name}` is the string {value!r} in this saved config: `--set {field.name}={value}` wrote "
                    "it so before 2026-11-29, and the model took any such string as true, so it was built and trained "
                    f"with `{field.name}` true. Write true there (JSON) to load the model as it was trained."
                )
        return super().from_dict(_with_rope_shorthands(config_dict, overrides), **kwargs)

    @classmethod
    def _refuse_another_model_type(cls, model_type: str | None) -> None:
        """A saved config of another model type: `from_pretrained` only logged a warning, then built this family's
        model with the weights it found. A native GPT-2 folder gave a randomly initialised model (its tensors have
        other names), a decoder's folder loaded into the encoder ran its causal weights bidirectionally."""
        if model_type in (None, cls.model_type):
            return
        ours = {config_class.model_type: config_class.__name__ for config_class in FAMILY_KNOBS}
        advice = (f"it is a {ours[model_type]}: load it with that family's classes, or with the Auto classes, which "
                  "read its type" if model_type in ours else "a native model converts to this package's first "
                  "(`hf-scratch convert FOLDER OUTPUT`, `hf_scratch_transformer.conversion.from_hf`)")
        raise ValueError(
            f"{cls.__name__} builds `model_type` {cls.model_type!r} models, and this config is of {model_type!r}, "
            f"whose weights it would not fit: {advice}."
        )

    def _validate_family(self) -> None:
        """The family's own checks."""

    def _refuse_other_families_knobs(self, kwargs: dict) -> None:
        """A knob of another family (`kwargs`: the arguments that are not this config's fields) would be kept as an
        extra attribute that nothing here reads: a decoder given `type_vocab_size` still has no token types. Worse,
        `sliding_window` is read by transformers' masks and caches, and would window a seq2seq cross-attention cache.
        None (unset) passes."""
        for key, value in kwargs.items():
            owners = [config_class.__name__ for config_class, knobs in FAMILY_KNOBS.items() if key in knobs]
            if owners and value is not None:
                raise ValueError(
                    f"`{key}` is a knob of {' and '.join(owners)} only; {type(self).__name__} would keep it and "
                    "ignore it."
                )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def activation_dropout_rate(self) -> float:
        """The feed-forward's dropout rate: `activation_dropout`, or `dropout` where that is None."""
        return self.dropout if self.activation_dropout is None else self.activation_dropout

    def _check_special_token_ids(self) -> None:
        """Each special id is an integer from 0, and the ids the model embeds (pad, a padding row of every token
        embedding, the seq2seq encoder's too; the decoder's start token) are tokens of their vocabulary. Out of range,
        `nn.Embedding` failed with an AssertionError naming no field (pad), or nothing failed: a negative pad made the
        last token the padding row (no gradient); a float pad failed at the first forward with an IndexError. bos and
        eos past the vocabulary stay allowed, as native configs allow them: `get_preset("gpt2-small", vocab_size=512)`
        keeps GPT-2's 50256, as `GPT2Config(vocab_size=512)` does."""
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value, vocabulary = getattr(self, name, None), "vocab_size"
            source_size = getattr(self, "encoder_vocab_size", None) or self.vocab_size
            if name == "pad_token_id" and source_size < self.vocab_size:
                vocabulary = "encoder_vocab_size"  # the smaller of the two embeddings it pads
            size = getattr(self, vocabulary) if name in ("pad_token_id", "decoder_start_token_id") else math.inf
            for token_id in value if isinstance(value, list) else [value]:
                if token_id is not None and (not isinstance(token_id, int) or isinstance(token_id, bool)
                                             or not 0 <= token_id < size):
                    bound = "" if size == math.inf else f" to below `{vocabulary}` ({size})"
                    raise ValueError(f"`{name}` ({value!r}) must be a token of the vocabulary: an integer from "
                                     f"0{bound}.")

    def _validate_common(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                     "intermediate_size", "max_position_embeddings"):
            _check_positive(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})."
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be divisible by `num_key_value_heads` "
                f"({self.num_key_value_heads})."
            )
        _check_choice("hidden_act", self.hidden_act, HIDDEN_ACTS)
        _check_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        _check_choice("sinusoidal_layout", self.sinusoidal_layout, SINUSOIDAL_LAYOUTS)
        _check_choice("norm_type", self.norm_type, NORM_TYPES)
        _check_choice("norm_position", self.norm_position, NORM_POSITIONS)
        _check_choice("init_scheme", self.init_scheme, INIT_SCHEMES)
        if self.position_embedding_type == "rope" and self.head_dim % 2 != 0:
            raise ValueError(f"`position_embedding_type='rope'` needs an even head size, got {self.head_dim}.")
        if self.position_embedding_type == "sinusoidal" and self.hidden_size % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even `hidden_size`, got {self.hidden_size}.")
        for name in ("dropout", "attention_dropout", "embedding_dropout"):
            _check_probability(name, getattr(self, name))
        if self.activation_dropout is not None:
            _check_probability("activation_dropout", self.activation_dropout)
        for name in ("layer_norm_eps", "initializer_range"):
            _check_positive_number(name, getattr(self, name))
        # Every True/False knob, PreTrainedConfig's too: `--set tie_word_embeddings=False` gave the string "False",
        # which is true, and the head stayed tied without a word.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name, None)
            if field.type in _BOOL_TYPES or (field.type in _OPTIONAL_BOOL_TYPES and value is not None):
                _check_bool(field.name, value)
        if self.is_encoder_decoder != self.family_is_encoder_decoder:
            raise ValueError(
                f"`is_encoder_decoder` must be {self.family_is_encoder_decoder} for {type(self).__name__} (it says "
                f"whether the family's models are encoder-decoders), got {self.is_encoder_decoder!r}."
            )


class ScratchDecoderConfig(ScratchConfigBase):
    """GPT-style decoder-only causal language model, and its sequence and token classifiers and question answerer."""

    model_type = "scratch_decoder"
    family_auto_map = {
        "AutoConfig": "configuration_scratch.ScratchDecoderConfig",
        "AutoModel": "modeling_scratch_decoder.ScratchDecoderModel",
        "AutoModelForCausalLM": "modeling_scratch_decoder.ScratchDecoderForCausalLM",
        "AutoModelForSequenceClassification": "modeling_scratch_decoder.ScratchDecoderForSequenceClassification",
        "AutoModelForTokenClassification": "modeling_scratch_decoder.ScratchDecoderForTokenClassification",
        "AutoModelForQuestionAnswering": "modeling_scratch_decoder.ScratchDecoderForQuestionAnswering",
    }

    num_hidden_layers: int = 6
    # None = full causal attention; an int = each token sees itself and the previous `sliding_window - 1` tokens.
    sliding_window: int | None = None
    # The token classifier's input dropout; None = `dropout`.
    classifier_dropout: float | None = None

    def _validate_family(self) -> None:
        _check_positive("num_hidden_layers", self.num_hidden_layers)
        if self.sliding_window is not None:
            _check_positive("sliding_window", self.sliding_window)
        if self.classifier_dropout is not None:
            _check_probability("classifier_dropout", self.classifier_dropout)


class ScratchEncoderConfig(ScratchConfigBase):
    """BERT-style bidirectional encoder for masked LM, sequence and token classification, question answering and
    multiple choice."""

    model_type = "scratch_encoder"
    family_auto_map = {
        "AutoConfig": "configuration_scratch.ScratchEncoderConfig",
        "AutoModel": "modeling_scratch_encoder.ScratchEncoderModel",
        "AutoModelForMaskedLM": "modeling_scratch_encoder.ScratchEncoderForMaskedLM",
        "AutoModelForSequenceClassification": "modeling_scratch_encoder.ScratchEncoderForSequenceClassification",
        "AutoModelForTokenClassification": "modeling_scratch_encoder.ScratchEncoderForTokenClassification",
        "AutoModelForQuestionAnswering": "modeling_scratch_encoder.ScratchEncoderForQuestionAnswering",
        "AutoModelForMultipleChoice": "modeling_scratch_encoder.ScratchEncoderForMultipleChoice",
    }

    num_hidden_layers: int = 6
    # 0 = no token-type (segment) embeddings.
    type_vocab_size: int = 0
    # With `labels`, the MLM head projects only the labelled positions (same loss, less compute).
    sparse_prediction: bool = False
    # BERT's MLM "transform": dense + activation + norm before the vocabulary projection.
    mlm_transform: bool = False
    # BERT's pooler before the sequence classifier: [CLS]'s hidden state through a dense layer and tanh.
    classifier_pooler: bool = False
    # None = `dropout`.
    classifier_dropout: float | None = None

    def _validate_family(self) -> None:
        _check_positive("num_hidden_layers", self.num_hidden_layers)
        # A bool is an int to Python, and `nn.Embedding(True, ...)` fails with a TypeError naming no field.
        type_vocab_size = self.type_vocab_size
        if not isinstance(type_vocab_size, int) or isinstance(type_vocab_size, bool) or type_vocab_size < 0:
            raise ValueError(f"`type_vocab_size` must be a non-negative integer, got {self.type_vocab_size!r}.")
        if self.classifier_dropout is not None:
            _check_probability("classifier_dropout", self.classifier_dropout)


class ScratchSeq2SeqConfig(ScratchConfigBase):
    """Encoder-decoder Transformer of "Attention Is All You Need". `vocab_size` is the target vocabulary."""

    model_type = "scratch_seq2seq"
    family_auto_map = {
        "AutoConfig": "configuration_scratch.ScratchSeq2SeqConfig",
        "AutoModel": "modeling_scratch_seq2seq.ScratchSeq2SeqModel",
        "AutoModelForSeq2SeqLM": "modeling_scratch_seq2seq.ScratchSeq2SeqForConditionalGeneration",
    }
    family_custom_pipelines = {
        "scratch-text2text": {
            "impl": "pipeline_scratch_text2text.ScratchText2TextPipeline",
            "pt": ["AutoModelForSeq2SeqLM"],
            "type": "text",
        }
    }
    # `d_model`: the width's name in transformers' encoder-decoders (Marian, BART, T5), which code written for them
    # reads (`Seq2SeqLMExportableModule.export()` sizes its example encoder states by it).
    attribute_map: ClassVar[dict[str, str]] = {"num_hidden_layers": "decoder_layers", "d_model": "hidden_size"}
    family_is_encoder_decoder = True

    encoder_layers: int = 6
    decoder_layers: int = 6
    # None = one vocabulary shared by source and target.
    encoder_vocab_size: int | None = None
    # Encoder and decoder token embeddings are one matrix (needs a shared vocabulary): fairseq's
    # `--share-all-embeddings` without the head. Independent of `tie_word_embeddings`, which ties the output
    # projection to the decoder's embeddings (`--share-decoder-input-output-embed`): both = one matrix for all three;
    # `share_embeddings` alone = one input matrix and an output head of its own.
    share_embeddings: bool = True
    # A bias on the output projection (Marian's `final_logits_bias`).
    output_bias: bool = False
    decoder_start_token_id: int | None = None
    is_encoder_decoder: bool = True

    def _validate_family(self) -> None:
        _check_positive("encoder_layers", self.encoder_layers)
        _check_positive("decoder_layers", self.decoder_layers)
        if self.encoder_vocab_size is not None:
            _check_positive("encoder_vocab_size", self.encoder_vocab_size)
            if self.share_embeddings:
                raise ValueError(
                    "`share_embeddings=True` needs one shared vocabulary: set `encoder_vocab_size=None` "
                    "or `share_embeddings=False`."
                )

    @property
    def source_vocab_size(self) -> int:
        return self.vocab_size if self.encoder_vocab_size is None else self.encoder_vocab_size


# The knobs of each family that are fields there alone or in two (`_refuse_other_families_knobs` names them given to
# another family). `decoder_start_token_id` is generation's as much as the seq2seq family's: any config may hold it.
FAMILY_KNOBS = {
    config_class: own_fields(config_class) - own_fields(ScratchConfigBase) - {"decoder_start_token_id"}
    for config_class in (ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig)
}

__all__ = ["ScratchConfigBase", "ScratchDecoderConfig", "ScratchEncoderConfig", "ScratchSeq2SeqConfig"]
