"""`torch.compile(fullgraph=True)`: a training step of each family, and decoding with a static cache.
Compilation takes tens of seconds on CPU, so these are marked slow; CI runs them."""

import os
import tempfile
import warnings

import pytest
import torch
import torch.nn.functional as F
from tiny_models import FAMILIES, lm_inputs, tiny_config, tiny_lm

from hf_scratch_transformer import kernel_choice
from hf_scratch_transformer.compiled_decoding import (
    cpu_compile_config,
    cpu_inductor_is_sound,
    inductor_cache_of_its_own_when_emulating,
)
from hf_scratch_transformer.scratch_layers import ScratchFeedForward
from hf_scratch_transformer.scratch_linear import ScratchLinear

# What the inductor of PyTorch 2.11-2.12 fails (compiled_decoding.FIRST_SOUND_CPU_INDUCTOR): cpu_compile_config() warns
needs_a_sound_cpu_inductor = pytest.mark.skipif(not cpu_inductor_is_sound(),
                                                reason=f"PyTorch {torch.__version__}'s inductor: see compiled_decoding")

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def slow_blas_rows(monkeypatch):
    """A CPU whose BLAS reads one row slowly (the AMD EPYCs), where traced one-row products are row dots: whatever
    CPU the tests run on."""
    monkeypatch.setattr(kernel_choice, "blas_reads_rows_slowly", lambda: True)


def _assert_compiled_step_matches_eager(eager_model, compiled_model, inputs: dict) -> None:
    """One training step (loss and gradients) of `compiled_model` under `torch.compile(fullgraph=True)`, against
    the same step of its eager twin."""
    compiled = torch.compile(compiled_model, fullgraph=True)  # a graph break would raise
    _step_both(eager_model, compiled, inputs)
    _assert_same_gradients(eager_model, compiled_model)


def _step_both(eager_model, compiled, inputs: dict) -> None:
    """The loss of `compiled` (a compiled twin) equal to the eager model's, and both backward passes run."""
    eager_loss, compiled_loss = eager_model(**inputs).loss, compiled(**inputs).loss
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-5, rtol=1e-5)
    eager_loss.backward()
    compiled_loss.backward()


def _assert_same_gradients(eager_model, compiled_model) -> None:
    for (name, a), (_, b) in zip(eager_model.named_parameters(), compiled_model.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_training_step_matches_eager(family):
    overrides = {
        "decoder": dict(position_embedding_type="rope", num_key_value_heads=2),
        "encoder": dict(sparse_prediction=True),  # boolean indexing of the labelled positions, in the graph
        "seq2seq": {},
    }[family]
    eager_model, compiled_model = tiny_lm(family, **overrides).train(), tiny_lm(family, **overrides).train()
    inputs = lm_inputs(family)
    if family == "encoder":
        inputs["labels"][:, ::2] = -100
    _assert_compiled_step_matches_eager(eager_model, compiled_model, inputs)


def test_a_dynamic_compiled_rotary_training_step_takes_a_second_length():
    """`Trainer(torch_compile=True)` recompiles with a dynamic length at the second batch length: inductor's backward
    fixed the strides of the queries split from one rotary pass over the fused heads at the length it compiled
    with, so the next length's backward failed an `assert_size_stride` (native Llama, rotating apart, trained on)."""
    rope = dict(position_embedding_type="rope", num_key_value_heads=2)
    eager_model, compiled_model = tiny_lm("decoder", **rope).train(), tiny_lm("decoder", **rope).train()
    compiled = torch.compile(compiled_model, dynamic=True)
    for length in (9, 7):
        inputs = lm_inputs("decoder", length=length)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        inputs["attention_mask"][1, -2:] = 0  # a padding mask: sdpa's CPU flash kernel, whose backward reads them
        _step_both(eager_model, compiled, inputs)
    _assert_same_gradients(eager_model, compiled_model)


@pytest.mark.parametrize("family", ["encoder", "seq2seq"])
def test_compiled_checkpointed_training_step_of_a_bidirectional_stack(family):
    """Gradient checkpointing on: an encoder stack warned about the config's `use_cache` (it has no cache), and the
    logging call broke the graph."""
    eager_model, compiled_model = tiny_lm(family).train(), tiny_lm(family).train()
    compiled_model.activation_checkpointing_enable()
    inputs = lm_inputs(family)
    _assert_compiled_step_matches_eager(eager_model, compiled_model, inputs)


@pytest.mark.parametrize("batch", [1, 2], ids=["batch-1", "batch-2"])  # batch 1: products of one row (row_dot)
@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_compiled_static_cache_decoding_gives_the_same_tokens(family, batch, slow_blas_rows):
    model = tiny_lm(family, position_embedding_type="rope")
    ids = torch.randint(3, 99, (batch, 5), generator=torch.Generator().manual_seed(0))
    reference = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    compile_config = cpu_compile_config()
    compile_config.fullgraph = True  # a graph break would raise
    compiled = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, cache_implementation="static",
                              compile_config=compile_config)
    assert hasattr(model, "_compiled_call"), "generate() did not compile the forward"
    assert torch.equal(compiled, reference)


