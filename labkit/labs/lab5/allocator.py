"""Lab 5, exercise 1: a block allocator, watched after every call of a seeded script and then inside the engine (a pool
small enough to preempt), so a lost or shared block is named at the call that made it."""

from __future__ import annotations

import math
from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.learner_errors import raised_record
from labkit.labs.common.shared import rng
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints

BLOCK_SIZE = 16
POOL_BLOCKS = 64


def allocator_script(seed: int) -> list[tuple[str, str, int]]:
    """Seeded calls: ("allocate", seq, tokens) growing sequences token by token, and ("free", seq, 0)."""
    r = rng(seed)
    calls = [("allocate", "s62", 62)]
    lengths = {name: 0 for name in ("a", "b", "c", "d")}
    for _ in range(40):
        name = r.choice(sorted(lengths))
        grown = lengths[name] + r.randint(1, 30)
        blocks_after = (
            4 + sum(-(-n // BLOCK_SIZE) for other, n in lengths.items() if other != name) + -(-grown // BLOCK_SIZE)
        )
        if blocks_after > POOL_BLOCKS or r.random() < 0.15:  # a full pool (or chance) ends a sequence instead
            if lengths[name]:
                calls.append(("free", name, 0))
            lengths[name] = 0
            continue
        lengths[name] = grown
        calls.append(("allocate", name, grown))
    calls += [("free", "s62", 0)] + [("free", name, 0) for name, n in lengths.items() if n]
    return calls


def run_allocator_script(allocator_class, calls) -> list[dict[str, Any]]:
    """Make the calls on a fresh 64-block allocator; after each, note every table and the free count."""
    allocator = allocator_class(POOL_BLOCKS, BLOCK_SIZE)
    live: set[str] = set()
    log = []
    for op, seq, tokens in calls:
        try:
            if op == "allocate":
                allocator.allocate(seq, tokens)
                live.add(seq)
            else:
                allocator.free(seq)
                live.discard(seq)
        except Exception as error:  # judged after the calls before it, which may show the cause
            log.append({"op": op, "seq": seq, "tokens": tokens, "error": raised_record(error, [allocator_class])})
            break
        tables = {name: [int(b) for b in allocator.block_table(name)] for name in sorted(live | {seq})}
        log.append(
            {"op": op, "seq": seq, "tokens": tokens, "tables": tables, "num_free": int(allocator.num_free_blocks)}
        )
    return log


def check_allocator_log(calls, log) -> Mismatch | None:
    """Every table the right length and stable, no block owned twice, no block lost."""
    lengths: dict[str, int] = {}
    previous: dict[str, list[int]] = {}
    for index, ((op, seq, tokens), entry) in enumerate(zip(calls, log)):
        where = f"call {index}, {op}({seq!r}{', ' + str(tokens) if op == 'allocate' else ''})"
        if "error" in entry:
            return raised_mismatch(entry["error"], None).within(where)
        if op == "allocate":
            lengths[seq] = tokens
        else:
            lengths.pop(seq, None)
        problem = _call_problem(where, op, seq, entry, lengths, previous)
        if problem:
            return problem
        previous = {name: list(table) for name, table in entry["tables"].items()}
    return None


def _call_problem(where: str, op: str, seq: str, entry, lengths: dict[str, int], previous) -> Mismatch | None:
    """What one call left wrong: a freed sequence still holding blocks, then table by table its length, its old
    blocks (for the sequence that grew) and who owns each block, then the blocks lost or counted twice."""
    tables = entry["tables"]
    if op == "free" and tables.get(seq):
        return Mismatch(
            f"{where}: {seq!r} still has blocks {tables[seq]} after free",
            "free(seq) must give every block of the sequence back and forget its table.",
        )
    owner: dict[int, str] = {}
    for name, table in tables.items():
        grew = op == "allocate" and name == seq
        problem = (
            _length_problem(where, name, table, lengths.get(name, 0))
            or (_moved_problem(where, name, table, previous.get(name, [])) if grew else None)
            or _ownership_problem(where, name, table, owner)
        )
        if problem:
            return problem
    return _lost_problem(where, entry["num_free"], len(owner))


def _length_problem(where: str, name: str, table: list[int], tokens: int) -> Mismatch | None:
    want = math.ceil(tokens / BLOCK_SIZE)
    if len(table) == want:
        return None
    return Mismatch(
        f"{where}: {name!r} holds {tokens} tokens and owns {len(table)} blocks, expected {want}",
        "A sequence of n tokens needs ceil(n / block_size) blocks: take only the blocks it "
        "still lacks (needed minus len(table)), one at a time from the free list.",
    )


def _moved_problem(where: str, name: str, table: list[int], before: list[int]) -> Mismatch | None:
    if table[: len(before)] == before:
        return None
    return Mismatch(
        f"{where}: {name!r}'s table changed from {before} to {table}",
        "Growing a sequence appends new blocks to its table; the blocks it has keep their "
        "place (its K/V already live there).",
    )


def _ownership_problem(where: str, name: str, table: list[int], owner: dict[int, str]) -> Mismatch | None:
    """A block outside the pool or already owned; otherwise notes ``name`` as the owner of each of its blocks."""
    for block in table:
        if not 0 <= block < POOL_BLOCKS:
            return Mismatch(f"{where}: {name!r} owns block {block}, outside the pool 0..{POOL_BLOCKS - 1}")
        if block in owner:
            return Mismatch(
                f"{where}: block {block} is owned by both {owner[block]!r} and {name!r}",
                "Take a block off the free list when you hand it out, so it cannot be given twice.",
            )
        owner[block] = name
    return None


def _lost_problem(where: str, num_free: int, owned: int) -> Mismatch | None:
    if num_free + owned == POOL_BLOCKS:
        return None
    lost = POOL_BLOCKS - num_free - owned
    gap = f"{lost} missing" if lost > 0 else f"{-lost} counted twice"
    return Mismatch(
        f"{where}: {num_free} blocks free + {owned} owned = {num_free + owned}, not {POOL_BLOCKS} ({gap})",
        "A block must always be either on the free list or in exactly one table: put freed "
        "blocks back on the free list.",
    )


def _run_allocator(functions, inputs) -> dict[str, Any]:
    allocator_class = functions[0]
    log = run_allocator_script(allocator_class, inputs["calls"])
    engine = serve(inputs["requests"], "continuous", block_allocator=allocator_class(12, 4), max_num_seqs=4)
    return {"log": log, "engine": engine}


def _compare_allocator(expected, got) -> Mismatch | None:
    problem = check_allocator_log(expected["calls"], got["log"])
    problem = problem or run_failure(got["engine"], "in the engine (12 blocks of 4), ")
    if problem is not None:
        return problem
    if got["engine"]["blocks_used_at_end"]:
        return Mismatch(
            f"in the engine, {got['engine']['blocks_used_at_end']} blocks were still in use after every request "
            "finished",
            "free(seq) must return all of a sequence's blocks.",
        )
    mismatch = compare_with_solo(expected["solo"], got["engine"]["tokens"])
    return mismatch.within("in the engine (12 blocks of 4, so requests are preempted)") if mismatch else None


register(
    diagnosed(
        Exercise(
            id="lab5.block_allocator",
            functions=("PagedBlockAllocator",),
            answers=("labkit.kv.block_allocator.FreeListBlockAllocator",),
            make_inputs=lambda seed: {"calls": allocator_script(seed), "requests": random_requests(seed, 8)},
            run=_run_allocator,
            oracle=lambda inputs: {"calls": inputs["calls"], **solo_oracle(inputs)},
            compare=_compare_allocator,
            tested="a 62-token sequence owns 4 blocks of 16 (at most 15 empty slots); over a seeded script of allocate/free "
            "calls on 64 blocks every table has ceil(tokens/16) blocks, keeps its old blocks, no block is owned twice "
            "or lost; and the engine with your allocator (12 blocks of 4, so it must preempt) gives every request "
            "its solo tokens and ends with no block in use",
            hint="A sequence's table grows at its end, one block from the free list at a time, until it can hold all its "
            "tokens; freeing gives every block back. At every moment a block is either free or in exactly one table. "
            'labkit.hint("lab5.block_allocator") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab5.block_allocator",
    "Blocks are handed out only when a sequence needs them, from wherever the free list points. The table records "
    "where the sequence's 1st, 2nd, ... block live, so a block it holds never moves; freeing gives all of them back.",
    "allocate: ask blocks_needed how many blocks the sequence still lacks, take that many off the free list one at "
    "a time, append each to the sequence's table (made the first time), and return the table. free: drop the table "
    "and put its blocks back on the free list.",
    "self.tables.setdefault(seq_id, []) is the table; self.free_blocks.popleft() takes a block off the free list; "
    "self.free_blocks.extend(self.tables.pop(seq_id, [])) frees.",
)
