"""The building blocks: attention back-ends agree, masks hide what they must, positions and norms compute the
published formulas, every knob value trains, initialisation follows its scheme."""

import contextlib
import copy
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import FAMILIES, PAD, VOCAB, lm_inputs, tiny_config, tiny_lm

from hf_scratch_transformer import kernel_choice, scratch_layers
from hf_scratch_transformer.modeling_scratch_common import ScratchPreTrainedModel
from hf_scratch_transformer.scratch_attention import eager_attention_forward, sdpa_attention_forward
from hf_scratch_transformer.scratch_layers import ScratchRMSNorm
from hf_scratch_transformer.scratch_positions import (
    ScratchRotaryEmbedding,
    alibi_slopes,
    apply_rotary,
    sinusoidal_table,
)

# ---------------------------------------------------------------------------------------------- attention


class _Heads(torch.nn.Module):
    """Stands in for the attention module: the attributes the attention functions read."""

    def __init__(self, groups: int, is_causal: bool):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, is_causal


def test_eager_attention_is_the_textbook_formula():
    query, key, value = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    output, weights = eager_attention_forward(_Heads(2, False), query, key, value, None, scaling=8**-0.5)
    key_full, value_full = key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1)
    expected_weights = torch.softmax(query @ key_full.transpose(-1, -2) / math.sqrt(8), dim=-1)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(output, (expected_weights @ value_full).transpose(1, 2))


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_sdpa_function_equals_eager_function(groups, mask_kind):
    query, key, value = torch.randn(2, 4, 5, 8), torch.randn(2, 4 // groups, 6, 8), torch.randn(2, 4 // groups, 6, 8)
    mask = None
    if mask_kind != "none":
        mask = torch.rand(2, 1, 5, 6) > 0.3
        mask[..., 0] = True
        if mask_kind == "float":
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    module = _Heads(groups, is_causal=False)
    eager, _ = eager_attention_forward(module, query, key, value, mask, scaling=0.3)
    sdpa, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(sdpa, eager)


BACKEND_VARIANTS = [
    dict(),
    dict(num_key_value_heads=2),
    dict(num_key_value_heads=1),
    dict(position_embedding_type="rope"),
    dict(position_embedding_type="alibi"),
    dict(position_embedding_type="sinusoidal", norm_position="post", final_norm=False),
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("variant", BACKEND_VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()) or "mha")
def test_eager_and_sdpa_models_give_the_same_outputs(family, variant):
    eager = tiny_lm(family, attn_implementation="eager", **variant)
    sdpa = tiny_lm(family, attn_implementation="sdpa", **variant)
    assert sdpa.config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    inputs = lm_inputs(family)
    mask = torch.ones_like(inputs["input_ids"])
    if family == "decoder":
        mask[1, :3] = 0  # left padding in the second row
        inputs["labels"][1, :4] = -100  # the first real token is predicted from padding
    else:
        mask[1, -3:] = 0  # right padding of the (source) sequence
    eager_out, sdpa_out = eager(**inputs, attention_mask=mask), sdpa(**inputs, attention_mask=mask)
    # Outputs at padding positions are meaningless (their rows may be fully masked): compare real tokens.
    real = mask.bool() if family != "seq2seq" else torch.ones(sdpa_out.logits.shape[:2], dtype=torch.bool)
    torch.testing.assert_close(sdpa_out.logits[real], eager_out.logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sdpa_out.loss, eager_out.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family, variant", [("decoder", dict(position_embedding_type="rope", sliding_window=4)),
                                             ("encoder", dict())])
