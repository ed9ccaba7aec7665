"""The checks of lab 8: the solved answers pass, typical wrong answers fail with a message that names them.

The answers are the solution cells of the lab source itself (so the tests cannot drift from the
notebook), and each wrong answer is that solution with one typical mistake edited in.
"""

from __future__ import annotations

import pytest
from lab_sources import solved_exercise

from labkit.grading import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.labs import hints

pytestmark = pytest.mark.lab8


def answer(exercise_id: str, name: str, edits: tuple[tuple[str, str], ...] = ()):
    """The solved function ``name`` from the lab source, with each (old, new) edit applied to its cell first."""
    return solved_exercise(exercise_id, (name,), edits)[0]


SEARCH_BACK = "for i in range(len(token_ids) - n - 1, -1, -1):"
RETURN_DRAFT = "                return token_ids[i + n : i + n + k]\n"
AGREE = "    while accepted < len(draft) and draft[accepted] == target_argmax[accepted]:\n        accepted += 1\n"
GREEDY_RETURN = "    return draft[:accepted] + [target_argmax[accepted]]"
RESIDUAL = "residual = torch.clamp(target_probs[i] - draft_probs[i], min=0)"
FREE_LOOP = (
    "    while len(table) > blocks.blocks_for(request.num_computed_tokens):\n        blocks.free_block(table.pop())\n"
)
TARGET_DRAFT = "p, q = target_probs[i, token], draft_probs[i, token]"
BONUS = "    return accepted + [int(torch.multinomial(target_probs[len(draft)], 1, generator=generator))]"

