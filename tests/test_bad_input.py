"""Bad input gets a ValueError that names the problem (SPEC section 10), never a deep IndexError, RuntimeError or
UnicodeDecodeError, and never a silently wrong result: positions, labels, input shapes, prepared masks, token
types, config field types, training text files and weights files."""

import copy
import json
import os
import re
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from tiny_models import FAMILIES, VOCAB, lm_inputs, tiny_config, tiny_lm
from tiny_native import gpt2
from tiny_tokenizers import TOKENIZER_KINDS, byte_level_bpe
from torch._subclasses.fake_tensor import FakeTensorMode

from hf_scratch_transformer import (
    ScratchDecoderConfig,
    ScratchDecoderForCausalLM,
    ScratchDecoderForSequenceClassification,
    ScratchEncoderConfig,
    ScratchEncoderForMaskedLM,
    ScratchEncoderForMultipleChoice,
    ScratchEncoderForSequenceClassification,
    ScratchEncoderForTokenClassification,
    ScratchSeq2SeqConfig,
    hub,
    scratch_layers,
    training_data,
)
from tokenizer_training import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------- model inputs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned"])
def test_negative_position_ids_are_a_clear_error(family, position_embedding_type):
    # Sinusoidal positions used to read the table from its end: a wrong result, no error.
    model = tiny_lm(family, position_embedding_type=position_embedding_type)
    ids = torch.randint(3, VOCAB, (1, 4))
    name = "decoder_position_ids" if family == "seq2seq" else "position_ids"
    with pytest.raises(ValueError, match="`position_ids` must not be negative, got values from -1 to 2"):
        model(input_ids=ids, labels=ids, **{name: torch.tensor([[-1, 0, 1, 2]])})


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_the_model_makes_are_checked_without_reading_them_back(family, monkeypatch):
    """Positions made from the cache's length are known in Python: only the ids are read for the range checks (an
    op and two reads fewer between a training step's products), and past the table the error is the same."""
    model = tiny_lm(family, position_embedding_type="learned")  # 64 positions
    read, value_range = [], scratch_layers.value_range
    monkeypatch.setattr(scratch_layers, "value_range", lambda tensor: read.append(tensor) or value_range(tensor))
    inputs = lm_inputs(family)
    model(**inputs)
    ids = [inputs["input_ids"]] + ([] if family != "seq2seq" else [model.prepare_decoder_input_ids_from_labels(
        inputs["labels"])])
    assert len(read) == len(ids) and all(torch.equal(seen, given) for seen, given in zip(read, ids, strict=True))
    name = "decoder_input_ids" if family == "seq2seq" else "input_ids"
    too_long = {**inputs, name: torch.randint(3, VOCAB, (1, 65)), "labels": None}
    if family == "seq2seq":
        too_long["input_ids"] = inputs["input_ids"][:1]
    with pytest.raises(ValueError, match="reaches position 64, but this model has `max_position_embeddings=64`"):
        model(**too_long)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("wrong", [VOCAB, -5])
def test_labels_outside_the_vocabulary_are_a_clear_error(family, wrong):
    model, inputs = tiny_lm(family), lm_inputs(family)
    # In seq2seq, labels shifted right become the decoder inputs: the error must still name `labels`. (The
    # causal LM never reads position 0, which the shift drops.)
    inputs["labels"][0, 1] = wrong
    inputs["labels"][1, 1] = -100  # ignored labels are fine
    with pytest.raises(ValueError, match=rf"`labels` must lie in \[0, {VOCAB - 1}\].*got \[{wrong}\]"):
        model(**inputs)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("where", ["meta", "fake"])
def test_the_range_checks_leave_tensors_without_values_alone(family, where):
    """A model on the meta device, or run under `FakeTensorMode` (shape and memory estimates, tracers), has no
    values to check: the id and label checks failed there ("Tensor.item() cannot be called on meta tensors", a
    DataDependentOutputException) where native models run. The loss and logits keep their shapes."""
    model, inputs = tiny_lm(family).train(), lm_inputs(family)
    if where == "meta":
        model, inputs = model.to("meta"), {name: tensor.to("meta") for name, tensor in inputs.items()}
        outputs = model(**inputs)
    else:
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:
            outputs = model(**{name: fake.from_tensor(tensor) for name, tensor in inputs.items()})
            outputs.loss.backward()
    assert outputs.loss.shape == ()
    assert outputs.logits.shape == (*inputs["labels"].shape, VOCAB)


@pytest.mark.parametrize("family", FAMILIES)
def test_float_labels_are_a_clear_error(family):
    model, inputs = tiny_lm(family), lm_inputs(family)
    with pytest.raises(ValueError, match="`labels` must be integer token ids, got dtype torch.float32"):
        model(**{**inputs, "labels": inputs["labels"].float()})


@pytest.mark.parametrize("head", [ScratchDecoderForSequenceClassification, ScratchEncoderForSequenceClassification,
                                  ScratchEncoderForTokenClassification])
@pytest.mark.parametrize("wrong", [3, -5])
def test_class_labels_outside_num_labels_are_a_clear_error(head, wrong):
    # They failed inside the cross-entropy with "IndexError: Target 3 is out of bounds".
    family = "decoder" if head is ScratchDecoderForSequenceClassification else "encoder"
    model, ids = head(tiny_config(family, num_labels=3)), lm_inputs(family)["input_ids"]
    labels = torch.zeros(ids.shape if head is ScratchEncoderForTokenClassification else ids.shape[:1], dtype=torch.long)
    labels[0] = wrong
    with pytest.raises(ValueError, match=rf"`labels` must lie in \[0, 2\] \(`num_labels` is 3\).*got \[{wrong}\]"):
        model(input_ids=ids, labels=labels)
    labels[0] = -100 if head is ScratchEncoderForTokenClassification else 2  # what the loss takes still passes
    assert torch.isfinite(model(input_ids=ids, labels=labels).loss)


CHOICE_IDS = torch.randint(3, VOCAB, (2, 3, 5))  # two rows of three choices


@pytest.mark.parametrize("inputs, message", [
    (dict(input_ids=CHOICE_IDS[0]), r"`input_ids` must have shape \(batch_size, num_choices, sequence_length\).*"
                                    r"got \(3, 5\)"),
    (dict(input_ids=CHOICE_IDS[:, :0]), r"at least one row, choice and token, got \(2, 0, 5\)"),
    (dict(inputs_embeds=torch.randn(2, 3, 5)), r"`inputs_embeds` must have shape \(batch_size, num_choices, "
                                               r"sequence_length, hidden_size\)"),
    (dict(input_ids=CHOICE_IDS, attention_mask=torch.ones(2, 5)),
     r"`attention_mask` must have shape \(2, 3, 5\) to match `input_ids`.*got \(2, 5\)"),
    (dict(input_ids=CHOICE_IDS, labels=torch.tensor([[0], [1]])), r"`labels` must have shape \(2,\).*got \(2, 1\)"),
    (dict(input_ids=CHOICE_IDS, labels=torch.tensor([3, 0])),
     r"`labels` must lie in \[0, 2\] \(each row has 3 choices\).*got \[3\]"),
    (dict(input_ids=CHOICE_IDS, labels=torch.tensor([0.0, 1.0])), r"`labels` must be integer choice ids"),
], ids=["a-batch-of-sequences", "no-choices", "embeddings-without-choices", "a-mask-per-row", "labels-per-choice",
        "a-label-past-the-choices", "float-labels"])
def test_multiple_choice_inputs_of_the_wrong_shape_or_labels_out_of_range_are_a_clear_error(inputs, message):
    """A batch of plain sequences (B, T) was read as T choices of one token each, without a word; a label past the
    choices failed inside the cross-entropy."""
    model = ScratchEncoderForMultipleChoice(tiny_config("encoder"))
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_seq2seq_without_decoder_inputs_or_labels_names_them():
    model = tiny_lm("seq2seq")
    with pytest.raises(ValueError, match="`decoder_input_ids`.*`labels`"):
        model(input_ids=lm_inputs("seq2seq")["input_ids"])
    with pytest.raises(ValueError, match="`decoder_input_ids` must have shape"):
        model.model(input_ids=lm_inputs("seq2seq")["input_ids"], decoder_input_ids=torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="`decoder_input_ids` must lie in"):
        model(input_ids=lm_inputs("seq2seq")["input_ids"], decoder_input_ids=torch.tensor([[3, VOCAB]]))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", [(0, 4), (2, 0)])
def test_empty_inputs_are_a_clear_error(family, shape):
    with pytest.raises(ValueError, match=r"`input_ids` must have shape .*got " + re.escape(str(shape))):
        extra = {"decoder_input_ids": torch.ones(1, 1, dtype=torch.long)} if family == "seq2seq" else {}
        tiny_lm(family)(input_ids=torch.zeros(shape, dtype=torch.long), **extra)


def test_unbatched_inputs_are_a_clear_error():
    model = tiny_lm("decoder")
    with pytest.raises(ValueError, match=r"`input_ids` must have shape .*add the batch dimension: `input_ids\[None\]`"):
        model(input_ids=torch.tensor([3, 4, 5]))
    with pytest.raises(ValueError, match=r"`inputs_embeds` must have shape \(batch_size, sequence_length, hidden_size"):
        model(inputs_embeds=torch.zeros(3, 32))


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_prepared_4d_mask_of_the_wrong_size_is_a_clear_error(family):
    model = tiny_lm(family)
    ids = torch.randint(3, VOCAB, (2, 4))
    with pytest.raises(ValueError, match=r"`attention_mask` given as a 4D mask must broadcast to .* = \(2, 4, 4, 4\)"):
        model(input_ids=ids, attention_mask=torch.ones(2, 1, 3, 3, dtype=torch.bool))
    # A mask of the right size, or one that broadcasts, still works: the causal mask written out gives the same.
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask = mask.tril() if family == "decoder" else mask
    masked = model(input_ids=ids, attention_mask=mask[None, None]).logits
    torch.testing.assert_close(masked, model(input_ids=ids).logits)


def test_prepared_4d_encoder_mask_of_the_wrong_size_is_a_clear_error():
    model = tiny_lm("seq2seq")
    ids = torch.randint(3, VOCAB, (1, 5))
    with pytest.raises(ValueError, match="`encoder_attention_mask` given as a 4D mask"):
        model.model.decoder(
            input_ids=ids[:, :3], encoder_hidden_states=torch.zeros(1, 5, 32),
            encoder_attention_mask=torch.ones(1, 1, 3, 4, dtype=torch.bool),
        )


@pytest.mark.parametrize("wrong", [2, -1])
def test_token_types_outside_type_vocab_size_are_a_clear_error(wrong):
    model = tiny_lm("encoder", type_vocab_size=2)
    ids = torch.randint(3, VOCAB, (1, 4))
    with pytest.raises(ValueError, match=r"`token_type_ids` must lie in \[0, 1\] \(`type_vocab_size=2`\)"):
        model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, wrong, 0]]))
    model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 1, 0]]))


