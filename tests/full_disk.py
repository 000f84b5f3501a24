"""`fail_as_on_a_full_disk`: one file-system call failing with ENOSPC for chosen paths, in a test's own process."""

import errno
from collections.abc import Callable
from pathlib import Path


def fail_as_on_a_full_disk(monkeypatch, owner, name: str, failing: Callable[[Path], bool]) -> None:
    """`owner.name` (`os.mkdir`, `Path.open`, ...) raises ENOSPC for the paths `failing` picks, as on a full disk,
    and works as before for the others (until the test ends)."""
    original = getattr(owner, name)

    def full_disk(path, *args, **kwargs):
        if failing(Path(path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(owner, name, full_disk)
