"""Hugging Face's own common model tests (`ModelTesterMixin`, `ConfigTester`) run against the three families.

Every native model in `transformers` passes these; they check save/load, tied weights, initialisation,
attention and hidden-state outputs, training and gradient checkpointing, eager vs sdpa, embedding resizing, ...
The upstream test files are not committed: `conformance/setup_hf_tests.py` builds them from the sdist of the
installed `transformers` into `.hf_conformance/` (git-ignored), as the package `hf_upstream_tests` (renamed so
that it cannot clash with this repository's `tests/`). Without network access on a first run, the module skips.

Each family is tested with one representative configuration at the upstream tiny sizes (batch 13, seq 7,
vocab 99, hidden 32, 2 layers, 4 heads): the decoder Llama-style, the encoder BERT-style, the seq2seq model as in
Vaswani et al. Skips below are explained where they are declared; the others come from upstream (no GPU, no
flash attention, no DeepSpeed, ...) and say so in their reason.
"""

import importlib.util
import sys
import unittest
import warnings
from pathlib import Path

import pytest

import hf_scratch_transformer
from hf_scratch_transformer import (
    ScratchDecoderConfig,
    ScratchDecoderForCausalLM,
    ScratchDecoderForQuestionAnswering,
    ScratchDecoderForSequenceClassification,
    ScratchDecoderForTokenClassification,
    ScratchDecoderModel,
    ScratchEncoderConfig,
    ScratchEncoderForMaskedLM,
    ScratchEncoderForMultipleChoice,
    ScratchEncoderForQuestionAnswering,
    ScratchEncoderForSequenceClassification,
    ScratchEncoderForTokenClassification,
    ScratchEncoderModel,
    ScratchSeq2SeqConfig,
    ScratchSeq2SeqForConditionalGeneration,
    ScratchSeq2SeqModel,
)


def _load_setup_module():
    path = Path(__file__).parent / "conformance" / "setup_hf_tests.py"
    spec = importlib.util.spec_from_file_location("setup_hf_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_setup = _load_setup_module()
try:
    _TREE = _setup.build()
except _setup.SetupError as error:
    pytest.skip(f"upstream transformers tests unavailable: {error}", allow_module_level=True)
if str(_TREE) not in sys.path:
    sys.path.insert(0, str(_TREE))

# Upstream registers its pytest markers (flash_attn_test, torch_compile_test, ...) in its own pyproject.toml.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    import hf_upstream_tests.test_modeling_common as upstream
    from hf_upstream_tests.test_configuration_common import ConfigTester
    from hf_upstream_tests.test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask


# The mixin picks labels and some tests by class name: `name in get_values(MODEL_FOR_..._MAPPING_NAMES)`, tables
# of native models (`Auto*.register` does not touch them; only the decoder's causal LM adds itself to its table, for
# Trainer's label smoothing, and counts twice there, which changes no membership test). Each of our classes counts
# for the tables of the Auto classes it is registered with.
def _registered_names() -> dict[int, list[str]]:
    names = {}
    for models in hf_scratch_transformer.AUTO_CLASSES.values():
        for auto_class, model_class in models:
            table = auto_class._model_mapping._model_mapping  # the MODEL_..._MAPPING_NAMES dict behind it
            names.setdefault(id(table), []).append(model_class.__name__)
    return names


_OUR_NAMES = _registered_names()
_native_get_values = upstream.get_values


def _get_values_with_ours(mapping):
    return [*_native_get_values(mapping), *_OUR_NAMES.get(id(mapping), [])]


upstream.get_values = _get_values_with_ours


class _TinySizes:
    """The sizes upstream testers use. `parent` is the TestCase (the mixin calls `self.parent.assert...`)."""

    batch_size = 13
    seq_length = 7
    is_training = True
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    intermediate_size = 37

    def __init__(self, parent):
        self.parent = parent

    def prepare_config_and_inputs_for_common(self):
        return self.get_config(), self.get_inputs()


class ScratchDecoderModelTester(_TinySizes):
    pad_token_id = 0

    def get_config(self):
        # Llama-style, as the preset "llama-style": RoPE, RMSNorm, SwiGLU, no biases, 2:1 grouped-query attention,
        # untied output head.
        return ScratchDecoderConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=2,
            intermediate_size=self.intermediate_size,
            hidden_act="swiglu",
            max_position_embeddings=512,
            position_embedding_type="rope",
            rope_theta=10000.0,
            norm_type="rmsnorm",
            use_bias=False,
            tie_word_embeddings=False,
            dropout=0.1,
            attention_dropout=0.1,
            pad_token_id=self.pad_token_id,
            bos_token_id=1,
            eos_token_id=2,
        )

    def get_inputs(self):
        shape = [self.batch_size, self.seq_length]
        return {"input_ids": ids_tensor(shape, self.vocab_size), "attention_mask": random_attention_mask(shape)}


