"""Lab 9, the capstone: the checks for the learner's engine loop, policy, dashboard, admission and SLO sweep.

- ``engine_turn(llm, inbox, send)``: one turn of a server's engine loop: take every command
  the HTTP side left (add a request, abort one whose client hung up), run one step, send each
  request its new tokens. Driven with scripted clients on the tiny model: commands are applied
  oldest first, newcomers join the very next step, a hang-up frees its blocks in that turn, every
  token is streamed as it is made, and every answer equals the request decoded alone.
- ``continuous_schedule(state)``: the learner's lab 4 policy, judged by lab 4's check first (where
  memory binds), then as the policy of a real ``labkit serve``; six HTTP clients stream greedy
  completions, each text must be the prompt decoded alone.
- ``dashboard(before_text, after_text)``: the numbers of a serving dashboard from two
  ``/metrics`` scrapes, compared with labkit's own reading of the same scrapes.
- ``admit(queue, promise_ms)``: admission control, None to admit or Retry-After seconds; on
  queue snapshots, compared with ``labkit.serve.admission.retry_after`` and its typical misreadings.
- ``highest_rate(measure, rates, promise)``: the highest request rate whose p99 latencies keep
  the promise with nothing lost, measuring as few rates as it can; compared with labkit's rule
  (:func:`labkit.slo.highest_rate`, the one ``labkit loadtest`` and the simulator use) on replayed
  measurements.
- ``find_capacity(url, rates, promise)``: the SLO sweep against a real server, whose every load is
  recorded; the answer must equal labkit's rule applied to exactly those measurements. Then once
  more on replayed measurements with a known capacity mid-grid, where the mistakes a machine can
  hide (another promise than the one given, every rate measured) show.
"""

from __future__ import annotations

from typing import Any

from labkit.engine.reference import compare_to_solo, solo_greedy
from labkit.grading.checks import Exercise, get_exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.shared import small_model
from labkit.labs.hints import register_hints
from labkit.labs.lab4 import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.lab9.admission import (
    WRONG_RULES,
    admission_inputs,
    admission_oracle,
    describe,
    describe_situation,
    run_admit,
    what_differs,
)
from labkit.labs.lab9.capacity import (
    SITUATIONS,
    capacity_inputs,
    capacity_oracle,
    course_highest_rate,
    highest_rate_oracle,
    judge_sweep,
    replay,
    run_capacity,
    sweep_situations,
)
from labkit.labs.lab9.dashboard import KEYS, close, read_dashboard, seeded_scrapes, typical_misreadings
from labkit.labs.lab9.engine_loop import (
    client_script,
    drive,
    joined_mid_run,
    policy_inputs,
    policy_oracle,
    serve_clients,
)

# --- lab9.engine_turn -------------------------------------------------------------------------


def _run_loop(functions, inputs) -> dict[str, Any]:
    return drive(functions[0], inputs["clients"])


def _loop_oracle(inputs) -> dict[str, Any]:
    model = small_model()
    return {
        "clients": inputs["clients"],
        "solo": {
            c["request_id"]: solo_greedy(model, c["prompt_ids"], c["max_tokens"], ignore_eos=True)
            for c in inputs["clients"]
            if c["hangs_up"] is None
        },
    }


def describe_command(command: list[str]) -> str:
    kind, request_id = command
    return f"the {'add' if kind == 'add' else 'abort (hang-up)'} of {request_id}"


def out_of_order(given: list[list[str]], applied: list[list[str]]) -> tuple[list[str], list[str]] | None:
    """Two commands whose order matters, applied the other way round: two adds (the engine serves requests in the
    order they were added) or two commands for one request (an abort before its add cancels nothing)."""
    given, applied = [list(c) for c in given], [list(c) for c in applied]
    for index, first in enumerate(given):
        for second in given[index + 1 :]:
            matters = first[0] == second[0] == "add" or first[1] == second[1]
            if matters and first in applied and second in applied and applied.index(first) > applied.index(second):
                return first, second
    return None


