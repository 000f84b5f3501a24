"""The releases installed of what the package needs, checked as it is imported, as transformers checks its own.

pip installs a later request over an earlier one with a warning only: a package pinning `accelerate==1.14`, installed
after this one, leaves an environment where a resumed run silently departs from the uninterrupted one, and tokenizers
0.23.2 one that trains masked-LMs on each document's first sequence alone. Each range's reason is beside it in
pyproject.toml. transformers' own ranges are checked here too, before transformers is imported (this module imports
neither it nor torch): where transformers refuses a release (a `pip install -U tokenizers` past its range), its import
stopped `hf-scratch` with a traceback. This module is never copied next to saved weights (remote code needs only
transformers and torch).
"""

import importlib.metadata
from collections.abc import Iterator

from packaging.requirements import Requirement

DISTRIBUTION = "hf-scratch-transformer"
PACKAGE = "hf_scratch_transformer"  # the ImportError's `name`: `hf-scratch` answers such an error in one line


def runtime_requirements(distribution: str) -> Iterator[Requirement]:
    """The requirements of an installed `distribution` that hold whatever extras are installed, on this Python and
    platform; none where it runs from a checkout it was never installed from (no metadata)."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return
    for requirement in map(Requirement, requirements):
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            yield requirement


def out_of_range(requirement: Requirement, missing_is_refused: bool = True) -> str | None:
    """Why the installed release of `requirement` does not satisfy it, as pip reads a range (PEP 440: a pre-release
    is compared, not admitted unless the range names one); None where it does."""
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        found = f"{requirement.name} is not installed" if missing_is_refused else None
    else:
        found = None if requirement.specifier.contains(installed, prereleases=True) else \
            f"{requirement.name} {installed} is installed"
    return found and f"{requirement.name}{requirement.specifier} is required, but {found}"


def refused(reason: str, requirement: Requirement, needed_by: str) -> ImportError:
    wanted = f"{requirement.name}{requirement.specifier}"
    return ImportError(f"{reason}.\n{needed_by} needs it; a later pip command may have replaced or removed the release "
                       f"it installed. `pip install '{wanted}'` puts back one in range.", name=PACKAGE)


def check_installed_dependencies() -> None:
    """Raise ImportError (`name` PACKAGE) naming the first runtime requirement (not an extra's) of the package, or of
    transformers, that the installed release falls outside, or (the package's) that is not installed, and the pip
    command that mends it. transformers' requirements that are not installed are left to its import, which names the
    module it lacks: it checks the ranges of what is installed only."""
    for requirement in runtime_requirements(DISTRIBUTION):
        if reason := out_of_range(requirement):
            raise refused(reason, requirement, DISTRIBUTION)
    # After ours, which put transformers' own release in range.
    for requirement in runtime_requirements("transformers"):
        if reason := out_of_range(requirement, missing_is_refused=False):
            raise refused(reason, requirement, f"transformers {importlib.metadata.version('transformers')}")


# As the package is imported: its `__init__` imports this module before any other.
check_installed_dependencies()
