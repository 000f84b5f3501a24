"""ScratchLinear's bf16 products under CPU autocast (`kernel_choice.bf16_kernel`): autocast's own, or the widened one
through the fp32 BLAS. Forced either way they give the same results to bf16 rounding, forward and backward (double
backward too), in a layer, in whole models and against the native GPT-2; the widened product keeps bf16 tensors for
backward, as autocast's does; it is taken only for products of many rows under bf16 autocast; the choice is made once
per process and can be forced."""

import pytest
import torch
import torch.nn.functional as F
from tiny_models import FAMILIES, lm_inputs, tiny_lm
from tiny_native import gpt2

from hf_scratch_transformer import kernel_choice, linear_kernels
from hf_scratch_transformer.conversion import from_hf
from hf_scratch_transformer.kernel_choice import FEW_ROWS, bf16_kernel
from hf_scratch_transformer.scratch_linear import ScratchLinear

MANY_ROWS = 2 * FEW_ROWS


@pytest.fixture
def bf16_products(force_choice):
    """`bf16_products(choice)` sets HF_SCRATCH_CPU_BF16_PRODUCTS for this test; the choice is made afresh on both
    sides of it."""
    return lambda choice: force_choice(kernel_choice.BF16_PRODUCTS_VARIABLE, kernel_choice.clear_kernel_choices,
                                       choice)


@pytest.fixture
def widened_calls(monkeypatch):
    """The inputs' shapes of every product computed widened (`bf16_by_fp32_linear`), gradient products included."""
    calls = []
    widened = linear_kernels.bf16_by_fp32_linear

    def counting(inputs, weight, bias):
        calls.append(tuple(inputs.shape))
        return widened(inputs, weight, bias)

    monkeypatch.setattr(linear_kernels, "bf16_by_fp32_linear", counting)
    return calls