class ScratchEncoderModelTester(_TinySizes):
    type_vocab_size = 2
    num_choices = 4  # the mixin repeats each input this many times for the multiple-choice head (as BERT's tester)

    def get_config(self):
        # BERT-style: post-norm, learned positions, token types, embedding norm, GELU, MLM transform, tied head.
        return ScratchEncoderConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act="gelu",
            max_position_embeddings=512,
            position_embedding_type="learned",
            type_vocab_size=self.type_vocab_size,
            norm_position="post",
            final_norm=False,
            embedding_norm=True,
            mlm_transform=True,
            dropout=0.1,
            attention_dropout=0.1,
            pad_token_id=0,
        )

    def get_inputs(self):
        shape = [self.batch_size, self.seq_length]
        return {
            "input_ids": ids_tensor(shape, self.vocab_size),
            "token_type_ids": ids_tensor(shape, self.type_vocab_size),
            "attention_mask": random_attention_mask(shape),
        }


class ScratchSeq2SeqModelTester(_TinySizes):
    encoder_seq_length = decoder_seq_length = _TinySizes.seq_length
    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def get_config(self):
        # Vaswani et al. (preset "transformer-base"): post-norm, sinusoidal positions, ReLU, embeddings scaled by
        # sqrt(hidden) and shared by encoder, decoder and output projection. The untied-head tests set
        # `tie_word_embeddings=False`, which unties the head only: encoder and decoder keep sharing.
        return ScratchSeq2SeqConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act="relu",
            max_position_embeddings=512,
            position_embedding_type="sinusoidal",
            norm_position="post",
            final_norm=False,
            scale_embeddings=True,
            share_embeddings=True,
            dropout=0.1,
            attention_dropout=0.1,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            decoder_start_token_id=self.bos_token_id,
        )

    def get_inputs(self):
        # As BART's tester: source ids above the special ids and ending in EOS, so nothing is padding.
        shape = [self.batch_size, self.seq_length]
        input_ids = ids_tensor(shape, self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = ids_tensor(shape, self.vocab_size).clamp(3)
        decoder_input_ids[:, 0] = self.bos_token_id
        return {
            "input_ids": input_ids,
            "attention_mask": input_ids.ne(self.pad_token_id),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_input_ids.ne(self.pad_token_id),
        }


# Skips that upstream decides by itself, besides the environmental ones (accelerator, MPS, flash attention, kernels,
# DeepSpeed, @slow), and why they do not apply here:
# - features these families do not have: sparse experts / grouped_mm / router logits (MoE), composite models and
#   sub-configs, axial or partial RoPE, `_keep_in_fp32_modules` (none is needed), a tensor-parallel plan;
# - "No conversion found": checkpoint weight-renaming tables exist for native model types only;
# - test_sliding_window_mask needs a `use_sliding_window` switch (Mistral-style); ours is `sliding_window` alone;
# - test_resize_position_vector_embeddings is opt-in (`test_resize_position_embeddings`), an API we do not offer;
# - the other family's LM-head tests ("No decoder-only / sequence-to-sequence language modeling head");
# - the RoPE tests on the encoder and seq2seq ("does not support RoPE scaling"): those configurations use absolute
#   positions, so, as native configs without RoPE, they have no `rope_parameters`;
# - test_sdpa_can_dispatch_composite_models ("does not support SDPA" means "not composite");
# - test_can_capture_specific_layers_hidden_states on seq2seq: it reads `hidden_states`, which encoder-decoder
#   outputs split into `encoder_hidden_states` / `decoder_hidden_states` (native BART skips it too).
class _ScratchConformanceTest(ModelTesterMixin):
    model_tester_class = None
    config_class = None

    # Upstream runs this only for models whose config file carries a copyright year >= 2023 (or that opt in).
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        # Upstream passes hidden_size=37 to check that a non-default value survives; ours must be divisible by
        # the default `num_attention_heads` (8), so 48.
        self.config_tester = ConfigTester(self, config_class=self.config_class, hidden_size=48)

    def test_config(self):
        self.config_tester.run_common_tests()

    # Upstream requires GenerationTesterMixin for models that can `generate`, but its file is not in the sdist:
    # the harness has an empty stub, so no upstream generation test runs here.
    @unittest.skip("GenerationTesterMixin is not shipped in the transformers sdist")
    def test_generation_tester_mixin_inheritance(self):
        pass


class ScratchDecoderConformanceTest(_ScratchConformanceTest, unittest.TestCase):
    model_tester_class = ScratchDecoderModelTester
    config_class = ScratchDecoderConfig
    all_model_classes = (ScratchDecoderModel, ScratchDecoderForCausalLM, ScratchDecoderForSequenceClassification,
                         ScratchDecoderForTokenClassification, ScratchDecoderForQuestionAnswering)


class ScratchEncoderConformanceTest(_ScratchConformanceTest, unittest.TestCase):
    model_tester_class = ScratchEncoderModelTester
    config_class = ScratchEncoderConfig
    all_model_classes = (
        ScratchEncoderModel,
        ScratchEncoderForMaskedLM,
        ScratchEncoderForSequenceClassification,
        ScratchEncoderForTokenClassification,
        ScratchEncoderForQuestionAnswering,
        ScratchEncoderForMultipleChoice,
    )


class ScratchSeq2SeqConformanceTest(_ScratchConformanceTest, unittest.TestCase):
    model_tester_class = ScratchSeq2SeqModelTester
    config_class = ScratchSeq2SeqConfig
    all_model_classes = (ScratchSeq2SeqModel, ScratchSeq2SeqForConditionalGeneration)
    is_encoder_decoder = True
