"""Importing the package refuses an environment whose installed releases fall outside its ranges (installed over it
by a later `pip install`), naming the requirement and the command that mends it."""

import importlib.metadata
import subprocess
import sys

import pytest
from forked_python import run_python
from packaging.requirements import Requirement

from hf_scratch_transformer.installed_dependencies import check_installed_dependencies


def installed_instead(monkeypatch, name: str, version: str) -> None:
    """importlib.metadata answers `version` for distribution `name`, the truth for every other."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda asked: version if asked == name else real(asked))


def uninstalled(monkeypatch, name: str) -> None:
    """importlib.metadata finds no distribution `name`, the truth for every other."""
    real = importlib.metadata.version

    def version(asked):
        if asked == name:
            raise importlib.metadata.PackageNotFoundError(asked)
        return real(asked)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_the_environment_of_the_suite_is_in_range():
    check_installed_dependencies()


@pytest.mark.parametrize(("name", "version", "wanted"), [
    ("tokenizers", "0.23.2", "tokenizers>=0.23.3"),  # loses the overflow of truncated texts
    ("accelerate", "1.14.0", "accelerate>=1.15"),  # a resumed run departs from the uninterrupted one
    ("transformers", "5.26.0", "transformers<5.26,>=5.25"),  # a minor release the suite has not passed with
])
def test_a_release_out_of_range_stops_the_import_with_the_fix(monkeypatch, name, version, wanted):
    installed_instead(monkeypatch, name, version)
    with pytest.raises(ImportError, match=rf"^{wanted} is required, but {name} {version} is installed\.\n"
                                          rf"hf-scratch-transformer needs it; .* `pip install '{wanted}'`"):
        check_installed_dependencies()


def transformers_floor_of_regex() -> str:
    """transformers' own range of regex, a requirement of its that the package does not share."""
    return next(f"regex{requirement.specifier}" for requirement in map(Requirement, importlib.metadata.requires(
        "transformers")) if requirement.name == "regex")


def test_a_release_transformers_refuses_is_named_with_transformers_range(monkeypatch):
    """transformers refuses, as it is imported, a release outside its own ranges: that stopped `hf-scratch` with
    transformers' traceback. The package checks them too, before it imports transformers."""
    installed_instead(monkeypatch, "regex", "2020.1.8")
    wanted = transformers_floor_of_regex()
    with pytest.raises(ImportError, match=rf"^{wanted} is required, but regex 2020\.1\.8 is installed\.\n"
                                          rf"transformers {importlib.metadata.version('transformers')} needs it; "
                                          rf".* `pip install '{wanted}'`"):
        check_installed_dependencies()


def test_a_pre_release_of_the_next_minor_is_out_of_range(monkeypatch):
    """As pip reads `<5.26`: a 5.26 pre-release (transformers' main branch) is not admitted."""
    installed_instead(monkeypatch, "transformers", "5.26.0.dev0")
    with pytest.raises(ImportError, match=r"^transformers<5\.26,>=5\.25 is required, but transformers 5\.26\.0\.dev0"):
        check_installed_dependencies()


def test_a_requirement_of_transformers_not_installed_is_left_to_its_import(monkeypatch):
    """transformers checks the ranges of what is installed (tokenizers, say, only where installed): so does the
    package, for transformers' requirements, not to refuse an environment that transformers runs in."""
    uninstalled(monkeypatch, "regex")
    check_installed_dependencies()


def test_a_dependency_uninstalled_since_is_named_as_missing(monkeypatch):
    uninstalled(monkeypatch, "seqeval")
    with pytest.raises(ImportError) as refused:
        check_installed_dependencies()
    assert str(refused.value).startswith("seqeval>=1.2.2 is required, but seqeval is not installed.\n")
    assert "replaced or removed the release it installed. `pip install 'seqeval>=1.2.2'`" in str(refused.value)


def test_the_extras_ranges_are_left_to_whoever_installs_them(monkeypatch):
    installed_instead(monkeypatch, "openai", "0.1.0")  # the `test` extra asks for >= 1.99.1
    check_installed_dependencies()


