"""Encoder-only family (BERT-style): `ScratchEncoderModel`, `ScratchEncoderForMaskedLM`,
`ScratchEncoderForSequenceClassification`, `ScratchEncoderForTokenClassification`,
`ScratchEncoderForQuestionAnswering`, `ScratchEncoderForMultipleChoice`. The stack is the shared `ScratchTransformer`,
bidirectional, with optional token-type embeddings.

References: Devlin et al. (2019), BERT; Geiping & Goldstein (2023), Cramming (sparse MLM prediction);
transformers' `BertForMaskedLM` and `ModernBertForMaskedLM` for the v5 conventions.
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from .configuration_scratch import ScratchEncoderConfig
from .modeling_scratch_common import (
    ScratchPreTrainedModel,
    ScratchTransformer,
    check_choice_inputs_shape,
    check_labels_shape,
)
from .scratch_attention import resolve_cache
from .scratch_dropout import dropout
from .scratch_heads import answer_spans, check_answer_positions, classify_tokens
from .scratch_layers import ScratchMLMTransform, ScratchPooler
from .scratch_linear import ScratchLinear


class ScratchEncoderPreTrainedModel(ScratchPreTrainedModel):
    config: ScratchEncoderConfig


class ScratchEncoderModel(ScratchTransformer):
    """The bare bidirectional stack: input ids (B, T) -> hidden states (B, T, hidden)."""

    config: ScratchEncoderConfig

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(
            config,
            layers_field="num_hidden_layers",
            vocab_size=config.vocab_size,
            is_causal=False,
            type_vocab_size=config.type_vocab_size,
        )


class ScratchEncoderForMaskedLM(ScratchEncoderPreTrainedModel):
    """Masked language model: logits (B, T, vocab) for every position; with `labels` and
    `config.sparse_prediction`, logits (N, vocab) for the N labelled positions only, with the same loss."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(config)
        self.model = ScratchEncoderModel(config)
        self.head_transform = ScratchMLMTransform(config) if config.mlm_transform else nn.Identity()
        self.lm_head = ScratchLinear(config.hidden_size, config.vocab_size, bias=config.use_bias)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        """`labels` (B, T): the original id at masked positions, -100 elsewhere. `past_key_values` (`cache` from
        transformers 5.24): keys and values every layer attends to before the input's (prefix tuning), as BERT takes
        them; named here because PEFT passes them to the heads whose signature has them, and to the trunk alone
        otherwise."""
        check_labels_shape(labels, input_ids if input_ids is not None else inputs_embeds)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=resolve_cache(cache, past_key_values, self),
            return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if labels is not None and self.config.sparse_prediction:
            # Project only the labelled positions: (B, T, hidden) -> (N, hidden). Boolean indexing keeps the
            # loss identical to the dense one, since -100 positions contribute nothing there either.
            labelled = labels.reshape(-1) != -100
            hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1])[labelled]
            labels = labels.reshape(-1)[labelled]
        logits = self.lm_head(self.head_transform(hidden_states))
        loss = None
        if labels is not None:  # a sliced labels tensor is fine too: the loss flattens it with `view`
            loss = self.loss_function(
                logits=logits, labels=labels.contiguous(), vocab_size=self.config.vocab_size, **kwargs
            )
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class _ScratchEncoderWithHead(ScratchEncoderPreTrainedModel):
    """The trunk under a task head that a subclass adds (then calls `post_init`). The heads' forwards name
    `past_key_values` (a prefix, see `ScratchEncoderForMaskedLM.forward`): without it in the signature, PEFT's prefix
    tuning calls the trunk alone and feeds the head the trunk's second output (BERT's pooler output), else its first:
    here every token's hidden state, not one per sequence."""

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(config)
        self.model = ScratchEncoderModel(config)

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, **kwargs):
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )


class _ScratchEncoderClassifier(_ScratchEncoderWithHead):
    """Trunk + dropout + linear layer; subclasses choose what to classify (first token or every token)."""

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.classifier_dropout = nn.Dropout(
            config.classifier_dropout if config.classifier_dropout is not None else config.dropout
        )
        self.classifier = ScratchLinear(config.hidden_size, self._scores_per_input(config))
        self.pooler = self._pooler(config)
        self.post_init()

    def _scores_per_input(self, config: ScratchEncoderConfig) -> int:
        """The classifier's outputs: one score per class, unless the subclass scores otherwise."""
        return config.num_labels

    def _pooler(self, config: ScratchEncoderConfig) -> nn.Module | None:
        """What the classifier reads the hidden states through first (BERT's pooler), where the subclass has one."""
        return None


