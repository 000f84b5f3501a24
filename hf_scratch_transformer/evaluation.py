"""What the training and fine-tuning commands evaluate: the validation loss weighted by token (not by batch), and
the metrics each task reports (perplexity, masked-LM accuracy, BLEU/chrF, accuracy and macro-F1, entity F1, a
regressor's MSE and correlations, the accuracy of multiple choice). No model file imports this module.
"""

import math
from collections.abc import Callable

import numpy as np
import torch
from torch.nn import functional as F

from hf_scratch_transformer.training import next_token_labels


def summed_token_losses(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """logits (batch, length, vocab), labels (batch, length) -> (batch, 2): each sequence's summed cross-entropy
    over its labelled tokens (-100 ignored) and their count. `shift=True` for a causal LM (its `loss_type`
    "ForCausalLM"), whose position t predicts label t + 1. With `sparse_prediction` a masked LM gives (N, vocab)
    logits for its N labelled positions only, in order. A single-label sequence classifier's logits (batch, classes)
    and labels (batch,) are one labelled token per sequence. In fp32 a sequence at a time, as the models' losses
    upcast: no fp32 copy of a whole batch of bf16 logits."""
    if labels.dim() == 1:
        logits, labels = logits[:, None], labels[:, None]
    if shift:
        labels = next_token_labels(labels)
    labels = labels.to(logits.device)
    counts = (labels != -100).sum(-1)
    if logits.dim() > 2:
        sequences = zip(logits, labels, strict=True)  # (length, vocab), (length,)
    else:
        sequences = zip(logits.split(counts.tolist()), labels[labels != -100].split(counts.tolist()), strict=True)
    sums = [F.cross_entropy(sequence_logits.float(), sequence_labels, reduction="sum")
            for sequence_logits, sequence_labels in sequences]
    return torch.stack([torch.stack(sums), counts.float()], dim=-1)


def summed_span_losses(start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor,
                       end_positions: torch.Tensor) -> torch.Tensor:
    """A question-answering window's two labelled tokens, its answer's first and last: logits (batch, length) twice,
    positions (batch,) twice -> (batch, 2) as `summed_token_losses`. Positions are clamped to [0, length] and one
    at `length` counts nothing, as transformers' question-answering loss (the mean of the start and the end
    cross-entropy) takes them: the windows' summed losses over their count are that loss."""
    logits = torch.stack([start_logits, end_logits], dim=1)  # (batch, 2, length)
    length = logits.shape[-1]
    labels = torch.stack([start_positions.view(-1), end_positions.view(-1)], dim=1).to(logits.device).clamp(0, length)
    return summed_token_losses(logits, labels.masked_fill(labels == length, -100), shift=False)


def summed_squared_errors(predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A regressor's scores (batch, 1) and labels (batch,) -> (batch, 2) as `summed_token_losses`: each row's squared
    error and a count of one, whose sum over the count is the mean squared error transformers' regression loss is."""
    errors = (predictions.reshape(labels.shape).double() - labels.to(predictions.device).double()) ** 2
    return torch.stack([errors, torch.ones_like(errors)], dim=-1)


class TokenWeightedEvaluationLoss:
    """`Trainer` mixin: the evaluation loss is the mean cross-entropy over every labelled token of the evaluation
    set, the loss the training steps minimise and the Accelerate loop reports. Trainer's is the mean of each batch's
    mean, each batch counted by its number of sequences, so it moved with the evaluation batch size whenever sequences
    carry different numbers of labels (masked LM, seq2seq): 5.669, 5.681, 5.691 for the same weights at batches of
    4, 2, 1. A question-answering window counts its answer's first and last token (`summed_span_losses`). Each
    sequence's summed loss and count are taken from the forward that computes the loss (a hook: the seq2seq trainer
    calls the model itself) and gathered per batch with `gather_for_metrics`, which drops the repeats Accelerate pads
    the last batch of each process with: Trainer's own kept the mean of such a batch for its real sequences, and the
    loss moved with the number of processes (a text classifier's 0.6905 in two processes of batch 2 for the 5 texts'
    0.6977; question answering's 3.2969 for its 73 windows' 3.2957). Under a `compute_loss_func` (label smoothing)
    Trainer gives the model no labels: they are taken from the batch `compute_loss` was given."""

    _labels_of_the_loss: torch.Tensor | None = None  # the batch's labels while `compute_loss` runs

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        self._token_losses, recorded = torch.zeros(2, dtype=torch.float64), []
        shift = getattr(self.accelerator.unwrap_model(self.model), "loss_type", None) == "ForCausalLM"

        def record(module, inputs, kwargs, outputs) -> None:  # forwards with labels only: not generate()'s steps
            labels = kwargs.get("labels")
            if labels is None:
                labels = self._labels_of_the_loss
            if labels is not None and labels.is_floating_point():  # a regressor's scores
                recorded.append(summed_squared_errors(outputs.logits.detach(), labels))
            elif labels is not None:
                recorded.append(summed_token_losses(outputs.logits.detach(), labels, shift))
            elif kwargs.get("start_positions") is not None and kwargs.get("end_positions") is not None:
                recorded.append(summed_span_losses(outputs.start_logits.detach(), outputs.end_logits.detach(),
                                                   kwargs["start_positions"], kwargs["end_positions"]))

        self._recorded_token_losses = recorded
        hook = self.model.register_forward_hook(record, with_kwargs=True)
        try:
            output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        finally:
            hook.remove()
        summed, count = self._token_losses.tolist()
        if count:
            output.metrics[f"{metric_key_prefix}_loss"] = summed / count
        return output

    def compute_loss(self, model, inputs, *args, **kwargs):
        # Trainer pops the labels before the forward when it has a `compute_loss_func`: without them the hook
        # recorded nothing, and the loss was Trainer's mean of batch means again (6.38 in two processes, 4.78 in one)
        self._labels_of_the_loss = inputs.get("labels")
        try:
            return super().compute_loss(model, inputs, *args, **kwargs)
        finally:
            self._labels_of_the_loss = None

    def prediction_step(self, *args, **kwargs):
        result = super().prediction_step(*args, **kwargs)
        recorded = getattr(self, "_recorded_token_losses", None)
        if recorded:  # in step on every process: each takes the same number of batches
            per_sequence = self.accelerator.gather_for_metrics(recorded.pop())  # (sequences of every process, 2)
            recorded.clear()
            self._token_losses += per_sequence.sum(0).cpu().double()
        return result


# ---------------------------------------------------------------------------------------------- metrics


def perplexity(eval_loss: float) -> float:
    return math.exp(min(eval_loss, 100.0))


def argmax_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`Trainer(preprocess_logits_for_metrics=...)`: predictions (batch, length), not (batch, length, vocab) logits.
    With `sparse_prediction` the model gives (N, vocab) logits for the N labelled positions only, in order; they are
    put back in place (-100 elsewhere), so that the predictions are shaped like the labels: Trainer trims a last,
    short batch by examples, which would cut a flat list of predictions at the wrong place."""
    predictions = logits.argmax(-1)
    if predictions.shape == labels.shape:
        return predictions
    placed = torch.full_like(labels, -100)
    placed[labels != -100] = predictions
    return placed


def mlm_accuracy(eval_prediction) -> dict:
    """Share of masked tokens (labels other than -100) predicted exactly, and how many there were (none: no share)."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    masked = labels != -100
    if not masked.any():
        return {"masked_tokens": 0}
    return {"mlm_accuracy": float((predictions[masked] == labels[masked]).mean()), "masked_tokens": int(masked.sum())}


def translation_metrics(tokenizer, references: list[str]) -> Callable:
    """`Seq2SeqTrainer(compute_metrics=...)` with `predict_with_generate`: corpus BLEU and chrF (sacrebleu's defaults,
    as `evaluate`'s "sacrebleu" and "chrf") of the generated translations, decoded without special tokens, against
    `references`, the evaluation set's target texts in its order: one reference each, as sacrebleu scores a system's
    output against a reference file. The labels decoded (run_translation.py's references) are not those texts: cut
    at --max-length, and told apart by the tokenizer's decoding (WordPiece's "U - Bahn" for "U-Bahn", an `<unk>`
    dropped, a lower-casing normalizer), they moved the scores."""
    import sacrebleu

    def compute(eval_prediction) -> dict:
        predictions = eval_prediction.predictions
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} translations for {len(references)} references: the metrics score "
                             "the evaluation set they were made for")
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        hypotheses = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
                "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}

    return compute


