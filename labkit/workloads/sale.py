"""The course's running example: a payments app's support bot during a cashback sale.

Many customers ask short questions with short answers ("Where is my cashback?"); a few
ask for a page ("Explain every charge on my statement"). That mix of skewed answer
lengths, arriving in bursts, is what makes static batching pad and queues grow, so the
labs and the book use this one seeded workload to show it, on the real engine and in
the simulator alike.
"""

from __future__ import annotations

import numpy as np

from labkit.workloads.arrivals import arrival_times
from labkit.workloads.spec import RequestSpec, Workload
from labkit.workloads.tokens import estimate_tokens

SYSTEM_PROMPT = "You are the support assistant of a payments app. Answer clearly and politely."

# (question, how often it is asked, median answer length in tokens)
SALE_QUESTIONS: tuple[tuple[str, float, int], ...] = (
    ("Where is my cashback?", 6, 30),
    ("When will the festival cashback reach my wallet?", 5, 40),
    ("Is the sale cashback valid on electricity bill payments?", 4, 50),
    ("Why was my card payment declined during the sale?", 3, 80),
    ("How do I check whether my order qualifies for the festival offer?", 3, 90),
    ("I was charged twice for one order. How do I get the money back?", 2, 140),
    ("Compare the cashback on the credit card, the debit card and the wallet for a large purchase.", 1, 300),
    ("Explain every charge on my statement this month, line by line.", 1, 450),
)


def sale_workload(
    num_requests: int = 200,
    rate: float = 8.0,
    *,
    burstiness: float = 0.5,
    seed: int = 0,
    answer_sigma: float = 0.6,
    max_answer_len: int = 512,
    tokenizer=None,
    name: str = "sale",
) -> Workload:
    """A seeded burst of support chats: ``rate`` requests/s, gamma gaps of shape ``burstiness``.

    Each request is the system prompt plus one question, picked by how often it is
    asked; its answer length is lognormal around that question's median (``answer_sigma``)
    and clipped to [1, ``max_answer_len``]. With a ``tokenizer``, prompt lengths are the
    exact chat-template token counts; without one, the words x 1.3 estimate.
    """
    if not (answer_sigma >= 0 and np.isfinite(answer_sigma)):
        raise ValueError(f"answer_sigma must be a finite number >= 0, got {answer_sigma!r}")
    if max_answer_len < 1:
        raise ValueError(f"max_answer_len must be >= 1, got {max_answer_len!r}")
    questions, weights, medians = zip(*SALE_QUESTIONS)
    prompt_lens = [_prompt_len(_messages(q), tokenizer) for q in questions]
    arrival_rng, pick_rng, answer_rng = np.random.default_rng(seed).spawn(3)
    times = arrival_times(num_requests, rate, burstiness, arrival_rng)
    picks = pick_rng.choice(len(questions), size=num_requests, p=np.array(weights) / sum(weights))
    spread = answer_rng.lognormal(mean=0.0, sigma=answer_sigma, size=num_requests)  # median 1
    answer_lens = np.clip(np.rint(np.array(medians)[picks] * spread), 1, max_answer_len).astype(np.int64)
    requests = tuple(
        RequestSpec(f"sale-{i}", t, prompt_lens[k], o, _messages(questions[k]))
        for i, (t, k, o) in enumerate(zip(times.tolist(), picks.tolist(), answer_lens.tolist()))
    )
    meta = {
        "rate": rate,
        "burstiness": burstiness,
        "seed": seed,
        "answer_sigma": answer_sigma,
        "max_answer_len": max_answer_len,
        "prompt_len": "exact" if tokenizer else "estimated",
    }
    return Workload(requests, name=name, meta=meta)


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def _prompt_len(messages: list[dict[str, str]], tokenizer) -> int:
    if tokenizer is not None:
        from labkit.models.tokens import encode_prompt  # here, so lengths-only users never import torch

        return len(encode_prompt(tokenizer, messages))
    return sum(estimate_tokens(m["content"]) for m in messages)