class _ScratchEncoderSequenceScorer(_ScratchEncoderClassifier):
    """Scores a sequence from the hidden state of its first token ([CLS]); with `classifier_pooler`, from that state
    through a dense layer and tanh first, as BERT's pooler (its sequence classifier and multiple-choice head)."""

    def _pooler(self, config: ScratchEncoderConfig) -> nn.Module | None:
        return ScratchPooler(config) if config.classifier_pooler else None

    def _score_sequences(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, T, hidden) -> (B, scores per input)."""
        pooled = hidden_states[:, 0]  # (B, hidden)
        if self.pooler is not None:
            pooled = self.pooler(pooled)
        return self.classifier(dropout(pooled, self.classifier_dropout.p, self.training))


class ScratchEncoderForSequenceClassification(_ScratchEncoderSequenceScorer):
    """Classifies a sequence from [CLS]'s hidden state (through BERT's pooler with `classifier_pooler`, as
    `BertForSequenceClassification`): logits (B, num_labels)."""

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput:
        outputs = self._encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            cache=resolve_cache(cache, past_key_values, self), **kwargs,
        )
        logits = self._score_sequences(outputs.last_hidden_state)  # (B, num_labels)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class ScratchEncoderForTokenClassification(_ScratchEncoderClassifier):
    """Labels every token (named entities, part of speech): logits (B, T, num_labels)."""

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TokenClassifierOutput:
        check_labels_shape(labels, input_ids if input_ids is not None else inputs_embeds)
        outputs = self._encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            cache=resolve_cache(cache, past_key_values, self), **kwargs,
        )
        return classify_tokens(self, outputs, labels, **kwargs)


class ScratchEncoderForQuestionAnswering(_ScratchEncoderWithHead):
    """Extractive question answering (SQuAD): the answer's start and end logits (B, T) each, from one linear layer
    over every token's hidden state, as BERT's head (no dropout before it). `qa_outputs` is the name BERT and PEFT's
    question-answering task (its trained module) give it."""

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(config)
        self.qa_outputs = ScratchLinear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput:
        """`start_positions`, `end_positions` (B,): the token index of each answer's first and last token; one past
        the sequence or beyond, the answer is not in it and counts nothing (transformers' question-answering loss
        clamps them there, as BERT's)."""
        check_answer_positions(start_positions, end_positions)
        outputs = self._encode(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            cache=resolve_cache(cache, past_key_values, self), **kwargs,
        )
        return answer_spans(self, outputs, start_positions, end_positions, **kwargs)


class ScratchEncoderForMultipleChoice(_ScratchEncoderSequenceScorer):
    """Chooses among C candidate sequences (SWAG: a context paired with each ending) by one score per sequence, read
    from [CLS] as the sequence classifier reads it (through BERT's pooler with `classifier_pooler`, as
    `BertForMultipleChoice`): inputs (B, C, T) -> logits (B, C). `num_labels` plays no part: any number of choices."""

    def __init__(self, config: ScratchEncoderConfig):
        super().__init__(config)
        self.loss_type = "ForMultipleChoice"  # transformers names no loss for it (`LOSSES`)

    def _scores_per_input(self, config: ScratchEncoderConfig) -> int:
        return 1

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MultipleChoiceModelOutput:
        """`input_ids`, `attention_mask`, `token_type_ids`, `position_ids` (B, C, T), or `inputs_embeds`
        (B, C, T, hidden): the C choices of each row. `labels` (B,): the index of each row's right choice (-100:
        none, ignored). The hidden states and attentions returned are the B * C sequences' (as BERT's)."""
        batch, choices = check_choice_inputs_shape(input_ids, inputs_embeds, labels, attention_mask=attention_mask,
                                                   token_type_ids=token_type_ids, position_ids=position_ids)

        def one_row_per_choice(tensor: torch.Tensor | None) -> torch.Tensor | None:
            # (B, C, T, ...) -> (B * C, T, ...)
            return None if tensor is None else tensor.reshape(batch * choices, *tensor.shape[2:])

        outputs = self._encode(
            *(one_row_per_choice(tensor) for tensor in (input_ids, attention_mask, token_type_ids, position_ids,
                                                        inputs_embeds)),
            **kwargs,
        )
        logits = self._score_sequences(outputs.last_hidden_state).view(batch, choices)  # (B * C, 1) -> (B, C)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, **kwargs)
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "ScratchEncoderPreTrainedModel",
    "ScratchEncoderModel",
    "ScratchEncoderForMaskedLM",
    "ScratchEncoderForSequenceClassification",
    "ScratchEncoderForTokenClassification",
    "ScratchEncoderForQuestionAnswering",
    "ScratchEncoderForMultipleChoice",
]
