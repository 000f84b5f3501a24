"""`ScratchLinear`: each fp32 CPU kernel (native `F.linear`, oneDNN, the transposed product) gives `F.linear`'s values
and gradients, the machine's choice between them is made once per process and can be forced, and the kernel chosen
is the one taken."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize
import torch.nn.utils.prune
from tiny_models import FAMILIES, lm_inputs, tiny_lm

from hf_scratch_transformer import kernel_choice, linear_kernels, scratch_linear
from hf_scratch_transformer.kernel_choice import fp32_kernel
from hf_scratch_transformer.scratch_linear import ScratchLinear

pytestmark = pytest.mark.skipif(not linear_kernels.ONEDNN_AVAILABLE, reason="this torch build has no oneDNN")
ONEDNN_LINEAR = linear_kernels.onednn_linear
MANY_ROWS = 2 * kernel_choice.FEW_ROWS
FEW_ROW_REGIMES = (kernel_choice.DECODING, kernel_choice.DECODING_FROM_MEMORY, kernel_choice.BATCH_DECODING,
                   kernel_choice.BATCH_DECODING_FROM_MEMORY)


def seconds(onednn: float, transposed: float = 2.0) -> dict[str, float]:
    """A timing's answer (`time_kernels`: kernel -> best seconds), the BLAS's F.linear taking 1 s."""
    return {"native": 1.0, "onednn": onednn, "transposed": transposed}


@pytest.fixture
def kernels(force_choice, monkeypatch):
    """`kernels(choice)` sets HF_SCRATCH_CPU_KERNELS for this test; the choice is made afresh on both sides of it.
    The tests' small weights are timed too, as large ones (`UNTIMED_WEIGHT_ELEMENTS` has a test of its own)."""
    monkeypatch.setattr(kernel_choice, "UNTIMED_WEIGHT_ELEMENTS", 0)
    return lambda choice: force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, choice)


def test_few_row_products_of_small_weights_take_the_blas_untimed(force_choice, monkeypatch):
    """oneDNN's fixed cost a call is several times the BLAS's whole product of a small weight, and timing each such
    shape cost a tiny model's first generate() up to 3.7 s: up to UNTIMED_WEIGHT_ELEMENTS, F.linear, untimed; a
    larger weight, or prefill and training (timed on TIMED_SHAPE), is timed; a forced kernel is the one forced."""
    timed = []
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, shape: timed.append((regime, shape)) or
                        {"native": 2.0, "onednn": 1.0, "transposed": 2.0})
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "auto")
    for regime in FEW_ROW_REGIMES:
        assert fp32_kernel(regime, (128, 128)) == "native"
        assert fp32_kernel(regime, (129, 128)) == "onednn"
    assert timed == [(regime, (129, 128)) for regime in FEW_ROW_REGIMES]
    assert fp32_kernel(kernel_choice.PREFILL, (16, 16)) == "onednn"
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "onednn")
    assert fp32_kernel(kernel_choice.DECODING, (16, 16)) == "onednn"


@pytest.fixture
def onednn_calls(monkeypatch, kernels):
    """The inputs' shapes of every oneDNN product, with oneDNN forced (whichever kernel this machine prefers)."""
    kernels("onednn")
    calls = []

    def counting(*args):
        calls.append(args[0].shape)
        return ONEDNN_LINEAR(*args)

    monkeypatch.setattr(linear_kernels, "onednn_linear", counting)
    return calls


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 24), (2, 5, 24), (3, 1, 24)])
def test_values_and_gradients_match_f_linear(shape, bias, onednn_calls):
    torch.manual_seed(0)
    layer = ScratchLinear(24, 40, bias=bias)
    inputs = torch.randn(shape, requires_grad=True)
    reference_inputs = inputs.detach().clone().requires_grad_()
    output = layer(inputs)
    reference = F.linear(reference_inputs, layer.weight, layer.bias)
    torch.testing.assert_close(output, reference, atol=1e-5, rtol=1e-5)

    grad_output = torch.randn_like(output)
    grads = torch.autograd.grad(output, [inputs, *layer.parameters()], grad_output)
    reference_grads = torch.autograd.grad(reference, [reference_inputs, *layer.parameters()], grad_output)
    for grad, expected in zip(grads, reference_grads, strict=True):
        assert grad.shape == expected.shape
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)
    assert len(onednn_calls) == 3  # forward, input grad, weight grad


def test_frozen_weight_skips_the_weight_product(onednn_calls):
    layer = ScratchLinear(8, 4).requires_grad_(False)
    inputs = torch.randn(3, 8, requires_grad=True)
    layer(inputs).sum().backward()
    torch.testing.assert_close(inputs.grad, layer.weight.sum(0).expand(3, 8))
    assert len(onednn_calls) == 2


def test_no_grad_inference_uses_onednn(onednn_calls):
    layer = ScratchLinear(8, 4)
    inputs = torch.randn(2, 3, 8)
    with torch.no_grad():
        output = layer(inputs)
    torch.testing.assert_close(output, F.linear(inputs, layer.weight, layer.bias))
    assert onednn_calls == [torch.Size([2, 3, 8])]


