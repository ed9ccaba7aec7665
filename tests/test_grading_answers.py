"""Issue 51.3: labkit's answer to an exercise is out of reach of the learner's code while it is checked.

The notebook's `labkit.check` and the grader's kernel both go through `attempt_exercise`, so these
in-process tests cover both; the hostile run (test_grading_sandbox.py) grades such a notebook.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import labkit.grading.answers as answers_module
import labkit.grading.exercises.demo as demo
from labkit.engine.state import SchedulerOutput
from labkit.grading.answers import ReferenceAnswerCalled, ledger, reference
from labkit.grading.attempt import attempt_exercise
from labkit.grading.checks import get_exercise
from labkit.grading.feedback import evaluate
from labkit.grading.result import ERROR, PASS
from labkit.kernels.traffic import DecodeShape
from labkit.kv.paged_batch import PagedBatch, SequenceSlice
from labkit.labs.manifest import LABS
from labkit.models.quant import Int4Weight, Int8Weight
from labkit.slo import Promise, from_requests

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
    """A function with the reference's code that is not the reference: what a learner who wrote the same would hand in.
    A class is copied with what it inherits from labkit (blocking a class blocks its subclasses)."""
    if isinstance(function, types.FunctionType):
        twin = types.FunctionType(
            function.__code__, function.__globals__, function.__name__, function.__defaults__, function.__closure__
        )
        twin.__kwdefaults__ = function.__kwdefaults__
        return twin
    if isinstance(function, type):
        body = {k: v for c in reversed(function.__mro__[:-1]) for k, v in vars(c).items() if k not in DESCRIPTORS}
        return type(function.__name__, (), {**body, "__module__": __name__})
    return function


DESCRIPTORS = ("__dict__", "__weakref__")


def cheat_calling(dotted: str):
    """A learner's function that hands in labkit's answer, looked up (module, class) when called."""

    def cheat(*args, **kwargs):
        return reference(dotted)(*args, **kwargs)

    return cheat


def int4_codes(quantized: Int4Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return quantized.codes[:, : quantized.in_features], quantized.scale, quantized.zero


def int4_weight(codes, scale, zero, group_size=128) -> Int4Weight:
    padded = torch.nn.functional.pad(codes, (0, scale.shape[1] * group_size - codes.shape[1]))
    return Int4Weight(padded, scale, zero, codes.shape[1], group_size)


def continuous_with(schedule_running, chunked=False):
    """Continuous batching as a learner writes it around labkit's `schedule_running`."""

    def schedule(state):
        output = SchedulerOutput()
        budget = schedule_running(state, output, state.max_num_batched_tokens, chunked)
        while not output.preempted and state.waiting and len(state.running) < state.max_num_seqs and budget > 0:
            request = state.waiting[0]
            num_new = min(request.num_missing_tokens, budget)
            if (request.num_missing_tokens > budget and not chunked) or not state.blocks.can_allocate(
                request.request_id, num_new
            ):
                break
            state.admit(request, num_new)
            output.scheduled[request.request_id] = num_new
            budget -= num_new
        return output

    return schedule


def waste_from_spans(batch_spans):
    def padding_waste(output_lens, batch_size):
        spans = batch_spans(output_lens, batch_size)
        useful, padded = sum(s[1] for s in spans), sum(s[2] for s in spans)
        return {"useful": useful, "padded": padded, "utilisation": useful / (useful + padded)}

    return padding_waste


def one_sequence(paged_attention):
    def attend(q, k_pool, v_pool, table, context_len):
        sequence = SequenceSlice(0, len(q), int(context_len), [int(block) for block in table])
        batch = PagedBatch.build([sequence], k_pool.shape[1], q.device, q.dtype)
        return paged_attention(0, q, k_pool, v_pool, batch)

    return attend


def expected_metrics(summarize):
    def serving_metrics(trace, slo):
        summary = summarize(trace, slo)
        means = {"ttft_ms": summary.ttft_ms.mean, "tpot_ms": summary.tpot_ms.mean, "itl_ms": summary.itl_ms.mean}
        return {**means, "goodput": summary.goodput}

    return serving_metrics


