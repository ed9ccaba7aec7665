"""Disaggregated prefill and decode against chunked prefill on the same GPUs, in the simulator, on the lesson's sale.

    python scripts/disagg_table.py                         # 8, 16 and 24 requests/s, 400 requests each (about a minute)
    python scripts/disagg_table.py --rates 16 --requests 100

Four GPUs of the lesson's sale (Llama 3.1 8B, A100-class, 3 ms per pass) serve its bursty support chats with
1,000-token prompts: all four running chunked prefill (512- and 256-token steps), or split into a prefill and a
decode pool with each request's KV crossing a link (see labkit.sim.disagg). The promise is a token at least every
50 ms. The table shows where the split wins the promise back (decode steps carry no prompt chunks), where it does
not (a slow link, too few prefill GPUs), and that it buys tail latency, not throughput.
"""

from __future__ import annotations

import argparse

from labkit.capacity import sale_fleet_gpu
from labkit.sim.disagg import disaggregation_table, format_table


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="8,16,24", help="request rates to simulate, comma-separated (req/s)")
    parser.add_argument("--requests", type=int, default=400, help="requests per rate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rates = tuple(float(rate) for rate in args.rates.split(","))
    table = format_table(disaggregation_table(rates, num_requests=args.requests, seed=args.seed, **sale_fleet_gpu()))
    print(table)
    return table


if __name__ == "__main__":
    main()
