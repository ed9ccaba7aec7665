"""The replicas' KV events: the prefix cache publishes what it stores, evicts and clears; ``labkit serve`` serves
them at ``/kv_events``; ``labkit route --policy cache_aware`` reads them and predicts, in tokens, exactly what each
replica finds, where its shadow index (what it sent there) misses every eviction.

Over HTTP: two real ``labkit serve`` replicas on loopback (the tiny model speaking through the course model's
tokenizer, whose pools are small enough to evict) behind a router that tokenizes with its own copy of that
tokenizer, through ``scripts/kv_events_replay.py``'s replay. Nothing asserts a duration.
"""

import argparse
import asyncio
import random

import httpx
import pytest
from script_loader import load_script
from test_route import Seen, router_over, turn

from labkit.engine import LLM
from labkit.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventLog, apply_event
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator, block_hashes
from labkit.models import tiny_model
from labkit.models.loading import load_tokenizer
from labkit.models.tokens import encode_prompt
from labkit.serve.router_app import Routing
from labkit.serve.router_caches import FleetCaches, ShadowIndex, cached_run
from labkit.serve.router_prometheus import RouterMetrics
from labkit.serve.router_relay import CACHE_VIEW_HEADER, PREDICTED_HEADER, REPLICA_HEADER
from labkit.serve.router_server import RouterThread
from labkit.serve.server import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMEOUT = httpx.Timeout(60.0)


# --- the prefix cache's events, no HTTP -------------------------------------------------------------------------
def read_all(log: KVEventLog, held: dict, position: dict) -> None:
    """A reader that polls the log as the router does, keeping the hashes held in ``held``."""
    reply = log.read(position.get("next", 0), position.get("epoch"), limit=3)
    while True:
        if "held" in reply:
            held.clear()
            held.update(dict.fromkeys(reply["held"]))
        for event in reply.get("events", []):
            apply_event(held, event)
        position.update(next=reply["next"], epoch=reply["epoch"])
        if not reply.get("more"):
            return
        reply = log.read(position["next"], position["epoch"], limit=3)


def test_a_reader_of_the_events_finds_what_the_prefix_cache_finds_through_evictions_and_a_reset():
    """Random sequences on a pool of 8 blocks of 4 tokens (so blocks are evicted all the time): after every call,
    the hashes a polling reader holds are the cache's, and a prompt's cached run by those hashes is the cache's."""
    rng = random.Random(0)
    blocks = PrefixCachingBlockAllocator(8, block_size=4)
    log = KVEventLog(blocks.block_size, max_events=5)  # small: the reader falls behind and gets the held hashes
    seen: list = []
    blocks.publish_events(lambda event: (log.publish(event), seen.append(event)))
    held: dict = {}
    position: dict = {}
    stems = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]  # prompts share these starts
    live: dict[str, list[int]] = {}
    for n in range(300):
        if live and (len(live) > 1 or rng.random() < 0.4):
            seq = rng.choice(sorted(live))
            blocks.free(seq)
            del live[seq]
        else:
            tokens = rng.choice(stems)[: rng.randrange(4, 13)] + [rng.randrange(50) for _ in range(rng.randrange(6))]
            seq = f"s{n}"
            blocks.take_cached_prefix(seq, tokens[:-1])
            if blocks.can_allocate(seq, len(tokens)):
                blocks.allocate(seq, len(tokens))
                blocks.cache_full_blocks(seq, tokens)
                live[seq] = tokens
            else:
                blocks.free(seq)
        if n == 150:
            for seq in list(live):
                blocks.free(seq)
            live.clear()
            assert blocks.reset_prefix_cache() and blocks.num_cached_blocks == 0
        read_all(log, held, position)
        assert set(held) == set(blocks._cached), f"after call {n}"
        probe = rng.choice(stems)[: rng.randrange(2, 13)]
        assert cached_run(held, probe, 4) == blocks.cached_tokens(probe), f"after call {n}"
    assert blocks.num_evictions > 20
    assert {type(event) for event in seen} == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_the_events_are_vllms_and_a_busy_cache_is_not_reset():
    blocks = PrefixCachingBlockAllocator(2, block_size=2)
    published = []
    blocks.allocate("a", 4)
    blocks.cache_full_blocks("a", [1, 2, 3, 4])  # before anyone listens ...
    blocks.publish_events(published.append)  # ... told as a BlockStored per block held
    first, second = blocks.hash_blocks([1, 2, 3, 4])
    assert published == [BlockStored((first,), None, 2), BlockStored((second,), first, 2)]
    assert not blocks.reset_prefix_cache(), "sequence a holds blocks: nothing is forgotten"
    blocks.free("a")
    blocks.allocate("b", 2)  # the least recently freed cached block is evicted (a's first; its tail is freed first)
    assert published[-1] == BlockRemoved((second,))
    blocks.free("b")
    assert blocks.reset_prefix_cache() and published[-1] == AllBlocksCleared()


