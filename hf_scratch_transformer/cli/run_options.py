"""Options and defaults shared by the two training entry points, `train.py` (Trainer) and `train_accelerate.py`
(Accelerate), so that both take the same data, model and tokenizer arguments."""

import argparse
import atexit
import json
import os
import shutil
import signal
import sys
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NoReturn

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

from accelerate.utils import gather_object
from datasets import Dataset, DatasetDict
from huggingface_hub import is_offline_mode, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from hf_scratch_command import is_rank_zero
from hf_scratch_transformer import checkpointing, training_data
from hf_scratch_transformer.data import DEFAULT_CORPUS
from hf_scratch_transformer.presets import FAMILY_CONFIGS, PRESETS, check_fields, get_preset
from tokenizer_training import TOKENIZER_FILES

AUTO_MODEL = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
RUN_FOLDERS = ("checkpoints", "tokenizer", "model")  # the folders a run writes into its output folder
RUN_FILES = (*RUN_FOLDERS, "loss_curve.jsonl")  # all it writes there
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)  # `from_pretrained`'s
TOKENIZER_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")  # `special_token_ids`
LOCK_FILE = ".hf-scratch.lock"  # held by the main process of the run writing the folder (claim_output_dir)
_held_locks = []  # open for the life of the process: closing a file releases its lock
_made_for_the_lock = []  # output folders this process made to lock them

DEFAULTS = {  # task -> (preset, tokenizer kind, tokenizer family)
    "causal-lm": ("gpt-mini", "bpe", "decoder"),
    "masked-lm": ("bert-prenorm", "wordpiece", "encoder"),
    "seq2seq": ("transformer-base", "bpe", "seq2seq"),
}
TOKENIZER_VOCAB_SIZE = 4096  # --vocab-size of a tokenizer trained by the run


# ----------------------------------------------------------------------------------------------- stopping
# Under a launcher (torchrun, accelerate launch) every process parses the same options and reads the same files, so
# each meets the same problem: it is said once, by the main process, and every process exits with status 2.


class RunParser(argparse.ArgumentParser):
    """The training commands' parser: its usage and errors are printed by the main process alone."""

    def print_usage(self, file=None) -> None:
        if is_rank_zero():
            super().print_usage(file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        remove_unused_output_dirs()  # a refusal; at exit would be too late for a caller that catches SystemExit
        super().exit(status, message if is_rank_zero() else None)


def say(*args, **kwargs) -> None:
    """`print` on the main process only: under torchrun every process runs the command, and each printed its lines."""
    if is_rank_zero():
        print(*args, **kwargs)


def note(line: str) -> None:
    """`line` as a note on the main process, on stderr with the warnings: what the run does with the data unasked."""
    say(f"note: {line}", file=sys.stderr)


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Stop with `message` and exit status 2 as `parser.error` does, without the usage: for a problem found in the
    files (a checkpoint, the data), which no option caused."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def fail_with(parser: argparse.ArgumentParser, error: checkpointing.CheckpointError) -> NoReturn:
    """`fail` with a checkpoint's or a write's error. A write error may be one process's alone (its share of a
    checkpoint, on its disk): said by the main process only, it went unsaid, and the run ended in the launcher's
    traceback. So every process that meets one says it, naming itself; other errors all processes meet alike."""
    if isinstance(error, checkpointing.WriteError) and not is_rank_zero():
        print(f"{parser.prog}: error in process {os.environ.get('RANK')}: {error}", file=sys.stderr, flush=True)
    fail(parser, str(error))


def fail_together(parser: argparse.ArgumentParser, accelerator, problem: str | None) -> None:
    """Called by every process at the same point with the problem it found, or None: if any process found one, all
    stop with it. One process stopping alone would leave the others waiting for it in their next collective
    operation, which gloo ends with a traceback."""
    if accelerator.num_processes > 1:
        problem = next(filter(None, gather_object([problem])), None)
    if problem is not None:
        fail(parser, problem)


def stop_cleanly_on_ctrl_c() -> None:
    """Ctrl-C ends a training command with one line and exit status 130 instead of a KeyboardInterrupt traceback. It
    leaves what a kill leaves (docs/checkpoints.md): the complete checkpoints, and leftovers that nothing reads."""

    def stop(signum, frame):
        if is_rank_zero():
            print("\nstopped by Ctrl-C: --resume continues from the newest complete checkpoint", file=sys.stderr)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, stop)


