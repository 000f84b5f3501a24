"""What the training scripts share: data preparation for the three tasks, the label-smoothed loss, the bf16 speed
check, masked-LM masks drawn per step, stopping on a time budget or a SIGTERM, evaluation metrics and the loss-curve
plot. No model file imports this module (it never travels to the Hub).

Data flows through `datasets`: local text files (one document per paragraph), parallel files (one sentence per
line, aligned), or any dataset name `datasets.load_dataset` accepts.
"""

import copy
import itertools
import math
import os
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import reduce
from datasets import Dataset, DatasetDict, Features, List, Value, load_dataset
from torch.nn import functional as F
from transformers import DataCollatorWithPadding, TrainerCallback

from hf_scratch_transformer.kernel_choice import one_thread
from hf_scratch_transformer.scratch_loss import cross_entropy
from tokenizer_training import TEXT_ENCODING, check_text_file, load_data

TASKS = ("causal-lm", "masked-lm", "seq2seq")

# ---------------------------------------------------------------------------------------------- model


def load_to_train(model_class, folder, **kwargs):
    """`model_class.from_pretrained(folder, **kwargs)` in float32, whatever dtype the folder was saved in.
    transformers 5 loads a folder in its own dtype (`dtype="auto"`): a bf16 folder (`hf-scratch convert` of a bf16
    Llama writes one) trained in bf16, where AdamW at a learning rate of 1e-5 left 84% of a tiny model's weights as
    they were after 5 steps (fp16 alike, with fp16's overflow besides). Weights and optimizer state train in
    float32, as with --bf16 autocast (docs/training.md), and the trained folder is saved in float32."""
    return model_class.from_pretrained(folder, dtype=torch.float32, **kwargs)


# ---------------------------------------------------------------------------------------------- data


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
    """A model without a token-type table (`type_vocab_size` 0, e.g. the bert-prenorm preset) refuses segment ids other
    than 0, which an encoder's tokenizer gives the second text of a pair (pipelines' `text_pair`, zero-shot
    classification, cross-encoders): its tokenizer then gives none, as ModernBERT's does. Saved with it
    (`model_input_names` in tokenizer_config.json)."""
    if getattr(config, "type_vocab_size", None) == 0 and "token_type_ids" in tokenizer.model_input_names:
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


def pack_for_causal_lm(texts: Dataset, tokenizer, block_size: int) -> Dataset:
    """Documents -> `<s> document </s>` token streams, concatenated and cut into blocks of `block_size` (sequence
    packing: every token trains). The tokenizer adds `<s>`; `</s>` ends each document here. The stream is cut as one,
    so blocks run on across documents and batches; only the last block may be short: it is padded on the right,
    with labels -100 there (no attention mask needed: a causal model never attends to later positions), so that even
    data shorter than one block gives a block rather than an empty split."""
    check_task_token(tokenizer, "causal-lm")  # else None would end each document

    def tokenize(batch):
        # verbose=False: the blocks below cut the documents, so the tokenizer's warning of one longer than its
        # model_max_length ("... will result in indexing errors") does not apply here; run_clm.py prints it, then
        # "Please ignore the warning above". The tokenizer still warns of any other call's.
        ids = tokenizer(batch["text"], verbose=False).input_ids
        return {"input_ids": [document + [tokenizer.eos_token_id] for document in ids]}

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


def tokenize_for_mlm(texts: Dataset, tokenizer, max_length: int) -> Dataset:
    """Documents -> `[CLS] ... [SEP]` sequences of at most `max_length` tokens; the collator masks them. A longer
    document continues in further sequences (truncated, its tail would never train: 13% of Tiny Shakespeare's tokens
    at 128)."""

    def tokenize(batch):
        encoded = tokenizer(batch["text"], truncation=True, max_length=max_length, return_overflowing_tokens=True,
                            return_special_tokens_mask=True)
        del encoded["overflow_to_sample_mapping"]  # which document each sequence came from
        return encoded

    return truncated_map(texts, tokenize, tokenizer)


def tokenize_for_seq2seq(pairs: Dataset, tokenizer, max_length: int) -> Dataset:
    """Pairs -> `input_ids` (source + `</s>`) and `labels` (target + `</s>`); one shared vocabulary."""

    def tokenize(batch):
        return tokenizer(batch["source"], text_target=batch["target"], truncation=True, max_length=max_length)

    return truncated_map(pairs, tokenize, tokenizer)


