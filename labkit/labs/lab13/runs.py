"""What lab 13's notebook runs on this machine. Everything here prints what this machine showed and decides nothing:
whether a kernel moves with the batch depends on the CPU, its BLAS and torch's build, so the lab's checks use
stand-ins (:mod:`~labkit.labs.lab13.kernels`) and these runs only report."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from labkit.batch_invariant import tiled_linear
from labkit.engine import LLM
from labkit.labs.lab13.kernels import split_partial
from labkit.models.fast_linear import matmul_path, prepacked_linear
from labkit.models.layers import rms_norm
from labkit.sampling import SamplingParams

HIDDEN, OUT = 576, 1536  # the course model's hidden size and its MLP's width


def this_machines_operations(seed: int = 0) -> tuple[dict[str, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]:
    """The course model's kinds of operation at its shapes, on random weights, as this machine's torch runs them,
    and a crowd of 16 rows."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(OUT, HIDDEN, generator=generator) / math.sqrt(HIDDEN)
    gain = torch.rand(HIDDEN, generator=generator) + 0.5
    crowd = torch.randn(16, HIDDEN, generator=generator)
    cpu = torch.device("cpu")
    packed = prepacked_linear(weight)
    operations = {
        "matmul, fp32, plain F.linear": lambda x: F.linear(x, weight),
        f"matmul, fp32, labkit's default path ({matmul_path(cpu, torch.float32).describe()})": packed,
        "matmul, bf16, F.linear": lambda x: F.linear(x.bfloat16(), weight.bfloat16()),
        "matmul, fp32, labkit.batch_invariant.tiled_linear (16-row tiles)": tiled_linear(lambda x: F.linear(x, weight)),
        "rms_norm, fp32": lambda x: rms_norm(x, gain, 1e-5),
        "softmax, fp32": lambda x: torch.softmax(x, dim=-1),
    }
    return operations, crowd


def _answers(llm: LLM, prompts: Sequence[list[int]], params: SamplingParams) -> tuple[list, float]:
    """Each prompt's (tokens, log-probabilities), served together, and the output tokens per second."""
    start = time.perf_counter()
    outputs = llm.generate(list(prompts), params, use_tqdm=False)
    seconds = time.perf_counter() - start
    answers = [(out.outputs[0].token_ids, [entry.logprob for entry in out.outputs[0].logprobs]) for out in outputs]
    return answers, sum(len(tokens) for tokens, _ in answers) / seconds


def alone_and_in_a_crowd(
    model, prompts: Sequence[str], deterministic: bool = False, alone: int = 2, max_tokens: int = 6
) -> dict[str, int]:
    """The first ``alone`` prompts decoded greedily one at a time, then among all of ``prompts`` at once; for each,
    printed: the same tokens or not, the same log-probabilities bit for bit or not, and the largest difference."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    ids = [list(model.tokenizer.encode(text)) for text in prompts]
    llm = LLM(model, deterministic=deterministic, max_num_seqs=len(ids), max_model_len=128)
    solo = [_answers(llm, [prompt], params)[0][0] for prompt in ids[:alone]]
    crowd, _ = _answers(llm, ids, params)
    counts = {"prompts": alone, "same tokens": 0, "same bits": 0}
    for text, (tokens, logprobs), (crowd_tokens, crowd_logprobs) in zip(prompts, solo, crowd):
        gap = max(abs(a - b) for a, b in zip(logprobs, crowd_logprobs))
        counts["same tokens"] += tokens == crowd_tokens
        counts["same bits"] += logprobs == crowd_logprobs
        print(
            f"{text!r:<38} tokens {'same' if tokens == crowd_tokens else 'DIFFERENT':<9} log-probabilities "
            f"{'same bits' if logprobs == crowd_logprobs else 'DIFFERENT'} (largest difference {gap:.1e})"
        )
    return counts


def cost_of_determinism(model, prompts: Sequence[str], rounds: int = 2, max_tokens: int = 8) -> float:
    """Output tokens per second serving ``prompts`` together, ``deterministic`` off and on, in turns over ``rounds``
    (so both see the same machine); the medians and their ratio printed, the ratio returned."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    ids = [list(model.tokenizer.encode(text)) for text in prompts]
    engines = {on: LLM(model, deterministic=on, max_num_seqs=len(ids), max_model_len=128) for on in (False, True)}
    speeds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for on, llm in engines.items():
            speeds[on].append(_answers(llm, ids, params)[1])
    today, invariant = statistics.median(speeds[False]), statistics.median(speeds[True])
    print(f"{len(ids)} prompts together, {max_tokens} tokens each, median of {rounds} turns on this machine:")
    print(f"  deterministic=False {today:7.1f} tok/s\n  deterministic=True  {invariant:7.1f} tok/s")
    print(f"  ratio (on / off)    {invariant / today:7.2f}")
    return invariant / today


def one_query_in_four_places(split_kv_attention, split_size: int = 8, queries: int = 20, seed: int = 0) -> int:
    """``queries`` random query rows of a 48-key prompt, each attended in decode, a chunk, the prompt's prefill and a
    crowd padded to 64 keys, through ``split_kv_attention(q, keys, values, length, split_size, split_partial)``.
    Returns (and prints) how many came out with the same bits in all four places."""
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(64, 3, 16, generator=generator) for _ in range(2))
    same = 0
    for _ in range(queries):
        q = torch.randn(3, 16, generator=generator)
        length = int(torch.randint(1, 48, (1,), generator=generator))
        widths = (length, min(48, length + 5), 48, 64)
        outs = [
            split_kv_attention(q, keys[:width], values[:width], length, split_size, split_partial) for width in widths
        ]
        same += all(torch.equal(out, outs[0]) for out in outs)
    print(f"{same} of {queries} queries: the same bits in decode, a chunk, the prefill and a padded crowd")
    return same