def test_flex_attention_gives_the_outputs_of_sdpa(family, variant):
    """Every family was refused `attn_implementation="flex_attention"`, which native Llama, BERT and Marian take (on
    CPU too): the masks come from transformers' `masking_utils`, which builds flex's block masks. Here what no native
    model under flex has (sliding windows with padding; BERT has no flex); grouped-query attention and the
    encoder-decoder's against Llama and Marian under flex: tests/test_parity_hf.py. Each variant compiles flex
    attention for its masks and lengths: 15-40 s on 2 cores of an AVX2-only AMD EPYC."""
    sdpa = tiny_lm(family, **variant).eval()
    flex = tiny_lm(family, attn_implementation="flex_attention", **variant).eval()
    flex.load_state_dict(sdpa.state_dict())
    assert flex.config._attn_implementation == "flex_attention"
    inputs = lm_inputs(family)
    mask = torch.ones_like(inputs["input_ids"])
    mask[1, :3] = 0  # padding in the second row (the seq2seq source's too)
    with torch.no_grad():
        sdpa_out, flex_out = sdpa(**inputs, attention_mask=mask), flex(**inputs, attention_mask=mask)
    real = mask.bool() if family != "seq2seq" else torch.ones(sdpa_out.logits.shape[:2], dtype=torch.bool)
    torch.testing.assert_close(flex_out.logits[real], sdpa_out.logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flex_out.loss, sdpa_out.loss, atol=1e-5, rtol=1e-5)
    # (Not generate(): its one-query steps fail in inductor's C++ flex kernel on a CPU with PyTorch 2.13, native
    # Llama's alike: "CppCompileError ... 'cur_kvSplitSize0' was not declared".)


def test_sliding_window_eager_and_sdpa_agree_and_limit_what_is_seen():
    eager = tiny_lm("decoder", attn_implementation="eager", sliding_window=3)
    sdpa = tiny_lm("decoder", attn_implementation="sdpa", sliding_window=3)
    ids = lm_inputs("decoder")["input_ids"]
    out = eager(input_ids=ids, output_attentions=True)
    torch.testing.assert_close(sdpa(input_ids=ids).logits, out.logits, atol=1e-5, rtol=1e-5)
    weights = out.attentions[0][0, 0]  # (T, T)
    seen = weights > 0
    for query in range(ids.shape[1]):
        assert seen[query].nonzero().flatten().tolist() == list(range(max(0, query - 2), query + 1))


# ---------------------------------------------------------------------------------------------- masks


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(2, 10),
    cut=st.integers(0, 9),
    position_embedding_type=st.sampled_from(["learned", "rope", "alibi"]),
)
def test_causal_model_never_sees_the_future(length, cut, position_embedding_type):
    """Changing tokens after position `cut` leaves every output up to `cut` unchanged."""
    cut = min(cut, length - 1)
    model = tiny_lm("decoder", position_embedding_type=position_embedding_type)
    ids = torch.randint(3, VOCAB, (1, length))
    changed = ids.clone()
    changed[:, cut + 1:] = torch.randint(3, VOCAB, (1, length - cut - 1))
    with torch.no_grad():
        seen = slice(0, cut + 1)
        torch.testing.assert_close(model(input_ids=changed).logits[:, seen], model(input_ids=ids).logits[:, seen])


@settings(max_examples=25, deadline=None)
@given(real=st.integers(1, 8), padding=st.integers(1, 5), family=st.sampled_from(FAMILIES),
       left=st.booleans(), position_embedding_type=st.sampled_from(["sinusoidal", "rope", "alibi"]))
def test_padding_is_invisible(real, padding, family, left, position_embedding_type):
    """A padded row gives, on its real tokens, the outputs of the same row alone (right padding for the
    bidirectional encoder and the seq2seq source; either side for the causal decoder, with positions from the
    mask as `generate` passes them)."""
    if family != "decoder":
        left = False
    model = tiny_lm(family, position_embedding_type=position_embedding_type)
    ids = torch.randint(3, VOCAB, (1, real))
    pad = torch.full((1, padding), PAD)
    padded = torch.cat([pad, ids], 1) if left else torch.cat([ids, pad], 1)
    mask = (torch.arange(real + padding) >= padding if left else torch.arange(real + padding) < real).long()[None]
    kwargs, padded_kwargs = {}, {"attention_mask": mask}
    if family == "seq2seq":
        target = torch.randint(3, VOCAB, (1, 4))
        kwargs = padded_kwargs = {"decoder_input_ids": target}
        padded_kwargs = {**kwargs, "attention_mask": mask}
    elif left:
        padded_kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(input_ids=ids, **kwargs).logits
        together = model(input_ids=padded, **padded_kwargs).logits
    if family != "seq2seq":
        together = together[:, padding:] if left else together[:, :real]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- positions, norms