def assert_equal_to_bf16_rounding(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The same bf16-rounded sums in another order: a result differs by a unit in the last place of bf16 (2^-8 of its
    size) where the two sums round to neighbours, and an element that nearly cancels by a few units of its largest
    terms; here of the order of the tensor's largest value. A wrong operand, transpose or missing bias differs by a
    sizeable fraction of the values."""
    assert actual.dtype == expected.dtype
    scale = expected.float().abs().max().item()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2**-7, atol=2**-6 * scale)


def product_and_grads(layer: ScratchLinear, inputs: torch.Tensor, grad_output: torch.Tensor) -> list[torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = layer(inputs)
    return [output, *torch.autograd.grad(output, [inputs, *layer.parameters()], grad_output)]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_widened_product_gives_autocasts_results(bf16_products, widened_calls, dtype, bias):
    torch.manual_seed(0)
    layer = ScratchLinear(48, 80, bias=bias)
    inputs = torch.randn(3, MANY_ROWS, 48, dtype=dtype, requires_grad=True)
    grad_output = torch.randn(3, MANY_ROWS, 80).bfloat16()
    bf16_products("native")
    expected = product_and_grads(layer, inputs, grad_output)
    assert widened_calls == []
    bf16_products("fp32")
    actual = product_and_grads(layer, inputs, grad_output)
    assert widened_calls == [(3, MANY_ROWS, 48), (3 * MANY_ROWS, 80), (80, 3 * MANY_ROWS)]  # forward, 2 gradients
    assert [tensor.dtype for tensor in actual] == [torch.bfloat16, dtype, torch.float32] + [torch.float32] * bias
    for got, wanted in zip(actual, expected, strict=True):
        assert_equal_to_bf16_rounding(got, wanted)


def test_a_frozen_bf16_weight_gets_no_gradient_product(bf16_products, widened_calls):
    """A frozen base layer (PEFT's LoRA trains beside it) in bf16, as `from_pretrained(dtype=bfloat16)` loads it: only
    the inputs' gradient is computed, in bf16, as autocast's product gives it."""
    torch.manual_seed(0)
    layer = ScratchLinear(24, 40).bfloat16().requires_grad_(False)
    inputs = torch.randn(MANY_ROWS, 24, requires_grad=True)
    grad_output = torch.randn(MANY_ROWS, 40).bfloat16()
    results = {}
    for choice in ("native", "fp32"):
        bf16_products(choice)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = layer(inputs)
        results[choice] = [output, *torch.autograd.grad(output, inputs, grad_output)]
    assert widened_calls == [(MANY_ROWS, 24), (MANY_ROWS, 40)]  # forward, the inputs' gradient
    for got, wanted in zip(results["fp32"], results["native"], strict=True):
        assert_equal_to_bf16_rounding(got, wanted)


@pytest.mark.parametrize("bias", [True, False])
def test_a_bf16_layers_products_are_widened_without_autocast(bf16_products, widened_calls, bias):
    """A model loaded or cast to bf16 (`from_pretrained(dtype=torch.bfloat16)`) computes bf16 products without
    autocast: the same choice applies to them."""
    torch.manual_seed(0)
    layer = ScratchLinear(48, 80, bias=bias).bfloat16()
    inputs = torch.randn(2, MANY_ROWS, 48).bfloat16().requires_grad_()
    grad_output = torch.randn(2, MANY_ROWS, 80).bfloat16()
    results = {}
    for choice in ("native", "fp32"):
        bf16_products(choice)
        output = layer(inputs)
        results[choice] = [output, *torch.autograd.grad(output, [inputs, *layer.parameters()], grad_output)]
    assert widened_calls == [(2, MANY_ROWS, 48), (2 * MANY_ROWS, 80), (80, 2 * MANY_ROWS)]
    assert {tensor.dtype for tensor in results["fp32"]} == {torch.bfloat16}
    for got, wanted in zip(results["fp32"], results["native"], strict=True):
        assert_equal_to_bf16_rounding(got, wanted)


def test_without_gradients_the_product_is_widened_once(bf16_products, widened_calls):
    bf16_products("fp32")
    layer = ScratchLinear(16, 8)
    inputs = torch.randn(MANY_ROWS, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        output = layer(inputs)
        expected = F.linear(inputs, layer.weight, layer.bias)  # autocast's own
    assert widened_calls == [(MANY_ROWS, 16)]
    assert_equal_to_bf16_rounding(output, expected)


def test_the_widened_product_keeps_bf16_tensors_for_backward(bf16_products):
    """What backward keeps is bf16, as autocast's product keeps it: bf16 saves the memory it is chosen for."""
    bf16_products("fp32")
    layer = ScratchLinear(32, 64)
    inputs = torch.randn(MANY_ROWS, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: saved.append(tensor) or tensor, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(inputs).sum().backward()
    assert {tensor.dtype for tensor in saved} == {torch.bfloat16}
    assert sorted(tuple(tensor.shape) for tensor in saved) == [(64, 32), (MANY_ROWS, 32)]


def test_double_backward_matches_autocasts(bf16_products):
    torch.manual_seed(0)
    layer = ScratchLinear(16, 24)
    inputs = torch.randn(MANY_ROWS, 16, requires_grad=True)
    results = {}
    for choice in ("native", "fp32"):
        bf16_products(choice)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = layer(inputs)
        (input_grad,) = torch.autograd.grad(output.float().pow(2).sum(), inputs, create_graph=True)
        results[choice] = torch.autograd.grad(input_grad.pow(2).sum(), [inputs, layer.weight])
    for got, wanted in zip(results["fp32"], results["native"], strict=True):
        assert_equal_to_bf16_rounding(got, wanted)


@pytest.mark.parametrize(
    "case",
    ["few rows", "fp16 autocast", "float64", "no autocast", "torch.func", "bf16 layer, few rows"],
)
def test_other_products_keep_their_kernels(bf16_products, widened_calls, case):
    bf16_products("fp32")
    layer = ScratchLinear(8, 4)
    rows = FEW_ROWS if "few rows" in case else MANY_ROWS  # a decoding step would spend its time widening the weight
    inputs = torch.randn(rows, 8)
    if case == "float64":
        layer, inputs = layer.double(), inputs.double()
    if case == "bf16 layer, few rows":  # a decoding step of a bf16 model
        layer, inputs = layer.bfloat16(), inputs[:FEW_ROWS].bfloat16()
    autocast = {"fp16 autocast": torch.float16, "no autocast": None, "bf16 layer, few rows": None}.get(
        case, torch.bfloat16)

    def run(product):
        if case == "torch.func":
            return torch.func.vmap(product)(inputs.reshape(2, -1, 8)).reshape(rows, 4)
        return product(inputs)

    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        output = run(layer)
        expected = run(lambda rows: F.linear(rows, layer.weight, layer.bias))
    assert widened_calls == []
    torch.testing.assert_close(output, expected)


def test_the_choice_is_timed_once_and_can_be_forced(bf16_products, monkeypatch):
    bf16_products("auto")
    timings = []

    def timed(lead):
        def time_bf16_kernels():
            timings.append(lead)
            return {"native": 1.0, "fp32": lead}
        return time_bf16_kernels

    monkeypatch.setattr(kernel_choice, "time_bf16_kernels", timed(0.5))
    assert bf16_kernel() == bf16_kernel() == "fp32"
    assert timings == [0.5]
    kernel_choice.clear_kernel_choices()
    monkeypatch.setattr(kernel_choice, "time_bf16_kernels", timed(0.9))  # within the margin: autocast's own
    assert bf16_kernel() == "native"
    bf16_products("native")
    monkeypatch.setattr(kernel_choice, "time_bf16_kernels", timed(0.1))
    assert bf16_kernel() == "native"
    assert timings == [0.5, 0.9]
    bf16_products("bf16")
    with pytest.raises(ValueError, match="HF_SCRATCH_CPU_BF16_PRODUCTS must be one of auto, native, fp32; got 'bf16'"):
        bf16_kernel()


def test_timing_measures_both_kernels_and_leaves_the_random_state():
    state = torch.get_rng_state()
    seconds = kernel_choice.time_bf16_kernels(repeats=1)
    assert set(seconds) == {"native", "fp32"}
    assert all(0 < value < 60 for value in seconds.values())
    assert torch.equal(torch.get_rng_state(), state)


def bf16_training_step(model, inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bf16_training_step_is_the_same_with_either_product(family, bf16_products, widened_calls):
    model = tiny_lm(family).train()
    inputs = lm_inputs(family, batch=4, length=40)  # 160 rows: many
    results = {}
    for choice in ("native", "fp32"):
        bf16_products(choice)
        results[choice] = bf16_training_step(model, inputs)
    assert widened_calls  # the "fp32" step's products were widened
    (loss, grads), (expected_loss, expected_grads) = results["fp32"], results["native"]
    torch.testing.assert_close(loss, expected_loss, atol=1e-2, rtol=1e-2)
    for grad, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected, atol=2e-2, rtol=5e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bf16_models_logits_are_the_same_with_either_product(family, bf16_products, widened_calls):
    model = tiny_lm(family).bfloat16()
    inputs = lm_inputs(family, batch=4, length=40)
    logits = {}
    for choice in ("native", "fp32"):
        bf16_products(choice)
        with torch.no_grad():
            logits[choice] = model(**inputs).logits
    assert widened_calls
    assert_equal_to_bf16_rounding_of_a_network(logits["fp32"], logits["native"])


def assert_equal_to_bf16_rounding_of_a_network(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Through a network a bf16 rounding step in one layer moves the next layer's inputs: the results agree to a few
    bf16 steps of their largest values, as the attention kernels' do (tests/test_attention_kernel.py)."""
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float(), expected.float(), rtol=0,
                               atol=2**-4 * max(1.0, expected.float().abs().max().item()))


def test_a_widened_bf16_step_matches_the_native_gpt2(bf16_products, widened_calls):
    native = gpt2(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()  # no dropout: the same sums on both sides
    ours = from_hf(native).train()
    ids = torch.randint(3, 99, (4, 40), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "labels": ids}
    bf16_products("fp32")
    (loss, _), (expected_loss, _) = bf16_training_step(ours, inputs), bf16_training_step(native, inputs)
    assert widened_calls
    torch.testing.assert_close(loss, expected_loss, atol=1e-2, rtol=1e-2)
    ours_grads = {name: parameter.grad for name, parameter in ours.named_parameters()}
    for native_name, ours_name, transposed in [
        ("transformer.wte.weight", "model.embeddings.embed_tokens.weight", False),  # the tied output head's too
        ("transformer.h.0.attn.c_attn.weight", "model.layers.0.self_attn.qkv_proj.weight", True),  # Conv1D: (in, out)
        ("transformer.h.1.mlp.c_fc.weight", "model.layers.1.mlp.up_proj.weight", True),
    ]:
        grad = ours_grads[ours_name].t() if transposed else ours_grads[ours_name]
        torch.testing.assert_close(grad, native.get_parameter(native_name).grad, atol=2e-2, rtol=5e-2)
