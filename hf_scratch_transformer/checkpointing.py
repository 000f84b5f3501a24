"""Crash-safe training checkpoints for both entry points: Accelerate's `save_state` / `load_state`
(`save_checkpoint`, `load_checkpoint`) and `Trainer` (`trainer_checkpoints.CrashSafeCheckpoints`, a mixin for
`Trainer` classes, built on what is here).

A checkpoint is complete or invisible. It is written into `NAME.tmp` (`step-N.tmp`, `checkpoint-N.tmp`); once every
process is done, the main process writes `COMPLETE.json` (the step, the size and SHA-256 of every file, free-form
metadata) and renames the folder to `NAME`. A checkpoint is deleted by renaming it to `NAME.deleted` first, then
removing the files. Both renames are atomic within one filesystem, so a kill at any instant leaves each checkpoint
either complete under its name or in a `.tmp` / `.deleted` folder that nothing reads and the next save removes.

Resuming takes the newest checkpoint that verifies (manifest present, every listed file there with its size and
checksum) and says which newer ones it skipped and why. Loading checks the checkpoint before anything reads it,
and checks that the random state really was restored (Accelerate only logs a failure at INFO, `Trainer` skips a
missing file): every problem is a `CheckpointError`, a `ValueError` that names the file.

Several machines must share one filesystem for the checkpoint folder. No model file imports this module (it never
travels to the Hub). What a crash at each point leaves behind: docs/checkpoints.md.
"""

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate.utils import DistributedType, extract_model_from_parallel
from accelerate.utils.constants import FSDP_MODEL_NAME
from safetensors import safe_open
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.tensor import DTensor
from transformers import PreTrainedConfig
from transformers.trainer import TRAINER_STATE_NAME
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_NAME

from .configuration_scratch import own_fields

