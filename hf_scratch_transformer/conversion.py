"""Native `transformers` models -> Scratch models with the same outputs: `from_hf(model)` converts a
`GPT2LMHeadModel`, `BertForMaskedLM` or `MarianMTModel` (configuration and weights).

Each source has one explicit table from our parameter names to theirs; fused projections (our QKV) are
concatenations of their separate ones, and GPT-2's Conv1D weights are transposed. Every native tensor must be
used exactly once (tied copies are named as such), and every one of ours filled: a mismatch is an error, never a
silently half-converted model. No model file imports this module.
"""

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .configuration_scratch import ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig
from .modeling_scratch_decoder import ScratchDecoderForCausalLM
from .modeling_scratch_encoder import ScratchEncoderForMaskedLM
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
}


def _activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"Activation {name!r} has no Scratch equivalent; known: {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


def _unsupported(condition: bool, what: str) -> None:
    if condition:
        raise ValueError(f"Cannot convert: {what} has no Scratch equivalent.")


class _Checkpoint:
    """A native state dict from which every tensor must be taken once (or skipped, saying why)."""

    def __init__(self, model: PreTrainedModel):
        self.tensors = {k: v.detach() for k, v in model.state_dict().items()}  # `_load` copies them
        self.taken: set[str] = set()

    def take(self, key: str) -> torch.Tensor:
        self.taken.add(key)
        return self.tensors[key]

    def transposed(self, key: str) -> torch.Tensor:
        """GPT-2's Conv1D stores (in, out); nn.Linear wants (out, in)."""
        return self.take(key).t().contiguous()

    def concat(self, *keys: str) -> torch.Tensor:
        """Separate projections stacked along the output dimension: our fused QKV / KV."""
        return torch.cat([self.take(key) for key in keys], dim=0)

    def skip(self, key: str) -> None:
        """A tensor the native forward does not read on its own: a tied copy, or an unused matrix."""
        self.taken.add(key)

    def check_all_taken(self) -> None:
        left = sorted(set(self.tensors) - self.taken)
        if left:
            raise ValueError(f"Conversion left native tensors unused: {left}")


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


def _linear(ours: str, tensor: Callable[[str], torch.Tensor], theirs: str, bias: bool = True) -> dict:
    entries = {f"{ours}.weight": tensor(f"{theirs}.weight")}
    if bias:
        entries[f"{ours}.bias"] = tensor(f"{theirs}.bias")
    return entries


def _norm(ours: str, source: _Checkpoint, theirs: str) -> dict:
    return {f"{ours}.weight": source.take(f"{theirs}.weight"), f"{ours}.bias": source.take(f"{theirs}.bias")}


# ---------------------------------------------------------------------------------------------- GPT-2


def _gpt2(native) -> tuple[PreTrainedModel, dict, _Checkpoint]:
    c = native.config
    _unsupported(c.scale_attn_by_inverse_layer_idx, "scale_attn_by_inverse_layer_idx=True")
    _unsupported(not c.scale_attn_weights, "scale_attn_weights=False")
    _unsupported(c.add_cross_attention, "add_cross_attention=True")
    config = ScratchDecoderConfig(
        vocab_size=c.vocab_size,
        num_hidden_layers=c.n_layer,
        hidden_size=c.n_embd,
        num_attention_heads=c.n_head,
        intermediate_size=c.n_inner or 4 * c.n_embd,
        hidden_act=_activation(c.activation_function),
        max_position_embeddings=c.n_positions,
        position_embedding_type="learned",
        norm_position="pre",
        layer_norm_eps=c.layer_norm_epsilon,
        final_norm=True,
        use_bias=True,
        dropout=c.resid_pdrop,
        attention_dropout=c.attn_pdrop,
        activation_dropout=0.0,
        embedding_dropout=c.embd_pdrop,
        tie_word_embeddings=c.tie_word_embeddings,
        initializer_range=c.initializer_range,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
    )
    src = _Checkpoint(native)
    t = {
        "model.embeddings.embed_tokens.weight": src.take("transformer.wte.weight"),
        "model.embeddings.embed_positions.weight": src.take("transformer.wpe.weight"),
        **_norm("model.final_norm", src, "transformer.ln_f"),
    }
    for i in range(c.n_layer):
        ours, theirs = f"model.layers.{i}", f"transformer.h.{i}"
        t |= _norm(f"{ours}.attn_norm", src, f"{theirs}.ln_1")
        t |= {f"{ours}.self_attn.qkv_proj.weight": src.transposed(f"{theirs}.attn.c_attn.weight"),
              f"{ours}.self_attn.qkv_proj.bias": src.take(f"{theirs}.attn.c_attn.bias")}
        t |= {f"{ours}.self_attn.o_proj.weight": src.transposed(f"{theirs}.attn.c_proj.weight"),
              f"{ours}.self_attn.o_proj.bias": src.take(f"{theirs}.attn.c_proj.bias")}
        t |= _norm(f"{ours}.mlp_norm", src, f"{theirs}.ln_2")
        t |= {f"{ours}.mlp.up_proj.weight": src.transposed(f"{theirs}.mlp.c_fc.weight"),
              f"{ours}.mlp.up_proj.bias": src.take(f"{theirs}.mlp.c_fc.bias")}
        t |= {f"{ours}.mlp.down_proj.weight": src.transposed(f"{theirs}.mlp.c_proj.weight"),
              f"{ours}.mlp.down_proj.bias": src.take(f"{theirs}.mlp.c_proj.bias")}
    if config.tie_word_embeddings:
        src.skip("lm_head.weight")
    else:
        t["lm_head.weight"] = src.take("lm_head.weight")
    return ScratchDecoderForCausalLM(config), t, src