def test_sinusoidal_table_is_the_papers_formula():
    table = sinusoidal_table(50, 16)
    pos, i = 7, 3
    assert table[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-6)


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -(k + 1) for k in range(8)]
    assert alibi_slopes(4).tolist() == [2.0 ** -(2 * (k + 1)) for k in range(4)]
    assert len(alibi_slopes(6)) == 6 and len(set(alibi_slopes(6).tolist())) == 6


def test_bidirectional_alibi_penalises_distance_both_ways():
    """ALiBi's bias -slope * |i - j| is symmetric, so an encoder with ALiBi positions (and no others) maps the reversed
    sequence to the reversed outputs; another order of the same tokens changes them (the positions count)."""
    model = tiny_lm("encoder", position_embedding_type="alibi")
    ids = torch.randint(3, VOCAB, (2, 7))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        reversed_logits, rotated_logits = model(input_ids=ids.flip(1)).logits, model(input_ids=ids.roll(1, 1)).logits
    torch.testing.assert_close(reversed_logits, logits.flip(1))
    assert not torch.allclose(rotated_logits, logits.roll(1, 1), atol=1e-3)


def test_rotary_scores_depend_only_on_relative_position():
    config = tiny_config("decoder", position_embedding_type="rope")
    rotary = ScratchRotaryEmbedding(config)
    query, key = torch.randn(1, 1, 1, config.head_dim), torch.randn(1, 1, 1, config.head_dim)

    def score(query_position, key_position):
        cos_q, sin_q = rotary(query, torch.tensor([[query_position]]))
        cos_k, sin_k = rotary(key, torch.tensor([[key_position]]))
        return (apply_rotary(query, cos_q, sin_q) * apply_rotary(key, cos_k, sin_k)).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10))
    assert not torch.allclose(score(5, 2), score(5, 4))


def test_rms_norm_formula():
    norm = ScratchRMSNorm(6, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 6)
    torch.testing.assert_close(norm(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight)


def test_rms_norm_fp32_op_is_llamas_formula_bit_for_bit():
    """In fp32 on CPU the norm is PyTorch's `rms_norm` op; it must equal the formula it replaces (LlamaRMSNorm's, still
    run in other dtypes) to the bit, values and both gradients."""
    norm = ScratchRMSNorm(384, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 5, 384, requires_grad=True)
    grad = torch.randn(2, 5, 384)

    def llama_formula(x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return norm.weight * normed.to(x.dtype)

    ours, reference = norm(x), llama_formula(x)
    assert torch.equal(ours, reference)
    assert all(map(torch.equal, torch.autograd.grad(ours, (x, norm.weight), grad),
                   torch.autograd.grad(reference, (x, norm.weight), grad)))
    half = x.detach().bfloat16()  # the formula's own path, in bf16
    torch.testing.assert_close(norm(half), llama_formula(half), rtol=0, atol=0)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_block_layout(norm_position):
    """Pre-norm: x + f(norm(x)); post-norm: norm(x + f(x)) (checked on one block with attention switched off)."""
    model = tiny_lm("encoder", norm_position=norm_position, num_hidden_layers=1)
    block = model.model.layers[0]
    x = torch.randn(1, 4, 32)
    attention_out = block.self_attn(block.attn_norm(x) if norm_position == "pre" else x)[0]
    if norm_position == "pre":
        h = x + attention_out
        expected = h + block.mlp(block.mlp_norm(h))
    else:
        h = block.attn_norm(x + attention_out)
        expected = block.mlp_norm(h + block.mlp(h))
    torch.testing.assert_close(block(x), expected)


ACTS = ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]


@pytest.fixture
def small_results_in_place(monkeypatch):
    """Tiny models' results are far below `IN_PLACE_MIN_BYTES`: written over at any size, so that the guards of
    `may_write_over` are what decides."""
    monkeypatch.setattr(scratch_layers, "IN_PLACE_MIN_BYTES", 0)


def _feed_forward(hidden_act: str, monkeypatch):
    """One feed-forward layer of a tiny model and its input; a counter of the in-place activations it computes,
    which it may compute at this size (`small_results_in_place`)."""
    monkeypatch.setattr(scratch_layers, "IN_PLACE_MIN_BYTES", 0)
    mlp = tiny_lm("encoder", hidden_act=hidden_act, num_hidden_layers=1).model.layers[0].mlp
    calls, kernels = [], dict(scratch_layers.IN_PLACE_ACTIVATIONS)
    for activation, kernel in kernels.items():
        kernels[activation] = lambda projected, kernel=kernel: calls.append(projected.shape) or kernel(projected)
    monkeypatch.setattr(scratch_layers, "IN_PLACE_ACTIVATIONS", kernels)
    return mlp, torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0)), calls


