"""Quantized and offloaded inference (issue 14 item 3): `ScratchLinear` keeps its oneDNN path for plain fp32 weights
and hands every other weight (a tensor subclass, a fake or meta tensor) to `F.linear`, so that torchao's int8
weights (`TorchAoConfig`) and accelerate's CPU/disk offload (`device_map="auto"`) work as on a native Llama of the
same size and weights (`conversion.from_hf`), which goes through the same treatment for comparison."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import LlamaConfig, LlamaForCausalLM, TorchAoConfig

from hf_scratch_transformer import ScratchDecoderForCausalLM, kernel_choice, linear_kernels
from hf_scratch_transformer.conversion import from_hf, to_hf
from hf_scratch_transformer.kernel_choice import clear_kernel_choices
from hf_scratch_transformer.linear_kernels import PLAIN_TYPES
from hf_scratch_transformer.scratch_linear import ScratchLinear, is_torchao_weight

VOCAB = 99
CLASSES = {"ours": ScratchDecoderForCausalLM, "native": LlamaForCausalLM}
NEW_TOKENS = 8
# Int8 rounding moves these logits by about 1% of their largest value (0.7% weight-only, 1.2% with int8 activations
# too); a weight read without its scale, transposed, or left out is off by its whole size. 3% sits between. With int8
# activations the product is oneDNN's int8 one, which on a CPU without AVX-512 VNNI (an AVX2 host; measured with
# oneDNN limited to AVX2 on an AMD EPYC) moves them by 9.7%, the native Llama's exactly as ours: 15% for that method.
QUANTIZATION_TOLERANCE = {"Int8WeightOnlyConfig": 0.03, "Int8DynamicActivationInt8WeightConfig": 0.15}


@pytest.fixture
def onednn_calls(monkeypatch):
    """The weight shape of every oneDNN product, with oneDNN forced (as tests/conftest.py does for the suite)."""
    monkeypatch.setenv(kernel_choice.KERNELS_VARIABLE, "onednn")
    clear_kernel_choices()
    calls, product = [], linear_kernels.onednn_linear

    def counting(*args):
        calls.append(tuple(args[1].shape))
        return product(*args)

    monkeypatch.setattr(linear_kernels, "onednn_linear", counting)
    yield calls
    clear_kernel_choices()


# ----------------------------------------------------------------------------------------------- the layer alone
class TracedTensor(torch.Tensor):
    """The smallest weight wrapper: a subclass that logs each function called on it and then runs it, as torchao's
    and DTensor's `__torch_function__` do before dispatching to their own kernels."""

    seen: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_weight_takes_f_linear_and_a_plain_one_onednn(onednn_calls):
    layer = ScratchLinear(8, 4)
    inputs = torch.randn(3, 8)
    expected = F.linear(inputs, layer.weight, layer.bias)
    with torch.no_grad():
        torch.testing.assert_close(layer(inputs), expected)
        assert len(onednn_calls) == 1  # the plain fp32 weight keeps the fast path
        layer.weight = torch.nn.Parameter(layer.weight.detach().as_subclass(TracedTensor))
        assert type(layer.weight) not in PLAIN_TYPES
        TracedTensor.seen.clear()
        torch.testing.assert_close(layer(inputs).as_subclass(torch.Tensor), expected)
    assert len(onednn_calls) == 1 and "linear" in TracedTensor.seen


def test_fake_and_meta_tensors_get_shapes_without_onednn(onednn_calls):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # how torch.compile and torch.export trace: CPU-looking tensors with no data
        assert ScratchLinear(8, 4)(torch.randn(2, 5, 8)).shape == (2, 5, 4)
    with torch.device("meta"):  # how from_pretrained builds a model, and what an offloaded weight is between hooks
        layer = ScratchLinear(8, 4)
    assert layer(torch.randn(2, 8, device="meta")).shape == (2, 4)
    # A meta weight with real inputs is torch's device error; oneDNN's op read it as memory and returned garbage.
    with pytest.raises(RuntimeError, match="meta"):
        layer(torch.randn(2, 8))
    assert onednn_calls == []


# ----------------------------------------------------------------------------------------------- saved models
@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A 4-layer GQA Llama and ours with its weights (`from_hf`), each saved; and inputs."""
    torch.manual_seed(0)
    native = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    root = tmp_path_factory.mktemp("quantization")
    for side, model in (("native", native), ("ours", from_hf(native))):
        model.save_pretrained(root / side)
    return {side: root / side for side in CLASSES}


@pytest.fixture(scope="module")
def inputs() -> dict:
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def logits_and_tokens(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logits = model(**inputs).logits
    tokens = model.generate(input_ids=inputs["input_ids"][:1], max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                            do_sample=False)
    return logits, tokens


def quantized_weights(model) -> set:
    return {name for name, parameter in model.named_parameters() if type(parameter) not in PLAIN_TYPES}


@pytest.fixture(scope="module")
def fp32(folders, inputs) -> dict:
    return {side: logits_and_tokens(CLASSES[side].from_pretrained(folders[side]).eval(), inputs) for side in CLASSES}


@pytest.mark.parametrize("method", ["Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig"])
def test_torchao_int8_loads_runs_generates_and_reloads(method, folders, inputs, fp32, tmp_path, onednn_calls):
    quantization = pytest.importorskip("torchao.quantization")
    config = TorchAoConfig(getattr(quantization, method)())
    models = {side: CLASSES[side].from_pretrained(folders[side], quantization_config=config).eval() for side in CLASSES}
    # Every linear layer but the LM head (TorchAoConfig's default) holds an int8 tensor subclass, in both.
    quantized = {side: quantized_weights(model) for side, model in models.items()}
    assert len(quantized["native"]) == 4 * 7 and len(quantized["ours"]) == 4 * 4  # q, k, v fused; gate, up fused
    assert not any("lm_head" in name or "embed" in name for names in quantized.values() for name in names)

    onednn_calls.clear()
    results = {side: logits_and_tokens(model, inputs) for side, model in models.items()}
    assert onednn_calls and set(onednn_calls) == {(VOCAB, 64)}  # the plain fp32 LM head keeps the fast path
    logits, tokens = results["ours"]
    reference = fp32["ours"][0]
    error = (logits - reference).abs().max().item()
    assert 0 < error <= QUANTIZATION_TOLERANCE[method] * reference.abs().max().item(), error
    # The native Llama, treated the same way, computes the same products: to fp32 rounding, the same tokens.
    torch.testing.assert_close(logits, results["native"][0], atol=1e-5, rtol=1e-5)
    assert torch.equal(tokens, results["native"][1]) and tokens.shape[1] == inputs["input_ids"].shape[1] + NEW_TOKENS

    # Saved and reloaded (no quantization_config: it is in config.json), the int8 weights come back as they were.
    models["ours"].save_pretrained(tmp_path)
    reloaded = ScratchDecoderForCausalLM.from_pretrained(tmp_path).eval()
    assert quantized_weights(reloaded) == quantized["ours"]
    reloaded_logits, reloaded_tokens = logits_and_tokens(reloaded, inputs)
    assert torch.equal(reloaded_logits, logits) and torch.equal(reloaded_tokens, tokens)


# torchao's `quantize_` on a model in memory (torchao's own way, no TorchAoConfig): every linear layer, the LM head too.
# Int4 as torchao's CPU int4 (`IntxWeightOnlyConfig`, groups of 32 inputs: `Int4WeightOnlyConfig` needs the `mslk`
# package or CUDA, on both sides); float8 weight-only runs on CPU (float8 activations need CUDA).
IN_MEMORY_CONFIGS = {
    "Int8WeightOnlyConfig": lambda quantization: quantization.Int8WeightOnlyConfig(),
    "Int8DynamicActivationInt8WeightConfig": lambda quantization: quantization.Int8DynamicActivationInt8WeightConfig(),
    "IntxWeightOnlyConfig": lambda quantization: quantization.IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=quantization.granularity.PerGroup(32)),
    "Float8WeightOnlyConfig": lambda quantization: quantization.Float8WeightOnlyConfig(),
}


@pytest.mark.parametrize("method", IN_MEMORY_CONFIGS)
def test_quantize_in_memory_computes_the_native_llamas_products(method, folders, inputs, fp32):
    """Per-row and per-group scales are per output row, so our fused QKV and gate | up hold the values and scales of
    Llama's separate layers, whichever torchao tensor they become."""
    quantization = pytest.importorskip("torchao.quantization")
    native = LlamaForCausalLM.from_pretrained(folders["native"]).eval()
    models = {"ours": from_hf(native), "native": native}
    for model in models.values():
        quantization.quantize_(model, IN_MEMORY_CONFIGS[method](quantization))
    assert all(type(model.lm_head.weight) not in PLAIN_TYPES for model in models.values())
    results = {side: logits_and_tokens(model, inputs) for side, model in models.items()}
    assert not torch.equal(results["ours"][0], fp32["ours"][0])  # quantized
    torch.testing.assert_close(results["ours"][0], results["native"][0], atol=1e-5, rtol=1e-5)
    assert torch.equal(results["ours"][1], results["native"][1])


