"""Lab 9's checks that need a real server or the grader's own measurement: the learner's policy
behind ``labkit serve`` over HTTP, the admission rule, and the capacity sweep.

Each passes the right answer and fails the typical mistakes, naming them. Servers are started on
free loopback ports by the checks themselves and stopped by them. The capacity check's verdict
compares two real sweeps, so its pass and fail cases here are judged on fixed grader results; the
whole check, both sweeps for real, runs on the right answer in the solved lab 9 notebook
(test_labs_execute) and in its grading (test_grading_labs), where it must pass.
"""

import math
from pathlib import Path

import nbformat
import pytest

from labkit.engine.scheduler import SchedulerOutput
from labkit.grading.checks import get_exercise
from labkit.grading.feedback import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.labs.checking.serve_admission import WRONG_RULES

pytestmark = pytest.mark.lab9
ROOT = Path(__file__).resolve().parents[1]


def verdict(exercise_id: str, function) -> str:
    result = evaluate(exercise_id, function)
    return f"{result.status}: {result.message}"


# --- lab9.continuous_schedule ----------------------------------------------------------------------
def solved(name: str):
    """The function ``name`` as lab 9's solved notebook defines it (its import cell run first)."""
    cells = nbformat.read(ROOT / "labs" / "source" / "lab9_serving.ipynb", as_version=4).cells
    code = [c.source for c in cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(code[0], namespace)
    exec(next(source for source in code if source.startswith(f"def {name}(")), namespace)
    return namespace[name]


continuous_schedule = solved("continuous_schedule")


def static_schedule(state):
    if state.running:
        output = SchedulerOutput()
        for request in list(state.running):
            if state.reserve(request, request.num_missing_tokens, output):
                output.scheduled[request.request_id] = request.num_missing_tokens
        return output
    return continuous_schedule(state)


def raises_on_a_full_house(state):
    if len(state.running) == state.max_num_seqs:
        raise KeyError("no seat")
    return continuous_schedule(state)


def test_the_policy_passes_under_http():
    assert verdict("lab9.continuous_schedule", continuous_schedule).startswith(PASS)


@pytest.mark.parametrize(
    "wrong, named",
    [
        (static_schedule, "slots were in use while"),
        (raises_on_a_full_house, "raised KeyError"),
    ],
)
def test_each_policy_mistake_fails_and_is_named(wrong, named):
    got = verdict("lab9.continuous_schedule", wrong)
    assert got.startswith(FAIL) and named in got, got


def test_a_changed_answer_is_caught():
    exercise = get_exercise("lab9.continuous_schedule")
    expected = {"answers": [{"text": " Paris.", "settled": " Paris.", "near_tie": False}]}
    got = {"answers": [{"text": " Lyon.", "error": None}], "decisions": [], "blocks_used_at_end": 0, "raised": []}
    assert "decoded alone" in exercise.compare(expected, got).difference
    leaked = {**got, "answers": [{"text": " Paris.", "error": None}], "blocks_used_at_end": 3}
    joined = [
        {
            "prefill": {"r1": 5},
            "scheduled": {"r0": 1, "r1": 5},
            "running": 2,
            "max_num_seqs": 4,
            "waiting": 0,
            "head_fits_whole": False,
            "head_fits_chunk": False,
            "preempted": [],
        }
    ]
    assert "3 KV blocks" in exercise.compare(expected, {**leaked, "decisions": joined}).difference
    assert "joined while another was decoding" in exercise.compare(expected, leaked).difference


# --- lab9.admit ----------------------------------------------------------------------------------
admit = solved("admit")


def one_mistake(rule):
    """An admit with exactly one of the typical mistakes."""

    def wrong(queue, promise_ms):
        if queue.service_s is None:
            return None
        newcomer = 0 if rule == "the newcomer is not counted" else 1
        running = 0 if rule == "running requests ignored" else queue.running
        place = max(0, running + queue.waiting + newcomer - queue.max_num_seqs)
        wait_s = place * queue.service_s / (1 if rule == "one seat at a time" else queue.max_num_seqs)
        limit = promise_ms if rule == "seconds compared with milliseconds" else promise_ms / 1000
        if (wait_s < limit) if rule == "a wait equal to the promise refused" else (wait_s <= limit):
            return None
        if rule == "Retry-After in milliseconds":
            return math.ceil((wait_s - promise_ms / 1000) * 1000)
        if rule == "Retry-After rounded down":
            return int(wait_s - promise_ms / 1000)
        return max(1, math.ceil(wait_s - promise_ms / 1000))

    return wrong


def test_the_admission_rule_passes():
    assert verdict("lab9.admit", admit).startswith(PASS)


@pytest.mark.parametrize("rule", list(WRONG_RULES))
def test_each_admission_mistake_fails_and_is_named(rule):
    got = verdict("lab9.admit", one_mistake(rule))
    assert got.startswith(FAIL) and rule in got and WRONG_RULES[rule][:30] in got, got


def test_other_wrong_admissions_name_the_situation():
    refuses_at_start = lambda queue, promise_ms: 1 if queue.service_s is None else admit(queue, promise_ms)  # noqa: E731
    got = verdict("lab9.admit", refuses_at_start)
    assert got.startswith(FAIL) and "'nothing measured yet'" in got, got

    def no_rounding(queue, promise_ms):
        answer = admit(queue, promise_ms)
        return None if answer is None else max(0, queue.running + queue.waiting + 1 - queue.max_num_seqs) * 0.25

    got = verdict("lab9.admit", no_rounding)
    assert got.startswith(FAIL) and "'one place too many'" in got, got


# --- lab9.find_capacity --------------------------------------------------------------------------
PROMISE = {"ttft_ms": 600.0, "tpot_ms": 140.0}
GRADER = {
    "rate": 2.0,
    "promise": PROMISE,
    "p99": {
        "1.0": {"ttft_ms": 180.0, "tpot_ms": 80.0},
        "2.0": {"ttft_ms": 420.0, "tpot_ms": 85.0},
        "4.0": {"ttft_ms": 1100.0, "tpot_ms": 90.0},
    },
    "rates": [1.0, 2.0, 4.0, 8.0, 16.0],
}
MINE = {"promise": {"ttft_ms": 640.0, "tpot_ms": 150.0}}


@pytest.mark.parametrize("reported", [1.0, 2.0, 4.0])
def test_a_rate_within_a_step_of_the_graders_passes(reported):
    compare = get_exercise("lab9.find_capacity").compare
    assert compare(GRADER, {**MINE, "rate": reported}) is None


@pytest.mark.parametrize(
    "reported, named",
    [
        (16.0, "3 steps of the grid above"),
        (8.0, "2 steps of the grid above"),
        (None, "2 steps of the grid below"),
        (3.0, "one of the rates you were given"),
        ("fast", "'fast'"),
    ],
)
def test_a_rate_far_from_the_graders_fails(reported, named):
    mismatch = get_exercise("lab9.find_capacity").compare(GRADER, {**MINE, "rate": reported})
    assert mismatch is not None and named in mismatch.difference, mismatch
    if "rates you were given" not in mismatch.difference:
        assert "4 req/s TTFT 1100 ms, TPOT 90 ms" in mismatch.difference, mismatch


def test_a_blank_sweep_is_not_done_before_any_server_starts(monkeypatch):
    from labkit.labs.checking import serve_capacity

    def no_server():
        raise AssertionError("a server was started for a blank exercise")

    monkeypatch.setattr(serve_capacity, "server_llm", no_server)

    def find_capacity(url, rates, promise):
        raise NotImplementedError("Exercise lab9.find_capacity: replace this line with your code")

    assert evaluate("lab9.find_capacity", find_capacity).status == NOT_DONE
