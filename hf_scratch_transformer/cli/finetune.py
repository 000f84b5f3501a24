"""Fine-tune a saved model for text or token classification with `Trainer`, reporting accuracy and macro-F1 (a score
per text with --regression: the MSE and Pearson's and Spearman's correlations, as run_glue reports STS-B; and,
for entity tags such as B-PER / I-PER / O, entity-level precision, recall and F1 as seqeval and run_ner compute them),
for extractive question answering, reporting SQuAD's exact match and F1 (as run_qa computes them), or for multiple
choice, reporting accuracy (as run_swag does):

    hf-scratch finetune --model outputs/masked-lm/model --task text-classification \\
        --train-file train.csv --validation-file dev.csv --text-column sentence --label-column label
    hf-scratch finetune --model outputs/masked-lm/model --task token-classification \\
        --train-file train.json --tokens-column tokens --label-column ner_tags
    hf-scratch finetune --model path/to/native-bert-folder --task text-classification --dataset imdb
    hf-scratch finetune --model outputs/masked-lm/model --task question-answering --dataset squad
    hf-scratch finetune --model outputs/masked-lm/model --task multiple-choice --train-file train.jsonl

The model is one of ours (any family with the task's head: decoder or encoder, encoder alone for multiple choice),
or a saved native GPT-2 / Llama / Mistral / Qwen2 / BERT folder, converted first with
`hf_scratch_transformer.conversion.from_hf`. Data: local CSV / JSON files or a `datasets` name; question answering
reads SQuAD's columns (question, context, and answers as {"text": [...], "answer_start": [...]}, empty lists for a
question the context does not answer, as SQuAD 2.0); multiple choice reads a question (any first text), a list of
choices, as many in every row, and the right choice's index from 0 (SWAG's columns map to these: docs/training.md).
Writes OUTPUT_DIR/model (Hub-ready, with eval_results.json) and
OUTPUT_DIR/checkpoints. To continue causal-LM or seq2seq training of a saved model instead, use
`hf-scratch train --model FOLDER`.
"""

import argparse
import json
import os
from pathlib import Path

import torch
import transformers
from datasets import DatasetDict
from transformers import (
    AutoConfig,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    DataCollatorForMultipleChoice,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    TrainingArguments,
    set_seed,
)

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_command import command_help, is_rank_zero
from hf_scratch_transformer import (
    ScratchEncoderConfig,
    evaluation,
    hub,
    mixed_precision,
    multiple_choice,
    question_answering,
    training,
    training_data,
)
from hf_scratch_transformer.checkpointing import TRAINER_PREFIX, CheckpointError, checkpoint_to_resume
from hf_scratch_transformer.cli.output_folder import add_run_safety_arguments, claim_output_dir, remove_the_earlier_run
from hf_scratch_transformer.cli.run_data import data_settings, dataset_name, on_the_hub
from hf_scratch_transformer.cli.run_errors import fail, say
from hf_scratch_transformer.cli.run_options import (
    RunParser,
    absolute_positions,
    check_model_fits,
    check_model_folder,
    freeze_imported_objects,
    load_tokenizer,
    local_path,
    model_tokenizer,
    positive_float,
    positive_int,
    random_seed,
    read_config_file,
    refuse_another_tokenizer,
    refuse_force_bf16_alone,
    refuse_fp16_on_cpu,
    refuse_lone_processes,
    repo_id,
    sequence_length,
    stop_cleanly_on_ctrl_c,
    train_until_stopped,
    trainer_model_folder,
)
from hf_scratch_transformer.conversion import CONVERTERS, LANGUAGE_MODEL_CONVERTERS, from_hf
from hf_scratch_transformer.sharding import ShardedTrainer
from hf_scratch_transformer.trainer_checkpoints import CrashSafeTrainer
from tokenizer_training import load_data

# model_type -> the native class `from_hf` converts. Llama, Mistral and Qwen2 folders, left out, trained as the native
# classifier with a card naming ours; other native models are refused (`check_model_folder`).
NATIVE_LMS = {(native := getattr(transformers, name)).config_class.model_type: native
              for name in LANGUAGE_MODEL_CONVERTERS}
HEADS = {"text-classification": AutoModelForSequenceClassification,
         "token-classification": AutoModelForTokenClassification,
         "question-answering": AutoModelForQuestionAnswering,
         "multiple-choice": AutoModelForMultipleChoice}
HEAD_SUFFIXES = {"text-classification": "ForSequenceClassification", "token-classification": "ForTokenClassification",
                 "question-answering": "ForQuestionAnswering", "multiple-choice": "ForMultipleChoice"}
MODELS_WITH_HEAD = {"text-classification": "a decoder or an encoder of ours, or a native GPT-2, Llama, Mistral, Qwen2 "
                                           "or BERT",
                    "token-classification": "a decoder or an encoder of ours, or a native GPT-2, Llama, Mistral, Qwen2 "
                                            "or BERT",
                    "question-answering": "a decoder or an encoder of ours, or a native GPT-2, Llama, Mistral, Qwen2 "
                                          "or BERT",
                    "multiple-choice": "an encoder of ours, or a native BERT"}
