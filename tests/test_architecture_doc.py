"""docs/architecture.md's tables of files name every module, and only modules that exist: the next engineer finds
each file's job there (a module added without a row went unlisted, a module renamed would leave a stale row)."""

import re
from pathlib import Path

from hf_scratch_command import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
# The section's first table lists the package's files, the second those outside it, at the top of the checkout.
TABLE_FOLDERS = ("hf_scratch_transformer/", "")


def named_modules() -> set[str]:
    """Every `*.py` in backticks of the tables' rows, as a path from the checkout's top: a row whose first cell is a
    folder (`cli/`) names files of that folder; `modeling_scratch_{decoder,encoder}.py` is written out."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Files", 1)[1].split("\n## ", 1)[0]
    tables = [block for block in re.split(r"\n\s*\n", section) if block.lstrip().startswith("|")]
    names = set()
    for table, folder in zip(tables, TABLE_FOLDERS, strict=False):
        for row in table.splitlines():
            first_cell = row.split("|")[1].strip().strip("`")
            row_folder = folder + first_cell if first_cell.endswith("/") else folder
            for stem, choices, suffix in re.findall(r"`([\w/]*?)(?:\{([\w,]+)\})?([\w/]*\.py)`", row):
                names |= {row_folder + stem + choice + suffix for choice in (choices.split(",") if choices else [""])}
    return names


def test_every_module_has_its_row():
    subcommands = {module.replace(".", "/") + ".py" for module, _ in COMMANDS.values()}  # "one flat script each"
    folders = ("hf_scratch_transformer", "hf_scratch_transformer/cli", "tokenizer_training")
    modules = {str(path.relative_to(ROOT)) for folder in folders for path in (ROOT / folder).glob("*.py")}
    assert sorted(modules - subcommands - named_modules()) == []
    assert "hf_scratch_command.py" in named_modules()


def test_every_row_names_a_module_that_exists():
    assert sorted(name for name in named_modules() if not (ROOT / name).is_file()) == []
