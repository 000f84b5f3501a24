"""Atomic training checkpoints around Accelerate's `save_state` / `load_state`.

Every process writes its part of the checkpoint into `step-N.tmp`. Once all of them are done, the main process
writes `COMPLETE.json` (the step, the size and SHA-256 of every file, free-form metadata) and renames the folder to
`step-N`. A rename within one filesystem is atomic, so a run killed while saving leaves a `.tmp` folder, never a
`step-N` that looks complete. Loading checks the marker and every file against the manifest before Accelerate reads
anything (Accelerate itself skips a missing RNG file silently and reports a truncated weights file without its
name), and raises `CheckpointError`, a `ValueError` whose message names the problem.

Several machines must share one filesystem for the checkpoint folder. No model file imports this module (it never
travels to the Hub).
"""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

MANIFEST = "COMPLETE.json"
_COMPLETE_NAME = re.compile(r"step-(\d+)")
_PARTIAL_NAME = re.compile(r"step-(\d+)\.tmp")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete (interrupted while being written) or corrupt."""


def checkpoint_path(folder: str | Path, step: int) -> Path:
    return Path(folder) / f"step-{step}"


def save_checkpoint(accelerator, folder: str | Path, step: int, metadata: dict | None = None,
                    extra_files: dict[str, str] | None = None, keep: int | None = None) -> Path:
    """`accelerator.save_state` made atomic: returns `folder/step-{step}`, complete. Call it on every process.

    `extra_files` (name -> text, e.g. the loss log so far) are written by the main process beside the state;
    `metadata` goes into the manifest. Checkpoints of later steps are removed: they belong to a history the run
    left by resuming from an earlier checkpoint, and `latest_checkpoint` must not pick them. With `keep`, only the
    newest `keep` complete checkpoints remain."""
    final = checkpoint_path(folder, step)
    partial = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)  # the leftover of a save that was interrupted
        partial.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()  # every process's files (its RNG state, its FSDP shard) are on disk
    if accelerator.is_main_process:
        for name, text in (extra_files or {}).items():
            (partial / name).write_text(text, encoding="utf-8")
        write_manifest(partial, step, metadata)
        for path in complete_checkpoints(folder):
            if _step(path) >= step:
                shutil.rmtree(path)
        os.replace(partial, final)
        _fsync(final.parent)
        if keep is not None:
            prune_checkpoints(folder, keep)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str | Path, verify_checksums: bool = True) -> dict:
    """Check the checkpoint at `path` against its manifest, then `accelerator.load_state` it; returns the manifest."""
    manifest = verify_checkpoint(path, verify_checksums)
    accelerator.load_state(str(path))
    return manifest


def write_manifest(folder: str | Path, step: int, metadata: dict | None = None) -> dict:
    """Flush every file of `folder` to disk, then record the step, each file's size and SHA-256, and `metadata`
    in `folder/COMPLETE.json`, written last: its presence marks the checkpoint complete."""
    folder = Path(folder)
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        _fsync(file)
        files[file.relative_to(folder).as_posix()] = {"size": file.stat().st_size, "sha256": _sha256(file)}
    manifest = {"format": 1, "step": step, "files": files, "metadata": metadata or {}}
    partial = folder / (MANIFEST + ".tmp")
    partial.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    _fsync(partial)
    os.replace(partial, folder / MANIFEST)
    _fsync(folder)
    return manifest


def verify_checkpoint(path: str | Path, verify_checksums: bool = True) -> dict:
    """The manifest of the checkpoint at `path`, after checking that the folder exists, is complete, and that every
    file it lists is there with its recorded size (and SHA-256). Raises `CheckpointError` naming the problem."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"No checkpoint at {path}: the folder does not exist.")
    if _PARTIAL_NAME.fullmatch(path.name) or not (path / MANIFEST).is_file():
        raise CheckpointError(
            f"Checkpoint {path} is incomplete: it has no {MANIFEST}, so it was interrupted while being written "
            "(or is not a checkpoint of this script). Resume from an earlier checkpoint."
        )
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files, step = manifest["files"], int(manifest["step"])
        expected = {name: (int(entry["size"]), entry["sha256"]) for name, entry in files.items()}
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"Checkpoint {path} is corrupt: its {MANIFEST} cannot be read ({error}).") from error
    for name, (size, checksum) in expected.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"Checkpoint {path} (step {step}) is corrupt: the file {name} is missing.")
        if file.stat().st_size != size:
            raise CheckpointError(
                f"Checkpoint {path} (step {step}) is corrupt: the file {name} has {file.stat().st_size} bytes, "
                f"{size} were written (truncated or overwritten)."
            )
        if verify_checksums and _sha256(file) != checksum:
            raise CheckpointError(
                f"Checkpoint {path} (step {step}) is corrupt: the file {name} does not match its SHA-256 checksum."
            )
    return manifest


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """The complete checkpoints in `folder` (named `step-N` with a manifest), oldest first; `.tmp` folders and
    folders without a manifest are left out."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [path for path in folder.iterdir() if _COMPLETE_NAME.fullmatch(path.name) and (path / MANIFEST).is_file()]
    return sorted(found, key=_step)


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The newest complete checkpoint in `folder`, or None."""
    checkpoints = complete_checkpoints(folder)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(folder: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and leftovers of interrupted saves."""
    if keep < 1:
        raise ValueError(f"`keep` must be at least 1, got {keep}.")
    for path in complete_checkpoints(folder)[:-keep]:
        shutil.rmtree(path)
    for path in Path(folder).iterdir():
        if _PARTIAL_NAME.fullmatch(path.name):
            shutil.rmtree(path)


def _step(path: Path) -> int:
    return int(_COMPLETE_NAME.fullmatch(path.name)[1])


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk (a rename is durable only once its folder is flushed)."""
    if os.name == "nt" and path.is_dir():  # Windows cannot open a folder to flush it
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
