"""Lab 2, the KV cache: the checks for its four exercises.

The learner writes a per-sequence cache (append this pass's K and V, attend over all of it),
decoding that feeds one token per step through it, the KV bytes a token leaves behind, and
how many conversations fit in a GPU's memory. The oracle for decoding is the run without a
cache, through Hugging Face transformers' own forward pass, compared at every step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_sequences, compare_tensors, compare_tokens
from labkit.grading.result import Mismatch
from labkit.kv.attention import attention, causal_mask
from labkit.labs.common.diagnose import check_attention, check_logits, check_positions, diagnosed, raised_mismatch
from labkit.labs.common.learner_errors import capture, raised_in
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import greedy_without_cache, on_check_device, prompt_and_steps, rng, torch_generator
from labkit.labs.hints import register_hints
from labkit.models.config import ModelConfig

# --- lab2.kv_cache ------------------------------------------------------------------------

# A prefill of 3 tokens, a decode step, a 2-token step (as a chunk of a prompt would be), a decode step.
# The 2-token step is what tells a [new queries x all keys] mask from a square one.
PASS_LENGTHS = (3, 1, 2, 1)


def _cache_inputs(seed: int) -> tuple[list[list[tuple[torch.Tensor, ...]]]]:
    generator = torch_generator(seed)
    passes = []
    for length in PASS_LENGTHS:
        passes.append(
            [
                (
                    torch.randn(length, 4, 8, generator=generator),
                    torch.randn(length, 2, 8, generator=generator),
                    torch.randn(length, 2, 8, generator=generator),
                )
                for _layer in range(2)
            ]
        )
    return on_check_device((passes,))


def _run_cache(functions, inputs) -> dict[str, Any]:
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


def _cache_oracle(inputs) -> dict[str, Any]:
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


def _compare_cache(expected, got) -> Mismatch | None:
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
            make_inputs=_cache_inputs,
            run=_run_cache,
            oracle=_cache_oracle,
            compare=_compare_cache,
            tested="KVCache(2) fed passes of 3, 1, 2 and 1 tokens (4 query heads, 2 KV heads): every attend output "
            "equals attention over all keys cached so far (causal for the new queries), and length counts them",
            hint="A layer's cache grows by this pass's rows, after the ones it holds; attention then reads all of them, "
            "with a mask that lets each new query see the cached keys and the new keys up to itself. "
            'labkit.hint("lab2.kv_cache") shows more.',
        ),
        known=_cache_error_hint,
    )
)


# --- lab2.generate_with_cache -------------------------------------------------------------


def _generate_inputs(seed: int) -> dict[str, Any]:
    """The course model, a prompt and a token count; and exercise 1's inputs, to check the cache it uses."""
    return {"generate": prompt_and_steps(seed), "cache": _cache_inputs(seed)}


def _run_generate(functions, inputs) -> dict[str, Any]:
    model, ids, steps = inputs["generate"]
    recording = RecordingModel(model)
    tokens = capture(functions, lambda: functions[0](recording, list(ids), steps))
    return {
        "tokens": tokens,
        "calls": recording.calls,
        "cache": capture(functions[1:], lambda: _run_cache(functions[1:], inputs["cache"])),
    }


def _generate_oracle(inputs) -> dict[str, Any]:
    return {**greedy_without_cache(inputs["generate"]), "cache": _cache_oracle(inputs["cache"])}


