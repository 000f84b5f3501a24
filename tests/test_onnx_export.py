"""ONNX as transformers exports native models (`transformers.exporters`' `OnnxExporter`: `torch.onnx.export(...,
dynamo=True)` with transformers' patches), run in ONNX Runtime at other shapes than the traced ones and compared with
GPT-2, BERT and Marian carrying the same weights (`from_hf`): the forward of each family with a dynamic batch and
length, and the decoder with its cache as the graph's inputs and outputs, decoding step by step; and the forward through
the TorchScript exporter (`dynamo=False`, deprecated)."""

import io

import pytest
import torch
from test_export import _forward_inputs, _ids
from tiny_native import ATOL, bert, gpt2, llama, marian
from transformers import DynamicCache, GenerationConfig
from transformers.exporters import OnnxConfig, OnnxExporter
from transformers.exporters.utils import decompose_for_generation

from hf_scratch_transformer import kernel_choice
from hf_scratch_transformer.conversion import from_hf
from hf_scratch_transformer.scratch_attention import CACHE_FIELD

onnx, onnxscript, onnxruntime = (
    pytest.importorskip(package, reason="ONNX export needs onnx, onnxscript and onnxruntime (the test extras)")
    for package in ("onnx", "onnxscript", "onnxruntime")
)

pytestmark = pytest.mark.filterwarnings("ignore")  # the exporter's "experimental" and torch's tracing warnings


def _standard_ops(program) -> set[str]:
    """The graph's ops, which must all be ONNX's own (no kernel of ours, no ONNX Runtime contrib op)."""
    nodes = list(program.graph.all_nodes())
    assert {node.domain for node in nodes} <= {"", "ai.onnx"}
    return {node.op_type for node in nodes}


@pytest.mark.parametrize("family, make_native", [("gpt2", gpt2), ("bert", bert), ("marian", marian)],
                         ids=["gpt2", "bert", "marian"])
