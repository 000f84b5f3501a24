"""Options and defaults shared by the two training entry points, `train.py` (Trainer) and `train_accelerate.py`
(Accelerate), so that both take the same data, model and tokenizer arguments."""

import argparse
from pathlib import Path

from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

from hf_scratch_transformer import training

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT / "data/tinyshakespeare/input.txt"
AUTO_MODEL = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
DEFAULTS = {  # task -> (preset, tokenizer kind, tokenizer family)
    "causal-lm": ("gpt-mini", "bpe", "decoder"),
    "masked-lm": ("bert-prenorm", "wordpiece", "encoder"),
    "seq2seq": ("transformer-base", "bpe", "seq2seq"),
}


def add_data_and_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The "data" and "model and tokenizer" argument groups."""
    data = parser.add_argument_group("data (default: the embedded Tiny Shakespeare)")
    data.add_argument("--train-files", nargs="+", help="text files, one document per paragraph")
    data.add_argument("--validation-files", nargs="+", help="default: 5%% of the training documents")
    data.add_argument("--source-files", nargs="+", help="seq2seq: source side, one sentence per line")
    data.add_argument("--target-files", nargs="+", help="seq2seq: target side, aligned with --source-files")
    data.add_argument("--validation-source", nargs="+")
    data.add_argument("--validation-target", nargs="+")
    data.add_argument("--dataset", help="a `datasets.load_dataset` name or path instead of files")
    data.add_argument("--dataset-config")
    data.add_argument("--dataset-name", help="the data's name on the model card (default: dataset or file name)")
    data.add_argument("--text-column", default="text")
    data.add_argument("--source-column", default="source")
    data.add_argument("--target-column", default="target")
    data.add_argument("--max-length", type=int, default=128, help="tokens per sequence (default 128)")
    model_args = parser.add_argument_group("model and tokenizer")
    model_args.add_argument("--model", type=Path, help="continue training a saved model folder (its tokenizer too)")
    model_args.add_argument("--preset", help="default: gpt-mini / bert-prenorm / transformer-base by task")
    model_args.add_argument("--config", type=Path, help="a config.json to build the model from instead of a preset")
    model_args.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides, JSON values")
    model_args.add_argument("--tokenizer", type=Path, help="a saved tokenizer folder; default: train one")
    model_args.add_argument("--tokenizer-kind", choices=["bpe", "wordpiece", "unigram"], help="default by task")
    model_args.add_argument("--vocab-size", type=int, default=4096, help="tokenizer vocabulary (default 4096)")


def load_run_data(args) -> tuple[DatasetDict, Dataset]:
    """The task's train/validation data from the parsed options, and the texts a new tokenizer learns from (for
    seq2seq both sides, since the vocabulary is shared)."""
    if args.task == "seq2seq":
        raw = training.load_parallel(
            args.source_files, args.target_files, args.validation_source, args.validation_target,
            dataset=args.dataset, dataset_config=args.dataset_config, source_column=args.source_column,
            target_column=args.target_column, seed=args.seed,
        )
        texts = raw["train"].map(lambda pair: {"text": pair["source"] + "\n" + pair["target"]},
                                 remove_columns=["source", "target"])
        return raw, texts
    files = args.train_files or (None if args.dataset else [str(DEFAULT_CORPUS)])
    raw = training.load_texts(files, args.dataset, args.dataset_config, args.text_column, args.validation_files,
                              seed=args.seed)
    return raw, raw["train"]
