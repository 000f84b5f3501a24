"""Encoder-decoder family, the Transformer of Vaswani et al. (2017): `ScratchSeq2SeqModel` and
`ScratchSeq2SeqForConditionalGeneration`. Both halves are the shared `ScratchTransformer`: the encoder
bidirectional, the decoder causal with cross-attention over the encoder output.

Embeddings: two independent knobs, as fairseq's `--share-all-embeddings` and `--share-decoder-input-output-embed`.
With `share_embeddings` the encoder and decoder token embeddings are one tied matrix (one shared vocabulary); with
`tie_word_embeddings` the output projection is tied to the decoder's embeddings. Both: one matrix for all three.
References: transformers' `BartModel` / `MarianMTModel` for the v5 conventions (EncoderDecoderCache, tying).
"""

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.processing_utils import Unpack
from transformers.utils import ModelOutput, TransformersKwargs, can_return_tuple

from .configuration_scratch import ScratchSeq2SeqConfig
from .modeling_scratch_common import (
    ScratchCrossAttentionTransformer,
    ScratchGenerationMixin,
    ScratchPreTrainedModel,
    ScratchSourceEncoder,
    check_labels_shape,
)

# Imported so that `save_pretrained` copies the pipeline file beside the model (it ships the files a model file
# imports relatively); saved configs declare it in `custom_pipelines`.
from .pipeline_scratch_text2text import register_pipeline_task
from .scratch_attention import CACHE_FIELD, cache_output, resolve_cache
from .scratch_linear import ScratchLinear
from .scratch_loss import check_label_ids


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int | None):
    """Decoder inputs from labels (B, T): [start, y_1, ..., y_{T-1}], with -100 replaced by padding."""
    if decoder_start_token_id is None:
        raise ValueError("`config.decoder_start_token_id` must be set to build `decoder_input_ids` from `labels`.")
    if pad_token_id is None:
        raise ValueError("`config.pad_token_id` must be set to build `decoder_input_ids` from `labels`.")
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def _check_source_mask_width(attention_mask: torch.Tensor | None, encoder_states: torch.Tensor) -> None:
    """The source's 2D `attention_mask` must cover the encoder's tokens. `generate(prefill_chunk_size=...)` cuts it to
    the decoder's length (transformers slices `attention_mask` as if it were the decoder's, as in a decoder-only
    model), which Marian takes silently, attending to the source's padding: name the option instead."""
    if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape[1] == encoder_states.shape[1]:
        return
    raise ValueError(
        f"`attention_mask` (the source's) covers {attention_mask.shape[1]} tokens but the encoder output has "
        f"{encoder_states.shape[1]}. `generate(prefill_chunk_size=...)` cuts it so on encoder-decoder models, whose "
        "decoder prompt is too short to chunk: leave `prefill_chunk_size` unset."
    )


class ScratchSeq2SeqPreTrainedModel(ScratchPreTrainedModel):
    config: ScratchSeq2SeqConfig

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """`resize_token_embeddings` resizes the one vocabulary: the shared matrix or, when `share_embeddings=False`,
        both matrices; then the output projection (which tying replaces when it is tied). Two vocabularies are
        refused, since `config.vocab_size` is the target's."""
        if not self.config.share_embeddings:
            if self.config.encoder_vocab_size is not None:
                raise ValueError(
                    "This model has separate source and target vocabularies (`encoder_vocab_size`): resize "
                    "`model.encoder` / `model.decoder` embeddings directly and update the config."
                )
            # The decoder's matrix here (resized in place); the input (the encoder's) and the output head as
            # transformers resizes them, keeping their `requires_grad` and device hooks.
            decoder = self.base_model.decoder
            decoder.set_input_embeddings(self._get_resized_embeddings(
                decoder.get_input_embeddings(), new_num_tokens, pad_to_multiple_of, mean_resizing
            ))
        return super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)