CASES = [
    # (exercise, learner name, edits, expected status, words the message must contain)
    ("lab8.propose_ngram", "propose_ngram", (), PASS, "PASS"),
    (
        "lab8.propose_ngram",
        "propose_ngram",
        ((SEARCH_BACK, "for i in range(len(token_ids) - n, -1, -1):"),),
        FAIL,
        "finds the last n tokens themselves",
    ),
    (
        "lab8.propose_ngram",
        "propose_ngram",
        ((RETURN_DRAFT, RETURN_DRAFT + "        return []\n"),),
        FAIL,
        "Fall back to shorter patterns",
    ),
    (
        "lab8.propose_ngram",
        "propose_ngram",
        ((SEARCH_BACK, "for i in range(len(token_ids) - 2 * n, -1, -1):"),),
        FAIL,
        "overlaps the last n tokens",
    ),
    (
        "lab8.propose_ngram",
        "propose_ngram",
        (("for n in range(max_n, min_n - 1, -1):", "for n in range(min_n, max_n + 1):"),),
        FAIL,
        "shorter n-gram",
    ),
    ("lab8.propose_ngram", "propose_ngram", (("i + n + k]", "i + n + k + 1]"),), FAIL, "at most k"),
    (
        "lab8.propose_ngram",
        "propose_ngram",
        ((SEARCH_BACK, "for i in range(len(token_ids) - n):"),),
        FAIL,
        "most recent",
    ),
    ("lab8.accept_greedy", "accept_greedy", (), PASS, "PASS"),
    (
        "lab8.accept_greedy",
        "accept_greedy",
        ((GREEDY_RETURN, "    return draft[:accepted]"),),
        FAIL,
        "forgot the bonus token",
    ),
    (
        "lab8.accept_greedy",
        "accept_greedy",
        (
            (AGREE, ""),
            (
                GREEDY_RETURN,
                "    kept = [d for d, t in zip(draft, target_argmax) if d == t]\n"
                "    return kept + [target_argmax[len(kept)]]",
            ),
        ),
        FAIL,
        "past the first mismatch",
    ),
    (
        "lab8.accept_greedy",
        "accept_greedy",
        (("draft[accepted] == target_argmax[accepted]", "draft[accepted] == draft[accepted]"),),
        FAIL,
        "compared with itself",
    ),
    ("lab8.rollback", "rollback", (), PASS, "PASS"),
    (
        "lab8.rollback",
        "rollback",
        (
            ("    request.num_computed_tokens -= num_rejected\n", ""),
            ("(request.num_computed_tokens)", "(request.num_computed_tokens - num_rejected)"),
        ),
        FAIL,
        "did not roll back the KV of the rejected tokens",
    ),
    ("lab8.rollback", "rollback", ((FREE_LOOP, ""),), FAIL, "No block went back to the pool"),
    (
        "lab8.rollback",
        "rollback",
        (("blocks.blocks_for(request.num_computed_tokens)", "request.num_computed_tokens // blocks.block_size"),),
        FAIL,
        "freed a block that still holds tokens",
    ),
    ("lab8.rollback", "rollback", (("table.pop()", "table.pop(0)"),), FAIL, "from the front of the table"),
    (
        "lab8.rollback",
        "rollback",
        (("table = blocks.block_table(request.request_id)", "table = list(blocks.block_table(request.request_id))"),),
        FAIL,
        "popped from a copy of the table",
    ),
    ("lab8.accept_sampling", "accept_sampling", (), PASS, "PASS"),
    ("lab8.accept_sampling", "accept_sampling", (("< p / q:", "< p:"),), FAIL, "with probability p(x)"),
    ("lab8.accept_sampling", "accept_sampling", ((RESIDUAL, "residual = target_probs[i]"),), FAIL, "samples from p"),
    (
        "lab8.accept_sampling",
        "accept_sampling",
        ((TARGET_DRAFT, "p, q = draft_probs[i, token], draft_probs[i, token]"),),
        FAIL,
        "its own probabilities",
    ),
    ("lab8.accept_sampling", "accept_sampling", ((BONUS, "    return accepted"),), FAIL, "forgot the bonus token"),
    (
        "lab8.accept_sampling",
        "accept_sampling",
        ((TARGET_DRAFT, "p, q = draft_probs[i, token], target_probs[i, token]"),),
        FAIL,
        "the ratio is upside down",
    ),
    (  # accept with p(x), resample from p without x: distributed as p, yet it rejects a perfect draft
        "lab8.accept_sampling",
        "accept_sampling",
        (("< p / q:", "< p:"), (RESIDUAL, "residual = target_probs[i].clone()\n        residual[token] = 0")),
        FAIL,
        "with a perfect draft (q = p) that is 1",
    ),
    (
        "lab8.accept_sampling",
        "accept_sampling",
        ((", generator=generator", ""),),
        FAIL,
        "Draw every random number from the generator passed in",
    ),
    (
        "lab8.accept_sampling",
        "accept_sampling",
        (("accepted.append(token)", "accepted.append(token + 1)"),),
        FAIL,
        "are not the start of the draft",
    ),
]


@pytest.mark.parametrize(
    "exercise_id, name, edits, status, words",
    [pytest.param(*case, id=f"{case[0]}-{'solved' if not case[2] else case[4][:24]}") for case in CASES],
)
def test_check_verdict(exercise_id, name, edits, status, words):
    result = evaluate(exercise_id, answer(exercise_id, name, edits))
    assert result.status == status, result.message
    assert words in result.message, result.message


def test_an_exception_in_the_learners_rule_names_their_function_and_line():
    wrong = answer("lab8.accept_sampling", "accept_sampling", ((BONUS, BONUS.replace("len(draft)", "len(draft) + 1")),))
    result = evaluate("lab8.accept_sampling", wrong)
    assert result.status == FAIL, result.message
    assert "your function accept_sampling raised IndexError" in result.message
    assert "of your cell" in result.message and "Traceback" not in result.message


def test_unfinished_exercise_says_not_done():
    def accept_greedy(draft, target_argmax):
        raise NotImplementedError("Exercise lab8.accept_greedy: replace this line with your code")

    result = evaluate("lab8.accept_greedy", accept_greedy)
    assert result.status == NOT_DONE and "NOT DONE" in result.message


@pytest.mark.parametrize(
    "exercise_id", ["lab8.propose_ngram", "lab8.accept_greedy", "lab8.rollback", "lab8.accept_sampling"]
)
def test_every_exercise_has_at_least_two_tiers_of_hints(exercise_id):
    assert len(hints.tiers(exercise_id)) >= 2
