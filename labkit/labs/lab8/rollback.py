"""Lab 8, exercise 3: ``rollback(request, num_rejected, blocks)``, the KV of rejected drafts undone; checked on
crafted block tables, then inside the engine, watching every step for blocks held in vain."""

from __future__ import annotations

from typing import Any

from labkit.engine.request import Request
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab8.runs import serve_speculating
from labkit.labs.lab8.served import GREEDY_K, compare_engine_run, engine_oracle, with_engine_requests
from labkit.sampling_params import SamplingParams

ROLLBACK_POOL = 32


def rollback_cases(seed: int) -> list[dict[str, int]]:
    """(tokens computed, block size, rejected): within a block, across one, back to a block's edge, none."""
    r = rng(seed)
    cases = [(40, 4, 7), (33, 4, 1), (16, 16, 5), (17, 16, 1), (9, 4, 0), (24, 8, 8)]
    cases += [(n, 4, r.randint(0, min(n, 5))) for n in (r.randint(6, 40) for _ in range(4))]
    return [dict(computed=c, block_size=b, rejected=j) for c, b, j in cases]


def run_rollback_case(rollback_fn, case) -> dict[str, Any]:
    """Roll back one request of a fresh pool (another sequence holds the first 5 blocks); note what changed."""
    blocks = FreeListBlockAllocator(ROLLBACK_POOL, case["block_size"])
    blocks.allocate("other", 5 * case["block_size"])
    request = Request("r", [1] * case["computed"], SamplingParams())
    request.num_computed_tokens = case["computed"]
    before = list(blocks.allocate("r", case["computed"]))
    rollback_fn(request, case["rejected"], blocks)
    return {
        "before": before,
        "computed": int(request.num_computed_tokens),
        "table": [int(b) for b in blocks.block_table("r")],
        "num_free": int(blocks.num_free_blocks),
        "other": [int(b) for b in blocks.block_table("other")],
    }


def _compare_rollback_case(case, got) -> Mismatch | None:
    computed, size, rejected = case["computed"], case["block_size"], case["rejected"]
    where = f"{computed} tokens computed in blocks of {size}, {rejected} rejected"
    left = computed - rejected
    keep = -(-left // size)
    mistake = _moved_back(got, computed, left, where)
    if mistake is not None:
        return mistake
    if got["other"] != list(range(5)):
        return Mismatch(f"{where}: another sequence's blocks changed", "Touch only this request's block table.")
    if got["table"] == got["before"][:keep] and got["num_free"] == ROLLBACK_POOL - 5 - keep:
        return None
    difference = (
        f"{where}: the table is {got['table']} with {got['num_free']} blocks free, expected {got['before'][:keep]}"
    )
    return Mismatch(difference, _blocks_mistake(got, left, size, keep))


def _moved_back(got: dict[str, Any], computed: int, left: int, where: str) -> Mismatch | None:
    if got["computed"] == left:
        return None
    hint = (
        "You did not roll back the KV of the rejected tokens: num_computed_tokens must move back by num_rejected, "
        "or the next step's positions start past tokens that do not exist and the model reads the rejected "
        "drafts' keys and values."
        if got["computed"] == computed
        else "Move num_computed_tokens back by exactly num_rejected."
    )
    return Mismatch(f"{where}: num_computed_tokens is {got['computed']}, expected {left}", hint)


def _blocks_mistake(got: dict[str, Any], left: int, size: int, keep: int) -> str | None:
    """What a wrong table shows: nothing freed, a partly filled block freed, a copy popped, the front freed."""
    if len(got["table"]) > keep and got["num_free"] == ROLLBACK_POOL - 5 - len(got["before"]):
        return (
            f"No block went back to the pool: {left} tokens need {keep} blocks of {size}, so the blocks after those "
            "hold only rejected tokens. Pop them off the end of the table and free_block each."
        )
    if len(got["table"]) == left // size < keep:
        return (
            "You freed a block that still holds tokens: a partly filled last block stays. Keep "
            "blocks.blocks_for(num_computed_tokens) blocks (rounded up), not num_computed_tokens // block_size."
        )
    if got["table"] == got["before"] and got["num_free"] == ROLLBACK_POOL - 5 - keep:
        return (
            "The right blocks went back to the pool, but the request's table still lists them: you popped from a "
            "copy of the table. blocks.block_table(request.request_id) is the allocator's own list; pop from it "
            "directly (not from list(...) or .copy() of it), so the table and the pool agree."
        )
    if (
        len(got["table"]) < len(got["before"])
        and got["table"] == got["before"][len(got["before"]) - len(got["table"]) :]
    ):
        return (
            "You freed blocks from the front of the table: those hold the first tokens of the sequence. "
            "The rejected tokens are at the end; pop from the end."
        )
    return None


def _run_rollback(functions, inputs) -> dict[str, Any]:
    rollback_fn = functions[0]
    units = [run_rollback_case(rollback_fn, case) for case in inputs["cases"]]
    engine = serve_speculating(inputs["requests"], GREEDY_K, rollback=rollback_fn, watch_blocks=True)
    return {"units": units, "engine": engine}


def _rollback_oracle(inputs) -> dict[str, Any]:
    return {"cases": inputs["cases"], **engine_oracle(inputs["seed"])}


def _compare_rollback(expected, got) -> Mismatch | None:
    for case, unit in zip(expected["cases"], got["units"]):
        mismatch = _compare_rollback_case(case, unit)
        if mismatch is not None:
            return mismatch
    run = got["engine"]
    if run.get("error") is None and run["excess_blocks"]:
        step, excess = run["excess_blocks"]
        return Mismatch(
            f"in the engine with your rollback, after step {step} the running requests held {excess} more blocks "
            "than their computed tokens need",
            "Blocks that hold only rejected tokens must go back to the pool, or speculation leaks memory every step.",
        )
    return compare_engine_run(expected, run, "your rollback")


register(
    diagnosed(
        Exercise(
            id="lab8.rollback",
            functions=("rollback",),
            answers=("labkit.speculative.rollback.rollback",),
            make_inputs=lambda seed: with_engine_requests(rollback_cases(seed), seed),
            run=_run_rollback,
            oracle=_rollback_oracle,
            compare=_compare_rollback,
            tested="rollback on 10 requests (blocks of 4, 8 or 16; 0 to 8 rejected tokens, within a block and across "
            f"one): num_computed_tokens moved back and exactly the blocks past the last computed token freed; then "
            f"the engine with it (k = {GREEDY_K}) serves 3 seeded repetitive texts on the course model: the solo "
            "tokens, the engine's draft and accepted counts, and no step leaves a request holding blocks it does not need",
            hint="Move num_computed_tokens back by num_rejected; then, while the table has more blocks than "
            'blocks_for(num_computed_tokens), free the last one. labkit.hint("lab8.rollback") shows more.',
        )
    )
)

register_hints(
    "lab8.rollback",
    "The verification pass wrote keys and values for every draft token. Those of rejected drafts describe tokens "
    "that will never be in the sequence; nothing needs erasing, as long as the request forgets it computed them "
    "(the next step overwrites those slots) and gives back the blocks that hold nothing else.",
    "request.num_computed_tokens -= num_rejected. Then blocks.block_table(request.request_id) is the allocator's own "
    "list: while it is longer than blocks.blocks_for(request.num_computed_tokens), pop its last block and give it "
    "back with blocks.free_block.",
    "table = blocks.block_table(request.request_id); while len(table) > blocks.blocks_for(request.num_computed_tokens): "
    "blocks.free_block(table.pop())",
)
