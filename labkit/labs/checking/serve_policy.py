"""Lab 9's policy check: the learner's scheduler as the policy of a real ``labkit serve``, over HTTP.

Six clients stream greedy completions from a server whose engine runs the learner's
``continuous_schedule``; they arrive a little apart, so later ones must join a batch already
running. The run half (in the notebook's kernel) returns what the clients read, what the policy
decided at every step, and the KV blocks still held once every answer is over; the oracle decodes
each prompt alone with the same model, so the text a client reads must be the text the model says
alone (up to a near-tie, where two tokens are too close for batched arithmetic to be bound by).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from labkit.engine import LLM
from labkit.engine.reference import NEAR_TIE, solo_greedy
from labkit.engine.scheduler import policy_from_function
from labkit.labs.checking.engine_runs import ObservedPolicy
from labkit.labs.checking.learner_errors import noting_errors
from labkit.labs.checking.shared import course_model
from labkit.models.tokens import encode_prompt
from labkit.serve.server import ServerThread

CLIENTS = (
    ("The capital of France is", 10),
    ("Once upon a time,", 16),
    ("Water boils at", 6),
    ("The three primary colours are", 12),
    ("My favourite fruit is", 8),
    ("In the morning I", 14),
)
SERVER_DIALS = dict(max_num_seqs=4, num_blocks=64, block_size=16, max_model_len=256)
ARRIVAL_GAP_S = 0.05  # client i sends its request i * ARRIVAL_GAP_S after the first
CLIENT_TIMEOUT_S = 120.0  # only against a hang (a policy that never admits anyone)


def policy_inputs(seed: int) -> dict[str, Any]:
    return {"clients": [list(client) for client in CLIENTS], "dials": SERVER_DIALS}


def stream_completion(url: str, prompt: str, max_tokens: int, delay_s: float) -> dict[str, Any]:
    """One client: wait, then stream a greedy completion; the text it read, or the error it got."""
    time.sleep(delay_s)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    text, error = [], None
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=CLIENT_TIMEOUT_S) as response:
            if response.status_code != 200:
                return {"text": None, "error": f"HTTP {response.status_code}: {response.read().decode()[:300]}"}
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    error = event["error"]["message"]
                    break
                text.append(event["choices"][0]["text"])
    except httpx.HTTPError as err:
        error = f"{type(err).__name__}: {err}"
    return {"text": None if error else "".join(text), "error": error}


def serve_clients(schedule, inputs: dict[str, Any]) -> dict[str, Any]:
    """The run half: the learner's policy behind a server on a free loopback port, six clients against it."""
    noted, raised = noting_errors(schedule)
    policy = ObservedPolicy(policy_from_function(noted))
    llm = LLM(course_model(), policy=policy, **inputs["dials"])
    answers: list[dict[str, Any] | None] = [None] * len(inputs["clients"])

    def client(index: int, prompt: str, max_tokens: int) -> None:
        answers[index] = stream_completion(server.url, prompt, max_tokens, index * ARRIVAL_GAP_S)

    with ServerThread(llm) as server:
        threads = [threading.Thread(target=client, args=(i, *c)) for i, c in enumerate(inputs["clients"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        server.worker.stop()  # the loop ends: nothing more can touch the engine while we count its blocks
    if (server.worker.error or "").startswith("NotImplementedError"):
        raise NotImplementedError  # the exercise cell as handed out: "not done", not a failure
    return {
        "answers": answers,
        "decisions": list(policy.decisions),
        "blocks_used_at_end": llm.state.blocks.num_used_blocks,
        "raised": raised[:1],
    }


def policy_oracle(inputs: dict[str, Any]) -> dict[str, Any]:
    """Each prompt decoded alone: the whole text, and the text up to its first near-tie (if any)."""
    model = course_model()
    expected = []
    for prompt, max_tokens in inputs["clients"]:
        run = solo_greedy(model, encode_prompt(model.tokenizer, prompt), max_tokens, ignore_eos=True)
        ties = [i for i, gap in enumerate(run.gaps) if gap < NEAR_TIE]
        settled = run.tokens[: ties[0]] if ties else run.tokens
        expected.append(
            {
                "text": model.tokenizer.decode(run.tokens, skip_special_tokens=True),
                "settled": model.tokenizer.decode(settled, skip_special_tokens=True),
                "near_tie": bool(ties),
            }
        )
    return {"answers": expected}


def joined_mid_run(decisions: list[dict[str, Any]]) -> bool:
    """Whether some step took a newcomer's prompt while another request was already decoding."""
    return any(d["prefill"] and len(d["scheduled"]) > len(d["prefill"]) for d in decisions)
