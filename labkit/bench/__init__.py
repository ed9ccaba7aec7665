"""Benchmark labkit's engine against Hugging Face generate on real ShareGPT prompts.

Five ways to serve the same seeded workload, in one process: (a) HF ``generate`` one
request at a time, (b) HF ``generate`` in static batches of 8, (c) labkit static
batching, (d) labkit continuous batching, (e) labkit continuous batching with chunked
prefill. One table compares them, each relative to (a). ``--sweep`` adds the decode-step
time against batch size, beside the roofline bound of this machine; ``--busy N`` runs it all
while N other cores spin, as on a machine that is not idle. The command is :mod:`labkit.cli.bench`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labkit.metrics import Summary, summarize
from labkit.trace import Trace


@dataclass
class BenchRow:
    name: str
    summary: Summary


def run_bench(
    model,
    num_prompts: int = 64,
    seed: int = 0,
    max_prompt_tokens: int = 512,
    max_output_tokens: int = 128,
    max_num_seqs: int = 64,
    hf_batch_size: int = 8,
    progress: Callable[[str], None] = print,
) -> list[BenchRow]:
    """Serve one workload five ways and summarise each run (see the module docstring); ``progress`` gets status lines."""
    from labkit.bench.hf_baselines import hf_static_batches
    from labkit.workloads import sharegpt_prompts

    workload = sharegpt_prompts(
        num_prompts,
        seed=seed,
        tokenizer=model.tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
    )
    prompts = [_token_ids(model, spec.prompt) for spec in workload]
    lengths = [spec.output_len for spec in workload]
    runs = [
        ("(a) HF generate, one at a time", lambda: hf_static_batches(model, prompts, lengths, 1, "hf-1")),
        (
            f"(b) HF generate, static batches of {hf_batch_size}",
            lambda: hf_static_batches(model, prompts, lengths, hf_batch_size, f"hf-{hf_batch_size}"),
        ),
    ]
    for label, policy in [
        ("(c) labkit static batching", "static"),
        ("(d) labkit continuous batching", "continuous"),
        ("(e) labkit chunked prefill", "chunked"),
    ]:
        runs.append(
            (
                label,
                lambda policy=policy: _labkit_run(
                    model, policy, workload, max_num_seqs, max_prompt_tokens + max_output_tokens
                ),
            )
        )
    rows = []
    for label, run in runs:
        progress(f"running {label} ...")
        rows.append(BenchRow(label, summarize(run())))
    return rows


def _token_ids(model, prompt) -> list[int]:
    from labkit.models.tokens import encode_prompt

    return encode_prompt(model.tokenizer, prompt)


def _labkit_run(model, policy: str, workload, max_num_seqs: int, max_model_len: int) -> Trace:
    from labkit.engine import LLM, serve_workload

    return serve_workload(LLM(model, policy=policy, max_num_seqs=max_num_seqs, max_model_len=max_model_len), workload)


def format_table(rows: list[BenchRow]) -> str:
    """One line per engine: throughput, latency percentiles, batching waste, ratios to row (a)."""
    base = rows[0].summary.output_throughput
    header = (
        f"{'engine':<40} {'out tok/s':>9} {'x (a)':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'TPOT p50':>9} {'TPOT p99':>9} {'slot util':>9} {'padded':>7}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        s = row.summary
        lines.append(
            f"{row.name:<40} {s.output_throughput:>9.1f} {s.output_throughput / base:>6.2f} "
            f"{s.ttft_ms.median:>9.0f} {s.ttft_ms.p99:>9.0f} {s.tpot_ms.median:>9.1f} "
            f"{s.tpot_ms.p99:>9.1f} {s.slot_utilization:>9.2f} {s.padded_slot_steps:>7}"
        )
    lines.append("(times in ms; padded = slot-steps held by sequences that had already finished)")
    return "\n".join(lines)