def test_a_reader_of_another_run_or_too_far_behind_gets_the_hashes_held():
    log = KVEventLog(block_size=16, max_events=2)
    for key in (1, 2, 3):
        log.publish(BlockStored((key,), None, 16))
    log.publish(BlockRemoved((2,)))
    assert log.read(0) == {"epoch": log.epoch, "block_size": 16, "next": 4, "held": [1, 3]}  # no epoch: a new reader
    assert log.read(1, log.epoch)["held"] == [1, 3]  # event 1 is no longer kept
    assert log.read(2, log.epoch)["events"] == [
        {"type": "BlockStored", "block_hashes": (3,), "parent_block_hash": None, "block_size": 16},
        {"type": "BlockRemoved", "block_hashes": (2,)},
    ]
    assert log.read(4, "another run")["held"] == [1, 3]
    assert log.read(4, log.epoch) == {"epoch": log.epoch, "block_size": 16, "next": 4, "more": False, "events": []}


def feed_reading(answers: list[httpx.Response]) -> tuple[FleetCaches, list[dict]]:
    """A one-replica view whose replica gives ``answers`` in turn (one per refresh); and the queries it was sent."""
    queries: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        queries.append(dict(request.url.params))
        return answers.pop(0)

    caches = FleetCaches(["http://replica"], ShadowIndex(1, block_size=4))
    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    for _ in range(len(answers)):
        asyncio.run(caches.refresh(client, [0]))
    return caches, queries


def test_the_router_follows_a_replicas_log_across_a_restart_and_guesses_where_there_is_none():
    prompt = list(range(1, 10))  # two full blocks of 4 before the last token
    first, second = block_hashes(prompt, 4)[:2]
    log, restarted = KVEventLog(4), KVEventLog(4)
    log.publish(BlockStored((first,), None, 4))
    held_then_event = [httpx.Response(200, json=log.read(0))]
    log.publish(BlockStored((second,), first, 4))
    held_then_event.append(httpx.Response(200, json=log.read(1, log.epoch)))
    restarted.publish(BlockStored((first,), None, 4))  # another run: its numbers mean nothing to the old reader
    caches, queries = feed_reading([*held_then_event, httpx.Response(200, json=restarted.read(2, log.epoch))])
    assert queries == [{"since": "0"}, {"since": "1", "epoch": log.epoch}, {"since": "2", "epoch": log.epoch}]
    assert caches.source(0) == "kv_events" and caches.cached(0, prompt) == 4  # the restarted replica holds one
    for nothing in (httpx.Response(404, json={}), httpx.Response(200, text="<html>not labkit</html>")):
        caches, _ = feed_reading([nothing])
        caches.record(0, prompt)
        assert caches.source(0) == "shadow" and caches.cached(0, prompt) == 8  # what it was sent, believed held


# --- over HTTP ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    """The tiny model speaking through the course model's tokenizer (its own copy: the router loads another)."""
    tokenizer = load_tokenizer("default", progress=False)
    model = tiny_model("llama", vocab_size=len(tokenizer), max_position_embeddings=512)
    model.tokenizer = tokenizer
    return model


def small_replica(model, **dials) -> ServerThread:
    """A replica whose pool holds 20 blocks of 16 tokens: two or three chats, so the others' are evicted."""
    return ServerThread(LLM(model, num_blocks=20, block_size=16, max_model_len=320, **dials)).start()


def chat(url: str, messages: list[dict]) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 4, "ignore_eos": True, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT)