@pytest.mark.parametrize(
    "context, dtype",
    [
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16), torch.bfloat16),  # autocast owns the product
        (torch.no_grad, torch.float64),
    ],
)
def test_other_dtypes_take_f_linear(context, dtype, onednn_calls):
    layer = ScratchLinear(8, 4).to(torch.float64 if dtype == torch.float64 else torch.float32)
    inputs = torch.randn(2, 8, dtype=layer.weight.dtype)
    with context():
        output = layer(inputs)
    assert output.dtype == dtype
    assert onednn_calls == []


def test_empty_batch(onednn_calls):
    layer = ScratchLinear(8, 4)
    assert layer(torch.randn(0, 8)).shape == (0, 4)
    assert onednn_calls == []


def test_double_backward_matches_f_linear():
    torch.manual_seed(0)
    layer = ScratchLinear(6, 5)
    inputs = torch.randn(3, 6, requires_grad=True)

    def second_derivative(linear):
        grad, = torch.autograd.grad(linear(inputs).pow(3).sum(), inputs, create_graph=True)
        return torch.autograd.grad(grad.pow(2).sum(), [inputs, layer.weight])

    expected = second_derivative(lambda x: F.linear(x, layer.weight, layer.bias))
    for ours, reference in zip(second_derivative(layer), expected, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_torch_func_transforms_match_f_linear(onednn_calls):
    torch.manual_seed(0)
    layer = ScratchLinear(6, 5)
    params = dict(layer.named_parameters())
    inputs = torch.randn(4, 3, 6)

    def ours(parameters, x):
        return torch.func.functional_call(layer, parameters, (x,)).pow(2).sum()

    def reference(parameters, x):
        return F.linear(x, parameters["weight"], parameters["bias"]).pow(2).sum()

    losses = (ours, reference)
    per_sample = [torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, inputs) for loss in losses]
    for name in params:
        torch.testing.assert_close(per_sample[0][name], per_sample[1][name], atol=1e-5, rtol=1e-5)
    tangent = torch.ones_like(inputs[0])
    jvps = [torch.func.jvp(lambda x, loss=loss: loss(params, x), (inputs[0],), (tangent,))[1] for loss in losses]
    torch.testing.assert_close(jvps[0], jvps[1], atol=1e-4, rtol=1e-5)
    assert onednn_calls == []  # transforms take F.linear, which has their batching rules


def test_forward_mode_ad_matches_f_linear():
    torch.manual_seed(0)
    layer = ScratchLinear(6, 5)
    inputs, tangent = torch.randn(3, 6), torch.randn(3, 6)
    with torch.autograd.forward_ad.dual_level():
        ours = torch.autograd.forward_ad.unpack_dual(layer(torch.autograd.forward_ad.make_dual(inputs, tangent)))
    torch.testing.assert_close(ours.tangent, F.linear(tangent, layer.weight), atol=1e-5, rtol=1e-5)


def test_forward_mode_ad_through_the_weight_and_bias_matches_f_linear(onednn_calls):
    """Tangents of the parameters too (a directional derivative in weight space, as `forward_ad` computes it), each
    term of the product rule: inputs x weight tangent + bias tangent."""
    torch.manual_seed(0)
    layer = ScratchLinear(6, 5)
    inputs = torch.randn(3, 6)
    with torch.autograd.forward_ad.dual_level():
        parameters = {name: torch.autograd.forward_ad.make_dual(parameter.detach(), torch.randn_like(parameter))
                      for name, parameter in layer.named_parameters()}
        ours, reference = (torch.autograd.forward_ad.unpack_dual(output).tangent for output in (
            torch.func.functional_call(layer, parameters, (inputs,)), F.linear(inputs, *parameters.values())))
    assert onednn_calls  # the product under test: oneDNN's, the kernel the suite forces
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [3, MANY_ROWS])  # a decoding step, a training batch: the two choices of a machine
def test_each_forced_kernel_gives_f_linear_results(rows, kernels, onednn_calls):
    torch.manual_seed(0)
    layer = ScratchLinear(24, 40)
    inputs = torch.randn(rows, 24, requires_grad=True)
    grad_output = torch.randn(rows, 40)
    reference = F.linear(inputs, layer.weight, layer.bias)
    expected = [reference, *torch.autograd.grad(reference, [inputs, *layer.parameters()], grad_output)]
    for choice, products in [("native", 0), ("onednn", 3), ("transposed", 0)]:
        kernels(choice)
        onednn_calls.clear()
        output = layer(inputs)
        results = [output, *torch.autograd.grad(output, [inputs, *layer.parameters()], grad_output)]
        for result, reference in zip(results, expected, strict=True):
            torch.testing.assert_close(result, reference, atol=1e-5, rtol=1e-5)
        assert len(onednn_calls) == products, choice


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 24), (2, 3, 24)])
def test_products_with_gradients_are_no_views_and_take_in_place_ops(shape, bias, kernels, onednn_calls):
    """A recorded product is a tensor of its own, not a view, as `F.linear`'s without a bias (an output head's):
    FSDP2 warns of a wrapped module that returns a view ("An in-place op on this view ... wrong gradients"), and a
    custom Function's view output refuses in-place ops. oneDNN's op returns a view of its output over more than two
    dimensions, and the transposed product was reshaped after its copy: both were views."""
    torch.manual_seed(0)
    layer = ScratchLinear(24, 40, bias=bias)
    inputs = torch.randn(shape, requires_grad=True)
    grad_output = torch.randn(*shape[:-1], 40)
    reference = F.linear(inputs, layer.weight, layer.bias) * 2
    expected = torch.autograd.grad(reference, [inputs, *layer.parameters()], grad_output)
    for choice, products in [("onednn", 1), ("transposed", 0)]:
        kernels(choice)
        onednn_calls.clear()
        output = layer(inputs)
        assert not output._is_view() and len(onednn_calls) == products, choice
        output.mul_(2)
        torch.testing.assert_close(output, reference, atol=1e-5, rtol=1e-5)
        for grad, wanted in zip(torch.autograd.grad(output, [inputs, *layer.parameters()], grad_output), expected,
                                strict=True):
            torch.testing.assert_close(grad, wanted, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_models_give_the_same_loss_and_gradients_with_each_kernel(family, kernels):
    model = tiny_lm(family)
    results = {}
    for choice in ("native", "onednn", "transposed"):
        kernels(choice)
        loss = model(**lm_inputs(family)).loss
        results[choice] = [loss, *torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)]
    for choice in ("onednn", "transposed"):
        for ours, reference in zip(results[choice], results["native"], strict=True):
            if reference is not None:
                torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-4)


