"""`hf-scratch convert` (and its wrapper `scripts/convert_hf_checkpoint.py`) end to end, as a user runs it: tiny native
GPT-2, Llama, BERT and Marian models saved with `save_pretrained`, converted in a subprocess, reloaded through the Auto
classes with the native logits (1e-4); a Scratch folder exported the other way, loading with the plain Auto classes;
and the refusals (an unsupported model, a missing folder, config or weight, a knob with no native equivalent, a
contradicting --to) exit with status 2 naming the problem, writing nothing."""

import errno
import importlib.util
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from forked_python import run_python
from huggingface_hub import ModelCard
from load_without_package import run_without_package
from safetensors.torch import load_file, save_file
from tiny_models import tiny_lm
from tiny_native import ATOL, VOCAB, bert, gpt2, llama, marian
from tiny_tokenizers import byte_level_bpe, wordpiece
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2DoubleHeadsModel,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForQuestionAnswering,
    TorchAoConfig,
)

import hf_scratch_transformer as hst
from hf_scratch_transformer import hub
from hf_scratch_transformer.conversion import from_hf

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "convert_hf_checkpoint.py"


def run_script(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(SCRIPT), *map(str, args)]
    return run_python(command, cwd=Path.cwd(), env=env, timeout=300)


def run_command(*args) -> subprocess.CompletedProcess:
    """`hf-scratch convert ...`, through the same dispatcher as the installed command."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hf_scratch_transformer.cli", "convert", *map(str, args)]
    return run_python(command, cwd=Path.cwd(), env=env, timeout=300)


def convert_here(monkeypatch, *args) -> None:
    """`hf-scratch convert ARGS` in this process, as the command's module: no process start (3-4 s a case)."""
    monkeypatch.setattr(sys, "argv", ["hf-scratch convert", *map(str, args)])
    runpy.run_module("hf_scratch_transformer.cli.convert", run_name="__main__")


def convert_refused(monkeypatch, capsys, *args):
    """`convert_here(ARGS)` stopping with exit status 2 (as argparse; 1 until 2026-11-30), and what it printed."""
    with pytest.raises(SystemExit) as stopped:
        convert_here(monkeypatch, *args)
    assert stopped.value.code == 2
    return capsys.readouterr()


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
    # A source without a card gets a short one, for `hf-scratch publish`: what was converted, how to load it.
    card = ModelCard.load(output / "README.md").text
    assert card.startswith(f"\n# scratch\n\n{hub.CONVERTED} from `{type(native).__name__}` to `{our_class.__name__}`")
    assert f'{auto_class.__name__}.from_pretrained(repo_id, trust_remote_code=True)' in card
    if make_tokenizer is None:  # no tokenizer in the source: none written, quietly
        assert not (output / "tokenizer_config.json").exists() and "tokenizer" not in result.stdout
    else:
        source_ids, output_ids = (AutoTokenizer.from_pretrained(folder)("To be, or not to be").input_ids
                                  for folder in (source, output))
        assert output_ids == source_ids


TASK_HEADS = {  # native class: (Auto class, our class, the card's task)
    BertForSequenceClassification: (AutoModelForSequenceClassification, hst.ScratchEncoderForSequenceClassification,
                                    "text-classification"),
    BertForTokenClassification: (AutoModelForTokenClassification, hst.ScratchEncoderForTokenClassification,
                                 "token-classification"),
    BertForQuestionAnswering: (AutoModelForQuestionAnswering, hst.ScratchEncoderForQuestionAnswering,
                               "question-answering"),
    BertForMultipleChoice: (AutoModelForMultipleChoice, hst.ScratchEncoderForMultipleChoice, "multiple-choice"),
}
UNLABELLED = ("question-answering", "multiple-choice")  # heads without classes


def _head_outputs(model, inputs: dict) -> list[torch.Tensor]:
    with torch.no_grad():
        output = model(**inputs)
    return [output[name] for name in ("logits", "start_logits", "end_logits") if name in output]


def _card_example(folder: Path, script: Path) -> Path:
    """The "How to use" code of `folder`'s card, made to load `folder` in place of its repository, written to
    `script`."""
    card = ModelCard.load(folder / "README.md")
    example = card.text.split("How to use")[1].split("```python\n")[1].split("```")[0]
    script.write_text(example.replace(f'"{hub.card_repo_id(folder)}"', repr(str(folder))))
    return script


def test_berts_task_heads_convert_to_ours_and_back_with_cards_whose_examples_run(tmp_path, monkeypatch, capsys):
    """A BERT sequence or token classifier, question-answering or multiple-choice folder becomes ours and ours becomes
    BERT's again, each loading with its Auto class to the source's outputs and labels, the last with BERT's very
    tensors. Each card's example (ours with remote code, BERT's without) runs where the package is missing."""
    tokenizer, examples = wordpiece(), []
    labels = {0: "O", 1: "B-PER", 2: "I-PER"}
    for native_class, (auto_class, our_class, task) in TASK_HEADS.items():
        source, scratch, back = (tmp_path / f"{task}-{name}" for name in ("native", "scratch", "back"))
        head = {} if task in UNLABELLED else dict(id2label=labels, label2id={v: k for k, v in labels.items()})
        native = native_class(BertConfig(**bert(vocab_size=len(tokenizer)).config.to_dict() | head)).eval()
        inputs = _inputs("encoder")
        if task == "multiple-choice":  # the two rows as the choices of one: (1, 2, length)
            inputs = {name: tensor[None] for name, tensor in inputs.items()}
        examples += _convert_head_both_ways(native, tokenizer, inputs, auto_class, our_class, task, tmp_path,
                                            monkeypatch, capsys)
    completed = run_without_package(tmp_path, "--run", *examples)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]


