"""Position information, the four kinds of SPEC section 3.

- `sinusoidal`: the fixed table of Vaswani et al. (2017), section 3.5, added to the token embeddings.
- `learned`: a trained table (GPT-2, BERT), added to the token embeddings.
- `rope`: rotary embeddings (Su et al., 2021) applied to queries and keys inside attention; configured through
  `rope_parameters` so that transformers' `ROPE_INIT_FUNCTIONS` scaling types (linear, dynamic, yarn, ...) work.
- `alibi`: a per-head linear distance penalty added to the attention scores (Press et al., 2022).

Tables that are computed, not trained (sinusoid table, inverse frequencies, ALiBi slopes), are non-persistent
buffers: `from_pretrained` builds the model on the meta device, so `_init_weights` refills them through
`reset_buffers()` (see `modeling_scratch_common.py`).
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update


def sinusoidal_table(num_positions: int, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """Angles pos / 10000^(2i/d), shape (num_positions, dim). "interleaved": PE[pos, 2i] = sin, PE[pos, 2i+1] = cos
    (the paper); "split": sines in the first half, cosines in the second (tensor2tensor, fairseq, Marian)."""
    # float64 angles: at position 1000 a float32 angle is already off by about 1e-4.
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    angles = position * inv_freq  # (num_positions, dim / 2)
    if layout == "split":
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    else:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
    return table.float()


class ScratchSinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoid table indexed by position ids: (batch, seq) -> (batch, seq, hidden)."""

    def __init__(self, num_positions: int, dim: int, layout: str = "interleaved"):
        super().__init__()
        self.layout = layout
        self.weight = nn.Buffer(sinusoidal_table(num_positions, dim, layout), persistent=False)

    def reset_buffers(self) -> None:
        init.copy_(self.weight, sinusoidal_table(*self.weight.shape, self.layout))

    def forward(self, position_ids: torch.LongTensor) -> torch.Tensor:
        return self.weight[position_ids]


class ScratchLearnedPositionalEmbedding(nn.Embedding):
    """Trained table indexed by position ids: (batch, seq) -> (batch, seq, hidden); `nn.Embedding` itself."""


class ScratchRotaryEmbedding(nn.Module):
    """cos/sin tables for rotary embeddings: position ids (batch, seq) -> two tensors (batch, seq, head_dim)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rope_type = config.rope_parameters["rope_type"]
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        inv_freq, self.attention_scaling = self._rope_init_fn(config)
        self.inv_freq = nn.Buffer(inv_freq, persistent=False)
        # Read by `dynamic_rope_update` to restore the frequencies after a long input.
        self.original_inv_freq = nn.Buffer(inv_freq.clone(), persistent=False)

    @property
    def _rope_init_fn(self) -> Callable:
        if self.rope_type == "default":
            return self.compute_default_rope_parameters
        return ROPE_INIT_FUNCTIONS[self.rope_type]

    @staticmethod
    def compute_default_rope_parameters(config, device=None, seq_len=None) -> tuple[torch.Tensor, float]:
        """theta_i = base^(-2i/d) for i in [0, d/2): the frequencies of the RoFormer paper, eq. (15)."""
        base = config.rope_parameters["rope_theta"]
        dim = config.head_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device, torch.float) / dim))
        return inv_freq, 1.0

    def reset_buffers(self) -> None:
        inv_freq, _ = self._rope_init_fn(self.config)
        init.copy_(self.inv_freq, inv_freq)
        init.copy_(self.original_inv_freq, inv_freq)

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq  # (batch, seq, head_dim / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (batch, seq, head_dim)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys (batch, heads, seq, head_dim) by the tables (batch, seq, head_dim):
    x * cos + rotate_half(x) * sin, where rotate_half(x) = (-x2, x1) for the halves (x1, x2) of the head."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Geometric slopes 2^(-8/n), 2^(-16/n), ...; for a head count that is not a power of two, the extra heads
    take every other slope of the next power of two (Press et al., 2022, and their reference code)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** (i + 1) for i in range(closest)]
    if closest < num_heads:
        extra_base = 2.0 ** (-4.0 / closest)
        slopes += [extra_base ** (2 * i + 1) for i in range(num_heads - closest)]
    return torch.tensor(slopes, dtype=torch.float32)


class ScratchAlibiBias(nn.Module):
    """Additive attention bias -slope_h * |i - j| for query index i and key index j: (1, heads, q_len, kv_len).

    Indices count from the start of the (cached) sequence; with left padding the real tokens are contiguous, so
    index distances equal position distances, and padded keys are masked anyway.
    """

    def __init__(self, num_heads: int):
        super().__init__()
        self.slopes = nn.Buffer(alibi_slopes(num_heads), persistent=False)

    def reset_buffers(self) -> None:
        init.copy_(self.slopes, alibi_slopes(self.slopes.shape[0]))

    def forward(self, q_len: int, kv_len: int, q_offset, kv_offset, dtype: torch.dtype) -> torch.Tensor:
        device = self.slopes.device
        query_index = torch.arange(q_len, device=device) + q_offset
        key_index = torch.arange(kv_len, device=device) + kv_offset
        distance = (query_index[:, None] - key_index[None, :]).abs()  # (q_len, kv_len)
        return self.from_distance(distance[None, None], dtype)

    def from_distance(self, distance: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Bias (batch, heads, q_len, kv_len) from query-key distances (batch, 1, q_len, kv_len)."""
        return (-self.slopes[:, None, None] * distance).to(dtype)

    def packed(self, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Bias for requests packed in one row, as continuous batching runs them, from its block-diagonal causal
        mask (1, 1, q_len, kv_len) alone. A query sees a run of consecutive positions of its own request, ending at
        itself (keys come out of the paged cache in position order, a sliding window only shortens the run), so
        its distance to a visible key is the number of visible keys after that key in its row. Hidden keys get some
        bias too; the mask hides them anyway."""
        visible = mask if mask.dtype == torch.bool else mask == 0
        distance = visible.flip(-1).cumsum(-1).flip(-1) - 1  # visible keys from each key on, less the key itself
        return self.from_distance(distance, dtype)
