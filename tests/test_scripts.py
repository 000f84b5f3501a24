"""The command-line scripts end to end, at tiny sizes and step budgets: the main job (`scripts/train.py`) for
the three tasks, resuming, and fine-tuning (`scripts/finetune.py`) of ours and of a converted BERT."""

import ast
import gc
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import transformers
from datasets import ClassLabel, Dataset, Features, Value
from forked_python import run_python
from huggingface_hub import ModelCard
from tiny_models import tiny_config, tiny_lm
from tiny_texts import choice_rows, squad_rows, words, write_json_lines
from tiny_tokenizers import byte_level_bpe, wordpiece, write_run_corpus
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    pipeline,
)

import hf_scratch_transformer
from hf_scratch_transformer import hub, training
from hf_scratch_transformer.cli.run_data import dataset_name
from hf_scratch_transformer.cli.run_options import config_override
from hf_scratch_transformer.conversion import to_hf

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = ["--set", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"]
TINY_RUN = ["--max-length", "32", "--batch-size", "4", "--vocab-size", "300", "--eval-steps", "2",
            "--max-eval-samples", "16"]
GIVEN_TOKENIZER_RUN = [option for option in TINY_RUN if option not in ("--vocab-size", "300")]  # none trained


def run_script(name: str, *arguments, cwd: Path, returncode: int = 0) -> str:
    """Runs scripts/NAME, expecting `returncode`; returns its output (stdout, then stderr)."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = run_python([sys.executable, str(ROOT / "scripts" / name), *map(str, arguments)], cwd=cwd, env=env,
                        timeout=600)
    assert result.returncode == returncode, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def causal_lm_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("causal")
    stdout = run_script("train.py", "--max-steps", 4, "--output-dir", output, *TINY_RUN, *TINY_MODEL, cwd=output)
    return output, stdout


@pytest.mark.parametrize("script", ["train.py", "train_accelerate.py"])
def test_a_max_length_past_the_models_positions_is_refused_before_the_data(causal_lm_run, script, tmp_path):
    """gpt-mini's learned positions (64 here): longer blocks failed at the first training step, after tokenizing."""
    output, _ = causal_lm_run
    stderr = run_script(script, "--model", output / "model", "--max-length", 100, "--output-dir", tmp_path / "run",
                        cwd=tmp_path, returncode=2)
    assert "--max-length 100 is longer than the model's 64 learned positions (max_position_embeddings)" in stderr
    assert "Traceback" not in stderr and "tokenizing" not in stderr


def test_main_job_writes_a_hub_ready_folder_and_samples_from_it(causal_lm_run):
    output, stdout = causal_lm_run
    folder = output / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "loss_curve.png",
                 "eval_results.json", "modeling_scratch_decoder.py", "configuration_scratch.py"):
        assert (folder / name).exists(), name
    results = json.loads((folder / "eval_results.json").read_text())
    assert results["perplexity"] == pytest.approx(torch.tensor(results["loss"]).exp().item(), rel=1e-4)
    card = ModelCard.load(folder / "README.md")
    assert card.data.eval_results[0].metric_value is not None and "gpt-mini" in card.text
    assert "| eval_sequences | 16 |" in card.text  # --max-eval-samples: the card says what its figures measured
    assert "sample from the reloaded model:\nROMEO:" in stdout
    assert "pin_memory" not in stdout  # no warning about pinned memory where no GPU takes the batches
    assert isinstance(AutoModelForCausalLM.from_pretrained(folder), hf_scratch_transformer.ScratchDecoderForCausalLM)


@pytest.mark.parametrize("script", ["train.py", "train_accelerate.py"])
def test_packing_documents_longer_than_a_block_does_not_warn_of_indexing_errors(script, tmp_path):
    """The main job printed transformers' "Token indices sequence length is longer than the specified maximum sequence
    length for this model (1006 > 32). Running this sequence through the model will result in indexing errors" as it
    tokenized Tiny Shakespeare, though packing cuts the documents into blocks of --max-length. (The data is a new
    file: `datasets` replays the tokenizing of data it has seen from its cache, without the tokenizer's warning.)"""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(words(12, seed=i)) for i in range(40)))  # 60 words a paragraph
    output = run_script(script, "--train-files", corpus, "--output-dir", tmp_path / "run", "--max-steps", 1,
                        "--max-length", 32, "--batch-size", 4, "--vocab-size", 300, *TINY_MODEL, cwd=tmp_path)
    assert "Token indices sequence length" not in output


def test_training_resumes_from_the_last_checkpoint(causal_lm_run, tmp_path):
    output, _ = causal_lm_run
    run_tokenizer = (output / "checkpoints/checkpoint-4/tokenizer.json").read_text()
    wordpiece().save_pretrained(tmp_path / "other")  # another vocabulary would change the ids under the weights
    refused = run_script("train.py", "--max-steps", 6, "--output-dir", output, "--resume", "--tokenizer",
                         tmp_path / "other", *GIVEN_TOKENIZER_RUN, *TINY_MODEL, cwd=output, returncode=2)
    assert f"the tokenizer of {tmp_path / 'other'} differs from the one" in refused and "Traceback" not in refused
    stdout = run_script("train.py", "--max-steps", 6, "--output-dir", output, "--resume", *TINY_RUN, *TINY_MODEL,
                        cwd=output)
    assert "tokenizer: the run's own, from" in stdout  # not trained again
    assert (output / "model/tokenizer.json").read_text() == run_tokenizer
    state = json.loads(next((output / "checkpoints").glob("checkpoint-6")).joinpath("trainer_state.json").read_text())
    steps = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert steps[0] == 1 and steps[-1] == 6 and len(steps) == len(set(steps)), "history continued, not restarted"


def test_training_continues_from_a_saved_model_folder(causal_lm_run, tmp_path):
    output, _ = causal_lm_run
    before = AutoModelForCausalLM.from_pretrained(output / "model")
    run_script("train.py", "--model", output / "model", "--max-steps", 2, "--output-dir", tmp_path,
               *GIVEN_TOKENIZER_RUN, cwd=tmp_path)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert after.config.vocab_size == before.config.vocab_size  # same tokenizer and architecture, trained further
    assert not torch.equal(after.lm_head.weight, before.lm_head.weight)


def test_trains_help_example_of_continuing_a_saved_folder_runs_as_written(causal_lm_run, tmp_path):
    """`hf-scratch train --help` showed `hf-scratch train --model outputs/causal-lm/model --max-steps 200`, into the
    default --output-dir, outputs/causal-lm: the run that saved that folder, so the example always stopped with
    "outputs/causal-lm holds an earlier run"."""
    output, _ = causal_lm_run
    shutil.copytree(output, tmp_path / "outputs/causal-lm")  # what the help's first example, `hf-scratch train`, left
    docstring = ast.get_docstring(ast.parse((ROOT / "hf_scratch_transformer/cli/train.py").read_text()))
    example = next(line for line in docstring.replace("\\\n", " ").splitlines() if " --model " in line)
    arguments = shlex.split(example, comments=True)[2:]  # after `hf-scratch train`
    run_script("train.py", *arguments, "--max-steps", 2, *GIVEN_TOKENIZER_RUN, cwd=tmp_path)  # the later value wins
    assert (tmp_path / arguments[arguments.index("--output-dir") + 1] / "model/model.safetensors").is_file()


def test_masked_lm_training(tmp_path):
    corpus = tmp_path / "corpus.txt"
    # 90 words a paragraph: longer than the model's 64 positions, as the first validation line, which the sample at
    # the end masks (it failed with a traceback after the folder was saved).
    corpus.write_text("\n\n".join(" ".join(words(18, seed=i)) for i in range(300)))
    # 13 evaluation examples in batches of 4: the last batch is short (the default corpus's 362 in 16s is too), and
    # its one example has several masked tokens.
    stdout = run_script("train.py", "--task", "masked-lm", "--train-files", corpus, "--max-steps", 4, "--output-dir",
                        tmp_path, *TINY_RUN, *TINY_MODEL, "--max-eval-samples", 13, cwd=tmp_path)
    results = json.loads((tmp_path / "model/eval_results.json").read_text())
    assert 0.0 <= results["mlm_accuracy"] <= 1.0
    assert "fill-mask: " in stdout
    # Every evaluation masks the same tokens: the final one of the last weights is the one of step 4, to the bit (from
    # the global RNG, it gave another loss).
    state = json.loads((tmp_path / "checkpoints/checkpoint-4/trainer_state.json").read_text())
    last = next(entry for entry in state["log_history"] if entry["step"] == 4 and "eval_loss" in entry)
    assert (last["eval_loss"], last["eval_mlm_accuracy"]) == (results["loss"], results["mlm_accuracy"])
    # Resumed from step 2, the run keeps its WordPiece vocabulary (trained again, it comes out differently).
    shutil.rmtree(tmp_path / "checkpoints/checkpoint-4")
    run_script("train.py", "--task", "masked-lm", "--train-files", corpus, "--max-steps", 4, "--output-dir", tmp_path,
               *TINY_RUN, *TINY_MODEL, "--max-eval-samples", 13, "--resume", cwd=tmp_path)
    assert (tmp_path / "model/tokenizer.json").read_text() == \
        (tmp_path / "checkpoints/checkpoint-2/tokenizer.json").read_text()


def test_a_masked_lm_evaluation_that_masked_nothing_reports_no_figures(tmp_path):
    """One validation word, not masked at 15%: the loss was 0 / 0, and eval_results.json held NaN (no JSON reader
    takes it) and an accuracy of 0.0 over no token."""
    corpus, validation = tmp_path / "corpus.txt", tmp_path / "validation.txt"
    corpus.write_text("\n\n".join(" ".join(words(8, seed=i)) for i in range(100)))
    validation.write_text("man")  # masked at 15% or not, the same every time (seeded): here not
    stdout = run_script("train.py", "--task", "masked-lm", "--train-files", corpus, "--validation-files", validation,
                        "--max-steps", 1, "--output-dir", tmp_path, *TINY_RUN, *TINY_MODEL, cwd=tmp_path)
    assert "no token of the 1 validation sequences was masked" in stdout
    assert json.loads((tmp_path / "model/eval_results.json").read_text()) == {}
    assert "model-index" not in (tmp_path / "model/README.md").read_text()


