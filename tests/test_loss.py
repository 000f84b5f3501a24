"""`scratch_loss`: the language-model losses give transformers' values and gradients (`ForCausalLMLoss`,
`ForMaskedLMLoss`), on the CPU cross-entropy that reuses its log-probabilities."""

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import FAMILIES, lm_inputs, tiny_config, tiny_lm
from transformers.loss.loss_utils import ForCausalLMLoss, ForMaskedLMLoss

import hf_scratch_transformer as hst
from hf_scratch_transformer import scratch_loss, training
from hf_scratch_transformer.scratch_loss import cross_entropy, lm_loss

VOCAB = 11


@pytest.fixture(autouse=True)
def every_size_takes_ours(monkeypatch):
    """The tests' logits are tiny: below `MIN_LOGITS` the loss is `F.cross_entropy`, so force ours."""
    monkeypatch.setattr(scratch_loss, "MIN_LOGITS", 0)


def _logits_and_labels(rows: int, ignored: list[bool], dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows, VOCAB, generator=generator)).to(dtype)
    labels = torch.randint(0, VOCAB, (rows,), generator=generator)
    labels[torch.tensor(ignored[:rows] + [False] * (rows - len(ignored)))] = -100
    return logits, labels


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 12), ignored=st.lists(st.booleans(), max_size=12),
       reduction=st.sampled_from(["mean", "sum"]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       smoothing=st.sampled_from([0.0, 0.1, 0.35, 1.0]))
