"""Lab 2, exercise 1: a per-sequence KV cache, fed passes of several sizes and checked at every layer; exercise 2 runs
this same check on the side, to blame a wrong decoding on the cache it uses."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.diagnose import check_attention, diagnosed
from labkit.labs.common.shared import on_check_device, torch_generator
from labkit.labs.hints import register_hints

# A prefill of 3 tokens, a decode step, a 2-token step (as a chunk of a prompt would be), a decode step.
# The 2-token step is what tells a [new queries x all keys] mask from a square one.
PASS_LENGTHS = (3, 1, 2, 1)


def cache_inputs(seed: int) -> tuple[list[list[tuple[torch.Tensor, ...]]]]:
    generator = torch_generator(seed)
    # per pass and layer: q with 4 query heads, k and v with 2 KV heads
    passes = [
        [tuple(torch.randn(length, heads, 8, generator=generator) for heads in (4, 2, 2)) for _layer in range(2)]
        for length in PASS_LENGTHS
    ]
    return on_check_device((passes,))


def run_cache(functions, inputs) -> dict[str, Any]:
    cache = functions[0](2)
    calls, lengths, seen = [], [], 0
    for layers in inputs[0]:
        records = []
        for layer, (q, k, v) in enumerate(layers):
            records.append({"q": q, "k": k, "v": v, "out": cache.attend(layer, q, k, v)})
        calls.append({"positions": torch.arange(seen, seen + len(q)), "attention": records})
        seen += len(q)
        lengths.append(cache.length)
    return {"calls": calls, "lengths": lengths}


def cache_oracle(inputs) -> dict[str, Any]:
    """Attention over everything seen so far, per pass and layer, and the running token count."""
    history: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    outs = []
    for layers in inputs[0]:
        for layer, (q, k, v) in enumerate(layers):
            old_k, old_v = history.get(layer, (k[:0], v[:0]))
            keys, values = torch.cat([old_k, k]), torch.cat([old_v, v])
            history[layer] = (keys, values)
            outs.append(attention(q, keys, values, causal_mask(len(q), len(keys), q.device)))
    return {"outs": outs, "lengths": list(itertools.accumulate(PASS_LENGTHS))}


def compare_cache(expected, got) -> Mismatch | None:
    lengths = got["lengths"]
    mismatch = check_attention(got["calls"], keeps_history=True)
    if mismatch is not None:
        return Mismatch(mismatch.difference.replace("forward call", "pass"), mismatch.hint)
    outs = [record["out"] for call in got["calls"] for record in call["attention"]]
    mismatch = compare_sequences(
        expected["outs"], outs, lambda e, g: compare_tensors(e, g, atol=1e-4, rtol=1e-4), item="(pass, layer)"
    )
    if mismatch is not None:
        return mismatch
    if [int(n) for n in lengths] != expected["lengths"]:
        return Mismatch(
            f"cache.length after passes of {list(PASS_LENGTHS)} tokens was {lengths}, expected {expected['lengths']}",
            "length is the number of tokens cached so far (the size of dim 0 of a layer's keys).",
        )
    return None


def _cache_error_hint(record: dict[str, Any]) -> str | None:
    """A size error in attend is, in practice, a mask that is not [new queries x all keys]."""
    if "size" in record["message"]:
        return (
            "With tokens already cached, a pass's queries see more keys than there are queries: the mask must "
            "have one row per new query and one column per key, cached ones included (a square mask only works "
            "for the first pass, and a 1-token step hides the mistake by broadcasting)."
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab2.kv_cache",
            functions=("KVCache",),
            answers=("labkit.kv.contiguous.ContiguousKVCache",),
            make_inputs=cache_inputs,
            run=run_cache,
            oracle=cache_oracle,
            compare=compare_cache,
            tested="KVCache(2) fed passes of 3, 1, 2 and 1 tokens (4 query heads, 2 KV heads): every attend output "
            "equals attention over all keys cached so far (causal for the new queries), and length counts them",
            hint="A layer's cache grows by this pass's rows, after the ones it holds; attention then reads all of them, "
            "with a mask that lets each new query see the cached keys and the new keys up to itself. "
            'labkit.hint("lab2.kv_cache") shows more.',
        ),
        known=_cache_error_hint,
    )
)

register_hints(
    "lab2.kv_cache",
    "Each layer keeps the keys and values of every token seen so far, in token order. A pass adds its own rows "
    "after them; attention then reads everything the layer holds, since a new token may look at every earlier one.",
    "append: the first time a layer is seen, store k and v as they are; later, join the new rows after the stored "
    "ones along the token axis, and return all of the layer's keys and values. attend: append first, then attend "
    "from q over everything append returned.",
    "torch.cat([old, new]) joins along dim 0, the token axis. The mask is causal_mask(len(q), len(keys), q.device): "
    "one row per new query and one column per key, the cached keys included.",
)