@pytest.mark.parametrize("family", FAMILIES)
def test_token_types_to_a_model_without_them_are_refused_with_advice_its_family_can_take(family):
    """Only the encoder has `type_vocab_size`: the decoder and seq2seq families, whose configs refuse it, are told to
    leave the types out (they were told to build the model with it)."""
    model = tiny_lm(family, **({"type_vocab_size": 0} if family == "encoder" else {}))
    advice = r" or build the model with `type_vocab_size`\." if family == "encoder" else r"\.$"
    inputs = lm_inputs(family)
    with pytest.raises(ValueError, match=r"this model has no token types; leave them out" + advice):
        model(**inputs, token_type_ids=torch.ones_like(inputs["input_ids"]))
    model(**inputs, token_type_ids=torch.zeros_like(inputs["input_ids"]))  # all-zero types change nothing and pass


# ---------------------------------------------------------------------------------------------- config types


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("dropout", "0.1", "`dropout` must be a number, got '0.1' (str)"),
        ("attention_dropout", None, "`attention_dropout` must be a number, got None"),
        ("layer_norm_eps", None, "`layer_norm_eps` must be a number, got None"),
        ("layer_norm_eps", "1e-5", "`layer_norm_eps` must be a number, got '1e-5'"),
        ("initializer_range", True, "`initializer_range` must be a number, got True"),
        ("use_bias", "yes", "`use_bias` must be True or False, got 'yes'"),
        ("final_norm", 1, "`final_norm` must be True or False, got 1"),
        # PreTrainedConfig's flags too: `--set tie_word_embeddings=False` gave the string "False", which is true, and
        # the head stayed tied without a word.
        ("tie_word_embeddings", "False", "`tie_word_embeddings` must be True or False, got 'False' (str)"),
        ("use_cache", "False", "`use_cache` must be True or False, got 'False'"),
        ("return_dict", 0, "`return_dict` must be True or False, got 0"),
    ],
)
def test_config_fields_of_the_wrong_type_are_named(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ScratchDecoderConfig(**{field: value})


def test_family_config_flags_of_the_wrong_type_are_named():
    with pytest.raises(ValueError, match="`mlm_transform` must be True or False"):
        ScratchEncoderConfig(mlm_transform="no")
    with pytest.raises(ValueError, match="`classifier_dropout` must be a number"):
        ScratchEncoderConfig(classifier_dropout="0.1")
    with pytest.raises(ValueError, match="`share_embeddings` must be True or False"):
        ScratchSeq2SeqConfig(share_embeddings=None)


def test_a_folder_saved_with_a_string_flag_names_the_value_it_was_trained_with(tmp_path):
    """Until 2026-11-29 `--set tie_word_embeddings=False` saved the string "False" in config.json, and the model took it
    as true: tied head, no lm_head.weight saved. Such a folder was refused with "must be True or False", and writing
    the false it seemed to ask for loaded the model with an untrained head (a warning of a missing weight, nothing
    more). The refusal now says the model was trained with it true; written true, it loads as saved."""
    model = tiny_lm("decoder").eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "tie_word_embeddings": "False"}))  # the old file
    with pytest.raises(ValueError, match=re.escape(
            "`tie_word_embeddings` is the string 'False' in this saved config: `--set tie_word_embeddings=False` wrote "
            "it so before 2026-11-29, and the model took any such string as true, so it was built and trained with "
            "`tie_word_embeddings` true. Write true there (JSON)")):
        ScratchDecoderForCausalLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**saved, "tie_word_embeddings": True}))
    inputs = lm_inputs("decoder")
    with torch.no_grad():
        assert torch.equal(ScratchDecoderForCausalLM.from_pretrained(tmp_path)(**inputs).logits, model(**inputs).logits)


@pytest.mark.parametrize("saved, loader, advice", [
    ("decoder", ScratchEncoderForMaskedLM, "it is a ScratchDecoderConfig: load it with that family's classes"),
    ("encoder", ScratchDecoderForCausalLM, "it is a ScratchEncoderConfig"),
    ("decoder", ScratchSeq2SeqConfig, "it is a ScratchDecoderConfig"),
    ("gpt2", ScratchDecoderForCausalLM, "a native model converts to this package's first (`hf-scratch convert"),
])
def test_a_folder_of_another_model_type_is_refused_by_name(tmp_path, saved, loader, advice):
    """transformers only logs "You are using a model of type X to instantiate a model of type Y", then builds the
    class's model with what weights fit: a native GPT-2 folder loaded as a randomly initialised decoder (its tensors
    have other names), a decoder's folder as an encoder that ran its causal weights bidirectionally."""
    model = gpt2() if saved == "gpt2" else tiny_lm(saved)
    model.save_pretrained(tmp_path)
    expected = loader.config_class if hasattr(loader, "config_class") else loader
    with pytest.raises(ValueError, match=re.escape(
            f"{expected.__name__} builds `model_type` {expected.model_type!r} models, and this config is of "
            f"{model.config.model_type!r}, whose weights it would not fit: {advice}")):
        loader.from_pretrained(tmp_path)


@pytest.mark.parametrize("family", FAMILIES)
def test_integer_floats_still_load_from_json(family, tmp_path):
    config = tiny_config(family, dropout=0, attention_dropout=0, initializer_range=1, layer_norm_eps=1)
    config.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["dropout"] == 0 and stored["layer_norm_eps"] == 1
    assert type(config).from_pretrained(tmp_path).to_dict() == config.to_dict()


# ---------------------------------------------------------------------------------------------- text files

