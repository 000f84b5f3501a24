"""The language-model losses: transformers' `ForCausalLMLoss` / `ForMaskedLMLoss`, with a faster CPU cross-entropy
(also label-smoothed, for the training scripts' objective); and the sequence-classification loss, counted as they
are under gradient accumulation.

On CPU, PyTorch's backward of `cross_entropy` over a (tokens, vocab) matrix (nll_loss backward into a zero-filled
matrix, then log_softmax backward) takes several times its forward: for 2048 x 8192 logits, forward and backward
cost 73-103 ms in fp32, 91-109 ms from bf16 logits (AVX-512 AMD EPYC). The gradient is softmax minus the one-hot
target; computed in one pass from the saved log-probabilities, forward and backward take 30 ms and 49-52 ms there
(docs/performance.md has the AVX2 figures). The log-probabilities are PyTorch's own (`log_softmax` in fp32, the
upcast transformers does), so the loss is the same; gradients agree to fp32 rounding. With label smoothing
(PyTorch's definition) the gradient is softmax minus the smoothed targets, in the same pass: 2048 x 8192 logits,
forward and backward, 34 ms against `F.cross_entropy`'s 81 in fp32, 54 against 114-131 from bf16 logits (AVX-512 AMD
EPYC). Its fixed cost (about twenty small operations and a Python `autograd.Function`, about 0.1 ms) is more than
its backward saves below about half a million logits (nanoGPT's 768 x 65: 0.18-0.29 ms against 0.10-0.15 ms), so
there, as on other devices, under `torch.compile` and under `torch.func` transforms, the loss is `F.cross_entropy`
as in transformers. Our backward cannot be differentiated again (create_graph=True): it says so and names the way
out.
"""

import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForSequenceClassificationLoss

from .scratch_linear import inside_torch_func

# Fewer logits (tokens x vocabulary) than this take `F.cross_entropy`. Measured in fp32 and bf16, AVX-512 and AVX2
# (docs/nanogpt.md): ours was 1.6-1.9x slower at 50 thousand logits, on a par from 130 to 520 thousand (0.8-1.4x),
# faster from 650 thousand (1.1-1.6x in 7 cases of 8) and 1.5-2.5x from 2 million.
MIN_LOGITS = 600_000


