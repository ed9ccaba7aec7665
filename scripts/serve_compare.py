"""Side by side: labkit serve configurations, llama-server GGUFs and OpenVINO GenAI, the same traces, in turns.

    python scripts/serve_compare.py --labkit                          # labkit serve at its defaults
    python scripts/serve_compare.py --labkit --labkit fp32="--dtype float32" --labkit int8="--quantization int8" \\
        --llama Q8_0=~/llama-build/gguf/SmolLM2-135M-Instruct.Q8_0.gguf --llama-args "-t 2" --rounds 3
    python scripts/serve_compare.py --labkit --labkit int8="--quantization int8" \\
        --openvino int8=~/ov-build/SmolLM2-135M-Instruct-int8          # OpenVINO GenAI, offline
    python scripts/serve_compare.py --labkit --url other=http://127.0.0.1:8080   # a server you started

Each round sends W1 (32 short chats) and W2 (64 ShareGPT conversations) to every system in turn
(systems interleaved, so a machine that gets busier moves them all alike): every request at t = 0,
greedy, ``ignore_eos`` so each produces exactly its ``max_new_tokens``, streamed through labkit's
load tester (the official ``openai`` client). The script starts each labkit configuration and each
llama-server GGUF afresh for its turn and stops it after, so only the measured server runs and no
cache outlives a turn; four short chats warm it up first. llama-server gets one slot per request
of the trace (``-np``) and a context per slot that holds the trace's longest request (``-c``), unless
``--llama-args`` or the GGUF's own arguments say otherwise. OpenVINO GenAI has no server on PyPI: its
continuous-batching pipeline gets the same requests at once in a fresh process each turn
(scripts/openvino_offline.py), without HTTP, so its figure is what a server around it could at best reach.

It prints output tokens per second, the median over rounds, and two ratios: at equal bytes
(``--equal-bytes``: labkit int8 over llama-server Q8_0 and over OpenVINO int8, one byte per weight each) and labkit's
defaults (a bare ``--labkit``) over llama-server's best quantized GGUF. It warns when a system produced
another number of tokens than the trace asks for (then the comparison is not fair). The load average is
printed at the start and the end: say it beside the figures. README, "Side by side with llama.cpp",
says how to build llama-server and make the GGUFs; "OpenVINO GenAI beside them", how to install it and
export the model.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from labkit.serve.background import ServeProcess
from labkit.serve.loadtest import api_base, run_load, server_model
from labkit.workloads import replay_workload

TRACES = Path(__file__).parent / "traces"
WORKLOADS = {"W1": TRACES / "w1_trace32.json", "W2": TRACES / "w2_sharegpt64.json"}
UNQUANTIZED = {"F32", "F16", "BF16"}  # llama-server GGUFs left out of "llama's best quantized"
GET_LLAMA_SERVER = (
    "llama-server not found: give --llama-server PATH or put it on PATH. Build it from the llama-cpp-python "
    "sdist on PyPI (no other network needed): README.md, 'Side by side with llama.cpp', has the commands."
)
GET_OPENVINO = "README.md, 'OpenVINO GenAI beside them', says how to install it from PyPI and export the model"


def trace_workload(path: Path, name: str, requests: int | None = None):
    """A trace file as a labkit workload: every request at t = 0, its messages and its answer length
    (its first ``requests`` only, if given: a short trial)."""
    chats = json.loads(path.read_text())["requests"][:requests]
    return replay_workload(
        [0.0] * len(chats),
        [sum(len(m["content"]) for m in r["messages"]) // 4 for r in chats],  # a rough length, for the record
        [r["max_new_tokens"] for r in chats],
        prompts=[r["messages"] for r in chats],
        name=name,
    )


def tokens_per_second(url: str, workload, model: str) -> tuple[float, int, list[str]]:
    """Send the workload at once; return output tokens per second of wall time, the tokens and the errors."""
    started = time.perf_counter()
    trace, errors = asyncio.run(run_load(api_base(url), workload, model, ignore_eos=True))
    wall = time.perf_counter() - started
    tokens = sum(record.output_len for record in trace.requests if record.output_len)
    return tokens / wall, tokens, errors


def warm_up_workload():
    """Four short chats, four tokens each, none of them in a trace: a fresh system's first steps (llama-server's
    first batch takes seconds) are not timed, and no prompt of the timed run is in a cache beforehand."""
    chats = [[{"role": "user", "content": f"Warm-up {n}: name a colour."}] for n in range(4)]
    return replay_workload([0.0] * 4, [8] * 4, [4] * 4, prompts=chats, name="warm-up")


def warm_up(url: str, model: str) -> None:
    asyncio.run(run_load(api_base(url), warm_up_workload(), model, ignore_eos=True))


# --- the systems -------------------------------------------------------------------------------------
class LlamaServer(ServeProcess):
    """``llama-server ARGS`` as a child process on 127.0.0.1 and a free port, started as labkit serve is."""

    name = "llama-server"
    ready_line = r"listening on (http://[^\s/]+)"

    def __init__(self, binary: str, *args: str):
        self.launcher = (binary,)
        super().__init__(*args)


def default_prompt_ids() -> Callable[[list[dict]], list[int]]:
    """Prompt token ids through the default model's tokenizer and chat template: what labkit serve computes on."""
    from labkit.models import default_model
    from labkit.models.tokenizer import ChatTokenizer
    from labkit.models.tokens import encode_prompt

    tokenizer = ChatTokenizer(default_model.ensure_converted(progress=False))
    return lambda messages: encode_prompt(tokenizer, messages)


