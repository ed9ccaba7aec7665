"""Lab 9, exercise 1: ``engine_turn(llm, inbox, send)``, one turn of a server's engine loop, driven with scripted
clients on the tiny model (:mod:`~labkit.labs.lab9.engine_loop`)."""

from __future__ import annotations

from typing import Any

from labkit.engine.reference import compare_to_solo, solo_greedy
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import small_model
from labkit.labs.hints import register_hints
from labkit.labs.lab9.engine_loop import client_script, drive


def _run_loop(functions, inputs) -> dict[str, Any]:
    return drive(functions[0], inputs["clients"])


def _loop_oracle(inputs) -> dict[str, Any]:
    model = small_model()
    return {
        "clients": inputs["clients"],
        "solo": {
            c["request_id"]: solo_greedy(model, c["prompt_ids"], c["max_tokens"], ignore_eos=True)
            for c in inputs["clients"]
            if c["hangs_up"] is None
        },
    }


def describe_command(command: list[str]) -> str:
    kind, request_id = command
    return f"the {'add' if kind == 'add' else 'abort (hang-up)'} of {request_id}"


def out_of_order(given: list[list[str]], applied: list[list[str]]) -> tuple[list[str], list[str]] | None:
    """Two commands whose order matters, applied the other way round: two adds (the engine serves requests in the
    order they were added) or two commands for one request (an abort before its add cancels nothing)."""
    given, applied = [list(c) for c in given], [list(c) for c in applied]
    for index, first in enumerate(given):
        for second in given[index + 1 :]:
            matters = first[0] == second[0] == "add" or first[1] == second[1]
            if matters and first in applied and second in applied and applied.index(first) > applied.index(second):
                return first, second
    return None


def check_turns(clients: list[dict[str, Any]], turns: list[dict[str, Any]]) -> Mismatch | None:
    """Every command taken in its turn, oldest first, one step a turn, newcomers in that very step, hang-ups
    freed at once."""
    for number, turn in enumerate(turns):
        mistake = _turn_mistake(number, turn)
        if mistake is not None:
            return mistake
    for client in clients:
        mistake = _client_mistake(client, turns)
        if mistake is not None:
            return mistake
    return None


def _turn_mistake(number: int, turn: dict[str, Any]) -> Mismatch | None:
    """The inbox emptied, oldest command first, and one step run."""
    if turn["inbox_left"]:
        return Mismatch(
            f"turn {number}: {turn['inbox_left']} commands were still in the inbox after your turn",
            "Take every command out of the inbox each turn (inbox.pop(0) until it is empty): one left "
            "there waits a whole step, or is applied again next turn.",
        )
    swapped = out_of_order(turn["given"], turn["applied"])
    if swapped is not None:
        first, second = (describe_command(command) for command in swapped)
        return Mismatch(
            f"turn {number}: the inbox held {first} before {second}, but your loop applied {second} first: "
            "commands must be handled in the order they arrived (oldest first)",
            "inbox.pop(0) takes the oldest command, inbox.pop() the newest. Newest first serves the last to "
            "arrive first, and lets a hang-up reach the engine before the request it cancels, which then "
            "runs for nobody.",
        )
    if len(turn["steps"]) > 1:
        return Mismatch(
            f"turn {number} ran {len(turn['steps'])} engine steps",
            "One step per turn: the loop must come back to the inbox between steps, or a request that "
            "arrives waits until the batch drains (that is static batching, across HTTP clients).",
        )
    return None


