"""Every lab's solved piece plugs into the engine with every feature it is compatible with on at once, and serves
the same tokens as the engine's own parts; a piece that lacks a call an enabled feature needs is refused when the
engine is built, by name (labkit.engine.interfaces), never with an AttributeError mid-run."""

import pytest
from lab_sources import solved

from labkit.engine import LLM
from labkit.engine.interfaces import MissingPartError
from labkit.engine.scheduler import policy_from_function
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.engine_runs import run_requests
from labkit.labs.common.shared import small_model
from labkit.labs.lab5 import engine_attention
from labkit.labs.lab7.runs import allocator_with, chat_requests

SPECULATION = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# A pool small enough that the chats below preempt one another, with 4-token blocks so prefixes share blocks.
EVERYTHING = dict(num_blocks=14, block_size=4, max_num_seqs=4, speculative_config=SPECULATION)


def learner_parts(piece: str) -> tuple[dict, dict]:
    """The engine arguments that plug in the lab's solved ``piece``, and those of the engine's own parts that
    it replaces (same features on)."""
    if piece == "lab4 policy":
        return {"policy": policy_from_function(solved("lab4", "continuous_schedule"))}, {"policy": "continuous"}
    if piece == "lab4 victim chooser":
        return {"choose_victim": solved("lab4", "choose_victim")}, {}
    if piece == "lab5 allocator":
        # the lab 5 allocator caches no prefixes; at this pool size the chats still preempt one another
        plain = {"enable_prefix_caching": False, "num_blocks": 16}
        return {"block_allocator": solved("lab5", "PagedBlockAllocator"), **plain}, {
            "block_allocator": FreeListBlockAllocator,
            **plain,
        }
    if piece == "lab5 attention":
        return {"attention": engine_attention(solved("lab5", "paged_attention"))}, {}
    if piece == "lab6 policy":
        return {"policy": policy_from_function(solved("lab6", "chunked_schedule"), chunked=True)}, {"policy": "chunked"}
    if piece == "lab7 prefix cache":
        names = ("block_hashes", "cached_prefix", "release_block", "pick_block")
        return {"block_allocator": allocator_with(**{name: solved("lab7", name) for name in names})}, {}
    if piece == "lab8 speculation":
        names = {"propose": "propose_ngram", "accept_greedy": "accept_greedy", "rollback": "rollback"}
        pieces = {key: solved("lab8", name) for key, name in names.items()}
        return {"speculative_config": {**SPECULATION, **pieces}}, {}
    raise AssertionError(piece)


def served(**parts):
    settings = {**EVERYTHING, **parts}
    if "policy" not in settings:
        settings["policy"] = "chunked"
    return run_requests(chat_requests(seed=6, count=8), model=small_model(), **settings)


@pytest.mark.parametrize(
    "piece",
    [
        "lab4 policy",
        "lab4 victim chooser",
        "lab5 allocator",
        "lab5 attention",
        "lab6 policy",
        "lab7 prefix cache",
        "lab8 speculation",
    ],
)
def test_each_labs_solved_piece_serves_the_engines_tokens_with_every_feature_on(piece):
    yours, engines = learner_parts(piece)
    reference, want = served(**engines)
    llm, got = served(**yours)
    steps = llm.trace.steps
    assert got == want, f"{piece}: tokens differ from the engine's own parts"
    # every compatible feature really ran: preemption, speculation, prefix caching where it is on
    assert llm.num_preemptions > 0 and reference.num_preemptions > 0, f"{piece}: nothing was preempted"
    assert sum(step.num_draft_tokens for step in steps) > 0, f"{piece}: no draft was verified"
    if llm.config.enable_prefix_caching:
        assert sum(step.prefix_cache_hits for step in steps) > 0, f"{piece}: the prefix cache found nothing"
    assert llm.state.blocks.num_used_blocks == 0, f"{piece}: blocks left held at the end"


class WithoutCanAllocate:
    """A lab 5 allocator with one call missing."""

    def __init__(self, num_blocks, block_size):
        self.inner = FreeListBlockAllocator(num_blocks, block_size)
        self.num_blocks, self.block_size = num_blocks, block_size

    def block_table(self, seq_id):
        return self.inner.block_table(seq_id)

    def allocate(self, seq_id, num_tokens):
        return self.inner.allocate(seq_id, num_tokens)

    def free(self, seq_id):
        self.inner.free(seq_id)

    @property
    def num_used_blocks(self):
        return self.inner.num_used_blocks


def test_an_allocator_missing_a_call_is_refused_at_construction_by_name():
    with pytest.raises(MissingPartError, match=r"serving needs the block allocator to have can_allocate.*lab 5"):
        LLM(small_model(), block_allocator=WithoutCanAllocate, num_blocks=16, enable_prefix_caching=False)


def test_prefix_caching_asked_of_an_allocator_that_cannot_is_refused_with_both_fixes():
    allocator = solved("lab5", "PagedBlockAllocator")
    with pytest.raises(
        MissingPartError, match=r"prefix caching needs .*take_cached_prefix.*lab 7.*turn prefix caching off"
    ):
        LLM(small_model(), block_allocator=allocator, num_blocks=16, enable_prefix_caching=True)


def test_a_proposer_piece_that_is_not_a_function_and_a_policy_without_schedule_are_refused():
    with pytest.raises((MissingPartError, TypeError, ValueError), match="rollback"):
        LLM(small_model(), num_blocks=16, speculative_config={**SPECULATION, "rollback": "undo"})

    class NoSchedule:
        name, chunked = "mine", False

    with pytest.raises(MissingPartError, match=r"scheduling needs the scheduler policy to have schedule.*lab 4"):
        LLM(small_model(), policy=NoSchedule(), num_blocks=16)
