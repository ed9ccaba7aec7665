"""Lab 4, the preemption choice: whom to preempt when the blocks run out (vLLM's answer: the newest running request),
a wrong choice named by its kind; the notebook's comparison with the oldest uses the names it exports."""

from __future__ import annotations

from typing import Any

from labkit.engine.request import Request
from labkit.engine.state import SchedulerState
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import CheckRequest, random_requests, serve
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.sampling_params import SamplingParams

# A pool too small for the workload: 10 blocks of 4 tokens hold 40 tokens, and six requests of
# 6-10 prompt tokens and 10-16 output tokens need up to 25 each. Prefix caching is off, so only
# the learner's choice decides who loses their blocks.
PREEMPT_DIALS = dict(max_num_seqs=4, num_blocks=10, block_size=4, enable_prefix_caching=False)


def preemption_requests(seed: int) -> list[CheckRequest]:
    """Six requests arriving in the first ticks, together needing about three times the pool."""
    return random_requests(seed, 6, prompt_range=(6, 10), output_range=(10, 16), arrival_span=4)


def _choice(running: list[Request], request: Request, victim: Any) -> dict[str, Any]:
    """One choice as plain data: who was running (oldest first), who asked for room, and who was chosen."""
    ids = [r.request_id for r in running]
    return {"running": ids, "scheduling": request.request_id, "victim": getattr(victim, "request_id", repr(victim))}


def noting_choices(choose_victim, choices: list[dict[str, Any]]):
    """The learner's ``choose_victim``, for the engine's ``choose_victim=`` seam, noting each choice in ``choices``."""

    def noted(state, request):
        running = list(state.running)
        victim = choose_victim(state, request)
        choices.append(_choice(running, request, victim))
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
        choices.append({**_choice(requests, requests[asker], victim), "direct": True})
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
    problem = check_choices(got["choices"] + got["direct"]) or run_failure(got)
    if problem is not None:
        return problem
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

register_hints(
    "lab4.preemption",
    "A preempted request loses its KV blocks and will recompute its prompt and every token it made so far. "
    "Which running request has computed the least? Which was promised service first?",
    "state.running is in the order requests were admitted, oldest first. The request being scheduled may itself "
    "be the best choice, but only when nobody joined after it.",
    "The newest running request is the last one of state.running.",
)