def _decoding_problem(expected, got) -> Mismatch | None:
    """The first thing wrong with the decoding itself: its passes, positions, attention, logits, tokens."""
    prompt, calls, steps, tokens = expected["prompt"], got["calls"], len(expected["tokens"]), got["tokens"]
    record = raised_in(tokens)
    if record is not None:
        return raised_mismatch(record, None)
    if not calls:
        return Mismatch("model.forward was never called", "Prefill the prompt once, then one pass per new token.")
    if calls[0]["input_ids"].tolist() != prompt:
        return Mismatch(
            f"the first forward pass got {calls[0]['input_ids'].tolist()}, expected the prompt {prompt}",
            "Start with one prefill pass over the whole prompt.",
        )
    mismatch = check_positions(calls[0]["positions"], list(range(len(prompt))), "the prefill pass")
    if mismatch:
        return mismatch
    for step, call in enumerate(calls[1:], start=1):
        sent = call["input_ids"].tolist()
        if len(sent) != 1:
            return Mismatch(
                f"step {step}: model.forward got {len(sent)} tokens, expected only the newest one",
                "With a cache the earlier tokens' K and V are already stored: feed just the token you "
                "picked last, and let attention read the rest from the cache.",
            )
        picked = int(calls[step - 1]["logits"][-1].argmax())  # what the pass before chose, whatever was returned
        if sent[0] != picked:
            return Mismatch(
                f"step {step}: model.forward got token {sent[0]}, but the pass before picked {picked}",
                "Feed back the token you just chose.",
            )
        mismatch = check_positions(call["positions"], [len(prompt) + step - 1], f"step {step}")
        if mismatch:  # a cache that forgets also miscounts: name the earlier cause when there is one
            return check_attention(calls[:step], keeps_history=True) or mismatch
    mismatch = check_attention(calls, keeps_history=True)
    if mismatch:
        return mismatch
    if len(calls) != steps:
        return Mismatch(
            f"{len(calls)} forward passes for {steps} new tokens, expected {steps}: one token per pass",
            "The prefill's logits already give the first new token, and each later pass gives one more, so the "
            "last token needs no pass after it."
            if len(calls) > steps
            else "Each new token after the first needs one decode pass.",
        )
    mismatch = compare_sequences(
        expected["logits"],
        [call["logits"][-1] for call in calls],
        lambda e, g: check_logits(e, g, "logits"),
        item="step",
    )
    if mismatch:
        return mismatch
    if isinstance(tokens, list) and len(tokens) == len(prompt) + steps and tokens[: len(prompt)] == prompt:
        return Mismatch(
            f"you returned {len(tokens)} tokens: the prompt's {len(prompt)} and then the {steps} new ones",
            "Return only the new tokens (the caller already has the prompt).",
        )
    return compare_tokens(expected["tokens"], tokens)


def _compare_generate(expected, got) -> Mismatch | None:
    """Decoding first; when it is wrong and exercise 1's cache is wrong too, the cache is named as the cause."""
    problem = _decoding_problem(expected, got)
    if problem is None:
        return None
    record = raised_in(got["cache"])
    cache_problem = raised_mismatch(record, None) if record else _compare_cache(expected["cache"], got["cache"])
    if cache_problem is None:
        return problem
    return Mismatch(
        f"your KVCache does not pass exercise 1's check yet ({cache_problem.difference}), and this decoding uses it",
        "Fix exercise 1 first, then run this check again. "
        + (cache_problem.hint or "Run exercise 1's check: it says where the cache goes wrong."),
    )


register(
    Exercise(
        id="lab2.generate_with_cache",
        functions=("generate_with_cache", "KVCache"),
        answers=("labkit.kv.contiguous.ContiguousKVCache",),  # exercise 1's: no labkit function decodes for it
        make_inputs=_generate_inputs,
        run=_run_generate,
        oracle=_generate_oracle,
        compare=_compare_generate,
        tested="generate_with_cache(model, prompt, n) with the default model: one prefill pass, then one token per pass at "
        "the right position (n passes in all), attention over the whole cache, the logits at every step equal to the "
        "run without a cache (transformers' own forward pass over the whole sequence), and only the n new tokens "
        "returned",
        hint="Prefill the whole prompt once through a fresh cache; then feed only the newest token, at the position "
        'that counts the tokens already cached. labkit.hint("lab2.generate_with_cache") shows more.',
    )
)

# --- lab2.kv_bytes_per_token --------------------------------------------------------------


def _config(name: str, layers: int, heads: int, kv_heads: int, head_dim: int) -> ModelConfig:
    return ModelConfig(
        name=name,
        architecture="llama",
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=heads * head_dim,
        intermediate_size=4 * heads * head_dim,
        vocab_size=1000,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
    )