def _label_index(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """labels (N,) -> (N, 1) column indices, ignored rows pointing at column 0 (their weight is 0)."""
    return labels.masked_fill(labels == ignore_index, 0)[:, None]


class _SummedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy against targets smoothed by `smoothing` (PyTorch's `label_smoothing`: (1 - smoothing) on
    the label, smoothing / V on every class; 0 is the negative log-likelihood): logits (N, V) in any float dtype,
    labels (N,) -> fp32 scalar, rows labelled `ignore_index` counting for nothing. Also returns the (N, V) fp32
    log-probabilities, which backward reuses."""

    @staticmethod
    def forward(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, smoothing: float):
        fp32_logits = logits.float()  # (N, V); a fresh copy unless the logits are fp32 already
        if fp32_logits is logits:  # the caller's tensor (the model output's `logits`): never written
            log_probs = torch.log_softmax(fp32_logits, dim=-1)
        else:
            # Into the copy: one fresh (N, V) fp32 buffer, not two. Its page faults cost as much as the arithmetic:
            # 2048 x 8192 from bf16, 21 against 39 ms (AVX-512 AMD EPYC). The kernel takes a row's maximum and sum
            # before it writes the row, each output from its own input: the same values, bit for bit (test_loss).
            log_probs = torch.log_softmax(fp32_logits, dim=-1, out=fp32_logits)
        row_loss = -log_probs.gather(-1, _label_index(labels, ignore_index)).squeeze(-1)  # (N,)
        if smoothing:
            row_loss = (1 - smoothing) * row_loss - smoothing / log_probs.shape[-1] * log_probs.sum(-1)
        return (row_loss * (labels != ignore_index)).sum(), log_probs

    @staticmethod
    def setup_context(ctx, inputs, outputs) -> None:
        logits, labels, ignore_index, smoothing = inputs
        ctx.mark_non_differentiable(outputs[1])
        ctx.set_materialize_grads(False)  # no zero-filled (N, V) gradient for the log-probabilities output
        ctx.save_for_backward(outputs[1], labels)
        ctx.ignore_index, ctx.smoothing, ctx.logits_dtype = ignore_index, smoothing, logits.dtype

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_log_probs: None):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "The Scratch language-model loss computes its gradient from saved log-probabilities and cannot be "
                "differentiated twice (create_graph=True) on CPU; set `model.loss_function` to transformers' "
                "`ForCausalLMLoss` / `ForMaskedLMLoss` (transformers.loss.loss_utils) for that."
            )
        log_probs, labels = ctx.saved_tensors
        index = _label_index(labels, ctx.ignore_index)
        row_weight = (labels != ctx.ignore_index).to(log_probs.dtype)[:, None] * grad_loss  # (N, 1)
        # softmax - targets, written over the saved log-probabilities: a fresh (N, V) buffer costs as much as the
        # arithmetic (page faults). A second backward through this graph (retain_graph=True) would need them:
        # autograd then raises, as for any saved tensor modified in place.
        probs = log_probs.exp_()
        if ctx.smoothing:
            probs.sub_(ctx.smoothing / probs.shape[-1])
        label_weight = torch.full_like(row_weight, ctx.smoothing - 1)
        grad_logits = probs.scatter_add_(-1, index, label_weight).mul_(row_weight)
        return grad_logits.to(ctx.logits_dtype), None, None, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """`F.cross_entropy(logits.float(), labels, ignore_index=..., reduction=..., label_smoothing=...)` for reduction
    "mean" or "sum"; logits (N, V), labels (N,)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"`reduction` must be \"mean\" or \"sum\", got {reduction!r}.")
    if not 0.0 <= label_smoothing <= 1.0:  # as F.cross_entropy checks it
        raise ValueError(f"`label_smoothing` must be between 0.0 and 1.0, got {label_smoothing}.")
    if (logits.device.type != "cpu" or torch.compiler.is_compiling() or logits.numel() < MIN_LOGITS
            or inside_torch_func()):
        return F.cross_entropy(logits.float(), labels, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    total, _ = _SummedCrossEntropy.apply(logits, labels, ignore_index, label_smoothing)
    if reduction == "sum":
        return total
    return total / (labels != ignore_index).sum()  # the mean over counted rows; 0 / 0 = nan, as F.cross_entropy


def check_label_ids(labels: torch.Tensor, vocab_size: int, ignore_index: int = -100) -> None:
    """Labels must be integer token ids in [0, vocab_size) or `ignore_index`: a float or out-of-range label would
    otherwise fail inside the loss's gather (CPU) or a device-side assert (CUDA), naming neither (SPEC section 10).
    The range is read from the data, so it is not checked while compiling or under `torch.func` transforms."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"`labels` must be integer token ids, got dtype {labels.dtype}.")
    if torch.compiler.is_compiling() or inside_torch_func() or labels.numel() == 0:
        return
    low, high = (int(value) for value in torch.aminmax(labels))
    if 0 <= low and high < vocab_size:  # nothing ignored, nothing out of range: one read, no masked copy
        return
    low, high = torch.aminmax(labels.masked_fill(labels == ignore_index, 0))
    if low < 0 or high >= vocab_size:
        wrong = labels[(labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))].unique()
        raise ValueError(
            f"`labels` must lie in [0, {vocab_size - 1}] (the vocabulary size is {vocab_size}) or be {ignore_index} "
            f"(ignored), got {wrong[:5].tolist()}{' ...' if len(wrong) > 5 else ''}."
        )


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, num_items_in_batch=None,
            ignore_index: int = -100, shift_labels: torch.Tensor | None = None, *, shift: bool, **kwargs):
    """transformers' `ForCausalLMLoss` (shift=True: position t predicts label t + 1, or `shift_labels` as given)
    and `ForMaskedLMLoss` (shift=False), same arguments: logits (..., V), labels (...). With
    `num_items_in_batch` (Trainer's gradient accumulation) the sum is divided by it, otherwise the mean."""
    if shift and shift_labels is None:
        # Checked before the shift pads them with `ignore_index`: unpadded labels then pass in one read.
        check_label_ids(labels[..., 1:], vocab_size, ignore_index)
        targets = F.pad(labels[..., 1:], (0, 1), value=ignore_index).reshape(-1).to(logits.device)
    else:
        targets = (shift_labels if shift else labels).reshape(-1).to(logits.device)
        check_label_ids(targets, vocab_size, ignore_index)
    if num_items_in_batch is None:
        return cross_entropy(logits.reshape(-1, vocab_size), targets, ignore_index, "mean")
    total = cross_entropy(logits.reshape(-1, vocab_size), targets, ignore_index, "sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def sequence_classification_loss(labels: torch.Tensor, pooled_logits: torch.Tensor, config, num_items_in_batch=None,
                                 **kwargs) -> torch.Tensor:
    """transformers' `ForSequenceClassificationLoss` (regression, single- or multi-label by `config.problem_type`), a
    mean over the batch. With `num_items_in_batch` (Trainer's gradient accumulation, which then leaves the loss
    undivided by the number of micro-batches) the sum over this batch divided by it instead: transformers' own ignores
    the count except for cross-entropy, which made accumulated updates that many times too large."""
    loss = ForSequenceClassificationLoss(labels, pooled_logits, config, num_items_in_batch=num_items_in_batch)
    if num_items_in_batch is None or config.problem_type == "single_label_classification":
        return loss  # cross-entropy divides its sum by the count itself
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss * labels.numel() / num_items_in_batch  # MSE and BCE average every label value, which Trainer counts