QUESTION_ANSWERING, MULTIPLE_CHOICE = "question-answering", "multiple-choice"
UNCLASSED = (QUESTION_ANSWERING, MULTIPLE_CHOICE)  # tasks whose labels are positions, not classes
# BERT's own class for the task where it reads [CLS] through its pooler, as run_glue and run_swag fine-tune BERT
POOLED_BERT = {"text-classification": transformers.BertForSequenceClassification,
               MULTIPLE_CHOICE: transformers.BertForMultipleChoice}
# The data columns each task reads: option -> its default column
COLUMNS = {"text-classification": {"--text-column": "text", "--label-column": "label"},
           "token-classification": {"--tokens-column": "tokens", "--label-column": "label"},
           QUESTION_ANSWERING: {"--question-column": "question", "--context-column": "context",
                                "--answers-column": "answers"},
           MULTIPLE_CHOICE: {"--question-column": "question", "--choices-column": "choices",
                             "--label-column": "label"}}
FORMATS = (".csv", ".json", ".jsonl")  # the data files with named columns (`load_data` reads them)


def step_budget(text: str) -> int:
    """--max-steps: a positive count, or -1 for Trainer's "train for --epochs"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1 and value != -1:
        raise argparse.ArgumentTypeError(f"must be >= 1, or -1 to train for --epochs; got {text}")
    return value


class ClassificationTrainer(training.ParametersCountedOnce, evaluation.TokenWeightedEvaluationLoss, ShardedTrainer,
                            CrashSafeTrainer):
    """FSDP under an FSDP launch, on CPU processes too, with a final folder of the full weights (`ShardedTrainer`, as
    `train`'s): Accelerate ran such a launch on CPU as DDP without a word, and `Trainer.save_model` writes no weights
    under FSDP's sharded state dict. Its evaluation loss counts each labelled word (sentences carry different numbers
    of them) or text alike, in any number of processes."""


# ----------------------------------------------------------------------------------------------- arguments
parser = RunParser(description=command_help(__doc__),
                   formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--model", type=local_path(), required=True,
                    help="a saved folder: ours, or native GPT-2 / Llama / Mistral / Qwen2 / BERT")
parser.add_argument("--task", choices=sorted(HEADS), required=True)
parser.add_argument("--output-dir", type=Path, help="default: outputs/<task>")
parser.add_argument("--train-file", help="CSV (.csv), JSON or JSON lines (.json, .jsonl) file")
parser.add_argument("--validation-file", help="default: 10%% of the training file")
parser.add_argument("--dataset", help="instead of files: a `datasets.load_dataset` name, a folder, or a data file")
parser.add_argument("--dataset-config", help="--dataset's configuration")
parser.add_argument("--text-column", help="text-classification input (default text)")
parser.add_argument("--tokens-column", help="token-classification input words (default tokens)")
parser.add_argument("--label-column", default="label",
                    help="label, list of labels per word, or the right choice's index (default label)")
parser.add_argument("--question-column", help="question-answering and multiple-choice question (default question)")
parser.add_argument("--context-column", help="question-answering context the answer is in (default context)")
parser.add_argument("--answers-column", help='question-answering answers, {"text": [...], "answer_start": [...]} '
                                             "(default answers)")
parser.add_argument("--choices-column", help="multiple-choice choices: a list of texts per row (default choices)")
parser.add_argument("--max-length", type=sequence_length,
                    help="tokens per text, >= 3 (default 128, or the model's absolute positions if fewer)")
parser.add_argument("--doc-stride", type=positive_int,
                    help="question-answering: tokens shared by the windows of a context longer than --max-length "
                         "(default a quarter of --max-length)")
parser.add_argument("--epochs", type=positive_float, default=3.0, help="default 3")
parser.add_argument("--max-steps", type=step_budget, default=-1, help="overrides --epochs when > 0 (default -1)")
parser.add_argument("--batch-size", type=positive_int, default=16, help="default 16")
parser.add_argument("--learning-rate", type=positive_float, default=5e-5, help="default 5e-5")
parser.add_argument("--seed", type=random_seed, default=42, help="default 42")
parser.add_argument("--regression", action="store_true",
                    help="text-classification of a score per text (one output, mean squared error), as run_glue "
                         "fine-tunes STS-B: reports the MSE and Pearson's and Spearman's correlations")
parser.add_argument("--classifier-pooler", action="store_true",
                    help="text-classification and multiple-choice of an encoder: read [CLS] through BERT's pooler (a "
                         "dense layer and tanh, new where the model has none) before the classifier, so that the "
                         "model exports to BERT's class (a native BERT is always fine-tuned so)")
parser.add_argument("--force-bf16", action="store_true",
                    help="the launch config's bf16 even on a CPU where it is slower than fp32")
parser.add_argument("--model-name", type=repo_id, help="the card's title and repo id (default: scratch-<task>-<data>)")
parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies")
add_run_safety_arguments(parser)
args = parser.parse_args()
stop_cleanly_on_ctrl_c()  # one line, exit status 130, not a traceback from every process (scripts/finetune.py)
freeze_imported_objects()
check_model_folder(parser, args.model, converts=NATIVE_LMS)
refuse_force_bf16_alone(parser, args.force_bf16, os.environ.get("ACCELERATE_MIXED_PRECISION", "no"),
                        "bf16 to the launch (`accelerate launch --mixed_precision bf16`, or its config's)")
# A family without the task's head: the Auto class failed with a traceback after the data work. A native model is
# judged by the family it converts to (a native Marian was converted first, then refused). A local folder's type is
# read from its config.json: no model work before the data checks.
saved = read_config_file(args.model)
model_type = saved["model_type"] if saved else AutoConfig.from_pretrained(args.model).model_type  # else a Hub id
family = (LANGUAGE_MODEL_CONVERTERS[NATIVE_LMS[model_type].__name__].ours.config_class if model_type in NATIVE_LMS
          else transformers.CONFIG_MAPPING[model_type])
if family not in HEADS[args.task]._model_mapping:
    parser.error(f"--model {args.model}: a {model_type} model has no {args.task} head; {args.task} fine-tunes "
                 f"{MODELS_WITH_HEAD[args.task]}")
if args.classifier_pooler and (args.task not in POOLED_BERT or family is not ScratchEncoderConfig):
    parser.error(f"--classifier-pooler: BERT's pooler goes with --task {' or '.join(POOLED_BERT)} of an encoder (ours "
                 f"or a native BERT); --model {args.model} is a {model_type} model, --task {args.task}")
set_seed(args.seed)
output_dir = args.output_dir or Path("outputs") / args.task
claim_output_dir(parser, output_dir, args.resume, args.overwrite_output_dir, is_rank_zero(), model=args.model)
resumed = None  # the checkpoint this run continues: chosen before any work
if args.resume:
    try:
        resumed = checkpoint_to_resume(output_dir / "checkpoints", TRAINER_PREFIX, print if is_rank_zero() else None)
    except CheckpointError as error:
        parser.error(str(error))
# The checkpoint's weights were fine-tuned on the ids of its run's tokenizer, which Trainer saves in it: another
# --model of the same shapes (a base trained with another vocabulary) went on under them, tokenizing the data with its
# own ids, and its tokenizer was saved into the model folder, without a word.
if resumed is not None and (resumed / "tokenizer_config.json").is_file():
    refuse_another_tokenizer(parser, model_tokenizer(args.model), load_tokenizer(parser, resumed), resumed,
                             remedy="resume with the run's own --model")

# ----------------------------------------------------------------------------------------------- data
# Everything about the data is checked here, before the model is built: `datasets` and the label mapping would
# otherwise report a bad file, a missing label or a label the training data lacks deep inside, with a traceback.


def load_data_file(option: str, path: str):
    """The rows of a local CSV or JSON lines file, or an error naming `path` and what is wrong with it."""
    file = Path(path)
    if not file.is_file():
        parser.error(f"{option} {path}: no such file")
    if file.suffix.lower() not in FORMATS:  # DATA.CSV too, as Windows tools name files
        fail(parser, f"{option} {path}: unsupported format {file.suffix or '(no extension)'!r}; use CSV (.csv) or "
                     "JSON lines (.json, .jsonl)")
    if args.task != "text-classification" and file.suffix.lower() == ".csv":
        held = {"token-classification": "a list of words and a list of labels",
                QUESTION_ANSWERING: 'SQuAD\'s answers ({"text": [...], "answer_start": [...]})',
                MULTIPLE_CHOICE: "a list of choices"}[args.task]
        fail(parser, f"{option} {path}: {args.task.replace('-', ' ')} needs {held} per row, which CSV cannot hold: "
                     "use JSON lines (.json, .jsonl)")
    try:
        return load_data(file, split="train")  # binary, not UTF-8, unparsable, no rows
    except ValueError as error:
        fail(parser, f"{option} {error}")


def rows(indices: list[int]) -> str:
    shown = ", ".join(str(i + 1) for i in indices[:5]) + (f" and {len(indices) - 5} more" if len(indices) > 5 else "")
    return f"row{'s' if len(indices) > 1 else ''} {shown} (counted from 1, after any header)"


def class_order(name: str) -> tuple:
    """Sort key of class names: integers in numeric order, so that labels 0..N-1 keep their ids (as text, "10" comes
    before "2"), then the other names alphabetically."""
    try:
        return 0, int(name), name
    except ValueError:
        return 1, 0, name


def label_key(value) -> str:
    """A label as a class name: whole floats (CSV columns with gaps are read as floats) as their integer."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def check_label_shapes(where: str, data) -> None:
    """An error naming the rows whose labels are not shaped for the task: one label per text, or a list of words
    (strings) and a list of as many labels. Checked for `datasets` ClassLabel columns too, whose ids need no other
    check: a ClassLabel list per text, or a label list longer or shorter than its words, failed midway through
    tokenizing with a traceback, or had its extra labels left out without a word."""
    if args.task == "text-classification":
        if lists := [index for index, value in enumerate(data[args.label_column]) if isinstance(value, list)]:
            fail(parser, f"{where}: labels in {args.label_column!r} that are neither class names nor integer ids "
                         "(lists: text classification reads one class per text, multi-label classification is not "
                         f"offered; a label per word is --task token-classification) in {rows(lists)}")
        return
    malformed, mismatched, not_words = [], [], []
    for index, (words, labels) in enumerate(zip(data[input_column], data[args.label_column], strict=True)):
        if not isinstance(words, list) or not isinstance(labels, list):
            malformed.append(index)
        elif len(words) != len(labels):
            mismatched.append(index)
        elif not all(isinstance(word, str) for word in words):
            not_words.append(index)
    if malformed:
        fail(parser, f"{where}: token classification needs lists in {input_column!r} and {args.label_column!r}, "
                     f"one label per word; not lists in {rows(malformed)}")
    # A null word was tokenized as the text "None" (a null first word, or numbers, failed in the tokenizer)
    if not_words:
        fail(parser, f"{where}: words in {input_column!r} that are not text (missing, or numbers) in "
                     f"{rows(not_words)}: each word is a string")
    if mismatched:
        first = data[mismatched[0]]
        fail(parser, f"{where}: the number of labels differs from the number of words in {rows(mismatched)}; "
                     f"row {mismatched[0] + 1} has {len(first[input_column])} words in {input_column!r} and "
                     f"{len(first[args.label_column])} labels in {args.label_column!r}: give one label per word")


