"""The four pieces of speculative decoding on their own: prompt lookup, both acceptance rules, rollback."""

from __future__ import annotations

import pytest
import torch

from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.speculative import (
    accept_greedy,
    accept_sampling,
    one_hot_probs,
    parse_speculative_config,
    propose_ngram,
    rollback,
)


# --- propose_ngram -------------------------------------------------------------------------------
def test_ngram_returns_what_followed_the_most_recent_earlier_occurrence():
    assert propose_ngram([5, 1, 2, 9, 1, 2, 7, 1, 2], k=2) == [7, 1]


def test_ngram_prefers_the_longer_match():
    # [3, 1, 2] occurred once (followed by 8); [1, 2] alone last occurred before 6.
    assert propose_ngram([3, 1, 2, 8, 0, 1, 2, 6, 3, 1, 2], k=1, max_n=3) == [8]
    assert propose_ngram([3, 1, 2, 8, 0, 1, 2, 6, 3, 1, 2], k=1, max_n=2) == [6]


def test_ngram_without_a_match_or_too_short_proposes_nothing():
    assert propose_ngram([1, 2, 3, 4], k=3) == []
    assert propose_ngram([7], k=3) == []
    assert propose_ngram([1, 2, 3, 1], k=2, min_n=2) == []


def test_ngram_draft_is_cut_at_the_end_of_the_sequence():
    assert propose_ngram([1, 2, 1], k=5) == [2, 1]


# --- accept_greedy ---------------------------------------------------------------------------------
def test_greedy_all_accepted_adds_the_bonus_token():
    assert accept_greedy([4, 5, 6], [4, 5, 6, 9]) == [4, 5, 6, 9]


def test_greedy_stops_at_the_first_mismatch_with_the_target_correction():
    assert accept_greedy([4, 5, 6], [4, 7, 6, 9]) == [4, 7]
    assert accept_greedy([4, 5, 6], [1, 5, 6, 9]) == [1]


def test_greedy_with_no_draft_is_plain_decoding():
    assert accept_greedy([], [3]) == [3]


def test_greedy_refuses_a_wrong_number_of_target_choices():
    with pytest.raises(ValueError, match="len\\(draft\\) \\+ 1"):
        accept_greedy([1, 2], [1, 2])


# --- accept_sampling ---------------------------------------------------------------------------------
def _draws(draft, q, p, n=6000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [tuple(accept_sampling(draft, q, p, generator)) for _ in range(n)]


def test_sampling_first_token_follows_the_target_for_a_one_hot_draft():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    q = one_hot_probs([1], 3)
    draws = _draws([1], q, p)
    first = torch.bincount(torch.tensor([d[0] for d in draws]), minlength=3).float() / len(draws)
    assert torch.allclose(first, p[0], atol=0.03), first
    # accepted (token 1 kept) with probability p(1) = 0.3, and then a bonus follows
    assert all(len(d) == 2 for d in draws if d[0] == 1) and all(len(d) == 1 for d in draws if d[0] != 1)


def test_sampling_with_a_draft_distribution_keeps_the_target_distribution():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.1, 0.2, 0.7]])
    counts = torch.zeros(3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(6000):
        draft = [int(torch.multinomial(q[0], 1, generator=generator))]
        counts[accept_sampling(draft, q, p, generator)[0]] += 1
    assert torch.allclose(counts / counts.sum(), p[0], atol=0.03), counts / counts.sum()


def test_sampling_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="target_probs"):
        accept_sampling([1], torch.ones(1, 3) / 3, torch.ones(1, 3) / 3)


# --- rollback -------------------------------------------------------------------------------------------
class _Request:
    def __init__(self, computed):
        self.request_id, self.num_computed_tokens = "r", computed


def test_rollback_moves_back_and_returns_the_blocks_no_longer_needed():
    blocks = FreeListBlockAllocator(8, block_size=4)
    blocks.allocate("r", 10)  # 3 blocks
    request = _Request(10)
    rollback(request, 3, blocks)  # 7 tokens: 2 blocks
    assert request.num_computed_tokens == 7 and len(blocks.block_table("r")) == 2 and blocks.num_free_blocks == 6
    rollback(request, 0, blocks)
    assert request.num_computed_tokens == 7 and blocks.num_free_blocks == 6


# --- speculative_config ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "config, message",
    [
        ({"method": "eagle", "num_speculative_tokens": 2}, "unknown speculative method 'eagle'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "k": 3}, "unknown keys"),
        ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "simulator parameter"),
    ],
)
def test_bad_speculative_configs_are_refused_with_the_fix(config, message):
    with pytest.raises(ValueError, match=message):
        parse_speculative_config(config)


def test_a_good_config_keeps_vllm_names_and_plugs_in_learner_functions():
    def mine(token_ids, k, min_n=1, max_n=4):
        return []

    config = parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3, "propose": mine})
    assert config.k == 3 and config.prompt_lookup_max == 4 and config.propose is mine
    assert config.accept_greedy is accept_greedy
