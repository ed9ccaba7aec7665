"""Issue 51.3: labkit's answer to an exercise is out of reach of the learner's code while it is checked.

The notebook's `labkit.check` and the grader's kernel both go through `attempt_exercise`, so these
in-process tests cover both; the hostile run (test_grading_sandbox.py) grades such a notebook.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

import pytest
import torch

import labkit.grading.exercises.demo as demo
from labkit.grading.answers import ReferenceAnswerCalled, reference
from labkit.grading.attempt import attempt_exercise
from labkit.grading.checks import exercises_for_lab, get_exercise
from labkit.grading.feedback import evaluate
from labkit.grading.result import ERROR, PASS
from labkit.kernels.traffic import DecodeShape
from labkit.labs.manifest import LABS
from labkit.models.quant import Int4Weight, Int8Weight

course_add = demo.course_add  # bound early, as `from ... import` in a notebook binds it


def calls_bound_early(a, b):
    return course_add(a, b)


def calls_through_module(a, b):
    return demo.course_add(a, b)


def catches_the_refusal(a, b):
    try:
        return demo.course_add(a, b)
    except ReferenceAnswerCalled:
        return a + b


@pytest.mark.parametrize("learner", [calls_bound_early, calls_through_module, catches_the_refusal, demo.course_add])
def test_calling_the_reference_fails_the_exercise_and_says_why(learner):
    result = evaluate("demo.add", learner)
    assert result.status == ERROR and result.points == 0, result.message
    assert "demo.add: your code called labkit.grading.exercises.demo.course_add, the reference answer" in result.message
    assert demo.course_add is course_add and globals()["course_add"] is course_add  # put back afterwards


def test_every_other_reference_and_the_oracle_keep_working():
    def add_using_another_exercises_answer(a, b):
        return demo.course_softmax(torch.stack([a, b]))[0] * 0 + a + b  # labkit's softmax is not this answer

    assert evaluate("demo.add", add_using_another_exercises_answer).status == PASS
    assert evaluate("demo.add", lambda a, b: a + b).status == PASS


def copy_of(function):
    """A function with the reference's code that is not the reference: what a learner who wrote the same would hand in."""
    if isinstance(function, types.FunctionType):
        twin = types.FunctionType(
            function.__code__, function.__globals__, function.__name__, function.__defaults__, function.__closure__
        )
        twin.__kwdefaults__ = function.__kwdefaults__
        return twin
    return function


def cheat_calling(dotted: str):
    """A learner's function that hands in labkit's answer, looked up through its module when called."""
    module_name, _, name = dotted.rpartition(".")

    def cheat(*args, **kwargs):
        return getattr(importlib.import_module(module_name), name)(*args, **kwargs)

    return cheat


def int4_codes(quantized: Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantized.codes[:, : quantized.in_features], quantized.scale, quantized.zero


def int4_weight(codes, scale, zero, group_size=128) -> Int4Weight:
    padded = torch.nn.functional.pad(codes, (0, scale.shape[1] * group_size - codes.shape[1]))
    return Int4Weight(padded, scale, zero, codes.shape[1], group_size)


# Where labkit's answer takes or gives its data in another shape than the exercise, per function: how a
# learner would wrap it. The same wrapper turns a copy of it into the honest control.
ADAPTERS = {
    "lab1.causal_mask": (lambda f: lambda n, device=None: f(n, n, device),),
    "lab10.int8": (lambda f: lambda w: tuple(f(w)), lambda f: lambda codes, scale: f(Int8Weight(codes, scale))),
    "lab10.int4": (
        lambda f: lambda w, group_size=128: int4_codes(f(w, group_size)),
        lambda f: lambda *args: f(int4_weight(*args)),
    ),
    "lab11.decode_bytes": (lambda f: lambda *args, **kwargs: f(DecodeShape(*args, **kwargs)),),
}


def adapted(exercise_id: str, position: int, function):
    return ADAPTERS.get(exercise_id, [lambda f: f] * 2)[position](function)


COVERED = [exercise.id for lab in LABS for exercise in exercises_for_lab(lab.name) if exercise.answers]


def test_the_labs_declare_answers_that_exist():
    declared = {exercise.id: exercise.answers for lab in LABS for exercise in exercises_for_lab(lab.name)}
    covered_labs = {exercise_id.partition(".")[0] for exercise_id, answers in declared.items() if answers}
    assert covered_labs >= {"lab1", "lab7", "lab8", "lab10", "lab11"}
    for exercise_id, answers in declared.items():
        for dotted in answers:
            assert callable(reference(dotted)), (exercise_id, dotted)


@pytest.mark.parametrize("exercise_id", COVERED)
def test_a_lab_exercise_fails_on_its_reference_and_passes_on_the_same_code_written_out(exercise_id):
    """One cheating submission per exercise (and so per lab) and its honest control, as `labkit.check` runs them."""
    exercise = get_exercise(exercise_id)
    written_out = [adapted(exercise_id, i, copy_of(reference(dotted))) for i, dotted in enumerate(exercise.answers)]
    assert len(written_out) == len(exercise.functions)  # answers name the reference of each function, in order
    honest = evaluate(exercise_id, *written_out)
    assert honest.status == PASS, honest.message
    for position, dotted in enumerate(exercise.answers):
        functions = list(written_out)
        functions[position] = adapted(exercise_id, position, cheat_calling(dotted))
        result = evaluate(exercise_id, *functions)
        assert result.status == ERROR and f"your code called {dotted}, the reference answer" in result.message
        assert reference(dotted) is not None and "refuse" not in reference(dotted).__name__  # put back


def test_the_reference_is_put_back_even_when_the_run_is_interrupted():
    """A cell interrupted mid-check (KeyboardInterrupt passes every `except Exception`) leaves labkit whole."""

    original = course_add  # a local: out of the block's reach (module names are swapped, not closures)
    seen = []

    def interrupted(functions, inputs):
        seen.extend([demo.course_add is original, globals()["course_add"] is original])
        raise KeyboardInterrupt

    exercise = dataclasses.replace(get_exercise("demo.add"), run=interrupted)
    with pytest.raises(KeyboardInterrupt):
        attempt_exercise(exercise, (calls_bound_early,), seed=0)
    assert seen == [False, False]  # stubs while it ran
    assert demo.course_add is original and globals()["course_add"] is original
