"""The building blocks every Scratch family is made of: norms, feed-forward, the Transformer block, embeddings.

- Norms: LayerNorm (Ba et al., 2016) and RMSNorm (Zhang & Sennrich, 2019); the class names keep the words
  "LayerNorm" / "RMSNorm", which transformers' loaders look for.
- Feed-forward: `relu`, `gelu`, `gelu_tanh`, `silu` (two matrices, Vaswani et al. section 3.3) or the gated
  `swiglu` / `geglu` (Shazeer, 2020), whose gate and up projections are one fused matrix.
- `ScratchBlock`: self-attention, optional cross-attention, feed-forward, each a residual sub-layer with dropout,
  in pre-norm (x + f(norm(x))) or post-norm (norm(x + f(x)), the paper's layout).
- `ScratchEmbeddings`: token embeddings (optionally x sqrt(hidden)), token types, absolute positions, dropout.

Strings from the config are turned into modules here, once, so `forward` compares no strings.
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_hooks
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from .linear_kernels import inside_torch_func
from .scratch_attention import ScratchAttention
from .scratch_dropout import dropout
from .scratch_linear import ScratchLinear
from .scratch_positions import ScratchLearnedPositionalEmbedding, ScratchSinusoidalPositionalEmbedding
from .value_checks import values_unreadable

# Smaller results are not written over their inputs: glibc hands out blocks under its mmap threshold (128 KiB by
# default) from its free lists without page faults, so there the checks and autograd's in-place bookkeeping cost more
# than the fresh tensor. A product and its residual sum written in place, against out of place (AVX2-only AMD EPYC,
# one thread, warm loop): 3-12% slower up to 32 KiB, within 3% from 64 to 256 KiB, 1-3% faster from 384 KiB and 35%
# at 3 MiB (docs/performance.md).
IN_PLACE_MIN_BYTES = 128 << 10


def may_write_over(output: torch.Tensor, *producers: nn.Module) -> bool:
    """Whether an op may write its result over `output`, a fresh tensor the `producers` returned, where that gains
    (`IN_PLACE_MIN_BYTES`) and nothing else can hold it: a plain CPU tensor (a subclass such as DTensor keeps its own
    semantics), no forward hook on the producers or on every module (a hook may keep what it was given), outside
    `torch.compile` and `torch.func` transforms (their graphs and batching rules expect the op out of place). A view
    (F.linear's output of 3-D inputs with a bias: a view of the 2-D product) only without an autograd graph: with
    one, autograd forbids writing over a view that a custom `autograd.Function` returned (the alias a module's
    backward hook hands on) and copies the whole tensor again in backward for the others."""
    if (
        torch.compiler.is_compiling()  # first: the checks below would break a traced graph
        or type(output) is not torch.Tensor
        or output.nbytes < IN_PLACE_MIN_BYTES
        or not output.is_cpu
        or (output._base is not None and output.grad_fn is not None)
        or inside_torch_func()
        or module_hooks._global_forward_hooks
    ):
        return False
    # A loop, not any() over a generator: each generator step is a Python frame, and between a training step's
    # products every frame costs several times what it costs in a warm loop (docs/nanogpt.md).
    for producer in producers:
        if producer._forward_hooks:
            return False
    return True


class ScratchLayerNorm(nn.LayerNorm):
    """nn.LayerNorm, named so that transformers recognises it as a norm."""


class ScratchRMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in float32 for stability."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if hidden_states.dtype == weight.dtype == torch.float32 and hidden_states.is_cpu and not torch.jit.is_tracing():
            # On CPU PyTorch's op runs the lines below in C++: the same ops, so the same values and gradients bit for
            # bit, and 7 Python calls less, each costly between a decoding step's products (docs/performance.md,
            # "Python between the products"). CUDA's is a fused kernel of other rounding than the native models'.
            # A traced graph (TorchScript, its ONNX export, which has no op for `aten::rms_norm`) takes the lines below.
            return F.rms_norm(hidden_states, weight.shape, weight, self.eps)
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * hidden_states.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(config) -> nn.Module:
    if config.norm_type == "rmsnorm":
        return ScratchRMSNorm(config.hidden_size, config.layer_norm_eps)
    return ScratchLayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.use_bias)


# hidden_act -> (element-wise activation in transformers' ACT2FN, gated?)
ACTIVATIONS = {
    "relu": ("relu", False),
    "gelu": ("gelu", False),
    "gelu_tanh": ("gelu_pytorch_tanh", False),
    "silu": ("silu", False),
    "swiglu": ("silu", True),
    "geglu": ("gelu", True),
}


# The classes of ACT2FN's modules that ACTIVATIONS makes -> the same kernel writing over its input (the same values,
# bit for bit). Looked up by the class of the module `act_fn` holds at each call, so an activation swapped in later is
# called as it is (but ACT2FN's "gelu_python" and "gelu_python_tanh" share these classes: swapped in, without
# gradients they get the C kernel's rounding); a table of the module, not an attribute of it, so a model still
# pickles (an op does not).
IN_PLACE_ACTIVATIONS = {
    type(ACT2FN["relu"]): torch.relu_,
    type(ACT2FN["gelu"]): torch.ops.aten.gelu_,
    type(ACT2FN["gelu_pytorch_tanh"]): functools.partial(torch.ops.aten.gelu_, approximate="tanh"),
    type(ACT2FN["silu"]): torch.ops.aten.silu_,
}


class ScratchFeedForward(nn.Module):
    """Position-wise feed-forward: (B, T, hidden) -> (B, T, intermediate) -> (B, T, hidden)."""

    def __init__(self, config):
        super().__init__()
        activation, self.gated = ACTIVATIONS[config.hidden_act]
        self.act_fn = ACT2FN[activation]
        # Gated variants compute gate and up projections with one matmul: (B, T, 2 * intermediate).
        up_size = 2 * config.intermediate_size if self.gated else config.intermediate_size
        self.up_proj = ScratchLinear(config.hidden_size, up_size, bias=config.use_bias)
        if self.gated:
            self.up_proj.fused_sizes = (config.intermediate_size, config.intermediate_size)
            # torchao's weight-only CPU product converts the int8 weight to an fp32 copy at every call, which costs
            # more per byte for this matrix, twice the native model's largest, than for the native gate and up
            # (3072 x 384: 210 us against 2 x 65, AVX-512 Intel Xeon; docs/quantization.md): one product per part.
            self.up_proj.quantized_in_parts = True
        self.down_proj = ScratchLinear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.down_proj.materializes_compiled_row = True  # inductor would compute the activation again per weight row
        self.activation_dropout = nn.Dropout(config.activation_dropout_rate)  # a rate, see `scratch_dropout`

    def _activate(self, projected: torch.Tensor) -> torch.Tensor:
        """`act_fn` of the up projection's output, written over that output where nothing else can see it: no
        autograd graph keeps it (inference, evaluation), no hook saw it or expects to see the activation, on CPU.
        There a fresh (B, T, intermediate) tensor costs page faults on every forward: at the benchmark's size BERT
        prefilled 8-11% faster, Marian 2-3%, GPT-2 as fast (AVX-512 AMD EPYC; BERT 7.5% limited to AVX2)."""
        in_place = IN_PLACE_ACTIVATIONS.get(type(self.act_fn))
        if (
            in_place is None
            or projected.requires_grad
            or not may_write_over(projected, self.up_proj)
            or self.act_fn._forward_hooks  # a hook expects to see the activation called
            or self.act_fn._forward_pre_hooks
            or module_hooks._global_forward_pre_hooks
        ):
            return self.act_fn(projected)
        return in_place(projected)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.up_proj(hidden_states)
        if self.gated:
            gate, up = hidden_states.chunk(2, dim=-1)
            hidden_states = self._activate(gate) * up
        else:
            hidden_states = self._activate(hidden_states)
        if self.training:  # a call less per layer when not (docs/performance.md, "Python between the products")
            hidden_states = dropout(hidden_states, self.activation_dropout.p, True)
        return self.down_proj(hidden_states)


class ScratchMLMTransform(nn.Module):
    """BERT's prediction-head transform before the vocabulary projection: dense -> activation -> norm."""

    def __init__(self, config):
        super().__init__()
        self.dense = ScratchLinear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        self.act_fn = ACT2FN[ACTIVATIONS[config.hidden_act][0]]
        self.norm = make_norm(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act_fn(self.dense(hidden_states)))


class ScratchPooler(nn.Module):
    """BERT's pooler before its sequence classifier: dense -> tanh, over [CLS]'s hidden state (B, hidden)."""

    def __init__(self, config):
        super().__init__()
        self.dense = ScratchLinear(config.hidden_size, config.hidden_size, bias=config.use_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden_states))


