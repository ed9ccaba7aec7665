"""The planner's text tables: a plan numbered row by row as in the lesson, and a fleet sizing.

Rendering only: every figure comes worked out in the :class:`~labkit.capacity.planner.CapacityPlan`
or :class:`~labkit.capacity.fleet.FleetSizing`; ``str()`` of either prints what this module makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.sim.hardware import GB, TB, TFLOPS

if TYPE_CHECKING:
    from labkit.capacity.fleet import FleetOption, FleetSizing
    from labkit.capacity.planner import CapacityPlan

MS = 1e3


def render_plan(plan: CapacityPlan) -> str:
    """The plan's table: what fits, how fast and how much, the promise, and the fleet when there is one."""
    sections = [_memory_rows(plan), _speed_rows(plan), _promise_rows(plan)]
    if plan.gpus > 1:
        sections.append(_fleet_rows(plan))
    lines = _title(plan)
    for section in sections:
        lines += ["", *section]
    return "\n".join(lines)


def render_fleet(sizing: FleetSizing) -> str:
    """One line per tensor-parallel size tried: the load a replica carries, the replicas and GPUs, or why not."""
    example = next(o.plan for o in sizing.options if o.plan is not None)
    kept = "within the promise" if example.promise_s is not None else "at the request ceiling"
    return "\n".join(
        [
            f"Fleet for {_rate(sizing.load_per_s)} requests/s {kept}: {example.model.name} on {example.hardware.name}",
            "(napkin estimate from the cost model, not a measurement)",
            "",
            f"{'GPUs per replica':>16}  {'load per replica':>18}  {'in flight':>9}  {'replicas':>8}  {'GPUs':>5}  note",
            *(_fleet_option_row(o, o is sizing.best) for o in sizing.options),
        ]
    )


def _fleet_option_row(option: FleetOption, best: bool) -> str:
    if option.plan is None:
        return f"{option.tensor_parallel:>16}  {'-':>18}  {'-':>9}  {'-':>8}  {'-':>5}  {option.why_not}"
    replica = option.plan
    in_flight = replica.conversations if replica.promise_in_flight is None else replica.promise_in_flight
    return (
        f"{option.tensor_parallel:>16}  {_rate(replica.carried_load_per_s) + ' req/s':>18}  {in_flight:>9,.0f}  "
        f"{option.replicas:>8,}  {option.gpus:>5,}  {'fewest GPUs' if best else ''}"
    )


def _title(plan: CapacityPlan) -> list[str]:
    n = plan.tensor_parallel
    fleet = "" if plan.gpus == 1 else f" ({plan.replicas:,} x {n} GPU{'s' if n > 1 else ''})"
    return [
        f"Capacity plan: {plan.model.name} on {plan.hardware.name}{fleet}",
        "(napkin estimate from the four-constant cost model, not a measurement)",
        f"(every GPU rated alike: arithmetic at an achievable {plan.hardware.flops / TFLOPS:.3g} TFLOP/s, half the "
        f"datasheet peak or a measured rate; bandwidth {plan.hardware.bandwidth / TB:.3g} TB/s as given)",
    ]


def _memory_rows(plan: CapacityPlan) -> list[str]:
    """Part 1, rows 1 to 5: memory less weights, divided by one conversation's KV cache."""
    m, n, per_gpu = plan.model, plan.tensor_parallel, _per_gpu(plan)
    return [
        "Part 1: how many conversations fit",
        _row(
            1,
            "usable memory",
            f"{plan.gpu_memory_bytes / GB:,.0f} GB x {plan.memory_fraction:.2f}",
            f"{plan.gpu_memory_bytes * plan.memory_fraction / GB:,.1f} GB",
        ),
        _row(
            2,
            "left for KV caches" + per_gpu,
            f"minus {plan.weight_bytes_per_gpu / GB:,.1f} GB of weights" + (f" (1/{n})" if n > 1 else ""),
            f"{plan.kv_budget_bytes / GB:,.1f} GB",
        ),
        _row(3, "KV per token" + per_gpu, _kv_formula(plan), f"{plan.kv_bytes_per_token_per_gpu / 1024:,.0f} KiB"),
        _row(
            4,
            "KV per conversation" + per_gpu,
            f"{plan.prompt_len + plan.answer_len:,} tokens"
            + (
                ""
                if m.sliding_window is None
                else f", {m.sliding_layers} of {m.layers} layers hold {m.sliding_window:,} at most"
            ),
            f"{plan.kv_bytes_per_conversation / 1e6:,.0f} MB",
        ),
        _row(5, "conversations that fit", "row 2 / row 4, rounded down", f"{plan.conversations:,}"),
    ]


