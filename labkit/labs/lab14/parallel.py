"""Lab 14, exercise 3: expert parallelism over two real processes (:mod:`~labkit.labs.lab14.ranks`), checked against one
process: each rank's layer output, and the greedy tokens of a toy model of two such layers, so that a mistake the
first batch hides (a size kept from an earlier call) still shows."""

from __future__ import annotations

from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.learner_errors import RAISED, capture
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab14.course import course_dispatch, course_route
from labkit.labs.lab14.dispatch import MISTAKES, TOLERANCE, rows_elsewhere
from labkit.labs.lab14.moe_model import MoeLayer, make_layer, make_lm
from labkit.labs.lab14.ranks import HUNG, WORLD, run_on_two_ranks

STEPS, SEQUENCES = 4, 2  # greedy steps, and sequences per rank
NOT_DONE = "not done"
WAITING = ("Timed out", "timed out", "Connection closed", "Connection reset")  # a rank's error waiting for a partner
MARGIN = 1e-3  # the smallest gap between the best two logits the prompts' greedy steps may have


def _held(expert, rank: int, per_rank: int):
    """``expert`` for the experts this rank holds; asked for another rank's expert, a clear error."""

    def held(e, rows):
        if int(e) // per_rank != rank:
            raise ValueError(
                f"rank {rank} holds experts {rank * per_rank}-{(rank + 1) * per_rank - 1} and was asked for expert "
                f"{int(e)}: a row for expert e must be sent to rank e // experts_per_rank"
            )
        return expert(int(e), rows)

    return held


def rank_work(function, inputs: dict[str, Any], rank: int) -> Any:
    """What each rank runs: the learner's layer on this rank's batch, then the toy model's greedy steps with it."""
    per_rank = inputs["layer"].experts // WORLD

    def parallel(x, weights, chosen, expert):
        return function(x, weights, chosen, _held(expert, rank, per_rank), per_rank)

    def both() -> dict[str, Any]:
        out = parallel(inputs["x"][rank], inputs["weights"][rank], inputs["chosen"][rank], inputs["layer"].expert)
        if not isinstance(out, torch.Tensor):
            return {"out": repr(out)[:80]}
        return {"out": out, "tokens": inputs["lm"].greedy(inputs["prompts"][rank], STEPS, course_route, parallel)}

    try:
        return capture([function], both)
    except NotImplementedError:
        return {NOT_DONE: True}


def _clear_margins(lm, prompts: torch.Tensor) -> torch.Tensor:
    """For each prompt token, whether every greedy step has its best logit ahead of the next by :data:`MARGIN`."""
    clear, tokens = torch.ones(len(prompts), dtype=torch.bool), prompts
    for _ in range(STEPS):
        logits = lm.step(tokens, course_route, course_dispatch)
        top = logits.topk(2, dim=-1).values
        clear &= top[:, 0] - top[:, 1] >= MARGIN
        tokens = logits.argmax(dim=-1)
    return clear


