"""Lab 8, exercise 4: ``accept_sampling(draft, draft_probs, target_probs, generator)``, the speculative-sampling rule.

The rule is random, so it is checked by the distribution of what it returns over thousands of seeded draws.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.shared import check_generator, on_check_device, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab8.sampling import MISTAKE_HINTS, closest_rule, frequencies, total_variation

TRIALS = 3000
TOLERANCE = 0.06  # total variation allowed between the frequencies seen and the target's p (noise is ~0.02)
REPEATS = 50  # calls made twice, with generators seeded alike, to see that the rule draws from its generator


def sampling_cases(seed: int) -> dict[str, Any]:
    """Small vocabularies where every wrong rule is far from p: a peaked draft, a flat one, a one-hot one;
    then a perfect draft (q = p), which the rule must always accept. Drawn on the CPU, handed over on the
    check's device, where the engine hands the learner's rule its probabilities and generator."""
    generator = torch_generator(seed)
    cases: list[dict[str, Any]] = []
    for k, one_hot in ((1, False), (2, False), (3, True)):
        vocab = 6
        p = torch.softmax(2.0 * torch.randn(k + 1, vocab, generator=generator, dtype=torch.float64), dim=-1)
        q = torch.softmax(2.0 * torch.randn(k, vocab, generator=generator, dtype=torch.float64), dim=-1)
        if one_hot:  # what prompt lookup drafts: certain of its tokens
            q = torch.nn.functional.one_hot(q.argmax(dim=-1), vocab).double()
        cases.append({"p": p, "q": q, "seed": seed + len(cases)})
    p = torch.softmax(2.0 * torch.randn(3, 6, generator=generator, dtype=torch.float64), dim=-1)
    cases.append({"p": p, "q": p[:2].clone(), "seed": seed + len(cases), "perfect": True})
    return on_check_device({"cases": cases})


def _sampled_rows(accept, case) -> torch.Tensor:
    """One row per draw: the k draft tokens (drawn from q here), how many tokens the rule returned, and those
    tokens (at most k + 1 kept, -1 after them). A tensor, so 3,000 draws stay one compact value."""
    generator = check_generator(case["seed"] + 10_000)
    p, q = case["p"], case["q"]
    k = q.shape[0]
    # every draft at once, on the CPU (the same drafts on every device): draft token i of each trial from q[i]
    drafts = torch.multinomial(q.cpu(), TRIALS, replacement=True, generator=torch_generator(case["seed"])).T.tolist()
    rows = []
    for draft in drafts:
        out = [int(t) for t in accept(list(draft), q.clone(), p.clone(), generator)]
        kept = out[: k + 1]
        rows.append(draft + [len(out)] + kept + [-1] * (k + 1 - len(kept)))
    return torch.tensor(rows, dtype=torch.int64)


def _repeated(accept, case) -> dict[str, Any]:
    """The same REPEATS calls made twice with generators seeded alike, the global random generators (torch's,
    Python's, NumPy's) reseeded differently in between: the tokens of both rounds, and whether the calls moved
    torch's global generator. The global generators are put back as they were."""
    p, q = case["p"], case["q"]
    draw = torch_generator(case["seed"] + 20_000)
    drafts = [[int(torch.multinomial(row, 1, generator=draw)) for row in q.cpu()] for _ in range(REPEATS)]
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    rounds, moved = [], False
    try:
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            random.seed(global_seed)
            np.random.seed(global_seed)
            before = torch.get_rng_state()
            generator = check_generator(case["seed"] + 30_000)
            rounds.append([[int(t) for t in accept(list(d), q.clone(), p.clone(), generator)] for d in drafts])
            moved = moved or not torch.equal(before, torch.get_rng_state())
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
    return {"rounds": rounds, "moved_global": moved}


def _run_sampling(functions, inputs) -> dict[str, Any]:
    """Each case's draws (or the record of what the rule raised there, so an earlier case's verdict comes
    first), and the repeated calls of the reproducibility check, on case 1 (k = 2)."""
    accept = functions[0]
    rows = [capture(functions, functools.partial(_sampled_rows, accept, case)) for case in inputs["cases"]]
    repeated = capture(functions, functools.partial(_repeated, accept, inputs["cases"][1]))
    return {"rows": rows, "repeated": repeated}


