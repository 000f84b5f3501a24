"""Saved folders as Hub users meet them: loaded with `trust_remote_code=True` where the package is not installed,
and driven through `transformers.pipeline`, with tokenizers trained here on local text."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from load_without_package import run_without_package
from tiny_models import tiny_config
from tiny_native import bert, gpt2, llama
from tiny_tokenizers import byte_level_bpe, wordpiece
from transformers import AutoTokenizer, BertConfig, BertForTokenClassification, pipeline, set_seed
from transformers.decision import DecisionConfig

import hf_scratch_transformer as hst
from hf_scratch_transformer.conversion import from_hf

FAMILY_OF = {
    hst.ScratchDecoderConfig: "decoder", hst.ScratchEncoderConfig: "encoder", hst.ScratchSeq2SeqConfig: "seq2seq"
}
HEADS = [(auto, model, FAMILY_OF[config]) for config, pairs in hst.AUTO_CLASSES.items() for auto, model in pairs]
TEXT = "To be, or not to be"


@pytest.fixture(scope="module")
def tokenizers():
    return {
        "decoder": byte_level_bpe(family="decoder"),
        "encoder": wordpiece(),
        "seq2seq": byte_level_bpe(family="seq2seq"),
    }


def _save(model_class, family: str, tokenizer, folder: Path, **overrides) -> Path:
    specials = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    if family != "encoder":
        specials["bos_token_id"] = tokenizer.bos_token_id
    if family == "seq2seq":
        specials["decoder_start_token_id"] = tokenizer.bos_token_id
    torch.manual_seed(0)
    model = model_class(tiny_config(family, vocab_size=len(tokenizer), num_labels=3, **specials, **overrides)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _inputs(family: str, tokenizer) -> dict:
    encoded = tokenizer([TEXT, "Now is the winter"], return_tensors="pt", padding=True)
    inputs = {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask}
    if family == "seq2seq":
        inputs["decoder_input_ids"] = encoded.input_ids[:, :3]
    return inputs


# ---------------------------------------------------------------------------------------------- remote code


def test_every_head_loads_with_trust_remote_code_where_the_package_is_missing(tokenizers, tmp_path):
    jobs, expected = [], []
    for index, (auto_class, model_class, family) in enumerate(HEADS):
        folder = _save(model_class, family, tokenizers[family], tmp_path / f"{index}-{model_class.__name__}")
        config = json.loads((folder / "config.json").read_text())
        assert set(config["auto_map"]) == set(type(tiny_config(family)).family_auto_map)
        inputs = _inputs(family, tokenizers[family])
        if model_class is hst.ScratchEncoderForMultipleChoice:  # the two texts as the choices of one row
            inputs = {name: tensor[None] for name, tensor in inputs.items()}
        with torch.no_grad():
            expected.append(model_class.from_pretrained(folder).eval()(**inputs)[0])
        job = {"folder": str(folder), "auto_class": auto_class.__name__, "inputs": inputs}
        if family == "seq2seq" and auto_class.__name__ == "AutoModelForSeq2SeqLM":
            job.update(pipeline_task=hst.TEXT2TEXT_TASK, text=TEXT, pipeline_kwargs={"max_new_tokens": 6})
        jobs.append(job)
    torch.save(jobs, tmp_path / "jobs.pt")
    completed = run_without_package(tmp_path, tmp_path / "jobs.pt", tmp_path / "results.pt")
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = torch.load(tmp_path / "results.pt")
    for (_, model_class, _), result, reference in zip(HEADS, results, expected, strict=True):
        assert result["class"] == model_class.__name__
        torch.testing.assert_close(result["output"], reference, rtol=0, atol=0)
    seq2seq_pipeline_output = next(r["pipeline"] for r in results if "pipeline" in r)
    assert seq2seq_pipeline_output[0]["generated_text"] == _text2text_reference(tmp_path, tokenizers)


def test_scratch_text2text_takes_a_model_loaded_where_the_package_is_missing(tokenizers, tmp_path):
    """A Hub user who loads the model first (a dtype, a device) hands the object to `pipeline`, as with transformers'
    own tasks. Without the package, the task was known only from a folder's `custom_pipelines`, which `pipeline()`
    reads when given a folder name: with the object it failed with "Unknown task scratch-text2text"."""
    folder = _save(hst.ScratchSeq2SeqForConditionalGeneration, "seq2seq", tokenizers["seq2seq"], tmp_path / "model")
    (tmp_path / "example.py").write_text(
        "import json\n"
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline\n"
        f"model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
        f"translator = pipeline({hst.TEXT2TEXT_TASK!r}, model=model, tokenizer=tokenizer)\n"
        f"print(json.dumps(translator({TEXT!r}, max_new_tokens=6)))\n"
    )
    completed = run_without_package(tmp_path, "--run", tmp_path / "example.py")
    assert completed.returncode == 0, completed.stderr[-3000:]
    expected = pipeline(hst.TEXT2TEXT_TASK, model=str(folder), trust_remote_code=True)(TEXT, max_new_tokens=6)
    assert json.loads(completed.stdout.splitlines()[-1]) == expected


def _text2text_reference(tmp_path, tokenizers) -> str:
    folder = next(tmp_path.glob("*-ScratchSeq2SeqForConditionalGeneration"))
    translator = pipeline(hst.TEXT2TEXT_TASK, model=str(folder), trust_remote_code=True)
    return translator(TEXT, max_new_tokens=6)[0]["generated_text"]


# ---------------------------------------------------------------------------------------------- pipelines


def test_text_generation_pipeline(tokenizers, tmp_path):
    tokenizer = tokenizers["decoder"]
    folder = _save(hst.ScratchDecoderForCausalLM, "decoder", tokenizer, tmp_path)
    generator = pipeline("text-generation", model=str(folder))
    text = generator(TEXT, max_new_tokens=6, do_sample=False)[0]["generated_text"]
    model = hst.ScratchDecoderForCausalLM.from_pretrained(folder)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert text == tokenizer.decode(expected[0], skip_special_tokens=True)
    assert text.startswith(TEXT)


def test_fill_mask_pipeline(tokenizers, tmp_path):
    tokenizer = tokenizers["encoder"]
    folder = _save(hst.ScratchEncoderForMaskedLM, "encoder", tokenizer, tmp_path, sparse_prediction=True)
    predictions = pipeline("fill-mask", model=str(folder))(f"To be, or not to {tokenizer.mask_token}", top_k=3)
    assert len(predictions) == 3
    model = hst.ScratchEncoderForMaskedLM.from_pretrained(folder).eval()
    encoded = tokenizer(f"To be, or not to {tokenizer.mask_token}", return_tensors="pt")
    position = (encoded.input_ids[0] == tokenizer.mask_token_id).nonzero().item()
    best = model(**encoded).logits[0, position].argmax().item()
    assert predictions[0]["token"] == best


@pytest.mark.parametrize("model_class, family", [(hst.ScratchDecoderForSequenceClassification, "decoder"),
                                                 (hst.ScratchEncoderForSequenceClassification, "encoder")])
def test_text_classification_pipeline(tokenizers, tmp_path, model_class, family):
    tokenizer = tokenizers[family]
    folder = _save(model_class, family, tokenizer, tmp_path)
    result = pipeline("text-classification", model=str(folder))(TEXT)[0]
    model = model_class.from_pretrained(folder).eval()
    probabilities = model(**tokenizer(TEXT, return_tensors="pt")).logits.softmax(-1)[0]
    assert result["label"] == model.config.id2label[probabilities.argmax().item()]
    assert result["score"] == pytest.approx(probabilities.max().item(), rel=1e-5)


def test_token_classification_pipeline(tokenizers, tmp_path):
    tokenizer = tokenizers["encoder"]
    folder = _save(hst.ScratchEncoderForTokenClassification, "encoder", tokenizer, tmp_path)
    entities = pipeline("token-classification", model=str(folder))(TEXT)
    model = hst.ScratchEncoderForTokenClassification.from_pretrained(folder).eval()
    encoded = tokenizer(TEXT, return_tensors="pt")
    labels = model(**encoded).logits[0].argmax(-1)[1:-1]  # without [CLS] and [SEP]
    assert [entity["entity"] for entity in entities] == [model.config.id2label[i.item()] for i in labels]


def _pipelines(task: str, models: dict, tokenizer, folder: Path) -> list:
    """`task`'s pipeline on each model of {name: model}, saved with `tokenizer` as a user saves it."""
    for name, model in models.items():
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    return [pipeline(task, model=str(folder / name)) for name in models]


