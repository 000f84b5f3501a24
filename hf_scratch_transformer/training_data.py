"""Training data for the three tasks, through `datasets`: local text files (one document per paragraph), parallel
files (one sentence per line, aligned), or any dataset name `datasets.load_dataset` accepts; then tokenized for a
task (packed blocks for the causal LM, sequences for the masked LM, pairs for seq2seq). No model file imports this
module (it never travels to the Hub).
"""

import copy
import itertools
from collections.abc import Callable

import numpy as np
import tokenizers
import torch
from datasets import Dataset, DatasetDict, Features, List, Value, load_dataset

from tokenizer_training import TEXT_ENCODING, check_text_file, load_data


def load_texts(files: list[str] | None = None, dataset: str | None = None, dataset_config: str | None = None,
               text_column: str = "text", validation_files: list[str] | None = None,
               validation_split: float = 0.05, seed: int = 0) -> DatasetDict:
    """A DatasetDict with "train" and "validation" splits of documents in column "text".

    Local files are read by paragraph (blank-line separated), so line breaks inside a document survive."""
    if (files is None) == (dataset is None):
        raise ValueError("Give either training files or a dataset name, not both or neither.")
    if dataset is not None and validation_files:  # else they would be left out without a word
        raise ValueError("Validation files go with training files: a dataset brings its own validation split, or "
                         "one is split off its training data.")
    if files is not None:
        for path in [*files, *(validation_files or [])]:
            check_text_file(path, plain=True)  # `datasets` reports an empty or binary file without naming it
        data_files = {"train": list(files)} | ({"validation": list(validation_files)} if validation_files else {})
        raw = load_dataset("text", data_files=data_files, sample_by="paragraph", encoding=TEXT_ENCODING).map(
            _paragraphs, batched=True, desc="paragraphs")
    else:
        raw = _load_text_columns(dataset, dataset_config, {text_column: "text"})
    source = ", ".join(map(str, files)) if files is not None else f"dataset {dataset!r}"
    return _with_validation(raw, validation_split, seed, source, "paragraph (blank-line separated)")


def load_parallel(source_files: list[str] | None = None, target_files: list[str] | None = None,
                  validation_source: list[str] | None = None, validation_target: list[str] | None = None,
                  dataset: str | None = None, dataset_config: str | None = None, source_column: str = "source",
                  target_column: str = "target", validation_split: float = 0.05, seed: int = 0,
                  report: Callable[[str], None] | None = None) -> DatasetDict:
    """A DatasetDict of aligned pairs in columns "source" and "target", from parallel files or a dataset. `report` is
    told how many pairs of each split were left out for a blank side (`_without_blank_texts`)."""
    # Files that would be left out without a word: beside a dataset, or one validation side without the other.
    if dataset is not None and (source_files or target_files or validation_source or validation_target):
        raise ValueError("Give either parallel files or a dataset name, not both.")
    if bool(validation_source) != bool(validation_target):
        raise ValueError("Give validation files for both sides, source and target, or for neither.")
    if dataset is not None:
        if source_column == target_column:  # renamed once, it would leave no "source" column to tokenize
            raise ValueError(f"{source_column!r} is both the source and the target column: name the pairs' two "
                             "columns.")
        raw = _load_text_columns(dataset, dataset_config, {source_column: "source", target_column: "target"}, report)
        return _with_validation(raw, validation_split, seed, f"dataset {dataset!r}", "pair")
    if not source_files or not target_files:
        raise ValueError("Give source and target training files (or a dataset name).")
    splits = {"train": _read_pairs(source_files, target_files)}
    if validation_source:
        splits["validation"] = _read_pairs(validation_source, validation_target)
    # Aligned first, then the pairs with a blank side left out, as from a dataset's columns
    splits = _without_blank_texts(DatasetDict(splits), ["source", "target"], report)
    return _with_validation(splits, validation_split, seed, ", ".join(map(str, source_files)), "line")


def _paragraphs(batch: dict) -> dict:
    """The texts `datasets` read by paragraph, split at every blank line, also one holding spaces or tabs, with no
    blank line left at either end: `datasets` splits at "\n\n" only, so a line of spaces joined two paragraphs, a
    third line break began a document with "\n", and blank lines alone became a document (`<s> \n </s>`)."""
    paragraphs = []
    for text in batch["text"]:
        paragraph = []
        for line in [*text.split("\n"), ""]:  # the blank line at the end closes the last paragraph
            if line and not line.isspace():
                paragraph.append(line)
            elif paragraph:
                paragraphs.append("\n".join(paragraph))
                paragraph = []
    return {"text": paragraphs}


