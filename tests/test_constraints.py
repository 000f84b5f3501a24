"""constraints.txt, the versions `make quickstart` and `make test` install (on the Python the suite runs on): one
exact version for every package pyproject.toml names, so that a fresh clone and CI install what the suite passed
with, and each inside pyproject.toml's range, or pip's install fails."""

from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONSTRAINTS = Path(__file__).parents[1] / "constraints.txt"


def pinned_versions() -> dict[str, str]:
    """constraints.txt's packages by canonical name, each with its one version."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            pin = Requirement(line)
            (specifier,) = pin.specifier
            assert specifier.operator == "==" and not pin.marker and not pin.extras, f"not an exact pin: {line}"
            pins[canonicalize_name(pin.name)] = specifier.version
    return pins


def test_every_package_the_project_names_is_pinned_within_its_range():
    pins = pinned_versions()
    named = [Requirement(text) for text in requires("hf-scratch-transformer")]
    assert {canonicalize_name(requirement.name) for requirement in named} >= {"transformers", "accelerate", "peft"}
    for requirement in named:
        name = canonicalize_name(requirement.name)
        if name == "torch":  # the Makefile installs torch==2.13.0 first, the CPU build
            assert "2.13.0" in requirement.specifier
            continue
        assert name in pins, f"{requirement.name} ({requirement}) has no version in constraints.txt"
        assert pins[name] in requirement.specifier, f"constraints.txt: {name}=={pins[name]}, outside {requirement}"
