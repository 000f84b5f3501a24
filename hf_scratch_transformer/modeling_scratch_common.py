"""What the three Scratch families share: the `PreTrainedModel` base with weight initialisation, and
`ScratchTransformer`, one stack of blocks (embeddings -> N x `ScratchBlock` -> final norm) that serves as the
decoder-only model, the encoder-only model, and both halves of the encoder-decoder.

A stack is causal or bidirectional, with or without cross-attention; it builds its masks and position tables once
per forward and passes them to every layer.
"""

import copy
import inspect
import itertools
import json
import os
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import _add_variant
from transformers.processing_utils import Unpack
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, ModelOutput, TransformersKwargs
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_scratch import ScratchConfigBase
from .scratch_attention import MODEL_UPDATES_PAGED_CACHE, ScratchAttention, cache_output, is_paged, resolve_cache
from .scratch_layers import ScratchBlock, ScratchEmbeddings, ScratchLayerNorm, ScratchRMSNorm, make_norm
from .scratch_linear import mark_working_set
from .scratch_loss import (
    lm_loss,
    multiple_choice_loss,
    sequence_classification_loss,
    token_classification_loss,
)
from .scratch_masks import build_cross_attention_mask, build_self_attention_mask, mask_for_generate
from .scratch_positions import ScratchAlibiBias, ScratchRotaryEmbedding

LOSSES = {
    "ForCausalLM": partial(lm_loss, shift=True),
    "ForMaskedLM": partial(lm_loss, shift=False),
    "ForSequenceClassification": sequence_classification_loss,
    "ForTokenClassification": token_classification_loss,
    "ForMultipleChoice": multiple_choice_loss,
}


def check_labels_shape(labels: torch.Tensor | None, inputs: torch.Tensor | None, name: str = "labels") -> None:
    """`labels` (or another per-token tensor) must be (batch, length) of `inputs` (ids, or embeddings)."""
    if labels is None or inputs is None:
        return
    if labels.shape != inputs.shape[:2]:
        raise ValueError(
            f"`{name}` must have shape {tuple(inputs.shape[:2])} to match the inputs, got {tuple(labels.shape)}."
        )


def check_inputs_shape(inputs: torch.Tensor, name: str, dims: int) -> None:
    """Ids must be (batch, length) and embeddings (batch, length, hidden), neither empty: an unbatched input would
    fail deep inside with an index error, an empty one in a reshape inside attention."""
    if inputs.dim() == dims and 0 not in inputs.shape[:2]:
        return
    expected = "(batch_size, sequence_length, hidden_size)" if dims == 3 else "(batch_size, sequence_length)"
    hint = f" For one sequence, add the batch dimension: `{name}[None]`." if inputs.dim() == dims - 1 else ""
    raise ValueError(
        f"`{name}` must have shape {expected}, with at least one sequence and one token, got {tuple(inputs.shape)}."
        + hint
    )


def check_choice_inputs_shape(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
                              labels: torch.Tensor | None, **per_token: torch.Tensor | None) -> tuple[int, int]:
    """(batch, choices) of a multiple-choice head's inputs: ids (batch, choices, length) or embeddings (batch,
    choices, length, hidden), none empty; the `per_token` tensors (attention mask, token types, positions) shaped as
    the ids, and labels (batch,). A batch of plain sequences (batch, length) was otherwise read as `length` choices
    of one token each, without a word, and a mask of another shape failed in a reshape."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
    inputs, name, dims = (input_ids, "input_ids", 3) if input_ids is not None else (inputs_embeds, "inputs_embeds", 4)
    if inputs.dim() != dims or 0 in inputs.shape[:3]:
        expected = "(batch_size, num_choices, sequence_length" + (", hidden_size)" if dims == 4 else ")")
        raise ValueError(f"`{name}` must have shape {expected}: each row's choices, with at least one row, choice "
                         f"and token, got {tuple(inputs.shape)}.")
    for tensor_name, tensor in per_token.items():
        if tensor is not None and tensor.shape != inputs.shape[:3]:
            raise ValueError(f"`{tensor_name}` must have shape {tuple(inputs.shape[:3])} to match `{name}` "
                             f"(batch_size, num_choices, sequence_length), got {tuple(tensor.shape)}.")
    batch, choices = inputs.shape[:2]
    if labels is not None and labels.shape != (batch,):
        raise ValueError(f"`labels` must have shape ({batch},): the index of each row's right choice, got "
                         f"{tuple(labels.shape)}.")
    return batch, choices


def _safetensors_problem(path) -> str | None:
    """What makes `path` an incomplete or corrupt safetensors file, or None. The format: an 8-byte little-endian
    header length, a JSON header giving each tensor's byte range in the data, then the data, which must end
    exactly where the file ends (so a truncated copy fails here)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        header_length = int.from_bytes(handle.read(8), "little")
        if size < 8 or 8 + header_length > size:
            return f"its {size} bytes are too few for its header"
        try:
            header = json.loads(handle.read(header_length))
            data_end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"),
                           default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):  # not JSON, or not the safetensors one
            return "its header is not a safetensors header"
    data_length = size - 8 - header_length
    if data_end != data_length:
        return f"its header describes {data_end} bytes of tensor data, but the file holds {data_length}"
    return None