def _same_answers(theirs, ours) -> None:
    """Equal texts, tokens and labels; scores to fp32 rounding."""
    if isinstance(theirs, list):
        for a, b in zip(theirs, ours, strict=True):
            _same_answers(a, b)
    elif isinstance(theirs, dict):
        assert theirs.keys() == ours.keys()
        for key in theirs:
            _same_answers(theirs[key], ours[key])
    elif isinstance(theirs, float | np.floating):  # the pipelines' scores are numpy's
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    else:
        assert ours == theirs


@pytest.mark.parametrize("make_native", [gpt2, llama], ids=["gpt2", "llama"])
def test_text_generation_pipeline_answers_as_the_native_model(tokenizers, tmp_path, make_native):
    """The same weights through the same pipeline: a batch of prompts padded to each other (`batch_size=2`), beams
    with several sequences, seeded sampling and `return_full_text=False` give the native model's texts."""
    tokenizer = tokenizers["decoder"]
    torch.manual_seed(0)
    native = make_native(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    prompts = [TEXT, "Now is the winter of our discontent", "O"]
    calls = [(prompts, dict(max_new_tokens=6, batch_size=2)),
             (TEXT, dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, return_full_text=False)),
             (prompts, dict(max_new_tokens=6, batch_size=2, do_sample=True, top_k=20, num_return_sequences=2))]
    theirs, ours = _pipelines("text-generation", {"native": native, "ours": from_hf(native)}, tokenizer, tmp_path)
    for inputs, options in calls:
        answers = []
        for generator in (theirs, ours):
            set_seed(0)
            answers.append(generator(inputs, **options))
        _same_answers(*answers)


