"""What lab 14's notebook runs with the learner's functions: one and two processes side by side, and the weight bytes
a decode step reads against the planner's curve.

These print and plot what this machine computed with the learner's own functions; the verdicts are the checks'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import matplotlib.pyplot as plt
import torch

from labkit.labs.lab14.moe_model import make_layer, make_lm
from labkit.labs.lab14.ranks import WORLD, backend, run_on_two_ranks
from labkit.sim.moe import expected_distinct_experts, weight_bytes_read

LAYERS, OTHER_BYTES = 4, 2_000_000  # the stack the curve is measured on, and what it reads whatever the batch
STEPS = 6


def _greedy_on_rank(functions: tuple[Callable, Callable], inputs: dict[str, Any], rank: int) -> dict[str, Any]:
    """Each rank's greedy tokens of the toy model, its layers run by the learner's expert parallelism."""
    expert_parallel_moe, route = functions
    per_rank = inputs["lm"].layers[0].experts // WORLD

    def parallel(x, weights, chosen, expert):
        return expert_parallel_moe(x, weights, chosen, expert, per_rank)

    return {"tokens": inputs["lm"].greedy(inputs["prompts"][rank], STEPS, route, parallel)}


def one_and_two_processes(
    expert_parallel_moe: Callable, route: Callable, moe_dispatch: Callable, seed: int = 0
) -> bool:
    """The toy model's greedy tokens from 4 prompt tokens, on two processes with ``expert_parallel_moe`` and on one
    with ``moe_dispatch``, printed side by side."""
    lm = make_lm(seed)
    prompts = torch.randperm(len(lm.embedding), generator=torch.Generator().manual_seed(seed))[: 2 * WORLD]
    results = run_on_two_ranks(
        (expert_parallel_moe, route), _greedy_on_rank, {"lm": lm, "prompts": prompts.view(WORLD, 2)}
    )
    if not all(isinstance(result, dict) and "tokens" in result for result in results):
        print(f"the two processes did not finish: {results[0]!r:.300}")
        return False
    alone = lm.greedy(prompts, STEPS, route, moe_dispatch).view(WORLD, 2, STEPS)
    name, device = backend()
    print(f"two processes ({name} on {device}, {lm.layers[0].experts // WORLD} experts each) and one:")
    same = True
    for rank, result in enumerate(results):
        for sequence, tokens in enumerate(result["tokens"].tolist()):
            one = alone[rank, sequence].tolist()
            same &= tokens == one
            print(f"  rank {rank}, prompt token {int(prompts[2 * rank + sequence]):>2}: {tokens}  one process: {one}")
    print("the same tokens" if same else "DIFFERENT tokens")
    return same


def bytes_per_step_curve(
    weight_bytes_per_step: Callable,
    route: Callable,
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    draws: int = 8,
    seed: int = 0,
) -> dict[int, float]:
    """Mean weight bytes per step, by ``weight_bytes_per_step``, of batches of random hidden states routed by ``route``
    through a stack of :data:`LAYERS` of the course's layers (8 experts, top-2), beside labkit's even-routing curve."""
    layers = [make_layer(seed + i) for i in range(LAYERS)]
    generator = torch.Generator().manual_seed(seed)
    expert_bytes, experts, top_k = layers[0].expert_bytes, layers[0].experts, layers[0].top_k
    measured = {}
    for batch in batches:
        total = 0
        for _ in range(draws):
            x = torch.randn(batch, 64, generator=generator)
            total += weight_bytes_per_step(
                [route(layer.logits(x), top_k)[1] for layer in layers], expert_bytes, OTHER_BYTES
            )
        measured[batch] = total / draws
    everything = OTHER_BYTES + LAYERS * experts * expert_bytes
    planned = {b: weight_bytes_read(everything, experts, top_k, LAYERS * expert_bytes, b) for b in batches}
    for batch in batches:
        touched = expected_distinct_experts(batch, experts, top_k)
        print(f"batch {batch:>3}: measured {measured[batch] / 1e6:6.2f} MB, even routing {planned[batch] / 1e6:6.2f} MB "
              f"({touched:.1f} of {experts} experts a layer)")  # fmt: skip
    _plot(measured, planned, everything)
    return measured


def _plot(measured: dict[int, float], planned: dict[int, float], everything: float) -> None:
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(list(planned), [v / 1e6 for v in planned.values()], "-", label="labkit.sim.moe (even routing)")
    axes.plot(list(measured), [v / 1e6 for v in measured.values()], "o", label="measured: your function, this router")
    axes.axhline(everything / 1e6, color="grey", linestyle=":", label="every expert (a dense model's read)")
    axes.set(xscale="log", xlabel="tokens in the decode step", ylabel="weight MB read per step")
    axes.legend()
    plt.show()
