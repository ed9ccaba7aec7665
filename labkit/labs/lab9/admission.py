"""Lab 9, exercise 4: ``admit(queue, promise_ms)``, admission control, checked on queue snapshots with known
answers; each typical wrong rule is computed too, so a learner whose answers match one is told which mistake it is."""

from __future__ import annotations

import math
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.hints import register_hints
from labkit.serve.admission import QueueSnapshot, predicted_wait_s, retry_after

# (name, running, waiting, max_num_seqs, service_s, promise_ms)
SITUATIONS = (
    ("free seats", 3, 0, 8, 2.0, 1000.0),
    ("nothing measured yet", 8, 30, 8, None, 1000.0),
    ("at the promise", 8, 3, 8, 2.0, 1000.0),
    ("one place too many", 8, 4, 8, 2.0, 1000.0),
    ("four seats, one waiting", 4, 0, 4, 6.0, 2000.0),
    ("a full house", 8, 6, 8, 2.0, 1000.0),
    ("far over", 8, 40, 8, 2.0, 1000.0),
    ("a small server", 2, 13, 2, 0.4, 1500.0),
)


WRONG_RULES = {
    "the newcomer is not counted": "the newcomer needs a seat too: with it, running + waiting + 1 people want "
    "max_num_seqs seats, so it is running + waiting + 1 - max_num_seqs -th in line",
    "one seat at a time": "max_num_seqs seats free up in parallel, together one every service_s / max_num_seqs "
    "seconds; place_in_line * service_s treats the server as a single seat",
    "running requests ignored": "the requests already running hold the seats: they are ahead of the newcomer as much "
    "as the waiting ones",
    "a wait equal to the promise refused": "a predicted wait equal to the promise keeps it: refuse only when the wait "
    "is over the promise",
    "Retry-After in milliseconds": "Retry-After is in whole seconds (HTTP says so): ceil(wait_s - promise_ms / 1000)",
    "Retry-After rounded down": "round the excess wait up (math.ceil) and never below 1 s: Retry-After 0 tells the "
    "client to come back at once, into the same queue",
    "seconds compared with milliseconds": "the wait is in seconds and the promise in milliseconds: convert one before "
    "comparing (wait_s * 1000 <= promise_ms)",
}


def wrong_answer(rule: str, running: int, waiting: int, seats: int, service_s, promise_ms: float):
    """What a learner who made this one mistake (a key of WRONG_RULES) would answer."""
    if service_s is None:
        return None
    newcomer = 0 if rule == "the newcomer is not counted" else 1
    ahead = 0 if rule == "running requests ignored" else running
    place = max(0, ahead + waiting + newcomer - seats)
    wait_s = place * service_s / (1 if rule == "one seat at a time" else seats)
    limit_s = promise_ms if rule == "seconds compared with milliseconds" else promise_ms / 1000
    keeps = wait_s < limit_s if rule == "a wait equal to the promise refused" else wait_s <= limit_s
    if keeps:
        return None
    excess_s = wait_s - promise_ms / 1000
    if rule == "Retry-After in milliseconds":
        return max(1, math.ceil(excess_s * 1000))
    if rule == "Retry-After rounded down":
        return int(excess_s)
    return max(1, math.ceil(excess_s))


def snapshot(situation: list) -> QueueSnapshot:
    _name, running, waiting, seats, service_s, _promise = situation
    return QueueSnapshot(waiting=waiting, running=running, max_num_seqs=seats, service_s=service_s)


def admission_inputs(seed: int) -> dict[str, Any]:
    return {"situations": [list(s) for s in SITUATIONS]}


def run_admit(functions, inputs) -> list:
    """The learner's answer for each situation, as given (a number, None, or a description of anything else)."""
    answers = []
    for situation in inputs["situations"]:
        answer = functions[0](snapshot(situation), situation[-1])
        answers.append(answer if answer is None or isinstance(answer, (int, float)) else repr(answer))
    return answers


