"""``labkit serve``: an OpenAI-compatible server over labkit's engine, with ``vllm serve``'s dial names.

    labkit serve --max-num-seqs 32 --port 8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}]}'

Any OpenAI client works against it, as against ``vllm serve``; ``/metrics`` has vLLM's metric
names. It listens on loopback unless told otherwise (``--host 0.0.0.0`` opens it to the network:
add ``--api-key`` then). Ctrl-C or SIGTERM stops it gracefully.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import typing
from collections.abc import Callable
from typing import Any

from labkit.engine.config import EngineConfig, engine_config
from labkit.engine.quantization import check_quantization
from labkit.serve.admission import admission_within

TRACE_WINDOW = 4096  # the steps (and finished requests) a long-running server keeps in its engine's trace
# EngineConfig settings that are deliberately not flags, and why
NOT_FLAGS = {"trace_window": f"a long-running server keeps its last {TRACE_WINDOW} steps, so its memory stays bounded"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--model", default="default", help="model: 'default', a checkpoint folder or a cached hub id")
    parser.add_argument("--served-model-name", help="the model id clients send (default: the model's name)")
    parser.add_argument(
        "--dtype",
        help="float32, bfloat16 or float16 (default: bf16 where this machine runs it measurably faster, else fp32)",
    )
    parser.add_argument(
        "--quantization",
        type=quantization_flag,
        help="int8: linears in int8 (weights per channel, activations per token) on the fastest int8 kernel "
        "that works here, tried at start (default: unquantized, as in vLLM)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (8000; 0 picks a free one)")
    parser.add_argument("--api-key", help="if set, /v1 requests need 'Authorization: Bearer KEY'")
    add_engine_arguments(parser.add_argument_group("engine dials (vllm serve's names)"))
    parser.add_argument(
        "--max-waiting",
        type=int,
        help="answer 503 + Retry-After while this many requests wait to start (off by default)",
    )
    parser.add_argument(
        "--max-queue-delay-ms",
        type=milliseconds,
        metavar="MS",
        help="labkit only (vllm serve has no such option): answer 503 + Retry-After to a request predicted to "
        "wait longer than this before it starts (off by default; see labkit.serve.admission)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        help="on Ctrl-C/SIGTERM, seconds to let requests in flight finish (default: long enough for a 512-token "
        "answer at the speed measured, 10 s at least)",
    )


def add_engine_arguments(group: argparse._ArgumentGroup) -> None:
    """A flag for each EngineConfig setting (its help and allowed values as the field says), and ``--policy``."""
    hints = typing.get_type_hints(EngineConfig)
    for setting in engine_flags():
        meta = setting.metadata
        kind = value_type(hints[setting.name])
        flag = flag_of(setting)
        if kind is bool:
            group.add_argument(flag, dest=setting.name, action=argparse.BooleanOptionalAction, help=meta.get("help"))
            continue
        if kind not in PARSERS:
            raise TypeError(
                f"EngineConfig.{setting.name} is a {kind.__name__}, which labkit serve cannot read from text: "
                "add a parser to PARSERS, or the setting to NOT_FLAGS with the reason"
            )
        group.add_argument(
            flag,
            dest=setting.name,
            type=checked(setting.name, PARSERS[kind]),
            choices=meta.get("choices") or None,
            metavar=meta.get("metavar"),
            help=meta.get("help"),
        )
    group.add_argument(
        "--policy", help="scheduler policy: static, continuous, chunked, or module:Class for your own SchedulerPolicy"
    )


def engine_flags() -> list[dataclasses.Field]:
    """The EngineConfig fields that are ``labkit serve`` flags: all but NOT_FLAGS."""
    return [setting for setting in dataclasses.fields(EngineConfig) if setting.name not in NOT_FLAGS]


def flag_of(setting: dataclasses.Field) -> str:
    """The setting's ``vllm serve`` flag: the one its field names, else its name dashed."""
    return setting.metadata.get("flag") or "--" + setting.name.replace("_", "-")


def value_type(hint: Any) -> type:
    """The type a flag's text becomes: the field's first type besides None (``dict | SpeculativeConfig``: dict)."""
    return next(kind for kind in typing.get_args(hint) or (hint,) if kind is not type(None))


