"""Fine-tune a saved model for text or token classification with `Trainer`, reporting accuracy and macro-F1:

    hf-scratch finetune --model outputs/masked-lm/model --task text-classification \\
        --train-file train.csv --validation-file dev.csv --text-column sentence --label-column label
    hf-scratch finetune --model outputs/masked-lm/model --task token-classification \\
        --train-file train.json --tokens-column tokens --label-column ner_tags
    hf-scratch finetune --model path/to/native-bert-folder --task text-classification --dataset imdb

The model is one of ours (any family with a classification head: decoder or encoder), or a saved native
GPT-2 / BERT folder, converted first with `hf_scratch_transformer.conversion.from_hf`. Data: local CSV / JSON
files or a `datasets` name. Writes OUTPUT_DIR/model (Hub-ready, with eval_results.json) and OUTPUT_DIR/checkpoints.
To continue causal-LM or seq2seq training of a saved model instead, use `hf-scratch train --model FOLDER`.
"""

import argparse
import json
import tempfile
from pathlib import Path

from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    TrainingArguments,
    set_seed,
)

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_transformer import training
from hf_scratch_transformer.checkpointing import CheckpointError, CrashSafeTrainer
from hf_scratch_transformer.cli.run_options import add_run_safety_arguments, claim_output_dir
from hf_scratch_transformer.conversion import from_hf

NATIVE_LMS = {"gpt2": AutoModelForCausalLM, "bert": AutoModelForMaskedLM}
HEADS = {"text-classification": AutoModelForSequenceClassification,
         "token-classification": AutoModelForTokenClassification}

# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--model", type=Path, required=True, help="a saved folder: ours, or native GPT-2 / BERT")
parser.add_argument("--task", choices=sorted(HEADS), required=True)
parser.add_argument("--output-dir", type=Path, help="default: outputs/<task>")
parser.add_argument("--train-file", help="CSV or JSON (lines) file")
parser.add_argument("--validation-file", help="default: 10%% of the training file")
parser.add_argument("--dataset", help="a `datasets.load_dataset` name or path instead of files")
parser.add_argument("--dataset-config")
parser.add_argument("--text-column", default="text", help="text-classification input (default text)")
parser.add_argument("--tokens-column", default="tokens", help="token-classification input words (default tokens)")
parser.add_argument("--label-column", default="label", help="label, or list of labels per word (default label)")
parser.add_argument("--max-length", type=int, default=128)
parser.add_argument("--epochs", type=float, default=3.0)
parser.add_argument("--max-steps", type=int, default=-1, help="overrides --epochs when > 0")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--learning-rate", type=float, default=5e-5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies")
add_run_safety_arguments(parser)
args = parser.parse_args()
set_seed(args.seed)
output_dir = args.output_dir or Path("outputs") / args.task
claim_output_dir(parser, output_dir, args.resume, args.overwrite_output_dir)

# ----------------------------------------------------------------------------------------------- data
if (args.train_file is None) == (args.dataset is None):
    parser.error("give --train-file or --dataset")
if args.train_file:
    extension = "csv" if args.train_file.endswith(".csv") else "json"
    files = {"train": args.train_file} | ({"validation": args.validation_file} if args.validation_file else {})
    raw = load_dataset(extension, data_files=files)
else:
    raw = load_dataset(args.dataset, args.dataset_config)
if "validation" not in raw:
    split = raw["train"].train_test_split(test_size=0.1, seed=args.seed)
    raw["train"], raw["validation"] = split["train"], split["test"]
input_column = args.text_column if args.task == "text-classification" else args.tokens_column
for column in (input_column, args.label_column):
    if column not in raw["train"].column_names:
        parser.error(f"the data has no column {column!r}; columns: {raw['train'].column_names}")

labels_feature = raw["train"].features[args.label_column]
# `datasets` ClassLabel columns hold ids already and carry their names; other labels are mapped to ids here.
class_names = getattr(getattr(labels_feature, "feature", labels_feature), "names", None)
values = raw["train"][args.label_column]
names = class_names or sorted({str(v) for row in values for v in (row if isinstance(row, list) else [row])})
label2id = {name: i for i, name in enumerate(names)}


def label_id(value) -> int:
    return value if class_names else label2id[str(value)]


# ----------------------------------------------------------------------------------------------- model
config = AutoConfig.from_pretrained(args.model)
source = args.model
if config.model_type in NATIVE_LMS:  # a native checkpoint: convert it, then build the head on our weights
    source = Path(tempfile.mkdtemp()) / "converted"
    from_hf(NATIVE_LMS[config.model_type].from_pretrained(args.model)).save_pretrained(source)
tokenizer = AutoTokenizer.from_pretrained(args.model)
if tokenizer.pad_token is None:
    tokenizer.pad_token = tokenizer.eos_token  # GPT-2 has no padding token
# A decoder's tokenizer pads on the left for batched generation; with absolute positions, a left-padded text's tokens
# then take positions that depend on the longest text of its batch. Classifiers find the last real token on either
# side, so they pad on the right (as GPT-2's tokenizer does), in training and in the saved folder's pipelines.
tokenizer.padding_side = "right"
model = HEADS[args.task].from_pretrained(
    source, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label2id,
    pad_token_id=tokenizer.pad_token_id,
)
print(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters, labels {names}")


def encode(batch):
    if args.task == "text-classification":
        encoded = tokenizer(batch[input_column], truncation=True, max_length=args.max_length)
        encoded["labels"] = [label_id(value) for value in batch[args.label_column]]
        return encoded
    encoded = tokenizer(batch[input_column], is_split_into_words=True, truncation=True, max_length=args.max_length)
    encoded["labels"] = []
    for row, word_labels in enumerate(batch[args.label_column]):
        previous, aligned = None, []
        for word in encoded.word_ids(row):  # label the first piece of each word; -100 for the rest
            aligned.append(-100 if word is None or word == previous else label_id(word_labels[word]))
            previous = word
        encoded["labels"].append(aligned)
    return encoded


datasets = raw.map(encode, batched=True, remove_columns=raw["train"].column_names, desc="tokenizing")
collator = (DataCollatorWithPadding(tokenizer) if args.task == "text-classification"
            else DataCollatorForTokenClassification(tokenizer))

# ----------------------------------------------------------------------------------------------- training
trainer = CrashSafeTrainer(
    model=model,
    args=TrainingArguments(
        output_dir=str(output_dir / "checkpoints"), num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate, warmup_steps=0.06, weight_decay=0.01, eval_strategy="epoch",
        save_strategy="epoch", save_total_limit=1, logging_steps=10, report_to=[], seed=args.seed,
    ),
    train_dataset=datasets["train"], eval_dataset=datasets["validation"], data_collator=collator,
    processing_class=tokenizer, compute_metrics=training.classification_metrics,
)
try:
    trainer.train(resume_from_checkpoint=True if args.resume else None)
except CheckpointError as error:  # found before any training step: say what is wrong, without a traceback
    parser.error(str(error))
results = {key.removeprefix("eval_"): value for key, value in trainer.evaluate().items()
           if key in ("eval_loss", "eval_accuracy", "eval_f1")}
print("evaluation: " + ", ".join(f"{key} {value:.4f}" for key, value in results.items()))
folder = output_dir / "model"
trainer.save_model(str(folder))
(folder / "eval_results.json").write_text(json.dumps(results, indent=2))
training.plot_loss_curve(trainer.state.log_history, folder / "loss_curve.png", title=args.task)
print(f"saved to {folder}")
