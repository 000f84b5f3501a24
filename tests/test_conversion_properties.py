"""Properties of `to_hf` / `from_hf` and `hf-scratch convert` over drawn configurations (the fixed configurations are in
`test_export_native.py` and `test_convert_script.py`).

- Every model whose knobs docs/native_models.md ("Export (`to_hf`)") lists as exporting becomes the native class it
  names, with our logits (1e-4 in fp32), a `save_pretrained` folder that reloads with the Auto classes to the same
  weights (and logits), and a `from_hf` back to the exact state dict and config (less the training-only knobs the
  docs say are dropped), in fp32, bf16 and fp16: sizes with odd vocabularies and head sizes, `intermediate_size` not
  a multiple of the width, GQA, tied and untied heads, token types, every RoPE scaling type, sliding windows, one or
  two Marian vocabularies, output biases, special ids (none, or several eos ids).
- Any other combination of the architecture knobs is refused with a `ValueError` that names, per candidate class,
  exactly the knobs the table rules out (checked against the table written out here, not conversion.py's own).
- The command converts drawn Scratch folders to native folders and back to the same weights, in their dtype.
"""

import contextlib
import io
import runpy
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_native import ATOL

import hf_scratch_transformer as hst
from hf_scratch_transformer.conversion import from_hf, to_hf

ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu"]  # the non-gated ones: GPT-2, BERT and Marian have them all
ROPE_TYPES = ["default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"]
CONFIGS = {"decoder": hst.ScratchDecoderConfig, "encoder": hst.ScratchEncoderConfig,
           "seq2seq": hst.ScratchSeq2SeqConfig}
MODELS = {"decoder": hst.ScratchDecoderForCausalLM, "encoder": hst.ScratchEncoderForMaskedLM,
          "seq2seq": hst.ScratchSeq2SeqForConditionalGeneration}
AUTO_CLASSES = {"decoder": transformers.AutoModelForCausalLM, "encoder": transformers.AutoModelForMaskedLM,
                "seq2seq": transformers.AutoModelForSeq2SeqLM}


# ---------------------------------------------------------------------------------------------- drawn models


def _special_ids(draw, vocab: int) -> dict:
    ids = {name: draw(st.none() | st.integers(0, vocab - 1)) for name in ("pad_token_id", "bos_token_id")}
    ids["eos_token_id"] = draw(st.none() | st.integers(0, vocab - 1)
                               | st.lists(st.integers(0, vocab - 1), min_size=1, max_size=2, unique=True))
    return ids


def _rope_parameters(draw, head_dim: int, max_positions: int) -> dict:
    # transformers' dynamic NTK divides by head_dim - 2 (a native Llama fails alike)
    rope_type = draw(st.sampled_from([kind for kind in ROPE_TYPES if head_dim > 2 or kind != "dynamic"]))
    rope = {"rope_type": rope_type, "rope_theta": draw(st.sampled_from([10000.0, 500.0]))}
    original = draw(st.integers(4, max_positions))  # the inputs run past it (and past max_positions)
    if rope_type in ("linear", "dynamic"):
        rope["factor"] = draw(st.sampled_from([1.5, 4.0]))
    elif rope_type == "yarn":
        rope |= dict(factor=draw(st.sampled_from([2.0, 4.0])), original_max_position_embeddings=original)
    elif rope_type == "longrope":
        rope |= dict(short_factor=[1.0] * (head_dim // 2), long_factor=[2.0 + i for i in range(head_dim // 2)],
                     original_max_position_embeddings=original)
    elif rope_type == "llama3":
        rope |= dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=original)
    elif rope_type == "proportional":
        rope["partial_rotary_factor"] = draw(st.sampled_from([0.5, 1.0]))
    return rope


