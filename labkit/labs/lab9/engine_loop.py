"""A server's engine loop driven turn by turn with scripted clients (lab 9), and the learner's policy behind a real
``labkit serve``.

In ``labkit serve`` one thread owns the engine; the HTTP handlers only put commands in its inbox and wait for what
it sends them. The check plays the HTTP side: clients arrive at scripted turns (two at the first), one hangs up
mid-answer and one the moment it arrives (its add and its abort in one inbox, so their order decides whether it
runs), and every turn is recorded. The tiny model on a ticking clock makes every run the same.
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
from labkit.labs.common.engine_runs import ObservedPolicy, TickClock
from labkit.labs.common.learner_errors import noting_errors
from labkit.labs.common.shared import course_model, rng, small_model
from labkit.models.tokens import encode_prompt
from labkit.sampling_params import SamplingParams
from labkit.serve.server import ServerThread

MAX_TURNS = 200  # a loop that needs more is not making progress
LOOP_DIALS = dict(max_num_seqs=8, num_blocks=96, block_size=4, max_model_len=256, enable_prefix_caching=False)


def client_script(seed: int) -> list[dict[str, Any]]:
    """Seven clients: their prompt, answer length, the turn each arrives at, the one that hangs up mid-answer
    and the one that hangs up the moment it arrives (the last)."""
    r = rng(seed)
    arrivals = sorted([0, 0] + [r.randint(1, 8) for _ in range(4)])
    clients = [
        {
            "request_id": f"client{i}",
            "prompt_ids": [r.randint(2, 255) for _ in range(r.randint(3, 12))],
            "max_tokens": r.randint(5, 12),
            "arrives": turn,
            "hangs_up": None,
        }
        for i, turn in enumerate(arrivals)
    ]
    quitter = clients[r.randint(0, 3)]
    quitter["max_tokens"] = 12
    quitter["hangs_up"] = quitter["arrives"] + r.randint(2, 4)  # after a few tokens, long before its answer ends
    at_once = r.randint(1, 6)  # its add and its abort reach the inbox in the same turn
    clients.append(
        {
            "request_id": f"client{len(clients)}",
            "prompt_ids": [r.randint(2, 255) for _ in range(r.randint(3, 12))],
            "max_tokens": 12,
            "arrives": at_once,
            "hangs_up": at_once,
        }
    )
    return clients


def record_commands(llm: LLM) -> list[list[str]]:
    """The commands the loop applies to ``llm``, in order, as [kind, request_id], noted as they reach it."""
    applied: list[list[str]] = []
    add_request, abort_request = llm.add_request, llm.abort_request

    def add(prompt, params=None, request_id=None, *args, **kwargs):
        applied.append(["add", str(request_id)])
        return add_request(prompt, params, request_id, *args, **kwargs)

    def abort(request_id):
        applied.append(["abort", str(request_id)])
        return abort_request(request_id)

    llm.add_request, llm.abort_request = add, abort
    return applied


def drive(engine_turn, clients: list[dict[str, Any]], model=None) -> dict[str, Any]:
    """Run ``engine_turn(llm, inbox, send)`` once per turn with the clients' commands; record every turn."""
    llm = LLM(model or small_model(), clock=TickClock(), **LOOP_DIALS)
    applied = record_commands(llm)
    inbox: list[tuple] = []
    sent: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    turn = 0

    def send(output) -> None:
        sent.append(
            {
                "turn": turn,
                "request_id": output.request_id,
                "tokens": list(output.token_ids),
                "finished": bool(output.finished),
            }
        )

    last_command = max(c["hangs_up"] or c["arrives"] for c in clients)
    while turn <= last_command or llm.has_unfinished():
        if turn >= MAX_TURNS:
            raise RuntimeError(f"the clients were still waiting after {MAX_TURNS} turns: does each turn run a step?")
        for client in clients:
            if client["arrives"] == turn:
                params = SamplingParams(max_tokens=client["max_tokens"], ignore_eos=True)
                inbox.append(("add", client["request_id"], list(client["prompt_ids"]), params))
            if client["hangs_up"] == turn:
                inbox.append(("abort", client["request_id"]))
        steps_before, applied_before = len(llm.trace.steps), len(applied)
        given = [[command[0], command[1]] for command in inbox]
        engine_turn(llm, inbox, send)
        turns.append(
            {
                "given": given,
                "applied": applied[applied_before:],
                "steps": [sorted(step.scheduled) for step in llm.trace.steps[steps_before:]],
                "blocks": {c["request_id"]: len(llm.state.blocks.block_table(c["request_id"])) for c in clients},
                "inbox_left": len(inbox),
            }
        )
        turn += 1
    return {"turns": turns, "sent": sent}


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
