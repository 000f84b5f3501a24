"""The output folder a training run owns: claimed for a new run only where no earlier run would be lost, locked
against a second run writing it at the same time, and cleared of an earlier run only when asked."""

import argparse
import atexit
import os
import shutil
import sys
from contextlib import suppress
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: runs are not locked
    fcntl = None

from hf_scratch_transformer import checkpointing
from hf_scratch_transformer.cli.run_errors import fail, fail_together, fail_with

RUN_FOLDERS = ("checkpoints", "tokenizer", "model")  # the folders a run writes into its output folder
RUN_FILES = (*RUN_FOLDERS, "loss_curve.jsonl")  # all it writes there
# The kinds of file in a run's model folder: config, weights, model code, tokenizer files (vocabularies, merges,
# SentencePiece models, chat template), the card, eval results, loss plot, training arguments.
MODEL_FOLDER_SUFFIXES = {".json", ".safetensors", ".py", ".bin", ".txt", ".model", ".spm", ".jinja", ".md", ".png"}
LOCK_FILE = ".hf-scratch.lock"  # held by the main process of the run writing the folder (claim_output_dir)
_held_locks = []  # open for the life of the process: closing a file releases its lock
_made_for_the_lock = []  # output folders this process made to lock them


def add_run_safety_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite-output-dir", action="store_true",
                        help="start again in an output folder that holds an earlier run, removing its checkpoints, "
                        "tokenizer and loss log")


def continues_run(checkpoint: Path, output_dir: Path) -> bool:
    """Whether `checkpoint` lies in `output_dir/checkpoints`: resuming it continues the run this folder holds.
    Any other checkpoint belongs to another run, and resuming it into `output_dir` starts a branch of that run."""
    return Path(checkpoint).resolve().is_relative_to((output_dir / "checkpoints").resolve())


def lock_output_dir(output_dir: Path) -> str | None:
    """Hold a lock on `output_dir` until the process ends; the problem when another run holds it. Two runs writing
    one folder would remove each other's checkpoints being written and interleave their loss logs. A folder or lock
    file that cannot be made (a full disk, a quota, a file system gone read-only) is the problem too: it was a
    traceback."""
    where = next(folder for folder in (output_dir, *output_dir.parents) if folder.is_dir())  # it, or its parent
    try:
        with checkpointing.write_error_named(f"--output-dir {output_dir}", where, "Nothing of the run is done yet: "
                                             "free space (or remove the cause), then run the command again.",
                                             failed="could not be made or locked"):
            lock = open_the_lock(output_dir)
    except checkpointing.WriteError as error:
        return str(error)
    if lock is None:
        return None
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


def open_the_lock(output_dir: Path):
    """`output_dir`'s LOCK_FILE, open (and the folder, made where missing); None where files cannot be locked."""
    try:  # made for the lock: a command that stops before writing leaves no folder behind
        output_dir.mkdir(parents=True)
        _made_for_the_lock.append(output_dir)
    except FileExistsError:  # there already, or made by another run starting at the same instant
        pass
    return (output_dir / LOCK_FILE).open("a") if fcntl is not None else None


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


def replaced_whole_by_its_run(folder: Path) -> bool:
    """Whether `folder` is a checkpoint (its manifest: its run prunes it) or a run's model folder (written whole again
    when its run ends, `checkpointing.replace_folder`)."""
    return (folder / checkpointing.MANIFEST).is_file() or folder.name == "model"


def not_the_runs_own(output_dir: Path, overwrite: bool) -> list[Path]:
    """What the first folder of the run that it removes whole holds beside the run's own files, which went with it:
    in `checkpoints/` (removed by --overwrite-output-dir) whatever is not named as a checkpoint (another tool's logs,
    the user's notes); in `tokenizer/` (the same) and `model/` (written again as every run ends) a folder, or a file of
    a kind `save_pretrained` and the run never write (a GGUF that llama.cpp's converter put beside the weights). A file
    of the run's kinds there (notes.txt) cannot be told from the run's own; hidden ones (the .DS_Store that macOS's
    Finder leaves in every folder it shows) are no one's work, and `publish` leaves them out too."""
    for name in ("checkpoints", "tokenizer", "model") if overwrite else ("model",):
        if (folder := output_dir / name).is_dir() and not folder.is_symlink():
            own = checkpointing.is_checkpoint_name if name == "checkpoints" else is_model_folder_file
            if foreign := sorted(path for path in folder.iterdir() if not (own(path) or path.name.startswith("."))):
                return foreign
    return []