def truncated_map(data: Dataset, tokenize: Callable, tokenizer) -> Dataset:
    """`data.map(tokenize)` where `tokenize` calls `tokenizer` with `truncation=True`. That leaves truncation on in a
    fast tokenizer's backend, which `save_pretrained` then writes into tokenizer.json: the saved (and published)
    tokenizer would cut every text to the training length for anyone who loads that file with `tokenizers`."""
    encoded = data.map(tokenize, batched=True, remove_columns=data.column_names, desc="tokenizing")
    if (backend := getattr(tokenizer, "backend_tokenizer", None)) is not None:
        backend.no_truncation()
    return encoded


# ---------------------------------------------------------------------------------------------- loss


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """A causal LM's labels are its inputs: position t predicts label t + 1, the last position nothing (-100), as
    transformers' `ForCausalLMLoss` shifts them. (batch, length) -> (batch, length)."""
    return F.pad(labels, (0, 1), value=-100)[..., 1:]


def label_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float, shift: bool,
                        num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Cross-entropy with label smoothing `epsilon` (Szegedy et al., 2016), -100 ignored. `shift=True` for the
    causal LM, whose labels are its inputs: position t predicts label t + 1. Divided by `num_items_in_batch` when
    given (gradient accumulation counts the whole accumulated batch), else by the number of labelled tokens. On CPU
    through `scratch_loss.cross_entropy`, whose backward costs a fraction of `F.cross_entropy`'s."""
    if shift:
        labels = next_token_labels(labels)
    labels = labels.reshape(-1).to(logits.device)
    total = cross_entropy(logits.reshape(labels.shape[0], -1), labels, reduction="sum", label_smoothing=epsilon)
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
    return total / count


def smoothed_loss_function(task: str, epsilon: float) -> Callable:
    """A `Trainer(compute_loss_func=...)` applying `label_smoothed_loss` the right way for `task`. Unlike Trainer's
    own `label_smoothing_factor`, smoothing is the training objective only: evaluation (run without gradients) gets
    the plain cross-entropy, so that the validation loss, the perplexity taken from it and the card's figures are the
    model's own, not the smoothed objective."""

    def compute_loss(outputs, labels, num_items_in_batch=None):
        smoothing = epsilon if torch.is_grad_enabled() else 0.0
        return label_smoothed_loss(outputs.logits, labels, smoothing, shift=task == "causal-lm",
                                   num_items_in_batch=num_items_in_batch)

    return compute_loss


# ---------------------------------------------------------------------------------------------- precision
# Below this fraction of fp32's rate, bf16 products are emulated (no bf16 instructions: AVX2 CPUs at 0.007-0.02, an
# AVX-512 Xeon without BF16 at 0.18) and autocast makes training several times slower: refused. At or above it, the
# CPU has bf16 instructions but may still run them slower than fp32 (AVX-512 BF16 without AMX: an Intel Xeon's
# one-core check read 0.38-0.64 from run to run, so a threshold of 0.5 refused or warned by the moment there): a
# warning. Our models' products of many rows run widened to fp32 there (`kernel_choice.bf16_kernel`).
BF16_MIN_SPEED = 0.25


def matmul_gflops(dtype: torch.dtype, size: int = 256, product: Callable = torch.mm, runs: int = 3,
                  device: torch.device | str = "cpu") -> float:
    """GFLOP/s of `product` on two square `size` matrices of `dtype` on `device`: the best of `runs` after a
    warm-up. Raises what the kernel raises where it does not exist for `dtype`."""
    # Random, not constant, matrices: a GPU multiplies constant ones faster. A generator of its own leaves the
    # caller's random stream (a training run's) as it was.
    generator = torch.Generator(device).manual_seed(0)
    a, b = (torch.randn(size, size, generator=generator, device=device).to(dtype) for _ in range(2))
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    product(a, b)
    seconds = math.inf
    for _ in range(runs):
        synchronize()
        start = time.perf_counter()
        product(a, b)
        synchronize()
        seconds = min(seconds, time.perf_counter() - start)
    return 2 * size**3 / seconds / 1e9


