"""How fast the simulator runs: 100,000 sale requests through chunked prefill on an H100 cost model.

Usage: taskset -c 0 .venv/bin/python scripts/sim_speed.py   (one core: the speed target is stated for one)
"""

import time

from labkit.sim.cost_model import CostModel, get_model
from labkit.sim.hardware import get_hardware
from labkit.sim.simulator import blocks_that_fit, simulate
from labkit.workloads import sale_workload

hardware, model = get_hardware("h100-sxm"), get_model("llama-3.1-8b")
workload = sale_workload(100_000, rate=40.0, seed=0)
cost = CostModel.from_parts(hardware, model, overhead_s=0.003)
start = time.perf_counter()
trace = simulate(workload, cost, "chunked", num_blocks=blocks_that_fit(hardware, model), max_num_seqs=256)
print(f"{len(workload):,} requests simulated in {time.perf_counter() - start:.1f} s ({len(trace.steps):,} steps)")
