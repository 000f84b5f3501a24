"""The data a training run reads, from its options: loaded for its task (`training_data`), and named as its
checkpoints record it and its model card shows it."""

import argparse
import sys
from pathlib import Path

from datasets import Dataset, DatasetDict

from hf_scratch_transformer import training_data
from hf_scratch_transformer.cli.run_errors import fail, note, say
from hf_scratch_transformer.data import DEFAULT_CORPUS


def load_run_data(parser: argparse.ArgumentParser, args) -> tuple[DatasetDict, Dataset]:
    """The task's train/validation data from the parsed options, and the texts a new tokenizer learns from (for
    seq2seq both sides, since the vocabulary is shared). Data the loaders refuse (a missing, empty or binary file,
    a missing column, parallel files of different lengths) stops the command with their message, no traceback; so
    does a file that cannot be opened (a path through a file: "Not a directory", no permission to read it)."""
    try:
        data = _load_run_data(args)
    except (ValueError, OSError) as error:
        fail(parser, str(error))
    # Said, not refused (a model's fit to its own training text is worth a look too): else the validation loss, and
    # the card's figures taken from it, passed for a measure on unseen text.
    for trained, validated in (("train_files", "validation_files"), ("source_files", "validation_source"),
                               ("target_files", "validation_target")):
        training_files = {Path(file).resolve() for file in getattr(args, trained) or []}
        if same := [file for file in getattr(args, validated) or [] if Path(file).resolve() in training_files]:
            say(f"note: --{validated.replace('_', '-')} {same[0]} is also a training file: the validation loss "
                "measures the text the model trained on, not unseen text", file=sys.stderr)
            break
    return data


def _load_run_data(args) -> tuple[DatasetDict, Dataset]:
    # The other kind of data's options would be left out without a word (a causal LM given --source-files would
    # train on the default corpus).
    unused = ["train_files", "validation_files"] if args.task == "seq2seq" else [
        "source_files", "target_files", "validation_source", "validation_target"]
    if given := [f"--{name.replace('_', '-')}" for name in unused if getattr(args, name)]:
        raise ValueError(f"{', '.join(given)}: not data for --task {args.task} (text files: --train-files, "
                         "--validation-files; parallel files: --source-files, --target-files, --validation-source, "
                         "--validation-target)")
    # So would a column of the other task's, or a --dataset option without --dataset (files have no columns).
    columns = ["source_column", "target_column"] if args.task == "seq2seq" else ["text_column"]
    other_columns = ["text_column"] if args.task == "seq2seq" else ["source_column", "target_column"]
    if given := [f"--{name.replace('_', '-')}" for name in other_columns if getattr(args, name)]:
        raise ValueError(f"{', '.join(given)}: not a column of --task {args.task}'s data (its --dataset columns: "
                         f"{', '.join('--' + name.replace('_', '-') for name in columns)})")
    if not args.dataset and (given := [f"--{name.replace('_', '-')}" for name in ["dataset_config", *columns]
                                       if getattr(args, name)]):
        raise ValueError(f"{', '.join(given)}: options of --dataset, which this run does not use (files have no "
                         "columns)")
    # A file named twice, under one spelling or two (a.txt, ./a.txt), was read twice without a word: its examples
    # counted twice as often as the others'. Refused, a mistake far more often than not, where a validation file that
    # is also a training file is said (`load_run_data`), since that can be meant. Parallel files count by pair: one
    # source file beside two target files is two references.
    pairs = [["source_files", "target_files"], ["validation_source", "validation_target"]]
    for options in pairs if args.task == "seq2seq" else [["train_files"], ["validation_files"]]:
        if problem := files_given_twice({name: getattr(args, name) or [] for name in options}):
            raise ValueError(problem)
    if args.task == "seq2seq":
        raw = training_data.load_parallel(
            args.source_files, args.target_files, args.validation_source, args.validation_target,
            dataset=args.dataset, dataset_config=args.dataset_config, source_column=args.source_column or "source",
            target_column=args.target_column or "target", seed=args.seed,
            report=note,
        )
        texts = raw["train"].map(lambda pair: {"text": pair["source"] + "\n" + pair["target"]},
                                 remove_columns=["source", "target"])
        return raw, texts
    files = args.train_files or (None if args.dataset else [str(DEFAULT_CORPUS)])
    raw = training_data.load_texts(files, args.dataset, args.dataset_config, args.text_column or "text",
                              args.validation_files, seed=args.seed)
    return raw, raw["train"]