def test_seq2seq_training_with_the_seed_recipe(tmp_path):
    # 75 words a sentence, past the model's 64 positions: training truncates them to --max-length, and so must the
    # sample translated at the end (it failed with a traceback after the folder was saved).
    sources = [" ".join([sentence] * 15) for sentence in words(120, seed=1)]
    (tmp_path / "train.src").write_text("\n".join(sources))
    (tmp_path / "train.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in sources))
    stdout = run_script(
        "train.py", "--task", "seq2seq", "--source-files", tmp_path / "train.src", "--target-files",
        tmp_path / "train.tgt", "--recipe", "vaswani", "--warmup-steps", 2, "--max-steps", 4, "--num-beams", 2,
        "--output-dir", tmp_path, *TINY_RUN, "--set", "encoder_layers=1", "decoder_layers=1", "hidden_size=32",
        "num_attention_heads=2", "intermediate_size=64", cwd=tmp_path)
    results = json.loads((tmp_path / "model/eval_results.json").read_text())
    assert {"bleu", "chrf", "loss"} <= set(results)
    assert "translation:" in stdout
    assert "note: --max-length 32 cuts 114 of the 114 sources and 114 of the 114 targets" in stdout
    card = ModelCard.load(tmp_path / "model/README.md")
    assert "label_smoothing" in card.text and "inverse_sqrt" in card.text
    assert card.data.datasets is None  # local files: not linked as the Hub dataset "train"
    assert "Files: `train.src`, `train.tgt`" in card.text  # both sides (it named the source files only)
    # Seq2SeqTrainer's evaluation wrote every legacy generation default (max_length 20, greedy, top_k 50) into the
    # model's generation config, which the folder shipped: generate() and the pipeline then decoded with them.
    shipped = json.loads((tmp_path / "model/generation_config.json").read_text())
    assert not {"max_length", "num_beams", "top_k"} & set(shipped), shipped


def test_finetune_text_classification_from_our_masked_lm(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(words(100, seed=2)))
    run_script("train.py", "--task", "masked-lm", "--train-files", corpus, "--max-steps", 2, "--output-dir",
               tmp_path / "mlm", *TINY_RUN, *TINY_MODEL, cwd=tmp_path)
    rows = ["text,label"] + _animal_rows(80, 3)
    (tmp_path / "train.csv").write_text("\n".join(rows))
    # --dataset as a single local file (load_dataset looked for its name on the Hub)
    stdout = run_script("finetune.py", "--model", tmp_path / "mlm/model", "--task", "text-classification",
                        "--dataset", tmp_path / "train.csv", "--max-steps", 4, "--batch-size", 8,
                        "--output-dir", tmp_path / "cls", cwd=tmp_path)
    assert "accuracy" in stdout and "f1" in stdout and "pin_memory" not in stdout
    # The saved pipelines truncate as the run did: at its 64 tokens (the model's positions), not the base's 32 (a
    # token classifier's pipeline left the words past 32 tokens unlabelled).
    assert AutoTokenizer.from_pretrained(tmp_path / "mlm/model").model_max_length == 32
    assert AutoTokenizer.from_pretrained(tmp_path / "cls/model").model_max_length == 64
    # Tokenizing with truncation left it on in the saved tokenizer.json, cutting every text for `tokenizers` users
    assert json.loads((tmp_path / "cls/model/tokenizer.json").read_text())["truncation"] is None
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "cls/model")
    assert isinstance(model, hf_scratch_transformer.ScratchEncoderForSequenceClassification)
    assert set(model.config.id2label.values()) == {"animal", "other"}
    # bert-prenorm has no token types: its tokenizer gave the second text of a pair segment ids 1, which the model
    # refuses, so every pair (text_pair, zero-shot classification, cross-encoders) failed. The folders' tokenizers
    # give none, the pre-trained one's as the classifier's.
    for folder in ("mlm/model", "cls/model"):
        assert "token_type_ids" not in AutoTokenizer.from_pretrained(tmp_path / folder)("a dog", "a horse")
    pair = pipeline("text-classification", model=str(tmp_path / "cls/model"))({"text": "a dog", "text_pair": "a horse"})
    assert pair["label"] in {"animal", "other"}
    # Hub-ready as the main job's folder: a card with the model's class, its metrics and the run (was missing, so
    # `hf-scratch publish` refused the folder).
    plan = dict(hub.upload_plan(tmp_path / "cls/model"))
    assert {"README.md", "config.json", "model.safetensors", "loss_curve.png"} <= set(plan)
    card = ModelCard.load(tmp_path / "cls/model/README.md")
    assert card.data.pipeline_tag == "text-classification"
    assert {result.metric_name for result in card.data.eval_results} == {"Accuracy", "Macro F1", "Eval loss"}
    assert card.data.datasets is None  # a local file: not linked as the Hub dataset "train"
    assert "(`ScratchEncoderForSequenceClassification`)" in card.text and "| steps_trained | 4 |" in card.text
    # The figures' data: the card's "Dataset" column names the training file, which they were not measured on
    assert "| evaluated_on | 10% of the training data, held out: 8 examples |" in card.text
    assert "# scratch-text-classification-train\n" in card.text and str(tmp_path / "train.csv") not in card.text


def test_a_local_dataset_is_named_by_its_file_or_folder(tmp_path):
    """A card and a default repo id name a --dataset: a local path would put its folders (and slashes) in both."""
    (tmp_path / "reviews.csv").write_text("text,label\n")
    assert dataset_name(str(tmp_path / "reviews.csv")) == "reviews"
    assert dataset_name(str(tmp_path)) == tmp_path.name
    assert dataset_name("stanfordnlp/imdb") == "stanfordnlp/imdb"


def test_finetune_text_classification_from_our_causal_lm_scores_texts_independently_of_their_batch(
        causal_lm_run, tmp_path):
    """The causal LM's tokenizer pads on the left (for generation) and gpt-mini's positions are absolute: the
    classifier's folder pads on the right, so a text's score is the same alone and in a batch of longer ones."""
    rows = ["text,label"] + _animal_rows(40, 3)
    (tmp_path / "train.csv").write_text("\n".join(rows))
    run_script("finetune.py", "--model", causal_lm_run[0] / "model", "--task", "text-classification",
               "--train-file", tmp_path / "train.csv", "--max-steps", 2, "--batch-size", 8,
               "--output-dir", tmp_path / "cls", cwd=tmp_path)
    classifier = pipeline("text-classification", model=str(tmp_path / "cls/model"), top_k=None)
    assert classifier.tokenizer.padding_side == "right"
    assert isinstance(classifier.model, hf_scratch_transformer.ScratchDecoderForSequenceClassification)
    texts = ["a dog", "the red horse walks down the big street", "the woman sees"]
    alone = [classifier(text)[0] for text in texts]
    batched = classifier(texts, batch_size=3)
    for one, together in zip(alone, batched, strict=True):
        assert [entry["label"] for entry in one] == [entry["label"] for entry in together]
        assert [entry["score"] for entry in one] == pytest.approx([entry["score"] for entry in together], abs=1e-5)


def test_finetune_tags_words_and_answers_questions_with_our_causal_lm(causal_lm_run, tmp_path):
    """The decoder's token classifier and question answerer, as GPT-2's: each token read after the tokens before it.
    The tagger's folder pads on the right, so a sentence's tags are the same alone and in a batch of longer ones; the
    question answerer is scored by SQuAD's exact match and F1."""
    tagged = [{"tokens": s.split(), "tags": ["B-ANIMAL" if w in ("dog", "horse") else "O" for w in s.split()]}
              for s in words(40, 4)]
    run_script("finetune.py", "--model", causal_lm_run[0] / "model", "--task", "token-classification",
               "--train-file", write_json_lines(tmp_path / "tags.json", tagged), "--label-column", "tags",
               "--max-steps", 2, "--batch-size", 8, "--output-dir", tmp_path / "ner", cwd=tmp_path)
    tagger = pipeline("token-classification", model=str(tmp_path / "ner/model"))
    assert isinstance(tagger.model, hf_scratch_transformer.ScratchDecoderForTokenClassification)
    assert tagger.tokenizer.padding_side == "right"
    texts = ["a dog", "the red horse walks down the big street", "the woman sees"]
    for one, together in zip([tagger(text) for text in texts], tagger(texts, batch_size=3), strict=True):
        assert [entry["entity"] for entry in one] == [entry["entity"] for entry in together]
        assert [entry["score"] for entry in one] == pytest.approx([entry["score"] for entry in together], abs=1e-5)
    results = json.loads((tmp_path / "ner/model/eval_results.json").read_text())
    assert set(results) == {"loss", "accuracy", "f1", "entity_precision", "entity_recall", "entity_f1"}
    run_script("finetune.py", "--model", causal_lm_run[0] / "model", "--task", "question-answering", "--train-file",
               write_json_lines(tmp_path / "squad.json", squad_rows(40, seed=8)), "--max-length", 24, "--max-steps", 2,
               "--batch-size", 8, "--output-dir", tmp_path / "qa", cwd=tmp_path)
    answerer = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa/model")
    assert isinstance(answerer, hf_scratch_transformer.ScratchDecoderForQuestionAnswering)
    results = json.loads((tmp_path / "qa/model/eval_results.json").read_text())
    assert set(results) == {"loss", "exact_match", "f1"} and 0 <= results["exact_match"] <= results["f1"] <= 100
    assert ModelCard.load(tmp_path / "qa/model/README.md").data.pipeline_tag == "question-answering"


