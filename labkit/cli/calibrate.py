"""Calibrate the simulator on this machine: time the engine, fit the cost model, check its predictions.

Runs a short seeded sweep on the real engine, fits bandwidth, arithmetic rate and
per-pass overhead to the step times, saves them under the labkit cache, then serves a
new seeded workload on the engine and in the simulator and prints predicted against
measured output throughput and median TTFT/TPOT::

    labkit calibrate                     # default model, sweep + check, a couple of minutes on a CPU
    labkit calibrate --skip-check        # fit and save only
    labkit calibrate --load --rate 3     # reuse the saved fit, check it on another workload
    labkit calibrate --load --json       # the fit and the check as JSON
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

from labkit.cli import print_json, say_for
from labkit.sim.calibrate import (
    Calibration,
    calibrate_engine,
    calibration_path,
    check_prediction,
    check_workload,
    format_report,
    load_calibration,
    machine_name,
)

MAX_NUM_SEQS = 16  # the sweep's largest batch: the check stays inside what was timed
MAX_MODEL_LEN = 768  # longest prompt plus answer of the sweep and the check, rounded up


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", default="default", help="model to calibrate (default: the course's model)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration sweep (0)")
    parser.add_argument("--check-seed", type=int, default=1, help="seed of the held-out check workload (1)")
    parser.add_argument("--requests", type=int, default=32, help="requests in the check workload (32)")
    parser.add_argument("--rate", type=float, default=2.0, help="their arrival rate, requests/s (2)")
    parser.add_argument("--skip-check", action="store_true", help="fit and save, without the check")
    parser.add_argument("--load", action="store_true", help="reuse the saved calibration instead of timing")
    parser.add_argument(
        "--path",
        help="calibration file to write, or to read with --load "
        "(default: one per machine, model and dtype in the labkit cache)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the calibration and the check as JSON; progress goes to stderr"
    )


def _describe(calibration: Calibration) -> str:
    cost = calibration.cost_model
    return (
        f"{calibration.model} ({calibration.dtype}) on {calibration.machine}, {calibration.device}: "
        f"bandwidth {cost.bandwidth / 1e9:.1f} GB/s ({calibration.bandwidth_source}), arithmetic {cost.flops / 1e9:.1f} GFLOP/s, "
        f"overhead {cost.overhead_s * 1e3:.1f} ms per pass, attention {cost.attention_s_per_token * 1e6:.1f} µs "
        f"per context token beyond its bytes, weights {cost.weight_bytes / 1e6:.0f} MB; "
        f"fitted on {calibration.num_steps} steps, median step error {calibration.median_step_error_pct:.1f}%"
    )


def run(args: argparse.Namespace) -> int:
    from labkit.engine import LLM
    from labkit.models import load_model

    if args.requests < 2 or not args.rate > 0:
        raise ValueError(
            f"--requests {args.requests} --rate {args.rate:g}: need at least 2 requests and a rate above 0 requests/s"
        )
    say = say_for(args)
    model = load_model(args.model)
    blocks = MAX_NUM_SEQS * MAX_MODEL_LEN // 16
    llm = LLM(model, max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN, num_blocks=blocks, block_size=16)
    dtype = str(model.dtype).removeprefix("torch.")
    if args.load:
        path = args.path or calibration_path(machine_name(), model.config.name, dtype)
        calibration = load_calibration(path)
        say(f"loaded {path}")
    else:
        started = time.perf_counter()
        calibration = calibrate_engine(llm, seed=args.seed)
        path = calibration.save(args.path)
        say(f"timed and fitted in {time.perf_counter() - started:.0f} s; saved {path}")
    say(_describe(calibration))
    result = {"path": str(path), "calibration": asdict(calibration)}
    if not args.skip_check:
        workload = check_workload(model.config.vocab_size, args.requests, args.rate, args.check_seed)
        rows, _, _ = check_prediction(llm, calibration.cost_model, workload)
        say(format_report(rows, f"{workload.name}, {args.requests} requests: simulator vs engine"))
        result["check"] = {
            "workload": workload.name,
            "rows": [{**asdict(row), "error_pct": row.error_pct} for row in rows],
        }
    if args.json:
        print_json(result)
    return 0
