"""Tiny configurations of each family (the sizes of transformers' own model testers) and inputs for them."""

import torch

from hf_scratch_transformer import (
    ScratchDecoderConfig,
    ScratchDecoderForCausalLM,
    ScratchEncoderConfig,
    ScratchEncoderForMaskedLM,
    ScratchSeq2SeqConfig,
    ScratchSeq2SeqForConditionalGeneration,
)

VOCAB = 99
PAD, BOS, EOS = 0, 1, 2
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    pad_token_id=PAD,
    bos_token_id=BOS,
    eos_token_id=EOS,
    dropout=0.0,
)
FAMILIES = ("decoder", "encoder", "seq2seq")
# The decoder's position schemes and head groupings, then with sliding windows (caches and masks differ for each).
POSITION_VARIANTS = [
    dict(position_embedding_type="learned"),
    dict(position_embedding_type="sinusoidal"),
    dict(position_embedding_type="rope"),
    dict(position_embedding_type="alibi"),
    dict(position_embedding_type="rope", num_key_value_heads=2),
    dict(position_embedding_type="learned", num_key_value_heads=1),
]
DECODER_VARIANTS = POSITION_VARIANTS + [
    dict(position_embedding_type="rope", sliding_window=4),
    dict(position_embedding_type="alibi", sliding_window=3, num_key_value_heads=2),
]


def variant_id(variant: dict) -> str:
    """A pytest id for a dict of config overrides."""
    return "-".join(f"{key}={value}" for key, value in variant.items())


def tiny_config(family: str, **overrides):
    """A small config of `family`; `overrides` replace any field."""
    if family == "seq2seq":
        values = {**TINY, "encoder_layers": 2, "decoder_layers": 2, "decoder_start_token_id": BOS, **overrides}
        return ScratchSeq2SeqConfig(**values)
    values = {**TINY, "num_hidden_layers": 2, **overrides}
    return (ScratchDecoderConfig if family == "decoder" else ScratchEncoderConfig)(**values)


LM_CLASSES = {
    "decoder": ScratchDecoderForCausalLM,
    "encoder": ScratchEncoderForMaskedLM,
    "seq2seq": ScratchSeq2SeqForConditionalGeneration,
}


def tiny_lm(family: str, **overrides):
    """The language-model head class of `family` on a tiny config, seeded, in eval mode."""
    torch.manual_seed(0)
    return LM_CLASSES[family](tiny_config(family, **overrides)).eval()


def lm_inputs(family: str, batch: int = 2, length: int = 7, seed: int = 1) -> dict:
    """Random ids (no special tokens) as the `family`'s LM expects them, with `labels`."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    if family == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(3, VOCAB, (batch, length - 2), generator=generator)}
    return {"input_ids": ids, "labels": ids.clone()}

