"""Train a tokenizer for a Scratch model family and save it as a Hugging Face tokenizer folder.

    python -m tokenizer_training --kind bpe --family decoder --files "$(python -m hf_scratch_transformer.data)" \\
        --vocab-size 8000 --output-dir outputs/tokenizer
    python -m tokenizer_training --kind wordpiece --family encoder --dataset path/to/folder_of_txt_csv_or_json \\
        --output-dir outputs/tokenizer-mlm
    python -m tokenizer_training --kind unigram --family seq2seq --dataset wikitext \\
        --dataset-config wikitext-2-raw-v1 --output-dir outputs/tokenizer-s2s      # a Hub dataset: needs network

The folder loads with `AutoTokenizer.from_pretrained(output_dir)`.
"""

import argparse
import sys
import time
from pathlib import Path

from hf_scratch_transformer.checkpointing import CheckpointError
from hf_scratch_transformer.cli.run_data import files_given_twice
from hf_scratch_transformer.cli.run_errors import fail
from hf_scratch_transformer.cli.run_options import non_negative_int, positive_int
from tokenizer_training import load_data, padded_vocab_size, train_tokenizer
from tokenizer_training.saving import held_tokenizer, save_in_place, tokenizer_files
from tokenizer_training.trainers import FAMILIES, KINDS

# -----------------------------------------------------------------------------------------------
# Arguments

# `hf-scratch tokenizer` names itself in sys.argv[0]; run with -m, argparse would say "__main__.py".
prog = sys.argv[0] if sys.argv[0].startswith("hf-scratch") else "python -m tokenizer_training"
parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--kind", choices=KINDS, required=True, help="tokenizer model: byte-level BPE, WordPiece, Unigram")
parser.add_argument("--family", choices=FAMILIES, required=True, help="model family: sets special tokens and templates")
source = parser.add_mutually_exclusive_group(required=True)
source.add_argument("--files", nargs="+", action="extend", type=Path,  # repeated, it adds files
                    help="plain text files, one example per line")
source.add_argument("--dataset", help="a `datasets` name on the Hub, or a local data file or folder (txt/csv/json)")
parser.add_argument("--dataset-config", default=None, help="dataset configuration name (default: none)")
parser.add_argument("--split", help="dataset split to train on (default: train)")
parser.add_argument("--text-column", help="dataset column holding the text (default: text)")
parser.add_argument("--vocab-size", type=positive_int, default=8000,
                    help="tokens, special ones included (default: 8000)")
parser.add_argument("--min-frequency", type=non_negative_int, default=2,
                    help="least count of a pair to merge (default: 2)")
parser.add_argument("--model-max-length", type=positive_int, default=None,
                    help="longest input for truncation (default: unset)")
parser.add_argument("--output-dir", type=Path, required=True, help="folder to write the tokenizer to")
parser.add_argument("--overwrite-output-dir", action="store_true",
                    help="replace the tokenizer that --output-dir holds (that of a trained model, say)")
args = parser.parse_args()
# Options of --dataset were left out without a word with --files (plain text files have no configuration, splits or
# columns): the tokenizer learnt from every line of the files.
if args.files and (given := [f"--{name.replace('_', '-')}" for name in ("dataset_config", "split", "text_column")
                             if getattr(args, name) is not None]):
    parser.error(f"{', '.join(given)}: options of --dataset, which --files does not use (plain text files have no "
                 "configuration, splits or columns)")
# Read twice, a file's words counted double, which --min-frequency then judged by (as the training commands refuse it).
if args.files and (problem := files_given_twice({"files": args.files})):
    parser.error(problem)
# A model folder's tokenizer replaced without a word would put other ids under its weights (a slow one too: vocab.txt).
held = tokenizer_files(args.output_dir)
if held and not args.overwrite_output_dir:
    parser.error(f"--output-dir {args.output_dir} holds {held_tokenizer(held)}: pass --overwrite-output-dir to "
                 "replace it, or choose another --output-dir")
if folders := [name for name in held if not (args.output_dir / name).is_file()]:  # failed after training, half saved
    parser.error(f"--output-dir {args.output_dir}: {', '.join(folders)} is a folder, where the tokenizer's file goes")
# `save_pretrained` only logs that a file is in the way and writes nothing: refuse before training.
blocking = next((folder for folder in (args.output_dir, *args.output_dir.parents) if folder.exists()), None)
if blocking is not None and not blocking.is_dir():
    parser.error(f"--output-dir {args.output_dir}: {blocking} is a file, not a folder")

# -----------------------------------------------------------------------------------------------
# Data

dataset = None
if args.dataset is not None:
    try:
        dataset = load_data(args.dataset, args.dataset_config, split=args.split or "train")
    except ValueError as error:  # not a dataset's file, not text, unparsable, no rows, or no such split
        parser.error(f"--dataset {error}")

# -----------------------------------------------------------------------------------------------
# Training

t0 = time.time()
try:
    tokenizer = train_tokenizer(
        args.kind, args.family, files=args.files, dataset=dataset, text_column=args.text_column or "text",
        vocab_size=args.vocab_size, min_frequency=args.min_frequency, model_max_length=args.model_max_length,
    )
except (ValueError, FileNotFoundError) as error:  # a missing or unreadable file, or a missing column: named
    parser.error(str(error))
print(f"trained {args.kind} for {args.family} in {time.time() - t0:.1f}s")
print(f"vocabulary: {len(tokenizer):,} tokens -> model vocab_size {padded_vocab_size(tokenizer):,} (padded to 64)")

# -----------------------------------------------------------------------------------------------
# Saving

# The replaced tokenizer's other files go too: left, they would be read with the new one (--overwrite-output-dir only).
try:
    stale = save_in_place(tokenizer, args.output_dir, held)
except CheckpointError as error:  # a full disk: one line, not a traceback over a half-replaced tokenizer
    fail(parser, str(error))
if stale:
    print(f"removed the replaced tokenizer's {', '.join(stale)}")
print(f"saved to {args.output_dir}")

# -----------------------------------------------------------------------------------------------
# Round-trip check (WordPiece drops whitespace, and characters unseen in training become unknown tokens)

sample = "Hello world! Numbers: 123, 4567.\nContractions: I'm, you're, it's."
# verbose=False: shown, not run through a model, the example may be longer than a small --model-max-length without the
# tokenizer's warning of "indexing errors" applying.
ids = tokenizer(sample, verbose=False)["input_ids"]
decoded = tokenizer.decode(ids, skip_special_tokens=True)
print(f"example: {sample!r}\n  tokens: {tokenizer.convert_ids_to_tokens(ids)}\n  decoded: {decoded!r}")
print(f"  round trip: {'exact' if decoded == sample else 'lossy'}")