BAD_TEXT = {
    "empty.txt": (b"", "holds no text"),
    "blank.txt": (b"\n \n\t\n\n", "holds no text"),
    "nul.txt": (b"some text\x00with a NUL\n", "NUL bytes"),
    "binary.txt": (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not UTF-8 text"),
    "latin1.txt": ("café\n".encode("latin-1"), "not UTF-8 text"),
}


@pytest.fixture
def bad_text(tmp_path):
    """`bad_text(name)`: the path of one of the BAD_TEXT files, and the words its error must hold."""

    def make(name):
        content, message = BAD_TEXT[name]
        (tmp_path / name).write_bytes(content)
        return str(tmp_path / name), message

    return make


@pytest.mark.parametrize("name", list(BAD_TEXT))
def test_tokenizer_training_names_a_bad_text_file(bad_text, name):
    path, message = bad_text(name)
    with pytest.raises(ValueError, match=rf"{name} .*{message}"):
        train_tokenizer("bpe", "decoder", files=[path], vocab_size=300)


@pytest.mark.parametrize("name", list(BAD_TEXT))
def test_training_data_loaders_name_a_bad_text_file(bad_text, tmp_path, name):
    path, message = bad_text(name)
    good = tmp_path / "good.txt"
    good.write_text("one\n\ntwo\n\nthree\n")
    with pytest.raises(ValueError, match=rf"{name} .*{message}"):
        training_data.load_texts([path])
    with pytest.raises(ValueError, match=rf"{name} .*{message}"):
        training_data.load_texts([str(good)], validation_files=[path])
    with pytest.raises(ValueError, match=rf"{name} .*{message}"):
        training_data.load_parallel([str(good)], [path])


def test_training_data_too_small_to_split_off_validation_is_named(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("a single line\n")
    with pytest.raises(ValueError, match=r"one.txt holds 1 training example\(s\), one per paragraph.*validation"):
        training_data.load_texts([str(one)])
    with pytest.raises(ValueError, match=r"one.txt holds 1 training example\(s\), one per line.*validation"):
        training_data.load_parallel([str(one)], [str(one)])
    assert training_data.load_texts([str(one)], validation_files=[str(one)])["validation"].num_rows == 1


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_dataset_split_without_text_is_named(tmp_path, split):
    """Rows without text are left out; a split left without rows failed with a traceback as training began (a
    causal LM's validation split: with KeyError 'loss', after training)."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "pairs").mkdir()
    for name in ("train", "validation"):
        blank = name == split
        (tmp_path / f"texts/{name}.csv").write_text("text\n\" \"\n" if blank else "text\na dog\na cat\n")
        (tmp_path / f"pairs/{name}.csv").write_text("source,target\na man,\" \"\n" if blank else
                                                    "source,target\na dog,ein Hund\na cat,eine Katze\n")
    with pytest.raises(ValueError, match=rf"its '{split}' split holds no example: every row's 'text' is missing"):
        training_data.load_texts(dataset=str(tmp_path / "texts"))
    with pytest.raises(ValueError, match=rf"'{split}' split holds no example: every row's 'source' or 'target' is"):
        training_data.load_parallel(dataset=str(tmp_path / "pairs"))


# ---------------------------------------------------------------------------------------------- weights files


def _corrupt(path, how: str) -> None:
    data = path.read_bytes()
    corrupted = {"truncated": data[: len(data) // 2], "header": data[:8] + b"{not json" + data[17:], "tiny": data[:4]}
    path.write_bytes(corrupted[how])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny decoder saved for the Hub (weights, code, tokenizer, card), and the model's class."""
    folder = tmp_path_factory.mktemp("saved")
    model = tiny_lm("decoder")
    model.save_pretrained(folder)
    byte_level_bpe().save_pretrained(folder)
    hub.write_model_card(
        folder, task="causal-lm", model_name="someone/tiny", preset=None, config=model.config.to_dict(),
        num_parameters=model.num_parameters(), dataset="tiny", hyperparameters={}, eval_results={},
    )
    return folder, type(model)


@pytest.mark.parametrize(
    "how,message",
    [("truncated", "header describes .* bytes of tensor data, but the file holds"),
     ("header", "header is not a safetensors header"),
     ("tiny", "4 bytes are too few for its header")],
)
def test_corrupt_weights_are_named_when_publishing_and_loading(saved, tmp_path, how, message):
    source, model_class = saved
    folder = tmp_path / "model"
    folder.mkdir()
    for path in source.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    assert hub.upload_plan(folder)  # complete before the damage
    _corrupt(folder / "model.safetensors", how)
    expected = rf"model.safetensors is not a complete safetensors file: .*{message}"
    with pytest.raises(ValueError, match=expected):
        hub.publish(folder, "someone/tiny", dry_run=True)
    with pytest.raises(ValueError, match=expected) as error:
        model_class.from_pretrained(folder)
    assert error.value.__cause__ is not None  # safetensors' own error, kept as the cause


# ---------------------------------------------------------------------------------------------- command-line input
# Bad options and data files stop the commands with exit code 2 and a message naming the problem, before any
# tokenizer or model work: run in this process through `hf-scratch`'s own entry point, with that work replaced by a
# tripwire (speed-independent: a check that came too late fails the test at once), and nothing written.


class ReachedModelWork(Exception):
    pass


def config_only(folder: Path) -> Path:
    """`folder` (made) with a config.json of ours and empty weights and tokenizer files: as far as `finetune` reads a
    model before its data checks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "scratch_encoder"}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


@pytest.fixture
def hf_scratch(monkeypatch, capsys):
    """`hf_scratch(*arguments)`: run `hf-scratch ARGUMENTS` here, expecting a refusal; returns its stderr."""
    import accelerate
    import transformers
    import transformers.trainer  # first imported under the tripwires, it would keep one as its Accelerator

    import tokenizer_training
    from hf_scratch_transformer.cli import main

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the command got past its checks to tokenizer, model or Accelerate work")

    monkeypatch.setattr(tokenizer_training, "train_tokenizer", tripwire)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tripwire)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", tripwire)
    monkeypatch.setattr(accelerate, "Accelerator", tripwire)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])  # `main` sets it: restored afterwards

    def run(*arguments) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            main([str(argument) for argument in arguments])
        stderr = capsys.readouterr().err
        assert stopped.value.code == 2, stderr
        assert "Traceback" not in stderr
        return stderr

    return run


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i} of a small corpus" for i in range(40)))
    return path


@pytest.mark.parametrize(
    "arguments,message",
    [
        (["train", "--max-steps", "0"], "argument --max-steps: must be >= 1, got 0"),
        (["train", "--max-steps", "-3"], "argument --max-steps: must be >= 1, got -3"),
        (["train", "--max-minutes", "0"], "argument --max-minutes: must be > 0, got 0"),
        (["train", "--max-minutes", "-1"], "argument --max-minutes: must be > 0, got -1"),
        (["train", "--max-length", "0"], "argument --max-length: must be >= 3, got 0"),
        (["train", "--gradient-accumulation-steps", "0"], "argument --gradient-accumulation-steps: must be >= 1"),
        (["train", "--resume", "--overwrite-output-dir"], "--resume continues the earlier run and --overwrite"),
        (["train", "--model", "no/such/model"], "argument --model: folder no/such/model does not exist"),
        (["train", "--tokenizer", "./no-tokenizer"], "argument --tokenizer: folder ./no-tokenizer does not exist"),
        # Bare names are Hub ids: offline, they failed after the data work with "We couldn't connect" and a traceback
        (["train", "--tokenizer", "gpt2"], "argument --tokenizer: folder gpt2 does not exist, and with HF_HUB_OFFLINE "
                                           "set a Hub id must be in the local Hub cache, where it is not"),
        (["train-accelerate", "--config", "nofile.json"], "argument --config: file or folder nofile.json does not "
                                                          "exist, and with HF_HUB_OFFLINE set a Hub id must be in"),
        (["finetune", "--task", "text-classification", "--model", "bert-base-uncased"],
         "argument --model: folder bert-base-uncased does not exist, and with HF_HUB_OFFLINE set"),
        (["train", "--model", "not a name"], "argument --model: folder not a name does not exist"),
        # The card's title and the repo id its usage code loads: "bad name!" gave from_pretrained("bad name!")
        (["train", "--model-name", "bad name!"], "argument --model-name: 'bad name!' is not a Hub repo id"),
        (["train-accelerate", "--model-name", "a/b/c"], "argument --model-name: 'a/b/c' is not a Hub repo id"),
        (["finetune", "--task", "text-classification", "--model-name", "x--y"], "'x--y' is not a Hub repo id"),
        # A folder without a tokenizer (a run's checkpoints folder) failed in `from_pretrained` with a traceback
        (["train", "--tokenizer", "."], "argument --tokenizer: . holds no tokenizer_config.json"),
        # --model continues a saved model with its own tokenizer: these were left out without a word.
        (["train", "--task", "masked-lm", "--model", "{saved}", "--tokenizer", "{saved}"],
         "--tokenizer: for a new model; --model continues"),
        (["train", "--task", "masked-lm", "--model", "{saved}", "--preset", "gpt2-small", "--tokenizer-kind",
          "unigram"], "--preset, --tokenizer-kind: for a new model; --model continues"),
        (["train", "--task", "masked-lm", "--model", "{saved}", "--vocab-size", "300"],
         "--vocab-size: for a new model; --model"),
        # A masked LM continued with --task left at causal-lm was refused for its tokenizer's family, with advice
        # about a --tokenizer never given (or, where the tokenizer records none, by `AutoModelForCausalLM` with a
        # traceback after the data work).
        (["train", "--model", "{saved}"], "is a scratch_encoder model (the encoder family), but --task causal-lm "
                                          "trains the decoder family: continue it with --task masked-lm."),
        # A tokenizer given is used as it is: these were left out without a word.
        (["train", "--tokenizer", "{saved}", "--vocab-size", "300"],
         "--vocab-size: for a tokenizer trained here; --tokenizer "),
        (["train", "--tokenizer", "{saved}", "--tokenizer-kind", "unigram", "--vocab-size", "300"],
         "--tokenizer-kind, --vocab-size: for a tokenizer trained here; --tokenizer "),
        (["train-accelerate", "--keep-checkpoints", "0"], "argument --keep-checkpoints: must be >= 1, got 0"),
        (["train-accelerate", "--gradient-accumulation-steps", "0"], "argument --gradient-accumulation-steps: must"),
        # Optimisation options out of range trained silently wrong (a negative smoothing or clipping norm, listed
        # by the card) or failed after the tokenizer and the data (a smoothing of 1.5, a negative learning rate).
        (["train", "--label-smoothing", "-0.1"], "argument --label-smoothing: must be >= 0 and < 1, got -0.1"),
        (["train", "--label-smoothing", "1.5"], "argument --label-smoothing: must be >= 0 and < 1, got 1.5"),
        (["train-accelerate", "--label-smoothing", "1"], "argument --label-smoothing: must be >= 0 and < 1, got 1"),
        (["train", "--learning-rate", "-1"], "argument --learning-rate: must be > 0, got -1"),
        (["train-accelerate", "--learning-rate", "nan"], "argument --learning-rate: must be > 0, got nan"),
        # A learning rate of 0 trained every step without changing a weight, and wrote the model as trained.
        (["train", "--learning-rate", "0"], "argument --learning-rate: must be > 0, got 0"),
        (["train-accelerate", "--learning-rate", "0"], "argument --learning-rate: must be > 0, got 0"),
        (["finetune", "--task", "text-classification", "--learning-rate", "0"],
         "argument --learning-rate: must be > 0, got 0"),
        # finetune read any number: a negative one was AdamW's traceback after the model and the data.
        (["finetune", "--task", "text-classification", "--learning-rate", "-1"],
         "argument --learning-rate: must be > 0, got -1"),
        (["train-accelerate", "--max-grad-norm", "-1"], "argument --max-grad-norm: must be >= 0, got -1"),
        (["train", "--adam-beta2", "1.5"], "argument --adam-beta2: must be >= 0 and < 1, got 1.5"),
        (["train", "--adam-epsilon", "-0.1"], "argument --adam-epsilon: must be >= 0, got -0.1"),
        (["train", "--weight-decay", "-0.1"], "argument --weight-decay: must be >= 0, got -0.1"),
        (["train", "--max-grad-norm", "-1"], "argument --max-grad-norm: must be >= 0, got -1"),
        # Schedules that need settings neither command takes were transformers' traceback after the data work; one
        # stepped with an evaluation loss failed at the Accelerate loop's first step (train's Trainer steps it).
        (["train", "--lr-scheduler", "cosine_with_min_lr"], "argument --lr-scheduler: invalid choice: 'cosine_with"),
        (["train-accelerate", "--lr-scheduler", "warmup_stable_decay"], "argument --lr-scheduler: invalid choice"),
        (["train-accelerate", "--lr-scheduler", "reduce_lr_on_plateau"], "argument --lr-scheduler: invalid choice"),
        (["tokenizer", "--kind", "bpe", "--family", "decoder", "--min-frequency", "-1"],
         "argument --min-frequency: must be >= 0, got -1"),
        (["finetune", "--task", "text-classification", "--max-steps", "0"],
         "argument --max-steps: must be >= 1, or -1 to train for --epochs; got 0"),
        (["finetune", "--task", "text-classification", "--max-length", "0"], "argument --max-length: must be >= 3"),
        # A seed outside NumPy's [0, 2**32) was NumPy's traceback from transformers' `set_seed` (train, finetune);
        # train-accelerate said "expected non-negative integer", naming no option.
        (["train", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        (["train-accelerate", "--seed", "4294967296"],
         "argument --seed: must be < 2**32 (NumPy's seeds), got 4294967296"),
        (["finetune", "--task", "text-classification", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        # Infinity passed `>= 0`: --epochs inf was Trainer's OverflowError after the model and data work, and a
        # learning rate of inf trained a step into nan weights.
        (["finetune", "--task", "text-classification", "--epochs", "inf"],
         "argument --epochs: must be a finite number, got inf"),
        (["train", "--learning-rate", "inf"], "argument --learning-rate: must be a finite number, got inf"),
        (["train-accelerate", "--weight-decay", "inf"], "argument --weight-decay: must be a finite number, got inf"),
        # A warmup the run would not do trained without a word: as long as the run, the learning rate still rose at
        # its last step (the recipe's 4000 steps under the default 600: never past 15% of --learning-rate); under a
        # schedule without warmup, it was left out.
        (["train", "--recipe", "vaswani"], "--recipe vaswani's warmup of 4000 is not shorter than --max-steps 600"),
        (["train-accelerate", "--max-steps", "10", "--warmup-steps", "10"],
         "--warmup-steps 10 is not shorter than --max-steps 10: the learning rate would still be rising"),
        (["train", "--lr-scheduler", "constant", "--warmup-steps", "5"],
         "--warmup-steps 5: --lr-scheduler constant has no warmup and would leave it out"),
        (["train-accelerate", "--lr-scheduler", "constant", "--warmup-steps", "5"], "constant has no warmup"),
        # --force-bf16 without bf16 asked for was left out without a word: the run trained in fp32.
        (["train", "--force-bf16"], "--force-bf16 lets bf16 mixed precision run on a CPU where it is slow, but this "
                                    "run asks for no bf16 (mixed precision: no): add --bf16, or leave out"),
        (["finetune", "--task", "text-classification", "--model", "{saved}", "--force-bf16"],
         "this run asks for no bf16 (mixed precision: no): add bf16 to the launch (`accelerate launch "
         "--mixed_precision bf16`, or its config's), or leave out --force-bf16."),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_bad_options_are_refused_before_any_work(hf_scratch, monkeypatch, corpus, tmp_path, arguments, message):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)  # an `accelerate launch` config's
    command, options = arguments[0], arguments[1:]
    data = {"train": ["--train-files", corpus], "train-accelerate": ["--train-files", corpus],
            "tokenizer": ["--files", corpus], "finetune": ["--model", tmp_path, "--train-file", tmp_path / "x.csv"]}
    if "{saved}" in options:  # a saved model's folder, as far as these checks read it
        saved = tmp_path / "saved"
        saved.mkdir()
        config_only(saved)
        options = [saved if option == "{saved}" else option for option in options]
    output = tmp_path / "out"
    assert message in hf_scratch(command, *data[command], *options, "--output-dir", output)
    assert not output.exists()


@pytest.mark.parametrize("command", ["train", "tokenizer"])
def test_errors_name_the_command_as_the_user_typed_it(hf_scratch, command):
    # `hf-scratch tokenizer` said "usage: python -m tokenizer_training" and "python -m tokenizer_training: error".
    stderr = hf_scratch(command, "--no-such-option")
    assert stderr.startswith(f"usage: hf-scratch {command} ") and f"hf-scratch {command}: error:" in stderr


@pytest.mark.parametrize("command", [["train"], ["train-accelerate", "--cpu"]])
def test_a_vocab_size_below_the_tokenizers_alphabet_is_named(monkeypatch, capsys, corpus, tmp_path, command):
    # Byte-level BPE holds 260 tokens at least: train_tokenizer's ValueError was a traceback after the data work.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(SystemExit) as stopped:
        main([*command, "--train-files", str(corpus), "--vocab-size", "100", "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert "`vocab_size` 100 is too small for a bpe tokenizer of this text" in capsys.readouterr().err


class ReadData(Exception):
    pass


@pytest.mark.parametrize("options, message", [
    (["--force-bf16"], "--force-bf16 lets bf16 mixed precision run on a CPU where it is slow, but this run asks for no "
                       "bf16 (mixed precision: no): add --mixed-precision bf16, or leave out --force-bf16."),
    (["--model", "{saved}"], "is a scratch_encoder model (the encoder family), but --task causal-lm trains the decoder "
                             "family: continue it with --task masked-lm."),
])
def test_train_accelerate_refuses_options_it_would_leave_out_or_fail_on_before_the_data(
        monkeypatch, capsys, corpus, tmp_path, options, message):
    """As `train` (test_bad_options_are_refused_before_any_work, whose tripwire would stop this command at its
    Accelerator, built before these checks): --force-bf16 without bf16 trained in fp32 without a word; a masked LM
    continued under the default --task was refused for its tokenizer's family, in words about a --tokenizer."""
    from hf_scratch_transformer.cli import main, run_data

    def read(*args, **kwargs):
        raise ReadData

    monkeypatch.setattr(run_data, "load_run_data", read)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    saved = config_only(tmp_path / "saved")
    options = [str(saved) if option == "{saved}" else option for option in options]
    with pytest.raises(SystemExit) as stopped:
        main(["train-accelerate", "--cpu", "--train-files", str(corpus), *options, "--output-dir",
              str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_repeated_file_and_set_options_add_up(hf_scratch, monkeypatch, corpus, tmp_path):
    # argparse keeps the last of a repeated option: `--train-files a --train-files b` trained on b alone, and
    # `--set hidden_size=33 --set num_hidden_layers=1` built the model without the first override, silently.
    from hf_scratch_transformer import training_data

    def read(files, dataset, dataset_config, text_column, validation_files, **kwargs):
        raise ReadData(files, validation_files)

    monkeypatch.setattr(training_data, "load_texts", read)
    other = tmp_path / "other.txt"
    other.write_text("more text\n")
    with pytest.raises(ReadData) as read_data:
        hf_scratch("train", "--train-files", corpus, "--train-files", other, "--validation-files", corpus,
                   "--validation-files", other, "--output-dir", tmp_path / "out")
    assert read_data.value.args == ([str(corpus), str(other)], [str(corpus), str(other)])
    assert "hidden_size" in hf_scratch("train", "--set", "hidden_size=33", "--set", "num_hidden_layers=1",
                                       "--train-files", corpus, "--output-dir", tmp_path / "out")


def test_an_unknown_command_is_refused_as_a_bad_option_is(hf_scratch):
    assert "hf-scratch: error: unknown command 'trian'" in hf_scratch("trian", "--max-steps", "10")  # exit status 2


@pytest.mark.parametrize("name", ["train", "train-accelerate", "finetune", "convert", "publish", "benchmark"])
def test_a_commands_help_shows_its_examples(monkeypatch, capsys, name):
    """A command's --help printed its summary alone, cut before the examples it announces ("... would be uploaded:"
    and then the options)."""
    import ast
    import importlib.util

    from hf_scratch_command import COMMANDS
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])  # `main` sets it: restored afterwards
    with pytest.raises(SystemExit) as stopped:
        main([name, "--help"])
    assert stopped.value.code == 0
    source = Path(importlib.util.find_spec(COMMANDS[name][0]).origin).read_text()
    examples = ast.get_docstring(ast.parse(source), clean=False).split("\n\n")[1]
    assert examples in capsys.readouterr().out


@pytest.mark.parametrize("name", ["train", "train-accelerate", "finetune", "convert", "publish", "benchmark",
                                  "tokenizer"])
def test_a_commands_help_states_every_default(monkeypatch, name):
    """Options such as finetune's --epochs and --batch-size, train's --weight-decay and train-accelerate's
    --max-grad-norm showed no default in --help, which a user needs before choosing a value."""
    import argparse

    from hf_scratch_transformer.cli import main

    parsers = []
    parse_known_args = argparse.ArgumentParser.parse_known_args

    def recording(parser, *args, **kwargs):
        parsers.append(parser)
        return parse_known_args(parser, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", recording)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])  # `main` sets it: restored afterwards
    with pytest.raises(SystemExit):
        main([name, "--help"])
    def has_a_default(action):  # a store_true's False is none (and a seed's 0 is one)
        return action.default not in (None, [], argparse.SUPPRESS) and action.default is not False

    unstated = [action.option_strings for parser in parsers for action in parser._actions
                if has_a_default(action) and action.help != argparse.SUPPRESS and "default" not in (action.help or "")]
    assert parsers and not unstated


def test_help_version_and_an_unknown_command_are_answered_without_importing_torch():
    """`hf-scratch --help` took 11 s on a 2-core AVX2 host: it imported the package (torch, transformers) to print
    a table. The entry point answers these three itself."""
    code = """
import sys, hf_scratch_command
hf_scratch_command.main(["--help"])
hf_scratch_command.main(["--version"])
try:
    hf_scratch_command.main(["trian"])
except SystemExit as refused:
    assert refused.code == 2
heavy = {"torch", "transformers", "hf_scratch_transformer"} & set(sys.modules)
assert not heavy, heavy
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train-accelerate" in result.stdout and f"hf-scratch {version('hf-scratch-transformer')}" in result.stdout
    assert "hf-scratch: error: unknown command 'trian'" in result.stderr


def test_the_command_run_as_a_module_answers_as_the_installed_one():
    # `python -m hf_scratch_command --help` (or any command) ran nothing, and exited 0 without a word.
    result = subprocess.run([sys.executable, "-m", "hf_scratch_command", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "train-accelerate" in result.stdout, result.stderr[-3000:]


def test_a_command_imports_its_package_without_collecting_then_freezes_what_it_made(tmp_path):
    """Collecting while the package was imported (torch, transformers: about 400,000 objects that stay) walked them
    again and again, and every full collection of a run's data work walked them once more: from its start to the end
    of a 2-step run of nanoGPT's recipe `hf-scratch train` took 30.0 s on a 2-core AVX2 host, 23.7 s with this and
    the training commands' own freeze (docs/training.md, "Startup")."""
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    (tmp_path / "probe" / "command.py").write_text(
        "import gc, probe\nprint(probe.COLLECTING, gc.isenabled(), gc.get_freeze_count() > 0)\n")
    code = "import hf_scratch_command as c; c.COMMANDS['probe'] = ('probe.command', ''); c.main(['probe'])"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.stdout.split() == ["False", "True", "True"], result.stderr[-3000:]


@pytest.mark.parametrize("name", ["train", "convert", "tokenizer"])
def test_ctrl_c_while_a_command_starts_stops_with_one_line(monkeypatch, capsys, name):
    """Ctrl-C while the command's module runs its imports (datasets, accelerate, Trainer: seconds) ended in a
    KeyboardInterrupt traceback; once the training commands run, it stops them with one line and exit status 130."""
    import runpy

    from hf_scratch_transformer.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runpy, "run_module", interrupted)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])  # `main` sets it: restored afterwards
    with pytest.raises(SystemExit) as stopped:
        main([name, "--help"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip() == "stopped by Ctrl-C"


def test_ctrl_c_while_the_installed_command_imports_the_package_stops_with_one_line():
    """The installed `hf-scratch` (pyproject.toml's entry point) imported the package, torch and transformers,
    seconds in all, before its `main` could answer a Ctrl-C: one then ended in a KeyboardInterrupt traceback."""
    module, function = re.search(r'^hf-scratch = "([\w.]+):(\w+)"', (ROOT / "pyproject.toml").read_text(),
                                 re.MULTILINE).groups()
    # -X importtime writes a line as each module is imported: the signal is sent while torch is being imported.
    command = [sys.executable, "-X", "importtime", "-c", f"from {module} import {function}; {function}()",
               "train", "--help"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as child:
        next(line for line in child.stderr if "torch" in line)
        child.send_signal(signal.SIGINT)
        lines = [line for line in child.stderr.read().splitlines() if not line.startswith("import time:")]
        assert child.wait(timeout=60) == 130 and "Traceback" not in "\n".join(lines), lines[-30:]
    assert lines[-1] == "stopped by Ctrl-C"


@pytest.mark.parametrize("name", ["missing.txt", "empty.txt", "binary.txt"])
def test_the_main_job_names_bad_data_or_output_before_any_work(hf_scratch, bad_text, corpus, tmp_path, name):
    path, message = (str(tmp_path / name), "No such file or directory") if name == "missing.txt" else bad_text(name)
    output = tmp_path / "out"
    assert re.search(rf"{name}.* {message}|{message}.*{name}", hf_scratch("train", "--train-files", path,
                                                                           "--output-dir", output))
    assert not output.exists()
    output.write_text("")  # a file where the run's folder would go: refused before the data is read
    stderr = hf_scratch("train", "--train-files", path, "--output-dir", output)
    assert f"--output-dir {output} is a file, not a folder" in stderr
    # under a file: it was said to be read-only
    stderr = hf_scratch("train", "--train-files", path, "--output-dir", output / "run")
    assert f"--output-dir {output / 'run'} cannot be made: {output} is a file, not a folder" in stderr


@pytest.mark.parametrize("name", list(BAD_TEXT))
def test_a_bad_text_file_in_a_dataset_folder_is_named_before_any_work(hf_scratch, bad_text, tmp_path, name):
    """A folder of .txt files given as --dataset: a file of NUL bytes was trained on as text, and one that is not
    UTF-8 was reported naming the folder alone ("cannot be read: 'utf-8' codec can't decode ..."). Each file is
    checked as one given with --train-files is."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "good.txt").write_text("\n".join(f"line {i} of a small corpus" for i in range(40)))
    path, message = bad_text(name)
    os.replace(path, folder / name)
    stderr = hf_scratch("train", "--dataset", folder, "--output-dir", tmp_path / "out")
    assert f"{folder}: {folder / name} " in stderr and message in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_given_as_a_text_file_is_named(hf_scratch, tmp_path):
    # The training commands failed with an IsADirectoryError traceback; the tokenizer called it "not found".
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("hello\n")
    message = f"{folder} is a folder, not a text file: pass its files, or the folder as --dataset"
    assert message in hf_scratch("train", "--train-files", folder, "--output-dir", tmp_path / "out")
    assert message in hf_scratch("train", "--task", "seq2seq", "--source-files", folder, "--target-files", folder,
                                 "--output-dir", tmp_path / "out")
    with pytest.raises(ValueError, match=message):
        train_tokenizer("bpe", "decoder", files=[folder], vocab_size=300)


@pytest.mark.parametrize(
    "arguments,message",
    [
        (["--source-files", "{c}", "--target-files", "{c}"],
         "--source-files, --target-files: not data for --task causal-lm"),
        (["--task", "masked-lm", "--train-files", "{c}", "--validation-target", "{c}"],
         "--validation-target: not data for --task masked-lm"),
        (["--task", "seq2seq", "--source-files", "{c}", "--target-files", "{c}", "--validation-files", "{c}"],
         "--validation-files: not data for --task seq2seq"),
        (["--task", "seq2seq", "--source-files", "{c}", "--target-files", "{c}", "--validation-source", "{c}"],
         "validation files for both sides"),
        (["--task", "seq2seq", "--dataset", "some/pairs", "--source-files", "{c}"], "parallel files or a dataset"),
        (["--dataset", "some/texts", "--validation-files", "{c}"], "Validation files go with training files"),
        (["--train-files", "{c}", "--text-column", "body"],
         "--text-column: options of --dataset, which this run does not use (files have no columns)"),
        (["--task", "seq2seq", "--source-files", "{c}", "--target-files", "{c}", "--dataset-config", "de-en",
          "--target-column", "de"], "--dataset-config, --target-column: options of --dataset"),
        (["--dataset", "some/texts", "--source-column", "en"],
         "--source-column: not a column of --task causal-lm's data (its --dataset columns: --text-column)"),
        (["--task", "seq2seq", "--dataset", "some/pairs", "--text-column", "en"],
         "--text-column: not a column of --task seq2seq's data (its --dataset columns: --source-column, "
         "--target-column)"),
    ],
    ids=["causal-lm source files", "masked-lm validation target", "seq2seq validation files",
         "one validation side", "pairs beside a dataset", "validation files beside a dataset",
         "a column of files", "a dataset config and column of files", "a seq2seq column for text",
         "a text column for pairs"],
)
def test_data_options_that_would_be_left_out_are_refused(hf_scratch, corpus, tmp_path, arguments, message):
    # Each was ignored without a word: a causal LM given parallel files trained on the default corpus.
    output = tmp_path / "out"
    options = [str(corpus) if argument == "{c}" else argument for argument in arguments]
    assert message in hf_scratch("train", *options, "--output-dir", output)
    assert not output.exists()


@pytest.mark.parametrize("task,family", [("seq2seq", "decoder"), ("causal-lm", "encoder"), ("masked-lm", "seq2seq")])
def test_a_tokenizer_of_another_family_is_refused_before_the_model(monkeypatch, capsys, corpus, tmp_path, task, family):
    # A decoder tokenizer's `<s> text` without `</s>` trained a seq2seq model that never learns to stop, silently.
    import transformers

    from hf_scratch_transformer.cli import main

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the command built a model with the tokenizer of another family")

    train_tokenizer(TOKENIZER_KINDS[family], family, files=[corpus], vocab_size=300).save_pretrained(tmp_path / family)
    for auto_class in ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM"):
        monkeypatch.setattr(getattr(transformers, auto_class), "from_config", tripwire)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    data = ["--source-files", corpus, "--target-files", corpus] if task == "seq2seq" else ["--train-files", corpus]
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--task", task, *map(str, data), "--tokenizer", str(tmp_path / family),
              "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    needed = {"seq2seq": "seq2seq", "causal-lm": "decoder", "masked-lm": "encoder"}[task]
    assert (f"was trained for the {family} family, but --task {task} needs one for the {needed} family"
            in capsys.readouterr().err)


def test_a_seq2seq_tokenizer_that_ends_no_text_with_eos_is_refused_before_the_model(monkeypatch, capsys, corpus,
                                                                                    tmp_path):
    # One made elsewhere (GPT-2's appends nothing) records no family: its pad token let it through, and the model
    # trained on targets without `</s>` never learnt to stop, silently (a translation ran on to --max-length).
    import transformers
    from tokenizers import processors

    from hf_scratch_transformer.cli import main

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the command built a model for targets without an end")

    ours = byte_level_bpe(family="seq2seq")
    backend = type(ours.backend_tokenizer).from_str(ours.backend_tokenizer.to_str())
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # GPT-2's: no special token added
    type(ours)(tokenizer_object=backend, **ours.special_tokens_map).save_pretrained(tmp_path / "foreign")
    monkeypatch.setattr(transformers.AutoModelForSeq2SeqLM, "from_config", tripwire)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--task", "seq2seq", "--source-files", str(corpus), "--target-files", str(corpus),
              "--tokenizer", str(tmp_path / "foreign"), "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    assert "does not end a text with an eos_token ('</s>' is not its last token)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "train-accelerate"])
@pytest.mark.parametrize("case", ["tokens-added-to-a-model-folder", "a-smaller-source-vocabulary-set"])
def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused_before_the_data(monkeypatch, capsys, corpus,
                                                                                   tmp_path, command, case):
    # Tokens added to a saved model's tokenizer were refused in a line that gave no way on; a seq2seq model's
    # `--set encoder_vocab_size` below the tokenizer's size was not checked at all: a ValueError traceback at the first
    # step, after the tokenizing.
    from hf_scratch_transformer.cli import main

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the data was tokenized for a model without rows for some of its ids")

    tokenizer = byte_level_bpe(family="seq2seq" if case.startswith("a-smaller") else "decoder")
    if case == "tokens-added-to-a-model-folder":
        tiny_lm("decoder", vocab_size=320).save_pretrained(tmp_path / "model")
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.add_tokens([f"<added {i}>" for i in range(30)])  # 330 tokens
        tokenizer.save_pretrained(tmp_path / "model")
        options, refused = ["--model", tmp_path / "model", "--train-files", corpus], "the model's vocabulary only 320"
        ids = "ids 320 to 329 have no embedding row"
    else:
        tokenizer.save_pretrained(tmp_path / "tokenizer")
        options = ["--task", "seq2seq", "--tokenizer", tmp_path / "tokenizer", "--source-files", corpus,
                   "--target-files", corpus, "--preset", "transformer-xavier", "--set", "encoder_layers=1",
                   "decoder_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
                   "encoder_vocab_size=100"]
        refused = "the model's source vocabulary only 100"
        ids = f"ids 100 to {len(tokenizer) - 1} have no embedding row"
    for preparation in ("pack_for_causal_lm", "tokenize_for_seq2seq"):
        monkeypatch.setattr(training_data, preparation, tripwire)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(SystemExit) as stopped:
        main([command, *map(str, options), "--max-length", "32", "--output-dir", str(tmp_path / "out")])
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2
    assert refused in stderr and ids in stderr and "model.resize_token_embeddings(len(tokenizer))" in stderr


def test_tokenizer_refuses_an_output_dir_that_is_a_file(tmp_path, corpus, monkeypatch, capsys):
    # `save_pretrained` only logged "should be a directory": the command said "saved to" and exited 0, writing nothing.
    from hf_scratch_transformer.cli import main

    in_the_way = tmp_path / "afile"
    in_the_way.write_text("")
    monkeypatch.setattr("sys.argv", ["hf-scratch"])  # `main` sets it: restored afterwards
    for output in (in_the_way, in_the_way / "tokenizer"):
        with pytest.raises(SystemExit) as stopped:
            main(["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus), "--vocab-size", "300",
                  "--output-dir", str(output)])
        said = capsys.readouterr()
        assert stopped.value.code == 2 and "Traceback" not in said.err, said.err[-3000:]
        assert f"--output-dir {output}: {in_the_way} is a file, not a folder" in said.err
        assert "saved" not in said.out and in_the_way.read_text() == ""


# finetune data: file name -> (task, content, words the refusal must hold)
BAD_FINETUNE_DATA = {
    "missing.csv": ("text-classification", "text,label\na dog,animal\na man,other\nsome text,\nmore,\n",
                    "the label column 'label' has no value in rows 3, 4"),
    "fractional.csv": ("text-classification", "text,label\na dog,0.5\na man,1.5\n",
                       "fractional labels in 'label' (scores for regression?) in rows 1, 2"),
    "short.json": ("token-classification",
                   '{"tokens": ["a", "dog"], "tags": ["O", "ANIMAL"]}\n{"tokens": ["a", "man"], "tags": ["O"]}\n',
                   "the number of labels differs from the number of words in row 2"),
    # a null word was trained on as the text "None"; a null first word, or numbers, failed in the tokenizer
    "null_word.json": ("token-classification",
                       '{"tokens": ["a", "dog"], "tags": ["O", "B-A"]}\n{"tokens": ["a", null], "tags": ["O", "O"]}\n',
                       "words in 'tokens' that are not text (missing, or numbers) in row 2"),
    "numbers.json": ("token-classification", '{"tokens": [1, 2], "tags": ["O", "B-A"]}\n',
                     "words in 'tokens' that are not text (missing, or numbers) in row 1"),
    "tokens.csv": ("token-classification", "tokens,tags\n\"['a', 'dog']\",\"['O', 'ANIMAL']\"\n",
                   "token classification needs a list of words and a list of labels per row"),
    "corpus.txt": ("text-classification", "a dog\na man\n", "unsupported format '.txt'; use CSV (.csv) or JSON"),
    "binary.csv": ("text-classification", b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not UTF-8 text"),
    "header.csv": ("text-classification", "text,label\n", "holds no rows"),
    "no_text.csv": ("text-classification", "text,label\na dog,animal\n,other\na man,other\n",
                    "the text column 'text' holds no text in row 2"),
    "empty.json": ("text-classification", "", "holds no text"),
    # an empty text is no token for GPT-2's tokenizer: a traceback at its batch, or a row of padding only
    "blank.json": ("text-classification", '{"text": "a dog", "label": "a"}\n{"text": " ", "label": "b"}\n',
                   "the text column 'text' holds no text in row 2"),
    # several classes per text: the hint sent a multi-label user to token classification, which needs word lists
    "multilabel.json": ("text-classification",
                        '{"text": "a dog", "label": ["animal", "pet"]}\n{"text": "a man", "label": ["person"]}\n',
                        "(lists: text classification reads one class per text, multi-label classification is not "
                        "offered; a label per word is --task token-classification) in rows 1, 2"),
    # a blank label was trained as a class named "" (or " "), which the pipeline then gave as the label
    "blank_label.json": ("text-classification",
                         '{"text": "a dog", "label": "animal"}\n{"text": "a man", "label": " "}\n'
                         '{"text": "a horse", "label": ""}\n', "the label column 'label' has no value in rows 2, 3"),
    # Question answering: SQuAD's columns. A misplaced answer trained the model on another span, or on none.
    "squad.csv": ("question-answering", "question,context,answers\nWhere?,in Verona,Verona\n",
                  "question answering needs SQuAD's answers ({\"text\": [...], \"answer_start\": [...]}) per row"),
    "misplaced.json": ("question-answering",
                       '{"question": "Where?", "context": "in Verona", "answers": {"text": ["Verona"], '
                       '"answer_start": [3]}}\n{"question": "Where?", "context": "in Verona", "answers": {"text": '
                       '["Verona"], "answer_start": [4]}}\n',
                       "an answer's text in 'answers' is not at its answer_start in the context ('context'; "
                       "answer_start counts characters from 0) in row 2"),
    "answer_text.json": ("question-answering", '{"question": "Where?", "context": "in Verona", "answers": "Verona"}\n',
                         "the answers in 'answers' are not SQuAD's {\"text\": [...], \"answer_start\": [...]} (two "
                         "lists of the same length"),
    "no_question.json": ("question-answering",
                         '{"question": "", "context": "in Verona", "answers": {"text": [], "answer_start": []}}\n',
                         "the question column 'question' holds no text in row 1"),
    # Multiple choice: a question, a list of choices (as many in every row: one batch holds one number), an index.
    "choices.csv": ("multiple-choice", "question,choices,label\nWhat runs?,\"['a dog', 'a house']\",0\n",
                    "multiple choice needs a list of choices per row, which CSV cannot hold"),
    "one_choice.json": ("multiple-choice", '{"question": "What runs?", "choices": ["a dog", "a house"], "label": 0}\n'
                                           '{"question": "What runs?", "choices": ["a dog"], "label": 0}\n',
                        "the choices in 'choices' are not a list of two or more texts in row 2"),
    "uneven.json": ("multiple-choice", '{"question": "What runs?", "choices": ["a dog", "a house", "a man"], '
                                       '"label": 0}\n{"question": "What runs?", "choices": ["a dog", "a house"], '
                                       '"label": 0}\n',
                    "the number of choices in 'choices' is not 3, that of the first training row (every row needs "
                    "as many) in row 2"),
    "label_past.json": ("multiple-choice", '{"question": "What runs?", "choices": ["a dog", "a house"], "label": 2}\n'
                                           '{"question": "What runs?", "choices": ["a dog", "a man"], "label": "a dog"}'
                                           '\n',
                        "the label in 'label' is not the index of one of the row's choices (an integer, counted from "
                        "0) in rows 1, 2"),
    "no_prompt.json": ("multiple-choice", '{"question": null, "choices": ["a dog", "a house"], "label": 0}\n',
                       "the question column 'question' holds no text in row 1"),
    # an upper-case suffix (Windows tools) was an "unsupported format '.CSV'"
    "MISSING.CSV": ("text-classification", "text,label\na dog,animal\na man,other\nsome text,\nmore,\n",
                    "the label column 'label' has no value in rows 3, 4"),
}


@pytest.mark.parametrize("name", list(BAD_FINETUNE_DATA))
def test_finetune_names_bad_data_before_building_the_model(hf_scratch, tmp_path, name):
    task, content, message = BAD_FINETUNE_DATA[name]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    output = tmp_path / "out"
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path), "--task", task, "--train-file", path,
                        "--label-column", "tags" if task == "token-classification" else "label", "--output-dir", output)
    assert f"--train-file {path}" in stderr and message in stderr
    assert "usage:" not in stderr, "a problem in the data, which no option caused: one line, without the usage"
    assert not output.exists()


@pytest.mark.parametrize("task,options,message", [
    ("text-classification", ["--dataset-config", "sst2"], "--dataset-config goes with --dataset"),
    ("text-classification", ["--tokens-column", "words"],
     "--tokens-column: not an input of --task text-classification (its input column: --text-column)"),
    ("token-classification", ["--text-column", "sentence"],
     "--text-column: not an input of --task token-classification (its input column: --tokens-column)"),
    ("text-classification", ["--text-column", "label"],  # a KeyError traceback
     "--text-column and --label-column both name the column 'label'"),
    ("question-answering", ["--text-column", "text"],
     "--text-column: not an input of --task question-answering (its input columns: --question-column, "
     "--context-column, --answers-column)"),
    ("question-answering", ["--label-column", "tags"], "--label-column: not an input of --task question-answering"),
    ("question-answering", ["--question-column", "context"],
     "--question-column and --context-column both name the column 'context'"),
    ("text-classification", ["--doc-stride", "16"], "--doc-stride: goes with --task question-answering"),
    ("multiple-choice", ["--context-column", "text"],
     "--context-column: not an input of --task multiple-choice (its input columns: --question-column, "
     "--choices-column)"),
    ("text-classification", ["--choices-column", "endings"],
     "--choices-column: not an input of --task text-classification"),
])
def test_finetune_refuses_options_it_would_leave_out(hf_scratch, tmp_path, task, options, message):
    # Each was ignored without a word: the run read the default column, or the file as it was.
    (tmp_path / "train.json").write_text('{"text": "a dog", "tokens": ["a", "dog"], "label": 0}\n')
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path), "--task", task, "--train-file",
                        tmp_path / "train.json", *options, "--output-dir", tmp_path / "out")
    assert message in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("task, rows, message", [
    ("token-classification", '{"tokens": ["a"], "label": [1.5]}\n',
     "--regression: goes with --task text-classification (a score per text), not --task token-classification"),
    ("text-classification", '{"text": "a dog", "label": 0.5}\n{"text": "a man", "label": "high"}\n'
                            '{"text": "a horse", "label": null}\n{"text": "a cat", "label": true}\n',
     "--regression needs a number in the label column 'label'; none in rows 2, 3, 4"),
], ids=["another-task", "labels-that-are-not-numbers"])
def test_finetune_regression_refuses_what_it_cannot_score(hf_scratch, tmp_path, task, rows, message):
    (tmp_path / "train.json").write_text(rows)
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path / "model"), "--task", task, "--regression",
                        "--train-file", tmp_path / "train.json", "--output-dir", tmp_path / "out")
    assert message in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "validation,message",
    [("text,label\na cat,animal\na tree,plant\n", "labels ['plant'] do not occur in the training data"),
     ("text,label\na cat,0.5\n", "fractional labels in 'label'")],
)
def test_finetune_checks_the_labels_of_the_validation_file(hf_scratch, tmp_path, validation, message):
    (tmp_path / "train.csv").write_text("text,label\na dog,animal\na man,other\na horse,animal\n")
    (tmp_path / "dev.csv").write_text(validation)
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path), "--task", "text-classification", "--train-file",
                        tmp_path / "train.csv", "--validation-file", tmp_path / "dev.csv", "--output-dir",
                        tmp_path / "out")
    assert f"--validation-file {tmp_path / 'dev.csv'}: {message}" in stderr


class ReachedTraining(Exception):
    pass


@pytest.fixture
def short_positions_model(tmp_path):
    """A tiny encoder folder with 16 learned positions, and a CSV of texts longer than that."""
    from tiny_tokenizers import wordpiece

    from hf_scratch_transformer import ScratchEncoderForMaskedLM

    tokenizer = wordpiece()
    ScratchEncoderForMaskedLM(tiny_config("encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                          max_position_embeddings=16)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rows = [f"{' '.join(['the dog runs to the big house'] * 4)},{'yes' if i % 2 else 'no'}" for i in range(10)]
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows))
    return tmp_path


def test_finetune_fits_its_texts_in_the_models_positions(monkeypatch, capsys, short_positions_model):
    """The default --max-length 128 on a model with fewer learned positions failed at the first training step with
    a traceback; it now takes the model's positions, and a longer --max-length given is refused before the data work
    (as `train --model` refuses it)."""
    from hf_scratch_transformer.cli import main
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    folder = short_positions_model
    lengths = []

    def train(self, *args, **kwargs):
        lengths.extend(len(ids) for ids in self.train_dataset["input_ids"])
        raise ReachedTraining

    monkeypatch.setattr(CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    command = ["finetune", "--model", folder / "model", "--task", "text-classification", "--train-file",
               folder / "train.csv"]
    with pytest.raises(ReachedTraining):
        main([str(argument) for argument in [*command, "--output-dir", folder / "out"]])
    assert max(lengths) == 16

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the data was tokenized for a --max-length the model cannot read")

    monkeypatch.setattr(training_data, "truncated_map", tripwire)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([str(argument) for argument in [*command, "--max-length", "32", "--output-dir", folder / "refused"]])
    assert stopped.value.code == 2
    assert "--max-length 32 is longer than the model's 16 learned positions" in capsys.readouterr().err
    assert not (folder / "refused").exists()


def _stop_at_training(monkeypatch) -> list:
    """Patches finetune's Trainer to stop as training starts; the returned list then holds that Trainer."""
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    trainers = []

    def train(self, *args, **kwargs):
        trainers.append(self)
        raise ReachedTraining

    monkeypatch.setattr(CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    return trainers


def test_finetune_reads_whole_float_labels_as_their_integer_ids(monkeypatch, short_positions_model):
    """A label column of floats (pandas writes 0.0, 1.0 for a float column) was refused as "neither class names nor
    integer ids", though whole floats are integer ids, as the validation file's 0, 1 are."""
    from hf_scratch_transformer.cli import main

    folder = short_positions_model
    (folder / "floats.csv").write_text("text,label\n" + "\n".join(f"text {i},{i % 3}.0" for i in range(12)))
    (folder / "dev.csv").write_text("text,label\na dog,2\na man,0\n")
    trainers = _stop_at_training(monkeypatch)
    with pytest.raises(ReachedTraining):
        main([str(argument) for argument in [
            "finetune", "--model", folder / "model", "--task", "text-classification", "--train-file",
            folder / "floats.csv", "--validation-file", folder / "dev.csv", "--output-dir", folder / "out"]])
    trainer = trainers[0]
    assert trainer.model.config.id2label == {0: "0", 1: "1", 2: "2"}
    assert trainer.train_dataset["labels"] == [i % 3 for i in range(12)]
    assert trainer.eval_dataset["labels"] == [2, 0]


def test_finetune_refuses_a_tokenizer_with_nothing_to_pad_with_before_converting(monkeypatch, capsys, tmp_path):
    """A tokenizer with neither a padding nor an end-of-text token (GPT-2's pads with its end-of-text token) failed
    at the first batch, after converting the model and tokenizing the data: "Asking to pad but the tokenizer does
    not have a padding token", a traceback."""
    import tiny_native

    from hf_scratch_transformer import conversion
    from hf_scratch_transformer.cli import main

    tokenizer = byte_level_bpe()
    tiny_native.gpt2(vocab_size=len(tokenizer), pad_token_id=None).save_pretrained(tmp_path / "gpt2")
    tokenizer.save_pretrained(tmp_path / "gpt2")
    settings = json.loads((tmp_path / "gpt2/tokenizer_config.json").read_text())
    for role in ("pad_token", "eos_token"):
        settings.pop(role, None)
    (tmp_path / "gpt2/tokenizer_config.json").write_text(json.dumps(settings))
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(f"text {i},{i % 2}" for i in range(10)))

    def tripwire(*args, **kwargs):
        raise ReachedModelWork("the model was converted for a tokenizer that cannot pad its batches")

    monkeypatch.setattr(conversion, "from_hf", tripwire)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(SystemExit) as stopped:
        main([str(argument) for argument in [
            "finetune", "--model", tmp_path / "gpt2", "--task", "text-classification", "--train-file",
            tmp_path / "train.csv", "--output-dir", tmp_path / "out"]])
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in stderr
    assert f"the tokenizer in {tmp_path / 'gpt2'} has no pad_token, nor an eos_token to pad with" in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_finetune_names_unlabelled_rows_of_a_class_label_column(hf_scratch, tmp_path):
    """A `datasets` ClassLabel column marks a row without a label with id -1, which was passed on to the loss:
    "IndexError: Target -1 is out of bounds" at the first training step. Refused, naming the rows, as an empty label
    of a CSV file is."""
    from datasets import ClassLabel, Dataset, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["animal", "other"])})
    Dataset.from_dict({"text": ["a dog", "a man", "a horse", "a street"], "label": [0, 1, -1, 1]},
                      features=features).to_parquet(tmp_path / "data/train.parquet")
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path), "--task", "text-classification", "--dataset",
                        tmp_path / "data", "--output-dir", tmp_path / "out")
    assert "the 'train' split: the label column 'label' has no value (id -1) in row 3" in stderr


CLASS_LABEL_DATA = {  # ClassLabel ids need no value check, but their shape was not checked either
    # labels shorter than the words: an IndexError traceback midway through tokenizing
    "short": ("token-classification", [["a", "dog"], ["a", "man", "runs"]], [[0, 1], [0, 1]],
              "the number of labels differs from the number of words in row 2"),
    # longer: the extra labels were left out without a word, and the run trained
    "long": ("token-classification", [["a", "dog"], ["a", "man"]], [[0, 1], [0, 1, 1]],
             "the number of labels differs from the number of words in row 2"),
    # one class per text for token classification: "TypeError: 'int' object is not subscriptable"
    "scalar": ("token-classification", [["a", "dog"], ["a", "man"]], [0, 1],
               "token classification needs lists in 'tokens' and 'label', one label per word; not lists in rows 1, 2"),
    # multi-label ClassLabel lists (go_emotions' layout): "TypeError: list indices must be integers or slices"
    "multi-label": ("text-classification", ["a dog", "a man"], [[0], [0, 1]],
                    "(lists: text classification reads one class per text, multi-label classification is not "
                    "offered; a label per word is --task token-classification) in rows 1, 2"),
}


@pytest.mark.parametrize("name", list(CLASS_LABEL_DATA))
def test_finetune_checks_the_shape_of_class_label_columns(hf_scratch, tmp_path, name):
    from datasets import ClassLabel, Dataset, Features, List, Value

    task, inputs, labels, message = CLASS_LABEL_DATA[name]
    column = "text" if task == "text-classification" else "tokens"
    tags = ClassLabel(names=["O", "B-ANIMAL"])
    features = Features({column: Value("string") if task == "text-classification" else List(Value("string")),
                         "label": List(tags) if isinstance(labels[0], list) else tags})
    Dataset.from_dict({column: inputs, "label": labels}, features=features).to_parquet(tmp_path / "data/train.parquet")
    stderr = hf_scratch("finetune", "--model", config_only(tmp_path), "--task", task, "--dataset", tmp_path / "data",
                        "--output-dir", tmp_path / "out")
    assert "the 'train' split: " in stderr and message in stderr
    assert not (tmp_path / "out").exists()


def test_set_with_a_config_file_is_checked_as_with_a_preset(hf_scratch, corpus, tmp_path):
    # With --config, a misspelt --set field was dropped by `AutoConfig.from_pretrained` without a word, and an
    # impossible value failed with a traceback after the tokenizer and data work (`run_options.config_overrides`,
    # which train-accelerate shares, once its Accelerator is up).
    tiny_config("decoder").save_pretrained(tmp_path / "config")
    run = ["train", "--config", tmp_path / "config", "--train-files", corpus, "--output-dir", tmp_path / "out"]
    assert "ScratchDecoderConfig has no field num_layers (did you mean num_hidden_layers?)" in hf_scratch(
        *run, "--set", "num_layers=1")
    assert "`hidden_size` (33) must be divisible" in hf_scratch(*run, "--set", "hidden_size=33")
    assert "rope_theta: RoPE settings" in hf_scratch(*run, "--set", "rope_theta=500.0")


@pytest.mark.parametrize("content, refusal", [
    ('{"model_type": "scratch_decoder", "hidden_size": 32,', "config.json is not a JSON object"),
    ("[1, 2]", "config.json is not a JSON object"),
    ('{"hidden_size": 32}', "model_type None is none of this package's"),
    ('{"model_type": "bert", "hidden_size": 32}', "model_type 'bert' is none of this package's"),
    ('{"model_type": "scratch_decoder", "hidden_actt": "gelu"}',
     "ScratchDecoderConfig has no field hidden_actt (did you mean hidden_act?)"),
])
def test_a_config_file_is_checked_before_any_work(hf_scratch, corpus, tmp_path, content, refusal):
    # A file that is no JSON object, or no config of ours, failed with a traceback after the tokenizer and data work;
    # a misspelt field in it was kept in the saved config.json, where it did nothing, without a word.
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.json").write_text(content)
    stderr = hf_scratch("train", "--config", tmp_path / "config", "--train-files", corpus, "--output-dir",
                        tmp_path / "out")
    assert f"--config {tmp_path / 'config'}: " in stderr and refusal in stderr, stderr


