"""``labkit serve`` over real HTTP on loopback, with the real ``openai`` client.

The model is the tiny random-weight Llama with the default model's tokenizer, so every
request runs in milliseconds yet goes through real tokenization, the chat template,
detokenization and the whole engine. Each server here is started and stopped by its fixture
or test. Nothing asserts a duration: where the server has to catch up (an abort, a gauge),
the test waits for the state it expects, with a generous bound only against a hang.
"""

import asyncio
import json
import threading
import time

import httpx
import pytest
from lazy_import import lazy_module
from prometheus_client.parser import text_string_to_metric_families

from labkit.engine import LLM
from labkit.engine.scheduler import ChunkedPrefill
from labkit.kv.paged_attention import paged_attention
from labkit.models import default_model, tiny_model
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams
from labkit.serve.server import ServerThread

openai = lazy_module("openai")  # on first use: collecting this file need not import the client

NUM_BLOCKS, MAX_MODEL_LEN = 512, 2048
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
TEXT = "The three primary colours are"


class BatchWatcher(ChunkedPrefill):
    """The default policy, remembering the largest batch it ever scheduled (proof of batching)."""

    max_batch = 0

    def schedule(self, state):
        output = super().schedule(state)
        self.max_batch = max(self.max_batch, len(output.scheduled))
        return output


def chat_model():
    """The tiny model, made to speak through the default model's tokenizer and chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model.ensure_converted(progress=False))
    model = tiny_model(
        "llama",
        seed=0,
        vocab_size=len(tokenizer),
        max_position_embeddings=MAX_MODEL_LEN,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.tokenizer = tokenizer
    return model


def slow_attention(*args, **kwargs):
    """Paged attention that dawdles, so a long answer stays in flight while a test looks at it."""
    time.sleep(0.005)
    return paged_attention(*args, **kwargs)


def make_llm(model, **dials) -> LLM:
    return LLM(model, num_blocks=NUM_BLOCKS, block_size=16, max_model_len=MAX_MODEL_LEN, **dials)


@pytest.fixture(scope="module")
def model():
    return chat_model()


@pytest.fixture(scope="module")
def server(model):
    llm = make_llm(model, max_num_seqs=16, policy=BatchWatcher())
    with ServerThread(llm) as running:
        running.llm, running.name = llm, llm.describe()["model"]
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def expected_text(model, prompt, max_tokens: int) -> str:
    """What the offline engine says to the same prompt, greedily."""
    return make_llm(model).generate(prompt, SamplingParams(max_tokens=max_tokens), use_tqdm=False)[0].text


def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics, parsed by prometheus_client, by name and labels."""
    samples = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("model_name", "engine"))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return samples