def one_core_product_rates() -> tuple[float, float]:
    """GFLOP/s of bf16 and of fp32 products on one CPU core, what `--bf16` decides by (`slow_bf16_refusal`, and the
    benchmark's bf16 rows): the kernels' speed, not the machine's load of the moment. With all threads, a parallel
    fp32 product on a busy machine ran 85x slower (2.1 against 181 GFLOP/s beside another process's products), where
    an emulated bf16 one, serial, did not, which made bf16 look native on an AVX2 CPU."""
    with one_thread():
        return matmul_gflops(torch.bfloat16), matmul_gflops(torch.float32)


def bf16_is_native(bf16: float, fp32: float) -> bool:
    """Whether the CPU has bf16 instructions, from `one_core_product_rates`: emulated products run far below
    BF16_MIN_SPEED of fp32's rate."""
    return bf16 >= BF16_MIN_SPEED * fp32


def slow_bf16_refusal(mixed_precision: str, device: torch.device | str, force: bool, option: str) -> str | None:
    """The error to stop a run with that asks for bf16 mixed precision (by `option`) on a CPU whose bf16 products
    are slow: without AVX-512 BF16 or AMX, PyTorch computes them about 100x slower than fp32 on an AVX2 CPU and about
    5x slower on an older AVX-512 one, so autocast would slow training down. Times both on one core (0.1 s) and
    names the rates; None where bf16 is fast, not asked for, or not on CPU. With `force` it warns instead and
    returns None. Where bf16 products run at BF16_MIN_SPEED of fp32's rate or more but still slower (AVX-512 BF16
    without AMX: an Intel Xeon at 0.55-0.59x, where our models trained 0.85-0.96x as fast in bf16 as in fp32, their
    products widened to fp32: `kernel_choice.bf16_kernel`), the run goes on with a warning that names the rates:
    bf16 still takes less memory (0.78-0.80 of fp32's peak in training there)."""
    if mixed_precision != "bf16" or torch.device(device).type != "cpu":
        return None
    distributed = torch.distributed.is_initialized()
    main = not distributed or torch.distributed.get_rank() == 0
    measured = list(one_core_product_rates()) if main else [None, None]
    if distributed:
        # The main process's timing decides for every process of a launched run (and warns once): each timing its
        # own, they could decide apart near a threshold, and another process refusing alone stopped the run without
        # a word, since only the main process prints errors.
        torch.distributed.broadcast_object_list(measured, src=0)
    bf16, fp32 = measured
    if bf16 >= fp32:
        return None
    rates = (f"bf16 matrix products run at {bf16:.1f} GFLOP/s here, fp32 at {fp32:.1f} ({fp32 / bf16:.1f}x "
             f"faster)")
    if bf16_is_native(bf16, fp32):
        if main:
            warnings.warn(f"bf16 mixed precision will likely train slower than fp32 on this CPU "
                          f"({torch.backends.cpu.get_cpu_capability()}; bf16 products not faster than fp32 ones): "
                          f"{rates}. It still takes less memory; for speed, train in fp32 (without {option}).",
                          stacklevel=2)
        return None
    reason = (f"bf16 mixed precision would slow training down on this CPU ({torch.backends.cpu.get_cpu_capability()}"
              f"; bf16 products not native, or slow): {rates}. Train in fp32 (without {option})")
    if force:
        if main:
            warnings.warn(f"{reason}; training in bf16 anyway, as --force-bf16 asks.", stacklevel=2)
        return None
    return f"{reason}, or add --force-bf16 to train in bf16 anyway."


# ---------------------------------------------------------------------------------------------- masked-LM batches


