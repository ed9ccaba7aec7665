"""Lab 12, prefill and decode apart: the learner moves a request's KV cache from one engine's pools to another's.

``hand_off_kv`` is checked on seeded pools, then inside two engines: a prefill engine hands each request to a decode
engine through the learner's copy, and every request must say what it says alone. A wrong answer is compared with
the typical mistakes (:func:`simulate`'s switches) so the message names the one it shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from labkit.engine import LLM
from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.engine_runs import CheckRequest, TickClock, random_requests
from labkit.labs.common.shared import on_check_device, rng, small_model, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure, solo_oracle
from labkit.labs.hints import register_hints
from labkit.labs.lab12.runs import serve_handing_off
from labkit.sampling_params import SamplingParams

LAYERS, POOL_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 2, 12, 4, 2, 3
RESIDENT = "resident"  # a sequence already in the target pool: its blocks must stay as they were
SENTINEL = -7.0  # what the target pools hold before the copy, so a slot left unwritten shows

MISTAKES = {  # simulate()'s switch -> what the learner is told
    "pool_order": (
        dict(pool_order=True),
        "The source blocks were read in pool order (block 0, 1, 2, ...): a sequence's i-th block is table[i], "
        "wherever it lies in the pool. Read token t from table[t // block_size], slot t % block_size.",
    ),
    "partial": (
        dict(full_blocks_only=True),
        "The last, partial block was dropped: num_tokens // block_size counts only full blocks. A prompt that ends "
        "mid-block still has tokens in its last block: copy ceil(num_tokens / block_size) blocks (or every token).",
    ),
    "values": (
        dict(copy_values=False),
        "Only K was copied: the target's V pools still hold what was there before. Copy V the same way.",
    ),
    "kv_swapped": (
        dict(swap_kv=True),
        "K and V were swapped: the source's keys went into the target's V pool and its values into the K pool.",
    ),
    "layers": (
        dict(reverse_layers=True),
        "The layers were mixed up: layer l of the source must go to layer l of the target (source_k[l] -> "
        "target_k[l]), one pair of pools per layer.",
    ),
    "one_short": (
        dict(token_shift=-1),
        "One token too few was copied (off by one): the sequence's computed tokens are positions 0 to "
        "num_tokens - 1, all of them.",
    ),
}


# --- the reference, with the typical mistakes as switches ---------------------------------------------


def simulate(
    source_k: Sequence[torch.Tensor],
    source_v: Sequence[torch.Tensor],
    table: Sequence[int],
    num_tokens: int,
    allocator,
    target_k: Sequence[torch.Tensor],
    target_v: Sequence[torch.Tensor],
    seq_id: str,
    *,
    pool_order: bool = False,
    full_blocks_only: bool = False,
    copy_values: bool = True,
    swap_kv: bool = False,
    reverse_layers: bool = False,
    token_shift: int = 0,
) -> list[int]:
    """The hand-off copy token by token, or (with a switch) one typical mistake of it. Returns the target table."""
    size = allocator.block_size
    target_table = list(allocator.allocate(seq_id, num_tokens))
    source_table = list(range(len(table))) if pool_order else list(table)
    count = (num_tokens // size) * size if full_blocks_only else num_tokens + token_shift
    count = min(count, len(source_table) * size, len(target_table) * size)
    layers = len(source_k)
    for layer in range(layers):
        into = layers - 1 - layer if reverse_layers else layer
        pairs = [(source_k[layer], target_v[into] if swap_kv else target_k[into])]
        if copy_values:
            pairs.append((source_v[layer], target_k[into] if swap_kv else target_v[into]))
        for source, target in pairs:
            for t in range(count):
                block, slot = divmod(t, size)
                target[target_table[block], slot] = source[source_table[block], slot]
    return target_table


# --- seeded cases --------------------------------------------------------------------------------------


def copy_cases(seed: int) -> dict[str, dict[str, Any]]:
    """A prompt ending mid-block, one ending on a block boundary, and a one-token prompt, each with a shuffled
    source table and a target pool that already holds another sequence."""
    r, generator = rng(seed), torch_generator(seed)
    cases = {}
    for name, num_tokens, resident in [
        ("a prompt ending mid-block", 3 * BLOCK_SIZE + 2, 2),
        ("a prompt ending on a block boundary", 4 * BLOCK_SIZE, 3),
        ("a one-token prompt", 1, 1),
    ]:
        shape = (POOL_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        blocks = -(-num_tokens // BLOCK_SIZE) + 1  # one block more than the tokens need: its next slot is not theirs
        cases[name] = {
            "source_k": [torch.randn(shape, generator=generator) for _ in range(LAYERS)],
            "source_v": [torch.randn(shape, generator=generator) for _ in range(LAYERS)],
            "table": r.sample(range(1, POOL_BLOCKS), blocks),  # never 0, 1, 2, ...: pool order shows
            "num_tokens": num_tokens,
            "resident_tokens": resident * BLOCK_SIZE,
            "resident_k": torch.randn(shape, generator=generator),
        }
    return on_check_device(cases)


def _target(case: dict[str, Any]) -> tuple[FreeListBlockAllocator, list[torch.Tensor], list[torch.Tensor]]:
    """A fresh target: its allocator with the resident sequence in it, and pools of SENTINEL except the resident's
    blocks, which hold their own values."""
    allocator = FreeListBlockAllocator(POOL_BLOCKS, BLOCK_SIZE)
    resident = allocator.allocate(RESIDENT, case["resident_tokens"])
    pools = []
    for _ in range(2 * LAYERS):
        pool = torch.full_like(case["resident_k"], SENTINEL)
        pool[resident] = case["resident_k"][resident]
        pools.append(pool)
    return allocator, pools[:LAYERS], pools[LAYERS:]


def copy_outcome(function, case: dict[str, Any]) -> dict[str, Any]:
    """What one hand-off left behind, as plain data: the table returned, the allocator's, and the target pools."""
    allocator, target_k, target_v = _target(case)
    source_k = [pool.clone() for pool in case["source_k"]]
    source_v = [pool.clone() for pool in case["source_v"]]
    returned = function(source_k, source_v, list(case["table"]), case["num_tokens"], allocator, target_k, target_v, "r")
    return {
        "returned": [int(b) for b in returned] if isinstance(returned, (list, tuple)) else returned,
        "allocated": list(allocator.block_table("r")),
        "num_used_blocks": allocator.num_used_blocks,
        "target_k": target_k,
        "target_v": target_v,
    }


