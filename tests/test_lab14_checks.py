"""Lab 14's checks: the right answers pass under several seeds, and each typical wrong one fails with its mistake named.

The answers are the solved notebook's own cells (``tests/lab_sources.py``); a wrong answer is the solution with one
typical mistake edited in, or written here as a learner would write it. The expert-parallel check runs two real
processes per evaluation (about a second each on an idle machine), so its wrong answers are tried under one seed.
"""

from __future__ import annotations

import time
from unittest import mock

import pytest
import torch

from labkit.grading import evaluate
from labkit.grading.result import NOT_DONE
from labkit.labs import lab14
from labkit.labs.hints import tiers
from labkit.labs.lab14 import course, moe_model, ranks
from labkit.sim.moe import expected_distinct_experts
from tests.lab_sources import solved_exercise

pytestmark = [pytest.mark.lab14]
SEEDS = [0, 1, 5]


def route(*edits):
    return solved_exercise("lab14.route", ("route",), edits)[0]


def dispatch(*edits):
    return solved_exercise("lab14.dispatch", ("moe_dispatch",), edits)[0]


def parallel(*edits):
    return solved_exercise("lab14.expert_parallel", ("expert_parallel_moe",), edits)[0]


def bytes_per_step(*edits):
    return solved_exercise("lab14.bytes_per_step", ("weight_bytes_per_step",), edits)[0]


def case_id(value) -> str:
    """A test id that is the same in every process (pytest-xdist compares them): a function's name, a text's start."""
    return value[:30] if isinstance(value, str) else getattr(value, "__name__", type(value).__name__)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "exercise, answer", [("route", route), ("dispatch", dispatch), ("bytes_per_step", bytes_per_step)]
)
def test_the_solved_answers_pass(exercise, answer, seed):
    result = evaluate(f"lab14.{exercise}", answer(), seed=seed)
    assert result.passed, result.message


def softmax_of_the_chosen_logits(logits, k):
    values, chosen = logits.topk(k, dim=-1)
    return torch.softmax(values, dim=-1), chosen


def experts_in_ascending_order(logits, k):
    weights, chosen = route()(logits, k)
    order = chosen.argsort(dim=-1)
    return weights.gather(-1, order), chosen.gather(-1, order)


@pytest.mark.parametrize("answer", [softmax_of_the_chosen_logits, experts_in_ascending_order])
def test_the_same_routing_written_otherwise_passes(answer):
    assert evaluate("lab14.route", answer, seed=3).passed


