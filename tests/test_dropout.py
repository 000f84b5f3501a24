"""`scratch_dropout.dropout`: on CPU a mask of 32 random bits per element (faster than F.dropout's bernoulli_,
docs/performance.md), which must keep each element independently with probability 1 - p, scale the kept ones by
1 / (1 - p), follow `torch.manual_seed`, and differentiate as dropout does; and no layer drops out in eval mode."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import FAMILIES, lm_inputs, tiny_lm

from hf_scratch_transformer.scratch_dropout import dropout, keep_mask

COUNT = 2_000_000


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9])
def test_each_element_is_kept_with_probability_one_minus_p_independently(p):
    torch.manual_seed(0)
    kept = keep_mask(torch.Size([COUNT]), p).double()
    sigma = (p * (1 - p) / COUNT) ** 0.5
    assert abs(kept.mean().item() - (1 - p)) < 5 * sigma
    # Neighbours come from the two halves of one 64-bit draw, and the next draw: no correlation between them.
    for pair in (kept[0::2] * kept[1::2], kept[1:-1:2] * kept[2::2]):
        pair_sigma = ((1 - p) ** 2 * (1 - (1 - p) ** 2) / pair.numel()) ** 0.5
        assert abs(pair.mean().item() - (1 - p) ** 2) < 5 * pair_sigma


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), p=st.floats(0.05, 0.95),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]))
def test_kept_elements_are_scaled_and_the_rest_zero_for_any_shape(shape, p, dtype):
    inputs = torch.rand(shape, dtype=dtype) + 1  # no zeros of its own
    torch.manual_seed(1)
    dropped = dropout(inputs, p, training=True)
    torch.manual_seed(1)
    kept = keep_mask(inputs.shape, p)  # the same draw: dropout takes its mask from the global generator
    assert dropped.dtype == dtype and dropped.shape == inputs.shape
    assert torch.equal(dropped, torch.where(kept, inputs * (1 / (1 - p)), 0))


def test_a_seed_gives_the_same_masks_and_the_gradient_is_the_mask_scaled():
    inputs = torch.randn(4, 33, requires_grad=True)  # an odd count: the last draw is half used
    torch.manual_seed(3)
    first = dropout(inputs, 0.3, training=True)
    torch.manual_seed(3)
    second = dropout(inputs, 0.3, training=True)
    assert torch.equal(first, second) and not torch.equal(first, dropout(inputs, 0.3, training=True))
    kept = first != 0
    (gradient,) = torch.autograd.grad(first.sum(), inputs, create_graph=True)
    torch.testing.assert_close(gradient, kept / 0.7)
    # Differentiable again (double backward, as F.dropout) and in forward mode; a transposed input too.
    def seeded(tensor):
        torch.manual_seed(5)
        return dropout(tensor, 0.3, training=True)

    double = inputs.detach().double().mT.requires_grad_()
    assert torch.autograd.gradcheck(seeded, double, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(seeded, double)


def test_backward_keeps_a_bool_mask_not_a_float_one():
    """F.dropout on CPU keeps its scaled mask in the input's dtype; ours keeps one byte an element."""
    saved = []
    inputs = torch.randn(64, 64, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        dropout(inputs, 0.2, training=True)
    assert saved == [torch.bool]
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.dtype) or t, lambda t: t):
        F.dropout(inputs, 0.2, training=True)
    assert torch.float32 in saved


def test_inactive_or_total_dropout_and_transforms_take_the_plain_path():
    inputs = torch.ones(1000)
    assert dropout(inputs, 0.5, training=False) is inputs
    assert dropout(inputs, 0.0, training=True) is inputs
    assert torch.equal(dropout(inputs, 1.0, training=True), torch.zeros(1000))  # F.dropout's p = 1
    # Under vmap (randomness="different") PyTorch's own dropout runs, batched.
    batched = torch.vmap(lambda row: dropout(row, 0.5, training=True), randomness="different")(torch.ones(3, 100))
    assert batched.shape == (3, 100) and set(batched.unique().tolist()) <= {0.0, 2.0}




RATES = dict(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3, embedding_dropout=0.3)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_eval_mode_drops_nothing_out_whatever_the_rates(family, attn_implementation):
    """In eval mode every dropout (embeddings, attention, feed-forward, residual) is off: a model with high rates gives
    the logits of the same weights with every rate 0."""
    with_rates = tiny_lm(family, attn_implementation=attn_implementation, **RATES)
    without = tiny_lm(family, attn_implementation=attn_implementation, **dict.fromkeys(RATES, 0.0))
    without.load_state_dict(with_rates.state_dict())
    inputs = lm_inputs(family)
    with torch.no_grad():
        torch.testing.assert_close(with_rates(**inputs).logits, without(**inputs).logits, rtol=0, atol=0)