def test_cross_entropy_matches_pytorch(rows, ignored, reduction, dtype, smoothing):
    logits, labels = _logits_and_labels(rows, ignored, dtype)
    ours_input, reference_input = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = cross_entropy(ours_input, labels, reduction=reduction, label_smoothing=smoothing)
    reference = F.cross_entropy(reference_input.float(), labels, reduction=reduction, label_smoothing=smoothing)
    if (labels == -100).all() and reduction == "mean":
        assert ours.isnan() and reference.isnan()  # nothing counted: 0 / 0, as PyTorch says
    else:
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-6)
    # Ignored rows get no gradient even from that nan mean (PyTorch's are zeros): ours were nan, which an optimizer
    # step wrote into every weight.
    ours.backward()
    reference.backward()
    assert ours_input.grad.dtype == dtype
    torch.testing.assert_close(ours_input.grad, reference_input.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_chunk_of_rows_is_pytorchs_and_the_logits_are_left_alone(dtype, layout, smoothing, monkeypatch):
    """Wide rows (the vectorized kernel), in either memory order, cut into chunks of 3 rows and a last of 1 (logits
    that are not fp32 go through the loss a chunk at a time): loss and gradient are `F.cross_entropy`'s of the fp32
    logits to fp32 rounding, and the caller's logits are unchanged by forward and backward (fp32 logits are the
    caller's tensor itself, not a copy)."""
    monkeypatch.setattr(scratch_loss, "CHUNK_BYTES", 3 * 4 * 1000)
    logits = (3 * torch.randn(40, 1000, generator=torch.Generator().manual_seed(0))).to(dtype)
    if layout == "columns":
        logits = logits.t().contiguous().t()
    labels = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1))
    labels[[0, 4, 39]] = -100  # in the first chunk, inside one, and the last
    logits.requires_grad_()
    before = logits.detach().clone()
    reference_input = before.float().requires_grad_()
    reference = F.cross_entropy(reference_input, labels, reduction="sum", label_smoothing=smoothing)
    total = scratch_loss._SummedCrossEntropy.apply(logits, labels, -100, smoothing)
    torch.testing.assert_close(total, reference)
    total.backward()
    reference.backward()
    assert torch.equal(logits.detach(), before)
    assert logits.grad.dtype == dtype and logits.grad.stride() == logits.stride()
    torch.testing.assert_close(logits.grad, reference_input.grad.to(dtype))  # within the dtype's rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunks_change_nothing_bit_for_bit(dtype, monkeypatch):
    """The loss and gradient from chunks of rows are those of the whole matrix in one chunk, bit for bit: every
    operation works row by row. Forward and backward each compute the log-probabilities one chunk at a time."""
    logits = (3 * torch.randn(40, 1000, generator=torch.Generator().manual_seed(0))).to(dtype)
    labels = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1))
    labels[7] = -100
    log_softmax, rows_seen = torch.log_softmax, []

    def counting(rows, *args, **kwargs):
        rows_seen.append(len(rows))
        return log_softmax(rows, *args, **kwargs)

    monkeypatch.setattr(torch, "log_softmax", counting)
    results = []
    for chunk_rows in (40, 3):
        monkeypatch.setattr(scratch_loss, "CHUNK_BYTES", chunk_rows * 4 * 1000)
        x = logits.clone().requires_grad_()
        total = scratch_loss._SummedCrossEntropy.apply(x, labels, -100, 0.1)
        total.backward()
        results.append((total, x.grad))
    assert rows_seen == [40, 40] + ([3] * 13 + [1]) * 2
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_logits_of_ignored_rows_leave_pytorchs_loss(value, dtype, smoothing, reduction):
    """An ignored row's logits may be non-finite (fp16 overflow, or nan at padding): PyTorch's loss skips the row,
    ours was nan (0 x its nan or inf row loss). Gradients are PyTorch's, nan in those rows included."""
    logits, labels = _logits_and_labels(6, [True, False, True], dtype)
    logits[0, 3] = value
    logits[2] = value
    ours_input, reference_input = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = cross_entropy(ours_input, labels, reduction=reduction, label_smoothing=smoothing)
    reference = F.cross_entropy(reference_input.float(), labels, reduction=reduction, label_smoothing=smoothing)
    assert reference.isfinite()
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-6)
    ours.backward()
    reference.backward()
    torch.testing.assert_close(ours_input.grad, reference_input.grad, atol=1e-6, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_float64_logits_keep_float64(reduction, smoothing):
    """A float64 model's loss was rounded to fp32 (widened with `.float()`, as transformers' losses do)."""
    logits, labels = _logits_and_labels(6, [True], torch.float64)
    ours_input, reference_input = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = cross_entropy(ours_input, labels, reduction=reduction, label_smoothing=smoothing)
    reference = F.cross_entropy(reference_input, labels, reduction=reduction, label_smoothing=smoothing)
    assert ours.dtype == torch.float64
    torch.testing.assert_close(ours, reference, atol=1e-12, rtol=1e-12)
    ours.backward()
    reference.backward()
    torch.testing.assert_close(ours_input.grad, reference_input.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("num_items_in_batch", [None, 7, torch.tensor(5)])
@pytest.mark.parametrize("shift, reference", [(True, ForCausalLMLoss), (False, ForMaskedLMLoss)])
def test_lm_loss_matches_transformers(shift, reference, num_items_in_batch):
    logits = torch.randn(2, 6, VOCAB, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    labels[0, :2] = -100
    ours = lm_loss(logits, labels, VOCAB, num_items_in_batch=num_items_in_batch, shift=shift)
    expected = reference(logits, labels, VOCAB, num_items_in_batch=num_items_in_batch)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("num_items_in_batch", [None, 0])
def test_a_batch_with_every_label_ignored_gets_transformers_zero_gradients(num_items_in_batch):
    """Trainer's micro-batch whose labels are all -100 (completions truncated away), counted (0 items in the whole
    step) or not (the mean): the loss is nan, as transformers', and the gradients zeros, not nan."""
    logits = torch.randn(2, 6, VOCAB, generator=torch.Generator().manual_seed(0))
    labels = torch.full((2, 6), -100)
    gradients = []
    for loss_function in (partial(lm_loss, shift=True), ForCausalLMLoss):
        inputs = logits.clone().requires_grad_()
        loss = loss_function(inputs, labels, VOCAB, num_items_in_batch=num_items_in_batch)
        assert loss.isnan()
        loss.backward()
        gradients.append(inputs.grad)
    assert torch.equal(gradients[0], gradients[1]) and not gradients[0].any()


def test_given_shift_labels_are_used_as_they_are():
    logits = torch.randn(2, 5, VOCAB)
    labels, shift_labels = torch.randint(0, VOCAB, (2, 5)), torch.randint(0, VOCAB, (2, 5))
    ours = lm_loss(logits, labels, VOCAB, shift_labels=shift_labels, shift=True)
    torch.testing.assert_close(ours, ForCausalLMLoss(logits, labels, VOCAB, shift_labels=shift_labels))


def test_double_backward_names_the_way_out():
    logits, labels = _logits_and_labels(6, [True], torch.float32)
    x = logits.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="ForCausalLMLoss"):
        torch.autograd.grad(cross_entropy(x, labels), x, create_graph=True)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_logits_take_pytorch_with_the_same_values(dtype, smoothing, monkeypatch):
    """Below the cut-off `F.cross_entropy` (whose fixed cost is lower) gives the loss: same values and gradients,
    and it can be differentiated twice. At the cut-off, ours (which cannot)."""
    logits, labels = _logits_and_labels(9, [False, True], dtype)
    monkeypatch.setattr(scratch_loss, "MIN_LOGITS", 0)
    ours_input = logits.clone().requires_grad_()
    ours_loss = cross_entropy(ours_input, labels, label_smoothing=smoothing)
    ours_grad, = torch.autograd.grad(ours_loss, ours_input)
    monkeypatch.setattr(scratch_loss, "MIN_LOGITS", logits.numel() + 1)
    small_input = logits.clone().requires_grad_()
    small_loss = cross_entropy(small_input, labels, label_smoothing=smoothing)
    small_grad, = torch.autograd.grad(small_loss, small_input, create_graph=True)
    assert small_grad.requires_grad  # PyTorch's, which has a double backward
    torch.testing.assert_close(small_loss, ours_loss.detach())
    torch.testing.assert_close(small_grad, ours_grad, atol=1e-6, rtol=1e-5)
    monkeypatch.setattr(scratch_loss, "MIN_LOGITS", logits.numel())
    with pytest.raises(RuntimeError, match="ForCausalLMLoss"):
        torch.autograd.grad(cross_entropy(small_input, labels, label_smoothing=smoothing), small_input,
                            create_graph=True)


def test_the_training_scripts_smoothed_objective_takes_ours():
    """`training.label_smoothed_loss` (the train scripts' `--label-smoothing`, the seq2seq recipe's 0.1) computes
    PyTorch's label-smoothed cross-entropy through ours, whose backward names itself when differentiated twice."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, VOCAB, generator=generator, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, 6), generator=generator)
    labels[0, 0] = -100
    loss = training.label_smoothed_loss(logits, labels, 0.1, shift=False)
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)
    with pytest.raises(RuntimeError, match="ForCausalLMLoss"):
        torch.autograd.grad(loss, logits, create_graph=True)


def test_torch_func_grad_matches_pytorch():
    logits, labels = _logits_and_labels(6, [False, True], torch.float32)
    torch.testing.assert_close(torch.func.grad(lambda x: cross_entropy(x, labels))(logits),
                               torch.func.grad(lambda x: F.cross_entropy(x, labels))(logits), atol=1e-6, rtol=1e-5)


def test_second_backward_through_a_retained_graph_raises():
    """Backward reuses the saved log-probabilities: a second pass must fail loudly, never give wrong gradients."""
    logits, labels = _logits_and_labels(4, [], torch.float32)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("family", FAMILIES)
def test_models_use_it_and_a_set_loss_function_wins(family, monkeypatch):
    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return cross_entropy(*args, **kwargs)

    monkeypatch.setattr(scratch_loss, "cross_entropy", counting)
    model = tiny_lm(family)
    inputs = lm_inputs(family)
    loss = model(**inputs).loss
    assert len(calls) == 1
    expected_type = {"decoder": ForCausalLMLoss}.get(family, ForMaskedLMLoss)
    model.loss_function = expected_type
    torch.testing.assert_close(model(**inputs).loss, loss, atol=1e-6, rtol=1e-6)
    model.loss_function = lambda **kwargs: torch.tensor(42.0)
    assert model(**inputs).loss.item() == 42.0


def test_a_float64_token_classifier_loss_is_float64():
    """transformers' `ForTokenClassification` widens with `.float()`, which rounded a float64 model's loss to fp32;
    native BERT's token classifier keeps float64."""
    model = hst.ScratchEncoderForTokenClassification(tiny_config("encoder", num_labels=3)).double().eval()
    inputs = lm_inputs("encoder")
    labels = inputs["labels"] % 3
    labels[0, :2] = -100
    output = model(input_ids=inputs["input_ids"], labels=labels)
    assert output.loss.dtype == torch.float64
    expected = F.cross_entropy(output.logits.reshape(-1, 3), labels.reshape(-1))
    torch.testing.assert_close(output.loss, expected, atol=1e-12, rtol=0)


def test_label_smoothing_out_of_range_is_named():
    logits, labels = _logits_and_labels(4, [], torch.float32)
    for smoothing in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"`label_smoothing` must be between 0.0 and 1.0, got {smoothing}"):
            cross_entropy(logits, labels, label_smoothing=smoothing)


def test_unsupported_reduction_is_named():
    logits, labels = _logits_and_labels(3, [], torch.float32)
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(logits, labels, reduction="none")
