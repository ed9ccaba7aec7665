"""``labkit loadtest URL``: ``vllm bench serve``'s job against any OpenAI-compatible server.

    labkit serve &                                   # or vllm serve, sglang, llama-server ...
    labkit loadtest http://127.0.0.1:8000 --dataset sale --num-prompts 32 --request-rate 4
    labkit loadtest http://127.0.0.1:8000 --request-rate 1,2,4,8 --promise-ms 100 --plot sweep.png

Streams every request through ``/v1/chat/completions`` with the ``openai`` client and prints
the table ``vllm bench serve`` prints (TTFT, TPOT, ITL, E2EL: mean, median, p99; throughput;
goodput with ``--goodput``). Several rates make a sweep that finds the highest rate whose p99
TPOT stays within ``--promise-ms`` (and p99 TTFT within ``--ttft-promise-ms``, if given).
Prompt lengths come from the server's usage counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from pathlib import Path

from labkit.metrics import parse_slo, summarize
from labkit.serve.loadtest import api_base, best_rate, format_bench, format_sweep, run_load, server_model
from labkit.slo import Promise
from labkit.workloads import DATASETS, make_workload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("url", help="the server, http://host:port (or its .../v1 base)")
    parser.add_argument("--model", help="model id to request (default: the first the server lists)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY", "EMPTY"),
        help="bearer key (default: $OPENAI_API_KEY, else 'EMPTY')",
    )
    parser.add_argument("--dataset", choices=DATASETS, default="sale", help="where prompts come from (sale)")
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per run (32)")
    parser.add_argument(
        "--request-rate", default="inf", help="requests/s, Poisson ('inf': all at once); a comma list sweeps: 1,2,4,8"
    )
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1 = Poisson)")
    parser.add_argument("--max-concurrency", type=int, help="most requests in flight at once (no cap)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrivals (0)")
    parser.add_argument(
        "--max-output-tokens", type=int, default=128, help="cap on the answer lengths of sale and sharegpt (128)"
    )
    parser.add_argument("--random-input-len", type=int, default=64, help="random dataset: prompt tokens (64)")
    parser.add_argument("--random-output-len", type=int, default=32, help="random dataset: answer tokens (32)")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly the intended answer lengths (vLLM's ignore_eos)"
    )
    parser.add_argument("--goodput", nargs="+", metavar="NAME:MS", help="SLO for goodput, e.g. ttft:500 tpot:50")
    parser.add_argument("--promise-ms", type=float, help="p99 TPOT promise a sweep must keep")
    parser.add_argument(
        "--ttft-promise-ms", type=float, help="with --promise-ms: a p99 TTFT limit the sweep must keep as well"
    )
    parser.add_argument("--result-file", help="write the results as JSON here")
    parser.add_argument("--plot", help="with several rates: save p50/p99 TPOT against rate as this image")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of tables")


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--request-rate {text!r}: give numbers of requests/s ('inf' for all at once), "
            "comma-separated for a sweep, e.g. 1,2,4,8"
        ) from None
    if not all(rate > 0 for rate in rates):
        raise ValueError(f"--request-rate {text!r}: every rate must be > 0")
    return rates


def _plain(value):
    """JSON has no NaN: an undefined statistic (no samples) is written as null."""
    return None if isinstance(value, float) and math.isnan(value) else value


def run(args: argparse.Namespace) -> int:
    rates = parse_rates(args.request_rate)
    slo = parse_slo(args.goodput) if args.goodput else None
    if args.plot and len(rates) < 2:
        raise ValueError("--plot draws latency against rate: give several rates, e.g. --request-rate 1,2,4")
    promise = None if args.promise_ms is None else Promise(args.promise_ms, args.ttft_promise_ms)
    base = api_base(args.url)
    model = args.model or asyncio.run(server_model(base, args.api_key))
    summaries, results = {}, []
    for rate in rates:
        workload = make_workload(
            args.dataset,
            args.num_prompts,
            rate,
            args.burstiness,
            args.seed,
            args.max_output_tokens,
            args.random_input_len,
            args.random_output_len,
        )
        trace, errors = asyncio.run(
            run_load(
                base,
                workload,
                model,
                api_key=args.api_key,
                max_concurrency=args.max_concurrency,
                ignore_eos=args.ignore_eos,
            )
        )
        summaries[rate] = summary = summarize(trace, slo)
        results.append({"request_rate": rate, **{k: _plain(v) for k, v in summary.to_dict().items()}, "errors": errors})
        if not args.json:
            print(f"\n{args.dataset}, {args.num_prompts} prompts at {rate:g} req/s against {base} ({model})")
            print(format_bench(summary, args.max_concurrency, errors))
    result = {
        "url": base,
        "model": model,
        "dataset": args.dataset,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "goodput": slo,
        "runs": results,
    }
    if promise is not None:
        result["promise_ms"], result["ttft_promise_ms"] = promise.tpot_ms, promise.ttft_ms
        result["best_rate"] = best_rate(summaries, promise)
    if args.json:
        print(json.dumps(result, indent=2))
    elif len(rates) > 1:
        print("\n" + format_sweep(summaries, promise))
    if args.result_file:
        Path(args.result_file).write_text(json.dumps(result, indent=2))
    if args.plot:
        _plot(summaries, args.promise_ms, args.plot)
    lost = sum(s.num_requests - s.num_completed for s in summaries.values())
    if lost:
        print(f"labkit loadtest: {lost} requests failed (see 'failed:' lines); check the server's log", file=sys.stderr)
    return 1 if lost else 0


def _plot(summaries, promise_ms: float | None, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from labkit.viz.latency import plot_latency_vs_rate

    ax = plot_latency_vs_rate({"served": summaries}, metric="tpot", slo_ms=promise_ms)
    figure = ax.figure
    assert isinstance(figure, Figure), "plot_latency_vs_rate draws on a figure of its own"
    figure.savefig(path, dpi=120, bbox_inches="tight")