def parallel_cases(seed: int) -> dict[str, Any]:
    """A seeded layer of 8 experts (4 per rank) and a batch of 3 to 9 tokens on each rank, routed by its router (each
    rank sends the other a different number of rows); the toy model of the seed and 2 prompt tokens per rank whose
    greedy steps have no near-tie."""
    r, generator = rng(seed), torch_generator(seed)
    layer, lm = make_layer(seed + 7), make_lm(seed)
    while True:  # until the ranks send each other different numbers of rows, so that unexchanged counts show
        x = [torch.randn(r.randint(3, 9), 64, generator=generator) for _ in range(WORLD)]
        routes = [course_route(layer.logits(batch), layer.top_k) for batch in x]
        across = [int((chosen // (layer.experts // WORLD) != rank).sum()) for rank, (_, chosen) in enumerate(routes)]
        if across[0] != across[1]:
            break
    candidates = torch.tensor(r.sample(range(len(lm.embedding)), 40))
    prompts = candidates[_clear_margins(lm, candidates)][: WORLD * SEQUENCES].view(WORLD, SEQUENCES)
    inputs = {"layer": layer, "lm": lm, "x": x, "weights": [w for w, _ in routes], "chosen": [c for _, c in routes]}
    return on_check_device({**inputs, "prompts": prompts})


def _first_cause(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Of the ranks' exceptions, the one that is not a rank's timeout waiting for its failed partner."""
    return next((r for r in records if not any(word in r["message"] for word in WAITING)), records[0])


def _run(functions, inputs) -> Any:
    results = run_on_two_ranks(functions[0], rank_work, inputs)
    if any(isinstance(result, dict) and NOT_DONE in result for result in results):
        raise NotImplementedError("expert_parallel_moe is not written yet")
    crashed = [result for result in results if "crashed" in result]
    if crashed:  # gloo ends a process whose collective received the wrong size; its partner's error only echoes it
        return crashed[:1]
    raised = [dict(result[RAISED], rank=rank) for rank, result in enumerate(results) if RAISED in result]
    if raised:
        cause = _first_cause(raised)
        return {RAISED: dict(cause, message=f"{cause['message']} (on rank {cause['rank']})")}
    return results


def _oracle(inputs) -> dict[str, Any]:
    layer: MoeLayer = inputs["layer"]
    x, weights, chosen = (torch.cat(inputs[key]) for key in ("x", "weights", "chosen"))
    sizes = [len(batch) for batch in inputs["x"]]

    def per_rank(dispatch_weights, dispatch_chosen) -> list[torch.Tensor]:
        return list(course_dispatch(x, dispatch_weights, dispatch_chosen, layer.expert).split(sizes))

    tokens = inputs["lm"].greedy(inputs["prompts"].flatten(), STEPS, course_route, course_dispatch)
    return {
        "right": per_rank(weights, chosen),
        "wrong": {
            hint: list(mistake(x, weights, chosen, layer.expert).split(sizes)) for hint, mistake in MISTAKES.items()
        },
        "tokens": list(tokens.view(WORLD, SEQUENCES, STEPS)),
        "sizes": sizes,
    }


def _hung_mismatch(record: dict[str, Any]) -> Mismatch:
    return Mismatch(
        f"the two ranks had not finished after {record['seconds']:.0f} s (rank {record['waiting']} still running): a "
        "collective that one rank called and the other did not, or sizes the two ranks disagree on",
        "Both ranks must call the same collectives in the same order, and what rank r sends to rank s is what rank s "
        "expects from r: exchange the counts first (all_to_all_single of a tensor of one count per rank), then use "
        "them as the split sizes.",
    )


def _layer_mismatch(expected: dict[str, Any], rank: int, out: Any) -> Mismatch | None:
    right = expected["right"][rank]
    where = f"rank {rank}'s layer output for its {len(right)} tokens"
    if not isinstance(out, torch.Tensor):
        return Mismatch(f"{where}: expert_parallel_moe returned {out}", "Return this rank's output, a tensor [T, H].")
    out = out.to(right.device)
    if out.shape != right.shape:
        return Mismatch(
            f"{where}: shape {tuple(out.shape)}, expected {tuple(right.shape)}",
            "Return one row per token of this rank's x, in x's order: the rows that came back, added per token.",
        )
    if torch.allclose(out, right, **TOLERANCE):
        return None
    hint = next((h for h, wrong in expected["wrong"].items() if torch.allclose(out, wrong[rank], **TOLERANCE)), None)
    moved = rows_elsewhere(out, right)
    if hint is None and moved:
        hint = (
            "Rows went back to the wrong tokens: rows come back in the order you sent them (sorted by rank); add "
            "each to the token it was sent for (index_add_ with the sorted tokens, and the weights in the same order)."
        )
    gap = float((out - right).abs().max())
    return Mismatch(
        f"{where}: off by up to {gap:.3g} from one process",
        hint
        or "Did the rows come back? A tensor made with torch.empty holds garbage until the all-to-all back fills it. "
        "Then compare the order you sent the rows in with the order you add them back: the rows come back in the "
        "order you sent them, so keep each row's token and weight in that same order.",
    )


def _compare(expected: dict[str, Any], got: Any) -> Mismatch | None:
    record = got[0] if isinstance(got, list) and got else {}
    if HUNG in record:
        return _hung_mismatch(record[HUNG])
    if "crashed" in record:
        crash = record["crashed"]
        return Mismatch(
            f"rank {crash['rank']} ended with exit code {crash['exitcode']} and no result: {crash['log'].strip()}",
            _known({"message": crash["log"]}),
        )
    for rank, result in enumerate(got):
        mismatch = _layer_mismatch(expected, rank, result["out"])
        if mismatch is not None:
            return mismatch
        right = expected["tokens"][rank]
        tokens = result["tokens"].to(right.device)
        if not torch.equal(tokens, right):
            sequence = int((tokens != right).any(dim=1).nonzero()[0])
            return Mismatch(
                f"rank {rank}, sequence {sequence} of the toy model: greedy tokens {tokens[sequence].tolist()}, one "
                f"process gives {right[sequence].tolist()}",
                "The layer matched on the first batch but not in the model's steps: does your function rely on "
                "something of that batch (its size, a count kept from an earlier call)?",
            )
    return None


def _known(record: dict[str, Any]) -> str | None:
    """The typical mistake an exception on a rank shows."""
    message = record["message"]
    if "holds experts" in message:
        return (
            "A row went to the wrong rank: expert e lives on rank e // experts_per_rank, so sort the (token, expert) "
            "pairs by that, and count how many go to each rank in that order."
        )
    if any(word in message for word in ("split", "size", "numel", "shape")):
        return (
            "The sizes disagree: rank s must be told how many rows rank r sends it before it can receive them. "
            "Exchange the counts first (all_to_all_single of a [world] tensor of counts) and pass what you send as "
            "input_split_sizes and what you receive as output_split_sizes."
        )
    if any(word in message for word in WAITING):
        return (
            "A rank waited for a collective its partner never joined: both ranks must call the same collectives, "
            "in the same order, the same number of times (also when a rank has no rows to send: send zero)."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab14.expert_parallel",
            functions=("expert_parallel_moe",),
            make_inputs=parallel_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="expert_parallel_moe on two real processes joined by torch.distributed (gloo on the CPU, NCCL on "
            "two GPUs), a seeded layer of 8 experts with 4 on each rank and 3 to 9 tokens per rank: each rank's output "
            "within 1e-5 of one process's, and the greedy tokens of a toy model of two such layers (2 sequences per "
            f"rank, {STEPS} steps) equal to one process's",
            hint="Sort the (token, expert) pairs by destination rank (e // experts_per_rank), exchange the counts, "
            "all_to_all_single the rows and the expert ids, run your experts, all_to_all_single the rows back with the "
            'sizes swapped, and add them to their tokens with their weights. labkit.hint("lab14.expert_parallel").',
        ),
        known=_known,
    )
)

register_hints(
    "lab14.expert_parallel",
    "Each rank turns its tokens into (token, expert) pairs and sorts them by the rank that holds the expert. Both "
    "ranks then exchange how many rows each sends the other, the rows themselves, and which expert each row is for. "
    "The experts run where they are; the results go back the same way, and each rank adds them to its tokens.",
    "dest = chosen.flatten() // experts_per_rank; order = dest.argsort(stable=True); send = torch.bincount(dest, "
    "minlength=world); recv = torch.empty_like(send); dist.all_to_all_single(recv, send). Then all_to_all_single(out, "
    "inp, recv.tolist(), send.tolist()) for the rows and the ids; back with the two lists swapped.",
    "rows = torch.empty(sum(r), H); dist.all_to_all_single(rows, x[token[order]], r, s)  # r, s: recv, send lists\n"
    "... run the experts on rows grouped by id into done ...\nback = torch.empty(len(order), H); "
    "dist.all_to_all_single(back, done, s, r)\nout.index_add_(0, token[order], weights.flatten()[order, None] * back)",
)