def default_prompt_tokens() -> Callable[[list[dict]], int]:
    """Prompt length in tokens (llama-server's GGUF is the same model, so its slots are sized by this count)."""
    prompt_ids = default_prompt_ids()
    return lambda messages: len(prompt_ids(messages))


def slot_arguments(workload, prompt_tokens: Callable[[list[dict]], int], given: list[str]) -> list[str]:
    """``-np`` one slot per request and ``-c`` so that each slot holds the longest request (prompt and
    answer, 64 tokens spare, in whole 256s), unless ``given`` sets them."""
    slots = len(workload)
    for flag in ("-np", "--parallel"):
        if flag in given:
            slots = int(given[given.index(flag) + 1])
    longest = max(prompt_tokens(spec.prompt) + spec.output_len for spec in workload) + 64
    per_slot = -(-longest // 256) * 256
    chosen = [] if {"-np", "--parallel"} & set(given) else ["-np", str(slots)]
    return chosen + ([] if {"-c", "--ctx-size"} & set(given) else ["-c", str(slots * per_slot)])


Turn = tuple[float, int, list[str], str | None]  # tokens per second, output tokens, errors, precision


@dataclass
class System:
    """One system to measure: a server that ``start(workload)`` gives running, ready for that workload, or
    a peer without a server whose ``offline(workload)`` times one turn itself."""

    name: str
    start: Callable[..., ServeProcess | _Running] | None
    labkit: str | None = None  # the labkit configuration's name, None for another server
    llama: str | None = None  # the llama-server GGUF's name
    openvino: str | None = None  # the OpenVINO model's name
    offline: Callable[..., Turn] | None = None
    precisions: list[str] = field(default_factory=list)  # what it computed in, each turn


def named_value(item: str, flag: str, example: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise SystemExit(f"{flag} wants NAME=VALUE, e.g. {flag} {example}; got {item!r}")
    return name, value


def labkit_system(item: str, common: list[str]) -> System:
    """``--labkit NAME=ARGS``: labkit serve with those arguments (and ``--labkit-args``)."""
    name, args = named_value(item, "--labkit", "int8='--quantization int8'")
    return System(
        f"labkit {name}", partial(lambda _workload, a: ServeProcess(*a), a=[*common, *shlex.split(args)]), labkit=name
    )


def llama_system(item: str, binary: str, common: list[str], prompt_tokens: Callable) -> System:
    """``--llama NAME=GGUF [ARGS]``: llama-server on that GGUF file, its slots sized for each workload."""
    name, value = named_value(item, "--llama", "Q8_0=/path/model.Q8_0.gguf")
    gguf, *own = shlex.split(value) or [""]
    gguf = str(Path(gguf).expanduser())  # bash expands NAME=~/x, zsh and sh do not
    if not Path(gguf).is_file():
        raise SystemExit(
            f"--llama {name}: no GGUF file at {gguf!r}; README.md, 'Side by side with llama.cpp', makes them"
        )
    given = [*common, *own]

    def start(workload) -> ServeProcess:
        slots = slot_arguments(workload, prompt_tokens, given)
        return LlamaServer(binary, "-m", gguf, "--alias", f"llama-{name}", "--no-webui", *slots, *given)

    return System(f"llama {name}", start, llama=name)


def find_llama_server(given: str | None) -> str:
    """The llama-server program: ``--llama-server`` or PATH; a missing one says how to get it."""
    found = shutil.which(given or "llama-server")
    if found is None:
        raise SystemExit(GET_LLAMA_SERVER + (f" (--llama-server {given!r} is not a program)" if given else ""))
    return found


def openvino_command(folder: Path, workload) -> list[str]:
    """The child process that times OpenVINO GenAI on one trace (scripts/openvino_offline.py)."""
    script = Path(__file__).parent / "openvino_offline.py"
    return [sys.executable, str(script), str(folder), "--workload", workload.name, "--requests", str(len(workload))]


def openvino_turn(folder: Path, workload) -> Turn:
    """OpenVINO GenAI's turn, in a fresh process (as each server is started afresh): its JSON line read back."""
    done = subprocess.run(openvino_command(folder, workload), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"OpenVINO GenAI failed on {workload.name}:\n{done.stderr[-2000:]}")
    said = json.loads(done.stdout.strip().splitlines()[-1])
    return said["tokens"] / said["seconds"], said["tokens"], [], said["precision"]


def openvino_system(item: str) -> System:
    """``--openvino NAME=FOLDER``: OpenVINO GenAI's pipeline on a model exported to that folder, offline."""
    name, value = named_value(item, "--openvino", "int8=~/ov-build/SmolLM2-135M-Instruct-int8")
    folder = Path(value).expanduser()
    if not (folder / "openvino_model.xml").is_file():
        raise SystemExit(
            f"--openvino {name}: no exported model in {str(folder)!r} (no openvino_model.xml); {GET_OPENVINO}"
        )
    if importlib.util.find_spec("openvino_genai") is None:
        raise SystemExit(f"--openvino {name}: openvino_genai is not installed in {sys.executable}; {GET_OPENVINO}")
    return System(f"openvino {name} (offline)", None, openvino=name, offline=partial(openvino_turn, folder))


def url_system(item: str) -> System:
    name, url = named_value(item, "--url", "other=http://127.0.0.1:8080")
    return System(name, lambda _workload: _Running(url))


class _Running:
    """A server someone else started and stops: a ``with`` block leaves it as it is."""

    def __init__(self, url: str):
        self.url = url
        self.log: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def build_systems(args, prompt_tokens: Callable | None = None) -> list[System]:
    """Every system the command line names, labkit configurations first, in the order given."""
    common_labkit = shlex.split(args.labkit_args)
    systems = [labkit_system(item, common_labkit) for item in args.labkit]
    if args.llama:
        binary = find_llama_server(args.llama_server)
        tokens = prompt_tokens or default_prompt_tokens()
        systems += [llama_system(item, binary, shlex.split(args.llama_args), tokens) for item in args.llama]
    systems += [openvino_system(item) for item in args.openvino]
    systems += [url_system(item) for item in args.url]
    names = [s.name for s in systems]
    if len(set(names)) < len(names):
        raise SystemExit(f"two systems share a name: {names}; give each --labkit/--llama/--openvino/--url its own NAME")
    return systems


# --- the table ---------------------------------------------------------------------------------------
def ratio_lines(
    systems: list[System], medians: dict[tuple[str, str], float], workloads: list[str], equal_bytes: list[str]
) -> list[str]:
    """The comparisons the issue asks for, where the systems for them were measured: each ``LABKIT=PEER`` pair
    at equal bytes (PEER a llama-server GGUF's or an OpenVINO model's name), then labkit's defaults against
    llama-server's best quantized GGUF."""
    lines = []
    by_labkit = {s.labkit: s.name for s in systems if s.labkit}
    for pair in equal_bytes:
        ours, _, theirs = pair.partition("=")
        if ours not in by_labkit:
            continue
        for peer in (s.name for s in systems if theirs in (s.llama, s.openvino)):
            cells = [f"{w} {medians[(by_labkit[ours], w)] / medians[(peer, w)]:.2f}x" for w in workloads]
            lines.append(f"equal bytes, {by_labkit[ours]} / {peer}: " + ", ".join(cells))
    quantized = [s.name for s in systems if s.llama and s.llama.upper() not in UNQUANTIZED]
    if "defaults" in by_labkit and quantized:
        cells = []
        for w in workloads:
            best = max(quantized, key=lambda name: medians[(name, w)])
            cells.append(f"{w} {medians[(by_labkit['defaults'], w)] / medians[(best, w)]:.2f}x (best: {best})")
        lines.append("labkit defaults / llama's best quantized: " + ", ".join(cells))
    return lines


def table(
    systems: list[System],
    speeds: dict[tuple[str, str], list[float]],
    workloads: dict,
    rounds: int,
    equal_bytes: list[str],
) -> str:
    """Medians over rounds, one row per system, then the ratios."""
    medians = {key: statistics.median(values) for key, values in speeds.items()}
    expected = {w: sum(spec.output_len for spec in workload) for w, workload in workloads.items()}
    header = " | ".join(f"{w}, {len(workloads[w])} requests ({expected[w]:,} output tokens), tok/s" for w in workloads)
    rows = [f"| system | {header} |", "|---|" + "---|" * len(workloads)]
    for system in systems:
        cells = [" / ".join(f"{v:.1f}" for v in speeds[(system.name, w)]) for w in workloads]
        counts = Counter(system.precisions)
        note = f" ({', '.join(f'{p} in {n} turn(s)' for p, n in counts.items())})" if counts else ""
        rows.append(f"| {system.name}{note} | " + " | ".join(cells) + " |")
    rows.append(f"\n(each round's tok/s, in order; {rounds} round(s), medians below)")
    rows += [
        "median " + ", ".join(f"{w} {medians[(s.name, w)]:.1f}" for w in workloads) + f": {s.name}" for s in systems
    ]
    return "\n".join(rows + ratio_lines(systems, medians, list(workloads), equal_bytes))


def precision_of(server: ServeProcess) -> str | None:
    """What labkit serve said it computes in ("computes in bfloat16 (...)"): its defaults measure at every
    start, so one turn may choose otherwise than the next, and the table says so."""
    said = [line.split("computes in ", 1)[1] for line in server.log if "computes in " in line]
    return said[0].split()[0] if said else None


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--labkit",
        nargs="?",
        const="defaults=",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="a labkit serve configuration, e.g. int8='--quantization int8'; bare: 'defaults', no arguments",
    )
    parser.add_argument(
        "--labkit-args",
        default="",
        help="arguments for every labkit configuration, as one string (one flag alone: --labkit-args=--flag)",
    )
    parser.add_argument(
        "--llama", action="append", default=[], metavar="NAME=GGUF [ARGS]", help="llama-server on a GGUF"
    )
    parser.add_argument("--llama-server", default=None, help="the llama-server program (default: found on PATH)")
    parser.add_argument(
        "--llama-args",
        default="",
        help="arguments for every llama-server, e.g. '-t 2 --no-repack' (one flag alone: --llama-args=--flag)",
    )
    parser.add_argument(
        "--openvino",
        action="append",
        default=[],
        metavar="NAME=FOLDER",
        help="OpenVINO GenAI on a model exported by optimum-cli, offline (no server of it installs from PyPI)",
    )
    parser.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="a server you started")
    parser.add_argument("--model", default=None, help="model name to send (default: what each server lists)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="W1,W2", help="which traces: W1, W2 or both")
    parser.add_argument("--requests", type=int, default=None, help="only each trace's first N requests (a trial)")
    parser.add_argument(
        "--equal-bytes",
        action="append",
        default=None,
        metavar="LABKIT=PEER",
        help="a pair compared at equal bytes, PEER a --llama or --openvino NAME; repeatable (default: int8=Q8_0, int8=int8)",
    )
    args = parser.parse_args(argv)
    args.equal_bytes = args.equal_bytes or ["int8=Q8_0", "int8=int8"]
    if not (args.labkit or args.llama or args.openvino or args.url):
        parser.error(
            "nothing to compare: give --labkit, --llama NAME=GGUF, --openvino NAME=FOLDER and/or --url NAME=URL"
        )
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"--workloads: no trace named {sorted(unknown)}; choose from {sorted(WORKLOADS)}")
    return args