def _convert_head_both_ways(native, tokenizer, inputs: dict, auto_class, our_class, task: str, tmp_path: Path,
                            monkeypatch, capsys) -> list[Path]:
    """`native` (a task head) saved with `tokenizer`, converted to ours (the same outputs on `inputs` and labels once
    loaded with `auto_class`) and back (the native class with its very tensors and a card of `task`); returns the
    scripts of both cards' examples."""
    source, scratch, back = (tmp_path / f"{task}-{name}" for name in ("native", "scratch", "back"))
    native.save_pretrained(source)
    tokenizer.save_pretrained(source)
    convert_here(monkeypatch, source, scratch)
    assert "parity check passed" in capsys.readouterr().out
    ours = auto_class.from_pretrained(scratch).eval()
    assert type(ours) is our_class and ours.config.id2label == native.config.id2label
    for actual, expected in zip(_head_outputs(ours, inputs), _head_outputs(native, inputs), strict=True):
        torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    convert_here(monkeypatch, scratch, back)
    assert f"-> {type(native).__name__}" in capsys.readouterr().out
    reloaded = auto_class.from_pretrained(back)
    assert type(reloaded) is type(native) and reloaded.config.id2label == native.config.id2label
    for key, tensor in native.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    assert ModelCard.load(back / "README.md").data.pipeline_tag == task
    return [_card_example(folder, tmp_path / f"{folder.name}.py") for folder in (scratch, back)]


def test_a_gpt2_classifier_without_a_padding_id_converts_to_ours_and_back(tmp_path, monkeypatch, capsys):
    """GPT-2's sequence classifier (as GPT-2 checkpoints come: no padding id, so one row at a time, which the check
    takes) becomes ours and ours GPT-2's again, with its labels, the same outputs and GPT-2's very tensors; the
    card's example of ours runs where the package is missing."""
    tokenizer = byte_level_bpe()
    labels = {0: "negative", 1: "positive"}
    native = GPT2ForSequenceClassification(GPT2Config(**gpt2(vocab_size=len(tokenizer), pad_token_id=None).config
                                                      .to_dict() | dict(id2label=labels,
                                                                        label2id={v: k for k, v in labels.items()})))
    source, scratch, back = tmp_path / "native", tmp_path / "scratch", tmp_path / "back"
    native.save_pretrained(source)
    tokenizer.save_pretrained(source)
    convert_here(monkeypatch, source, scratch)
    assert "parity check passed" in capsys.readouterr().out
    ours = AutoModelForSequenceClassification.from_pretrained(scratch).eval()
    assert type(ours) is hst.ScratchDecoderForSequenceClassification and ours.config.id2label == labels
    ids = _inputs("decoder")["input_ids"][:1]
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, native.eval()(input_ids=ids).logits, atol=ATOL, rtol=0)
    convert_here(monkeypatch, scratch, back)
    assert "-> GPT2ForSequenceClassification" in capsys.readouterr().out
    reloaded = AutoModelForSequenceClassification.from_pretrained(back)
    assert type(reloaded) is GPT2ForSequenceClassification and reloaded.config.id2label == labels
    for key, tensor in native.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], tensor), key
    assert ModelCard.load(back / "README.md").data.pipeline_tag == "text-classification"
    completed = run_without_package(tmp_path, "--run", _card_example(scratch, tmp_path / "scratch.py"))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]


@pytest.mark.parametrize("native_class, auto_class, our_class, task", [
    (GPT2ForTokenClassification, AutoModelForTokenClassification, hst.ScratchDecoderForTokenClassification,
     "token-classification"),
    (LlamaForQuestionAnswering, AutoModelForQuestionAnswering, hst.ScratchDecoderForQuestionAnswering,
     "question-answering"),
], ids=["gpt2-tagger", "llama-question-answerer"])
def test_decoder_token_heads_convert_to_ours_and_back_with_cards_whose_examples_run(native_class, auto_class,
                                                                                   our_class, task, tmp_path,
                                                                                   monkeypatch, capsys):
    """GPT-2's token classifier and Llama's question answerer (its trunk under `transformer`) become ours and back,
    with their labels and very tensors; both cards' examples run where the package is missing."""
    tokenizer = byte_level_bpe()
    labels = {} if task == "question-answering" else {"id2label": {0: "O", 1: "B-ANIMAL"},
                                                       "label2id": {"O": 0, "B-ANIMAL": 1}}
    make_config = (lambda **values: GPT2Config(**gpt2(**values).config.to_dict())) if native_class is (
        GPT2ForTokenClassification) else (lambda **values: LlamaConfig(**llama(**values).config.to_dict()))
    native = native_class(make_config(vocab_size=len(tokenizer), **labels)).eval()
    examples = _convert_head_both_ways(native, tokenizer, _inputs("decoder"), auto_class, our_class, task, tmp_path,
                                       monkeypatch, capsys)
    completed = run_without_package(tmp_path, "--run", *examples)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-3000:]


def test_a_tokenizer_of_vocabulary_files_only_is_carried(tmp_path):
    """Older checkpoints (Google's small BERTs) hold only vocab.txt: AutoTokenizer loads it, so convert carries it
    (it was dropped without a word)."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    vocabulary = wordpiece().get_vocab()
    source.mkdir()
    (source / "vocab.txt").write_text("\n".join(sorted(vocabulary, key=vocabulary.get)) + "\n")
    bert(vocab_size=len(vocabulary)).save_pretrained(source)
    result = run_command(source, output, "--no-check")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "with its tokenizer" in result.stdout
    expected = AutoTokenizer.from_pretrained(source)("To be, or not to be").input_ids
    assert AutoTokenizer.from_pretrained(output)("To be, or not to be").input_ids == expected


@pytest.mark.parametrize("native_class, make_native, family, unused", [
    (BertForPreTraining, bert, "encoder", "cls.seq_relationship.weight"),
    (GPT2DoubleHeadsModel, gpt2, "decoder", "multiple_choice_head.summary.weight"),
], ids=["bert-pretraining", "gpt2-double-heads"])
def test_checkpoints_of_other_heads_that_hold_the_language_model_convert(native_class, make_native, family, unused,
                                                                         tmp_path):
    """BERT's original checkpoints are `BertForPreTraining` (MLM and NSP heads): they hold all of `BertForMaskedLM`
    and were refused for their `architectures`. The other head's tensors are listed as unused."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    native = native_class(make_native().config)
    native.save_pretrained(source)
    result = run_command(source, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parity check passed" in result.stdout and unused in result.stdout
    lm = make_native().eval()  # the language model the checkpoint holds
    lm.load_state_dict(native.state_dict(), strict=False)
    ours = CASES[family][1].from_pretrained(output).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**_inputs(family)).logits, lm(**_inputs(family)).logits, atol=ATOL, rtol=0)


def _llama(vocab_size: int = VOCAB) -> LlamaForCausalLM:
    config = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=37, vocab_size=vocab_size, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2, rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0})
    return LlamaForCausalLM(config).eval()


def test_saved_llama_folder_converts_with_the_command(tmp_path):
    source, output = tmp_path / "llama", tmp_path / "scratch"
    tokenizer = byte_level_bpe()
    native = _llama(vocab_size=len(tokenizer))
    native.generation_config.max_new_tokens = 13
    native.save_pretrained(source)
    tokenizer.save_pretrained(source)

    result = run_command(source, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LlamaForCausalLM -> ScratchDecoderForCausalLM" in result.stdout

    ours = AutoModelForCausalLM.from_pretrained(output).eval()
    assert type(ours) is hst.ScratchDecoderForCausalLM and ours.config.rope_parameters["rope_type"] == "linear"
    assert ours.generation_config.max_new_tokens == 13
    inputs = _inputs("decoder")
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, native(**inputs).logits, atol=ATOL, rtol=0)
    assert AutoTokenizer.from_pretrained(output)("To be").input_ids == tokenizer("To be").input_ids


def test_scratch_folder_exports_to_a_native_folder(tmp_path):
    """The other direction, detected from `model_type`: the result needs neither the package nor remote code
    (`test_export_native.py` loads such folders in a process without the package)."""
    source, output = tmp_path / "scratch", tmp_path / "native"
    tokenizer = byte_level_bpe()
    ours = tiny_lm("decoder", vocab_size=len(tokenizer), position_embedding_type="rope", norm_type="rmsnorm",
                   hidden_act="swiglu", use_bias=False, num_key_value_heads=2, tie_word_embeddings=False)
    ours.generation_config.max_new_tokens = 13
    ours.save_pretrained(source)
    tokenizer.save_pretrained(source)

    result = run_command(source, output, "--to", "native")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ScratchDecoderForCausalLM -> LlamaForCausalLM" in result.stdout and "parity check passed" in result.stdout

    assert json.loads((output / "config.json").read_text())["model_type"] == "llama"
    assert "auto_map" not in json.loads((output / "config.json").read_text())
    native = AutoModelForCausalLM.from_pretrained(output).eval()
    assert type(native) is LlamaForCausalLM and native.generation_config.max_new_tokens == 13
    inputs = _inputs("decoder")
    with torch.no_grad():
        torch.testing.assert_close(native(**inputs).logits, ours(**inputs).logits, atol=ATOL, rtol=0)
    assert AutoTokenizer.from_pretrained(output)("To be").input_ids == tokenizer("To be").input_ids


def test_an_export_that_llama_cpp_would_run_otherwise_is_noted(tmp_path, monkeypatch, capsys):
    """A GPT-2 export with ReLU (the `gpt-mini` preset's) converts to GGUF without a word from llama.cpp, whose GPT-2
    graph computes GELU: the command says so. An export that llama.cpp runs as it is gets no note."""
    for act, noted in (("relu", True), ("gelu_tanh", False)):
        source, output = tmp_path / act, tmp_path / f"{act}-native"
        tiny_lm("decoder", position_embedding_type="learned", hidden_act=act, intermediate_size=128).save_pretrained(
            source)
        convert_here(monkeypatch, source, output)
        out = capsys.readouterr().out
        assert "-> GPT2LMHeadModel" in out
        assert ("note for llama.cpp / GGUF: activation_function='relu'" in out) is noted, out


EXPORTS = {  # family: (native factory, card task, tokenizer)
    "decoder": (gpt2, "causal-lm", byte_level_bpe),
    "encoder": (bert, "masked-lm", wordpiece),
    "seq2seq": (marian, "seq2seq", lambda: byte_level_bpe(family="seq2seq")),
}


@pytest.mark.parametrize("family", EXPORTS)
def test_an_exported_folder_carries_its_card_and_is_ready_to_publish(family, tmp_path, monkeypatch):
    """A trained folder exported to its native family had no card, so `hf-scratch publish` refused it. Its card now
    goes with it (metadata, results, loss curve), saying what was converted, and its "How to use" loads the native
    model with the plain Auto classes: run where the package is missing, without remote code, it works."""
    make_native, task, make_tokenizer = EXPORTS[family]
    tokenizer, source, output = make_tokenizer(), tmp_path / "trained", tmp_path / "native"
    specials = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
                "decoder_start_token_id": tokenizer.pad_token_id} if family == "seq2seq" else {}
    ours = from_hf(make_native(vocab_size=len(tokenizer), **specials))
    ours.save_pretrained(source)
    tokenizer.save_pretrained(source)
    (source / hub.LOSS_CURVE).write_bytes(b"a plot")
    hub.write_model_card(source, task=task, model_name="someone/tiny", preset=None, config=ours.config.to_dict(),
                         num_parameters=ours.num_parameters(), dataset="tiny_shakespeare", hyperparameters={},
                         eval_results={"eval_loss": 2.5})
    if family == "seq2seq":  # a card written before the note named the transformers releases: its note goes too
        card_text = (source / "README.md").read_text()
        earlier = "The model code travels with the weights, so loading needs `trust_remote_code=True` (read the " \
            "`*.py` files first)."
        (source / "README.md").write_text(card_text.replace(hub.REMOTE_CODE_NOTE, earlier))

    convert_here(monkeypatch, source, output)
    card = ModelCard.load(output / "README.md")
    native_class = type(make_native()).__name__
    assert f"{hub.CONVERTED} from `{type(ours).__name__}` to `{native_class}`" in card.text
    assert "the source's on a random batch with a padded row" in card.text
    assert "trust_remote_code" not in card.text.replace("loaded without `trust_remote_code`", "")
    assert card.data.eval_results == ModelCard.load(source / "README.md").data.eval_results
    assert (output / hub.LOSS_CURVE).read_bytes() == b"a plot"
    assert {"README.md", hub.LOSS_CURVE, "model.safetensors"} <= dict(hub.upload_plan(output)).keys()
    assert hub.card_repo_id(output) == "someone/tiny"  # what `publish` points at the repo it uploads to

    example = card.text.split("## How to use")[1].split("```python\n")[1].split("```")[0]
    (tmp_path / "example.py").write_text(example.replace('"someone/tiny"', repr(str(output))))
    completed = run_without_package(tmp_path, "--run", tmp_path / "example.py")
    assert completed.returncode == 0, completed.stderr[-3000:]


FOREIGN_USAGE = '```python\n# the source\'s own example\nmodel = GPT2LMHeadModel.from_pretrained("someone/foo")\n```\n'
FOREIGN_CARDS = {  # a card not written by us: its usage section under another heading, then what follows it
    # huggingface_hub's default model card template
    "hub-template": "## Uses\n\nText generation.\n\n## How to Get Started with the Model\n\nUse the code below.\n\n"
                    + FOREIGN_USAGE,
    "usage": "## Usage\n\n" + FOREIGN_USAGE + "\n### With a pipeline\n\n" + FOREIGN_USAGE,  # examples in subsections
    # the layout of the gpt2 and bert-base-uncased cards: a subsection of "Intended uses", with one after it
    "subsection": "## Intended uses & limitations\n\nText generation.\n\n### How to use\n\n" + FOREIGN_USAGE
                  + "\n#### Limitations and bias\n\nUnfiltered web text.\n",
}


@pytest.mark.parametrize("layout", FOREIGN_CARDS)
def test_the_card_of_a_converted_folder_has_one_usage_section(layout, tmp_path):
    """A source card not written by us kept its own example (loading the source class) beside ours when its heading
    was not exactly "## How to use"; under "### How to use", the subsections after it were dropped."""
    source, output = tmp_path / "source", tmp_path / "output"
    source.mkdir(), output.mkdir()
    card = f"---\nlicense: mit\n---\n\n# foo\n\n{FOREIGN_CARDS[layout]}\n## Citation\n\nnone\n"
    (source / "README.md").write_text(card)
    card = hub.write_conversion_card(output, source, name="foo", task="causal-lm", source_class="GPT2LMHeadModel",
                                     model_class="ScratchDecoderForCausalLM", native=False, check="Checked.").text
    assert "source's own example" not in card and "GPT2LMHeadModel.from_pretrained" not in card
    assert card.count("How to use") == 1 and card.count("```python") == 1
    assert "AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True)" in card
    assert card.index("How to use") < card.index("## Citation")  # where the source's example was
    if layout == "hub-template":  # intended uses, not an example
        assert "## Uses\n\nText generation." in card
    if layout == "subsection":
        assert "#### Limitations and bias\n\nUnfiltered web text." in card
        assert card.index("## Intended uses") < card.index("### How to use") < card.index("#### Limitations")


def _gpt2_with_a_broken_card(path: Path) -> Path:
    gpt2().save_pretrained(path)
    (path / "README.md").write_text("---\nlicense: [apache-2.0\n---\n# A model\n")
    return path


def _unsupported_folder(path: Path) -> Path:
    (path / "config.json").write_text(json.dumps({"model_type": "opt", "architectures": ["OPTForCausalLM"]}))
    return path


def _scratch_alibi_folder(path: Path) -> Path:
    tiny_lm("decoder", position_embedding_type="alibi").save_pretrained(path)
    return path