class MasksOfEachStep:
    """`Trainer` mixin for masked-LM training with `DataCollatorForLanguageModeling`: the masks of a training batch
    are drawn as its step takes it (`get_batch_samples`), from a generator seeded with the run's seed, the step, the
    batch's place in the step and the process, not from the global RNG as the DataLoader collates it. Accelerate's
    DataLoader fetches one batch ahead, and a resumed Trainer restores the global RNG only after taking its first
    step's batches: either way a resumed run drew other masks than the uninterrupted one (its losses left the
    uninterrupted run's at the first step after the checkpoint). Evaluation batches are masked by the collator, from
    a generator seeded with the run's seed and the process at each evaluation (and `predict`'s): every evaluation
    masks the same tokens, so that two of them differ by the weights only (from the global RNG, the final evaluation
    of a run's last weights gave another loss than the evaluation of the same weights at its last step)."""

    def get_train_dataloader(self):
        masking = self.data_collator  # the DataLoader pads only; `get_batch_samples` masks
        self._masking = copy.copy(masking)
        self._masking.generator = torch.Generator()
        self.data_collator = DataCollatorWithPadding(masking.tokenizer, pad_to_multiple_of=masking.pad_to_multiple_of)
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = masking

    def get_eval_dataloader(self, eval_dataset=None):
        return self._masked_from_the_seed(super().get_eval_dataloader, eval_dataset)

    def get_test_dataloader(self, test_dataset):
        return self._masked_from_the_seed(super().get_test_dataloader, test_dataset)

    def _masked_from_the_seed(self, get_dataloader, dataset):
        masking = self.data_collator
        self.data_collator = copy.copy(masking)  # the DataLoader keeps this one, its generator drawn from in order
        self.data_collator.generator = torch.Generator().manual_seed(  # step -1: no training batch's seed
            hash((self.args.seed, -1, 0, self.args.process_index)) % 2**63)  # ints: no per-process hash salt
        try:
            return get_dataloader(dataset)
        finally:
            self.data_collator = masking

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device):
        taken = itertools.islice(epoch_iterator, num_batches)
        batches = (self._masked(batch, place) for place, batch in enumerate(taken))
        return super().get_batch_samples(batches, num_batches, device)

    def _masked(self, batch, place: int):
        """The batch with its masks drawn, on the CPU as the collator draws them (the same masks on any device)."""
        step, process = self.state.global_step, self.args.process_index  # the step about to be taken
        self._masking.generator.manual_seed(hash((self.args.seed, step, place, process)) % 2**63)
        ids, special = batch["input_ids"], batch.pop("special_tokens_mask", None)
        masked, labels = self._masking.torch_mask_tokens(ids.cpu(), None if special is None else special.cpu())
        batch["input_ids"], batch["labels"] = masked.to(ids.device), labels.to(ids.device)
        return batch


# ---------------------------------------------------------------------------------------------- evaluation loss


def summed_token_losses(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """logits (batch, length, vocab), labels (batch, length) -> (batch, 2): each sequence's summed cross-entropy
    over its labelled tokens (-100 ignored) and their count. `shift=True` for a causal LM (its `loss_type`
    "ForCausalLM"), whose position t predicts label t + 1. With `sparse_prediction` a masked LM gives (N, vocab)
    logits for its N labelled positions only, in order. In fp32 a sequence at a time, as the models' losses upcast:
    no fp32 copy of a whole batch of bf16 logits."""
    if shift:
        labels = next_token_labels(labels)
    labels = labels.to(logits.device)
    counts = (labels != -100).sum(-1)
    if logits.dim() > 2:
        sequences = zip(logits, labels, strict=True)  # (length, vocab), (length,)
    else:
        sequences = zip(logits.split(counts.tolist()), labels[labels != -100].split(counts.tolist()), strict=True)
    sums = [F.cross_entropy(sequence_logits.float(), sequence_labels, reduction="sum")
            for sequence_logits, sequence_labels in sequences]
    return torch.stack([torch.stack(sums), counts.float()], dim=-1)


class TokenWeightedEvaluationLoss:
    """`Trainer` mixin: the evaluation loss is the mean cross-entropy over every labelled token of the evaluation
    set, the loss the training steps minimise and the Accelerate loop reports. Trainer's is the mean of each batch's
    mean, each batch counted by its number of sequences, so it moved with the evaluation batch size whenever sequences
    carry different numbers of labels (masked LM, seq2seq): 5.669, 5.681, 5.691 for the same weights at batches of
    4, 2, 1. Each sequence's summed loss and count are taken from the forward that computes the loss (a hook: the
    seq2seq trainer calls the model itself) and gathered per batch with `gather_for_metrics`, which drops the
    repeats Accelerate pads the last batch of each process with."""

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        self._token_losses, recorded = torch.zeros(2, dtype=torch.float64), []
        shift = getattr(self.accelerator.unwrap_model(self.model), "loss_type", None) == "ForCausalLM"

        def record(module, inputs, kwargs, outputs) -> None:  # forwards with labels only: not generate()'s steps
            if kwargs.get("labels") is not None:
                recorded.append(summed_token_losses(outputs.logits.detach(), kwargs["labels"], shift))

        self._recorded_token_losses = recorded
        hook = self.model.register_forward_hook(record, with_kwargs=True)
        try:
            output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        finally:
            hook.remove()
        summed, count = self._token_losses.tolist()
        if count:
            output.metrics[f"{metric_key_prefix}_loss"] = summed / count
        return output

    def prediction_step(self, *args, **kwargs):
        result = super().prediction_step(*args, **kwargs)
        recorded = getattr(self, "_recorded_token_losses", None)
        if recorded:  # in step on every process: each takes the same number of batches
            per_sequence = self.accelerator.gather_for_metrics(recorded.pop())  # (sequences of every process, 2)
            recorded.clear()
            self._token_losses += per_sequence.sum(0).cpu().double()
        return result


# ---------------------------------------------------------------------------------------------- stopping


class Preemption:
    """SIGTERM as a request to stop after the optimizer step under way, with a checkpoint of that step: what job
    schedulers (SLURM, Kubernetes, spot instances) send before they kill a job after a grace period, and torchrun
    forwards to every process. Only around the training steps (`with Preemption() as preemption:`): the handler
    sets `requested`, which the loop reads after each step, every process agreeing (`StopAfterStep`, the Accelerate
    loop's loss reduction); the loop then saves, sets `stopped_at` and stops. Further SIGTERMs change nothing (SLURM
    signals every process of a job step, and torchrun forwards its own: a worker gets two); SIGKILL and Ctrl-C still
    end the run at once, a save included, which leaves that checkpoint incomplete, passed over by --resume.
    Elsewhere SIGTERM ends the process at once, as it always did: before training (data, tokenizer work), and in
    the final evaluation and model folder, which a short grace period would not see through."""

    def __init__(self):
        self.requested, self.stopped_at, self._before = False, None, None

    def __enter__(self):
        self._before = signal.signal(signal.SIGTERM, self._request)
        return self

    def _request(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, error_type, *rest) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self._before is None else self._before)  # None: set in C
        if self.requested and self.stopped_at is None and error_type is None:
            # It came after the last step's check (during the last checkpoint): the process ends now, as it did.
            os.kill(os.getpid(), signal.SIGTERM)