def _kv_formula(plan: CapacityPlan) -> str:
    """Row 3's sum: keys and values per KV head, or the latent and RoPE key of multi-head latent attention."""
    m, n = plan.model, plan.tensor_parallel
    if m.kv_lora_rank is not None:
        where = "latent on every GPU" if n > 1 else "MLA latent"
        return f"{m.layers} x ({m.kv_lora_rank} + {m.qk_rope_head_dim}) x {m.kv_bytes_per_value:g} B, {where}"
    kv_heads = round(m.kv_heads * plan.kv_bytes_per_token_per_gpu / m.kv_bytes_per_token)  # on each GPU
    return f"2 x {m.layers} x {kv_heads} x {m.head_dim} x {m.kv_bytes_per_value:g} B" + (
        f" ({kv_heads} of {m.kv_heads} heads)" if n > 1 else ""
    )


def _speed_rows(plan: CapacityPlan) -> list[str]:
    """Part 2: the decode step, then what it gives per request, per second and per dollar."""
    return ["Part 2: how fast, and how much", *_decode_step_rows(plan), *_throughput_rows(plan)]


def _decode_step_rows(plan: CapacityPlan) -> list[str]:
    """Row 6: a full batch's step, the larger of its memory and arithmetic terms plus overhead and talk."""
    m, n, per_gpu = plan.model, plan.tensor_parallel, _per_gpu(plan)
    return [
        _row(6, "decode step, all on board", f"mean context {plan.mean_context:,.0f} tokens", ""),
        *_experts_rows(plan),
        _row(
            "",
            "  memory term" + per_gpu,
            f"({plan.decode_weight_read_bytes_per_gpu / GB:,.1f} + {plan.kv_read_bytes_per_gpu / GB:,.1f} GB KV) / "
            f"{plan.hardware.bandwidth / TB:.3g} TB/s",
            f"{plan.decode_memory_s * MS:.1f} ms",
        ),
        _row(
            "",
            "  arithmetic term" + per_gpu,
            f"{plan.conversations:,} x 2 x {m.active / 1e9:.3g}e9"
            + (f" / {n}" if n > 1 else "")
            + f" / {plan.hardware.flops / TFLOPS:.3g} TFLOP/s",
            f"{plan.decode_compute_s * MS:.1f} ms",
        ),
        *_allreduce_rows(plan),
        _row(
            "",
            "  step",
            f"the larger + {plan.overhead_s * MS:.1f} ms overhead" + (" + all-reduce" if n > 1 else ""),
            f"{plan.decode_step_s * MS:.1f} ms",
        ),
    ]


def _experts_rows(plan: CapacityPlan) -> list[str]:
    """A mixture's weights read in a full step: the experts its batch touches, of all of them; none when dense."""
    m = plan.model
    if plan.experts_touched is None:
        return []
    return [
        _row(
            "",
            "  experts touched per layer",
            f"{m.experts} x (1 - (1 - {m.experts_per_token}/{m.experts})^{plan.conversations:,})",
            f"{plan.experts_touched:,.1f} of {m.experts}",
        )
    ]


def _allreduce_rows(plan: CapacityPlan) -> list[str]:
    """The all-reduces of a split replica's step; none on one GPU."""
    n = plan.tensor_parallel
    if n == 1:
        return []
    return [
        _row(
            "",
            "  all-reduce",
            f"{plan.model.layers} x 2 x 2({n}-1)/{n} x {plan.conversations:,} x {plan.hidden_size:,} x 2 B "
            f"/ {plan.hardware.interconnect_bandwidth / GB:,.0f} GB/s",
            f"{plan.decode_allreduce_s * MS:.2f} ms",
        )
    ]


