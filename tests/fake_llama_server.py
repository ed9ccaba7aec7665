"""A stand-in for llama-server in tests: llama-server's command line and ready line, labkit's tiny model behind.

It writes the arguments it was given to the file named by ``FAKE_LLAMA_RECORD`` (one JSON list a line),
says ``listening on http://127.0.0.1:PORT`` as llama-server does, and serves the tiny chat model of
``test_serve`` through ``labkit serve`` on that port, under the ``--alias`` name. The real binary is
never needed in CI.
"""

import argparse
import json
import os
import socket
import sys

from tiny_server import launch

if __name__ == "__main__":
    with open(os.environ["FAKE_LLAMA_RECORD"], "a") as record:
        record.write(json.dumps(sys.argv[1:]) + "\n")
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", required=True)
    parser.add_argument("--alias", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    known, _rest = parser.parse_known_args()  # -np, -c, -t, --no-webui: llama-server's business
    if not os.path.isfile(known.m):
        sys.exit(f"fake llama-server: no model at {known.m}")
    port = known.port
    if port == 0:
        with socket.socket() as probe:
            probe.bind((known.host, 0))
            port = probe.getsockname()[1]
    print(f"main: listening on http://{known.host}:{port}", file=sys.stderr, flush=True)
    launch(["--host", known.host, "--port", str(port), "--served-model-name", known.alias])