ROUTE_MISTAKES = [
    (
        route(("return weights / weights.sum(dim=-1, keepdim=True), chosen", "return weights, chosen")),
        "not renormalized",
    ),
    (route(("softmax(logits.float(), dim=-1)", "softmax(logits.float(), dim=0)")), "softmax ran over the tokens"),
    (route(("topk(k, dim=-1)", "topk(k, dim=-1, largest=False)")), "LEAST likely"),
    (lambda logits, k: logits.topk(k, dim=-1), "raw logits"),
    (route(("torch.softmax(logits.float(), dim=-1)", "torch.sigmoid(logits.float())")), "sigmoid"),
    (route(("topk(k, dim=-1)", "topk(1, dim=-1)")), "Use the k you are given"),
    (lambda logits, k: route()(logits, k)[::-1], "(chosen, weights), in that order"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("answer, words", ROUTE_MISTAKES, ids=case_id)
def test_a_wrong_routing_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab14.route", answer, seed=seed)
    assert not result.passed and words in result.message, result.message


def per_token_loop(x, weights, chosen, expert):
    out = torch.zeros_like(x)
    for t in range(len(x)):
        for w, e in zip(weights[t], chosen[t]):
            out[t] += w * expert(int(e), x[t : t + 1])[0]
    return out


def crashes_on_an_empty_expert(x, weights, chosen, expert):
    for e in range(8):
        if not (chosen == e).any():
            torch.cat([])
    return dispatch()(x, weights, chosen, expert)


DISPATCH_MISTAKES = [
    (dispatch(("flat_weights[picks, None] * ", "")), "weights were not applied"),
    (dispatch(("flat_weights[picks, None] *", "flat_weights[picks, None] ** 2 *")), "applied twice"),
    (
        dispatch(
            (
                "flat, flat_weights = chosen.flatten(), weights.flatten()",
                "flat, flat_weights = chosen[:, 0], weights[:, 0]",
            ),
            (".repeat_interleave(chosen.shape[1])", ""),
        ),
        "only its first expert",
    ),  # fmt: skip
    (dispatch(("out.index_add_(0, rows,", "out.index_add_(0, rows.flip(0),")), "the tokens whose rows you handed it"),
    (per_token_loop, "was called"),
    (crashes_on_an_empty_expert, "no token chose"),
    (lambda x, weights, chosen, expert: dispatch()(x, weights, chosen, expert)[:, :32], "has shape"),
]


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("answer, words", DISPATCH_MISTAKES, ids=case_id)
def test_a_wrong_dispatch_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab14.dispatch", answer, seed=seed)
    assert not result.passed and words in result.message, result.message


BYTES_MISTAKES = [
    (bytes_per_step(("len(layer.unique())", "layer.numel()")), "once per token"),
    (lambda chosen, expert_bytes, other_bytes: other_bytes + len(chosen) * 8 * expert_bytes, "dense model"),
    (lambda chosen, e, o: o + len(torch.cat([c.flatten() for c in chosen]).unique()) * e, "over all the layers"),
    (lambda chosen, e, o: o + len(chosen[0].unique()) * e, "first layer"),
    (bytes_per_step(("return other_bytes + ", "return ")), "other_bytes is missing"),
    (lambda chosen, e, o: str(o), "Return a number of bytes"),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("answer, words", BYTES_MISTAKES, ids=case_id)
def test_a_wrong_byte_count_fails_with_its_mistake_named(answer, words, seed):
    result = evaluate("lab14.bytes_per_step", answer, seed=seed)
    assert not result.passed and words in result.message, result.message


def test_expert_parallelism_on_two_processes_passes_under_two_seeds():
    for seed in (0, 1):
        result = evaluate("lab14.expert_parallel", parallel(), seed=seed)
        assert result.passed, result.message


PARALLEL_MISTAKES = [
    (parallel(("destination = flat // experts_per_rank", "destination = flat % world")), "wrong rank"),
    (
        parallel(
            ("recv_counts = torch.empty_like(send_counts)", "recv_counts = send_counts.clone()"),
            ("    dist.all_to_all_single(recv_counts, send_counts)  # how many rows each rank will send me\n", ""),
        ),
        "Exchange the counts first",
    ),  # fmt: skip
    (
        parallel(
            (
                "out.index_add_(0, token[order], weights.flatten()[order, None] * back)",
                "out.index_add_(0, token, weights.flatten()[order, None] * back)",
            )
        ),
        "the order you sent the rows in",
    ),  # fmt: skip
    (
        parallel(
            (
                "    dist.all_to_all_single(back, done, send, recv)  # the same sizes, swapped: rows return in the order "
                "sent\n",
                "",
            )
        ),
        "Did the rows come back?",
    ),  # fmt: skip
    (
        parallel(("weights.flatten()[order, None] * back", "weights.flatten()[order, None] ** 2 * back")),
        "applied twice",
    ),
    (
        parallel(
            (
                "    dist.all_to_all_single(ids, flat[order], recv, send)\n",
                "    if dist.get_rank() == 0:\n        dist.barrier()\n"
                "    dist.all_to_all_single(ids, flat[order], recv, send)\n",
            )
        ),
        "its partner never joined",
    ),  # fmt: skip
]


@pytest.mark.parametrize("answer, words", PARALLEL_MISTAKES, ids=case_id)
def test_a_wrong_expert_parallelism_fails_with_its_mistake_named(answer, words):
    with mock.patch.object(ranks, "TIMEOUT_S", 5.0):  # a rank left waiting gives up sooner than a learner's would
        result = evaluate("lab14.expert_parallel", answer, seed=2)
    assert not result.passed and words in result.message, result.message


def sleeps(x, weights, chosen, expert, experts_per_rank):
    time.sleep(60)


def test_ranks_that_never_finish_are_stopped_and_named():
    start = time.monotonic()
    with mock.patch.object(ranks, "TIMEOUT_S", 1.0):
        result = evaluate("lab14.expert_parallel", sleeps, seed=0)
    assert not result.passed and "had not finished after 6 s" in result.message, result.message
    assert time.monotonic() - start < 45  # stopped, not waited for (its own sleep is 60 s)


def test_an_unwritten_expert_parallelism_is_not_done():
    def blank(x, weights, chosen, expert, experts_per_rank):
        raise NotImplementedError

    assert evaluate("lab14.expert_parallel", blank).status == NOT_DONE


def test_the_dispatch_is_the_layer_token_by_token_and_d_of_one_is_k():
    layer = moe_model.make_layer(4)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(4))
    weights, chosen = course.course_route(layer.logits(x), layer.top_k)
    grouped = course.course_dispatch(x, weights, chosen, layer.expert)
    assert torch.allclose(grouped, moe_model.per_token_reference(x, weights, chosen, layer.expert), atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(9))
    assert expected_distinct_experts(1, layer.experts, layer.top_k) == pytest.approx(2)


def test_every_exercise_has_tiered_hints():
    for exercise in ("route", "dispatch", "expert_parallel", "bytes_per_step"):
        assert len(tiers(f"lab14.{exercise}")) >= 2
    assert lab14.MISTAKES
