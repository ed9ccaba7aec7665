"""``labkit route`` over real HTTP on loopback: two ``labkit serve`` replicas (the tiny chat model) behind it.

Which replica served a request is read from the router's ``x-labkit-replica`` header, and how many requests each
replica finished from its own ``vllm:request_success`` counter, so "none lost, none served twice" is counted by
the replicas, not by the router. Nothing asserts a duration: where a request must still be in flight, the test
holds its stream open after the first event; the bounds only stop a hang.
"""

import os
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from test_serve import chat_model, make_llm, scrape, slow_attention, stream_events, wait_for

from labkit.engine import LLM
from labkit.engine.fleet import ROUTERS, CacheAware, generate_on_fleet, make_router
from labkit.engine.interfaces import ReplicaView, RequestView
from labkit.models import tiny_model
from labkit.sampling import SamplingParams
from labkit.serve.replica_procs import ReplicaProcesses
from labkit.serve.router_app import Routing
from labkit.serve.router_caches import FleetCaches, ShadowIndex
from labkit.serve.router_health import ReplicaHealth
from labkit.serve.router_prometheus import RouterMetrics
from labkit.serve.router_relay import REPLICA_HEADER
from labkit.serve.router_server import RouterThread
from labkit.serve.server import ServerThread

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMEOUT = httpx.Timeout(60.0)
SYSTEM_A = "You are a ship's cook. Answer in one line, about food, with a recipe from the galley. " * 2
SYSTEM_B = "You are a lighthouse keeper. Answer in one line, about weather and the lamp. " * 2


def turn(system: str, *said: str) -> list[dict]:
    """A conversation: the system prompt, then user and assistant in turn."""
    roles = ["user", "assistant"]
    return [{"role": "system", "content": system}] + [
        {"role": roles[i % 2], "content": text} for i, text in enumerate(said)
    ]


@pytest.fixture(scope="module")
def model():
    return chat_model()


@pytest.fixture(scope="module")
def replicas(model):
    """Two replicas that dawdle a little per step, so a long answer stays in flight while a test looks."""
    with (
        ServerThread(make_llm(model, attention=slow_attention)) as r0,
        ServerThread(make_llm(model, attention=slow_attention)) as r1,
    ):
        yield [r0, r1]


def router_over(servers, policy: str, max_imbalance: int = 4, tokenizer=None, use_events: bool = True) -> RouterThread:
    """A router over the servers (or URLs); cache_aware needs the fleet's ``tokenizer``."""
    urls = [getattr(server, "url", server) for server in servers]
    caches = FleetCaches(urls, ShadowIndex(len(urls)), use_events) if policy == "cache_aware" else None
    metrics = RouterMetrics(urls)
    health = ReplicaHealth(urls, metrics, first_backoff_s=0.2, max_backoff_s=1.0, check_every_s=0.5)
    routing = Routing(
        urls, make_router(policy, max_imbalance), caches, metrics, 60.0, health=health, tokenizer=tokenizer
    )
    return RouterThread(routing)


def served(server) -> float:
    """Requests the replica answered to their end (stop or length, not abort), by its own count (read
    in-process: it works after the replica stopped)."""
    text = server.worker.metrics.render().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' not in line
    )


def complete(url: str, prompt: str = "Hello", max_tokens: int = 3, **extra) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT)


def chat(url: str, messages: list[dict], max_tokens: int = 3) -> httpx.Response:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=TIMEOUT)