MANIFEST = "COMPLETE.json"
LOSS_WINDOW = "loss_window.json"  # Trainer checkpoints: the loss summed since the last log (CrashSafeCheckpoints)
PARTIAL_SUFFIX = ".tmp"  # being written
DELETED_SUFFIX = ".deleted"  # being removed
ACCELERATE_PREFIX = "step"  # Accelerate checkpoints: step-N
TRAINER_PREFIX = "checkpoint"  # Trainer's PREFIX_CHECKPOINT_DIR: checkpoint-N


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete (interrupted while being written) or corrupt."""


class CheckpointUnreadable(CheckpointError):
    """A checkpoint this process may not read (its permissions: another user's copy). Never skipped for an older
    one: the run resumed from that would save over it and prune around it."""


class TrainingDiverged(CheckpointError):
    """Training whose weights went nan or inf: the run stops there, and no checkpoint or model of them is written
    (`check_step_finite`, `check_weights_finite`)."""


class WriteError(CheckpointError):
    """Something of a run's that could not be written (a full disk, a quota): a process's own, which under a launcher
    the other processes need not meet (`write_error_named`)."""


def checkpoint_path(folder: str | Path, step: int, prefix: str = ACCELERATE_PREFIX) -> Path:
    return Path(folder) / f"{prefix}-{step}"


# ----------------------------------------------------------------------------------------------- saving


def save_checkpoint(accelerator, folder: str | Path, step: int, metadata: dict | None = None,
                    extra_files: dict[str, str | bytes] | None = None, keep: int | None = None) -> Path:
    """`accelerator.save_state` made crash-safe: returns `folder/step-{step}`, complete. Call it on every process.

    `extra_files` (relative path -> text or bytes, e.g. the loss log so far, `tokenizer/tokenizer.json`) are written
    by the main process beside the state, and checked by the manifest like it; `metadata` goes into the manifest.
    See `commit_checkpoint` for what happens to other checkpoints."""
    final = checkpoint_path(folder, step)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if accelerator.is_main_process:
        with reported_as_not_written(final):  # a new folder fails on a full disk too (ext4 gives it a block)
            remove_leftovers(folder)
            partial.mkdir(parents=True)
    accelerator.wait_for_everyone()
    with reported_as_not_written(final):
        accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()  # every process's files (its RNG state, its FSDP shard) are on disk
    if accelerator.is_main_process:
        with reported_as_not_written(final):
            for name, content in (extra_files or {}).items():
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    (partial / name).write_bytes(content)
                else:
                    (partial / name).write_text(content, encoding="utf-8")
            commit_checkpoint(partial, final, step, metadata, keep)
    accelerator.wait_for_everyone()
    return final


def reported_as_not_written(final: Path):
    """A write error while the checkpoint `final` is saved (a full disk, a quota) as a `CheckpointError` that says
    so: torch reports a full disk as "unexpected pos N vs M" or "iostream error", safetensors as an I/O error."""
    return write_error_named(
        f"Checkpoint {final.name}", final.parent, "The complete checkpoints written before are kept, and what was "
        "written of this one is ignored: free space (or remove the cause), then continue with --resume."
    )


def model_folder_reported_as_not_written(final: Path):
    """The same for a run's model folder `final`, written aside (`folder_aside`) after the last checkpoint: a resumed
    finished run loads that checkpoint, trains nothing and writes the folder again."""
    return write_error_named(
        "The model folder", final.parent, f"The checkpoints are kept, and {final.name}/ as it was before: free "
        "space (or remove the cause), then run the same command with --resume, which writes the model folder from "
        "the last checkpoint without training again."
    )


@contextlib.contextmanager
def write_error_named(what: str, where: Path, next_step: str, failed: str = "could not be written"):
    """Any error inside as a `WriteError` naming `what` was being written (or what else `failed`) in the folder
    `where`, the error, the free space there and the `next_step` to take."""
    try:
        yield
    except CheckpointError:  # named already, by a `write_error_named` inside
        raise
    except Exception as error:
        free = shutil.disk_usage(where).free // 2**20 if where.is_dir() else 0
        raise WriteError(
            f"{what} {failed} in {where} ({type(error).__name__}: {error}; {free} MiB free on that file "
            f"system). {next_step}"
        ) from error


def tied_copies(model) -> dict[str, str]:
    """{name: its source} of the names `model` ties to another (`all_tied_weights_keys`) that still share that one's
    tensor: a file stores such a matrix once, under its source's name, and loading ties them again."""
    parameters = dict(model.named_parameters(remove_duplicate=False))
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return {name: source for name, source in tied.items()
            if name in parameters and parameters[name] is parameters.get(source)}


def leave_out_tied_copies(models: list, weights: list[dict], output_dir: str) -> None:
    """An `Accelerator.register_save_state_pre_hook`: each model's state dict without its `tied_copies`, as
    `save_pretrained` leaves them out. safetensors stores a tensor once, so Accelerate dropped them itself, warning
    "Removed shared tensor {'lm_head.weight'} while saving. This should be OK, but check ..." at every checkpoint of
    a tied model; of any other shared tensor it still does. Loading ties them again (safetensors' loader takes a
    missing name from the one that shares its tensor)."""
    for model, state_dict in zip(models, weights, strict=False):  # no state dicts under FSDP: it saves shards
        for name, source in tied_copies(extract_model_from_parallel(model)).items():
            if source in state_dict:
                state_dict.pop(name, None)


def commit_checkpoint(partial: Path, final: Path, step: int, metadata: dict | None = None,
                      keep: int | None = None, protect: str | Path | None = None) -> None:
    """Mark the fully written folder `partial` complete and rename it to `final` (main process only).

    Checkpoints of this step and later ones are removed first: they belong to a history the run left by resuming
    from an earlier checkpoint (or are leftovers that failed to verify), and resuming must not pick them. With
    `keep`, only the newest `keep` complete checkpoints remain, and `protect` (Trainer's best checkpoint)."""
    prefix = final.name.rsplit("-", 1)[0]
    write_manifest(partial, step, metadata)
    for path in checkpoints(final.parent, prefix):
        if _step(path) >= step:
            print(f"removing {path}: a step at or after {step}, from the history this run left by resuming")
            remove_checkpoint(path)
    os.replace(partial, final)
    _fsync_renamed(final, f"--resume continues from {final.name}: remove the cause (check the disk), then continue "
                   "with --resume.")
    if keep is not None:  # `final` is complete now: an error here was reported as its own, "could not be written"
        with write_error_named("The older checkpoints", final.parent, f"{final.name} is complete and kept: remove "
                               "the cause (or the older checkpoints), then continue with --resume.",
                               failed="could not be removed"):
            prune_checkpoints(final.parent, keep, prefix, protect)


def write_manifest(folder: str | Path, step: int, metadata: dict | None = None) -> dict:
    """Flush every file of `folder` to disk, then record the step, each file's size and SHA-256, and `metadata`
    in `folder/COMPLETE.json`, written last: its presence marks the checkpoint complete."""
    folder = Path(folder)
    _fsync_tree(folder)
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[file.relative_to(folder).as_posix()] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    manifest = {"format": 1, "step": step, "files": files, "metadata": metadata or {}}
    partial = folder / (MANIFEST + PARTIAL_SUFFIX)
    partial.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    _fsync(partial)
    os.replace(partial, folder / MANIFEST)
    _fsync(folder)
    return manifest


# ----------------------------------------------------------------------------------------------- other folders


def folder_aside(final: str | Path, is_main_process: bool = True) -> Path:
    """`final.tmp`, where a folder (a run's model folder) is written before `replace_folder` puts it in place of
    `final`; the main process empties it of what an interrupted write left, before any process writes there."""
    partial = Path(final).with_name(Path(final).name + PARTIAL_SUFFIX)
    if is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    return partial


def replace_folder(partial: str | Path, final: str | Path) -> None:
    """Put the fully written folder `partial` in place of `final` (main process only): its files are flushed, an
    earlier `final` is renamed aside (`final.deleted`), `partial` is renamed in its place, then the earlier one is
    removed. A kill at any instant leaves `final` complete (the earlier one or the new one) or absent, never half
    written; a failed rename of `partial` puts the earlier one back. An earlier one that cannot be removed (a file
    of it held open on NFS, a folder made read-only) is a `WriteError` once the new one is in place: removed first,
    it left no `final`, said to be as it was."""
    partial, final = Path(partial), Path(final)
    _fsync_tree(partial)
    earlier = final.with_name(final.name + DELETED_SUFFIX)
    shutil.rmtree(earlier, ignore_errors=True)  # an earlier removal of the same name, interrupted
    try:
        os.replace(final, earlier)
    except FileNotFoundError:  # no earlier folder
        earlier = None
    try:
        os.replace(partial, final)
    except OSError:  # put back: left aside, the earlier one went with the next command's clearing of leftovers
        if earlier is not None:
            os.replace(earlier, final)
        raise
    _fsync_renamed(final)
    if earlier is not None:
        with write_error_named(f"The earlier {final.name}/", final.parent, f"{final} is complete, this run's; the "
                               f"earlier one is left in {earlier}, which nothing reads and the next command into "
                               f"{final.parent} removes: remove the cause (a file of it held open, its permissions) "
                               "or the folder.", failed="could not be removed"):
            shutil.rmtree(earlier)


def place_folder(partial: str | Path, final: str | Path) -> None:
    """Put the fully written folder `partial` at `final`, which nothing holds (absent, or an empty folder): its files
    are flushed, then it is renamed, atomically. Where `final` holds something (made meanwhile), an OSError, and
    `partial` stays as it is."""
    partial, final = Path(partial), Path(final)
    _fsync_tree(partial)
    os.replace(partial, final)
    _fsync_renamed(final)


def _fsync_renamed(final: Path, next_step: str = "Remove the cause (check the disk).") -> None:
    """Flush the folder of `final`, just renamed into place. A failure (an I/O error) is a `WriteError` saying that
    `final` is complete in place: the caller's own error said it "could not be written" (a checkpoint that `--resume`
    picks), or was "as it was"."""
    with write_error_named(f"{final.name}/", final.parent, f"A machine stopped before the file system writes "
                           f"{final.parent} may lose the rename. {next_step}",
                           failed="is complete, but its rename could not be flushed to disk"):
        _fsync(final.parent)


# ----------------------------------------------------------------------------------------------- deleting


def remove_checkpoint(path: str | Path) -> None:
    """Delete a checkpoint (or a folder of them) atomically: rename it out of the way, then remove the files. A kill
    during the removal leaves a `.deleted` folder, which nothing reads and `remove_leftovers` clears."""
    path = Path(path)
    doomed = path.with_name(path.name + DELETED_SUFFIX)
    shutil.rmtree(doomed, ignore_errors=True)  # an earlier removal of the same name, interrupted
    try:
        os.replace(path, doomed)
    except FileNotFoundError:  # removed meanwhile (by the user, while the run pruned): nothing left to do
        return
    _fsync(path.parent)
    shutil.rmtree(doomed)


def remove_leftovers(folder: str | Path) -> None:
    """Remove what interrupted saves (`.tmp`) and deletions (`.deleted`) left in `folder`."""
    folder = Path(folder)
    if folder.is_dir():
        for path in folder.iterdir():
            if _LEFTOVER_NAME.fullmatch(path.name) and path.is_dir():
                shutil.rmtree(path)


def prune_checkpoints(folder: str | Path, keep: int, prefix: str = ACCELERATE_PREFIX,
                      protect: str | Path | None = None) -> None:
    """Delete all but the newest `keep` complete checkpoints and `protect` (atomically, one at a time)."""
    if keep < 1:
        raise ValueError(f"`keep` must be at least 1, got {keep}.")
    kept = Path(protect).resolve() if protect is not None else None
    for path in complete_checkpoints(folder, prefix)[:-keep]:
        if path.resolve() != kept:
            remove_checkpoint(path)


# ----------------------------------------------------------------------------------------------- finding, verifying


def checkpoints(folder: str | Path, prefix: str = ACCELERATE_PREFIX) -> list[Path]:
    """Every folder named `{prefix}-N` in `folder`, complete or not, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    name = re.compile(rf"{re.escape(prefix)}-(\d+)")
    return sorted((path for path in folder.iterdir() if name.fullmatch(path.name) and path.is_dir()), key=_step)


def not_checkpoint_folders(folder: str | Path) -> list[Path]:
    """What in a run's `folder` of checkpoints bears the name of a checkpoint (either command's, or a leftover of one)
    but is no folder of the run's own: a file, or a symbolic link. `checkpoints` passes over it, and the run failed
    only when it saved or removed that step (a rename onto the file; `rmtree` of the link, after renaming it), with
    a message blaming the free space."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir()
                  if is_checkpoint_name(path) and (path.is_symlink() or not path.is_dir()))


