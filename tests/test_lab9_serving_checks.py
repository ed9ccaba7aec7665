"""Lab 9's checks that need a real server or the grader's own measurement: the learner's policy
behind ``labkit serve`` over HTTP, the admission rule, and the capacity sweep.

Each passes the right answer and fails the typical mistakes, naming them. Servers are started on
free loopback ports by the checks themselves and stopped by them. The capacity check judges the
learner's rate on the loads their own sweep sent (recorded by the load tester), then on a replayed
sweep of known capacity, so its typical mistakes are judged here on fixed recorded sweeps and on the
replay (with the server's one /v1/models answer faked), and the whole check runs for real once: the
solved sweep with two busy cores beside it (it must pass, however slow the machine is).
"""

import math
from pathlib import Path

import nbformat
import pytest
from lab_sources import is_exercise, solved_namespace, source_cells

from labkit.bench.busy import busy_cores
from labkit.engine.scheduler import SchedulerOutput
from labkit.grading.checks import get_exercise
from labkit.grading.feedback import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS, Mismatch, Note
from labkit.labs.common.pieces import Piece, course_pieces
from labkit.labs.lab9.admission import WRONG_RULES
from labkit.labs.lab9.capacity import (
    EXAMPLE_PROMISE,
    LOAD,
    REPLAY_PROMISE,
    REPLAY_SIGNS,
    capacity_inputs,
    capacity_oracle,
    course_highest_rate,
    judge_sweep,
    replay_sweep,
)
from labkit.labs.lab9.highest_rate import SEARCH
from labkit.serve import background
from labkit.serve.background import measure
from labkit.slo import Promise, from_requests, highest_rate

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


def without_the_block_check(state):
    """Seats and budget, but no state.blocks.can_allocate: fine on a big pool, breaks when memory binds."""
    output = SchedulerOutput()
    budget = state.max_num_batched_tokens
    for request in list(state.running):
        if state.reserve(request, request.num_missing_tokens, output):
            output.scheduled[request.request_id] = request.num_missing_tokens
            budget -= request.num_missing_tokens
    while state.waiting and len(state.running) < state.max_num_seqs and state.waiting[0].num_missing_tokens <= budget:
        head = state.waiting[0]
        budget -= head.num_missing_tokens
        output.scheduled[head.request_id] = head.num_missing_tokens
        state.admit(head, head.num_missing_tokens)
    return output


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
        (
            without_the_block_check,
            "in lab 4's check run: your function without_the_block_check raised OutOfBlocksError",
        ),
    ],
    ids=["static", "raises", "no-block-check"],
)
def test_each_policy_mistake_fails_and_is_named(wrong, named):
    got = verdict("lab9.continuous_schedule", wrong)
    assert got.startswith(FAIL) and named in got, got
    if wrong is without_the_block_check:  # lab 4's own hint for it
        assert "state.blocks.can_allocate" in got, got


def test_a_changed_answer_is_caught():
    exercise, lab4 = get_exercise("lab9.continuous_schedule"), get_exercise("lab4.continuous_schedule")
    lab4_inputs = lab4.make_inputs(0)  # lab 4's check run, passed: what the server's answers are judged after
    expected = {
        "answers": [{"text": " Paris.", "settled": " Paris.", "near_tie": False}],
        "lab4": lab4.oracle(lab4_inputs),
    }
    got = {
        "answers": [{"text": " Lyon.", "error": None}],
        "decisions": [],
        "blocks_used_at_end": 0,
        "raised": [],
        "lab4": lab4.run([continuous_schedule], lab4_inputs),
    }
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
    assert "return an int" in got and "math.ceil(" not in got, got


def test_a_wrong_admission_is_named_without_the_formula():
    """The last hint tier holds the formula (and costs points); the failure message names what differs."""

    def twice_the_wait(queue, promise_ms):
        if queue.service_s is None:
            return None
        wait_s = (
            2 * max(0, queue.running + queue.waiting + 1 - queue.max_num_seqs) * queue.service_s / queue.max_num_seqs
        )
        return None if wait_s * 1000 <= promise_ms else max(1, math.ceil(wait_s - promise_ms / 1000))

    got = verdict("lab9.admit", twice_the_wait)
    assert got.startswith(FAIL) and "'at the promise'" in got and "so it admits; you refused" in got, got
    assert "running + waiting + 1" not in got and "math.ceil" not in got, got


# --- lab9.find_capacity --------------------------------------------------------------------------
PROMISE = {"ttft_ms": 600.0, "tpot_ms": 140.0}
URL = "http://127.0.0.1:5555/v1"
EXPECTED = capacity_oracle(capacity_inputs(0))