@pytest.mark.parametrize("files, refusal", [
    ({}, "holds no config.json: not a model folder written by `save_pretrained`"),
    ({"config.json": '{"model_type": "gpt2", "n_embd": 32}'},
     "is a gpt2 model, not one of this package's: convert it first"),
    ({"COMPLETE.json": "{}", "random_states_0.pkl": ""},
     "is an Accelerate checkpoint written before 2026-11-29, which carries no config.json to build its model from: "
     "continue its run with `hf-scratch train-accelerate --resume-from"),
])
def test_a_model_folder_that_cannot_continue_is_refused_before_any_work(hf_scratch, corpus, tmp_path, files, refusal):
    # A tokenizer's folder failed in `from_pretrained` with "Unrecognized model"; a native GPT-2 trained as
    # GPT2LMHeadModel, with a card naming ours and an evaluation loss counted over unshifted labels (62/64 of it); an
    # Accelerate checkpoint of before its config.json was called no model folder of `save_pretrained`.
    (tmp_path / "model").mkdir()
    for name, content in files.items():
        (tmp_path / "model" / name).write_text(content)
    stderr = hf_scratch("train", "--model", tmp_path / "model", "--train-files", corpus, "--output-dir",
                        tmp_path / "out")  # train-accelerate checks with the same function, once Accelerate is up
    assert f"--model {tmp_path / 'model'} " in stderr and refusal in stderr, stderr