def stop_after_sigterm(accelerator, step: int, max_steps: int, checkpoint: Path) -> NoReturn:
    """End a training command that a SIGTERM stopped after `step`, checkpointed in `checkpoint`
    (`training.Preemption`): one line, and exit status 143 (128 + SIGTERM) as for a process the signal ended, without
    the final evaluation and model folder, which a scheduler's grace period may not see through. The main process says
    it before any process ends: a launcher stops the others as soon as one ends with an error."""
    say(f"stopped by SIGTERM after step {step} of {max_steps}, checkpointed in {checkpoint}: --resume continues",
        file=sys.stderr, flush=True)
    accelerator.wait_for_everyone()
    raise SystemExit(128 + signal.SIGTERM)


def train_until_stopped(parser: argparse.ArgumentParser, trainer, resumed: str | None, preemption) -> None:
    """`trainer.train(resume_from_checkpoint=resumed)`, where a SIGTERM stops training after the step under way with
    a checkpoint of it (`preemption`, a `training.Preemption`), then ends the command (`stop_after_sigterm`), and a
    checkpoint found wrong before any step, or not written, ends it in one line, not a traceback."""
    try:
        with preemption:
            trainer.train(resume_from_checkpoint=resumed)
    except checkpointing.CheckpointError as error:
        fail_with(parser, error)
    if (step := preemption.stopped_at) is not None:
        stop_after_sigterm(trainer.accelerator, step, trainer.state.max_steps,
                           Path(trainer.args.output_dir) / f"{checkpointing.TRAINER_PREFIX}-{step}")


@contextmanager
def model_folder_written(parser: argparse.ArgumentParser, folder: Path):
    """Around the writing of a run's model folder `folder`: a write error (a full disk, a quota) stops the command
    with one line that names it and what to do (`checkpointing.model_folder_reported_as_not_written`), not a
    traceback; the checkpoints and the earlier folder are untouched."""
    try:
        with checkpointing.model_folder_reported_as_not_written(folder):
            yield
    except checkpointing.CheckpointError as error:
        fail_with(parser, error)


@contextmanager
def run_file_written(parser: argparse.ArgumentParser, what: str, output_dir: Path):
    """Around the main process's writing of `what`, a run's own file beside its checkpoints (the tokenizer, the loss
    log): a write error (a full disk) stops the command with one line that names it, as for a checkpoint, not an
    OSError traceback at a training step; each checkpoint carries both, and --resume continues from it."""
    try:
        with checkpointing.write_error_named(what, output_dir, "The complete checkpoints written before are kept: "
                                             "free space (or remove the cause), then continue with --resume."):
            yield
    except checkpointing.CheckpointError as error:
        fail_with(parser, error)


@contextmanager
def trainer_model_folder(parser: argparse.ArgumentParser, trainer, folder: Path) -> Iterator[Path]:
    """The writing of a `Trainer` run's model folder `folder`, in every process of the run. Yields the folder aside
    (`checkpointing.folder_aside`) with the model saved in it (`trainer.save_model`: every process takes part, as
    FSDP gathers the shards; the main one writes); the main process writes the rest of the folder in the block
    (`trainer.is_world_process_zero()`), which is then put in place complete: a kill leaves the earlier folder, the
    new one, or none. The other processes wait until it is in place: when one process of a run fails, the launcher
    kills the rest, and one that aborted in its own teardown (seen once, gloo's "terminate called without an active
    exception") took the folder the main process was still writing with it."""
    main = trainer.is_world_process_zero()
    written = checkpointing.folder_aside(folder, main)
    trainer.accelerator.wait_for_everyone()  # emptied of an interrupted write before anyone writes there
    with model_folder_written(parser, folder):
        trainer.save_model(str(written))  # weights, config, model code (auto_map), tokenizer
        yield written
        if main:
            checkpointing.replace_folder(written, folder)
    trainer.accelerator.wait_for_everyone()


def refuse_lone_processes(parser: argparse.ArgumentParser, trainer) -> None:
    """Processes launched together (torchrun) that Trainer did not join: each would train alone, on the whole data,
    and all would write the same folders."""
    if trainer.args.world_size != int(os.environ.get("WORLD_SIZE", 1)):
        parser.error(f"launched as {os.environ['WORLD_SIZE']} processes, but they found no device to train together "
                     "on: on CPU set ACCELERATE_USE_CPU=1")


@contextmanager
def main_process_first(accelerator):
    """`accelerator.main_process_first()` that lets the other processes go on also when the main one stops inside
    (bad data): they meet the same problem and stop too, instead of waiting for it in a barrier it never reaches."""
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
    try:
        yield
    finally:
        if accelerator.is_main_process:
            accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------------------------- argument types