# ---------------------------------------------------------------------------------------------- BERT


def _bert(native) -> tuple[PreTrainedModel, dict, _Checkpoint]:
    c = native.config
    _unsupported(getattr(c, "position_embedding_type", "absolute") != "absolute", "relative position embeddings")
    _unsupported(c.is_decoder, "a BERT decoder")
    config = ScratchEncoderConfig(
        vocab_size=c.vocab_size,
        num_hidden_layers=c.num_hidden_layers,
        hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        hidden_act=_activation(c.hidden_act),
        max_position_embeddings=c.max_position_embeddings,
        position_embedding_type="learned",
        type_vocab_size=c.type_vocab_size,
        norm_position="post",
        layer_norm_eps=c.layer_norm_eps,
        final_norm=False,
        embedding_norm=True,
        mlm_transform=True,
        use_bias=True,
        dropout=c.hidden_dropout_prob,
        attention_dropout=c.attention_probs_dropout_prob,
        activation_dropout=0.0,
        embedding_dropout=c.hidden_dropout_prob,
        tie_word_embeddings=c.tie_word_embeddings,
        initializer_range=c.initializer_range,
        pad_token_id=c.pad_token_id,
    )
    src = _Checkpoint(native)
    emb = "bert.embeddings"
    t = {
        "model.embeddings.embed_tokens.weight": src.take(f"{emb}.word_embeddings.weight"),
        "model.embeddings.embed_positions.weight": src.take(f"{emb}.position_embeddings.weight"),
        "model.embeddings.token_type_embeddings.weight": src.take(f"{emb}.token_type_embeddings.weight"),
        **_norm("model.embeddings.norm", src, f"{emb}.LayerNorm"),
    }
    for i in range(c.num_hidden_layers):
        ours, theirs = f"model.layers.{i}", f"bert.encoder.layer.{i}"
        qkv = [f"{theirs}.attention.self.{name}" for name in ("query", "key", "value")]
        t |= {f"{ours}.self_attn.qkv_proj.weight": src.concat(*(f"{k}.weight" for k in qkv)),
              f"{ours}.self_attn.qkv_proj.bias": src.concat(*(f"{k}.bias" for k in qkv))}
        t |= _linear(f"{ours}.self_attn.o_proj", src.take, f"{theirs}.attention.output.dense")
        t |= _norm(f"{ours}.attn_norm", src, f"{theirs}.attention.output.LayerNorm")
        t |= _linear(f"{ours}.mlp.up_proj", src.take, f"{theirs}.intermediate.dense")
        t |= _linear(f"{ours}.mlp.down_proj", src.take, f"{theirs}.output.dense")
        t |= _norm(f"{ours}.mlp_norm", src, f"{theirs}.output.LayerNorm")
    t |= _linear("head_transform.dense", src.take, "cls.predictions.transform.dense")
    t |= _norm("head_transform.norm", src, "cls.predictions.transform.LayerNorm")
    t["lm_head.bias"] = src.take("cls.predictions.bias")
    src.skip("cls.predictions.decoder.bias")  # the same tensor as cls.predictions.bias
    if config.tie_word_embeddings:
        src.skip("cls.predictions.decoder.weight")
    else:
        t["lm_head.weight"] = src.take("cls.predictions.decoder.weight")
    return ScratchEncoderForMaskedLM(config), t, src


# ---------------------------------------------------------------------------------------------- Marian


def _marian_attention(src: _Checkpoint, ours: str, theirs: str, cross: bool) -> dict:
    q, k, v = (f"{theirs}.{name}_proj" for name in ("q", "k", "v"))
    if cross:
        t = _linear(f"{ours}.q_proj", src.take, q)
        t |= {f"{ours}.kv_proj.weight": src.concat(f"{k}.weight", f"{v}.weight"),
              f"{ours}.kv_proj.bias": src.concat(f"{k}.bias", f"{v}.bias")}
    else:
        t = {f"{ours}.qkv_proj.weight": src.concat(f"{q}.weight", f"{k}.weight", f"{v}.weight"),
             f"{ours}.qkv_proj.bias": src.concat(f"{q}.bias", f"{k}.bias", f"{v}.bias")}
    return t | _linear(f"{ours}.o_proj", src.take, f"{theirs}.out_proj")