def is_checkpoint_name(path: Path) -> bool:
    """Whether `path` bears the name of a checkpoint of either command, or of a leftover of one (`.tmp`,
    `.deleted`): what a run writes in its folder of checkpoints."""
    return _CHECKPOINT_NAME.fullmatch(path.name) is not None


def complete_checkpoints(folder: str | Path, prefix: str = ACCELERATE_PREFIX) -> list[Path]:
    """The checkpoints in `folder` that carry a manifest, oldest first (not verified: see `latest_checkpoint`)."""
    return [path for path in checkpoints(folder, prefix) if (path / MANIFEST).is_file()]


def latest_checkpoint(folder: str | Path, prefix: str = ACCELERATE_PREFIX,
                      report: Callable[[str], None] | None = print) -> Path | None:
    """The newest checkpoint in `folder` that verifies (sizes and checksums), or None when there is none. Each newer
    one that does not is skipped, and `report` is told which and why. When checkpoints exist but none verifies,
    raises `CheckpointError` rather than let a resumed run silently start again."""
    found, newest_problem = checkpoints(folder, prefix), None
    for path in reversed(found):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointUnreadable:
            raise
        except CheckpointError as error:
            if report is not None:
                report(f"skipping {path.name}: {error}")
            newest_problem = newest_problem or error
    if found:
        raise CheckpointError(f"None of the {len(found)} checkpoints in {folder} verifies (the newest: "
                              f"{str(newest_problem).rstrip('.')}). "
                              "Repair them, or start the run again.")
    return None