@pytest.mark.parametrize("native_class", [BertForMaskedLM, BertForTokenClassification])
def test_finetune_token_classification_from_a_converted_native_bert(native_class, tmp_path):
    _native_bert_folder(tmp_path / "bert", native_class)
    rows = [{"tokens": s.split(), "tags": ["ANIMAL" if w in ("dog", "horse") else "O" for w in s.split()]}
            for s in words(60, 4)]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(row) for row in rows))
    stdout = run_script("finetune.py", "--model", tmp_path / "bert", "--task", "token-classification",
                        "--train-file", tmp_path / "train.json", "--label-column", "tags", "--max-steps", 4,
                        "--output-dir", tmp_path / "ner", cwd=tmp_path)
    assert "accuracy" in stdout
    # A native classifier's head is not converted: said, not silently dropped
    assert ("only its language model is converted" in stdout) == (native_class is BertForTokenClassification)
    # converted in memory, said before transformers' load report of the new head, which names no folder
    assert f"{tmp_path / 'bert'}: converted to ScratchEncoderForMaskedLM in memory" in stdout
    config = json.loads((tmp_path / "ner/model/config.json").read_text())
    assert config["model_type"] == "scratch_encoder" and set(config["id2label"].values()) == {"ANIMAL", "O"}
    card = ModelCard.load(tmp_path / "ner/model/README.md")
    assert card.data.pipeline_tag == "token-classification" and "ScratchEncoderForTokenClassification" in card.text
    # ANIMAL and O are word classes, not entity tags: no entity scores
    assert set(json.loads((tmp_path / "ner/model/eval_results.json").read_text())) == {"loss", "accuracy", "f1"}


def test_finetune_scores_entity_tags_as_run_ner_does(tmp_path):
    """IOB2 tags: the entity-level precision, recall and F1 (seqeval), printed, in eval_results.json and the card."""
    rows = [{"tokens": s.split(), "tags": [("B-ANIMAL" if w in ("dog", "horse") else "I-ANIMAL" if w == "runs" and
                                             previous in ("dog", "horse") else "O")
                                           for previous, w in zip(["", *s.split()], s.split(), strict=False)]}
            for s in words(40, 4)]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(row) for row in rows))
    stdout = run_script("finetune.py", "--model", _tiny_folder(tmp_path / "mlm"), "--task", "token-classification",
                        "--train-file", tmp_path / "train.json", "--label-column", "tags", "--max-steps", 2,
                        "--output-dir", tmp_path / "ner", cwd=tmp_path)
    assert "entity_f1" in stdout
    results = json.loads((tmp_path / "ner/model/eval_results.json").read_text())
    assert set(results) == {"loss", "accuracy", "f1", "entity_precision", "entity_recall", "entity_f1"}
    assert all(0 <= results[f"entity_{score}"] <= 1 for score in ("precision", "recall", "f1"))
    card = ModelCard.load(tmp_path / "ner/model/README.md")
    names = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert names["Entity F1 (seqeval)"] == pytest.approx(results["entity_f1"])


def test_finetune_question_answering_from_our_masked_lm(tmp_path):
    """SQuAD-style data, contexts longer than the windows: trained, scored with SQuAD's exact match and F1, and
    saved as a question-answering folder with its card."""
    rows = squad_rows(40, seed=8)
    assert any(not row["answers"]["text"] for row in rows) and any(row["answers"]["text"] for row in rows)
    stdout = run_script("finetune.py", "--model", _tiny_folder(tmp_path / "mlm"), "--task", "question-answering",
                        "--train-file", write_json_lines(tmp_path / "train.json", rows), "--max-length", 24,
                        "--max-steps", 3, "--batch-size", 8, "--output-dir", tmp_path / "qa", cwd=tmp_path)
    assert "evaluation: loss" in stdout and "exact_match" in stdout
    results = json.loads((tmp_path / "qa/model/eval_results.json").read_text())
    assert set(results) == {"loss", "exact_match", "f1"} and 0 <= results["exact_match"] <= results["f1"] <= 100
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa/model")
    assert isinstance(model, hf_scratch_transformer.ScratchEncoderForQuestionAnswering)
    # Windows with a stride leave truncation and its stride on in the backend: not in the saved tokenizer.json
    assert json.loads((tmp_path / "qa/model/tokenizer.json").read_text())["truncation"] is None
    card = ModelCard.load(tmp_path / "qa/model/README.md")
    assert card.data.pipeline_tag == "question-answering"
    names = {result.metric_name: result.metric_value for result in card.data.eval_results}
    assert names == {"Eval loss": pytest.approx(results["loss"]), "Exact match (SQuAD)": results["exact_match"],
                     "F1 (SQuAD)": results["f1"]}
    assert "| doc_stride | 6 |" in card.text  # a quarter of the 24 tokens
    assert "| evaluated_on | 10% of the training data, held out: 4 examples |" in card.text  # questions, not windows


def test_finetune_multiple_choice_from_our_masked_lm(tmp_path):
    """Rows of a question and three choices: trained, scored by accuracy and loss (those of the saved model itself over
    the validation rows, each question paired with each choice), saved as a multiple-choice folder with its card."""
    validation = choice_rows(10, seed=6)
    stdout = run_script("finetune.py", "--model", _tiny_folder(tmp_path / "mlm"), "--task", "multiple-choice",
                        "--train-file", write_json_lines(tmp_path / "train.json", choice_rows(40, seed=5)),
                        "--validation-file", write_json_lines(tmp_path / "dev.json", validation), "--max-steps", 3,
                        "--batch-size", 4, "--output-dir", tmp_path / "mc", cwd=tmp_path)
    assert "evaluation: loss" in stdout and "accuracy" in stdout
    results = json.loads((tmp_path / "mc/model/eval_results.json").read_text())
    assert set(results) == {"loss", "accuracy"}
    model = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "mc/model").eval()
    assert isinstance(model, hf_scratch_transformer.ScratchEncoderForMultipleChoice)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "mc/model")
    pairs = tokenizer([row["question"] for row in validation for _ in row["choices"]],
                      [choice for row in validation for choice in row["choices"]], padding=True, return_tensors="pt")
    labels = torch.tensor([row["label"] for row in validation])
    with torch.no_grad():
        output = model(**{name: tensor.view(10, 3, -1) for name, tensor in pairs.items()}, labels=labels)
    assert results["accuracy"] == pytest.approx((output.logits.argmax(-1) == labels).float().mean().item())
    assert results["loss"] == pytest.approx(output.loss.item(), rel=1e-5)
    card = ModelCard.load(tmp_path / "mc/model/README.md")
    assert card.data.pipeline_tag == "multiple-choice"
    assert {result.metric_name for result in card.data.eval_results} == {"Eval loss", "Accuracy"}


def test_finetune_multiple_choice_from_a_native_bert_scores_through_its_pooler_and_exports_back(monkeypatch, tmp_path,
                                                                                               capsys):
    """A native BERT is fine-tuned for multiple choice as run_swag does, as `BertForMultipleChoice` (its pooler from a
    pre-training checkpoint), each question paired with each choice (the choice segment 1), and exports back to it."""
    torch.manual_seed(0)
    native = _native_bert_folder(tmp_path / "bert", BertForPreTraining)
    trainer = trainer_at_training(monkeypatch, "--model", tmp_path / "bert", "--task", "multiple-choice",
                                  "--train-file", write_json_lines(tmp_path / "train.json", choice_rows(20, seed=5)),
                                  "--output-dir", tmp_path / "out")
    model = trainer.model
    assert isinstance(model, hf_scratch_transformer.ScratchEncoderForMultipleChoice) and model.config.classifier_pooler
    torch.testing.assert_close(model.pooler.dense.weight, native.bert.pooler.dense.weight, rtol=0, atol=0)
    assert "as BertForMultipleChoice: its pooler where the checkpoint holds one" in capsys.readouterr().out
    row = trainer.train_dataset[0]
    assert len(row["input_ids"]) == 3 and all(1 in types for types in row["token_type_ids"])
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    assert batch["input_ids"].shape[:2] == (2, 3) and batch["labels"].shape == (2,)
    exported = to_hf(model).eval()
    assert type(exported) is BertForMultipleChoice
    with torch.no_grad():
        torch.testing.assert_close(exported(**batch).logits, model.eval()(**batch).logits, atol=1e-5, rtol=0)


BERT_KNOBS = dict(position_embedding_type="learned", norm_position="post", final_norm=False, embedding_norm=True,
                  use_bias=True, hidden_act="gelu", mlm_transform=True)  # what `to_hf` needs for BERT's classes


@pytest.mark.parametrize("task, rows, native_class", [
    ("text-classification", lambda: [{"text": row.split(",")[0], "label": row.split(",")[1]}
                                     for row in _animal_rows(20, 3)], BertForSequenceClassification),
    ("multiple-choice", lambda: choice_rows(20, seed=5), BertForMultipleChoice),
])
def test_finetune_of_our_masked_lm_with_berts_pooler_exports_to_berts_class(task, rows, native_class, monkeypatch,
                                                                            tmp_path):
    """Our MLM has no pooler, so its classifier reads [CLS] as it is and BERT's class (which pools it) cannot take it:
    with --classifier-pooler the head reads it through a new pooler, and the fine-tuned model exports to BERT's."""
    base = _tiny_folder(tmp_path / "mlm", **BERT_KNOBS)
    train = write_json_lines(tmp_path / "train.json", rows())
    plain = trainer_at_training(monkeypatch, "--model", base, "--task", task, "--train-file", train, "--output-dir",
                                tmp_path / "plain").model
    assert not plain.config.classifier_pooler and plain.pooler is None
    with pytest.raises(ValueError, match="classifier_pooler=False"):
        to_hf(plain)
    model = trainer_at_training(monkeypatch, "--model", base, "--task", task, "--train-file", train, "--output-dir",
                                tmp_path / "pooled", "--classifier-pooler").model
    assert model.config.classifier_pooler and model.pooler is not None
    torch.testing.assert_close(model.model.embeddings.embed_tokens.weight, plain.model.embeddings.embed_tokens.weight)
    assert type(to_hf(model)) is native_class