def _marian_stack(src: _Checkpoint, stack: str, layers: int) -> dict:
    positions = src.take(f"model.{stack}.embed_positions.weight")
    table = sinusoidal_table(*positions.shape, layout="split")
    if not torch.allclose(positions.float(), table, atol=1e-5):
        raise ValueError(f"model.{stack}.embed_positions.weight is not the sinusoid table Scratch computes.")
    t = {}
    for i in range(layers):
        ours, theirs = f"model.{stack}.layers.{i}", f"model.{stack}.layers.{i}"
        t |= _marian_attention(src, f"{ours}.self_attn", f"{theirs}.self_attn", cross=False)
        t |= _norm(f"{ours}.attn_norm", src, f"{theirs}.self_attn_layer_norm")
        if stack == "decoder":
            t |= _marian_attention(src, f"{ours}.cross_attn", f"{theirs}.encoder_attn", cross=True)
            t |= _norm(f"{ours}.cross_attn_norm", src, f"{theirs}.encoder_attn_layer_norm")
        t |= _linear(f"{ours}.mlp.up_proj", src.take, f"{theirs}.fc1")
        t |= _linear(f"{ours}.mlp.down_proj", src.take, f"{theirs}.fc2")
        t |= _norm(f"{ours}.mlp_norm", src, f"{theirs}.final_layer_norm")
    return t


def _marian(native) -> tuple[PreTrainedModel, dict, _Checkpoint]:
    c = native.config
    _unsupported(c.encoder_attention_heads != c.decoder_attention_heads, "different encoder and decoder head counts")
    _unsupported(c.encoder_ffn_dim != c.decoder_ffn_dim, "different encoder and decoder FFN sizes")
    # transformers 5 ties Marian's embeddings only under `tie_word_embeddings`: with it off, encoder, decoder and
    # output matrices are separate parameters even when `share_encoder_decoder_embeddings` is set.
    shared = c.share_encoder_decoder_embeddings and c.tie_word_embeddings
    target_vocab = c.vocab_size if c.share_encoder_decoder_embeddings else (c.decoder_vocab_size or c.vocab_size)
    src = _Checkpoint(native)
    final_logits_bias = src.take("final_logits_bias").reshape(-1)
    config = ScratchSeq2SeqConfig(
        vocab_size=target_vocab,
        encoder_vocab_size=None if target_vocab == c.vocab_size else c.vocab_size,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        hidden_size=c.d_model,
        num_attention_heads=c.encoder_attention_heads,
        intermediate_size=c.encoder_ffn_dim,
        hidden_act=_activation(c.activation_function),
        max_position_embeddings=c.max_position_embeddings,
        position_embedding_type="sinusoidal",
        sinusoidal_layout="split",
        norm_position="post",
        layer_norm_eps=1e-5,  # nn.LayerNorm's default, which Marian uses
        final_norm=False,
        use_bias=True,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        embedding_dropout=c.dropout,  # Marian drops out embeddings + positions with `dropout` too
        scale_embeddings=c.scale_embedding,
        share_embeddings=shared,
        tie_word_embeddings=c.tie_word_embeddings,
        output_bias=bool(final_logits_bias.any()),
        initializer_range=c.init_std,
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        decoder_start_token_id=c.decoder_start_token_id,
    )
    t = _marian_stack(src, "encoder", c.encoder_layers) | _marian_stack(src, "decoder", c.decoder_layers)
    if shared:
        t["model.decoder.embeddings.embed_tokens.weight"] = src.take("model.shared.weight")
        for copy in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
            src.skip(copy)
    else:
        t["model.encoder.embeddings.embed_tokens.weight"] = src.take("model.encoder.embed_tokens.weight")
        t["model.decoder.embeddings.embed_tokens.weight"] = src.take("model.decoder.embed_tokens.weight")
        if "model.shared.weight" in src.tensors:
            src.skip("model.shared.weight")  # kept by Marian, read by nothing when not tied
    if config.tie_word_embeddings:
        src.skip("lm_head.weight")
    else:
        t["lm_head.weight"] = src.take("lm_head.weight")
    if config.output_bias:
        t["lm_head.bias"] = final_logits_bias
    return ScratchSeq2SeqForConditionalGeneration(config), t, src


CONVERTERS = {"GPT2LMHeadModel": _gpt2, "BertForMaskedLM": _bert, "MarianMTModel": _marian}


def from_hf(model: PreTrainedModel) -> PreTrainedModel:
    """The Scratch model equivalent to a native `GPT2LMHeadModel`, `BertForMaskedLM` or `MarianMTModel`: same
    weights, same outputs, the native generation settings; in the native model's train/eval mode."""
    name = type(model).__name__
    if name not in CONVERTERS:
        raise ValueError(f"Cannot convert a {name}; supported: {', '.join(CONVERTERS)}.")
    scratch, tensors, source = CONVERTERS[name](model)
    source.check_all_taken()
    _load(scratch, tensors)
    if getattr(model, "generation_config", None) is not None and scratch.can_generate():
        scratch.generation_config = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    return scratch.train(model.training)


__all__ = ["from_hf", "CONVERTERS"]
