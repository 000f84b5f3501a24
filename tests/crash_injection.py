"""Run a training command with a SIGKILL at a chosen instant, as a crash or an impatient user would:

    python crash_injection.py POINT N hf_scratch_transformer.cli.train_accelerate ARGS...

POINT says where the N-th occurrence (counted from 1) kills the process:
    step     before the N-th optimizer step runs
    state    inside the N-th save: every file of the state written, no manifest yet
    rename   inside the N-th save: manifest written, just before the folder gets its final name
    delete   inside the N-th checkpoint deletion (pruning, or a step the run left): renamed aside, one file removed
    card     as the N-th model card is written: the model folder's weights and tokenizer saved, no card yet
    tokenizer  as the N-th file of the run's tokenizer folder (OUTPUT_DIR/tokenizer, or where it is written aside) is
             written, the files before it written (not those that checkpoints carry)
    late     no kill: every process but the main one lists a folder being written (`NAME.tmp`) N seconds late, as a
             slow process would
    exit     every process but the main one aborts as its interpreter ends (SIGABRT, as gloo's teardown once did
             in a two-process run), while the main one writes its model card N seconds late, as on a slow disk
    clock    no kill: every process but the main one sees `--max-minutes`' clock run N times as fast, so that its
             budget runs out steps before the main one's, as where processes cross it at different steps
    bf16     no kill: the bf16 speed check measures fp32 products at 370 GFLOP/s and bf16 ones at N on the main
             process, at 70 (slow: refused) on the others, as where processes time them apart near a threshold
    full     no kill: every process but the main one finds its disk full at its N-th save of a random state (its own
             file of a checkpoint), as where the processes write to disks of their own
    term     no kill: every process but the main one gets SIGTERM before its N-th optimizer step, the main one
             none, as where a launcher's SIGTERM reaches the processes at different steps
    log      no kill: the N-th append to the loss log (loss_curve.jsonl) fails as on a full disk

The real code runs unchanged; only the functions named above are wrapped. CRASH_SIGNAL=SIGINT in the environment
sends Ctrl-C's signal instead of SIGKILL.
"""

import atexit
import errno
import os
import runpy
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from hf_scratch_transformer import checkpointing, hub, mixed_precision, training


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), getattr(signal, os.environ.get("CRASH_SIGNAL", "SIGKILL")))


def kill_on_call(owner, name: str, when, count: int) -> None:
    """Wrap `owner.name` so that its `count`-th call for which `when(*args)` holds kills the process first."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args, **kwargs):
        if when(*args):
            calls[0] += 1
            if calls[0] == count:
                die()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def kill_inside_deletion(count: int) -> None:
    """The `count`-th removal of a `.deleted` folder deletes one file, then the process dies."""
    original, calls = shutil.rmtree, [0]

    def rmtree(path, *args, **kwargs):
        if str(path).endswith(checkpointing.DELETED_SUFFIX) and Path(path).exists() and not kwargs.get("ignore_errors"):
            calls[0] += 1
            if calls[0] == count:
                next(p for p in sorted(Path(path).rglob("*")) if p.is_file()).unlink()
                die()
        return original(path, *args, **kwargs)

    shutil.rmtree = rmtree


def kill_inside_the_run_tokenizer(count: int) -> None:
    """The `count`-th file written into a run's tokenizer folder (`tokenizer/`, `tokenizer.tmp/`), not a checkpoint's,
    kills the process first."""

    def written_into_the_run_tokenizer(path, *args) -> bool:
        folder = Path(path).parent
        return folder.name.startswith("tokenizer") and not checkpointing.is_checkpoint_name(folder.parent)

    kill_on_call(Path, "write_bytes", written_into_the_run_tokenizer, count)


def fail_random_state_save(count: int) -> None:
    """The `count`-th `torch.save` of a random state (Accelerate's random_states_N.pkl, Trainer's rng_state_N.pth)
    fails as on a full disk."""
    original, calls = torch.save, [0]

    def save(obj, file, *args, **kwargs):
        if "random_state" in str(file) or "rng_state" in str(file):
            calls[0] += 1
            if calls[0] == count:
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return original(obj, file, *args, **kwargs)

    torch.save = save


def fail_loss_log_append(count: int) -> None:
    """The `count`-th opening of the loss log for an append fails as on a full disk."""
    original, calls = Path.open, [0]

    def open_(path, mode="r", *args, **kwargs):
        if path.name == "loss_curve.jsonl" and "a" in mode:
            calls[0] += 1
            if calls[0] == count:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return original(path, mode, *args, **kwargs)

    Path.open = open_


def main() -> None:
    point, count, module, *arguments = sys.argv[1:]
    count = int(count)
    if point == "step":
        kill_on_call(torch.optim.AdamW, "step", lambda *args: True, count)
    elif point == "state":
        kill_on_call(checkpointing, "write_manifest", lambda *args: True, count)
    elif point == "rename":
        # the commit renames a folder to its final name (removals rename one to `.deleted`)
        kill_on_call(os, "replace", lambda source, target, *rest: Path(source).is_dir()
                     and not str(target).endswith(checkpointing.DELETED_SUFFIX), count)
    elif point == "delete":
        kill_inside_deletion(count)
    elif point == "card":
        kill_on_call(hub, "write_model_card", lambda *args: True, count)
    elif point == "tokenizer":
        kill_inside_the_run_tokenizer(count)
    elif point == "late":
        if int(os.environ.get("RANK", "0")) != 0:
            list_now = os.listdir

            def listdir(path=".", *args):
                if str(path).endswith(checkpointing.PARTIAL_SUFFIX):
                    time.sleep(count)
                return list_now(path, *args)

            os.listdir = listdir
    elif point == "exit":
        if int(os.environ.get("RANK", "0")) != 0:
            atexit.register(os.abort)
        else:
            write_card = hub.write_model_card

            def slow_write_model_card(*args, **kwargs):
                time.sleep(count)
                return write_card(*args, **kwargs)

            hub.write_model_card = slow_write_model_card
    elif point == "clock":
        if int(os.environ.get("RANK", "0")) != 0:
            training.time = SimpleNamespace(monotonic=lambda: count * time.monotonic())
    elif point == "bf16":
        bf16 = count if int(os.environ.get("RANK", "0")) == 0 else 70
        mixed_precision.matmul_gflops = lambda dtype, *args, **kwargs: bf16 if dtype == torch.bfloat16 else 370
    elif point == "full":
        if int(os.environ.get("RANK", "0")) != 0:
            fail_random_state_save(count)
    elif point == "term":
        if int(os.environ.get("RANK", "0")) != 0:
            os.environ["CRASH_SIGNAL"] = "SIGTERM"
            kill_on_call(torch.optim.AdamW, "step", lambda *args: True, count)
    elif point == "log":
        fail_loss_log_append(count)
    else:
        raise SystemExit(f"unknown kill point {point!r}")
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__")


if __name__ == "__main__":
    main()
