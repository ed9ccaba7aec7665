"""Side by side: labkit serve and any OpenAI-compatible server, the same traces, one client, in turns.

    python scripts/serve_compare.py --labkit                          # labkit serve at its defaults
    python scripts/serve_compare.py --labkit --url llama=http://127.0.0.1:8080 --rounds 3

Each round sends W1 (32 short chats) and W2 (64 ShareGPT conversations) to every system in turn
(systems interleaved, so a machine that gets busier moves them all alike): every request at t = 0,
greedy, ``ignore_eos`` so each produces exactly its ``max_new_tokens``, streamed through labkit's
load tester (the official ``openai`` client). It prints output tokens per second, the median over
rounds, and each system's ratio to the first; it warns when a system produced another number of
tokens than the trace asks for (then the comparison is not fair). The load average is printed at
the start and the end: say it beside the figures.

Start the other servers yourself (llama-server, vLLM, ``transformers serve``) with the same model;
``--labkit-args "--max-num-seqs 64"`` passes dials to labkit serve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import time
from pathlib import Path

from labkit.serve.background import ServeProcess
from labkit.serve.loadtest import api_base, run_load, server_model
from labkit.workloads import replay_workload

TRACES = Path(__file__).parent / "traces"
WORKLOADS = {"W1": TRACES / "w1_trace32.json", "W2": TRACES / "w2_sharegpt64.json"}


def trace_workload(path: Path, name: str):
    """A trace file as a labkit workload: every request at t = 0, its messages and its answer length."""
    requests = json.loads(path.read_text())["requests"]
    return replay_workload(
        [0.0] * len(requests),
        [sum(len(m["content"]) for m in r["messages"]) // 4 for r in requests],  # a rough length, for the record
        [r["max_new_tokens"] for r in requests],
        prompts=[r["messages"] for r in requests],
        name=name,
    )


def tokens_per_second(url: str, workload, model: str) -> tuple[float, int, list[str]]:
    """Send the workload at once; return output tokens per second of wall time, the tokens and the errors."""
    started = time.perf_counter()
    trace, errors = asyncio.run(run_load(api_base(url), workload, model, ignore_eos=True))
    wall = time.perf_counter() - started
    tokens = sum(record.output_len for record in trace.requests if record.output_len)
    return tokens / wall, tokens, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labkit", action="store_true", help="start labkit serve (at its defaults) as a system")
    parser.add_argument("--labkit-args", default="", help="dials for labkit serve, as one string")
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="another server")
    parser.add_argument("--model", default=None, help="model name to send (default: what each server lists)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="W1,W2", help="which traces: W1, W2 or both")
    args = parser.parse_args()
    systems: dict[str, str] = {}
    server = None
    if args.labkit:
        server = ServeProcess(*shlex.split(args.labkit_args))
        systems["labkit serve"] = server.url
    for item in args.url:
        name, _, url = item.partition("=")
        if not url:
            parser.error(f"--url wants NAME=URL, got {item!r}")
        systems[name] = url
    if not systems:
        parser.error("nothing to compare: give --labkit and/or --url NAME=URL")
    workloads = {name: trace_workload(WORKLOADS[name], name) for name in args.workloads.split(",")}
    expected = {name: sum(spec.output_len for spec in workload) for name, workload in workloads.items()}
    models = {name: args.model or asyncio.run(server_model(api_base(url))) for name, url in systems.items()}
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    speeds: dict[tuple[str, str], list[float]] = {}
    try:
        for round_number in range(1, args.rounds + 1):
            for workload_name, workload in workloads.items():
                for system, url in systems.items():
                    speed, tokens, errors = tokens_per_second(url, workload, models[system])
                    speeds.setdefault((system, workload_name), []).append(speed)
                    note = (
                        ""
                        if tokens == expected[workload_name]
                        else f"  (!) {tokens} tokens, the trace asks {expected[workload_name]}"
                    )
                    note += f"  {len(errors)} errors, first: {errors[0]}" if errors else ""
                    print(f"round {round_number} {workload_name} {system}: {speed:.0f} tok/s{note}")
    finally:
        if server is not None:
            server.stop()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    first = next(iter(systems))
    print("| workload | " + " | ".join(systems) + " |")
    print("|---|" + "---|" * len(systems))
    for workload_name in workloads:
        medians = {system: statistics.median(speeds[(system, workload_name)]) for system in systems}
        cells = [
            f"{medians[s]:.0f} tok/s" + ("" if s == first else f" ({medians[first] / medians[s]:.2f}x)")
            for s in systems
        ]
        print(f"| {workload_name} | " + " | ".join(cells) + " |")
    print(f"\n(x): {first} over that system, medians of {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