def classification_metrics(eval_prediction) -> dict:
    """Accuracy and macro-F1 over labelled items (sequences, or tokens with -100 for the unlabelled ones). Macro-F1
    averages every class found in the labels or the predictions, as scikit-learn's does: a class only ever
    predicted (wrongly) counts, with F1 0."""
    return _accuracy_and_macro_f1(*_predicted_ids(eval_prediction))


def regression_metrics(eval_prediction) -> dict:
    """A regressor's mean squared error and Pearson's and Spearman's correlations of its scores with the labels, as
    run_glue reports them for STS-B (Spearman's: Pearson's of the ranks, ties ranked by their mean, as SciPy's)."""
    scores = np.asarray(eval_prediction.predictions, dtype=np.float64).reshape(-1)
    labels = np.asarray(eval_prediction.label_ids, dtype=np.float64).reshape(-1)
    return {"mse": float(np.mean((scores - labels) ** 2)), "pearson": _pearson(scores, labels),
            "spearman": _pearson(_ranks(scores), _ranks(labels))}


def _pearson(first: np.ndarray, second: np.ndarray) -> float:
    """Pearson's correlation; NaN where either side is constant (no correlation to measure), as SciPy gives it."""
    if np.ptp(first) == 0 or np.ptp(second) == 0:  # not by the spread below: a constant's mean is rounded
        return float("nan")
    first, second = first - first.mean(), second - second.mean()
    spread = math.sqrt(float(np.sum(first**2) * np.sum(second**2)))
    return float(np.sum(first * second) / spread) if spread else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's rank from 1, tied values sharing their mean rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def choice_accuracy(eval_prediction) -> dict:
    """The share of rows whose highest-scored choice is the right one (run_swag's accuracy); logits (rows, choices)."""
    predictions, labels = _predicted_ids(eval_prediction)
    return {"accuracy": float((predictions == labels)[labels != -100].mean())}