@pytest.mark.parametrize("model_class, task", [
    (hf_scratch_transformer.ScratchEncoderForMaskedLM, "token-classification"),
    (hf_scratch_transformer.ScratchDecoderForCausalLM, "text-classification"),
])
def test_finetune_refuses_berts_pooler_where_no_head_reads_it(model_class, task, monkeypatch, tmp_path, capsys):
    train = write_json_lines(tmp_path / "train.json", [{"text": s, "tokens": s.split(), "label": "a"} for s in
                                                       words(4, 1)])
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    from hf_scratch_transformer.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["finetune", "--model", str(_tiny_folder(tmp_path / "model", model_class)), "--task", task,
              "--train-file", str(train), "--classifier-pooler", "--output-dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    refusal = "--classifier-pooler: BERT's pooler goes with --task text-classification or multiple-choice of an encoder"
    assert refusal in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def trainer_at_training(monkeypatch, *arguments):
    """Runs `hf-scratch finetune ARGUMENTS` in this process up to its first training step; returns its Trainer."""
    from hf_scratch_transformer.cli import main
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    reached = []

    def train(self, *args, **kwargs):
        reached.append(self)
        raise ReachedTraining

    monkeypatch.setattr(CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(ReachedTraining):
        main(["finetune", *map(str, arguments)])
    return reached[0]


def test_finetune_continues_a_question_answering_model_with_its_head(monkeypatch, tmp_path, capsys):
    """A question-answering model trains on with its own `qa_outputs`; a classifier's folder gets a new one."""
    train = write_json_lines(tmp_path / "train.json", squad_rows(20, seed=9))
    base = _tiny_folder(tmp_path / "qa", hf_scratch_transformer.ScratchEncoderForQuestionAnswering)
    saved = hf_scratch_transformer.ScratchEncoderForQuestionAnswering.from_pretrained(base).qa_outputs.weight
    trainer = trainer_at_training(monkeypatch, "--model", base, "--task", "question-answering", "--train-file", train,
                                  "--output-dir", tmp_path / "out")
    torch.testing.assert_close(trainer.model.qa_outputs.weight, saved)
    assert "trains a new head" not in capsys.readouterr().out
    # the data's windows: each labelled with its answer's tokens, or with none at [CLS]
    assert {"input_ids", "start_positions", "end_positions"} <= set(trainer.train_dataset.column_names)
    assert "offset_mapping" not in trainer.train_dataset.column_names  # the metrics' own, not the model's
    classifier = _tiny_folder(tmp_path / "cls", hf_scratch_transformer.ScratchEncoderForSequenceClassification,
                              id2label={0: "a", 1: "b"}, label2id={"a": 0, "b": 1})
    trainer = trainer_at_training(monkeypatch, "--model", classifier, "--task", "question-answering", "--train-file",
                                  train, "--output-dir", tmp_path / "out2")
    assert "is a ScratchEncoderForSequenceClassification of ['a', 'b']; question-answering trains a new head" in (
        capsys.readouterr().out)
    assert trainer.model.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}  # not the classifier's classes


def test_finetune_question_answering_from_a_converted_native_bert(monkeypatch, tmp_path, capsys):
    _native_bert_folder(tmp_path / "bert")
    trainer = trainer_at_training(monkeypatch, "--model", tmp_path / "bert", "--task", "question-answering",
                                  "--train-file", write_json_lines(tmp_path / "train.json", squad_rows(20, seed=9)),
                                  "--output-dir", tmp_path / "out")
    assert isinstance(trainer.model, hf_scratch_transformer.ScratchEncoderForQuestionAnswering)
    assert "converted to ScratchEncoderForMaskedLM in memory" in capsys.readouterr().out
    # BERT's token types: the context's tokens are segment 1
    assert any(1 in types for types in trainer.train_dataset["token_type_ids"])


@pytest.mark.parametrize("native_class", [BertForSequenceClassification, BertForTokenClassification,
                                          BertForQuestionAnswering, BertForMultipleChoice,
                                          GPT2ForSequenceClassification, GPT2ForTokenClassification])
def test_finetune_keeps_the_head_of_a_native_model_of_the_task(native_class, monkeypatch, tmp_path, capsys):
    """A native classifier of the data's classes (the sequence classifier with its pooler), question answerer or
    multiple-choice head (with its pooler) is converted with its head (which `from_hf` converts) and trains on from
    it, its classes in its order, as one of ours does; it was left out and drawn anew. Of other classes, the head is
    new, as for ours (BERT's pooler kept)."""
    gpt2 = native_class in (GPT2ForSequenceClassification, GPT2ForTokenClassification)
    tokenizer = byte_level_bpe() if gpt2 else wordpiece()
    task = {BertForTokenClassification: "token-classification", BertForQuestionAnswering: "question-answering",
            BertForMultipleChoice: "multiple-choice", GPT2ForTokenClassification: "token-classification",
            }.get(native_class, "text-classification")
    classes = {} if task in ("question-answering", "multiple-choice") else {"id2label": {0: "other", 1: "animal"},
                                                       "label2id": {"other": 0, "animal": 1}}
    torch.manual_seed(0)
    sizes = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=len(tokenizer),
                 max_position_embeddings=64, **classes)
    native = native_class(GPT2Config(**sizes) if gpt2 else BertConfig(**sizes, intermediate_size=64))
    native.save_pretrained(tmp_path / "bert")
    tokenizer.save_pretrained(tmp_path / "bert")
    if task == "text-classification":
        rows = _animal_rows(20, 3)
        (tmp_path / "train.csv").write_text("\n".join(["text,label", *rows]))
        data = ["--train-file", tmp_path / "train.csv"]
    elif task == "token-classification":
        rows = [{"tokens": s.split(), "tags": ["animal" if w in ("dog", "horse") else "other" for w in s.split()]}
                for s in words(20, 4)]
        data = ["--train-file", write_json_lines(tmp_path / "train.json", rows), "--label-column", "tags"]
    elif task == "multiple-choice":
        data = ["--train-file", write_json_lines(tmp_path / "train.json", choice_rows(20, seed=5))]
    else:
        data = ["--train-file", write_json_lines(tmp_path / "train.json", squad_rows(20, seed=9))]
    trainer = trainer_at_training(monkeypatch, "--model", tmp_path / "bert", "--task", task, *data, "--output-dir",
                                  tmp_path / "out")
    pooled = task in ("text-classification", "multiple-choice")
    score = native_class is GPT2ForSequenceClassification
    heads = {"score": "score"} if score else {"qa_outputs": "qa_outputs"} if task == "question-answering" else {
        "classifier": "classifier", **({"pooler.dense": "bert.pooler.dense"} if pooled and not gpt2 else {})}
    for ours, theirs in heads.items():  # the native model's own layers
        for kind in ("weight",) if score else ("weight", "bias"):  # GPT-2's `score` has no bias
            torch.testing.assert_close(trainer.model.get_parameter(f"{ours}.{kind}"),
                                       native.get_parameter(f"{theirs}.{kind}"), rtol=0, atol=0)
    assert trainer.model.config.id2label == native.config.id2label
    stdout = capsys.readouterr().out
    assert f"converted to {type(trainer.model).__name__} in memory (`from_hf`), its {task} head with it" in stdout
    assert "trains a new head" not in stdout
    if classes:  # other classes: a new head, said
        native.config.id2label, native.config.label2id = {0: "other", 1: "person"}, {"other": 0, "person": 1}
        native.save_pretrained(tmp_path / "bert")
        trainer = trainer_at_training(monkeypatch, "--model", tmp_path / "bert", "--task", task, *data,
                                      "--output-dir", tmp_path / "out2")
        head = "score" if score else "classifier"
        assert not torch.allclose(trainer.model.get_parameter(f"{head}.weight"), native.get_parameter(f"{head}.weight"))
        assert "trains a new head" in capsys.readouterr().out
        if task == "text-classification" and not gpt2:  # BERT's pooler kept: its pretrained model's (`BertModel`'s)
            torch.testing.assert_close(trainer.model.pooler.dense.weight, native.bert.pooler.dense.weight, rtol=0,
                                       atol=0)


def test_finetune_classifies_from_a_native_berts_pooler_and_exports_back_to_berts_classifier(monkeypatch, tmp_path,
                                                                                              capsys):
    """BERT fine-tunes a sequence classifier through its pooler, which its pre-training checkpoints hold (trained on
    next-sentence prediction): converted with it (ours with `classifier_pooler`), the classifier is BERT's own and
    exports back to `BertForSequenceClassification` (it had no pooler and exported to nothing)."""
    torch.manual_seed(0)
    native = _native_bert_folder(tmp_path / "bert", BertForPreTraining)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bert")
    rows = _animal_rows(20, 3)
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows))
    trainer = trainer_at_training(monkeypatch, "--model", tmp_path / "bert", "--task", "text-classification",
                                  "--train-file", tmp_path / "train.csv", "--output-dir", tmp_path / "out")
    model = trainer.model
    assert model.config.classifier_pooler and model.config.id2label == {0: "animal", 1: "other"}
    torch.testing.assert_close(model.pooler.dense.weight, native.bert.pooler.dense.weight, rtol=0, atol=0)
    assert "as BertForSequenceClassification: its pooler where the checkpoint holds one" in capsys.readouterr().out
    exported = to_hf(model).eval()
    assert type(exported) is BertForSequenceClassification and exported.config.id2label == model.config.id2label
    inputs = tokenizer(["a dog runs", "the red house"], return_tensors="pt", padding=True)
    inputs.pop("token_type_ids")  # the tiny folder's tokenizer writes none (no token types)
    with torch.no_grad():
        torch.testing.assert_close(exported(**inputs).logits, model.eval()(**inputs).logits, atol=1e-5, rtol=0)


def test_finetune_question_answering_resumed_with_another_doc_stride_says_so(tmp_path):
    """--doc-stride cuts the contexts into other windows, so other steps: a resumed run names it changed, as it names
    --max-length."""
    finetune = ["--model", _tiny_folder(tmp_path / "mlm"), "--task", "question-answering", "--train-file",
                write_json_lines(tmp_path / "train.json", squad_rows(20, seed=9)), "--max-length", 24,
                "--output-dir", tmp_path / "qa"]
    run_script("finetune.py", *finetune, "--max-steps", 1, "--doc-stride", 4, cwd=tmp_path)
    stdout = run_script("finetune.py", *finetune, "--max-steps", 2, "--doc-stride", 5, "--resume", cwd=tmp_path)
    assert "'doc_stride': (4, 5)" in stdout.split("changed settings ")[1].split(" make the steps differ")[0], stdout