def files_given_twice(options: dict[str, list]) -> str | None:
    """The problem when a file is given twice among the files of `options` (option name -> files), whatever the
    spelling of its path; several options' files (parallel files) count by position, as pairs, where they come in
    pairs (else each side is read as one stream, not file by file). None when none is."""
    sides = list(options.values())
    if len({len(side) for side in sides}) > 1:
        return None
    seen = {}
    for paths in zip(*sides, strict=True):
        first = seen.setdefault(tuple(Path(path).resolve() for path in paths), paths)
        if first is not paths:
            named = [" ".join(f"--{name.replace('_', '-')} {path}" for name, path in zip(options, given, strict=True))
                     for given in (paths, first)]
            return (f"{named[0]}: given twice{f' (first as {named[1]})' if named[0] != named[1] else ''}: its "
                    "examples would count twice as often as the others'. Name each file once (to weigh a text more, "
                    "copy it into a file of its own).")
    return None


def dataset_name(dataset: str) -> str:
    """A --dataset as a model card and a default repo id name it: a local file or folder by its name (its path
    would put folders and slashes in the repo id), a Hub dataset as it is."""
    path = Path(dataset)
    return path.stem if path.is_file() else path.resolve().name if path.is_dir() else dataset


def on_the_hub(dataset: str | None) -> bool:
    """Whether a --dataset is a Hub dataset (a model card links it), not a local file or folder, nor absent."""
    return dataset is not None and not Path(dataset).exists()


# The options that name a run's data (the training commands' and finetune's), its files first.
DATA_FILE_OPTIONS = ("train_files", "validation_files", "source_files", "target_files", "validation_source",
                     "validation_target", "train_file", "validation_file")
DATA_OPTIONS = (*DATA_FILE_OPTIONS, "dataset", "dataset_config", "text_column", "source_column", "target_column",
                "tokens_column", "label_column", "question_column", "context_column", "answers_column",
                "choices_column")


def data_settings(args) -> dict:
    """The data a run reads, as its checkpoints record it among the settings that shape the steps (which a resumed
    run names when they changed): the data options given, each file resolved (the same file named from another
    working folder is the same data; a local --dataset too), and the embedded corpus where a language model is given
    no data."""
    given = {name: value for name in DATA_OPTIONS if (value := getattr(args, name, None))}
    if getattr(args, "task", None) in ("causal-lm", "masked-lm") and not (args.train_files or args.dataset):
        given["train_files"] = [DEFAULT_CORPUS]

    def resolved(files):
        return [str(Path(file).resolve()) for file in files] if isinstance(files, list) else str(Path(files).resolve())

    local = (*DATA_FILE_OPTIONS, *(["dataset"] if "dataset" in given and Path(given["dataset"]).exists() else []))
    return {name: resolved(value) if name in local else value for name, value in given.items()}


def run_data_files(args) -> list[Path]:
    """The files a training run read, as its card lists them: a seq2seq run's both sides, or the embedded corpus."""
    given = args.train_files or (args.source_files or []) + (args.target_files or [])
    return [Path(f) for f in given or [DEFAULT_CORPUS]]


def run_data_name(args, files: list[Path]) -> str:
    """What a training run's card calls its data: --dataset-name, else the --dataset, the embedded corpus, or the
    first data file."""
    if args.dataset_name or args.dataset:
        return args.dataset_name or dataset_name(args.dataset)
    return "tiny_shakespeare" if files == [DEFAULT_CORPUS] else files[0].stem


def run_data_on_hub(args, files: list[Path]) -> bool:
    """Whether a training run's data is a Hub dataset that its card may link: a --dataset that is no local path, or
    the embedded corpus (the Hub's tiny_shakespeare); data files are not."""
    return on_the_hub(args.dataset) if args.dataset else files == [DEFAULT_CORPUS]
