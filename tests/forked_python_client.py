"""`python forked_python_client.py SOCKET FILE ARGS` (or `SOCKET -m MODULE ARGS`): what `python -u FILE ARGS` does,
in a process forked from the server listening at SOCKET that forked_python.py's `with_forked_processes` started.
This process stands for the forked one: it passes on the signals it gets and ends with its exit status (by the
same signal where a signal ended it). Where the server has ended, or says the environment would have been
read at import, it becomes a fresh `python -u`. Only the standard library, so that it starts in milliseconds."""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_fresh() -> None:
    os.execv(sys.executable, [sys.executable, "-u", *sys.argv[2:]])


def main() -> None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(sys.argv[1])
    except OSError:  # the server has ended
        run_fresh()
    request = {"arguments": sys.argv[2:], "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
    reply = json.loads(connection.recv(4096))
    if "pid" not in reply:
        connection.close()
        run_fresh()
    for number in FORWARDED:
        signal.signal(number, lambda number, _: os.kill(reply["pid"], number))
    status = json.loads(connection.recv(4096))["status"]
    if status < 0:
        if -status != signal.SIGKILL:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


main()