def _llama_folder(path: Path) -> Path:
    _llama().save_pretrained(path)
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


def _gpt2_with_a_resized_weight(path: Path) -> Path:
    gpt2().save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:32].clone()  # the config says 64
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _folder_without_weights(path: Path) -> Path:
    gpt2().config.save_pretrained(path)
    return path


def _folder_with_a_broken_config(path: Path) -> Path:
    (path / "config.json").write_text('{"model_type": "gpt2",')
    return path


def _bert_without_model_type(path: Path) -> Path:
    bert().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    del config["model_type"], config["architectures"]
    (path / "config.json").write_text(json.dumps(config))
    return path


def _llama_quantized_with_bitsandbytes(path: Path) -> Path:
    """A 4-bit bitsandbytes folder as the Hub has many (its config is what matters: loading it needs bitsandbytes,
    which is not installed here; the refusal must not depend on the weights)."""
    _llama().save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _llama_quantized_with_torchao(path: Path) -> Path:
    from torchao.quantization import Int8WeightOnlyConfig

    _llama().save_pretrained(path / "fp32")
    LlamaForCausalLM.from_pretrained(path / "fp32", quantization_config=TorchAoConfig(Int8WeightOnlyConfig())
                                     ).save_pretrained(path)
    return path


def _gpt2_with_truncated_weights(path: Path) -> Path:
    gpt2().save_pretrained(path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return path


def _gpt2_with_a_corrupt_bin(path: Path) -> Path:
    gpt2().save_pretrained(path)
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(bytes(range(256)) * 8)
    return path


def _with_config_values(make_native, **values):
    """A source folder whose config.json is edited by hand after saving."""
    def make_source(path: Path) -> Path:
        make_native().save_pretrained(path)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(config | values))
        return path
    return make_source


def _gpt2_sharded_with_a_broken_index(path: Path) -> Path:
    gpt2().save_pretrained(path, max_shard_size="50KB")
    (path / "model.safetensors.index.json").write_text('{"weight_map": ')
    return path


def _llama_with_a_generation_config(text: str):
    def make_source(path: Path) -> Path:
        _llama().save_pretrained(path)
        (path / "generation_config.json").write_text(text)
        return path
    return make_source


def _config_that_is_a_list(path: Path) -> Path:
    (path / "config.json").write_text("[1, 2]")
    return path


def _config_with_a_list_model_type(path: Path) -> Path:
    (path / "config.json").write_text('{"model_type": ["gpt2"]}')
    return path


def _folder_without_config(path: Path) -> Path:
    gpt2().save_pretrained(path)
    (path / "config.json").unlink()
    return path


@pytest.mark.parametrize("make_source, options, expected", [
    (_unsupported_folder, [], ["model_type='opt'", "OPTForCausalLM",
                               "supported: gpt2 (GPT2LMHeadModel or GPT2ForSequenceClassification or "
                               "GPT2ForTokenClassification or GPT2ForQuestionAnswering)",
                               "llama (LlamaForCausalLM or LlamaForSequenceClassification or ",
                               "scratch_decoder (ScratchDecoderForCausalLM or "
                               "ScratchDecoderForSequenceClassification or "]),
    (lambda path: path / "missing", [], ["does not exist", "local folders only, never the Hub", "hf download"]),
    (lambda path: gpt2().save_pretrained(path) or path / "config.json", [], [  # it said the file does not exist
        "config.json is a file: give the folder that `save_pretrained` wrote"]),
    (_folder_without_config, [], ["no config.json"]),
    (_gpt2_without_a_weight, [], ["lacks weights", "transformer.h.1.mlp.c_fc.weight"]),
    (_gpt2_with_a_resized_weight, [], ["shapes its config.json does not give",
                                       "transformer.wpe.weight (32, 32) (the config gives (64, 32))"]),
    (_folder_without_weights, [], ["cannot load", "as a GPT2LMHeadModel", "no file named model.safetensors"]),
    (_folder_with_a_broken_config, [], ["config.json is not valid JSON"]),
    (_bert_without_model_type, [], ["model_type=None", 'names no model_type: add the model\'s own (e.g. "model_type"']),
    (_gpt2_with_a_larger_tokenizer, [], ["the tokenizer has", "more than the model's vocabulary (99)"]),
    (_scratch_alibi_folder, [], ["Cannot export", "position_embedding_type='alibi'"]),
    (_llama_folder, ["--to", "native"], ["--to native", "native LlamaForCausalLM", "converts to Scratch only"]),
    pytest.param(_llama_quantized_with_bitsandbytes, [], [
        "holds weights quantized with bitsandbytes", "requires bitsandbytes",
        "convert the full-precision folder, then quantize the result"], marks=pytest.mark.skipif(
        importlib.util.find_spec("bitsandbytes") is not None, reason="loads where bitsandbytes is installed")),
    pytest.param(_llama_quantized_with_torchao, [], [
        "`model.layers.0.self_attn.q_proj.weight` is a quantized Int8Tensor"], marks=pytest.mark.skipif(
        importlib.util.find_spec("torchao") is None, reason="needs torchao")),
    (_gpt2_with_a_broken_card, [], ["README.md is not a valid model card", "correct or remove it"]),
    # These three ended in a traceback (a SafetensorError naming no file, an UnpicklingError advising
    # weights_only=False, an AttributeError or TypeError).
    (_gpt2_with_truncated_weights, [], ["cannot load", "model.safetensors is not a complete safetensors file"]),
    (_gpt2_with_a_corrupt_bin, [], ["cannot load", "a PyTorch weights file of it is corrupt or no weights file"]),
    (_config_that_is_a_list, [], ["config.json is not a model's config: a JSON object whose model_type is a string"]),
    (_config_with_a_list_model_type, [], ["config.json is not a model's config"]),
    # These four ended in a traceback (a KeyError or TypeError from the native class's own code, a JSONDecodeError
    # naming no file); a generation config that does not parse was replaced by one made from config.json.
    (_with_config_values(gpt2, activation_function="gelu_typo"), [], [
        "cannot load", "as a GPT2LMHeadModel: KeyError: 'gelu_typo'"]),
    (_with_config_values(_llama, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), [], [
        "as a LlamaForCausalLM: KeyError", "Missing required keys in `rope_parameters`", "'factor'"]),
    (_gpt2_sharded_with_a_broken_index, [], ["model.safetensors.index.json is not valid JSON"]),
    (_llama_with_a_generation_config("{oops"), [], [
        "generation_config.json is not a generation config that loads", "not a valid JSON file", "correct or remove"]),
    (_llama_with_a_generation_config("[1, 2]"), [], [
        "generation_config.json is not a generation config that loads", "correct or remove it"]),
], ids=["unsupported-model", "missing-folder", "source-is-a-file", "missing-config", "missing-weight",
        "resized-weight", "no-weights", "broken-config", "no-model-type", "tokenizer-too-large",
        "knob-without-native-equivalent", "contradicting-direction", "bitsandbytes-without-the-library",
        "torchao-int8", "broken-card", "truncated-safetensors", "corrupt-bin", "config-list", "model-type-list",
        "unknown-activation", "incomplete-rope-parameters", "broken-shard-index", "broken-generation-config",
        "generation-config-list"])