def wait_for(condition, what: str, limit_s: float = 60.0):
    """Poll until ``condition()`` holds; the limit only stops a hang, it is not a timing claim."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def stream_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


# --- answers -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_says_what_the_engine_says_offline(model, server, client, stream):
    expected = expected_text(model, CHAT, 12)
    answer = client.chat.completions.create(
        model=server.name,
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        stream=stream,
        stream_options={"include_usage": True} if stream else None,
    )
    if stream:
        chunks = list(answer)
        assert chunks[0].choices[0].delta.role == "assistant"
        pieces = [c.choices[0].delta.content for c in chunks if c.choices]
        text, reason, usage = "".join(pieces), chunks[-2].choices[0].finish_reason, chunks[-1].usage
        assert len(pieces) == usage.completion_tokens  # one event per token, so clients can time each
    else:
        text, reason, usage = answer.choices[0].message.content, answer.choices[0].finish_reason, answer.usage
    assert text == expected
    assert reason == "length" and usage.completion_tokens == 12
    assert usage.prompt_tokens == len(encode_prompt(model.tokenizer, CHAT))
    assert usage.total_tokens == usage.prompt_tokens + 12


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_take_text_or_token_ids(model, server, client, stream):
    expected = expected_text(model, TEXT, 10)
    ids = model.tokenizer.encode(TEXT)
    for prompt in (TEXT, ids):
        answer = client.completions.create(
            model=server.name, prompt=prompt, max_tokens=10, temperature=0, stream=stream
        )
        text = "".join(c.choices[0].text for c in answer) if stream else answer.choices[0].text
        assert text == expected
    assert expected_text(model, TEXT + " red", 10) != expected  # the comparison can tell answers apart


def test_stop_strings_end_the_answer_before_them(model, server, client):
    full = expected_text(model, TEXT, 24)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    whole = client.completions.create(model=server.name, prompt=TEXT, max_tokens=24, temperature=0, stop=[stop])
    streamed = client.completions.create(
        model=server.name, prompt=TEXT, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert whole.choices[0].text == full[: full.index(stop)]
    assert whole.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in streamed) == full[: full.index(stop)]
    unmatched = client.completions.create(
        model=server.name, prompt=TEXT, max_tokens=24, temperature=0, stop=["\u2603 never \u2603"]
    )
    assert unmatched.choices[0].text == full and unmatched.choices[0].finish_reason == "length"


def test_a_seed_fixes_the_sample(server, client):
    def sample(seed):
        return (
            client.completions.create(
                model=server.name, prompt=TEXT, max_tokens=16, temperature=1.0, top_p=0.9, seed=seed
            )
            .choices[0]
            .text
        )

    assert sample(5) == sample(5)
    assert sample(5) != sample(6)


def test_sixteen_concurrent_streams_are_batched_and_all_complete(server):
    async def one(client, i):
        stream = await client.chat.completions.create(
            model=server.name,
            messages=[{"role": "user", "content": f"Question number {i}?"}],
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [chunk async for chunk in stream]
        return sum(1 for c in chunks if c.choices), chunks[-1].usage

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, i) for i in range(16)))

    results = asyncio.run(all_of_them())
    assert [(events, usage.completion_tokens) for events, usage in results] == [(24, 24)] * 16
    assert server.llm.policy.max_batch > 1  # the clients shared steps: continuous batching across connections


# --- hanging up, and shutting down ---------------------------------------------------------
def test_a_client_that_hangs_up_mid_stream_frees_its_blocks(model):
    llm = make_llm(model, attention=slow_attention)
    with ServerThread(llm) as server:
        body = {
            "model": llm.describe()["model"],
            "prompt": TEXT,
            "max_tokens": 1500,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
            events = stream_events(response)
            for _ in range(3):
                next(events)
            assert scrape(server.url)["vllm:kv_cache_usage_perc"] > 0
        # the connection is closed: the request must be aborted long before its 1500 tokens
        wait_for(lambda: not llm.has_unfinished(), "the engine dropped the request")
        assert llm.state.blocks.num_free_blocks == NUM_BLOCKS
        wait_for(lambda: scrape(server.url)["vllm:kv_cache_usage_perc"] == 0.0, "/metrics shows the cache empty")
        after = scrape(server.url)
        assert after["vllm:num_requests_running"] == 0
        assert after["vllm:request_success_total{finished_reason=abort}"] == 1
        assert after["vllm:request_success_total{finished_reason=length}"] == 0
        assert after["vllm:generation_tokens_total"] < 1500


def test_graceful_shutdown_aborts_what_is_in_flight_and_frees_everything(model):
    llm = make_llm(model, attention=slow_attention)
    server = ServerThread(llm, shutdown_timeout=0.2).start()
    body = {"model": llm.describe()["model"], "prompt": TEXT, "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        events = stream_events(response)  # kept: a dropped generator would close the connection
        next(events)
        server.stop()
        assert not server._thread.is_alive()
    assert not llm.has_unfinished() and llm.state.blocks.num_free_blocks == NUM_BLOCKS
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


# --- bad requests --------------------------------------------------------------------------
def hostile_requests(name: str):
    """(what, method, path, body bytes or JSON, expected status): each must be refused, none may hurt."""
    good = {"model": name, "messages": CHAT, "max_tokens": 4}
    return [
        ("not JSON", "POST", "/v1/chat/completions", b"{bad", 400),
        ("JSON but not an object", "POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("nested 100,000 deep", "POST", "/v1/chat/completions", b"[" * 100_000, 400),
        ("10 MB body", "POST", "/v1/chat/completions", b'{"x": "' + b"a" * 10_000_000 + b'"}', 413),
        ("no messages", "POST", "/v1/chat/completions", {"model": name}, 400),
        ("empty messages", "POST", "/v1/chat/completions", {**good, "messages": []}, 400),
        ("unknown role", "POST", "/v1/chat/completions", {**good, "messages": [{"role": "god", "content": "x"}]}, 400),
        (
            "content not text",
            "POST",
            "/v1/chat/completions",
            {**good, "messages": [{"role": "user", "content": 7}]},
            400,
        ),
        ("unknown model", "POST", "/v1/chat/completions", {**good, "model": "gpt-9"}, 404),
        ("max_tokens 0", "POST", "/v1/chat/completions", {**good, "max_tokens": 0}, 400),
        ("max_tokens huge", "POST", "/v1/chat/completions", {**good, "max_tokens": 10**12}, 400),
        ("max_tokens a string", "POST", "/v1/chat/completions", {**good, "max_tokens": "ten"}, 400),
        ("negative temperature", "POST", "/v1/chat/completions", {**good, "temperature": -1}, 400),
        (
            "NaN temperature",
            "POST",
            "/v1/chat/completions",
            json.dumps({**good, "temperature": float("nan")}).encode(),
            400,
        ),
        ("top_p 0", "POST", "/v1/chat/completions", {**good, "top_p": 0}, 400),
        ("top_p above 1", "POST", "/v1/chat/completions", {**good, "top_p": 1.5}, 400),
        ("seed past 64 bits", "POST", "/v1/chat/completions", {**good, "seed": 2**70}, 400),
        ("n 2", "POST", "/v1/chat/completions", {**good, "n": 2}, 400),
        ("five stop strings", "POST", "/v1/chat/completions", {**good, "stop": list("abcde")}, 400),
        (
            "stream_options without stream",
            "POST",
            "/v1/chat/completions",
            {**good, "stream_options": {"include_usage": True}},
            400,
        ),
        (
            "prompt over max_model_len",
            "POST",
            "/v1/completions",
            {"model": name, "prompt": [5] * (MAX_MODEL_LEN + 10), "max_tokens": 1},
            400,
        ),
        (
            "token id outside the vocabulary",
            "POST",
            "/v1/completions",
            {"model": name, "prompt": [10**9], "max_tokens": 1},
            400,
        ),
        ("wrong method", "GET", "/v1/chat/completions", None, 405),
        ("unknown path", "POST", "/v1/embeddings", {"model": name, "input": "x"}, 404),
    ]


def test_hostile_requests_get_4xx_in_openai_shape_and_the_server_answers_the_next(server, client):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for what, method, path, body, status in hostile_requests(server.name):
            content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            response = http.request(method, path, content=content, headers={"Content-Type": "application/json"})
            assert response.status_code == status, f"{what}: {response.status_code} {response.text[:300]}"
            error = response.json()["error"]
            assert isinstance(error["message"], str) and error["message"] and "type" in error, what
        assert http.get("/health").status_code == 200
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=0)
    good = client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=4)
    assert good.usage.completion_tokens >= 1


def test_an_api_key_guards_the_v1_routes_only(model):
    with ServerThread(make_llm(model), api_key="s3cret") as server:
        name = server.worker.llm.describe()["model"]
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        missing = httpx.post(server.url + "/v1/completions", json={"model": name, "prompt": TEXT})
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        right = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in right.models.list()] == [name]
        assert right.completions.create(model=name, prompt=TEXT, max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 200


def test_a_full_waiting_queue_answers_503_with_retry_after(model):
    llm = make_llm(model, max_num_seqs=1, attention=slow_attention)
    with ServerThread(llm, max_waiting=1) as server:
        body = {
            "model": llm.describe()["model"],
            "prompt": TEXT,
            "max_tokens": 1500,
            "stream": True,
            "ignore_eos": True,
        }
        with (
            httpx.Client(base_url=server.url, timeout=60) as first,
            httpx.Client(base_url=server.url, timeout=60) as second,
        ):
            with first.stream("POST", "/v1/completions", json=body) as running:
                events = stream_events(running)  # kept: a dropped generator would close the connection
                next(events)  # it holds the only batch slot
                with second.stream("POST", "/v1/completions", json=body) as waiting:
                    assert waiting.status_code == 200  # accepted: it waits for the slot
                    refused = httpx.post(server.url + "/v1/completions", json=body)
                    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
                    assert refused.json()["error"]["code"] == "queue_full"
        wait_for(lambda: not llm.has_unfinished(), "both streams were aborted")
        assert (
            httpx.post(server.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2}).status_code
            == 200
        )


# --- /metrics --------------------------------------------------------------------------------
def test_metrics_have_vllm_names_and_buckets_and_count_what_was_served(server, client):
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    kinds = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
    }
    assert {name: families[name].type for name in kinds} == kinds

    def edges(name):
        return [float(s.labels["le"]) for s in families[name].samples if s.name.endswith("_bucket")][:-1]

    ttft, itl, e2e = (
        edges(f"vllm:{n}")
        for n in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")
    )
    assert (len(ttft), ttft[0], ttft[-1]) == (22, 0.001, 2560.0)  # vLLM's edges
    assert (len(itl), itl[0], itl[-1]) == (19, 0.01, 80.0)
    assert (len(e2e), e2e[0], e2e[-1]) == (21, 0.3, 7680.0) and edges("vllm:request_queue_time_seconds") == e2e

    before = scrape(server.url)
    answers = [
        client.chat.completions.create(
            model=server.name, messages=CHAT, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}
        )
        for n in (3, 7)
    ]
    streamed = list(
        client.completions.create(
            model=server.name,
            prompt=TEXT,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usages = [a.usage for a in answers] + [streamed[-1].usage]
    wait_for(
        lambda: (
            scrape(server.url)["vllm:e2e_request_latency_seconds_count"]
            == before["vllm:e2e_request_latency_seconds_count"] + 3
        ),
        "three requests finished",
    )
    after = scrape(server.url)

    def delta(name):
        return after[name] - before.get(name, 0.0)

    assert delta("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages) == 15
    assert delta("vllm:request_success_total{finished_reason=length}") == 3
    assert delta("vllm:request_success_total{finished_reason=abort}") == 0
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:request_queue_time_seconds_count") == 3
    assert delta("vllm:inter_token_latency_seconds_count") == 15 - 3  # one gap per token after the first
    assert delta("vllm:num_preemptions_total") == 0


# --- prefix caching ------------------------------------------------------------------------
LONG_SYSTEM = "You answer questions about colours, briefly and kindly, in plain words. " * 6


def shared_prefix_chats(model):
    """Two chats with one long system prompt, their token ids, and the tokens the second can find cached."""
    chats = [
        [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}]
        for question in ("Name a colour.", "Which colour is the sky?")
    ]
    ids = [encode_prompt(model.tokenizer, chat) for chat in chats]
    common = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    block_size = 16
    reusable = min(common, len(ids[1]) - 1) // block_size * block_size  # whole blocks, never the last token
    return chats, ids, reusable


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_prefix_cache_counters_count_the_prompt_tokens_found_cached(model, caching):
    chats, ids, reusable = shared_prefix_chats(model)
    assert reusable >= 64, "the test needs a shared prefix of several blocks"
    llm = make_llm(model, enable_prefix_caching=caching)
    with ServerThread(llm) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        texts = []
        for chat in chats:  # one after the other: the second finds what the first left in the cache
            answer = client.chat.completions.create(
                model=llm.describe()["model"],
                messages=chat,
                max_tokens=4,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            texts.append(answer.choices[0].message.content)
        wait_for(lambda: scrape(server.url)["vllm:request_success_total{finished_reason=length}"] == 2, "both done")
        after = scrape(server.url)
    if caching:
        assert after["vllm:prefix_cache_queries_total"] == len(ids[0]) + len(ids[1])
        assert after["vllm:prefix_cache_hits_total"] == reusable
    else:
        assert after["vllm:prefix_cache_queries_total"] == after["vllm:prefix_cache_hits_total"] == 0
    assert after["vllm:prompt_tokens_total"] == len(ids[0]) + len(ids[1])  # a hit is still a prompt token
    assert texts == [expected_text(model, chat, 4) for chat in chats]  # the cache changes no token


# --- speculative decoding ----------------------------------------------------------------------
def test_speculation_counters_are_the_engines_own_and_only_shown_when_it_is_on(model, server):
    assert not any(name.startswith("vllm:spec_decode") for name in scrape(server.url))  # off: absent, as in vLLM
    # the model drafts for itself: every draft is accepted, so the counters have something to count
    config = {"method": "draft_model", "model": model, "num_speculative_tokens": 3}
    prompt, params = [5, 6, 7, 8, 9] * 4, SamplingParams(max_tokens=24, ignore_eos=True)
    offline = make_llm(model, speculative_config=config)
    alone = offline.generate([prompt], params, use_tqdm=False)[0]
    steps = offline.trace.steps
    llm = make_llm(model, speculative_config=config)
    with ServerThread(llm) as served:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(
            model=llm.describe()["model"], prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
        )
        wait_for(lambda: scrape(served.url)["vllm:request_success_total{finished_reason=length}"] == 1, "done")
        after = scrape(served.url)
    assert answer.choices[0].text == alone.text  # speculation changes no token
    drafts = sum(s.num_drafts for s in steps)
    draft_tokens = sum(s.num_draft_tokens for s in steps)
    accepted = sum(s.num_accepted_tokens for s in steps)
    assert 0 < drafts < 24 and accepted > 0
    assert after["vllm:spec_decode_num_drafts_total"] == drafts
    assert after["vllm:spec_decode_num_draft_tokens_total"] == draft_tokens
    assert after["vllm:spec_decode_num_accepted_tokens_total"] == accepted <= draft_tokens
    assert after["vllm:generation_tokens_total"] == 24


# --- fields honoured or refused ------------------------------------------------------------
def test_what_labkit_cannot_do_is_refused_by_name_and_what_it_can_is_honoured(model, server, client):
    tool = {"type": "function", "function": {"name": "refund", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="tools is not supported"):
        client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=4, tools=[tool])
    with pytest.raises(openai.BadRequestError, match="response_format is not supported"):
        client.chat.completions.create(
            model=server.name, messages=CHAT, max_tokens=4, response_format={"type": "json_object"}
        )
    # A completion without max_tokens gets vLLM's 16 tokens, not the rest of the context.
    short = client.completions.create(model=server.name, prompt=TEXT, temperature=0, extra_body={"ignore_eos": True})
    assert short.usage.completion_tokens == 16
    # stop_token_ids (vLLM's extension) end the answer at the first listed token the model picks.
    ids = make_llm(model).generate(TEXT, SamplingParams(max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    stop_at = ids.outputs[0].token_ids[3]
    first = ids.outputs[0].token_ids.index(stop_at)
    stopped = client.completions.create(
        model=server.name, prompt=TEXT, max_tokens=8, temperature=0, extra_body={"stop_token_ids": [stop_at]}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == first + 1
    developer = [{"role": "developer", "content": "You are terse."}, CHAT[1]]
    said = client.chat.completions.create(model=server.name, messages=developer, max_tokens=6, temperature=0)
    assert said.choices[0].message.content == expected_text(model, CHAT, 6)


def test_only_json_bodies_are_read_so_a_web_page_cannot_drive_the_server(server):
    body = json.dumps({"model": server.name, "messages": CHAT, "max_tokens": 2}).encode()
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {"Content-Type": content_type} if content_type else {}
            response = http.post("/v1/chat/completions", content=body, headers=headers)
            assert response.status_code == 415, (content_type, response.text)
            assert "Content-Type: application/json" in response.json()["error"]["message"]
        fine = http.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
        )
        assert fine.status_code == 200


def test_a_prompt_stuck_in_the_tokenizer_does_not_stall_other_clients(model, monkeypatch):
    """Tokenizing runs off the event loop: while one request's tokenizer is held (as a multi-MB prompt
    would hold it), a request of token ids is answered. The wait bound only stops a hang."""
    import labkit.serve.app as app_module

    held, release = threading.Event(), threading.Event()
    real_encode = app_module.encode_prompt

    def slow_encode(tokenizer, prompt):
        held.set()
        release.wait(120)
        return real_encode(tokenizer, prompt)

    monkeypatch.setattr(app_module, "encode_prompt", slow_encode)
    with ServerThread(make_llm(model)) as running:
        name = running.worker.llm.describe()["model"]
        with (
            httpx.Client(base_url=running.url, timeout=120) as first,
            httpx.Client(base_url=running.url, timeout=60) as second,
        ):
            stuck = threading.Thread(
                target=first.post,
                args=("/v1/chat/completions",),
                kwargs={"json": {"model": name, "messages": CHAT, "max_tokens": 2}},
            )
            stuck.start()
            assert held.wait(60), "the first request never reached the tokenizer"
            answer = second.post("/v1/completions", json={"model": name, "prompt": [5, 6, 7], "max_tokens": 3})
            release.set()
            stuck.join(120)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1