@pytest.mark.parametrize("hidden_act", ACTS)
def test_feed_forward_activates_in_place_without_gradients_bit_for_bit(hidden_act, monkeypatch):
    """Without an autograd graph the activation is written over the up projection's output (a fresh tensor costs
    page faults on CPU): the same values, bit for bit, as the activation module with gradients recorded."""
    mlp, x, calls = _feed_forward(hidden_act, monkeypatch)
    expected = mlp(x)  # gradients recorded: the activation module
    assert not calls
    with torch.no_grad():
        assert torch.equal(mlp(x), expected)
    with torch.inference_mode():
        assert torch.equal(mlp(x), expected)
    assert len(calls) == 2
    expected.sum().backward()  # the module's path still differentiates
    assert mlp.up_proj.weight.grad is not None


@pytest.mark.parametrize("hook_on", ["up_proj", "act_fn", "everywhere"])
def test_feed_forward_never_overwrites_what_a_hook_saw(hook_on, monkeypatch):
    """A forward hook on the up projection may keep its output, and one on the activation must see it called:
    with either (or a global module hook) the activation is the module's, out of place."""
    mlp, x, calls = _feed_forward("gelu", monkeypatch)
    seen = []
    if hook_on == "everywhere":
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, output: seen.append(output.clone()) if module is mlp.up_proj else None
        )
    else:
        handle = getattr(mlp, hook_on).register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        with torch.no_grad():
            mlp(x)
            projection = mlp.up_proj(x)
    finally:
        handle.remove()
    assert not calls
    if hook_on != "act_fn":
        assert torch.equal(seen[0], projection)  # not the activation written over it
    else:
        torch.testing.assert_close(seen[0], torch.nn.functional.gelu(projection))


def test_a_swapped_activation_is_called_and_the_model_still_pickles(monkeypatch):
    """The in-place kernel follows the class of the module `act_fn` holds now: one swapped in is called as it is.
    A model still pickles and copies (`torch.save` of a whole model, `copy.deepcopy` for a reference model)."""
    mlp, x, calls = _feed_forward("gelu", monkeypatch)
    mlp.act_fn = torch.nn.Tanh()
    with torch.no_grad():
        expected = mlp.down_proj(torch.tanh(mlp.up_proj(x)))
        assert torch.equal(mlp(x), expected)
    assert not calls
    model = tiny_lm("decoder", hidden_act="gelu_tanh")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        expected = model(ids).logits
        assert torch.equal(torch.load(buffer, weights_only=False)(ids).logits, expected)
        assert torch.equal(copy.deepcopy(model)(ids).logits, expected)