def _lines(files: list[str]) -> list[str]:
    """The files' lines, split at line breaks only ("\\n", "\\r\\n"): `str.splitlines` also splits at form feeds,
    \\x85, \\u2028 and more, and universal newlines at a lone "\\r", which a sentence can hold, and every later pair
    would be out of alignment. Blank lines ending a file are no sentences (an editor's extra line break at the end of
    one side made the files "differ in length")."""
    lines = []
    for path in files:
        with open(path, encoding=TEXT_ENCODING, newline="\n") as handle:  # no universal newlines
            file_lines = [line.removesuffix("\n").removesuffix("\r") for line in handle]
        while file_lines and (not file_lines[-1] or file_lines[-1].isspace()):
            file_lines.pop()
        lines += file_lines
    return lines


def _load_text_columns(dataset: str, dataset_config: str | None, columns: dict[str, str],
                       report: Callable[[str], None] | None = None) -> DatasetDict:
    """`load_data(dataset, dataset_config)` with its text `columns` checked to hold text and renamed (its name ->
    ours), and rows missing one of them left out (an empty CSV cell is no example): the tokenizer fails on either
    with a bare TypeError, midway through tokenizing. Blank texts are no examples either: a folder of text files is
    read line by line, and each blank line would be a document `<s> </s>`, or an MLM sequence with nothing to mask.
    `report`: as `_without_blank_texts`'."""
    raw = load_data(dataset, dataset_config)
    if "train" not in raw:  # e.g. a folder holding test.csv only: a bare KeyError below
        raise ValueError(f"Dataset {dataset!r} has no 'train' split (it has {', '.join(raw)}); training needs one.")
    features = raw["train"].features
    for column in columns:
        if column not in features:
            raise ValueError(f"Dataset {dataset!r} has no column {column!r}: {raw['train'].column_names}")
        if getattr(features[column], "dtype", None) not in ("string", "large_string"):
            raise ValueError(f"Dataset {dataset!r}: column {column!r} holds {features[column]}, not text.")
    # The other columns left out first: one of our names (a "text" beside --text-column body) failed the renaming with
    # a KeyError traceback, 'Field "text" exists 2 times in schema'.
    raw = raw.select_columns(list(columns))
    raw = raw.rename_columns({name: ours for name, ours in columns.items() if name != ours})
    raw = _without_blank_texts(raw, list(columns.values()), report)
    # A split left without rows failed with a traceback as training began, or (a causal LM's validation) after it
    if empty := [split for split in ("train", "validation") if split in raw and raw[split].num_rows == 0]:
        raise ValueError(f"Dataset {dataset!r}: its {empty[0]!r} split holds no example: every row's "
                         f"{' or '.join(map(repr, columns))} is missing or blank.")
    return raw


def _without_blank_texts(data: DatasetDict, columns: list[str],
                         report: Callable[[str], None] | None = None) -> DatasetDict:
    """`data` without the rows whose text in one of `columns` is missing or blank: no example, whichever route the data
    came by (a pair with a blank side teaches the model to translate nothing into a sentence, or the reverse).
    `report` is told how many rows of the training and validation splits went, and why: a pair's other side is text
    the run does not see (2 of 3 validation pairs went without a word)."""
    kept = data.filter(lambda *texts: all(text and not text.isspace() for text in texts), input_columns=columns,
                       desc="missing or blank texts")
    for split, name in (("train", "training"), ("validation", "validation")):
        if report and split in data and (left_out := data[split].num_rows - kept[split].num_rows):
            report(f"{left_out} of the {data[split].num_rows} {name} examples left out: their "
                   f"{' or '.join(columns)} is blank or missing")
    return kept


def _read_pairs(source_files: list[str], target_files: list[str]) -> Dataset:
    for path in [*source_files, *target_files]:
        check_text_file(path, plain=True)
    sources, targets = [_lines([path]) for path in source_files], [_lines([path]) for path in target_files]
    # File by file where they come in pairs: a line lost in one file of several misaligned every later pair, though
    # the totals agreed.
    pairs = zip(source_files, target_files, sources, targets, strict=True) if len(sources) == len(targets) else []
    for source, target, source_lines, target_lines in pairs:
        if len(source_lines) != len(target_lines):
            raise ValueError(f"Parallel files differ in length: {source} has {len(source_lines)} lines, {target} "
                             f"{len(target_lines)}; the n-th line of each must translate the other's.")
    sources, targets = list(itertools.chain(*sources)), list(itertools.chain(*targets))
    if len(sources) != len(targets):
        raise ValueError(f"Parallel files differ in length: {len(sources)} source vs {len(targets)} target lines.")
    return Dataset.from_dict({"source": sources, "target": targets})


def _with_validation(raw: DatasetDict, validation_split: float, seed: int, source: str, unit: str) -> DatasetDict:
    """`raw`'s own validation split, or one split off its training data; `source` and `unit` (what one example
    is) name the data in errors."""
    if "validation" in raw:
        return DatasetDict(train=raw["train"], validation=raw["validation"])
    if raw["train"].num_rows < 2:  # `train_test_split` needs an example on each side, and names no file
        raise ValueError(
            f"{source} holds {raw['train'].num_rows} training example(s), one per {unit}: too few to split off a "
            "validation set. Give more data, or validation data of its own."
        )
    split = raw["train"].train_test_split(test_size=validation_split, seed=seed)
    return DatasetDict(train=split["train"], validation=split["test"])


def keep_the_inputs_the_model_reads(tokenizer, config) -> None:
    """A model without a token-type table (`type_vocab_size` 0, e.g. the bert-prenorm preset; the decoder and seq2seq
    families have none) refuses segment ids other than 0, which an encoder's tokenizer gives the second text of a pair
    (pipelines' `text_pair`, zero-shot classification, cross-encoders): its tokenizer then gives none, as ModernBERT's
    does. Saved with it (`model_input_names` in tokenizer_config.json)."""
    if getattr(config, "type_vocab_size", 0) == 0 and "token_type_ids" in tokenizer.model_input_names:
        tokenizer.model_input_names = [name for name in tokenizer.model_input_names if name != "token_type_ids"]


# The special token each task's data needs: packing ends every document with eos, the MLM collator puts [MASK] in,
# the seq2seq collator pads sources with pad. A tokenizer made elsewhere may lack it.
TASK_TOKENS = {"causal-lm": "eos_token", "masked-lm": "mask_token", "seq2seq": "pad_token"}


def check_task_token(tokenizer, task: str) -> None:
    """Raise ValueError unless `tokenizer` has the special token (`TASK_TOKENS`) that `task`'s data needs."""
    role = TASK_TOKENS[task]
    if getattr(tokenizer, role, None) is None:
        raise ValueError(f"The tokenizer has no {role}, which {task} data needs: set one "
                         f"(tokenizer.{role} = ..., then save_pretrained), or train one with `hf-scratch tokenizer`.")
    if task == "seq2seq" and not ends_targets_with_eos(tokenizer):
        raise ValueError(
            f"The tokenizer does not end a text with an eos_token ({tokenizer.eos_token!r} is not its last token), "
            "which seq2seq targets need: the model learns to stop there, and without it generates to its length "
            "limit. Train one with `hf-scratch tokenizer --family seq2seq`, or give this one a post-processor that "
            "appends its eos_token (as T5's and BART's tokenizers do).")


def ends_targets_with_eos(tokenizer) -> bool:
    """Whether `tokenizer` ends a seq2seq target with its eos token, as T5's, BART's and Marian's do (ours of the
    seq2seq family too): GPT-2's appends nothing, and a decoder's template opens a text with `<s>` only."""
    return tokenizer.eos_token_id is not None and tokenizer(text_target="a").input_ids[-1:] == [tokenizer.eos_token_id]


def pack_for_causal_lm(texts: Dataset, tokenizer, block_size: int) -> Dataset:
    """Documents -> `<s> document </s>` token streams, concatenated and cut into blocks of `block_size` (sequence
    packing: every token trains). The tokenizer adds `<s>`; `</s>` ends each document here. The stream is cut as one,
    so blocks run on across documents and batches; only the last block may be short: it is padded on the right,
    with labels -100 there (no attention mask needed: a causal model never attends to later positions), so that even
    data shorter than one block gives a block rather than an empty split. A tokenizer made elsewhere that ends a text
    with `</s>` itself (BART's, T5's) gets no second one."""
    check_task_token(tokenizer, "causal-lm")  # else None would end each document
    eos = [tokenizer.eos_token_id]

    def tokenize(batch):
        # verbose=False: the blocks below cut the documents, so the tokenizer's warning of one longer than its
        # model_max_length ("... will result in indexing errors") does not apply here; run_clm.py prints it, then
        # "Please ignore the warning above". The tokenizer still warns of any other call's.
        ids = tokenizer(batch["text"], verbose=False).input_ids
        return {"input_ids": [document if document[-1:] == eos else document + eos for document in ids]}

    pad = tokenizer.pad_token_id or 0  # any id: labels -100 there, and no real token attends to it

    def blocks():
        stream = []
        for batch in tokenized.iter(batch_size=1000):
            stream += [token for ids in batch["input_ids"] for token in ids]
            usable = len(stream) // block_size * block_size
            for start in range(0, usable, block_size):
                yield {"input_ids": stream[start : start + block_size], "labels": stream[start : start + block_size]}
            del stream[:usable]  # the rest opens the next block
        if stream:
            padding = block_size - len(stream)
            yield {"input_ids": stream + [pad] * padding, "labels": stream + [-100] * padding}

    tokenized = texts.map(tokenize, batched=True, remove_columns=texts.column_names, desc="tokenizing")
    columns = Features({"input_ids": List(Value("int64")), "labels": List(Value("int64"))})
    if tokenized.num_rows == 0:  # `from_generator` refuses to make a dataset of no rows
        return Dataset.from_dict({"input_ids": [], "labels": []}, features=columns)
    return Dataset.from_generator(blocks, features=columns)  # cached, under a hash of `blocks` and what it reads


