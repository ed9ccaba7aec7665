"""Quantized weights on this machine: bytes, decode-step time at batch 1, 8 and 64, and quality, per scheme.

    python scripts/quant_bench.py                       # the default model, on labkit's device
    LABKIT_DEVICE=cuda python scripts/quant_bench.py --model /path/to/hf-checkpoint --out quant.json
    python scripts/quant_bench.py --bf16 --batches 1,8 # and bf16 against fp32 (what labkit serve may pick)

For each scheme (the model as loaded, labkit's weight-only int8 per channel, int4 in groups of 128,
and with ``--bf16`` the fp32 model computing in bf16, which `labkit serve` picks where bf16 is fast;
slow to time on a CPU without native bf16) it prints the weight bytes, the median decode step of
the real engine at each batch size after a prompt of ``--context`` tokens, and greedy agreement and mean KL against the unquantized model on
the fixed ShareGPT quality prompts. labkit's quantized layers dequantize and then multiply (no fused
int8/int4 kernel), so their step time shows this machine's cost of that, not what vLLM's kernels
do on a GPU; the bytes are the figure that carries over. scripts/gpu_check.sh runs it on a GPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from labkit.bench.decode_sweep import labkit_decode_ms
from labkit.models import load_model
from labkit.models.quant import SCHEMES, quality, quantize_model
from labkit.workloads import sharegpt_quality_prompts


def measure(
    model, batches: tuple[int, ...], context: int, repeats: int, prompts: int, n_tokens: int, others: dict | None = None
) -> list[dict]:
    """One row per scheme: its weight bytes, step times (ms) per batch size and quality against ``model``.

    ``others`` adds rows for other versions of the same model by name (such as it computing in bf16).
    """
    quality_prompts = sharegpt_quality_prompts(model.tokenizer, n=prompts) if prompts else []
    candidates = {"as loaded": model, **{scheme: quantize_model(model, scheme) for scheme in SCHEMES}, **(others or {})}
    rows = []
    for scheme, candidate in candidates.items():
        row = {
            "scheme": scheme,
            "weight bytes": candidate.weight_bytes(),
            "step ms": {batch: labkit_decode_ms(candidate, batch, context, repeats) for batch in batches},
        }
        if quality_prompts and candidate is not model:
            score = quality(model, candidate, quality_prompts, n_tokens)
            row.update({"greedy agreement": score.agreement, "mean KL nats": score.mean_kl})
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    batches = list(rows[0]["step ms"])
    lines = [
        "| scheme | weights MB | " + " | ".join(f"step ms, batch {b}" for b in batches) + " | agreement | mean KL |",
        "|---|---:|" + "---:|" * len(batches) + "---:|---:|",
    ]
    for row in rows:
        steps = " | ".join(f"{row['step ms'][b]:.1f}" for b in batches)
        reference = row["scheme"] == "as loaded"
        agreement = (
            f"{row['greedy agreement']:.1%}" if "greedy agreement" in row else "(reference)" if reference else "-"
        )
        kl = f"{row['mean KL nats']:.4f}" if "mean KL nats" in row else ""
        lines.append(f"| {row['scheme']} | {row['weight bytes'] / 1e6:.1f} | {steps} | {agreement} | {kl} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' or a local Hugging Face checkpoint folder")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=8, help="quality prompts (0: skip the quality columns)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens scored per quality prompt")
    parser.add_argument("--bf16", action="store_true", help="add a row: the fp32 model computing in bf16")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    model = load_model(args.model)
    print(f"{model.config.name} on {model.device}, {model.dtype}")
    batches = tuple(int(b) for b in args.batches.split(","))
    others = {}
    if args.bf16 and model.dtype == torch.float32:  # what labkit serve's choice of bf16 costs in quality
        others["bf16 compute"] = load_model(args.model, device=model.device, dtype="bfloat16", progress=False)
    rows = measure(model, batches, args.context, args.repeats, args.prompts, args.tokens, others)
    print(format_rows(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
