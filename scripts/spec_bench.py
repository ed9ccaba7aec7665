"""Speculative decoding (prompt lookup) on the default model: where it pays and where it stops paying.

Part 1, batch 1, greedy: prompts that ask to repeat or edit a given text (the answer copies the
prompt, so prompt lookup guesses well) and ordinary chat questions (SALE_QUESTIONS of the course's
support-bot workload), each with the model's real chat template, with k = 0 (off), 2 and 4 draft
tokens. Output tokens/s over the prompts served one at a time, the acceptance rate, and each
k's ratio against k = 0 measured in the same run. Greedy answers are identical for every k.

Part 2, the editing prompts at batch 8, 32 and 64 (all arriving at once, max_num_seqs = batch),
k = 0 and 4: measured throughput ratio on this machine, beside what the cost model predicts for
Llama 3.1 8B on an H100 SXM with the acceptance rate measured here (labkit.capacity.speculative_speedup).
Measured figures are from this machine; predicted ones say so.

Usage: .venv/bin/python scripts/spec_bench.py [--max-tokens 96] [--batches 8 32 64] [--prompts 4]
"""

from __future__ import annotations

import argparse
import time

from labkit.capacity import speculative_speedup
from labkit.engine import LLM
from labkit.metrics import summarize
from labkit.models import load_model
from labkit.sampling import SamplingParams
from labkit.workloads.sale import SALE_QUESTIONS, SYSTEM_PROMPT

TEXTS = (
    "Our store opens at nine in the morning and closes at six in the evening from Monday to Friday. "
    "On Saturdays we open at ten and close at four. We are closed on Sundays and public holidays.",
    "To reset your password, open the app, tap Settings, then Account, then Security. Choose Reset "
    "password, enter the code we send to your phone, and pick a new password of at least ten characters.",
    "def total_price(items):\n    total = 0\n    for item in items:\n        total += item.price * item.quantity\n"
    "    return total\n",
    "The meeting moved from Tuesday to Thursday at three o'clock. Please bring the quarterly report, "
    "the budget draft and your notes from the last meeting. Lunch will be served after the meeting.",
)
EDIT_ASKS = (
    "Repeat the following text exactly, word for word:\n\n{}",
    "Correct any mistakes in this text and write it out again in full:\n\n{}",
    "Rewrite the following text, changing nothing but replacing 'the' with 'THE':\n\n{}",
    "Copy this text back to me unchanged:\n\n{}",
)


def editing_prompts() -> list[list[dict]]:
    return [[{"role": "user", "content": ask.format(text)}] for ask, text in zip(EDIT_ASKS, TEXTS)]


def chat_prompts() -> list[list[dict]]:
    questions = [question for question, _, _ in SALE_QUESTIONS[:4]]
    return [[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}] for q in questions]


def engine(model, k: int, max_num_seqs: int) -> LLM:
    config = None if k == 0 else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4}
    blocks = max_num_seqs * (1024 // 16 + 1)  # every request whole: no pool sized to free memory, zero-filled
    llm = LLM(model, max_model_len=1024, max_num_seqs=max_num_seqs, num_blocks=blocks, speculative_config=config)
    llm.generate([[{"role": "user", "content": "Say hi."}]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    return llm


def one_at_a_time(model, prompts, k: int, max_tokens: int) -> dict:
    """Batch 1: each prompt served alone; output tok/s over all of them, acceptance over all steps."""
    llm = engine(model, k, max_num_seqs=1)
    params = SamplingParams(max_tokens=max_tokens)
    tokens = drafted = accepted = 0
    answers = []
    seconds = 0.0
    for prompt in prompts:
        start = time.perf_counter()
        output = llm.generate([prompt], params, use_tqdm=False)[0]
        seconds += time.perf_counter() - start
        summary = summarize(llm.trace)
        tokens += len(output.token_ids)
        drafted += summary.spec_decode_num_draft_tokens
        accepted += summary.spec_decode_num_accepted_tokens
        answers.append(output.token_ids)
    return dict(tok_s=tokens / seconds, rate=accepted / drafted if drafted else None, answers=answers, tokens=tokens)


def batched(model, prompts, k: int, batch: int, max_tokens: int) -> dict:
    """``batch`` requests at once (the prompts repeated in turn), max_num_seqs = batch."""
    llm = engine(model, k, max_num_seqs=batch)
    chosen = [prompts[i % len(prompts)] for i in range(batch)]
    outputs = llm.generate(chosen, SamplingParams(max_tokens=max_tokens), use_tqdm=False)
    summary = summarize(llm.trace)
    context = sum(len(o.prompt_token_ids) + len(o.token_ids) / 2 for o in outputs) / len(outputs)
    return dict(
        tok_s=summary.output_throughput,
        rate=summary.spec_decode_acceptance_rate if k else None,
        context=context,
        answers=[o.token_ids for o in outputs],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--prompts", type=int, default=4, help="prompts of each kind (editing, chat), up to 4")
    args = parser.parse_args(argv)
    model = load_model()
    print(f"model {model.config.name} on {model.device}; greedy; max_tokens {args.max_tokens}\n")

    print("Part 1: batch 1 (measured on this machine)")
    print(f"{'prompts':<10}{'k':>3}{'out tok/s':>11}{'vs k=0':>8}{'acceptance':>12}{'same answers':>14}")
    for name, prompts in (("editing", editing_prompts()[: args.prompts]), ("chat", chat_prompts()[: args.prompts])):
        base = None
        for k in (0, 2, 4):
            run = one_at_a_time(model, prompts, k, args.max_tokens)
            base = base or run
            rate = "-" if run["rate"] is None else f"{run['rate']:.0%}"
            same = "yes" if run["answers"] == base["answers"] else "NO"
            print(f"{name:<10}{k:>3}{run['tok_s']:>11.1f}{run['tok_s'] / base['tok_s']:>7.2f}x{rate:>12}{same:>14}")

    print("\nPart 2: editing prompts batched, k = 4 against k = 0")
    print(
        f"{'batch':>5}{'k=0 tok/s':>11}{'k=4 tok/s':>11}{'measured':>10}{'acceptance':>12}{'8B on H100 (cost model)':>26}"
    )
    for batch in args.batches:
        plain = batched(model, editing_prompts()[: args.prompts], 0, batch, args.max_tokens)
        spec = batched(model, editing_prompts()[: args.prompts], 4, batch, args.max_tokens)
        predicted = speculative_speedup([batch], k=4, acceptance_rate=spec["rate"], context_len=spec["context"])[0]
        same = "" if plain["answers"] == spec["answers"] else "  (answers differ!)"
        print(
            f"{batch:>5}{plain['tok_s']:>11.1f}{spec['tok_s']:>11.1f}{spec['tok_s'] / plain['tok_s']:>9.2f}x"
            f"{spec['rate']:>12.0%}{predicted.speedup:>20.2f}x ({predicted.verify_bound}){same}"
        )


if __name__ == "__main__":
    main()
