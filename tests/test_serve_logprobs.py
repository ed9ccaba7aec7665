"""Logprobs, the logits processors (penalties, ``logit_bias``, ``min_tokens``), ``echo`` and half-closed clients.

Over real HTTP with the ``openai`` client and raw sockets, on the tiny random-weight model of
``test_serve`` (with the default model's tokenizer). The oracle is Hugging Face's own forward pass
(``model.hf``): a logprob must equal log_softmax of its logits, and a processed greedy answer must
equal a greedy loop over those logits with the processor written out here from its definition.
The first section tests the processors in the sampler directly.
"""

import json
import re
import socket
from dataclasses import replace

import httpx
import pytest
import torch
from lazy_import import lazy_module
from test_serve import CHAT, NUM_BLOCKS, TEXT, chat_model, make_llm, scrape, stream_events, wait_for

from labkit.engine import LLM
from labkit.models import tiny_model
from labkit.models.tokens import encode_prompt
from labkit.sampling import SamplingParams, filtered_probabilities, process_logits, token_logprob
from labkit.serve.server import ServerThread

openai = lazy_module("openai")  # on first use: collecting this file need not import the client

TOLERANCE = 1e-4


# --- the processors in the sampler --------------------------------------------------------------
def test_processors_follow_their_definitions():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    prompt, output = [0, 1], [3, 3, 2]

    def processed(**fields):
        return process_logits(logits, SamplingParams(max_tokens=8, **fields), prompt, output, stop_ids=[4])

    # frequency: minus the penalty per occurrence in the output; presence: once per token in it
    assert processed(frequency_penalty=0.5).tolist() == [2.0, -1.0, 0.0, 2.0, -2.0]
    assert processed(presence_penalty=0.5).tolist() == [2.0, -1.0, 0.0, 2.5, -2.0]
    # repetition (prompt and output): positive logits divided, negative multiplied; token 4 never seen
    assert processed(repetition_penalty=2.0).tolist() == [1.0, -2.0, 0.25, 1.5, -2.0]
    assert processed(logit_bias={1: 100.0, 3: -100.0}).tolist() == [2.0, 99.0, 0.5, -97.0, -2.0]
    # min_tokens: the stop ids are forbidden while the output is shorter
    assert processed(min_tokens=4)[4] == -torch.inf and processed(min_tokens=3)[4] == -2.0
    assert torch.equal(logits, torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0]))  # the input row is left alone


def test_min_p_drops_the_unlikely_and_keeps_the_likeliest():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = SamplingParams(temperature=1.0, min_p=0.4)
    kept = filtered_probabilities(logits, probs)
    assert kept[2] == kept[3] == 0 and torch.allclose(kept[:2], torch.tensor([0.625, 0.375]))
    assert filtered_probabilities(logits, replace(probs, min_p=1.0)).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_token_logprob_is_log_softmax_of_the_raw_row_with_the_top_n_sorted():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.0])
    entry = token_logprob(logits, 2, 3)
    expected = torch.log_softmax(logits, -1)
    assert entry.token_id == 2 and entry.logprob == pytest.approx(expected[2].item())
    assert [t for t, _ in entry.top] == [1, 2, 0]
    assert [lp for _, lp in entry.top] == pytest.approx(expected[[1, 2, 0]].tolist())
    assert token_logprob(logits, 2, 0).top == ()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"presence_penalty": 2.5}, "presence_penalty must be in"),
        ({"frequency_penalty": -3}, "frequency_penalty must be in"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0"),
        ({"logit_bias": {5: 101}}, "logit_bias values must be in"),
        ({"logit_bias": {-1: 1}}, "logit_bias keys must be token ids"),
        ({"min_tokens": 9}, "min_tokens must be in"),
        ({"logprobs": 21}, "logprobs must be in"),
        ({"min_p": 1.5}, "min_p must be in"),
    ],
)
def test_sampling_params_refuse_bad_extras(fields, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(max_tokens=8, **fields)


def test_the_default_path_samples_the_very_same_tensor():
    """No processor asked: the runner hands ``sample`` the logits as they came (so no token can change)."""
    llm = LLM(tiny_model("llama", seed=0), num_blocks=32, block_size=4, max_model_len=64)
    raw = torch.randn(2, 10)

    class Plain:
        params = SamplingParams()

    assert llm.runner._processed(raw, [Plain(), Plain()]) is raw


def test_a_processed_neighbour_changes_nothing_for_a_plain_request():
    model = tiny_model("llama", seed=0)
    llm = LLM(model, num_blocks=64, block_size=4, max_model_len=128)
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], plain, use_tqdm=False)[0].token_ids
    both = llm.generate(
        [[5, 6, 7], [5, 6, 7]], [plain, replace(plain, frequency_penalty=2.0, logprobs=2)], use_tqdm=False
    )
    assert both[0].token_ids == alone and both[0].logprobs is None
    assert len(both[1].logprobs) == 12


