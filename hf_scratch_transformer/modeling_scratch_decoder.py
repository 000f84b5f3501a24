"""Decoder-only family (GPT-style): `ScratchDecoderModel`, `ScratchDecoderForCausalLM`,
`ScratchDecoderForSequenceClassification`, `ScratchDecoderForTokenClassification`,
`ScratchDecoderForQuestionAnswering`. The stack itself is the shared `ScratchTransformer`, causal: a head reads each
token's hidden state after the tokens before it only, as GPT-2's and Llama's heads do.

References: Radford et al. (2019), GPT-2; transformers' `LlamaForCausalLM` for the v5 conventions (loss through
`self.loss_function`, `logits_to_keep`, caches).
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_outputs import (
    CausalLMOutputWithPast,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from .configuration_scratch import ScratchDecoderConfig
from .modeling_scratch_common import (
    ScratchGenerationMixin,
    ScratchPreTrainedModel,
    ScratchTransformer,
    check_labels_shape,
)
from .scratch_attention import CACHE_FIELD, cache_output, resolve_cache
from .scratch_heads import answer_spans, check_answer_positions, classify_tokens
from .scratch_linear import ScratchLinear


class ScratchDecoderPreTrainedModel(ScratchPreTrainedModel):
    config: ScratchDecoderConfig


class ScratchDecoderModel(ScratchTransformer):
    """The bare causal stack: input ids (B, T) -> hidden states (B, T, hidden)."""

    config: ScratchDecoderConfig

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config, layers_field="num_hidden_layers", vocab_size=config.vocab_size, is_causal=True)


class ScratchDecoderForCausalLM(ScratchDecoderPreTrainedModel, ScratchGenerationMixin):
    """Causal language model: logits (B, T, vocab) for the next token at every position."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config)
        self.model = ScratchDecoderModel(config)
        self.lm_head = ScratchLinear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        """`labels` (B, T) are the input ids themselves (-100 = ignore): the shift happens inside the loss.
        `logits_to_keep` > 0 computes logits for the last that many positions only (generation needs one).
        The cache comes as `cache` (transformers >= 5.24) or `past_key_values`.
        With `labels` no cache is made unless `use_cache=True` asks for one."""
        check_labels_shape(labels, input_ids if input_ids is not None else inputs_embeds)
        if labels is not None and use_cache is None:
            # A loss needs no cache (as in the seq2seq family): filling one concatenates every layer's keys and
            # values, forward and backward: about 1 ms of a 50 ms step at nanoGPT's size (docs/nanogpt.md).
            use_cache = False
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=resolve_cache(cache, past_key_values, self),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, kept, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            **cache_output(getattr(outputs, CACHE_FIELD)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class _ScratchDecoderWithHead(ScratchDecoderPreTrainedModel):
    """The causal trunk under a task head that a subclass adds (then calls `post_init`). `past_key_values` given are
    attended to before the input (a prefix, as PEFT's prefix tuning passes one)."""

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ScratchDecoderModel(config)

    def _decode(self, input_ids, attention_mask, position_ids, cache, past_key_values, inputs_embeds, use_cache,
                **kwargs):
        """The trunk's output; the cache comes as `cache` or under its earlier name, `past_key_values`."""
        return self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=resolve_cache(cache, past_key_values, self),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            return_dict=True,  # read by name, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )


class ScratchDecoderForSequenceClassification(_ScratchDecoderWithHead):
    """Classifies a sequence from the hidden state of its last real (non-padding) token, as GPT-2 does."""

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config)
        self.score = ScratchLinear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutputWithPast:
        if labels is not None and use_cache is None:
            use_cache = False  # a loss needs no cache, as in `ScratchDecoderForCausalLM`
        outputs = self._decode(input_ids, attention_mask, position_ids, cache, past_key_values,
                               inputs_embeds, use_cache, **kwargs)
        logits = self.score(outputs.last_hidden_state)  # (B, T, num_labels)
        batch_size = logits.shape[0]
        last = self._last_token_index(input_ids, attention_mask, batch_size, logits.shape[1])
        pooled_logits = logits[torch.arange(batch_size, device=logits.device), last]
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, pooled_logits=pooled_logits, config=self.config, **kwargs
            )
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled_logits,
            **cache_output(getattr(outputs, CACHE_FIELD)),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _last_token_index(self, input_ids: torch.LongTensor | None, attention_mask: torch.Tensor | None,
                          batch_size: int, length: int) -> torch.Tensor | int:
        """Index of the rightmost non-padding token of each row (works for left and right padding): by the padding
        id in `input_ids`, or for embeddings by a 2D `attention_mask` (its last `length` columns: a prefix's come
        first). GPT-2 reads embeddings at the last position, with a warning: the padding of a right-padded row, as
        PEFT's prompt tuning passes them. Without either, the last position, as GPT-2 does."""
        pad_token_id = self.config.pad_token_id
        if pad_token_id is None and batch_size > 1:  # embeddings too: a padded row would be read at its padding
            raise ValueError("Sequence classification of a batch needs `config.pad_token_id` to find each end.")
        if input_ids is not None and pad_token_id is not None:
            real = input_ids != pad_token_id
        elif input_ids is None and attention_mask is not None and attention_mask.dim() == 2:
            real = attention_mask[:, -length:] != 0
        else:
            return -1
        positions = torch.arange(length, device=real.device)
        return (positions * real).argmax(-1)


