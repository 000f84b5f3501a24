"""Native `transformers` models <-> Scratch models with the same outputs, in both directions.

- `from_hf(model)` converts a native `GPT2LMHeadModel`, `LlamaForCausalLM` (and `MistralForCausalLM`,
  `Qwen2ForCausalLM`), `BertForMaskedLM` or `MarianMTModel` into the matching Scratch model, and the sequence and
  token classifiers and question answerers of GPT-2, Llama, Mistral, Qwen2 and BERT, and BERT's multiple-choice head
  too.
- `to_hf(model)` is its inverse: `ScratchDecoderForCausalLM` -> `GPT2LMHeadModel` or `LlamaForCausalLM`
  (`MistralForCausalLM` with a sliding window), and its task heads to theirs; `ScratchEncoderForMaskedLM`
  -> `BertForMaskedLM` (and the sequence classifier and multiple-choice head with `classifier_pooler`, the token
  classifier and question-answering heads to BERT's), `ScratchSeq2SeqForConditionalGeneration` -> `MarianMTModel`.
  A model with knobs that no native class computes exactly gets one `ValueError` naming every such knob and the
  value that would export. Never an approximate export.

Each native family is one `_Family` read both ways. Its weight table pairs each of our tensors with the native
tensor(s): the same tensor, GPT-2's Conv1D (stored transposed), or native projections stacked along the output rows
into one of our fused ones (QKV, gate|up). In its config tables, `renamed` fields are copied both ways and `fixed`
knobs are what the native architecture always is: `from_hf` sets them, `to_hf` requires them. Every source tensor
must be used exactly once (tied copies count as their source) and every target parameter filled, shapes checked:
a mismatch is an error, never a silently half-converted model. No model file imports this module.
"""

import copy

import torch
import transformers
from transformers import PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .modeling_scratch_decoder import (
    ScratchDecoderForCausalLM,
    ScratchDecoderForQuestionAnswering,
    ScratchDecoderForSequenceClassification,
    ScratchDecoderForTokenClassification,
)
from .modeling_scratch_encoder import (
    ScratchEncoderForMaskedLM,
    ScratchEncoderForMultipleChoice,
    ScratchEncoderForQuestionAnswering,
    ScratchEncoderForSequenceClassification,
    ScratchEncoderForTokenClassification,
)
from .modeling_scratch_seq2seq import ScratchSeq2SeqForConditionalGeneration
from .scratch_positions import sinusoidal_table

# transformers' activation names -> our `hidden_act`
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
    "gelu_accurate": "gelu_tanh",  # the tanh formula again, written out
}
# our `hidden_act` -> the name `to_hf` writes: the first one listed above ("gelu_new" is GPT-2's own name for it)
NATIVE_ACTIVATIONS = {ours: theirs for theirs, ours in reversed(ACTIVATIONS.items())}
# RoPE types that Scratch's rotary embedding computes: like Llama's, it looks the frequencies up in transformers'
# ROPE_INIT_FUNCTIONS, reading the same config fields (`rope_parameters`, `head_dim`, `max_position_embeddings`), and
# updates them in `dynamic_rope_update`. So every scaling type Llama runs gives the same cos/sin tables here.
ROPE_TYPES = ("default", *ROPE_INIT_FUNCTIONS)


def _unknown_activation(field: str, name: str) -> tuple[bool, str]:
    """A (refused, why) pair for a `_refuse` list: the activation has no Scratch equivalent. Refused with the model's
    other problems, not on its own first."""
    return name not in ACTIVATIONS, f"{field}={name!r} (known: {', '.join(sorted(ACTIVATIONS))})"


def _refuse(problems: list[str], what: str) -> None:
    """Raise once for everything in a native model that has no Scratch equivalent."""
    if problems:
        raise ValueError(f"Cannot convert this {what}: " + "; ".join(problems) + " (no Scratch equivalent).")


# ---------------------------------------------------------------------------------------------- weight tables

SAME, CONV1D, STACKED = "same", "conv1d", "stacked"
Entry = tuple[str, str | tuple[str, ...], str]  # (our name, native name or names, how they relate)


def _same(ours: str, theirs: str, bias: bool = True) -> list[Entry]:
    """Weight (and bias) of a module laid out alike on both sides: Linear, LayerNorm, RMSNorm, Embedding."""
    entries = [(f"{ours}.weight", f"{theirs}.weight", SAME)]
    return entries + [(f"{ours}.bias", f"{theirs}.bias", SAME)] if bias else entries


def _conv1d(ours: str, theirs: str) -> list[Entry]:
    """GPT-2's Conv1D stores its weight (in, out); nn.Linear wants (out, in). Biases agree."""
    return [(f"{ours}.weight", f"{theirs}.weight", CONV1D), (f"{ours}.bias", f"{theirs}.bias", SAME)]


def _stacked(ours: str, theirs: list[str], bias: bool) -> list[Entry]:
    """One of our fused projections = the native ones stacked along the output rows, in the order given."""
    entries = [(f"{ours}.weight", tuple(f"{name}.weight" for name in theirs), STACKED)]
    return entries + [(f"{ours}.bias", tuple(f"{name}.bias" for name in theirs), STACKED)] if bias else entries


class _StateDict:
    """A model's state dict from which every tensor must be read once. A tied copy counts as read: it is its
    source (transformers' `all_tied_weights_keys` names such copies)."""

    def __init__(self, model: PreTrainedModel):
        self.model_name = type(model).__name__
        self.tensors = {k: v.detach() for k, v in model.state_dict().items()}  # `_load` copies them
        self._check_plain_and_in_memory()
        self.read = set(model.all_tied_weights_keys)

    def _check_plain_and_in_memory(self) -> None:
        """Conversion slices, transposes and concatenates ordinary tensors: a quantized weight (a tensor subclass
        such as torchao's) or an offloaded one (left on the meta device by `device_map`) fails deep inside torch or
        torchao with an error that names neither; name it here."""
        for key, tensor in self.tensors.items():
            if tensor.is_meta:
                raise ValueError(
                    f"Cannot convert this {self.model_name}: `{key}` is not in memory (on the meta device, as "
                    "`device_map` offloading leaves it). Load the model without offloading, then convert it."
                )
            if type(tensor) is not torch.Tensor:
                raise ValueError(
                    f"Cannot convert this {self.model_name}: `{key}` is a quantized {type(tensor).__name__}. Convert "
                    "the full-precision model (loaded without `quantization_config`), then quantize the result."
                )

    def take(self, key: str) -> torch.Tensor:
        self.read.add(key)
        return self.tensors[key]

    def skip(self, key: str) -> None:
        """A tensor the forward pass never reads (said why where it is called)."""
        self.read.add(key)

    def check_all_read(self) -> None:
        left = sorted(set(self.tensors) - self.read)
        if left:
            raise ValueError(f"Conversion left tensors of the {self.model_name} unused: {left}")