def test_speculation_with_logprobs_or_processors_is_refused_by_the_engine():
    llm = LLM(
        tiny_model("llama", seed=0),
        num_blocks=32,
        block_size=4,
        max_model_len=64,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    )
    for fields in ({"logprobs": 1}, {"presence_penalty": 1.0}, {"min_tokens": 2}):
        with pytest.raises(ValueError, match="cannot be combined with speculative_config"):
            llm.add_request([1, 2, 3], SamplingParams(max_tokens=4, **fields))
    llm.add_request([1, 2, 3], SamplingParams(max_tokens=4, min_p=0.1, temperature=1.0))  # a filter: fine


# --- over HTTP ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return chat_model()


@pytest.fixture(scope="module")
def server(model):
    llm = make_llm(model, max_num_seqs=8)
    with ServerThread(llm) as running:
        running.llm, running.name = llm, llm.describe()["model"]
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def hf_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """log_softmax of Hugging Face's logits at each position that chose an output token: [len(output), V]."""
    ids = torch.tensor([prompt_ids + output_ids[:-1]])
    with torch.no_grad():
        logits = model.hf(ids).logits[0, len(prompt_ids) - 1 :]
    return torch.log_softmax(logits.float(), dim=-1)


def offline(model, prompt, **fields):
    """The offline engine's answer (token ids) to the same prompt and params."""
    return make_llm(model).generate(prompt, SamplingParams(**fields), use_tqdm=False)[0].token_ids


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_are_log_softmax_of_the_models_logits(model, server, client, stream):
    fields = dict(model=server.name, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5)
    if stream:
        content = [
            entry
            for chunk in client.chat.completions.create(**fields, stream=True)
            if chunk.choices and chunk.choices[0].logprobs
            for entry in chunk.choices[0].logprobs.content
        ]
    else:
        content = client.chat.completions.create(**fields).choices[0].logprobs.content
    prompt_ids = encode_prompt(model.tokenizer, CHAT)
    output_ids = offline(model, CHAT, max_tokens=8)
    expected = hf_logprobs(model, prompt_ids, output_ids)
    assert len(content) == len(output_ids)
    for position, (entry, token) in enumerate(zip(content, output_ids)):
        assert entry.token == model.tokenizer.decode([token])
        assert abs(entry.logprob - expected[position, token].item()) < TOLERANCE
        top = entry.top_logprobs
        assert len(top) == 5 and [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token == entry.token and top[0].logprob == entry.logprob  # greedy: the chosen is the top-1
        best = expected[position].topk(5)
        assert [t.logprob for t in top] == pytest.approx(best.values.tolist(), abs=TOLERANCE)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token or "\ufffd" in entry.token


def test_sampled_logprobs_are_the_raw_models_not_the_temperatures(model, server, client):
    """vLLM's default: the logprob of the sampled token at temperature 1, whatever the request's temperature."""
    fields = dict(max_tokens=6, temperature=1.7, seed=3, top_p=0.95)
    answer = client.completions.create(model=server.name, prompt=TEXT, logprobs=0, **fields)
    output_ids = offline(model, TEXT, **fields)
    expected = hf_logprobs(model, encode_prompt(model.tokenizer, TEXT), output_ids)
    logprobs = answer.choices[0].logprobs
    assert logprobs.tokens == [model.tokenizer.decode([t]) for t in output_ids]
    for position, token in enumerate(output_ids):
        assert abs(logprobs.token_logprobs[position] - expected[position, token].item()) < TOLERANCE
        assert list(logprobs.top_logprobs[position]) == [logprobs.tokens[position]]  # logprobs 0: the chosen only


def test_completion_logprobs_have_openais_shape_whole_and_streamed(model, server, client):
    fields = dict(model=server.name, prompt=TEXT, max_tokens=8, temperature=0, logprobs=3)
    whole = client.completions.create(**fields).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**fields, stream=True) if c.choices]
    streamed = {key: [v for c in chunks if c.logprobs for v in getattr(c.logprobs, key)] for key in ("tokens",)}
    logprobs = whole.logprobs
    assert streamed["tokens"] == logprobs.tokens and len(logprobs.tokens) == 8
    assert [v for c in chunks if c.logprobs for v in c.logprobs.text_offset] == logprobs.text_offset
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(8)]
    assert logprobs.text_offset == offsets and "".join(logprobs.tokens) == whole.text
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(top) == 3 and top[token] == logprob == max(top.values())  # greedy: the chosen is in the top 3