def _train_step(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits of a training forward and the gradients of its loss, the model's own left as they were."""
    model.zero_grad(set_to_none=True)
    outputs = model(**inputs)
    outputs.loss.backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return outputs.logits.detach(), gradients


def _linear_trains_into_a_view(use_bias: bool) -> bool:
    """Whether F.linear over (batch, seq, in) inputs that need gradients returns a view of its 2-D product, which a
    residual sum must not be written over: with a bias up to PyTorch 2.14, from 2.15 never (an unsafe view)."""
    weight, bias = torch.ones(2, 2, requires_grad=True), torch.ones(2) if use_bias else None
    return torch.nn.functional.linear(torch.ones(1, 1, 2), weight, bias)._base is not None


@contextlib.contextmanager
def _sums_out_of_place():
    """A global module hook that does nothing: no residual sum may be written in place under it."""
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, output: None)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("kernel", ["native", "onednn", "transposed"])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("norm_position", ["pre", "post"])
@pytest.mark.parametrize("family", FAMILIES)
def test_residual_sums_are_written_over_the_projections_with_the_same_logits_and_gradients(
    family, norm_position, dropout, use_bias, kernel, monkeypatch, force_choice, small_results_in_place
):
    """Each residual sum is written over the attention's or the feed-forward's output projection (a fresh tensor,
    which F.linear does not keep for backward), or over the dropout's output: logits and every gradient bit for bit
    those of the sums out of place, cross-attention included. In pre-norm without dropout each block returns its
    last projection's tensor itself: in training where that is no view (every kernel's product but F.linear's with a
    bias up to PyTorch 2.14, a view of its 2-D product), without gradients always."""
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, kernel)
    model = tiny_lm(family, norm_position=norm_position, dropout=dropout, use_bias=use_bias).train()
    inputs = lm_inputs(family)
    torch.manual_seed(3)
    with _sums_out_of_place():
        expected_logits, expected_gradients = _train_step(model, inputs)
    projections, block_outputs = [], []
    linear_forward, block_forward = scratch_layers.ScratchLinear.forward, scratch_layers.ScratchBlock.forward
    monkeypatch.setattr(scratch_layers.ScratchLinear, "forward",
                        lambda self, x: projections.append(linear_forward(self, x)) or projections[-1])
    monkeypatch.setattr(scratch_layers.ScratchBlock, "forward",
                        lambda self, *args, **kwargs: block_outputs.append(block_forward(self, *args, **kwargs))
                        or block_outputs[-1])

    def written_over() -> list[bool]:
        found = [any(output is projection for projection in projections) for output in block_outputs]
        projections.clear(), block_outputs.clear()
        assert found
        return found

    torch.manual_seed(3)  # the same dropout masks
    logits, gradients = _train_step(model, inputs)
    assert torch.equal(logits, expected_logits)
    assert gradients.keys() == expected_gradients.keys()
    assert all(torch.equal(gradients[name], expected_gradients[name]) for name in gradients)
    no_views = not (kernel == "native" and _linear_trains_into_a_view(use_bias))
    in_place = written_over()
    assert all(in_place) if norm_position == "pre" and not dropout and no_views else not any(in_place)
    model.eval()
    with torch.no_grad():
        with _sums_out_of_place():
            expected_logits = model(**inputs).logits
        projections.clear(), block_outputs.clear()
        assert torch.equal(model(**inputs).logits, expected_logits)
    in_place = written_over()
    assert all(in_place) if norm_position == "pre" else not any(in_place)


