"""The sdpa back-end's eager math on CPU (`scratch_attention_kernel`). The bf16 training choice: both kernels give
the same attention and gradients to bf16 rounding, forced either way, in a layer and in whole models; the eager math
is taken only where the choice applies; the choice is made once per process and can be forced. With attention
dropout: the eager math and its dropout mask, as the eager back-end draws it."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiny_models import FAMILIES, lm_inputs, tiny_lm
from tiny_native import llama

from hf_scratch_transformer import scratch_attention, scratch_attention_kernel
from hf_scratch_transformer.conversion import from_hf
from hf_scratch_transformer.scratch_attention_kernel import CHOSEN, EAGER_MAX_KEYS, bf16_training_kernel


@pytest.fixture
def attention(force_choice):
    """`attention(choice)` sets HF_SCRATCH_CPU_ATTENTION for this test; the choice is made afresh on both sides."""
    return lambda choice: force_choice(scratch_attention_kernel.ATTENTION_VARIABLE, CHOSEN.clear, choice)


@pytest.fixture
def eager_calls(monkeypatch):
    """The query shapes of every eager computation the sdpa back-end hands over to."""
    calls = []
    eager = scratch_attention.eager_attention_forward

    def counting(module, query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return eager(module, query, *args, **kwargs)

    monkeypatch.setattr(scratch_attention, "eager_attention_forward", counting)
    return calls


class Layer(torch.nn.Module):
    """What the attention functions read of their module."""

    def __init__(self, heads: int, kv_heads: int, causal: bool):
        super().__init__()
        self.num_key_value_groups, self.is_causal = heads // kv_heads, causal


def sdpa_attention(layer, query, key, value, mask):
    """The sdpa back-end's output (B, T, H, D) and the gradients of query, key, value for a fixed output grad."""
    leaves = [tensor.detach().requires_grad_() for tensor in (query, key, value)]
    output, _ = scratch_attention.sdpa_attention_forward(layer, *leaves, mask, scaling=query.shape[-1] ** -0.5)
    grad_output = torch.linspace(-1, 1, output.numel()).reshape(output.shape).to(output.dtype)
    return output, torch.autograd.grad(output, leaves, grad_output)


