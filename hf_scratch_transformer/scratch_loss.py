"""The language-model losses: transformers' `ForCausalLMLoss` / `ForMaskedLMLoss`, with a faster CPU cross-entropy
(also label-smoothed, for the training scripts' objective); the sequence-classification and multiple-choice losses,
counted as they are under gradient accumulation; and transformers' classification losses with their class ids checked
first.

On CPU, PyTorch's backward of `cross_entropy` over a (tokens, vocab) matrix (nll_loss backward into a zero-filled
matrix, then log_softmax backward) takes several times its forward: for 2048 x 8192 logits, forward and backward
cost 73-103 ms in fp32, 91-109 ms from bf16 logits (AVX-512 AMD EPYC). The gradient is softmax minus the one-hot
target; computed in one pass from the saved log-probabilities, forward and backward take 30 ms there from fp32,
29-33 ms from bf16, whose log-probabilities are computed a chunk of rows at a time, in forward and again in backward
(docs/performance.md has the AVX2 figures). The log-probabilities are PyTorch's own (`log_softmax` in fp32, the
upcast transformers does), so the loss is the same; gradients agree to fp32 rounding. With label smoothing
(PyTorch's definition) the gradient is softmax minus the smoothed targets, in the same pass: 2048 x 8192 logits,
forward and backward, 34 ms against `F.cross_entropy`'s 81 in fp32, 31 against 118 from bf16 logits (AVX-512 AMD
EPYC). Its fixed cost (about twenty small operations and a Python `autograd.Function`, about 0.1 ms) is more than
its backward saves below about half a million logits (nanoGPT's 768 x 65: 0.18-0.29 ms against 0.10-0.15 ms), so
there, as on other devices, under `torch.compile` and under `torch.func` transforms, the loss is `F.cross_entropy`
as in transformers. Our backward cannot be differentiated again (create_graph=True): it says so and names the way
out.
"""

import torch
import torch.nn.functional as F
from transformers.loss.loss_utils import ForSequenceClassificationLoss, fixed_cross_entropy

from .linear_kernels import inside_torch_func
from .value_checks import values_unreadable

# Fewer logits (tokens x vocabulary) than this take `F.cross_entropy`. Measured in fp32 and bf16, AVX-512 and AVX2
# (docs/nanogpt.md): ours was 1.6-1.9x slower at 50 thousand logits, on a par from 130 to 520 thousand (0.8-1.4x),
# faster from 650 thousand (1.1-1.6x in 7 cases of 8) and 1.5-2.5x from 2 million.
MIN_LOGITS = 600_000