@st.composite
def exportable(draw):
    """(family, the native class `to_hf` must give, our config's values): knobs of the docs' export table, the rest
    drawn."""
    target = draw(st.sampled_from(["GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "BertForMaskedLM",
                                   "MarianMTModel"]))
    rope = target in ("LlamaForCausalLM", "MistralForCausalLM")
    heads = draw(st.sampled_from([1, 2, 3, 4]))
    head_dim = draw(st.sampled_from([2, 4, 6] if rope else [1, 2, 3, 5]))
    if target == "MarianMTModel" and heads * head_dim % 2:  # sinusoids need an even width
        head_dim *= 2
    vocab, max_positions = draw(st.integers(1, 130)), draw(st.integers(8, 40))
    values = dict(
        vocab_size=vocab, hidden_size=heads * head_dim, num_attention_heads=heads,
        intermediate_size=draw(st.integers(1, 50)), max_position_embeddings=max_positions,
        tie_word_embeddings=draw(st.booleans()), initializer_range=draw(st.sampled_from([0.02, 0.1])),
        dropout=draw(st.sampled_from([0.0, 0.1])), attention_dropout=draw(st.sampled_from([0.0, 0.1])),
        activation_dropout=draw(st.sampled_from([None, 0.0, 0.2])), embedding_dropout=draw(st.sampled_from([0.0, 0.1])),
        init_scheme=draw(st.sampled_from(["normal", "xavier"])), use_cache=draw(st.booleans()),
    )
    layers = draw(st.integers(1, 3))
    if target != "MarianMTModel":
        values |= dict(num_hidden_layers=layers, layer_norm_eps=draw(st.sampled_from([1e-5, 1e-6, 1e-12])),
                       **_special_ids(draw, vocab))
    if target == "GPT2LMHeadModel":
        return "decoder", target, values | dict(position_embedding_type="learned",
                                                hidden_act=draw(st.sampled_from(ACTIVATIONS)))
    if rope:
        values |= dict(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu",
                       num_key_value_heads=draw(st.sampled_from([k for k in (1, 2, 3, 4) if heads % k == 0])),
                       rope_parameters=_rope_parameters(draw, head_dim, max_positions))
        if target == "MistralForCausalLM":
            return "decoder", target, values | dict(sliding_window=draw(st.integers(1, 10)), use_bias=False)
        return "decoder", target, values | dict(use_bias=draw(st.booleans()))
    if target == "BertForMaskedLM":
        return "encoder", target, values | dict(
            position_embedding_type="learned", norm_position="post", final_norm=False, embedding_norm=True,
            mlm_transform=True, type_vocab_size=draw(st.integers(0, 3)), hidden_act=draw(st.sampled_from(ACTIVATIONS)),
            classifier_dropout=draw(st.sampled_from([None, 0.3])), sparse_prediction=draw(st.booleans()))
    share = values["tie_word_embeddings"] and draw(st.booleans())
    encoder_vocab = None if share else draw(st.none() | st.integers(1, 130))
    ids = _special_ids(draw, min(vocab, encoder_vocab or vocab))  # pad is a token of both vocabularies
    return "seq2seq", target, values | ids | dict(
        encoder_layers=layers, decoder_layers=draw(st.integers(1, 3)), position_embedding_type="sinusoidal",
        sinusoidal_layout="split", norm_position="post", final_norm=False, layer_norm_eps=1e-5,
        hidden_act=draw(st.sampled_from(ACTIVATIONS)), scale_embeddings=draw(st.booleans()), share_embeddings=share,
        encoder_vocab_size=encoder_vocab, output_bias=draw(st.booleans()),
        decoder_start_token_id=draw(st.integers(0, vocab - 1)))


def _model(family: str, values: dict, dtype=torch.float32):
    """Seeded, with weights moved off their init (biases and norms not 0 and 1), in eval mode."""
    torch.manual_seed(0)
    model = MODELS[family](CONFIGS[family](**values)).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model.to(dtype)


