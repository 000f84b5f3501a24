"""hf-scratch-transformer: the Transformer of "Attention Is All You Need", written from scratch, as three
Hugging Face model families (decoder-only, encoder-only, encoder-decoder).

Importing the package checks the installed releases of its dependencies against its ranges and transformers' own
(`installed_dependencies`), and registers every config and model with the `transformers` Auto classes (from each
config's `family_auto_map`), marks each class for `register_for_auto_class`, so that `save_pretrained` writes the
model code next to the weights; the seq2seq model file registers the pipeline task `scratch-text2text`. Saved folders
then load with `trust_remote_code=True` where this package is not installed. This file is never copied there.
"""

# First, before an import below fails on a release out of the package's ranges: the installed releases are checked
# as this module is imported, and one out of range is named with its range, not by the name it lacks.
from . import installed_dependencies  # noqa: F401

# isort: split
import importlib

import transformers
from transformers import AutoConfig

from .configuration_scratch import ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig
from .modeling_scratch_decoder import (
    ScratchDecoderForCausalLM,
    ScratchDecoderForQuestionAnswering,
    ScratchDecoderForSequenceClassification,
    ScratchDecoderForTokenClassification,
    ScratchDecoderModel,
    ScratchDecoderPreTrainedModel,
)
from .modeling_scratch_encoder import (
    ScratchEncoderForMaskedLM,
    ScratchEncoderForMultipleChoice,
    ScratchEncoderForQuestionAnswering,
    ScratchEncoderForSequenceClassification,
    ScratchEncoderForTokenClassification,
    ScratchEncoderModel,
    ScratchEncoderPreTrainedModel,
)
from .modeling_scratch_seq2seq import (
    ScratchSeq2SeqForConditionalGeneration,
    ScratchSeq2SeqModel,
    ScratchSeq2SeqPreTrainedModel,
)
from .pipeline_scratch_text2text import TASK as TEXT2TEXT_TASK
from .pipeline_scratch_text2text import ScratchText2TextPipeline


def _auto_classes(config_class) -> list[tuple[type, type]]:
    """(Auto class, model class) pairs of one family, from its config's `family_auto_map`."""
    pairs = []
    for auto_name, reference in config_class.family_auto_map.items():
        if auto_name == "AutoConfig":
            continue
        module_name, class_name = reference.split(".")
        module = importlib.import_module(f".{module_name}", __name__)
        pairs.append((getattr(transformers, auto_name), getattr(module, class_name)))
    return pairs


# config class -> [(Auto class, model class), ...]: the table of SPEC section 2.
AUTO_CLASSES = {
    config_class: _auto_classes(config_class)
    for config_class in (ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig)
}


def _register() -> None:
    for config_class, models in AUTO_CLASSES.items():
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_class, model_class in models:
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


_register()

__all__ = [
    "AUTO_CLASSES",
    "TEXT2TEXT_TASK",
    "ScratchDecoderConfig",
    "ScratchEncoderConfig",
    "ScratchSeq2SeqConfig",
    "ScratchDecoderPreTrainedModel",
    "ScratchDecoderModel",
    "ScratchDecoderForCausalLM",
    "ScratchDecoderForSequenceClassification",
    "ScratchDecoderForTokenClassification",
    "ScratchDecoderForQuestionAnswering",
    "ScratchEncoderPreTrainedModel",
    "ScratchEncoderModel",
    "ScratchEncoderForMaskedLM",
    "ScratchEncoderForSequenceClassification",
    "ScratchEncoderForTokenClassification",
    "ScratchEncoderForQuestionAnswering",
    "ScratchEncoderForMultipleChoice",
    "ScratchSeq2SeqPreTrainedModel",
    "ScratchSeq2SeqModel",
    "ScratchSeq2SeqForConditionalGeneration",
    "ScratchText2TextPipeline",
]
