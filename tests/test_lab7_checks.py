"""Lab 7's checks: the solved answers pass, each typical mistake fails with a message that names it.

The answers are the solution cells of the lab source (so the tests cannot drift from the
notebook), and each wrong answer is that solution with one mistake edited in. Also: the
learner's pieces plugged into labkit's allocator behave like labkit's own; hints have tiers;
demo cells wait for their checks; ``labkit grade`` grades the lab.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from lab_sources import exercise_cell, solved_exercise

from labkit.grading import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.labs import hints
from labkit.labs.common.gate import passed
from labkit.labs.lab7.runs import (
    allocator_with,
    chat_requests,
    pool_script,
    run_pool_script,
    serve_counted,
)

pytestmark = pytest.mark.lab7

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "labs" / "source" / "lab7_prefix_caching.ipynb"
FUNCTIONS = {"lab7.block_hashes": ("block_hashes",), "lab7.cached_prefix": ("cached_prefix",)}
FUNCTIONS["lab7.lru_free"] = ("release_block", "pick_block")


def answer(exercise_id: str, *edits: tuple[str, str]) -> tuple:
    """The solved functions of an exercise, with each (old, new) edit applied to the cell first."""
    return solved_exercise(exercise_id, FUNCTIONS[exercise_id], edits)


def verdict(exercise_id: str, *edits: tuple[str, str]):
    return evaluate(exercise_id, *answer(exercise_id, *edits))


CASES = [
    # (exercise, edits, expected status, words the message must contain)
    ("lab7.block_hashes", (), PASS, "PASS"),
    (
        "lab7.block_hashes",
        (("block_hash(parent, token_ids", "block_hash(NO_PARENT, token_ids"),),
        FAIL,
        "hashing a block without its parent",
    ),
    (
        "lab7.block_hashes",
        (("range(0, len(token_ids) - block_size + 1, block_size)", "range(0, len(token_ids), block_size)"),),
        FAIL,
        "sharing the last partial block",
    ),
    ("lab7.cached_prefix", (), PASS, "PASS"),
    (
        "lab7.cached_prefix",
        (("hashes[: (num_prompt_tokens - 1) // block_size]", "hashes"),),
        FAIL,
        "zero tokens for a fully cached prompt",
    ),
    (
        "lab7.cached_prefix",
        (("            break\n", "            continue\n"),),
        FAIL,
        "kept going after block",
    ),
    (
        "lab7.cached_prefix",
        (("blocks.append(block)", "blocks.append(key)"),),
        FAIL,
        "returned hashes, not blocks",
    ),
    ("lab7.lru_free", (), PASS, "PASS"),
    (
        "lab7.lru_free",
        (("    if refs[block] > 0:\n        return\n", ""),),
        FAIL,
        "freeing a block still used by another request",
    ),
    (
        "lab7.lru_free",
        (("evictable.popitem(last=False)", "evictable.popitem()"),),
        FAIL,
        "evicting the most recent instead of the least recent",
    ),
    (
        "lab7.lru_free",
        (
            (
                "    if is_cached:\n        evictable[block] = None\n    else:\n        free.append(block)",
                "    free.append(block)",
            ),
        ),
        FAIL,
        "went to the free list",
    ),
    (
        "lab7.lru_free",
        (
            (
                "    if free:\n        return free.popleft()\n    block, _",
                "    if not evictable:\n        return free.popleft()\n    block, _",
            ),
        ),
        FAIL,
        "never-used blocks were free",
    ),
    (
        "lab7.lru_free",
        (("evictable[block] = None", "evictable[block] = None\n        evictable.move_to_end(block, last=False)"),),
        FAIL,
        "the LRU order",
    ),
    ("lab7.lru_free", (("return free.popleft()", "return free.pop()"),), FAIL, "the wrong end of the free list"),
]


@pytest.mark.parametrize(
    "exercise_id, edits, status, words",
    [pytest.param(*case, id=f"{case[0]}-{'solved' if not case[1] else case[3][:28]}") for case in CASES],
)
def test_check_verdict(exercise_id, edits, status, words):
    result = verdict(exercise_id, *edits)
    assert result.status == status, result.message
    assert words in result.message, result.message


def test_one_extra_hash_is_counted_in_the_singular():
    """Under a block of tokens the wrong chain returns one hash: the message says "1 hash", not "1 hashes"."""
    result = verdict(
        "lab7.block_hashes",
        ("range(0, len(token_ids) - block_size + 1, block_size)", "range(0, len(token_ids), block_size)"),
    )
    assert result.status == FAIL and "you returned 1 hash," in result.message, result.message


def test_an_exception_in_the_learners_code_names_their_function_and_line():
    result = verdict("lab7.block_hashes", ("hashes.append(parent)", "hashes.append(parent + token_ids)"))
    assert result.status == FAIL, result.message
    assert "your function block_hashes raised TypeError" in result.message and "of your cell" in result.message


def test_unfinished_exercise_says_not_done():
    def cached_prefix(hashes, num_prompt_tokens, block_size, cached):
        raise NotImplementedError("Exercise lab7.cached_prefix: replace this line with your code")

    assert evaluate("lab7.cached_prefix", cached_prefix).status == NOT_DONE


def test_labkits_own_pieces_plugged_in_serve_exactly_like_labkits_allocator():
    """The plug itself is neutral: labkit's functions through allocator_with equal the allocator, on every seed."""
    from labkit.kv import prefix_cache as reference

    plugged = allocator_with(
        lambda tokens, size: reference.block_hashes(tokens, size),
        reference.longest_cached_prefix,
        reference.release_block,
        reference.pick_block,
    )
    for seed in range(3):
        calls = pool_script(seed)
        assert run_pool_script(plugged, calls) == run_pool_script(PrefixCachingBlockAllocator, calls)
    requests = chat_requests(0)
    mine = serve_counted(requests, plugged(20, 4), max_num_seqs=3, block_size=4)
    labkits = serve_counted(requests, PrefixCachingBlockAllocator(20, 4), max_num_seqs=3, block_size=4)
    assert mine == labkits
    assert labkits["evictions"] > 0 and sum(labkits["found"]) > 0  # the run exercises what the checks judge