def test_logprob_fields_are_checked(server, client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs must be an integer from 0 to 20"):
        client.chat.completions.create(model=server.name, messages=CHAT, logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs: true"):
        client.chat.completions.create(model=server.name, messages=CHAT, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="logprobs must be an integer"):
        client.completions.create(model=server.name, prompt=TEXT, extra_body={"logprobs": True})
    plain = client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=2, logprobs=False)
    assert plain.choices[0].logprobs is None


# --- the processors over HTTP: each one's answer equals a greedy loop with its definition ------------
def reference_greedy(model, prompt_ids: list[int], max_tokens: int, adjust) -> list[int]:
    """Greedy decoding over Hugging Face's logits, each row adjusted by ``adjust(row, output)`` first."""
    output: list[int] = []
    for _ in range(max_tokens):
        with torch.no_grad():
            row = model.hf(torch.tensor([prompt_ids + output])).logits[0, -1].float()
        output.append(int(adjust(row, output).argmax()))
    return output


def frequency(penalty):
    return lambda row, out: row - penalty * torch.bincount(torch.tensor(out, dtype=torch.long), minlength=len(row))


def presence(penalty):
    return lambda row, out: row - penalty * torch.isin(torch.arange(len(row)), torch.tensor(out, dtype=torch.long))


def repetition(penalty, prompt_ids):
    def adjust(row, out):
        row = row.clone()
        for token in set(prompt_ids + out):
            row[token] = row[token] / penalty if row[token] > 0 else row[token] * penalty
        return row

    return adjust


LOOP = {"42": 14.0}  # a bias that makes the tiny model say token 42 again and again (20 times in 24)


def biased(adjust):
    """Add LOOP's bias first, as vLLM does (logit_bias and min_tokens before the penalties)."""

    def both(row, out):
        row = row.clone()
        row[42] += 14.0
        return adjust(row, out)

    return both


def test_each_penalty_answers_as_its_definition_says(model, server, client):
    prompt_ids = encode_prompt(model.tokenizer, TEXT)
    body = dict(model=server.name, prompt=TEXT, max_tokens=24, temperature=0, logit_bias=LOOP)
    looped = client.completions.create(**body, extra_body={"ignore_eos": True}).choices[0].text
    plain = reference_greedy(model, prompt_ids, 24, biased(lambda row, out: row))
    assert looped == model.tokenizer.decode(plain, skip_special_tokens=True) and plain.count(42) > 12
    cases = {
        "frequency_penalty": (2.0, frequency(2.0)),
        "presence_penalty": (2.0, presence(2.0)),
        "repetition_penalty": (1.3, repetition(1.3, prompt_ids)),
    }
    for name, (value, adjust) in cases.items():
        answer = client.completions.create(**body, extra_body={"ignore_eos": True, name: value}).choices[0].text
        expected = reference_greedy(model, prompt_ids, 24, biased(adjust))
        assert answer == model.tokenizer.decode(expected, skip_special_tokens=True), name
        assert expected.count(42) < plain.count(42), name  # each one breaks the loop, some more than others
    assert reference_greedy(model, prompt_ids, 24, biased(frequency(2.0))).count(42) <= 4  # per use: the most


def test_logit_bias_bans_and_forces(model, server, client):
    plain = offline(model, TEXT, max_tokens=8, ignore_eos=True)
    body = dict(model=server.name, prompt=TEXT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    banned = client.completions.create(**body, logit_bias={str(plain[0]): -100}, logprobs=0).choices[0]
    ids = model.tokenizer.encode(banned.text, add_special_tokens=False)
    assert banned.logprobs.tokens[0] != model.tokenizer.decode([plain[0]]) and plain[0] not in ids
    forced = client.completions.create(**body, logit_bias={"42": 100}).choices[0]
    assert forced.text == model.tokenizer.decode([42] * 8)
    with pytest.raises(openai.BadRequestError, match="vocabulary has"):
        client.completions.create(**body, logit_bias={str(len(model.tokenizer) + 5): 1})
    with pytest.raises(openai.BadRequestError, match="logit_bias values must be numbers from -100 to 100"):
        client.completions.create(**body, logit_bias={"42": 101})


def test_min_tokens_keeps_the_end_away(model, server, client):
    """A bias on end-of-text makes the greedy answer end at once (with ignore_eos off); min_tokens holds it off."""
    eos = model.tokenizer.eos_token_id
    body = dict(model=server.name, prompt=TEXT, max_tokens=12, temperature=0, logit_bias={str(eos): 30})
    early = client.completions.create(**body)
    assert early.choices[0].finish_reason == "stop" and early.usage.completion_tokens == 1
    held = client.completions.create(**body, extra_body={"min_tokens": 5})
    assert held.choices[0].finish_reason == "stop" and held.usage.completion_tokens == 6  # EOS comes right after
    with pytest.raises(openai.BadRequestError, match="min_tokens .* must not be above max_tokens"):
        client.completions.create(**body, extra_body={"min_tokens": 13})


def test_stop_token_ids_and_ignore_eos_reach_the_engine(model, server, client):
    eos = model.tokenizer.eos_token_id
    body = dict(model=server.name, prompt=TEXT, max_tokens=6, temperature=0, logit_bias={str(eos): 30})
    assert client.completions.create(**body, extra_body={"ignore_eos": True}).usage.completion_tokens == 6
    plain = offline(model, TEXT, max_tokens=6, ignore_eos=True)
    stopped = client.completions.create(**{**body, "logit_bias": None}, extra_body={"stop_token_ids": [plain[1]]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].stop_reason == plain[1]


# --- echo ------------------------------------------------------------------------------------------
def test_echo_puts_the_prompt_first(model, server, client):
    body = dict(model=server.name, max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(prompt=TEXT, **body).choices[0].text
    assert client.completions.create(prompt=TEXT, echo=True, **body).choices[0].text == TEXT + plain
    chunks = [c.choices[0].text for c in client.completions.create(prompt=TEXT, echo=True, stream=True, **body)]
    assert chunks[0].startswith(TEXT) and "".join(chunks) == TEXT + plain
    ids = model.tokenizer.encode(TEXT, add_special_tokens=False)
    echoed = client.completions.create(prompt=ids, echo=True, **body).choices[0].text
    assert echoed == model.tokenizer.decode(ids) + plain
    with pytest.raises(openai.BadRequestError, match="echo with logprobs is not supported"):
        client.completions.create(prompt=TEXT, echo=True, logprobs=1, **body)
    with pytest.raises(openai.BadRequestError, match="echo is not supported on chat"):
        client.chat.completions.create(model=server.name, messages=CHAT, extra_body={"echo": True})


def test_what_labkit_does_not_do_is_still_refused_and_says_why(server, client):
    refusals = [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "does not call tools"),
        ({"response_format": {"type": "json_object"}}, "no guided decoding"),
        ({"extra_body": {"best_of": 2}}, "no best_of, no beam search"),
        ({"extra_body": {"use_beam_search": True}}, "has no beam search"),
    ]
    for fields, why in refusals:
        with pytest.raises(openai.BadRequestError, match=why):
            client.chat.completions.create(model=server.name, messages=CHAT, max_tokens=2, **fields)


# --- a client that half-closes its socket still gets its answer ---------------------------------
def half_closed_request(server, body: dict) -> bytes:
    """Send one whole request, shutdown(SHUT_WR), and read everything until the server closes.

    Without the interim ``100 Continue`` lines that probe whether the client is still there (see
    :meth:`~labkit.serve.guard.GuardedH11Protocol._probe`): HTTP/1.1 clients skip them."""
    host, port = server.socket.getsockname()[:2]
    data = json.dumps(body).encode()
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return re.sub(rb"^(HTTP/1.1 100 Continue\r\n\r\n)*", b"", received)


def test_a_client_that_half_closes_after_its_request_gets_its_answer(model, server, client):
    body = {"model": server.name, "prompt": TEXT, "max_tokens": 6, "temperature": 0}
    expected = client.completions.create(**body).choices[0].text
    head, _, answer = half_closed_request(server, body).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and json.loads(answer)["choices"][0]["text"] == expected
    head, _, events = half_closed_request(server, {**body, "stream": True}).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in events
    assert httpx.get(server.url + "/health").status_code == 200
    assert not server.llm.has_unfinished()


def test_a_streamed_client_that_closes_is_still_aborted(model):
    """A full close looks like a half-close until the server writes: the next tokens find the client gone."""
    llm = make_llm(model)
    with ServerThread(llm) as server:
        body = {"model": llm.describe()["model"], "prompt": TEXT, "max_tokens": 1500, "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "ignore_eos": True}) as response:
            next(stream_events(response))
        wait_for(lambda: not llm.has_unfinished(), "the engine dropped the request")
        assert llm.state.blocks.num_free_blocks == NUM_BLOCKS
        assert scrape(server.url)["vllm:generation_tokens_total"] < 1500
