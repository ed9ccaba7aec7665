"""Lab 4, continuous batching: the checks for the learner's scheduling decision, preemption choice and metrics.

- ``continuous_schedule(state) -> SchedulerOutput``: running requests get their next tokens,
  then waiting requests join from the head of the queue while a batch slot, free blocks and the
  token budget allow. Served on the tiny model as the engine's policy, each request's tokens
  compared with the request decoded alone, every decision watched for idle slots and overfull
  batches, and the steps of the lesson's ten replies counted against static batching.
- ``choose_victim(state, request) -> Request``: whom to preempt when the blocks run out. Plugged
  into continuous batching on a pool too small for the workload; every choice must be the newest
  running request (vLLM's), and the tokens must still equal solo decoding.
- ``serving_metrics(trace, slo) -> dict``: mean TTFT, TPOT and ITL (ms) and goodput (requests/s)
  from a seeded trace, checked against ``labkit.metrics.summarize`` on the same trace.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from labkit.engine.request import Request
from labkit.engine.scheduler import policy_from_function
from labkit.engine.state import SchedulerState
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import CheckRequest, random_requests, run_requests, serve
from labkit.labs.common.learner_errors import noting_errors
from labkit.labs.common.shared import rng
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.metrics import summarize
from labkit.sampling_params import SamplingParams
from labkit.trace import RequestRecord, Trace

# The lesson's ten replies (tokens each) and its five seats: 84 steps static, 58 continuous.
TEN_REPLIES = (21, 5, 8, 47, 32, 35, 6, 3, 8, 37)
SEATS = 5

CHECK_DIALS = dict(max_num_seqs=4, num_blocks=20, block_size=4)  # small enough that memory sometimes binds


# labkit's continuous batching, out of reach while a learner's policy is checked (here and in lab 9): the policy
# (and so ChunkedPrefill, its subclass) and the step it starts with; the check's engine runs the learner's policy.
SCHEDULING_ANSWERS = (
    "labkit.engine.scheduler.continuous.ContinuousBatching",
    "labkit.engine.scheduler.base.schedule_running",
)


def check_decisions(decisions: list[dict[str, Any]], chunked: bool = False) -> Mismatch | None:
    """The first decision that overfills the batch or leaves a slot idle while the head of the queue fits."""
    for step, d in enumerate(decisions):
        if d["running"] > d["max_num_seqs"]:
            return Mismatch(
                f"step {step}: {d['running']} requests were running, but max_num_seqs is {d['max_num_seqs']}",
                "Admit a waiting request only while len(state.running) < state.max_num_seqs.",
            )
        fits = d["head_fits_chunk"] if chunked else d["head_fits_whole"]
        if d["running"] < d["max_num_seqs"] and d["waiting"] and fits and not d["preempted"]:
            room = "a chunk of its prompt" if chunked else f"its {d['head_tokens']} prompt tokens"
            return Mismatch(
                f"step {step}: only {d['running']} of {d['max_num_seqs']} slots were in use while "
                f"{d['head']} waited, and {room} had blocks and budget",
                "After scheduling the running requests, keep admitting from the head of state.waiting "
                "(state.admit) while a slot, free blocks and the token budget allow. Waiting for the "
                "whole batch to finish is static batching.",
            )
    return None


def _run_policy(functions, inputs):
    schedule, raised = noting_errors(functions[0])
    return {**serve(inputs["requests"], policy_from_function(schedule), **inputs["dials"]), "raised": raised[:1]}


def _compare_run(expected, got) -> Mismatch | None:
    if got["raised"]:
        record = got["raised"][0]
        hint = 'labkit.hint("lab4.continuous_schedule") shows the next hint.'
        if record["error"] == "OutOfBlocksError":
            hint = "Admit a request only if state.blocks.can_allocate(its id, its tokens) says its blocks are free."
        return raised_mismatch(record, hint)
    return check_decisions(got["decisions"]) or run_failure(got) or compare_with_solo(expected["solo"], got["tokens"])


register(
    Exercise(
        id="lab4.continuous_schedule",
        functions=("continuous_schedule",),
        answers=SCHEDULING_ANSWERS,
        make_inputs=lambda seed: {"requests": random_requests(seed, 14), "dials": CHECK_DIALS},
        run=_run_policy,
        oracle=solo_oracle,
        compare=_compare_run,
        tested="your policy serves 14 seeded requests arriving over time on the tiny model (4 slots, 20 blocks of 4): "
        "never more than max_num_seqs running, no slot idle while the next request fits, and every request's "
        "greedy tokens equal to decoding it alone",
        hint="Running requests first, each given its missing tokens; then newcomers from the head of the queue while "
        'a seat, the blocks and the token budget allow. labkit.hint("lab4.continuous_schedule") shows more.',
        points=2.0,
    )
)


def ten_replies() -> list[CheckRequest]:
    """The lesson's ten replies, all waiting at the start, with short distinct prompts."""
    return [CheckRequest([10 + i, 20 + i, 30 + i], length) for i, length in enumerate(TEN_REPLIES)]


