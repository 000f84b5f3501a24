"""Convert a saved model folder between native `transformers` and Scratch, in either direction.

    hf-scratch convert path/to/gpt2 outputs/gpt2-scratch                 # native -> Scratch
    hf-scratch convert path/to/TinyLlama outputs/tinyllama-scratch --atol 1e-3
    hf-scratch convert outputs/my-llama-style outputs/my-llama-native    # Scratch -> native
    hf-scratch convert path/to/opus-mt-en-de outputs/opus-mt-scratch --no-check

The direction comes from the source's `model_type` (or --to, which must agree with it). A native folder, written by
`save_pretrained` of `GPT2LMHeadModel` (gpt2), `LlamaForCausalLM` (llama), `MistralForCausalLM` (mistral),
`Qwen2ForCausalLM` (qwen2), `BertForMaskedLM` (bert) or `MarianMTModel` (marian) (or `BertForPreTraining` and
`GPT2DoubleHeadsModel`, which hold those language models too), becomes a Scratch folder through
`hf_scratch_transformer.conversion.from_hf`. A Scratch folder saved from a language-model head (scratch_decoder,
scratch_encoder, scratch_seq2seq) becomes the native folder through `to_hf`: GPT-2, Llama or Mistral, BERT or
Marian, whichever computes exactly the same function (knobs that none does are named, and nothing is written).
Sequence classifiers convert both ways too (`GPT2ForSequenceClassification`, `LlamaForSequenceClassification`,
`MistralForSequenceClassification` and `Qwen2ForSequenceClassification` <-> `ScratchDecoderForSequenceClassification`,
their token classifiers and question answerers alike <-> `ScratchDecoderForTokenClassification` and
`ScratchDecoderForQuestionAnswering`, `BertForSequenceClassification` <-> `ScratchEncoderForSequenceClassification`
with `classifier_pooler`), and BERT's
other task heads (`BertForTokenClassification` <-> `ScratchEncoderForTokenClassification`, `BertForQuestionAnswering`
<-> `ScratchEncoderForQuestionAnswering`, `BertForMultipleChoice` <-> `ScratchEncoderForMultipleChoice`), as
`hf-scratch finetune` saves them.

The converted model is checked (unless --no-check: the logits of both models on a random batch in eval mode must
agree within --atol) and saved with `save_pretrained` in the source's dtype, with its generation config and the
source's tokenizer when it has one, and a model card for `hf-scratch publish` (`hub.write_conversion_card`: the
source's card, or a short one, saying what was converted and how it was checked, with a "How to use" that loads the
converted classes). A Scratch result loads with `AutoModelFor*.from_pretrained(output)` after
`import hf_scratch_transformer`, or with `trust_remote_code=True` where the package is not installed; a native
result loads with the plain Auto classes, no remote code; where llama.cpp would run it otherwise once converted to
GGUF (a GPT-2 without `gelu_tanh` or with a feed-forward other than 4 x hidden, Mistral's window), a note says why
(`llama_cpp.llama_cpp_caveats`; docs/native_models.md, "GGUF and llama.cpp"). Local folders only: the Hub is
never contacted. An output folder that already holds files is replaced only with --overwrite-output-dir (never one
that contains the source); the output cannot lie in the source folder, nor be a mount point (give a folder inside
it).
"""

import argparse
import errno
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import NoReturn

import psutil

from hf_scratch_command import command_help