Draws = list[tuple[list[int], list[int], int]]  # (draft, returned tokens as kept, how many were returned) per draw


def _draws(rows: torch.Tensor, k: int) -> Draws:
    return [(row[:k].tolist(), row[k + 1 : k + 1 + min(int(row[k]), k + 1)].tolist(), int(row[k])) for row in rows]


def _tokens(count: int) -> str:
    return f"{count} token" + ("" if count == 1 else "s")


def _compare_sampled_case(index, case, rows) -> Mismatch | None:
    p, q = case["p"], case["q"]
    results = _draws(rows, q.shape[0])
    k, vocab = q.shape
    kind = ", a perfect draft, q = p" if case.get("perfect") else ", a one-hot draft" if q.max() == 1 else ""
    where = f"case {index} (k = {k}, vocabulary {vocab}{kind})"
    return (
        _each_return(results, k, where)
        or _first_token(results, p, q, where)
        or _bonus_token(results, p, k, where)
        or _perfect_draft(case, results, where)
    )


def _each_return(results: Draws, k: int, where: str) -> Mismatch | None:
    """Every call returned 1 to k + 1 tokens, all but the last a prefix of the draft."""
    for draft, out, returned in results:
        if not 1 <= returned <= k + 1:
            more = f" and {returned - len(out)} more" if returned > len(out) else ""
            return Mismatch(
                f"{where}: draft {draft}, you returned {_tokens(returned)}: {out}{more}",
                f"Return the accepted drafts (a prefix of the draft) and then one token: 1 to k + 1 = {k + 1} "
                "tokens in all.",
            )
        if out[:-1] != draft[: len(out) - 1]:
            return Mismatch(
                f"{where}: draft {draft}, you returned {out}: its first {_tokens(len(out) - 1)} "
                f"{out[:-1]} are not the start of the draft",
                "Every token before the last one you return is an accepted draft, in the draft's order: return "
                "draft[:a] plus one new token, where a is the number of drafts accepted before the first rejection.",
            )
    return None


def _first_token(results: Draws, p: torch.Tensor, q: torch.Tensor, where: str) -> Mismatch | None:
    """The first token returned is distributed as the target's p; otherwise the closest known wrong rule is named."""
    first = frequencies([out[0] for _, out, _ in results], q.shape[1])
    seen = total_variation(first, p[0])
    if seen <= TOLERANCE:
        return None
    rule, distance = closest_rule(p[0], q[0], first)
    difference = (
        f"{where}: the first token's frequencies over {len(results)} draws are {_fmt(first)}, the target's "
        f"p is {_fmt(p[0])} (total variation {seen:.2f}, noise is about 0.02)"
    )
    return Mismatch(difference, MISTAKE_HINTS.get(rule) if rule != "correct" and distance < seen else None)


def _bonus_token(results: Draws, p: torch.Tensor, k: int, where: str) -> Mismatch | None:
    """After k accepted drafts, one more token, distributed as the target's last row."""
    vocab = p.shape[1]
    full = [out for _, out, _ in results if len(out) == k + 1]
    whole_draft_only = [out for draft, out, _ in results if out == draft]
    if whole_draft_only and not full:
        return Mismatch(
            f"{where}: never more than {_tokens(k)}, even when every draft was accepted",
            "You forgot the bonus token: when all k drafts are accepted, sample one more token from the "
            "target's last row, target_probs[k].",
        )
    if len(full) > 200:
        bonus = frequencies([out[-1] for out in full], vocab)
        gap = total_variation(bonus, p[k])
        if gap > 2 * TOLERANCE:
            return Mismatch(
                f"{where}: the bonus token's frequencies {_fmt(bonus)}, the target's last row is {_fmt(p[k])}",
                "The bonus token, after k accepted drafts, is sampled from target_probs[k], the target's "
                "distribution at the position after the last draft.",
            )
    return None