def _ten_replies_steps(policy) -> int:
    """Steps the engine takes for the ten replies; an error in the learner's policy propagates."""
    llm, _ = run_requests(ten_replies(), policy, max_num_seqs=SEATS, num_blocks=64, block_size=16)
    return len(llm.trace.steps)


def _compare_steps(expected, got) -> Mismatch | None:
    if got == expected["continuous"]:
        return None
    return Mismatch(
        f"your policy took {got} steps; static batching takes {expected['static']} and continuous "
        f"batching {expected['continuous']}",
        "A finished request must free its slot for the next one on the very next step: admit "
        "whenever a slot is free, not only when the batch is empty.",
    )


register(
    diagnosed(
        Exercise(
            id="lab4.ten_replies",
            functions=("continuous_schedule",),
            answers=SCHEDULING_ANSWERS,
            make_inputs=lambda seed: None,
            run=lambda functions, inputs: _ten_replies_steps(policy_from_function(functions[0])),
            oracle=lambda inputs: {
                "static": _ten_replies_steps("static"),
                "continuous": _ten_replies_steps("continuous"),
            },
            compare=_compare_steps,
            tested=f"the lesson's ten replies {list(TEN_REPLIES)} on {SEATS} slots take as few steps as continuous "
            "batching allows (static batching takes 84)",
            hint='Admit whenever a slot is free. labkit.hint("lab4.ten_replies") shows more.',
        )
    )
)


# --- lab4.preemption: whom to preempt when blocks run out -------------------------------------

# A pool too small for the workload: 10 blocks of 4 tokens hold 40 tokens, and six requests of
# 6-10 prompt tokens and 10-16 output tokens need up to 25 each. Prefix caching is off, so only
# the learner's choice decides who loses their blocks.
PREEMPT_DIALS = dict(max_num_seqs=4, num_blocks=10, block_size=4, enable_prefix_caching=False)


def preemption_requests(seed: int) -> list[CheckRequest]:
    """Six requests arriving in the first ticks, together needing about three times the pool."""
    return random_requests(seed, 6, prompt_range=(6, 10), output_range=(10, 16), arrival_span=4)


def noting_choices(choose_victim, choices: list[dict[str, Any]]):
    """The learner's ``choose_victim``, for the engine's ``choose_victim=`` seam, noting each choice in ``choices``."""

    def noted(state, request):
        running = [r.request_id for r in state.running]
        victim = choose_victim(state, request)
        choices.append(
            {
                "running": running,
                "scheduling": request.request_id,
                "victim": getattr(victim, "request_id", repr(victim)),
            }
        )
        return victim

    return noted


def oldest(state, request):
    """The opposite choice, for the lab's comparison: the request that has waited longest."""
    return state.running[0]


def recomputed_tokens(llm) -> int:
    """Prompt-phase tokens computed beyond every prompt's first prefill: the price of the preemptions."""
    prefilled = sum(step.num_prefill_tokens for step in llm.trace.steps)
    return prefilled - sum(record.prompt_len for record in llm.trace.requests)


def serve_choosing(requests: list[CheckRequest], choose_victim) -> dict[str, Any]:
    """Serve the requests with the given choice of victim; the run, plus every choice made."""
    choices: list[dict[str, Any]] = []
    run = serve(requests, "continuous", choose_victim=noting_choices(choose_victim, choices), **PREEMPT_DIALS)
    return {**run, "choices": choices}


