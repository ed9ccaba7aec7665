"""Lab 8, exercise 1: ``propose_ngram(token_ids, k, min_n, max_n)``, prompt lookup, against the engine's own
proposer; the typical mistakes are modelled so the message names the one an answer shows."""

from __future__ import annotations

from typing import Any

from labkit import speculative as engine_spec
from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.mistakes import named_mistake
from labkit.labs.common.shared import rng
from labkit.labs.hints import register_hints


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
            answers=("labkit.speculative.ngram.propose_ngram",),
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