class ScratchBlock(GradientCheckpointingLayer):
    """One Transformer layer: self-attention, cross-attention (decoder of seq2seq only), feed-forward."""

    def __init__(self, config, layer_idx: int, is_causal: bool, has_cross_attention: bool = False):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.self_attn = ScratchAttention(config, layer_idx, is_causal=is_causal)
        self.attn_norm = make_norm(config)
        self.cross_attn = None
        if has_cross_attention:
            self.cross_attn = ScratchAttention(config, layer_idx, is_causal=False, is_cross_attention=True)
            self.cross_attn_norm = make_norm(config)
        self.mlp = ScratchFeedForward(config)
        self.mlp_norm = make_norm(config)
        self.residual_dropout = nn.Dropout(config.dropout)

    def _add_residual(
        self,
        residual: torch.Tensor,
        update: torch.Tensor,
        norm: nn.Module,
        sublayer: nn.Module,
        projection: nn.Module | None,
    ) -> torch.Tensor:
        """residual + dropout(update), then the norm in post-norm. `update` is what `sublayer` returned, the output
        of its `projection`: where that is our own linear layer's fresh output (or the dropout's) that nothing else
        holds (`may_write_over`), in the residual's dtype (autocast's bf16 update must be promoted, not rounded), the
        sum is written over it: a fresh (B, T, hidden) tensor costs page faults on CPU. F.linear keeps its input, not
        its output, for backward: the same values and gradients, bit for bit. On the AVX2-only AMD EPYC (the one
        class measured) a training step at nanoGPT's size (no biases) took 0.7-0.8% less; at the benchmark's GPT-2
        size a tie (docs/nanogpt.md)."""
        if self.training:
            update = dropout(update, self.residual_dropout.p, True)
        if (
            type(projection) is ScratchLinear  # another module (an adapter's) may keep its output for backward
            and update.dtype == residual.dtype
            and may_write_over(update, sublayer, projection)
        ):
            hidden_states = update.add_(residual)
        else:
            hidden_states = residual + update
        return hidden_states if self.pre_norm else norm(hidden_states)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        past_key_values=None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """(B, T, hidden) -> (B, T, hidden). Masks come prepared by the stack (see `scratch_masks.py`).
        Submodules are read from `_modules` once each: between a decoding step's products every lookup and call costs
        several times what it costs in a warm loop (docs/performance.md, "Python between the products")."""
        modules = self._modules
        attention, norm = modules["self_attn"], modules["attn_norm"]
        update, _ = attention(
            norm(hidden_states) if self.pre_norm else hidden_states,
            attention_mask=attention_mask,
            position_embeddings=position_embeddings,
            past_key_values=past_key_values,
            **kwargs,
        )
        # The layer whose output the sublayer returns (None where a sublayer of another kind was swapped in)
        projection = attention._modules.get("o_proj")
        hidden_states = self._add_residual(hidden_states, update, norm, attention, projection)
        if self.cross_attn is not None:
            attention, norm = modules["cross_attn"], modules["cross_attn_norm"]
            update, _ = attention(
                norm(hidden_states) if self.pre_norm else hidden_states,
                attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                encoder_hidden_states=encoder_hidden_states,
                **kwargs,
            )
            projection = attention._modules.get("o_proj")
            hidden_states = self._add_residual(hidden_states, update, norm, attention, projection)
        mlp, norm = modules["mlp"], modules["mlp_norm"]
        update = mlp(norm(hidden_states) if self.pre_norm else hidden_states)
        return self._add_residual(hidden_states, update, norm, mlp, mlp._modules.get("down_proj"))