def is_model_folder_file(path: Path) -> bool:
    """Whether `path` is of the kinds a run writes in its model or tokenizer folder (`MODEL_FOLDER_SUFFIXES`)."""
    return path.is_file() and path.suffix in MODEL_FOLDER_SUFFIXES


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
    # The model the run starts from is read, never written: an output folder that is that folder put the run's files
    # among its own (with --overwrite-output-dir, a checkpoint's tokenizer/ and loss log were removed or rewritten as
    # an earlier run's, so that it no longer verified and its run dropped it); one in a checkpoint or a run's model
    # folder, where that run's pruning, or its next model folder, removed this run whole.
    for option, source in (("--model", model), ("--resume-from", resume_from)):
        if source is not None and source.exists() and output_dir.resolve().is_relative_to(source.resolve()) and (
                output_dir.resolve() == source.resolve() or replaced_whole_by_its_run(source)):
            parser.error(f"--output-dir {output_dir} lies in {option} {source}, the folder this run starts from (and "
                         "only reads): choose an --output-dir outside it.")
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
    if foreign := not_the_runs_own(output_dir, overwrite):
        folder = foreign[0].parent
        removal = "the run replaces it whole as it ends" if folder.name == "model" else \
            "--overwrite-output-dir removes it whole"
        parser.error(f"{folder} holds what the run never writes there ({', '.join(path.name for path in foreign[:5])}"
                     f"{' ...' if len(foreign) > 5 else ''}), and {removal}: move them out of it, or choose another "
                     "--output-dir.")
    problem = lock_output_dir(output_dir) if is_main_process else None
    if accelerator is not None:
        fail_together(parser, accelerator, problem)
    elif problem:
        fail(parser, problem)
    if is_main_process:  # what a removal (of the model folder, or of the earlier run when overwriting) interrupted left
        for name in RUN_FOLDERS:
            shutil.rmtree(output_dir / (name + checkpointing.DELETED_SUFFIX), ignore_errors=True)


def remove_the_earlier_run(parser: argparse.ArgumentParser, output_dir: Path, overwrite: bool,
                           is_main_process: bool = True, tokenizer: Path | None = None) -> None:
    """--overwrite-output-dir: remove what the earlier run left, its checkpoints atomically, so that no later `--resume`
    mixes the two runs, and its tokenizer folder and loss log (train-accelerate's), which a run given --tokenizer or
    --model, or a `train` or `finetune` run, writes none of: left beside the new run's model and checkpoints, they
    passed for its own (another vocabulary, which `--resume` took for a checkpoint that carries no tokenizer). A
    --tokenizer (`tokenizer`) that is the earlier run's tokenizer folder stays: it is this run's. Called as training
    starts, once every check has passed: removed as the output folder was claimed, they went with a run then refused
    for a mistyped data file, and nothing came in their place. One that cannot be removed (a file system gone
    read-only, a file of it held open on NFS) stops the command in one line: it was a traceback."""
    if not (is_main_process and overwrite):
        return
    given = tokenizer and Path(tokenizer).resolve()
    earlier = [path for name in ("checkpoints", "tokenizer", "loss_curve.jsonl") if (path := output_dir / name).exists()
               and not (path.is_dir() and next(path.iterdir(), None) is None) and path.resolve() != given]
    if earlier:
        print(f"--overwrite-output-dir: removing the earlier run's {', '.join(path.name for path in earlier)} in "
              f"{output_dir}")
    try:
        for path in earlier:
            with checkpointing.write_error_named(f"--overwrite-output-dir: the earlier run's {path.name}", output_dir,
                                                 "Nothing of this run is written yet: remove the cause, then run the "
                                                 "command again, which removes the rest.",
                                                 failed="could not be removed"):
                if path.is_dir() and not path.is_symlink():
                    checkpointing.remove_checkpoint(path)
                else:  # the loss log, or a link (to a tokenizer folder elsewhere, left as it is)
                    path.unlink()
    except checkpointing.CheckpointError as error:
        fail_with(parser, error)
