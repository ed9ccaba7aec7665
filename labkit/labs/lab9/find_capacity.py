"""Lab 9, exercise 6: ``find_capacity(url, rates, promise)``, the SLO sweep against a real server, judged on the
loads it sent (:mod:`~labkit.labs.lab9.capacity`), with labkit's ``highest_rate`` in place of the learner's."""

from __future__ import annotations

from labkit.grading.checks import Exercise, register
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.hints import register_hints
from labkit.labs.lab9.capacity import capacity_inputs, capacity_oracle, course_highest_rate, judge_sweep, run_capacity
from labkit.labs.lab9.highest_rate import SEARCH

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
    "lab9.find_capacity",
    "You have everything already: measure(url, rate, **LOAD) runs one load test, and highest_rate searches.",
    "Give highest_rate a measure that takes only the rate: lambda rate: measure(url, rate, **LOAD).",
    "return highest_rate(lambda rate: measure(url, rate, **LOAD), rates, promise)",
)