DECISION_REQUEST = {
    "state": "I was charged twice for my order and want a refund.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Is a refund requested?"},
        "mood": {"type": "choice", "instructions": "The mood?", "criteria": {"angry": "upset", "calm": "fine"}},
        "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
    },
}


@pytest.mark.parametrize("make_native, positions", [(gpt2, "n_positions"), (llama, "max_position_embeddings")],
                         ids=["gpt2", "llama"])
def test_decision_pipeline_answers_as_the_native_model(tokenizers, tmp_path, make_native, positions):
    """transformers 5.25's `pipeline("decision")` (System One's typed questions, which `/v1/systemone` answers with)
    scores each option by the next-token logit of its label, through the tokenizer's chat template: a saved folder of
    ours, its decision settings beside it (`decision.json`: labels that are single tokens of this vocabulary), gives
    the native model's answers and probabilities, for yes/no, choice and score questions."""
    tokenizer = copy.deepcopy(tokenizers["decoder"])
    tokenizer.chat_template = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
                               "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    torch.manual_seed(0)
    native = make_native(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, **{positions: 512},
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    models = {"native": native, "ours": from_hf(native)}
    for name in models:
        DecisionConfig(labels={"noul": ["Y", "N"]}).save_pretrained(tmp_path / name)
    theirs, ours = _pipelines("decision", models, tokenizer, tmp_path)
    answers = theirs(DECISION_REQUEST)
    assert answers.keys() == DECISION_REQUEST["questions"].keys()
    _same_answers(answers, ours(DECISION_REQUEST))


def test_fill_mask_and_token_classification_pipelines_answer_as_bert(tokenizers, tmp_path):
    """BERT's weights through the same pipelines: fill-mask with several masks, `targets` and a batch, and
    token-classification with each aggregation, give BERT's tokens, labels and scores."""
    tokenizer, mask = tokenizers["encoder"], tokenizers["encoder"].mask_token
    torch.manual_seed(0)
    native = bert(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    converted = from_hf(native)
    theirs, ours = _pipelines("fill-mask", {"native": native, "ours": converted}, tokenizer, tmp_path / "masked")
    for inputs, options in [(f"To {mask}, or not to {mask}.", dict(top_k=3)),
                            (f"To be, or not to {mask}.", dict(targets=["be", "the", "king"])),
                            ([f"To {mask}, or not", f"Now is the {mask} of our discontent"], dict(batch_size=2))]:
        _same_answers(theirs(inputs, **options), ours(inputs, **options))
    labels = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    head = dict(num_labels=5, id2label=labels, label2id={label: i for i, label in labels.items()})
    native_tagger = BertForTokenClassification(BertConfig(**native.config.to_dict() | head)).eval()
    ours_tagger = from_hf(native_tagger)
    theirs, ours = _pipelines("token-classification", {"native": native_tagger, "ours": ours_tagger}, tokenizer,
                              tmp_path / "tokens")
    for aggregation in ("none", "simple", "first", "max", "average"):
        _same_answers(theirs(TEXT, aggregation_strategy=aggregation, ignore_labels=[]),
                      ours(TEXT, aggregation_strategy=aggregation, ignore_labels=[]))


def test_scratch_text2text_pipeline(tokenizers, tmp_path):
    tokenizer = tokenizers["seq2seq"]
    folder = _save(hst.ScratchSeq2SeqForConditionalGeneration, "seq2seq", tokenizer, tmp_path)
    assert json.loads((folder / "config.json").read_text())["custom_pipelines"] == (
        hst.ScratchSeq2SeqConfig.family_custom_pipelines)
    assert (folder / "pipeline_scratch_text2text.py").exists()
    # A folder that declares `custom_pipelines` always asks for `trust_remote_code` (transformers reads the
    # declaration before its registry); the pipeline class then comes from the folder.
    translator = pipeline(hst.TEXT2TEXT_TASK, model=str(folder), trust_remote_code=True)
    assert type(translator).__name__ == "ScratchText2TextPipeline"
    outputs = translator([TEXT, "Now is the winter"], max_new_tokens=6, num_beams=2, num_return_sequences=2)
    model = hst.ScratchSeq2SeqForConditionalGeneration.from_pretrained(folder)
    expected = model.generate(**tokenizer(TEXT, return_tensors="pt"), max_new_tokens=6, num_beams=2,
                              num_return_sequences=2)
    assert [o["generated_text"] for o in outputs[0]] == [
        t.strip() for t in tokenizer.batch_decode(expected, skip_special_tokens=True)]
    assert len(outputs) == 2 and len(outputs[1]) == 2
    # Batched (two inputs a batch, the third alone), each input keeps its own sequences.
    texts = [TEXT, "Now is the winter", "O Romeo"]
    settings = dict(max_new_tokens=6, num_beams=2, num_return_sequences=2)
    assert translator(texts, batch_size=2, **settings) == [translator(text, **settings) for text in texts]


def test_scratch_text2text_pipeline_with_generate_asked_for_a_dict(tokenizers, tmp_path):
    """`return_dict_in_generate=True` (passed, or in the model's generation config) makes `generate()` return a
    `ModelOutput`: the pipeline still returns the texts, as transformers' own generating pipelines do."""
    folder = _save(hst.ScratchSeq2SeqForConditionalGeneration, "seq2seq", tokenizers["seq2seq"], tmp_path)
    translator = pipeline(hst.TEXT2TEXT_TASK, model=str(folder), trust_remote_code=True)
    settings = dict(max_new_tokens=6, num_beams=2, num_return_sequences=2)
    expected = translator([TEXT, "O Romeo"], **settings)
    assert translator([TEXT, "O Romeo"], return_dict_in_generate=True, output_scores=True, **settings) == expected
    translator.model.generation_config.return_dict_in_generate = True
    assert translator([TEXT, "O Romeo"], batch_size=2, **settings) == expected


def test_scratch_text2text_pipeline_truncates_sources_when_asked(tokenizers, tmp_path):
    """`truncation=True`, as transformers' removed text2text pipeline took it, cuts each source at the tokenizer's
    `model_max_length`: it reached `generate()` and failed there as a model kwarg that is not used."""
    tokenizers["seq2seq"].save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, model_max_length=5)
    torch.manual_seed(0)
    model = hst.ScratchSeq2SeqForConditionalGeneration(tiny_config("seq2seq", vocab_size=len(tokenizer))).eval()
    translator = pipeline(hst.TEXT2TEXT_TASK, model=model, tokenizer=tokenizer)
    settings = dict(max_new_tokens=4, num_beams=1, do_sample=False)
    source = "Now is the winter of our discontent"
    cut = tokenizer(source, truncation=True, return_tensors="pt")
    assert cut.input_ids.shape[-1] == 5 < len(tokenizer(source).input_ids)
    expected = tokenizer.decode(model.generate(**cut, **settings)[0], skip_special_tokens=True).strip()
    assert translator([source, TEXT], truncation=True, batch_size=2, **settings)[0] == [{"generated_text": expected}]
    assert translator(source, max_source_length=5, **settings) == [{"generated_text": expected}]
    uncut = tokenizer.decode(model.generate(**tokenizer(source, return_tensors="pt"), **settings)[0],
                             skip_special_tokens=True).strip()
    assert uncut != expected
    assert translator(source, truncation=False, **settings) == [{"generated_text": uncut}]
    assert translator(source, **settings) == [{"generated_text": uncut}]  # cut only when asked


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_scratch_text2text_default_length_stays_within_absolute_positions(tokenizers, tmp_path, positions):
    """The pipeline's default of 256 new tokens is more than a model with 128 absolute positions (`hf-scratch train
    --task seq2seq`'s default) can decode: a call without a length failed at position 128 whenever no EOS came first.
    The default stops at the last position instead; a length the caller gives is theirs."""
    tokenizer = tokenizers["seq2seq"]
    folder = _save(hst.ScratchSeq2SeqForConditionalGeneration, "seq2seq", tokenizer, tmp_path,
                   max_position_embeddings=16, position_embedding_type=positions, initializer_range=0.5)
    translator = pipeline(hst.TEXT2TEXT_TASK, model=str(folder), trust_remote_code=True)
    model = hst.ScratchSeq2SeqForConditionalGeneration.from_pretrained(folder)
    expected = model.generate(**tokenizer(TEXT, return_tensors="pt"), max_new_tokens=16, num_beams=4)
    assert translator(TEXT)[0]["generated_text"] == tokenizer.decode(expected[0], skip_special_tokens=True).strip()
    with pytest.raises(ValueError, match="reaches position 16"):
        translator(TEXT, max_new_tokens=17, eos_token_id=None)


def test_scratch_text2text_pipeline_drafts_with_its_assistant_model(tokenizers):
    """`pipeline(..., assistant_model=...)` loads the assistant (transformers' `Pipeline.__init__`); the pipeline must
    hand it to `generate()`, as the text-generation pipeline does: it was kept and never used."""
    config = tiny_config("seq2seq", vocab_size=len(tokenizers["seq2seq"]))
    torch.manual_seed(0)
    model = hst.ScratchSeq2SeqForConditionalGeneration(config).eval()
    assistant = hst.ScratchSeq2SeqForConditionalGeneration(config).eval()
    drafts = []
    assistant.register_forward_hook(lambda *_: drafts.append(1))
    settings = dict(max_new_tokens=5, num_beams=1, do_sample=False)
    translator = pipeline(hst.TEXT2TEXT_TASK, model=model, tokenizer=tokenizers["seq2seq"], assistant_model=assistant)
    plain = pipeline(hst.TEXT2TEXT_TASK, model=model, tokenizer=tokenizers["seq2seq"])
    assert translator(TEXT, **settings) == plain(TEXT, **settings)  # greedy verification: the same text
    assert drafts


@pytest.mark.parametrize("model_class, family", [(hst.ScratchSeq2SeqModel, "seq2seq"),
                                                 (hst.ScratchDecoderForCausalLM, "decoder")])
def test_scratch_text2text_pipeline_refuses_a_model_that_does_not_translate(tokenizers, model_class, family):
    """A model without an LM head failed with AttributeError ('_generation_defaults', or '_generate_kwargs' at the
    first call), and a decoder-only one answered its own source followed by a continuation as the "translation"."""
    model = model_class(tiny_config(family, vocab_size=len(tokenizers["seq2seq"]))).eval()
    with pytest.raises(ValueError, match=f"encoder-decoder .* {model_class.__name__}"):
        pipeline(hst.TEXT2TEXT_TASK, model=model, tokenizer=tokenizers["seq2seq"])


def test_saved_tokenizer_loads_with_auto_tokenizer(tokenizers, tmp_path):
    folder = _save(hst.ScratchDecoderForCausalLM, "decoder", tokenizers["decoder"], tmp_path)
    assert AutoTokenizer.from_pretrained(folder)(TEXT).input_ids == tokenizers["decoder"](TEXT).input_ids


def test_scratch_text2text_task_is_registered_for_models_built_here(tokenizers):
    config = tiny_config("seq2seq", vocab_size=len(tokenizers["seq2seq"]))
    model = hst.ScratchSeq2SeqForConditionalGeneration(config).eval()
    translator = pipeline(hst.TEXT2TEXT_TASK, model=model, tokenizer=tokenizers["seq2seq"])
    assert isinstance(translator, hst.ScratchText2TextPipeline)
    assert isinstance(translator(TEXT, max_new_tokens=3)[0]["generated_text"], str)