def reimported_with(name: str, version: str) -> str:
    """The start of a script run in a fork of the suite's server (`run_python`), which has imported the package: its
    modules are dropped so that the import runs again (torch and transformers stay imported: a second, not the 10 s
    of a fresh interpreter), with `version` of distribution `name` in place of the release installed."""
    return ("import importlib.metadata as metadata, sys\n"
            "for module in [module for module in sys.modules if module.split('.')[0] == 'hf_scratch_transformer']:\n"
            "    del sys.modules[module]\n"
            "real = metadata.version\n"
            f"metadata.version = lambda name: {version!r} if name == {name!r} else real(name)\n")


def test_importing_the_package_runs_the_check(tmp_path):
    script = tmp_path / "import_the_package.py"
    script.write_text(reimported_with("accelerate", "1.14.0") + "import hf_scratch_transformer\n")
    result = run_python([sys.executable, script], cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    assert "ImportError: accelerate>=1.15 is required, but accelerate 1.14.0 is installed." in result.stderr


def test_the_check_comes_before_an_import_that_a_release_out_of_range_breaks(tmp_path):
    """The check ran after the package's imports: where a release out of range lacked a name the package imports
    (transformers 5.22 standing in, without `merge_with_config_defaults`), the import stopped on that name."""
    script = tmp_path / "import_over_transformers_5_22.py"
    script.write_text(reimported_with("transformers", "5.22.0")
                      + "import transformers.utils.generic\n"
                      "del transformers.utils.generic.merge_with_config_defaults\n"
                      "import hf_scratch_transformer\n")
    result = run_python([sys.executable, script], cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    assert "ImportError: transformers<5.26,>=5.25 is required, but" in result.stderr, result.stderr[-2000:]
    assert "merge_with_config_defaults" not in result.stderr


def test_the_command_answers_an_environment_out_of_range_in_its_own_words(tmp_path):
    """`hf-scratch` printed the ImportError's whole traceback, the reason on its last line: now the reason and the
    fix alone, exit status 1, as a bad option is answered."""
    script = tmp_path / "run_the_command.py"
    script.write_text(reimported_with("accelerate", "1.14.0")
                      + "from hf_scratch_command import main\nmain(sys.argv[1:])\n")
    result = run_python([sys.executable, script, "train", "--help"], cwd=tmp_path, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    reason, fix = result.stderr.rstrip().splitlines()[-2:]  # under any import-time warnings
    assert reason.startswith("hf-scratch train: error: accelerate>=1.15 is required")
    assert fix.endswith("`pip install 'accelerate>=1.15'` puts back one in range.")


def test_a_release_transformers_refuses_is_answered_before_transformers_is_imported(tmp_path):
    """In a new interpreter, where transformers' own check would run as it is imported: the package's check names
    the range first, so `hf-scratch` answers it in its own two lines, and neither transformers nor torch is imported
    (an environment refused costs no import of either)."""
    script = tmp_path / "run_the_command.py"
    script.write_text("import importlib.metadata as metadata, sys\n"
                      "real = metadata.version\n"
                      "metadata.version = lambda name: '2020.1.8' if name == 'regex' else real(name)\n"
                      "from hf_scratch_command import main\n"
                      "try:\n"
                      "    main(sys.argv[1:])\n"
                      "finally:\n"
                      "    print(sorted({'transformers', 'torch'} & set(sys.modules)))\n")
    result = subprocess.run([sys.executable, script, "finetune", "--help"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    wanted = transformers_floor_of_regex()
    reason, fix = result.stderr.rstrip().splitlines()[-2:]
    assert reason == f"hf-scratch finetune: error: {wanted} is required, but regex 2020.1.8 is installed."
    assert fix.startswith(f"transformers {importlib.metadata.version('transformers')} needs it;")
    assert fix.endswith(f"`pip install '{wanted}'` puts back one in range.")
    assert result.stdout == "[]\n"