@needs_a_sound_cpu_inductor
@pytest.mark.parametrize("family, positions", [("decoder", "learned"), ("decoder", "sinusoidal"),
                                               ("seq2seq", "learned")])
def test_compiled_decoding_past_the_absolute_positions_names_the_generation_lengths(family, positions):
    """The compiled step reads no values back, and a step past the table failed in inductor's code ("index out of
    bounds", a device-side assert on a GPU): each step's positions are checked before it runs. Left padding: the
    positions generate() makes from the mask, not the sequence's length, decide; up to the last position it decodes."""
    model = tiny_lm(family, position_embedding_type=positions, max_position_embeddings=16)
    ids = torch.randint(3, 99, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row: its positions run 2 behind the other's
    compiled = dict(cache_implementation="static", compile_config=cpu_compile_config(), do_sample=False)
    # Positions 0-15 read: the prompt's 5 (seq2seq: the decoder's start token), then each new token but the last
    fitting = 16 if family == "seq2seq" else 16 - 5 + 1
    output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=fitting, min_new_tokens=fitting,
                            **compiled)
    assert output.shape[1] == 17 and hasattr(model, "_compiled_call"), "generate() did not compile the forward"
    with pytest.raises(ValueError, match=r"reaches position 16.*`max_new_tokens`"):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=fitting + 1, min_new_tokens=fitting + 1,
                       **compiled)


