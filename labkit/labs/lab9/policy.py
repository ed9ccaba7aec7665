"""Lab 9, exercise 2: the learner's lab 4 ``continuous_schedule``, judged by lab 4's check first, then as the policy
of a real ``labkit serve`` (:mod:`~labkit.labs.lab9.engine_loop`)."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, get_exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import raised_mismatch
from labkit.labs.hints import register_hints
from labkit.labs.lab4 import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.lab9.engine_loop import joined_mid_run, policy_inputs, policy_oracle, serve_clients

LAB4_POLICY = "lab4.continuous_schedule"
# The kernel's half of lab 4's check, held here: the run goes to the kernel with it, and no check is registered there.
_LAB4_RUN = get_exercise(LAB4_POLICY).run


def _policy_inputs(seed: int) -> dict[str, Any]:
    return {**policy_inputs(seed), "lab4": get_exercise(LAB4_POLICY).make_inputs(seed)}


def _run_policy(functions, inputs) -> dict[str, Any]:
    """Lab 4's check run first (the tiny model on a pool small enough that memory binds), then the server:
    a policy that breaks there (raises, say, for admitting without free blocks) never gets a server."""
    lab4 = _LAB4_RUN(functions, inputs["lab4"])
    if lab4["raised"] or lab4.get("error") or check_decisions(lab4["decisions"]) is not None:
        return {"lab4": lab4}
    return {"lab4": lab4, **serve_clients(functions[0], inputs)}


def _policy_oracle(inputs) -> dict[str, Any]:
    return {**policy_oracle(inputs), "lab4": get_exercise(LAB4_POLICY).oracle(inputs["lab4"])}


def _compare_policy(expected, got) -> Mismatch | None:
    """Lab 4's check first; then the server's answers, its decisions, and what it left behind."""
    problem = get_exercise(LAB4_POLICY).compare(expected["lab4"], got["lab4"])
    if isinstance(problem, Mismatch):
        return Mismatch(f"in lab 4's check run: {problem.difference}", problem.hint)
    if got["raised"]:
        return raised_mismatch(got["raised"][0], 'Fix it in lab 4 first; labkit.hint("lab9.continuous_schedule").')
    return _answers_as_alone(expected, got) or check_decisions(got["decisions"]) or _batched_and_freed(got)


def _answers_as_alone(expected, got) -> Mismatch | None:
    """Every client read what the model says decoding its prompt alone (up to a near-tie)."""
    for index, (answer, want) in enumerate(zip(got["answers"], expected["answers"])):
        if answer["error"] is not None:
            return Mismatch(f"client {index} got an error from the server: {answer['error']}")
        text, settled = answer["text"], want["settled"] if want["near_tie"] else want["text"]
        if text != want["text"] and not (want["near_tie"] and text.startswith(settled)):
            return Mismatch(
                f"client {index} read {text!r}; decoded alone, the model says {want['text']!r}",
                "Serving must not change what a request says: every running request gets exactly its missing "
                "tokens (num_missing_tokens), and a newcomer is admitted with blocks for its whole prompt.",
            )
    return None


def _batched_and_freed(got) -> Mismatch | None:
    """A later client joined a batch already decoding, and no block was held once every answer was over."""
    if not joined_mid_run(got["decisions"]):
        return Mismatch(
            "no client's request ever joined while another was decoding: each waited for the batch to drain",
            "That is static batching. Let a waiting request in at the next step whenever a seat, its blocks and "
            "the token budget allow, while the others keep decoding.",
        )
    if got["blocks_used_at_end"]:
        return Mismatch(f"every answer was over, yet {got['blocks_used_at_end']} KV blocks were still held")
    return None


register(
    Exercise(
        id="lab9.continuous_schedule",
        functions=("continuous_schedule",),
        answers=SCHEDULING_ANSWERS,
        make_inputs=_policy_inputs,
        run=_run_policy,
        oracle=_policy_oracle,
        compare=_compare_policy,
        tested="lab 4's check first (the tiny model, 20 KV blocks, so memory binds), then your policy runs a real "
        "labkit serve (the course model, 4 seats) on a free loopback port; six clients stream greedy completions "
        "over HTTP, 50 ms apart: every text equals the prompt decoded alone, no seat idles while the next request "
        "fits, later clients join a batch already decoding, no block is held at the end",
        hint="Paste the continuous_schedule that passed lab 4's check; if it did there, it passes here.",
    )
)

register_hints(
    "lab9.continuous_schedule",
    "This is lab 4's first exercise, unchanged: the server's engine calls your policy once per step, whoever the "
    "requests came from.",
    "Open lab 4, copy the body of the continuous_schedule that passed its check into this cell.",
    "Running requests first (state.reserve, their num_missing_tokens), then admit from the head of state.waiting "
    "while len(state.running) < state.max_num_seqs, the token budget and state.blocks.can_allocate allow.",
)
