"""Quantized models on this machine: bytes, decode tok/s at batch 1, 8 and 32, and quality, per scheme.

    python scripts/quant_bench.py                       # the default model, on labkit's device
    LABKIT_DEVICE=cuda python scripts/quant_bench.py --model /path/to/hf-checkpoint --out quant.json
    python scripts/quant_bench.py --no-bf16 --batches 1,8 --rounds 3

The rows: the model as loaded; lab 10's weight-only int8 (per channel) and int4 (groups of 128),
which dequantize and then multiply in float (no fused kernel, so on a CPU their speed shows that
cost, not what vLLM's kernels do on a GPU; their bytes carry over); ``w8a8``, what
``labkit serve --quantization int8`` runs (int8 weights times int8 activations on torch's int8
kernels, the LM head too), and ``w8a8, LM head float`` (the measurement behind quantizing the head);
and the fp32 model computing in bf16 (what `labkit serve` picks where bf16 is fast), by default
where oneDNN's bf16 kernels work (``--bf16`` forces it, slow on a CPU without native bf16).
Each row has its weight bytes, the median decode step of the real engine at each batch after a
prompt of ``--context`` tokens, timed in turns over ``--rounds`` rounds so that every row sees the
same machine (tok/s and the ratio to the model as loaded come from one run), and greedy agreement
and mean KL against the unquantized model on lab 10's fixed ShareGPT quality prompts.
scripts/gpu_check.sh runs it on a GPU (the w8a8 rows are CPU-only: they are left out there).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from labkit.engine.decode_timing import labkit_decode_ms
from labkit.engine.int8_choice import choose_int8_backend
from labkit.models import load_model
from labkit.models.fast_linear import probe_prepack
from labkit.models.int8_model import Int8Model
from labkit.models.quant import SCHEMES, quality, quantize_model
from labkit.workloads import sharegpt_quality_prompts


def w8a8_rows(model) -> dict:
    """The int8 x int8 versions of ``model`` (LM head in int8 or not), where an int8 kernel works here."""
    backend = choose_int8_backend() if model.device.type == "cpu" else None
    if backend is None or not backend.works:
        print(f"w8a8 rows left out: {backend.reason if backend else 'int8 kernels are tried on a CPU only'}")
        return {}
    print(f"w8a8 on {backend.reason}")
    return {"w8a8": Int8Model(model, backend, lm_head=True), "w8a8, LM head float": Int8Model(model, backend, False)}


def measure(
    model,
    batches: tuple[int, ...],
    context: int,
    repeats: int,
    prompts: int,
    n_tokens: int,
    others: dict | None = None,
    rounds: int = 1,
) -> list[dict]:
    """One row per scheme: its weight bytes, step times (ms, medians of ``rounds`` taken in turns) per batch
    size and quality against ``model``. ``others`` adds rows for other versions of the same model by name."""
    quality_prompts = sharegpt_quality_prompts(model.tokenizer, n=prompts) if prompts else []
    candidates = {"as loaded": model, **{scheme: quantize_model(model, scheme) for scheme in SCHEMES}, **(others or {})}
    steps: dict[str, dict[int, list[float]]] = {scheme: {batch: [] for batch in batches} for scheme in candidates}
    for _ in range(rounds):
        for batch in batches:
            for scheme, candidate in candidates.items():
                steps[scheme][batch].append(labkit_decode_ms(candidate, batch, context, repeats))
    rows = []
    for scheme, candidate in candidates.items():
        row = {
            "scheme": scheme,
            "weight bytes": candidate.weight_bytes(),
            "step ms": {batch: statistics.median(times) for batch, times in steps[scheme].items()},
        }
        if quality_prompts and candidate is not model:
            score = quality(model, candidate, quality_prompts, n_tokens)
            row.update({"greedy agreement": score.agreement, "mean KL nats": score.mean_kl})
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    """A markdown table: decode tok/s per batch with its ratio to the model as loaded (the first row)."""
    batches = list(rows[0]["step ms"])
    reference = rows[0]["step ms"]  # the model as loaded
    lines = [
        "| scheme | weights MB | " + " | ".join(f"tok/s, batch {b}" for b in batches) + " | agreement | mean KL |",
        "|---|---:|" + "---:|" * len(batches) + "---:|---:|",
    ]
    for row in rows:
        speeds = " | ".join(
            f"{1e3 * b / row['step ms'][b]:.0f} ({reference[b] / row['step ms'][b]:.2f}x)" for b in batches
        )
        reference_row = row is rows[0]
        agreement = (
            f"{row['greedy agreement']:.1%}" if "greedy agreement" in row else "(reference)" if reference_row else "-"
        )
        kl = f"{row['mean KL nats']:.4f}" if "mean KL nats" in row else ""
        lines.append(f"| {row['scheme']} | {row['weight bytes'] / 1e6:.1f} | {speeds} | {agreement} | {kl} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' or a local Hugging Face checkpoint folder")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=6, help="decode steps timed per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="measurements per row and batch, taken in turns")
    parser.add_argument("--prompts", type=int, default=8, help="quality prompts (0: skip the quality columns)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens scored per quality prompt")
    parser.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the fp32 model computing in bf16 (default: where oneDNN's bf16 kernels work)",
    )
    parser.add_argument(
        "--w8a8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the int8 x int8 rows (CPU only; --no-w8a8 leaves them out, as on a GPU)",
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    model = load_model(args.model)
    print(f"{model.config.name} on {model.device}, {model.dtype}, {torch.get_num_threads()} torch threads")
    batches = tuple(int(b) for b in args.batches.split(","))
    others = w8a8_rows(model) if args.w8a8 else {}
    bf16 = probe_prepack(model.device, torch.bfloat16).prepacked if args.bf16 is None else args.bf16
    if bf16 and model.dtype == torch.float32:  # what labkit serve's choice of bf16 costs in quality
        others["bf16 compute"] = load_model(args.model, device=model.device, dtype="bfloat16", progress=False)
    rows = measure(model, batches, args.context, args.repeats, args.prompts, args.tokens, others, args.rounds)
    print(format_rows(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
