"""`scratch-text2text`: text in, generated text out, for encoder-decoder models (translation, summarisation).

transformers 5 removed its `text2text-generation` and `translation` pipelines, so the seq2seq family ships its
own task. The seq2seq model file registers it with `PIPELINE_REGISTRY` when imported (on package import, or when a
saved folder's model loads with `trust_remote_code`), and saved seq2seq folders carry this file and declare it in
`config.custom_pipelines`, so that

    pipeline("scratch-text2text", model=folder, trust_remote_code=True)

works where this package is not installed, as does `pipeline("scratch-text2text", model=model)` for a model loaded
from such a folder. Output: one `{"generated_text": ...}` per returned sequence. Unless the call or the model's
generation config says otherwise: 4 beams and 256 new tokens at most, or `max_position_embeddings` for learned and
sinusoidal positions where that is fewer. Sources are cut with `truncation=True` (at the tokenizer's
`model_max_length`) or `max_source_length=N`, and uncut otherwise.
"""

from transformers import AutoModelForSeq2SeqLM, GenerationConfig, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

TASK = "scratch-text2text"
# Position tables that end at `max_position_embeddings` (RoPE and ALiBi have no end).
ABSOLUTE_POSITIONS = ("learned", "sinusoidal")


class ScratchText2TextPipeline(Pipeline):
    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    # Used unless the model's own generation config says otherwise.
    _default_generation_config = GenerationConfig(max_new_tokens=256, num_beams=4)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A model without an LM head failed later with an AttributeError (`Pipeline.__init__` sets the generation
        # defaults only for models that generate), and a decoder-only one answered its source and a continuation.
        if not (self.model.config.is_encoder_decoder and self.model.can_generate()):
            raise ValueError(
                f"{TASK} needs an encoder-decoder model that generates (ScratchSeq2SeqForConditionalGeneration, "
                f"AutoModelForSeq2SeqLM); got a {type(self.model).__name__}."
            )
        # The decoder reads one position per new token: with absolute positions, the default length stops at the
        # last one (`hf-scratch train --task seq2seq` makes 128), where 256 failed whenever no EOS came first.
        config = self.model.config
        if getattr(config, "position_embedding_type", None) in ABSOLUTE_POSITIONS:
            defaults = self._generation_defaults
            defaults["max_new_tokens"] = min(defaults["max_new_tokens"], config.max_position_embeddings)

    def _sanitize_parameters(
        self, max_source_length=None, truncation=None, skip_special_tokens=None, **generate_kwargs
    ):
        preprocess_params = {
            name: value for name, value in (("max_source_length", max_source_length), ("truncation", truncation))
            if value is not None
        }
        postprocess_params = {} if skip_special_tokens is None else {"skip_special_tokens": skip_special_tokens}
        # `Pipeline.__init__` loads `assistant_model=` (and `assistant_tokenizer=`) but leaves passing them on to the
        # task, as transformers' text-generation pipeline does: otherwise they are kept and never used.
        if getattr(self, "assistant_model", None) is not None:  # set only for a model that can generate
            generate_kwargs["assistant_model"] = self.assistant_model
        if getattr(self, "assistant_tokenizer", None) is not None:
            generate_kwargs |= {"tokenizer": self.tokenizer, "assistant_tokenizer": self.assistant_tokenizer}
        return preprocess_params, generate_kwargs, postprocess_params

    def preprocess(self, text: str, max_source_length: int | None = None, truncation=None):
        # `truncation=True`, as transformers' removed text2text pipeline took it (it reached `generate()` and failed
        # there as an unused model kwarg): cut at `max_source_length`, else the tokenizer's `model_max_length` (the
        # length the training commands trained at).
        truncate = max_source_length is not None if truncation is None else truncation
        return self.tokenizer(text, return_tensors="pt", truncation=truncate, max_length=max_source_length)

    def _forward(self, model_inputs, **generate_kwargs):
        # The ids only, even where the call or the model's generation config asks `generate()` for a dict (as
        # transformers' image-text-to-text pipeline does): the reshape and decoding below need the tensor.
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs, return_dict_in_generate=False)
        inputs = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)  # (inputs x returned, L)
        # (inputs, returned, L): the pipeline splits a batch along dim 0, so each input keeps its own sequences.
        return {"output_ids": output_ids.reshape(inputs, -1, output_ids.shape[-1])}

    def postprocess(self, model_outputs, skip_special_tokens: bool = True):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"][0], skip_special_tokens=skip_special_tokens)
        return [{"generated_text": text.strip()} for text in texts]


def register_pipeline_task() -> None:
    """Registers the task, unless registered already: each saved folder loaded with `trust_remote_code` imports its
    own copy of this file, and the first registration (the package's, where it is installed) stays."""
    if TASK not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            TASK, pipeline_class=ScratchText2TextPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )
