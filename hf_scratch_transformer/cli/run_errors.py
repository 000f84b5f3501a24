"""How a training run says what it meets. Under a launcher (torchrun, accelerate launch) every process parses the
same options and reads the same files, so each meets the same problem: it is said once, by the main process, and
every process exits with status 2."""

import argparse
import os
import sys
from typing import NoReturn

from accelerate.utils import gather_object

from hf_scratch_command import is_rank_zero
from hf_scratch_transformer import checkpointing


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