def assert_equal_to_bf16_rounding(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Two bf16 computations of a sum differ by a few units in the last place of its largest terms, not of its result:
    an element that nearly cancels may differ by more than its own size allows (a key gradient of 0.955 in fp32 came
    out 0.92 and 0.99, in a tensor reaching 6.8). The terms here are of order 1 (normal inputs, output gradients in
    [-1, 1]), so the tolerance is 2^-4 of the larger of 1 and the tensor's largest value: in 12,000 random tensors the
    largest difference was under a quarter of it; a wrong mask or scale differs by a sizeable fraction of the values."""
    torch.testing.assert_close(actual, expected, rtol=0, atol=2**-4 * max(1.0, expected.abs().max().item()))


MASKS = ("causal, no mask (sdpa's own flag)", "causal over a cached prefix", "causal and padded", "padded", "none",
         "causal and padded past the first queries' keys")


@pytest.mark.parametrize("masking", MASKS)
# The fixture only sets the choice, which each example sets again.
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.integers(1, 3),
    heads_and_groups=st.sampled_from([(2, 1), (4, 1), (4, 2), (4, 4)]),
    query_length=st.integers(1, 24),
    prefix=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
@example(batch=2, heads_and_groups=(4, 4), query_length=24, prefix=4, seed=34569)  # failed a per-element tolerance
def test_both_kernels_give_the_same_attention_and_gradients(
    attention, masking, batch, heads_and_groups, query_length, prefix, seed
):
    heads, groups = heads_and_groups
    causal = masking.startswith("causal")
    # Keys beyond the queries: a cache prefix (causal), a longer source (cross-attention).
    key_length = query_length + (0 if masking == MASKS[0] else prefix)
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, query_length, 16, generator=generator).bfloat16()
    key, value = (torch.randn(batch, heads // groups, key_length, 16, generator=generator).bfloat16() for _ in "kv")
    mask = None
    if masking not in (MASKS[0], "none"):
        mask = torch.ones(batch, 1, query_length, key_length, dtype=torch.bool)
        if causal:
            mask &= scratch_attention_kernel.causal_mask(query_length, key_length, query.device)
        if masking == MASKS[-1]:  # the first queries attend to no key: sdpa gives them zeros
            mask[0, ..., : prefix + (query_length + 1) // 2] = False
        elif "padded" in masking:
            mask[0, ..., : torch.randint(0, key_length, (), generator=generator)] = False  # left padding
            mask[..., -1] = True  # every query keeps a key
    layer = Layer(heads, heads // groups, causal)
    results = {}
    for choice in ("sdpa", "eager"):
        attention(choice)
        results[choice] = sdpa_attention(layer, query, key, value, mask)
    (output, grads), (expected, expected_grads) = results["eager"], results["sdpa"]
    assert_equal_to_bf16_rounding(output, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert_equal_to_bf16_rounding(grad, expected_grad)


def test_eager_math_only_where_the_choice_applies(attention, eager_calls):
    layer = Layer(4, 4, causal=True)
    short, long = (torch.randn(2, 4, length, 16) for length in (EAGER_MAX_KEYS, EAGER_MAX_KEYS + 1))
    attention("eager")
    sdpa_attention(layer, short.bfloat16(), short.bfloat16(), short.bfloat16(), None)
    assert eager_calls == [(2, 4, EAGER_MAX_KEYS, 16)]
    sdpa_attention(layer, long.bfloat16(), long.bfloat16(), long.bfloat16(), None)  # too many keys
    sdpa_attention(layer, short, short, short, None)  # fp32
    layer.eval()  # inference: nothing to differentiate, and flash's forward is the faster
    sdpa_attention(layer, short.bfloat16(), short.bfloat16(), short.bfloat16(), None)
    assert len(eager_calls) == 1
    layer.train()
    with torch.no_grad():  # training mode decides: a reentrant checkpoint's first forward has no gradients
        scratch_attention.sdpa_attention_forward(layer, *(short.bfloat16(),) * 3, None, scaling=0.25)
    assert len(eager_calls) == 2
    attention("sdpa")
    sdpa_attention(layer, short.bfloat16(), short.bfloat16(), short.bfloat16(), None)
    assert len(eager_calls) == 2


def left_padded(inputs: dict) -> dict:
    """`inputs` of a decoder with the second sequence's first 3 tokens padding (masked; the last pad position
    predicts the first real token, as transformers' collators label a left-padded batch)."""
    attention_mask = torch.ones_like(inputs["input_ids"])
    attention_mask[1, :3] = 0
    labels = inputs["labels"].masked_fill(attention_mask == 0, -100)
    return inputs | {"attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize("family", [*FAMILIES, "decoder, left-padded"])
def test_a_bf16_training_step_is_the_same_with_either_kernel(family, attention, eager_calls):
    """Left-padded, the pad positions attend to no key: the eager math spread them over every key (the future
    included), and the loss moved with the timed kernel; it gives them sdpa's zeros."""
    padded = family.endswith("left-padded")
    family = family.split(",")[0]
    model = tiny_lm(family).train()
    inputs = left_padded(lm_inputs(family)) if padded else lm_inputs(family)
    results = {}
    for choice in ("sdpa", "eager"):
        attention(choice)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        results[choice] = loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]
    layers = {"decoder": 2, "encoder": 2, "seq2seq": 6}[family]  # seq2seq: encoder, decoder self and cross
    assert len(eager_calls) == layers
    (loss, grads), (expected_loss, expected_grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(loss, expected_loss, atol=1e-2, rtol=1e-2)
    for grad, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected, atol=2e-2, rtol=5e-2)


def test_the_choice_is_made_once_per_timed_length_and_can_be_forced(attention, monkeypatch):
    """Timed at 128 keys for sequences of up to 128, at 256 for longer ones up to EAGER_MAX_KEYS, each once: a
    machine whose eager math wins only at short sequences keeps it there."""
    attention("auto")
    timings = []

    def timed(length):
        timings.append(length)
        return 1.0, 0.5 if length == 128 else 1.2  # sdpa, eager: eager at half the time at 128, slower at 256

    monkeypatch.setattr(scratch_attention_kernel, "time_kernels", timed)
    assert [bf16_training_kernel(keys) for keys in (100, 200, 64, 129, 256, 128)] == [
        "eager", "sdpa", "eager", "sdpa", "sdpa", "eager"]
    assert timings == [128, 256]
    assert CHOSEN == {128: "eager", 256: "sdpa"}
    for choice in ("sdpa", "eager"):
        attention(choice)
        assert bf16_training_kernel(32) == bf16_training_kernel(EAGER_MAX_KEYS) == choice
    assert timings == [128, 256]
    attention("flash")
    with pytest.raises(ValueError, match="HF_SCRATCH_CPU_ATTENTION must be one of auto, sdpa, eager; got 'flash'"):
        bf16_training_kernel(32)


@pytest.mark.parametrize("eager_seconds, expected", [(0.85, "eager"), (0.95, "sdpa")])
def test_the_eager_math_must_be_10_percent_faster_to_be_taken(attention, monkeypatch, eager_seconds, expected):
    """On a tie, or within noise, PyTorch's own kernel is kept (EAGER_MARGIN)."""
    attention("auto")
    monkeypatch.setattr(scratch_attention_kernel, "time_kernels", lambda length: (1.0, eager_seconds))
    assert bf16_training_kernel(EAGER_MAX_KEYS) == expected


def test_the_timing_measures_both_kernels_and_leaves_the_random_state_alone():
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    sdpa, eager = scratch_attention_kernel.time_kernels(128, repeats=1)
    assert 0 < sdpa < 10 and 0 < eager < 10
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_num_threads() == threads


def test_the_eager_math_equals_flash_attention_in_fp32():
    """The computation the choice switches to is causal attention itself (fp32: to rounding)."""
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 4, 9, 16) for _ in range(3))
    layer = Layer(4, 4, causal=True)
    mask = scratch_attention_kernel.causal_mask(9, 9, query.device)
    output, _ = scratch_attention.eager_attention_forward(layer, query, key, value, mask, scaling=0.25)
    expected = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=0.25).transpose(1, 2)
    torch.testing.assert_close(output, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_eager_math_is_the_textbook_math_bit_for_bit(dtype):
    """Scaling and mask in one pass (`bias + scaling * scores`) and the softmax in the scores' dtype give what scale,
    masked_fill and an fp32 (float64: float64) softmax rounded to the dtype give, to the bit (a power-of-two scaling),
    with a boolean mask or its additive form, a query that no key is left to (left padding) included."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 4, 9, 16, generator=generator).mul(3).to(dtype) for _ in range(3))
    mask = scratch_attention_kernel.causal_mask(9, 9, query.device).repeat(2, 1, 1, 1)  # (B, 1, T, S)
    mask[1, :, :3, :] = False  # the second row's first three queries attend to no key
    scores = torch.matmul(query, key.transpose(2, 3)) * 0.25
    scores = scores.masked_fill(~mask, torch.finfo(dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(dtype, torch.float32)).to(dtype)
    expected = torch.matmul(weights, value).transpose(1, 2)
    layer = Layer(4, 4, causal=True)
    for given_mask in (mask, scratch_attention.additive_mask(mask, dtype)):
        output, probabilities = scratch_attention.eager_attention_forward(layer, query, key, value, given_mask, 0.25)
        torch.testing.assert_close(probabilities, weights, rtol=0, atol=0)
        torch.testing.assert_close(output, expected, rtol=0, atol=0)


def test_reentrant_checkpointing_recomputes_the_same_attention_and_dropout(attention):
    """Reentrant checkpointing runs a layer without gradients, then again with them: both runs must take the same
    kernel and draw the same attention dropout, so the gradients are those of the uncheckpointed step."""
    attention("eager")
    model = tiny_lm("decoder", attention_dropout=0.5).train()
    inputs = lm_inputs("decoder")
    results = []
    for checkpointed in (False, True):
        if checkpointed:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        model.zero_grad()
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss, grads), (expected_loss, expected_grads) = results[1], results[0]
    torch.testing.assert_close(loss, expected_loss)
    for grad, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("choice", ["sdpa", "eager"])
def test_attention_dropout_takes_the_eager_math_and_its_mask(attention, eager_calls, choice, dtype):
    """With attention dropout on, PyTorch's CPU sdpa computes the math path itself (its flash kernel has no dropout)
    and draws the mask with `bernoulli_`: our sdpa back-end computes the eager math instead, at any length, dtype or
    timed choice, dropping the same entries as the eager back-end for the same seed."""
    attention(choice)
    layer = Layer(4, 2, causal=True)
    generator = torch.Generator().manual_seed(0)
    length = EAGER_MAX_KEYS + 8  # beyond the bf16 choice's reach: the dropout alone decides
    query = torch.randn(2, 4, length, 16, generator=generator).to(dtype)
    key, value = (torch.randn(2, 2, length, 16, generator=generator).to(dtype) for _ in "kv")
    torch.manual_seed(1)
    output, _ = scratch_attention.sdpa_attention_forward(layer, query, key, value, None, scaling=0.25, dropout=0.3)
    assert eager_calls == [tuple(query.shape)]
    layer.eval()  # a dropout rate outside training mode is applied as sdpa applies it, by sdpa
    scratch_attention.sdpa_attention_forward(layer, query, key, value, None, scaling=0.25, dropout=0.3)
    assert len(eager_calls) == 1
    layer.train()
    causal = scratch_attention_kernel.causal_mask(length, length, query.device)
    torch.manual_seed(1)
    expected, _ = scratch_attention.eager_attention_forward(layer, query, key, value, causal, 0.25, dropout=0.3)
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_with_attention_dropout_is_the_same_under_sdpa_and_eager(family):
    """Both back-ends draw the attention dropout alike (the sdpa one drew it with `bernoulli_` before): one seed, one
    loss and the same gradients, whichever `attn_implementation`."""
    model = tiny_lm(family, attention_dropout=0.3).train()
    inputs = lm_inputs(family)
    results = {}
    for implementation in ("sdpa", "eager"):
        model.set_attn_implementation(implementation)
        model.zero_grad()
        torch.manual_seed(0)
        loss = model(**inputs).loss
        loss.backward()
        results[implementation] = loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]
    (loss, grads), (expected_loss, expected_grads) = results["sdpa"], results["eager"]
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
    for grad, expected in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=0, atol=0)


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_a_left_padded_bf16_step_gives_the_native_sdpa_logits(attention, kernel):
    """Either kernel of our sdpa back-end, against native Llama's sdpa on the same weights, both in bf16
    (`.to(torch.bfloat16)`; under autocast its rotated queries are fp32, which takes sdpa), in training mode over a
    left-padded batch: through the eager math the pad positions' logits (the last one predicts the first real token)
    were up to 0.13 off, each pad position attending to every key, the future included; real positions differ by
    0.002."""
    native = llama(attn_implementation="sdpa").to(torch.bfloat16).train()
    ours = from_hf(native)
    attention(kernel)
    inputs = left_padded(lm_inputs("decoder", batch=3, length=12))
    expected, actual = (model(**inputs) for model in (native, ours))
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-2, rtol=0)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-3, rtol=0)
