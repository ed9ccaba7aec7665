"""`labkit.check`: instant feedback in the notebook, a clear PASS or FAIL with a hint.

The check builds inputs from a fixed seed (so the message is the same each run),
runs the learner's functions, compares with the oracle, and shows the verdict as
HTML in Jupyter or as plain text elsewhere. It never raises because of the
learner's code: a NotImplementedError reads "NOT DONE", any other error is one
line naming the learner's own line that failed.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import sys
from collections.abc import Callable, Mapping
from typing import Any

from labkit.grading.attempt import OK, attempt_exercise, attempt_in_namespace
from labkit.grading.checks import get_exercise
from labkit.grading.graded_run import check_left_to_grader, in_graded_run
from labkit.grading.judge import expected_outputs, judge, with_source_rule
from labkit.grading.result import NOT_DONE, PASS, CheckResult

# Border colours of the HTML box, by status; anything else is a failure.
_COLOURS = {PASS: "#2e7d32", NOT_DONE: "#9e9e9e"}
_FAILURE_COLOUR = "#c62828"


_verdicts: dict[tuple[Any, ...], bool] = {}  # (exercise id, seed, *function objects) -> passed, in this process


def evaluate(
    exercise_id: str,
    *functions: Callable[..., Any],
    seed: int = 0,
    namespace: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> CheckResult:
    """Run one exercise's check in this process and return the verdict without showing it.

    Pass the learner's functions in the order the exercise lists them, or a
    `namespace` (such as the notebook's globals) to find them by name. An exercise with a
    `source_rule` reads the exercise cell's `source` (default: the latest notebook cell that
    defines its functions). Each verdict is remembered by the function objects it judged
    (see :func:`known_verdict`). In the grader's kernel nothing is checked here: the grader does it
    after the notebook has run (graded_run.py).
    """
    if in_graded_run():
        return check_left_to_grader(exercise_id)
    exercise = get_exercise(exercise_id)
    if functions:
        if len(functions) != len(exercise.functions):
            names = ", ".join(exercise.functions)
            raise ValueError(
                f"{exercise_id} needs {len(exercise.functions)} function(s) ({names}); got {len(functions)}"
            )
        attempt = attempt_exercise(exercise, functions, seed)
    else:
        namespace = namespace or {}
        attempt = attempt_in_namespace(exercise, namespace, seed)
        functions = tuple(namespace.get(name) for name in exercise.functions)
    if attempt.status != OK:  # not done, missing or raising: no oracle needed (some measure for a minute)
        result = judge(exercise, attempt, None)
    else:
        result = judge(exercise, attempt, expected_outputs(exercise, seed))
    if exercise.source_rule is not None:
        source = source if source is not None else cell_source(exercise.functions)
        if source is None and result.passed:
            result = dataclasses.replace(result, message=f"{result.message}\nNote: {_NO_SOURCE}")
        elif source is not None:
            result = with_source_rule(exercise, result, source)
    _verdicts[(exercise_id, seed, *functions)] = result.passed
    return result


_NO_SOURCE = "no notebook cell defining these functions was found, so the rules on its source were not checked here"


def cell_source(names: tuple[str, ...]) -> str | None:
    """The source of the latest notebook cell run (IPython's history) that defines every one of ``names``."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    history = shell.user_ns.get("In", []) if shell is not None else []
    for source in reversed(history):
        try:
            defined = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
        except SyntaxError:
            continue
        if set(names) <= defined:
            return source
    return None


def known_verdict(exercise_id: str, functions: tuple[Callable[..., Any], ...], seed: int = 0) -> bool | None:
    """Whether these very functions passed the exercise's last check in this process (None: never checked).

    A demo cell's gate asks this after the check cell above it, so the learner's code and the
    oracle do not run twice; running a function's cell again makes a new object, checked afresh.
    """
    return _verdicts.get((exercise_id, seed, *functions))


def to_html(result: CheckResult) -> str:
    """The verdict as a coloured box: headline in bold, then one line per part of the message."""
    colour = _COLOURS.get(result.status, _FAILURE_COLOUR)
    headline, *details = result.message.splitlines()
    rows = []
    for line in details:
        label, separator, text = line.partition(": ")
        rows.append(
            f"<div><b>{html.escape(label)}:</b> {html.escape(text)}</div>"
            if separator
            else f"<div>{html.escape(line)}</div>"
        )
    return (
        f'<div style="border-left: 6px solid {colour}; padding: 4px 10px; margin: 4px 0">'
        f'<div style="color: {colour}; font-weight: bold">{html.escape(headline)}</div>{"".join(rows)}</div>'
    )


def show(result: CheckResult) -> None:
    """Display as HTML (with a text fallback) inside a Jupyter kernel; print elsewhere."""
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        display({"text/plain": result.message, "text/html": to_html(result)}, raw=True)
    else:
        print(result.message)


def check(exercise_id: str, *functions: Callable[..., Any], seed: int = 0) -> None:
    """Check an exercise and show PASS or FAIL with the first difference and a hint.

    `labkit.check("lab2.decode_with_cache", decode_with_cache)`; without functions,
    they are looked up by name among the caller's globals (the notebook's variables).
    """
    caller_globals = sys._getframe(1).f_globals
    result = evaluate(exercise_id, *functions, seed=seed, namespace=caller_globals)
    if in_graded_run():
        print(result.message)
    else:
        show(result)