def test_forward_exports_to_onnx_with_a_dynamic_batch_and_length_as_the_native_model(family, make_native):
    """The graph's products are ONNX `MatMul`s (the eager CPU kernel choice stays out of it); in ONNX Runtime its
    logits at the traced shape and at others are the native model's, padded positions included."""
    native = make_native()
    ours = from_hf(native)
    exported = OnnxExporter().export(ours, _forward_inputs(family, 2, 7), OnnxConfig(dynamic=True))
    assert "MatMul" in _standard_ops(exported.program)
    for batch, length in ((2, 7), (3, 11), (1, 5)):
        inputs = _forward_inputs(family, batch, length)
        with torch.no_grad():
            expected = native(**inputs).logits
            torch.testing.assert_close(ours(**inputs).logits, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(exported(**inputs).logits, expected, atol=ATOL, rtol=0)


def _empty_cache(model, batch):
    """A cache holding no position yet, as tensors: the graph takes the past keys and values as inputs, and a
    `DynamicCache` makes its layers' tensors only at their first update."""
    config = model.config
    head_size = config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        empty = torch.zeros(batch, config.num_key_value_heads, 0, head_size)
        cache.update(empty, empty, layer)
    return cache


def test_decoder_exports_with_its_cache_as_inputs_and_outputs_and_decodes_as_the_native_model():
    """`generate()`'s multi-token decode step (`decompose_for_generation`), exported with a dynamic batch, length and
    cache length: in ONNX Runtime, a prefill over an empty cache, then one greedy token a step over the cache the
    graph gave back, at another batch and prompt length than traced (left padding), gives at every step the logits
    GPT-2 computes over the whole sequence."""
    native = gpt2()
    ours = from_hf(native)
    ids = _ids(2, 7)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    config = GenerationConfig(do_sample=False, pad_token_id=0, eos_token_id=2)
    _, decode_inputs = decompose_for_generation(ours, {"input_ids": ids, "attention_mask": mask},
                                                generation_config=config, multi_token_decode=True)["decode"]
    # The cache goes by the running version's name (`cache` from transformers 5.24, `past_key_values` before): in the
    # step's inputs, the graph's input names and its outputs.
    assert decode_inputs[CACHE_FIELD].get_seq_length() > 0 and decode_inputs["input_ids"].shape[1] > 1
    exported = OnnxExporter().export(ours, decode_inputs, OnnxConfig(dynamic=True))
    assert "MatMul" in _standard_ops(exported.program)
    assert f"input.{CACHE_FIELD}.layers.1.keys" in [value.name for value in exported.program.graph.inputs]

    prompt = _ids(3, 9, seed=5)
    mask = torch.ones_like(prompt)
    mask[2, :3] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens, cache, logits = prompt, _empty_cache(ours, 3), []
    for _ in range(8):
        new = tokens[:, cache.get_seq_length():]
        out = exported(input_ids=new, attention_mask=mask, position_ids=positions[:, -new.shape[1]:],
                       **{CACHE_FIELD: cache})
        cache = getattr(out, CACHE_FIELD)
        logits.append(out.logits[:, -1])
        tokens = torch.cat([tokens, logits[-1].argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
    assert cache.get_seq_length() == 9 + 7
    with torch.no_grad():
        expected = native(tokens[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1]).logits[:, 8:]
    torch.testing.assert_close(torch.stack(logits, dim=1), expected, atol=ATOL, rtol=0)


class _Logits(torch.nn.Module):
    """The model's logits from its inputs given in order: the TorchScript exporter traces positional tensors."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs, strict=True))).logits


@pytest.mark.parametrize("kernels, sample_length", [("onednn", 7), ("auto", 40)], ids=["onednn", "auto-prefill"])
@pytest.mark.parametrize("family, make_native", [("gpt2", gpt2), ("gpt2", llama), ("bert", bert), ("marian", marian)],
                         ids=["gpt2", "llama", "bert", "marian"])
def test_the_torchscript_exporter_traces_an_unpadded_sample_into_a_graph_that_takes_the_mask(family, make_native,
                                                                                            kernels, sample_length,
                                                                                            force_choice):
    """`torch.onnx.export(..., dynamo=False)` traces shapes as tensors: `is_causal` was one, which sdpa refused
    (TypeError: "must be bool, not Tensor", the decoder without padding and the seq2seq decoder); an unpadded
    sample's "every key visible" became the graph's answer, which then left out `attention_mask` (the decoder's
    logits were wrong wherever padding was); the oneDNN product went into the graph ("unsupported input list type:
    Scalar?"); in a process that had made no kernel choice, the first prefill product's timing ran inside the trace
    and failed ("unexpected sym_eq between Tensor and Tensor"); RMSNorm went in as `aten::rms_norm`, which the
    exporter has no ONNX op for (UnsupportedOperatorError, where Llama's written-out norm exports). The native models
    export: so do ours, with logits equal at padded inputs of other shapes."""
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, kernels)
    native = make_native()
    ours = from_hf(native)
    sample = _forward_inputs(family, 2, sample_length)  # 80 rows: prefill's products
    sample["attention_mask"] = torch.ones_like(sample["attention_mask"])
    names = list(sample)
    axes = {name: {0: "batch", 1: "target" if name == "decoder_input_ids" else "length"} for name in names}
    axes["logits"] = {0: "batch", 1: "target" if family == "marian" else "length"}
    graph = io.BytesIO()
    torch.onnx.export(_Logits(ours, names).eval(), tuple(sample.values()), graph, dynamo=False, input_names=names,
                      output_names=["logits"], dynamic_axes=axes)
    assert {node.domain for node in onnx.load_from_string(graph.getvalue()).graph.node} <= {""}
    session = onnxruntime.InferenceSession(graph.getvalue(), providers=["CPUExecutionProvider"])
    assert [value.name for value in session.get_inputs()] == names
    for batch, length in ((2, 7), (3, 11)):
        inputs = _forward_inputs(family, batch, length)
        with torch.no_grad():
            expected = native(**inputs).logits
        logits = torch.from_numpy(session.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})[0])
        if family == "gpt2":  # left padding: a padded query sees no key, which sdpa and ONNX Runtime answer apart
            logits, expected = logits[inputs["attention_mask"].bool()], expected[inputs["attention_mask"].bool()]
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
