"""Lab 9 under the grader: most checks need no network, and the loopback the rest use exists in the sandbox.

The grader runs each submission in a bubblewrap sandbox with a network namespace of its own.
Three checks judge the learner's functions without a socket (scripted clients, stored scrapes,
replayed load tests); two (the learner's policy behind a server, their SLO sweep) and the
notebook's own cells start ``labkit serve`` on 127.0.0.1, which works because the namespace has
its own loopback. The whole graded run is tests/test_grading_labs.py's.
"""

import socket
import subprocess
import sys

import pytest

from labkit.grading import sandbox
from labkit.grading.feedback import evaluate
from labkit.grading.result import PASS

pytestmark = pytest.mark.lab9


def test_the_checks_open_no_socket(monkeypatch):
    from test_lab9_checks import dashboard, engine_turn, highest_rate

    def refuse(*args, **kwargs):
        raise AssertionError("a lab 9 check opened a socket")

    monkeypatch.setattr(socket.socket, "__init__", refuse)
    for exercise_id, function in (
        ("lab9.engine_turn", engine_turn),
        ("lab9.dashboard", dashboard),
        ("lab9.highest_rate", highest_rate),
    ):
        result = evaluate(exercise_id, function, seed=7)
        assert result.status == PASS, result.message


LOOPBACK_ROUND_TRIP = """
import socket
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
client.sendall(b"ping")
print(peer.recv(4).decode())
"""


@pytest.mark.skipif(bool(sandbox.sandbox_problem()), reason="no bubblewrap sandbox on this machine")
def test_loopback_works_inside_the_graders_sandbox():
    uid = sandbox.sandbox_uid(0)
    with sandbox.sandbox_folder(uid) as folder:
        command = sandbox.sandbox_command(folder, uid, sandbox.Limits(memory_bytes=None, cpu_seconds=60))
        done = subprocess.run(
            [*command, sys.executable, "-c", LOOPBACK_ROUND_TRIP], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ping"