def safetensors_error(path) -> ValueError | None:
    """A ValueError naming `path` and what is wrong with it when it is not a complete safetensors file, else None."""
    problem = _safetensors_problem(path)
    if problem is None:
        return None
    return ValueError(f"{path} is not a complete safetensors file: {problem}. Save or download it again.")


def remove_stale_weights(folder, variant: str | None = None) -> None:
    """After `save_pretrained` into a folder that held an earlier save in the other layout: transformers removes only
    the earlier shards, so a sharded save left the earlier `model.safetensors` (which `from_pretrained` reads before
    the index: the earlier weights) and a single-file save left the earlier shards' index."""
    folder = Path(folder)
    single = folder / _add_variant(SAFE_WEIGHTS_NAME, variant)
    index = folder / _add_variant(SAFE_WEIGHTS_INDEX_NAME, variant)
    if not (single.is_file() and index.is_file()):
        return
    try:
        shards = set(json.loads(index.read_text("utf-8"))["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError):  # not an index that could load: not this save's
        shards = {None}
    if shards and all(shard and (folder / shard).is_file() for shard in shards):
        single.unlink()  # saved sharded now: the single file is the earlier save's
    else:
        index.unlink()  # saved as one file now: transformers removed the shards this index names


class ScratchPreTrainedModel(PreTrainedModel):
    """Initialisation and the transformers feature flags common to every Scratch model."""

    config: ScratchConfigBase
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["ScratchBlock"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    _supports_sdpa = True
    _supports_flex_attn = True  # the masks come from transformers' `masking_utils`, which builds flex's block masks
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    # generate()'s mask over a static cache: ours builds it inside the (compiled) step, from the 2D mask.
    create_masks_for_generate = staticmethod(mask_for_generate)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Registered for the Auto classes, ours count as remote code, whose `forward` signature `generate()` inspects
        # at every decoding step (looking for `cache_position`); computed once here, inspection reads it (about
        # 40 us a token saved).
        if "forward" in cls.__dict__:
            cls.forward.__signature__ = inspect.signature(cls.forward)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """As transformers' `save_pretrained`, declaring every class of the family in `auto_map` (transformers adds
        only the saved one) and the family's own pipelines in `custom_pipelines`, for `trust_remote_code` loading.
        Entries already in the config win. An earlier save's weights in the other layout are removed."""
        config = self.config
        config.auto_map = {**config.family_auto_map, **(getattr(config, "auto_map", None) or {})}
        if config.family_custom_pipelines:
            # A deep copy: `pipeline()` rewrites the entries it reads in place.
            config.custom_pipelines = {
                **copy.deepcopy(config.family_custom_pipelines), **(getattr(config, "custom_pipelines", None) or {})
            }
        result = super().save_pretrained(save_directory, *args, **kwargs)
        given = inspect.signature(PreTrainedModel.save_pretrained).bind(self, save_directory, *args, **kwargs).arguments
        if given.get("is_main_process", True):
            remove_stale_weights(save_directory, given.get("variant"))
        return result

    @staticmethod
    def _load_pretrained_model(model, state_dict, checkpoint_files, *args, **kwargs):
        """transformers' loading step of `from_pretrained`. A truncated or corrupt weights file fails inside
        safetensors with an error that names no file: name it (SPEC section 10)."""
        try:
            return PreTrainedModel._load_pretrained_model(model, state_dict, checkpoint_files, *args, **kwargs)
        except Exception as error:
            for file in checkpoint_files or ():
                corrupt = file.endswith(".safetensors") and safetensors_error(file)
                if corrupt:
                    raise corrupt from error
            raise

    def post_init(self) -> None:
        super().post_init()
        mark_working_set(self)  # few-row products choose their kernel by how much the model reads (scratch_linear)

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        mark_working_set(self)  # a resized output head reads more or fewer bytes, and a new one is not marked yet
        return embeddings

    def _get_resized_lm_head(self, old_lm_head: nn.Linear, *args, **kwargs) -> nn.Linear:
        """transformers' resize of an untied output head, which builds a plain `nn.Linear`: the new head gets the old
        one's class back (`ScratchLinear`, its fp32 kernel choice), as the model has it when built or loaded."""
        new_lm_head = super()._get_resized_lm_head(old_lm_head, *args, **kwargs)
        if type(new_lm_head) is nn.Linear and isinstance(old_lm_head, nn.Linear):
            # The same parameters: ScratchLinear's only state of its own, the working set, is marked after the resize.
            new_lm_head.__class__ = type(old_lm_head)
        return new_lm_head

    @property
    def loss_function(self):
        """transformers' loss for the model's `loss_type`, except the language-model losses, which are the same
        functions on a faster CPU cross-entropy, the sequence-classification one, which honours
        `num_items_in_batch`, and the classification ones, which check the class ids (`scratch_loss.py`). As in
        transformers, a function assigned with `model.loss_function = ...` wins."""
        assigned = self.__dict__.get("_loss_function")  # not hasattr: a missing module attribute raises, slowly
        if assigned is not None:
            return assigned
        return LOSSES.get(self.loss_type) or super().loss_function

    @loss_function.setter
    def loss_function(self, value) -> None:
        self._loss_function = value

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """All initialisation, in one place:

        | module                      | `normal`                      | `xavier`                                    |
        |-----------------------------|-------------------------------|---------------------------------------------|
        | Linear weight               | N(0, initializer_range)       | Xavier-uniform per fused part (Q, K, V, ...)|
        | Linear bias                 | 0                             | 0                                           |
        | Embedding                   | N(0, initializer_range)       | N(0, hidden_size^-0.5) (Vaswani et al.)     |
        | padding row of an Embedding | 0                             | 0                                           |
        | norm weight / bias          | 1 / 0                         | 1 / 0                                       |
        | computed tables (buffers)   | recomputed: sinusoids, RoPE frequencies, ALiBi slopes        |

        Runs on the meta device after `from_pretrained` for whatever the checkpoint did not hold; the `init.*`
        functions skip tensors that were loaded.
        """
        config = self.config
        xavier = config.init_scheme == "xavier"
        if isinstance(module, nn.Linear):
            if not xavier:
                init.normal_(module.weight, mean=0.0, std=config.initializer_range)
            elif not getattr(module.weight, "_is_hf_initialized", False):
                # A fused projection is several matrices side by side: each gets its own fan-in/fan-out.
                for part in module.weight.split(getattr(module, "fused_sizes", None) or [module.out_features], dim=0):
                    nn.init.xavier_uniform_(part)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = config.hidden_size**-0.5 if xavier else config.initializer_range
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, (ScratchLayerNorm, ScratchRMSNorm)):
            init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif hasattr(module, "reset_buffers"):
            module.reset_buffers()


class ScratchGenerationMixin(GenerationMixin):
    """transformers' `generate()`, with the position each decoding step reaches checked before the step runs."""

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, *args, inputs_embeds=None, **kwargs) -> dict:
        """transformers' inputs of a decoding step. Over a static cache the step may run compiled, where the forward
        reads no values back (`value_range`): a step past the table of absolute positions failed in inductor's code
        with "index out of bounds" (on a GPU, a device-side assert). So its positions are checked here, eagerly.
        `inputs_embeds` named: `generate()` takes them only from a model whose signature here names them.

        A prefill over a cache that holds part of `decoder_input_ids` runs the rest only. transformers (5.23-5.24)
        cuts a continued sequence to what its cache lacks by the length of the mask, which it records for
        decoder-only models alone: an encoder-decoder without `decoder_attention_mask` fed its whole
        `decoder_input_ids` again on top of the cache (the cached prefix twice: wrong logits when continuing from
        a returned `past_key_values`, and wrong drafts from an assistant, which continues so at every round)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # 5.24: `cache`
        if getattr(cache, "is_compileable", False):
            self._check_positions_of_step(input_ids, kwargs)
            self._check_room_in_cache(cache, input_ids, kwargs)
        if (self.config.is_encoder_decoder and cache is not None and kwargs.get("next_sequence_length") is None
                and kwargs.get("decoder_attention_mask") is None):
            past_length = cache.get_seq_length()
            if 0 < past_length < input_ids.shape[-1]:
                kwargs["next_sequence_length"] = input_ids.shape[-1] - past_length
        return super().prepare_inputs_for_generation(input_ids, *args, inputs_embeds=inputs_embeds, **kwargs)

    def _prefill(self, input_ids: torch.LongTensor, generation_config, model_kwargs: dict, *args, **kwargs):
        """transformers' (5.23-5.24) chunked prefill splits `input_ids` and cuts the mask and positions to each chunk,
        but passes a decoder-only model's `inputs_embeds` whole with the first: the forward failed on mismatched
        sizes (GPT-2 and Llama alike), a "tensor a (7) must match tensor b (0)" from inside the embeddings. Refused by
        name here."""
        chunked = generation_config.prefill_chunk_size is not None
        if chunked and not self.config.is_encoder_decoder and model_kwargs.get("inputs_embeds") is not None:
            raise ValueError(
                "`generate(prefill_chunk_size=...)` chunks `input_ids` only, not `inputs_embeds`: leave "
                "`prefill_chunk_size` unset to generate from `inputs_embeds`."
            )
        return super()._prefill(input_ids, generation_config, model_kwargs, *args, **kwargs)

    def _check_room_in_cache(self, cache, input_ids: torch.LongTensor, kwargs: dict) -> None:
        """A static cache's layers hold `max_cache_len` tokens each (sliding ones wrap around). A user's cache too
        small for the generation, or a returned one continued past it, failed inside transformers' cache, native
        models too: an IndexError from `index_copy_` (on a GPU, a device-side assert, which ends the process's CUDA
        use) after the cache had counted the tokens as stored. Checked before the step, from the sequence's length."""
        layers = getattr(cache, "self_attention_cache", cache).layers  # seq2seq: the decoder's own keys
        room = min((layer.max_cache_len for layer in layers if not layer.is_sliding), default=None)
        mask = kwargs.get("decoder_attention_mask" if self.config.is_encoder_decoder else "attention_mask")
        length = max(input_ids.shape[-1], mask.shape[-1] if mask is not None else 0)
        if room is not None and length > room:
            raise ValueError(
                f"The static cache holds {room} tokens (max_cache_len) and this decoding step needs {length}: build "
                "the cache with a max_cache_len of at least the generation's max_length, or pass "
                '`cache_implementation="static"` and let generate() size it.'
            )

    def _check_positions_of_step(self, input_ids: torch.LongTensor, kwargs: dict) -> None:
        """The last position a step reaches: the positions `generate()` made from the mask (decoder-only, since
        transformers 5.24) or the user gave, read back (a read a step, where the model has a table), or else the
        length of the sequence so far, whose last token's position it is (seq2seq decoding counts up from the
        cache's length)."""
        seq2seq = self.config.is_encoder_decoder
        # Not `get_decoder()`, which searches the model: 12 us a call (Intel Xeon, AVX-512), twice a token
        embeddings = (self.model.decoder if seq2seq else self.model).embeddings
        if embeddings.embed_positions is None:  # rotary or ALiBi positions: no table to run out of
            return
        prefix = "decoder_" if seq2seq else ""
        positions, mask = kwargs.get(f"{prefix}position_ids"), kwargs.get(f"{prefix}attention_mask")
        if positions is not None and positions.numel():
            last = int(positions.max())
        else:
            last = max(input_ids.shape[-1], mask.shape[-1] if mask is not None else 0) - 1
        embeddings.check_last_position(last)


class ScratchTransformer(ScratchPreTrainedModel):
    """A stack of Transformer blocks with its embeddings: input ids (B, T) -> hidden states (B, T, hidden).

    Not used on its own: the family models below construct it with their settings.
    """

    _can_record_outputs = {
        "hidden_states": ScratchBlock,
        "attentions": OutputRecorder(ScratchAttention, index=1, layer_name="self_attn"),
    }

    def __init__(
        self,
        config,
        *,
        layers_field: str,
        vocab_size: int,
        is_causal: bool,
        has_cross_attention: bool = False,
        type_vocab_size: int = 0,
    ):
        super().__init__(config)
        # The config field that counts this stack's layers (the seq2seq halves share one config). Forward runs as
        # many as it says now: early-exit self-speculation (`generate(assistant_early_exit=n)`) lowers it while
        # drafting, as Llama's stack honours.
        self.layers_field = layers_field
        num_layers = getattr(config, layers_field)
        self.is_causal = is_causal
        self.has_cross_attention = has_cross_attention
        # What errors call the inputs: the encoder-decoder passes its decoder `decoder_input_ids` / `..._embeds`.
        prefix = "decoder_" if has_cross_attention else ""
        self.input_names = (f"{prefix}input_ids", f"{prefix}inputs_embeds")
        self.embeddings = ScratchEmbeddings(config, vocab_size, type_vocab_size, input_name=self.input_names[0])
        self.layers = nn.ModuleList(
            [ScratchBlock(config, i, is_causal=is_causal, has_cross_attention=has_cross_attention)
             for i in range(num_layers)]
        )
        self.final_norm = make_norm(config) if config.final_norm else nn.Identity()
        self.rotary_emb = ScratchRotaryEmbedding(config) if config.position_embedding_type == "rope" else None
        self.alibi = ScratchAlibiBias(config.num_attention_heads) if config.position_embedding_type == "alibi" else None
        if is_causal:
            # Read by `merge_with_config_defaults`, which turns a cache off under gradient checkpointing in training
            # and warns. A bidirectional stack has no cache: with the flag it would warn about the config's
            # `use_cache=True`, and that logging call breaks a `torch.compile(fullgraph=True)` graph. Its layers
            # carry their own flags.
            self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.embed_tokens = value

    def _new_cache(self) -> Cache:
        if self.has_cross_attention:
            return EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        return DynamicCache(config=self.config)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """The cache comes as `cache` (transformers >= 5.24, `generate()` and continuous batching) or as
        `past_key_values` (the earlier name); the output holds it under the running version's field name."""
        past_key_values = resolve_cache(cache, past_key_values, self)
        paged = is_paged(past_key_values)
        if paged:
            # Continuous batching (`use_cache=False`): before 5.24 the attention function updates the paged cache, so
            # it travels in the kwargs as `cache`; from 5.24 our attention layer updates it, as native ones do.
            if not MODEL_UPDATES_PAGED_CACHE:
                kwargs["cache"] = past_key_values
                past_key_values = None
            use_cache = False
        ids_name, embeds_name = self.input_names
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Pass exactly one of `{ids_name}` or `{embeds_name}`.")
        if self.has_cross_attention and encoder_hidden_states is None:
            raise ValueError("This decoder attends to an encoder: pass `encoder_hidden_states`.")
        if self.has_cross_attention and past_key_values is not None and not isinstance(
            past_key_values, EncoderDecoderCache
        ):
            # One plain cache failed inside cross-attention (native Marian mixes both kinds of keys in it, silently).
            raise ValueError(
                "An encoder-decoder caches its self- and cross-attention keys apart: pass an `EncoderDecoderCache` "
                "(such as `EncoderDecoderCache(DynamicCache(), DynamicCache())`), got a "
                f"{type(past_key_values).__name__}."
            )
        inputs, name, dims = (input_ids, ids_name, 2) if input_ids is not None else (inputs_embeds, embeds_name, 3)
        check_inputs_shape(inputs, name, dims)
        if not self.is_causal:
            # A bidirectional stack makes no cache, but keys and values given as `past_key_values` are attended to
            # before the input's own, at later positions, as BERT does: PEFT's prefix tuning passes its prefix so.
            use_cache = False
        if use_cache and past_key_values is None:
            past_key_values = self._new_cache()
        past_length = past_key_values.get_seq_length() if past_key_values is not None and not paged else 0
        given_positions = position_ids
        position_span = None  # (first, last) of positions made here: the embeddings check them without reading them
        if position_ids is None:
            length = inputs.shape[1]
            if isinstance(past_length, int):  # a static cache counts in a tensor
                position_ids = torch.arange(past_length, past_length + length, device=inputs.device).unsqueeze(0)
                position_span = (past_length, past_length + length - 1) if length else None
            else:
                position_ids = torch.arange(length, device=inputs.device).unsqueeze(0) + past_length  # (1, T)
        if token_type_ids is not None and token_type_ids.shape in ((inputs.shape[1],), (1, inputs.shape[1])):
            token_type_ids = token_type_ids.expand(inputs.shape[:2])  # one row serves every sequence, as in BERT
        check_labels_shape(token_type_ids, inputs, "token_type_ids")

        hidden_states = self.embeddings(  # (B, T, hidden)
            input_ids, inputs_embeds, position_ids, token_type_ids, position_span=position_span
        )
        attention_mask = build_self_attention_mask(
            # Only given positions can restart (packed sequences): `masking_utils` looks for restarts at every
            # unmasked forward without a cache (about 40 us), ours count up from the cache length.
            self.config, hidden_states, attention_mask, past_key_values, given_positions, self.is_causal, self.alibi,
            paged=paged,
        )
        if self.has_cross_attention:
            if encoder_hidden_states.shape[0] not in (1, inputs.shape[0]):
                # Else a shape error from inside cross-attention's matrix product.
                raise ValueError(
                    f"`{name}` hold {inputs.shape[0]} sequences and the encoder output "
                    f"{encoder_hidden_states.shape[0]}: give each decoder row its source, or one source for all rows."
                )
            encoder_attention_mask = build_cross_attention_mask(
                self.config, hidden_states, encoder_hidden_states, encoder_attention_mask
            )
        position_embeddings = self.rotary_emb(hidden_states, position_ids) if self.rotary_emb is not None else None

        # islice, not `self.layers[:n]`: slicing builds a new ModuleList at every forward (about 10 us).
        for layer in itertools.islice(self.layers, getattr(self.config, self.layers_field)):
            # Tensors that need gradients go positionally: reentrant gradient checkpointing (`use_reentrant=True`)
            # passes only positional arguments through `torch.utils.checkpoint`.
            hidden_states = layer(
                hidden_states,
                encoder_hidden_states,
                attention_mask=attention_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,  # as Llama: flash kernels find packed sequences by their position resets
                past_key_values=past_key_values,
                encoder_attention_mask=encoder_attention_mask,
                **kwargs,
            )
        return self._stack_output(self.final_norm(hidden_states), past_key_values if use_cache else None)

    def _stack_output(self, last_hidden_state: torch.Tensor, cache: Cache | None) -> ModelOutput:
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=last_hidden_state, **cache_output(cache))


