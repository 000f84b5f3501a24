"""Named configurations of the systems this project grew from (SPEC section 4). Presets are data: each entry
names its family and the source it reproduces; `get_preset` copies it, applies overrides and builds the family's
config, so validation always runs. No model file imports this module (it never travels to the Hub).
"""

import copy
import dataclasses
import difflib

from .configuration_scratch import ROPE_KEYS, ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig

FAMILY_CONFIGS = {
    "seq2seq": ScratchSeq2SeqConfig,
    "decoder": ScratchDecoderConfig,
    "encoder": ScratchEncoderConfig,
}

# Vaswani et al. (2017), Table 3 "base": post-norm, sinusoidal, ReLU, shared source/target BPE vocabulary of
# about 37k tokens, embeddings tied with the output projection and scaled by sqrt(d_model) (section 3.4).
_TRANSFORMER_BASE = dict(
    family="seq2seq",
    vocab_size=37000,
    encoder_layers=6,
    decoder_layers=6,
    hidden_size=512,
    num_attention_heads=8,
    intermediate_size=2048,
    hidden_act="relu",
    max_position_embeddings=1024,
    position_embedding_type="sinusoidal",
    norm_type="layernorm",
    norm_position="post",
    layer_norm_eps=1e-6,
    final_norm=False,
    dropout=0.1,
    embedding_dropout=0.1,  # section 5.4: also on the sums of embeddings and positional encodings
    scale_embeddings=True,
    share_embeddings=True,
    tie_word_embeddings=True,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
)

PRESETS: dict[str, dict] = {
    "transformer-base": _TRANSFORMER_BASE,
    # Vaswani et al. (2017), Table 3 "big" (P_drop 0.3 for EN-DE).
    "transformer-big": {
        **_TRANSFORMER_BASE, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096,
        "dropout": 0.3, "embedding_dropout": 0.3,
    },
    # The same stack in the pre-norm form most from-scratch notes use (Xiong et al., 2020): a final norm per stack.
    "transformer-prenorm": {**_TRANSFORMER_BASE, "norm_position": "pre", "final_norm": True},
    # Pre-norm, separate source and target vocabularies, Xavier-uniform init (fairseq / OpenNMT recipes).
    "transformer-xavier": {
        **_TRANSFORMER_BASE, "norm_position": "pre", "final_norm": True, "vocab_size": 32000,
        "encoder_vocab_size": 32000, "share_embeddings": False, "init_scheme": "xavier",
    },
    # GPT-2 124M, the `gpt2` checkpoint's config.json: n_layer 12, n_embd 768, n_head 12, n_positions 1024.
    "gpt2-small": dict(
        family="decoder",
        vocab_size=50257,
        num_hidden_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu_tanh",
        max_position_embeddings=1024,
        position_embedding_type="learned",
        norm_position="pre",
        layer_norm_eps=1e-5,
        final_norm=True,
        use_bias=True,
        dropout=0.1,
        attention_dropout=0.1,
        embedding_dropout=0.1,
        activation_dropout=0.0,  # resid/attn/embd_pdrop; none inside the MLP
        tie_word_embeddings=True,
        bos_token_id=50256,
        eos_token_id=50256,
    ),
    # minGPT's "gpt-mini" size (6 layers, 6 heads, 192 wide) with a vocabulary for tokenizers trained here.
    "gpt-mini": dict(
        family="decoder",
        vocab_size=8192,
        num_hidden_layers=6,
        hidden_size=192,
        num_attention_heads=6,
        intermediate_size=768,
        hidden_act="relu",
        max_position_embeddings=256,
        position_embedding_type="learned",
        norm_position="pre",
        final_norm=True,
        dropout=0.1,
        tie_word_embeddings=True,
    ),
    # Llama-style: RoPE, RMSNorm, SwiGLU (intermediate about 8/3 x hidden), no biases, 4:1 GQA, untied head.
    "llama-style": dict(
        family="decoder",
        vocab_size=32000,
        num_hidden_layers=8,
        hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1376,
        hidden_act="swiglu",
        max_position_embeddings=2048,
        position_embedding_type="rope",
        rope_theta=10000.0,
        norm_type="rmsnorm",
        norm_position="pre",
        layer_norm_eps=1e-6,
        final_norm=True,
        use_bias=False,
        dropout=0.0,
        tie_word_embeddings=False,
    ),
    # BERT base, the `bert-base-uncased` config.json: post-norm, learned positions, 2 token types, GELU,
    # embedding LayerNorm and the MLM transform head; tied decoder with its own bias.
    "bert-base": dict(
        family="encoder",
        vocab_size=30522,
        num_hidden_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="gelu",
        max_position_embeddings=512,
        position_embedding_type="learned",
        type_vocab_size=2,
        norm_position="post",
        layer_norm_eps=1e-12,
        final_norm=False,
        embedding_norm=True,
        mlm_transform=True,
        dropout=0.1,
        attention_dropout=0.1,
        embedding_dropout=0.1,
        activation_dropout=0.0,  # hidden/attention_probs_dropout_prob; none inside the MLP
        tie_word_embeddings=True,
        pad_token_id=0,
    ),
    # Cramming (Geiping & Goldstein, 2023): pre-norm, embedding and final norms, GEGLU without biases, no
    # dropout, sparse MLM prediction, tied head; sinusoidal positions as SPEC section 4 asks.
    "bert-prenorm": dict(
        family="encoder",
        vocab_size=32768,
        num_hidden_layers=16,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        hidden_act="geglu",
        max_position_embeddings=128,
        position_embedding_type="sinusoidal",
        type_vocab_size=0,
        norm_position="pre",
        final_norm=True,
        embedding_norm=True,
        use_bias=False,
        dropout=0.0,
        sparse_prediction=True,
        tie_word_embeddings=True,
        pad_token_id=0,
    ),
}


def get_preset(name: str, **overrides):
    """A new config for preset `name`, with `overrides` applied (any config field, e.g. `vocab_size=8192`)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    values = copy.deepcopy(PRESETS[name])
    config_class = FAMILY_CONFIGS[values.pop("family")]
    values.update(overrides)
    check_fields(config_class, overrides, values)
    return config_class(**values)


def check_fields(config_class, overrides: dict, values: dict) -> None:
    """`overrides` of a `config_class` built from `values` (which include them): transformers' configs keep any
    unknown keyword as an attribute, so a misspelt field (`num_layers`) would be saved in config.json and change
    nothing: name it instead. Keywords the configs take that are not fields:
    `attn_implementation`, the RoPE settings (`rope_theta` and the like, folded into `rope_parameters`) and the
    `attribute_map` aliases (a seq2seq `num_hidden_layers`). RoPE settings of a config without RoPE positions would
    be dropped by the config: named too."""
    known = {field.name for field in dataclasses.fields(config_class)} | {"attn_implementation"}
    known |= {*ROPE_KEYS, *config_class.attribute_map}
    position_type = values.get("position_embedding_type", config_class.position_embedding_type)
    if position_type != "rope" and (ignored := [key for key in overrides if key in ROPE_KEYS]):
        raise ValueError(
            f"{', '.join(ignored)}: RoPE settings, for `position_embedding_type='rope'` (this config has "
            f"{position_type!r})."
        )
    unknown = [key for key in overrides if key not in known and not hasattr(config_class, key)]
    if unknown:
        hints = [f"{key} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(key, known, n=1)) else key
                 for key in unknown]
        raise ValueError(f"{config_class.__name__} has no field {', '.join(hints)}.")


__all__ = ["PRESETS", "FAMILY_CONFIGS", "check_fields", "get_preset"]