def test_auto_times_each_regime_once_and_keeps_the_choice(kernels, onednn_calls, monkeypatch):
    """Decoding steps (one row, a few rows), prefill (many rows, no gradients) and training (many rows, gradients)
    each have their choice, timed at the first product of the regime: oneDNN may win one and lose another."""
    timed = []
    faster = {kernel_choice.PREFILL}

    def timing(regime, shape):  # oneDNN faster for prefill only
        timed.append(regime)
        return seconds(0.5) if regime in faster else seconds(2.0)

    monkeypatch.setattr(kernel_choice, "time_kernels", timing)
    kernels("auto")
    layer = ScratchLinear(8, 4)
    for grad in (False, True, False):
        with torch.set_grad_enabled(grad):
            for rows in (1, MANY_ROWS, 2, MANY_ROWS + 1):
                layer(torch.randn(rows, 8))
    assert sorted(timed) == sorted([kernel_choice.DECODING, kernel_choice.BATCH_DECODING, kernel_choice.PREFILL,
                                    kernel_choice.TRAINING])
    assert [shape[0] for shape in onednn_calls] == [MANY_ROWS, MANY_ROWS + 1] * 2  # the no-grad many-row products
    assert [fp32_kernel(regime, layer.weight.shape) for regime in (
        kernel_choice.DECODING, kernel_choice.PREFILL, kernel_choice.TRAINING)] == ["native", "onednn", "native"]


@pytest.mark.parametrize("onednn_time, prefill, decoding, training", [
    (0.5, "onednn", "onednn", "onednn"),
    (0.85, "onednn", "onednn", "native"),
    (0.93, "onednn", "native", "native"),
    (0.96, "native", "native", "native"),
    (1.0, "native", "native", "native"),
])
def test_onednn_must_be_5_percent_faster_for_prefill_10_for_decoding_20_for_training(kernels, monkeypatch, onednn_time,
                                                                                     prefill, decoding, training):
    """The margins of ONEDNN_MARGINS: prefill's timing is the steadiest, and at 0.89-0.93 of the BLAS's time whole
    models prefilled 5-14% faster with oneDNN (AVX-512 AMD EPYC); decoding steps keep 10%, from memory too;
    training's timing, the noisiest, read 0.83-1.11 there where whole models tie or lose with oneDNN, so it needs
    20%."""
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: seconds(onednn_time))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    kernels("auto")
    assert fp32_kernel(kernel_choice.PREFILL) == prefill
    assert {fp32_kernel(regime) for regime in FEW_ROW_REGIMES} == {decoding}
    assert fp32_kernel(kernel_choice.TRAINING) == training


