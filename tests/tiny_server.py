"""`labkit serve` on the tiny chat model, as a program of its own, for the tests that need a real server process
(run as ``python tests/tiny_server.py --port 0 [--slow] [--late-start] [serve flags]``), and a socket helper."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

TINY_SERVER = Path(__file__).resolve()


def closed_by_server(sock: socket.socket, limit_s: float = 60.0) -> bytes:
    """What the server sent before it closed the connection (the limit only stops a hang)."""
    sock.settimeout(limit_s)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def launch(argv: list[str]) -> None:
    """``labkit serve ARGV`` on the tiny chat model; ``--slow`` makes every step dawdle, ``--late-start``
    makes the engine loop take a second to start (as a big model's warm-up would)."""
    import functools
    import time

    from test_serve import chat_model, slow_attention

    import labkit.engine
    import labkit.models
    from labkit.serve import serve_cli
    from labkit.serve.worker import EngineWorker

    if "--slow" in argv:
        argv.remove("--slow")
        labkit.engine.LLM = functools.partial(labkit.engine.LLM, attention=slow_attention)
    if "--late-start" in argv:
        argv.remove("--late-start")
        start = EngineWorker.start
        EngineWorker.start = lambda self: (time.sleep(1.0), start(self))[1]
    model = chat_model()
    labkit.models.load_model = lambda *args, **kwargs: model
    import argparse

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    sys.exit(serve_cli.run(parser.parse_args(argv)))


if __name__ == "__main__":
    launch(sys.argv[1:])
