"""What a user who only ran `pip install` has: the wheel built from this checkout, installed into a fresh virtual
environment (its dependencies are the test environment's, reached through a `.pth` file: no download), runs the
main job through the installed `hf-scratch` command from a folder outside the checkout, and the folder it writes
is complete (weights, model card from the packaged template, loss plot) and reloads; `publish --dry-run` accepts it."""

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from importlib.metadata import version
from pathlib import Path

import pytest

from hf_scratch_command import COMMANDS, command_help

ROOT = Path(__file__).resolve().parent.parent


def run(command: list, cwd: Path, env: dict | None = None) -> str:
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """(the fresh environment's bin folder, an environment for running from it)."""
    work = tmp_path_factory.mktemp("installed")
    # Built from a copy: setuptools' build/ folder in a checkout can hold files that no longer exist.
    source = shutil.copytree(ROOT, work / "source", ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "*.egg-info", ".hf_conformance", "__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", work / "dist", source],
        cwd=work)
    wheel = next((work / "dist").glob("hf_scratch_transformer-*.whl"))
    venv.create(work / "env", with_pip=False)
    bin_dir = work / "env" / ("Scripts" if os.name == "nt" else "bin")
    site = Path(run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], work).strip())
    # The test environment's packages (torch, transformers, ...) after the wheel's own: the editable install of
    # this checkout there is a finder that a plain path entry does not load, so the package comes from the wheel.
    (site / "test_environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}
    # Without a PYTHONPATH too: one naming a checkout shows pip its egg-info, the same version, and pip skips the
    # wheel ("already installed"), so the package would not be in the fresh environment.
    run([sys.executable, "-m", "pip", "--python", bin_dir / "python", "install", "--no-deps", "--no-index", "-q",
         wheel], cwd=work, env=env)
    return bin_dir, env


@pytest.mark.slow
def test_the_installed_command_runs_the_main_job_outside_the_checkout(installed, tmp_path):
    bin_dir, env = installed
    # Where `import hf_scratch_transformer` finds it, without importing it (torch and transformers: 10 s)
    where = run([bin_dir / "python", "-c", "import importlib.util; "
                 "print(importlib.util.find_spec('hf_scratch_transformer').origin)"], tmp_path, env)
    assert str(ROOT) not in where and "site-packages" in where, "the package must come from the wheel"
    assert "train-accelerate" in run([bin_dir / "hf-scratch", "--help"], tmp_path, env)
    expected = f"hf-scratch {version('hf-scratch-transformer')}"  # this checkout's, installed editable
    assert run([bin_dir / "hf-scratch", "--version"], tmp_path, env).strip() == expected

    stdout = run([bin_dir / "hf-scratch", "train", "--max-steps", "2", "--batch-size", "2", "--max-length", "32",
                  "--vocab-size", "300", "--max-eval-samples", "4", "--set", "num_hidden_layers=1", "hidden_size=32",
                  "num_attention_heads=2", "intermediate_size=64"], tmp_path, env)  # the embedded default corpus
    folder = tmp_path / "outputs/causal-lm/model"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "loss_curve.png",
                 "modeling_scratch_decoder.py"):
        assert (folder / name).is_file(), name
    assert "tiny_shakespeare" in (folder / "README.md").read_text(), "the card is rendered from the packaged template"
    assert "sample from the reloaded model:" in stdout
    listing = run([bin_dir / "hf-scratch", "publish", folder, "--repo-id", "someone/tiny", "--dry-run"], tmp_path, env)
    assert "model.safetensors" in listing and "README.md" in listing


@pytest.mark.slow
def test_the_accelerate_configs_are_installed(installed, tmp_path):
    """`accelerate launch --config_file` needs the configs of configs/accelerate (FSDP's wrap unit, the CPU launcher):
    installed with the package, `python -m hf_scratch_transformer.configs` prints their folder."""
    bin_dir, env = installed
    folder = Path(run([bin_dir / "python", "-m", "hf_scratch_transformer.configs"], tmp_path, env).strip())
    assert str(ROOT) not in str(folder)
    shipped = sorted(path.name for path in (ROOT / "configs" / "accelerate").glob("*.yaml"))
    assert shipped and sorted(path.name for path in folder.glob("*.yaml")) == shipped
    for name in shipped:
        assert (folder / name).read_text() == (ROOT / "configs" / "accelerate" / name).read_text()


@pytest.mark.slow
def test_the_corpus_the_help_examples_name_is_installed(installed, tmp_path):
    """The tokenizer's help example read data/tinyshakespeare/input.txt, a path only a checkout has: it names
    `python -m hf_scratch_transformer.data`, which prints the installed corpus."""
    bin_dir, env = installed
    corpus = Path(run([bin_dir / "python", "-m", "hf_scratch_transformer.data"], tmp_path, env).strip())
    assert str(ROOT) not in str(corpus)
    assert corpus.read_text() == (ROOT / "data" / "tinyshakespeare" / "input.txt").read_text()


@pytest.mark.slow
def test_the_wheel_declares_its_license_as_an_spdx_expression(installed, tmp_path):
    """`License-Expression` (PEP 639): the `project.license` table that setuptools deprecates, and stops building
    on 2027-02-18, gave only the free-text `License` field. The license's text travels with it (Apache-2.0 asks
    every copy to carry it): the checkout had none, so neither had the wheel."""
    bin_dir, env = installed
    license = run([bin_dir / "python", "-c", "from importlib.metadata import files, metadata; "
                   "print(metadata('hf-scratch-transformer')['License-Expression']); "
                   "print(next(f for f in files('hf-scratch-transformer') if f.name == 'LICENSE').read_text())"],
                  tmp_path, env)
    expression, text = license.split("\n", 1)
    assert expression == "Apache-2.0" and "Apache License" in text and "Version 2.0" in text


@pytest.mark.slow
def test_the_installed_help_examples_name_no_file_outside_the_users_folder(installed, tmp_path):
    """`hf-scratch train --help` named ../shared/data/multi30k/train.en, a file of the project's own workspace that no
    installed user has. Each command's help (its installed module's docstring, read without importing torch) names
    no path above the folder the command runs in."""
    bin_dir, env = installed
    site = Path(run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path,
                    env).strip())
    for name, (module, _) in COMMANDS.items():
        path = site.joinpath(*module.split("."))
        source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"
        help_text = command_help(ast.get_docstring(ast.parse(source.read_text())))
        assert "hf-scratch" in help_text or "python -m" in help_text, f"{name}: no examples in {source}"
        assert "../" not in help_text, f"hf-scratch {name} --help:\n{help_text}"


def test_the_sdist_carries_what_its_tests_scripts_and_docs_need(tmp_path):
    """setuptools' sdist held tests/test_*.py but not conftest.py, the tiny-model helpers, scripts/, docs/ or the
    Makefile (and the constraints.txt it installs with): 31 of 33 test modules failed to import in an unpacked sdist.
    MANIFEST.in grafts them in."""
    source = shutil.copytree(ROOT, tmp_path / "source", ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "build", "*.egg-info", ".hf_conformance", "__pycache__", "*.pyc"))
    run([sys.executable, "-c", "from setuptools import build_meta; build_meta.build_sdist('dist')"], cwd=source)
    with tarfile.open(next((source / "dist").glob("*.tar.gz"))) as sdist:
        carried = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    needed = {"Makefile", "constraints.txt"} | {path.relative_to(source).as_posix()
                                                for folder in ("tests", "scripts", "docs")
                                                for path in (source / folder).rglob("*") if path.is_file()}
    assert needed - carried == set()