def _label_index(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """labels (N,) -> (N, 1) column indices, ignored rows pointing at column 0 (their weight is 0)."""
    return labels.masked_fill(labels == ignore_index, 0)[:, None]


# Logits that are not fp32 go through the loss this many bytes of fp32 at a time (about a hundred rows of a
# vocabulary of 8192): a chunk stays in the caches and its buffer is reused, where the whole (N, V) fp32 copy was a
# fresh allocation whose page faults cost as much as the arithmetic.
CHUNK_BYTES = 4 << 20


def _row_losses(log_probs: torch.Tensor, index: torch.Tensor, smoothing: float, out: torch.Tensor) -> None:
    """log_probs (n, V) fp32, index (n, 1) -> each row's loss against the smoothed target, written into out (n,)."""
    torch.gather(log_probs, -1, index, out=out[:, None]).neg_()
    if smoothing:
        out.mul_(1 - smoothing).sub_(log_probs.sum(-1), alpha=smoothing / log_probs.shape[-1])


def _softmax_minus_targets_(log_probs: torch.Tensor, index: torch.Tensor, row_weight: torch.Tensor,
                            smoothing: float) -> torch.Tensor:
    """The gradient of the rows' weighted losses, (softmax - smoothed target) * row_weight, written over log_probs
    (n, V) fp32; index and row_weight (n, 1)."""
    probs = log_probs.exp_()
    if smoothing:
        probs.sub_(smoothing / probs.shape[-1])
    label_weight = torch.full_like(row_weight, smoothing - 1)
    return probs.scatter_add_(-1, index, label_weight).mul_(row_weight)


class _SummedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy against targets smoothed by `smoothing` (PyTorch's `label_smoothing`: (1 - smoothing) on
    the label, smoothing / V on every class; 0 is the negative log-likelihood): logits (N, V) in any float dtype,
    labels (N,) -> fp32 scalar, rows labelled `ignore_index` counting for nothing.

    fp32 logits: the (N, V) log-probabilities are saved, and backward writes the gradient over them. Other dtypes:
    the fp32 log-probabilities exist one chunk of rows at a time (`CHUNK_BYTES`), forward and backward (which
    computes them again from the saved logits): no (N, V) fp32 buffer at all. Recomputing costs more than it saves
    for fp32 logits, whose gradient is an (N, V) fp32 buffer anyway. 2048 x 8192, forward and backward: from bf16
    29-33 against 45-48 ms with the whole fp32 copy, fp32 37 ms saved against 42-46 recomputed (AVX-512 AMD EPYC)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, smoothing: float):
        index = _label_index(labels, ignore_index)
        row_loss = torch.empty(labels.shape, dtype=torch.float32, device=logits.device)  # (N,)
        if logits.dtype == torch.float32:
            log_probs = torch.log_softmax(logits, dim=-1)  # a new tensor: the caller's logits are never written
            _row_losses(log_probs, index, smoothing, row_loss)
            ctx.save_for_backward(log_probs, labels)
        else:
            for rows, log_probs in _fp32_log_probs_by_chunk(logits):
                _row_losses(log_probs, index[rows], smoothing, row_loss[rows])
            ctx.save_for_backward(logits, labels)
        ctx.ignore_index, ctx.smoothing = ignore_index, smoothing
        # Selected, not multiplied: an ignored row's non-finite logits (fp16 overflow, nan at padding) make its loss
        # nan or inf, and 0 x that made the whole loss nan, where PyTorch's skips the row.
        return torch.where(labels != ignore_index, row_loss, 0.0).sum()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "The Scratch language-model loss computes its gradient from saved log-probabilities and cannot be "
                "differentiated twice (create_graph=True) on CPU; set `model.loss_function` to transformers' "
                "`ForCausalLMLoss` / `ForMaskedLMLoss` (transformers.loss.loss_utils) for that."
            )
        saved, labels = ctx.saved_tensors
        index = _label_index(labels, ctx.ignore_index)
        # Selected, not multiplied: with every label ignored the mean is 0 / 0 and `grad_loss` not finite, and
        # 0 x inf made every gradient nan, where PyTorch's are zeros.
        row_weight = torch.where(labels[:, None] != ctx.ignore_index, grad_loss.float(), 0.0)  # (N, 1)
        if saved.dtype == torch.float32:
            # Over the saved log-probabilities: a fresh (N, V) buffer costs as much as the arithmetic (page faults).
            # A second backward through this graph (retain_graph=True) would need them: autograd then raises, as for
            # any saved tensor modified in place.
            return _softmax_minus_targets_(saved, index, row_weight, ctx.smoothing), None, None, None
        grad_logits = torch.empty_like(saved)
        for rows, log_probs in _fp32_log_probs_by_chunk(saved):
            grad_logits[rows] = _softmax_minus_targets_(log_probs, index[rows], row_weight[rows], ctx.smoothing)
        return grad_logits, None, None, None


