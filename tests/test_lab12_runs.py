"""What lab 12's parts 2 and 3 run with the learner's functions, on a tiny model: the tier with a reload policy
computes fewer prompt tokens than no tier (and a policy that never reloads computes as many), and a prefill engine
handing over through a right copy gives one engine's tokens, through a copy that forgets V other tokens."""

from __future__ import annotations

import pytest

from labkit.kv.tier_policy import reload_or_recompute
from labkit.labs.lab12 import runs
from labkit.labs.lab12.handoff import simulate
from labkit.models import tiny_model

pytestmark = [pytest.mark.lab12, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def model():
    return tiny_model(vocab_size=5008)  # the tier runs draw token ids up to 5000


def test_the_tier_with_the_learners_policy_saves_prompt_tokens_and_a_policy_that_never_reloads_does_not(model, capsys):
    costs = runs.measure_tier_costs(model, prefix_tokens=64)
    assert costs.recompute_seconds_per_token > 0 and costs.reload_seconds_per_block >= 0
    free = costs.__class__(0.0, 0.0, costs.recompute_seconds_per_token)  # reloading free: every run pays
    reloading = runs.tier_off_and_on(model, reload_or_recompute, free, conversations=2, prefix_tokens=64)
    assert reloading["on"][1] < reloading["off"][1]
    never = runs.tier_off_and_on(model, lambda *args: [], free, conversations=2, prefix_tokens=64)
    assert never["on"][1] == never["off"][1]
    assert "tier  on: prompt tokens computed" in capsys.readouterr().out


def test_a_right_hand_off_gives_one_engines_tokens_and_one_that_forgets_v_does_not(model, capsys):
    prompts = [[11 + i for i in range(length)] for length in (5, 16, 23)]
    assert runs.apart_and_together(simulate, model, prompts, max_tokens=6) == [True, True, True]
    forgets_v = lambda *args: simulate(*args, copy_values=False)  # noqa: E731
    assert not all(runs.apart_and_together(forgets_v, model, prompts, max_tokens=6))
    assert "DIFFERENT" in capsys.readouterr().out
