"""`to_hf` and `from_hf` are inverses on every pair: GPT-2, Llama, Mistral (and Qwen2 one way), BERT and Marian.

On tiny randomly initialised models (weights perturbed so that biases and norms are not their trivial init): logits
equal to 1e-4 in fp32, the same greedy and beam-search tokens, and round trips that give back the exact state dict
and config. The exported folder loads with the plain Auto classes in a process where `hf_scratch_transformer`
cannot be imported. Every knob without a native equivalent is named in one `ValueError`.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from tiny_models import BOS, EOS, PAD, TINY, VOCAB, tiny_lm
from tiny_native import ATOL, bert, gpt2, llama, marian
from transformers import (
    BertForMaskedLM,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MarianMTModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import hf_scratch_transformer as hst
from hf_scratch_transformer.conversion import from_hf, to_hf
from hf_scratch_transformer.llama_cpp import llama_cpp_caveats

# Our knobs that equal each native architecture (the tiny configs are pre-norm, LayerNorm, biases, final norm).
GPT2_KNOBS = dict(position_embedding_type="learned", hidden_act="gelu_tanh")
LLAMA_KNOBS = dict(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu", use_bias=False,
                   layer_norm_eps=1e-6)
BERT_KNOBS = dict(norm_position="post", final_norm=False, embedding_norm=True, mlm_transform=True, type_vocab_size=2)
MARIAN_KNOBS = dict(position_embedding_type="sinusoidal", sinusoidal_layout="split", norm_position="post",
                    final_norm=False, scale_embeddings=True, output_bias=True)

# id: (family, our config overrides, the native class `to_hf` must give)
EXPORTS = {
    "gpt2": ("decoder", GPT2_KNOBS, GPT2LMHeadModel),
    "gpt2-relu-untied": ("decoder", {**GPT2_KNOBS, "hidden_act": "relu", "tie_word_embeddings": False},
                         GPT2LMHeadModel),
    "llama-gqa-untied": ("decoder", {**LLAMA_KNOBS, "num_key_value_heads": 2, "tie_word_embeddings": False},
                         LlamaForCausalLM),
    "llama-biases-tied": ("decoder", {**LLAMA_KNOBS, "use_bias": True}, LlamaForCausalLM),
    "llama-yarn": ("decoder", {**LLAMA_KNOBS, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 500.0, "factor": 2.0, "original_max_position_embeddings": 32}},
        LlamaForCausalLM),
    "mistral-window": ("decoder", {**LLAMA_KNOBS, "num_key_value_heads": 1, "sliding_window": 4}, MistralForCausalLM),
    "bert": ("encoder", BERT_KNOBS, BertForMaskedLM),
    "bert-no-token-types-untied": ("encoder", {**BERT_KNOBS, "type_vocab_size": 0, "tie_word_embeddings": False},
                                   BertForMaskedLM),
    "marian-shared": ("seq2seq", MARIAN_KNOBS, MarianMTModel),
    "marian-two-vocabularies": ("seq2seq", {**MARIAN_KNOBS, "share_embeddings": False, "encoder_vocab_size": 120},
                                MarianMTModel),
    "marian-untied": ("seq2seq", {**MARIAN_KNOBS, "share_embeddings": False, "tie_word_embeddings": False,
                                  "output_bias": False, "hidden_act": "gelu"}, MarianMTModel),
    "marian-separate-embeddings-tied-head": ("seq2seq", {**MARIAN_KNOBS, "share_embeddings": False}, MarianMTModel),
}
GENERATIVE = [name for name, (family, _, _) in EXPORTS.items() if family != "encoder"]


def perturbed(model):
    """Trained-looking weights: biases and norms away from 0 and 1. Computed tables (Marian's sinusoids) stay."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def _ours(name):
    family, overrides, _ = EXPORTS[name]
    return perturbed(tiny_lm(family, **overrides))


def _inputs(family, length=9):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, length), generator=generator)
    mask = torch.ones_like(ids)
    if family == "decoder":
        mask[1, :3], ids[1, :3] = 0, PAD  # left padding
    else:
        mask[1, -3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family == "seq2seq":
        inputs["decoder_input_ids"] = torch.cat([torch.full((2, 1), BOS), ids[:, :4]], dim=1)
    return inputs


def _assert_same_logits(a, b, family):
    inputs = _inputs(family)
    with torch.no_grad():
        torch.testing.assert_close(a(**inputs).logits, b(**inputs).logits, atol=ATOL, rtol=0)


def _assert_same_state_dict(a, b):
    left, right = a.state_dict(), b.state_dict()
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def _assert_same_generation(a, b, family):
    inputs = _inputs(family, length=6)
    inputs.pop("decoder_input_ids", None)
    for kwargs in (dict(do_sample=False), dict(num_beams=3, length_penalty=0.7, num_return_sequences=2)):
        expected = a.generate(**inputs, max_new_tokens=8, min_new_tokens=8, **kwargs)
        actual = b.generate(**inputs, max_new_tokens=8, min_new_tokens=8, **kwargs)
        assert torch.equal(actual, expected), kwargs


# ---------------------------------------------------------------------------------------------- ours -> native


@pytest.mark.parametrize("name", EXPORTS)
def test_export_computes_the_same_and_converts_back_exactly(name):
    family, _, native_class = EXPORTS[name]
    ours = _ours(name)
    native = to_hf(ours)
    assert type(native) is native_class and not native.training
    _assert_same_logits(ours, native, family)
    back = from_hf(native)
    assert type(back) is type(ours)
    _assert_same_state_dict(back, ours)
    expected = ours.config.to_dict()
    # `activation_dropout=None` ("the same as `dropout`") comes back as the rate the native config has.
    expected["activation_dropout"] = ours.config.activation_dropout_rate
    assert back.config.to_dict() == expected


@pytest.mark.parametrize("name", GENERATIVE)
def test_export_generates_the_same_tokens(name):
    ours = _ours(name)
    _assert_same_generation(ours, to_hf(ours), EXPORTS[name][0])


def test_export_keeps_generation_config_dtype_and_mode():
    ours = _ours("llama-gqa-untied")
    ours.generation_config.num_beams, ours.generation_config.max_new_tokens = 3, 11
    native = to_hf(ours.to(torch.bfloat16).train())
    assert native.dtype == torch.bfloat16 and native.training
    assert (native.generation_config.num_beams, native.generation_config.max_new_tokens) == (3, 11)
    assert native.generation_config.eos_token_id == EOS


@pytest.mark.parametrize("convert, make_source", [(from_hf, llama), (to_hf, lambda: _ours("llama-gqa-untied"))],
                         ids=["from_hf", "to_hf"])
def test_a_loaded_generation_config_that_validation_dislikes_is_saved_as_the_source_saves_it(convert, make_source,
                                                                                             tmp_path):
    """Hub checkpoints often set `temperature` / `top_p` without `do_sample`: transformers warns about such a loaded
    config and saves it back unchanged, but refused to save the converted model's (rebuilt, so "modified"), which
    failed `hf-scratch convert` after all its work."""
    make_source().save_pretrained(tmp_path / "source")
    written = {"temperature": 0.6, "top_p": 0.9, "eos_token_id": EOS}
    (tmp_path / "source" / "generation_config.json").write_text(json.dumps(written))
    source = type(make_source()).from_pretrained(tmp_path / "source")
    convert(source).save_pretrained(tmp_path / "converted")
    saved = json.loads((tmp_path / "converted" / "generation_config.json").read_text())
    assert saved == written | {"transformers_version": saved["transformers_version"]}


@pytest.mark.parametrize("name", ["gpt2", "llama-gqa-untied", "mistral-window", "bert", "marian-shared"])
def test_use_cache_off_is_carried_both_ways(name):
    """`use_cache=False` (a config saved from gradient-checkpointed training) came back True both ways: the
    converted model's forward returned a cache the source's did not (another `return_dict=False` tuple)."""
    ours = _ours(name)
    ours.config.use_cache = False
    native = to_hf(ours)
    assert native.config.use_cache is False
    assert from_hf(native).config.use_cache is False


# What llama.cpp computes otherwise, per export (docs/native_models.md, "GGUF and llama.cpp"): the GPT-2 and Mistral
# window cases were run through its convert_hf_to_gguf.py and llama.cpp itself (0c1e57098), the RoPE scalings read in
# its source (a458664); here only the rule, which needs neither.
YARN = EXPORTS["llama-yarn"][1]["rope_parameters"]  # factor 2 over 32 pretraining positions, of the tiny 64
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32}


