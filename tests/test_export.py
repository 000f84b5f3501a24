"""`torch.export` as transformers exports native models, side by side with GPT-2, BERT and Marian carrying the same
weights (`from_hf`): the forward of each family with a dynamic batch and length (`transformers.exporters`'
`DynamoExporter`), every task head against BERT's, GPT-2's and Llama's, the decoder through
`integrations.executorch`'s static-cache wrappers and `generate()`'s prefill and decode steps over a static cache, and
the encoder-decoder through `Seq2SeqLMExportableModule`. ONNX: tests/test_onnx_export.py."""

import copy

import pytest
import torch
from tiny_models import tiny_lm
from tiny_native import ATOL, VOCAB, bert, gpt2, llama, marian
from transformers import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GenerationConfig,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    LlamaForQuestionAnswering,
    LlamaForTokenClassification,
)
from transformers.exporters import DynamoConfig, DynamoExporter
from transformers.exporters.utils import decompose_for_generation
from transformers.integrations.executorch import (
    Seq2SeqLMExportableModule,
    TorchExportableModuleForDecoderOnlyLM,
    TorchExportableModuleWithStaticCache,
    convert_and_export_with_cache,
)
from transformers.modeling_outputs import BaseModelOutput

from hf_scratch_transformer.conversion import from_hf

pytestmark = pytest.mark.filterwarnings("ignore")  # the exporter's "experimental" and torch's tracing warnings


def _ids(batch, length, seed=0):
    return torch.randint(3, VOCAB - 2, (batch, length), generator=torch.Generator().manual_seed(seed))


def _forward_inputs(family, batch, length):
    ids = _ids(batch, length)
    mask = torch.ones_like(ids)
    if family == "gpt2":
        mask[-1, :2] = 0  # left padding
        return {"input_ids": ids, "attention_mask": mask}
    mask[-1, -2:] = 0
    if family == "bert":
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": _ids(batch, length - 3, seed=1)}


@pytest.mark.parametrize("family, make_native", [("gpt2", gpt2), ("bert", bert), ("marian", marian)],
                         ids=["gpt2", "bert", "marian"])
def test_forward_exports_with_a_dynamic_batch_and_length_as_the_native_model(family, make_native):
    native = make_native()
    ours = from_hf(native)
    exported = {}
    for name, model in (("native", native), ("ours", ours)):
        program = DynamoExporter().export(model, _forward_inputs(family, 2, 7), DynamoConfig(dynamic=True)).program
        exported[name] = program.module()
    for batch, length in ((2, 7), (3, 11)):  # the traced shape and another
        inputs = _forward_inputs(family, batch, length)
        with torch.no_grad():
            expected = native(**inputs).logits
            torch.testing.assert_close(ours(**inputs).logits, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(exported["ours"](**inputs).logits, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(exported["native"](**inputs).logits, expected, atol=ATOL, rtol=0)


TASK_HEADS = {  # native task head: the config of its language model (tiny_native)
    BertForSequenceClassification: bert, BertForTokenClassification: bert, BertForQuestionAnswering: bert,
    BertForMultipleChoice: bert, GPT2ForSequenceClassification: gpt2, GPT2ForTokenClassification: gpt2,
    GPT2ForQuestionAnswering: gpt2, LlamaForTokenClassification: llama, LlamaForQuestionAnswering: llama,
}


@pytest.mark.parametrize("native_class", TASK_HEADS, ids=lambda native_class: native_class.__name__)
def test_every_task_head_exports_with_a_dynamic_batch_and_length(native_class):
    """Ours converted from each native task head: the exported program gives the native head's outputs at the traced
    shape and another, right-padded rows (the decoder classifier finds each row's last real token), and the multiple
    choice head's choices in place of the batch."""
    config = TASK_HEADS[native_class]().config
    config.num_labels = 2 if native_class.__name__.endswith("QuestionAnswering") else 3
    native = native_class(config).eval()
    ours = from_hf(native)

    def inputs(batch, length):
        ids = _ids(batch, length)
        ids[-1, -2:] = config.pad_token_id or 0
        mask = (torch.arange(length) < torch.tensor([[length]] * (batch - 1) + [[length - 2]])).long()
        if native_class is BertForMultipleChoice:  # the rows as the choices of one
            return {"input_ids": ids[None], "attention_mask": mask[None]}
        return {"input_ids": ids, "attention_mask": mask}

    program = DynamoExporter().export(ours, inputs(2, 7), DynamoConfig(dynamic=True)).program.module()
    for batch, length in ((2, 7), (3, 11)):
        with torch.no_grad():
            expected, actual = native(**inputs(batch, length)), program(**inputs(batch, length))
        for name in ("logits", "start_logits", "end_logits"):
            if name in expected:
                torch.testing.assert_close(actual[name], expected[name], atol=ATOL, rtol=0)


def _static_cache(model, batch_size=1, max_cache_len=24):
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static",
                                               cache_config={"batch_size": batch_size, "max_cache_len": max_cache_len})
    return model


def test_static_cache_decoder_exports_and_decodes_the_native_tokens():
    """`TorchExportableModuleForDecoderOnlyLM` with a dynamic length: a prefill of the prompt, then one token a step,
    gives eager `generate()`'s tokens, which are GPT-2's; `convert_and_export_with_cache` driven by transformers' own
    helper gives the native program's tokens (the helper feeds each new token one position late, on both)."""
    native = gpt2()
    ours = from_hf(native)
    prompt = _ids(1, 6)
    expected = native.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert torch.equal(ours.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False), expected)
    length = {"input_ids": {1: torch.export.Dim.DYNAMIC}, "cache_position": {0: torch.export.Dim.DYNAMIC}}
    program = TorchExportableModuleForDecoderOnlyLM(_static_cache(ours)).export(
        input_ids=_ids(1, 3), cache_position=torch.arange(3), dynamic_shapes=length, strict=False
    ).module()
    logits = program(input_ids=prompt, cache_position=torch.arange(6))
    tokens = prompt
    for position in range(6, 16):
        tokens = torch.cat([tokens, logits[:, -1:].argmax(-1)], dim=1)
        if position < 15:
            logits = program(input_ids=tokens[:, -1:], cache_position=torch.tensor([position]))
    assert torch.equal(tokens, expected)
    helped = [TorchExportableModuleWithStaticCache.generate(convert_and_export_with_cache(model), prompt, 10)
              for model in (ours, _static_cache(native))]
    assert torch.equal(helped[0], helped[1])