def full_pool_choices(choose_victim) -> list[dict[str, Any]]:
    """The learner's choice called directly on a full pool of three running requests: once for the newest
    (who must give up its own seat: nobody joined after it), once for the oldest (the newest pays)."""
    choices = []
    for asker in (2, 0):
        blocks = FreeListBlockAllocator(9, 4)
        state = SchedulerState(blocks, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
        requests = [
            Request(f"r{i}", [10 + i] * 12, SamplingParams(max_tokens=8), arrival_time=float(i)) for i in range(3)
        ]
        for request in requests:
            state.add(request)
            state.admit(request, 12)
            request.num_computed_tokens = 12
        victim = choose_victim(state, requests[asker])
        choices.append(
            {
                "running": [r.request_id for r in requests],
                "scheduling": requests[asker].request_id,
                "victim": getattr(victim, "request_id", repr(victim)),
                "direct": True,
            }
        )
    return choices


def choice_mistake(choice: dict[str, Any]) -> str | None:
    """What kind of wrong choice this was (None if it was the newest): not running, itself, oldest, the newest
    but for the asker (who was itself the newest), other."""
    running, victim, scheduling = choice["running"], choice["victim"], choice["scheduling"]
    if victim == running[-1]:
        return None
    if victim not in running:
        return "not running"
    if scheduling == running[-1] and victim == running[-2]:
        # with two running, also the oldest: a later choice tells which rule it was
        return "spared itself or oldest" if victim == running[0] else "spared itself"
    if victim == scheduling and victim == running[0]:
        return "itself or oldest"  # the same request: a later choice tells which rule it was
    return "itself" if victim == scheduling else "oldest" if victim == running[0] else "other"


def check_choices(choices: list[dict[str, Any]]) -> Mismatch | None:
    """The first choice that is not the newest running request, named by its kind of mistake.

    When the request being scheduled is also the oldest, preempting it is both mistakes at once;
    then the first later choice that tells them apart is reported.
    """
    wrong = [(index, choice, choice_mistake(choice)) for index, choice in enumerate(choices)]
    wrong = [entry for entry in wrong if entry[2] is not None]
    if not wrong:
        return None
    ambiguous = ("itself or oldest", "spared itself or oldest")
    index, choice, kind = next((entry for entry in wrong if entry[2] not in ambiguous), wrong[0])
    running, victim, scheduling = choice["running"], choice["victim"], choice["scheduling"]
    if choice.get("direct"):
        where = f"choose_victim(state, {scheduling}) on a full pool (running, oldest first: {running})"
    else:
        where = f"preemption {index + 1} (running, oldest first: {running}; making room for {scheduling})"
    if kind == "not running":
        return Mismatch(
            f"{where}: you chose {victim}, which is not running (it holds no blocks to give back)",
            "Only a request in state.running holds blocks; preempting anyone else frees nothing.",
        )
    if kind == "itself":
        return Mismatch(
            f"{where}: you preempted {scheduling}, the request being scheduled itself, while the newer "
            f"{running[-1]} was running",
            "A request gives up its own seat only when it is the newest one; otherwise the newest pays.",
        )
    if kind == "spared itself":
        return Mismatch(
            f"{where}: you preempted {victim}, the newest request other than {scheduling}; but {scheduling}, the "
            "one asking for room, is itself the newest running request, so it is the victim",
            "Preempt the newest running request even when it is the one asking: return request (the engine then "
            "computes nothing for it this step). Sparing it preempts an older request, which breaks first come, "
            "first served.",
        )
    if kind in ("oldest", "itself or oldest", "spared itself or oldest"):
        return Mismatch(
            f"{where}: you preempted the oldest running request {victim}; vLLM preempts the newest, {running[-1]}",
            "The oldest was promised service first and has the most tokens to recompute; preempting it again and "
            "again can keep it from ever finishing.",
        )
    return Mismatch(
        f"{where}: you preempted {victim}, not the newest running request {running[-1]}",
        "Preempt the request that joined last: the end of state.running.",
    )


def _compare_preemption(expected, got) -> Mismatch | None:
    mismatch = check_choices(got["choices"] + got["direct"])
    if mismatch is not None:
        return mismatch
    failure = run_failure(got)
    if failure is not None:
        return failure
    if not got["preemptions"]:
        return Mismatch(
            "the pool never ran out, so no request was preempted and your choice was never tested",
            "This is the check's fault, not yours: tell your instructor the seed.",
        )
    mismatch = compare_with_solo(expected["solo"], got["tokens"])
    return mismatch.within(f"after {got['preemptions']} preemptions") if mismatch else None


register(
    diagnosed(
        Exercise(
            id="lab4.preemption",
            functions=("choose_victim",),
            answers=("labkit.engine.state.newest",),
            make_inputs=lambda seed: {"requests": preemption_requests(seed)},
            run=lambda functions, inputs: {
                **serve_choosing(inputs["requests"], functions[0]),
                "direct": full_pool_choices(functions[0]),
            },
            oracle=solo_oracle,
            compare=_compare_preemption,
            tested="6 seeded requests on a pool of 10 blocks of 4 (too small for them, so requests are preempted), "
            "continuous batching with your choose_victim: every choice is the newest running request, preemptions "
            "happened, and every request's greedy tokens equal decoding it alone; then two direct calls on a full "
            "pool of three: the newest asking for room is its own victim, the oldest asking makes the newest pay",
            hint="Think of what each running request has already computed, and who was promised service first. "
            'labkit.hint("lab4.preemption") shows more.',
        )
    )
)

# --- lab4.serving_metrics: TTFT, TPOT, ITL and goodput from a trace -----------------------------

METRIC_NAMES = ("ttft_ms", "tpot_ms", "itl_ms", "goodput")


def metrics_trace(seed: int) -> Trace:
    """A seeded trace of 12 finished requests (times in seconds): uneven lengths, a few stalls."""
    r = rng(seed)
    requests = []
    for index in range(12):
        arrival = r.uniform(0.0, 2.0)
        first = arrival + r.uniform(0.05, 0.9)
        times = [first]
        gap = r.uniform(0.02, 0.08)
        for _ in range(r.choice([2, 3, 5, 8, 20, 40]) - 1):
            times.append(times[-1] + gap * r.uniform(0.8, 1.2) + (0.4 if r.random() < 0.05 else 0.0))
        requests.append(
            RequestRecord(f"r{index}", arrival, r.randint(5, 60), arrival + 0.01, times, times[-1], 0, "length")
        )
    return Trace(requests=requests)


def metrics_slo(trace: Trace) -> dict[str, float]:
    """Limits (ms) near the medians, so that some requests meet one limit and miss the other."""
    summary = summarize(trace)
    return {"ttft": round(summary.ttft_ms.median, -1), "tpot": round(summary.tpot_ms.median, 1)}


def metrics_expected(trace: Trace, slo: dict[str, float]) -> dict[str, float]:
    """labkit.metrics' own answer: the means in ms, and goodput in requests per second."""
    summary = summarize(trace, slo)
    return {
        "ttft_ms": summary.ttft_ms.mean,
        "tpot_ms": summary.tpot_ms.mean,
        "itl_ms": summary.itl_ms.mean,
        "goodput": summary.goodput,
    }


def metric_mistakes(trace: Trace, slo: dict[str, float]) -> dict[str, dict[str, float]]:
    """For each metric, the values the typical mistakes give: mistake -> value."""
    records = trace.requests
    duration = max(r.finish_time for r in records) - min(r.arrival_time for r in records)
    right = metrics_expected(trace, slo)
    ttft_s = [r.first_token_time - r.arrival_time for r in records]
    tpot_s = [(r.finish_time - r.first_token_time) / (r.output_len - 1) for r in records]
    any_good = sum(t * 1000 <= slo["ttft"] or p * 1000 <= slo["tpot"] for t, p in zip(ttft_s, tpot_s))
    unit = "seconds, not milliseconds: multiply by 1000"
    return {
        "ttft_ms": {unit: right["ttft_ms"] / 1000},
        "tpot_ms": {
            unit: right["tpot_ms"] / 1000,
            "TPOT included the first token: count the time after the first token, over the tokens after it "
            "(output_len - 1)": float(np.mean([(r.finish_time - r.first_token_time) / r.output_len for r in records]))
            * 1000,
            "TPOT included the first token's wait (from the arrival): TPOT starts at the first token": float(
                np.mean([(r.finish_time - r.arrival_time) / (r.output_len - 1) for r in records])
            )
            * 1000,
        },
        "itl_ms": {
            unit: right["itl_ms"] / 1000,
            "ITL was averaged per request, then over requests: ITL is every gap between two tokens, pooled, so "
            "a long answer's gaps count once each": float(np.mean([np.mean(np.diff(r.token_times)) for r in records]))
            * 1000,
        },
        "goodput": {
            "goodput counted requests that missed one SLO limit: a good request meets every limit": any_good / duration,
            "every request counted as good: were seconds compared with limits in milliseconds?": len(records)
            / duration,
            "goodput is good requests per second of the run (first arrival to last finish), not a count": right[
                "goodput"
            ]
            * duration,
        },
    }


def metrics_inputs(seed: int) -> dict[str, Any]:
    """A seeded trace and SLO on which every typical mistake gives a different number than the right one."""
    for attempt in range(100):
        trace = metrics_trace(seed * 100 + attempt)
        slo = metrics_slo(trace)
        right = metrics_expected(trace, slo)
        if all(
            not math.isclose(wrong, right[name], rel_tol=1e-3)
            for name, mistakes in metric_mistakes(trace, slo).items()
            for wrong in mistakes.values()
        ):
            return {"trace": trace, "slo": slo}
    raise RuntimeError(f"no trace for seed {seed} tells every mistake apart")  # never seen: a bug of the check


def _run_metrics(functions, inputs) -> dict[str, Any]:
    got = functions[0](inputs["trace"], dict(inputs["slo"]))
    if not isinstance(got, dict):
        return {"returned": type(got).__name__}
    return {name: float(got[name]) if isinstance(got.get(name), (int, float)) else None for name in METRIC_NAMES}


def _compare_metrics(expected, got) -> Mismatch | None:
    if "returned" in got:
        return Mismatch(f"serving_metrics returned a {got['returned']}, expected a dict with keys {list(METRIC_NAMES)}")
    for name in METRIC_NAMES:
        want, have = expected["values"][name], got[name]
        if have is None:
            return Mismatch(
                f"the result has no number under {name!r}", f"Return a dict with keys {list(METRIC_NAMES)}."
            )
        if math.isclose(have, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        hint = next(
            (
                mistake
                for mistake, wrong in expected["mistakes"][name].items()
                if math.isclose(have, wrong, rel_tol=1e-6)
            ),
            None,
        )
        return Mismatch(
            f"{name}: expected {want:.4g}, got {have:.4g} (labkit.metrics.summarize on the same trace)", hint
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab4.serving_metrics",
            functions=("serving_metrics",),
            answers=("labkit.metrics.summarize", "labkit.labs.lab4.metrics_expected"),
            make_inputs=metrics_inputs,
            run=_run_metrics,
            oracle=lambda inputs: {
                "values": metrics_expected(inputs["trace"], inputs["slo"]),
                "mistakes": metric_mistakes(inputs["trace"], inputs["slo"]),
            },
            compare=_compare_metrics,
            tested="serving_metrics(trace, slo) on a seeded trace of 12 requests (2 to 40 tokens, a few stalls) "
            "equals labkit.metrics.summarize on the same trace: mean TTFT, TPOT and ITL in ms, goodput in requests/s",
            hint="TTFT ends at the first token; TPOT and ITL look only at what comes after it; goodput counts "
            'requests that meet every limit. labkit.hint("lab4.serving_metrics") shows more.',
        )
    )
)

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

