"""Options and defaults shared by the training commands, `train.py` (Trainer) and `train_accelerate.py` (Accelerate),
so that both take the same data, model and tokenizer arguments, and with `finetune.py` the model checks, the Trainer's
model folder and how a run stops. Beside it: the data a run reads (`run_data`), the output folder it owns
(`output_folder`), how it says a problem (`run_errors`)."""

import argparse
import gc
import json
import math
import os
import signal
import sys
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from huggingface_hub import is_offline_mode, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from hf_scratch_command import is_rank_zero
from hf_scratch_transformer import checkpointing, training_data
from hf_scratch_transformer.cli.output_folder import remove_unused_output_dirs
from hf_scratch_transformer.cli.run_errors import fail, fail_with, say
from hf_scratch_transformer.presets import FAMILY_CONFIGS, PRESETS, check_fields, get_preset
from tokenizer_training import TOKENIZER_FILES

AUTO_MODEL = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}
WEIGHTS_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)  # `from_pretrained`'s
TOKENIZER_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")  # `special_token_ids`

DEFAULTS = {  # task -> (preset, tokenizer kind, tokenizer family)
    "causal-lm": ("gpt-mini", "bpe", "decoder"),
    "masked-lm": ("bert-prenorm", "wordpiece", "encoder"),
    "seq2seq": ("transformer-base", "bpe", "seq2seq"),
}
TOKENIZER_VOCAB_SIZE = 4096  # --vocab-size of a tokenizer trained by the run
# --lr-scheduler: transformers' schedules (`get_scheduler`) that need no more than the warmup and the step count. The
# others need settings neither command takes (`cosine_with_min_lr`'s minimum, `warmup_stable_decay`'s decay steps)
# and failed with a traceback after the data work. `train` also takes those Trainer steps with the evaluation loss
# (`reduce_lr_on_plateau`, `greedy`); the Accelerate loop evaluates only once trained, and failed at its first step.
STEP_SCHEDULES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                  "inverse_sqrt")
EVALUATION_SCHEDULES = ("reduce_lr_on_plateau", "greedy")
# The schedules `get_scheduler` builds without their `num_warmup_steps`: a warmup given to them is left out.
SCHEDULES_WITHOUT_WARMUP = ("constant", *EVALUATION_SCHEDULES)


# ----------------------------------------------------------------------------------------------- stopping


class RunParser(argparse.ArgumentParser):
    """The training commands' parser: its usage and errors are printed by the main process alone (`run_errors`)."""

    def print_usage(self, file=None) -> None:
        if is_rank_zero():
            super().print_usage(file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        remove_unused_output_dirs()  # a refusal; at exit would be too late for a caller that catches SystemExit
        super().exit(status, message if is_rank_zero() else None)


def stop_cleanly_on_ctrl_c() -> None:
    """Ctrl-C ends a training command with one line and exit status 130 instead of a KeyboardInterrupt traceback. It
    leaves what a kill leaves (docs/checkpoints.md): the complete checkpoints, and leftovers that nothing reads."""

    def stop(signum, frame):
        if is_rank_zero():
            print("\nstopped by Ctrl-C: --resume continues from the newest complete checkpoint", file=sys.stderr)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, stop)


def freeze_imported_objects() -> None:
    """Freeze what the process holds out of the garbage collector's generations once a training command's imports
    are done (Trainer, datasets, accelerate: more than the package `hf_scratch_command.import_without_collecting`
    imports), so that the full collections of its data work skip them (docs/training.md, "Startup")."""
    gc.freeze()


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


def refuse_fp16_on_cpu(parser: argparse.ArgumentParser, mixed_precision: str, device) -> None:
    """fp16 mixed precision (an option, or the `accelerate launch` config's, which Trainer follows) on a CPU: there
    Accelerate leaves autocast off and the run trained in fp32 while it said fp16 (Trainer's loop without a word)."""
    if mixed_precision == "fp16" and device.type == "cpu":
        parser.error("fp16 mixed precision needs a GPU (Accelerate pairs it with a GradScaler there; on a CPU it "
                     "leaves autocast off, and the run would train in fp32); use bf16 on CPU.")


def check_warmup(parser: argparse.ArgumentParser, warmup_steps: int, schedule: str, max_steps: int,
                 source: str = "--warmup-steps") -> None:
    """A warmup of `warmup_steps` that `source` asked for (--warmup-steps, or a --recipe's; the default, 5% of the
    steps, needs no check) that the run would not do: one of as many steps as the run or more left the learning rate
    rising until training ended, never at --learning-rate (`--recipe vaswani`'s 4000 steps under the default 600),
    and --warmup-steps under a schedule without warmup was left out; both without a word."""
    if schedule in SCHEDULES_WITHOUT_WARMUP:
        if source == "--warmup-steps":  # a recipe's warmup gives way to the schedule asked for
            parser.error(f"--warmup-steps {warmup_steps}: --lr-scheduler {schedule} has no warmup and would leave it "
                         "out; use constant_with_warmup for a constant rate after a warmup, or leave out "
                         "--warmup-steps.")
        return
    if warmup_steps >= max_steps:
        parser.error(f"{source} {warmup_steps} is not shorter than --max-steps {max_steps}: the learning rate would "
                     "still be rising when training ends, and never reach --learning-rate; pass a --warmup-steps "
                     "below --max-steps (the default is 5% of the steps), or more --max-steps.")