@pytest.mark.parametrize("capability, avx2_only", [("AVX2", True), ("AVX512", False), ("DEFAULT", False)])
def test_an_avx2_only_cpu_takes_onednn_from_15_percent_faster_for_prefill_20_for_decoding(kernels, monkeypatch,
                                                                                          capability, avx2_only):
    """On an AVX2-only AMD EPYC, prefill's timing read oneDNN down to 0.88 of the BLAS's time and decoding's down to
    0.87, while with oneDNN whole models prefilled 5% slower and decoded within noise: there, and only there,
    oneDNN must be 15% faster for prefill and 20% for decoding; training keeps its 20%. Decoding from memory keeps
    10% on every class: there oneDNN read 0.72-0.96 of the BLAS's time and models decoded up to 20% faster with it;
    so do decoding steps of a few rows, timed over 8 rows at once."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: seconds(0.87))
    kernels("auto")
    expected = "native" if avx2_only else "onednn"
    assert fp32_kernel(kernel_choice.PREFILL) == fp32_kernel(kernel_choice.DECODING) == expected
    assert {fp32_kernel(regime) for regime in FEW_ROW_REGIMES[1:]} == {"onednn"}
    assert fp32_kernel(kernel_choice.TRAINING) == "native"
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: seconds(0.82))
    kernel_choice.clear_kernel_choices()
    assert fp32_kernel(kernel_choice.PREFILL) == "onednn"
    assert fp32_kernel(kernel_choice.DECODING) == expected
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: seconds(0.78))
    kernel_choice.clear_kernel_choices()
    assert fp32_kernel(kernel_choice.DECODING) == "onednn"


@pytest.mark.parametrize("regime", ["training", "prefill", "decoding", "batch_decoding"])
def test_training_products_are_timed_on_one_core_the_others_on_the_process_threads(monkeypatch, regime):
    """Training products are timed on one core (both libraries split them over the threads, so their code for a core
    decides); prefill and decoding products, whose kernels rank differently on one thread and on two (AVX-512 AMD
    EPYC: MKL left a one-row product on one thread where oneDNN split it), with the threads they run on. Each with
    its own rows (a decoding step of several sequences: 4), with gradients for training only."""
    seen, product = [], F.linear

    def linear(inputs, weight, bias):
        seen.append((torch.get_num_threads(), inputs.shape[0], inputs.requires_grad))
        return product(inputs, weight, bias)

    monkeypatch.setattr(F, "linear", linear)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        kernel_choice.time_kernels(regime, repeats=1)
    finally:
        torch.set_num_threads(threads)
    training = regime == kernel_choice.TRAINING
    assert set(seen) == {(1 if training else 2, kernel_choice.TIMED_ROWS[regime], training)}


def test_decoding_is_timed_over_more_rounds(monkeypatch):
    """A decoding round is short (about 1 ms) and a core busy with other work stalls its two-thread product, so it
    is timed over TIMED_ROUNDS' 20 rounds (3 rounds picked the BLAS in 4 of 9 processes with one core busy), prefill
    over 5 (its margin is the narrower), training over 8 (over 3 its one-core timing spread over 0.83-1.11); each
    after a warm-up round."""
    calls, product = [], F.linear

    def linear(*args):
        calls.append(args[0].shape[0])
        return product(*args)

    monkeypatch.setattr(F, "linear", linear)
    for regime in (kernel_choice.DECODING, kernel_choice.PREFILL, kernel_choice.TRAINING):
        calls.clear()
        kernel_choice.time_kernels(regime, shape=(16, 8))
        per_round = 5 if regime == kernel_choice.DECODING else 1
        assert len(calls) == (kernel_choice.TIMED_ROUNDS[regime] + 1) * per_round
    assert kernel_choice.TIMED_ROUNDS == {"decoding": 20, "decoding_from_memory": 5, "batch_decoding": 10,
                                           "batch_decoding_from_memory": 5, "prefill": 5, "training": 8}


def test_a_timing_stops_at_its_deadline_after_one_timed_round(monkeypatch):
    """On a busy machine each oneDNN call waits for a core, and a tiny masked LM's evaluation spent 80 s timing its
    kernels: the rounds stop at the first that ends past TIMING_DEADLINE_SECONDS, after the warm-up and one timed
    round; under it, every round runs."""
    clock = [0.0]
    monkeypatch.setattr(kernel_choice.time, "perf_counter", lambda: clock[0])
    rounds = {"slow": 0, "fast": 0}

    def run(name, seconds):
        rounds[name] += 1
        clock[0] += seconds

    slow = kernel_choice.best_interleaved({"slow": lambda: run("slow", 0.4), "fast": lambda: run("fast", 0.2)}, 20)
    assert rounds == {"slow": 2, "fast": 2}  # the warm-up, then a timed round ending at 1.2 s
    assert slow == pytest.approx({"slow": 0.4, "fast": 0.2})
    rounds.update(slow=0, fast=0)
    kernel_choice.best_interleaved({"slow": lambda: run("slow", 0.001), "fast": lambda: run("fast", 0.001)}, 20)
    assert rounds == {"slow": 21, "fast": 21}


@pytest.mark.parametrize("regime, cap_name, fraction", [
    ("decoding_from_memory", "MAX_STREAMED_BYTES", 2),
    ("batch_decoding_from_memory", "MAX_STREAMED_BYTES", 2),
    ("batch_decoding", "MAX_CACHED_BYTES", 1 / 2),
])
def test_decoding_steps_are_timed_over_weights_read_as_a_model_reads_them(monkeypatch, regime, cap_name, fraction):
    """Decoding a model larger than the cache reads every weight from memory at each step, so its timing reads
    weights of twice the largest cache's size in turn, each once a round (at most MAX_STREAMED_BYTES); a few rows of a
    model within the cache read each weight once from it, timed over weights of half its size (at most
    MAX_CACHED_BYTES); the regime's rows at a time (one, or 4) on the process's threads."""
    seen, product = [], F.linear

    def linear(inputs, weight, bias):
        seen.append((inputs.shape[0], weight.data_ptr(), torch.get_num_threads()))
        return product(inputs, weight, bias)

    monkeypatch.setattr(F, "linear", linear)
    weight_bytes = 16 * 8 * 4
    for cache, cap in ((64 << 10, 256 << 20), (1 << 40, 32 << 10)):
        monkeypatch.setattr(kernel_choice, "last_level_cache_bytes", lambda cache=cache: cache)
        monkeypatch.setattr(kernel_choice, cap_name, cap)
        seen.clear()
        kernel_choice.time_kernels(regime, repeats=2, shape=(16, 8))
        weights = int(min(fraction * cache, cap)) // weight_bytes
        assert len(seen) == 3 * weights  # a warm-up round and two timed ones
        assert len({pointer for _, pointer, _ in seen}) == weights
        assert {(rows, threads) for rows, _, threads in seen} == {(kernel_choice.TIMED_ROWS[regime],
                                                                   torch.get_num_threads())}


@pytest.mark.parametrize("from_memory", [False, True])
def test_small_weights_are_timed_over_at_most_max_timed_weights(from_memory):
    """32 MiB of 16 x 16 weights were 32768 products a kernel a round: a 16-wide model's fine-tuning spent 40 s of its
    first step timing them. At most MAX_TIMED_WEIGHTS, distinct, of the shape asked."""
    weights = kernel_choice.weights_read_once((4, 4), from_memory)
    assert len(weights) == kernel_choice.MAX_TIMED_WEIGHTS == 256
    assert {weight.shape for weight in weights} == {(4, 4)}
    assert len({weight.data_ptr() for weight in weights}) == len(weights)


def test_the_largest_cache_is_read_from_sysfs(monkeypatch, tmp_path):
    for index, size in enumerate(["48K", "1024K", "32768K\n", "unknown"]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size)
    monkeypatch.setattr(kernel_choice, "CACHE_SIZES", tmp_path)
    kernel_choice.last_level_cache_bytes.cache_clear()
    try:
        assert kernel_choice.last_level_cache_bytes() == 32 << 20
        monkeypatch.setattr(kernel_choice, "CACHE_SIZES", tmp_path / "absent")  # no sysfs (not Linux)
        kernel_choice.last_level_cache_bytes.cache_clear()
        assert kernel_choice.last_level_cache_bytes() == kernel_choice.DEFAULT_CACHE_BYTES
    finally:
        kernel_choice.last_level_cache_bytes.cache_clear()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_larger_than_the_cache_decodes_in_its_own_regime(family, kernels, onednn_calls, monkeypatch, tmp_path):
    """Every linear layer of a model knows the bytes of fp32 weights a few-row forward reads (when built, loaded,
    and after the vocabulary is resized); few-row products of a model larger than the largest cache
    take the kernel of DECODING_FROM_MEMORY, of a smaller one DECODING's, and the two give the same outputs to fp32
    rounding."""
    model = tiny_lm(family)
    layers = [module for module in model.modules() if isinstance(module, ScratchLinear)]
    working_set = 4 * sum(layer.weight.numel() for layer in layers)
    assert {layer.working_set for layer in layers} == {working_set}
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    assert {module.working_set for module in loaded.modules() if isinstance(module, ScratchLinear)} == {working_set}
    model.resize_token_embeddings(model.config.vocab_size + 8)
    resized = 4 * (working_set // 4 + 8 * model.config.hidden_size)
    assert {module.working_set for module in model.modules() if isinstance(module, ScratchLinear)} == {resized}

    kernels("decoding=native,batch_decoding=native,decoding_from_memory=onednn,batch_decoding_from_memory=onednn,"
            "prefill=native,training=native")
    inputs = lm_inputs(family, batch=1, length=5)
    outputs = {}
    for cache, products in ((resized, 0), (resized - 1, None)):
        monkeypatch.setattr(kernel_choice, "last_level_cache_bytes", lambda cache=cache: cache)
        onednn_calls.clear()
        with torch.no_grad():
            outputs[products] = model(**inputs).logits
        assert (len(onednn_calls) == 0) == (products == 0)  # the products of a model above the cache: oneDNN
    torch.testing.assert_close(outputs[None], outputs[0], atol=1e-5, rtol=1e-5)


def test_decoding_chooses_again_for_each_thread_count(kernels, onednn_calls, monkeypatch):
    """A one-row product's kernels compare differently on one thread and on two (MKL leaves it on one thread where
    oneDNN splits it): a process whose first decoding step ran on one thread, then decodes on two, times again
    there; prefill is chosen per thread count too."""
    timed = []

    def timing(regime, shape=(1536, 384)):  # oneDNN faster on two threads only
        timed.append((regime, torch.get_num_threads()))
        return seconds(0.5) if torch.get_num_threads() == 2 else seconds(2.0)

    monkeypatch.setattr(kernel_choice, "time_kernels", timing)
    kernels("auto")
    layer = ScratchLinear(1024, 2048)
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            for count in (1, 2, 1, 2):
                torch.set_num_threads(count)
                for rows in (1, MANY_ROWS):
                    inputs = torch.ones(rows, 1024)
                    torch.testing.assert_close(layer(inputs), F.linear(inputs, *layer.parameters()))
    finally:
        torch.set_num_threads(threads)
    assert timed == [("decoding", 1), ("prefill", 1), ("decoding", 2), ("prefill", 2)]
    assert [shape[0] for shape in onednn_calls] == [1, MANY_ROWS] * 2  # the products on two threads


def test_decoding_steps_choose_per_weight_shape_prefill_and_training_once(kernels, onednn_calls, monkeypatch):
    """auto: a few-row product's kernels rank by the weight's shape (Intel Xeon, 4 rows from memory: oneDNN 0.76-0.86
    of F.linear's time for GPT-2 small's 768-wide weights, 1.18 for its 768 x 768), so each decoding regime times each
    shape once, at its first product, and each shape takes its own kernel; a weight above MAX_TIMED_WEIGHT_BYTES is
    timed on its first rows. Prefill and training time one layer (TIMED_SHAPE) for every shape."""
    timed = []

    def timing(regime, shape):  # oneDNN faster, but for the 4 x 8 weight
        timed.append((regime, shape))
        return seconds(2.0) if shape == (4, 8) else seconds(0.5)

    monkeypatch.setattr(kernel_choice, "time_kernels", timing)
    monkeypatch.setattr(kernel_choice, "MAX_TIMED_WEIGHT_BYTES", 4 * 8 * 10)  # at most 10 rows of 8 inputs
    kernels("auto")
    small, middle, tall = ScratchLinear(8, 4), ScratchLinear(8, 8), ScratchLinear(8, 16)
    with torch.no_grad():
        for rows in (1, 2, MANY_ROWS, 1):
            for layer in (small, middle, tall):
                inputs = torch.ones(rows, 8)
                torch.testing.assert_close(layer(inputs), F.linear(inputs, *layer.parameters()))
    shaped = [(4, 8), (8, 8), (10, 8)]
    assert timed == [*((kernel_choice.DECODING, shape) for shape in shaped),
                     *((kernel_choice.BATCH_DECODING, shape) for shape in shaped),
                     (kernel_choice.PREFILL, kernel_choice.TIMED_SHAPE)]
    threads = torch.get_num_threads()
    assert {key: kernel for key, kernel in kernel_choice.KERNEL_CHOICES.items() if key[0] == "decoding"} == {
        ("decoding", (4, 8), threads): "native", ("decoding", (8, 8), threads): "onednn",
        ("decoding", (16, 8), threads): "onednn"}
    assert [shape[0] for shape in onednn_calls] == [1, 1, 2, 2, *[MANY_ROWS] * 3, 1, 1]


def test_forced_kernels_are_not_timed_and_a_wrong_value_is_named(kernels, monkeypatch):
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda *args, **kwargs: pytest.fail("timed a forced choice"))
    for choice in ("native", "onednn", "transposed"):
        kernels(choice)
        shaped = {fp32_kernel(regime, (4, 8)) for regime in kernel_choice.REGIMES}
        assert {fp32_kernel(regime) for regime in kernel_choice.REGIMES} == shaped == {choice}
    kernels("fastest")
    with pytest.raises(ValueError, match="HF_SCRATCH_CPU_KERNELS must be one of auto, native, onednn, transposed"):
        ScratchLinear(8, 4)(torch.randn(2, 8))


def test_kernels_forced_per_regime_leave_the_others_timed(kernels, monkeypatch):
    timed = []
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: timed.append(regime) or seconds(2.0))
    kernels(" Prefill=oneDNN, training=native ")
    assert fp32_kernel(kernel_choice.PREFILL) == "onednn"
    assert fp32_kernel(kernel_choice.TRAINING) == "native"
    assert timed == []
    assert fp32_kernel(kernel_choice.DECODING) == "native"  # not named: auto, timed (the BLAS 2x faster here)
    assert timed == [kernel_choice.DECODING]
    regimes = "decoding, decoding_from_memory, batch_decoding, batch_decoding_from_memory, prefill, training"
    for wrong, message in (("prefil=onednn", f"can name the regimes {regimes}; got 'prefil=onednn'"),
                           ("prefill=fast", "must be one of auto, native, onednn, transposed .*got 'prefill=fast'")):
        kernels(wrong)
        with pytest.raises(ValueError, match=message):
            fp32_kernel(kernel_choice.PREFILL)


def test_timing_works_in_inference_mode_and_leaves_the_random_state_alone(kernels):
    kernels("auto")
    layer = ScratchLinear(8, 4)
    state = torch.get_rng_state()
    with torch.inference_mode():
        output = layer(torch.ones(MANY_ROWS, 8))
        one_row = layer(torch.ones(1, 8))  # where decoding takes oneDNN, this weight's shape is timed too
        few_rows = layer(torch.ones(3, 8))
        training = fp32_kernel(kernel_choice.TRAINING)  # its timing runs a backward: it needs autograd back
    assert output.shape == (MANY_ROWS, 4)
    torch.testing.assert_close(one_row, output[:1])
    torch.testing.assert_close(few_rows, output[:3])
    assert torch.equal(torch.get_rng_state(), state)
    regimes = (kernel_choice.DECODING, kernel_choice.PREFILL)
    assert {training, *(fp32_kernel(regime) for regime in regimes)} <= {"native", "onednn"}
    assert fp32_kernel(kernel_choice.BATCH_DECODING) in {"native", "onednn", "transposed"}


def test_timing_works_under_another_default_dtype(kernels):
    """An fp32 layer run after `torch.set_default_dtype(torch.float64)` (native layers run so): the timing drew its
    tensors in the default dtype and oneDNN refused them ("expects float/bfloat16/half/int8/fp8 tensor
    inputDouble"), failing the first training step, prefill and `generate()` on the default (auto) choices."""
    kernels("auto")
    layer = ScratchLinear(8, 4)
    inputs = torch.randn(MANY_ROWS, 8)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        training = layer(inputs)
        with torch.no_grad():
            prefill, few_rows, one_row = layer(inputs), layer(inputs[:3]), layer(inputs[:1])
    finally:
        torch.set_default_dtype(default)
    expected = F.linear(inputs, layer.weight, layer.bias)
    for output in (training, prefill):
        torch.testing.assert_close(output, expected)
    torch.testing.assert_close(few_rows, expected[:3])
    torch.testing.assert_close(one_row, expected[:1])


@pytest.mark.parametrize("how", ["forced", "timed", "chosen before"])
def test_onednn_turned_off_by_the_user_is_not_taken(how, kernels, monkeypatch):
    """`torch.backends.mkldnn.flags(enabled=False)` (a user stepping around a oneDNN bug) turns oneDNN off for
    PyTorch's ops: products took it anyway where it was forced or chosen, and the timing called it."""
    calls = []
    monkeypatch.setattr(linear_kernels, "onednn_linear", lambda *args: calls.append(args) or ONEDNN_LINEAR(*args))
    layer, inputs = ScratchLinear(8, 4), torch.randn(MANY_ROWS, 8)
    kernels("onednn" if how == "forced" else "auto")
    if how == "chosen before":
        monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, shape: seconds(0.5))
        assert fp32_kernel(kernel_choice.TRAINING) == fp32_kernel(kernel_choice.PREFILL) == "onednn"
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)  # as `flags(enabled=False)` sets it
    output = layer(inputs)
    output.sum().backward()
    with torch.no_grad():
        layer(inputs)
    assert calls == []
    torch.testing.assert_close(output, F.linear(inputs, layer.weight, layer.bias))