def checkpoint_to_resume(folder: str | Path, prefix: str = ACCELERATE_PREFIX,
                         report: Callable[[str], None] | None = print) -> Path | None:
    """What `--resume` continues: the newest checkpoint in a run's `folder` of checkpoints that verifies
    (`latest_checkpoint`), or None to start the run again from step 0 (`report` is told so). A run stopped before its
    first checkpoint starts again; but where the run's folder holds a model or the other command's checkpoints
    (`train` writes checkpoint-N, `train-accelerate` step-N), starting again would replace a run that was never
    continued (its log at once, its model at the end): raises `CheckpointError` naming them."""
    folder = Path(folder)
    checkpoint = latest_checkpoint(folder, prefix, report)
    if checkpoint is not None:
        check_loop(checkpoint, prefix)
        return checkpoint
    other = TRAINER_PREFIX if prefix == ACCELERATE_PREFIX else ACCELERATE_PREFIX
    held = [f"its model in {folder.parent / 'model'}"] if (folder.parent / "model").is_dir() else []
    if checkpoints(folder, other):
        command = "hf-scratch train" if other == TRAINER_PREFIX else "hf-scratch train-accelerate"
        held.append(f"{other}-N checkpoints, which `{command}` writes and continues")
    if held:
        raise CheckpointError(
            f"--resume: {folder} holds no {prefix}-N checkpoint to continue, and {folder.parent} holds an earlier run "
            f"({'; '.join(held)}) that starting again from step 0 would replace. Pass --overwrite-output-dir to "
            "replace it, or choose another --output-dir."
        )
    if report is not None:
        report(f"no checkpoint in {folder}: starting from step 0")
    return None


def verify_checkpoint(path: str | Path) -> dict:
    """The manifest of the checkpoint at `path`, after checking that the folder exists, is complete, and that every
    file it lists is there with its recorded size and SHA-256 (read once per process while the files stay as they
    were: `_VERIFIED`). Raises `CheckpointError` naming the problem (`CheckpointUnreadable` where it may not be read).
    """
    try:
        return _verified_manifest(Path(path))
    except PermissionError as error:  # was a traceback
        raise CheckpointUnreadable(
            f"Checkpoint {path} cannot be read: {error.strerror} ({error.filename}). Give this user read access to "
            "it, or move it out of the run's folder."
        ) from error