def test_an_fp8_quantized_cache_decodes_as_the_native_llamas(folders, inputs):
    """`generate(cache_implementation="quantized")` with transformers' fp8 backend (the one that needs no other
    package: quanto and HQQ are not installed here) stores our keys and values as the native Llama stores its own."""
    quantized_cache = {"cache_implementation": "quantized", "cache_config": {"backend": "fp8"}}
    scores = {}
    for side in CLASSES:
        model = CLASSES[side].from_pretrained(folders[side]).eval()
        for cache, options in (("fp8", quantized_cache), ("plain", {})):
            output = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                                    return_dict_in_generate=True, **options)
            scores[side, cache] = torch.stack(output.scores)
    torch.testing.assert_close(scores["ours", "fp8"], scores["native", "fp8"], atol=1e-5, rtol=1e-5)
    assert not torch.equal(scores["ours", "fp8"], scores["ours", "plain"])  # the cache was quantized


class TorchaoProducts(TorchFunctionMode):
    """The weight shape of every `F.linear` with a torchao weight, in the order computed."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear and is_torchao_weight(args[1]):
            self.shapes.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


def test_a_quantized_gate_and_up_are_the_native_models_two_products(folders, inputs):
    """torchao's weight-only product converts the weight to fp32 at each call, which costs more per byte for our
    fused gate | up matrix than for the native gate and up: with a torchao weight, ours computes the two halves
    separately (docs/quantization.md), from views made once per weight."""
    quantization = pytest.importorskip("torchao.quantization")
    config = TorchAoConfig(quantization.Int8WeightOnlyConfig())
    model = ScratchDecoderForCausalLM.from_pretrained(folders["ours"], quantization_config=config).eval()
    up_proj = model.model.layers[0].mlp.up_proj
    with torch.no_grad(), TorchaoProducts() as products:
        model(**inputs)
    # Per layer: the fused QKV (64 + 2 x 32 rows, GQA) stays one product; gate and up (128 rows each), o and down.
    assert products.shapes == [(128, 64), (64, 64), (128, 64), (128, 64), (64, 128)] * 4
    parts = up_proj._torchao_parts(up_proj.weight)
    assert up_proj._torchao_parts(up_proj.weight) is parts  # kept: slicing a torchao tensor costs 80 us
    # A copy makes views of its own weight; `to` drops them (torch refuses to swap a weight's tensors while views
    # of it are kept elsewhere).
    copied = copy.deepcopy(up_proj)
    assert "_torchao_cache" not in copied.__dict__
    assert copied._torchao_parts(copied.weight)[0][0].qdata.data_ptr() == copied.weight.qdata.data_ptr()
    del parts
    up_proj.to("cpu")
    assert "_torchao_cache" not in up_proj.__dict__


def test_a_quantized_gate_and_up_with_biases_compute_the_native_llamas_products(inputs):
    """A Llama with biases (`mlp_bias`, `attention_bias`): each half of our fused gate | up, computed apart under
    torchao, adds its own half of the fused bias, as the native gate and up add theirs."""
    quantization = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    native = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, mlp_bias=True, attention_bias=True)).eval()
    with torch.no_grad():
        for name, parameter in native.named_parameters():
            if name.endswith("bias"):
                parameter.normal_()  # Llama starts them at zero, where a dropped bias would go unseen
    models = {"ours": from_hf(native), "native": native}
    for model in models.values():
        quantization.quantize_(model, quantization.Int8WeightOnlyConfig())
    with torch.no_grad():
        logits = {side: model(**inputs).logits for side, model in models.items()}
    torch.testing.assert_close(logits["ours"], logits["native"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("side", CLASSES)
def test_device_map_auto_offloads_to_cpu_and_disk_with_the_same_outputs(side, folders, inputs, fp32, tmp_path,
                                                                         onednn_calls):
    plain = CLASSES[side].from_pretrained(folders[side])
    size = sum(parameter.nbytes for parameter in plain.parameters())
    model = CLASSES[side].from_pretrained(folders[side], device_map="auto", max_memory={"cpu": int(0.6 * size)},
                                          offload_folder=tmp_path).eval()
    placed = set(model.hf_device_map.values())
    assert placed == {"cpu", "disk"}, model.hf_device_map  # the first blocks in memory, the rest read at each forward
    assert any(parameter.is_meta for parameter in model.parameters())
    logits, tokens = logits_and_tokens(model, inputs)
    torch.testing.assert_close(logits, fp32[side][0], atol=1e-6, rtol=1e-6)
    assert torch.equal(tokens, fp32[side][1])
    # accelerate's hooks put plain fp32 weights back before each forward: ours keeps its fast path on them.
    assert bool(onednn_calls) == (side == "ours")


@pytest.mark.parametrize("side", CLASSES)
def test_quantized_or_offloaded_models_are_refused_by_conversion_with_the_weight_named(side, folders, tmp_path):
    """`from_hf` / `to_hf` map full-precision tensors in memory: an int8 or offloaded weight would fail inside
    torchao or torch with an error that names neither (a torchao dispatch error, "Cannot copy out of meta tensor")."""
    quantization = pytest.importorskip("torchao.quantization")
    convert = to_hf if side == "ours" else from_hf
    int8 = CLASSES[side].from_pretrained(
        folders[side], quantization_config=TorchAoConfig(quantization.Int8WeightOnlyConfig()))
    with pytest.raises(ValueError, match=r"`model\.layers\.0\.\S+` is a quantized Int8Tensor\. Convert the full"):
        convert(int8)
    plain = CLASSES[side].from_pretrained(folders[side])
    size = sum(parameter.nbytes for parameter in plain.parameters())
    offloaded = CLASSES[side].from_pretrained(folders[side], device_map="auto", max_memory={"cpu": int(0.6 * size)},
                                              offload_folder=tmp_path)
    with pytest.raises(ValueError, match=r"`model\.\S+` is not in memory \(on the meta device"):
        convert(offloaded)
    assert type(convert(plain)).__name__ == CLASSES["native" if side == "ours" else "ours"].__name__


@pytest.mark.parametrize("side", CLASSES)
def test_a_quantized_model_runs_under_inference_mode_and_then_with_gradients(side, folders, inputs):
    """`torch.inference_mode()`, the usual wrapper of inference scripts: ours failed at its first forward with
    "Cannot set version_counter for inference tensor" (torchao's slicing of the fused gate | up into its parts), where
    the native Llama runs. The parts, made there, must also serve a later forward with gradients (a saliency map,
    say), as the native weights do."""
    quantization = pytest.importorskip("torchao.quantization")
    config = TorchAoConfig(quantization.Int8WeightOnlyConfig())
    model = CLASSES[side].from_pretrained(folders[side], quantization_config=config).eval()
    with torch.no_grad():
        expected = model(**inputs).logits
    model = CLASSES[side].from_pretrained(folders[side], quantization_config=config).eval()  # no parts made yet
    with torch.inference_mode():
        torch.testing.assert_close(model(**inputs).logits, expected, atol=0, rtol=0)
        tokens = model.generate(input_ids=inputs["input_ids"][:1], max_new_tokens=2, do_sample=False)
    assert tokens.shape[1] == inputs["input_ids"].shape[1] + 2
    embeds = model.get_input_embeddings()(inputs["input_ids"]).detach().requires_grad_()
    model(inputs_embeds=embeds, attention_mask=inputs["attention_mask"]).logits.sum().backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