def test_bad_sources_are_refused_with_a_clear_message(make_source, options, expected, tmp_path, monkeypatch, capsys):
    """Run in this process, as the command's module (each refusal comes before the conversion: no process start per
    case); anything but the command's own exit, a traceback say, fails the test."""
    source = tmp_path / "source"
    source.mkdir()
    with pytest.raises(SystemExit) as stopped:
        convert_here(monkeypatch, make_source(source), tmp_path / "output", *options)
    assert stopped.value.code == 2  # as argparse and the training commands: 1 (sys.exit's) until 2026-11-30
    stderr = capsys.readouterr().err
    for fragment in expected:
        assert fragment in stderr
    assert not (tmp_path / "output").exists()


def test_a_source_whose_own_logits_are_not_finite_is_named_as_such(tmp_path, monkeypatch, capsys):
    """A NaN in the source's weights made its logits NaN, and the check said the two models' logits "differ by up
    to nan", blaming the conversion. With --no-check it converts as it is."""
    native = gpt2()
    with torch.no_grad():
        native.transformer.h[0].ln_1.weight[0] = float("nan")
    native.save_pretrained(tmp_path / "native")
    said = convert_refused(monkeypatch, capsys, tmp_path / "native", tmp_path / "scratch")
    assert "the source's own logits on the check batch are not all finite" in said.err and "--no-check" in said.err
    assert not (tmp_path / "scratch").exists()
    convert_here(monkeypatch, tmp_path / "native", tmp_path / "scratch", "--no-check")
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "scratch")
    assert converted.model.layers[0].attn_norm.weight[0].isnan()


@pytest.mark.parametrize("error", [1.0, float("nan")], ids=["off", "nan"])
def test_a_conversion_whose_logits_are_not_the_sources_is_refused_and_writes_nothing(error, tmp_path, monkeypatch,
                                                                                    capsys):
    """The parity check is what keeps a wrong conversion from being saved: logits off by more than --atol, and NaN
    logits where the source's are finite (NaN is no difference above --atol: `diff > atol` let them through)."""

    def converted_wrongly(native):
        model = from_hf(native)
        model.lm_head.register_forward_hook(lambda module, inputs, logits: logits + error)
        return model

    gpt2().save_pretrained(tmp_path / "native")
    monkeypatch.setattr("hf_scratch_transformer.conversion.from_hf", converted_wrongly)
    said = convert_refused(monkeypatch, capsys, tmp_path / "native", tmp_path / "scratch")
    assert f"parity check failed: logits differ by up to {error:.3g} (> --atol" in said.err, said.err
    assert "nothing was written" in said.err and not (tmp_path / "scratch").exists()


def test_an_output_folder_that_holds_files_is_replaced_only_when_asked(tmp_path):
    """A second conversion into the same folder stops naming what it holds; with --overwrite-output-dir the folder
    is replaced whole: nothing of the earlier model (here its shards and their index) stays beside the new one."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    native = gpt2()
    native.save_pretrained(source)
    tiny_lm("decoder").save_pretrained(output, max_shard_size="20KB")
    earlier = sorted(path.name for path in output.iterdir())
    assert "model.safetensors.index.json" in earlier

    refused = run_command(source, output)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "already holds files (config.json" in refused.stderr and "--overwrite-output-dir" in refused.stderr
    assert sorted(path.name for path in output.iterdir()) == earlier

    replaced = run_command(source, output, "--overwrite-output-dir")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert not any("model-0000" in path.name or "index" in path.name for path in output.iterdir())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "scratch"]  # no staging folder left
    ours = AutoModelForCausalLM.from_pretrained(output).eval()
    inputs = _inputs("decoder")
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, native(**inputs).logits, atol=ATOL, rtol=0)


def _source_and_earlier_output(tmp_path: Path) -> tuple[Path, Path]:
    """A native GPT-2 folder to convert, and the output folder of an earlier conversion that the next one replaces."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    gpt2().save_pretrained(source)
    tiny_lm("decoder").save_pretrained(output)
    return source, output


