"""The suite's fork server (forked_python.py), through the client the launchers run: a command forked from the
server's imports ends as `python -u` would, an environment read at import runs a fresh interpreter, and the server
outlives clients killed at any instant (test_crash_safety kills the launchers' processes at random ones)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from forked_python import forked_command, run_python

# Prints whether it runs in a fork of the server (which has imported torch) and its arguments, then waits if told to.
SCRIPT = """import pathlib, sys, time
print("forked" if "torch" in sys.modules else "fresh", sys.argv[1:], flush=True)
if sys.argv[1:2] == ["wait"]:
    time.sleep(float(sys.argv[2]))
    pathlib.Path(sys.argv[3]).write_text("ran to its end")
sys.exit(3)
"""


def _script(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return str(script)


def _run_script(tmp_path, *arguments: str, env: dict | None = None) -> tuple[int, str]:
    """SCRIPT run through the client as a launcher would: its exit status and what it printed."""
    completed = subprocess.run(forked_command([sys.executable, _script(tmp_path), *arguments]), capture_output=True,
                               text=True, env=env, timeout=120, check=False)
    return completed.returncode, completed.stdout


def test_a_forked_command_ends_as_the_interpreter_would(tmp_path):
    assert _run_script(tmp_path, "a") == (3, "forked ['a']\n")


def test_a_signal_to_the_client_ends_the_forked_process_by_it(tmp_path):
    client = subprocess.Popen(forked_command([sys.executable, _script(tmp_path), "wait", "60", tmp_path / "ended"]),
                              stdout=subprocess.PIPE, text=True)
    assert client.stdout.readline() == f"forked ['wait', '60', '{tmp_path / 'ended'}']\n"
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=30) == -signal.SIGTERM
    assert not (tmp_path / "ended").exists()


@pytest.mark.filterwarnings("error")  # the command's own environment: nothing of the test process's to warn of
def test_an_environment_read_at_import_runs_a_fresh_interpreter(tmp_path):
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}  # read as oneDNN loads
    assert _run_script(tmp_path, env=env) == (3, "fresh []\n")
    completed = run_python([sys.executable, _script(tmp_path)], cwd=tmp_path, env=env, timeout=120)
    assert (completed.returncode, completed.stdout) == (3, "fresh []\n")


def test_a_variable_read_at_import_set_in_the_test_process_runs_fresh_and_warns(monkeypatch, tmp_path):
    """Set in the test process after its server started, a variable read at import ran `run_python`'s commands in a
    fork that had read the server's value (it compared the command's environment with the test process's, not the
    server's); and the launchers' commands ran fresh with no word of why."""
    forked_command([sys.executable])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with pytest.warns(UserWarning, match="^ONEDNN_MAX_CPU_ISA changed in this test process since its fork server"):
        completed = run_python([sys.executable, _script(tmp_path)], cwd=tmp_path, timeout=120)
    assert (completed.returncode, completed.stdout) == (3, "fresh []\n")
    with pytest.warns(UserWarning, match="add them to forked_python.RUNTIME_VARIABLES"):
        assert _run_script(tmp_path) == (3, "fresh []\n")


@pytest.mark.parametrize("variable, value", [("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "140550085463072"),
                                             ("HF_XET_HIGH_PERFORMANCE", "1")])
def test_what_the_suites_libraries_set_in_the_test_process_keeps_commands_forked(monkeypatch, tmp_path, variable,
                                                                                   value):
    """Set in the test process once its server runs (inductor before it loads a compiled kernel, in test_compile;
    lm_eval as it is imported, in test_ecosystem), each made every later command of that process run fresh."""
    forked_command([sys.executable])  # the server started before the variable is set, whichever test runs first
    monkeypatch.setenv(variable, value)
    assert _run_script(tmp_path) == (3, "forked []\n")


def _a_clients_environment() -> dict:
    """The environment a client started from here sends: a subprocess's own, which can differ from `os.environ`
    (under pytest here a subprocess has COLUMNS and LINES, `os.environ` has not)."""
    printed = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(printed)


def test_the_server_outlives_clients_killed_before_their_request_or_its_answer(tmp_path):
    """A client killed after it connected and before its request, and one killed after its request and before it
    heard its process's pid: either ended the server (the next commands ran fresh), and the second one's process ran
    on. Now the server serves on, and the process goes with its client."""
    server = forked_command([sys.executable])[2]
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection:
        connection.connect(server)
    ended = tmp_path / "ended"
    request = {"arguments": [_script(tmp_path), "wait", "2", str(ended)], "cwd": str(tmp_path),
               "env": _a_clients_environment()}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as connection, \
            open(tmp_path / "output", "w+") as output:  # its stdin, stdout and stderr: not the test process's
        connection.connect(server)
        socket.send_fds(connection, [json.dumps(request).encode()], [output.fileno()] * 3)
    assert _run_script(tmp_path) == (3, "forked []\n")
    time.sleep(3)  # the process, had it run on, wrote its file after 2 s
    assert not ended.exists()
