"""Build the tree of Hugging Face's own common model tests that `tests/test_hf_conformance.py` runs.

The test files come from the PyPI source distribution of the *installed* `transformers` (the wheel ships no
tests); nothing upstream is committed here. The tree is built under `<repo>/.hf_conformance/` (git-ignored):

    .hf_conformance/
        dl/transformers-<version>.tar.gz       the sdist, kept so that a rebuild needs no download
        transformers-<version>-<key>/          the tree root: put it on sys.path
            hf_upstream_tests/                 the sdist's `tests/`, as a package, plus stubs
            src/transformers -> installed package

The upstream package is renamed from `tests` to `hf_upstream_tests` (absolute `tests.` imports and paths are
rewritten) because this repository has its own `tests/` directory. `<key>` hashes this file, so editing the
stubs below rebuilds the tree; an existing tree for the same version and key is reused as is.

Usage: `python tests/conformance/setup_hf_tests.py [--cache DIR]` prints the tree root.
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from filelock import FileLock

PACKAGE = "hf_upstream_tests"
DEFAULT_CACHE = Path(__file__).resolve().parents[2] / ".hf_conformance"

# Files that the mixins import but the sdist does not ship, replaced by the little they need.
STUBS = {
    # GenerationTesterMixin lives in tests/generation/test_utils.py, which is only in the GitHub repository.
    "generation/test_utils.py": '''\
class GenerationTesterMixin:
    """Stub: upstream tests/generation/test_utils.py is not in the sdist."""
''',
    # ExportTesterMixin is a base of ModelTesterMixin; its tests are @slow torch.export / ONNX / ExecuTorch runs.
    "exporters/test_export.py": '''\
class ExportTesterMixin:
    """Stub: upstream tests/exporters/test_export.py is not in the sdist."""


class ExportGenerateTesterMixin:
    """Stub: upstream tests/exporters/test_export.py is not in the sdist."""
''',
    # Upstream this module also holds tests that import `httpx`; ConfigTester only needs this dict.
    "utils/test_configuration_utils.py": '''\
config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
''',
    # Multi-process helpers of the tensor-parallel / FSDP / expert-parallel mixins.
    "distributed_testing_utils.py": '''\
import unittest


def _skip(*args, **kwargs):
    raise unittest.SkipTest("distributed tests need tests/distributed_testing_utils.py, which the sdist lacks")


run_distributed = _start_rank_processes = _get_distributed_backend = _get_distributed_device_type = _skip
_get_rank_device = _set_rank_device = _skip
''',
    # Lists the tiny Hub checkpoints of the pipeline tests; empty, as they cannot run offline.
    "utils/tiny_model_summary.json": "{}\n",
}

# `tests` as a package or path name (`from tests.x`, "tests.pipelines...", "tests/utils/..."), not as a word.
_TESTS_REFERENCE = re.compile(r"(?<![\w.])tests(?=[./]\w)")


class SetupError(RuntimeError):
    """The tree could not be built (typically: the sdist could not be downloaded)."""


def installed_transformers() -> tuple[str, Path]:
    import transformers

    return transformers.__version__, Path(transformers.__file__).resolve().parent


def tree_root(cache: Path = DEFAULT_CACHE) -> Path:
    version, _ = installed_transformers()
    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return Path(cache) / f"transformers-{version}-{key}"


def _download_sdist(version: str, dest: Path) -> Path:
    sdist = dest / f"transformers-{version}.tar.gz"
    if sdist.is_file():
        return sdist
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
        "--timeout", "30", "-q", "-d", str(dest), f"transformers=={version}",
    ]
    # pip reads the sdist's metadata, which needs setuptools. Use the environment's own if it has one (no extra
    # download); virtual environments of Python >= 3.12 have none, and then pip fetches it into an isolated one.
    for extra in (["--no-build-isolation"], []):
        result = subprocess.run(command + extra, capture_output=True, text=True, check=False)
        if result.returncode == 0 and sdist.is_file():
            return sdist
    raise SetupError(
        f"`pip download transformers=={version}` (sdist) failed with exit code {result.returncode}: "
        f"{(result.stderr or result.stdout).strip()[-1000:] or '(no output)'}"
    )


def _extract_tests(sdist: Path, version: str, package_dir: Path) -> None:
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(sdist) as archive, tempfile.TemporaryDirectory() as scratch:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        if not any(m.name.endswith("/test_modeling_common.py") for m in members):
            raise SetupError(f"{sdist.name} has no tests/test_modeling_common.py")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
        archive.extractall(scratch, members=members, **safe)
        shutil.copytree(Path(scratch) / prefix, package_dir)


def _rename_package(package_dir: Path) -> None:
    for path in package_dir.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        renamed = _TESTS_REFERENCE.sub(PACKAGE, text)
        if renamed != text:
            path.write_text(renamed, encoding="utf-8")


def _add_stubs_and_links(root: Path, package_dir: Path, transformers_dir: Path) -> None:
    for relative, content in STUBS.items():
        path = package_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    for directory in [package_dir, *(p for p in package_dir.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()
    # test_pipeline_mixin.py imports `<root>/src/transformers` with `direct_transformers_import`.
    (root / "src").mkdir()
    (root / "src" / "transformers").symlink_to(transformers_dir, target_is_directory=True)


def build(cache: Path = DEFAULT_CACHE) -> Path:
    """Return the tree root, building it first if needed. Raises `SetupError` when that is impossible."""
    cache = Path(cache)
    root = tree_root(cache)
    if (root / PACKAGE / "test_modeling_common.py").is_file():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    # The test workers (pytest-xdist) import this at once: one downloads and builds, the others wait and reuse.
    with FileLock(cache / ".build.lock"):
        if (root / PACKAGE / "test_modeling_common.py").is_file():
            return root
        _build_tree(cache, root)
    return root


def _build_tree(cache: Path, root: Path) -> None:
    version, transformers_dir = installed_transformers()
    sdist = _download_sdist(version, cache / "dl")
    # Build next to the final place, then rename: an interrupted build leaves no half tree.
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache))
    staging.chmod(0o755)
    try:
        package_dir = staging / PACKAGE
        try:
            _extract_tests(sdist, version, package_dir)
        except (tarfile.TarError, EOFError) as error:
            sdist.unlink(missing_ok=True)  # a truncated download: fetch it again next time
            raise SetupError(f"{sdist} is not a readable archive: {error}") from error
        _rename_package(package_dir)
        _add_stubs_and_links(staging, package_dir, transformers_dir)
        os.rename(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for stale in cache.glob("transformers-*-*"):  # trees of other versions or older stubs
        if stale.is_dir() and stale != root:
            shutil.rmtree(stale, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="cache directory (default: %(default)s)")
    args = parser.parse_args()
    try:
        print(build(args.cache))
    except SetupError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
