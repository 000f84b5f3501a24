"""Importing the package refuses an environment whose installed releases fall outside its ranges (installed over it
by a later `pip install`), naming the requirement and the command that mends it."""

import importlib.metadata
import subprocess
import sys

import pytest

from hf_scratch_transformer.installed_dependencies import check_installed_dependencies


def installed_instead(monkeypatch, name: str, version: str) -> None:
    """importlib.metadata answers `version` for distribution `name`, the truth for every other."""
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda asked: version if asked == name else real(asked))


def test_the_environment_of_the_suite_is_in_range():
    check_installed_dependencies()


@pytest.mark.parametrize(("name", "version", "wanted"), [
    ("tokenizers", "0.23.2", "tokenizers>=0.23.3"),  # loses the overflow of truncated texts
    ("accelerate", "1.14.0", "accelerate>=1.15"),  # a resumed run departs from the uninterrupted one
    ("transformers", "5.25.0", "transformers<5.25,>=5.23"),  # a minor release the suite has not passed with
])
def test_a_release_out_of_range_stops_the_import_with_the_fix(monkeypatch, name, version, wanted):
    installed_instead(monkeypatch, name, version)
    with pytest.raises(ImportError, match=rf"{wanted} is required .* but found {name}=={version}\.\n"
                                          rf"hf-scratch-transformer needs it; .* `pip install '{wanted}'`"):
        check_installed_dependencies()


def test_the_extras_ranges_are_left_to_whoever_installs_them(monkeypatch):
    installed_instead(monkeypatch, "openai", "0.1.0")  # the `test` extra asks for >= 1.99.1
    check_installed_dependencies()


def test_importing_the_package_runs_the_check():
    script = ("import importlib.metadata as metadata\n"
              "real = metadata.version\n"
              "metadata.version = lambda name: '1.14.0' if name == 'accelerate' else real(name)\n"
              "import hf_scratch_transformer\n")
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "ImportError: accelerate>=1.15 is required" in result.stderr


@pytest.mark.parametrize("name", ["train", "convert"])
def test_the_command_answers_an_environment_out_of_range_in_its_own_words(tmp_path, name):
    """`hf-scratch` printed the ImportError's whole traceback, the reason on its last line: now the reason and the
    fix alone, exit status 1, as a bad option is answered."""
    script = ("import importlib.metadata as metadata, sys\n"
              "real = metadata.version\n"
              "metadata.version = lambda name: '1.14.0' if name == 'accelerate' else real(name)\n"
              "from hf_scratch_command import main\n"
              "main(sys.argv[1:])\n")
    result = subprocess.run([sys.executable, "-c", script, name, "--help"], cwd=tmp_path, check=False,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    reason, fix = result.stderr.rstrip().splitlines()[-2:]  # under torch's and torchao's import-time warnings
    assert reason.startswith(f"hf-scratch {name}: error: accelerate>=1.15 is required")
    assert fix.endswith("`pip install 'accelerate>=1.15'` puts back one in range.")
