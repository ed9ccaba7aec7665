"""Lab 8, exercise 2: ``accept_greedy(draft, target_argmax)``, the longest prefix of the draft the target agrees
with, plus one token of the target's own; checked on crafted drafts, then inside the engine."""

from __future__ import annotations

from typing import Any

from labkit import speculative as engine_spec
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints
from labkit.labs.lab8.runs import serve_speculating
from labkit.labs.lab8.served import GREEDY_K, compare_engine_run, engine_oracle, with_engine_requests


def greedy_cases(seed: int) -> list[dict[str, list[int]]]:
    """Crafted (all agree, a miss in the middle that agrees again later, a miss at once, no draft) and seeded."""
    cases = [
        dict(draft=[5, 6, 7], target_argmax=[5, 6, 7, 8]),
        dict(draft=[5, 6, 7], target_argmax=[5, 9, 7, 8]),
        dict(draft=[5, 6, 7], target_argmax=[1, 6, 7, 8]),
        dict(draft=[], target_argmax=[4]),
    ]
    r = rng(seed)
    for _ in range(20):
        k = r.randint(1, 5)
        draft = [r.randint(0, 3) for _ in range(k)]
        cases.append(dict(draft=draft, target_argmax=[t if r.random() < 0.7 else r.randint(0, 3) for t in draft] + [9]))
    return cases


def greedy_mistakes(draft: list[int], target: list[int]) -> dict[str, list[int]]:
    """What typical wrong rules return, keyed by the hint that names each."""
    agreed = engine_spec.accept_greedy(draft, target)[:-1]
    every_match = [d for d, t in zip(draft, target) if d == t]
    return {
        "You forgot the bonus token: after the accepted drafts, append the target's own token at the next "
        "position (target_argmax[len(accepted)]). Even with every draft rejected the step must yield one token.": agreed,
        "You accepted drafts past the first mismatch. Once the target disagrees, everything after it was "
        "drafted from a token that is now wrong: stop at the first mismatch.": every_match + [target[len(every_match)]],
        "You accepted every draft token, as if the draft were compared with itself. Compare each draft token "
        "with target_argmax at the same position, the target's own choice there.": draft + [target[len(draft)]],
    }


def _run_greedy(functions, inputs) -> dict[str, Any]:
    accept = functions[0]
    units = [[int(t) for t in accept(list(c["draft"]), list(c["target_argmax"]))] for c in inputs["cases"]]
    engine = serve_speculating(inputs["requests"], GREEDY_K, watch_blocks=True, accept_greedy=accept)
    return {"units": units, "engine": engine}


def _greedy_oracle(inputs) -> dict[str, Any]:
    return {
        "cases": inputs["cases"],
        "units": [engine_spec.accept_greedy(c["draft"], c["target_argmax"]) for c in inputs["cases"]],
        **engine_oracle(inputs["seed"]),
    }


def _compare_greedy(expected, got) -> Mismatch | None:
    for case, want, have in zip(expected["cases"], expected["units"], got["units"]):
        if have == want:
            continue
        draft, target = case["draft"], case["target_argmax"]
        difference = f"accept_greedy(draft={draft}, target_argmax={target}): expected {want}, got {have}"
        for hint, wrong in greedy_mistakes(draft, target).items():
            if have == wrong:
                return Mismatch(difference, hint)
        return Mismatch(difference)
    return compare_engine_run(expected, got["engine"], "your accept_greedy")


register(
    diagnosed(
        Exercise(
            id="lab8.accept_greedy",
            functions=("accept_greedy",),
            answers=("labkit.speculative.accept.accept_greedy",),
            make_inputs=lambda seed: with_engine_requests(greedy_cases(seed), seed),
            run=_run_greedy,
            oracle=_greedy_oracle,
            compare=_compare_greedy,
            tested=f"accept_greedy on 4 crafted and 20 seeded drafts; then the engine with it (prompt lookup, "
            f"k = {GREEDY_K}) serves 3 seeded repetitive texts on the course model: every request's tokens equal to "
            "decoding it alone, and as many draft and accepted tokens as with the engine's own rule",
            hint="Walk the draft and the target's argmax side by side; stop at the first disagreement; the step "
            'yields the agreeing drafts plus one token of the target\'s. labkit.hint("lab8.accept_greedy") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab8.accept_greedy",
    "The target computed its own choice at every draft position in one pass. A draft token is kept only if the "
    "target would have chosen it; the first one it would not have chosen ends the step.",
    "Count how many leading draft tokens equal target_argmax at the same index; call it a. Return draft[:a] plus "
    "target_argmax[a]: the target's token at the first disagreement, or the bonus token after a full match.",
    "a = 0; while a < len(draft) and draft[a] == target_argmax[a]: a += 1; return draft[:a] + [target_argmax[a]]",
)
