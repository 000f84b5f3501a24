"""Convert a saved native GPT-2, BERT or Marian checkpoint folder into a Scratch model folder.

    hf-scratch convert path/to/gpt2 outputs/gpt2-scratch
    hf-scratch convert path/to/bert-base-uncased outputs/bert-scratch --atol 1e-5
    hf-scratch convert path/to/opus-mt-en-de outputs/opus-mt-scratch --no-check

The source is a folder written by `save_pretrained` of `GPT2LMHeadModel` (model_type gpt2), `BertForMaskedLM`
(bert) or `MarianMTModel` (marian). It is loaded with that class, converted by
`hf_scratch_transformer.conversion.from_hf`, checked (unless --no-check: the logits of both models on a random
batch in eval mode must agree within --atol), and saved with `save_pretrained` in the source's dtype, with the
source's tokenizer when it has one. Load the result with `AutoModelForCausalLM` / `AutoModelForMaskedLM` /
`AutoModelForSeq2SeqLM.from_pretrained(output)` after `import hf_scratch_transformer`, or with
`trust_remote_code=True` where the package is not installed. Local folders only: the Hub is never contacted.
"""

import argparse
import json
import os
import sys
from pathlib import Path

# native model_type -> the class that is loaded and converted
NATIVE_CLASSES = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "marian": "MarianMTModel"}
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")

# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("source", type=Path, help="folder written by save_pretrained of a native model")
parser.add_argument("output", type=Path, help="folder for the converted model (created if needed)")
parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="compare logits with the native model before saving (default: on)")
parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed |logit difference| (default 1e-4)")
parser.add_argument("--seed", type=int, default=0, help="seed of the random check batch (default 0)")
args = parser.parse_args()


def fail(message: str) -> None:
    sys.exit(f"convert_hf_checkpoint: error: {message}")


# ----------------------------------------------------------------------------------------------- source
# Checked before the heavy imports, so that a wrong path fails at once.
if not args.source.is_dir():
    fail(f"source folder {args.source} does not exist")
if not (args.source / "config.json").is_file():
    fail(f"{args.source} has no config.json; expected a folder written by `save_pretrained`")
if args.output.resolve() == args.source.resolve():
    fail("the output folder must differ from the source folder")
source_config = json.loads((args.source / "config.json").read_text(encoding="utf-8"))
model_type, architectures = source_config.get("model_type"), source_config.get("architectures") or []
if model_type not in NATIVE_CLASSES or (architectures and NATIVE_CLASSES[model_type] not in architectures):
    supported = ", ".join(f"{name} ({cls})" for name, cls in NATIVE_CLASSES.items())
    fail(f"cannot convert {args.source}: model_type={model_type!r}, architectures={architectures}; "
         f"supported: {supported}")

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never wait on the network
import torch  # noqa: E402
import transformers  # noqa: E402

from hf_scratch_transformer.conversion import from_hf  # noqa: E402

tokenizer = None
if any((args.source / name).is_file() for name in TOKENIZER_FILES):
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.source)
    except Exception as error:  # e.g. a sentencepiece tokenizer without `sentencepiece` installed
        fail(f"{args.source} has tokenizer files, but AutoTokenizer cannot load them: {error}")

# ----------------------------------------------------------------------------------------------- convert
# Converted and checked in float32; saved in the source's dtype at the end.
native_class = getattr(transformers, NATIVE_CLASSES[model_type])
native, loading_info = native_class.from_pretrained(args.source, dtype=torch.float32, output_loading_info=True)
if loading_info["missing_keys"]:
    fail(f"the checkpoint lacks weights of a {native_class.__name__}: {sorted(loading_info['missing_keys'])}")
native.eval()
if tokenizer is not None and len(tokenizer) > native.config.vocab_size:
    fail(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary ({native.config.vocab_size})")
try:
    model = from_hf(native).eval()
except ValueError as error:  # an option of the native config that has no Scratch equivalent
    fail(str(error))

# ----------------------------------------------------------------------------------------------- check
if args.check:
    generator = torch.Generator().manual_seed(args.seed)
    config = native.config
    batch, length = 2, min(8, config.max_position_embeddings)
    ids = torch.randint(config.vocab_size, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, length // 2 :] = 0  # a padded row: the masks must agree too
    inputs = {"input_ids": ids, "attention_mask": mask}
    if model_type == "bert":
        inputs["token_type_ids"] = torch.randint(config.type_vocab_size, (batch, length), generator=generator)
    if model_type == "marian":
        inputs["decoder_input_ids"] = torch.randint(config.decoder_vocab_size, (batch, length), generator=generator)
    with torch.no_grad():
        diff = (model(**inputs).logits - native(**inputs).logits).abs().max().item()
    if not diff <= args.atol:  # also catches NaN
        fail(f"parity check failed: logits differ by up to {diff:.3g} (> --atol {args.atol:g}); nothing was written")
    print(f"parity check passed: max |logit difference| {diff:.3g} <= {args.atol:g}")

# ----------------------------------------------------------------------------------------------- save
dtype = source_config.get("dtype") or source_config.get("torch_dtype") or "float32"
model.to(getattr(torch, dtype)).save_pretrained(args.output)
if tokenizer is not None:
    tokenizer.save_pretrained(args.output)
print(f"{native_class.__name__} -> {type(model).__name__} ({model.num_parameters():,} parameters, {dtype}) "
      f"saved to {args.output}{' with its tokenizer' if tokenizer is not None else ''}")
if loading_info["unexpected_keys"]:  # e.g. BERT's pooler, which BertForMaskedLM does not have
    print(f"checkpoint tensors a {native_class.__name__} does not use (not converted): "
          f"{sorted(loading_info['unexpected_keys'])}")
