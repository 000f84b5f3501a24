"""`run_python`: `subprocess.run` for the suite's Python commands (the CLI modules, `scripts/*.py`,
`crash_injection.py`), each in a process of its own forked from a server that has imported torch, transformers,
Trainer, Accelerate and this package once. A fresh interpreter spends about 5 s importing those before a command
does anything, which was most of the suite's time; a fork starts in milliseconds.

The command runs as under `python -m MODULE ARGS` or `python FILE ARGS`: its own working folder, environment,
`sys.argv`, stdout (block-buffered) and stderr (line-buffered), exit status (a signal's negated, as subprocess gives).
What differs from a fresh interpreter: modules that read the environment as they are imported (torch's thread count,
oneDNN's and MKL's instruction sets, transformers' cache folders) have read the test process's, which conftest.py
sets before any import. So a command whose environment changes any variable but those read as it runs
(`RUNTIME_VARIABLES`) runs in a fresh interpreter, through `subprocess`. The server is multiprocessing's forkserver:
it has run no torch operation, so no thread pool is forked.
"""

import atexit
import multiprocessing
import os
import resource
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

# What every command imports first; the command modules themselves run as they are imported, so they are not here.
PRELOAD = ["hf_scratch_transformer", "hf_scratch_transformer.checkpointing", "hf_scratch_transformer.cli.run_options",
           "hf_scratch_transformer.cli.run_data",
           "hf_scratch_transformer.training", "hf_scratch_transformer.training_data",
           "hf_scratch_transformer.evaluation", "hf_scratch_transformer.mixed_precision", "transformers.trainer",
           "accelerate", "datasets"]
# Read by the commands as they run, not as they are imported: the variables the tests set.
RUNTIME_VARIABLES = ("HF_SCRATCH_", "ACCELERATE_", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "CRASH_SIGNAL",
                     "COLUMNS")
FORKSERVER = multiprocessing.get_context("forkserver")
FORKSERVER.set_forkserver_preload([__name__, *PRELOAD])


def _limit_file_size(size: int) -> None:
    """A write past `size` bytes fails as on a full disk (RLIMIT_FSIZE; Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


def _run_in_child(arguments: list[str], cwd: str, env: dict, stdout: str, stderr: str,
                  limit_file_size: int | None) -> None:
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for descriptor, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, descriptor)
        os.close(opened)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    if limit_file_size:
        _limit_file_size(limit_file_size)
    try:
        if arguments[0] == "-m":
            sys.argv = arguments[1:]
            runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = arguments
            sys.path.insert(0, str(Path(arguments[0]).resolve().parent))
            runpy.run_path(arguments[0], run_name="__main__")
    finally:  # as the interpreter's exit does (multiprocessing's child ends with os._exit)
        atexit._run_exitfuncs()


def run_python(command: list[str], *, cwd: Path, env: dict | None = None, timeout: float,
               limit_file_size: int | None = None) -> subprocess.CompletedProcess:
    """`command`: `[sys.executable, "-m", MODULE, ...]` or `[sys.executable, FILE, ...]`, as for subprocess.run
    (with capture_output=True, text=True); `env` replaces the environment, as there."""
    assert command[0] == sys.executable, f"not a Python command: {command}"
    env = dict(os.environ if env is None else env)
    changed = {name for name in env.keys() | os.environ.keys() if env.get(name) != os.environ.get(name)}
    if not all(name.startswith(RUNTIME_VARIABLES) for name in changed):
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
                              preexec_fn=(lambda: _limit_file_size(limit_file_size)) if limit_file_size else None)
    with tempfile.TemporaryDirectory(prefix="forked-python-") as captured:
        stdout, stderr = Path(captured, "stdout"), Path(captured, "stderr")
        stdout.touch()
        stderr.touch()
        arguments = [str(argument) for argument in command[1:]]
        process = FORKSERVER.Process(target=_run_in_child,
                                     args=(arguments, str(cwd), env, str(stdout), str(stderr), limit_file_size))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout, stdout.read_text(), stderr.read_text())
        return subprocess.CompletedProcess(command, process.exitcode, stdout.read_text(), stderr.read_text())