def _verified_manifest(path: Path) -> dict:
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint at {path}: " + ("it is a file, not a checkpoint folder." if path.exists()
                                                               else "the folder does not exist."))
    if not (path / MANIFEST).is_file() and (inside := checkpoints(path) or checkpoints(path, TRAINER_PREFIX)):
        # a run's folder of checkpoints, said to be an interrupted checkpoint
        raise CheckpointError(f"{path} is a folder of checkpoints, not one: pass one of them (the newest: "
                              f"{inside[-1]}).")
    if not (path / MANIFEST).is_file() and (manifest := _manifest_before_manifests(path)) is not None:
        return manifest  # a leftover's name (.tmp, .deleted) is no checkpoint-N: never taken so
    if _LEFTOVER_NAME.fullmatch(path.name) or not (path / MANIFEST).is_file():
        raise CheckpointError(
            f"Checkpoint {path} is incomplete: it has no {MANIFEST}, so it was interrupted while being written "
            "or deleted (or is not a checkpoint of this package). Resume from an earlier checkpoint."
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files, step, metadata = manifest["files"], int(manifest["step"]), manifest["metadata"]
        expected = {name: (int(entry["size"]), entry["sha256"]) for name, entry in files.items()}
        if not isinstance(metadata, dict):  # the resuming command reads its settings there
            raise TypeError(f"its metadata is {metadata!r}, not an object")
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"Checkpoint {path} is corrupt: its {MANIFEST} cannot be read ({error}).") from error
    if _NUMBERED_NAME.fullmatch(path.name) and _step(path) != step:
        raise CheckpointError(f"Checkpoint {path} is not what its name says: its {MANIFEST} records step {step}.")
    for name, (size, _) in expected.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"Checkpoint {path} (step {step}) is corrupt: the file {name} is missing.")
        if file.stat().st_size != size:
            raise CheckpointError(
                f"Checkpoint {path} (step {step}) is corrupt: the file {name} has {file.stat().st_size} bytes, "
                f"{size} were written (truncated or overwritten)."
            )
    stamps = _file_stamps(path, [MANIFEST, *expected])
    if _VERIFIED.get(path.resolve()) == stamps:
        return manifest
    for name, (_, checksum) in expected.items():
        if _sha256(path / name) != checksum:
            raise CheckpointError(
                f"Checkpoint {path} (step {step}) is corrupt: the file {name} does not match its SHA-256 checksum."
            )
    _VERIFIED[path.resolve()] = stamps
    return manifest


# What every Trainer checkpoint holds, whatever wrote it (the random state is checked as it loads).
_TRAINER_FILES = (CONFIG_NAME, SAFE_WEIGHTS_NAME, "optimizer.pt", "scheduler.pt", TRAINER_STATE_NAME)


def _manifest_before_manifests(path: Path) -> dict | None:
    """The manifest of a `checkpoint-N` that `hf-scratch train` or `finetune` wrote before checkpoints had one (until
    2026-11-23, Trainer's own folders, written in place), or None when `path` is not such a complete checkpoint.
    Trainer writes `trainer_state.json` last: a folder holding Trainer's files and a whole `trainer_state.json` of
    its step was written to the end (an interrupted write lacks it, or holds part of it). The current commands never
    leave a folder without a manifest under a final name (`.tmp`, `.deleted`). Format 0: no files to check, and no
    recorded settings."""
    if not _NUMBERED_NAME.fullmatch(path.name) or path.name.rsplit("-", 1)[0] != TRAINER_PREFIX or \
            not all((path / name).is_file() for name in _TRAINER_FILES):
        return None
    try:
        step = int(json.loads((path / TRAINER_STATE_NAME).read_text(encoding="utf-8"))["global_step"])
    except (ValueError, KeyError, TypeError):
        return None
    return {"format": 0, "step": step, "files": {}, "metadata": {}} if step == _step(path) else None


# Checkpoints whose checksums this process has verified, with each file's size and modification time then: a
# resumed run finds the latest checkpoint that verifies, then loads it, and reading every file twice took minutes on
# a large model. A file written since (another modification time or size) is read again.
_VERIFIED: dict[Path, tuple] = {}


def _file_stamps(path: Path, names) -> tuple:
    return tuple((name, (stat := (path / name).stat()).st_size, stat.st_mtime_ns) for name in sorted(names))


# The file each loop writes into every checkpoint of its own, the loop, and how it continues one.
_LOOPS = {ACCELERATE_PREFIX: ("random_states_0.pkl", "`hf-scratch train-accelerate` (the Accelerate loop)",
                              "--resume-from it, or --resume under a step-N name"),
          TRAINER_PREFIX: (TRAINER_STATE_NAME, "`hf-scratch train` (Trainer)", "--resume under a checkpoint-N name")}