class ScratchSourceEncoder(ScratchTransformer):
    """The encoder half of the encoder-decoder: the bidirectional stack, returning a `BaseModelOutput` as Marian's and
    BART's encoders do. `generate()` hands the encoder's output to every step, so an exported step's program takes
    exactly that class (its input tree holds it): with the stack's own class, a hand-built
    `BaseModelOutput(last_hidden_state=...)`, which native Marian's program takes, failed to flatten."""

    def __init__(self, config, *, vocab_size: int):
        super().__init__(config, layers_field="encoder_layers", vocab_size=vocab_size, is_causal=False)

    def _stack_output(self, last_hidden_state: torch.Tensor, cache: Cache | None) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=last_hidden_state)  # a bidirectional stack makes no cache


class ScratchCrossAttentionTransformer(ScratchTransformer):
    """The decoder half of the encoder-decoder: the same stack, also recording its cross-attention weights."""

    _can_record_outputs = {
        "hidden_states": ScratchBlock,
        "attentions": OutputRecorder(ScratchAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(ScratchAttention, index=1, layer_name="cross_attn"),
    }

    def __init__(self, config, *, vocab_size: int):
        super().__init__(
            config, layers_field="decoder_layers", vocab_size=vocab_size, is_causal=True, has_cross_attention=True
        )
