"""A server's engine loop driven turn by turn with scripted clients (lab 9).

In ``labkit serve`` one thread owns the engine; the HTTP handlers only put commands in its
inbox ("add this request", "this client hung up") and wait for what it sends them. Each turn of
the loop takes every command, runs one step, and sends each request its new tokens. The check
plays the HTTP side: clients arrive at scripted turns, one hangs up mid-answer, and after every
turn it notes which requests the step ran, which blocks each request holds and what was sent.
The tiny model on a ticking clock makes every run the same.
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
    """Six clients: their prompt, answer length, the turn each arrives at, and the one that hangs up."""
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
    return clients


def drive(engine_turn, clients: list[dict[str, Any]], model=None) -> dict[str, Any]:
    """Run ``engine_turn(llm, inbox, send)`` once per turn with the clients' commands; record every turn."""
    llm = LLM(model or small_model(), clock=TickClock(), **LOOP_DIALS)
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
        steps_before = len(llm.trace.steps)
        engine_turn(llm, inbox, send)
        turns.append(
            {
                "steps": [sorted(step.scheduled) for step in llm.trace.steps[steps_before:]],
                "blocks": {c["request_id"]: len(llm.state.blocks.block_table(c["request_id"])) for c in clients},
                "inbox_left": len(inbox),
            }
        )
        turn += 1
    return {"turns": turns, "sent": sent}


def loop_oracle_inputs(seed: int) -> dict[str, Any]:
    return {"clients": client_script(seed)}