def test_with_kv_events_the_predicted_cached_tokens_are_the_replicas_own_on_every_request(model):
    """Four chats of three turns, one request at a time, over two replicas that evict: with events the router
    predicts exactly what the replica then finds, on every request."""
    replay = load_script("kv_events_replay").replay
    args = argparse.Namespace(chats=4, turns=3, num_blocks=24, clients=1, max_tokens=4)
    rows, evictions = replay(model, load_tokenizer("default", progress=False), True, args)
    assert evictions > 0, "the pools must be small enough to evict"
    assert len(rows) == 12 and {row["view"] for row in rows} == {"kv_events"}
    assert sum(row["actual"] for row in rows) > 0, "some turn found its history"
    assert [row["predicted"] for row in rows] == [row["actual"] for row in rows]


def test_the_router_tokenizes_the_request_as_the_replica_does(model):
    """The policy's request view over HTTP carries the prompt's tokens, the ones the replica counts in its usage."""
    seen = Seen()
    server = small_replica(model)
    try:
        urls = [server.url]
        caches = FleetCaches(urls, ShadowIndex(1))
        tokenizer = load_tokenizer("default", progress=False)
        with RouterThread(Routing(urls, seen, caches, RouterMetrics(urls), 60.0, tokenizer=tokenizer)) as router:
            messages = turn("Be brief.", "What is a KV cache?")
            answer = chat(router.url, messages)
    finally:
        server.stop()
    tokens = seen.requests[0].prompt_token_ids
    assert tokens is not None and len(tokens) == answer.json()["usage"]["prompt_tokens"]
    assert list(tokens) == encode_prompt(model.tokenizer, messages)


def test_a_replica_without_events_falls_back_to_the_shadow_index(model):
    """Replica 0 has prefix caching off, so it publishes nothing (404): the router guesses for it from what it sent
    there, and the guess is wrong (nothing is cached there); it reads replica 1's events."""
    tokenizer = load_tokenizer("default", progress=False)
    without, with_events = small_replica(model, enable_prefix_caching=False), small_replica(model)
    try:
        missing = httpx.get(without.url + "/kv_events", timeout=TIMEOUT)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_kv_events"
        with router_over([without, with_events], "cache_aware", tokenizer=tokenizer) as router:
            messages = turn("A system prompt long enough to fill a few blocks of sixteen tokens. " * 3, "Hi?")
            first, second = chat(router.url, messages), chat(router.url, messages)
            assert first.headers[REPLICA_HEADER] == second.headers[REPLICA_HEADER] == without.url
            assert second.headers[CACHE_VIEW_HEADER] == "shadow" and int(second.headers[PREDICTED_HEADER]) > 0
            assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert router.routing.caches.source(1) == "kv_events"
    finally:
        with_events.stop()
        without.stop()


def test_a_reset_prefix_cache_is_published_and_the_router_predicts_nothing_after_it(model):
    tokenizer = load_tokenizer("default", progress=False)
    servers = [small_replica(model), small_replica(model)]
    try:
        with router_over(servers, "cache_aware", tokenizer=tokenizer) as router:
            messages = turn("A system prompt long enough to fill a few blocks of sixteen tokens. " * 3, "Hi?")
            chat(router.url, messages)
            again = chat(router.url, messages)
            assert (
                int(again.headers[PREDICTED_HEADER])
                == again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                > 0
            )
            replica = again.headers[REPLICA_HEADER]
            assert httpx.post(replica + "/reset_prefix_cache", timeout=TIMEOUT).status_code == 200
            after = chat(router.url, messages)
            assert after.headers[PREDICTED_HEADER] == "0"
            assert after.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        for server in servers:
            server.stop()


def test_the_replay_script_prints_events_against_the_shadow_index(capsys):
    """The script's quick run: exact with events; the shadow index, blind to evictions, over-predicts."""
    result = load_script("kv_events_replay").main(["--quick"])
    events, shadow = result["kv_events"], result["shadow"]
    assert events["exact"] == events["requests"] == shadow["requests"] == 12
    assert events["evictions"] > 0 and shadow["over"] > 0 and shadow["exact"] < 12
    out = capsys.readouterr().out
    assert "| kv_events | 12 | 12 |" in out and "| shadow | 12 |" in out
