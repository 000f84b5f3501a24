"""Tokenizers for the Scratch model families: byte-level BPE, WordPiece or Unigram, trained with the `tokenizers`
library on local text files or a `datasets` dataset, returned as a `PreTrainedTokenizerFast`; or one token per
character of a text (`character_tokenizer`, nanoGPT's character-level vocabulary).

    tok = train_tokenizer("bpe", "decoder", files=["data/tinyshakespeare/input.txt"], vocab_size=8000)
    tok.save_pretrained("outputs/tokenizer")  # AutoTokenizer.from_pretrained loads it back
    config = get_preset("gpt-mini", vocab_size=padded_vocab_size(tok), **special_token_ids(tok))

The family is stored as `family` in `tokenizer.init_kwargs`; `save_pretrained` writes it to `tokenizer_config.json`
and `AutoTokenizer.from_pretrained` reads it back. See `trainers.py` for the special tokens and templates.
"""

import math
import os
from collections.abc import Iterator
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from .trainers import FAMILIES, KINDS, characters, train

__all__ = ["FILE_BUILDERS", "TEXT_ENCODING", "TOKENIZER_FILES", "character_tokenizer", "check_text_file", "load_data",
           "padded_vocab_size", "special_token_ids", "train_tokenizer"]
# `datasets.load_dataset` takes Hub names and local folders; a single local file needs its format named: the builder.
FILE_BUILDERS = {".txt": "text", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
# UTF-8, less the byte-order mark that Windows editors write first: read as text, U+FEFF began the first example.
TEXT_ENCODING = "utf-8-sig"
# The files a tokenizer of a saved folder may be read from, fast or slow, today's or an older transformers': a folder
# holding any of them holds a tokenizer, and one left beside a new tokenizer overrides it (an old
# special_tokens_map.json renamed its special tokens, and added a new id).
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "source.spm", "target.spm")


def train_tokenizer(
    kind: str,
    family: str,
    *,
    files: list[str | Path] | None = None,
    dataset=None,
    text_column: str = "text",
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a `kind` tokenizer ("bpe", "wordpiece", "unigram") for `family` ("decoder", "encoder", "seq2seq").

    Give exactly one source: `files`, plain text files with one example per line, or `dataset`, a `datasets.Dataset`
    (or `IterableDataset`; of a `DatasetDict` the "train" split is used) whose `text_column` holds the text. Both
    are streamed, never loaded whole. `min_frequency` applies to BPE and WordPiece merges (Unigram has none).
    `model_max_length` is stored on the tokenizer for truncation; None leaves it unset.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown tokenizer kind {kind!r}; choose one of {', '.join(KINDS)}.")
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}; choose one of {', '.join(FAMILIES)}.")
    # Token ids are 32-bit in `tokenizers`: a larger size ended in its OverflowError, after the data was read.
    if not isinstance(vocab_size, int) or not 1 <= vocab_size < 2**32:
        raise ValueError(f"`vocab_size` must be a positive integer below 2**32, got {vocab_size!r}.")
    # `hf-scratch tokenizer` checks these as it reads its options; called here, a negative `min_frequency` was the
    # OverflowError of `tokenizers`, and a `model_max_length` of 0 saved a tokenizer that truncates every text away.
    if not isinstance(min_frequency, int) or isinstance(min_frequency, bool) or min_frequency < 0:
        raise ValueError(f"`min_frequency` must be a non-negative integer, got {min_frequency!r}.")
    if model_max_length is not None and (not isinstance(model_max_length, int) or model_max_length < 1):
        raise ValueError(f"`model_max_length` must be a positive integer or None, got {model_max_length!r}.")
    if isinstance(files, str | os.PathLike):  # else its characters were taken for file names ("not found: c, o, r")
        raise ValueError(f"`files` must be a list of text files, got the single path {str(files)!r}: pass "
                         f"[{str(files)!r}].")
    if (files is None) == (dataset is None):
        raise ValueError(
            "Give exactly one training source, `files` or `dataset`; got "
            + ("both." if files is not None else "neither.")
        )
    if files is not None:
        texts, length = _file_lines(files), None
    else:
        texts, length = _dataset_batches(dataset, text_column)
    return train(kind, family, texts, length, vocab_size, min_frequency, model_max_length)


def character_tokenizer(family: str, text: str, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer for `family` whose vocabulary is the family's special tokens, then each character of `text`
    (sorted): one token per character, as nanoGPT's shakespeare_char (65 characters for Tiny Shakespeare, 69 ids with
    the decoder's specials). Nothing is learned, so pass a text holding every character the data uses; any other
    character becomes the unknown token. Special tokens and templates are `train_tokenizer`'s for the family."""
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}; choose one of {', '.join(FAMILIES)}.")
    if not isinstance(text, str) or not text:
        raise ValueError(f"`text` must be a non-empty string holding the vocabulary's characters, got {text!r:.40}.")
    if model_max_length is not None and (not isinstance(model_max_length, int) or model_max_length < 1):
        raise ValueError(f"`model_max_length` must be a positive integer or None, got {model_max_length!r}.")
    return characters(text, family, model_max_length)