# model_type -> the class loaded from the source folder: native ones convert with `from_hf`, ours with `to_hf`
NATIVE_CLASSES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "bert": "BertForMaskedLM",
    "marian": "MarianMTModel",
}
SCRATCH_CLASSES = {
    "scratch_decoder": "ScratchDecoderForCausalLM",
    "scratch_encoder": "ScratchEncoderForMaskedLM",
    "scratch_seq2seq": "ScratchSeq2SeqForConditionalGeneration",
}
# model_type -> the task heads that convert too, loaded where config.json's `architectures` names one, each with the
# task of its card
HEAD_CLASSES = {
    **{model_type: {f"{prefix}ForSequenceClassification": "text-classification",
                    f"{prefix}ForTokenClassification": "token-classification",
                    f"{prefix}ForQuestionAnswering": "question-answering"}
       for model_type, prefix in (("gpt2", "GPT2"), ("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"),
                                  ("scratch_decoder", "ScratchDecoder"))},
    "bert": {"BertForSequenceClassification": "text-classification",
             "BertForTokenClassification": "token-classification",
             "BertForQuestionAnswering": "question-answering",
             "BertForMultipleChoice": "multiple-choice"},
    "scratch_encoder": {"ScratchEncoderForSequenceClassification": "text-classification",
                        "ScratchEncoderForTokenClassification": "token-classification",
                        "ScratchEncoderForQuestionAnswering": "question-answering",
                        "ScratchEncoderForMultipleChoice": "multiple-choice"},
}
# model_type -> the task of the converted model's card (`hub.TASKS`): its "How to use"
CARD_TASKS = {"gpt2": "causal-lm", "llama": "causal-lm", "mistral": "causal-lm", "qwen2": "causal-lm",
              "bert": "masked-lm", "marian": "seq2seq", "scratch_decoder": "causal-lm",
              "scratch_encoder": "masked-lm", "scratch_seq2seq": "seq2seq"}
# Any one of them means the source has a tokenizer: older checkpoints carry only their vocabulary files (BERT's
# vocab.txt, GPT-2's vocab.json and merges.txt, a sentencepiece model), which AutoTokenizer loads from them.
# Checkpoints of other native heads that hold the whole language model as well: BERT's pre-training checkpoints (the
# MLM head beside the NSP head and pooler) and GPT-2's double-heads model. They load as the class above; the other
# head's tensors are listed as unused.
HOLDING_THE_LM = {"bert": ("BertForPreTraining",), "gpt2": ("GPT2DoubleHeadsModel",)}

# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=command_help(__doc__),
                                 formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("source", type=Path, help="folder written by save_pretrained (native or Scratch)")
parser.add_argument("output", type=Path, help="folder for the converted model (created if needed)")
parser.add_argument("--to", choices=("scratch", "native"), default=None,
                    help="direction (default: from the source's model_type)")
parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="compare logits of both models before saving (default: on)")
parser.add_argument("--atol", type=float, default=1e-4, help="largest allowed |logit difference| (default 1e-4)")
parser.add_argument("--seed", type=int, default=0, help="seed of the random check batch (default 0)")
parser.add_argument("--overwrite-output-dir", action="store_true",
                    help="replace an output folder that already holds files (replaced whole once the new one is saved)")
args = parser.parse_args()