class HeldStream:
    """A streamed chat request through the router, held open after its first event (so it is in flight)."""

    def __init__(self, url: str, messages: list[dict]):
        body = {"messages": messages, "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True}
        self.client = httpx.Client(timeout=TIMEOUT)
        self.response = self.client.send(
            self.client.build_request("POST", url + "/v1/chat/completions", json=body), stream=True
        )
        assert self.response.status_code == 200
        self.replica = self.response.headers[REPLICA_HEADER]
        self.events = stream_events(self.response)
        next(self.events)

    def close(self) -> None:
        self.response.close()
        self.client.close()


def idle(router: RouterThread) -> bool:
    return sum(router.routing.in_flight) == 0


# --- policies on the seam, no HTTP ----------------------------------------------------------------------
def test_cache_aware_prefers_the_cache_within_the_load_bound():
    views = [ReplicaView(0, 0, 0), ReplicaView(1, 3, 128), ReplicaView(2, 1, 64)]
    assert CacheAware(max_imbalance=3).route(None, views) == 1  # most cached, 3 busier: allowed
    assert CacheAware(max_imbalance=2).route(None, views) == 2  # replica 1 is out; 2 has the most left
    assert CacheAware(max_imbalance=0).route(None, views) == 0  # only the least busy is allowed
    assert CacheAware().route(None, [ReplicaView(0, 2, 0), ReplicaView(1, 1, 0)]) == 1  # no cache: least busy


class Seen:
    """A router of your own that notes each request view it is shown (always the first replica)."""

    name = "seen"

    def __init__(self):
        self.requests: list[RequestView] = []

    def route(self, request, replicas):
        self.requests.append(request)
        return 0


def test_one_router_object_sees_the_request_before_tokenizing_over_http_and_after_in_the_fleet(replicas):
    """The engine's fleet routes tokenized requests; labkit route reads only the body's text (it does not tokenize)."""
    seen = Seen()
    llm = LLM(tiny_model("llama", seed=3), num_blocks=32, block_size=16)
    generate_on_fleet([llm], [[5, 6, 7]], SamplingParams(max_tokens=1), router=seen)
    assert seen.requests == [RequestView("0", None, (5, 6, 7))]
    urls = [server.url for server in replicas]
    metrics = RouterMetrics(urls)
    with RouterThread(Routing(urls, seen, None, metrics, 60.0)) as router:
        assert complete(router.url, "Hello there").headers[REPLICA_HEADER] == urls[0]
    assert seen.requests[1] == RequestView("", "Hello there", None)


def test_one_registry_of_routers_by_name():
    from labkit.serve.route_cli import POLICIES

    assert set(POLICIES) == set(ROUTERS) == {"round_robin", "least_loaded", "cache_aware"}
    assert make_router("cache_aware", max_imbalance=2).max_imbalance == 2
    with pytest.raises(ValueError, match="unknown router 'least_outstanding'"):
        make_router("least_outstanding")


def test_shadow_index_finds_the_longest_recorded_prefix_and_forgets_the_least_recent():
    index = ShadowIndex(2, block_size=4, max_blocks=3)
    first, later = list(range(1, 15)), list(range(1, 15)) + [50, 51, 52, 53, 54]  # the next turn extends the first
    index.record(1, first)  # 3 full blocks of 14 tokens
    assert index.cached(1, later) == 12 and index.cached(0, later) == 0
    assert index.cached(1, first[:13]) == 12 and index.cached(1, first[:12]) == 8  # the last token is never cached
    index.record(1, [9] * 12)  # three new blocks push the old ones out
    assert index.cached(1, later) == 0


def test_the_same_cache_aware_router_runs_the_engine_fleet():
    """One router, both clocks: in the engine's fleet the cached tokens come from the replicas' prefix caches."""
    model = tiny_model("llama", seed=3)
    system = list(range(2, 66))
    prompts = [system + [100 + i, 7] for i in range(2)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    for bound, expected in ((4, [1, 1]), (0, [1, 0])):
        llms = [LLM(model, num_blocks=64, block_size=16, max_num_seqs=4) for _ in range(2)]
        llms[1].generate(system + [9], SamplingParams(max_tokens=1), use_tqdm=False)  # replica 1 holds the prefix
        _, where = generate_on_fleet(llms, prompts, params, router=CacheAware(bound))
        assert where == expected, f"max_imbalance {bound}"


def test_the_same_cache_aware_router_runs_the_simulators_fleet():
    """On the cost model's clock, with no prompt shared, cache_aware is least-loaded (the bound at 0 or not)."""
    from labkit.capacity import LESSON_LLAMA_8B, SALE_GPU
    from labkit.sim import CostModel, simulate_fleet
    from labkit.sim.simulator import blocks_that_fit
    from labkit.workloads import replay_workload

    cost = CostModel.from_parts(SALE_GPU, LESSON_LLAMA_8B, overhead_s=0.003)
    workload = replay_workload([0.0] * 4 + [1.0] * 4, [200] * 8, [400, 1, 400, 1] + [50] * 4)
    blocks = blocks_that_fit(SALE_GPU, LESSON_LLAMA_8B)
    routed = {
        name: list(simulate_fleet(workload, cost, replicas=2, router=router, num_blocks=blocks).replica_of.values())
        for name, router in (
            ("least_loaded", "least_loaded"),
            ("cache_aware", CacheAware(0)),
            ("bound 4", CacheAware()),
        )
    }
    assert routed["cache_aware"] == routed["bound 4"] == routed["least_loaded"] == [0, 1, 0, 1, 1, 1, 0, 1]


# --- over HTTP ---------------------------------------------------------------------------------------------
def test_round_robin_alternates_and_metrics_count_per_replica(replicas):
    before = [served(server) for server in replicas]
    with router_over(replicas, "round_robin") as router:
        answers = [complete(router.url, f"Hello {i}") for i in range(4)]
        assert [answer.status_code for answer in answers] == [200] * 4
        urls = [server.url for server in replicas]
        assert [answer.headers[REPLICA_HEADER] for answer in answers] == urls * 2
        assert all(answer.json()["choices"][0]["text"] is not None for answer in answers)
        metrics = scrape(router.url)
        for url in urls:
            assert metrics[f"labkit_router_processed_requests_total{{worker={url}}}"] == 2
            assert metrics[f"labkit_router_running_requests{{worker={url}}}"] == 0
            assert metrics[f"labkit_router_retries_total{{worker={url}}}"] == 0
            assert metrics[f"vllm:num_requests_waiting{{worker={url}}}"] == 0  # the replica's own, relayed
            assert metrics[f"vllm:prefix_cache_queries_total{{worker={url}}}"] > 0
        models = httpx.get(router.url + "/v1/models", timeout=TIMEOUT)
        assert models.status_code == 200 and models.json()["data"]
        assert httpx.get(router.url + "/health", timeout=TIMEOUT).json()["replicas"] == dict.fromkeys(urls, "ok")
    assert [served(server) - b for server, b in zip(replicas, before, strict=True)] == [2, 2]


def test_a_replicas_own_refusal_of_a_bad_request_comes_back_as_it_is(replicas):
    """A 4xx is the replica's answer, not a failure: passed on, not retried (another replica would say the same)."""
    with router_over(replicas, "round_robin") as router:
        bad = complete(router.url, max_tokens=-1)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
        assert bad.headers[REPLICA_HEADER] == replicas[0].url
        assert scrape(router.url)[f"labkit_router_retries_total{{worker={replicas[0].url}}}"] == 0
        not_json = httpx.post(router.url + "/v1/completions", content=b"{", timeout=TIMEOUT)
        assert not_json.status_code == 415  # the router reads the body as labkit serve does
        not_json = httpx.post(
            router.url + "/v1/completions", content=b"{", timeout=TIMEOUT, headers={"content-type": "application/json"}
        )
        assert not_json.status_code == 400 and not_json.json()["error"]["code"] == "invalid_json"


def test_a_stream_passes_through_event_by_event(replicas):
    messages = turn(SYSTEM_A, "What is for dinner?")
    body = {"messages": messages, "max_tokens": 12, "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", replicas[0].url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as direct:
        expected = list(stream_events(direct))
    with router_over(replicas, "round_robin") as router:
        held = HeldStream(router.url, messages)  # the first event is here ...
        assert held.replica == replicas[0].url
        # ... while the replica is still generating: the router relays, it does not buffer the answer
        assert scrape(replicas[0].url)["vllm:num_requests_running"] == 1
        held.close()
        wait_for(lambda: idle(router), "the router forgets the closed stream")
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=TIMEOUT) as routed:
            got = list(stream_events(routed))
    text = [[choice.get("delta", {}).get("content") for choice in event["choices"]] for event in expected]
    assert [[choice.get("delta", {}).get("content") for choice in event["choices"]] for event in got] == text
    assert len(got) >= 12  # one event per step's token at least


def test_least_loaded_avoids_the_busy_replica(replicas):
    with router_over(replicas, "least_loaded") as router:
        held = HeldStream(router.url, turn(SYSTEM_A, "Keep talking."))
        try:
            assert held.replica == replicas[0].url
            for i in range(2):
                assert complete(router.url, f"Quick {i}").headers[REPLICA_HEADER] == replicas[1].url
        finally:
            held.close()
        wait_for(lambda: idle(router), "the router forgets the closed stream")
        assert complete(router.url).headers[REPLICA_HEADER] == replicas[0].url  # both idle again: the first


def test_a_client_that_leaves_a_stream_has_its_request_aborted_at_the_replica(replicas):
    """The router hangs up on the replica too, which aborts the request at its next event and frees its blocks."""

    def aborted() -> float:
        return scrape(replicas[0].url)["vllm:request_success_total{finished_reason=abort}"]

    before = aborted()
    with router_over(replicas, "round_robin") as router:
        held = HeldStream(router.url, turn(SYSTEM_A, "Go on."))  # 200 tokens: far from done after one
        held.close()
        wait_for(lambda: aborted() == before + 1, "the replica aborts the request its client left")
        wait_for(lambda: idle(router), "the router forgets it")


def test_cache_aware_sends_the_next_turn_where_the_first_was_served(replicas, model):
    with router_over(replicas, "cache_aware", tokenizer=model.tokenizer) as router:
        held = HeldStream(router.url, turn(SYSTEM_A, "What is for dinner?"))  # nothing cached: replica 0
        b1 = chat(router.url, turn(SYSTEM_B, "Will it rain?"))  # nothing cached, replica 0 busy: replica 1
        held.close()
        wait_for(lambda: idle(router), "the router forgets the closed stream")
        assert held.replica == replicas[0].url and b1.headers[REPLICA_HEADER] == replicas[1].url
        # both idle now: each conversation's next turn follows its cache
        hits_before = {server.url: scrape(server.url)["vllm:prefix_cache_hits_total"] for server in replicas}
        b2 = chat(router.url, turn(SYSTEM_B, "Will it rain?", b1.json()["choices"][0]["message"]["content"], "And?"))
        a2 = chat(router.url, turn(SYSTEM_A, "What is for dinner?", "Soup.", "And after?"))
        assert b2.headers[REPLICA_HEADER] == replicas[1].url and a2.headers[REPLICA_HEADER] == replicas[0].url
        metrics = scrape(router.url)
        for url in (replicas[0].url, replicas[1].url):
            # the replica found the cache the router predicted there: its own hits grew by the second turn
            assert metrics[f"vllm:prefix_cache_hits_total{{worker={url}}}"] > hits_before[url]
            assert metrics[f"labkit_router_predicted_cached_tokens_total{{worker={url}}}"] >= 16
        # replica 1 had nothing of SYSTEM_B before b1; replica 0 may hold SYSTEM_A from earlier tests' requests,
        # which its KV events tell the router, so the held stream may have been a predicted hit too
        hits, misses = "labkit_router_cache_hits_total{{worker={}}}", "labkit_router_cache_misses_total{{worker={}}}"
        assert metrics[hits.format(replicas[1].url)] == metrics[misses.format(replicas[1].url)] == 1
        assert metrics[hits.format(replicas[0].url)] + metrics[misses.format(replicas[0].url)] == 2
        assert metrics[hits.format(replicas[0].url)] >= 1


def replay_hits(model, policy: str) -> tuple[float, float]:
    """Three conversations of three turns each, turn by turn, through the router over two fresh replicas: the
    prompt tokens the replicas found in their prefix caches, and those they looked up."""
    servers = [ServerThread(make_llm(model)).start() for _ in range(2)]
    try:
        with router_over(servers, policy, tokenizer=model.tokenizer) as router:
            talks = [[f"Conversation {c}: " + (SYSTEM_A if c % 2 else SYSTEM_B) + f" Be brief, {c}."] for c in range(3)]
            for t in range(3):
                for said in talks:
                    answer = chat(router.url, turn(said[0], *said[1:], f"Question {t}?"), max_tokens=6)
                    said += [f"Question {t}?", answer.json()["choices"][0]["message"]["content"]]
        metrics = [scrape(server.url) for server in servers]
        return tuple(sum(m[f"vllm:prefix_cache_{kind}_total"] for m in metrics) for kind in ("hits", "queries"))
    finally:
        for server in servers:
            server.stop()


def test_cache_aware_finds_more_cached_tokens_than_round_robin_on_a_multi_turn_replay(model):
    """Round-robin scatters each conversation over both replicas (three conversations, two replicas): a turn
    finds its history only where the turn before happened to run. cache_aware keeps each on one replica."""
    scattered, queried = replay_hits(model, "round_robin")
    kept, same_queries = replay_hits(model, "cache_aware")
    assert queried == same_queries  # the same prompts, token for token
    assert kept > 1.5 * scattered, (kept, scattered)


def test_the_load_bound_overrides_the_cache(replicas, model):
    with router_over(replicas, "cache_aware", max_imbalance=1, tokenizer=model.tokenizer) as router:
        first = chat(router.url, turn(SYSTEM_A, "Soup?"))
        assert first.headers[REPLICA_HEADER] == replicas[0].url
        held = []
        try:
            for i in range(3):  # the same hot prefix three times, each held in flight
                held.append(HeldStream(router.url, turn(SYSTEM_A, "Soup?", "Yes.", f"Again {i}")))
            # replica 0 holds the prefix: it takes 2 (1 busier than replica 1 is within the bound), not the third
            assert [stream.replica for stream in held] == [replicas[0].url] * 2 + [replicas[1].url]
        finally:
            for stream in held:
                stream.close()
        wait_for(lambda: idle(router), "the router forgets the closed streams")


def test_a_draining_replicas_503_sends_the_request_to_another(replicas):
    draining = replicas[1]
    before = [served(server) for server in replicas]
    with router_over(replicas, "round_robin") as router:
        draining.worker.draining = True  # a stopping labkit serve answers 503 to new requests
        try:
            answers = [complete(router.url, f"Hello {i}") for i in range(4)]
        finally:
            draining.worker.draining = False
        assert [answer.status_code for answer in answers] == [200] * 4
        assert {answer.headers[REPLICA_HEADER] for answer in answers} == {replicas[0].url}
        metrics = scrape(router.url)
        # its first 503 (or its /health, checked first) said it drains: it was ejected at once, and no later
        # request tried it
        assert metrics[f"labkit_router_retries_total{{worker={draining.url}}}"] <= 1
        assert metrics[f"labkit_router_ejections_total{{worker={draining.url}}}"] == 1
        assert metrics[f"labkit_router_worker_up{{worker={draining.url}}}"] in (0, 1)  # 1 once it was readmitted
        wait_for(
            lambda: scrape(router.url)[f"labkit_router_readmissions_total{{worker={draining.url}}}"] == 1,
            "the router readmits the replica once its /health says 200 again",
        )
        assert {complete(router.url).headers[REPLICA_HEADER] for _ in range(2)} == {r.url for r in replicas}
    assert [served(server) - b for server, b in zip(replicas, before, strict=True)] == [5, 1]


def test_a_stopped_replica_loses_no_request_and_serves_none_twice(model):
    """Requests sent while one replica drains and stops: each answered once, by whichever replica took it."""
    a = ServerThread(make_llm(model), shutdown_timeout=5.0).start()
    b = ServerThread(make_llm(model), shutdown_timeout=5.0).start()
    results: list[httpx.Response] = []
    try:
        with router_over([a, b], "round_robin") as router:
            assert [complete(router.url).status_code for _ in range(2)] == [200, 200]

            def send(i: int) -> None:
                results.append(complete(router.url, f"Count {i}", max_tokens=8))

            threads = [threading.Thread(target=send, args=(i,)) for i in range(12)]
            for i, thread in enumerate(threads):
                thread.start()
                if i == 3:
                    b.worker.draining = True  # answers 503 from now on, as a stopping replica does ...
                if i == 6:
                    b.stop()  # ... then refuses the connection
            for thread in threads:
                thread.join(60)
            assert len(results) == 12 and [r.status_code for r in results] == [200] * 12, [r.text for r in results]
            assert served(a) + served(b) == 14  # every request finished once, over both replicas
            assert scrape(router.url)[f"labkit_router_ejections_total{{worker={b.url}}}"] >= 1
            # with every replica gone, the client is told why
            a.stop()
            refused = complete(router.url)
            assert refused.status_code == 503
            error = refused.json()["error"]
            assert error["code"] == "no_replica_available" and a.url in error["message"] and b.url in error["message"]
            assert httpx.get(router.url + "/health", timeout=TIMEOUT).status_code == 503
    finally:
        a.stop()
        b.stop()


def test_a_replica_that_stops_mid_stream_is_not_replaced_by_another(model):
    """Once a replica has started answering, the request is its own: if it stops, the client is told; no other
    replica starts the answer again (it would be served twice)."""
    a = ServerThread(make_llm(model, attention=slow_attention), shutdown_timeout=0.2).start()
    b = ServerThread(make_llm(model)).start()
    try:
        with router_over([a, b], "round_robin") as router:
            held = HeldStream(router.url, turn(SYSTEM_A, "Keep talking."))
            assert held.replica == a.url
            a.stop()  # drains: the stream gets the replica's error event, then [DONE]
            rest = list(held.events)
            held.close()
            assert rest and "error" in rest[-1], rest[-1:]
            wait_for(lambda: idle(router), "the router forgets the ended stream")
            assert served(b) == 0
            assert complete(router.url).headers[REPLICA_HEADER] == b.url  # the next request goes where it can
    finally:
        a.stop()
        b.stop()


def test_a_draining_replicas_streams_all_finish_while_new_requests_go_elsewhere(model):
    """SIGTERM's drain, as a thread server does it: the streams in flight finish whole (a limit long enough), the
    replica's /health says it drains, and the router sends every new request to the other one."""
    a = ServerThread(make_llm(model, attention=slow_attention), shutdown_timeout=600.0).start()
    b = ServerThread(make_llm(model)).start()
    try:
        with router_over([a, b], "round_robin") as router:
            held = [HeldStream(router.url, turn(SYSTEM_A, f"Keep talking {i}.")) for i in range(3)]
            assert [stream.replica for stream in held] == [a.url, b.url, a.url]
            a.server.should_exit = True  # uvicorn stops accepting; the drain starts
            wait_for(lambda: a.worker.draining, "the replica drains")
            answers = [complete(router.url, f"Elsewhere {i}") for i in range(4)]
            assert [answer.status_code for answer in answers] == [200] * 4
            assert {answer.headers[REPLICA_HEADER] for answer in answers} == {b.url}
            for stream in held:
                rest = list(stream.events)
                stream.close()
                assert rest and "error" not in rest[-1], rest[-1:]
                assert rest[-1]["choices"][0]["finish_reason"] == "length"
            assert scrape(router.url)[f"labkit_router_ejections_total{{worker={a.url}}}"] == 1
    finally:
        a.stop()
        b.stop()


def zombie(pid: int) -> bool:
    """Whether the process has exited and no one has reaped it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


def test_a_killed_replica_is_ejected_reaped_restarted_and_readmitted(default_model, monkeypatch):
    """``--start``'s children: one killed mid-run is tried by one request only, reaped, started again, readmitted;
    killed once more than allowed, it is reported and left down. Its restarts are stepped here, not on a timer."""
    # the children (they inherit this environment) skip oneDNN's prepacking: nothing here depends on the matmul path
    monkeypatch.setenv("LABKIT_PREPACK", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dials = ["--max-num-seqs", "2", "--max-model-len", "256", "--num-gpu-blocks-override", "32"]
    children = ReplicaProcesses(2, dials)
    urls = children.start()
    try:
        with router_over(urls, "round_robin") as router:
            assert [complete(router.url).headers[REPLICA_HEADER] for _ in range(2)] == urls
            killed = children.processes[1].pid
            os.kill(killed, signal.SIGKILL)
            wait_for(lambda: zombie(killed), "the child is dead and not yet reaped")
            answers = [complete(router.url, f"After {i}") for i in range(4)]
            assert [a.status_code for a in answers] == [200] * 4
            assert {a.headers[REPLICA_HEADER] for a in answers} == {urls[0]}
            metrics = scrape(router.url)
            assert metrics[f"labkit_router_retries_total{{worker={urls[1]}}}"] <= 1  # the first try, at most
            assert metrics[f"labkit_router_ejections_total{{worker={urls[1]}}}"] == 1
            # a killed process with threads is reapable once all of them are gone: the watch's passes, by hand
            wait_for(lambda: (children.check_children(max_restarts=1), not zombie(killed))[1], "it is reaped")
            assert children.restarts[1] == 1
            wait_for(
                lambda: scrape(router.url)[f"labkit_router_readmissions_total{{worker={urls[1]}}}"] == 1,
                "the restarted replica is readmitted",
                limit_s=600.0,  # it loads the model again, on a machine that may be busy
            )
            assert {complete(router.url).headers[REPLICA_HEADER] for _ in range(2)} == set(urls)
            again = children.processes[1].pid
            os.kill(again, signal.SIGKILL)
            wait_for(lambda: zombie(again), "the child is dead again")
            wait_for(lambda: (children.check_children(max_restarts=1), not zombie(again))[1], "it is reaped again")
            assert children.given_up == {1} and children.restarts[1] == 1  # reported, not restarted past the bound
            assert complete(router.url).headers[REPLICA_HEADER] == urls[0]
    finally:
        children.stop()
    assert all(process.poll() is not None for process in children.processes)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["route"], "--replica URL"),
        (["route", "--replica", "http://127.0.0.1:1", "--", "--max-num-seqs", "2"], "need --start N"),
        (["route", "--start", "1", "--", "--port", "9"], "picks each replica's --port"),
        (["route", "--start", "1", "--model", "a", "--", "--model", "b"], "another model than the replicas' --model b"),
    ],
)
def test_a_command_line_mistake_is_one_message(argv, says, capsys):
    from labkit.cli import main

    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_the_command_starts_its_replicas_routes_and_stops_them(default_model):
    """``labkit route --start 1``: a ``labkit serve`` process of the default model behind it; SIGTERM stops it too.

    One replica: the command's wiring is what is proven here; starting and stopping two children is proven by
    ``test_a_killed_replica_is_ejected_reaped_restarted_and_readmitted`` (the same ``ReplicaProcesses``)."""
    dials = ["--max-num-seqs", "2", "--max-model-len", "512", "--num-gpu-blocks-override", "64"]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labkit.cli",
            "route",
            "--start",
            "1",
            "--port",
            "0",
            "--policy",
            "cache_aware",
            "--",
            *dials,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "LABKIT_PREPACK": "0"},
    )
    try:
        found = None
        for line in process.stderr:  # the command says where it listens once every replica is healthy
            found = re.search(r"over 1 replica \((\S+)\) on (http://127\.0\.0\.1:\d+)/v1", line)
            if found:
                break
        assert found, f"labkit route never said where it listens (exit code {process.poll()})"
        *replica_urls, url = found.groups()
        answer = chat(url, [{"role": "user", "content": "What is the capital of France?"}], max_tokens=8)
        assert answer.status_code == 200 and "Paris" in answer.json()["choices"][0]["message"]["content"]
        assert answer.headers[REPLICA_HEADER] in replica_urls
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) != 0
        for replica_url in replica_urls:  # the replicas it started are gone with it
            with pytest.raises(httpx.TransportError):
                httpx.get(replica_url + "/health", timeout=5.0)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
        process.stderr.close()
