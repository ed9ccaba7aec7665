"""Lab 9, exercise 5: ``highest_rate(measure, rates, promise)``, the highest request rate whose p99 latencies keep
the promise with nothing lost, compared with labkit's rule on replayed measurements, each situation teaching one
mistake; the same shift of the grid in several situations is named as an off-by-one."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.hints import register_hints
from labkit.labs.lab9.capacity import SITUATIONS, grid_offset, highest_rate_oracle, replay, sweep_situations


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
register_hints(
    "lab9.highest_rate",
    "A promise on p99 TPOT is about the slowest 1% of users, not the average one, and a lost request breaks it "
    "outright. Go up in load and stop at the first rate that breaks it.",
    "For rate in sorted(rates): requests = measure(rate); if any request is not ok, or for some metric, limit in "
    "promise.items() np.percentile([r[metric] for r in requests], 99) > limit: stop. Otherwise remember the rate.",
    "Return the last rate that kept the promise, or None if the lowest already broke it; never measure past the "
    "first failure.",
)