def admission_oracle(inputs) -> dict[str, Any]:
    situations = inputs["situations"]
    return {
        "names": [s[0] for s in situations],
        "situations": [list(s) for s in situations],
        "waits": [predicted_wait_s(snapshot(s)) for s in situations],
        "answers": [retry_after(snapshot(s), s[-1]) for s in situations],
        "wrong": {rule: [wrong_answer(rule, *s[1:]) for s in situations] for rule in WRONG_RULES},
    }


def describe(answer) -> str:
    return "admit (None)" if answer is None else f"refuse with Retry-After {answer!r}"


def describe_situation(situation: list) -> str:
    name, running, waiting, seats, service_s, promise_ms = situation
    held = "nothing measured yet" if service_s is None else f"service_s {service_s:g}"
    return f"'{name}' ({running} running, {waiting} waiting, {seats} seats, {held}, promise {promise_ms:g} ms)"


def what_differs(situation: list, wait_s: float, want, mine) -> str:
    """Why labkit's rule answers ``want`` where the learner answered ``mine``, without giving the rule away."""
    promise_ms = situation[-1]
    if mine is not None and (not isinstance(mine, int) or isinstance(mine, bool)):
        return "Retry-After is a whole number of seconds: return an int (or None to admit)"
    if situation[4] is None:
        return "nothing is measured yet, so there is no wait to predict: admit"
    seen = f"labkit predicts a wait of {wait_s:.3g} s for a seat, "
    if want is None:
        return seen + f"within the promise of {promise_ms:g} ms, so it admits; you refused"
    if mine is None:
        return seen + f"over the promise of {promise_ms:g} ms, so it refuses; you admitted"
    excess = f"{wait_s - promise_ms / 1000:.3g} s more than the promise"
    return seen + f"{excess}: Retry-After is that excess in whole seconds, rounded up, and at least 1"


def _compare_admit(expected, got) -> Mismatch | None:
    if got == expected["answers"]:
        return None
    for rule, answers in expected["wrong"].items():
        if got == answers:
            return Mismatch(f"your answers match a rule with one mistake ({rule})", WRONG_RULES[rule])
    for situation, wait_s, want, mine in zip(expected["situations"], expected["waits"], expected["answers"], got):
        if mine != want:
            return Mismatch(
                f"situation {describe_situation(situation)}: you answered {describe(mine)}, labkit's rule says "
                f"{describe(want)}: {what_differs(situation, wait_s, want, mine)}",
                "Predict the newcomer's wait for a seat from the snapshot (all the seats free up in parallel), "
                'compare it with the promise, and if it is over, say when to come back; labkit.hint("lab9.admit") '
                "shows more.",
            )
    return None


register(
    diagnosed(
        Exercise(
            id="lab9.admit",
            functions=("admit",),
            answers=("labkit.serve.admission.retry_after",),
            make_inputs=admission_inputs,
            run=run_admit,
            oracle=admission_oracle,
            compare=_compare_admit,
            tested="eight queue snapshots (free seats, nothing measured yet, a wait exactly at the promise, one "
            "place too many, parallel seats, a full house, far over, a small server): your answer equals labkit's "
            "rule in each, None to admit or Retry-After in whole seconds",
            hint="Predict the newcomer's wait for a seat from the snapshot; admit when it keeps the promise, else "
            "say in whole seconds when to come back.",
            points=2.0,
        )
    )
)

register_hints(
    "lab9.admit",
    "Seats free up in parallel: max_num_seqs of them, each held service_s seconds, so one frees every "
    "service_s / max_num_seqs seconds on average.",
    "The newcomer's place in line for a seat: running + waiting + 1 - max_num_seqs (0 or less: a seat is free). "
    "Its wait: that place times the time between two seats freeing up. No service_s yet: admit.",
    "Admit (None) if wait_s * 1000 <= promise_ms; otherwise return max(1, math.ceil(wait_s - promise_ms / 1000)).",
)