def _fp32_log_probs_by_chunk(logits: torch.Tensor):
    """logits (N, V) -> (rows, log_probs) for consecutive slices of rows, log_probs (n, V) fp32 in one reused
    buffer: `log_softmax` of the upcast rows, bit for bit (the kernel reads a row's maximum and sum before it writes
    the row)."""
    rows_per_chunk = max(1, CHUNK_BYTES // (4 * logits.shape[-1]))
    buffer = torch.empty(min(rows_per_chunk, logits.shape[0]), logits.shape[-1], device=logits.device)
    for start in range(0, logits.shape[0], rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        chunk = buffer[:logits[rows].shape[0]]
        yield rows, torch.log_softmax(chunk.copy_(logits[rows]), dim=-1, out=chunk)


def widened(logits: torch.Tensor) -> torch.Tensor:
    """Logits in at least fp32, the precision of the loss: transformers' losses widen with `.float()`, which rounded a
    float64 model's logits and loss to fp32 (native BERT's and Marian's own `CrossEntropyLoss` keeps float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """`F.cross_entropy(logits.float(), labels, ignore_index=..., reduction=..., label_smoothing=...)` for reduction
    "mean" or "sum"; logits (N, V), labels (N,). float64 logits stay float64 (`widened`)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"`reduction` must be \"mean\" or \"sum\", got {reduction!r}.")
    if not 0.0 <= label_smoothing <= 1.0:  # as F.cross_entropy checks it
        raise ValueError(f"`label_smoothing` must be between 0.0 and 1.0, got {label_smoothing}.")
    if (logits.dtype == torch.float64 or logits.device.type != "cpu" or torch.compiler.is_compiling()
            or logits.numel() < MIN_LOGITS or inside_torch_func()):
        return F.cross_entropy(widened(logits), labels, ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)
    total = _SummedCrossEntropy.apply(logits, labels, ignore_index, label_smoothing)
    if reduction == "sum":
        return total
    return total / (labels != ignore_index).sum()  # the mean over counted rows; 0 / 0 = nan, as F.cross_entropy


def check_label_ids(labels: torch.Tensor, num_ids: int, ignore_index: int = -100, kind: str = "token") -> None:
    """Labels must be integer ids in [0, num_ids) or `ignore_index`: a float or out-of-range label would otherwise
    fail inside the loss's gather (CPU) or a device-side assert (CUDA), naming neither (SPEC section 10). `kind`
    "token": token ids of a vocabulary of `num_ids`; "class": class ids of `num_labels` = `num_ids` classes; "choice":
    the index of one of `num_ids` choices. The range is read from the data, so it is not checked where those are not
    read (`values_unreadable`)."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"`labels` must be integer {kind} ids, got dtype {labels.dtype}.")
    if values_unreadable(labels):
        return
    low, high = (int(value) for value in torch.aminmax(labels))
    if 0 <= low and high < num_ids:  # nothing ignored, nothing out of range: one read, no masked copy
        return
    low, high = torch.aminmax(labels.masked_fill(labels == ignore_index, 0))
    if low < 0 or high >= num_ids:
        wrong = labels[(labels != ignore_index) & ((labels < 0) | (labels >= num_ids))].unique()
        size = {"token": f"the vocabulary size is {num_ids}", "class": f"`num_labels` is {num_ids}",
                "choice": f"each row has {num_ids} choices"}[kind]
        raise ValueError(
            f"`labels` must lie in [0, {num_ids - 1}] ({size}) or be {ignore_index} "
            f"(ignored), got {wrong[:5].tolist()}{' ...' if len(wrong) > 5 else ''}."
        )


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, num_items_in_batch=None,
            ignore_index: int = -100, shift_labels: torch.Tensor | None = None, *, shift: bool, **kwargs):
    """transformers' `ForCausalLMLoss` (shift=True: position t predicts label t + 1, or `shift_labels` as given)
    and `ForMaskedLMLoss` (shift=False), same arguments: logits (..., V), labels (...). With
    `num_items_in_batch` (Trainer's gradient accumulation) the sum is divided by it, otherwise the mean."""
    if shift and shift_labels is None:
        # Checked before the shift pads them with `ignore_index`: unpadded labels then pass in one read.
        following = labels[..., 1:]  # each position's target: the next label
        check_label_ids(following, vocab_size, ignore_index)
        targets = F.pad(following, (0, 1), value=ignore_index).reshape(-1).to(logits.device)
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
    if config.problem_type == "single_label_classification" or (
        config.problem_type is None and config.num_labels > 1 and labels.dtype in (torch.long, torch.int)
    ):  # transformers' own rule for a single-label problem: cross-entropy, which fails on a class id out of range
        check_label_ids(labels, config.num_labels, kind="class")
    loss = ForSequenceClassificationLoss(labels, pooled_logits, config, num_items_in_batch=num_items_in_batch)
    if num_items_in_batch is None or config.problem_type == "single_label_classification":
        return loss  # cross-entropy divides its sum by the count itself
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss * labels.numel() / num_items_in_batch  # MSE and BCE average every label value, which Trainer counts


def token_classification_loss(logits: torch.Tensor, labels: torch.Tensor, config, **kwargs) -> torch.Tensor:
    """transformers' `ForTokenClassification`, with each label checked to be a class id or -100 first: one out of
    range failed inside the cross-entropy with an IndexError (SPEC section 10); float64 logits kept (`widened`)."""
    check_label_ids(labels, config.num_labels, kind="class")
    return fixed_cross_entropy(widened(logits).reshape(-1, config.num_labels), labels.reshape(-1).to(logits.device),
                               **kwargs)


def multiple_choice_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None, ignore_index: int = -100,
                         **kwargs) -> torch.Tensor:
    """The cross-entropy of each row's choice scores, logits (B, C), against the right choice's index, labels (B,),
    as `BertForMultipleChoice`'s, with each label checked to be a choice first. With `num_items_in_batch` (Trainer's
    gradient accumulation) the sum divided by it: BERT's mean made accumulated updates that many times too large."""
    check_label_ids(labels, logits.shape[-1], ignore_index, kind="choice")
    return fixed_cross_entropy(widened(logits), labels.to(logits.device), num_items_in_batch, ignore_index)