def full_disk_for_the_weights(monkeypatch) -> None:
    def full_disk(tensors, filename, **kwargs):
        Path(filename).write_bytes(b"\0" * 64)  # what fitted
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", full_disk)


def full_disk_for_the_folder(monkeypatch) -> None:
    make = os.mkdir

    def full_disk(path, *args, **kwargs):  # ext4 gives a new folder a block
        if ".converting-" in Path(path).name:
            raise OSError(28, "No space left on device", str(path))
        return make(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", full_disk)


@pytest.mark.parametrize("full_disk", [full_disk_for_the_weights, full_disk_for_the_folder])
def test_a_full_disk_while_the_converted_model_is_saved_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys,
                                                                                     full_disk):
    """It ended in a safetensors traceback, leaving the partial copy (the model's size, on the full disk) in a hidden
    folder beside the output that no later command removed; and where the folder of that copy could not be made, in an
    OSError traceback."""
    source, output = _source_and_earlier_output(tmp_path)
    earlier = {path.name: path.read_bytes() for path in output.iterdir()}
    full_disk(monkeypatch)
    said = convert_refused(monkeypatch, capsys, source, output, "--overwrite-output-dir")
    assert "The converted model could not be written" in said.err
    assert "No space left on device" in said.err and f"{output} is as it was" in said.err
    assert {path.name: path.read_bytes() for path in output.iterdir()} == earlier
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "scratch"], "no partial copy left"


def test_an_output_another_command_wrote_while_this_one_converted_is_kept(tmp_path, monkeypatch, capsys):
    """Two conversions into one new output folder, the second finishing while the first converted: the output held
    nothing when checked, and the last to finish replaced the other's model without --overwrite-output-dir."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    gpt2().save_pretrained(source)
    write_card = hub.write_conversion_card

    def written_meanwhile(*args, **kwargs):
        tiny_lm("decoder").save_pretrained(output)  # the other command's
        return write_card(*args, **kwargs)

    monkeypatch.setattr(hub, "write_conversion_card", written_meanwhile)
    said = convert_refused(monkeypatch, capsys, source, output)
    assert f"{output} was written while this conversion ran" in said.err
    assert not (output / "README.md").exists(), "the other command's model, kept"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "scratch"], "no staging folder left"


@pytest.mark.parametrize("earlier", [True, False], ids=["over-an-earlier-output", "into-a-new-one"])
def test_a_converted_model_that_cannot_take_its_place_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys,
                                                                                   earlier):
    """The converted model is renamed into place last (an earlier output renamed aside first): a file system gone
    read-only there ended in an OSError traceback, the earlier output left hidden beside its place."""
    if earlier:
        source, output = _source_and_earlier_output(tmp_path)
    else:
        source, output = tmp_path / "native", tmp_path / "scratch"
        gpt2().save_pretrained(source)
    before = {path.name: path.read_bytes() for path in output.iterdir()} if earlier else None
    replace = os.replace

    def read_only(source, target, *args, **kwargs):
        if ".converting-" in Path(source).name:
            raise OSError(errno.EROFS, "Read-only file system", str(target))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", read_only)
    said = convert_refused(monkeypatch, capsys, source, output, "--overwrite-output-dir")
    assert "The converted model could not take its place in" in said.err and "Traceback" not in said.err
    assert "Read-only file system" in said.err and f"{output} is as it was" in said.err
    assert (output.is_dir() and {path.name: path.read_bytes() for path in output.iterdir()}) == (before or False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "scratch"][:1 + earlier], "nothing aside"


def _dead_pid() -> int:
    """The id of a process that has ended (a killed conversion's)."""
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True,
                             text=True)
    return int(process.stdout)


def test_a_conversion_killed_between_its_renames_is_undone_by_the_next(tmp_path, monkeypatch, capsys):
    """Killed after the earlier output was renamed aside and before the new one was renamed in, a conversion left the
    output absent, the earlier one and the new one in hidden folders that only it knew: the next command puts the
    earlier one back (so it asks for --overwrite-output-dir) and removes the partial one; a running conversion's
    folders stay."""
    source, output = _source_and_earlier_output(tmp_path)
    earlier = {path.name: path.read_bytes() for path in output.iterdir()}
    dead, alive = _dead_pid(), f"{os.getpid()}-{round(psutil.Process().create_time() * 100)}"
    output.rename(tmp_path / f".scratch.replaced-{dead}-1")
    (tmp_path / f".scratch.converting-{dead}-1").mkdir()
    (tmp_path / f".scratch.converting-{dead}-1" / "config.json").write_text("{}")
    (tmp_path / f".scratch.converting-{alive}").mkdir()
    said = convert_refused(monkeypatch, capsys, source, output)
    assert "already holds files" in said.err
    assert {path.name: path.read_bytes() for path in output.iterdir()} == earlier
    assert sorted(path.name for path in tmp_path.iterdir()) == [f".scratch.converting-{alive}", "native", "scratch"]
    assert f"restored {output} from .scratch.replaced-{dead}-1" in said.out
    assert f".scratch.converting-{dead}-1" in said.out