SHAPES = (
    ("SmolLM2-135M", 30, 9, 3, 64),
    ("Llama-3.1-8B", 32, 32, 8, 128),
    ("Qwen3-8B", 36, 32, 8, 128),
    ("Llama-3.1-70B", 80, 64, 8, 128),
)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bytes_inputs(seed: int) -> tuple[list[tuple[ModelConfig, torch.dtype]]]:
    pick = rng(seed)
    cases = [(_config(*SHAPES[0]), torch.float32), (_config(*SHAPES[1]), torch.bfloat16)]
    cases.append((_config(*pick.choice(SHAPES[2:])), pick.choice(DTYPES)))
    return (cases,)


def _compare_bytes(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["bytes"]):
        return Mismatch(f"expected a list of {len(expected['bytes'])} numbers, got {got!r}")
    for index, (want, have, shape) in enumerate(zip(expected["bytes"], got, expected["shapes"])):
        if isinstance(have, (int, float)) and have == want:
            continue
        shown = f"{have:,}" if isinstance(have, (int, float)) else repr(have)
        where = f"{shape['name']} in {shape['dtype']}: expected {want:,} bytes per token, got {shown}"
        if not isinstance(have, (int, float)):
            return Mismatch(where, "Return a whole number of bytes (an int).")
        hints = {
            want / 2: "That is half: a token stores a key AND a value at every layer (the factor 2).",
            want * shape["heads"] / shape["kv_heads"]: "You counted query heads. Only the KV heads are cached "
            "(grouped-query attention): use num_kv_heads.",
            want / shape["bytes"]: "That counts values, not bytes: multiply by the bytes per value of the dtype "
            "(torch.empty((), dtype=dtype).element_size()).",
            want / shape["layers"]: "Every layer keeps its own K and V: multiply by num_layers.",
        }
        return Mismatch(where, hints.get(have))
    return None


register(
    Exercise(
        id="lab2.kv_bytes_per_token",
        functions=("kv_bytes_per_token",),
        answers=("labkit.models.config.ModelConfig.kv_bytes_per_token",),
        make_inputs=_bytes_inputs,
        run=lambda functions, inputs: [functions[0](config, dtype) for config, dtype in inputs[0]],
        oracle=lambda inputs: {
            "bytes": [config.kv_bytes_per_token(dtype) for config, dtype in inputs[0]],
            "shapes": [
                {
                    "name": config.name,
                    "dtype": str(dtype).removeprefix("torch."),
                    "heads": config.num_heads,
                    "kv_heads": config.num_kv_heads,
                    "layers": config.num_layers,
                    "bytes": torch.empty((), dtype=dtype).element_size(),
                }
                for config, dtype in inputs[0]
            ],
        },
        compare=_compare_bytes,
        tested="kv_bytes_per_token(config, dtype) for SmolLM2-135M (fp32), Llama 3.1 8B (bf16) and one more model",
        hint="2 (K and V) x num_layers x num_kv_heads x head_dim x bytes per value.",
    )
)

# --- lab2.conversations_that_fit ----------------------------------------------------------

GB = 1e9


def _fit_inputs(seed: int) -> tuple[list[tuple[float, float, int, int, float]]]:
    pick = rng(seed)
    cases = [
        (24 * GB, 16 * GB, 131072, 8192, 0.85),  # an 8B model in 16 bits on a 24 GB card, 8K-token chats
        (80 * GB, 16 * GB, 131072, 1300, 0.9),  # the same model on an 80 GB card, 1,300-token chats
        (24 * GB, 28 * GB, 131072, 1024, 0.9),  # weights bigger than the card
        (
            pick.choice((40, 80, 141)) * GB,
            pick.choice((1, 16, 28)) * GB,
            pick.choice((61440, 131072, 163840)),
            pick.choice((2048, 4096, 32768)),
            pick.choice((0.8, 0.9, 0.95)),
        ),
    ]
    return (cases,)


