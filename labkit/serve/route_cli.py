"""``labkit route``: one OpenAI-compatible address in front of several ``labkit serve`` replicas on this machine.

    labkit route --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002 --policy cache_aware
    labkit route --start 2 --policy cache_aware -- --model default --max-num-seqs 8

Each request to /v1/completions or /v1/chat/completions (streams included) goes to the replica the policy
picks: round_robin (each in turn), least_loaded (fewest requests in flight) or cache_aware (the replica
believed to hold the longest prefix of this prompt, unless it is more than --max-imbalance requests busier than
the least busy one). A replica that refuses a request before answering has it sent to another; none is served
twice. A replica that refuses, dies, drains or fails its health check is ejected at once and readmitted when its
/health answers 200 again. /metrics counts per replica; /health is 200 while one replica is. With --start N the
router starts N ``labkit serve`` replicas itself (the arguments after ``--`` go to each), starts one that exits
again (at most --max-restarts times), and stops them when it stops.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from labkit.serve.replica_procs import DEFAULT_MAX_RESTARTS
from labkit.serve.router_policies import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_INDEX_BLOCKS,
    DEFAULT_MAX_IMBALANCE,
    POLICIES,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--replica", action="append", default=[], metavar="URL", help="a running labkit serve (repeat for each)"
    )
    parser.add_argument("--start", type=int, metavar="N", help="start N labkit serve replicas (args after --)")
    parser.add_argument("--policy", choices=POLICIES, default="round_robin", help="routing policy (round_robin)")
    parser.add_argument(
        "--max-imbalance",
        type=int,
        default=DEFAULT_MAX_IMBALANCE,
        help=f"cache_aware's load bound: skip a replica this many requests busier than the least busy "
        f"({DEFAULT_MAX_IMBALANCE})",
    )
    parser.add_argument(
        "--chunk-chars",
        type=int,
        default=DEFAULT_CHUNK_CHARS,
        help=f"cache_aware's shadow index: characters per block ({DEFAULT_CHUNK_CHARS})",
    )
    parser.add_argument(
        "--index-blocks",
        type=int,
        default=DEFAULT_INDEX_BLOCKS,
        help=f"cache_aware's shadow index: blocks remembered per replica, LRU ({DEFAULT_INDEX_BLOCKS})",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=DEFAULT_MAX_RESTARTS,
        help=f"with --start: times a replica that exits is started again ({DEFAULT_MAX_RESTARTS})",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000; 0 picks a free one)")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds a replica may take to start answering (600)"
    )
    parser.add_argument("serve_args", nargs="*", metavar="-- SERVE_ARGS", help="with --start: labkit serve's options")


def routing_for(urls: list[str], args: argparse.Namespace):
    """The router's shared state for these replica URLs and the command line's policy."""
    from labkit.engine.fleet import make_router
    from labkit.serve.router_app import Routing
    from labkit.serve.router_metrics import RouterMetrics
    from labkit.serve.router_policies import ShadowIndex

    index = ShadowIndex(len(urls), args.chunk_chars, args.index_blocks) if args.policy == "cache_aware" else None
    return Routing(urls, make_router(args.policy, args.max_imbalance), index, RouterMetrics(urls), args.timeout)


def run(args: argparse.Namespace) -> int:
    from labkit.serve.replica_procs import ReplicaProcesses
    from labkit.serve.router_server import make_router_server
    from labkit.serve.uvicorn_thread import serve_forever, url_of

    urls = [url.rstrip("/") for url in args.replica]
    if args.start is None and not urls:
        raise ValueError("give the replicas (--replica URL, repeated) or --start N to start N of them")
    if args.serve_args and args.start is None:
        raise ValueError(f"arguments for labkit serve ({' '.join(args.serve_args)}) need --start N")
    if args.max_restarts < 0:
        raise ValueError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    started = ReplicaProcesses(args.start, args.serve_args) if args.start is not None else None
    stop_watching = threading.Event()
    # uvicorn re-raises the SIGTERM that stopped it once it has drained; as an exception (not the default
    # handler's sudden exit) it lets the replicas started here be stopped too
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if started is not None:
            print(f"labkit route: starting {args.start} labkit serve replicas...", file=sys.stderr, flush=True)
            urls += started.start()
            watch = (stop_watching, args.max_restarts)
            threading.Thread(target=started.watch, args=watch, name="labkit-replicas", daemon=True).start()
        if len(set(urls)) != len(urls):
            raise ValueError(f"a replica is named twice: {' '.join(urls)}")
        server, sock = make_router_server(routing_for(urls, args), args.host, args.port)
        ready = f"labkit route: {args.policy} over {len(urls)} replicas ({', '.join(urls)}) on {url_of(sock)}/v1"
        serve_forever(server, sock, ready)
    finally:
        stop_watching.set()
        if started is not None:
            started.stop()
    return 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
