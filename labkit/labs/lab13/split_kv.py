"""Lab 13, exercise 3: ``split_kv_attention(q, keys, values, length, split_size, partial)``, split-KV with a fixed
split size, so a query's sum over its keys is cut the same way in a decode, in a crowd, in a prefill and in a chunk
of one; checked on seeded queries, each in those four places.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.labs.lab13.kernels import split_partial

HEADS, DIM = 3, 16
OVERFLOWS = 80.0  # scores past this overflow exp in float32 (88.7): a NaN below it is no overflow
LARGE = 150.0  # the largest score of the check's last query


def _attention(q, keys, values, length, split_size, partial, stop=True, rescale_sum=True, rescale_acc=True):
    """Split-KV attention, right by default; each switch turned off is a typical mistake."""
    end = length if stop else len(keys)
    parts = [
        partial(q, keys[s : min(s + split_size, end)], values[s : min(s + split_size, end)])
        for s in range(0, end, split_size)
    ]
    maxes = torch.stack([m for m, _, _ in parts])  # [splits, H]
    scale = torch.exp(maxes - maxes.amax(dim=0))
    total, acc = torch.zeros(q.shape[0], device=q.device), torch.zeros_like(q, dtype=torch.float32)
    for (_, share, weighted), s in zip(parts, scale):  # first split to last
        total = total + (s * share if rescale_sum else share)
        acc = acc + (s[:, None] * weighted if rescale_acc else weighted)
    return acc / total[:, None]


def course_split_kv_attention(q, keys, values, length, split_size, partial):
    """Attention of ``q`` over the first ``length`` keys, in splits of ``split_size`` from key 0, merged in order."""
    return _attention(q, keys, values, length, split_size, partial)


MISTAKES: dict[str, dict[str, bool]] = {
    "The splits ran past length: keys at positions >= length belong to other queries (the rest of the prompt, or "
    "another sequence's padding), not this one. Stop the last split at length: keys[s : min(s + split_size, "
    "length)].": dict(stop=False),
    "The merge added the splits as they are: each split's l and acc are relative to its own max. Scale split s by "
    "exp(m_s - M), M the largest m_s, in both sums.": dict(rescale_sum=False, rescale_acc=False),
    "The sum l was not rescaled: acc_s was scaled by exp(m_s - M) but l_s was added as it is. Scale both.": dict(
        rescale_sum=False
    ),
    "The weighted values acc were not rescaled: l_s was scaled by exp(m_s - M) but acc_s was added as it is. Scale "
    "both.": dict(rescale_acc=False),
}


def _expected_sizes(length: int, split_size: int) -> list[int]:
    return sorted([split_size] * (length // split_size) + ([length % split_size] if length % split_size else []))


def split_cases(seed: int) -> list[dict[str, Any]]:
    """Seeded queries of a prompt, each in four places, and one with large scores: the calls the check makes."""
    r, generator = rng(seed), torch_generator(seed)
    split_size, prompt = r.choice([4, 8]), r.randint(21, 40)
    keys, values = (torch.randn(prompt, HEADS, DIM, generator=generator) for _ in range(2))
    garbage = 50 * torch.randn(r.randint(5, 20), HEADS, DIM, generator=generator)  # another sequence's padding
    calls = []
    positions = [r.randint(0, split_size - 2), r.randint(split_size, prompt - 2), prompt - 1]
    queries = [(position, None) for position in positions] + [(r.randint(2 * split_size, prompt - 1), LARGE)]
    for query, (position, largest) in enumerate(queries):
        q, length = torch.randn(HEADS, DIM, generator=generator), position + 1
        if largest:  # scaled so that its largest score over its keys is LARGE: exp of it overflows float32
            q = q * (largest / float(torch.einsum("hd,khd->hk", q, keys[:length]).max() / math.sqrt(DIM)))
        places = {
            "decode": length,
            "a chunk of the prompt": min(prompt, length + r.randint(1, split_size)),
            "the prompt's prefill": prompt,
            "a crowd (the batch padded past the prompt)": None,
        }
        for place, width in places.items():
            k, v = (
                (keys[:width], values[:width]) if width else (torch.cat([keys, garbage]), torch.cat([values, garbage]))
            )
            calls.append(
                {
                    "query": query,
                    "place": place,
                    "q": q,
                    "keys": k,
                    "values": v,
                    "length": length,
                    "split_size": split_size,
                }
            )
    return on_check_device(calls)


def _recording(sizes: list[int]) -> Callable:
    def partial(q, keys, values):
        sizes.append(len(keys))
        return split_partial(q, keys, values)

    return partial


def _run(functions, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for call in calls:
        sizes: list[int] = []
        got = functions[0](
            call["q"], call["keys"], call["values"], call["length"], call["split_size"], _recording(sizes)
        )
        results.append({"out": got if isinstance(got, torch.Tensor) else repr(got)[:80], "sizes": sizes})
    return results


def _exact(call: dict[str, Any]) -> torch.Tensor:
    q, keys, values = (
        call["q"].double(),
        call["keys"][: call["length"]].double(),
        call["values"][: call["length"]].double(),
    )
    weights = torch.softmax(torch.einsum("hd,khd->hk", q, keys) / math.sqrt(DIM), dim=-1)
    return torch.einsum("hk,khd->hd", weights, values)


def _oracle(calls: list[dict[str, Any]]) -> dict[str, Any]:
    def args(call):
        return call["q"], call["keys"], call["values"], call["length"], call["split_size"], split_partial

    return {
        "exact": [_exact(call) for call in calls],
        "wrong": {hint: [_attention(*args(call), **switch) for call in calls] for hint, switch in MISTAKES.items()},
        "sizes": [_expected_sizes(call["length"], call["split_size"]) for call in calls],
        "max_score": [
            float((torch.einsum("hd,khd->hk", call["q"], call["keys"][: call["length"]]).abs().max()) / math.sqrt(DIM))
            for call in calls
        ],
        "where": [
            (
                call["query"],
                f"query {call['query']} (length {call['length']}, split_size {call['split_size']}) in "
                f"{call['place']}, a tensor of {len(call['keys'])} keys",
            )
            for call in calls
        ],
    }


def _close(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.double(), b.double(), 1e-4, 1e-5)


def _wrong_value(expected: dict[str, Any], got: list[dict[str, Any]], index: int, out: torch.Tensor) -> str:
    """The hint for an output that is not attention: a named mistake, an overflow, or what to look at."""
    if not torch.isfinite(out).all():
        if expected["max_score"][index] > OVERFLOWS:
            return (
                f"NaN or inf with scores up to {expected['max_score'][index]:.0f}: exp(m_s) overflows float32 past 88. "
                "Subtract the largest split max M first: scale split s by exp(m_s - M)."
            )
        return "NaN or inf where no score is large: is a split empty (m_s = -inf) and weighted by exp(-inf - -inf)?"
    for hint, outputs in expected["wrong"].items():
        if _close(out, outputs[index]):
            return hint
    return (
        "Each split's (m, l, acc) from partial; M = the largest m; out = sum(exp(m_s - M) * acc_s) / "
        "sum(exp(m_s - M) * l_s), over the splits of the query's first length keys."
    )


def _compare(expected: dict[str, Any], got: list[dict[str, Any]]) -> Mismatch | None:
    first_bits: dict[int, tuple[str, torch.Tensor]] = {}
    for index, (result, exact, sizes) in enumerate(zip(got, expected["exact"], expected["sizes"])):
        query, where = expected["where"][index]
        out = result["out"]
        if not isinstance(out, torch.Tensor):
            return Mismatch(f"{where}: split_kv_attention returned {out}", "Return the output, a torch.Tensor [H, D].")
        if out.shape != exact.shape:
            return Mismatch(f"{where}: the output has shape {tuple(out.shape)}, expected {tuple(exact.shape)} ([H, D])")
        if not _close(out, exact):
            difference = (out.double() - exact).abs().max()
            return Mismatch(
                f"{where}: not softmax attention over its {sum(sizes)} keys (largest difference "
                f"{float(difference):.3g})",
                _wrong_value(expected, got, index, out),
            )
        used = sorted(result["sizes"])
        if 0 in used:
            return Mismatch(
                f"{where}: partial was called on {used.count(0)} empty splits past length",
                "Stop the splits at the query's length: range(0, length, split_size). Splits past it are as many as "
                "the tensor is wide (the batch's longest context), so a sum over them (torch.stack(...).sum(0)) may "
                "add in another order from one batch to the next, though they add only zeros.",
            )
        if used != sizes:
            return Mismatch(f"{where}: your splits held {used} keys, expected {sizes}", _sizes_hint(used))
        if query not in first_bits:
            first_bits[query] = (where, out)
        elif not torch.equal(out, first_bits[query][1]):
            return Mismatch(
                f"{where}: other bits than the same query in {first_bits[query][0].split(' in ', 1)[1]}",
                "Your splits are right, so the merge is what moved: add the splits in one order fixed by their "
                "positions (first to last), over the query's own splits only (none past length).",
            )
    return None


def _sizes_hint(used: list[int]) -> str:
    if not used:
        return "partial was never called: compute each split's (m, l, acc) with partial(q, split_keys, split_values)."
    return (
        "Splits of another size than split_size: a fixed NUMBER of splits (len(keys) / n keys each) moves its cuts "
        "with the tensor's width (the batch's longest context, the prompt's length) or the query's length, and with "
        "them the order of the sum. Cut at multiples of split_size from key 0: range(0, length, split_size)."
    )


register(
    diagnosed(
        Exercise(
            id="lab13.split_kv",
            functions=("split_kv_attention",),
            answers=("labkit.labs.lab13.split_kv.course_split_kv_attention",),
            make_inputs=split_cases,
            run=_run,
            oracle=_oracle,
            compare=_compare,
            tested="split_kv_attention on four seeded queries of a 21-40 key prompt (one inside the first split, two "
            "later, one with scores in the hundreds), each in decode, a chunk, the prompt's prefill and a padded "
            "crowd, split sizes 4 or 8: close to attention, splits of split_size keys, the same bits in all four",
            hint="Splits [s, min(s + split_size, length)) for s in range(0, length, split_size); each gives (m, l, acc) "
            "from partial; scale each by exp(m - M) and add them first to last; divide. "
            'labkit.hint("lab13.split_kv") shows more.',
        )
    )
)

register_hints(
    "lab13.split_kv",
    "Where a split starts must not depend on how wide the tensor is: count splits from key 0 in steps of split_size "
    "and stop at length. Then each query's splits are the same keys in a decode, a prefill or a crowd.",
    "parts = [partial(q, keys[s:e], values[s:e]) for s in range(0, length, split_size) with e = min(s + split_size, "
    "length)]. Each part's l and acc are relative to its own max m: bring them to the largest, M.",
    "M = torch.stack([m for m, _, _ in parts]).amax(0); then, first to last: total += exp(m - M) * l and acc += "
    "exp(m - M)[:, None] * a; return acc / total[:, None].",
)