def check_loop(path: str | Path, prefix: str = ACCELERATE_PREFIX) -> None:
    """A checkpoint (verified) must be one of the loop that resumes it (`prefix`: Accelerate's step-N, Trainer's
    checkpoint-N); else `CheckpointError` naming what it is and what it lacks. A step-N folder renamed checkpoint-N
    verified, and Trainer failed on it with a FileNotFoundError traceback (trainer_state.json)."""
    own = _LOOPS[prefix][0]
    if (Path(path) / own).is_file():
        return
    other = TRAINER_PREFIX if prefix == ACCELERATE_PREFIX else ACCELERATE_PREFIX
    marker, loop, how = _LOOPS[other]
    if (Path(path) / marker).is_file():
        raise CheckpointError(f"Checkpoint {path} is one of {loop}, which continues it ({how}): it has no {own}, "
                              f"which this command's {prefix}-N checkpoints hold.")
    raise CheckpointError(f"Checkpoint {path} has neither {own} nor {marker}: it is no checkpoint of a training "
                          "command.")


# ----------------------------------------------------------------------------------------------- divergence


def check_step_finite(step: int, values: dict, skipped: Callable[[], bool], folder: str | Path,
                      prefix: str = ACCELERATE_PREFIX) -> None:
    """Raise `TrainingDiverged` when one of the training step `step`'s `values` (name -> its loss or gradient norm,
    a float or tensor the same in every process; None: not computed) is nan or inf and its optimizer step was not
    `skipped()` (asked only then: on a GPU the GradScaler's answer waits for the step): that step has made every
    weight nan. (fp16's GradScaler skips a step whose gradients overflowed, on purpose: the weights stay finite, and
    the run goes on.) The values came from the weights after step `step - 1`, which give them again to a run resumed
    from a checkpoint of those weights: the error names the one before."""
    for name, value in values.items():
        if value is not None and not math.isfinite(value := float(value)) and not skipped():
            raise _diverged(f"the {name} of step {step} is {value}, computed from the weights after step {step - 1}",
                            step - 1, folder, prefix)


def check_weights_finite(model, step: int, folder: str | Path, prefix: str = ACCELERATE_PREFIX) -> None:
    """Raise `TrainingDiverged` when a weight of `model` after step `step`, about to be saved, is nan or inf. Call it
    in every process."""
    if not _weights_finite(model):
        raise _diverged(f"the weights after step {step} hold nan or inf", step, folder, prefix)


def _weights_finite(model) -> bool:
    """Whether every parameter of `model` is finite in every process (each reads its own shard of an FSDP model). One
    pass over the weights, made before a checkpoint is saved and after one is loaded, never per step."""
    flags = [(p.to_local() if isinstance(p, DTensor) else p).isfinite().all() for p in model.parameters()]
    finite = torch.stack([flag.to(flags[0].device) for flag in flags]).all().int()  # a model over several devices
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(finite, torch.distributed.ReduceOp.MIN)
    return bool(finite)


def check_loaded_weights_finite(model, checkpoint: str | Path) -> None:
    """`model`, just loaded from `checkpoint`, must hold finite weights. A checkpoint of nan or inf ones (written
    before runs stopped at a divergence) verifies, but cannot be trained on: it is refused by name rather than
    skipped, since the checkpoint before it, resumed with the same settings, would take the same steps to the same
    end (and may hold nan weights too)."""
    if not _weights_finite(model):
        raise TrainingDiverged(
            f"Checkpoint {checkpoint} holds nan or inf weights: its run diverged, and it was written before runs "
            "stopped there, so no training continues from it. Train again with a lower learning rate."
        )


def _diverged(what: str, bad_from: int, folder: str | Path, prefix: str) -> TrainingDiverged:
    """The error of a run whose weights after step `bad_from` are bad (`what` says how), naming the newest checkpoint
    of `folder` before them."""
    earlier = [path for path in complete_checkpoints(folder, prefix) if _step(path) < bad_from]
    where = f"the newest checkpoint before those weights is {earlier[-1]}" if earlier else \
        "no checkpoint before those weights is left"
    return TrainingDiverged(
        f"Training diverged: {what}. No checkpoint or model of nan or inf weights is written; {where}. Lower the "
        "learning rate (or lengthen the warmup) and train again: from a checkpoint the same settings take the same "
        "steps again, and --resume refuses another learning rate."
    )


# ----------------------------------------------------------------------------------------------- loading


