"""hf-scratch-transformer: the Transformer of "Attention Is All You Need", written from scratch, as three
Hugging Face model families (decoder-only, encoder-only, encoder-decoder).

Importing the package registers every config and model with the `transformers` Auto classes, and marks each
class for `register_for_auto_class`, so that `save_pretrained` writes the model code next to the weights and the
folder loads with `trust_remote_code=True` where this package is not installed. This file is never copied there.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_scratch import ScratchDecoderConfig, ScratchEncoderConfig, ScratchSeq2SeqConfig
from .modeling_scratch_decoder import (
    ScratchDecoderForCausalLM,
    ScratchDecoderForSequenceClassification,
    ScratchDecoderModel,
    ScratchDecoderPreTrainedModel,
)
from .modeling_scratch_encoder import (
    ScratchEncoderForMaskedLM,
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

# (config, [(auto class, model class), ...]) for each family: the table of SPEC section 2.
AUTO_CLASSES = {
    ScratchDecoderConfig: [
        (AutoModel, ScratchDecoderModel),
        (AutoModelForCausalLM, ScratchDecoderForCausalLM),
        (AutoModelForSequenceClassification, ScratchDecoderForSequenceClassification),
    ],
    ScratchEncoderConfig: [
        (AutoModel, ScratchEncoderModel),
        (AutoModelForMaskedLM, ScratchEncoderForMaskedLM),
        (AutoModelForSequenceClassification, ScratchEncoderForSequenceClassification),
        (AutoModelForTokenClassification, ScratchEncoderForTokenClassification),
    ],
    ScratchSeq2SeqConfig: [
        (AutoModel, ScratchSeq2SeqModel),
        (AutoModelForSeq2SeqLM, ScratchSeq2SeqForConditionalGeneration),
    ],
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
    "ScratchDecoderConfig",
    "ScratchEncoderConfig",
    "ScratchSeq2SeqConfig",
    "ScratchDecoderPreTrainedModel",
    "ScratchDecoderModel",
    "ScratchDecoderForCausalLM",
    "ScratchDecoderForSequenceClassification",
    "ScratchEncoderPreTrainedModel",
    "ScratchEncoderModel",
    "ScratchEncoderForMaskedLM",
    "ScratchEncoderForSequenceClassification",
    "ScratchEncoderForTokenClassification",
    "ScratchSeq2SeqPreTrainedModel",
    "ScratchSeq2SeqModel",
    "ScratchSeq2SeqForConditionalGeneration",
]
