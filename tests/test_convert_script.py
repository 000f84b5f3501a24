"""`scripts/convert_hf_checkpoint.py` end to end, as a user runs it: tiny native GPT-2, BERT and Marian models saved
with `save_pretrained`, converted in a subprocess, reloaded through the Auto classes with the native logits (1e-4);
and the refusals (an unsupported model, a missing folder, config or weight) exit non-zero naming the problem."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_native import ATOL, VOCAB, bert, gpt2, marian
from tiny_tokenizers import byte_level_bpe, wordpiece
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)

import hf_scratch_transformer as hst

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "convert_hf_checkpoint.py"
def run_script(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(SCRIPT), *map(str, args)]
    return subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=300)


def _inputs(family: str) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB - 2, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if family == "encoder":
        inputs["token_type_ids"] = torch.randint(0, 2, ids.shape, generator=generator)
    if family == "seq2seq":
        inputs["decoder_input_ids"] = ids[:, :5]
    return inputs


CASES = {
    # family: (native factory, Auto class, our class, tokenizer factory or None)
    "decoder": (gpt2, AutoModelForCausalLM, hst.ScratchDecoderForCausalLM, byte_level_bpe),
    "encoder": (bert, AutoModelForMaskedLM, hst.ScratchEncoderForMaskedLM, wordpiece),
    "seq2seq": (marian, AutoModelForSeq2SeqLM, hst.ScratchSeq2SeqForConditionalGeneration, None),
}


@pytest.mark.parametrize("family", CASES)
def test_converted_folder_reloads_with_native_logits(family, tmp_path):
    make_native, auto_class, our_class, make_tokenizer = CASES[family]
    source, output = tmp_path / "native", tmp_path / "scratch"
    if make_tokenizer is None:
        native = make_native().eval()
    else:
        tokenizer = make_tokenizer()
        tokenizer.save_pretrained(source)
        native = make_native(vocab_size=len(tokenizer)).eval()
    native.save_pretrained(source)

    result = run_script(source, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parity check passed" in result.stdout

    ours = auto_class.from_pretrained(output).eval()
    assert type(ours) is our_class
    inputs = _inputs(family)
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, native(**inputs).logits, atol=ATOL, rtol=0)
    if make_tokenizer is None:  # no tokenizer in the source: none written, quietly
        assert not (output / "tokenizer_config.json").exists() and "tokenizer" not in result.stdout
    else:
        source_ids, output_ids = (AutoTokenizer.from_pretrained(folder)("To be, or not to be").input_ids
                                  for folder in (source, output))
        assert output_ids == source_ids


def _llama_folder(path: Path) -> Path:
    config = LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=37,
                         vocab_size=VOCAB)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _gpt2_without_a_weight(path: Path) -> Path:
    gpt2().save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    del weights["transformer.h.1.mlp.c_fc.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _gpt2_with_a_larger_tokenizer(path: Path) -> Path:
    gpt2().save_pretrained(path)
    byte_level_bpe().save_pretrained(path)  # a few hundred tokens for a vocabulary of 99
    return path


def _folder_without_config(path: Path) -> Path:
    gpt2().save_pretrained(path)
    (path / "config.json").unlink()
    return path


@pytest.mark.parametrize("make_source, expected", [
    (_llama_folder, ["model_type='llama'", "LlamaForCausalLM", "supported: gpt2 (GPT2LMHeadModel)"]),
    (lambda path: path / "missing", ["does not exist"]),
    (_folder_without_config, ["no config.json"]),
    (_gpt2_without_a_weight, ["lacks weights", "transformer.h.1.mlp.c_fc.weight"]),
    (_gpt2_with_a_larger_tokenizer, ["the tokenizer has", "more than the model's vocabulary (99)"]),
], ids=["unsupported-model", "missing-folder", "missing-config", "missing-weight", "tokenizer-too-large"])
def test_bad_sources_are_refused_with_a_clear_message(make_source, expected, tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    result = run_script(make_source(source), tmp_path / "output")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    for fragment in expected:
        assert fragment in result.stderr
    assert not (tmp_path / "output").exists()
