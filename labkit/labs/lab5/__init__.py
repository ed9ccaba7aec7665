"""Lab 5, PagedAttention: the checks for the learner's block allocator, slot mapping and paged attention.

- ``PagedBlockAllocator``: blocks handed out on demand from a free list, one block table per
  sequence, every block back on the free list when the sequence ends. Checked on a seeded script
  of allocations and frees (the tables are watched after every call) and inside the engine.
- ``slot_mapping``: where token ``pos`` of a sequence lives: ``table[pos // B] * B + pos % B``.
- ``paged_attention``: one sequence's attention, its keys and values gathered from the pools
  through its block table; checked against dense attention and inside the engine.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.kv.paged_batch import PagedBatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import random_requests, serve
from labkit.labs.common.learner_errors import raised_record
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints

BLOCK_SIZE = 16
POOL_BLOCKS = 64

# --- lab5.block_allocator ---------------------------------------------------------------------


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
        tables = entry["tables"]
        if op == "free" and tables.get(seq):
            return Mismatch(
                f"{where}: {seq!r} still has blocks {tables[seq]} after free",
                "free(seq) must give every block of the sequence back and forget its table.",
            )
        owner: dict[int, str] = {}
        for name, table in tables.items():
            want = math.ceil(lengths.get(name, 0) / BLOCK_SIZE)
            if len(table) != want:
                return Mismatch(
                    f"{where}: {name!r} holds {lengths.get(name, 0)} tokens and owns {len(table)} blocks, "
                    f"expected {want}",
                    "A sequence of n tokens needs ceil(n / block_size) blocks: take only the blocks it "
                    "still lacks (needed minus len(table)), one at a time from the free list.",
                )
            if table[: len(previous.get(name, []))] != previous.get(name, []) and op == "allocate" and name == seq:
                return Mismatch(
                    f"{where}: {name!r}'s table changed from {previous[name]} to {table}",
                    "Growing a sequence appends new blocks to its table; the blocks it has keep their "
                    "place (its K/V already live there).",
                )
            for block in table:
                if not 0 <= block < POOL_BLOCKS:
                    return Mismatch(f"{where}: {name!r} owns block {block}, outside the pool 0..{POOL_BLOCKS - 1}")
                if block in owner:
                    return Mismatch(
                        f"{where}: block {block} is owned by both {owner[block]!r} and {name!r}",
                        "Take a block off the free list when you hand it out, so it cannot be given twice.",
                    )
                owner[block] = name
        if entry["num_free"] + len(owner) != POOL_BLOCKS:
            lost = POOL_BLOCKS - entry["num_free"] - len(owner)
            gap = f"{lost} missing" if lost > 0 else f"{-lost} counted twice"
            return Mismatch(
                f"{where}: {entry['num_free']} blocks free + {len(owner)} owned = "
                f"{entry['num_free'] + len(owner)}, not {POOL_BLOCKS} ({gap})",
                "A block must always be either on the free list or in exactly one table: put freed "
                "blocks back on the free list.",
            )
        previous = {name: list(table) for name, table in tables.items()}
    return None


def _run_allocator(functions, inputs) -> dict[str, Any]:
    allocator_class = functions[0]
    log = run_allocator_script(allocator_class, inputs["calls"])
    engine = serve(inputs["requests"], "continuous", block_allocator=allocator_class(12, 4), max_num_seqs=4)
    return {"log": log, "engine": engine}


def _compare_allocator(expected, got) -> Mismatch | None:
    mismatch = check_allocator_log(expected["calls"], got["log"])
    if mismatch is not None:
        return mismatch
    failure = run_failure(got["engine"], "in the engine (12 blocks of 4), ")
    if failure is not None:
        return failure
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

# --- lab5.slot_mapping ------------------------------------------------------------------------


def _slot_cases(seed: int) -> list[tuple[list[int], int, int, int]]:
    r = rng(seed)
    cases = []
    for block_size, start, end in ((16, 0, 62), (16, 61, 62), (4, 5, 11), (8, r.randint(0, 20), 40)):
        table = r.sample(range(100), -(-end // block_size))
        cases.append((table, start, end, block_size))
    return cases


def _slots(table, start, end, block_size) -> list[int]:
    return [table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]


def _compare_slots(expected, got) -> Mismatch | None:
    cases, want_all = expected
    for (table, start, end, block_size), want, have in zip(cases, want_all, got):
        if have == want:
            continue
        where = f"table {table}, block_size {block_size}, positions {start}..{end - 1}"
        if not isinstance(have, list) or len(have) != len(want):
            return Mismatch(
                f"{where}: expected {len(want)} slots, got {have!r:.80}",
                "Return one slot (an int) per position in range(start, end).",
            )
        first = next(i for i, (w, h) in enumerate(zip(want, have)) if w != h)
        hint = "slot = table[pos // block_size] * block_size + pos % block_size."
        if have == [pos for pos in range(start, end)]:
            hint = "You returned the positions themselves: look the block up in the block table first."
        elif all(h - w in (1, -1) and h - w == have[0] - want[0] for w, h in zip(want, have)):
            hint = "Every slot is off by one: positions count from 0, and so do offsets inside a block."
        return Mismatch(f"{where}, position {start + first}: expected slot {want[first]}, got {have[first]}", hint)
    return None


def _slot_error_hint(record: dict[str, Any]) -> str | None:
    """An IndexError here means a block was asked of the table beyond the ones the positions need."""
    if record["error"] == "IndexError":
        return (
            "Your code looked up a block the table does not have. The new tokens are positions start .. end - 1 "
            "(range(start, end) stops before end), and position pos lives in the table's entry pos // block_size."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab5.slot_mapping",
            functions=("slot_mapping",),
            answers=("labkit.labs.lab5._slots",),
            make_inputs=_slot_cases,
            run=lambda functions, cases: [[int(s) for s in functions[0](*case)] for case in cases],
            oracle=lambda cases: (cases, [_slots(*case) for case in cases]),
            compare=_compare_slots,
            tested="slot_mapping(block_table, start, end, block_size) for 4 seeded tables: the slot of every position",
            hint="A position picks an entry of the block table (which block) and an offset inside that block; the slot "
            'counts whole blocks before it, then the offset. labkit.hint("lab5.slot_mapping") shows more.',
        ),
        known=_slot_error_hint,
    )
)

# --- lab5.paged_attention ---------------------------------------------------------------------


def _attention_cases(seed: int) -> list[dict[str, torch.Tensor | list[int] | int]]:
    """Pools of 12 blocks of 4 with random contents; tables in random order; queries at the end of the context."""
    generator = torch_generator(seed)
    r = rng(seed)
    cases = []
    for context_len, num_query in ((1, 1), (13, 1), (23, 5), (16, 16)):
        k_pool = torch.randn(12, 4, 2, 8, generator=generator)
        v_pool = torch.randn(12, 4, 2, 8, generator=generator)
        table = r.sample(range(12), -(-context_len // 4))
        q = torch.randn(num_query, 4, 8, generator=generator)
        cases.append({"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_table": table, "context_len": context_len})
    return on_check_device(cases)


def _dense(case, table=None, truncate=True, causal=True):
    table = case["block_table"] if table is None else table
    keys = case["k_pool"][table].flatten(0, 1)
    values = case["v_pool"][table].flatten(0, 1)
    if truncate:
        keys, values = keys[: case["context_len"]], values[: case["context_len"]]
    num_query = case["q"].shape[0]
    mask = causal_mask(num_query, keys.shape[0], keys.device) if causal else None
    return attention(case["q"], keys, values, mask)


def _attention_oracle(inputs) -> dict[str, Any]:
    cases, requests = inputs["cases"], inputs["requests"]
    mistakes = []
    for case in cases:
        known = {
            "The blocks were gathered in sorted order, not in block-table order: the table's i-th entry "
            "holds the sequence's tokens i*B..(i+1)*B-1, wherever that block sits in the pool.": _dense(
                case, sorted(case["block_table"])
            ),
            "The keys include the unused slots at the end of the last block: keep only the first context_len "
            "gathered tokens.": _dense(case, truncate=False, causal=False),
            "The queries are not masked causally: query i (at position context_len - Tq + i) may only see "
            "keys up to its own position (causal_mask(Tq, context_len, q.device)).": _dense(case, causal=False),
        }
        mistakes.append(known)
    return {"outs": [_dense(case) for case in cases], "mistakes": mistakes, **solo_oracle({"requests": requests})}


def _run_attention(functions, inputs) -> dict[str, Any]:
    learner = functions[0]
    outs = [
        learner(case["q"], case["k_pool"], case["v_pool"], case["block_table"], case["context_len"])
        for case in inputs["cases"]
    ]
    engine = serve(
        inputs["requests"],
        "continuous",
        attention=engine_attention(learner),
        max_num_seqs=4,
        num_blocks=48,
        block_size=4,
    )
    return {"outs": outs, "engine": engine}


def engine_attention(per_sequence):
    """Plug a one-sequence ``paged_attention(q, k_pool, v_pool, table, context_len)`` into the engine."""

    def attend(layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch):
        out = torch.empty_like(q)
        for seq in batch.sequences:
            rows = slice(seq.start, seq.start + seq.num_query)
            out[rows] = per_sequence(q[rows], k_pool, v_pool, seq.block_table, seq.context_len)
        return out

    return attend


def _compare_attention(expected, got) -> Mismatch | None:
    for index, (want, have, mistakes) in enumerate(zip(expected["outs"], got["outs"], expected["mistakes"])):
        mismatch = compare_tensors(
            want, have, dims=("query", "head", "dim"), what="attention output", atol=1e-4, rtol=1e-4
        )
        if mismatch is None:
            continue
        for hint, wrong in mistakes.items():
            if isinstance(have, torch.Tensor) and have.shape == wrong.shape and torch.allclose(have, wrong, atol=1e-4):
                mismatch = Mismatch(mismatch.difference, hint)
                break
        return mismatch.within(f"case {index} ({want.shape[0]} queries)")
    failure = run_failure(got["engine"], "in the engine with your attention, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], got["engine"]["tokens"])
    return mismatch.within("in the engine with your attention") if mismatch else None


def _attention_error_hint(record: dict[str, Any]) -> str | None:
    """A size error means the gathered keys and the mask disagree about how many tokens there are."""
    if "size" in record["message"]:
        return (
            "The keys and the mask disagree in length. The gathered blocks hold blocks x block_size slots, but only "
            "the first context_len of them are the sequence's tokens: cut keys and values to context_len, and mask "
            "with Tq rows and context_len columns."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab5.paged_attention",
            functions=("paged_attention",),
            answers=("labkit.kv.paged_attention.paged_attention",),
            make_inputs=lambda seed: {"cases": _attention_cases(seed), "requests": random_requests(seed, 6)},
            run=_run_attention,
            oracle=_attention_oracle,
            compare=_compare_attention,
            tested="paged_attention on 4 seeded cases (pools of 12 blocks of 4, tables in random order; 1 to 16 queries) "
            "equals dense attention over the same keys, and the engine using it gives every request its solo tokens",
            hint="Gather the sequence's blocks in table order into one run of slots, keep only its context_len tokens, "
            "and mask so that each of the last Tq positions sees the keys up to itself. "
            'labkit.hint("lab5.paged_attention") shows more.',
            points=2.0,
        ),
        known=_attention_error_hint,
    )
)

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

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
register_hints(
    "lab5.slot_mapping",
    "The pool is one long row of slots, block after block. A token's slot is where its block starts in that row, "
    "plus its offset inside the block.",
    "For each position from start up to, not including, end: its entry in the table is pos // block_size, that "
    "entry names the block, and the offset inside the block is pos % block_size.",
    "[block_table[pos // block_size] * block_size + pos % block_size for pos in range(start, end)]",
)
register_hints(
    "lab5.paged_attention",
    "The sequence's keys lie in blocks scattered over the pool; its block table lists them in order. Gathered in "
    "table order they are exactly a dense cache, followed by the unused slots of the last block.",
    "Index the pools with the table ([blocks, block_size, Hkv, D]), flatten the first two axes, keep the first "
    "context_len rows; the Tq queries are the last Tq positions, so the mask has Tq rows and context_len columns.",
    "blocks = torch.tensor(block_table, device=k_pool.device); keys = k_pool[blocks].flatten(0, 1)[:context_len], "
    "the same for values; attention(q, keys, values, causal_mask(q.shape[0], context_len, q.device)).",
)