@pytest.mark.parametrize("hook_on", ["self_attn", "o_proj", "mlp", "down_proj", "everywhere"])
def test_a_residual_sum_never_overwrites_what_a_hook_kept(hook_on, force_choice, small_results_in_place):
    """A forward hook on a sublayer or its output projection (activation caching, interpretability tools) may keep
    the tensor it was given: then the sum is a new tensor and the kept one still holds the sublayer's output.
    A full backward hook hands on an alias of the output, which must not be written over either: it is called."""
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "native")  # sums in place
    model = tiny_lm("decoder", use_bias=False).train()
    layer = model.model.layers[0]
    modules = {"self_attn": layer.self_attn, "o_proj": layer.self_attn.o_proj, "mlp": layer.mlp,
               "down_proj": layer.mlp.down_proj}
    kept = []

    def keep(module, args, output):
        tensor = output[0] if isinstance(output, tuple) else output
        if hook_on != "everywhere" or module in modules.values():
            kept.append((tensor, tensor.clone()))

    if hook_on == "everywhere":
        handle = torch.nn.modules.module.register_module_forward_hook(keep)
    else:
        handle = modules[hook_on].register_forward_hook(keep)
    try:
        model(**lm_inputs("decoder")).loss.backward()
    finally:
        handle.remove()
    assert kept
    assert all(torch.equal(tensor, copy_at_the_hook) for tensor, copy_at_the_hook in kept)
    if hook_on != "everywhere":
        called = []
        handle = modules[hook_on].register_full_backward_hook(lambda module, grad_in, grad_out: called.append(1))
        try:
            model(**lm_inputs("decoder")).loss.backward()
        finally:
            handle.remove()
        assert called


def test_a_residual_sum_under_autocast_is_promoted_and_a_foreign_projection_is_left_alone(
    force_choice, small_results_in_place
):
    """Under bf16 autocast the projection's output is bf16 and the residual fp32: the sum is fp32, as out of place
    (written over the bf16 tensor it would be rounded). A projection that is not ours may keep its output for
    backward (here tanh's): the sum is out of place, and backward runs and agrees."""
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "native")  # sums in place
    model = tiny_lm("decoder", use_bias=False).train()
    block, hidden = model.model.layers[0], torch.randn(2, 7, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with _sums_out_of_place():
            expected = block(hidden)
        output = block(hidden)
    assert output.dtype == expected.dtype == torch.float32
    assert torch.equal(output, expected)
    for layer in model.model.layers:
        layer.self_attn.o_proj = torch.nn.Sequential(layer.self_attn.o_proj, torch.nn.Tanh())
    inputs = lm_inputs("decoder")
    with _sums_out_of_place():
        expected_logits, expected_gradients = _train_step(model, inputs)
    logits, gradients = _train_step(model, inputs)
    assert torch.equal(logits, expected_logits)
    assert all(torch.equal(gradients[name], expected_gradients[name]) for name in gradients)


@pytest.mark.parametrize("grad", [False, True])
def test_only_results_of_at_least_the_threshold_are_written_over(grad, force_choice, monkeypatch):
    """Below `IN_PLACE_MIN_BYTES` a fresh tensor costs less than the checks and autograd's in-place bookkeeping: a
    block's sums and activation are written over their inputs from that size on, not below it; the same values."""
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "native")  # sums in place
    block = tiny_lm("decoder", use_bias=False).train().model.layers[0]
    hidden_size, in_place_activations = block.mlp.down_proj.out_features, []
    projections, linear_forward = [], scratch_layers.ScratchLinear.forward
    monkeypatch.setattr(scratch_layers.ScratchLinear, "forward",
                        lambda self, x: projections.append(linear_forward(self, x)) or projections[-1])
    kernels = {activation: lambda projected, kernel=kernel: in_place_activations.append(1) or kernel(projected)
               for activation, kernel in scratch_layers.IN_PLACE_ACTIVATIONS.items()}
    monkeypatch.setattr(scratch_layers, "IN_PLACE_ACTIVATIONS", kernels)
    threshold_rows = scratch_layers.IN_PLACE_MIN_BYTES // (4 * hidden_size)  # fp32 (1, rows, hidden) sums
    for rows, in_place in ((threshold_rows - 1, False), (threshold_rows, True), (1, False)):
        hidden = torch.randn(1, rows, hidden_size, generator=torch.Generator().manual_seed(rows))
        with torch.set_grad_enabled(grad), _sums_out_of_place():
            expected = block(hidden)
        projections.clear(), in_place_activations.clear()
        with torch.set_grad_enabled(grad):
            output = block(hidden)
        assert torch.equal(output, expected)
        assert (output is projections[-1]) == in_place
        activation_bytes = 4 * rows * block.mlp.up_proj.out_features  # 4x wider: written over at fewer rows
        # with gradients GELU keeps its input
        assert bool(in_place_activations) == (activation_bytes >= scratch_layers.IN_PLACE_MIN_BYTES and not grad)


