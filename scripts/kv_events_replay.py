"""What ``labkit route --policy cache_aware`` predicts cached against what its replicas found: the replicas' KV
events against the shadow index, on two ``labkit serve`` replicas whose pools are small enough to evict.

Multi-turn chats (each with its own system prompt) are replayed through the router, turn by turn, by ``--clients``
clients at once (each sends its own chats' turns one after another), twice over fresh replicas: once with the
router reading the replicas' KV events, once with its shadow index alone. For every request the router's
predicted cached tokens (its ``x-labkit-predicted-cached-tokens`` header) are set beside the replica's own count
(``usage.prompt_tokens_details.cached_tokens``), and the time to first token is read at the client. Each pool
holds only some of the chats, so a chat's history is often evicted before its next turn: the shadow index, which
never sees an eviction, predicts blocks that are gone; the events do not. The replicas run in this process
(threads), so with several clients they share its cores.

Usage: .venv/bin/python scripts/kv_events_replay.py [--model default] [--chats 6] [--turns 3] [--num-blocks 24]
       [--clients 1] [--max-tokens 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx

from labkit.engine import LLM
from labkit.engine.fleet import CacheAware
from labkit.models import load_model, tiny_model
from labkit.models.loading import load_tokenizer
from labkit.serve.router_app import Routing
from labkit.serve.router_caches import FleetCaches, ShadowIndex
from labkit.serve.router_prometheus import RouterMetrics
from labkit.serve.router_relay import CACHE_VIEW_HEADER, PREDICTED_HEADER, REPLICA_HEADER
from labkit.serve.router_server import RouterThread
from labkit.serve.server import ServerThread

BLOCK_SIZE = 16
TOPICS = ["bread", "rain", "chess", "bees", "tides", "maps", "clocks", "kites", "salt", "ferns", "owls", "glass"]


def chats(count: int, turns: int) -> list[tuple[str, list[str]]]:
    """``count`` chats, each a system prompt of its own (about 60 tokens) and ``turns`` user questions."""
    return [
        (
            f"You are guide number {c}, an expert on {TOPICS[c % len(TOPICS)]}. Answer in one short line, plainly, "
            f"and stay on {TOPICS[c % len(TOPICS)]}. Never mention the other guides or their topics. " * 2,
            [
                f"Question {t} about {TOPICS[c % len(TOPICS)]}: what should a beginner know first, and why?"
                for t in range(turns)
            ],
        )
        for c in range(count)
    ]


def ask(url: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat request through the router: the answer, the router's prediction, the replica's count."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    pieces, first, usage = [], None, None
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600.0) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    pieces.append(choice["delta"]["content"])
        headers = answer.headers
    assert usage is not None, "the replica sends usage when asked (stream_options.include_usage)"
    return {
        "text": "".join(pieces),
        "replica": headers[REPLICA_HEADER],
        "view": headers[CACHE_VIEW_HEADER],
        "predicted": int(headers[PREDICTED_HEADER]),
        "actual": usage["prompt_tokens_details"]["cached_tokens"],
        "prompt": usage["prompt_tokens"],
        "ttft_s": (first or time.perf_counter()) - start,
    }


def replay(model, tokenizer, use_events: bool, args: argparse.Namespace) -> tuple[list[dict], int]:
    """The chats through a cache_aware router over two fresh replicas: one row per request, and the evictions."""
    engines = [
        LLM(model, num_blocks=args.num_blocks, block_size=BLOCK_SIZE, max_model_len=args.num_blocks * BLOCK_SIZE)
        for _ in range(2)
    ]
    servers = [ServerThread(llm).start() for llm in engines]
    rows: list[dict] = []
    try:
        urls = [server.url for server in servers]
        caches = FleetCaches(urls, ShadowIndex(len(urls), BLOCK_SIZE), use_events)
        routing = Routing(urls, CacheAware(), caches, RouterMetrics(urls), 600.0, tokenizer=tokenizer)
        with RouterThread(routing) as router:
            conversations = chats(args.chats, args.turns)

            def client(mine: list[int]) -> None:
                histories = {c: [{"role": "system", "content": conversations[c][0]}] for c in mine}
                for t in range(args.turns):
                    for c in mine:
                        histories[c].append({"role": "user", "content": conversations[c][1][t]})
                        row = ask(router.url, histories[c], args.max_tokens)
                        histories[c].append({"role": "assistant", "content": row["text"]})
                        rows.append({"chat": c, "turn": t, **row, "replica": urls.index(row["replica"])})

            threads = [
                threading.Thread(target=client, args=(list(range(k, args.chats, args.clients)),))
                for k in range(args.clients)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for server in servers:
            server.stop()
    return rows, sum(llm.state.blocks.num_evictions for llm in engines)


def summary(rows: list[dict]) -> dict:
    ttft = sorted(row["ttft_s"] for row in rows)
    return {
        "requests": len(rows),
        "exact": sum(row["predicted"] == row["actual"] for row in rows),
        "over": sum(max(row["predicted"] - row["actual"], 0) for row in rows),
        "under": sum(max(row["actual"] - row["predicted"], 0) for row in rows),
        "hit_rate": sum(row["actual"] for row in rows) / sum(row["prompt"] for row in rows),
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p90_s": ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default', a checkpoint, or 'tiny' (random weights)")
    parser.add_argument("--chats", type=int, default=6)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--num-blocks", type=int, default=24, help="each replica's pool, in blocks of 16 tokens")
    parser.add_argument("--clients", type=int, default=1, help="clients sending at once (1: one request at a time)")
    parser.add_argument("--max-tokens", type=int, default=8, help="each answer's length")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model with the course's tokenizer (a test runs this)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.chats, args.turns, args.max_tokens = "tiny", 4, 3, 4
    if min(args.chats, args.turns, args.clients, args.max_tokens) < 1 or args.num_blocks < 2:
        parser.error("--chats, --turns, --clients and --max-tokens must be 1 or more, --num-blocks 2 or more")
    tokenizer = load_tokenizer("default", progress=False)
    if args.model == "tiny":  # random weights speaking through the course model's tokenizer and chat template
        model = tiny_model("llama", vocab_size=len(tokenizer), max_position_embeddings=args.num_blocks * BLOCK_SIZE)
        model.tokenizer = tokenizer
    else:
        model = load_model(args.model)
        tokenizer = model.tokenizer
    print(
        f"model {model.config.name}; 2 replicas of {args.num_blocks} blocks of {BLOCK_SIZE} tokens; {args.chats} chats "
        f"x {args.turns} turns, {args.clients} client(s) at once; answers of {args.max_tokens} tokens"
    )
    result: dict = {}
    for name, use_events in (("kv_events", True), ("shadow", False)):
        rows, evictions = replay(model, tokenizer, use_events, args)
        result[name] = {"rows": rows, "evictions": evictions, **summary(rows)}
        print(f"\n{name}: per request (predicted cached tokens by the router, found by the replica)")
        print(
            f"{'chat':>4} {'turn':>4} {'replica':>7} {'view':>9} {'prompt':>6} {'predicted':>9} {'actual':>6} {'TTFT ms':>8}"
        )
        for row in sorted(rows, key=lambda r: (r["turn"], r["chat"])):
            print(
                f"{row['chat']:>4} {row['turn']:>4} {row['replica']:>7} {row['view']:>9} {row['prompt']:>6} "
                f"{row['predicted']:>9} {row['actual']:>6} {row['ttft_s'] * 1e3:>8.1f}"
            )
    print(
        "\n| router's view | requests | predicted = found | tokens over-predicted | under | hit rate | mean TTFT | p90 TTFT | evictions |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, got in result.items():
        print(
            f"| {name} | {got['requests']} | {got['exact']} | {got['over']} | {got['under']} | {got['hit_rate']:.1%} | "
            f"{got['ttft_mean_s'] * 1e3:.0f} ms | {got['ttft_p90_s'] * 1e3:.0f} ms | {got['evictions']} |"
        )
    return result


if __name__ == "__main__":
    main()