def refuse_force_bf16_alone(parser: argparse.ArgumentParser, force_bf16: bool, mixed_precision: str,
                            asked_with: str) -> None:
    """--force-bf16 lets bf16 mixed precision run where it is slow (`mixed_precision.slow_bf16_refusal`); in a run
    that asks for no bf16 (`mixed_precision`: its option's, else the `accelerate launch` config's) it was left out
    without a word, and the run trained in fp32."""
    if force_bf16 and mixed_precision != "bf16":
        parser.error(f"--force-bf16 lets bf16 mixed precision run on a CPU where it is slow, but this run asks for no "
                     f"bf16 (mixed precision: {mixed_precision}): add {asked_with}, or leave out --force-bf16.")


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
    """An argparse `type`: a finite number of `kind` that is >= `minimum` (> with `exclusive`). Infinity passed
    `>=`: `--learning-rate inf` trained a step into nan weights, `--epochs inf` was Trainer's OverflowError after the
    data work."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not value >= minimum or (exclusive and value == minimum):  # `not >=`: nan too
            raise argparse.ArgumentTypeError(f"must be {'>' if exclusive else '>='} {minimum}, got {text}")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
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


def random_seed(text: str) -> int:
    """An argparse `type` for --seed: an integer every generator a run seeds takes. transformers' `set_seed` seeds
    NumPy's too, which takes [0, 2**32) only: `--seed -1` (a "random seed" elsewhere) was NumPy's traceback."""
    value = non_negative_int(text)
    if value >= 2**32:
        raise argparse.ArgumentTypeError(f"must be < 2**32 (NumPy's seeds), got {text}")
    return value


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


def load_tokenizer(parser: argparse.ArgumentParser, folder: Path):
    """`AutoTokenizer`'s tokenizer of `folder`; one it cannot load stops the command with exit status 2, naming the
    folder (it was a traceback). A kill while `hf-scratch tokenizer` saves leaves tokenizer_config.json without
    tokenizer.json, on purpose (`tokenizer_training.saving`: never the new config over the earlier vocabulary)."""
    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as error:  # no backend tokenizer to build; a JSONDecodeError of a cut file
        half_saved = (folder / "tokenizer_config.json").is_file() and not (folder / "tokenizer.json").exists()
        fail(parser, f"the tokenizer in {folder} cannot be loaded: {str(error).splitlines()[0]}" + (
            " It has tokenizer_config.json but no tokenizer.json, as a tokenizer save stopped midway leaves it: save "
            "the tokenizer there again (`hf-scratch tokenizer ... --overwrite-output-dir`)." if half_saved else ""))


def load_run_tokenizer(parser: argparse.ArgumentParser, folder: Path, max_length: int):
    """The tokenizer of `folder` (--tokenizer, --model or a checkpoint), cutting texts at the run's --max-length
    (`model_max_length`, saved with it), as the one a run trains does: one from `hf-scratch tokenizer` has none unless
    asked, and the saved folder's `truncation=True` and pipelines passed texts past the model's positions on to it."""
    tokenizer = load_tokenizer(parser, folder)
    tokenizer.model_max_length = max_length
    return tokenizer


def check_model_folder(parser: argparse.ArgumentParser, folder: Path | None, converts: Collection[str] = (),
                       task: str | None = None) -> None:
    """A --model folder that cannot train, read from its config.json before anything is loaded: none there (a
    tokenizer's folder failed in `from_pretrained` with "Unrecognized model"), quantized weights (torchao's int8,
    bitsandbytes, GPTQ, ...: Trainer refused them with a traceback after the data work, the accelerate loop trained
    around them and failed at its first checkpoint), a native model that the command does not convert (`converts`:
    the model types it does; Trainer trained it as the native class, with a card naming ours and the native loss's
    count of tokens), a model of another family than the training commands' `task` trains, or no weights or
    tokenizer. A name that is no local folder is left to `from_pretrained` (a Hub id)."""
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
    if task is not None:
        refuse_another_model_family(parser, folder, saved.get("model_type"), task)


def refuse_another_model_family(parser: argparse.ArgumentParser, folder: Path, model_type: str, task: str) -> None:
    """A --model of another family than --task trains (`hf-scratch train --model MASKED_LM_FOLDER`, --task left at
    causal-lm): refused by its tokenizer's family in words about a --tokenizer never given, or, with a tokenizer that
    records none, by `AutoModelFor*.from_pretrained` with a traceback after the data work."""
    family = next(name for name, config_class in FAMILY_CONFIGS.items() if config_class.model_type == model_type)
    if family != DEFAULTS[task][2]:
        its_task = next(name for name, defaults in DEFAULTS.items() if defaults[2] == family)
        parser.error(f"--model {folder} is a {model_type} model (the {family} family), but --task {task} trains the "
                     f"{DEFAULTS[task][2]} family: continue it with --task {its_task}.")


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
    if given and load_tokenizer(parser, given).get_vocab() != tokenizer.get_vocab():
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
    """Before any data work: the model has a row for every token id, in each vocabulary (a seq2seq model's source
    vocabulary too, which `--set encoder_vocab_size` may make the smaller), and absolute positions (learned or
    sinusoidal) for --max-length tokens; else the first training step would fail, after tokenizing."""
    config = model.config
    vocabularies = {"": config.vocab_size, "source ": getattr(config, "source_vocab_size", config.vocab_size)}
    for which, size in vocabularies.items():
        if size < len(tokenizer):
            fail(parser, f"The tokenizer has {len(tokenizer)} tokens but the model's {which}vocabulary only {size}: "
                         f"ids {size} to {len(tokenizer) - 1} have no embedding row. Tokens added to a model's "
                         "tokenizer need rows (`model.resize_token_embeddings(len(tokenizer))`, then "
                         "`save_pretrained`, as transformers' examples do); a new model takes the tokenizer's size "
                         "unless --set gives a smaller one.")
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
