"""Small randomly initialised native `transformers` models (GPT-2, Llama, BERT, Marian) for the parity tests, in eval
mode; BERT's question-answering head beside ours converted from it."""

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
)

from hf_scratch_transformer import ScratchEncoderForQuestionAnswering
from hf_scratch_transformer.conversion import from_hf

VOCAB = 99
ATOL = 1e-4  # logits parity, fp32


def gpt2(**overrides) -> GPT2LMHeadModel:
    values = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=1,
                  eos_token_id=2, pad_token_id=0)
    return GPT2LMHeadModel(GPT2Config(**{**values, **overrides})).eval()


def llama(**overrides) -> LlamaForCausalLM:
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(LlamaConfig(**{**values, **overrides})).eval()


def bert(**overrides) -> BertForMaskedLM:
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=37,
                  vocab_size=VOCAB, max_position_embeddings=64, type_vocab_size=2)
    return BertForMaskedLM(BertConfig(**{**values, **overrides})).eval()


def bert_question_answering(**overrides) -> tuple[BertForQuestionAnswering, ScratchEncoderForQuestionAnswering]:
    """BERT's question-answering head over a random BERT (as `bert()`), and ours converted from it."""
    native = BertForQuestionAnswering(bert(**overrides).config).eval()
    return native, from_hf(native)


def marian(**overrides) -> MarianMTModel:
    values = dict(encoder_layers=2, decoder_layers=2, d_model=32, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, vocab_size=VOCAB,
                  max_position_embeddings=64, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1,
                  eos_token_id=0, scale_embedding=True, activation_function="swish")
    model = MarianMTModel(MarianConfig(**{**values, **overrides})).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()  # real opus-mt checkpoints have one; it becomes our `lm_head.bias`
    return model