def policy_of(policy_class):
    return lambda state: policy_class().schedule(state)


def handing_off_with(piece: str):
    """lab12.kv_handoff written around one of labkit's pieces (``slots``, ``read`` or ``write``), the rest by hand."""

    def adapter(f):
        def hand_off_kv(source_k, source_v, table, num_tokens, allocator, target_k, target_v, seq_id):
            target = list(allocator.allocate(seq_id, num_tokens))
            for source, destination in ((source_k, target_k), (source_v, target_v)):
                for pool, into in zip(source, destination):
                    size, into_size = pool.shape[1], into.shape[1]
                    if piece == "slots":
                        rows = pool.reshape(-1, *pool.shape[2:])[f(table, num_tokens, size)]
                    elif piece == "read":
                        rows = f(pool, table, num_tokens)
                    else:
                        rows = torch.stack([pool[table[t // size], t % size] for t in range(num_tokens)])
                    if piece == "write":
                        f(into, target, rows)
                    else:
                        for t in range(num_tokens):
                            into[target[t // into_size], t % into_size] = rows[t]
            return target

        return hand_off_kv

    return adapter


# Where labkit's answer takes or gives its data in another shape than the exercise, per answer: how a learner would
# wrap it. The same wrapper turns a copy of it into the honest control.
ADAPTERS = {
    "labkit.kv.attention.causal_mask": lambda f: lambda n, device=None: f(n, n, device),
    "labkit.models.quant.quantize_int8": lambda f: lambda w: tuple(f(w)),
    "labkit.models.quant.dequantize_int8": lambda f: lambda codes, scale: f(Int8Weight(codes, scale)),
    "labkit.models.quant.quantize_int4": lambda f: lambda w, group_size=128: int4_codes(f(w, group_size)),
    "labkit.models.quant.dequantize_int4": lambda f: lambda *args: f(int4_weight(*args)),
    "labkit.kernels.traffic.decode_bytes": lambda f: lambda *args, **kwargs: f(DecodeShape(*args, **kwargs)),
    "labkit.viz.timeline.batch_spans": waste_from_spans,
    "labkit.engine.scheduler.continuous.ContinuousBatching": policy_of,
    "labkit.engine.fleet.CacheAware": lambda cls: (
        lambda replicas, max_imbalance: cls(max_imbalance).route(None, replicas)
    ),
    "labkit.kv.handoff.slots": handing_off_with("slots"),
    "labkit.kv.handoff.read_tokens": handing_off_with("read"),
    "labkit.kv.handoff.write_tokens": handing_off_with("write"),
    "labkit.engine.scheduler.chunked.ChunkedPrefill": policy_of,
    "labkit.engine.scheduler.base.schedule_running": continuous_with,
    "labkit.metrics.summarize": expected_metrics,
    "labkit.kv.paged_attention.paged_attention": one_sequence,
    "labkit.batch_invariant.tiled_linear": lambda f: (
        lambda x, weight, matmul, tile_rows: f(lambda rows: matmul(rows, weight), tile_rows)(x)
    ),
    "labkit.slo.highest_rate": lambda f: (
        lambda measure, rates, promise: f(
            {rate: from_requests(measure(rate)) for rate in rates}, Promise.from_limits(promise)
        )
    ),
}
# A chunked policy written around schedule_running passes chunked=True.
CHUNKED_ADAPTERS = {"labkit.engine.scheduler.base.schedule_running": lambda f: continuous_with(f, chunked=True)}


def adapted(exercise_id: str, dotted: str, function):
    chunked = exercise_id.startswith("lab6.") and dotted in CHUNKED_ADAPTERS
    return (CHUNKED_ADAPTERS if chunked else ADAPTERS).get(dotted, lambda f: f)(function)


def generating_with(cache_class):
    """lab2.generate_with_cache written out (labkit has no answer to it) on the cache it is handed in with."""

    def generate_with_cache(model, prompt_ids, n):
        cache, device, new = cache_class(model.config.num_layers), model.device, []
        logits = model.forward(torch.tensor(prompt_ids, device=device), torch.arange(len(prompt_ids)), cache.attend)
        while len(new) < n:
            new.append(int(logits[-1].argmax()))
            if len(new) < n:
                logits = model.forward(
                    torch.tensor(new[-1:], device=device), torch.tensor([cache.length]), cache.attend
                )
        return new

    return generate_with_cache


# Where a function of the exercise has no labkit answer: its first answer solves function AFTER, and the learner's
# functions are WRITTEN from those that have one.
AFTER = {"lab2.generate_with_cache": 1}
WRITTEN = {"lab2.generate_with_cache": lambda functions: {0: generating_with(functions[1]), **functions}}


def position(exercise, index: int) -> int:
    """Which of the learner's functions an answer solves: answers follow the functions, extra ones solve the last."""
    return min(index + AFTER.get(exercise.id, 0), len(exercise.functions) - 1)


def submission(exercise_id: str, functions: dict[int, object]) -> list:
    functions = WRITTEN.get(exercise_id, lambda functions: functions)(functions)
    return [functions[index] for index in sorted(functions)]


LAB_NAMES = [lab.name for lab in LABS]
COVERED = [exercise_id for exercise_id, answers in ledger(LAB_NAMES).items() if answers]


def test_every_lab_declares_answers_that_exist():
    declared = ledger(LAB_NAMES)
    covered_labs = {exercise_id.partition(".")[0] for exercise_id in COVERED}
    assert covered_labs == {lab.name for lab in LABS}
    for exercise_id, answers in declared.items():
        for dotted in answers:
            assert callable(reference(dotted)), (exercise_id, dotted)


def test_every_exercise_that_declares_no_answer_says_why_in_the_module_docstring():
    """The ledger is read from the registry; only the reasons are prose, and none may go missing."""
    reasons = answers_module.__doc__.split("Not covered, and why:")[1]
    unexplained = [
        exercise_id for exercise_id, answers in ledger(LAB_NAMES).items() if not answers and exercise_id not in reasons
    ]
    assert not unexplained, f"say in labkit/grading/answers.py why these declare no answer: {unexplained}"


def written_out(exercise) -> dict[int, object]:
    """The learner's functions with labkit's answers written out: the first answer of each function, copied."""
    functions: dict[int, object] = {}
    for index, dotted in enumerate(exercise.answers):
        functions.setdefault(position(exercise, index), adapted(exercise.id, dotted, copy_of(reference(dotted))))
    return functions


@pytest.mark.parametrize("exercise_id", COVERED)
def test_a_lab_exercise_fails_on_its_reference_and_passes_on_the_same_code_written_out(exercise_id):
    """One cheating submission per answer (and so per lab) and its honest control, as `labkit.check` runs them."""
    exercise = get_exercise(exercise_id)
    honest_functions = submission(exercise_id, written_out(exercise))
    assert len(honest_functions) == len(exercise.functions)  # an answer (or a written-out function) for each
    honest = evaluate(exercise_id, *honest_functions)
    assert honest.status == PASS, honest.message
    for index, dotted in enumerate(exercise.answers):
        functions = written_out(exercise)
        functions[position(exercise, index)] = adapted(exercise_id, dotted, cheat_calling(dotted))
        result = evaluate(exercise_id, *submission(exercise_id, functions))
        assert result.status == ERROR and f"your code called {dotted}, the reference answer" in result.message, (
            dotted,
            result.message,
        )
        assert "refuse" not in getattr(reference(dotted), "__name__", "")  # put back
        if isinstance(reference(dotted), type):
            assert "refuse" not in reference(dotted).__init__.__name__


# One notebook per lab that hands in labkit's answers the ways a notebook reaches them (bound early by an import,
# a package's re-export, an alias, a subclass, a method, a module attribute), and what each exercise must name.
NOTEBOOKS = {
    "lab2": (
        """
from labkit.kv.contiguous import ContiguousKVCache
KVCache = ContiguousKVCache

def kv_bytes_per_token(config, dtype):
    return config.kv_bytes_per_token(dtype)
""",
        {
            "lab2.kv_cache": "labkit.kv.contiguous.ContiguousKVCache",
            "lab2.kv_bytes_per_token": "labkit.models.config.ModelConfig.kv_bytes_per_token",
        },
    ),
    "lab3": (
        """
from labkit.labs.lab3 import course_padded_causal_mask, padded_layout as left_pad

def padded_causal_mask(key_is_real, num_queries):
    return course_padded_causal_mask(key_is_real, num_queries)
""",
        {
            "lab3.left_pad": "labkit.labs.lab3.padded_layout",
            "lab3.padded_causal_mask": "labkit.labs.lab3.course_padded_causal_mask",
        },
    ),
    "lab4": (
        """
from labkit.engine.scheduler import newest
from labkit.metrics import summarize

def choose_victim(state, request):
    return newest(state, request)

def serving_metrics(trace, slo):
    s = summarize(trace, slo)
    return {"ttft_ms": s.ttft_ms.mean, "tpot_ms": s.tpot_ms.mean, "itl_ms": s.itl_ms.mean, "goodput": s.goodput}
""",
        {"lab4.preemption": "labkit.engine.state.newest", "lab4.serving_metrics": "labkit.metrics.summarize"},
    ),
    "lab5": (
        """
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.lab5 import _slots as slot_mapping

class PagedBlockAllocator(FreeListBlockAllocator):
    pass
""",
        {
            "lab5.block_allocator": "labkit.kv.block_allocator.FreeListBlockAllocator",
            "lab5.slot_mapping": "labkit.labs.lab5._slots",
        },
    ),
    "lab6": (
        """
from labkit.engine.scheduler import ChunkedPrefill
from labkit.labs import lab6
choose_budget = lab6.largest_budget

def chunked_schedule(state):
    return ChunkedPrefill().schedule(state)
""",
        {
            "lab6.chunked_schedule": "labkit.engine.scheduler.chunked.ChunkedPrefill",
            "lab6.choose_budget": "labkit.labs.lab6.largest_budget",
        },
    ),
    "lab9": (
        """
import labkit.slo as slo
from labkit.labs.lab9.dashboard import read_dashboard as dashboard
from labkit.serve.admission import retry_after

def admit(queue, promise_ms):
    return retry_after(queue, promise_ms)

def highest_rate(measure, rates, promise):
    measured = {rate: slo.from_requests(measure(rate)) for rate in rates}
    return slo.highest_rate(measured, slo.Promise.from_limits(promise))
""",
        {
            "lab9.admit": "labkit.serve.admission.retry_after",
            "lab9.dashboard": "labkit.labs.lab9.dashboard.read_dashboard",
            "lab9.highest_rate": "labkit.slo.highest_rate",
        },
    ),
}


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_a_notebook_that_hands_in_labkits_answers_fails_them_by_name_and_the_honest_one_passes(lab):
    """Issue 51.3, one such submission per lab: its functions found by name in the notebook's globals, as
    `labkit.check` and the grader's kernel find them; the same exercises written out pass."""
    source, named = NOTEBOOKS[lab]
    notebook: dict = {"__name__": "__main__"}
    exec(compile(source, f"{lab}.ipynb", "exec"), notebook)
    for exercise_id, dotted in named.items():
        result = evaluate(exercise_id, namespace=notebook)
        assert result.status == ERROR and result.points == 0, (exercise_id, result.message)
        assert f"{exercise_id}: your code called {dotted}, the reference answer" in result.message, result.message
        honest = evaluate(exercise_id, *submission(exercise_id, written_out(get_exercise(exercise_id))))
        assert honest.status == PASS, (exercise_id, honest.message)
    assert all(callable(reference(dotted)) and "refuse" not in str(reference(dotted)) for dotted in named.values())


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