def stack_blocks(blocks: list[dict]) -> dict[str, torch.Tensor]:
    """The collator of packed blocks (`pack_for_causal_lm`): each column's rows, all of one length, stacked into a
    (B, T) int64 tensor, as `default_data_collator` does; through NumPy, since `torch.tensor` of a list of lists of
    Python ints took 4.7x as long (123 against 26 us for 12 x 64 ids, one column; about 0.5% of a training step at
    nanoGPT's size, docs/nanogpt.md)."""
    return {key: torch.from_numpy(np.array([block[key] for block in blocks], dtype=np.int64)) for key in blocks[0]}


def tokenize_for_mlm(texts: Dataset, tokenizer, max_length: int) -> Dataset:
    """Documents -> `[CLS] ... [SEP]` sequences of at most `max_length` tokens; the collator masks them. A longer
    document continues in further sequences (truncated, its tail would never train: 13% of Tiny Shakespeare's tokens
    at 128)."""

    def tokenize(batch):
        encoded = tokenizer(batch["text"], truncation=True, max_length=max_length, return_overflowing_tokens=True,
                            return_special_tokens_mask=True)
        del encoded["overflow_to_sample_mapping"]  # which document each sequence came from
        check_every_token_kept(encoded["input_ids"], tokenizer(batch["text"], add_special_tokens=False)["input_ids"],
                               tokenizer)
        return encoded

    return truncated_map(texts, tokenize, tokenizer)


def check_every_token_kept(sequences: list[list[int]], documents: list[list[int]], tokenizer) -> None:
    """Raise unless `sequences` (truncated with their overflow, special tokens added) hold as many tokens as the
    untruncated `documents`. tokenizers 0.23.1-0.23.2 return too little overflow (huggingface/tokenizers#2091: most
    of Tiny Shakespeare at 128), which would leave the tail of every long document out of training without a word.
    Importing the package refuses those releases where it was installed; this holds wherever it runs, and for any
    later release that loses tokens again. Costs a second, untruncated pass of the tokenizer: under half a second for
    Tiny Shakespeare."""
    kept = sum(map(len, sequences)) - len(sequences) * tokenizer.num_special_tokens_to_add()
    whole = sum(map(len, documents))
    if kept != whole:
        raise RuntimeError(
            f"The tokenizer cut these documents' {whole} tokens into sequences that hold {kept}: the overflow of "
            f"truncated texts was lost. tokenizers {tokenizers.__version__} is installed; 0.23.1-0.23.2 lose it "
            f"(huggingface/tokenizers#2091). Install tokenizers>=0.23.3, as this package requires."
        )


def mask_once(sequences: Dataset, masking, seed: int) -> Dataset:
    """Masked-LM validation `sequences` (`tokenize_for_mlm`'s) with their masks drawn once by `masking` (a
    `DataCollatorForLanguageModeling`): sequence i's from a generator seeded with the run's seed and i, so that every
    evaluation scores the same tokens, whatever the number of processes, the batch size or the RNG's state (each
    process masked its batches from its own stream: the same weights gave 4.8038 in one process and 4.8279 in two).
    Adds `labels` (-100 where nothing is masked); a padding collator that pads them with -100 batches them."""

    def mask(row: dict, index: int) -> dict:
        one_row = {name: torch.tensor([row[name]]) for name in ("input_ids", "special_tokens_mask") if name in row}
        masked = mask_each_row(masking, one_row, lambda tokens: row_seed(seed, -1, index))
        return {"input_ids": masked["input_ids"][0], "labels": masked["labels"][0]}

    removed = [name for name in ("special_tokens_mask",) if name in sequences.column_names]
    return sequences.map(mask, with_indices=True, remove_columns=removed, desc="masking the validation set")