def test_finetune_refuses_a_doc_stride_the_windows_cannot_hold(monkeypatch, tmp_path, capsys):
    """The tokenizer panicked in Rust midway through the data: "`stride` must be strictly less than `max_len`"."""
    from hf_scratch_transformer.cli import main

    rows = squad_rows(10, seed=9)
    rows[3]["question"] = "which big red animal walks in the house and the street ?"
    train = write_json_lines(tmp_path / "train.json", rows)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    # "which animal is there ?" is 9 tokens, row 4's question 25: with [CLS] and two [SEP], 12 and 28 tokens
    for options, message in (
            (["--max-length", "40", "--doc-stride", "28"],
             "with --doc-stride 28 in rows 1, 2, 3, 4, 5 and 5 more (counted from 1, after any header); row 1's leaves "
             "28 tokens for its context, which must be more than --doc-stride"),
            (["--max-length", "20"],
             "questions in 'question' that leave their context no room in windows of --max-length 20 tokens in row 4 "
             "(counted from 1, after any header); row 4's takes 28 with the special tokens: raise --max-length")):
        with pytest.raises(SystemExit) as stopped:
            main(["finetune", "--model", str(_tiny_folder(tmp_path / "mlm")), "--task", "question-answering",
                  "--train-file", str(train), *options, "--output-dir", str(tmp_path / "out")])
        said = capsys.readouterr()
        assert stopped.value.code == 2 and message in said.err and "Traceback" not in said.err, said.err[-2000:]
        assert not (tmp_path / "out").exists()


def _tiny_folder(folder: Path, model_class=hf_scratch_transformer.ScratchEncoderForMaskedLM, **config) -> Path:
    """A tiny model of ours with a test tokenizer (WordPiece for an encoder, else byte-level BPE), saved as
    `hf-scratch finetune` reads it."""
    family = model_class.config_class.model_type.removeprefix("scratch_")
    tokenizer = wordpiece() if family == "encoder" else byte_level_bpe(family=family)
    torch.manual_seed(0)
    model_class(tiny_config(family, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **config)
                ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _native_bert_folder(folder: Path, native_class=BertForMaskedLM):
    """A tiny native BERT of `native_class` with the test WordPiece tokenizer, saved in `folder`; returns the model."""
    tokenizer = wordpiece()
    native = native_class(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=len(tokenizer), max_position_embeddings=64))
    native.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return native


def _animal_rows(count: int, seed: int) -> list[str]:
    """CSV rows `text,label` of `words`: "animal" where the sentence names a dog or a horse, else "other"."""
    return [f"{s},{'animal' if 'dog' in s or 'horse' in s else 'other'}" for s in words(count, seed)]


def test_finetune_regression_scores_texts_as_run_glue_scores_sts_b(tmp_path):
    """--regression: one output trained on a score per text (the mean squared error), reported as run_glue reports
    STS-B (MSE, Pearson's and Spearman's correlations) and as the saved model's own scores over the validation texts
    give them; its card names them."""
    def rows(count, seed):
        return [{"text": text, "label": sum(word in ("dog", "horse") for word in text.split()) / 5 + 0.1}
                for text in words(count, seed)]

    validation = rows(12, 7)
    run_script("finetune.py", "--model", _tiny_folder(tmp_path / "mlm"), "--task", "text-classification",
               "--regression", "--train-file", write_json_lines(tmp_path / "train.json", rows(40, 6)),
               "--validation-file", write_json_lines(tmp_path / "dev.json", validation), "--max-steps", 3,
               "--batch-size", 8, "--output-dir", tmp_path / "sts", cwd=tmp_path)
    results = json.loads((tmp_path / "sts/model/eval_results.json").read_text())
    assert set(results) == {"loss", "mse", "pearson", "spearman"}
    assert results["loss"] == pytest.approx(results["mse"], rel=1e-5)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "sts/model").eval()
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "sts/model")
    with torch.no_grad():
        scores = model(**tokenizer([row["text"] for row in validation], padding=True, return_tensors="pt")).logits[:, 0]
    labels = torch.tensor([row["label"] for row in validation])
    assert results["mse"] == pytest.approx(((scores - labels) ** 2).mean().item(), rel=1e-4)
    assert results["pearson"] == pytest.approx(torch.corrcoef(torch.stack([scores, labels]))[0, 1].item(), abs=1e-4)
    card = ModelCard.load(tmp_path / "sts/model/README.md")
    assert {result.metric_name for result in card.data.eval_results} == {
        "Eval loss", "Mean squared error", "Pearson correlation", "Spearman correlation"}


def test_finetune_regression_goes_on_with_a_regressors_head_and_draws_a_classifiers_anew(monkeypatch, tmp_path, capsys):
    rows = [{"text": text, "label": len(text) / 10} for text in words(20, 2)]
    train = write_json_lines(tmp_path / "train.json", rows)
    regressor = _tiny_folder(tmp_path / "regressor", hf_scratch_transformer.ScratchEncoderForSequenceClassification,
                             num_labels=1, problem_type="regression")
    saved = hf_scratch_transformer.ScratchEncoderForSequenceClassification.from_pretrained(regressor).classifier.weight
    trainer = trainer_at_training(monkeypatch, "--model", regressor, "--task", "text-classification", "--regression",
                                  "--train-file", train, "--output-dir", tmp_path / "out")
    torch.testing.assert_close(trainer.model.classifier.weight, saved, rtol=0, atol=0)
    assert "trains a new head" not in capsys.readouterr().out
    classifier = _tiny_folder(tmp_path / "classifier", hf_scratch_transformer.ScratchEncoderForSequenceClassification,
                              id2label={0: "a", 1: "b"}, label2id={"a": 0, "b": 1})
    trainer = trainer_at_training(monkeypatch, "--model", classifier, "--task", "text-classification", "--regression",
                                  "--train-file", train, "--output-dir", tmp_path / "out2")
    assert trainer.model.classifier.weight.shape[0] == 1 and trainer.model.config.problem_type == "regression"
    assert "trains a new head" in capsys.readouterr().out


def test_finetune_gives_integer_labels_their_own_ids(tmp_path):
    """Sorted as text, labels 0..10 took the ids 0, 1, 3, 4, ... 10, 2: class 2 was the head's row 3."""
    rows = ["text,label"] + [f"{s},{i % 11}" for i, s in enumerate(words(44, 5))]
    (tmp_path / "train.csv").write_text("\n".join(rows))
    run_script("finetune.py", "--model", _tiny_folder(tmp_path / "mlm"), "--task", "text-classification",
               "--train-file", tmp_path / "train.csv", "--max-steps", 1, "--output-dir", tmp_path / "cls", cwd=tmp_path)
    config = json.loads((tmp_path / "cls/model/config.json").read_text())
    assert config["id2label"] == {str(i): str(i) for i in range(11)}


def test_finetune_continues_a_classifier_with_its_classes_in_their_order(tmp_path):
    """A classifier whose classes are not in sorted order, fine-tuned further on them, kept its head's rows under
    sorted names (its predictions swapped classes); on other classes it gets a new head (sizes were refused)."""
    base = _tiny_folder(tmp_path / "base", hf_scratch_transformer.ScratchEncoderForSequenceClassification,
                           id2label={0: "other", 1: "animal"}, label2id={"other": 0, "animal": 1})
    rows = ["text,label"] + _animal_rows(40, 3)
    (tmp_path / "train.csv").write_text("\n".join(rows))
    # A step too small to change the logits at fp32 tolerance (a rate of 0 is refused): swapped classes would.
    run_script("finetune.py", "--model", base, "--task", "text-classification", "--train-file", tmp_path / "train.csv",
               "--max-steps", 1, "--learning-rate", 1e-9, "--output-dir", tmp_path / "same", cwd=tmp_path)
    before = AutoModelForSequenceClassification.from_pretrained(base).eval()
    after = AutoModelForSequenceClassification.from_pretrained(tmp_path / "same/model").eval()
    assert after.config.id2label == before.config.id2label
    inputs = wordpiece()(["a dog runs", "the man sees a house"], return_tensors="pt", padding=True)
    torch.testing.assert_close(after(**inputs).logits, before(**inputs).logits)
    # The same from a `datasets` ClassLabel column, whose ids follow its own order of names (here the other one).
    texts = words(40, 3)
    Dataset.from_dict({"text": texts, "label": [0 if "dog" in s or "horse" in s else 1 for s in texts]},
                      features=Features({"text": Value("string"), "label": ClassLabel(names=["animal", "other"])})
                      ).to_parquet(tmp_path / "dataset/train.parquet")
    run_script("finetune.py", "--model", base, "--task", "text-classification", "--dataset", tmp_path / "dataset",
               "--max-steps", 1, "--learning-rate", 1e-9, "--output-dir", tmp_path / "dataset-run", cwd=tmp_path)
    after = AutoModelForSequenceClassification.from_pretrained(tmp_path / "dataset-run/model").eval()
    assert after.config.id2label == before.config.id2label
    torch.testing.assert_close(after(**inputs).logits, before(**inputs).logits)
    three = ["text,label"] + [f"{s},{i % 3}" for i, s in enumerate(words(30, 6))]
    (tmp_path / "three.csv").write_text("\n".join(three))
    run_script("finetune.py", "--model", base, "--task", "text-classification", "--train-file", tmp_path / "three.csv",
               "--max-steps", 1, "--output-dir", tmp_path / "three", cwd=tmp_path)
    assert AutoModelForSequenceClassification.from_pretrained(tmp_path / "three/model").config.num_labels == 3
    # Other classes of the same number: the head trained for "other" and "animal" served "big" and "small" unchanged.
    other = ["text,label"] + [f"{s},{'big' if 'horse' in s or 'house' in s else 'small'}" for s in words(40, 3)]
    (tmp_path / "other.csv").write_text("\n".join(other))
    stdout = run_script("finetune.py", "--model", base, "--task", "text-classification", "--train-file",
                        tmp_path / "other.csv", "--max-steps", 1, "--learning-rate", 1e-9, "--output-dir",
                        tmp_path / "other", cwd=tmp_path)
    assert "trains a new head" in stdout
    after = AutoModelForSequenceClassification.from_pretrained(tmp_path / "other/model").eval()
    assert set(after.config.label2id) == {"big", "small"}
    assert not torch.allclose(after.classifier.weight, before.classifier.weight)
    torch.testing.assert_close(after.model.embeddings.embed_tokens.weight, before.model.embeddings.embed_tokens.weight)


