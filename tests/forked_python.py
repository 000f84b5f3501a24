"""`run_python`: `subprocess.run` for the suite's Python commands (the CLI modules, `scripts/*.py`,
`crash_injection.py`), each in a process of its own forked from a server that has imported torch, transformers,
Trainer, Accelerate and this package once. A fresh interpreter spends about 5 s importing those before a command
does anything, which was most of the suite's time; a fork starts in milliseconds.

The command runs as under `python -m MODULE ARGS` or `python FILE ARGS`: its own working folder, environment,
`sys.argv`, stdout (block-buffered) and stderr (line-buffered), exit status (a signal's negated, as subprocess gives).
What differs from a fresh interpreter: modules that read the environment as they are imported (torch's thread count,
oneDNN's and MKL's instruction sets, transformers' cache folders) have read the server's, the test process's as it
started the server (conftest.py sets it before any import). So a command whose environment differs from that in any
variable but those read as it runs (`RUNTIME_VARIABLES`) runs in a fresh interpreter, through `subprocess`; where the
difference is the test process's own (a library set a variable there since), a warning names it, as every later
command of that process then runs fresh (5 s each). The server is multiprocessing's forkserver: it has run no torch
operation, so no thread pool is forked.

`with_forked_processes`: the same for the processes that torchrun and `accelerate launch` start (each of a 2-process
run spent 6-8 s importing, and a launch test ran two of them at once on the suite's share of the cores). The launcher
starts `forked_python_client.py` in their place, which stands for its process (its exit status, and the signals it
gets are passed on) while a server forks the process from the forkserver's imports and hands it the client's stdin,
stdout and stderr.
"""

import atexit
import contextlib
import functools
import gc
import io
import json
import multiprocessing
import os
import resource
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from multiprocessing import forkserver
from pathlib import Path

# What every command imports first; the command modules themselves run as they are imported, so they are not here.
PRELOAD = ["hf_scratch_transformer", "hf_scratch_transformer.checkpointing", "hf_scratch_transformer.cli.run_options",
           "hf_scratch_transformer.cli.run_data",
           "hf_scratch_transformer.training", "hf_scratch_transformer.training_data",
           "hf_scratch_transformer.evaluation", "hf_scratch_transformer.mixed_precision", "transformers.trainer",
           "accelerate", "datasets"]
