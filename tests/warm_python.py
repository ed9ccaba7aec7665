"""A Python that starts warm, for tests that run many short Python commands: torch imported once, not per command.

``python tests/warm_python.py serve FOLDER`` imports the heavy libraries (torch, transformers, pytest), writes
FOLDER/python, prints ``ready`` and serves until killed. FOLDER/python takes a Python command line (``-c CODE``,
``-m MODULE``, ``-`` or a script, each with its own arguments) and hands it, with its environment, working directory
and standard streams, to the server, which runs it in a fork of itself; it exits with the command's status, as
``python ARGS...`` would. Any other command line, or no server to reach, runs the real interpreter. In a command,
``sys.executable`` is FOLDER/python, so the Pythons it starts (a compiler's child process) start warm too.

A fork shares with the server only the modules imported already, and those saw the server's environment. So
nothing of labkit's is imported in advance (it reads LABKIT_* and switches Triton's interpreter on at import), nor
Triton (it reads that switch at import), and nothing touches CUDA (a CUDA context does not survive a fork).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import threading
import types

HEAVY = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "nbformat", "pytest", "xdist")
LAUNCHER = '#!/bin/sh\nexec {python} -S {client} {socket} "$@"\n'  # -S: the client needs nothing but the stdlib


def _run(args: list[str]) -> None:
    """``python ARGS`` in this process: sys.argv and sys.path as the interpreter sets them."""
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    if args[0] == "-m":
        sys.path[:1] = [os.getcwd(), *entries]
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] in ("-c", "-"):
        sys.path[:1] = ["", *entries]
        code, name = (args[1], "<string>") if args[0] == "-c" else (sys.stdin.read(), "<stdin>")
        sys.argv = ["-c", *args[2:]] if args[0] == "-c" else args
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(code, name, "exec"), main.__dict__)
    else:
        sys.path[:1] = [os.path.dirname(os.path.abspath(args[0])), *entries]
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")


def _status_of(args: list[str]) -> int:
    """Run ``python ARGS`` and end as the interpreter would (threads joined, atexit run, streams flushed), with its
    exit status, but without tearing down every module torch brought in: seconds a process, and nothing to see."""
    try:
        _run(args)
        status = 0
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else 0 if exit.code is None else 1
        if not isinstance(exit.code, int | None):
            print(exit.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return status


def _run_one(conn: socket.socket, launcher: str) -> None:
    """Receive a command (its standard streams as file descriptors, then its request), run it in a fork that takes
    the client's streams, directory and environment, and send back its exit status."""
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    chunks = []
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
    request = json.loads(b"".join(chunks))
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.executable = launcher
        os._exit(_status_of(request["argv"]))
    for fd in fds:
        os.close(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    conn.sendall(str(code if code >= 0 else 128 - code).encode())


def _reap(*_) -> None:
    """Collect the runners that have ended: so the CPU time of their commands counts as the server's children's."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _stop(*_) -> None:
    """On SIGTERM: wait for the runners still going, then end."""
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    os._exit(0)


def serve(folder: str) -> None:
    """Import the heavy libraries, then run each command handed over, each in a runner of its own (so a command
    may start another), until killed."""
    for name in HEAVY:
        __import__(name)
    path = os.path.join(folder, "server")
    launcher = os.path.join(folder, "python")
    with open(launcher, "w") as file:
        file.write(LAUNCHER.format(python=sys.executable, client=os.path.abspath(__file__), socket=path))
    os.chmod(launcher, 0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, _stop)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the runner waits for its command
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            listener.close()
            _run_one(conn, launcher)
            os._exit(0)
        conn.close()


def client(path: str, args: list[str]) -> int:
    """Run ``python ARGS`` in the server at ``path``; its exit status."""
    served = args and (args[0] in ("-c", "-m") and len(args) > 1 or args[0] == "-" or not args[0].startswith("-"))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not served:
            raise ConnectionRefusedError("a command line the server does not take")
        conn.connect(path)
    except OSError:
        os.execv(sys.executable, [sys.executable, *args])  # the real interpreter (the client's own)
    socket.send_fds(conn, [b"x"], [0, 1, 2])
    conn.sendall(json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode())
    conn.shutdown(socket.SHUT_WR)
    chunks = []
    while chunk := conn.recv(64):
        chunks.append(chunk)
    return int(b"".join(chunks) or b"1")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