def check_sharding(path: str | Path, fsdp: bool, state_dict_type=None) -> None:
    """A checkpoint resumes under the sharding it was saved with: FSDP writes the model as `pytorch_model_fsdp_N`,
    a run without FSDP as whole files, and each loader fails on the other kind deep inside, over a missing file.
    Under FSDP, so does each state dict type (`state_dict_type`, the run's FSDP plugin's) on the other's files:
    SHARDED_STATE_DICT is a folder `pytorch_model_fsdp_0`, FULL_STATE_DICT a file `pytorch_model_fsdp.bin`."""
    sharded = any(file.name.startswith(FSDP_MODEL_NAME) for file in Path(path).iterdir())
    if sharded != fsdp:
        raise CheckpointError(
            f"Checkpoint {path} was saved {'sharded by FSDP' if sharded else 'without FSDP'}, and this run "
            f"{'shards the model with FSDP' if fsdp else 'does not use FSDP'}: resume it launched as it was saved "
            "(the same accelerate config, or --fsdp for train; docs/distributed.md)."
        )
    saved = "SHARDED_STATE_DICT" if (Path(path) / f"{FSDP_MODEL_NAME}_0").is_dir() else \
        "FULL_STATE_DICT" if (Path(path) / f"{FSDP_MODEL_NAME}.bin").is_file() else None
    now = getattr(state_dict_type, "name", state_dict_type)  # torch's StateDictType, or its name
    if fsdp and saved and now and saved != now:
        raise CheckpointError(
            f"Checkpoint {path} was saved by FSDP as {saved}, and this run's FSDP config has fsdp_state_dict_type "
            f"{now}: resume it with the fsdp_state_dict_type it was saved with (docs/distributed.md)."
        )


def load_checkpoint(accelerator, path: str | Path, model=None, optimizer=None) -> dict:
    """Check the checkpoint at `path` against its manifest (and its weights against `model`, the prepared model,
    when given), then `accelerator.load_state` it; returns the manifest. Raises `CheckpointError` when this
    process's random state was not restored, or when the checkpoint's state replaced the settings of `optimizer`
    (when given)."""
    manifest = verify_checkpoint(path)
    check_loop(path)
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    check_sharding(path, fsdp, accelerator.state.fsdp_plugin.state_dict_type if fsdp else None)
    if model is not None:  # else Accelerate's loader fails on another model with a traceback of size mismatches
        check_same_tensors(path, accelerator.unwrap_model(model))
        check_same_config(path, accelerator.unwrap_model(model))
    # Every process checks the files of all, so that all stop together (before `load_state`, which may communicate).
    for process in range(accelerator.num_processes):
        if not (Path(path) / f"random_states_{process}.pkl").is_file():
            raise CheckpointError(f"Checkpoint {path} has no random state for process {process} "
                                  f"(random_states_{process}.pkl): it was saved by fewer processes than this run has.")
    rng_file = Path(path) / f"random_states_{accelerator.process_index}.pkl"
    settings = optimizer_settings(optimizer) if optimizer is not None else None
    accelerator.load_state(str(path))
    if settings is not None:
        check_same_optimizer(path, settings, optimizer)
    if model is not None:
        check_loaded_weights_finite(model, path)
    try:  # as Accelerate reads it; it swallows any failure, so compare what it restored with the file
        saved = torch.load(rng_file, weights_only=False)["torch_manual_seed"]
        restored = torch.equal(torch.get_rng_state(), saved)
    except Exception as error:
        raise CheckpointError(f"Checkpoint {path}: the random state {rng_file.name} cannot be loaded ({error}).") \
            from error
    if not restored:
        raise CheckpointError(f"Checkpoint {path}: the random state {rng_file.name} was not restored.")
    return manifest


# Optimizer settings a checkpoint's optimizer state brings back with it (`load_state_dict` takes each group's
# hyperparameters from the file, and the schedule its base rates), by the name the user knows them.
_OPTIMIZER_SETTINGS = {"initial_lr": "learning rate", "betas": "Adam betas", "eps": "Adam epsilon",
                       "weight_decay": "weight decay"}


def optimizer_settings(optimizer) -> list[dict]:
    return [{key: tuple(value) if isinstance(value := group.get(key), list) else value for key in _OPTIMIZER_SETTINGS}
            for group in optimizer.param_groups]


def check_same_optimizer(checkpoint: str | Path, before: list[dict], optimizer) -> None:
    """`optimizer`, just loaded from `checkpoint`, must keep the settings it had before (`before`,
    `optimizer_settings`); else `CheckpointError` naming those that differ. A `--learning-rate` (or Adam or weight
    decay option) changed for `--resume` was silently replaced by the checkpoint's, while the model card reported
    the new value."""
    differing = []
    for here, there in zip(before, optimizer_settings(optimizer), strict=True):
        for key, name in _OPTIMIZER_SETTINGS.items():
            line = f"{name} {there[key]!r} there, {here[key]!r} here"
            if there[key] != here[key] and line not in differing:
                differing.append(line)
    if differing:
        raise CheckpointError(
            f"Checkpoint {checkpoint} was trained with other optimizer settings than this run's "
            f"({'; '.join(differing)}), which its optimizer state would keep, ignoring this run's. Resume with the "
            "run's own settings, or start a new run in another output folder."
        )


