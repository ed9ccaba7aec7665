"""Prefix caching on the default model: chats that share a long system prompt, served with it on and off;
then a multi-turn ShareGPT replay, where each turn resends the history, and its hit rate.

Every request is the same system prompt (a support bot's policy, about ``--system-tokens``
tokens) and one short question of its own, all arriving at once. Both runs use the same
engine settings and a KV pool that holds every request whole, so the only difference is
whether the shared blocks are computed once or once per request. Measured on this machine.

The replay (``--conversations``, 0 to skip it) serves turn 1 of every conversation together,
then turn 2 (whose prompt is turn 1's, its recorded reply and a new question), and so on, on
one engine with caching on: the hit rate is prefix_cache_hits / prefix_cache_queries over all
turns, and the same per turn.

Usage: .venv/bin/python scripts/prefix_cache_bench.py [--requests 32] [--system-tokens 1000] [--max-tokens 32]
       [--conversations 8] [--turns 3]
"""

from __future__ import annotations

import argparse
import statistics

from labkit.engine import LLM
from labkit.metrics import summarize
from labkit.models import load_model
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams
from labkit.workloads import sharegpt_multiturn

BLOCK_SIZE = 16
TOPICS = (
    "cashback",
    "a declined card",
    "a refund",
    "a double charge",
    "the wallet limit",
    "a lost card",
    "the festival offer",
    "a failed transfer",
)
ASKS = (
    "When will I hear back about {}?",
    "Who do I call about {}?",
    "What documents do I need for {}?",
    "How long does {} usually take?",
)


def system_prompt(tokenizer, num_tokens: int) -> str:
    """A policy document of numbered rules, just long enough to reach ``num_tokens`` tokens."""
    rules = []
    while len(tokenizer.encode(" ".join(rules))) < num_tokens:
        n = len(rules) + 1
        rules.append(
            f"Rule {n}: when a customer asks about case type {n}, check the account history, "
            f"quote policy section {n} word for word, and never promise a date you cannot keep."
        )
    return " ".join(rules)


def chats(tokenizer, num_requests: int, system_tokens: int) -> list[list[dict[str, str]]]:
    system = system_prompt(tokenizer, system_tokens)
    questions = [ask.format(topic) for ask in ASKS for topic in TOPICS]
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{questions[i % len(questions)]} My order is number {1000 + i}."},
        ]
        for i in range(num_requests)
    ]


def serve(model, prompts, caching: bool, max_tokens: int, num_blocks: int) -> dict[str, float]:
    """One run; what it computed and how fast it answered."""
    llm = LLM(
        model, max_num_seqs=len(prompts), num_blocks=num_blocks, block_size=BLOCK_SIZE, enable_prefix_caching=caching
    )
    llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    summary = summarize(llm.trace)
    return {
        "prefill tokens computed": sum(step.num_prefill_tokens for step in llm.trace.steps),
        "hit rate": summary.prefix_cache_hit_rate,
        "TTFT p50 (s)": summary.ttft_ms.median / 1000,
        "TTFT p99 (s)": summary.ttft_ms.p99 / 1000,
        "output tok/s": summary.output_throughput,
        "duration (s)": summary.duration_s,
    }


def multiturn_replay(model, conversations: int, turns: int, max_tokens: int, max_prompt_tokens: int) -> None:
    """Serve a multi-turn ShareGPT replay turn by turn with caching on; print its hit rate, overall and per turn."""
    workload = sharegpt_multiturn(
        conversations,
        seed=0,
        tokenizer=model.tokenizer,
        min_turns=turns,
        max_turns=turns,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_tokens,
    )
    rounds: dict[int, list] = {}
    for request in workload:
        rounds.setdefault(int(request.request_id.rsplit("-turn", 1)[1]), []).append(request)
    longest = max(workload.prompt_lens) + max_tokens
    llm = LLM(
        model,
        max_num_seqs=conversations,
        max_model_len=longest,
        num_blocks=turns * conversations * (-(-longest // BLOCK_SIZE)),
    )
    print(
        f"\nmulti-turn ShareGPT replay: {conversations} conversations x {turns} turns, prompts of "
        f"{min(workload.prompt_lens)}-{max(workload.prompt_lens)} tokens, {max_tokens} output tokens each, caching on"
    )
    print("| turn | requests | prompt tokens (queries) | found in cache (hits) | hit rate |")
    print("|---|---|---|---|---|")
    total_queries = total_hits = 0
    for turn, requests in sorted(rounds.items()):
        params = [SamplingParams(max_tokens=r.output_len, ignore_eos=True) for r in requests]
        llm.generate([r.prompt for r in requests], params, use_tqdm=False)
        summary = summarize(llm.trace)
        queries, hits = summary.prefix_cache_queries, summary.prefix_cache_hits
        total_queries, total_hits = total_queries + queries, total_hits + hits
        print(f"| {turn} | {len(requests)} | {queries:,} | {hits:,} | {hits / queries:.1%} |")
    print(f"| all | {len(workload)} | {total_queries:,} | {total_hits:,} | {total_hits / total_queries:.1%} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting; the table shows medians")
    parser.add_argument("--conversations", type=int, default=8, help="multi-turn replay: conversations (0: skip)")
    parser.add_argument("--turns", type=int, default=3, help="multi-turn replay: turns per conversation")
    parser.add_argument("--max-prompt-tokens", type=int, default=1500, help="multi-turn replay: longest prompt")
    args = parser.parse_args(argv)

    model = load_model()
    prompts = chats(model.tokenizer, args.requests, args.system_tokens)
    lengths = [len(encode_prompt(model.tokenizer, p)) for p in prompts]
    num_blocks = sum(-(-(n + args.max_tokens) // BLOCK_SIZE) for n in lengths)  # every request fits whole
    print(
        f"{args.requests} chats of {min(lengths)}-{max(lengths)} prompt tokens sharing a "
        f"{len(model.tokenizer.encode(prompts[0][0]['content']))}-token system prompt, {args.max_tokens} "
        f"output tokens each; {model.config.name} on {model.device} ({model.dtype}), {num_blocks} blocks"
    )
    serve(model, prompts[:2], False, 2, num_blocks)  # warm-up: first calls pay one-time costs
    rows = {}
    for caching in (False, True):
        runs = [serve(model, prompts, caching, args.max_tokens, num_blocks) for _ in range(args.repeats)]
        rows["on" if caching else "off"] = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    keys = list(rows["on"])
    print("| prefix caching | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(
            f"| {name} | "
            + " | ".join(f"{row[key]:,.3g}" if key != "prefill tokens computed" else f"{row[key]:,.0f}" for key in keys)
            + " |"
        )
    off, on = rows["off"], rows["on"]
    print(
        f"prefill tokens computed: {1 - on['prefill tokens computed'] / off['prefill tokens computed']:.1%} "
        f"fewer; TTFT p50 {off['TTFT p50 (s)'] / on['TTFT p50 (s)']:.1f}x lower; output tok/s "
        f"{on['output tok/s'] / off['output tok/s']:.1f}x"
    )
    if args.conversations:
        multiturn_replay(model, args.conversations, args.turns, args.max_tokens, args.max_prompt_tokens)


if __name__ == "__main__":
    main()