def test_a_preset_or_config_of_another_family_than_the_task_is_refused(hf_scratch, corpus, tmp_path):
    # `--task masked-lm --preset gpt-mini` trained a tokenizer, then failed in `AutoModelForMaskedLM.from_config`
    # with a traceback listing fifty native config classes.
    run = ["train", "--train-files", corpus, "--output-dir", tmp_path / "out"]
    assert ("--preset gpt-mini is a preset of the decoder family, but --task masked-lm trains the encoder family: "
            "use one of bert-base, bert-prenorm") in hf_scratch(*run, "--task", "masked-lm", "--preset", "gpt-mini")
    tiny_config("decoder").save_pretrained(tmp_path / "config")
    assert ("is a config of the decoder family (scratch_decoder), but --task seq2seq trains the seq2seq family"
            in hf_scratch(*run, "--task", "seq2seq", "--config", tmp_path / "config"))


class BuiltModel(Exception):
    pass


@pytest.mark.parametrize("command", [["train"], ["train-accelerate", "--cpu"]])
def test_config_file_fields_the_run_replaces_are_named(monkeypatch, capsys, corpus, tmp_path, command):
    # A --config file's special token ids and sizes were replaced by the run's tokenizer's (and --max-length's)
    # without a word: the model trained was not the one the file described.
    from hf_scratch_transformer.cli import main

    def built(tokenizer, config):
        raise BuiltModel(config)

    monkeypatch.setattr(training_data, "keep_the_inputs_the_model_reads", built)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    tiny_config("decoder", pad_token_id=7, max_position_embeddings=512).save_pretrained(tmp_path / "config")
    run = [*command, "--config", str(tmp_path / "config"), "--train-files", str(corpus), "--max-length", "32",
           "--vocab-size", "300"]
    with pytest.raises(BuiltModel) as model:
        main([*run, "--output-dir", str(tmp_path / "out")])
    config = model.value.args[0]
    assert (f"--config {tmp_path / 'config'}: the new model takes from this run's tokenizer and --max-length "
            f"pad_token_id 7 -> {config.pad_token_id}, vocab_size 99 -> {config.vocab_size}, "
            "max_position_embeddings 512 -> 64") in capsys.readouterr().out
    with pytest.raises(BuiltModel) as model:
        main([*run, "--set", "max_position_embeddings=512", "--output-dir", str(tmp_path / "kept")])  # asked for
    assert model.value.args[0].max_position_embeddings == 512
    assert "max_position_embeddings 512" not in capsys.readouterr().out


@pytest.mark.parametrize("command", [["train", "--train-files", "{corpus}"],
                                     ["finetune", "--task", "text-classification", "--train-file", "{corpus}"]])
@pytest.mark.parametrize("broken, refusal", [
    ("config.json", "its config.json is not JSON (Expecting property name"),
    ("model.safetensors", "holds no weights (model.safetensors, model.safetensors.index.json, pytorch_model.bin"),
    ("tokenizer_config.json", "holds no tokenizer (tokenizer.json, tokenizer_config.json, vocab files)"),
])
def test_a_model_folder_without_weights_tokenizer_or_a_json_config_is_refused_before_any_work(
        hf_scratch, corpus, tmp_path, command, broken, refusal):
    # Each was `from_pretrained`'s traceback, finetune's after its data work: "is not a valid JSON file", "no file
    # named model.safetensors", "Couldn't instantiate the backend tokenizer" (a model saved without its tokenizer).
    folder = config_only(tmp_path / "model")
    if broken == "config.json":
        (folder / broken).write_text("{not json")
    else:
        (folder / broken).unlink()
    stderr = hf_scratch(*[corpus if option == "{corpus}" else option for option in command], "--model", folder,
                        "--output-dir", tmp_path / "out")
    assert f"--model {folder}" in stderr and refusal in stderr, stderr
    assert not (tmp_path / "out").exists()


def test_finetune_refuses_a_native_model_it_does_not_convert(hf_scratch, corpus, tmp_path):
    # A native RoBERTa (or any native family with a classifier in transformers) trained as the native class, with a
    # card calling it a Transformer written from scratch.
    folder = config_only(tmp_path / "model")
    (folder / "config.json").write_text('{"model_type": "roberta"}')
    stderr = hf_scratch("finetune", "--model", folder, "--task", "text-classification", "--train-file", corpus,
                        "--output-dir", tmp_path / "out")
    assert (f"--model {folder} is a roberta model, neither one of this package's nor a native model it converts "
            "(bert, gpt2, llama, marian, mistral, qwen2)") in stderr, stderr


