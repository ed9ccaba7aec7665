"""OpenVINO GenAI on one trace, offline: the peer that ``scripts/serve_compare.py`` runs, one fresh process a turn.

    python scripts/openvino_offline.py ~/ov-build/SmolLM2-135M-Instruct-int8 --workload W1

No OpenAI-compatible server for OpenVINO GenAI installs from PyPI (Intel's OpenVINO Model Server ships as a
container or an archive), so this drives its continuous-batching pipeline directly: every request of the
trace handed over at once (as the servers get them all at t = 0), greedy, ``ignore_eos``, each its own
``max_new_tokens``. The prompts are the very token ids labkit serve feeds its model (labkit's tokenizer and
chat template), so the two read the same prompts and write the same number of tokens. The pipeline is
OpenVINO GenAI's defaults on the CPU (its scheduler, its threads, its KV-cache precision); four short chats
warm it up first, untimed. It prints one JSON line: output tokens, seconds, and what the CPU computes in.
Having no HTTP and no streaming, the figure is what a server around this pipeline could at best reach.
README, "OpenVINO GenAI beside them", says how to install it and export the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_compare, beside this file

from serve_compare import WORKLOADS, default_prompt_ids, trace_workload, warm_up_workload  # noqa: E402

EXPORT_IT = "README.md, 'OpenVINO GenAI beside them', exports it with optimum-cli"


def generation_configs(workload) -> list:
    """The servers' sampling, per request: greedy, ``ignore_eos``, the trace's answer length."""
    import openvino_genai

    return [
        openvino_genai.GenerationConfig(max_new_tokens=int(spec.output_len), ignore_eos=True, do_sample=False)
        for spec in workload
    ]


def prompt_tensors(workload, prompt_ids) -> list:
    """Each request's prompt as the token ids labkit serve computes on, one row each."""
    import numpy as np
    import openvino

    return [openvino.Tensor(np.array([prompt_ids(spec.prompt)], dtype=np.int64)) for spec in workload]


def open_pipeline(folder: Path):
    """OpenVINO GenAI's continuous-batching pipeline on the CPU at its defaults, for an exported model."""
    import openvino_genai

    if not (folder / "openvino_model.xml").is_file():
        raise SystemExit(f"no OpenVINO model in {folder} (openvino_model.xml is missing); {EXPORT_IT}")
    return openvino_genai.ContinuousBatchingPipeline(str(folder), openvino_genai.SchedulerConfig(), "CPU")


def cpu_precision() -> str:
    """What OpenVINO's CPU plugin computes in and keeps its KV cache in here, unless a model says otherwise."""
    import openvino

    core = openvino.Core()
    compute, cache = (core.get_property("CPU", key) for key in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION"))
    return f"{compute.get_type_name()}+{cache.get_type_name()}-kv"


def generate(pipeline, workload, prompt_ids) -> int:
    """The workload's requests at once; the output tokens written."""
    results = pipeline.generate(prompt_tensors(workload, prompt_ids), generation_configs(workload))
    return sum(len(result.m_generation_ids[0]) for result in results)


def offline_turn(folder: Path, workload) -> dict:
    """Open, warm up, time one trace: ``tokens``, ``seconds``, ``precision``."""
    pipeline, prompt_ids = open_pipeline(folder), default_prompt_ids()
    generate(pipeline, warm_up_workload(), prompt_ids)
    started = time.perf_counter()
    tokens = generate(pipeline, workload, prompt_ids)
    return {"tokens": tokens, "seconds": time.perf_counter() - started, "precision": cpu_precision()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a folder exported by optimum-cli export openvino")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--requests", type=int, default=None, help="only the trace's first N requests (a trial)")
    args = parser.parse_args(argv)
    workload = trace_workload(WORKLOADS[args.workload], args.workload, args.requests)
    print(json.dumps(offline_turn(args.model.expanduser(), workload)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
