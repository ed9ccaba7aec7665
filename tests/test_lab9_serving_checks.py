"""Lab 9's checks that need a real server or the grader's own measurement: the learner's policy
behind ``labkit serve`` over HTTP, the admission rule, and the capacity sweep.

Each passes the right answer and fails the typical mistakes, naming them. Servers are started on
free loopback ports by the checks themselves and stopped by them. The capacity check judges the
learner's rate on the loads their own sweep sent (recorded by the load tester), so its typical
mistakes are judged here on fixed recorded sweeps, and the whole check runs for real twice: the
solved sweep with two busy cores beside it (it must pass, however slow the machine is) and one
that measures nothing (it must fail).
"""

import math
from pathlib import Path

import nbformat
import pytest

from labkit.bench.busy import busy_cores
from labkit.engine.scheduler import SchedulerOutput
from labkit.grading.checks import get_exercise
from labkit.grading.feedback import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.labs.checking.serve_admission import WRONG_RULES
from labkit.labs.checking.serve_capacity import capacity_inputs, capacity_oracle

pytestmark = pytest.mark.lab9
ROOT = Path(__file__).resolve().parents[1]


def verdict(exercise_id: str, function) -> str:
    result = evaluate(exercise_id, function)
    return f"{result.status}: {result.message}"


# --- lab9.continuous_schedule ----------------------------------------------------------------------
def solved(name: str, *needs: str):
    """The function ``name`` as lab 9's solved notebook defines it (its import cell run first, then the
    cells of the solved functions it ``needs``)."""
    cells = nbformat.read(ROOT / "labs" / "source" / "lab9_serving.ipynb", as_version=4).cells
    code = [c.source for c in cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(code[0], namespace)
    for each in (*needs, name):
        exec(next(source for source in code if source.startswith(f"def {each}(")), namespace)
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
URL = "http://127.0.0.1:5555/v1"
EXPECTED = capacity_oracle(capacity_inputs(0))


def sent(rate, ttft_ms: float, tpot_ms: float, lost: int = 0, url: str = URL, **shape) -> dict:
    """One recorded load of six requests: ``lost`` of them failed, the rest with these latencies."""
    ok = {"ok": True, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2el_ms": ttft_ms + 15 * tpot_ms}
    failed = {"ok": False, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
    return {"url": url, "rate": rate, "load": {**EXPECTED["load"], **shape}, "requests": [failed] * lost + [ok] * 6}


# TTFT breaks its limit at 4 req/s (a queue); TPOT would keep its own up to 16
SWEEP = [sent(1.0, 180, 80), sent(2.0, 420, 85), sent(4.0, 1100, 90)]
FAR = [*SWEEP, sent(8.0, 2500, 95), sent(16.0, 5000, 100)]


def judged(rate, loads=SWEEP):
    return get_exercise("lab9.find_capacity").compare(
        EXPECTED, {"rate": rate, "promise": PROMISE, "url": URL, "loads": loads}
    )


def test_labkits_rule_on_the_sweeps_own_measurements_passes():
    assert judged(2.0) is None
    assert judged(1.0, [sent(1.0, 180, 80), sent(2.0, 420, 85, lost=1)]) is None  # a lost request breaks it
    assert judged(None, [sent(1.0, 700, 80)]) is None  # nothing keeps it: None, after measuring the lowest only
    assert judged(16.0, [sent(rate, 100, 80) for rate in EXPECTED["rates"]]) is None  # all kept: all measured


@pytest.mark.parametrize(
    "rate, loads, named",
    [
        (8.0, SWEEP, "2 steps of the grid above"),
        (1.0, SWEEP, "1 step of the grid below"),
        (None, SWEEP, "2 steps of the grid below"),
        (4.0, SWEEP, "the first rate that broke the promise"),
        (16.0, FAR, "the TPOT limit alone allows"),
        (3.0, SWEEP, "one of the rates you were given"),
        ("fast", SWEEP, "'fast'"),
        (None, [], "measured nothing"),
        (2.0, [sent(1.0, 180, 80, url="http://127.0.0.1:8000/v1")], "not the server it was given"),
        (2.0, [sent(1.0, 180, 80, num_prompts=8, input_len=32)], "another load than the lab's LOAD"),
        (2.0, [*SWEEP, sent(2.0, 400, 85)], "2 req/s more than once"),
        (1.0, [sent(1.0, 180, 80), sent(4.0, 1100, 90)], "but not 2 req/s"),
        (2.0, FAR, "right answer, but"),
    ],
    ids=[
        "two-above",
        "one-below",
        "none",
        "first-broken",
        "tpot-only",
        "off-the-grid",
        "not-a-number",
        "measured-nothing",
        "another-server",
        "another-load",
        "a-rate-twice",
        "a-rate-skipped",
        "measured-past-the-break",
    ],
)
def test_each_sweep_mistake_fails_and_is_named(rate, loads, named):
    mismatch = judged(rate, loads)
    assert mismatch is not None and named in mismatch.difference, mismatch
    if "of the grid" in named:  # the learner sees what was measured and what the rule makes of it
        assert "4 req/s TTFT 1100 ms, TPOT 90.0 ms" in mismatch.difference and "signs 2 req/s" in mismatch.difference


find_capacity = solved("find_capacity", "highest_rate")


@pytest.mark.timing
def test_the_solved_sweep_passes_however_busy_the_machine_is():
    """Two spin loops beside the server and the sweep: the measurements move, the verdict must not."""
    with busy_cores(2):
        got = verdict("lab9.find_capacity", find_capacity)
    assert got.startswith(PASS), got


def test_a_sweep_that_measures_nothing_fails_on_a_real_server():
    got = verdict("lab9.find_capacity", lambda url, rates, promise: None)
    assert got.startswith(FAIL) and "measured nothing" in got, got


def test_a_blank_sweep_is_not_done_before_any_server_starts(monkeypatch):
    from labkit.labs.checking import serve_capacity

    def no_server():
        raise AssertionError("a server was started for a blank exercise")

    monkeypatch.setattr(serve_capacity, "server_llm", no_server)

    def find_capacity(url, rates, promise):
        raise NotImplementedError("Exercise lab9.find_capacity: replace this line with your code")

    assert evaluate("lab9.find_capacity", find_capacity).status == NOT_DONE