def test_the_script_shares_a_block_frees_it_and_evicts_on_every_seed():
    for seed in range(12):
        log = run_pool_script(PrefixCachingBlockAllocator, pool_script(seed))
        assert "raised" not in log[-1]
        assert max(max(entry["refs"]) for entry in log) >= 2
        assert log[-1]["evictions"] >= 1
        assert all(not entry["tables"] for entry in log[-1:])  # everything freed at the end


@pytest.mark.parametrize("exercise_id", list(FUNCTIONS))
def test_every_exercise_has_at_least_two_hint_tiers_and_no_code_in_its_cell(exercise_id):
    assert len(hints.tiers(exercise_id)) >= 2
    learner_cell = exercise_cell(exercise_id).split("### BEGIN SOLUTION")[0]
    assert "#" not in learner_cell.replace("### BEGIN SOLUTION", "")


def test_demo_cells_wait_for_their_checks(capsys):
    (solved,) = answer("lab7.cached_prefix")
    (wrong,) = answer("lab7.cached_prefix", ("hashes[: (num_prompt_tokens - 1) // block_size]", "hashes"))
    namespace = {"passed": passed, "cached_prefix": solved}
    exec("result = passed('lab7.cached_prefix')", namespace)
    assert namespace["result"]
    namespace["cached_prefix"] = wrong
    exec("result = passed('lab7.cached_prefix')", namespace)
    assert not namespace["result"] and "skipped until exercise 2 passes" in capsys.readouterr().out


def test_the_block_map_demo_draws_no_request_in_the_free_blocks_grey():
    """The map colours an owner by its name; the text says free blocks are grey, so no request may be."""
    import re

    from labkit.viz.blocks import owner_colour

    cell = next(cell.source for cell in nbformat.read(SOURCE, as_version=4).cells if cell.get("id") == "lab7-17")
    ids = re.findall(r'request_id="(\w+)"', cell)
    assert len(ids) == 2
    for owner in [*ids, "+".join(ids)]:
        red, green, blue = owner_colour(owner)
        assert max(red, green, blue) - min(red, green, blue) > 0.1, f"{owner} is drawn in a grey"


def test_the_lab_states_its_time_by_the_labs_rule():
    """As labs 1-6: the solved run's time, 12 minutes per exercise and 10 for the measurements."""
    import re

    cells = nbformat.read(SOURCE, as_version=4).cells
    match = re.search(
        r"\*\*Time: about (\d+) minutes\.\*\* How we got it: the solved notebook runs in", cells[0].source
    )
    assert match, "no time estimate with how it was obtained"
    assert "(3 exercises)" in cells[0].source and abs(int(match.group(1)) - (12 * 3 + 10)) <= 5