def padded_vocab_size(tokenizer, multiple: int = 64) -> int:
    """`len(tokenizer)` rounded up to a multiple of `multiple`: the model's `vocab_size` (tidy matmul shapes)."""
    if multiple < 1:
        raise ValueError(f"`multiple` must be a positive integer, got {multiple!r}.")
    return multiple * math.ceil(len(tokenizer) / multiple)


def special_token_ids(tokenizer, family: str | None = None) -> dict:
    """The config fields for the tokenizer's special tokens: `pad_token_id`, `bos_token_id`, `eos_token_id` (None
    where the family has no such token, so a preset's ids are overridden), plus `decoder_start_token_id` (bos, else
    pad) for seq2seq. Pass them on as `get_preset(name, **special_token_ids(tok))`. The family is the one the tokenizer
    records (`train_tokenizer` does), else `family`: that of the model it serves (GPT-2's tokenizer records none)."""
    family = tokenizer.init_kwargs.get("family") or family
    if family not in FAMILIES:
        raise ValueError(
            f"The tokenizer's `family` is {family!r}, not one of {', '.join(FAMILIES)}: it was not made by "
            "`train_tokenizer`. Pass the model family it is meant for as `family`."
        )
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if family == "seq2seq":
        # A tokenizer without <s> (T5's, Marian's) starts the decoder at pad, as those models do.
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
        ids["decoder_start_token_id"] = start
    return ids


def check_text_file(path: str | Path, block_size: int = 1 << 20, plain: bool = False) -> None:
    """Raise ValueError naming `path` unless it is UTF-8 text with something besides whitespace: trainers would
    otherwise fail midway with a bare UnicodeDecodeError, or quietly learn from nothing. The file is streamed in
    blocks of `block_size` characters, so a check costs one read of it and little memory. With `plain` (a file read
    as plain text), a file of a dataset format (`FILE_BUILDERS`: CSV, JSON, ...) is refused too: its syntax, header
    and field separators would be trained on as text."""
    if Path(path).is_dir():  # else an IsADirectoryError traceback
        raise ValueError(f"{path} is a folder, not a text file: pass its files, or the folder as --dataset.")
    builder = FILE_BUILDERS.get(Path(path).suffix.lower(), "text")
    if plain and builder != "text":
        raise ValueError(f"{path} is a {builder.upper()} file, not plain text: pass it as a dataset (--dataset, "
                         "`load_data`), whose --text-column is read.")
    has_text = False
    try:
        with open(path, encoding=TEXT_ENCODING) as handle:
            while block := handle.read(block_size):
                if "\0" in block:
                    raise ValueError(f"{path} is not a text file: it holds NUL bytes (binary data?).")
                has_text = has_text or not block.isspace()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error.reason}; binary data?); convert it to UTF-8.") from error
    if not has_text:
        raise ValueError(f"{path} holds no text: it is empty or has blank lines only.")


