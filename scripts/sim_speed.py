"""How fast the simulator runs: 100,000 sale requests through chunked prefill on an H100 cost model.

Usage: taskset -c 0 .venv/bin/python scripts/sim_speed.py [--requests 100000]   (one core: the speed target is stated for one)
"""

from __future__ import annotations

import argparse
import time

from labkit.sim.cost_model import CostModel, get_model
from labkit.sim.hardware import get_hardware
from labkit.sim.simulator import blocks_that_fit, simulate
from labkit.workloads import sale_workload


def main(argv: list[str] | None = None) -> float:
    """Simulate the requests, print how long it took, and return the seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="sale requests to simulate")
    args = parser.parse_args(argv)
    hardware, model = get_hardware("h100-sxm"), get_model("llama-3.1-8b")
    workload = sale_workload(args.requests, rate=40.0, seed=0)
    cost = CostModel.from_parts(hardware, model, overhead_s=0.003)
    start = time.perf_counter()
    trace = simulate(workload, cost, "chunked", num_blocks=blocks_that_fit(hardware, model), max_num_seqs=256)
    seconds = time.perf_counter() - start
    print(f"{len(workload):,} requests simulated in {seconds:.1f} s ({len(trace.steps):,} steps)")
    return seconds


if __name__ == "__main__":
    main()