def _throughput_rows(plan: CapacityPlan) -> list[str]:
    """Rows 7 to 11: GPU time per request, the ceiling, tokens/s and the price; then what batching buys."""
    return [
        _row(7, "prefill", f"{plan.prompt_len:,} tokens, weights + attention", f"{plan.prefill_s * MS:.1f} ms"),
        _row("", "  of which attention", *_attention_cells(plan)),
        _row(
            8,
            "GPU time per request",
            f"prefill + {plan.answer_len:,} x step / {plan.conversations:,}",
            f"{plan.gpu_s_per_request * MS:.1f} ms",
        ),
        _row(9, "request ceiling", "1 / row 8", f"{_rate(plan.request_ceiling_per_s)} req/s"),
        _row(10, "output tokens/s", f"row 9 x {plan.answer_len:,}", f"{plan.tokens_per_s:,.0f}"),
        _row(11, "cost per million tokens", _price_formula(plan), _price_value(plan)),
        _row(
            "",
            "single-stream bound",
            ("bandwidth / active weight bytes" if plan.model.is_moe else "bandwidth / weight bytes") + _per_gpu(plan),
            f"{plan.single_stream_tokens_per_s:,.1f} tok/s",
        ),
        _row("", "batching buys", "row 10 / single stream", f"{plan.speedup_over_single_stream:.1f}x"),
        _row(
            "",
            "critical batch",
            "arithmetic = the experts' weights read, solved"
            if plan.model.is_moe
            else "flops / bandwidth x bytes per param / 2",
            f"{plan.critical_batch:,.0f} tokens",
        ),
    ]


def _attention_cells(plan: CapacityPlan) -> tuple[str, str]:
    """Row 7's attention arithmetic: 2 x layers x heads x head_dim x L x (L + 1) FLOPs, or why it is missing."""
    if plan.prefill_attention_s is None:
        return "not counted: the model names no query_heads", "-"
    return "2 x layers x heads x head_dim x L(L+1)", f"{plan.prefill_attention_s * MS:.1f} ms"


def _promise_rows(plan: CapacityPlan) -> list[str]:
    """Part 3: the time between a user's tokens, and, given a promise, the load that keeps it."""
    rows = [
        "Part 3: the promise to users",
        _row(
            "",
            "decode share of GPU time",
            f"{plan.decode_s_per_request * MS:.1f} / {plan.gpu_s_per_request * MS:.1f} ms",
            f"{plan.decode_share:.0%}",
        ),
        _row("", "time between a user's tokens", "step / decode share", f"{plan.token_interval_s * MS:.0f} ms"),
    ]
    if plan.promise_s is None:
        return rows
    return [
        *rows,
        _row(
            "",
            "load that keeps the promise",
            f"a token every {plan.promise_s * MS:.0f} ms or sooner",
            f"{_rate(plan.promise_load_per_s)} req/s",
        ),
        _row("", "conversations in flight", "load x answer x promise", f"{plan.promise_in_flight:,.0f}"),
        _row("", "capacity the promise costs", "1 - load / ceiling", f"{plan.promise_capacity_cost:.0%}"),
    ]


def _fleet_rows(plan: CapacityPlan) -> list[str]:
    """Part 4: the replicas' GPUs, ceiling, tokens/s and load within the promise, added up."""
    r = plan.replicas
    rows = [
        f"Part 4: the fleet, {r:,} replica(s) of {plan.tensor_parallel} GPU(s)",
        _row("", "GPUs", f"{r:,} x {plan.tensor_parallel}", f"{plan.gpus:,}"),
        _row("", "request ceiling", f"{r:,} x row 9", f"{_rate(plan.fleet_request_ceiling_per_s)} req/s"),
        _row("", "output tokens/s", f"{r:,} x row 10", f"{plan.fleet_tokens_per_s:,.0f}"),
    ]
    if plan.promise_s is None:
        return rows
    return [
        *rows,
        _row(
            "", "load that keeps the promise", f"{r:,} x the replica's", f"{_rate(plan.fleet_promise_load_per_s)} req/s"
        ),
    ]


def _per_gpu(plan: CapacityPlan) -> str:
    """What a label adds when the figures are one GPU's share of a split replica."""
    return ", per GPU" if plan.tensor_parallel > 1 else ""


def _price_formula(plan: CapacityPlan) -> str:
    if plan.price_per_gpu_hour is None:
        return "no price given"
    gpus = "" if plan.tensor_parallel == 1 else f" x {plan.tensor_parallel}"
    return f"${plan.price_per_gpu_hour:.2f}/h{gpus} / 3600 / row 10 x 1e6"


def _price_value(plan: CapacityPlan) -> str:
    return "-" if plan.cost_per_million_tokens is None else f"${plan.cost_per_million_tokens:.3f}"


def _rate(per_s: float) -> str:
    return f"{per_s:,.1f}" if per_s >= 1 else f"{per_s:.2g}"


def _row(number: int | str, label: str, formula: str, value: str) -> str:
    return f"{number!s:>3}  {label:<30} {formula:<46} {value:>14}"
