"""What ``deterministic=True`` (batch-invariant kernels) costs, per precision: today's path against it, in one run.

    python scripts/deterministic_cost.py                          # fp32, bf16 and int8, 16 ShareGPT prompts
    python scripts/deterministic_cost.py --precisions fp32,int8 --num-prompts 32 --rounds 3 --out cost.json

Each precision serves the same seeded ShareGPT workload (as ``labkit bench`` does, all arriving at once,
each answering its recorded length) on the default model, with ``deterministic`` off and on, in turns
over ``--rounds`` rounds, so both see the same machine; the table gives each one's median output tok/s
and the ratio, on over off (times on a shared machine move; their ratio, taken in turns, is what holds).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from labkit.engine import LLM, serve_workload
from labkit.metrics import summarize
from labkit.models import load_model
from labkit.workloads import sharegpt_prompts

PRECISIONS = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "int8": ("float32", "int8")}


def measure(precision: str, num_prompts: int, max_prompt: int, max_output: int, rounds: int) -> dict:
    """Median output tok/s with ``deterministic`` off and on, timed in turns."""
    dtype, quantization = PRECISIONS[precision]
    model = load_model("default", dtype=dtype)
    workload = sharegpt_prompts(
        num_prompts, seed=0, tokenizer=model.tokenizer, max_prompt_tokens=max_prompt, max_output_tokens=max_output
    )
    engines = {
        on: LLM(model, quantization=quantization, deterministic=on, max_model_len=max_prompt + max_output)
        for on in (False, True)
    }
    speeds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for deterministic, llm in engines.items():
            speeds[deterministic].append(summarize(serve_workload(llm, workload)).output_throughput)
    today, invariant = statistics.median(speeds[False]), statistics.median(speeds[True])
    return {"precision": precision, "off tok/s": today, "on tok/s": invariant, "on / off": invariant / today}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", default="fp32,bf16,int8")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    print(f"{'precision':<10} {'today tok/s':>11} {'deterministic tok/s':>19} {'ratio':>6}")
    for precision in args.precisions.split(","):
        if precision not in PRECISIONS:
            parser.error(f"unknown precision {precision!r}; use some of {', '.join(PRECISIONS)}")
        row = measure(precision, args.num_prompts, args.max_prompt_tokens, args.max_output_tokens, args.rounds)
        rows.append(row)
        print(f"{precision:<10} {row['off tok/s']:>11.1f} {row['on tok/s']:>19.1f} {row['on / off']:>6.2f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