def test_compiled_layers_neither_time_nor_take_onednn(kernels, onednn_calls, monkeypatch):
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda *args, **kwargs: pytest.fail("timed while compiling"))
    kernels("auto")
    layer = ScratchLinear(8, 4)
    inputs = torch.randn(MANY_ROWS, 8)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(inputs), F.linear(inputs, layer.weight, layer.bias))
    assert onednn_calls == []


@pytest.mark.parametrize("kernel", ["native", "onednn", "transposed"])
@pytest.mark.parametrize("moved_by", ["parametrization", "pruning", "functional_call"])
def test_a_weight_computed_or_swapped_at_each_call_is_the_one_used(moved_by, kernel, kernels):
    """The layer reads its parameters from their dict (a faster read than the attribute); a weight that
    `torch.nn.utils.parametrize` or pruning compute on each read (moved out of the dict) and one that
    `torch.func.functional_call` swaps in are the ones the product uses, with either kernel."""
    kernels(kernel)
    torch.manual_seed(0)
    layer, inputs = ScratchLinear(8, 4), torch.randn(3, 80, 8)
    replacement = {"weight": torch.randn(4, 8), "bias": torch.randn(4)}
    if moved_by == "parametrization":
        torch.nn.utils.parametrize.register_parametrization(layer, "weight", _Doubled())
    elif moved_by == "pruning":
        torch.nn.utils.prune.l1_unstructured(layer, "weight", amount=0.5)
    if moved_by == "functional_call":
        output, weight, bias = torch.func.functional_call(layer, replacement, (inputs,)), *replacement.values()
    else:
        output, weight, bias = layer(inputs), layer.weight, layer.bias  # twice the stored one, or half of it zeros
    torch.testing.assert_close(output, F.linear(inputs, weight, bias), rtol=1e-5, atol=1e-5)


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 2 * weight


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 24), (2, 5, 24), (4, 1, 24), (1, 24)])
def test_the_transposed_product_gives_f_linear_results_in_its_layout(shape, bias):
    torch.manual_seed(0)
    layer = ScratchLinear(24, 40, bias=bias)
    inputs = torch.randn(shape, requires_grad=True)
    output = linear_kernels.transposed_linear(inputs, layer.weight, layer.bias)
    reference = F.linear(inputs, layer.weight, layer.bias)
    assert output.shape == reference.shape and output.is_contiguous()  # F.linear's layout, for the views after it
    torch.testing.assert_close(output, reference, atol=1e-5, rtol=1e-5)
    grad_output = torch.randn_like(output)
    parameters = [inputs, *layer.parameters()]
    for grad, expected in zip(torch.autograd.grad(output, parameters, grad_output),
                              torch.autograd.grad(reference, parameters, grad_output), strict=True):
        torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows, grad, fits, regime", [
    (0, False, True, "decoding"),
    (1, True, True, "decoding"),
    (1, False, False, "decoding_from_memory"),
    (2, False, True, "batch_decoding"),
    (kernel_choice.FEW_ROWS, True, True, "batch_decoding"),
    (8, False, False, "batch_decoding_from_memory"),
    (kernel_choice.FEW_ROWS + 1, False, False, "prefill"),
    (kernel_choice.FEW_ROWS + 1, True, True, "training"),
])
def test_the_regime_of_a_product(rows, grad, fits, regime):
    """One row, 2 to FEW_ROWS rows (each from the cache or from memory, by the model's working set), more rows with or
    without gradients; the rows counted over every leading dimension."""
    cache = kernel_choice.last_level_cache_bytes()
    inputs = torch.zeros(rows, 1, 16).transpose(0, 1)  # (1, rows, 16)
    with torch.set_grad_enabled(grad):
        assert kernel_choice.regime_of(inputs, cache if fits else cache + 1) == regime