def check_turns(clients: list[dict[str, Any]], turns: list[dict[str, Any]]) -> Mismatch | None:
    """Every command taken in its turn, oldest first, one step a turn, newcomers in that very step, hang-ups
    freed at once."""
    for number, turn in enumerate(turns):
        if turn["inbox_left"]:
            return Mismatch(
                f"turn {number}: {turn['inbox_left']} commands were still in the inbox after your turn",
                "Take every command out of the inbox each turn (inbox.pop(0) until it is empty): one left "
                "there waits a whole step, or is applied again next turn.",
            )
        swapped = out_of_order(turn["given"], turn["applied"])
        if swapped is not None:
            first, second = (describe_command(command) for command in swapped)
            return Mismatch(
                f"turn {number}: the inbox held {first} before {second}, but your loop applied {second} first: "
                "commands must be handled in the order they arrived (oldest first)",
                "inbox.pop(0) takes the oldest command, inbox.pop() the newest. Newest first serves the last to "
                "arrive first, and lets a hang-up reach the engine before the request it cancels, which then "
                "runs for nobody.",
            )
        if len(turn["steps"]) > 1:
            return Mismatch(
                f"turn {number} ran {len(turn['steps'])} engine steps",
                "One step per turn: the loop must come back to the inbox between steps, or a request that "
                "arrives waits until the batch drains (that is static batching, across HTTP clients).",
            )
    for client in clients:
        arrived = turns[client["arrives"]]["steps"]
        gone_at_once = client["hangs_up"] == client["arrives"]  # it never has to run
        if not gone_at_once and (not arrived or client["request_id"] not in arrived[0]):
            return Mismatch(
                f"{client['request_id']} arrived at turn {client['arrives']} but that turn's step did not run it",
                "Apply the commands first, then step: a request that came in joins the very next step. "
                "Stepping first (or only when the engine is idle) makes every newcomer wait.",
            )
        if client["hangs_up"] is not None:
            held = turns[client["hangs_up"]]["blocks"][client["request_id"]]
            if held:
                return Mismatch(
                    f"{client['request_id']} hung up at turn {client['hangs_up']}, yet it still held {held} KV "
                    "blocks after that turn",
                    "An abort must reach the engine: llm.abort_request(request_id) stops the request and gives "
                    "its blocks back at once. Dropping it on the HTTP side leaves the engine computing for nobody.",
                )
    return None


def check_sent(expected: dict[str, Any], sent: list[dict[str, Any]]) -> Mismatch | None:
    """Each client got its tokens as they were made, nothing after it hung up, and the solo answer."""
    for client in expected["clients"]:
        rid = client["request_id"]
        mine = [s for s in sent if s["request_id"] == rid]
        if client["hangs_up"] is not None:
            late = [s["turn"] for s in mine if s["turn"] >= client["hangs_up"]]
            if late:
                return Mismatch(f"{rid} hung up at turn {client['hangs_up']} but was sent tokens at turn {late[0]}")
            continue
        counts = [len(s["tokens"]) for s in mine]
        if counts != list(range(1, client["max_tokens"] + 1)):
            what = "only when it finished" if counts == [client["max_tokens"]] else f"with token counts {counts}"
            return Mismatch(
                f"{rid} was sent its answer {what}; a streaming client needs each output as it is made "
                f"(token counts 1, 2, ..., {client['max_tokens']})",
                "send(output) for every output llm.step() returns, finished or not: that is what "
                "streams each token to its client.",
            )
        problem = compare_to_solo(mine[-1]["tokens"], expected["solo"][rid])
        if problem is not None:
            return Mismatch(f"{rid}: {problem}", "Add each request with its own prompt ids and sampling params.")
        if not mine[-1]["finished"]:
            return Mismatch(f"{rid}: the last output it was sent is not marked finished")
    return None


def _compare_loop(expected, got) -> Mismatch | None:
    return check_turns(expected["clients"], got["turns"]) or check_sent(expected, got["sent"])


def _known_loop_error(record: dict[str, Any]) -> str | None:
    if "already" in record["message"] or "duplicate" in record["message"].lower():
        return "A command was applied twice: take each one out of the inbox (inbox.pop(0)) as you apply it."
    return None


register(
    diagnosed(
        Exercise(
            id="lab9.engine_turn",
            functions=("engine_turn",),
            make_inputs=lambda seed: {"clients": client_script(seed)},
            run=_run_loop,
            oracle=_loop_oracle,
            compare=_compare_loop,
            tested="seven scripted clients arrive over the turns of your loop on the tiny model (two in the same "
            "turn), one hangs up mid-answer and one the moment it arrives: every command is taken in its turn, "
            "oldest first, one step a turn, newcomers join that very step, a hang-up's blocks are free after its "
            "turn, tokens are sent as they are made, and every answer equals the request decoded alone",
            hint="Commands first (add_request / abort_request), then one llm.step() if llm.has_unfinished(), then "
            "send every output it returned.",
            points=2.0,
        ),
        _known_loop_error,
    )
)

