"""The releases installed of what the package needs, checked as it is imported, as transformers checks its own.

pip installs a later request over an earlier one with a warning only: a package pinning `accelerate==1.14`, installed
after this one, leaves an environment where a resumed run silently departs from the uninterrupted one, and tokenizers
0.23.2 one that trains masked-LMs on each document's first sequence alone. Each range's reason is beside it in
pyproject.toml. This module is never copied next to saved weights (remote code needs only transformers and torch).
"""

import importlib.metadata

from packaging.requirements import Requirement
from transformers.utils.versions import require_version

DISTRIBUTION = "hf-scratch-transformer"
PACKAGE = "hf_scratch_transformer"  # the ImportError's `name`: `hf-scratch` answers such an error in one line


def check_installed_dependencies() -> None:
    """Raise ImportError (`name` PACKAGE) naming the first runtime requirement (not an extra's) the installed release
    falls outside, or that is not installed, and the pip command that mends it. Nothing to check where the package
    runs from a checkout it was never installed from (no metadata)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return
    for requirement in map(Requirement, requirements):
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an extra's (`[test]`), or for another Python or platform
        wanted = f"{requirement.name}{requirement.specifier}"
        try:
            require_version(wanted, f"{DISTRIBUTION} needs it; a later pip command may have replaced or removed the "
                                    f"release it installed. `pip install '{wanted}'` puts back one in range.")
        except ImportError as out_of_range:  # PackageNotFoundError (uninstalled since) is one too
            # args[0], the message: a PackageNotFoundError's str() reads "No package metadata was found for" it
            raise ImportError(out_of_range.args[0], name=PACKAGE) from None


# As the package is imported: its `__init__` imports this module before any other.
check_installed_dependencies()