def test_finetune_resumes_only_with_the_labels_of_its_checkpoint(tmp_path):
    """Resumed on other classes of the same number (or the same ones in another order), the checkpoint's head was
    loaded under the new names in silence: each of its rows predicted the class it was trained for under another
    name. Refused, naming both."""
    base = _tiny_folder(tmp_path / "mlm")
    texts = words(40, 3)
    (tmp_path / "train.csv").write_text("\n".join(["text,label"] + [
        f"{s},{'animal' if 'dog' in s or 'horse' in s else 'other'}" for s in texts]))
    finetune = ["--model", base, "--task", "text-classification", "--output-dir", tmp_path / "cls"]
    run_script("finetune.py", *finetune, "--train-file", tmp_path / "train.csv", "--max-steps", 1, cwd=tmp_path)
    (tmp_path / "renamed.csv").write_text("\n".join(["text,label"] + [
        f"{s},{'beast' if 'dog' in s or 'horse' in s else 'thing'}" for s in texts]))
    Dataset.from_dict({"text": texts, "label": [0 if "dog" in s or "horse" in s else 1 for s in texts]},
                      features=Features({"text": Value("string"), "label": ClassLabel(names=["other", "animal"])})
                      ).to_parquet(tmp_path / "reordered/train.parquet")
    for data, labels in ((["--train-file", tmp_path / "renamed.csv"], "['beast', 'thing']"),
                         (["--dataset", tmp_path / "reordered"], "['other', 'animal']")):
        output = run_script("finetune.py", *finetune, *data, "--max-steps", 2, "--resume", cwd=tmp_path, returncode=2)
        assert f"was trained for the labels ['animal', 'other'] (by id); this run's are {labels}" in output, output
        assert "Traceback" not in output
    assert json.loads((tmp_path / "cls/model/config.json").read_text())["id2label"] == {"0": "animal", "1": "other"}
    # Its checkpoints removed, --resume found none, started again from step 0 and replaced the model: refused.
    shutil.rmtree(tmp_path / "cls/checkpoints")
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / "cls").rglob("*")}
    output = run_script("finetune.py", *finetune, "--train-file", tmp_path / "train.csv", "--max-steps", 2,
                        "--resume", cwd=tmp_path, returncode=2)
    assert "holds an earlier run (its model in" in output and "--overwrite-output-dir" in output, output
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "cls").rglob("*")} == before


def test_finetune_trains_classes_from_a_regression_model(tmp_path):
    """The base's `problem_type` stayed: a regression model fine-tuned for classes took the mean squared error of
    (batch, classes) logits against (batch,) class ids (a size error, or broadcast in silence at two classes)."""
    base = _tiny_folder(tmp_path / "base", hf_scratch_transformer.ScratchEncoderForSequenceClassification,
                        num_labels=1, problem_type="regression")
    rows = ["text,label"] + _animal_rows(40, 3)
    (tmp_path / "train.csv").write_text("\n".join(rows))
    run_script("finetune.py", "--model", base, "--task", "text-classification", "--train-file", tmp_path / "train.csv",
               "--max-steps", 1, "--output-dir", tmp_path / "run", cwd=tmp_path)
    config = json.loads((tmp_path / "run/model/config.json").read_text())
    assert config["problem_type"] == "single_label_classification" and len(config["id2label"]) == 2


@pytest.mark.parametrize("model_class, task", [
    (hf_scratch_transformer.ScratchSeq2SeqForConditionalGeneration, "token-classification"),
    (hf_scratch_transformer.ScratchSeq2SeqForConditionalGeneration, "text-classification"),
    (hf_scratch_transformer.ScratchSeq2SeqForConditionalGeneration, "question-answering"),
    (hf_scratch_transformer.ScratchDecoderForCausalLM, "multiple-choice"),
])
def test_finetune_refuses_a_model_without_the_tasks_head(model_class, task, tmp_path):
    """The Auto class failed with a traceback ("Unrecognized configuration class ... for this kind of AutoModel")."""
    rows = [{"tokens": s.split(), "text": s, "label": "A" if "dog" in s else "B", "tags": ["O"] * 4 + ["X"]}
            for s in words(20, 7)]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(row) for row in rows))
    labels = "tags" if task == "token-classification" else "label"
    output = run_script("finetune.py", "--model", _tiny_folder(tmp_path / "model", model_class), "--task", task,
                        "--train-file", tmp_path / "train.json", "--label-column", labels,
                        "--output-dir", tmp_path / "out", cwd=tmp_path, returncode=2)
    family = model_class.config_class.model_type
    assert f"a {family} model has no {task} head; {task} fine-tunes " in output and "Traceback" not in output


def test_finetune_refuses_a_native_model_without_the_tasks_head_before_any_work(tmp_path):
    """A native Marian converts to our seq2seq family, which has no classifier: its data was read and the model
    converted (seconds to minutes of a real one) before the refusal. Now the folder is judged first: the missing
    training file is never reached."""
    import tiny_native

    tiny_native.marian().save_pretrained(tmp_path / "marian")
    byte_level_bpe(family="seq2seq").save_pretrained(tmp_path / "marian")
    output = run_script("finetune.py", "--model", tmp_path / "marian", "--task", "text-classification",
                        "--train-file", tmp_path / "not-there.csv", "--output-dir", tmp_path / "out", cwd=tmp_path,
                        returncode=2)
    assert "a marian model has no text-classification head" in output and "not-there.csv" not in output, output


class BuiltModel(Exception):
    pass


@pytest.mark.parametrize("options, encoder_vocab_size", [([], 320), (["--set", "encoder_vocab_size=400"], 400)],
                         ids=["follows", "set"])
def test_a_separate_source_vocabulary_follows_the_runs_one_tokenizer(monkeypatch, tmp_path, options,
                                                                     encoder_vocab_size):
    # transformer-xavier kept its 32,000 source embeddings for a 300-token tokenizer: rows no id reaches.
    from hf_scratch_transformer.cli import main

    def built(config):
        raise BuiltModel(config)

    monkeypatch.setattr(transformers.AutoModelForSeq2SeqLM, "from_config", built)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path, ("seq2seq",))
    with pytest.raises(BuiltModel) as model:
        main(["train", "--task", "seq2seq", "--preset", "transformer-xavier", "--tokenizer", str(tmp_path / "seq2seq"),
              "--source-files", str(tmp_path / "train.src"), "--target-files", str(tmp_path / "train.tgt"),
              "--output-dir", str(tmp_path / "run"), *options])
    config = model.value.args[0]
    assert (config.vocab_size, config.encoder_vocab_size) == (320, encoder_vocab_size)


@pytest.mark.parametrize("options, vocab_size", [([], 320), (["--set", "vocab_size=512"], 512)], ids=["padded", "set"])
def test_a_vocabulary_size_set_for_the_new_model_is_kept(monkeypatch, tmp_path, options, vocab_size):
    # `--set vocab_size=512` (room for tokens added later) was replaced by the tokenizer's padded size, silently;
    # `--set encoder_vocab_size` was kept. A size below the tokenizer's is refused by `check_model_fits`.
    from hf_scratch_transformer.cli import main

    def built(config):
        raise BuiltModel(config)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", built)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path)
    with pytest.raises(BuiltModel) as model:
        main(["train", "--tokenizer", str(tmp_path / "decoder"), "--train-files", str(tmp_path / "corpus.txt"),
              "--output-dir", str(tmp_path / "run"), *options])
    assert model.value.args[0].vocab_size == vocab_size


class CheckedModel(Exception):
    pass


@pytest.mark.parametrize("command", ["train", "train-accelerate"])
@pytest.mark.parametrize("source", ["--tokenizer", "--model"])
def test_a_given_tokenizer_cuts_texts_at_the_runs_max_length(monkeypatch, tmp_path, command, source):
    # `hf-scratch tokenizer` leaves model_max_length unset unless asked: a run given such a tokenizer saved it so, and
    # the folder's `truncation=True` and pipelines passed texts past the model's positions (a ValueError in the
    # model), where the tokenizer a run trains cuts them at --max-length.
    from hf_scratch_transformer.cli import main

    def checked(parser, model, tokenizer, max_length):
        raise CheckedModel(tokenizer)

    monkeypatch.setattr("hf_scratch_transformer.cli.run_options.check_model_fits", checked)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path)
    tiny_lm("decoder", vocab_size=320).save_pretrained(tmp_path / "decoder")  # beside its tokenizer: a model folder
    given = [source, str(tmp_path / "decoder")]
    with pytest.raises(CheckedModel) as run:
        main([command, *given, "--train-files", str(tmp_path / "corpus.txt"), "--max-length", "48",
              "--output-dir", str(tmp_path / "run")])
    assert run.value.args[0].model_max_length == 48


class AboutToTrain(Exception):
    pass