@pytest.mark.parametrize("onednn, transposed, expected", [
    (2.0, 0.5, "transposed"),
    (2.0, 0.92, "native"),  # within TRANSPOSED_MARGIN of F.linear: a tie keeps F.linear
    (0.6, 0.7, "onednn"),  # both faster: the fastest
    (0.8, 0.7, "transposed"),
])
def test_a_few_rows_take_the_fastest_kernel_that_beats_f_linear_by_its_margin(onednn, transposed, expected, kernels,
                                                                              onednn_calls, monkeypatch):
    """A decoding step of a few rows (2 to FEW_ROWS) times three kernels: F.linear, oneDNN and the BLAS on the
    transposed product, each taken only where it beats F.linear by its margin; one row and many rows keep their
    own choices (the transposed product is not timed there), and the kernel chosen is the one that runs."""
    monkeypatch.setattr(kernel_choice, "time_kernels", lambda regime, **kwargs: seconds(onednn, transposed))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    transposed_rows, transposed_linear = [], linear_kernels.transposed_linear

    def counting(inputs, weight, bias):
        transposed_rows.append(inputs.shape[0])
        return transposed_linear(inputs, weight, bias)

    monkeypatch.setattr(scratch_linear, "transposed_linear", counting)
    kernels("auto")
    layer = ScratchLinear(8, 4)
    with torch.no_grad():
        for rows in (1, 2, kernel_choice.FEW_ROWS, MANY_ROWS):
            inputs = torch.randn(rows, 8)
            torch.testing.assert_close(layer(inputs), F.linear(inputs, layer.weight, layer.bias))
    assert fp32_kernel(kernel_choice.BATCH_DECODING, layer.weight.shape) == expected
    assert transposed_rows == ([2, kernel_choice.FEW_ROWS] if expected == "transposed" else [])
    few = [2, kernel_choice.FEW_ROWS] if expected == "onednn" else []
    one_and_many = [1, MANY_ROWS] if onednn < 0.9 else []  # one row and prefill: oneDNN within their margins
    assert sorted(shape[0] for shape in onednn_calls) == sorted(one_and_many + few)


OVERLAPPING_TIMINGS = """
import threading, torch
from hf_scratch_transformer import kernel_choice
torch.set_num_threads(2)
first_in, second_in = threading.Event(), threading.Event()
def first_timing():
    with kernel_choice.one_thread():
        first_in.set()
        second_in.wait(10)
first = threading.Thread(target=first_timing)
first.start()
first_in.wait(10)
with kernel_choice.one_thread():
    second_in.set()
    first.join(10)  # the first timing ends inside the second
print(torch.get_num_threads())
"""


def test_overlapping_timings_of_two_threads_restore_the_thread_count():
    """A timing runs on one thread (`one_thread`). Until the process's first parallel region the count is the
    process's: a second thread's timing that began inside the first's took that 1 for the count to restore, and left
    the process on one thread for good. A fresh interpreter, as the first steps of a process's threads."""
    result = subprocess.run([sys.executable, "-c", OVERLAPPING_TIMINGS], capture_output=True, text=True, check=True)
    assert result.stdout.split()[-1] == "2"