def check_labels(where: str, data) -> set[str]:
    """The label names of one split (shaped for the task: `check_label_shapes`), or an error naming the rows
    whose labels are missing or malformed."""
    missing, fractional, malformed = [], [], []
    labels = data[args.label_column]
    values = [[value] for value in labels] if args.task == "text-classification" else labels
    for index, row in enumerate(values):
        for value in row:
            # None, NaN, or a blank name (JSON's ""), which trained as a class named ""
            if value is None or (isinstance(value, float) and value != value) or (
                    isinstance(value, str) and not value.strip()):
                missing.append(index)
            elif isinstance(value, float) and not value.is_integer():
                fractional.append(index)
            elif not isinstance(value, str | int | float):  # whole floats are ids (`label_key`): a column of 0.0, 1.0
                malformed.append(index)
    if missing:
        fail(parser, f"{where}: the label column {args.label_column!r} has no value in {rows(sorted(set(missing)))}")
    if fractional:
        fail(parser, f"{where}: fractional labels in {args.label_column!r} (scores for regression?) in "
                     f"{rows(sorted(set(fractional)))}: classification needs class names or integer ids; "
                     "--regression fine-tunes a score per text")
    if malformed:
        fail(parser, f"{where}: labels in {args.label_column!r} that are neither class names nor integer ids "
                     f"in {rows(sorted(set(malformed)))}")
    return {label_key(value) for row in values for value in row}