def sent(rate, ttft_ms: float, tpot_ms: float, lost: int = 0, url: str = URL, **shape) -> dict:
    """One recorded load of six requests: ``lost`` of them failed, the rest with these latencies."""
    ok = {"ok": True, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2el_ms": ttft_ms + 15 * tpot_ms}
    failed = {"ok": False, "ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
    return {"url": url, "rate": rate, "load": {**EXPECTED["load"], **shape}, "requests": [failed] * lost + [ok] * 6}


# TTFT breaks its limit at 8 req/s (a queue); TPOT would keep its own up to 32
SWEEP = [sent(2.0, 180, 80), sent(4.0, 420, 85), sent(8.0, 1100, 90)]
FAR = [*SWEEP, sent(16.0, 2500, 95), sent(32.0, 5000, 100)]


def judged(rate, loads=SWEEP):
    return judge_sweep(EXPECTED, {"rate": rate, "promise": PROMISE, "url": URL, "loads": loads})


def test_labkits_rule_on_the_sweeps_own_measurements_passes():
    assert judged(4.0) == Note("your sweep: 4 req/s; labkit's rule on the same measurements: 4 req/s")
    assert isinstance(judged(2.0, [sent(2.0, 180, 80), sent(4.0, 420, 85, lost=1)]), Note)  # a lost request breaks it
    assert isinstance(judged(None, [sent(2.0, 700, 80)]), Note)  # nothing keeps it: None, after the lowest only
    assert isinstance(judged(32.0, [sent(rate, 100, 80) for rate in EXPECTED["rates"]]), Note)  # all kept: all measured


@pytest.mark.parametrize(
    "rate, loads, named",
    [
        (16.0, SWEEP, "2 steps of the grid above"),
        (2.0, SWEEP, "1 step of the grid below"),
        (None, SWEEP, "2 steps of the grid below"),
        (8.0, SWEEP, "the first rate that broke the promise"),
        (32.0, FAR, "the TPOT limit alone allows"),
        (3.0, SWEEP, "one of the rates you were given"),
        ("fast", SWEEP, "'fast'"),
        (None, [], "measured nothing"),
        (4.0, [sent(2.0, 180, 80, url="http://127.0.0.1:8000/v1")], "not the server it was given"),
        (4.0, [sent(2.0, 180, 80, num_prompts=8, input_len=32)], "another load than the lab's LOAD"),
        (4.0, [*SWEEP, sent(4.0, 400, 85)], "4 req/s more than once"),
        (2.0, [sent(2.0, 180, 80), sent(8.0, 1100, 90)], "but not 4 req/s"),
        (4.0, FAR, "right answer, but"),
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
    assert isinstance(mismatch, Mismatch) and named in mismatch.difference, mismatch
    if "of the grid" in named:  # the learner sees what was measured and what the rule makes of it
        assert "8 req/s TTFT 1100 ms, TPOT 90.0 ms" in mismatch.difference and "signs 4 req/s" in mismatch.difference


find_capacity = solved("find_capacity", "highest_rate")
search = solved("highest_rate")
NOTEBOOKS_SERVER = "http://127.0.0.1:8000"
ALL_KEPT = [sent(rate, 100, 80) for rate in EXPECTED["rates"]]  # a fast machine: every rate keeps the promise


class Models:
    """The one request the load tester sends the server during a replay: its model name."""

    def json(self):
        return {"data": [{"id": "course-model"}]}


@pytest.fixture
def replayed(monkeypatch):
    """The learner's sweep under labkit's replayed load tester (no server needed but for /v1/models, faked)."""
    monkeypatch.setattr(background.httpx, "get", lambda *args, **kwargs: Models())
    return lambda sweep: replay_sweep(sweep, URL, EXPECTED["rates"])


def judged_with_replay(live_rate, live_loads, replay):
    got = {"rate": live_rate, "promise": PROMISE, "url": URL, "loads": live_loads, "replay": replay}
    return judge_sweep(EXPECTED, got)


def test_the_replayed_sweep_has_a_known_capacity_mid_grid(replayed):
    runs = replayed(find_capacity)["loads"]
    results = {load["rate"]: from_requests(load["requests"]) for load in runs}
    assert [load["rate"] for load in runs] == [2.0, 4.0, 8.0]  # the solved sweep stops where it breaks
    assert highest_rate(results, Promise.from_limits(REPLAY_PROMISE)) == REPLAY_SIGNS == 4.0
    everything = replayed(lambda url, rates, promise: [measure(url, rate, **LOAD) for rate in rates] and None)
    results = {load["rate"]: from_requests(load["requests"]) for load in everything["loads"]}
    assert highest_rate(results, Promise.from_limits(EXAMPLE_PROMISE)) == 16.0  # the example promise signs another


def test_the_solved_sweep_passes_live_and_replayed(replayed):
    verdict = judged_with_replay(4.0, SWEEP, replayed(find_capacity))
    assert verdict == Note("your sweep: 4 req/s; labkit's rule on the same measurements: 4 req/s"), verdict


def example_promise(url, rates, promise):
    return search(lambda rate: measure(url, rate, **LOAD), rates, EXAMPLE_PROMISE)


def forgets_the_load(url, rates, promise):
    return search(lambda rate: measure(url, rate), rates, promise)


def notebooks_server(url, rates, promise):
    return search(lambda rate: measure(NOTEBOOKS_SERVER, rate, **LOAD), rates, promise)


def every_rate(url, rates, promise):
    runs = {rate: measure(url, rate, **LOAD) for rate in rates}
    return search(runs.__getitem__, rates, promise)


@pytest.mark.parametrize(
    "wrong, live, named",
    [
        # each passes live where the machine makes it coincide with the right answer; the replay does not
        (example_promise, (4.0, SWEEP), "that is what exercise 5's example promise"),
        (every_rate, (32.0, ALL_KEPT), "right answer, but"),
        # and each of these the live sweep already names, from the loads it sent
        (lambda url, rates, promise: None, (None, []), "measured nothing"),
        (
            forgets_the_load,
            (4.0, [sent(2.0, 180, 80, num_prompts=8, input_len=32)]),
            "another load than the lab's LOAD",
        ),
        (notebooks_server, (4.0, [sent(2.0, 180, 80, url=NOTEBOOKS_SERVER + "/v1")]), "not the server it was given"),
    ],
    ids=["example-promise", "every-rate", "measures-nothing", "forgets-the-load", "the-notebooks-server"],
)
def test_each_typical_sweep_fails_named(replayed, wrong, live, named):
    replay = replayed(wrong)
    mismatch = judged_with_replay(*live, replay)
    assert isinstance(mismatch, Mismatch) and named in mismatch.difference, mismatch
    assert isinstance(judged_with_replay(4.0, SWEEP, replay), Mismatch)  # the replay alone fails it too


@pytest.mark.timing
def test_the_solved_sweep_passes_however_busy_the_machine_is(request):
    """Two spin loops beside the server and the sweep: the measurements move, the verdict must not.

    Under ``--busy N`` (CI's timing pass) N of them already run; this test adds the rest up to two.
    """
    with busy_cores(max(0, 2 - request.config.getoption("--busy"))):
        got = verdict("lab9.find_capacity", find_capacity)
    assert got.startswith(PASS) and "labkit's rule on the same measurements" in got, got


def test_a_blank_sweep_is_not_done_before_any_server_starts(monkeypatch):
    from labkit.labs.lab9 import capacity as serve_capacity

    def no_server():
        raise AssertionError("a server was started for a blank exercise")

    monkeypatch.setattr(serve_capacity, "server_llm", no_server)

    def find_capacity(url, rates, promise):
        raise NotImplementedError("Exercise lab9.find_capacity: replace this line with your code")

    assert evaluate("lab9.find_capacity", find_capacity).status == NOT_DONE


# --- one mistake in highest_rate costs highest_rate's points only ----------------------------------
# The typical wrong rules, each an edit of the solved highest_rate: a wrong rule used to fail find_capacity too,
# because the sweep was judged through the learner's own rule.
SEARCH_PIECE = Piece(SEARCH, course_highest_rate)
WRONG_SEARCHES = {
    "best of all rates": ("            break\n", "            continue\n"),
    "the mean, not p99": ("np.percentile([r[metric] for r in requests], 99)", "np.mean([r[metric] for r in requests])"),
    "the first failing rate": (
        "        requests = measure(rate)\n",
        "        requests = measure(rate)\n        best = rate\n",
    ),
    "TPOT only": ("in promise.items()", "in promise.items() if metric == 'tpot_ms'"),
}


def names_called(value) -> tuple[str, ...]:
    code = getattr(value, "__code__", None)
    return code.co_names if code is not None else ()


def with_wrong_search(mistake: str) -> dict:
    """A solved lab 9 namespace whose only mistake is ``mistake`` in highest_rate (defined in it, as a cell is)."""
    namespace = solved_namespace("lab9")
    cell = next(c.source for c in source_cells("lab9") if is_exercise(c) and c.source.startswith("def highest_rate("))
    old, new = WRONG_SEARCHES[mistake]
    assert old in cell, old
    exec(cell.replace(old, new), namespace)
    return namespace


@pytest.mark.parametrize("mistake", list(WRONG_SEARCHES))
def test_a_wrong_search_fails_its_own_check_and_the_sweep_is_judged_by_labkits_rule(replayed, mistake):
    namespace = with_wrong_search(mistake)
    assert evaluate("lab9.highest_rate", namespace=namespace).status == FAIL
    with course_pieces(namespace["find_capacity"], [SEARCH_PIECE]):
        assert namespace["highest_rate"] is course_highest_rate
        verdict = judged_with_replay(4.0, SWEEP, replayed(namespace["find_capacity"]))
    assert isinstance(verdict, Note), verdict
    assert namespace["highest_rate"] is not course_highest_rate  # the learner's own is put back


def test_a_lab9_notebook_whose_only_mistake_is_in_highest_rate_loses_exactly_one_exercise():
    """Graded as the grader does, from the notebook's namespace: a real server for the sweep (about 20 s)."""
    namespace = with_wrong_search("the mean, not p99")
    callers = {name for name, value in namespace.items() if "highest_rate" in names_called(value)}
    assert callers == {"find_capacity"}  # no other exercise of lab 9 calls it
    results = {
        exercise: evaluate(exercise, namespace=namespace) for exercise in ("lab9.highest_rate", "lab9.find_capacity")
    }
    lost = [exercise for exercise, result in results.items() if not result.passed]
    assert lost == ["lab9.highest_rate"], results
    sweep = results["lab9.find_capacity"].message
    assert "your highest_rate (exercise 5) still fails its check" in sweep, sweep