class ScratchSeq2SeqModel(ScratchSeq2SeqPreTrainedModel):
    """Encoder and decoder: source ids (B, S) and target ids (B, T) -> decoder hidden states (B, T, hidden)."""

    _shared_embeddings_keys = {"encoder.embeddings.embed_tokens.weight": "decoder.embeddings.embed_tokens.weight"}

    def __init__(self, config: ScratchSeq2SeqConfig):
        super().__init__(config)
        if config.share_embeddings:
            # Declared so that `save_pretrained` stores the shared matrix once, under the decoder's name.
            self._tied_weights_keys = self._shared_embeddings_keys
        self.encoder = ScratchSourceEncoder(config, vocab_size=config.source_vocab_size)
        self.decoder = ScratchCrossAttentionTransformer(config, vocab_size=config.vocab_size)
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """transformers ties a model's `_tied_weights_keys` only under `config.tie_word_embeddings`, which here is
        the output head's knob (the head's tie is declared by `ScratchSeq2SeqForConditionalGeneration`). Sharing the
        encoder's and decoder's embeddings follows `share_embeddings` alone, so that each knob works without the
        other, in `post_init`, `tie_weights`, `from_pretrained` and `resize_token_embeddings` alike."""
        if all_submodels or not self.config.share_embeddings:
            return super().get_expanded_tied_weights_keys(all_submodels)
        return dict(self._shared_embeddings_keys)

    def get_input_embeddings(self) -> nn.Embedding:
        # The source's, as Marian's (with one shared matrix, tied to the decoder's): hooks on it act on the encoder's
        # inputs. Trainer's NEFTune put its noise on the target embeddings when this was the decoder's.
        return self.encoder.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        # One shared matrix goes to both stacks, as Marian's `shared` does: set on the decoder alone, it left the
        # encoder reading the old one until `tie_weights`, and a vocabulary resized below the pad id failed in the
        # encoder's old module (its `padding_idx` past its new matrix).
        if self.config.share_embeddings:
            self.decoder.set_input_embeddings(value)
        self.encoder.set_input_embeddings(value)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | ModelOutput | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        """`token_type_ids` (a tokenizer's) and `position_ids` are the source's and go to the encoder only: the
        decoder reads other tokens, at `decoder_position_ids`."""
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
                **kwargs,
            )
        # Any output object is read by name (the encoder's `BaseModelOutput`, which `generate()` passes back at every
        # step, or another class); a tuple, from `return_dict=False`, is named here.
        elif not isinstance(encoder_outputs, ModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        _check_source_mask_width(attention_mask, encoder_outputs.last_hidden_state)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=resolve_cache(cache, past_key_values, self),
            use_cache=use_cache,
            return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **cache_output(getattr(decoder_outputs, CACHE_FIELD)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class ScratchSeq2SeqForConditionalGeneration(ScratchSeq2SeqPreTrainedModel, ScratchGenerationMixin):
    """Sequence-to-sequence LM: logits (B, T, vocab) for each target position."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embeddings.embed_tokens.weight"}

    def __init__(self, config: ScratchSeq2SeqConfig):
        super().__init__(config)
        # Labels are aligned with the logits already (decoder inputs are the shifted labels): the loss must not
        # shift again, which the name-derived default for "...ForConditionalGeneration" would do.
        self.loss_type = "ForMaskedLM"
        self.model = ScratchSeq2SeqModel(config)
        self.lm_head = ScratchLinear(config.hidden_size, config.vocab_size, bias=config.output_bias)
        self.post_init()

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def init_continuous_batching(self, *args, **kwargs):
        """transformers' continuous batching (`generate_batch`, `init_continuous_batching`) runs decoder-only models:
        it packs prompts into one decoder row and has no encoder pass. Each request of an encoder-decoder ended with
        an error about `decoder_input_ids` (native Marian's about `decoder_inputs_embeds`); refused here by name."""
        raise NotImplementedError(
            f"Continuous batching (`generate_batch`) runs decoder-only models; {type(self).__name__} is an "
            "encoder-decoder: batch its inputs and call `generate()`."
        )

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | ModelOutput | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        """`labels` (B, T) are the target ids (-100 = ignore); without `decoder_input_ids` they are shifted right
        behind `decoder_start_token_id` to make them. With `labels` no cache is made (`use_cache` is ignored)."""
        no_decoder_inputs = decoder_input_ids is None and decoder_inputs_embeds is None
        if labels is not None:
            # A loss needs no cache, and filling one copies every layer's keys and values (as Marian and BART do).
            use_cache = False
            if no_decoder_inputs:
                check_label_ids(labels, self.config.vocab_size)  # before they become ids, so the error names them
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        elif no_decoder_inputs:
            raise ValueError(
                "Pass `decoder_input_ids` or `decoder_inputs_embeds`, or `labels` to make them from (shifted right)."
            )
        check_labels_shape(labels, decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=resolve_cache(cache, past_key_values, self),
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            decoder_position_ids=decoder_position_ids,
            use_cache=use_cache,
            return_dict=True,  # read by name below, whatever `config.return_dict` says (as BERT does)
            **kwargs,
        )
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, kept, :])
        loss = None
        if labels is not None:  # a sliced labels tensor is fine too: the loss flattens it with `view`
            loss = self.loss_function(
                logits=logits, labels=labels.contiguous(), vocab_size=self.config.vocab_size, **kwargs
            )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **cache_output(getattr(outputs, CACHE_FIELD)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


# Done here, not at package registration, so that a model loaded with `trust_remote_code` where the package is not
# installed brings the task too: `pipeline("scratch-text2text", model=model)` reads no folder's `custom_pipelines`.
register_pipeline_task()

__all__ = [
    "ScratchSeq2SeqPreTrainedModel",
    "ScratchSeq2SeqModel",
    "ScratchSeq2SeqForConditionalGeneration",
    "shift_tokens_right",
]