@pytest.mark.parametrize("command", ["train", "train-accelerate"])
def test_a_model_folder_takes_its_tokenizers_special_ids_in_both_training_commands(monkeypatch, tmp_path, command):
    # A --model folder whose config.json and generation_config.json give other pad / bos / eos ids than its tokenizer:
    # the data is made with the tokenizer's (packing ends each document with its eos). Trainer (`train`) aligns the
    # configs with the tokenizer, with transformers' warning; train-accelerate kept the folder's, and saved a model
    # whose `generate()` stops at an eos it never learnt.
    from hf_scratch_transformer.cli import main
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    def about_to_train(model):
        raise AboutToTrain(model)

    # Trainer aligns them as `train()` begins, before its loop
    monkeypatch.setattr(CrashSafeTrainer, "_inner_training_loop",
                        lambda self, *args, **kwargs: about_to_train(self.model))
    monkeypatch.setattr(training, "weight_decay_groups", lambda model, *args: about_to_train(model))
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path)  # its tokenizer: <pad> 0, <s> 1, </s> 2
    tiny_lm("decoder", vocab_size=320, pad_token_id=7, bos_token_id=6, eos_token_id=5).save_pretrained(
        tmp_path / "decoder")
    with pytest.raises(AboutToTrain) as run:
        main([command, "--model", str(tmp_path / "decoder"), "--train-files", str(tmp_path / "corpus.txt"),
              "--max-length", "32", "--output-dir", str(tmp_path / "run")])
    model = run.value.args[0]
    assert (model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id) == (0, 1, 2)
    generation = model.generation_config
    assert (generation.pad_token_id, generation.bos_token_id, generation.eos_token_id) == (0, 1, [2, 5])


class KeptFreedMemory(Exception):
    pass


@pytest.mark.parametrize("command", ["train", "train-accelerate", "finetune"])
def test_every_training_command_freezes_its_imports_and_keeps_its_steps_freed_memory(monkeypatch, tmp_path, command):
    """`training.keep_freed_memory` (tests/test_training.py) is what took a thousand page faults out of each step
    (docs/nanogpt.md); each training command calls it once its data is ready, before the first step. Before its data
    work, it freezes its imports' objects out of the garbage collector's generations, as `hf-scratch` freezes the
    package's (docs/training.md, "Startup")."""
    from hf_scratch_transformer import ScratchEncoderForSequenceClassification
    from hf_scratch_transformer.cli import main

    calls = []

    def kept():
        calls.append("keep_freed_memory")
        raise KeptFreedMemory

    monkeypatch.setattr(training, "keep_freed_memory", kept)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    if command == "finetune":
        tokenizer = wordpiece()
        ScratchEncoderForSequenceClassification(tiny_config("encoder", vocab_size=len(tokenizer))).save_pretrained(
            tmp_path / "model")
        tokenizer.save_pretrained(tmp_path / "model")
        (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(f"the dog {i},{i % 2}" for i in range(8)))
        model, data = tmp_path / "model", ["--task", "text-classification", "--train-file", tmp_path / "train.csv"]
    else:
        write_run_corpus(tmp_path)
        model = tmp_path / "decoder"  # beside its tokenizer
        tiny_lm("decoder", vocab_size=320).save_pretrained(model)
        data = ["--train-files", tmp_path / "corpus.txt", "--max-length", "32"]
    with pytest.raises(KeptFreedMemory):
        main([str(argument) for argument in [command, "--model", model, *data, "--output-dir", tmp_path / "run"]])
    assert calls == ["freeze", "freeze", "keep_freed_memory"]  # the package's, the command's imports', then memory


@pytest.mark.parametrize("task, auto_class", [("causal-lm", "AutoModelForCausalLM"),
                                              ("seq2seq", "AutoModelForSeq2SeqLM")])