def turn(system: System, workload, model: str | None) -> Turn:
    """One system's turn at one workload: started afresh, warmed up, timed, stopped."""
    if system.offline is not None:
        return system.offline(workload)
    assert system.start is not None
    with system.start(workload) as server:
        model = model or asyncio.run(server_model(api_base(server.url)))
        warm_up(server.url, model)
        speed, tokens, errors = tokens_per_second(server.url, workload, model)
        return speed, tokens, errors, precision_of(server)


def main(argv: list[str] | None = None, prompt_tokens: Callable | None = None) -> int:
    args = parse_args(argv)
    workloads = {w: trace_workload(WORKLOADS[w], w, args.requests) for w in args.workloads.split(",")}
    expected = {w: sum(spec.output_len for spec in workload) for w, workload in workloads.items()}
    systems = build_systems(args, prompt_tokens)
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    speeds: dict[tuple[str, str], list[float]] = {}
    for round_number in range(1, args.rounds + 1):
        for workload_name, workload in workloads.items():
            for system in systems:
                speed, tokens, errors, precision = turn(system, workload, args.model)
                system.precisions += [precision] if precision else []
                speeds.setdefault((system.name, workload_name), []).append(speed)
                note = (
                    ""
                    if tokens == expected[workload_name]
                    else f"  (!) {tokens} tokens, the trace asks {expected[workload_name]}"
                )
                note += f"  {len(errors)} errors, first: {errors[0]}" if errors else ""
                said = f" [{precision}]" if precision else ""
                print(f"round {round_number} {workload_name} {system.name}{said}: {speed:.1f} tok/s{note}", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(table(systems, speeds, workloads, args.rounds, args.equal_bytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