def _native_to_ours(entries: list[Entry], source: _StateDict) -> dict[str, torch.Tensor]:
    tensors = {}
    for ours, theirs, how in entries:
        if how == STACKED:
            tensors[ours] = torch.cat([source.take(name) for name in theirs], dim=0)
        elif how == CONV1D:
            tensors[ours] = source.take(theirs).t().contiguous()
        else:
            tensors[ours] = source.take(theirs)
    return tensors


def _ours_to_native(entries: list[Entry], source: _StateDict, native: PreTrainedModel) -> dict[str, torch.Tensor]:
    rows = {name: p.shape[0] for name, p in native.named_parameters(remove_duplicate=False)}
    tensors = {}
    for ours, theirs, how in entries:
        tensor = source.take(ours)
        if how == STACKED:  # split along the rows, at the native sizes
            tensors |= dict(zip(theirs, tensor.split([rows[name] for name in theirs]), strict=True))
        elif how == CONV1D:
            tensors[theirs] = tensor.t().contiguous()
        else:
            tensors[theirs] = tensor
    return tensors


def _load(model: PreTrainedModel, tensors: dict[str, torch.Tensor]) -> None:
    """Load every parameter of `model` from `tensors`, checking names and shapes both ways. A tied parameter is
    filled through its source name (transformers' `all_tied_weights_keys` maps tied names to sources)."""
    tied = set(model.all_tied_weights_keys)
    expected = {name: p for name, p in model.named_parameters(remove_duplicate=False) if name not in tied}
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"Conversion table mismatch: missing {missing}, unexpected {unexpected}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{name}: converted shape {tuple(tensor.shape)} != {tuple(expected[name].shape)}")
        with torch.no_grad():
            expected[name].copy_(tensor)


# ---------------------------------------------------------------------------------------------- families


class _Family:
    """One native architecture and the Scratch knobs that compute exactly what it computes."""

    name = ""  # how refusals name the native side
    ours: type[PreTrainedModel]
    renamed: dict[str, str] = {}  # our config field -> the native one; the same value both ways
    fixed: dict[str, object] = {}  # our knobs the native architecture has no choice about

    def from_native(self, native: PreTrainedModel) -> dict:
        """Our config's values for `native`, beyond `fixed` (refusing what has no Scratch equivalent)."""
        raise NotImplementedError

    def our_config(self, native: PreTrainedModel):
        values = {ours: getattr(native.config, theirs) for ours, theirs in self.renamed.items()}
        return self.ours.config_class(**values, **self.fixed, **self.from_native(native))

    def blockers(self, config) -> list[str]:
        """Each knob of `config` that keeps this family from computing the same function, with what would fit."""
        return [f"`{knob}={getattr(config, knob)!r}` (needs {value!r})"
                for knob, value in self.fixed.items() if getattr(config, knob) != value]

    def native_model(self, config) -> PreTrainedModel:
        """An (untrained) native model of the same architecture as `config`."""
        raise NotImplementedError

    def renamed_values(self, config) -> dict:
        return {theirs: getattr(config, ours) for ours, theirs in self.renamed.items()}

    def weights(self, config) -> list[Entry]:
        raise NotImplementedError

    def native_weights(self, config, native: PreTrainedModel) -> list[Entry]:
        """`weights(config)` under the names `native` (the model converted, or exported to) gives its tensors."""
        return self.weights(config)

    def extra_from_native(self, native, source: _StateDict, config, entries: list[Entry]) -> dict:
        """Our tensors outside the weight table (and native ones it leaves unread on purpose), native -> ours."""
        return {}

    def extra_to_native(self, model, source: _StateDict, native, tensors: dict) -> None:
        """Tensors outside the weight table, ours -> native."""


def _non_gated_activation(config, target: str) -> list[str]:
    if config.hidden_act in NATIVE_ACTIVATIONS:
        return []
    return [f"`hidden_act={config.hidden_act!r}` ({target} has no gated feed-forward: needs one of "
            f"{', '.join(map(repr, sorted(NATIVE_ACTIVATIONS)))})"]


def _multi_head(config, target: str) -> list[str]:
    if config.num_key_value_heads == config.num_attention_heads:
        return []
    return [f"`num_key_value_heads={config.num_key_value_heads}` ({target} has no grouped-query attention: needs "
            f"num_key_value_heads == num_attention_heads = {config.num_attention_heads})"]