register_hints(
    "lab4.continuous_schedule",
    "Every step is a new decision. Whoever is running keeps going; whoever finished has already left, so their "
    "seats and blocks are free for the next in line right now, not when the whole batch is done.",
    "Two phases. First the running requests, oldest first: reserve room for their missing tokens (a reservation "
    "may preempt someone; skip a request that is no longer RUNNING) and schedule them. Then, unless someone was "
    "preempted, admit from the head of the queue while a seat is free and its whole prompt fits the budget and "
    "the free blocks; stop at the first that does not fit.",
    "state.reserve(request, n, output) returns False if request itself was preempted; "
    "state.blocks.can_allocate(head.request_id, n) and state.admit(head, n); output.scheduled[id] = n; "
    "budget = state.max_num_batched_tokens, minus what you schedule.",
)
register_hints(
    "lab4.ten_replies",
    "This check counts steps. A seat that frees after step 5 should be taken at step 6, not when the batch empties.",
    "If your policy admits only when state.running is empty, it is static batching. Admit whenever "
    "len(state.running) < state.max_num_seqs.",
)
register_hints(
    "lab4.preemption",
    "A preempted request loses its KV blocks and will recompute its prompt and every token it made so far. "
    "Which running request has computed the least? Which was promised service first?",
    "state.running is in the order requests were admitted, oldest first. The request being scheduled may itself "
    "be the best choice, but only when nobody joined after it.",
    "The newest running request is the last one of state.running.",
)
register_hints(
    "lab4.serving_metrics",
    "Every request record has arrival_time, token_times (one per output token, in seconds) and finish_time. "
    "TTFT is the wait for the first token; TPOT and ITL describe the tokens after it; goodput is the rate of "
    "requests that kept every promise.",
    "TTFT = first token time - arrival. TPOT of a request = (finish - first token) / (output_len - 1). ITL pools "
    "every gap between consecutive tokens of every request, then takes one mean. Goodput = requests meeting every "
    "SLO limit / (last finish - first arrival). Limits are in ms, the trace in seconds.",
    "np.mean(np.concatenate([np.diff(r.token_times) for r in trace.requests])) * 1000 is the mean ITL in ms; "
    "good = all(measured_ms[name] <= limit for name, limit in slo.items()).",
)