def _perfect_draft(case: dict[str, Any], results: Draws, where: str) -> Mismatch | None:
    """A draft whose probabilities equal the target's is always accepted."""
    k = case["q"].shape[0]
    if case.get("perfect") and sum(len(out) == k + 1 for _, out, _ in results) < len(results):
        rejected = sum(k - (len(out) - 1) for _, out, _ in results)
        return Mismatch(
            f"{where}: your rule rejected {rejected} of {k * len(results)} drafts, although the draft's "
            "probabilities equal the target's",
            "The rule must accept x with probability min(1, p(x) / q(x)); with a perfect draft (q = p) that is 1, "
            "so every draft is accepted. A rule that ignores q (accepting with p(x)) can still return tokens "
            "distributed as p, but it throws away good drafts.",
        )
    return None


def _device_hint(record: dict[str, Any]) -> str | None:
    """What to change when the rule drew with a generator on another device than its numbers (a GPU raises)."""
    if "generator" not in record["message"] or "device" not in record["message"]:
        return None
    return (
        "Draw on the probabilities' device: torch.rand((), generator=generator, device=target_probs.device). On a "
        "GPU the check, like the engine, hands you tensors and a generator on the GPU, and torch.rand without a "
        "device draws on the CPU, which a CUDA generator cannot."
    )


def _compare_sampling(expected, got) -> Mismatch | None:
    for index, (case, rows) in enumerate(zip(expected["cases"], got["rows"])):
        record = raised_in(rows)
        mismatch = raised_mismatch(record, _device_hint(record)) if record else _compare_sampled_case(index, case, rows)
        if mismatch is not None:
            return mismatch
    record = raised_in(got["repeated"])
    if record:
        return raised_mismatch(record, _device_hint(record))
    rounds, moved = got["repeated"]["rounds"], got["repeated"]["moved_global"]
    draw_from = (
        "Draw every random number from the generator passed in: torch.rand((), generator=generator, "
        "device=target_probs.device) and "
        "torch.multinomial(..., generator=generator). Then a run can be repeated with the same seed, and "
        "requests with their own seeds do not disturb each other."
    )
    if rounds[0] != rounds[1]:
        calls = next(i for i, (a, b) in enumerate(zip(*rounds)) if a != b)
        return Mismatch(
            f"{REPEATS} calls made twice with generators of the same seed returned different tokens (first at call "
            f"{calls + 1}: {rounds[0][calls]}, then {rounds[1][calls]}): your rule does not draw from `generator`",
            draw_from,
        )
    if moved:
        return Mismatch("your rule drew random numbers from torch's global generator, not from `generator`", draw_from)
    return None


def _fmt(distribution: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(x):.2f}" for x in distribution) + "]"


register(
    diagnosed(
        Exercise(
            id="lab8.accept_sampling",
            functions=("accept_sampling",),
            answers=("labkit.speculative.accept.accept_sampling",),
            make_inputs=sampling_cases,
            run=_run_sampling,
            oracle=lambda inputs: {"cases": inputs["cases"]},
            compare=_compare_sampling,
            tested=f"accept_sampling called {TRIALS} times on each of 4 seeded cases (k = 1, 2, 3, 2; one with a one-hot "
            "draft, as prompt lookup makes, one with a perfect draft, q = p): the first token returned is distributed "
            "as the target's p, the bonus token after k accepted drafts as the target's last row, a perfect draft "
            f"always accepted; then {REPEATS} calls made twice with generators seeded alike return the same tokens",
            hint="For each draft token x: accept with probability min(1, p(x) / q(x)); on the first rejection, sample "
            "from max(0, p - q) normalised and stop; if all are accepted, sample one more from the last row of p. "
            'labkit.hint("lab8.accept_sampling") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab8.accept_sampling",
    "Accepting x with probability min(1, p(x)/q(x)), and otherwise drawing from what p has and q lacks, makes each "
    "kept token distributed exactly as p: over-proposed tokens are thinned, under-proposed ones topped up.",
    "Go through the drafts in order. r = a uniform number from the generator. If r < p[i, x] / q[i, x], keep x and "
    "go on. Else draw from max(0, p[i] - q[i]) normalised and return what you kept plus that token. After the loop, "
    "draw the bonus token from p[k].",
    "torch.rand((), generator=generator, device=target_probs.device); residual = torch.clamp(target_probs[i] - draft_probs[i], min=0); "
    "int(torch.multinomial(residual / residual.sum(), 1, generator=generator))",
)