class _GPT2(_Family):
    name = "GPT2LMHeadModel"
    ours = ScratchDecoderForCausalLM
    trunk_prefix = "transformer"  # where `trunk_weights` puts the native trunk
    renamed = {
        "vocab_size": "vocab_size",
        "num_hidden_layers": "n_layer",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "n_positions",
        "layer_norm_eps": "layer_norm_epsilon",
        "dropout": "resid_pdrop",
        "attention_dropout": "attn_pdrop",
        "embedding_dropout": "embd_pdrop",
        "tie_word_embeddings": "tie_word_embeddings",
        "use_cache": "use_cache",
        "initializer_range": "initializer_range",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "pad_token_id": "pad_token_id",
    }
    fixed = {
        "position_embedding_type": "learned",
        "norm_type": "layernorm",
        "norm_position": "pre",
        "final_norm": True,
        "embedding_norm": False,
        "scale_embeddings": False,
        "use_bias": True,
        "sliding_window": None,
    }

    def from_native(self, native) -> dict:
        c = native.config
        _refuse([what for bad, what in [
            (c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx=True"),
            (not c.scale_attn_weights, "scale_attn_weights=False"),
            (c.add_cross_attention, "add_cross_attention=True"),
            _unknown_activation("activation_function", c.activation_function),
        ] if bad], self.name)
        return dict(
            intermediate_size=c.n_inner or 4 * c.n_embd,
            hidden_act=ACTIVATIONS[c.activation_function],
            activation_dropout=0.0,  # GPT-2 has no dropout inside its MLP
        )

    def blockers(self, config) -> list[str]:
        return super().blockers(config) + _non_gated_activation(config, self.name) + _multi_head(config, self.name)

    def native_model(self, config):
        return transformers.GPT2LMHeadModel(self.native_config(config))

    def native_config(self, config) -> transformers.GPT2Config:
        return transformers.GPT2Config(
            **self.renamed_values(config),
            # `n_ctx`, as OpenAI's GPT-2 configs have it: a field GPT2Config no longer writes, which llama.cpp's
            # convert_hf_to_gguf.py reads (a KeyError without it). It changes nothing in transformers.
            n_ctx=config.max_position_embeddings,
            n_inner=config.intermediate_size,
            activation_function=NATIVE_ACTIVATIONS[config.hidden_act],
        )

    def weights(self, config) -> list[Entry]:
        return self.trunk_weights(config) + (
            [] if config.tie_word_embeddings else _same("lm_head", "lm_head", bias=False))

    @staticmethod
    def trunk_weights(config) -> list[Entry]:
        t = (_same("model.embeddings.embed_tokens", "transformer.wte", bias=False)
             + _same("model.embeddings.embed_positions", "transformer.wpe", bias=False)
             + _same("model.final_norm", "transformer.ln_f"))
        for i in range(config.num_hidden_layers):
            ours, theirs = f"model.layers.{i}", f"transformer.h.{i}"
            t += _same(f"{ours}.attn_norm", f"{theirs}.ln_1")
            t += _conv1d(f"{ours}.self_attn.qkv_proj", f"{theirs}.attn.c_attn")  # already fused, q | k | v
            t += _conv1d(f"{ours}.self_attn.o_proj", f"{theirs}.attn.c_proj")
            t += _same(f"{ours}.mlp_norm", f"{theirs}.ln_2")
            t += _conv1d(f"{ours}.mlp.up_proj", f"{theirs}.mlp.c_fc")
            t += _conv1d(f"{ours}.mlp.down_proj", f"{theirs}.mlp.c_proj")
        return t


class _Llama(_Family):
    """Llama, and the two relatives that share its parameter names: Mistral (a sliding window, no biases) and Qwen2
    (biases on q, k and v only). `to_hf` writes Llama, or Mistral when there is a sliding window."""

    name = "LlamaForCausalLM / MistralForCausalLM"
    ours = ScratchDecoderForCausalLM
    trunk_prefix = "model"  # where `trunk_weights` puts the native trunk
    renamed = {
        "vocab_size": "vocab_size",
        "num_hidden_layers": "num_hidden_layers",
        "hidden_size": "hidden_size",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_key_value_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "layer_norm_eps": "rms_norm_eps",
        "attention_dropout": "attention_dropout",
        "tie_word_embeddings": "tie_word_embeddings",
        "use_cache": "use_cache",
        "initializer_range": "initializer_range",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "pad_token_id": "pad_token_id",
    }
    fixed = {
        "position_embedding_type": "rope",
        "norm_type": "rmsnorm",
        "norm_position": "pre",
        "final_norm": True,
        "embedding_norm": False,
        "scale_embeddings": False,
        # Llama's MLP is down(act(gate) * up) for any `hidden_act`, but vLLM's Llama refuses other activations and
        # llama.cpp's hard-codes SiLU: a GEGLU exported as Llama would fail or run wrong there. Only SwiGLU exports.
        "hidden_act": "swiglu",
    }

    def from_native(self, native) -> dict:
        c, problems = native.config, []
        if ACTIVATIONS.get(c.hidden_act) != "silu":  # "swish" is SiLU too
            problems.append(f"hidden_act={c.hidden_act!r} (only SiLU, our `swiglu`, converts both ways)")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads  # Qwen2 has none
        if head_dim != c.hidden_size // c.num_attention_heads:
            problems.append(f"head_dim={head_dim} != hidden_size / num_attention_heads "
                            f"(Scratch derives the head size from them)")
        rope = dict(c.rope_parameters)
        if rope.get("rope_type", "default") not in ROPE_TYPES:
            problems.append(f"rope_type={rope['rope_type']!r} (supported: {', '.join(ROPE_TYPES)})")
        # Mistral slides its window in every layer, Qwen2 in those its `layer_types` say (from `max_window_layers`
        # on); Scratch slides in all layers or none.
        sliding_window = getattr(c, "sliding_window", None)
        if c.model_type == "qwen2" and sliding_window is not None:
            if set(c.layer_types) == {"full_attention"}:
                sliding_window = None
            elif set(c.layer_types) != {"sliding_attention"}:
                problems.append(f"a sliding window in some layers only (layer_types={c.layer_types})")
        _refuse(problems, type(native).__name__)
        return dict(
            rope_parameters=rope,
            sliding_window=sliding_window,
            # One `use_bias` covers every projection. Qwen2 biases q, k and v only, and Llama can bias attention or
            # MLP alone: those projections get zero biases (`extra_from_native`), which changes no output. The trunk's
            # only: a head's bias (the token classifier's, the question answerer's) is the head's own.
            use_bias=any(key.startswith(f"{native.base_model_prefix}.") and key.endswith(".bias")
                         for key in native.state_dict()),
            dropout=0.0,  # Llama has no residual, embedding or MLP dropout
            embedding_dropout=0.0,
            activation_dropout=0.0,
        )

    def blockers(self, config) -> list[str]:
        problems = super().blockers(config)
        if config.sliding_window is not None and config.use_bias:
            problems.append(f"`sliding_window={config.sliding_window}` with `use_bias=True` (MistralForCausalLM, "
                            "the Llama with a sliding window, has no biases: needs use_bias=False or no window)")
        return problems

    native_classes = {"llama": transformers.LlamaForCausalLM, "mistral": transformers.MistralForCausalLM}

    def native_model(self, config):
        native_config = self.native_config(config)
        return self.native_classes[native_config.model_type](native_config)

    def native_config(self, config) -> transformers.PretrainedConfig:
        """Llama's, or Mistral's where there is a sliding window."""
        values = dict(self.renamed_values(config), hidden_act="silu", rope_parameters=dict(config.rope_parameters))
        if config.sliding_window is not None:
            return transformers.MistralConfig(**values, sliding_window=config.sliding_window)
        return transformers.LlamaConfig(**values, attention_bias=config.use_bias, mlp_bias=config.use_bias)

    def weights(self, config) -> list[Entry]:
        return self.trunk_weights(config) + (
            [] if config.tie_word_embeddings else _same("lm_head", "lm_head", bias=False))

    @staticmethod
    def trunk_weights(config) -> list[Entry]:
        bias = config.use_bias
        t = _same("model.embeddings.embed_tokens", "model.embed_tokens", bias=False)
        for i in range(config.num_hidden_layers):
            ours, theirs = f"model.layers.{i}", f"model.layers.{i}"
            t += _same(f"{ours}.attn_norm", f"{theirs}.input_layernorm", bias=False)
            t += _stacked(f"{ours}.self_attn.qkv_proj", [f"{theirs}.self_attn.{p}_proj" for p in "qkv"], bias)
            t += _same(f"{ours}.self_attn.o_proj", f"{theirs}.self_attn.o_proj", bias)
            t += _same(f"{ours}.mlp_norm", f"{theirs}.post_attention_layernorm", bias=False)
            t += _stacked(f"{ours}.mlp.up_proj", [f"{theirs}.mlp.gate_proj", f"{theirs}.mlp.up_proj"], bias)
            t += _same(f"{ours}.mlp.down_proj", f"{theirs}.mlp.down_proj", bias)
        t += _same("model.final_norm", "model.norm", bias=False)
        return t

    def extra_from_native(self, native, source, config, entries) -> dict:
        """A bias the native model does not have is a zero bias (see `use_bias` in `from_native`)."""
        for _, theirs, _ in entries:
            for name in (theirs if isinstance(theirs, tuple) else (theirs,)):
                if name.endswith(".bias") and name not in source.tensors:
                    weight = source.tensors[name.removesuffix(".bias") + ".weight"]
                    source.tensors[name] = weight.new_zeros(weight.shape[0])
        return {}


class _DecoderHead:
    """A decoder family's task head (mixed in before the family): the trunk and one linear layer, `head` here and
    `native_head` in the native class, with the config values the head reads (`_values` from the native config,
    `_native_values` from ours). The native classes keep the trunk under their `base_model_prefix`, which for
    Llama's question answerer is `transformer` (its old name), not the `model` of Llama's other classes: followed both
    ways (`native_weights`)."""

    head = native_head = ""
    head_bias = True
    native_classes: dict[str, type[PreTrainedModel]]  # the native config's model_type -> the head's class

    def our_config(self, native):
        config = super().our_config(native)
        config.update(self._values(native.config))
        return config

    def native_model(self, config):
        native_config = self.native_config(config)
        native_config.update(self._native_values(config))
        return self.native_classes[native_config.model_type](native_config)

    def weights(self, config) -> list[Entry]:
        return self.trunk_weights(config) + _same(self.head, self.native_head, bias=self.head_bias)

    def native_weights(self, config, native) -> list[Entry]:
        def renamed(key: str) -> str:
            return native.base_model_prefix + key[len(self.trunk_prefix):] if key.startswith(
                f"{self.trunk_prefix}.") else key

        return [(ours, tuple(map(renamed, theirs)) if isinstance(theirs, tuple) else renamed(theirs), how)
                for ours, theirs, how in self.weights(config)]

    @staticmethod
    def _values(native_config) -> dict:
        """Our config's values of the head, from the native config."""
        return {}

    @staticmethod
    def _native_values(config) -> dict:
        """The native config's values of the head, from ours."""
        return {}


def _sequence_classifier_labels(config) -> dict:
    """The label fields of a sequence classifier's config (ours or the native one's), which decide its loss too."""
    return {"id2label": config.id2label, "label2id": config.label2id, "problem_type": config.problem_type}


class _DecoderClassifier(_DecoderHead):
    """The sequence classifier: `score`, without bias, read at each row's last token other than padding, found by
    `input_ids` on both sides (from `inputs_embeds` the native classes read the last position, with a warning; ours
    the last one the attention mask keeps), with its labels and `problem_type`."""

    ours = ScratchDecoderForSequenceClassification
    head = native_head = "score"
    head_bias = False
    _values = _native_values = staticmethod(_sequence_classifier_labels)


def _native_classifier_dropout(config) -> float:
    """The dropout rate GPT-2's, Llama's, Mistral's and Qwen2's token classifiers apply before their classifier."""
    for field in ("classifier_dropout", "hidden_dropout"):
        if getattr(config, field, None) is not None:
            return getattr(config, field)
    return 0.1


class _DecoderTokenClassifier(_DecoderHead):
    """The token classifier: its labels and the dropout rate before it (the native classes' default, 0.1, written
    out both ways)."""

    ours = ScratchDecoderForTokenClassification
    head = "classifier"

    def from_native(self, native) -> dict:
        values = super().from_native(native)
        if not getattr(native.config, "token_classification_bias", True):
            _refuse(["token_classification_bias=False (Scratch's token classifier has a bias)"], type(native).__name__)
        return values

    @staticmethod
    def _values(native_config) -> dict:
        return {"id2label": native_config.id2label, "label2id": native_config.label2id,
                "classifier_dropout": _native_classifier_dropout(native_config)}

    @staticmethod
    def _native_values(config) -> dict:
        rate = config.classifier_dropout if config.classifier_dropout is not None else config.dropout
        return {"id2label": config.id2label, "label2id": config.label2id, "classifier_dropout": rate}


class _DecoderQuestionAnswerer(_DecoderHead):
    """The question answerer: `qa_outputs`, two outputs (the start and end logits) on both sides."""

    ours = ScratchDecoderForQuestionAnswering
    head = native_head = "qa_outputs"


class _GPT2TokenClassification(_DecoderTokenClassifier, _GPT2):
    name = "GPT2ForTokenClassification"
    native_head = "classifier"
    native_classes = {"gpt2": transformers.GPT2ForTokenClassification}


class _LlamaTokenClassification(_DecoderTokenClassifier, _Llama):
    name = "LlamaForTokenClassification / MistralForTokenClassification"
    native_head = "score"
    native_classes = {"llama": transformers.LlamaForTokenClassification,
                      "mistral": transformers.MistralForTokenClassification}


class _GPT2QuestionAnswering(_DecoderQuestionAnswerer, _GPT2):
    name = "GPT2ForQuestionAnswering"
    native_classes = {"gpt2": transformers.GPT2ForQuestionAnswering}


class _LlamaQuestionAnswering(_DecoderQuestionAnswerer, _Llama):
    name = "LlamaForQuestionAnswering / MistralForQuestionAnswering"
    native_classes = {"llama": transformers.LlamaForQuestionAnswering,
                      "mistral": transformers.MistralForQuestionAnswering}


class _GPT2SequenceClassification(_DecoderClassifier, _GPT2):
    name = "GPT2ForSequenceClassification"
    native_classes = {"gpt2": transformers.GPT2ForSequenceClassification}


class _LlamaSequenceClassification(_DecoderClassifier, _Llama):
    name = "LlamaForSequenceClassification / MistralForSequenceClassification"
    native_classes = {"llama": transformers.LlamaForSequenceClassification,
                      "mistral": transformers.MistralForSequenceClassification}


class _Bert(_Family):
    name = "BertForMaskedLM"
    ours = ScratchEncoderForMaskedLM
    renamed = {
        "vocab_size": "vocab_size",
        "num_hidden_layers": "num_hidden_layers",
        "hidden_size": "hidden_size",
        "num_attention_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
        "max_position_embeddings": "max_position_embeddings",
        "layer_norm_eps": "layer_norm_eps",
        "dropout": "hidden_dropout_prob",
        "attention_dropout": "attention_probs_dropout_prob",
        "classifier_dropout": "classifier_dropout",
        "tie_word_embeddings": "tie_word_embeddings",
        "use_cache": "use_cache",
        "initializer_range": "initializer_range",
        "pad_token_id": "pad_token_id",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
    }
    fixed = {
        "position_embedding_type": "learned",
        "norm_type": "layernorm",
        "norm_position": "post",
        "final_norm": False,
        "embedding_norm": True,
        "mlm_transform": True,
        "scale_embeddings": False,
        "use_bias": True,
    }

    def from_native(self, native) -> dict:
        c = native.config
        _refuse([what for bad, what in [
            (getattr(c, "position_embedding_type", "absolute") != "absolute", "relative position embeddings"),
            (c.is_decoder, "a BERT decoder"),
            _unknown_activation("hidden_act", c.hidden_act),
            *self._head_problems(c),
        ] if bad], self.name)
        return dict(
            hidden_act=ACTIVATIONS[c.hidden_act],
            type_vocab_size=0 if _no_token_types(native) else c.type_vocab_size,
            activation_dropout=0.0,  # BERT has no dropout inside its MLP
            embedding_dropout=c.hidden_dropout_prob,
            **self._labels(c),
        )

    def blockers(self, config) -> list[str]:
        return super().blockers(config) + _non_gated_activation(config, self.name) + _multi_head(config, self.name)

    def native_model(self, config):
        return getattr(transformers, self.name)(transformers.BertConfig(
            **self.renamed_values(config),
            **self._labels(config),
            hidden_act=NATIVE_ACTIVATIONS[config.hidden_act],
            type_vocab_size=max(config.type_vocab_size, 1),  # see `extra_to_native`
        ))

    @staticmethod
    def _labels(config) -> dict:
        """The label fields of the config (ours or BERT's) that the head reads: a token classifier's."""
        return {}

    @staticmethod
    def _head_problems(config) -> list[tuple[bool, str]]:
        """(refused, why) pairs for BERT's config that the head has no equivalent of."""
        return []

    def weights(self, config) -> list[Entry]:
        t = self._trunk_weights(config)
        t += _same("head_transform.dense", "cls.predictions.transform.dense")
        t += _same("head_transform.norm", "cls.predictions.transform.LayerNorm")
        # BERT's forward adds `decoder.bias`. Tied, it is `cls.predictions.bias`; untied, a separate parameter.
        if config.tie_word_embeddings:
            return t + [("lm_head.bias", "cls.predictions.bias", SAME)]
        return t + _same("lm_head", "cls.predictions.decoder")

    @staticmethod
    def _trunk_weights(config) -> list[Entry]:
        emb = "bert.embeddings"
        t = (_same("model.embeddings.embed_tokens", f"{emb}.word_embeddings", bias=False)
             + _same("model.embeddings.embed_positions", f"{emb}.position_embeddings", bias=False)
             + _same("model.embeddings.norm", f"{emb}.LayerNorm"))
        if config.type_vocab_size:
            t += _same("model.embeddings.token_type_embeddings", f"{emb}.token_type_embeddings", bias=False)
        for i in range(config.num_hidden_layers):
            ours, theirs = f"model.layers.{i}", f"bert.encoder.layer.{i}"
            t += _stacked(f"{ours}.self_attn.qkv_proj", [f"{theirs}.attention.self.{p}" for p in
                                                         ("query", "key", "value")], bias=True)
            t += _same(f"{ours}.self_attn.o_proj", f"{theirs}.attention.output.dense")
            t += _same(f"{ours}.attn_norm", f"{theirs}.attention.output.LayerNorm")
            t += _same(f"{ours}.mlp.up_proj", f"{theirs}.intermediate.dense")
            t += _same(f"{ours}.mlp.down_proj", f"{theirs}.output.dense")
            t += _same(f"{ours}.mlp_norm", f"{theirs}.output.LayerNorm")
        return t

    def extra_from_native(self, native, source, config, entries) -> dict:
        if not config.tie_word_embeddings:
            source.skip("cls.predictions.bias")  # untied, BERT's forward never reads it
        self._skip_absent_token_types(source, config)
        return {}

    def extra_to_native(self, model, source, native, tensors) -> None:
        if not model.config.tie_word_embeddings:
            tensors["cls.predictions.bias"] = tensors["cls.predictions.decoder.bias"]  # as a tied BERT has it
        self._token_types_to_native(model, native, tensors)

    @staticmethod
    def _skip_absent_token_types(source, config) -> None:
        if not config.type_vocab_size:
            source.skip("bert.embeddings.token_type_embeddings.weight")  # one zero row: adds nothing

    @staticmethod
    def _token_types_to_native(model, native, tensors) -> None:
        if not model.config.type_vocab_size:
            # BERT always adds a token-type row (type 0 by default); a single zero row adds nothing, as ours does.
            tensors["bert.embeddings.token_type_embeddings.weight"] = native.bert.embeddings.token_type_embeddings\
                .weight.detach().new_zeros(1, model.config.hidden_size)


class _BertTokenHead(_Bert):
    """BERT's trunk under one linear layer over every token's hidden state, which ours computes alike: token
    classification and question answering (subclasses name the native class and the layer, the same on both sides).
    Sequence classification adds BERT's pooler before the layer (`_BertSequenceClassification`)."""

    head = ""
    fixed = {knob: value for knob, value in _Bert.fixed.items() if knob != "mlm_transform"}  # no MLM head here

    def weights(self, config) -> list[Entry]:
        return self._trunk_weights(config) + _same(self.head, self.head)

    def extra_from_native(self, native, source, config, entries) -> dict:
        self._skip_absent_token_types(source, config)
        return {}

    def extra_to_native(self, model, source, native, tensors) -> None:
        self._token_types_to_native(model, native, tensors)


class _BertTokenClassification(_BertTokenHead):
    name = "BertForTokenClassification"
    ours = ScratchEncoderForTokenClassification
    head = "classifier"

    @staticmethod
    def _labels(config) -> dict:
        return {"id2label": config.id2label, "label2id": config.label2id}


class _BertQuestionAnswering(_BertTokenHead):
    name = "BertForQuestionAnswering"
    ours = ScratchEncoderForQuestionAnswering
    head = "qa_outputs"  # two outputs, the start and end logits (BERT's config's default `num_labels`)

    @staticmethod
    def _head_problems(config) -> list[tuple[bool, str]]:
        # BERT sizes its head by `num_labels` and splits it in two: any other size fails in its own forward
        return [(config.num_labels != 2, f"num_labels={config.num_labels} (start and end logits: 2)")]


class _BertSequenceClassification(_BertTokenClassification):
    """BERT classifies a sequence from [CLS] pooled through a dense layer and tanh (its pooler): ours with
    `classifier_pooler`. Its `problem_type` (regression, multi-label) decides the loss on both sides."""

    name = "BertForSequenceClassification"
    ours = ScratchEncoderForSequenceClassification
    fixed = _BertTokenHead.fixed | {"classifier_pooler": True}

    def weights(self, config) -> list[Entry]:
        return super().weights(config) + _same("pooler.dense", "bert.pooler.dense")

    @staticmethod
    def _labels(config) -> dict:
        return _sequence_classifier_labels(config)


class _BertMultipleChoice(_BertSequenceClassification):
    """BERT scores each choice as its sequence classifier scores a sequence (pooler, then one output): ours with
    `classifier_pooler`. No classes, whatever its config's labels say."""

    name = "BertForMultipleChoice"
    ours = ScratchEncoderForMultipleChoice

    @staticmethod
    def _labels(config) -> dict:
        return {}


def _no_token_types(native) -> bool:
    """A BERT with one all-zero token-type row: what `to_hf` writes for a Scratch encoder without token types."""
    weight = native.bert.embeddings.token_type_embeddings.weight
    return weight.shape[0] == 1 and not weight.detach().any()


class _Marian(_Family):
    name = "MarianMTModel"
    ours = ScratchSeq2SeqForConditionalGeneration
    renamed = {
        "encoder_layers": "encoder_layers",
        "decoder_layers": "decoder_layers",
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "intermediate_size": "encoder_ffn_dim",
        "max_position_embeddings": "max_position_embeddings",
        "dropout": "dropout",
        "attention_dropout": "attention_dropout",
        "scale_embeddings": "scale_embedding",
        "tie_word_embeddings": "tie_word_embeddings",
        "use_cache": "use_cache",
        "initializer_range": "init_std",
        "pad_token_id": "pad_token_id",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "decoder_start_token_id": "decoder_start_token_id",
    }
    fixed = {
        "position_embedding_type": "sinusoidal",
        "sinusoidal_layout": "split",  # all sines, then all cosines
        "norm_type": "layernorm",
        "norm_position": "post",
        "layer_norm_eps": 1e-5,  # nn.LayerNorm's default, which Marian uses
        "final_norm": False,
        "embedding_norm": False,
        "use_bias": True,
    }

    def from_native(self, native) -> dict:
        c = native.config
        _refuse([what for bad, what in [
            (c.encoder_attention_heads != c.decoder_attention_heads, "different encoder and decoder head counts"),
            (c.encoder_ffn_dim != c.decoder_ffn_dim, "different encoder and decoder FFN sizes"),
            _unknown_activation("activation_function", c.activation_function),
            # transformers sizes the decoder's embedding by `decoder_vocab_size` and the head by `vocab_size` there:
            # the decoder cannot read back the ids it predicts past the first (an IndexError in `generate()`)
            (c.share_encoder_decoder_embeddings and not c.tie_word_embeddings
             and c.decoder_vocab_size not in (None, c.vocab_size),
             f"decoder_vocab_size={c.decoder_vocab_size} with vocab_size={c.vocab_size} under "
             "share_encoder_decoder_embeddings=True and tie_word_embeddings=False (its decoder embeds "
             f"{c.decoder_vocab_size} ids and predicts {c.vocab_size})"),
        ] if bad], self.name)
        target_vocab = c.vocab_size if c.share_encoder_decoder_embeddings else (c.decoder_vocab_size or c.vocab_size)
        return dict(
            vocab_size=target_vocab,
            encoder_vocab_size=None if target_vocab == c.vocab_size else c.vocab_size,
            hidden_act=ACTIVATIONS[c.activation_function],
            embedding_dropout=c.dropout,  # Marian drops out embeddings + positions with `dropout` too
            activation_dropout=c.activation_dropout,  # not `renamed`: ours may be None ("the same as `dropout`")
            # transformers 5 ties Marian's embeddings only under `tie_word_embeddings`: with it off, encoder,
            # decoder and output matrices are separate parameters even when `share_encoder_decoder_embeddings` is set
            # (ours can share the two embeddings with an untied head, but Marian cannot, see `blockers`).
            share_embeddings=c.share_encoder_decoder_embeddings and c.tie_word_embeddings,
            output_bias=bool(native.final_logits_bias.any()),  # a zero bias (Marian's default) adds nothing
        )

    def blockers(self, config) -> list[str]:
        problems = super().blockers(config) + _non_gated_activation(config, self.name) + _multi_head(config, self.name)
        if config.decoder_start_token_id is None:
            problems.append("`decoder_start_token_id=None` (MarianConfig needs an id)")
        if config.share_embeddings and not config.tie_word_embeddings:
            problems.append("`share_embeddings=True` with `tie_word_embeddings=False` (Marian shares encoder and "
                            "decoder embeddings only together with the output head: needs `tie_word_embeddings=True` "
                            "or `share_embeddings=False`)")
        return problems

    def native_model(self, config):
        shared = config.share_embeddings
        return transformers.MarianMTModel(transformers.MarianConfig(
            **self.renamed_values(config),
            activation_dropout=config.activation_dropout_rate,
            vocab_size=config.source_vocab_size,
            decoder_vocab_size=config.vocab_size,
            share_encoder_decoder_embeddings=shared,
            decoder_attention_heads=config.num_attention_heads,
            decoder_ffn_dim=config.intermediate_size,
            activation_function=NATIVE_ACTIVATIONS[config.hidden_act],
            forced_eos_token_id=None,  # MarianConfig's default (0) would disagree with the generation config
        ))

    def weights(self, config) -> list[Entry]:
        t = []
        for stack, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
            for i in range(layers):
                ours = theirs = f"model.{stack}.layers.{i}"
                t += _marian_attention(f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
                t += _same(f"{ours}.attn_norm", f"{theirs}.self_attn_layer_norm")
                if stack == "decoder":
                    t += _marian_attention(f"{ours}.cross_attn", f"{theirs}.encoder_attn", cross=True)
                    t += _same(f"{ours}.cross_attn_norm", f"{theirs}.encoder_attn_layer_norm")
                t += _same(f"{ours}.mlp.up_proj", f"{theirs}.fc1")
                t += _same(f"{ours}.mlp.down_proj", f"{theirs}.fc2")
                t += _same(f"{ours}.mlp_norm", f"{theirs}.final_layer_norm")
        if config.share_embeddings:  # one matrix, `model.shared`; the encoder's, decoder's and head are tied to it
            t += _same("model.decoder.embeddings.embed_tokens", "model.shared", bias=False)
        else:
            t += _same("model.encoder.embeddings.embed_tokens", "model.encoder.embed_tokens", bias=False)
            t += _same("model.decoder.embeddings.embed_tokens", "model.decoder.embed_tokens", bias=False)
        return t + ([] if config.tie_word_embeddings else _same("lm_head", "lm_head", bias=False))

    def extra_from_native(self, native, source, config, entries) -> dict:
        _check_marian_positions(source)
        if not config.share_embeddings and "model.shared.weight" in source.tensors:
            source.skip("model.shared.weight")  # kept by Marian, read by nothing when not tied
        bias = source.take("final_logits_bias").reshape(-1)  # a (1, V) buffer
        return {"lm_head.bias": bias} if config.output_bias else {}

    def extra_to_native(self, model, source, native, tensors) -> None:
        native_tensors = _StateDict(native)
        _check_marian_positions(native_tensors)  # Marian computes its own; they must be ours
        for stack in ("encoder", "decoder"):
            key = f"model.{stack}.embed_positions.weight"
            tensors[key] = native_tensors.tensors[key]
        if model.config.output_bias:
            with torch.no_grad():
                native.final_logits_bias.copy_(source.take("lm_head.bias")[None])


def _marian_attention(ours: str, theirs: str, cross: bool) -> list[Entry]:
    q, k, v = (f"{theirs}.{p}_proj" for p in "qkv")
    if cross:
        t = _same(f"{ours}.q_proj", q) + _stacked(f"{ours}.kv_proj", [k, v], bias=True)
    else:
        t = _stacked(f"{ours}.qkv_proj", [q, k, v], bias=True)
    return t + _same(f"{ours}.o_proj", f"{theirs}.out_proj")


def _check_marian_positions(source: _StateDict) -> None:
    for stack in ("encoder", "decoder"):
        key = f"model.{stack}.embed_positions.weight"
        positions = source.take(key)
        # A half-precision Marian (`from_pretrained(dtype=torch.bfloat16)`) holds the table rounded to its dtype.
        atol = max(1e-5, torch.finfo(positions.dtype).eps)
        if not torch.allclose(positions.float().cpu(), sinusoidal_table(*positions.shape, layout="split"), atol=atol):
            raise ValueError(f"{key} is not the sinusoid table Scratch computes.")


GPT2, LLAMA, BERT, MARIAN = _GPT2(), _Llama(), _Bert(), _Marian()
GPT2_SEQUENCE_CLASSIFICATION = _GPT2SequenceClassification()
LLAMA_SEQUENCE_CLASSIFICATION = _LlamaSequenceClassification()
GPT2_TOKEN_CLASSIFICATION, LLAMA_TOKEN_CLASSIFICATION = _GPT2TokenClassification(), _LlamaTokenClassification()
GPT2_QUESTION_ANSWERING, LLAMA_QUESTION_ANSWERING = _GPT2QuestionAnswering(), _LlamaQuestionAnswering()
BERT_TOKEN_CLASSIFICATION, BERT_QUESTION_ANSWERING = _BertTokenClassification(), _BertQuestionAnswering()
BERT_SEQUENCE_CLASSIFICATION, BERT_MULTIPLE_CHOICE = _BertSequenceClassification(), _BertMultipleChoice()
# native language model -> its family, for `from_hf`
LANGUAGE_MODEL_CONVERTERS = {
    "GPT2LMHeadModel": GPT2,
    "LlamaForCausalLM": LLAMA,
    "MistralForCausalLM": LLAMA,
    "Qwen2ForCausalLM": LLAMA,
    "BertForMaskedLM": BERT,
    "MarianMTModel": MARIAN,
}
# native class -> its family, for `from_hf`: the language models and BERT's task heads
CONVERTERS = LANGUAGE_MODEL_CONVERTERS | {
    "GPT2ForSequenceClassification": GPT2_SEQUENCE_CLASSIFICATION,
    "LlamaForSequenceClassification": LLAMA_SEQUENCE_CLASSIFICATION,
    "MistralForSequenceClassification": LLAMA_SEQUENCE_CLASSIFICATION,
    "Qwen2ForSequenceClassification": LLAMA_SEQUENCE_CLASSIFICATION,
    "GPT2ForTokenClassification": GPT2_TOKEN_CLASSIFICATION,
    "LlamaForTokenClassification": LLAMA_TOKEN_CLASSIFICATION,
    "MistralForTokenClassification": LLAMA_TOKEN_CLASSIFICATION,
    "Qwen2ForTokenClassification": LLAMA_TOKEN_CLASSIFICATION,
    "GPT2ForQuestionAnswering": GPT2_QUESTION_ANSWERING,
    "LlamaForQuestionAnswering": LLAMA_QUESTION_ANSWERING,
    "MistralForQuestionAnswering": LLAMA_QUESTION_ANSWERING,
    "Qwen2ForQuestionAnswering": LLAMA_QUESTION_ANSWERING,
    "BertForSequenceClassification": BERT_SEQUENCE_CLASSIFICATION,
    "BertForTokenClassification": BERT_TOKEN_CLASSIFICATION,
    "BertForQuestionAnswering": BERT_QUESTION_ANSWERING,
    "BertForMultipleChoice": BERT_MULTIPLE_CHOICE,
}
# our class -> the families `to_hf` tries, in order (the first the knobs fit is used)
EXPORTS = {
    ScratchDecoderForCausalLM: (GPT2, LLAMA),
    ScratchDecoderForSequenceClassification: (GPT2_SEQUENCE_CLASSIFICATION, LLAMA_SEQUENCE_CLASSIFICATION),
    ScratchDecoderForTokenClassification: (GPT2_TOKEN_CLASSIFICATION, LLAMA_TOKEN_CLASSIFICATION),
    ScratchDecoderForQuestionAnswering: (GPT2_QUESTION_ANSWERING, LLAMA_QUESTION_ANSWERING),
    ScratchEncoderForMaskedLM: (BERT,),
    ScratchEncoderForSequenceClassification: (BERT_SEQUENCE_CLASSIFICATION,),
    ScratchEncoderForTokenClassification: (BERT_TOKEN_CLASSIFICATION,),
    ScratchEncoderForQuestionAnswering: (BERT_QUESTION_ANSWERING,),
    ScratchEncoderForMultipleChoice: (BERT_MULTIPLE_CHOICE,),
    ScratchSeq2SeqForConditionalGeneration: (MARIAN,),
}


def _computed_tables(model: PreTrainedModel) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(module, name, tensor) of each floating-point table a model computes instead of loading (its non-persistent
    buffers: RoPE frequencies, sinusoids, ALiBi slopes)."""
    return [(module, name, buffer) for module in model.modules() for name, buffer in module.named_buffers(recurse=False)
            if name in module._non_persistent_buffers_set and buffer.is_floating_point()]


def _finish(source: PreTrainedModel, target: PreTrainedModel) -> PreTrainedModel:
    """The source's generation settings, device, dtype, attention back-end and train/eval mode on the converted
    model. Computed tables take the precision of the source's own, not its dtype: `from_pretrained(dtype=bfloat16)`
    keeps Llama's rotary frequencies in float32 (ours too), and bf16 ones turn far positions by visibly wrong angles."""
    if source.can_generate() and target.can_generate():
        # A copy, not rebuilt from its dict: loaded, a generation config remembers it is unchanged since, and
        # `save_pretrained` then only warns about flags the validation dislikes (a `temperature` without `do_sample`,
        # common on the Hub), where a new one refuses to save, as the native model would not.
        target.generation_config = copy.deepcopy(source.generation_config)
    source_tables = _computed_tables(source)
    tables = _computed_tables(target)
    target.to(device=source.device, dtype=source.dtype)
    # The attention back-end, where both sides have it (eager returns the attention weights, sdpa none; GPT-2 has no
    # flex); any other (flash, kernels from the Hub) leaves the target's default.
    backend = source.config._attn_implementation
    if backend in ("eager", "sdpa") or backend == "flex_attention" and target._supports_flex_attn:
        target.set_attn_implementation(backend)
    for module, name, table in tables:  # a source without tables (GPT-2, BERT, Marian) leaves ours as computed
        dtype = source_tables[0][2].dtype if source_tables else table.dtype
        setattr(module, name, table.to(device=source.device, dtype=dtype))
    return target.train(source.training)


def from_hf(model: PreTrainedModel) -> PreTrainedModel:
    """The Scratch model equivalent to a native model of `CONVERTERS`: same weights, same outputs, the native
    generation settings, device, dtype and train/eval mode."""
    name = type(model).__name__
    if name not in CONVERTERS:
        raise ValueError(f"Cannot convert a {name}; supported: {', '.join(CONVERTERS)}.")
    family = CONVERTERS[name]
    source = _StateDict(model)  # first: reading the config may read tensors (BERT's token types), which must be plain
    config = family.our_config(model)
    entries = family.native_weights(config, model)
    tensors = family.extra_from_native(model, source, config, entries)
    tensors |= _native_to_ours(entries, source)
    source.check_all_read()
    scratch = family.ours(config)
    _load(scratch, tensors)
    return _finish(model, scratch)


def to_hf(model: PreTrainedModel) -> PreTrainedModel:
    """The native `transformers` model that computes exactly what `model` computes (see `EXPORTS`), with the same
    weights, generation settings, device, dtype and train/eval mode; saved, it loads anywhere with the plain Auto
    classes, no remote code. Raises a `ValueError` naming every knob that no native class has, per candidate class."""
    families = EXPORTS.get(type(model))
    if families is None:
        raise ValueError(f"Cannot export a {type(model).__name__}; supported: "
                         f"{', '.join(cls.__name__ for cls in EXPORTS)}.")
    blockers = {family.name: family.blockers(model.config) for family in families}
    family = next((family for family in families if not blockers[family.name]), None)
    if family is None:
        lines = "\n".join(f"  as {name}: " + "; ".join(problems) for name, problems in blockers.items())
        raise ValueError(
            f"Cannot export this {type(model).__name__} exactly: no native class computes what these knobs compute.\n"
            f"{lines}\nEach of these knobs changes what the model computes: a model trained with the values asked for "
            f"exports, this one has no exact native equivalent."
        )
    native = family.native_model(model.config)
    entries = family.native_weights(model.config, native)
    source = _StateDict(model)
    tensors = _ours_to_native(entries, source, native)
    family.extra_to_native(model, source, native, tensors)
    source.check_all_read()
    _load(native, tensors)
    return _finish(model, native)


__all__ = ["from_hf", "to_hf", "CONVERTERS", "EXPORTS", "LANGUAGE_MODEL_CONVERTERS"]
