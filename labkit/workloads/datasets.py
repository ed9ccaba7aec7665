"""The loads ``labkit loadtest`` sends, by dataset name (vLLM's ``bench serve`` ones): one builder, so the load
tester, the simulator's sweep and lab 9 send and simulate the very same requests.

``sale`` is the course's running example, ``sharegpt`` real chats, ``random`` plain words of a
given length: the client has no tokenizer, so a prompt of ``input_len`` tokens is
``input_len / TOKENS_PER_WORD`` words (see :mod:`labkit.workloads.tokens`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from labkit.workloads.arrivals import arrival_times, synthetic_workload
from labkit.workloads.sale import sale_workload
from labkit.workloads.sharegpt import sharegpt_prompts
from labkit.workloads.spec import Workload
from labkit.workloads.tokens import TOKENS_PER_WORD

DATASETS = ("sale", "sharegpt", "random")
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "number group problem fact money market story water light house river train music cloud garden"
).split()


def make_workload(
    dataset: str,
    num_prompts: int,
    rate: float,
    burstiness: float = 1.0,
    seed: int = 0,
    max_output_tokens: int = 128,
    input_len: int = 64,
    output_len: int = 32,
) -> Workload:
    """The requests to send: ``num_prompts`` of ``dataset`` with Poisson/gamma arrivals at ``rate``."""
    if dataset == "sale":
        return sale_workload(num_prompts, rate, burstiness=burstiness, seed=seed, max_answer_len=max_output_tokens)
    if dataset == "sharegpt":
        prompts = sharegpt_prompts(num_prompts, seed, max_prompt_tokens=1024, max_output_tokens=max_output_tokens)
        return prompts.with_arrival_times(arrival_times(num_prompts, rate, burstiness, seed))
    if dataset == "random":
        return random_words(
            synthetic_workload(
                num_prompts, rate, input_len, output_len, burstiness=burstiness, seed=seed, name="random"
            ),
            seed,
        )
    raise ValueError(f"unknown dataset {dataset!r}; use one of {', '.join(DATASETS)}")


def random_words(workload: Workload, seed: int) -> Workload:
    """Each request given a chat prompt of plain words, about ``prompt_len`` tokens long."""
    rng = np.random.default_rng(seed)
    requests = []
    for request in workload:
        words = rng.choice(WORDS, size=max(1, round(request.prompt_len / TOKENS_PER_WORD)))
        requests.append(replace(request, prompt=[{"role": "user", "content": " ".join(words)}]))
    return replace(workload, requests=tuple(requests))