def checked(name: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, then EngineConfig's own check of ``name``: a bad value is a usage error that says why."""

    def parse_setting(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {parse.__name__}, got {text!r}") from None
        try:
            engine_config(**{name: value})
        except (TypeError, ValueError) as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value

    return parse_setting


def json_config(text: str) -> dict:
    """A JSON object from the command line (as ``vllm serve --speculative-config``)."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(
            f'not valid JSON ({err.msg}); quote it whole, e.g. \'{{"method": "ngram", "num_speculative_tokens": 3}}\''
        ) from None
    if not isinstance(config, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {type(config).__name__}")
    return config


# how a flag's text becomes a setting's type (the value is then held against EngineConfig's own checks)
PARSERS: dict[type, Callable[[str], Any]] = {int: int, float: float, str: str, dict: json_config}


def quantization_flag(text: str) -> str:
    """``--quantization``'s value, if labkit serves it (see labkit.engine.quantization)."""
    try:
        return check_quantization(text)  # type: ignore[return-value]
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def serving_dtype(args: argparse.Namespace):
    """The dtype to load in: --dtype if given; fp32 under int8 (its kernels take fp32 rows); else the measured one."""
    from labkit.device import default_device
    from labkit.serve.dtype import DtypeChoice, choose_serving_dtype

    if args.quantization == "int8" and not args.dtype:
        import torch

        return DtypeChoice(torch.float32, "loaded so for int8: its linears line says what the rest computes in")
    return choose_serving_dtype(default_device(), args.dtype)  # bf16 only where tried and measured faster


def milliseconds(text: str) -> float:
    """A delay in ms from the command line: a number, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 ms or more (and finite), got {text}")
    return value


def import_policy(spec: str | None):
    """A policy name as is, or ``module:attr`` imported (a class is instantiated)."""
    if spec is None or ":" not in spec:
        return spec
    module_name, _, attr = spec.partition(":")
    try:
        policy = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"--policy {spec}: cannot import it ({err}); give module:Class with the module on PYTHONPATH"
        ) from None
    return policy() if isinstance(policy, type) else policy


def engine_dials(args: argparse.Namespace) -> dict:
    """The LLM keyword arguments the command line set (the engine's defaults for the rest)."""
    dials = {setting.name: getattr(args, setting.name) for setting in engine_flags()}
    dials["policy"] = import_policy(args.policy)
    return {name: value for name, value in dials.items() if value is not None}


def admission_hook(args: argparse.Namespace):
    """labkit's admission rule for ``--max-queue-delay-ms``, or None (admit everything)."""
    if args.max_queue_delay_ms is None:
        return None
    return admission_within(args.max_queue_delay_ms)


def run(args: argparse.Namespace) -> int:
    from labkit.engine import LLM
    from labkit.models import load_model
    from labkit.serve.server import make_server
    from labkit.serve.uvicorn_thread import serve_forever, url_of

    if args.max_waiting is not None and args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be at least 1, got {args.max_waiting}; leave it out for no bound")
    dtype = serving_dtype(args)
    print(f"labkit serve: computes in {dtype.describe()}", file=sys.stderr)
    model = load_model(args.model, dtype=dtype.dtype)
    llm = LLM(model, trace_window=TRACE_WINDOW, quantization=args.quantization, **engine_dials(args))
    del model  # under int8, the float model's packed linears are no longer used: let them go
    print(f"labkit serve: linears {llm.quantization.describe()}", file=sys.stderr)
    server, sock, worker = make_server(
        llm,
        args.host,
        args.port,
        api_key=args.api_key,
        max_waiting=args.max_waiting,
        admission=admission_hook(args),
        served_model_name=args.served_model_name,
        shutdown_timeout=args.shutdown_timeout,
    )
    setup = llm.describe()
    if "kv_pool" in setup:
        print(f"labkit serve: KV pool {setup['kv_pool']} (--num-gpu-blocks-override sets it)", file=sys.stderr)
    ready = (
        f"labkit serve: {setup['model']} ({setup['device']}, {setup['dtype']}, policy {setup['policy']}, "
        f"{setup['num_blocks']} blocks of {setup['block_size']}, max_model_len {setup['max_model_len']}, "
        f"prefix caching {'on' if setup['enable_prefix_caching'] else 'off'}, "
        f"speculative decoding {setup['speculative_decoding']}, KV offloading {setup['kv_offloading']}, "
        f"deterministic {'on' if setup['deterministic'] else 'off'}) "
        f"on {url_of(sock)}/v1"
    )
    serve_forever(server, sock, ready)  # says ``ready`` once the socket accepts connections
    return 0