@pytest.mark.parametrize("overrides", [{}, dict(position_embedding_type="alibi")], ids=["gpt2", "alibi"])
def test_generation_steps_export_over_a_static_cache(overrides):
    """`DynamoExporter.export_for_generation` over a static cache: the prefill and decode graphs compute what the
    model computes on the inputs `generate()` gave them (left padding). The padding mask's width was checked against
    the cache's length, a tensor under `torch.export`: "Could not guard on data-dependent expression"."""
    model = from_hf(gpt2()) if not overrides else tiny_lm("decoder", **overrides)
    ids = _ids(2, 7)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    config = GenerationConfig(do_sample=False, cache_implementation="static", pad_token_id=0, eos_token_id=2)
    steps = decompose_for_generation(model, inputs, generation_config=config, multi_token_decode=True)
    exported = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(dynamic=True),
                                                      generation_config=config, multi_token_decode=True)
    for name, (_, step_inputs) in steps.items():
        step_inputs = {key: value for key, value in step_inputs.items() if key not in ("use_cache", "return_dict")}
        with torch.no_grad():
            expected = model(**copy.deepcopy(step_inputs)).logits
        actual = exported.components[name].program.module()(**step_inputs).logits
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0,
                                   msg=lambda message, name=name: f"{name}: {message}")


def test_seq2seq_exportable_module_exports_with_its_defaults_and_decodes_as_eager():
    """`Seq2SeqLMExportableModule(model).export()` sizes its example encoder states by `config.d_model`, which
    ours lacked (AttributeError). Its exported encoder and static-cache decoder, one token a step from
    `decoder_start_token_id`, give the logits of the eager model, which are Marian's. (The module's own `generate`
    starts from token 0, T5's start, and native Marian's exported decoder leaves out its `final_logits_bias`.)"""
    native = marian()
    ours = from_hf(native)
    assert ours.config.d_model == ours.config.hidden_size
    module = Seq2SeqLMExportableModule(ours, max_hidden_seq_length=64, max_cache_length=16).export()
    source = _ids(1, 7)
    encoded = module.exported_encoder.module()(source)
    tokens, steps = [ours.config.decoder_start_token_id], []
    for position in range(6):
        logits = module.exported_decoder.module()(torch.tensor([tokens[-1:]]), encoded, torch.tensor([position]))
        steps.append(logits[:, -1])
        tokens.append(int(logits[0, -1].argmax()))
    with torch.no_grad():
        expected = native(input_ids=source, decoder_input_ids=torch.tensor([tokens[:-1]])).logits
    torch.testing.assert_close(torch.stack(steps, dim=1), expected, atol=ATOL, rtol=0)


def _seq2seq_decode_step(model):
    """`generate()`'s decode step of Marian-like `model` on a batch with padding: its exported program and inputs."""
    source = _ids(2, 7)
    mask = torch.ones_like(source)
    mask[-1, -2:] = 0
    inputs = {"input_ids": source, "attention_mask": mask}
    config = GenerationConfig(do_sample=False, decoder_start_token_id=VOCAB - 1, pad_token_id=VOCAB - 1,
                              eos_token_id=0)
    _, step_inputs = decompose_for_generation(model, inputs, generation_config=config)["decode"]
    program = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(dynamic=True),
                                                     generation_config=config).components["decode"].program.module()
    return program, {key: value for key, value in step_inputs.items() if key not in ("use_cache", "return_dict")}


def test_seq2seq_decode_program_takes_a_hand_built_base_model_output_as_marian_does():
    """An exported program's inputs have the tree structure they were traced with, output classes included, and
    `generate()`'s steps carry `encoder_outputs` as the encoder returned them. Marian's encoder returns a
    `BaseModelOutput`, so its decode program takes a hand-built `BaseModelOutput(last_hidden_state=...)`; ours
    returned the stack's `BaseModelOutputWithPastAndCrossAttentions`, and the same call failed ("Trying to flatten
    user inputs with exported input tree spec"). Both give the eager model's logits, which are Marian's."""
    native = marian()
    ours = from_hf(native)
    for name, model in (("native", native), ("ours", ours)):
        program, step_inputs = _seq2seq_decode_step(model)
        step_inputs["encoder_outputs"] = BaseModelOutput(
            last_hidden_state=step_inputs["encoder_outputs"].last_hidden_state
        )
        with torch.no_grad():
            expected = native(**copy.deepcopy(step_inputs)).logits
        torch.testing.assert_close(program(**step_inputs).logits, expected, atol=ATOL, rtol=0,
                                   msg=lambda message, name=name: f"{name}: {message}")