def fail(message: str) -> NoReturn:
    """Stop with exit status 2, as argparse does for a bad option and the training commands for any refusal."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


# The folders a conversion writes beside its output (hidden, named by its process): the new folder being written,
# then the earlier output, renamed aside just before the new one is renamed in.
ASIDE = ("converting", "replaced")


def process_name(pid: int) -> str:
    """`pid-start`: the process id and when that process started (in 1/100 s). An id is reused once its process ends
    (after a restart, by the first processes started), so the id alone could make a stopped conversion look alive."""
    return f"{pid}-{round(psutil.Process(pid).create_time() * 100)}"


def aside(output: Path, what: str) -> Path:
    return output.with_name(f".{output.name}.{what}-{process_name(os.getpid())}")


def process_alive(name: str) -> bool:
    pid, _, start = name.partition("-")
    try:  # a name without a start is an older release's, which named folders by the process id alone
        return process_name(int(pid)) == name if start else psutil.pid_exists(int(pid))
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's
        return True


def recover_from_stopped_conversions(output: Path) -> None:
    """What a conversion into `output` that was killed left beside it (a crash leaves its folders aside, and only
    that process knew them): its partial new folder is removed, and an earlier output it had renamed aside, where
    the new one never took its place, is put back: the output is as it was before that conversion. Folders of a
    conversion still running are left alone."""
    left = re.compile(rf"\.{re.escape(output.name)}\.({'|'.join(ASIDE)})-(\d+(?:-\d+)?)")
    for path in sorted(output.parent.iterdir()) if output.parent.is_dir() else []:
        match = left.fullmatch(path.name)
        if not match or not path.is_dir() or process_alive(match[2]):
            continue
        if match[1] == "replaced" and not output.exists():
            os.replace(path, output)
            print(f"restored {output} from {path.name}, where a conversion stopped while replacing it had put it")
        else:
            shutil.rmtree(path)
            print(f"removed {path.name}, left by a conversion that was stopped")


# ----------------------------------------------------------------------------------------------- source
# Checked before anything is loaded, so that a wrong path or model fails before any work.
if args.source.is_file():  # a file of the folder, config.json or the weights, say
    fail(f"the source {args.source} is a file: give the folder that `save_pretrained` wrote, {args.source.parent}")
if not args.source.is_dir():
    fail(f"source folder {args.source} does not exist (convert reads local folders only, never the Hub: download a "
         "Hub model into one first, `hf download REPO_ID --local-dir FOLDER`)")
if not (args.source / "config.json").is_file():
    fail(f"{args.source} has no config.json; expected a folder written by `save_pretrained`")
if args.output.resolve() == args.source.resolve():
    fail("the output folder must differ from the source folder")
if args.source.resolve().is_relative_to(args.output.resolve()):  # replacing the output would delete the source
    fail(f"the output folder {args.output} contains the source folder {args.source}: choose another output folder")
if args.output.exists() and not args.output.is_dir():
    fail(f"the output {args.output} is a file, not a folder")
# An output under a file failed only when the converted model was saved, with a traceback.
if in_the_way := next((parent for parent in args.output.parents if parent.exists() and not parent.is_dir()), None):
    fail(f"the output {args.output} lies under {in_the_way}, a file, not a folder")
# The source is only read: converted into it, the output was among its files (uploaded with them when it is published,
# removed when a run writes its model folder again).
if args.output.resolve().is_relative_to(args.source.resolve()):
    fail(f"the output folder {args.output} lies in the source folder {args.source}: choose an output outside it")
# The converted folder is written beside the output and renamed into place (see "save"): a mount point (a volume
# mounted into a container, say) cannot be renamed, which failed with a traceback after all the work, leaving the
# converted folder hidden beside it for the next conversion to remove.
if os.path.ismount(args.output.resolve()):  # resolved: a link to a mount point is no mount point itself
    fail(f"the output {args.output} is a mount point, which cannot be replaced: the converted folder is written "
         f"beside the output and renamed into place. Give a folder inside it, e.g. {args.output / 'converted'}")
# Written beside it, the converted folder needs the folder above the output writable (or the nearest one that exists,
# where the rest is created), not only the output: a PermissionError traceback after all the work.
above = next(parent for parent in args.output.resolve().parents if parent.exists())
if not os.access(above, os.W_OK | os.X_OK):
    fail(f"cannot write in {above}, where the converted folder is written and then renamed into place as "
         f"{args.output}: give an output in a folder you can write in")
recover_from_stopped_conversions(args.output.resolve())
held = sorted(path.name for path in args.output.iterdir()) if args.output.is_dir() else []
if held and not args.overwrite_output_dir:
    fail(f"{args.output} already holds files ({', '.join(held[:5])}{' ...' if len(held) > 5 else ''}): pass "
         "--overwrite-output-dir to replace it, or choose another output folder")
try:
    source_config = json.loads((args.source / "config.json").read_text(encoding="utf-8"))
except json.JSONDecodeError as error:
    fail(f"{args.source / 'config.json'} is not valid JSON: {error}")
if not isinstance(source_config, dict) or not isinstance(source_config.get("model_type", ""), str):
    fail(f"{args.source / 'config.json'} is not a model's config: a JSON object whose model_type is a string")
model_type, architectures = source_config.get("model_type"), source_config.get("architectures") or []
to_scratch = model_type in NATIVE_CLASSES
head = next((name for name in architectures if name in HEAD_CLASSES.get(model_type, {})), None)
source_class = head or NATIVE_CLASSES.get(model_type) or SCRATCH_CLASSES.get(model_type)
card_task = HEAD_CLASSES[model_type][head] if head else CARD_TASKS.get(model_type)
accepted = {source_class, *HOLDING_THE_LM.get(model_type, ())}
if source_class is None or (architectures and not accepted.intersection(architectures)):
    supported = ", ".join(f"{name} ({' or '.join((cls, *HEAD_CLASSES.get(name, {})))})"
                          for name, cls in {**NATIVE_CLASSES, **SCRATCH_CLASSES}.items())
    # Older checkpoints (Google's small BERTs) name none: transformers guessed it from the repository name.
    hint = "" if model_type else '; config.json names no model_type: add the model\'s own (e.g. "model_type": "bert")'
    fail(f"cannot convert {args.source}: model_type={model_type!r}, architectures={architectures}{hint}; "
         f"supported: {supported}")
if args.to is not None and args.to != ("scratch" if to_scratch else "native"):
    fail(f"--to {args.to}: {args.source} holds a {'native' if to_scratch else 'Scratch'} {source_class}, "
         f"which converts to {'Scratch' if to_scratch else 'native'} only")

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: never wait on the network
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.modeling_utils import get_state_dict_dtype, load_state_dict  # noqa: E402

import hf_scratch_transformer  # noqa: E402
from hf_scratch_transformer import hub  # noqa: E402
from hf_scratch_transformer.checkpointing import CheckpointError, write_error_named  # noqa: E402
from hf_scratch_transformer.conversion import from_hf, to_hf  # noqa: E402
from hf_scratch_transformer.llama_cpp import llama_cpp_caveats  # noqa: E402
from hf_scratch_transformer.modeling_scratch_common import safetensors_error  # noqa: E402
from tokenizer_training import TOKENIZER_FILES  # noqa: E402

# ----------------------------------------------------------------------------------------------- load
try:  # the source's card goes with the converted model: one whose metadata does not parse stops before any work
    hub.load_card(args.source)
except ValueError as error:
    fail(f"{error}; correct or remove it")
# One that does not parse, `from_pretrained` replaced without a word by one made from config.json (or failed with a
# traceback): the converted model would generate otherwise than its source. An encoder has none to carry.
generation_file = args.source / "generation_config.json"
if card_task in ("causal-lm", "seq2seq") and generation_file.is_file():
    try:
        transformers.GenerationConfig.from_pretrained(args.source)
    except (OSError, ValueError, TypeError) as error:
        fail(f"{generation_file} is not a generation config that loads ({error}); correct or remove it")
# Converted and checked in float32; saved in the source's dtype at the end.
loader = getattr(transformers if to_scratch else hf_scratch_transformer, source_class)
try:  # a folder without weights (OSError), or a config value its class refuses (ValueError)
    # Mismatched shapes are reported below, naming them, rather than raised by transformers.
    source, loading_info = loader.from_pretrained(args.source, dtype=torch.float32, output_loading_info=True,
                                                  ignore_mismatched_sizes=True)
except json.JSONDecodeError as error:  # config.json and generation_config.json parsed above: the weights' index
    indexes = ", ".join(path.name for path in sorted(args.source.glob("*.index.json"))) or "a JSON file of it"
    fail(f"cannot load {args.source} as a {source_class}: {indexes} is not valid JSON ({error}). Save or download "
         "it again.")
except (OSError, ValueError) as error:
    fail(f"cannot load {args.source} as a {source_class}: {error}")
except pickle.UnpicklingError as error:  # a corrupt .bin: its advice to load with weights_only=False is not for it
    fail(f"cannot load {args.source} as a {source_class}: a PyTorch weights file of it is corrupt or no weights "
         f"file ({str(error).splitlines()[0]}). Save or download it again.")
except ImportError as error:  # a quantizer's library (bitsandbytes, GPTQ, AWQ, torchao) that is not installed
    quantization = source_config.get("quantization_config")
    if not isinstance(quantization, dict):
        fail(f"cannot load {args.source} as a {source_class}: {error}")
    # Installing the library would not help: loaded, the weights are quantized tensors, which `to_hf` / `from_hf`
    # refuse (those of methods that transformers dequantizes at load, such as fp8 on CPU, raise no ImportError).
    fail(f"{args.source} holds weights quantized with {quantization.get('quant_method')} (config.json's "
         f"quantization_config), which cannot be loaded here ({error}); quantized weights do not convert: convert "
         "the full-precision folder, then quantize the result")
except Exception as error:  # a truncated or corrupt safetensors file fails in safetensors, naming no file; a config
    # value that the class's own code cannot build from (an unknown activation or RoPE type: KeyError)
    corrupt = next(filter(None, map(safetensors_error, sorted(args.source.glob("*.safetensors")))), None)
    fail(f"cannot load {args.source} as a {source_class}: {corrupt or f'{type(error).__name__}: {error}'}")
if loading_info["missing_keys"]:
    fail(f"the checkpoint lacks weights of a {source_class}: {sorted(loading_info['missing_keys'])}")
if loading_info["mismatched_keys"]:
    shapes = [f"{key} {tuple(saved)} (the config gives {tuple(expected)})"
              for key, saved, expected in sorted(loading_info["mismatched_keys"])]
    fail(f"checkpoint tensors of a {source_class} have shapes its config.json does not give: {'; '.join(shapes)}")
source.eval()

tokenizer = None
if any((args.source / name).is_file() for name in TOKENIZER_FILES):
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.source)
    except Exception as error:  # e.g. a sentencepiece tokenizer without `sentencepiece` installed
        fail(f"{args.source} has tokenizer files, but AutoTokenizer cannot load them: {error}")
    # The input vocabulary: Marian's `vocab_size` and our `source_vocab_size` are the encoder's.
    input_vocab = getattr(source.config, "source_vocab_size", source.config.vocab_size)
    if len(tokenizer) > input_vocab:
        fail(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary ({input_vocab})")

# ----------------------------------------------------------------------------------------------- convert
try:
    converted = (from_hf if to_scratch else to_hf)(source).eval()
except ValueError as error:  # a knob of one side that the other side has no exact equivalent for
    fail(str(error))
native = source if to_scratch else converted

# ----------------------------------------------------------------------------------------------- check
if args.check:
    generator = torch.Generator().manual_seed(args.seed)
    config = native.config
    # a classifier without a padding id classifies one row at a time (a batch is refused on both sides)
    batch = 1 if "ForSequenceClassification" in type(native).__name__ and config.pad_token_id is None else 2
    length = min(8, config.max_position_embeddings)
    ids = torch.randint(config.vocab_size, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    mask[-1, length // 2 :] = 0  # a padded row: the masks must agree too
    inputs = {"input_ids": ids, "attention_mask": mask}
    if config.model_type == "bert":
        inputs["token_type_ids"] = torch.randint(config.type_vocab_size, (batch, length), generator=generator)
    if config.model_type == "marian":
        inputs["decoder_input_ids"] = torch.randint(config.decoder_vocab_size, (batch, length), generator=generator)
    if "ForMultipleChoice" in type(native).__name__:  # the rows as the choices of one question: (1, choices, length)
        inputs = {name: tensor[None] for name, tensor in inputs.items()}

    def logits(model) -> torch.Tensor:
        """The logits; a question-answering head's start and end logits, stacked."""
        output = model(**inputs)
        return output.logits if "logits" in output else torch.stack([output.start_logits, output.end_logits])

    with torch.no_grad():
        expected = logits(source)
        diff = (logits(converted) - expected).abs().max().item()
    if not expected.isfinite().all():  # no difference to measure: a NaN in the source's weights, say
        fail("parity check impossible: the source's own logits on the check batch are not all finite (NaN or "
             "infinite; its weights?); nothing was written. --no-check converts it as it is")
    if not diff <= args.atol:  # also catches NaN
        fail(f"parity check failed: logits differ by up to {diff:.3g} (> --atol {args.atol:g}); nothing was written")
    print(f"parity check passed: max |logit difference| {diff:.3g} <= {args.atol:g}")

# ----------------------------------------------------------------------------------------------- save
# Written beside the output, then renamed into place: a crash leaves the earlier folder or the complete new one
# (between the two renames, both under hidden names, which the next conversion into that output sets right:
# `recover_from_stopped_conversions`), never a mix, and no stale file of the earlier folder stays.
output = args.output.resolve()
staging, replaced = (aside(output, what) for what in ASIDE)


def checkpoint_dtype() -> str:
    """The dtype `from_pretrained(dtype="auto")` takes when config.json names none (configs written by hand or by other
    tools): that of the checkpoint's first floating-point tensor, read on the meta device."""
    files = sorted(args.source.glob("model*.safetensors")) or sorted(args.source.glob("pytorch_model*.bin"))
    if not files:
        return "float32"
    return str(get_state_dict_dtype(load_state_dict(files[0], map_location="meta"))).removeprefix("torch.")


dtype = source_config.get("dtype") or source_config.get("torch_dtype") or checkpoint_dtype()
check = "Its outputs were not compared with the source's (`--no-check`)."
if args.check:
    agreement = "equal" if diff == 0 else f"match within {diff:.3g}"
    check = f"Its logits {agreement} the source's on a random batch with a padded row."
try:  # a full disk: one line, and the partial copy (of the model's size) removed, not a traceback leaving it hidden
    with write_error_named("The converted model", output.parent, f"{args.output} is as it was, and the partial "
                           "copy is removed: free space (or remove the cause), then run the command again."):
        staging.mkdir(parents=True)  # on a full disk too (ext4 gives a new folder a block)
        converted.to(getattr(torch, dtype)).save_pretrained(staging)  # with generation_config.json where it generates
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        hub.write_conversion_card(staging, args.source, name=output.name, task=card_task,
                                  source_class=source_class, model_class=type(converted).__name__,
                                  native=not to_scratch, check=check)
except CheckpointError as error:
    shutil.rmtree(staging, ignore_errors=True)
    fail(str(error))


def written_meanwhile(error: BaseException | None) -> bool:
    """Whether `error`, of putting the converted model in place, is the refusal of an output that holds files now."""
    return isinstance(error, OSError) and error.errno in (errno.ENOTEMPTY, errno.EEXIST)


def put_in_place() -> None:
    """Rename `staging` to `output`, an earlier output (--overwrite-output-dir) renamed aside first and put back when
    the rename fails (a file system gone read-only: it was a traceback, the earlier output left hidden). Otherwise the
    output held nothing when checked: one that holds files now was written meanwhile (another conversion into it,
    finished first), and was replaced without --overwrite-output-dir. `rmdir` and the rename refuse it."""
    if args.overwrite_output_dir and output.exists():
        os.replace(output, replaced)
    try:
        if output.exists():
            output.rmdir()
        os.replace(staging, output)
    except OSError as error:
        if replaced.exists() and not written_meanwhile(error):
            os.replace(replaced, output)
        raise


try:
    with write_error_named("The converted model", output.parent, f"{args.output} is as it was (an earlier one renamed "
                           "aside is put back, by the next conversion into it where that fails too), and the converted "
                           "copy is removed: remove the cause, then run the command again.",
                           failed="could not take its place"):
        put_in_place()
except CheckpointError as error:
    shutil.rmtree(staging, ignore_errors=True)
    if not written_meanwhile(error.__cause__):
        fail(str(error))
    fail(f"{args.output} was written while this conversion ran (by another command into the same output?): it is "
         "left as it is, and the converted model is not saved. Choose another output folder, or pass "
         "--overwrite-output-dir to replace it.")
shutil.rmtree(replaced, ignore_errors=True)
print(f"{source_class} -> {type(converted).__name__} ({converted.num_parameters():,} parameters, {dtype}) "
      f"saved to {args.output}{' with its tokenizer' if tokenizer is not None else ''}")
if not to_scratch:
    print("it loads with the plain transformers Auto classes, no trust_remote_code")
    for caveat in llama_cpp_caveats(converted):  # it converts to GGUF, and llama.cpp would run another function
        print(f"note for llama.cpp / GGUF: {caveat}")
if loading_info["unexpected_keys"]:  # e.g. BERT's pooler, which BertForMaskedLM does not have
    print(f"checkpoint tensors a {source_class} does not use (not converted): "
          f"{sorted(loading_info['unexpected_keys'])}")