# --- lab9.continuous_schedule: your policy behind the server ----------------------------------


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
    problem = get_exercise(LAB4_POLICY).compare(expected["lab4"], got["lab4"])
    if isinstance(problem, Mismatch):
        return Mismatch(f"in lab 4's check run: {problem.difference}", problem.hint)
    if got["raised"]:
        return raised_mismatch(got["raised"][0], 'Fix it in lab 4 first; labkit.hint("lab9.continuous_schedule").')
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
    problem = check_decisions(got["decisions"])
    if problem is not None:
        return problem
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

# --- lab9.dashboard ---------------------------------------------------------------------------


def _scrapes(seed: int) -> dict[str, str]:
    before, after = seeded_scrapes(seed)
    return {"before": before, "after": after}


def _run_dashboard(functions, inputs) -> Any:
    return functions[0](inputs["before"], inputs["after"])


def _dashboard_oracle(inputs) -> dict[str, Any]:
    return {
        "right": read_dashboard(inputs["before"], inputs["after"]),
        "wrong": typical_misreadings(inputs["before"], inputs["after"]),
    }


def _compare_dashboard(expected, got) -> Mismatch | None:
    if not isinstance(got, dict):
        return Mismatch(f"dashboard returned a {type(got).__name__}; return a dict with the keys {list(KEYS)}")
    missing = [key for key in KEYS if key not in got]
    if missing:
        return Mismatch(f"the dict lacks {missing}; it needs {list(KEYS)}")
    for key in KEYS:
        right, value = expected["right"][key], got[key]
        if close(value, right):
            continue
        for wrong, why in expected["wrong"].get(key, []):
            if close(value, wrong) and not close(wrong, right):
                return Mismatch(f"{key} = {value:.6g}, expected {right:.6g}: {why}")
        shown = f"{value:.6g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        return Mismatch(f"{key} = {shown}, expected {right:.6g} (labkit's reading of the same two scrapes)")
    return None


register(
    diagnosed(
        Exercise(
            id="lab9.dashboard",
            functions=("dashboard",),
            answers=("labkit.labs.lab9.dashboard.read_dashboard",),
            make_inputs=_scrapes,
            run=_run_dashboard,
            oracle=_dashboard_oracle,
            compare=_compare_dashboard,
            tested="two /metrics scrapes of a server that served seeded traffic: finished requests, generation "
            "tokens, mean and p90 TTFT, prefix-cache hit rate over the window, and the running and KV-usage "
            "gauges, each equal to labkit's own reading",
            hint="Counters and histograms: after minus before. Gauges: the after scrape. p90: Prometheus' "
            "histogram_quantile over the window's cumulative buckets.",
            points=2.0,
        )
    )
)

# --- lab9.admit -------------------------------------------------------------------------------


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

# --- lab9.highest_rate ------------------------------------------------------------------------


def _run_search(functions, inputs) -> dict[str, Any]:
    answers = {}
    for name, situation in inputs["situations"].items():
        measured: list[float] = []
        rate = functions[0](replay(situation["runs"], measured), list(inputs["rates"]), dict(situation["promise"]))
        answers[name] = {"rate": None if rate is None else float(rate), "measured": measured}
    return answers


def _search_oracle(inputs) -> dict[str, Any]:
    return {
        "rates": sorted(inputs["rates"]),
        **{
            name: highest_rate_oracle(situation["runs"], inputs["rates"], situation["promise"])
            for name, situation in inputs["situations"].items()
        },
    }


SEARCH_MISTAKES = {
    "tail": "at that rate most requests were fast, but the p99 TPOT was over the promise: the mean or the median "
    "hides the slowest 1% (use the 99th percentile: np.percentile(tpots, 99))",
    "lost": "at that rate a request was lost (ok False): a request the server refused or broke off breaks the "
    "promise however fast the others were",
    "noise": "a rate that passes above one that failed is noise, not capacity: the promise has to hold at every "
    "load up to the one you sign, so stop at the first rate that breaks it",
    "hopeless": "even the lowest rate breaks the promise here: return None (no rate keeps it)",
    "two limits": "this promise has two limits, p99 TTFT and p99 TPOT: TPOT kept its limit at every rate, but the "
    "queue pushed the p99 TTFT over its own; check every metric of the promise",
}


def grid_offset(rates: list[float], want: float | None, mine: float | None) -> int | None:
    """How many rates of the grid ``mine`` is above ``want`` (None counts as one below the lowest; None if
    ``mine`` is not on the grid)."""
    index = {None: -1, **{rate: i for i, rate in enumerate(sorted(rates))}}
    return None if mine not in index else index[mine] - index[want]


def off_by_one(rates: list[float], expected, got) -> Mismatch | None:
    """The same shift of the grid in several situations, whatever each teaches: an off-by-one in the search
    itself, not a misreading of one kind of measurement."""
    offsets = {name: grid_offset(rates, expected[name]["rate"], got[name]["rate"]) for name in SITUATIONS}
    shifts = {offset for offset in offsets.values() if offset}
    wrong = [name for name, offset in offsets.items() if offset]
    if len(shifts) != 1 or None in shifts or len(wrong) < 2:
        return None
    shift, name = shifts.pop(), wrong[0]
    seen = (
        f"situation '{name}': you answered {got[name]['rate']}, labkit's rule gives {expected[name]['rate']}, and "
        f"your answer is off by the same {abs(shift)} step{'s' if abs(shift) > 1 else ''} of the grid in "
        f"{len(wrong)} of the {len(SITUATIONS)} situations: an off-by-one in the search"
    )
    if shift == 1:
        return Mismatch(
            f"{seen}; you return the first rate that broke the promise, not the last that kept it",
            "Remember a rate once it has kept the promise; when one breaks it, return the one remembered (None if "
            "none was).",
        )
    where = "below" if shift < 0 else "above"
    return Mismatch(
        f"{seen}; you return a rate {where} the last that kept the promise",
        "The answer is the rate just below the first that breaks the promise: remember each rate as it keeps it "
        "and return the last one remembered.",
    )


def _compare_search(expected, got) -> Mismatch | None:
    problem = off_by_one(expected["rates"], expected, got)
    if problem is not None:
        return problem
    for name in SITUATIONS:
        want, mine = expected[name], got[name]
        if mine["rate"] != want["rate"]:
            return Mismatch(
                f"situation '{name}': you answered {mine['rate']}, labkit's rule gives {want['rate']}; "
                + SEARCH_MISTAKES[name]
            )
    for name in SITUATIONS:
        want, mine = expected[name], got[name]
        if len(mine["measured"]) > len(want["measured"]):
            return Mismatch(
                f"situation '{name}': right answer, but you measured {mine['measured']} where "
                f"{want['measured']} was enough",
                "Each measurement is minutes of load on a real server: go up from the lowest rate and stop at "
                "the first one that breaks the promise.",
            )
    return None


def _known_search_error(record: dict[str, Any]) -> str | None:
    if record["error"] == "TypeError" and "None" in record["message"]:
        return (
            "A lost request has ok False and no latencies (None). Look at ok first: one lost request breaks the "
            "promise by itself; take the percentile over the requests that were served."
        )
    return None


SEARCH = diagnosed(
    Exercise(
        id="lab9.highest_rate",
        functions=("highest_rate",),
        answers=("labkit.labs.lab9.capacity.course_highest_rate", "labkit.slo.highest_rate"),
        make_inputs=sweep_situations,
        run=_run_search,
        oracle=_search_oracle,
        compare=_compare_search,
        tested="replayed load tests at six rates in five situations (a tail only the p99 sees, a lost request, "
        "a rate passing again above a failure, a promise nothing keeps, a promise with a TTFT and a TPOT limit): "
        "your answer equals labkit's rule and you measure no rate past the first that breaks the promise",
        hint="Go up from the lowest rate; a rate keeps the promise if every request is ok and, for every metric "
        "of the promise, the 99th percentile is within its limit; stop at the first that does not and return "
        "the one before (or None).",
        points=2.0,
    ),
    _known_search_error,
)
register(SEARCH)

# --- lab9.find_capacity -----------------------------------------------------------------------


register(
    on_its_own(
        diagnosed(
            Exercise(
                id="lab9.find_capacity",
                functions=("find_capacity",),
                make_inputs=capacity_inputs,
                run=run_capacity,
                oracle=capacity_oracle,
                compare=judge_sweep,
                tested="your sweep runs against a fresh labkit serve (4 seats) with a promise of 5x the TTFT and "
                "3x the TPOT one user alone sees there, and every load it sends is recorded: it must send the lab's "
                "LOAD to that server, each rate once, up to the first that breaks the promise, and your rate must "
                "equal labkit's rule applied to exactly those measurements; then the same again with the load tester "
                "answering from a stored sweep whose capacity is known, under another promise. Your find_capacity "
                "runs with labkit's highest_rate in place of yours, which its own exercise checks",
                hint="find_capacity(url, rates, promise) = highest_rate(a measure that loads url with LOAD, rates, "
                "promise).",
            )
        ),
        Piece(SEARCH, course_highest_rate),
    )
)

register_hints(
    "lab9.engine_turn",
    "The HTTP side and the engine meet in two places only: the inbox (commands in) and send (outputs out). "
    "A turn is: empty the inbox into the engine, run one step, hand out what it made.",
    "For each command: 'add' -> llm.add_request(prompt_ids, params, request_id=...); 'abort' -> "
    "llm.abort_request(request_id). Then, only if llm.has_unfinished(), outputs = llm.step().",
    "while inbox: kind, *rest = inbox.pop(0) ... then: for output in llm.step(): send(output). Do not wait for "
    "output.finished: each output carries the tokens so far, and streaming clients want every one.",
)
register_hints(
    "lab9.continuous_schedule",
    "This is lab 4's first exercise, unchanged: the server's engine calls your policy once per step, whoever the "
    "requests came from.",
    "Open lab 4, copy the body of the continuous_schedule that passed its check into this cell.",
    "Running requests first (state.reserve, their num_missing_tokens), then admit from the head of state.waiting "
    "while len(state.running) < state.max_num_seqs, the token budget and state.blocks.can_allocate allow.",
)
register_hints(
    "lab9.admit",
    "Seats free up in parallel: max_num_seqs of them, each held service_s seconds, so one frees every "
    "service_s / max_num_seqs seconds on average.",
    "The newcomer's place in line for a seat: running + waiting + 1 - max_num_seqs (0 or less: a seat is free). "
    "Its wait: that place times the time between two seats freeing up. No service_s yet: admit.",
    "Admit (None) if wait_s * 1000 <= promise_ms; otherwise return max(1, math.ceil(wait_s - promise_ms / 1000)).",
)
register_hints(
    "lab9.dashboard",
    "A scrape is a snapshot since the server started. A dashboard shows a window: for counters and histograms "
    "the increase between two scrapes; for gauges (running, KV usage) the value now.",
    "Parse both texts with parse_metrics. finished = the increase of vllm:request_success_total summed over its "
    "finished_reason labels; mean TTFT = increase of _sum over increase of _count; hit rate = increase of "
    "prefix_cache_hits over increase of prefix_cache_queries.",
    "p90: take the window's bucket counts (after - before, each le), sorted by le; rank = 0.9 * the +Inf count; "
    "find the first bucket whose count >= rank and interpolate between its lower and upper edge: "
    "lower + (upper - lower) * (rank - count_below) / (count - count_below).",
)
register_hints(
    "lab9.highest_rate",
    "A promise on p99 TPOT is about the slowest 1% of users, not the average one, and a lost request breaks it "
    "outright. Go up in load and stop at the first rate that breaks it.",
    "For rate in sorted(rates): requests = measure(rate); if any request is not ok, or for some metric, limit in "
    "promise.items() np.percentile([r[metric] for r in requests], 99) > limit: stop. Otherwise remember the rate.",
    "Return the last rate that kept the promise, or None if the lowest already broke it; never measure past the "
    "first failure.",
)
register_hints(
    "lab9.find_capacity",
    "You have everything already: measure(url, rate, **LOAD) runs one load test, and highest_rate searches.",
    "Give highest_rate a measure that takes only the rate: lambda rate: measure(url, rate, **LOAD).",
    "return highest_rate(lambda rate: measure(url, rate, **LOAD), rates, promise)",
)