if (args.train_file is None) == (args.dataset is None):
    parser.error("give --train-file or --dataset")
if args.validation_file and not args.train_file:
    parser.error("--validation-file goes with --train-file (a --dataset brings its own validation split)")
if args.dataset_config and not args.dataset:
    parser.error("--dataset-config goes with --dataset")


def option_value(option: str):
    """The value of a column option; None where it was not given (its default: --label-column's is "label")."""
    value = getattr(args, option[2:].replace("-", "_"))
    return None if value == parser.get_default(option[2:].replace("-", "_")) else value


if given := [option for task_columns in COLUMNS.values() for option in task_columns
             if option not in COLUMNS[args.task] and option_value(option)]:
    read = ", ".join(option for option in COLUMNS[args.task] if option != "--label-column")
    parser.error(f"{given[0]}: not an input of --task {args.task} (its input column{'s' * (',' in read)}: {read})")
if args.regression and args.task != "text-classification":
    parser.error(f"--regression: goes with --task text-classification (a score per text), not --task {args.task}")
if args.doc_stride and args.task != QUESTION_ANSWERING:
    parser.error(f"--doc-stride: goes with --task {QUESTION_ANSWERING} (its windows over long contexts)")
columns = {option: option_value(option) or default for option, default in COLUMNS[args.task].items()}  # the names
for index, first in enumerate(columns):
    if same := [second for second in list(columns)[index + 1:] if columns[second] == columns[first]]:
        parser.error(f"{first} and {same[0]} both name the column {columns[first]!r}: the {args.task} data has "
                     f"{len(columns)} columns, {', '.join(columns)}")
if args.train_file:
    raw = DatasetDict({"train": load_data_file("--train-file", args.train_file)})
    if args.validation_file:
        raw["validation"] = load_data_file("--validation-file", args.validation_file)
else:
    try:
        raw = load_data(args.dataset, args.dataset_config)  # a name, a local folder, or a single local file
    except ValueError as error:
        parser.error(f"--dataset {error}")
    if "train" not in raw:
        fail(parser, f"--dataset {args.dataset}: no 'train' split (it has {', '.join(raw)})")
    # The splits this command uses: a test split, often unlabelled, would be refused for labels it never needs
    raw = DatasetDict({split: raw[split] for split in ("train", "validation") if split in raw})
sources = {"train": args.train_file, "validation": args.validation_file}
where = {split: f"--{split}-file {sources[split]}" if sources.get(split) else f"the {split!r} split" for split in raw}
input_column = columns.get("--text-column") or columns.get("--tokens-column")  # classification's
question_column, context_column, answers_column = (columns.get(option) for option in COLUMNS[QUESTION_ANSWERING])
choices_column = columns.get("--choices-column")