def test_a_stopped_conversion_whose_process_id_was_reused_is_undone(tmp_path, monkeypatch, capsys):
    """Its folders were named by the process id alone, and a process id is reused once its process ends (after a
    restart, by the first processes started): a live process holding it left the earlier output hidden and absent."""
    source, output = _source_and_earlier_output(tmp_path)
    earlier = {path.name: path.read_bytes() for path in output.iterdir()}
    output.rename(tmp_path / f".scratch.replaced-{os.getpid()}-1")  # this process's id, another start
    said = convert_refused(monkeypatch, capsys, source, output)
    assert "already holds files" in said.err
    assert {path.name: path.read_bytes() for path in output.iterdir()} == earlier


def test_an_older_releases_folders_named_by_the_process_id_alone_are_recovered_too(tmp_path, monkeypatch):
    source, output = _source_and_earlier_output(tmp_path)
    output.rename(tmp_path / f".scratch.replaced-{_dead_pid()}")
    (tmp_path / f".scratch.converting-{os.getpid()}").mkdir()  # a live process: left alone
    with pytest.raises(SystemExit):
        convert_here(monkeypatch, source, output)
    assert sorted(path.name for path in tmp_path.iterdir()) == [f".scratch.converting-{os.getpid()}", "native",
                                                                 "scratch"]


def test_a_conversion_killed_after_its_renames_leaves_nothing_behind_the_next(tmp_path, monkeypatch):
    """Killed before it removed the output it replaced, a conversion left that folder hidden, the model's size."""
    source, output = _source_and_earlier_output(tmp_path)
    (tmp_path / f".scratch.replaced-{_dead_pid()}-1").mkdir()
    convert_here(monkeypatch, source, output, "--overwrite-output-dir")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "scratch"]
    assert json.loads((output / "config.json").read_text())["model_type"] == "scratch_decoder"


def test_an_output_under_a_file_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """It failed with a NotADirectoryError traceback once the model was loaded, converted and checked."""
    source = tmp_path / "native"
    gpt2().save_pretrained(source)
    said = convert_refused(monkeypatch, capsys, source, source / "config.json" / "converted")
    assert f"lies under {source / 'config.json'}, a file, not a folder" in said.err


def test_an_output_that_is_a_mount_point_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """An empty volume mounted into a container as the output: the renaming that puts the converted folder in place
    failed with an OSError traceback (EBUSY) once the model was converted, checked and saved, leaving it hidden beside
    the output for the next conversion to remove. (A mount needs root: `os.path.ismount` says it here.)"""
    source, output = tmp_path / "native", tmp_path / "volume"
    gpt2().save_pretrained(source)
    output.mkdir()
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == output.resolve() or real_ismount(path))
    said = convert_refused(monkeypatch, capsys, source, output)
    assert f"the output {output} is a mount point" in said.err
    assert f"Give a folder inside it, e.g. {output / 'converted'}" in said.err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["native", "volume"] and not any(output.iterdir())


def test_an_output_in_a_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """An output folder of one's own in a folder one cannot write in (a shared or read-only one): the converted folder,
    written beside the output, failed with a PermissionError traceback after all the work. (Unwritable for root too
    only where the filesystem says so: `os.access` says it here.)"""
    source, shared = tmp_path / "native", tmp_path / "shared"
    gpt2().save_pretrained(source)
    (shared / "mine").mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kwargs: Path(path) != shared.resolve() and real_access(
        path, mode, **kwargs))
    said = convert_refused(monkeypatch, capsys, source, shared / "mine")
    assert f"cannot write in {shared.resolve()}, where the converted folder is written" in said.err
    assert [path.name for path in shared.iterdir()] == ["mine"] and not any((shared / "mine").iterdir())


def test_an_output_folder_that_contains_the_source_is_refused(tmp_path):
    """Replacing such an output folder (with --overwrite-output-dir) deleted the source with it."""
    source = tmp_path / "models" / "native"
    gpt2().save_pretrained(source)
    held = sorted(path.name for path in source.iterdir())
    result = run_command(source, tmp_path / "models", "--overwrite-output-dir")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "contains the source folder" in result.stderr
    assert sorted(path.name for path in source.iterdir()) == held


def test_an_output_folder_in_the_source_is_refused(tmp_path, monkeypatch, capsys):
    """The converted folder was written among the source's files: published, the source uploaded it as its own
    files, and a run whose model folder the source is removed it when it wrote that folder again."""
    source = tmp_path / "run" / "model"
    gpt2().save_pretrained(source)
    held = sorted(path.name for path in source.iterdir())
    said = convert_refused(monkeypatch, capsys, source, source / "scratch")
    assert f"the output folder {source / 'scratch'} lies in the source folder {source}" in said.err
    assert sorted(path.name for path in source.iterdir()) == held


def test_the_checkpoint_dtype_is_kept_when_config_json_names_none(tmp_path):
    """A bf16 checkpoint whose config.json has no dtype (written by hand or another tool) was saved in float32, twice
    its size; `from_pretrained(dtype="auto")` reads the dtype from the weights, and so does convert."""
    source, output = tmp_path / "native", tmp_path / "scratch"
    gpt2().to(torch.bfloat16).save_pretrained(source)
    config = json.loads((source / "config.json").read_text())
    del config["dtype"]
    (source / "config.json").write_text(json.dumps(config))
    result = run_command(source, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "config.json").read_text())["dtype"] == "bfloat16"
    assert {tensor.dtype for tensor in load_file(output / "model.safetensors").values()} == {torch.bfloat16}