# ---------------------------------------------------------------------------------------------- every knob


KNOB_VALUES = [
    ("hidden_act", ["relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"]),
    ("position_embedding_type", ["sinusoidal", "learned", "rope", "alibi"]),
    ("norm_type", ["layernorm", "rmsnorm"]),
    ("norm_position", ["pre", "post"]),
    ("final_norm", [True, False]),
    ("use_bias", [True, False]),
    ("num_key_value_heads", [4, 2, 1]),
    ("scale_embeddings", [True, False]),
    ("embedding_norm", [True, False]),
    ("tie_word_embeddings", [True, False]),
    ("init_scheme", ["normal", "xavier"]),
    ("dropout", [0.0, 0.3]),
    ("attention_dropout", [0.0, 0.3]),
    ("activation_dropout", [None, 0.0, 0.3]),
    ("embedding_dropout", [0.0, 0.3]),
]
FAMILY_KNOB_VALUES = [
    ("decoder", "sliding_window", [None, 3]),
    ("encoder", "type_vocab_size", [0, 2]),
    ("encoder", "sparse_prediction", [True, False]),
    ("encoder", "mlm_transform", [True, False]),
    ("seq2seq", "share_embeddings", [True, False]),
]
KNOB_CASES = [(family, knob, value) for knob, values in KNOB_VALUES for value in values for family in FAMILIES] + [
    (family, knob, value) for family, knob, values in FAMILY_KNOB_VALUES for value in values
]


@pytest.mark.parametrize("family, knob, value", KNOB_CASES)
def test_every_knob_value_trains_a_step_without_nan(family, knob, value):
    overrides = {knob: value}
    if (family, knob, value) == ("seq2seq", "share_embeddings", False):
        overrides["encoder_vocab_size"] = 120
    model = tiny_lm(family, **overrides).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = lm_inputs(family)
    if family == "encoder":
        inputs["labels"][:, ::2] = -100
        with_types = (knob, value) == ("type_vocab_size", 2)
        inputs["token_type_ids"] = torch.randint(0, 2, inputs["input_ids"].shape) if with_types else None
    for _ in range(2):
        loss = model(**inputs).loss
        assert torch.isfinite(loss)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad()


# ---------------------------------------------------------------------------------------------- initialisation


def _linear_weights(model, name_part):
    return [m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name_part in n]


def test_normal_init_uses_initializer_range():
    model = tiny_lm("decoder", hidden_size=128, intermediate_size=512, initializer_range=0.05,
                    tie_word_embeddings=False)
    weights = torch.cat([w.flatten() for w in _linear_weights(model, "layers")])
    assert weights.std().item() == pytest.approx(0.05, rel=0.05)
    assert model.model.embeddings.embed_tokens.weight[PAD].abs().sum() == 0
    biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert all(b.abs().sum() == 0 for b in biases)


def test_xavier_init_treats_each_fused_projection_separately():
    model = tiny_lm("decoder", hidden_size=128, intermediate_size=512, init_scheme="xavier", hidden_act="swiglu")
    qkv = model.model.layers[0].self_attn.qkv_proj.weight  # (3 * 128, 128)
    bound = math.sqrt(6 / (128 + 128))  # each of Q, K, V is a 128 x 128 matrix
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.9 * bound
    up = model.model.layers[0].mlp.up_proj.weight  # gate and up, each 512 x 128
    assert up.abs().max() <= math.sqrt(6 / (128 + 512))
    embedding = model.model.embeddings.embed_tokens.weight[3:]
    assert embedding.std().item() == pytest.approx(128**-0.5, rel=0.1)


def test_init_is_one_function_for_all_families():
    for family in FAMILIES:
        assert isinstance(tiny_lm(family), ScratchPreTrainedModel)
        assert "_init_weights" not in type(tiny_lm(family)).__dict__