def _rope(rope_parameters, **overrides):
    """A Llama export's config overrides with these `rope_parameters`."""
    return {**LLAMA_KNOBS, "rope_parameters": rope_parameters, **overrides}


LLAMA_CPP_CASES = {  # name: (our config overrides, fragments of the caveats, one per caveat; none = llama.cpp runs it)
    "gpt2-gelu_tanh": ({**GPT2_KNOBS, "intermediate_size": 128}, []),
    "gpt2-relu": ({**GPT2_KNOBS, "hidden_act": "relu", "intermediate_size": 128}, ["'relu': llama.cpp's GPT-2"]),
    "gpt2-silu": ({**GPT2_KNOBS, "hidden_act": "silu", "intermediate_size": 128}, ["'silu': llama.cpp's GPT-2"]),
    "gpt2-gelu": ({**GPT2_KNOBS, "hidden_act": "gelu", "intermediate_size": 128}, ["tanh approximation"]),
    "gpt2-relu-ffn37": ({**GPT2_KNOBS, "hidden_act": "relu"}, ["'relu'", "n_inner=37"]),
    "llama-gqa-untied": (EXPORTS["llama-gqa-untied"][1], []),
    "llama-biases-tied": (EXPORTS["llama-biases-tied"][1], []),
    "mistral-window": (EXPORTS["mistral-window"][1], ["sliding_window=4: llama.cpp runs MistralForCausalLM as Llama"]),
    "mistral-window-past-the-positions": ({**LLAMA_KNOBS, "sliding_window": 64}, []),
    "llama-linear": (_rope({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), []),
    "llama-yarn": (EXPORTS["llama-yarn"][1], []),
    "llama-yarn-attention_factor": (_rope({**YARN, "attention_factor": 1.0}), ["attention_factor=1.0 (yarn)"]),
    "llama-yarn-its-own-attention_factor": (_rope({**YARN, "attention_factor": 0.1 * math.log(2.0) + 1}), []),
    "llama-yarn-mscales": (_rope({**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}),
                           ["mscale=1.0, mscale_all_dim=1.0 (yarn): llama.cpp's Llama graph scales cos/sin by 0.1"]),
    "llama-yarn-mscale-alone": (_rope({**YARN, "mscale": 0.707}), []),  # transformers too needs both
    "llama-yarn-betas": (_rope({**YARN, "original_max_position_embeddings": 512, "beta_fast": 16, "beta_slow": 4},
                               max_position_embeddings=1024), ["beta_fast=16 (yarn)", "beta_slow=4 (yarn)"]),
    "llama-yarn-beta-rounded-alike": (_rope({**YARN, "beta_fast": 16}), []),  # the same whole correction range
    "llama-yarn-untruncated": (_rope({**YARN, "truncate": False}), ["truncate=False (yarn)"]),
    "llama-dynamic": (_rope({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
                      ["rope_type='dynamic': llama.cpp's converter writes no scaling"]),
    "llama-llama3": (_rope(LLAMA3), ["original_max_position_embeddings=32 (llama3)"]),
    "llama-llama3-8192": (_rope({**LLAMA3, "original_max_position_embeddings": 8192}, max_position_embeddings=16384),
                          []),
    "llama-longrope": (_rope({**LONGROPE, "short_factor": [1.0, 1.0, 1.5, 2.0], "long_factor": [2.0] * 4}),
                       ["short_factor (longrope)", "longrope's attention factor 1.095", "long_factor (longrope)"]),
    "llama-longrope-unscaled": (_rope({**LONGROPE, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4,
                                       "attention_factor": 1.0}), []),
    "llama-proportional": (_rope({"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
                           ["rope_type='proportional' (partial_rotary_factor=0.5): llama.cpp's converter does not"]),
    "llama-proportional-whole-head": (_rope({"rope_type": "proportional", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 1.0}), []),
    "mistral-window-yarn-attention_factor": (_rope({**YARN, "attention_factor": 1.0}, num_key_value_heads=1,
                                                   sliding_window=4), ["sliding_window=4", "attention_factor=1.0"]),
}


@pytest.mark.parametrize("name", LLAMA_CPP_CASES)
def test_llama_cpp_caveats_name_what_its_gguf_graphs_compute_otherwise(name):
    overrides, fragments = LLAMA_CPP_CASES[name]
    caveats = llama_cpp_caveats(to_hf(tiny_lm("decoder", **overrides)))
    assert len(caveats) == len(fragments) and all(f in c for f, c in zip(fragments, caveats, strict=True)), caveats


def test_a_gpt2_export_writes_n_ctx_for_llama_cpp(tmp_path):
    """llama.cpp's convert_hf_to_gguf.py reads GPT-2's `n_ctx` (OpenAI's configs have it; GPT2Config no longer
    writes it): without it the conversion stopped with a KeyError."""
    to_hf(tiny_lm("decoder", **GPT2_KNOBS)).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["n_ctx"] == config["n_positions"] == TINY["max_position_embeddings"]


# ---------------------------------------------------------------------------------------------- native -> ours


def _mistral(**overrides):
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64, sliding_window=4,
                  pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    return MistralForCausalLM(MistralConfig(**{**values, **overrides})).eval()


def _qwen2(**overrides):
    values = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=PAD,
                  bos_token_id=BOS, eos_token_id=EOS)
    return Qwen2ForCausalLM(Qwen2Config(**{**values, **overrides})).eval()


LLAMA3_ROPE = dict(rope_type="llama3", rope_theta=500.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
# id: (native factory, family, the class `to_hf(from_hf(...))` gives back)
IMPORTS = {
    "gpt2": (gpt2, "decoder", GPT2LMHeadModel),
    "llama": (lambda: llama(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE), "decoder", LlamaForCausalLM),
    "llama-attention-bias": (lambda: llama(attention_bias=True), "decoder", LlamaForCausalLM),
    "mistral": (_mistral, "decoder", MistralForCausalLM),
    # Qwen2 biases q, k and v only: ours has one `use_bias`, so the rest become zero biases, and it exports as a
    # Llama with biases everywhere (the same function; Qwen2 is not an export target).
    "qwen2": (_qwen2, "decoder", LlamaForCausalLM),
    "qwen2-all-layers-sliding": (lambda: _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0),
                                 "decoder", None),
    "bert": (bert, "encoder", BertForMaskedLM),
    # One token type, trained (RoBERTa-style configs): its row is added to every embedding. Only the all-zero row that
    # `to_hf` writes for a model without token types adds nothing and is left out.
    "bert-one-token-type": (lambda: bert(type_vocab_size=1), "encoder", BertForMaskedLM),
    "marian": (marian, "seq2seq", MarianMTModel),
    # Config fields that transformers 5 reads as no knob at all, as real checkpoints carry them (GPT-2's
    # `reorder_and_upcast_attn` counts in eager half precision only), a Llama biased in its MLP alone (zero attention
    # biases), a Mistral without a window and a Qwen2 whose windowed layers start past its last.
    "gpt2-reorder-and-upcast-attn": (lambda: gpt2(reorder_and_upcast_attn=True), "decoder", GPT2LMHeadModel),
    "llama-mlp-bias": (lambda: llama(mlp_bias=True), "decoder", LlamaForCausalLM),
    "llama-pretraining-tp": (lambda: llama(pretraining_tp=2), "decoder", LlamaForCausalLM),
    "mistral-no-window": (lambda: _mistral(sliding_window=None), "decoder", LlamaForCausalLM),
    "qwen2-window-past-the-layers": (lambda: _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=2),
                                     "decoder", LlamaForCausalLM),
    "bert-absolute-positions": (lambda: bert(position_embedding_type="absolute"), "encoder", BertForMaskedLM),
    "marian-unread-fields": (lambda: marian(normalize_before=True, layernorm_embedding=True), "seq2seq",
                             MarianMTModel),
    # Other names of functions we have: they were refused
    "llama-swish": (lambda: llama(hidden_act="swish"), "decoder", LlamaForCausalLM),
    "gpt2-gelu-accurate": (lambda: gpt2(activation_function="gelu_accurate"), "decoder", GPT2LMHeadModel),
}


@pytest.mark.parametrize("name", IMPORTS)
def test_import_computes_the_same_and_converts_back(name):
    make_native, family, back_class = IMPORTS[name]
    native = perturbed(make_native())
    ours = from_hf(native)
    _assert_same_logits(native, ours, family)
    if family != "encoder":
        _assert_same_generation(native, ours, family)
    if back_class is None:  # Qwen2's window with its q/k/v biases: no export target, said so
        with pytest.raises(ValueError, match="sliding_window=4` with `use_bias=True"):
            to_hf(ours)
        return
    back = to_hf(ours)
    assert type(back) is back_class
    if back_class is type(native) and back.state_dict().keys() == native.state_dict().keys():
        _assert_same_state_dict(back, native)
    else:  # the zero biases ours added are there now, or another class
        _assert_same_logits(native, back, family)


@pytest.mark.parametrize("make_native", [llama, _mistral], ids=["llama", "mistral"])
def test_early_exit_self_speculation_matches_the_native_model(make_native):
    """`generate(assistant_early_exit=1)`: Llama's stack runs `config.num_hidden_layers` layers, which the drafting
    lowers; ours failed with IndexError from the cache. Sampled, so the scores and the random draws must match too."""
    native = perturbed(make_native())
    ours = from_hf(native)
    ids = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    outputs = []
    for model in (native, ours):
        torch.manual_seed(0)
        outputs.append(model.generate(ids, max_new_tokens=8, do_sample=True, top_k=10, assistant_early_exit=1,
                                      return_dict_in_generate=True, output_scores=True))
    assert torch.equal(outputs[1].sequences, outputs[0].sequences)
    torch.testing.assert_close(torch.stack(outputs[1].scores), torch.stack(outputs[0].scores), atol=ATOL, rtol=0)


@pytest.mark.parametrize("rope", [
    dict(rope_type="linear", factor=2.0),
    dict(rope_type="dynamic", factor=2.0),
    dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=16),
    dict(rope_type="longrope", short_factor=[1.0] * 4, long_factor=[2.0, 3.0, 4.0, 5.0],
         original_max_position_embeddings=16),
    dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
         original_max_position_embeddings=16),
    dict(rope_type="proportional", partial_rotary_factor=0.5),
], ids=lambda rope: rope["rope_type"])
def test_llama_rope_scaling_types_convert(rope):
    """Past the original context (16) and, for `dynamic`, past `max_position_embeddings` (32)."""
    native = perturbed(llama(max_position_embeddings=32, rope_parameters={"rope_theta": 1000.0, **rope}))
    ours = from_hf(native)
    assert ours.config.rope_parameters == native.config.rope_parameters
    ids = torch.randint(3, VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, native(ids).logits, atol=ATOL, rtol=0)
    assert torch.equal(ours.generate(ids[:, :12], max_new_tokens=24, min_new_tokens=24, do_sample=False),
                       native.generate(ids[:, :12], max_new_tokens=24, min_new_tokens=24, do_sample=False))


def test_llama_gradients_match():
    """Training a converted Llama computes the native model's gradients: through the rotary pass over the fused queries
    and keys, grouped-query attention, the fp32 RMSNorm op and the fused gate | up (each compared as its parts)."""
    native = perturbed(llama()).train()
    ours = from_hf(native).train()
    ids = torch.randint(3, VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    embeds = {}
    for name, model in (("native", native), ("ours", ours)):
        embeds[name] = model.get_input_embeddings()(ids).detach().requires_grad_()
        model(inputs_embeds=embeds[name], labels=ids).loss.backward()
    torch.testing.assert_close(embeds["ours"].grad, embeds["native"].grad, atol=1e-5, rtol=1e-4)
    ours_layer, native_layer = ours.model.layers[1], native.model.layers[1]
    native_attention, native_mlp = native_layer.self_attn, native_layer.mlp
    expected = {
        "self_attn.qkv_proj": torch.cat([native_attention.q_proj.weight.grad, native_attention.k_proj.weight.grad,
                                         native_attention.v_proj.weight.grad]),
        "self_attn.o_proj": native_attention.o_proj.weight.grad,
        "mlp.up_proj": torch.cat([native_mlp.gate_proj.weight.grad, native_mlp.up_proj.weight.grad]),
        "mlp.down_proj": native_mlp.down_proj.weight.grad,
        "attn_norm": native_layer.input_layernorm.weight.grad,
        "mlp_norm": native_layer.post_attention_layernorm.weight.grad,
    }
    for name, gradient in expected.items():
        torch.testing.assert_close(ours_layer.get_submodule(name).weight.grad, gradient, atol=1e-5, rtol=1e-4,
                                   msg=lambda message, name=name: f"{name}: {message}")


@pytest.mark.parametrize("cast", ["from_pretrained", "to"])
def test_rotary_frequencies_keep_the_precision_of_the_source(cast, tmp_path):
    """`from_pretrained(dtype=torch.bfloat16)` keeps Llama's rotary frequencies in float32, `.to(torch.bfloat16)`
    casts them: both ways, the converted model computes its angles as the source does. bf16 frequencies at position
    2000 are off by radians (wide weights make attention depend on positions)."""
    native = llama(initializer_range=0.5)
    if cast == "from_pretrained":
        native.save_pretrained(tmp_path)
        native = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    else:
        native = native.to(torch.bfloat16)
    ours = from_hf(native)
    back = to_hf(ours)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(8)[None] + 2000
    with torch.no_grad():
        expected = native(ids, position_ids=positions).logits
        for model in (ours, back):
            assert model.model.rotary_emb.inv_freq.dtype == native.model.rotary_emb.inv_freq.dtype
            torch.testing.assert_close(model(ids, position_ids=positions).logits, expected, atol=0.05, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_marian_converts(dtype, tmp_path):
    """A Marian loaded in half precision holds its sinusoid tables rounded to that dtype: they are still the tables
    Scratch computes (they were refused as "not the sinusoid table")."""
    perturbed(marian()).save_pretrained(tmp_path)
    native = MarianMTModel.from_pretrained(tmp_path, dtype=dtype).eval()
    ours = from_hf(native)
    assert ours.dtype == dtype
    inputs = _inputs("seq2seq")
    with torch.no_grad():
        expected = native(**inputs).logits.float()
        torch.testing.assert_close(ours(**inputs).logits.float(), expected, atol=0.05, rtol=0)
        torch.testing.assert_close(to_hf(ours)(**inputs).logits.float(), expected, atol=ATOL, rtol=0)


def test_an_offloaded_bert_with_one_token_type_is_refused_naming_the_weight(tmp_path):
    """Whether BERT's one token-type row is all zero was read before the weights were checked: on the meta device
    (offloaded) that failed with "Tensor.item() cannot be called on meta tensors"."""
    bert(type_vocab_size=1).save_pretrained(tmp_path / "bert")
    offloaded = BertForMaskedLM.from_pretrained(tmp_path / "bert", device_map="auto", max_memory={"cpu": 1000},
                                                offload_folder=tmp_path / "offload")
    assert offloaded.bert.embeddings.token_type_embeddings.weight.is_meta
    with pytest.raises(ValueError, match=r"is not in memory \(on the meta device"):
        from_hf(offloaded)


def test_marian_sharing_without_a_tied_head_imports_as_separate_matrices():
    """transformers 5 shares Marian's embeddings only together with the head: `share_encoder_decoder_embeddings`
    without `tie_word_embeddings` is separate encoder, decoder and output matrices, and so is the conversion."""
    native = perturbed(marian(tie_word_embeddings=False))
    ours = from_hf(native)
    assert not ours.config.share_embeddings and not ours.config.tie_word_embeddings
    _assert_same_logits(native, ours, "seq2seq")
    _assert_same_generation(native, ours, "seq2seq")


def test_a_marian_whose_decoder_cannot_read_its_own_predictions_is_refused_naming_both_sizes():
    """Shared embeddings without a tied head size Marian's decoder embedding by `decoder_vocab_size` and its head by
    `vocab_size`: this one predicts ids its decoder cannot embed. It was refused over a weight's converted shape."""
    native = marian(tie_word_embeddings=False, decoder_vocab_size=VOCAB // 2, pad_token_id=1, decoder_start_token_id=1)
    with pytest.raises(ValueError, match=f"decoder_vocab_size={VOCAB // 2} with vocab_size={VOCAB}"):
        from_hf(native)


def _unknown_rope_type():
    native = llama()
    native.config.rope_parameters = {"rope_type": "mrope", "rope_theta": 10000.0}
    return native


@pytest.mark.parametrize("make_native, fragments", [
    (_unknown_rope_type, ["rope_type='mrope'", "supported: default, linear"]),
    (lambda: llama(head_dim=16), ["head_dim=16"]),
    (lambda: llama(hidden_act="gelu", head_dim=16), ["hidden_act='gelu'", "head_dim=16"]),  # both, in one error
    (lambda: _qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=1), ["some layers only"]),
], ids=["rope-type", "head-dim", "two-at-once", "qwen2-some-layers-sliding"])
def test_llama_family_options_without_equivalent_are_refused(make_native, fragments):
    with pytest.raises(ValueError) as error:
        from_hf(make_native())
    for fragment in fragments:
        assert fragment in str(error.value)


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("family, overrides, fragments", [
    ("decoder", dict(position_embedding_type="alibi"), ["position_embedding_type='alibi'` (needs 'learned')",
                                                         "position_embedding_type='alibi'` (needs 'rope')"]),
    ("decoder", dict(position_embedding_type="sinusoidal"), ["position_embedding_type='sinusoidal'"]),
    ("decoder", {**GPT2_KNOBS, "norm_position": "post"}, ["norm_position='post'` (needs 'pre')"]),
    ("decoder", {**GPT2_KNOBS, "final_norm": False}, ["final_norm=False"]),
    ("decoder", {**GPT2_KNOBS, "use_bias": False}, ["use_bias=False` (needs True)"]),
    ("decoder", {**GPT2_KNOBS, "scale_embeddings": True}, ["scale_embeddings=True"]),
    ("decoder", {**GPT2_KNOBS, "embedding_norm": True}, ["embedding_norm=True"]),
    ("decoder", {**GPT2_KNOBS, "num_key_value_heads": 2}, ["num_key_value_heads=2", "no grouped-query"]),
    ("decoder", {**GPT2_KNOBS, "sliding_window": 4}, ["sliding_window=4` (needs None)"]),
    ("decoder", {**LLAMA_KNOBS, "hidden_act": "geglu"}, ["hidden_act='geglu'` (needs 'swiglu')",
                                                         "has no gated feed-forward"]),
    ("decoder", {**LLAMA_KNOBS, "norm_type": "layernorm"}, ["norm_type='layernorm'` (needs 'rmsnorm')"]),
    ("decoder", {**LLAMA_KNOBS, "sliding_window": 4, "use_bias": True}, ["sliding_window=4` with `use_bias=True"]),
    ("encoder", {**BERT_KNOBS, "norm_position": "pre"}, ["norm_position='pre'` (needs 'post')"]),
    ("encoder", {**BERT_KNOBS, "mlm_transform": False}, ["mlm_transform=False"]),
    ("encoder", {**BERT_KNOBS, "embedding_norm": False}, ["embedding_norm=False"]),
    ("encoder", {**BERT_KNOBS, "hidden_act": "geglu"}, ["hidden_act='geglu'"]),
    ("encoder", {**BERT_KNOBS, "position_embedding_type": "sinusoidal"}, ["position_embedding_type='sinusoidal'"]),
    ("seq2seq", {**MARIAN_KNOBS, "sinusoidal_layout": "interleaved"}, ["sinusoidal_layout='interleaved'"]),
    ("seq2seq", {**MARIAN_KNOBS, "layer_norm_eps": 1e-6}, ["layer_norm_eps=1e-06` (needs 1e-05)"]),
    ("seq2seq", {**MARIAN_KNOBS, "norm_position": "pre", "final_norm": True}, ["norm_position='pre'",
                                                                                "final_norm=True"]),
    ("seq2seq", {**MARIAN_KNOBS, "num_key_value_heads": 1}, ["num_key_value_heads=1"]),
    ("seq2seq", {**MARIAN_KNOBS, "decoder_start_token_id": None}, ["decoder_start_token_id=None"]),
    ("seq2seq", {**MARIAN_KNOBS, "tie_word_embeddings": False},
     ["`share_embeddings=True` with `tie_word_embeddings=False`"]),
], ids=str)
def test_knobs_without_native_equivalent_are_named(family, overrides, fragments):
    model = tiny_lm(family, **overrides)
    with pytest.raises(ValueError, match="Cannot export") as error:
        to_hf(model)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_all_blockers_are_named_in_one_error():
    model = tiny_lm("decoder", position_embedding_type="alibi", norm_position="post", hidden_act="geglu")
    with pytest.raises(ValueError) as error:
        to_hf(model)
    message = str(error.value)
    for fragment in ("as GPT2LMHeadModel:", "as LlamaForCausalLM / MistralForCausalLM:", "alibi",
                     "norm_position='post'", "hidden_act='geglu'", "norm_type='layernorm'"):
        assert fragment in message


def test_only_language_model_heads_export():
    with pytest.raises(ValueError, match="Cannot export a ScratchDecoderModel; supported: ScratchDecoderForCausalLM"):
        to_hf(hst.ScratchDecoderModel(tiny_lm("decoder", **GPT2_KNOBS).config))


# ---------------------------------------------------------------------------------------------- saved folders

# Loads each exported folder with the plain Auto classes, in a process where hf_scratch_transformer cannot be
# imported (as on a serving machine), and checks its class, its logits and its generation config.
LOAD_WITHOUT_PACKAGE = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_scratch_transformer":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, NotInstalled())
import torch, transformers
for job in torch.load(sys.argv[1]):
    model = getattr(transformers, job["auto_class"]).from_pretrained(job["folder"]).eval()
    assert type(model).__name__ == job["class"] and type(model).__module__.startswith("transformers.models.")
    assert getattr(model.config, "auto_map", None) is None
    with torch.no_grad():
        torch.testing.assert_close(model(**job["inputs"]).logits, job["logits"], atol=1e-4, rtol=0)
    if job["generates"]:
        assert model.generation_config.max_new_tokens == 7, model.generation_config
print("loaded", len(torch.load(sys.argv[1])))
"""
AUTO_CLASSES = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM",
                "seq2seq": "AutoModelForSeq2SeqLM"}


def test_exported_folders_load_with_plain_auto_classes_without_the_package(tmp_path):
    jobs = []
    for name in ("gpt2", "llama-gqa-untied", "mistral-window", "bert-no-token-types-untied", "marian-shared"):
        family = EXPORTS[name][0]
        ours = _ours(name)
        if family != "encoder":
            ours.generation_config.max_new_tokens = 7  # must reach the saved generation_config.json
        native = to_hf(ours)
        native.save_pretrained(tmp_path / name)
        inputs = _inputs(family)
        with torch.no_grad():
            logits = ours(**inputs).logits
        jobs.append({"folder": str(tmp_path / name), "auto_class": AUTO_CLASSES[family],
                     "class": type(native).__name__, "inputs": inputs, "logits": logits,
                     "generates": family != "encoder"})
    torch.save(jobs, tmp_path / "jobs.pt")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_PACKAGE, str(tmp_path / "jobs.pt")], cwd=tmp_path,
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded {len(jobs)}" in result.stdout