def _fit_oracle(inputs) -> dict[str, list]:
    cases = inputs[0]
    right = [
        max(0, math.floor((memory * fraction - weights) / (per_token * context)))
        for memory, weights, per_token, context, fraction in cases
    ]
    return {"counts": right, "cases": [list(case) for case in cases]}


def _compare_fit(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["counts"]):
        return Mismatch(f"expected a list of {len(expected['counts'])} counts, got {got!r}")
    for (memory, weights, per_token, context, fraction), want, have in zip(expected["cases"], expected["counts"], got):
        if have == want and isinstance(have, int):
            continue
        where = (
            f"{memory / GB:.0f} GB card at {fraction:.0%}, {weights / GB:.0f} GB of weights, "
            f"{per_token:,} bytes per token, {context:,}-token conversations: expected {want}, got {have!r}"
        )
        per_conversation = per_token * context
        hints = {
            max(0, math.floor((memory - weights) / per_conversation)): "Only memory_fraction of the card is "
            "usable: multiply the memory by it before subtracting the weights.",
            math.floor(memory * fraction / per_conversation): "Subtract the weights first: they take their share "
            "of the memory before any KV cache does.",
            math.ceil((memory * fraction - weights) / per_conversation): "Round down: a conversation that only "
            "partly fits does not fit.",
            math.floor((memory * fraction - weights) / per_conversation): "When the weights alone do not fit, "
            "no conversation does: the answer is 0, never negative.",
        }
        if isinstance(have, float) and have.is_integer() and int(have) == want:
            return Mismatch(where, "Return an int (a count of conversations), not a float.")
        return Mismatch(where, hints.get(have) if have != want else None)
    return None


register(
    Exercise(
        id="lab2.conversations_that_fit",
        functions=("conversations_that_fit",),
        make_inputs=_fit_inputs,
        run=lambda functions, inputs: [functions[0](*case) for case in inputs[0]],
        oracle=_fit_oracle,
        compare=_compare_fit,
        tested="conversations_that_fit(gpu_memory_bytes, weight_bytes, kv_bytes_per_token, context_tokens, "
        "memory_fraction) on four cards and models, one whose weights do not fit",
        hint="floor((memory x fraction - weights) / (KV bytes per token x context tokens)), and 0 if that is negative.",
    )
)

# --- hints, from the idea to near-code (labkit.hint) ------------------------------------------

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
register_hints(
    "lab2.generate_with_cache",
    "Only the first pass needs the whole prompt; after it, the cache remembers every earlier token, so each pass "
    "feeds only the token picked last. The prefill's logits already give the first new token, so n new tokens take "
    "n passes.",
    "Make one KVCache for the sequence. Prefill: the prompt at positions 0 .. T-1, with the cache's attend as the "
    "callback. Then repeat: pick the argmax of the last row of logits; stop once you have n tokens; otherwise run "
    "a pass on that one token, at the position that counts the tokens already cached (cache.length).",
    "model.forward(torch.tensor(prompt_ids, device=model.device), torch.arange(T, device=model.device), "
    "cache.attend); then model.forward(torch.tensor([token], device=model.device), "
    "torch.tensor([cache.length], device=model.device), cache.attend). Return the new tokens only.",
)
register_hints(
    "lab2.kv_bytes_per_token",
    "Count what one token leaves at every layer: a key and a value, each one vector per KV head (not per query "
    "head), each number stored in the cache's dtype.",
    "Multiply 2 (key and value) by the layers, the KV heads and head_dim, then by the bytes one number takes.",
    "config.num_layers, config.num_kv_heads, config.head_dim; torch.empty((), dtype=dtype).element_size() is the "
    "bytes per number.",
)
register_hints(
    "lab2.conversations_that_fit",
    "The engine may use only a fraction of the card. The weights take their share of that first, and what remains "
    "holds the KV caches, one per conversation.",
    "usable = memory x fraction; left for caches = usable - weights; one conversation needs KV bytes per token x "
    "context tokens; count only whole conversations, and never fewer than none.",
    "Floor division (//) counts whole conversations; max(0, ...) turns weights that do not fit into 0; return an int.",
)