# Read by the commands as they run, not as they are imported: the variables the tests set.
RUNTIME_VARIABLES = ("HF_SCRATCH_", "ACCELERATE_", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "HF_TOKEN",
                     "CRASH_SIGNAL", "COLUMNS",
                     # and those torchrun and `accelerate launch` set for the processes they start
                     "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                     "ROLE_", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_", "TORCH_NCCL_", "FSDP_",
                     # pytest's own (the server was forked in another test); threadpoolctl's, and scikit-learn's
                     # and joblib's (seqeval imports them in the test process: entity scores), which only Intel's
                     # OpenMP reads (torch's CPU wheel loads GNU's). Not listed, KMP_INIT_AT_FORK once made every
                     # later test_accelerate and test_fsdp command of a worker run fresh: the suite took 26 minutes
                     "PYTEST_CURRENT_TEST", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
                     # and those the suite's libraries set in the test process once the server runs, which made
                     # every later command of that process run fresh: inductor's, which it sets in a process right
                     # before it loads a compiled kernel there (test_compile; test_serve and test_fsdp ran fresh
                     # after it), and lm_eval's, set as it is imported (test_ecosystem) and read by huggingface_hub's
                     # import for transfers from the Hub, which no test makes
                     "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "HF_XET_HIGH_PERFORMANCE")
CLIENT = Path(__file__).with_name("forked_python_client.py")
FORKSERVER = multiprocessing.get_context("forkserver")
FORKSERVER.set_forkserver_preload([__name__, *PRELOAD])


def _limit_file_size(size: int) -> None:
    """A write past `size` bytes fails as on a full disk (RLIMIT_FSIZE; Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


def _run_in_child(arguments: list[str], cwd: str, env: dict, stdout: str, stderr: str,
                  limit_file_size: int | None) -> None:
    for descriptor, path in ((1, stdout), (2, stderr)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, descriptor)
        os.close(opened)
    if limit_file_size:
        _limit_file_size(limit_file_size)
    try:
        _run_command(arguments, cwd, env, unbuffered=False)
    finally:  # as the interpreter's exit does (multiprocessing's child ends with os._exit)
        atexit._run_exitfuncs()


def _run_command(arguments: list[str], cwd: str, env: dict, unbuffered: bool) -> None:
    """Run `python ARGUMENTS` (`-m MODULE ...` or `FILE ...`) in this process, on the file descriptors 0-2 it has."""
    # The server's imports, 460k objects, are never garbage: frozen, the full collection that the command's own
    # imports set off leaves them unscanned (0.35 s of every command, 2-core AVX2 host).
    gc.freeze()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if unbuffered:  # as `python -u` has them: text written through to the file descriptor at once
        sys.stdout, sys.stderr = (io.TextIOWrapper(open(descriptor, "wb", buffering=0, closefd=False), errors=errors,
                                                   write_through=True)
                                  for descriptor, errors in ((1, "strict"), (2, "backslashreplace")))
    else:
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
    if arguments[0] == "-m":
        sys.argv = arguments[1:]
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = arguments
        sys.path.insert(0, str(Path(arguments[0]).resolve().parent))
        runpy.run_path(arguments[0], run_name="__main__")


def _read_at_import_and_changed(env: dict, server_env: dict) -> list[str]:
    """The variables that make a command with environment `env` unfit to run in a fork of a server that started with
    `server_env`: those it changes, but for those read as a command runs."""
    return sorted(name for name in env.keys() | server_env.keys()
                  if env.get(name) != server_env.get(name) and not name.startswith(RUNTIME_VARIABLES))


@functools.cache
def _forkserver_environment() -> dict:
    """The environment the forkserver started with, which its forks' imports read: this process's as it starts it."""
    environment = dict(os.environ)
    forkserver.ensure_running()
    return environment


def _warn_of_changes_in_this_process() -> None:
    changed = _read_at_import_and_changed(dict(os.environ), _forkserver_environment())
    if changed:
        warnings.warn(f"{', '.join(changed)} changed in this test process since its fork server started: its "
                      "commands that inherit them run in a fresh interpreter, about 5 s slower each; if no module "
                      "reads them as it is imported, add them to forked_python.RUNTIME_VARIABLES", stacklevel=3)


def run_python(command: list[str], *, cwd: Path, env: dict | None = None, timeout: float,
               limit_file_size: int | None = None) -> subprocess.CompletedProcess:
    """`command`: `[sys.executable, "-m", MODULE, ...]` or `[sys.executable, FILE, ...]`, as for subprocess.run
    (with capture_output=True, text=True); `env` replaces the environment, as there."""
    assert command[0] == sys.executable, f"not a Python command: {command}"
    _warn_of_changes_in_this_process()
    env = dict(os.environ if env is None else env)
    if _read_at_import_and_changed(env, _forkserver_environment()):
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


def forked_command(command: list[str]) -> list[str]:
    """`command` (`[sys.executable, ...]`, run with subprocess.Popen or a launcher) as a client of the server of
    this test process (started at the first call): the same, as `python -u` runs it, forked from the server."""
    assert command[0] == sys.executable, f"not a Python command: {command}"
    path = _server_socket()
    _warn_of_changes_in_this_process()
    return [sys.executable, str(CLIENT), path, *command[1:]]


def with_forked_processes(launcher: list[str]) -> list[str]:
    """`launcher`: torchrun's or `accelerate launch`'s command up to the script (`FILE ...` or `-m MODULE ...`, which
    follow it as before). The processes it starts then run as the launchers run them (`python -u`), forked."""
    no_python = "--no_python" if "accelerate.commands.launch" in launcher else "--no-python"
    return [*launcher, no_python, *forked_command([sys.executable])]


@functools.cache
def _server_socket() -> str:
    """The server's socket path. The socket listens before the server starts, so no client finds it missing."""
    _forkserver_environment()  # its snapshot before the forkserver starts
    folder = tempfile.mkdtemp(prefix="forked-python-")
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    server = FORKSERVER.Process(target=_serve_forks, args=(listener,), name="forked-python-server")
    server.start()
    listener.close()

    def stop() -> None:  # before multiprocessing's own exit handler, which would wait for it
        server.kill()
        server.join()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    return path


def _serve_forks(listener: socket.socket) -> None:
    """For each client that connects: a process forked from here runs its request (or, where its environment would
    have been read at import, the reply `{}` tells the client to run a fresh interpreter instead); the client hears
    the process's pid, then its exit status. A client that dies (killed: a connection that ends before its process)
    takes its process with it, as a fresh interpreter's launcher would take the interpreter, at any instant: the
    launchers' processes are killed at random ones (test_crash_safety), and an error here would end the server and
    leave its processes running."""
    wakeup_read, wakeup_write = os.pipe()
    for descriptor in (wakeup_read, wakeup_write):
        os.set_blocking(descriptor, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that each exit writes the wakeup pipe
    clients: dict[int, socket.socket] = {}  # pid -> the connection of the client that stands for it
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                connection = listener.accept()[0]
                message, descriptors, _, _ = socket.recv_fds(connection, 1 << 20, 3)
                if not message:  # a client killed before its request
                    connection.close()
                    continue
                request = json.loads(message)
                if _read_at_import_and_changed(request["env"], dict(os.environ)):
                    with contextlib.suppress(OSError):  # a client killed since its request
                        connection.send(b"{}")
                    connection.close()
                    for descriptor in descriptors:
                        os.close(descriptor)
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    for open_file in (listener, *clients.values()):
                        open_file.close()
                    for descriptor in (wakeup_read, wakeup_write):
                        os.close(descriptor)
                    _run_forked(request, descriptors, connection)
                for descriptor in descriptors:
                    os.close(descriptor)
                clients[pid] = connection
                selector.register(connection, selectors.EVENT_READ, pid)
                with contextlib.suppress(OSError):  # a client killed since its request: its connection's end is seen
                    connection.send(json.dumps({"pid": pid}).encode())  # next, and kills the process
            elif key.fileobj == wakeup_read:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wakeup_read, 512):
                        pass
                _report_exits(clients, selector)
            else:  # a client's connection is readable only once it ends: the client was killed
                selector.unregister(key.fileobj)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(key.data, signal.SIGKILL)


def _report_exits(clients: dict[int, socket.socket], selector: selectors.BaseSelector) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = clients.pop(pid)
        with contextlib.suppress(KeyError):
            selector.unregister(connection)
        with contextlib.suppress(OSError):  # a client killed meanwhile
            connection.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
        connection.close()


def _run_forked(request: dict, descriptors: list[int], connection: socket.socket) -> None:
    """In the forked process: become the client's `python -u ARGUMENTS` and end as the interpreter would."""
    connection.close()
    os.setsid()  # as the launchers start each process, in a session of its own
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, descriptor in enumerate(descriptors):
        os.dup2(descriptor, target)
        os.close(descriptor)
    code, interrupted = 1, False
    try:
        _run_command(request["arguments"], request["cwd"], request["env"], unbuffered=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException as error:
        frames = error.__traceback__  # from the command's own first frame on, as the interpreter prints it
        while frames.tb_next and frames.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>"):
            frames = frames.tb_next
        sys.excepthook(type(error), error.with_traceback(frames), frames)
        interrupted = isinstance(error, KeyboardInterrupt)
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if interrupted:  # the interpreter ends by SIGINT after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