def _inputs(family: str, config) -> dict:
    """A padded batch; RoPE models run past `max_position_embeddings` (and so past any original context)."""
    generator = torch.Generator().manual_seed(2)
    length = config.max_position_embeddings + 5 if config.position_embedding_type == "rope" else 8
    ids = torch.randint(0, getattr(config, "source_vocab_size", config.vocab_size), (2, length), generator=generator)
    mask = torch.ones_like(ids)
    if family == "decoder":
        mask[1, :3] = 0
    else:
        mask[1, -3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family == "encoder" and config.type_vocab_size:
        inputs["token_type_ids"] = torch.randint(0, config.type_vocab_size, ids.shape, generator=generator)
    if family == "seq2seq":
        inputs["decoder_input_ids"] = torch.randint(0, config.vocab_size, (2, 5), generator=generator)
    return inputs


def _logits(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits.float()


def _config_after_round_trip(config, native_class: str) -> dict:
    """Our config as `from_hf(to_hf(...))` gives it back: the training-only knobs that docs/native_models.md says
    are dropped take the native side's values; two equal Marian vocabularies are one size (the same model)."""
    expected = config.to_dict() | {"init_scheme": "normal"}
    expected["activation_dropout"] = config.activation_dropout_rate if native_class == "MarianMTModel" else 0.0
    if native_class in ("LlamaForCausalLM", "MistralForCausalLM"):
        expected |= {"dropout": 0.0, "embedding_dropout": 0.0}
    if native_class == "BertForMaskedLM":
        expected |= {"embedding_dropout": config.dropout, "sparse_prediction": False}
    if native_class == "MarianMTModel":
        expected["embedding_dropout"] = config.dropout
        if config.encoder_vocab_size == config.vocab_size:
            expected["encoder_vocab_size"] = None
    return expected


def _assert_same_state_dict(model, expected) -> None:
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for key, tensor in expected.items():
        assert state[key].dtype == tensor.dtype and torch.equal(state[key], tensor), key


@settings(max_examples=40, deadline=None)
@given(case=exportable(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_exportable_models_convert_exactly_both_ways(case, dtype):
    """In half precision the weights must convert exactly, and the logits are compared with both models cast to fp32:
    computed in half precision, fused and separate projections round differently."""
    family, native_class, values = case
    ours = _model(family, values, dtype)
    native = to_hf(ours)
    assert type(native).__name__ == native_class and native.dtype == dtype and not native.training
    back = from_hf(native)
    _assert_same_state_dict(back, ours.state_dict())
    assert back.config.to_dict() == _config_after_round_trip(ours.config, native_class)
    with tempfile.TemporaryDirectory() as folder:
        native.save_pretrained(folder)
        reloaded = AUTO_CLASSES[family].from_pretrained(folder).eval()
    assert type(reloaded) is type(native)
    _assert_same_state_dict(reloaded, native.state_dict())
    inputs = _inputs(family, ours.config)
    logits = _logits(ours.float(), inputs)
    torch.testing.assert_close(_logits(native.float(), inputs), logits, atol=ATOL, rtol=0)
    if dtype == torch.float32:  # in half precision a reloaded Llama computes its rotary frequencies in fp32
        torch.testing.assert_close(_logits(reloaded, inputs), logits, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------- refusals


def _table_blockers(family: str, config) -> dict[str, list[str]]:
    """Per candidate class of `to_hf`'s error, the knobs that the docs' table rules out for it (none: it exports)."""
    def off(**needed):
        return [knob for knob, value in needed.items() if getattr(config, knob) != value]

    non_gated = [] if config.hidden_act in ACTIVATIONS else ["hidden_act"]
    multi_head = [] if config.num_key_value_heads == config.num_attention_heads else ["num_key_value_heads"]
    if family == "decoder":
        llama = off(position_embedding_type="rope", norm_type="rmsnorm", norm_position="pre", final_norm=True,
                    embedding_norm=False, scale_embeddings=False, hidden_act="swiglu")
        if config.sliding_window is not None and config.use_bias:  # Mistral has no biases
            llama += ["sliding_window", "use_bias"]
        gpt2 = off(position_embedding_type="learned", norm_type="layernorm", norm_position="pre", final_norm=True,
                   embedding_norm=False, scale_embeddings=False, use_bias=True, sliding_window=None)
        return {"GPT2LMHeadModel": gpt2 + non_gated + multi_head, "LlamaForCausalLM / MistralForCausalLM": llama}
    if family == "encoder":
        return {"BertForMaskedLM": off(position_embedding_type="learned", norm_type="layernorm", norm_position="post",
                                       final_norm=False, embedding_norm=True, mlm_transform=True,
                                       scale_embeddings=False, use_bias=True) + non_gated + multi_head}
    marian = off(position_embedding_type="sinusoidal", sinusoidal_layout="split", norm_type="layernorm",
                 norm_position="post", layer_norm_eps=1e-5, final_norm=False, embedding_norm=False, use_bias=True)
    marian += non_gated + multi_head
    if config.decoder_start_token_id is None:
        marian.append("decoder_start_token_id")
    if config.share_embeddings and not config.tie_word_embeddings:
        marian += ["share_embeddings", "tie_word_embeddings"]
    return {"MarianMTModel": marian}


@st.composite
def any_knobs(draw):
    family = draw(st.sampled_from(list(MODELS)))
    values = dict(
        position_embedding_type=draw(st.sampled_from(["learned", "sinusoidal", "rope", "alibi"])),
        sinusoidal_layout=draw(st.sampled_from(["interleaved", "split"])),
        norm_type=draw(st.sampled_from(["layernorm", "rmsnorm"])), norm_position=draw(st.sampled_from(["pre", "post"])),
        final_norm=draw(st.booleans()), embedding_norm=draw(st.booleans()), scale_embeddings=draw(st.booleans()),
        use_bias=draw(st.booleans()), hidden_act=draw(st.sampled_from([*ACTIVATIONS, "swiglu", "geglu"])),
        num_key_value_heads=draw(st.sampled_from([1, 2, 4])), layer_norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
        tie_word_embeddings=draw(st.booleans()),
    )
    if family == "decoder":
        values["sliding_window"] = draw(st.none() | st.integers(1, 6))
    if family == "encoder":
        values |= dict(mlm_transform=draw(st.booleans()), type_vocab_size=draw(st.integers(0, 2)))
    if family == "seq2seq":
        values |= dict(share_embeddings=draw(st.booleans()), decoder_start_token_id=draw(st.none() | st.just(1)),
                       output_bias=draw(st.booleans()), encoder_layers=1, decoder_layers=1)
    else:
        values["num_hidden_layers"] = 1
    return family, values | dict(vocab_size=23, hidden_size=16, num_attention_heads=4, intermediate_size=19,
                                 max_position_embeddings=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@settings(max_examples=60, deadline=None)
@given(case=any_knobs())
def test_a_model_exports_exactly_when_the_table_says_else_every_knob_in_the_way_is_named(case):
    family, values = case
    ours = _model(family, values)
    blockers = _table_blockers(family, ours.config)
    if any(not knobs for knobs in blockers.values()):
        inputs = _inputs(family, ours.config)
        torch.testing.assert_close(_logits(to_hf(ours), inputs), _logits(ours, inputs), atol=ATOL, rtol=0)
        return
    with pytest.raises(ValueError, match="Cannot export") as error:
        to_hf(ours)
    lines = str(error.value).splitlines()
    for native_class, knobs in blockers.items():
        line = next(line for line in lines if line.startswith(f"  as {native_class}: "))
        named = {quoted.split("=")[0] for quoted in line.split("`")[1::2] if "=" in quoted}
        assert named == set(knobs), line


# ---------------------------------------------------------------------------------------------- the command


def _convert(*args) -> str:
    """`hf-scratch convert ARGS` in this process (as `test_convert_script.convert_here`); its output."""
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(output):
        patch.setattr(sys, "argv", ["hf-scratch convert", *map(str, args)])
        runpy.run_module("hf_scratch_transformer.cli.convert", run_name="__main__")
    return output.getvalue()


@settings(max_examples=6, deadline=None)
@given(case=exportable(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_the_command_exports_drawn_folders_and_converts_them_back(case, dtype):
    """Each folder in its dtype; the logits compared loaded in fp32 (Marian's sinusoids, a parameter there, are
    rounded to a half-precision dtype, ours are kept in fp32)."""
    family, native_class, values = case
    auto_class = AUTO_CLASSES[family]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        _model(family, values, dtype).save_pretrained(folder / "scratch")
        assert "parity check passed" in _convert(folder / "scratch", folder / "native")
        assert "parity check passed" in _convert(folder / "native", folder / "back")
        ours, native, back = (auto_class.from_pretrained(folder / name) for name in ("scratch", "native", "back"))
        assert type(native).__name__ == native_class and native.dtype == back.dtype == dtype
        _assert_same_state_dict(back, ours.state_dict())
        ours, native = (auto_class.from_pretrained(folder / name, dtype=torch.float32).eval()
                        for name in ("scratch", "native"))
    inputs = _inputs(family, ours.config)
    torch.testing.assert_close(_logits(native, inputs), _logits(ours, inputs), atol=ATOL, rtol=0)
