"""What serving over HTTP costs: the offline engine against ``labkit serve`` on the same trace, in turns.

    python scripts/serve_overhead.py                      # W1 and W2, 2 rounds
    python scripts/serve_overhead.py --workloads W1 --rounds 3

In one process: (a) the offline engine, ``LLM.generate`` on the trace's chats with the requests'
own sampling (greedy, ``ignore_eos``, each its ``max_new_tokens``), built as ``labkit serve`` builds
its engine (same model, dtype, torch threads, trace window, engine defaults); (b) ``labkit serve``
started as a child process with that dtype, loaded with the same trace by labkit's load tester,
exactly as ``scripts/serve_compare.py`` sends it (every request at t = 0, streamed). The two take
turns within each round, so a machine that gets busier moves both alike; both are warmed up with
the same two requests first, so their prefix caches hold the same at every turn. It prints output tokens per second for each, the
server's share of the offline figure, and a warning if the two produced different token counts.
The goal: the server keeps at least 90% of the offline throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_compare, beside this file

from serve_compare import WORKLOADS, tokens_per_second, trace_workload  # noqa: E402

from labkit.serve.background import ServeProcess  # noqa: E402
from labkit.serve.loadtest import api_base, server_model  # noqa: E402


def offline_engine(dtype: str | None):
    """The engine ``labkit serve`` builds at its defaults (``dtype`` as chosen for it), and the dtype's name."""
    from labkit.device import default_device
    from labkit.engine import LLM
    from labkit.models import load_model
    from labkit.serve.dtype import choose_serving_dtype
    from labkit.serve.serve_cli import TRACE_WINDOW

    choice = choose_serving_dtype(default_device(), dtype)
    llm = LLM(load_model("default", dtype=choice.dtype, progress=False), trace_window=TRACE_WINDOW)
    return llm, str(choice.dtype).removeprefix("torch."), choice.describe()


def offline_tokens_per_second(llm, workload) -> tuple[float, int]:
    """``LLM.generate`` on the workload with the load tester's sampling: tokens per second of wall time, tokens."""
    from labkit.sampling_params import SamplingParams

    params = [SamplingParams(max_tokens=int(s.output_len), temperature=0.0, ignore_eos=True) for s in workload]
    started = time.perf_counter()
    outputs = llm.generate([s.prompt for s in workload], params, use_tqdm=False)
    wall = time.perf_counter() - started
    tokens = sum(len(output.token_ids) for output in outputs)
    return tokens / wall, tokens


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", default="W1,W2", help="which traces: W1, W2 or both")
    parser.add_argument("--dtype", help="as labkit serve's --dtype (default: what labkit serve would choose here)")
    parser.add_argument("--labkit-args", default="", help="more dials for labkit serve, as one string")
    args = parser.parse_args()
    workloads = {name: trace_workload(WORKLOADS[name], name) for name in args.workloads.split(",")}
    llm, dtype, why = offline_engine(args.dtype)
    import torch

    print(f"both compute in {why}, torch threads {torch.get_num_threads()}")
    warm_up = trace_workload(WORKLOADS["W1"], "warm-up")[:2]  # so neither side pays first-call costs in round 1
    server = ServeProcess("--dtype", dtype, *args.labkit_args.split())
    try:
        base = api_base(server.url)
        model = asyncio.run(server_model(base))
        offline_tokens_per_second(llm, warm_up)
        tokens_per_second(server.url, warm_up, model)
        print(f"load average at the start: {load_average()}")
        rows: dict[str, list[tuple[float, float]]] = {name: [] for name in workloads}
        for round_number in range(1, args.rounds + 1):
            for name, workload in workloads.items():
                offline, offline_tokens = offline_tokens_per_second(llm, workload)
                served, served_tokens, errors = tokens_per_second(server.url, workload, model)
                rows[name].append((offline, served))
                note = (
                    ""
                    if served_tokens == offline_tokens
                    else f"  (!) server {served_tokens} tokens, offline {offline_tokens}"
                )
                note += f"  {len(errors)} errors, first: {errors[0]}" if errors else ""
                print(
                    f"round {round_number} {name}: offline {offline:.1f} tok/s, server {served:.1f} tok/s, "
                    f"{served / offline:.1%}{note}",
                    flush=True,
                )
    finally:
        server.stop()
    print(f"load average at the end: {load_average()}\n")
    print("| workload | offline tok/s | labkit serve tok/s | server / offline |")
    print("|---|---|---|---|")
    for name, pairs in rows.items():
        offline = statistics.median(o for o, _ in pairs)
        served = statistics.median(s for _, s in pairs)
        ratios = ", ".join(f"{s / o:.0%}" for o, s in pairs)
        print(f"| {name} | {offline:.1f} | {served:.1f} | {served / offline:.1%} (rounds: {ratios}) |")
    print(f"\nmedians of {args.rounds} rounds; the goal: the server keeps >= 90%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
