"""Plan GPU capacity by hand: conversations that fit, step times, tokens/s, cost, load under a promise.

Start from a preset (``--gpu``, ``--model``) or a worked example (``--example sale``) and
override any figure, for example::

    labkit plan --gpu h100-sxm --model qwen3-8b --prompt 2000 --answer 400 --promise-ms 40 --price 3
    labkit plan --example sale --memory-fraction 0.95
    labkit plan --example sale --weights int4 --kv fp8   # fewer bytes per weight and per cached value
    labkit plan --example sale --json   # every figure, for a script or a notebook
    labkit plan --gpu h100-sxm --speculate 4 --acceptance 0.7   # speculative decoding's speed-up by batch size
    labkit plan --example sale-70b --tensor-parallel 8 --replicas 12   # each replica split over 8 GPUs
    labkit plan --example sale-70b --load 10x   # the fewest GPUs for ten times the usual traffic
    labkit plan --gpu h200 --model deepseek-v3 --tensor-parallel 8 --compute fp8   # a mixture of experts with MLA

``--load`` takes requests/s (``58``) or a multiple of the sale's usual traffic (``10x``: the
5.8 requests/s one card of the sale example carries within its promise), tries 1, 2, 4 and 8
GPUs per replica (or the one ``--tensor-parallel`` names) and prints the fewest GPUs.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from labkit.capacity import (
    FRIENDS_EXAMPLE,
    KV_BYTES,
    PLANNER_MODELS,
    SALE_70B_EXAMPLE,
    SALE_EXAMPLE,
    WEIGHT_BYTES,
    format_speculation,
    plan,
    planner_model,
    sale_load,
    size_fleet,
    speculation_breakeven_batch,
    speculative_speedup,
    with_precision,
)
from labkit.cli import print_json
from labkit.sim.hardware import GB, PRESETS, TB, TFLOPS, get_hardware

EXAMPLES = {"sale": SALE_EXAMPLE, "sale-70b": SALE_70B_EXAMPLE, "friends": FRIENDS_EXAMPLE}
# An example whose model fits no single card is planned, unless told otherwise, on the split chapter 8's fleet picks.
EXAMPLE_TENSOR_PARALLEL = {"sale-70b": 8}
# the model's flags whose value goes into the ModelSpec field of the same name as it is given
MODEL_FLAGS = (
    "bytes_per_param layers kv_heads head_dim experts experts_per_token shared_experts kv_lora_rank "
    "qk_rope_head_dim sliding_window sliding_layers"
).split()
DEFAULTS = dict(hardware="a100-80gb", model="llama-3.1-8b", prompt_len=1000, answer_len=300)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`labkit plan`'s options, in the order its help lists them: the card, the model, the load, the output."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--example", choices=sorted(EXAMPLES), help="start from a worked example of the course")
    _add_hardware_arguments(parser)
    _add_model_arguments(parser)
    _add_serving_arguments(parser)


def _add_hardware_arguments(parser: argparse.ArgumentParser) -> None:
    """The card: a preset, or its memory, bandwidth, arithmetic rate and links."""
    parser.add_argument(
        "--gpu", help=f"hardware preset: {', '.join(sorted(PRESETS))} or this-machine (default a100-80gb)"
    )
    parser.add_argument("--gpu-memory-gb", type=float, help="memory of the card, GB")
    parser.add_argument("--bandwidth-tbs", type=float, help="memory bandwidth, TB/s")
    parser.add_argument(
        "--tflops", type=float, help="datasheet arithmetic rate, TFLOP/s (the plan counts half, the achievable rate)"
    )
    parser.add_argument(
        "--interconnect-gbs", type=float, help="link between the GPUs of a node, GB/s each way (NVLink)"
    )


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model: a preset, or its shape, its storage and (a group of their own) the shapes of the models served now."""
    parser.add_argument("--model", help=f"model preset: {', '.join(sorted(PLANNER_MODELS))} (default llama-3.1-8b)")
    parser.add_argument("--params-b", type=float, help="parameters, billions")
    parser.add_argument("--bytes-per-param", type=float, help="2 for BF16, 1 for 8-bit, about 0.52 for 4-bit")
    parser.add_argument(
        "--weights", choices=sorted(WEIGHT_BYTES), help="weight storage: int8 or int4 as vLLM's --quantization serves"
    )
    parser.add_argument("--kv", choices=sorted(KV_BYTES), help="KV cache storage: fp8 as vLLM's --kv-cache-dtype fp8")
    parser.add_argument(
        "--compute",
        choices=("bf16", "fp8"),
        help="arithmetic precision: fp8 doubles the rate on GPUs with fp8 tensor cores (H100, H200, B200)",
    )
    parser.add_argument("--layers", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument(
        "--hidden-size", type=int, help="the model's hidden size, for the all-reduces (presets know it)"
    )
    moe = parser.add_argument_group("a mixture of experts, latent attention, sliding windows (presets know theirs)")
    moe.add_argument("--active-params-b", type=float, help="parameters one token computes with, billions")
    moe.add_argument("--experts", type=int, help="routed experts per MoE layer")
    moe.add_argument("--experts-per-token", type=int, metavar="K", help="the router's top-k")
    moe.add_argument("--shared-experts", type=int, help="experts every token runs")
    moe.add_argument("--kv-lora-rank", type=int, help="MLA: the latent cached per token and layer (DeepSeek: 512)")
    moe.add_argument("--qk-rope-head-dim", type=int, help="MLA: the RoPE key cached beside it (DeepSeek: 64)")
    moe.add_argument("--sliding-window", type=int, help="tokens a sliding-window layer keeps")
    moe.add_argument("--sliding-layers", type=int, help="how many of the layers slide")


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """The conversations, the promise, the price and the fleet; what else to show, and how."""
    parser.add_argument("--memory-fraction", type=float, help="share of the card the server may use (0.9)")
    parser.add_argument("--prompt", type=int, help="prompt tokens per conversation (1000)")
    parser.add_argument("--answer", type=int, help="answer tokens per conversation (300)")
    parser.add_argument("--overhead-ms", type=float, help="fixed cost of every forward pass, ms (0)")
    parser.add_argument("--promise-ms", type=float, help="promised time between a user's tokens, ms")
    parser.add_argument("--price", type=float, help="price per GPU-hour, dollars")
    parser.add_argument("--tensor-parallel", type=int, metavar="N", help="GPUs per replica, the model split N ways (1)")
    parser.add_argument("--replicas", type=int, metavar="R", help="copies of the model behind a router (1)")
    parser.add_argument(
        "--load",
        type=_load,
        metavar="RATE",
        help="size the fleet for RATE requests/s, or for 10x the sale's usual traffic",
    )
    parser.add_argument(
        "--speculate",
        type=int,
        metavar="K",
        help="also show speculative decoding with K draft tokens per step: speed-up against batch size",
    )
    parser.add_argument(
        "--acceptance", type=float, default=0.7, help="with --speculate: chance each draft token is accepted (0.7)"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")


def _inputs(args: argparse.Namespace) -> dict:
    """The example's (or default) inputs, with every figure given on the command line put in."""
    inputs = dict(EXAMPLES[args.example] if args.example else DEFAULTS)
    hardware = get_hardware(args.gpu or inputs["hardware"])
    hardware_changes = {
        field: value * unit
        for field, value, unit in (
            ("memory_bytes", args.gpu_memory_gb, GB),
            ("bandwidth", args.bandwidth_tbs, TB),
            ("flops", args.tflops, TFLOPS),
            ("interconnect_bandwidth", args.interconnect_gbs, GB),
        )
        if value is not None
    }
    model = planner_model(args.model or inputs["model"])
    model_changes = {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name) is not None}
    for name, billions in (("parameters", args.params_b), ("active_parameters", args.active_params_b)):
        if billions is not None:
            model_changes[name] = billions * 1e9
    if hardware_changes:
        hardware = replace(hardware, name=f"{hardware.name}, as changed", **hardware_changes)
    if args.tflops is not None:  # a datasheet figure, rated like every other
        hardware = replace(hardware, flops_achievable=False)
    if model_changes:
        model = replace(model, name=f"{model.name}, as changed", **model_changes)
    model = with_precision(model, args.weights, args.kv)
    inputs.update(hardware=hardware, model=model)
    for key, value in (
        ("memory_fraction", args.memory_fraction),
        ("prompt_len", args.prompt),
        ("answer_len", args.answer),
        ("price_per_gpu_hour", args.price),
        ("overhead_s", None if args.overhead_ms is None else args.overhead_ms / 1e3),
        ("promise_s", None if args.promise_ms is None else args.promise_ms / 1e3),
        ("hidden_size", args.hidden_size),
        ("compute", args.compute),
    ):
        if value is not None:
            inputs[key] = value
    return inputs


def _load(text: str) -> float:
    """``--load``: requests/s, or ``10x`` for ten times the sale's usual traffic."""
    try:
        return sale_load(float(text[:-1])) if text.lower().endswith("x") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither requests/s (58) nor a multiple (10x)") from None


def run(args: argparse.Namespace) -> int:
    inputs = _inputs(args)
    if args.load is not None:
        return _size_fleet(args, inputs)
    inputs["tensor_parallel"] = args.tensor_parallel or EXAMPLE_TENSOR_PARALLEL.get(args.example or "", 1)
    if args.replicas is not None:
        inputs["replicas"] = args.replicas
    result = plan(**inputs)
    speculation = None if args.speculate is None else _speculation(args, inputs, result.conversations)
    if args.json:
        figures = result.to_dict()
        if speculation is not None:
            figures["speculation"] = speculation
        print_json(figures)
        return 0
    print(result)
    if speculation is not None:
        print(speculation["table"])
        where = speculation["breakeven_batch"]
        print(
            (f"speculation stops paying at a batch of {where}" if where else "speculation pays at every batch to 4,096")
            + f" (k = {args.speculate}, acceptance {args.acceptance:.0%}, drafts free as with prompt lookup; "
            "the verification pass at the achievable arithmetic rate, as the plan above)"
        )
    return 0


def _size_fleet(args: argparse.Namespace, inputs: dict) -> int:
    """The fewest GPUs that carry ``--load``, over the tensor-parallel sizes tried."""
    if args.replicas is not None:
        raise ValueError("--load chooses the replicas; drop --replicas (or drop --load to plan a fleet you chose)")
    if args.speculate is not None:
        raise ValueError("--speculate plans one replica; drop --load to see it")
    ways = (1, 2, 4, 8) if args.tensor_parallel is None else (args.tensor_parallel,)
    sizing = size_fleet(args.load, tensor_parallel=ways, **inputs)
    if args.json:
        print_json(sizing.to_dict())
        return 0
    print(sizing)
    print()
    print(sizing.best.plan)
    return 0


def _speculation(args: argparse.Namespace, inputs: dict, conversations: int) -> dict:
    """Speculative decoding on the plan's card, model and mean context, for batches up to what fits."""
    settings = dict(
        k=args.speculate,
        acceptance_rate=args.acceptance,
        hardware=inputs["hardware"].achievable(),  # rated as the plan rates it
        model=inputs["model"],
        context_len=inputs["prompt_len"] + inputs["answer_len"] / 2,
        overhead_s=inputs.get("overhead_s", 0.0),
        flops_fraction=1.0,
        memory_fraction=inputs.get("memory_fraction", 0.9),
    )
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= max(conversations, 1)]
    points = speculative_speedup(batches, **settings)
    return dict(
        k=args.speculate,
        acceptance_rate=args.acceptance,
        points=[dict(vars(p), speedup=p.speedup) for p in points],
        breakeven_batch=speculation_breakeven_batch(**settings),
        table=format_speculation(points),
    )