def test_a_tokenizer_made_elsewhere_gives_the_new_model_its_special_ids(monkeypatch, tmp_path, task, auto_class):
    # One not made by `train_tokenizer` (GPT-2's, saved by the user) records no family: `special_token_ids` stopped
    # the run with a traceback telling the user to set `tokenizer.init_kwargs['family']`. The task says the family.
    from hf_scratch_transformer.cli import main

    def built(config):
        raise BuiltModel(config)

    monkeypatch.setattr(getattr(transformers, auto_class), "from_config", built)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path, ())
    ours = byte_level_bpe(family="seq2seq" if task == "seq2seq" else "decoder")
    foreign = type(ours)(tokenizer_object=ours.backend_tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    foreign.save_pretrained(tmp_path / "foreign")
    data = (["--source-files", tmp_path / "train.src", "--target-files", tmp_path / "train.tgt"] if task == "seq2seq"
            else ["--train-files", tmp_path / "corpus.txt"])
    with pytest.raises(BuiltModel) as model:
        main(["train", "--task", task, "--tokenizer", str(tmp_path / "foreign"), *map(str, data),
              "--output-dir", str(tmp_path / "run")])
    config = model.value.args[0]
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    assert task == "causal-lm" or config.decoder_start_token_id == 1


@pytest.mark.parametrize("task, role", [("causal-lm", "eos_token"), ("masked-lm", "mask_token"),
                                        ("seq2seq", "pad_token")])
def test_a_tokenizer_without_the_special_token_the_task_needs_is_refused(capsys, monkeypatch, tmp_path, task, role):
    # Packing put None into the blocks (a traceback at the first batch); the MLM and seq2seq collators refused it
    # with a traceback after the tokenizing.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    write_run_corpus(tmp_path, ())
    ours = wordpiece() if task == "masked-lm" else byte_level_bpe()
    tokens = {key: value for key, value in ours.special_tokens_map.items() if key != role}
    type(ours)(tokenizer_object=ours.backend_tokenizer, **tokens).save_pretrained(tmp_path / "foreign")
    data = (["--source-files", tmp_path / "train.src", "--target-files", tmp_path / "train.tgt"] if task == "seq2seq"
            else ["--train-files", tmp_path / "corpus.txt"])
    with pytest.raises(SystemExit) as stopped:
        main(["train", "--task", task, "--tokenizer", str(tmp_path / "foreign"), *map(str, data),
              "--output-dir", str(tmp_path / "run")])
    assert stopped.value.code == 2
    assert f"has no {role}, which {task} data needs" in capsys.readouterr().err


@pytest.mark.parametrize("options, message", [
    (["--set", "num_layers=1"], "ScratchDecoderConfig has no field num_layers (did you mean num_hidden_layers?)"),
    (["--set", "hidden_size=33"], "hidden_size"),
    (["--set", "hidden_size"], "'hidden_size' is not KEY=VALUE"),
    (["--model", "saved", "--set", "dropout=0.2"], "--set configures a new model"),
    # Special ids were replaced by the tokenizer's without a word: the model trained with other ids than asked.
    (["--set", "pad_token_id=5", "eos_token_id=6"], "--set pad_token_id, eos_token_id: a new model's special token "
                                                     "ids are its tokenizer's"),
    (["--task", "seq2seq", "--set", "decoder_start_token_id=3"], "--set decoder_start_token_id: a new model's"),
], ids=["misspelt-field", "invalid-value", "no-value", "with-model", "special-ids", "decoder-start"])
def test_config_overrides_are_checked_before_any_work(options, message, tmp_path):
    (tmp_path / "saved").mkdir()  # a saved model's folder, as far as these checks read it
    (tmp_path / "saved/config.json").write_text('{"model_type": "scratch_decoder"}')
    (tmp_path / "saved/model.safetensors").write_bytes(b"")
    (tmp_path / "saved/tokenizer_config.json").write_text("{}")
    output = run_script("train.py", "--output-dir", tmp_path / "run", *options, cwd=tmp_path, returncode=2)
    assert message in output and "Traceback" not in output
    assert not (tmp_path / "run").exists()


def test_a_config_override_is_json_or_else_a_string():
    assert config_override("dropout=0.2") == ("dropout", 0.2)
    assert config_override("sliding_window=null") == ("sliding_window", None)
    assert config_override("position_embedding_type=rope") == ("position_embedding_type", "rope")


@pytest.mark.parametrize("script, options", [
    ("train.py", []), ("train_accelerate.py", ["--cpu"]),
    ("finetune.py", ["--task", "text-classification", "--dataset", "imdb"]),
])
def test_a_quantized_model_folder_is_refused_before_any_work(script, options, tmp_path):
    """A folder saved with a `quantization_config` (torchao's int8, bitsandbytes, GPTQ...) holds weights that do not
    train: train failed with Trainer's traceback after the data, train-accelerate trained around its int8 weights and
    stopped at the first checkpoint with "free space", finetune converted or loaded it first. Refused, naming it."""
    model = tiny_lm("decoder")
    model.save_pretrained(tmp_path / "int8")
    config = json.loads((tmp_path / "int8/config.json").read_text())
    config["quantization_config"] = {"quant_method": "torchao", "quant_type": {"default": {}}}
    (tmp_path / "int8/config.json").write_text(json.dumps(config))
    output = run_script(script, "--model", tmp_path / "int8", *options, "--output-dir", tmp_path / "run",
                        cwd=tmp_path, returncode=2)
    assert "--model" in output and "holds quantized weights (torchao" in output and "Traceback" not in output
    assert "full-precision folder" in output and not (tmp_path / "run").exists()


class ReachedTraining(Exception):
    pass


def finetune_until_training(monkeypatch, *arguments) -> dict:
    """Runs `hf-scratch finetune ARGUMENTS` in this process up to its first training step; returns the columns of
    the training data it would train on."""
    from hf_scratch_transformer.cli import main
    from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer

    trained = {}

    def train(self, *args, **kwargs):
        trained.update(self.train_dataset[:])
        raise ReachedTraining

    monkeypatch.setattr(CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with pytest.raises(ReachedTraining):
        main(["finetune", *map(str, arguments)])
    return trained


@pytest.mark.parametrize("tokenizer_kind", ["bpe", "wordpiece"])
def test_finetune_tokenizes_words_as_the_pipeline_tokenizes_their_text(monkeypatch, tmp_path, tokenizer_kind):
    """Token classification reads a list of words; the saved folder's pipeline reads the text. A byte-level BPE
    tokenizer took each word alone without the space before it ('dog', not 'Ġdog'), so the model was trained on
    other tokens than it is given in use (run_ner loads such tokenizers with add_prefix_space for this)."""
    tokenizer = byte_level_bpe(family="encoder") if tokenizer_kind == "bpe" else wordpiece()
    torch.manual_seed(0)
    hf_scratch_transformer.ScratchEncoderForMaskedLM(tiny_config(
        "encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    sentences = words(20, 4)
    rows = [{"tokens": s.split(), "tags": ["ANIMAL" if w in ("dog", "horse") else "O" for w in s.split()]}
            for s in sentences]
    (tmp_path / "train.json").write_text("\n".join(json.dumps(row) for row in rows))
    (tmp_path / "dev.json").write_text(json.dumps(rows[0]))
    trained = finetune_until_training(
        monkeypatch, "--model", tmp_path / "model", "--task", "token-classification", "--train-file",
        tmp_path / "train.json", "--validation-file", tmp_path / "dev.json", "--label-column", "tags",
        "--output-dir", tmp_path / "out")
    assert trained["input_ids"] == tokenizer(sentences).input_ids
    # the first piece of each word labelled, the rest (and the special tokens) -100
    assert [sum(label != -100 for label in labels) for labels in trained["labels"]] == [5] * len(sentences)


def test_finetune_leaves_a_datasets_test_split_alone(monkeypatch, tmp_path):
    """A dataset folder's test split, unlabelled as test sets often are, is not used; its empty labels (or labels
    the training data lacks, as -1) stopped the run: "the 'test' split: the label column 'label' has no value"."""
    rows = _animal_rows(20, 3)
    (tmp_path / "data").mkdir()
    (tmp_path / "data/train.csv").write_text("text,label\n" + "\n".join(rows))
    (tmp_path / "data/test.csv").write_text("text,label\na dog runs,\nthe man sees,\n")
    trained = finetune_until_training(monkeypatch, "--model", _tiny_folder(tmp_path / "mlm"), "--task",
                                      "text-classification", "--dataset", tmp_path / "data",
                                      "--output-dir", tmp_path / "out")
    assert len(trained["labels"]) == 18  # the training file, less the validation share (10%)


def test_finetune_reads_a_label_column_named_labels(monkeypatch, tmp_path):
    """A CSV column named as a model input ("labels") kept its type (large_string) through `datasets.map`: the
    class ids became the strings '0', '1', and training stopped with "too many dimensions 'str'" in the collator."""
    rows = _animal_rows(20, 3)
    (tmp_path / "train.csv").write_text("text,labels\n" + "\n".join(rows))
    trained = finetune_until_training(monkeypatch, "--model", _tiny_folder(tmp_path / "mlm"), "--task",
                                      "text-classification", "--train-file", tmp_path / "train.csv",
                                      "--label-column", "labels", "--output-dir", tmp_path / "out")
    assert set(trained["labels"]) == {0, 1}


def test_finetune_of_a_native_model_writes_no_copy_of_it(monkeypatch, tmp_path):
    """A native BERT was converted into a temporary folder and the new head loaded from there: removed once loaded,
    the copy stayed in /tmp for good when the run was killed before (440 MB from bert-base, each time). Converted in
    memory, nothing is written there at any instant."""
    _native_bert_folder(tmp_path / "bert")
    rows = _animal_rows(20, 3)
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(rows))
    (tmp_path / "temp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    left, load = [], training.load_to_train

    def loading(*args, **kwargs):  # what a kill as the head loads would leave
        left.extend((tmp_path / "temp").iterdir())
        return load(*args, **kwargs)

    monkeypatch.setattr(training, "load_to_train", loading)
    trained = finetune_until_training(monkeypatch, "--model", tmp_path / "bert", "--task", "text-classification",
                                      "--train-file", tmp_path / "train.csv", "--output-dir", tmp_path / "out")
    assert trained["input_ids"] and left == [] and list((tmp_path / "temp").iterdir()) == []


NANOGPT_STAND_IN = '''
"""Stands in for nanoGPT's model.py: its two names and their call signatures, a bigram model inside."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embedding = torch.nn.Embedding(config.vocab_size, config.vocab_size)

    def forward(self, ids, targets):
        logits = self.embedding(ids)
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
'''


def test_the_nanogpt_side_by_side_times_the_models_step_for_step_in_pairs(tmp_path):
    """`--step-for-step` builds ours, nanoGPT's (from the checkout's model.py) and GPT-2 at the recipe's sizes,
    trains each in turn and prints every round and the median of the paired steps' ratios with an interval."""
    (tmp_path / "model.py").write_text(NANOGPT_STAND_IN)
    output = run_script("nanogpt_side_by_side.py", "--nanogpt", tmp_path, "--step-for-step", "--rounds", 2,
                        "--steps", 2, cwd=tmp_path)
    assert len([line for line in output.splitlines() if line.startswith("round ")]) == 2
    summary = next(line for line in output.splitlines() if line.startswith("all rounds"))
    for name in ("ours", "GPT-2"):
        ratio, low, high = (float(value) for value in re.search(
            rf"{name} / nanoGPT ([\d.]+) \[([\d.]+), ([\d.]+)\]", summary).groups())
        assert 0 < low <= ratio <= high


NANOGPT_PREPARE_STAND_IN = """
# Stands in for nanoGPT's data/shakespeare_char/prepare.py: the characters' ids as uint16 (train.bin, first 90%).
import numpy as np
text = open("input.txt").read()
stoi = {char: i for i, char in enumerate(sorted(set(text)))}
np.array([stoi[char] for char in text[:int(len(text) * 0.9)]], dtype=np.uint16).tofile("train.bin")
"""


def test_the_nanogpt_side_by_side_pairs_each_step_of_our_command_with_an_iteration_of_nanogpts_loop(tmp_path):
    """`--paired-steps N` runs our command (scripts/train.py, in the script's process) for N steps, an iteration of
    nanoGPT's own loop before each of Trainer's steps, and prints the median of the pairs' ratios with an interval;
    the first 10 pairs are left out. Without --nanogpt it names what it needs."""
    (tmp_path / "model.py").write_text(NANOGPT_STAND_IN)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "prepare.py").write_text(NANOGPT_PREPARE_STAND_IN)
    output = run_script("nanogpt_side_by_side.py", "--nanogpt", tmp_path, "--work-dir", tmp_path / "work",
                        "--paired-steps", 13, cwd=tmp_path)
    summary = next(line for line in output.splitlines() if "paired steps" in line)
    assert "2 paired steps" in summary and "evaluation: loss" in output  # 12 pairs (the first step opens one), 10 out
    ratio, low, high = (float(value) for value in re.search(
        r"ours / nanoGPT ([\d.]+) \[95% bootstrap interval ([\d.]+), ([\d.]+)\]", summary).groups())
    assert 0 < low <= ratio <= high
    # nanoGPT's vocabulary: the corpus's 65 characters after our 4 special tokens, the model's rows not rounded up
    assert json.loads((tmp_path / "work" / "ours" / "model" / "config.json").read_text())["vocab_size"] == 69
    output = run_script("nanogpt_side_by_side.py", "--paired-steps", 13, cwd=tmp_path, returncode=2)
    assert "--paired-steps needs --nanogpt" in output


NANOGPT_TRAIN_STAND_IN = """
# nanoGPT's train.py prints an evaluation every eval_interval (250) iterations, in the iteration's time, and a line
# per iteration; this one prints the same lines, the evaluations' iterations 10x slower.
for i in range(0, 501):
    if i % 250 == 0:
        print(f"step {i}: train loss {4 - i / 250:.4f}, val loss {4.5 - i / 250:.4f}")
    print(f"iter {i}: loss 3.0000, time {100.0 if i % 250 == 0 else 10.0:.2f}ms, mfu 1.00%")
"""


def test_the_nanogpt_side_by_side_splits_the_corpus_and_reads_nanogpts_log_as_nanogpt_does(tmp_path, monkeypatch):
    """Both sides train on the first 90% of the characters (nanoGPT's prepare.py: `data[:int(n*0.9)]`); nanoGPT's
    loss is its last validation loss and its step time leaves out the iterations that also evaluated."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_side_by_side", ROOT / "scripts" / "nanogpt_side_by_side.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    text = script.CORPUS.read_text()
    split = script.corpus_split()
    assert split["train.txt"] == text[:int(len(text) * 0.9)] and split["train.txt"] + split["val.txt"] == text
    data = tmp_path / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    (data / "prepare.py").write_text("")
    (tmp_path / "train.py").write_text(NANOGPT_TRAIN_STAND_IN)
    result = script.run_nanogpt(tmp_path)
    assert (data / "input.txt").read_text() == text
    assert result["val_loss"] == 2.5 and result["step_ms"] == 10.0
    assert result["train_seconds"] == pytest.approx((498 * 10.0 + 3 * 100.0) / 1000)


def test_the_nanogpt_side_by_side_keeps_a_users_files_and_names_a_missing_checkout(tmp_path):
    """--work-dir userwork (relative) wrote Tiny Shakespeare over the user's own userwork/train.txt, then failed (the
    training ran from the checkout's root); a --nanogpt without model.py failed with a ModuleNotFoundError."""
    (tmp_path / "userwork").mkdir()
    (tmp_path / "userwork" / "train.txt").write_text("MY OWN TRAINING DATA")
    output = run_script("nanogpt_side_by_side.py", "--work-dir", "userwork", cwd=tmp_path, returncode=2)
    assert f"--work-dir {tmp_path / 'userwork'} holds a train.txt this script did not write" in output
    assert (tmp_path / "userwork" / "train.txt").read_text() == "MY OWN TRAINING DATA"
    (tmp_path / "userwork" / "notes.md").write_text("mine")
    (tmp_path / "userwork" / "train.txt").unlink()
    output = run_script("nanogpt_side_by_side.py", "--work-dir", "userwork", cwd=tmp_path, returncode=2)
    assert "holds files this script did not write (notes.md)" in output
    output = run_script("nanogpt_side_by_side.py", "--nanogpt", tmp_path, "--step-for-step", cwd=tmp_path,
                        returncode=2)
    assert f"--nanogpt {tmp_path}: no model.py there" in output and "Traceback" not in output
