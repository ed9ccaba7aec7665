"""Lab 8, speculative decoding: the checks for the learner's proposer and acceptance rules.

- ``propose_ngram(token_ids, k, min_n, max_n)``: prompt lookup. The last n tokens (longest n
  first) are searched for earlier in the sequence, and the k tokens that followed that
  occurrence are the draft. Checked against the engine's own proposer on seeded sequences.
- ``accept_greedy(draft, target_argmax)``: the longest prefix of the draft that the target
  agrees with, plus one token of the target's own. Checked on crafted cases, then inside the
  engine: every request's tokens equal to decoding it alone, and the same draft and accepted
  counts as the engine's own rule.
- ``accept_sampling(draft, draft_probs, target_probs, generator)``: the speculative-sampling
  rule. Checked by the distribution of what it returns over thousands of seeded draws.
- ``rollback(request, num_rejected, blocks)``: the KV of rejected drafts undone. Checked on
  crafted block tables, then inside the engine, watching every step for blocks held in vain.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
import torch

from labkit import spec as engine_spec
from labkit.engine.request import Request
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.labs.common.diagnose import diagnosed, raised_mismatch
from labkit.labs.common.engine_runs import CheckRequest
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.mistakes import named_mistake
from labkit.labs.common.shared import check_generator, on_check_device, rng, torch_generator
from labkit.labs.common.solo import compare_with_solo, run_failure
from labkit.labs.hints import register_hints
from labkit.labs.lab8.runs import repetitive_requests, serve_speculating, solo_course_runs
from labkit.labs.lab8.sampling import (
    MISTAKE_HINTS,
    closest_rule,
    frequencies,
    total_variation,
)
from labkit.sampling_params import SamplingParams

# --- lab8.propose_ngram -----------------------------------------------------------------------


def ngram_cases(seed: int) -> list[dict[str, Any]]:
    """Crafted sequences (a clear match, none, a short tail, a longer n-gram that wins, an overlap) and seeded ones.

    The seeded ones use a vocabulary of four tokens, so n-grams repeat often and at several lengths.
    """
    cases = [
        dict(token_ids=[1, 2, 3, 9, 9, 1, 2, 3], k=3, min_n=1, max_n=4),
        dict(token_ids=[5, 6, 7, 8], k=3, min_n=1, max_n=4),
        dict(token_ids=[4, 1, 2, 4, 1, 2], k=5, min_n=1, max_n=3),
        dict(token_ids=[3, 4, 7, 1, 4, 8, 3, 4], k=2, min_n=1, max_n=4),
        dict(token_ids=[6], k=2, min_n=1, max_n=4),
        dict(token_ids=[1, 2, 1, 2, 1], k=2, min_n=3, max_n=3),
    ]
    r = rng(seed)
    for _ in range(40):
        min_n = r.randint(1, 2)
        cases.append(
            dict(
                token_ids=[r.randint(0, 3) for _ in range(r.randint(2, 24))],
                k=r.randint(1, 5),
                min_n=min_n,
                max_n=r.randint(min_n, 4),
            )
        )
    return cases


def _looked_up(
    token_ids, k, min_n, max_n, longest_first=True, latest=True, fall_back=True, overlap=True, itself=False
) -> list[int]:
    """Prompt lookup with one of its choices turned around: a model of the typical mistakes.

    ``fall_back=False`` gives up after the first n tried; ``overlap=False`` skips occurrences that
    overlap the pattern; ``itself=True`` counts the last n tokens as an occurrence of themselves.
    """
    lengths = range(max_n, min_n - 1, -1) if longest_first else range(min_n, max_n + 1)
    for n in lengths:
        if n >= len(token_ids):
            continue
        last = len(token_ids) - 2 * n if not overlap else len(token_ids) - n - (0 if itself else 1)
        starts = range(last, -1, -1) if latest else range(last + 1)
        for i in starts:
            if token_ids[i : i + n] == token_ids[-n:]:
                return token_ids[i + n : i + n + k]
        if not fall_back:
            return []
    return []


# Each typical mistake: how _looked_up models it, and the hint that names it. A learner whose drafts
# equal a model's on every case made that mistake.
NGRAM_MISTAKES = {
    "itself": (
        dict(itself=True),
        "You found nothing where an earlier occurrence exists: your search finds the last n tokens themselves "
        "(they always match, and nothing follows them). Only an occurrence that starts before the last n tokens "
        "counts: start the search at i = len(token_ids) - n - 1.",
    ),
    "no fall-back": (
        dict(fall_back=False),
        "You gave up when the longest pattern had no earlier occurrence. Fall back to shorter patterns: try n "
        "from max_n down to min_n, and return [] only when no n has a match.",
    ),
    "no overlap": (
        dict(overlap=False),
        "You skipped an earlier occurrence because it overlaps the last n tokens. It only has to start before "
        "them (any i up to len(token_ids) - n - 1): in [1, 2, 1, 2, 1] the pattern [1, 2, 1] occurred at 0, so "
        "the draft is [2, 1].",
    ),
    "shortest first": (
        dict(longest_first=False),
        "You matched a shorter n-gram although a longer one occurs earlier too. Try n from max_n down to "
        "min_n and stop at the first n that matches: a longer match predicts better.",
    ),
    "earliest": (
        dict(latest=False),
        "You took the first occurrence of the pattern. Take the most recent one (the largest start i): "
        "what followed it last is the likeliest continuation now.",
    ),
}


def _run_ngram(functions, cases) -> list[list[int]]:
    return [[int(t) for t in functions[0](list(c["token_ids"]), c["k"], c["min_n"], c["max_n"])] for c in cases]


def _ngram_oracle(cases) -> dict[str, Any]:
    args = [(c["token_ids"], c["k"], c["min_n"], c["max_n"]) for c in cases]
    return {
        "cases": cases,
        "want": [engine_spec.propose_ngram(*a) for a in args],
        "mistakes": {name: [_looked_up(*a, **model) for a in args] for name, (model, _) in NGRAM_MISTAKES.items()},
    }


def _compare_ngram(expected, got) -> Mismatch | None:
    wrong = [i for i, (want, have) in enumerate(zip(expected["want"], got)) if have != want]
    if not wrong:
        return None
    index = wrong[0]
    case, want, have = expected["cases"][index], expected["want"][index], got[index]
    ids, k, min_n, max_n = case["token_ids"], case["k"], case["min_n"], case["max_n"]
    where = f"propose_ngram({ids}, k={k}, min_n={min_n}, max_n={max_n})"
    difference = f"{where}: expected {want}, got {have}"
    if len(have) > k:
        return Mismatch(difference, f"Propose at most k = {k} tokens: the ones right after the match, no more.")
    hint = named_mistake({hint: expected["mistakes"][name] for name, (_, hint) in NGRAM_MISTAKES.items()}, got, index)
    if hint:
        return Mismatch(difference, hint)
    if want and not all(t in ids for t in have):
        return Mismatch(difference, "Every proposed token must come from the sequence, after a match.")
    return Mismatch(difference)


register(
    diagnosed(
        Exercise(
            id="lab8.propose_ngram",
            functions=("propose_ngram",),
            answers=("labkit.spec.ngram.propose_ngram",),
            make_inputs=ngram_cases,
            run=_run_ngram,
            oracle=_ngram_oracle,
            compare=_compare_ngram,
            tested="propose_ngram on 6 crafted and 40 seeded sequences (4 tokens, so n-grams repeat), "
            "with k from 1 to 5 and n from 1 to 4: the same draft as the engine's prompt lookup",
            hint="Look for the last n tokens earlier in the sequence, longest n first; the draft is what followed "
            'that occurrence, at most k tokens. labkit.hint("lab8.propose_ngram") shows more.',
        )
    )
)

# --- lab8.accept_greedy -----------------------------------------------------------------------

GREEDY_K = 3


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


def engine_requests(seed: int) -> list[CheckRequest]:
    return repetitive_requests(seed, 3)


@functools.lru_cache(maxsize=2)
def engine_oracle(seed: int) -> dict[str, Any]:
    """The engine's own run of a seed's requests and their solo runs: shared by the greedy and rollback checks
    (and by the gates of demo cells, which ask again), so the course model decodes them once per process."""
    requests = engine_requests(seed)
    return {"engine": serve_speculating(requests, GREEDY_K, watch_blocks=True), "solo": solo_course_runs(requests)}


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


def compare_engine_run(expected, run, whose: str) -> Mismatch | None:
    """The engine run with the learner's piece: it ran, its tokens are the solo ones, its counts the engine's."""
    where = f"in the engine with {whose} (k = {GREEDY_K}, greedy)"
    failure = run_failure(run, f"{where}, ")
    if failure is not None:
        return failure
    mismatch = compare_with_solo(expected["solo"], run["tokens"])
    if mismatch is not None:
        return Mismatch(
            f"{where}, {mismatch.difference}",
            "Speculation must never change a greedy answer: every token kept must be the target's own argmax.",
        )
    for key, what in (("num_draft_tokens", "draft tokens"), ("num_accepted_tokens", "accepted drafts")):
        if run[key] != expected["engine"][key]:
            return Mismatch(
                f"{where}: {run[key]} {what}, the engine's own rule gives {expected['engine'][key]}",
                "The answers are right but the counts differ: accept exactly the drafts that agree, up to the first "
                "that does not, and count the bonus token as the target's, not as an accepted draft.",
            )
    return None


register(
    diagnosed(
        Exercise(
            id="lab8.accept_greedy",
            functions=("accept_greedy",),
            answers=("labkit.spec.accept.accept_greedy",),
            make_inputs=lambda seed: {"cases": greedy_cases(seed), "requests": engine_requests(seed), "seed": seed},
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

# --- lab8.rollback ----------------------------------------------------------------------------

ROLLBACK_POOL = 32


def rollback_cases(seed: int) -> list[dict[str, int]]:
    """(tokens computed, block size, rejected): within a block, across one, back to a block's edge, none."""
    r = rng(seed)
    cases = [(40, 4, 7), (33, 4, 1), (16, 16, 5), (17, 16, 1), (9, 4, 0), (24, 8, 8)]
    cases += [(n, 4, r.randint(0, min(n, 5))) for n in (r.randint(6, 40) for _ in range(4))]
    return [dict(computed=c, block_size=b, rejected=j) for c, b, j in cases]