# Values checked as argparse parses them, so that a wrong one stops at once with "argument --NAME: ..." and exit
# code 2, before any data, tokenizer or model work (and before anything is written).


def at_least(minimum: int | float, kind: type = int, exclusive: bool = False):
    """An argparse `type`: a number of `kind` that is >= `minimum` (> with `exclusive`)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= minimum or (exclusive and value == minimum):  # `not >=`: nan too
            raise argparse.ArgumentTypeError(f"must be {'>' if exclusive else '>='} {minimum}, got {text}")
        return value

    return parse


def local_path(what: str = "folder", holds: str | None = None):
    """An argparse `type` for a saved `what` ("folder", or "file or folder"): a value that looks like a local path
    (it holds a path separator or starts with '.' or '~') must exist, so that a typo is not reported by
    `from_pretrained` as an invalid Hub repo id. A bare name is left to `from_pretrained` (a Hub id, when online).
    `holds`: a file an existing folder must hold (a tokenizer folder's tokenizer_config.json: `from_pretrained`
    failed on a folder without one with "Couldn't instantiate the backend tokenizer" and a traceback), and a Hub id
    (else config.json). With HF_HUB_OFFLINE set, a bare name must be a Hub id in the local Hub cache: `--tokenizer
    gpt2` or `--config nofile.json` failed after the data work with a traceback ending in "We couldn't connect"."""

    def parse(text: str) -> Path:
        path = Path(text).expanduser()
        if path.exists():
            if what == "folder" and not path.is_dir():
                raise argparse.ArgumentTypeError(f"{text} is a file, not a folder written by `save_pretrained`")
            if holds and path.is_dir() and not (path / holds).is_file():
                raise argparse.ArgumentTypeError(f"{text} holds no {holds}: not a folder written by "
                                                 "`save_pretrained`")
            return path
        if os.sep in text or "/" in text or text.startswith((".", "~")):
            raise argparse.ArgumentTypeError(f"{what} {text} does not exist")
        try:
            cached = try_to_load_from_cache(text, holds or "config.json")  # a path, or not cached
        except HFValidationError:  # no Hub id either
            raise argparse.ArgumentTypeError(f"{what} {text} does not exist") from None
        if is_offline_mode() and not isinstance(cached, str):
            raise argparse.ArgumentTypeError(f"{what} {text} does not exist, and with HF_HUB_OFFLINE set a Hub id "
                                             "must be in the local Hub cache, where it is not")
        return path

    return parse


def repo_id(text: str) -> str:
    """An argparse `type` for --model-name, a model card's title and the repo id its usage loads: a Hub repo id
    (`name` or `namespace/name`), or the card would show code that cannot load it."""
    try:
        validate_repo_id(text)
    except HFValidationError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repo id: {error}") from None
    return text


positive_int = at_least(1)
non_negative_int = at_least(0)
positive_float = at_least(0, float, exclusive=True)
non_negative_float = at_least(0, float)
# The shortest --max-length that leaves a token to learn from: a causal LM needs 2 (one predicts the next), a masked
# LM 3 ([CLS] and [SEP] around one token it can mask); shorter ones train on nothing and report a loss of nan.
sequence_length = at_least(3)


def fraction(text: str) -> float:
    """An argparse `type`: a number in [0, 1), for label smoothing and Adam's betas. PyTorch refuses others only in
    the loss or the optimizer, after the data; a negative smoothing trained unsmoothed, and 1 spreads every target
    evenly (nothing left to learn)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:  # nan too
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text}")
    return value


def add_data_and_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The "data" and "model and tokenizer" argument groups."""
    data = parser.add_argument_group("data (default: the embedded Tiny Shakespeare; seq2seq has none)")
    # "extend": a repeated option adds its files (argparse would keep the last one's alone, silently).
    data.add_argument("--train-files", nargs="+", action="extend", help="text files, one document per paragraph")
    data.add_argument("--validation-files", nargs="+", action="extend", help="default: 5%% of the training documents")
    data.add_argument("--source-files", nargs="+", action="extend", help="seq2seq: source side, one sentence per line")
    data.add_argument("--target-files", nargs="+", action="extend",
                      help="seq2seq: target side, aligned with --source-files")
    data.add_argument("--validation-source", nargs="+", action="extend")
    data.add_argument("--validation-target", nargs="+", action="extend")
    data.add_argument("--dataset", help="a `datasets.load_dataset` name or path instead of files")
    data.add_argument("--dataset-config", help="--dataset's configuration")
    data.add_argument("--dataset-name", help="the data's name on the model card (default: dataset or file name)")
    data.add_argument("--text-column", help="--dataset's text column (default text)")
    data.add_argument("--source-column", help="seq2seq: --dataset's source column (default source)")
    data.add_argument("--target-column", help="seq2seq: --dataset's target column (default target)")
    data.add_argument("--max-length", type=sequence_length, default=128, help="tokens per sequence, >= 3 (default 128)")
    model_args = parser.add_argument_group("model and tokenizer")
    model_args.add_argument("--model", type=local_path(),
                            help="continue training a saved model folder (its tokenizer too)")
    model_args.add_argument("--preset", help="default: gpt-mini / bert-prenorm / transformer-base by task")
    model_args.add_argument("--config", type=local_path("file or folder"),
                            help="a config.json to build the model from instead of a preset")
    model_args.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE", type=config_override,
                            help="config overrides of a new model (VALUE as JSON, else a string)")
    model_args.add_argument("--tokenizer", type=local_path(holds="tokenizer_config.json"),
                            help="a saved tokenizer folder; default: train one")
    model_args.add_argument("--tokenizer-kind", choices=["bpe", "wordpiece", "unigram"], help="default by task")
    model_args.add_argument("--vocab-size", type=positive_int,
                            help=f"vocabulary of the tokenizer trained here (default {TOKENIZER_VOCAB_SIZE})")


def config_override(item: str) -> tuple[str, object]:
    """`--set KEY=VALUE` -> (KEY, VALUE read as JSON: 3, 0.1, true, null, [1, 2]; anything else is a string)."""
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"{item!r} is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def model_tokenizer(folder: Path | None) -> Path | None:
    """Where the tokenizer of a --model `folder` is: beside its weights (a `save_pretrained` folder, a Trainer
    checkpoint), or in the `tokenizer/` folder an Accelerate checkpoint (step-N) carries, where loading the checkpoint
    as --model failed with "Couldn't instantiate the backend tokenizer"."""
    if folder is not None and not (folder / "tokenizer_config.json").is_file() and (folder / "tokenizer").is_dir():
        return folder / "tokenizer"
    return folder


def check_model_folder(parser: argparse.ArgumentParser, folder: Path | None, converts: Collection[str] = ()) -> None:
    """A --model folder that cannot train, read from its config.json before anything is loaded: none there (a
    tokenizer's folder failed in `from_pretrained` with "Unrecognized model"), quantized weights (torchao's int8,
    bitsandbytes, GPTQ, ...: Trainer refused them with a traceback after the data work, the accelerate loop trained
    around them and failed at its first checkpoint), a native model that the command does not convert (`converts`:
    the model types it does; Trainer trained it as the native class, with a card naming ours and the native loss's
    count of tokens), or no weights or tokenizer. A name that is no local folder is left to `from_pretrained` (a Hub
    id)."""
    if folder is None or not folder.is_dir():
        return
    config = folder / "config.json"
    if not config.is_file() and (folder / "random_states_0.pkl").is_file():
        # An Accelerate step-N carries its model's config.json since 2026-11-29 only; --resume-from needs none.
        parser.error(f"--model {folder} is an Accelerate checkpoint written before 2026-11-29, which carries no "
                     "config.json to build its model from: continue its run with `hf-scratch train-accelerate "
                     f"--resume-from {folder}` and the run's options, or train from the run's model folder")
    if not config.is_file():
        parser.error(f"--model {folder} holds no config.json: not a model folder written by `save_pretrained`")
    try:
        saved = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:  # `from_pretrained`'s traceback, after the data work
        parser.error(f"--model {folder}: its config.json is not JSON ({error})")
    saved = saved if isinstance(saved, dict) else {}
    quantization = saved.get("quantization_config")
    if isinstance(quantization, dict):
        parser.error(f"--model {folder} holds quantized weights ({quantization.get('quant_method')}, config.json's "
                     "quantization_config), which do not train: train the full-precision folder, then quantize the "
                     "result.")
    ours = {family.model_type for family in FAMILY_CONFIGS.values()}
    if saved.get("model_type") not in {*ours, *converts}:
        parser.error(f"--model {folder} is a {saved.get('model_type')} model, " + (
            f"neither one of this package's nor a native model it converts ({', '.join(sorted(converts))})" if converts
            else f"not one of this package's: convert it first (`hf-scratch convert {folder} OUTPUT`), then continue "
                 "OUTPUT with --model."))
    # Else `from_pretrained` failed with a traceback, after the data work: a folder of a config alone, or a model saved
    # without its tokenizer ("Couldn't instantiate the backend tokenizer").
    if not any((folder / name).is_file() for name in WEIGHTS_FILES):
        parser.error(f"--model {folder} holds no weights ({', '.join(WEIGHTS_FILES)}): not a model folder written by "
                     "`save_pretrained`")
    if not any((model_tokenizer(folder) / name).exists() for name in TOKENIZER_FILES):
        parser.error(f"--model {folder} holds no tokenizer (tokenizer.json, tokenizer_config.json, vocab files): save "
                     "the tokenizer the model was trained with into the folder (`tokenizer.save_pretrained`)")


def config_overrides(parser: argparse.ArgumentParser, args) -> dict:
    """The --set overrides, checked against the preset's config before any data or tokenizer work: an unknown
    field (a typo would be saved and do nothing) or an invalid value stops the command, naming it."""
    overrides = dict(args.set)
    if overrides and args.model:
        parser.error("--set configures a new model (a preset or --config); --model continues a saved one as it is")
    # Else left out without a word: --model brings its config and its tokenizer.
    new_model_options = ("preset", "config", "tokenizer", "tokenizer_kind", "vocab_size")
    if args.model and (ignored := [f"--{name.replace('_', '-')}" for name in new_model_options if getattr(args, name)]):
        parser.error(f"{', '.join(ignored)}: for a new model; --model continues a saved one, with its own config and "
                     "tokenizer")
    tokenizer_options = ("tokenizer_kind", "vocab_size")
    if args.tokenizer and (ignored := [f"--{name.replace('_', '-')}" for name in tokenizer_options
                                       if getattr(args, name)]):
        parser.error(f"{', '.join(ignored)}: for a tokenizer trained here; --tokenizer {args.tokenizer} is a trained "
                     "one")
    if args.model:
        return overrides
    family = DEFAULTS[args.task][2]
    try:
        if args.config:
            config_family = check_config_file_overrides(args.config, overrides)
            if config_family not in (None, family):
                model_type = FAMILY_CONFIGS[config_family].model_type
                parser.error(f"--config {args.config} is a config of the {config_family} family ({model_type}), but "
                             f"--task {args.task} trains the {family} family.")
        else:
            preset = args.preset or DEFAULTS[args.task][0]
            get_preset(preset, **overrides)
            if PRESETS[preset]["family"] != family:
                presets = ", ".join(name for name, values in PRESETS.items() if values["family"] == family)
                parser.error(f"--preset {preset} is a preset of the {PRESETS[preset]['family']} family, but --task "
                             f"{args.task} trains the {family} family: use one of {presets}.")
    except ValueError as error:
        parser.error(str(error))
    # The training commands set these from the tokenizer (`special_token_ids`), over any --set: refused, not replaced.
    if given := [key for key in overrides if key in TOKENIZER_IDS]:
        parser.error(f"--set {', '.join(given)}: a new model's special token ids are its tokenizer's (pad, bos and eos "
                     "tokens; a seq2seq decoder starts at bos, else pad): leave them out, or give a --tokenizer whose "
                     "special tokens have the ids you want")
    return overrides


def read_config_file(config: Path) -> dict | None:
    """The fields of a --config file or folder; None when it is not a local JSON file (left to `from_pretrained`)."""
    file = config / "config.json" if config.is_dir() else config
    try:
        saved = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def check_config_file_overrides(config: Path, overrides: dict) -> str | None:
    """The family of a --config file or folder ("decoder", ...), its fields and its --set overrides checked as those
    of a preset before any data or tokenizer work: `from_pretrained` keeps a misspelt field (`hidden_actt`) without a
    word, and stopped with a traceback after that work on a file that is no JSON object or no config of ours. None
    for a name that is no local path: left to `from_pretrained` (a Hub id)."""
    file = config / "config.json" if config.is_dir() else config
    if not config.exists():
        return None
    saved = read_config_file(config)
    if saved is None:
        raise ValueError(f"--config {config}: {file} is not a JSON object (a model's config.json, or a preset's "
                         "fields with its model_type)")
    model_type = saved.get("model_type")
    family = next((name for name, family in FAMILY_CONFIGS.items() if family.model_type == model_type), None)
    if family is None:
        ours = ", ".join(family.model_type for family in FAMILY_CONFIGS.values())
        raise ValueError(f"--config {config}: model_type {model_type!r} is none of this package's ({ours}); a native "
                         "model's folder converts with `hf-scratch convert`, then trains with --model")
    config_class = FAMILY_CONFIGS[family]
    # What `save_pretrained` writes besides the fields: the remote-code maps (the defaults' `to_dict` has the rest)
    written = {*config_class().to_dict(), "auto_map", "custom_pipelines"}
    fields = {key: value for key, value in saved.items() if key not in written}
    try:
        check_fields(config_class, fields, saved)
    except ValueError as error:
        raise ValueError(f"--config {config}: {error}") from None
    check_fields(config_class, overrides, {**saved, **overrides})
    config_class.from_dict(saved, **overrides)  # the values, as `from_pretrained` will check them
    return family


def refuse_another_tokenizer(parser: argparse.ArgumentParser, given: Path | None, tokenizer, checkpoint: Path,
                             source: Path | None = None,
                             remedy: str = "leave out --tokenizer / --model, or pass the same one") -> None:
    """A resumed run keeps the tokenizer its checkpoint was trained with (`tokenizer`, from `source` when that is
    not the checkpoint itself): a --tokenizer / --model of another vocabulary would change the ids under the
    weights."""
    if given and AutoTokenizer.from_pretrained(given).get_vocab() != tokenizer.get_vocab():
        parser.error(f"the tokenizer of {given} differs from the one {checkpoint} was trained with"
                     f"{f' ({source})' if source else ''}, which a resumed run keeps: {remedy}.")


def refuse_another_family(parser: argparse.ArgumentParser, tokenizer, task: str, source: Path | None) -> None:
    """A tokenizer trained for another model family (by `train_tokenizer`, which records it) brings that family's
    special tokens and templates: a decoder's `<s> text`, without `</s>`, would teach a seq2seq model never to stop.
    A tokenizer from `source` without a recorded family is judged by the special token the task's data needs
    (`training_data.check_task_token`) alone."""
    family, needed = tokenizer.init_kwargs.get("family"), DEFAULTS[task][2]
    if family is not None and family != needed:
        parser.error(f"the tokenizer of {source} was trained for the {family} family, but --task {task} needs one for "
                     f"the {needed} family (its special tokens and templates): train one with `hf-scratch tokenizer "
                     f"--family {needed}`, or leave out --tokenizer to have the run train one.")
    try:
        training_data.check_task_token(tokenizer, task)
    except ValueError as error:
        parser.error(f"{source}: {error}")


def absolute_positions(config) -> int | None:
    """The most tokens a model with absolute positions (learned or sinusoidal) reads; None for relative ones."""
    if getattr(config, "position_embedding_type", None) in ("learned", "sinusoidal"):
        return config.max_position_embeddings
    return None


def check_model_fits(parser: argparse.ArgumentParser, model, tokenizer, max_length: int) -> None:
    """Before any data work: the model has a row for every token id, and absolute positions (learned or sinusoidal)
    for --max-length tokens; else the first training step would fail, after tokenizing."""
    config = model.config
    if config.vocab_size < len(tokenizer):
        fail(parser, f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")
    if max_length > (absolute_positions(config) or max_length):
        fail(parser, f"--max-length {max_length} is longer than the model's {config.max_position_embeddings} "
                     f"{config.position_embedding_type} positions (max_position_embeddings): pass --max-length "
                     f"{config.max_position_embeddings} or less.")


# The fields a training command sets on a new model from its tokenizer and --max-length (`special_token_ids`,
# `padded_vocab_size`, `follow_the_tokenizer`), over a --config file's values.
RUN_FIELDS = (*TOKENIZER_IDS, "vocab_size", "encoder_vocab_size", "max_position_embeddings")


def config_file_fields_replaced(config_file: Path, config, given: dict) -> str | None:
    """A line naming each field of a --config file that the new model (`config`) took from the run instead (its
    tokenizer's special ids and size, --max-length's positions), with both values; None when none changed. Fields
    --set gave (`given`) were asked for."""
    saved = read_config_file(config_file) or {}
    changed = [f"{key} {saved[key]} -> {getattr(config, key)}" for key in RUN_FIELDS
               if key in saved and key not in given and saved[key] != getattr(config, key, saved[key])]
    if not changed:
        return None
    return (f"--config {config_file}: the new model takes from this run's tokenizer and --max-length "
            f"{', '.join(changed)} (--set vocab_size=... / max_position_embeddings=... keeps a size)")


def follow_the_tokenizer(config, overrides: dict) -> None:
    """A new model's `vocab_size` is the tokenizer's (padded); so is `encoder_vocab_size`, where a seq2seq preset has
    a separate source vocabulary and --set does not name one: a run has one tokenizer for both sides, so the
    preset's own size would only add embedding rows no id reaches (31,700 of transformer-xavier's 32,000 with a
    300-token tokenizer, a quarter of its parameters)."""
    if getattr(config, "encoder_vocab_size", None) is not None and "encoder_vocab_size" not in overrides:
        config.encoder_vocab_size = config.vocab_size


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


def add_run_safety_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite-output-dir", action="store_true",
                        help="start again in an output folder that holds an earlier run, removing its checkpoints, "
                        "tokenizer and loss log")


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
                "tokens_column", "label_column")


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


def continues_run(checkpoint: Path, output_dir: Path) -> bool:
    """Whether `checkpoint` lies in `output_dir/checkpoints`: resuming it continues the run this folder holds.
    Any other checkpoint belongs to another run, and resuming it into `output_dir` starts a branch of that run."""
    return Path(checkpoint).resolve().is_relative_to((output_dir / "checkpoints").resolve())


def lock_output_dir(output_dir: Path) -> str | None:
    """Hold a lock on `output_dir` until the process ends; the problem when another run holds it. Two runs writing
    one folder would remove each other's checkpoints being written and interleave their loss logs."""
    try:  # made for the lock: a command that stops before writing leaves no folder behind
        output_dir.mkdir(parents=True)
        _made_for_the_lock.append(output_dir)
    except FileExistsError:  # there already, or made by another run starting at the same instant
        pass
    if fcntl is None:
        return None
    lock = (output_dir / LOCK_FILE).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return (f"{output_dir} is being written by another run (it holds {LOCK_FILE}): wait for it to end, or choose "
                "another --output-dir.")
    except OSError as error:  # a file system without locks (Lustre mounted without flock, some FUSE mounts)
        lock.close()  # was a traceback, and no run could write there
        print(f"note: {output_dir} cannot be locked ({error.strerror}): a second run into it at the same time is not "
              "refused, and would remove this one's checkpoints", file=sys.stderr)
        return None
    _held_locks.append(lock)
    return None


@atexit.register
def _release_locks() -> None:
    """Close the lock files (the locks end with the process anyway; unclosed, they are reported as leaked files)."""
    while _held_locks:
        _held_locks.pop().close()


@atexit.register
def remove_unused_output_dirs() -> None:
    """Remove the output folders made for the lock that hold nothing else: the command stopped before writing. Empty
    folders in them go too: the Trainer makes its output folder (`checkpoints`) when it is built, before a refusal
    that needs its arguments (`--bf16` on a CPU without native bf16)."""
    while _made_for_the_lock:
        folder = _made_for_the_lock.pop()
        with suppress(OSError):  # anything else in it, or a folder already gone: leave it as it is
            contents = list(folder.iterdir())
            if all(path.name == LOCK_FILE or (path.is_dir() and not any(path.iterdir())) for path in contents):
                for path in contents:
                    if path.is_dir():
                        path.rmdir()
                    else:
                        path.unlink()
                folder.rmdir()


def claim_output_dir(parser: argparse.ArgumentParser, output_dir: Path, resume: bool, overwrite: bool,
                     is_main_process: bool = True, resume_from: Path | None = None, accelerator=None,
                     model: Path | None = None) -> None:
    """Refuse to start a new run over an earlier one unless asked: `--resume` continues it, `--overwrite-output-dir`
    replaces it (`remove_the_earlier_run`), but not where it holds the run's own --model (`model`).
    `resume_from` (`--resume-from`) outside this folder's checkpoints starts a branch of another run: for this folder
    that is a new run, which needs an empty folder or `--overwrite-output-dir` like any other. The main process then
    locks the folder (`lock_output_dir`); with `accelerator`, every process stops when it cannot."""
    if output_dir.exists() and not output_dir.is_dir():
        parser.error(f"--output-dir {output_dir} is a file, not a folder")
    # Else the run would fail with a traceback at its first write, after the data, tokenizer and model work.
    existing = next(folder for folder in (output_dir, *output_dir.parents) if folder.exists())
    if not existing.is_dir():  # a parent that is a file: said to be read-only before
        parser.error(f"--output-dir {output_dir} cannot be made: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        parser.error(f"--output-dir {output_dir} cannot be written: {existing} is read-only (for this user, or "
                     "on a read-only file system). Choose another --output-dir.")
    if files := [name for name in RUN_FOLDERS if (output_dir / name).exists() and not (output_dir / name).is_dir()]:
        # the run writes a folder there: a traceback after the data and tokenizer work (or, replacing, one removing it)
        parser.error(f"{output_dir / files[0]} is a file, where the run writes a folder: move it away, or choose "
                     "another --output-dir.")
    # The run replaces its model folder whole, --overwrite-output-dir its checkpoints: renamed aside, then removed,
    # which `rmtree` refuses on a symbolic link (after the rename), said to be a full disk at the end of the run.
    if links := [path for name in ("model", "checkpoints") if (path := output_dir / name).is_symlink()
                 and (name == "model" or overwrite)]:
        fail(parser, f"{links[0]} is a symbolic link, to a folder the run replaces whole (renaming it aside): move the "
                     "link away, or give an --output-dir on the disk it points to.")
    if stray := checkpointing.not_checkpoint_folders(output_dir / "checkpoints"):
        fail(parser, f"{stray[0]} is {'a symbolic link' if stray[0].is_symlink() else 'a file'}, named as a "
                     "checkpoint: the run writes and removes checkpoint folders of its own under such names. Move it "
                     "away, or choose another --output-dir.")
    # An empty folder is what a run stopped before its first checkpoint leaves: nothing to continue or keep.
    earlier = [name for name in RUN_FILES if (path := output_dir / name).exists()
               and not (path.is_dir() and next(path.iterdir(), None) is None)]
    branch = resume_from is not None and not continues_run(resume_from, output_dir)
    if resume and overwrite and not branch:
        parser.error("--resume continues the earlier run and --overwrite-output-dir replaces it: pass one of them")
    replacing = bool(earlier) and not (resume and not branch)  # a new run, or a branch, over an earlier one
    if replacing and not overwrite and branch:
        parser.error(f"{output_dir} holds an earlier run ({', '.join(earlier)}), and --resume-from {resume_from} is a "
                     f"checkpoint of another run (not in {output_dir / 'checkpoints'}): continuing it here would "
                     "replace the earlier run. Choose a new --output-dir for the continuation, or pass "
                     "--overwrite-output-dir to replace the earlier run.")
    if replacing and not overwrite:
        parser.error(f"{output_dir} holds an earlier run ({', '.join(earlier)}): pass --resume to continue it, or "
                     "--overwrite-output-dir to replace it, or choose another --output-dir.")
    # A checkpoint of the earlier run as --model was removed before it was read (a traceback), its model folder was
    # replaced by the new run's: the model the run starts from is no earlier run to replace.
    removed = [output_dir / name for name in ("checkpoints", "model")]
    if replacing and model is not None and (held := next((folder for folder in removed
                                                          if model.resolve().is_relative_to(folder.resolve())), None)):
        parser.error(f"--model {model} lies in {held}, which replacing the earlier run in {output_dir} removes: copy "
                     f"it out of {output_dir} first, or choose another --output-dir.")
    problem = lock_output_dir(output_dir) if is_main_process else None
    if accelerator is not None:
        fail_together(parser, accelerator, problem)
    elif problem:
        fail(parser, problem)
    if is_main_process:  # what a removal (of the model folder, or of the earlier run when overwriting) interrupted left
        for name in RUN_FOLDERS:
            shutil.rmtree(output_dir / (name + checkpointing.DELETED_SUFFIX), ignore_errors=True)


def remove_the_earlier_run(output_dir: Path, overwrite: bool, is_main_process: bool = True,
                           tokenizer: Path | None = None) -> None:
    """--overwrite-output-dir: remove what the earlier run left, its checkpoints atomically, so that no later `--resume`
    mixes the two runs, and its tokenizer folder and loss log (train-accelerate's), which a run given --tokenizer or
    --model, or a `train` or `finetune` run, writes none of: left beside the new run's model and checkpoints, they
    passed for its own (another vocabulary, which `--resume` took for a checkpoint that carries no tokenizer). A
    --tokenizer (`tokenizer`) that is the earlier run's tokenizer folder stays: it is this run's. Called as training
    starts, once every check has passed: removed as the output folder was claimed, they went with a run then refused
    for a mistyped data file, and nothing came in their place."""
    if not (is_main_process and overwrite):
        return
    given = tokenizer and Path(tokenizer).resolve()
    earlier = [path for name in ("checkpoints", "tokenizer", "loss_curve.jsonl") if (path := output_dir / name).exists()
               and not (path.is_dir() and next(path.iterdir(), None) is None) and path.resolve() != given]
    if earlier:
        print(f"--overwrite-output-dir: removing the earlier run's {', '.join(path.name for path in earlier)} in "
              f"{output_dir}")
    for path in earlier:
        if path.is_dir() and not path.is_symlink():
            checkpointing.remove_checkpoint(path)
        else:  # the loss log, or a link (to a tokenizer folder elsewhere, left as it is)
            path.unlink()
