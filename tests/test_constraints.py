"""What the package declares it installs with. constraints.txt, the versions `make quickstart` and `make test`
install (on the Python the suite runs on): one exact version for every package pyproject.toml names, so that a fresh
clone and CI install what the suite passed with, and each inside pyproject.toml's range, or pip's install fails.
And no Python, and no version of a package transformers also names, that the package admits is one that transformers
excludes."""

from importlib.metadata import metadata, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

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


def test_every_python_the_package_admits_has_a_transformers_it_takes():
    """requires-python said >= 3.10, but transformers requires 3.11 from 5.21 on: on 3.10 pip found no transformers >=
    5.23 and said only that. The installed transformers is one of the range's (two minor releases, tested)."""
    ours = SpecifierSet(metadata("hf-scratch-transformer")["Requires-Python"])
    transformers = SpecifierSet(metadata("transformers")["Requires-Python"])
    pythons = [f"3.{minor}" for minor in range(8, 20)]
    assert [python for python in pythons if python in ours and python not in transformers] == []


def _floor(specifier: SpecifierSet) -> Version | None:
    return max((Version(clause.version) for clause in specifier if clause.operator in (">=", "==")), default=None)


def test_no_package_is_allowed_older_than_transformers_takes():
    """torch>=2.4 admitted a torch that transformers disables itself on (it wants 2.6, in its `torch` extra), and
    accelerate, huggingface_hub, tokenizers and safetensors were allowed older than transformers takes: a floor of ours
    is no lower than transformers' (any extra of its: what it needs of torch is in one)."""
    theirs = {}
    for text in requires("transformers"):
        requirement = Requirement(text)
        theirs.setdefault(canonicalize_name(requirement.name), []).append(_floor(requirement.specifier))
    for text in requires("hf-scratch-transformer"):
        requirement = Requirement(text)
        floors = [floor for floor in theirs.get(canonicalize_name(requirement.name), []) if floor]
        if floors:
            ours = _floor(requirement.specifier)
            assert ours is not None and ours >= max(floors), f"{requirement}: transformers takes >= {max(floors)}"