# --- the hand-off inside two engines -------------------------------------------------------------------

ENGINES = dict(block_size=BLOCK_SIZE, max_model_len=256, max_num_seqs=4, enable_prefix_caching=False)


def run_disaggregated(function, requests: list[CheckRequest]) -> dict[str, Any]:
    """A prefill engine and a decode engine on ticking clocks; each request is handed over through ``function`` as
    soon as its first token is out. Returns every request's tokens (or the error that stopped the run)."""
    model = small_model()
    prefill = LLM(model, clock=TickClock(), num_blocks=24, **ENGINES)
    decode = LLM(model, clock=TickClock(), num_blocks=64, **ENGINES)
    for index, request in enumerate(requests):
        params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True)
        prefill.add_request(list(request.prompt_ids), params, request_id=f"r{index}", arrival_time=request.arrival)
    try:
        tokens = serve_handing_off(function, prefill, decode)
    except NotImplementedError:
        raise
    except Exception as error:  # the learner's copy broke the run
        from labkit.grading.attempt import describe_exception

        return {"error": describe_exception(error)}
    return {
        "error": None,
        "tokens": [tokens.get(f"r{index}", []) for index in range(len(requests))],
        "leaked": decode.state.blocks.num_used_blocks,
    }


# --- the check ------------------------------------------------------------------------------------------


def _run(functions, inputs) -> dict[str, Any]:
    function = functions[0]
    cases = {name: copy_outcome(function, case) for name, case in inputs["cases"].items()}
    return {"cases": cases, "engine": run_disaggregated(function, inputs["requests"])}


def _oracle(inputs) -> dict[str, Any]:
    cases = {}
    for name, case in inputs["cases"].items():
        cases[name] = {
            "num_tokens": case["num_tokens"],
            "right": copy_outcome(simulate, case),
            "wrong": {
                key: copy_outcome(lambda *args, switch=switch: simulate(*args, **switch), case)
                for key, (switch, _) in MISTAKES.items()
            },
        }
    return {"cases": cases, **solo_oracle({"requests": inputs["requests"]})}


def _same_pools(got: dict[str, Any], wrong: dict[str, Any]) -> bool:
    return all(
        isinstance(have, torch.Tensor) and torch.equal(have, want)
        for name in ("target_k", "target_v")
        for have, want in zip(got[name], wrong[name])
    )


def _compare_tables(name: str, num_tokens: int, want: dict[str, Any], got: dict[str, Any]) -> Mismatch | None:
    """The allocation: blocks taken through the allocator, as many as the tokens need, and returned as the table."""
    needed = len(want["allocated"])
    if not got["allocated"]:
        return Mismatch(
            f"{name}: the target allocator holds no blocks for the sequence 'r' after your hand-off "
            f"(it should hold {needed} for {num_tokens} tokens)",
            "The target blocks were not allocated through the allocator: call allocator.allocate(seq_id, num_tokens) "
            "and write into the blocks it returns, never into blocks you pick yourself (another sequence may own them).",
        )
    if len(got["allocated"]) != needed:
        full = num_tokens // BLOCK_SIZE
        hint = (
            MISTAKES["partial"][1]
            if len(got["allocated"]) == full
            else "The token count is off by one: allocate(seq_id, num_tokens) gives exactly the blocks num_tokens "
            "tokens need."
        )
        return Mismatch(
            f"{name}: the allocator holds {len(got['allocated'])} blocks for {num_tokens} tokens of "
            f"{BLOCK_SIZE} per block, expected {needed}",
            hint,
        )
    if got["returned"] != got["allocated"]:
        return Mismatch(
            f"{name}: hand_off_kv returned {got['returned']!r:.80}, but the allocator's table for the sequence is "
            f"{got['allocated']}",
            "Return the target's block table: the list allocator.allocate(seq_id, num_tokens) returned.",
        )
    return None