def test_finetune_converts_every_native_model_that_from_hf_converts(monkeypatch, tmp_path):
    """A native Llama (Mistral, Qwen2) folder, which `from_hf` converts, was fine-tuned as the native
    LlamaForSequenceClassification, with a card calling it a Transformer written from scratch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_scratch_transformer.cli import main
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    tokenizer = byte_level_bpe()
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id)
                     ).save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"a {animal} runs,{animal}\n" for animal in
                                                                  ("dog", "horse") * 5))
    trained = []

    def train(self, *args, **kwargs):
        trained.append(type(self.model).__name__)
        raise ReachedTraining

    monkeypatch.setattr(CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(ReachedTraining):
        main(["finetune", "--model", str(tmp_path / "llama"), "--task", "text-classification", "--train-file",
              str(tmp_path / "train.csv"), "--output-dir", str(tmp_path / "out")])
    assert trained == ["ScratchDecoderForSequenceClassification"]


def test_tokenizer_refuses_dataset_options_with_files(hf_scratch, corpus, tmp_path):
    # --split, --text-column and --dataset-config were left out without a word: the tokenizer learnt every line.
    stderr = hf_scratch("tokenizer", "--kind", "bpe", "--family", "decoder", "--files", corpus, "--split",
                        "validation", "--text-column", "sentence", "--output-dir", tmp_path / "out")
    assert ("--split, --text-column: options of --dataset, which --files does not use (plain text files have no "
            "configuration, splits or columns)") in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["train", "--task", "masked-lm", "--train-files"],  # `config_only`'s family
                                     ["finetune", "--model", "{model}", "--task", "text-classification",
                                      "--train-file"]])
def test_a_refused_overwrite_leaves_the_earlier_run_as_it_was(hf_scratch, tmp_path, command):
    """--overwrite-output-dir removed the earlier run's checkpoints as the output folder was claimed, before the data
    was read: a mistyped data file then stopped the command, the checkpoints gone and nothing in their place. And a
    --model inside the checkpoints it removes (or the model folder the run replaces) was removed before it was read:
    a traceback."""
    output = tmp_path / "out"
    for folder in ("checkpoints/checkpoint-2", "model"):
        config_only(output / folder)
    before = sorted(path.relative_to(output) for path in output.rglob("*"))
    arguments = [config_only(tmp_path / "base") if option == "{model}" else option for option in command]
    stderr = hf_scratch(*arguments, tmp_path / "trian.txt", "--output-dir", output, "--overwrite-output-dir")
    assert "trian.txt" in stderr
    for held, model in ((output / "checkpoints", output / "checkpoints/checkpoint-2"), (output / "model",) * 2):
        arguments = [option for option in command if option not in ("--model", "{model}")]
        stderr = hf_scratch(*arguments, tmp_path / "corpus.txt", "--model", model, "--output-dir", output,
                            "--overwrite-output-dir")
        assert f"--model {model} lies in {held}, which replacing the earlier run in {output} removes" in stderr
    assert sorted(path.relative_to(output) for path in output.rglob("*") if path.name != ".hf-scratch.lock") == before


@pytest.mark.parametrize("command", [["train"], ["train-accelerate", "--cpu"]])
def test_a_run_refused_after_training_its_tokenizer_leaves_the_output_folder_as_it_was(monkeypatch, capsys, corpus,
                                                                                        tmp_path, command):
    """train-accelerate saved the tokenizer it trained into OUTPUT_DIR/tokenizer at once: a run then refused by the
    model's checks had replaced the earlier run's tokenizer under --overwrite-output-dir, and in a new folder left one
    over which the corrected command was refused ("holds an earlier run (tokenizer)")."""
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    earlier = tmp_path / "earlier"
    (earlier / "tokenizer").mkdir(parents=True)
    (earlier / "tokenizer/tokenizer.json").write_text("the earlier run's")
    for output, overwrite in ((earlier, ["--overwrite-output-dir"]), (tmp_path / "new", [])):
        with pytest.raises(SystemExit) as stopped:
            main([*command, "--train-files", str(corpus), "--vocab-size", "300", "--max-length", "32", "--set",
                  "max_position_embeddings=16", "--output-dir", str(output), *overwrite])
        assert stopped.value.code == 2
        assert "--max-length 32 is longer than the model's 16 learned positions" in capsys.readouterr().err
    assert [path.name for path in earlier.iterdir() if path.name != ".hf-scratch.lock"] == ["tokenizer"]
    assert (earlier / "tokenizer/tokenizer.json").read_text() == "the earlier run's"
    assert not (tmp_path / "new").exists()


def test_a_dataset_configuration_of_a_single_data_file_is_refused(hf_scratch, tmp_path):
    # A single local file is read by its builder alone: --dataset-config was left out without a word.
    data = tmp_path / "pairs.csv"
    data.write_text("text,source,target\n" + "".join(f"line {i},en {i},de {i}\n" for i in range(4)))
    message = f"{data}: a single data file has no configurations, and 'de-en' would be left out"
    assert message in hf_scratch("train", "--dataset", data, "--dataset-config", "de-en", "--output-dir",
                                 tmp_path / "out")
    assert message in hf_scratch("tokenizer", "--kind", "bpe", "--family", "decoder", "--dataset", data,
                                 "--dataset-config", "de-en", "--output-dir", tmp_path / "out")
    assert message in hf_scratch("finetune", "--model", config_only(tmp_path / "model"), "--task",
                                 "text-classification", "--dataset", data, "--dataset-config", "de-en",
                                 "--output-dir", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_validation_file_that_is_also_a_training_file_is_named(hf_scratch, capsys, corpus, tmp_path):
    # The validation loss of the training text passed for one of unseen text, without a word.
    other, source, target = (tmp_path / name for name in ("other.txt", "source.txt", "target.txt"))
    for path in (other, source, target):
        path.write_text(f"{path.stem} text\n\nmore {path.stem} text\n")
    for output, files, note in (
        ("texts", ["--train-files", corpus, "--validation-files", other, corpus], f"--validation-files {corpus}"),
        ("pairs", ["--task", "seq2seq", "--source-files", source, "--target-files", target, "--validation-source",
                   other, "--validation-target", tmp_path / ".." / tmp_path.name / "target.txt"],
         "--validation-target"),
        ("other", ["--train-files", corpus, "--validation-files", other], None),
    ):
        with pytest.raises(ReachedModelWork):
            hf_scratch("train", *files, "--output-dir", tmp_path / output)  # one each: the run holds its lock
        stderr = capsys.readouterr().err
        assert f"note: {note} " in stderr and "is also a training file" in stderr if note else "note:" not in stderr


def test_a_data_file_that_cannot_be_opened_is_named(hf_scratch, corpus, tmp_path):
    # A path through a file (or one the user may not read) stopped the training commands with a NotADirectoryError
    # (PermissionError) traceback; only a missing file was said in one line.
    through = corpus / "part.txt"
    for files in (["--train-files", through],
                  ["--task", "seq2seq", "--source-files", through, "--target-files", corpus]):
        assert f"Not a directory: '{through}'" in hf_scratch("train", *files, "--output-dir", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [["train"], ["train-accelerate", "--cpu"]])
def test_pairs_left_out_for_a_blank_side_are_counted(monkeypatch, capsys, tmp_path, command):
    # By design, a pair with a blank source or target is no example; 2 of 3 validation pairs went without a word.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    files = {"train.en": "one\n\nthree\nfour\n", "train.de": "eins\nzwei\ndrei\nvier\n",
             "valid.en": "a\n\nc\n", "valid.de": " \nB\nC\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit) as stopped:  # stopped as the tokenizer is trained, after the data
        main([*command, "--task", "seq2seq", "--source-files", str(tmp_path / "train.en"), "--target-files",
              str(tmp_path / "train.de"), "--validation-source", str(tmp_path / "valid.en"), "--validation-target",
              str(tmp_path / "valid.de"), "--vocab-size", "100", "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    stderr = capsys.readouterr().err
    for note in ("1 of the 4 training examples", "2 of the 3 validation examples"):
        assert f"note: {note} left out: their source or target is blank or missing" in stderr, stderr


def test_a_file_given_twice_is_refused(hf_scratch, corpus, tmp_path):
    # `--train-files a.txt --train-files a.txt` (or a.txt and ./a.txt) trained on the file twice without a word.
    spelt_again = tmp_path / ".." / tmp_path.name / "corpus.txt"
    source, target, other = (tmp_path / name for name in ("train.en", "train.de", "other.de"))
    for path in (source, target, other):
        path.write_text(f"{path.name} line\n")
    for files, refused in (
        (["--train-files", corpus, "--train-files", corpus], f"--train-files {corpus}: given twice: "),
        (["--train-files", corpus, "--validation-files", spelt_again, spelt_again],
         f"--validation-files {spelt_again}: given twice: "),
        (["--train-files", corpus, spelt_again], f"--train-files {spelt_again}: given twice (first as --train-files "
                                                 f"{corpus}): "),
        (["--task", "seq2seq", "--source-files", source, source, "--target-files", target, target],
         f"--source-files {source} --target-files {target}: given twice: "),
    ):
        assert refused in hf_scratch("train", *files, "--output-dir", tmp_path / "out")
    assert "given twice" in hf_scratch("tokenizer", "--kind", "bpe", "--family", "decoder", "--files", corpus,
                                       spelt_again, "--output-dir", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # One source file beside two target files is two references, and a validation file may be a training file
    with pytest.raises(ReachedModelWork):
        hf_scratch("train", "--task", "seq2seq", "--source-files", source, source, "--target-files", target, other,
                   "--validation-source", source, "--validation-target", target, "--output-dir", tmp_path / "pairs")


class KilledWhileSaving(BaseException):
    """A kill, as far as the code under it can tell: nothing of it runs after."""


def half_saved_tokenizer(monkeypatch, folder: Path) -> Path:
    """`folder` as a kill leaves it while `hf-scratch tokenizer` saves there: tokenizer_config.json moved in, the
    process killed before tokenizer.json (moved last, so that no new config is read over an earlier vocabulary)."""
    from tokenizer_training.saving import save_in_place

    folder.mkdir(parents=True, exist_ok=True)
    move = Path.replace

    def killed_before_the_vocabulary(source, target):
        if Path(target).name == "tokenizer.json":
            raise KilledWhileSaving
        return move(source, target)

    with monkeypatch.context() as patched:
        patched.setattr(Path, "replace", killed_before_the_vocabulary)
        with pytest.raises(KilledWhileSaving):
            save_in_place(byte_level_bpe(), folder, [])
    assert (folder / "tokenizer_config.json").is_file() and not (folder / "tokenizer.json").exists()
    return folder


def test_a_half_saved_tokenizer_given_beside_a_resumed_checkpoint_is_refused_by_name(monkeypatch, capsys, tmp_path):
    """The check that a resumed run's --tokenizer / --model is its checkpoint's loads the given one too: a half-saved
    folder there stopped the command with the traceback the loading of the run's tokenizer no longer gives."""
    from hf_scratch_transformer.cli.run_options import RunParser, refuse_another_tokenizer

    folder = half_saved_tokenizer(monkeypatch, tmp_path / "tokenizer")
    with pytest.raises(SystemExit) as stopped:
        refuse_another_tokenizer(RunParser(prog="hf-scratch train"), folder, byte_level_bpe(), tmp_path / "step-2")
    assert stopped.value.code == 2
    assert f"error: the tokenizer in {folder} cannot be loaded: " in capsys.readouterr().err


@pytest.mark.parametrize("command", [["train"], ["train-accelerate"], ["finetune", "--task", "text-classification"]])
def test_a_tokenizer_folder_a_kill_left_half_saved_is_refused_by_name(monkeypatch, capsys, corpus, tmp_path, command):
    """A tokenizer save killed between its two last moves leaves a folder that `AutoTokenizer` refuses, on purpose;
    given as --tokenizer (or as the tokenizer of a --model folder), it stopped the command with the traceback of
    "Couldn't instantiate the backend tokenizer". It is named now, with the way out (found by randomized kills)."""
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    if command[0] == "finetune":
        folder = half_saved_tokenizer(monkeypatch, tmp_path / "model")
        tiny_lm("decoder", vocab_size=320).save_pretrained(folder)
        data = tmp_path / "train.csv"
        data.write_text("text,label\n" + "".join(f"a {animal} runs,{animal}\n" for animal in ("dog", "horse") * 5))
        arguments = ["--model", folder, "--train-file", data]
    else:
        folder = half_saved_tokenizer(monkeypatch, tmp_path / "tokenizer")
        arguments = ["--tokenizer", folder, "--train-files", corpus, "--max-length", "32"]
    with pytest.raises(SystemExit) as stopped:
        main([*command, *map(str, arguments), "--output-dir", str(tmp_path / "out")])
    stderr = capsys.readouterr().err
    assert stopped.value.code == 2, stderr
    assert f"error: the tokenizer in {folder} cannot be loaded: " in stderr, stderr
    assert "It has tokenizer_config.json but no tokenizer.json, as a tokenizer save stopped midway leaves it" in stderr
