"""Lab 12's hand-off check: a learner's right copy passes, and each typical mistake fails with the message naming it.

The answers are written as a learner would write them (block by block), each wrong one with one thing changed.
"""

from __future__ import annotations

import pytest

from labkit.grading import evaluate
from labkit.grading.result import NOT_DONE
from labkit.labs.lab12 import handoff  # noqa: F401 (registers the check)

pytestmark = [pytest.mark.lab12, pytest.mark.usefixtures("one_torch_thread")]

EXERCISE = "lab12.kv_handoff"


def learner_copy(
    source_order=None,
    blocks_for=lambda n, size: -(-n // size),
    allocate=True,
    copy_v=True,
    swap_kv=False,
    reverse_layers=False,
    allocate_tokens=lambda n: n,
    tokens_in_block=lambda n, i, size: min(size, n - i * size),
):
    """A block-by-block hand-off, as the hints describe it, with one thing changeable per typical mistake."""

    def hand_off_kv(source_k, source_v, table, num_tokens, allocator, target_k, target_v, seq_id):
        size = allocator.block_size
        if allocate:
            target_table = list(allocator.allocate(seq_id, allocate_tokens(num_tokens)))
        else:
            target_table = list(range(-(-num_tokens // size)))
        sources = list(range(len(table))) if source_order == "pool" else list(table)
        layers = len(source_k)
        for layer in range(layers):
            into = layers - 1 - layer if reverse_layers else layer
            k_into, v_into = (target_v[into], target_k[into]) if swap_kv else (target_k[into], target_v[into])
            for i in range(blocks_for(num_tokens, size)):
                n = tokens_in_block(num_tokens, i, size)
                k_into[target_table[i], :n] = source_k[layer][sources[i], :n]
                if copy_v:
                    v_into[target_table[i], :n] = source_v[layer][sources[i], :n]
        return target_table

    return hand_off_kv


def test_a_right_hand_off_passes():
    result = evaluate(EXERCISE, learner_copy())
    assert result.passed, result.message


@pytest.mark.parametrize(
    "harmless",
    [
        dict(tokens_in_block=lambda n, i, size: size),
        dict(tokens_in_block=lambda n, i, size: min(size, n + 1 - i * size)),
    ],
    ids=["whole-last-block", "one-slot-past-the-last-token"],
)
def test_copying_past_the_last_token_within_its_block_is_right(harmless):
    """No step reads the slots after a sequence's last token, so copying the whole last block changes nothing."""
    result = evaluate(EXERCISE, learner_copy(**harmless))
    assert result.passed, result.message


def test_the_check_passes_over_several_seeds():
    for seed in (1, 2):
        result = evaluate(EXERCISE, learner_copy(), seed=seed)
        assert result.passed, result.message


@pytest.mark.parametrize(
    "wrong, named",
    [
        (dict(source_order="pool"), "read in pool order"),
        (dict(blocks_for=lambda n, size: n // size), "last, partial block was dropped"),
        (dict(copy_v=False), "Only K was copied"),
        (dict(swap_kv=True), "K and V were swapped"),
        (dict(reverse_layers=True), "layers were mixed up"),
        (dict(allocate=False), "not allocated through the allocator"),
        (dict(tokens_in_block=lambda n, i, size: min(size, n - 1 - i * size)), "One token too few"),
        (dict(allocate_tokens=lambda n: n + 1), "token count is off by one"),
        (dict(allocate_tokens=lambda n: n // 4 * 4, blocks_for=lambda n, size: n // size), "partial block"),
    ],
    ids=[
        "pool-order",
        "partial-block-dropped",
        "k-not-v",
        "k-v-swapped",
        "layers-swapped",
        "not-allocated",
        "one-token-short",
        "allocated-one-over",
        "allocated-full-blocks-only",
    ],
)
def test_each_typical_mistake_fails_naming_itself(wrong, named):
    result = evaluate(EXERCISE, learner_copy(**wrong))
    assert not result.passed
    assert named in result.message, result.message


def test_an_unfinished_exercise_is_not_done():
    def hand_off_kv(*args):
        raise NotImplementedError

    assert evaluate(EXERCISE, hand_off_kv).status == NOT_DONE


def test_a_learner_calling_labkits_own_copy_fails():
    from labkit.kv.handoff import write_tokens

    def hand_off_kv(source_k, source_v, table, num_tokens, allocator, target_k, target_v, seq_id):
        target_table = list(allocator.allocate(seq_id, num_tokens))
        for layer in range(len(source_k)):
            write_tokens(target_k[layer], target_table, source_k[layer][0, :1])
        return target_table

    assert not evaluate(EXERCISE, hand_off_kv).passed