def run_rollback_case(rollback_fn, case) -> dict[str, Any]:
    """Roll back one request of a fresh pool (another sequence holds the first 5 blocks); note what changed."""
    blocks = FreeListBlockAllocator(ROLLBACK_POOL, case["block_size"])
    blocks.allocate("other", 5 * case["block_size"])
    request = Request("r", [1] * case["computed"], SamplingParams())
    request.num_computed_tokens = case["computed"]
    before = list(blocks.allocate("r", case["computed"]))
    rollback_fn(request, case["rejected"], blocks)
    return {
        "before": before,
        "computed": int(request.num_computed_tokens),
        "table": [int(b) for b in blocks.block_table("r")],
        "num_free": int(blocks.num_free_blocks),
        "other": [int(b) for b in blocks.block_table("other")],
    }


def _compare_rollback_case(case, got) -> Mismatch | None:
    computed, size, rejected = case["computed"], case["block_size"], case["rejected"]
    where = f"{computed} tokens computed in blocks of {size}, {rejected} rejected"
    left = computed - rejected
    keep = -(-left // size)
    if got["computed"] != left:
        hint = (
            "You did not roll back the KV of the rejected tokens: num_computed_tokens must move back by num_rejected, "
            "or the next step's positions start past tokens that do not exist and the model reads the rejected "
            "drafts' keys and values."
            if got["computed"] == computed
            else "Move num_computed_tokens back by exactly num_rejected."
        )
        return Mismatch(f"{where}: num_computed_tokens is {got['computed']}, expected {left}", hint)
    if got["other"] != list(range(5)):
        return Mismatch(f"{where}: another sequence's blocks changed", "Touch only this request's block table.")
    if got["table"] == got["before"][:keep] and got["num_free"] == ROLLBACK_POOL - 5 - keep:
        return None
    difference = (
        f"{where}: the table is {got['table']} with {got['num_free']} blocks free, expected {got['before'][:keep]}"
    )
    if len(got["table"]) > keep and got["num_free"] == ROLLBACK_POOL - 5 - len(got["before"]):
        return Mismatch(
            difference,
            f"No block went back to the pool: {left} tokens need {keep} blocks of {size}, so the blocks after those "
            "hold only rejected tokens. Pop them off the end of the table and free_block each.",
        )
    if len(got["table"]) == left // size < keep:
        return Mismatch(
            difference,
            "You freed a block that still holds tokens: a partly filled last block stays. Keep "
            "blocks.blocks_for(num_computed_tokens) blocks (rounded up), not num_computed_tokens // block_size.",
        )
    if got["table"] == got["before"] and got["num_free"] == ROLLBACK_POOL - 5 - keep:
        return Mismatch(
            difference,
            "The right blocks went back to the pool, but the request's table still lists them: you popped from a "
            "copy of the table. blocks.block_table(request.request_id) is the allocator's own list; pop from it "
            "directly (not from list(...) or .copy() of it), so the table and the pool agree.",
        )
    if (
        len(got["table"]) < len(got["before"])
        and got["table"] == got["before"][len(got["before"]) - len(got["table"]) :]
    ):
        return Mismatch(
            difference,
            "You freed blocks from the front of the table: those hold the first tokens of the sequence. "
            "The rejected tokens are at the end; pop from the end.",
        )
    return Mismatch(difference)


def _run_rollback(functions, inputs) -> dict[str, Any]:
    rollback_fn = functions[0]
    units = [run_rollback_case(rollback_fn, case) for case in inputs["cases"]]
    engine = serve_speculating(inputs["requests"], GREEDY_K, rollback=rollback_fn, watch_blocks=True)
    return {"units": units, "engine": engine}


def _rollback_oracle(inputs) -> dict[str, Any]:
    return {
        "cases": inputs["cases"],
        **engine_oracle(inputs["seed"]),
    }


def _compare_rollback(expected, got) -> Mismatch | None:
    for case, unit in zip(expected["cases"], got["units"]):
        mismatch = _compare_rollback_case(case, unit)
        if mismatch is not None:
            return mismatch
    run = got["engine"]
    if run.get("error") is None and run["excess_blocks"]:
        step, excess = run["excess_blocks"]
        return Mismatch(
            f"in the engine with your rollback, after step {step} the running requests held {excess} more blocks "
            "than their computed tokens need",
            "Blocks that hold only rejected tokens must go back to the pool, or speculation leaks memory every step.",
        )
    return compare_engine_run(expected, run, "your rollback")


register(
    diagnosed(
        Exercise(
            id="lab8.rollback",
            functions=("rollback",),
            answers=("labkit.spec.rollback.rollback",),
            make_inputs=lambda seed: {"cases": rollback_cases(seed), "requests": engine_requests(seed), "seed": seed},
            run=_run_rollback,
            oracle=_rollback_oracle,
            compare=_compare_rollback,
            tested="rollback on 10 requests (blocks of 4, 8 or 16; 0 to 8 rejected tokens, within a block and across "
            f"one): num_computed_tokens moved back and exactly the blocks past the last computed token freed; then "
            f"the engine with it (k = {GREEDY_K}) serves 3 seeded repetitive texts on the course model: the solo "
            "tokens, the engine's draft and accepted counts, and no step leaves a request holding blocks it does not need",
            hint="Move num_computed_tokens back by num_rejected; then, while the table has more blocks than "
            'blocks_for(num_computed_tokens), free the last one. labkit.hint("lab8.rollback") shows more.',
        )
    )
)

# --- lab8.accept_sampling ---------------------------------------------------------------------

TRIALS = 3000
TOLERANCE = 0.06  # total variation allowed between the frequencies seen and the target's p (noise is ~0.02)
REPEATS = 50  # calls made twice, with generators seeded alike, to see that the rule draws from its generator


def sampling_cases(seed: int) -> dict[str, Any]:
    """Small vocabularies where every wrong rule is far from p: a peaked draft, a flat one, a one-hot one;
    then a perfect draft (q = p), which the rule must always accept. Drawn on the CPU, handed over on the
    check's device, where the engine hands the learner's rule its probabilities and generator."""
    generator = torch_generator(seed)
    cases = []
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


def _draws(rows: torch.Tensor, k: int) -> list[tuple[list[int], list[int], int]]:
    """(draft, returned tokens as kept, how many were returned) for each row of a case."""
    return [(row[:k].tolist(), row[k + 1 : k + 1 + min(int(row[k]), k + 1)].tolist(), int(row[k])) for row in rows]


def _sampling_oracle(inputs) -> dict[str, Any]:
    return {"cases": inputs["cases"]}


def _tokens(count: int) -> str:
    return f"{count} token" + ("" if count == 1 else "s")


def _compare_sampled_case(index, case, rows) -> Mismatch | None:
    p, q = case["p"], case["q"]
    results = _draws(rows, q.shape[0])
    k, vocab = q.shape
    kind = ", a perfect draft, q = p" if case.get("perfect") else ", a one-hot draft" if q.max() == 1 else ""
    where = f"case {index} (k = {k}, vocabulary {vocab}{kind})"
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
    first = frequencies([out[0] for _, out, _ in results], vocab)
    full = [out for _, out, _ in results if len(out) == k + 1]
    whole_draft_only = [out for draft, out, _ in results if out == draft]
    seen = total_variation(first, p[0])
    if seen > TOLERANCE:
        rule, distance = closest_rule(p[0], q[0], first)
        difference = (
            f"{where}: the first token's frequencies over {len(results)} draws are {_fmt(first)}, the target's "
            f"p is {_fmt(p[0])} (total variation {seen:.2f}, noise is about 0.02)"
        )
        return Mismatch(difference, MISTAKE_HINTS.get(rule) if rule != "correct" and distance < seen else None)
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
    if case.get("perfect") and len(full) < len(results):
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
            answers=("labkit.spec.accept.accept_sampling",),
            make_inputs=sampling_cases,
            run=_run_sampling,
            oracle=_sampling_oracle,
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

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

register_hints(
    "lab8.propose_ngram",
    "Text that repeats (an edit of a document, code that reuses names) is predicted by itself: if the last few "
    "tokens appeared before, what followed them then is a good guess for what follows now.",
    "For n from max_n down to min_n: the pattern is the last n tokens. Look at the earlier starts i (the occurrence "
    "must end before the last token, so it is not the pattern itself), the most recent first, for one where "
    "token_ids[i:i + n] equals it. At the first n with a match, return up to k tokens from i + n on.",
    "for n in range(max_n, min_n - 1, -1): skip n >= len(token_ids); pattern = token_ids[-n:]; "
    "for i in range(len(token_ids) - n - 1, -1, -1) (the most recent start first): "
    "if token_ids[i:i + n] == pattern: return token_ids[i + n:i + n + k]. After every n: return []",
)
register_hints(
    "lab8.accept_greedy",
    "The target computed its own choice at every draft position in one pass. A draft token is kept only if the "
    "target would have chosen it; the first one it would not have chosen ends the step.",
    "Count how many leading draft tokens equal target_argmax at the same index; call it a. Return draft[:a] plus "
    "target_argmax[a]: the target's token at the first disagreement, or the bonus token after a full match.",
    "a = 0; while a < len(draft) and draft[a] == target_argmax[a]: a += 1; return draft[:a] + [target_argmax[a]]",
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
register_hints(
    "lab8.rollback",
    "The verification pass wrote keys and values for every draft token. Those of rejected drafts describe tokens "
    "that will never be in the sequence; nothing needs erasing, as long as the request forgets it computed them "
    "(the next step overwrites those slots) and gives back the blocks that hold nothing else.",
    "request.num_computed_tokens -= num_rejected. Then blocks.block_table(request.request_id) is the allocator's own "
    "list: while it is longer than blocks.blocks_for(request.num_computed_tokens), pop its last block and give it "
    "back with blocks.free_block.",
    "table = blocks.block_table(request.request_id); while len(table) > blocks.blocks_for(request.num_computed_tokens): "
    "blocks.free_block(table.pop())",
)