def _client_mistake(client: dict[str, Any], turns: list[dict[str, Any]]) -> Mismatch | None:
    """A client ran in the step of the turn it arrived, and its blocks were free after the turn it hung up."""
    arrived = turns[client["arrives"]]["steps"]
    gone_at_once = client["hangs_up"] == client["arrives"]  # it never has to run
    if not gone_at_once and (not arrived or client["request_id"] not in arrived[0]):
        return Mismatch(
            f"{client['request_id']} arrived at turn {client['arrives']} but that turn's step did not run it",
            "Apply the commands first, then step: a request that came in joins the very next step. "
            "Stepping first (or only when the engine is idle) makes every newcomer wait.",
        )
    if client["hangs_up"] is not None:
        held = turns[client["hangs_up"]]["blocks"][client["request_id"]]
        if held:
            return Mismatch(
                f"{client['request_id']} hung up at turn {client['hangs_up']}, yet it still held {held} KV "
                "blocks after that turn",
                "An abort must reach the engine: llm.abort_request(request_id) stops the request and gives "
                "its blocks back at once. Dropping it on the HTTP side leaves the engine computing for nobody.",
            )
    return None


def check_sent(expected: dict[str, Any], sent: list[dict[str, Any]]) -> Mismatch | None:
    """Each client got its tokens as they were made, nothing after it hung up, and the solo answer."""
    for client in expected["clients"]:
        rid = client["request_id"]
        mine = [s for s in sent if s["request_id"] == rid]
        if client["hangs_up"] is not None:
            late = [s["turn"] for s in mine if s["turn"] >= client["hangs_up"]]
            if late:
                return Mismatch(f"{rid} hung up at turn {client['hangs_up']} but was sent tokens at turn {late[0]}")
            continue
        counts = [len(s["tokens"]) for s in mine]
        if counts != list(range(1, client["max_tokens"] + 1)):
            what = "only when it finished" if counts == [client["max_tokens"]] else f"with token counts {counts}"
            return Mismatch(
                f"{rid} was sent its answer {what}; a streaming client needs each output as it is made "
                f"(token counts 1, 2, ..., {client['max_tokens']})",
                "send(output) for every output llm.step() returns, finished or not: that is what "
                "streams each token to its client.",
            )
        problem = compare_to_solo(mine[-1]["tokens"], expected["solo"][rid])
        if problem is not None:
            return Mismatch(f"{rid}: {problem}", "Add each request with its own prompt ids and sampling params.")
        if not mine[-1]["finished"]:
            return Mismatch(f"{rid}: the last output it was sent is not marked finished")
    return None


def _compare_loop(expected, got) -> Mismatch | None:
    return check_turns(expected["clients"], got["turns"]) or check_sent(expected, got["sent"])


def _known_loop_error(record: dict[str, Any]) -> str | None:
    if "already" in record["message"] or "duplicate" in record["message"].lower():
        return "A command was applied twice: take each one out of the inbox (inbox.pop(0)) as you apply it."
    return None


register(
    diagnosed(
        Exercise(
            id="lab9.engine_turn",
            functions=("engine_turn",),
            make_inputs=lambda seed: {"clients": client_script(seed)},
            run=_run_loop,
            oracle=_loop_oracle,
            compare=_compare_loop,
            tested="seven scripted clients arrive over the turns of your loop on the tiny model (two in the same "
            "turn), one hangs up mid-answer and one the moment it arrives: every command is taken in its turn, "
            "oldest first, one step a turn, newcomers join that very step, a hang-up's blocks are free after its "
            "turn, tokens are sent as they are made, and every answer equals the request decoded alone",
            hint="Commands first (add_request / abort_request), then one llm.step() if llm.has_unfinished(), then "
            "send every output it returned.",
            points=2.0,
        ),
        _known_loop_error,
    )
)

register_hints(
    "lab9.engine_turn",
    "The HTTP side and the engine meet in two places only: the inbox (commands in) and send (outputs out). "
    "A turn is: empty the inbox into the engine, run one step, hand out what it made.",
    "For each command: 'add' -> llm.add_request(prompt_ids, params, request_id=...); 'abort' -> "
    "llm.abort_request(request_id). Then, only if llm.has_unfinished(), outputs = llm.step().",
    "while inbox: kind, *rest = inbox.pop(0) ... then: for output in llm.step(): send(output). Do not wait for "
    "output.finished: each output carries the tokens so far, and streaming clients want every one.",
)