class StopAfterStep(TrainerCallback):
    """Stop `Trainer` after an optimizer step, with a checkpoint of that step, once `seconds` of training have passed
    (a time budget: the run then evaluates and saves its model as at its last step, and `--resume` continues the
    schedule to `max_steps`; a budget in time as well as in steps keeps a run's length the same on slow machines),
    or once `preemption` caught a SIGTERM (also after the last step: the command then ends without its evaluation
    and model folder, `Preemption`). Both are checked after each optimizer step; `stopped_at` is the step."""

    def __init__(self, seconds: float | None = None, preemption: Preemption | None = None):
        self.seconds, self.preemption, self.start, self.stopped_at = seconds, preemption, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        flags = torch.tensor([self.seconds is not None and time.monotonic() - self.start > self.seconds,
                              self.preemption is not None and self.preemption.requested], dtype=torch.float)
        if args.world_size > 1:
            # Every process stops after the same step: one that stopped alone left the others waiting in the next
            # step's gradient exchange for it, for good. The clocks cross the budget, and a SIGTERM reaches the
            # processes, at different steps. One two-number reduction per step, for both.
            flags = reduce(flags.to(args.device), "max")
        over, preempted = flags.tolist()
        if preempted:
            self.preemption.stopped_at = state.global_step
        if preempted or (over and state.global_step < state.max_steps):
            control.should_training_stop = control.should_save = True
            self.stopped_at = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step:  # saved; an epoch strategy would evaluate it and save it again
            control.should_evaluate = control.should_save = False


# ---------------------------------------------------------------------------------------------- metrics


def perplexity(eval_loss: float) -> float:
    return math.exp(min(eval_loss, 100.0))


def argmax_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`Trainer(preprocess_logits_for_metrics=...)`: predictions (batch, length), not (batch, length, vocab) logits.
    With `sparse_prediction` the model gives (N, vocab) logits for the N labelled positions only, in order; they are
    put back in place (-100 elsewhere), so that the predictions are shaped like the labels: Trainer trims a last,
    short batch by examples, which would cut a flat list of predictions at the wrong place."""
    predictions = logits.argmax(-1)
    if predictions.shape == labels.shape:
        return predictions
    placed = torch.full_like(labels, -100)
    placed[labels != -100] = predictions
    return placed


def mlm_accuracy(eval_prediction) -> dict:
    """Share of masked tokens (labels other than -100) predicted exactly, and how many there were (none: no share)."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    masked = labels != -100
    if not masked.any():
        return {"masked_tokens": 0}
    return {"mlm_accuracy": float((predictions[masked] == labels[masked]).mean()), "masked_tokens": int(masked.sum())}


