"""Running a learner's piece (the scheduling decision, the block allocator, paged attention) inside labkit's engine
on the tiny model, on a clock that ticks once per reading so that a run is the same every time; what came out is
judged by `solo.py` (the grader's) and by the decisions observed right after every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.engine import LLM
from labkit.engine.interfaces import SchedulerPolicy
from labkit.engine.request import RequestStatus
from labkit.engine.scheduler import PolicyBase, SchedulerOutput, SchedulerState, make_policy
from labkit.engine.scheduler import policy_from_function as policy_from_function  # the notebooks import it here
from labkit.grading.attempt import describe_exception
from labkit.labs.common.shared import rng, small_model
from labkit.sampling_params import SamplingParams

MAX_STEPS = 2000  # a run that needs more has a scheduler that stopped making progress


class TickClock:
    """A clock that moves one unit each time it is read: runs do not depend on the machine's speed."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@dataclass(frozen=True)
class CheckRequest:
    """One request of a check: its prompt ids, how many tokens to make, and when it arrives (in ticks)."""

    prompt_ids: list[int]
    max_tokens: int
    arrival: float = 0.0


def observe(state: SchedulerState, plan: SchedulerOutput) -> dict[str, Any]:
    """What a scheduling decision left behind, as plain data, right after the policy returned."""
    head = state.waiting[0] if state.waiting else None
    budget_left = state.max_num_batched_tokens - plan.num_tokens
    decoding = [r.request_id for r in state.running if r.status is RequestStatus.RUNNING and r.is_decoding]
    return {
        "running": len(state.running),
        "waiting": len(state.waiting),
        "max_num_seqs": state.max_num_seqs,
        "budget": state.max_num_batched_tokens,
        # could the head of the queue have joined: whole (no chunking) or as a chunk of what is left?
        "head_fits_whole": head is not None
        and head.num_missing_tokens <= budget_left
        and state.blocks.can_allocate(head.request_id, head.num_missing_tokens),
        "head_fits_chunk": head is not None
        and budget_left > 0
        and state.blocks.can_allocate(head.request_id, min(head.num_missing_tokens, budget_left)),
        "head": head.request_id if head is not None else None,
        "head_tokens": head.num_missing_tokens if head is not None else 0,
        "budget_left": budget_left,
        "scheduled": dict(plan.scheduled),
        "prefill": {rid: n for rid, n in plan.scheduled.items() if not state.requests[rid].is_decoding},
        "decoding_not_scheduled": [rid for rid in decoding if rid not in plan.scheduled],
        "preempted": list(plan.preempted),
    }


class ObservedPolicy(PolicyBase):
    """Any policy, with what each of its decisions left behind noted in ``decisions`` (see :func:`observe`)."""

    def __init__(self, policy: SchedulerPolicy):
        self.policy = policy
        self.name, self.chunked = policy.name, policy.chunked
        self.decisions: list[dict[str, Any]] = []

    def schedule(self, state: SchedulerState) -> SchedulerOutput:
        plan = self.policy.schedule(state)
        self.decisions.append(observe(state, plan))
        return plan


def random_requests(
    seed: int, count: int, prompt_range=(3, 20), output_range=(2, 24), arrival_span: int = 30
) -> list[CheckRequest]:
    """Seeded requests for the tiny model (vocabulary 256), arriving over the first ticks."""
    r = rng(seed)
    arrivals = sorted(r.randint(0, arrival_span) for _ in range(count))
    return [
        CheckRequest([r.randint(2, 255) for _ in range(r.randint(*prompt_range))], r.randint(*output_range), t)
        for t in arrivals
    ]


def run_requests(
    requests: list[CheckRequest], policy: SchedulerPolicy | str = "continuous", model=None, **engine_args
) -> tuple[LLM, dict[str, list[int]]]:
    """Serve the requests (ids r0, r1, ...) on a ticking clock.

    Returns the engine (its trace in ``llm.trace``) and each request's output tokens by id.
    """
    model = model or small_model()
    engine_args.setdefault("max_model_len", 256)
    llm = LLM(model, policy=policy, clock=TickClock(), **engine_args)
    for i, r in enumerate(requests):
        llm.add_request(
            list(r.prompt_ids),
            SamplingParams(max_tokens=r.max_tokens, ignore_eos=True),
            request_id=f"r{i}",
            arrival_time=r.arrival,
        )
    tokens: dict[str, list[int]] = {}
    calls = 0
    while llm.has_unfinished():
        calls += 1
        if calls > MAX_STEPS:
            raise RuntimeError(
                f"the run passed {MAX_STEPS} steps without finishing: does your scheduler "
                "leave running requests unscheduled, or never admit waiting ones?"
            )
        for output in llm.step():
            if output.finished:
                tokens[output.request_id] = output.token_ids
    return llm, tokens


def serve(
    requests: list[CheckRequest], policy: SchedulerPolicy | str = "continuous", model=None, **engine_args
) -> dict[str, Any]:
    """:func:`run_requests`, as plain data: each request's tokens, the step count, preemptions,
    blocks still used at the end, and every decision the policy made, observed.

    If the run fails, ``error`` says how (one line naming the learner's code) and the decisions
    made until then are kept, so a check can point at the step where things first went wrong.
    """
    policy = ObservedPolicy(make_policy(policy))
    try:
        llm, tokens = run_requests(requests, policy, model, **engine_args)
    except NotImplementedError:
        raise  # an unfinished exercise: the check says "not done", not "failed"
    except Exception as error:  # the learner's piece broke the run: judge what happened before
        return {"error": describe_exception(error), "decisions": list(policy.decisions)}
    return {
        "error": None,
        "tokens": [tokens[f"r{i}"] for i in range(len(requests))],
        "steps": len(llm.trace.steps),
        "preemptions": llm.num_preemptions,
        "blocks_used_at_end": llm.state.blocks.num_used_blocks,
        "decisions": list(policy.decisions),
    }