def load_data(name: str | Path, config: str | None = None, split: str | None = None):
    """`datasets.load_dataset(name, config, split=split)` for a Hub name or local folder, and for a single local file
    too (read by the builder of its suffix, `FILE_BUILDERS`, where `load_dataset` would look for its name on the Hub);
    problems with the data are a ValueError beginning with `name`: a local file or folder that does not exist, a file
    type without a builder, a `config` for a single file, a text file that is binary or empty (`check_text_file`), a
    file the builder cannot parse (the parser's own words), a folder without data files (a traceback in `hf-scratch
    tokenizer` and `finetune`), no rows."""
    import datasets  # slow to import, and only callers with a dataset need it

    path = Path(name)
    builder = FILE_BUILDERS.get(path.suffix.lower())  # DATA.CSV too, as Windows tools name files
    # A mistyped local path would be looked up on the Hub: a ConnectionError offline, "doesn't exist on the Hub"
    # online. A data file's suffix, or a start that only a path has, makes a name local.
    if not path.exists() and (builder or str(name).startswith((".", "/", "~", os.sep))):
        raise ValueError(f"{name}: no such file or folder")
    if path.is_file() and builder is None:
        raise ValueError(f"{name}: unknown file type {path.suffix or '(no suffix)'!r}; use one of "
                         f"{', '.join(FILE_BUILDERS)}")
    if path.is_file() and config is not None:  # else left out without a word: a file is read by its builder alone
        raise ValueError(f"{name}: a single data file has no configurations, and {config!r} would be left out: leave "
                         "out the dataset configuration (--dataset-config)")
    if path.is_file() and builder != "parquet":
        check_text_file(path)  # `datasets` reports a binary or empty file in its own, vaguer words
    try:
        folder_builder = datasets.load_dataset_builder(str(name), config) if path.is_dir() else None
        # The text builder reads a .txt file, or a local folder of them, as UTF-8 with its BOM (csv and json skip it)
        text = builder == "text" if path.is_file() else folder_builder is not None and folder_builder.name == "text"
        if folder_builder is not None and text:  # each file checked as one given alone: `datasets` read a binary
            # file's NUL bytes as text (trained on), and its error for a file that is not UTF-8 named the folder only
            for files in folder_builder.config.data_files.values():
                for file in files:
                    check_text_file(file)
        encoding = {"encoding": TEXT_ENCODING} if text else {}
        if path.is_file():
            data = datasets.load_dataset(builder, data_files=str(path), split=split, **encoding)
        else:
            data = datasets.load_dataset(str(name), config, split=split, **encoding)
    except datasets.exceptions.DatasetGenerationError as error:  # the parser's own error is its cause
        raise ValueError(f"{name}: cannot be read{f' as {builder.upper()}' if builder else ''}: "
                         f"{error.__cause__ or error}") from error
    except ValueError as error:
        if "corresponds to no data" in str(error):  # `datasets`' words for a file or split without rows
            raise ValueError(f"{name}: holds no rows") from error
        raise ValueError(f"{name}: {error}") from error
    except FileNotFoundError as error:  # `datasets`' EmptyDatasetError, DataFilesNotFoundError, DatasetNotFoundError
        what = "holds no data files that `datasets` reads" if path.is_dir() else "no such dataset"
        raise ValueError(f"{name}: {what} ({error})") from error
    except ConnectionError as error:  # a name that is no local path, looked up on the Hub: offline, or unreachable
        raise ValueError(f"{name}: no such local file or folder, and the Hub cannot be reached for a dataset of "
                         f"that name ({error})") from error
    if any(rows == 0 for rows in (data.num_rows.values() if isinstance(data, dict) else [data.num_rows])):
        raise ValueError(f"{name}: holds no rows" + (f" in its {split!r} split" if split else ""))
    return data


def _file_lines(files: list[str | Path]) -> Iterator[str]:
    if not files:
        raise ValueError("`files` is empty; give at least one text file.")
    missing = [str(path) for path in files if not Path(path).exists()]
    if missing:  # checked up front: the generator below would only fail midway through training
        raise FileNotFoundError(f"Training text files not found: {', '.join(missing)}")
    for path in files:
        check_text_file(path, plain=True)

    def lines():
        for path in files:
            with open(path, encoding=TEXT_ENCODING) as handle:
                for line in handle:
                    yield line.rstrip("\n")  # as the `datasets` text loader: one example per line, no newline

    return lines()


def _dataset_batches(dataset, text_column: str, batch_size: int = 1000) -> tuple[Iterator[list[str]], int | None]:
    if isinstance(dataset, dict):  # DatasetDict and IterableDatasetDict are dicts of splits
        if "train" not in dataset:
            raise ValueError(f"The DatasetDict has no 'train' split (it has {', '.join(dataset)}); pass one split.")
        dataset = dataset["train"]
    if not hasattr(dataset, "iter"):
        raise TypeError(f"`dataset` must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}.")
    columns = dataset.column_names  # None for some streamed datasets: then a bad column fails on the first batch
    if columns is not None and text_column not in columns:
        raise ValueError(f"The dataset has no column {text_column!r} (it has {', '.join(columns)}); set `text_column`.")
    length = len(dataset) if hasattr(dataset, "__len__") else None  # streamed datasets have no length
    return _checked_texts(dataset.iter(batch_size=batch_size), text_column), length


def _checked_texts(batches: Iterator[dict], text_column: str) -> Iterator[list[str]]:
    """The column's texts, batch by batch, checked as `check_text_file` checks a file: `tokenizers` fails on a value
    that is not a string with a bare TypeError, and learns nothing, silently, from a column without text."""
    has_text = False
    for batch in batches:
        texts = batch[text_column]
        wrong = next((text for text in texts if not isinstance(text, str | None)), None)
        if wrong is not None:
            raise ValueError(f"The dataset's column {text_column!r} holds {type(wrong).__name__} values, not text; "
                             "set `text_column`.")
        texts = [text or "" for text in texts]  # a missing value (an empty CSV cell, say) is an empty text
        has_text = has_text or any(not text.isspace() for text in texts if text)
        yield texts
    if not has_text:
        raise ValueError(f"The dataset's column {text_column!r} holds no text: every value is empty or blank.")