@needs_a_sound_cpu_inductor
@pytest.mark.parametrize("slow_rows", [True, False], ids=["blas-slow-over-a-row", "blas-at-a-sums-rate"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_compiled_fp32_product_of_one_row_is_a_row_dot_the_others_a_linear(bias, slow_rows, monkeypatch):
    """Traced by torch.compile, a one-row fp32 CPU product is written as a sum of products, which inductor turns into
    a loop reading the weight once (docs/performance.md), where the BLAS reads one row slowly; where it reads it at a
    plain sum's rate (an Intel Xeon), and for more rows, the product stays `F.linear`. Values and gradients equal the
    eager layer's."""
    monkeypatch.setattr(kernel_choice, "blas_reads_rows_slowly", lambda: slow_rows)
    layer = ScratchLinear(48, 40, bias=bias)
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return graph_module.forward

    for shape in [(1, 48), (1, 1, 48), (3, 48)]:
        inputs = torch.randn(shape, requires_grad=True)
        compiled = torch.compile(layer, backend=capture, fullgraph=True)(inputs)
        eager = F.linear(inputs, layer.weight, layer.bias)
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad(compiled.sum(), (inputs, layer.weight))
        expected = torch.autograd.grad(eager.sum(), (inputs, layer.weight))
        for grad, reference in zip(grads, expected, strict=True):
            torch.testing.assert_close(grad, reference, atol=1e-5, rtol=1e-5)
        row_dot = shape[-2] == 1 and slow_rows
        assert ("linear" in graphs[-1], ".sum(" in graphs[-1]) == (not row_dot, row_dot), graphs[-1]


@needs_a_sound_cpu_inductor
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_a_compiled_feed_forward_of_one_row_writes_its_activation_out_for_the_down_projection(activation,
                                                                                                 slow_blas_rows):
    """Inlined into the down projection's row dot, the activation would be computed again for every row of its weight
    (an exact GELU's erf, 1536 x 384 times a layer): the row dot reads it written out by an identity product, an
    extern kernel (`linear_kernels.materialized`); the up projection's row dot reads its input as it comes. More rows
    have no row dot and no identity product. Values and gradients equal the eager block's."""
    torch.manual_seed(0)
    feed_forward = ScratchFeedForward(tiny_config("decoder", hidden_act=activation))
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return graph_module.forward

    for rows in (1, 3):
        inputs = torch.randn(1, rows, feed_forward.up_proj.in_features, requires_grad=True)
        compiled = torch.compile(feed_forward, backend=capture, fullgraph=True)(inputs)
        eager = feed_forward(inputs)
        torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
        grads = torch.autograd.grad(compiled.sum(), (inputs, feed_forward.down_proj.weight))
        expected = torch.autograd.grad(eager.sum(), (inputs, feed_forward.down_proj.weight))
        for grad, reference in zip(grads, expected, strict=True):
            torch.testing.assert_close(grad, reference, atol=1e-5, rtol=1e-5)
        assert graphs[-1].count("torch.mm(") == (rows == 1), graphs[-1]
        assert graphs[-1].count(".sum(") == 2 * (rows == 1), graphs[-1]


def test_export_and_a_dynamic_row_count_keep_the_linear():
    """`torch.export` keeps the linear layers for whatever runs its graph; a `mark_dynamic` row count is not
    specialized to one row (that would be an error)."""
    layer = ScratchLinear(16, 8)
    one_row = torch.randn(1, 16)
    assert "linear" in str(torch.export.export(layer, (one_row,)).graph)
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module.code)
        return graph_module.forward

    rows = torch.randn(3, 16)
    torch._dynamo.mark_dynamic(rows, 0)
    torch.testing.assert_close(torch.compile(layer, backend=capture)(rows), layer(rows))
    assert "linear" in graphs[-1] and ".sum(" not in graphs[-1], graphs[-1]


@pytest.mark.parametrize("blas, expected", [(1.4, True), (1.25, False), (1.0, False)])
def test_the_row_dot_is_taken_where_the_blas_reads_a_row_30_percent_slower_than_a_sum(monkeypatch, blas, expected):
    """`blas_reads_rows_slowly`: F.linear over one row against a plain `sum` over the same weights, timed once per
    process and thread count (AMD EPYCs: 2-3x a sum's time; an Intel Xeon: 1.0x, where the row dot gained nothing)."""
    timed = []
    monkeypatch.setattr(kernel_choice, "time_row_reads", lambda: timed.append(1) or (blas, 1.0))
    kernel_choice.clear_kernel_choices()
    try:
        assert kernel_choice.blas_reads_rows_slowly() is expected
        assert kernel_choice.blas_reads_rows_slowly() is expected
        assert timed == [1]
    finally:
        kernel_choice.clear_kernel_choices()


def test_timing_row_reads_measures_both_and_leaves_the_random_state_alone():
    state = torch.get_rng_state()
    with torch.inference_mode():
        blas, plain_sum = kernel_choice.time_row_reads(repeats=1)
    assert blas > 0 and plain_sum > 0
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("setting", ["emulated", "emulated, default written", "cache named", "machine's own"])
def test_an_emulated_instruction_set_compiles_into_a_cache_of_its_own(setting, monkeypatch, tmp_path):
    """Under ATEN_CPU_CAPABILITY inductor compiles for that instruction set, and its cache would hand those kernels to
    runs on the machine's own (nan losses, a corrupted heap): such a run gets a cache of its own, which inductor
    uses, also where inductor already wrote its default folder into TORCHINDUCTOR_CACHE_DIR (importing ours does);
    a cache the user named, and runs without the emulation, are left alone."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    if setting != "machine's own":
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")
    if setting != "emulated":
        named = str(tmp_path) if setting == "cache named" else default_cache_dir()
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", named)
    folder = inductor_cache_of_its_own_when_emulating()
    own = os.path.join(tempfile.gettempdir(), "torchinductor_avx2")
    expected = {"cache named": str(tmp_path), "machine's own": default_cache_dir()}.get(setting, own)
    assert folder == (own if setting.startswith("emulated") else None)
    assert cache_dir() == os.path.abspath(expected)  # where inductor compiles to


def test_the_cpu_compile_config_warns_of_a_pytorch_whose_inductor_fails_our_steps(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.12.0+cu130")
    with pytest.warns(UserWarning, match=r"PyTorch 2\.12\.0\+cu130's inductor fails .* from PyTorch 2\.13"):
        cpu_compile_config()
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu_compile_config().options == {"cpp_wrapper": True}