def _without_tail(outcome: dict[str, Any], table: list[int], num_tokens: int) -> dict[str, Any]:
    """The outcome with the slots past the last token of the sequence's last block zeroed: no step reads them, so a
    hand-off that copies the whole last block (garbage tail included) is as right as one that stops at the token."""
    used = num_tokens % BLOCK_SIZE
    if not used or not table:
        return outcome
    cleared = dict(outcome)
    for name in ("target_k", "target_v"):
        pools = [pool.clone() if isinstance(pool, torch.Tensor) else pool for pool in outcome[name]]
        for pool in pools:
            if isinstance(pool, torch.Tensor):
                pool[table[-1], used:] = 0
        cleared[name] = pools
    return cleared


def _compare_case(name: str, num_tokens: int, expected: dict[str, Any], got: dict[str, Any]) -> Mismatch | None:
    mismatch = _compare_tables(name, num_tokens, expected["right"], got)
    if mismatch is not None:
        return mismatch
    table = got["allocated"]
    want = _without_tail(expected["right"], table, num_tokens)
    got = _without_tail(got, table, num_tokens)
    wrongs = {key: _without_tail(wrong, table, num_tokens) for key, wrong in expected["wrong"].items()}
    for pools in ("target_k", "target_v"):
        for layer, (right, have) in enumerate(zip(want[pools], got[pools])):
            what = f"the target's {pools[-1].upper()} pool of layer {layer}"
            difference = compare_tensors(right, have, dims=("block", "slot", "kv head", "dim"), what=what, atol=0)
            if difference is None:
                continue
            for key, wrong in wrongs.items():
                if _same_pools(got, wrong):
                    return Mismatch(difference.difference, MISTAKES[key][1]).within(name)
            return difference.within(name)
    return None


def _compare(expected, got) -> Mismatch | None:
    for name, case in expected["cases"].items():
        mismatch = _compare_case(name, case["num_tokens"], case, got["cases"][name])
        if mismatch is not None:
            return mismatch
    engine = got["engine"]
    failure = run_failure(engine, "with your hand-off between a prefill and a decode engine, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], engine["tokens"])
    if mismatch is not None:
        return mismatch.within("after your hand-off from the prefill engine to the decode engine")
    if engine["leaked"]:
        return Mismatch(
            f"after the run the decode engine still holds {engine['leaked']} blocks: a hand-off leaked them"
        )
    return None


def _inputs(seed: int) -> dict[str, Any]:
    return {"cases": copy_cases(seed), "requests": random_requests(seed, 4, arrival_span=6)}


register(
    diagnosed(
        Exercise(
            id="lab12.kv_handoff",
            functions=("hand_off_kv",),
            answers=("labkit.kv.handoff.slots", "labkit.kv.handoff.read_tokens", "labkit.kv.handoff.write_tokens"),
            make_inputs=_inputs,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="your hand_off_kv on 3 seeded cases (2 layers, a shuffled source table, a target pool that already "
            "holds another sequence, prompts ending mid-block, on a block boundary, and of one token): the target "
            "blocks come from its allocator and hold exactly the source's K and V in table order; then a prefill "
            "engine hands 4 requests to a decode engine through it, and every request gives its solo tokens",
            hint="Allocate first (target_table = allocator.allocate(seq_id, num_tokens)), then for every layer and "
            "every token t < num_tokens copy K and V from source block table[t // block_size] to target block "
            'target_table[t // block_size], slot t % block_size. labkit.hint("lab12.kv_handoff") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab12.kv_handoff",
    "A pool is [num_blocks, block_size, kv_heads, head_dim]: pool[b, s] is the K (or V) of whichever token sits in "
    "slot s of block b. A sequence's token t sits in block table[t // block_size], slot t % block_size; the target "
    "gives the same token another block, from its own table.",
    "Block by block: for i in range(ceil(num_tokens / block_size)): n = min(block_size, num_tokens - i * block_size); "
    "target_k[layer][target_table[i], :n] = source_k[layer][table[i], :n]; the same for V. The last block is "
    "usually partial, and it holds the prompt's last tokens.",
)