def value_range(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(min, max) of an id tensor, read in one pass, for the range checks of SPEC section 10; None where its values
    are not read (`values_unreadable`)."""
    if values_unreadable(tensor):
        return None
    low, high = torch.aminmax(tensor)
    return int(low), int(high)


class ScratchEmbeddings(nn.Module):
    """input ids (B, T) -> (B, T, hidden): token embedding [x sqrt(hidden)] + token type + absolute position,
    then an optional norm and dropout. Rotary and ALiBi positions act inside attention instead."""

    def __init__(self, config, vocab_size: int, type_vocab_size: int = 0, input_name: str = "input_ids"):
        super().__init__()
        self.input_name = input_name  # what errors call the ids: the seq2seq decoder's are `decoder_input_ids`
        self.max_positions = config.max_position_embeddings
        self.embed_tokens = nn.Embedding(vocab_size, config.hidden_size, config.pad_token_id)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.token_type_embeddings = nn.Embedding(type_vocab_size, config.hidden_size) if type_vocab_size else None
        self.family_has_token_types = hasattr(config, "type_vocab_size")  # the encoder's knob; the others have none
        self.embed_positions = None
        if config.position_embedding_type == "learned":
            self.embed_positions = ScratchLearnedPositionalEmbedding(config.max_position_embeddings, config.hidden_size)
        elif config.position_embedding_type == "sinusoidal":
            self.embed_positions = ScratchSinusoidalPositionalEmbedding(
                config.max_position_embeddings, config.hidden_size, config.sinusoidal_layout
            )
        self.norm = make_norm(config) if config.embedding_norm else None
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)

    def check_ids(self, input_ids: torch.Tensor) -> None:
        """Out-of-range ids would index garbage or crash deep inside; name the problem instead (SPEC section 10)."""
        vocab_size = self.embed_tokens.weight.shape[0]  # tying may swap in a resized matrix
        span = value_range(input_ids)
        if span and (span[0] < 0 or span[1] >= vocab_size):
            raise ValueError(
                f"`{self.input_name}` must lie in [0, {vocab_size - 1}] (the vocabulary size is {vocab_size}), got "
                f"values from {span[0]} to {span[1]}. Does the tokenizer match the model?"
            )

    def check_positions(self, position_ids: torch.Tensor, span: tuple[int, int] | None = None) -> None:
        """`span`: the (first, last) position where the caller made the ids and knows them, so that they are not read
        back (an op and two reads between a training step's products)."""
        # A negative id would index the table from its end (sinusoidal) or crash inside `nn.Embedding` (learned).
        if span is None or torch.compiler.is_compiling():  # compiled, nothing is read (`value_range`)
            span = value_range(position_ids)
        if span and span[0] < 0:
            raise ValueError(f"`position_ids` must not be negative, got values from {span[0]} to {span[1]}.")
        if span:
            self.check_last_position(span[1])

    def check_last_position(self, last: int) -> None:
        """An input that reaches position `last` must fit the table of absolute positions (none with rotary or ALiBi
        positions: nothing to check)."""
        if self.embed_positions is not None and last >= self.max_positions:
            raise ValueError(
                f"The input reaches position {last}, but this model has "
                f"`max_position_embeddings={self.max_positions}` absolute positions; shorten or truncate the input. "
                # Raised part-way through `generate()` too, where a short prompt is not what to shorten.
                "In `generate()` the prompt and the new tokens share them: ask for fewer (`max_new_tokens`, "
                "`max_length`); prompt-lookup decoding also verifies up to `prompt_lookup_num_tokens` drafted tokens "
                "past `max_length`."
            )

    def check_token_types(self, token_type_ids: torch.Tensor) -> None:
        # Without a token-type table, all-zero types change nothing and pass (tokenizers send them by default).
        type_vocab_size = self.token_type_embeddings.num_embeddings if self.token_type_embeddings is not None else 0
        span = value_range(token_type_ids)
        if not span or 0 <= span[0] <= span[1] < max(type_vocab_size, 1):
            return
        if not type_vocab_size:
            raise ValueError(
                "`token_type_ids` were given, but this model has no token types; leave them out"
                + (" or build the model with `type_vocab_size`." if self.family_has_token_types else ".")
            )
        raise ValueError(
            f"`token_type_ids` must lie in [0, {type_vocab_size - 1}] (`type_vocab_size={type_vocab_size}`), got "
            f"values from {span[0]} to {span[1]}."
        )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_span: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """`position_span`: (first, last) of `position_ids` where the caller made them (`check_positions`)."""
        if inputs_embeds is None:
            self.check_ids(input_ids)
            inputs_embeds = self.embed_tokens(input_ids)
        # x 1.0 would change nothing and cost a pass over (B, T, hidden) forward and backward
        hidden_states = inputs_embeds * self.embed_scale if self.embed_scale != 1.0 else inputs_embeds
        if token_type_ids is not None:
            self.check_token_types(token_type_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(hidden_states.shape[:2], dtype=torch.long, device=hidden_states.device)
            hidden_states = hidden_states + self.token_type_embeddings(token_type_ids)
        if self.embed_positions is not None:
            self.check_positions(position_ids, position_span)
            hidden_states = hidden_states + self.embed_positions(position_ids).to(hidden_states.dtype)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return dropout(hidden_states, self.embedding_dropout.p, self.training)