class ScratchDecoderForTokenClassification(_ScratchDecoderWithHead):
    """Labels every token from its hidden state through dropout (`classifier_dropout`) and a linear layer, as
    `GPT2ForTokenClassification` and `LlamaForTokenClassification`: logits (B, T, num_labels). Its output has no place
    for a cache, so none is made unless `use_cache=True` asks (as for the question answerer)."""

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config)
        self.classifier_dropout = nn.Dropout(
            config.classifier_dropout if config.classifier_dropout is not None else config.dropout
        )
        self.classifier = ScratchLinear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TokenClassifierOutput:
        """`labels` (B, T): each token's class, -100 for none."""
        check_labels_shape(labels, input_ids if input_ids is not None else inputs_embeds)
        outputs = self._decode(input_ids, attention_mask, position_ids, cache, past_key_values,
                               inputs_embeds, bool(use_cache), **kwargs)
        return classify_tokens(self, outputs, labels, **kwargs)


class ScratchDecoderForQuestionAnswering(_ScratchDecoderWithHead):
    """Extractive question answering: the answer's start and end logits (B, T) each, from one linear layer over every
    token's hidden state, as `GPT2ForQuestionAnswering` and `LlamaForQuestionAnswering`."""

    def __init__(self, config: ScratchDecoderConfig):
        super().__init__(config)
        self.qa_outputs = ScratchLinear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput:
        """`start_positions`, `end_positions` (B,): the token index of each answer's first and last token."""
        check_answer_positions(start_positions, end_positions)
        outputs = self._decode(input_ids, attention_mask, position_ids, cache, past_key_values,
                               inputs_embeds, bool(use_cache), **kwargs)
        return answer_spans(self, outputs, start_positions, end_positions, **kwargs)


# Trainer's `label_smoothing_factor` shifts the labels of a causal LM only when its class name is in this table of
# native names, which `AutoModelForCausalLM.register` leaves alone: without the entry Trainer smooths our logits
# against unshifted labels and trains each position to predict its own token. Done here, not at registration, so
# that a folder loaded with `trust_remote_code` gets it too. The lazy Auto mappings read only keys that are also
# native config types, so they are unaffected.
MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(ScratchDecoderConfig.model_type, ScratchDecoderForCausalLM.__name__)

__all__ = [
    "ScratchDecoderPreTrainedModel",
    "ScratchDecoderModel",
    "ScratchDecoderForCausalLM",
    "ScratchDecoderForSequenceClassification",
    "ScratchDecoderForTokenClassification",
    "ScratchDecoderForQuestionAnswering",
]