def check_same_tensors(checkpoint: str, model) -> None:
    """A checkpoint's weights must hold the tensors of `model`, by name and shape; else `CheckpointError` naming the
    first differences. Whole weights are `model.safetensors`, FSDP's sharded ones `pytorch_model_fsdp_0`, whose
    torch.distributed.checkpoint metadata has every name's shape (Accelerate files them under `model.`). The names
    of one tied matrix count as one, under its first name: a file stores it once, under the name its writer kept
    (transformers the input embeddings', Accelerate any of them). Other FSDP state dict types and adapter
    checkpoints are left to their loaders."""
    file, sharded = Path(checkpoint) / SAFE_WEIGHTS_NAME, Path(checkpoint) / f"{FSDP_MODEL_NAME}_0"
    if not hasattr(model, "all_tied_weights_keys"):
        return
    if file.is_file():
        with safe_open(file, "pt") as weights:
            saved = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    elif (sharded / ".metadata").is_file():
        metadata = FileSystemReader(str(sharded)).read_metadata().state_dict_metadata
        saved = {name.removeprefix("model."): tuple(entry.size) for name, entry in metadata.items()
                 if hasattr(entry, "size")}
    else:
        return
    first, tied = {}, {}  # name -> the first name of its parameter
    for name, parameter in model.named_parameters(remove_duplicate=False):
        tied[name] = first.setdefault(id(parameter), name)
    saved = {tied.get(name, name): shape for name, shape in saved.items()}
    expected = {tied.get(name, name): tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    differing = [f"`{name}` {saved.get(name, 'absent')} there, {expected.get(name, 'absent')} here"
                 for name in sorted(saved.keys() | expected.keys()) if saved.get(name) != expected.get(name)]
    if differing:
        raise CheckpointError(
            f"Checkpoint {checkpoint} holds another model than this run builds ({len(differing)} tensors differ: "
            f"{'; '.join(differing[:3])}{' ...' if len(differing) > 3 else ''}). Resume with the run's own task, "
            "preset and settings, or start a new run in another output folder."
        )


def checkpoint_config(checkpoint: str, model) -> PreTrainedConfig | None:
    """The config a checkpoint saved beside its weights (Trainer's, and Accelerate's since they carry one), read as
    `model`'s config class; None without one."""
    config = getattr(model, "config", None)
    if not isinstance(config, PreTrainedConfig) or not (Path(checkpoint) / CONFIG_NAME).is_file():
        return None
    return type(config).from_pretrained(checkpoint)


# Config fields that change how a model trains or starts, not the function its weights compute.
_TRAINING_KNOBS = {"dropout", "attention_dropout", "activation_dropout", "embedding_dropout", "classifier_dropout",
                   "initializer_range", "init_scheme", "use_cache", "sparse_prediction"}


def check_same_config(checkpoint: str, model) -> None:
    """A checkpoint must have been trained with the model knobs of `model`'s config; else `CheckpointError` naming
    those that differ. `check_same_tensors` tells shapes only: a changed `--set hidden_act=...`, `norm_position`,
    `norm_type` or `position_embedding_type` (rope and alibi have no tensor) resumed silently, and the model folder
    then paired those weights with another function. Knobs of training alone (dropout, initialisation) may change."""
    saved = checkpoint_config(checkpoint, model)
    if saved is None:
        return
    knobs = (own_fields(type(model.config)) - _TRAINING_KNOBS) | {"rope_parameters"}
    there, here = saved.to_dict(), model.config.to_dict()
    differing = [f"{name} {there.get(name)!r} there, {here.get(name)!r} here" for name in sorted(knobs)
                 if there.get(name) != here.get(name)]
    if differing:
        raise CheckpointError(
            f"Checkpoint {checkpoint} was trained with another model config than this run builds "
            f"({'; '.join(differing)}). Resume with the run's own preset and --set values, or start a new run in "
            "another output folder."
        )


_NUMBERED_NAME = re.compile(r"[\w.]+-\d+")
_LEFTOVER_NAME = re.compile(rf"[\w.]+-\d+({re.escape(PARTIAL_SUFFIX)}|{re.escape(DELETED_SUFFIX)})")
_CHECKPOINT_NAME = re.compile(rf"({ACCELERATE_PREFIX}|{TRAINER_PREFIX})-\d+"
                              rf"({re.escape(PARTIAL_SUFFIX)}|{re.escape(DELETED_SUFFIX)})?")


def _step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_tree(folder: Path) -> None:
    """Flush every file under `folder` and the entries of every folder there, `folder` and nested ones (a model's
    `tokenizer/`) alike: a folder's new entries are durable only once it is flushed itself."""
    for path in [*folder.rglob("*"), folder]:
        if path.is_file() or path.is_dir():  # not a broken link
            _fsync(path)


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk (a rename is durable only once its folder is flushed)."""
    if os.name == "nt" and path.is_dir():  # Windows cannot open a folder to flush it
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
