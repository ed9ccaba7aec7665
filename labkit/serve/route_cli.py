"""``labkit route``: one OpenAI-compatible address in front of several ``labkit serve`` replicas on this machine.

    labkit route --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002 --policy cache_aware
    labkit route --start 2 --policy cache_aware -- --model default --max-num-seqs 8

Each request to /v1/completions or /v1/chat/completions (streams included) goes to the replica the policy
picks: round_robin (each in turn), least_loaded (fewest requests in flight) or cache_aware (the replica
holding the longest prefix of this prompt, unless it is more than --max-imbalance requests busier than the least
busy one). cache_aware tokenizes each prompt once with the fleet's tokenizer (--model's, or the --model after --)
and knows what each replica holds from its KV events (labkit serve's /kv_events, read before each decision), or,
for a replica that publishes none (or with --no-kv-events), from a shadow index of the prompts it sent there.
A replica that refuses a request before answering has it sent to another; none is served
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
from labkit.serve.router_caches import DEFAULT_BLOCK_SIZE, DEFAULT_INDEX_BLOCKS
from labkit.serve.router_policies import DEFAULT_MAX_IMBALANCE, POLICIES


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
        help=f"cache_aware's load bound: skip a replica more than this many requests busier than the least busy "
        f"({DEFAULT_MAX_IMBALANCE}; 0: only the least busy)",
    )
    parser.add_argument(
        "--model",
        help="cache_aware: the fleet's model, whose tokenizer names the prompt's blocks (default: the --model "
        "given to the replicas after --, else 'default')",
    )
    parser.add_argument(
        "--no-kv-events",
        action="store_true",
        help="cache_aware: ignore the replicas' KV events and guess from the shadow index alone",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE,
        help=f"cache_aware's shadow index: tokens per block, as the replicas' ({DEFAULT_BLOCK_SIZE})",
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
    """The router's shared state for these replica URLs and the command line's policy (cache_aware: with what it
    knows of the caches, and the fleet's tokenizer)."""
    from labkit.engine.fleet import make_router
    from labkit.models.loading import load_tokenizer
    from labkit.serve.router_app import Routing
    from labkit.serve.router_caches import FleetCaches, ShadowIndex
    from labkit.serve.router_prometheus import RouterMetrics

    policy, metrics = make_router(args.policy, args.max_imbalance), RouterMetrics(urls)
    if args.policy != "cache_aware":
        return Routing(urls, policy, None, metrics, args.timeout)
    shadow = ShadowIndex(len(urls), args.block_size, args.index_blocks)
    caches = FleetCaches(urls, shadow, use_events=not args.no_kv_events)
    return Routing(urls, policy, caches, metrics, args.timeout, tokenizer=load_tokenizer(fleet_model(args)))


def fleet_model(args: argparse.Namespace) -> str:
    """The model whose tokenizer the router uses: ``--model``, else the one its replicas are started with."""
    started = None
    for i, arg in enumerate(args.serve_args):
        if arg == "--model" and i + 1 < len(args.serve_args):
            started = args.serve_args[i + 1]
        elif arg.startswith("--model="):
            started = arg.split("=", 1)[1]
    if args.model and started and args.model != started:
        raise ValueError(f"--model {args.model} names another model than the replicas' --model {started}")
    return args.model or started or "default"


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
    fleet_model(args)  # a --model that contradicts the replicas' is said before any replica starts
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
        replicas = f"{len(urls)} replica{'s' * (len(urls) > 1)} ({', '.join(urls)})"
        ready = f"labkit route: {args.policy} over {replicas} on {url_of(sock)}/v1"
        serve_forever(server, sock, ready)
    finally:
        stop_watching.set()
        if started is not None:
            started.stop()
    return 0


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
