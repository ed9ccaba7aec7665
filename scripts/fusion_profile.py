"""What fusing the matmuls buys: the decode-step profile with labkit's fused matmuls and with separate ones, in turns.

    python scripts/fusion_profile.py                        # batch 1, 8, 32 and 64; 2 rounds
    python scripts/fusion_profile.py --batches 1 8 --rounds 3

labkit's model (labkit/models/llama.py) joins each layer's q, k and v weights into one matrix and its
gate and up weights into another, so a decode step makes two matrix multiplies where the Hugging Face
layer makes five. "Separate" is the same engine with each layer's ``qkv`` and ``gate_up`` replaced by
three and two multiplies by the original weights (on the same matmul path, prepacked or not), their
outputs joined with ``torch.cat``. Each round takes ``labkit bench --profile``'s step apart at every
batch both ways, one right after the other, so a machine that gets busier moves both alike; the table
shows each part's median over the rounds, separate -> fused.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from labkit.bench.step_profile import PARTS, profile_batch
from labkit.models.fast_linear import prepacked_linear

WAYS = ("separate", "fused")


def separate_matmuls(model) -> list[tuple]:
    """Per layer: (qkv, gate_up) functions that make the five multiplies of the unfused layer."""

    def layer_functions(hf_layer):
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        q, k, v = (
            prepacked_linear(m.weight, m.bias, enabled=model.prepacked) for m in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        gate, up = (prepacked_linear(m.weight, enabled=model.prepacked) for m in (mlp.gate_proj, mlp.up_proj))
        return (lambda h: torch.cat([q(h), k(h), v(h)], dim=-1)), (lambda h: torch.cat([gate(h), up(h)], dim=-1))

    return [layer_functions(layer) for layer in model.hf.model.layers]


def use(model, functions: list[tuple]) -> None:
    for layer, (qkv, gate_up) in zip(model.layers, functions):
        layer.qkv, layer.gate_up = qkv, gate_up


def measure(model, batches, context: int, rounds: int, repeats: int, bandwidth: float) -> dict:
    """{way: {batch: [StepProfile per round]}}, the two ways taking turns at each batch of each round."""
    ways = {"separate": separate_matmuls(model), "fused": [(layer.qkv, layer.gate_up) for layer in model.layers]}
    results: dict = {way: {batch: [] for batch in batches} for way in WAYS}
    try:
        for _ in range(rounds):
            for batch in batches:
                for way in WAYS:
                    use(model, ways[way])
                    results[way][batch].append(profile_batch(model, batch, context, bandwidth, repeats))
    finally:
        use(model, ways["fused"])
    return results


def format_rows(results: dict) -> str:
    """A Markdown table: per batch, the step and each part, separate -> fused (medians over rounds, ms)."""

    def median(way: str, batch: int, part: str | None) -> float:
        profiles = results[way][batch]
        return statistics.median(p.step_ms if part is None else p.parts_ms[part] for p in profiles)

    columns = [None, *PARTS]
    lines = [
        "| batch | " + " | ".join("step" if part is None else part for part in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for batch in results["fused"]:
        cells = []
        for part in columns:
            before, after = median("separate", batch, part), median("fused", batch, part)
            cells.append(f"{before:.1f} -> {after:.1f}" + (f" ({after / before - 1:+.0%})" if part is None else ""))
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=256, help="prompt tokens per sequence")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8, help="decode steps timed per profile")
    args = parser.parse_args()

    from labkit.models import load_model
    from labkit.sim.hardware import measure_bandwidth

    model = load_model(args.model)
    bandwidth = measure_bandwidth(device=model.device)
    print(f"{model.config.name}, {model.dtype}, {torch.get_num_threads()} torch thread(s), {model.matmul.describe()}")
    results = measure(model, args.batches, args.context, args.rounds, args.repeats, bandwidth)
    print(f"decode steps after a {args.context}-token prompt, ms, median of {args.rounds} rounds: separate -> fused")
    print(format_rows(results))


if __name__ == "__main__":
    main()