def mask_each_row(masking, batch: dict, seed_of_row: Callable[[list[int]], int]) -> dict:
    """A batch of `tokenize_for_mlm` sequences, padded, with each row masked by `masking` (a
    `DataCollatorForLanguageModeling`: 80% [MASK], 10% random, 10% kept) on its own tokens, not its padding, from a
    generator seeded with `seed_of_row(its tokens)`. A row's masks are then those it has alone, whatever rows and
    padding share its batch: two processes of batch 2 mask the tokens one process of batch 4 masks.
    Shapes: input_ids, attention_mask (optional), special_tokens_mask (optional) (B, T) -> input_ids, labels (B, T)
    (-100 where nothing is masked), attention_mask as given; special_tokens_mask is dropped (no model takes it)."""
    masking = copy.copy(masking)
    masking.generator = torch.Generator()
    ids, special = batch["input_ids"], batch.get("special_tokens_mask")
    real = batch.get("attention_mask", torch.ones_like(ids)).bool()
    masked, labels = ids.clone(), torch.full_like(ids, -100)
    for row, tokens in enumerate(ids):
        tokens = tokens[real[row]]
        masking.generator.manual_seed(seed_of_row(tokens.tolist()))
        row_special = None if special is None else special[row, real[row]][None]
        row_masked, row_labels = masking.torch_mask_tokens(tokens[None], row_special)
        masked[row, real[row]], labels[row, real[row]] = row_masked[0], row_labels[0]
    kept = {name: value for name, value in batch.items() if name != "special_tokens_mask"}
    return kept | {"input_ids": masked, "labels": labels}


def mask_training_rows(masking, batch: dict, seed: int, step: int) -> dict:
    """`mask_each_row` for a training batch of `step`, as both training commands mask theirs: each row from the run's
    seed, the step and its tokens."""
    return mask_each_row(masking, batch, lambda tokens: row_seed(seed, step, *tokens))


def row_seed(*key: int) -> int:
    """A generator seed from integers: the same in every process (a tuple of ints hashes without the per-process salt
    of str)."""
    return hash(key) % 2**63


def tokenize_for_seq2seq(pairs: Dataset, tokenizer, max_length: int,
                         report: Callable[[str], None] | None = None) -> Dataset:
    """Pairs -> `input_ids` (source + `</s>`) and `labels` (target + `</s>`); one shared vocabulary. A side longer
    than `max_length` tokens is cut there, as run_translation.py cuts it, and `report` is told how many were: the
    model learns to translate the start of a sentence into all of its translation, or the reverse."""

    def cut(texts: list[str], ids: list[list[int]], side: str) -> list[bool]:
        # A side `max_length` tokens long fits or was cut: tokenized whole (these alone), its length tells
        return [len(row) == max_length and len(tokenizer(**{side: text}, verbose=False).input_ids) > max_length
                for text, row in zip(texts, ids, strict=True)]

    def tokenize(batch):
        encoded = tokenizer(batch["source"], text_target=batch["target"], truncation=True, max_length=max_length)
        encoded["source_cut"] = cut(batch["source"], encoded["input_ids"], "text")
        encoded["target_cut"] = cut(batch["target"], encoded["labels"], "text_target")
        return encoded

    encoded = truncated_map(pairs, tokenize, tokenizer)
    sources, targets = sum(encoded["source_cut"]), sum(encoded["target_cut"])
    if report and (sources or targets):
        report(f"--max-length {max_length} cuts {sources} of the {len(pairs)} sources and {targets} of the "
               f"{len(pairs)} targets")
    return encoded.remove_columns(["source_cut", "target_cut"])


def truncated_map(data: Dataset, tokenize: Callable, tokenizer, with_indices: bool = False) -> Dataset:
    """`data.map(tokenize)` where `tokenize` calls `tokenizer` with `truncation=True` (and, `with_indices`, is given
    the batch's row indices too). That leaves truncation on in a fast tokenizer's backend, which `save_pretrained`
    then writes into tokenizer.json: the saved (and published) tokenizer would cut every text to the training length
    for anyone who loads that file with `tokenizers`."""
    encoded = data.map(tokenize, batched=True, with_indices=with_indices, remove_columns=data.column_names,
                       desc="tokenizing")
    if (backend := getattr(tokenizer, "backend_tokenizer", None)) is not None:
        backend.no_truncation()
    return encoded
