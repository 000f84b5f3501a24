"""What the token classifiers and question answerers of the encoder and decoder families compute over their trunk's
output: the same heads as BERT's, GPT-2's and Llama's, whichever tokens each hidden state has seen."""

import torch
from transformers.modeling_outputs import QuestionAnsweringModelOutput, TokenClassifierOutput

from .scratch_dropout import dropout


def classify_tokens(model, outputs, labels: torch.Tensor | None, **kwargs) -> TokenClassifierOutput:
    """Every token's hidden state (B, T, hidden) through `model.classifier_dropout` and `model.classifier` ->
    logits (B, T, num_labels); the loss (`model.loss_function`) where `labels` (B, T) are given."""
    hidden_states = dropout(outputs.last_hidden_state, model.classifier_dropout.p, model.training)
    logits = model.classifier(hidden_states)
    loss = None
    if labels is not None:
        loss = model.loss_function(logits=logits, labels=labels, config=model.config, **kwargs)
    return TokenClassifierOutput(
        loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
    )


def check_answer_positions(start_positions: torch.Tensor | None, end_positions: torch.Tensor | None) -> None:
    """Both or neither: the loss needs the start and the end of each answer."""
    if (start_positions is None) != (end_positions is None):
        given = "start_positions" if start_positions is not None else "end_positions"
        raise ValueError(f"{given} was given without the other: the loss needs both start_positions and "
                         "end_positions (or neither, for logits alone).")


def answer_spans(model, outputs, start_positions: torch.Tensor | None, end_positions: torch.Tensor | None,
                 **kwargs) -> QuestionAnsweringModelOutput:
    """Every token's hidden state (B, T, hidden) through `model.qa_outputs` (no dropout before it, as BERT, GPT-2 and
    Llama have it) -> the start and the end logits, (B, T) each; with the positions (B,), transformers'
    question-answering loss, which clamps them to [0, T] and counts one at T as nothing (an answer past the window)."""
    # (B, T, hidden) -> (B, T, 2) -> the start and the end logits
    start_logits, end_logits = (
        logits.contiguous() for logits in model.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
    )
    loss = None
    if start_positions is not None:
        loss = model.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
    return QuestionAnsweringModelOutput(
        loss=loss,
        start_logits=start_logits,
        end_logits=end_logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )
