"""`save_in_place`: a tokenizer saved into a folder that may hold another one (a model's folder, with
--overwrite-output-dir), so that a kill or a full disk at any instant leaves the earlier tokenizer, the new one, or a
folder that `AutoTokenizer` does not load; never a mix of the two. `save_pretrained` writes tokenizer_config.json,
then tokenizer.json: stopped between them over an earlier tokenizer, the new config loaded silently over the earlier
vocabulary, and a full disk left the earlier tokenizer.json cut short. A tokenizer that another command saved there
while this one trained (the folder held none, or another, when checked) is kept, and this one is not saved: the last
to save replaced it without --overwrite-output-dir.

A folder that does not exist yet is saved whole beside it (`.FOLDER.tokenizer.tmp`) and renamed into place: a kill
leaves it whole or absent. (Saved file by file, a kill left a new folder holding tokenizer_config.json alone, which
the same command then refused as "a tokenizer" without --overwrite-output-dir.) Into a folder that exists (a model's,
whose other files stay), the new tokenizer is saved aside (`FOLDER/.tokenizer.tmp`, which publishing skips as
hidden); the earlier one's files are moved out (`FOLDER/.tokenizer.deleted`), its tokenizer.json first; then the
new files are moved in, tokenizer.json last, and the earlier ones removed; a move that fails is undone (`move_in`).
`AutoTokenizer` loads a fast tokenizer from tokenizer.json, and fails on a folder that has its config without it.
Such a folder, a tokenizer's settings without a vocabulary, is refused as part of a tokenizer (`held_tokenizer`)."""

import shutil
from pathlib import Path

from hf_scratch_transformer import checkpointing
from tokenizer_training import TOKENIZER_FILES

VOCABULARY = "tokenizer.json"  # what the folder's tokenizer loads from: removed first, moved in last
# The files of a tokenizer's settings, saved beside its vocabulary (tokenizer.json, or a slow one's vocab.txt ...)
SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja")


def tokenizer_files(folder: Path) -> list[str]:
    """The files of a tokenizer that `folder` holds (`TOKENIZER_FILES`: a model's folder holds other files too)."""
    return [name for name in TOKENIZER_FILES if (folder / name).exists()]


def held_tokenizer(held: list[str]) -> str:
    """What a folder whose `tokenizer_files` are `held` holds, in words: a tokenizer, or its settings without a
    vocabulary (a save into an existing folder stopped midway, a copy in part)."""
    if any(name not in SETTINGS_FILES for name in held):
        return f"a tokenizer ({', '.join(held)})"
    return (f"part of a tokenizer ({', '.join(held)}) without its vocabulary ({VOCABULARY}, or a slow tokenizer's "
            "vocab.txt ...), which no tokenizer loads from")


def placed(aside: Path, folder: Path) -> bool:
    """Whether the saved folder `aside` took the place of `folder`, which held nothing when checked; False where a
    folder was made there meanwhile (its files are checked, and these moved into it). Any other error of the rename
    (a file system gone read-only, a quota) is raised: taken for such a folder, it ended in a FileNotFoundError."""
    try:
        checkpointing.place_folder(aside, folder)
    except OSError:
        if folder.is_dir():
            return False
        raise
    return True


def save_in_place(tokenizer, folder: Path, replaced: list[str]) -> list[str]:
    """Save `tokenizer` into `folder` in place of the files `replaced` (the earlier tokenizer's); returns those of
    them the new tokenizer does not write. A write error is a `CheckpointError` naming it, the earlier files kept."""
    new = not folder.exists()
    # emptied of what an interrupted save left
    aside = checkpointing.folder_aside(folder.parent / f".{folder.name}.tokenizer" if new else folder / ".tokenizer")
    try:
        with checkpointing.write_error_named("The tokenizer", aside.parent, f"{folder} is as it was."):
            written = sorted(Path(path).name for path in tokenizer.save_pretrained(aside))
            if new and placed(aside, folder):
                return []
    except checkpointing.CheckpointError:
        shutil.rmtree(aside, ignore_errors=True)  # a partial copy, on a disk that may be full
        raise
    if meanwhile := [name for name in tokenizer_files(folder) if name not in replaced]:
        shutil.rmtree(aside)
        raise checkpointing.CheckpointError(
            f"{folder} holds a tokenizer saved while this one was trained ({', '.join(meanwhile)}), by another "
            "command into the same --output-dir perhaps: it is left as it is, and this one is not saved. Choose "
            "another --output-dir, or pass --overwrite-output-dir to replace it.")
    with checkpointing.write_error_named("The new tokenizer", folder, f"{folder} is as it was, and the new tokenizer "
                                         f"is whole in {aside}: remove the cause, then run the command again, which "
                                         "trains and saves it again.", failed="could not take the earlier one's place"):
        move_in(aside, folder, written, replaced)
    return [name for name in replaced if name not in written]


def move_in(aside: Path, folder: Path, written: list[str], replaced: list[str]) -> None:
    """Move the files `written` of `aside` into `folder` in place of the files `replaced`, which are moved out first
    (into `folder/.tokenizer.deleted`, tokenizer.json first) and removed once the new ones are in (tokenizer.json
    last). A move that fails (a file system gone read-only, a full disk for a folder's entry) is undone, the last
    first, and raised: `folder` is as it was. (The earlier files were removed first: a failed move left neither
    tokenizer there.) Were the undoing to fail too, the `WriteError` says where the files are."""
    earlier = folder / f".tokenizer{checkpointing.DELETED_SUFFIX}"
    shutil.rmtree(earlier, ignore_errors=True)  # what an interrupted save left
    earlier.mkdir()
    moves = [(folder / name, earlier / name) for name in sorted(replaced, key=lambda name: name != VOCABULARY)]
    moves += [(aside / name, folder / name) for name in sorted(written, key=lambda name: name == VOCABULARY)]
    done = []
    try:
        for source, target in moves:
            source.replace(target)
            done.append((source, target))
    except OSError:
        with checkpointing.write_error_named(
                "The tokenizer files moved", folder, f"Neither tokenizer is whole in {folder}: the earlier one's files "
                f"are in it or in {earlier}, the new one's in it or in {aside}. Remove the cause, then run the command "
                "again, which saves the new one.", failed="could not be moved back"):
            for source, target in reversed(done):
                target.replace(source)
            earlier.rmdir()
        raise
    with checkpointing.write_error_named("The replaced tokenizer", folder, f"The new one is in place, whole; what is "
                                         f"left in {earlier} and {aside} nothing reads, and the next tokenizer saved "
                                         f"into {folder} removes it.", failed="could not be removed"):
        shutil.rmtree(earlier)
        aside.rmdir()