def check_squad_rows(where: str, data) -> None:
    """An error naming the rows of question-answering data that are not SQuAD's: a question and a context (text),
    and answers whose texts stand at their answer_start in the context. A misplaced answer trained the model on
    another span without a word (or, outside every window, on no answer)."""
    problems = question_answering.answer_problems(data[question_column], data[context_column],
                                                  data[answers_column])
    described = {
        "question": f"the question column {question_column!r} holds no text",
        "context": f"the context column {context_column!r} holds no text",
        "answers": f'the answers in {answers_column!r} are not SQuAD\'s {{"text": [...], "answer_start": [...]}} '
                   "(two lists of the same length: texts, and their first character's index in the context)",
        "misplaced": f"an answer's text in {answers_column!r} is not at its answer_start in the context "
                     f"({context_column!r}; answer_start counts characters from 0)",
    }
    for problem, indices in problems.items():
        fail(parser, f"{where}: {described[problem]} in {rows(indices)}")


def check_choice_rows(where: str, data, count: int | None) -> None:
    """An error naming the rows of multiple-choice data without a question, without a list of two or more choice
    texts, with another number of choices than `count` (the training data's first row's: a batch holds one number,
    and the collator failed midway through training), or whose label is not the index of one of their choices."""
    problems = multiple_choice.choice_problems(data[question_column], data[choices_column], data[args.label_column],
                                               count)
    described = {
        "question": f"the question column {question_column!r} holds no text",
        "choices": f"the choices in {choices_column!r} are not a list of two or more texts",
        "count": f"the number of choices in {choices_column!r} is not {count}, that of the first training row "
                 "(every row needs as many)",
        "label": f"the label in {args.label_column!r} is not the index of one of the row's choices (an integer, "
                 "counted from 0)",
    }
    for problem, indices in problems.items():
        if indices:
            fail(parser, f"{where}: {described[problem]} in {rows(indices)}")


