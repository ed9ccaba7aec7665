"""Benchmark labkit's engine against Hugging Face generate on real ShareGPT prompts: the same seeded workload
served five ways in one process, one table comparing them (the command, and the five ways, are
:mod:`labkit.cli.bench`'s)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labkit.metrics import Summary, summarize


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
    """Serve one workload five ways and summarise each run (see :mod:`labkit.cli.bench`); ``progress`` gets status
    lines."""
    from labkit.bench.hf_baselines import hf_static_batches
    from labkit.engine import LLM, serve_workload
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
    max_model_len, rows = max_prompt_tokens + max_output_tokens, []
    engines: list[tuple[str, int | str]] = [  # HF generate's batch size, or labkit's scheduler policy
        ("(a) HF generate, one at a time", 1),
        (f"(b) HF generate, static batches of {hf_batch_size}", hf_batch_size),
        ("(c) labkit static batching", "static"),
        ("(d) labkit continuous batching", "continuous"),
        ("(e) labkit chunked prefill", "chunked"),
    ]
    for label, engine in engines:
        progress(f"running {label} ...")
        if isinstance(engine, int):
            trace = hf_static_batches(model, prompts, lengths, engine, f"hf-{engine}")
        else:
            llm = LLM(model, policy=engine, max_num_seqs=max_num_seqs, max_model_len=max_model_len)
            trace = serve_workload(llm, workload)
        rows.append(BenchRow(label, summarize(trace)))
    return rows


def _token_ids(model, prompt) -> list[int]:
    from labkit.models.tokens import encode_prompt

    return encode_prompt(model.tokenizer, prompt)


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
