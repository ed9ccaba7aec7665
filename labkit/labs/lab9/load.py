"""Lab 9's sweep as the notebook and its capacity check both run it: the rates, the load each rate sends, the
server's dials, and the promise, relative to what one user alone sees on the same server (a GPU is far faster than
two CPU cores)."""

from __future__ import annotations

import statistics

from labkit.serve.background import measure

# Requests per second, each twice the last. The sweep starts at 2: at 1 the six requests overlap hardly more than at
# 2, and their arrivals alone took 6 s, the sweep's longest load, run twice a notebook (the demo and the check).
RATES = (2.0, 4.0, 8.0, 16.0, 32.0)
LOAD = dict(num_prompts=6, input_len=64, output_len=16)  # what every rate of the sweep sends
SERVER_DIALS = dict(policy="continuous", max_num_seqs=4, max_model_len=512, num_blocks=256)
TTFT_FACTOR, TPOT_FACTOR = 5.0, 3.0  # TPOT: a p99 of six is a maximum, and it moves 2x with noise alone
METRICS = ("ttft_ms", "tpot_ms")


def alone(url: str, repeats: int = 3) -> dict[str, float]:
    """What one user alone sees: the median TTFT and TPOT of ``repeats`` single requests of the sweep's shape.

    One full batch of the sweep's shape runs first, unmeasured: the first batches after a start are
    slow (memory is allocated, kernels picked), and would count against the lowest rate.
    """
    measure(url, RATES[-1], **{**LOAD, "num_prompts": SERVER_DIALS["max_num_seqs"]})
    runs = [measure(url, 8.0, **{**LOAD, "num_prompts": 1})[0] for _ in range(repeats)]
    return {metric: statistics.median(run[metric] for run in runs) for metric in METRICS}


def promise_for(url: str) -> dict[str, float]:
    """The sweep's promise on this server: p99 TTFT and TPOT limits in ms, relative to one user alone."""
    seen = alone(url)
    return {"ttft_ms": round(TTFT_FACTOR * seen["ttft_ms"], 1), "tpot_ms": round(TPOT_FACTOR * seen["tpot_ms"], 1)}