def translation_metrics(tokenizer) -> Callable:
    """`Seq2SeqTrainer(compute_metrics=...)` with `predict_with_generate`: corpus BLEU and chrF (sacrebleu)."""
    import sacrebleu

    def compute(eval_prediction) -> dict:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels == -100, tokenizer.pad_token_id, labels)
        hypotheses = [t.strip() for t in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        return {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
                "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}

    return compute


def classification_metrics(eval_prediction) -> dict:
    """Accuracy and macro-F1 over labelled items (sequences, or tokens with -100 for the unlabelled ones). Macro-F1
    averages every class found in the labels or the predictions, as scikit-learn's does: a class only ever
    predicted (wrongly) counts, with F1 0."""
    return _accuracy_and_macro_f1(*_predicted_ids(eval_prediction))


def _predicted_ids(eval_prediction) -> tuple[np.ndarray, np.ndarray]:
    """(predicted ids, labels) of an `EvalPrediction` whose predictions are ids or logits (one more dimension)."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    if predictions.ndim == labels.ndim + 1:  # logits
        predictions = predictions.argmax(-1)
    return predictions, labels


def _accuracy_and_macro_f1(predictions: np.ndarray, labels: np.ndarray) -> dict:
    keep = labels != -100
    predictions, labels = predictions[keep], labels[keep]
    f1_scores = []
    for label in np.union1d(labels, predictions):
        true_positive = np.sum((predictions == label) & (labels == label))
        predicted, actual = np.sum(predictions == label), np.sum(labels == label)
        f1_scores.append(2 * true_positive / (predicted + actual) if predicted + actual else 0.0)
    return {"accuracy": float((predictions == labels).mean()), "f1": float(np.mean(f1_scores))}


# Tag prefixes of the IOB1 / IOB2 / IOBES schemes that seqeval reads ("B-PER", "I-PER", "E-PER", "S-PER"), and "O"
ENTITY_TAG_PREFIXES = ("B-", "I-", "E-", "S-")


def names_entities(label_names: list[str]) -> bool:
    """Whether token labels are entity tags: each "O" or a scheme prefix and a type, at least one not "O"."""
    return any(name != "O" for name in label_names) and all(
        name == "O" or (name[:2] in ENTITY_TAG_PREFIXES and len(name) > 2) for name in label_names
    )


def token_classification_metrics(label_names: list[str]) -> Callable[[object], dict]:
    """`compute_metrics` for token classification: `classification_metrics` over the labelled words, and where the
    labels are entity tags (`names_entities`), entity-level precision, recall and F1 (micro over entities: an entity
    counts when its type and its words are all right), as seqeval's default (conlleval) mode computes them, i.e. the
    f1 that transformers' run_ner example reports. label_names: the head's labels by id."""
    entities = names_entities(label_names)

    def compute(eval_prediction) -> dict:
        predictions, labels = _predicted_ids(eval_prediction)
        metrics = _accuracy_and_macro_f1(predictions, labels)
        if entities:
            from seqeval.metrics import f1_score, precision_score, recall_score  # imports scikit-learn: 1.4 s

            # (texts, tokens) -> one tag sequence per text, over its labelled tokens (each word's first token)
            keep = labels != -100
            true = [[label_names[i] for i in row[kept]] for row, kept in zip(labels, keep, strict=True)]
            predicted = [[label_names[i] for i in row[kept]] for row, kept in zip(predictions, keep, strict=True)]
            metrics.update(entity_precision=float(precision_score(true, predicted, zero_division=0)),
                           entity_recall=float(recall_score(true, predicted, zero_division=0)),
                           entity_f1=float(f1_score(true, predicted, zero_division=0)))
        return metrics

    return compute


# ---------------------------------------------------------------------------------------------- plot


def plot_loss_curve(log_history: list[dict], path: Path, title: str = "") -> Path:
    """Training loss per logged step, and evaluation loss where evaluated, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from matplotlib import pyplot as plt

    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    evaluation = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    figure, axis = plt.subplots(figsize=(7, 4))
    for points, label, style in ((train, "training loss", "-"), (evaluation, "validation loss", "o-")):
        if points:
            axis.plot(*zip(*points, strict=True), style, label=label)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("loss")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
