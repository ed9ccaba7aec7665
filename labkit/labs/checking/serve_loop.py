"""A server's engine loop driven turn by turn with scripted clients (lab 9).

In ``labkit serve`` one thread owns the engine; the HTTP handlers only put commands in its
inbox ("add this request", "this client hung up") and wait for what it sends them. Each turn of
the loop takes every command, oldest first, runs one step, and sends each request its new
tokens. The check plays the HTTP side: clients arrive at scripted turns (two at the first), one
hangs up mid-answer and one the moment it arrives (its add and its abort in one inbox, so the
order they are applied in decides whether it runs), and after every turn it notes the commands
the inbox held and the order the loop applied them in, which requests the step ran, which blocks
each request holds and what was sent. The tiny model on a ticking clock makes every run the same.
"""

from __future__ import annotations

from typing import Any

from labkit.engine import LLM
from labkit.labs.checking.engine_runs import TickClock
from labkit.labs.checking.shared import rng, small_model
from labkit.sampling import SamplingParams

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


def loop_oracle_inputs(seed: int) -> dict[str, Any]:
    return {"clients": client_script(seed)}