def _predicted_ids(eval_prediction) -> tuple[np.ndarray, np.ndarray]:
    """(predicted ids, labels) of an `EvalPrediction` whose predictions are ids or logits (one more dimension)."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    if predictions.ndim == labels.ndim + 1:  # logits
        predictions = predictions.argmax(-1)
    return predictions, labels


def _accuracy_and_macro_f1(predictions: np.ndarray, labels: np.ndarray) -> dict:
    keep = labels != -100
    predictions, labels = predictions[keep], labels[keep]
    f1_scores = []
    for label in np.union1d(labels, predictions):
        true_positive = np.sum((predictions == label) & (labels == label))
        predicted, actual = np.sum(predictions == label), np.sum(labels == label)
        f1_scores.append(2 * true_positive / (predicted + actual) if predicted + actual else 0.0)
    return {"accuracy": float((predictions == labels).mean()), "f1": float(np.mean(f1_scores))}


# Tag prefixes of the IOB1 / IOB2 / IOBES schemes that seqeval reads ("B-PER", "I-PER", "E-PER", "S-PER"), and "O"
ENTITY_TAG_PREFIXES = ("B-", "I-", "E-", "S-")


def names_entities(label_names: list[str]) -> bool:
    """Whether token labels are entity tags: each "O" or a scheme prefix and a type, at least one not "O"."""
    return any(name != "O" for name in label_names) and all(
        name == "O" or (name[:2] in ENTITY_TAG_PREFIXES and len(name) > 2) for name in label_names
    )


def token_classification_metrics(label_names: list[str]) -> Callable[[object], dict]:
    """`compute_metrics` for token classification: `classification_metrics` over the labelled words, and where the
    labels are entity tags (`names_entities`), entity-level precision, recall and F1 (micro over entities: an entity
    counts when its type and its words are all right), as seqeval's default (conlleval) mode computes them, i.e. the
    f1 that transformers' run_ner example reports. label_names: the head's labels by id."""
    entities = names_entities(label_names)

    def compute(eval_prediction) -> dict:
        predictions, labels = _predicted_ids(eval_prediction)
        metrics = _accuracy_and_macro_f1(predictions, labels)
        if entities:
            from seqeval.metrics import f1_score, precision_score, recall_score  # imports scikit-learn: 1.4 s

            # (texts, tokens) -> one tag sequence per text, over its labelled tokens (each word's first token)
            keep = labels != -100
            true = [[label_names[i] for i in row[kept]] for row, kept in zip(labels, keep, strict=True)]
            predicted = [[label_names[i] for i in row[kept]] for row, kept in zip(predictions, keep, strict=True)]
            metrics.update(entity_precision=float(precision_score(true, predicted, zero_division=0)),
                           entity_recall=float(recall_score(true, predicted, zero_division=0)),
                           entity_f1=float(f1_score(true, predicted, zero_division=0)))
        return metrics

    return compute