def check_questions_fit() -> None:
    """Sets --doc-stride's default, a quarter of --max-length, shortened where a long question leaves less room for
    the context; an error naming the rows whose question leaves the context no room at --max-length, or whose room
    is no more than a --doc-stride given: the tokenizer panicked in Rust midway through the data ("`stride` must be
    strictly less than `max_len`")."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    room = {}  # split -> the context tokens each row's window holds
    for split in raw:
        questions = tokenizer(list(raw[split][question_column]), add_special_tokens=False, verbose=False)["input_ids"]
        room[split] = [args.max_length - specials - len(question) for question in questions]
    least = min(min(rooms) for rooms in room.values())
    if args.doc_stride is None:
        args.doc_stride = max(0, min(args.max_length // 4, least - 1))
    for split, rooms in room.items():
        if no_room := [row for row, tokens in enumerate(rooms) if tokens < 1]:
            fail(parser, f"{where[split]}: questions in {question_column!r} that leave their context no room in "
                         f"windows of --max-length {args.max_length} tokens in {rows(no_room)}; row {no_room[0] + 1}'s "
                         f"takes {args.max_length - rooms[no_room[0]]} with the special tokens: raise --max-length")
        if crowded := [row for row, tokens in enumerate(rooms) if tokens <= args.doc_stride]:
            fail(parser, f"{where[split]}: questions in {question_column!r} too long for windows of --max-length "
                         f"{args.max_length} tokens with --doc-stride {args.doc_stride} in {rows(crowded)}; row "
                         f"{crowded[0] + 1}'s leaves {rooms[crowded[0]]} tokens for its context, which must be more "
                         "than --doc-stride (the tokens windows share): raise --max-length, or lower --doc-stride")


def check_scores(where: str, data) -> None:
    """An error naming the rows of regression data whose label is not a number (missing, NaN, text, a list)."""
    if not_numbers := [index for index, value in enumerate(data[args.label_column])
                       if isinstance(value, bool) or not isinstance(value, int | float) or value != value]:
        fail(parser, f"{where}: --regression needs a number in the label column {args.label_column!r}; none in "
                     f"{rows(not_numbers)}")


def class_names_of(raw) -> tuple[list[str], list[str] | None]:
    """The classes of the labels in `raw`'s splits, in the order of their ids, and the names of a `datasets`
    ClassLabel column (None for other labels); an error naming the rows whose labels cannot be trained on."""
    labels_feature = raw["train"].features[args.label_column]
    # `datasets` ClassLabel columns hold ids already and carry their names; other labels are mapped to ids here, from
    # the whole training data (before a validation share is split off), and every other split must use only those.
    class_names = getattr(getattr(labels_feature, "feature", labels_feature), "names", None)
    if class_names:  # ClassLabel ids: -1 marks a row without a label (a test set's), which the loss cannot take
        for name in raw:
            ids = [row if isinstance(row, list) else [row] for row in raw[name][args.label_column]]  # per word, or one
            if unlabelled := [i for i, row in enumerate(ids) if min(row, default=0) < 0]:
                fail(parser, f"{where[name]}: the label column {args.label_column!r} has no value (id -1) in "
                             f"{rows(unlabelled)}")
        return class_names, class_names
    names = sorted(check_labels(where["train"], raw["train"]), key=class_order)
    for name in set(raw) - {"train"}:
        if unknown := check_labels(where[name], raw[name]) - set(names):
            fail(parser, f"{where[name]}: labels {sorted(unknown)} do not occur in the training data "
                         f"({where['train']}), whose labels are {names}")
    if len(names) < 2:
        fail(parser, f"{where['train']}: every row has the label {names[0]!r}; classification needs two or more")
    return names, None


for name in raw:
    for column in columns.values():
        if column not in raw[name].column_names:
            fail(parser, f"{where[name]}: the data has no column {column!r}; columns: {raw[name].column_names}")
    # An empty CSV cell is None, which the tokenizer would fail on midway; an empty text is no tokens at all for a
    # tokenizer without special tokens (GPT-2's): a traceback at its batch, or a row of padding only.
    if args.task == "text-classification":
        if no_text := [i for i, text in enumerate(raw[name][input_column])
                       if not isinstance(text, str) or not text.strip()]:
            fail(parser, f"{where[name]}: the text column {input_column!r} holds no text in {rows(no_text)}")
    if args.task == QUESTION_ANSWERING:
        check_squad_rows(where[name], raw[name])
    elif args.task == MULTIPLE_CHOICE:
        check_choice_rows(where[name], raw[name], multiple_choice.choice_count(raw["train"][choices_column]))
    else:
        check_label_shapes(where[name], raw[name])
    if args.regression:
        check_scores(where[name], raw[name])
names, class_names = class_names_of(raw) if args.task not in UNCLASSED and not args.regression else (None, None)
# SQuAD 2.0's rule: the model may answer none where its training data has questions without an answer
may_answer_none = args.task == QUESTION_ANSWERING and question_answering.has_no_answer(raw["train"][answers_column])
# What the card's figures were measured on: its "Dataset" column names the training data, whatever was evaluated
evaluated_on = (f"`{Path(args.validation_file).name}`" if args.validation_file
                else "its 'validation' split" if "validation" in raw else "10% of the training data, held out")
if "validation" not in raw and raw["train"].num_rows < 2:
    fail(parser, f"{where['train']}: holds {raw['train'].num_rows} row(s), too few to split off a validation set; "
                 "give --validation-file")

# ----------------------------------------------------------------------------------------------- model
config = AutoConfig.from_pretrained(args.model)
earlier_heads = [name for name in config.architectures or [] if name.endswith(tuple(HEAD_SUFFIXES.values()))]
# A model of this task fine-tuned further (a classifier: on the classes it knows) keeps its head and their order: each
# row of its head stays the class it was trained for (in the data's order, the names of its rows would be swapped).
# Any other head is drawn anew (below): with as many classes, a classifier's rows for "a" and "b" served "c" and "d".
# A regressor (one output) goes on as one; a classifier's head is drawn anew for regression, and a regressor's for
# classes.
regressor = config.num_labels == 1 and config.problem_type == "regression"
same_head = (any(name.endswith(HEAD_SUFFIXES[args.task]) for name in earlier_heads)
             and (regressor if args.regression else names is None or set(config.label2id) == set(names)))
if args.task in UNCLASSED:  # a start and an end logit per token, or a score per choice: transformers' default labels
    head = dict(num_labels=2, id2label={i: f"LABEL_{i}" for i in range(2)}, problem_type=None)
elif args.regression:  # one score per text: transformers' labels of one output, the mean squared error
    head = dict(num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0}, problem_type="regression")
else:
    if same_head:
        names = sorted(names, key=config.label2id.get)
    label2id = {name: i for i, name in enumerate(names)}
    head = dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id,
                problem_type="single_label_classification")  # what this command trains, whatever the base did


def label_id(value) -> int:
    if class_names:  # a ClassLabel id, in the dataset's order of names
        return label2id[class_names[value]]
    return label2id[label_key(value)]


tokenizer_folder = model_tokenizer(args.model)
tokenizer = load_tokenizer(parser, tokenizer_folder)  # before any model work: it may not pad batches
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token  # GPT-2 has no padding token
if tokenizer.pad_token is None:  # else "Asking to pad but the tokenizer does not have a padding token" at a batch
    fail(parser, f"the tokenizer in {tokenizer_folder} has no pad_token, nor an eos_token to pad with, "
                 "which batches of texts need: set one (tokenizer.pad_token = ..., then save_pretrained)")
base = None
if config.model_type in NATIVE_LMS:  # a native checkpoint: convert it, then build the head on our weights
    # In memory: written to a temporary folder and loaded from there, a copy of the base model's size stayed on disk
    # for good when the run was killed before it was removed. A native head of this task (and these classes) that
    # `from_hf` converts (the sequence classifiers, BERT's other task heads) comes with it, trained on as ours would be.
    whole = next((name for name in earlier_heads if same_head and name in CONVERTERS), None)
    # BERT classifies a sequence, and scores a choice, through its pooler: loaded as BERT's own class of the task (its
    # pooler from the checkpoint where it holds one, a new classifier), as run_glue and run_swag fine-tune BERT, the
    # model exports back to BERT's class
    pooled = not whole and args.task in POOLED_BERT and config.model_type == "bert"
    if whole:
        native = getattr(transformers, whole).from_pretrained(args.model)
    elif pooled:
        native = POOLED_BERT[args.task].from_pretrained(
            args.model, ignore_mismatched_sizes=True, **{key: head[key] for key in ("num_labels", "id2label",
                                                                                 "label2id") if key in head})
    else:
        native = NATIVE_LMS[config.model_type].from_pretrained(args.model)
    base = from_hf(native)
    del native
    if whole:
        say(f"{args.model}: converted to {type(base).__name__} in memory (`from_hf`), its {args.task} head with it")
    elif pooled:
        say(f"{args.model}: converted to {type(base).__name__} in memory (`from_hf`) as "
            f"{POOLED_BERT[args.task].__name__}: its pooler where the checkpoint holds one, a new classifier "
            "(transformers' load report above)")
    else:
        say(f"{args.model}: converted to {type(base).__name__} in memory (`from_hf`); the {args.task} head is built "
            "on it (transformers' load report below reads \"from: None\")")
    if earlier_heads and not whole and not pooled:
        say(f"note: {args.model} is a {earlier_heads[0]}; only its language model is converted (`from_hf`), so its "
            f"head is left out and {args.task} trains a new head")
# A decoder's tokenizer pads on the left for batched generation; with absolute positions, a left-padded text's tokens
# then take positions that depend on the longest text of its batch. Classifiers find the last real token on either
# side, so they pad on the right (as GPT-2's tokenizer does), in training and in the saved folder's pipelines.
tokenizer.padding_side = "right"
head["pad_token_id"] = tokenizer.pad_token_id
if args.classifier_pooler:
    head["classifier_pooler"] = True
if base is None:  # ignore_mismatched_sizes: a base classifier of other classes gets a new head
    model = training.load_to_train(HEADS[args.task], args.model, ignore_mismatched_sizes=True, **head)
else:
    model = training.head_on(HEADS[args.task], base, **head)
    del base  # the converted language model: freed, but for the weights the new model shares with it
if not same_head and earlier_heads:
    # the head: every module beside the base model, but BERT's pooler, which is its pretrained model's (`BertModel`'s)
    for name, module in model.named_children():
        if name not in (model.base_model_prefix, "pooler"):
            for parameter in module.parameters():
                parameter._is_hf_initialized = False  # loaded: transformers' init functions would leave it as it is
            module.apply(model._init_weights)
    say(f"note: {args.model} is a {earlier_heads[0]}"
        + (f" of {sorted(config.label2id)}" if "Classification" in earlier_heads[0] else "")
        + f"; {args.task}{f' on {names}' if names else ''} trains a new head")
training_data.keep_the_inputs_the_model_reads(tokenizer, model.config)  # a base saved before this was done
if args.max_length is None:  # as run_glue takes the model's maximum where it is below the default
    args.max_length = min(128, absolute_positions(model.config) or 128)
check_model_fits(parser, model, tokenizer, args.max_length)  # else a traceback at the first step, past 64 positions
# The saved folder's pipelines truncate to the tokenizer's model_max_length: the length trained at, or they cut texts
# shorter (a base trained at 32 tokens, fine-tuned at 64: words past 32 tokens went unlabelled) or longer.
tokenizer.model_max_length = args.max_length
if args.task == QUESTION_ANSWERING:
    check_questions_fit()
if "validation" not in raw:  # split off after every check, whose row numbers are the file's
    split = raw["train"].train_test_split(test_size=0.1, seed=args.seed)
    raw["train"], raw["validation"] = split["train"], split["test"]
say(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters"
    + (f", labels {names}" if names else ""))


def encode_labels(batch):
    if args.task == "text-classification":
        encoded = tokenizer(batch["inputs"], truncation=True, max_length=args.max_length)
        encoded["labels"] = [float(value) if args.regression else label_id(value) for value in batch["targets"]]
        return encoded
    # Each word after the first with the space before it in the text, which the pipeline reads: a byte-level BPE
    # tokenizer takes a word alone without it ('dog' where the text gives 'Ġdog'), so the model would learn other
    # tokens than it is given in use (run_ner loads such tokenizers with add_prefix_space); others drop the space.
    words = [[word if i == 0 else f" {word}" for i, word in enumerate(row)] for row in batch["inputs"]]
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=args.max_length)
    encoded["labels"] = []
    for row, word_labels in enumerate(batch["targets"]):
        previous, aligned = None, []
        for word in encoded.word_ids(row):  # label the first piece of each word; -100 for the rest
            aligned.append(-100 if word is None or word == previous else label_id(word_labels[word]))
            previous = word
        encoded["labels"].append(aligned)
    return encoded


# The columns read, under names that no output takes: `datasets.map` gives an output named as an input column
# (a CSV's "labels") that column's type, and class ids became the strings '0', '1'
if args.task == QUESTION_ANSWERING:
    used = {question_column: "question", context_column: "context", answers_column: "answers"}
    encode = question_answering.span_encoder(tokenizer, args.max_length, args.doc_stride)
elif args.task == MULTIPLE_CHOICE:
    used = {question_column: "question", choices_column: "choices", args.label_column: "label"}
    encode = multiple_choice.choice_encoder(tokenizer, args.max_length)
else:
    used = {input_column: "inputs", args.label_column: "targets"}
    encode = encode_labels
datasets = {split: training_data.truncated_map(raw[split].select_columns(list(used)).rename_columns(used), encode,
                                               tokenizer, with_indices=args.task == QUESTION_ANSWERING)
            for split in raw}
if args.task == QUESTION_ANSWERING:  # each window's row and context offsets: read by the metrics, not the model
    windows = datasets["validation"].select_columns(["example", "offset_mapping"])[:]
    datasets = {split: data.remove_columns(["example", "offset_mapping"]) for split, data in datasets.items()}
    compute_metrics = question_answering.answer_metrics(
        windows, list(raw["validation"][context_column]), list(raw["validation"][answers_column]), may_answer_none)
elif args.task == MULTIPLE_CHOICE:
    compute_metrics = evaluation.choice_accuracy
elif args.regression:
    compute_metrics = evaluation.regression_metrics
elif args.task == "text-classification":
    compute_metrics = evaluation.classification_metrics
else:
    compute_metrics = evaluation.token_classification_metrics(names)
collator = {"token-classification": DataCollatorForTokenClassification,
            MULTIPLE_CHOICE: DataCollatorForMultipleChoice}.get(args.task, DataCollatorWithPadding)(tokenizer)

# ----------------------------------------------------------------------------------------------- training
training.keep_freed_memory()  # each step's tensors reused, not faulted in again (docs/nanogpt.md)
preemption = training.Preemption()
trainer = ClassificationTrainer(
    model=model,
    args=TrainingArguments(
        output_dir=str(output_dir / "checkpoints"), num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate, warmup_steps=0.06, weight_decay=0.01, eval_strategy="epoch",
        save_strategy="epoch", save_total_limit=1, logging_steps=10, report_to=[], seed=args.seed,
        dataloader_pin_memory=torch.accelerator.is_available(),  # pinned host memory is for copies to a GPU
        ddp_find_unused_parameters=False,  # every parameter of the classifiers takes part in each step (test_presets)
    ),
    train_dataset=datasets["train"], eval_dataset=datasets["validation"], data_collator=collator,
    processing_class=tokenizer, step_settings={
        "max_length": args.max_length, "data": data_settings(args),
        # Without --max-steps, --epochs sets the steps and the schedule: changed on --resume, it went unsaid
        **({"epochs": args.epochs} if args.max_steps == -1 else {}),
        **({"doc_stride": args.doc_stride} if args.task == QUESTION_ANSWERING else {})},
    compute_metrics=compute_metrics,
    callbacks=[training.StopAfterStep(preemption=preemption)],
)
refuse_fp16_on_cpu(parser, trainer.args.mixed_precision, trainer.args.device)  # from the launch config
if refusal := mixed_precision.slow_bf16_refusal(trainer.args.mixed_precision, trainer.args.device, args.force_bf16,
                                                "the launch config's mixed_precision bf16"):
    parser.error(refusal)  # trained a hundred times slower without a word on a CPU without native bf16
refuse_lone_processes(parser, trainer)
remove_the_earlier_run(parser, output_dir, args.overwrite_output_dir, is_rank_zero())
train_until_stopped(parser, trainer, resumed, preemption)
reported = ("loss", "accuracy", "exact_match", "f1", "entity_precision", "entity_recall", "entity_f1",  # entity_*: IOB
            "mse", "pearson", "spearman")
results = {key.removeprefix("eval_"): value for key, value in trainer.evaluate().items()
           if key.removeprefix("eval_") in reported}
say("evaluation: " + ", ".join(f"{key} {value:.4f}" for key, value in results.items()))
folder = output_dir / "model"
with trainer_model_folder(parser, trainer, folder) as written:  # put in place complete; the others wait for it
    if trainer.is_world_process_zero():  # the main process writes the rest of the folder
        (written / "eval_results.json").write_text(json.dumps(results, indent=2))
        training.plot_loss_curve(trainer.state.log_history, written / "loss_curve.png", title=args.task)
        dataset = dataset_name(args.dataset) if args.dataset else Path(args.train_file).stem
        hub.write_model_card(
            written, task=args.task, preset=None,
            model_name=args.model_name or hub.default_repo_name("scratch", args.task, dataset),
            config=model.config.to_dict(), num_parameters=model.num_parameters(), dataset=dataset,
            dataset_on_hub=on_the_hub(args.dataset),
            dataset_description="" if args.dataset else "Files: " + ", ".join(
                f"`{Path(file).name}`" for file in (args.train_file, args.validation_file) if file),
            tokenizer_description=f"{type(tokenizer).__name__}, {len(tokenizer)} tokens (the base model's)",
            hyperparameters={"base_model": str(args.model), "epochs": args.epochs, "max_steps": args.max_steps,
                             "steps_trained": trainer.state.global_step,
                             "global_batch_size": args.batch_size * trainer.args.world_size,
                             "learning_rate": args.learning_rate, "mixed_precision": trainer.args.mixed_precision,
                             "evaluated_on": f"{evaluated_on}: {raw['validation'].num_rows} examples",
                             **({"doc_stride": args.doc_stride} if args.task == QUESTION_ANSWERING else {})},
            eval_results={("eval_loss" if key == "loss" else key): value for key, value in results.items()},
            model_class=type(model).__name__,
        )
if not trainer.is_world_process_zero():
    raise SystemExit(0)
print(f"saved a Hub-ready folder: {folder}")
