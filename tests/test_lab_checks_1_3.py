"""The checks of labs 1-3: a right answer passes, and each typical wrong answer fails saying what is wrong.

The right answers are the solutions in the lab sources (labs/source/*.ipynb), executed here;
the wrong ones are small edits of them, each a mistake learners really make.
"""

from __future__ import annotations

import math
from pathlib import Path

import nbformat
import pytest
import torch

from labkit.grading import evaluate
from labkit.kv.attention import attention as labkit_attention
from labkit.kv.attention import causal_mask as labkit_causal_mask

SOURCES = Path(__file__).resolve().parents[1] / "labs" / "source"
LAB_FILES = {"lab1": "lab1_prefill_decode.ipynb", "lab2": "lab2_kv_cache.ipynb", "lab3": "lab3_static_batching.ipynb"}


def _solutions(lab: str) -> dict:
    """The namespace a learner who solved every exercise has: the setup cell, then each exercise cell."""
    notebook = nbformat.read(SOURCES / LAB_FILES[lab], as_version=4)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    namespace: dict = {}
    exec(cells[0].source, namespace)
    for cell in cells:
        if any(tag.startswith("exercise:") for tag in cell.metadata.get("tags", [])):
            exec(cell.source, namespace)
    return namespace


@pytest.fixture(scope="module")
def lab1():
    return _solutions("lab1")


@pytest.fixture(scope="module")
def lab2():
    return _solutions("lab2")


@pytest.fixture(scope="module")
def lab3():
    return _solutions("lab3")


def assert_fails(result, *phrases: str) -> None:
    assert not result.passed, result.message
    assert result.status in ("fail", "error"), result.message
    for phrase in phrases:
        assert phrase.lower() in result.message.lower(), f"{phrase!r} not in:\n{result.message}"


def assert_passes(result, *phrases: str) -> None:
    assert result.passed, result.message
    assert result.message.startswith("PASS")
    for phrase in phrases:
        assert phrase.lower() in result.message.lower(), f"{phrase!r} not in:\n{result.message}"
    if not phrases:
        assert "Note:" not in result.message, result.message


def with_function(lab: str, function, name: str | None = None) -> dict:
    """A solved notebook of its own in which one function is redefined (as running a cell again would)."""
    namespace = _solutions(lab)
    namespace[name or function.__name__] = function
    return namespace


def verdicts(lab: str, namespace: dict) -> dict[str, str]:
    """Every exercise of the lab checked on ``namespace``: its status and message, by function name."""
    from labkit.grading.checks import exercises_for_lab

    return {exercise.functions[0]: evaluate(exercise.id, namespace=namespace) for exercise in exercises_for_lab(lab)}


def assert_one_point_lost(results: dict, wrong: str, *phrases: str) -> None:
    """Only the exercise of the wrong function fails (naming the mistake); each later one that calls it
    passes, with a note that names the wrong piece."""
    assert_fails(results[wrong], *phrases)
    for name, result in results.items():
        if name != wrong:
            assert result.passed, result.message


# --- every solution passes, and a blank says "not done" ------------------------------------


@pytest.mark.parametrize(
    "lab, exercises",
    [
        pytest.param("lab1", ["causal_mask", "attention", "prefill", "generate_without_cache"], marks=pytest.mark.lab1),
        pytest.param(
            "lab2",
            ["kv_cache", "generate_with_cache", "kv_bytes_per_token", "conversations_that_fit"],
            marks=pytest.mark.lab2,
        ),
        pytest.param(
            "lab3", ["left_pad", "padded_causal_mask", "generate_static_batch", "padding_waste"], marks=pytest.mark.lab3
        ),
    ],
)
def test_solutions_pass(lab, exercises, request):
    namespace = request.getfixturevalue(lab)
    for name in exercises:
        assert_passes(evaluate(f"{lab}.{name}", namespace=namespace))


@pytest.mark.lab1
def test_a_blank_exercise_reads_not_done(lab1):
    def causal_mask(num_tokens):
        raise NotImplementedError("Exercise lab1.causal_mask: replace this line with your code")

    result = evaluate("lab1.causal_mask", causal_mask)
    assert result.status == "not_done" and "not done" in result.message.lower()
    assert "Traceback" not in result.message


# --- lab 1 ----------------------------------------------------------------------------------


@pytest.mark.lab1
def test_an_inverted_mask_is_named_and_costs_only_its_own_point(lab1):
    def causal_mask(num_tokens):  # the nn.MultiheadAttention convention: True = hidden
        return torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)

    assert_fails(evaluate("lab1.causal_mask", causal_mask), "True must mean *may look*", "marks the hidden keys")
    results = verdicts("lab1", with_function("lab1", causal_mask))
    assert_one_point_lost(results, "causal_mask", "True must mean *may look*")
    for later in ("prefill", "generate_without_cache"):
        assert_passes(results[later], f"your {later} is right", "your causal_mask (exercise 1) still fails")


@pytest.mark.lab1
def test_a_wrong_prefill_costs_only_its_own_point(lab1):
    namespace = _solutions("lab1")  # a notebook of its own: the later functions call what it defines
    exec(
        "def prefill(model, prompt_ids):\n"
        "    ids = torch.tensor(prompt_ids[:-1])\n"
        "    mask = causal_mask(len(ids))\n"
        "    return model.forward(ids, torch.arange(len(ids)), lambda layer, q, k, v: attention(q, k, v, mask))\n",
        namespace,
    )
    results = verdicts("lab1", namespace)
    assert_one_point_lost(results, "prefill", "the prompt's last token is missing")
    assert_passes(results["generate_without_cache"], "your prefill (exercise 3) still fails")


@pytest.mark.lab1
def test_mask_of_the_future_and_mask_without_diagonal_are_named():
    assert_fails(evaluate("lab1.causal_mask", lambda n: torch.triu(torch.ones(n, n, dtype=torch.bool))), "j <= i")
    assert_fails(
        evaluate("lab1.causal_mask", lambda n: torch.tril(torch.ones(n, n, dtype=torch.bool), -1)),
        "diagonal",
        "look at itself",
    )


@pytest.mark.lab1
def test_attention_without_scaling_wrong_head_pairing_and_transposed_output_fail(lab1):
    def unscaled(q, k, v, mask):
        return lab1["attention"](q * math.sqrt(q.shape[-1]), k, v, mask)

    def tiled_heads(q, k, v, mask):
        group = q.shape[1] // k.shape[1]
        return lab1["attention"](q, k.repeat(1, group, 1), v.repeat(1, group, 1), mask)

    def heads_first(q, k, v, mask):
        return lab1["attention"](q, k, v, mask).transpose(0, 1)

    def softmax_over_queries(q, k, v, mask):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
        return torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(dim=1), v)

    def masked_to_zero(q, k, v, mask):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
        return torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, 0.0).softmax(dim=-1), v)

    assert_fails(evaluate("lab1.attention", softmax_over_queries), "softmax runs over the queries")
    assert_fails(evaluate("lab1.attention", masked_to_zero), "Masked scores were set to 0", "-inf")
    assert_fails(evaluate("lab1.attention", unscaled), "sqrt(head_dim)")
    assert_fails(evaluate("lab1.attention", tiled_heads), "repeat_interleave")
    assert_fails(evaluate("lab1.attention", heads_first), "shape", "wrong order")


@pytest.mark.lab1
def test_prefill_mistakes_are_named(lab1):
    attention = lab1["attention"]

    def not_causal(model, prompt):
        n = len(prompt)
        everything = torch.ones(n, n, dtype=torch.bool)
        return model.forward(
            torch.tensor(prompt), torch.arange(n), lambda layer, q, k, v: attention(q, k, v, everything)
        )

    def positions_from_one(model, prompt):
        n = len(prompt)
        mask = lab1["causal_mask"](n)
        return model.forward(
            torch.tensor(prompt), torch.arange(1, n + 1), lambda layer, q, k, v: attention(q, k, v, mask)
        )

    def heads_first(model, prompt):
        n = len(prompt)
        mask = lab1["causal_mask"](n)
        return model.forward(
            torch.tensor(prompt), torch.arange(n), lambda layer, q, k, v: attention(q, k, v, mask).transpose(0, 1)
        )

    assert_fails(evaluate("lab1.prefill", not_causal), "layer 0", "not causal")
    assert_fails(evaluate("lab1.prefill", positions_from_one), "position expected 0, got 1", "off by +1")
    assert_fails(evaluate("lab1.prefill", heads_first), "layer 0", "transposed")


@pytest.mark.lab1
def test_decoding_without_cache_mistakes_are_named(lab1):
    prefill = lab1["prefill"]

    def only_new_token(model, prompt, steps):
        tokens, sequence = [], list(prompt)
        for _ in range(steps):
            tokens.append(int(prefill(model, sequence)[-1].argmax()))
            sequence = tokens[-1:]
        return tokens

    def first_row(model, prompt, steps):
        sequence = list(prompt)
        for _ in range(steps):
            sequence.append(int(prefill(model, sequence)[0].argmax()))
        return sequence[len(prompt) :]

    def with_prompt(model, prompt, steps):
        sequence = list(prompt)
        for _ in range(steps):
            sequence.append(int(prefill(model, sequence)[-1].argmax()))
        return sequence

    def stops_at_end_of_text(model, prompt, steps):
        sequence = list(prompt)
        for _ in range(steps):
            sequence.append(int(prefill(model, sequence)[-1].argmax()))
            if sequence[-1] == model.tokenizer.eos_token_id:
                break
        return sequence[len(prompt) :]

    def at_least_one(model, prompt, steps):
        sequence = list(prompt)
        while True:
            sequence.append(int(prefill(model, sequence)[-1].argmax()))
            if len(sequence) - len(prompt) >= steps:
                return sequence[len(prompt) :]

    assert_fails(evaluate("lab1.generate_without_cache", only_new_token), "step 1", "whole sequence")
    assert_fails(evaluate("lab1.generate_without_cache", first_row), "last row")
    result = evaluate("lab1.generate_without_cache", with_prompt)
    assert_fails(result, "the prompt's", "return only the new tokens")
    assert "each step must run the whole sequence" not in result.message
    assert_fails(evaluate("lab1.generate_without_cache", stops_at_end_of_text), "end-of-text", "exactly max_new_tokens")
    assert_fails(evaluate("lab1.generate_without_cache", at_least_one), "max_new_tokens=0", "no times")


# --- lab 2 ----------------------------------------------------------------------------------


def _forgetful_cache(lab2):
    """A KVCache whose append keeps only the newest pass: the cache is never appended to."""

    class Forgetful(lab2["KVCache"]):
        def append(self, layer, k, v):
            self.keys[layer], self.values[layer] = k, v
            return k, v

    return Forgetful


@pytest.mark.lab2
def test_cache_not_appended_and_not_causal_are_named(lab2):
    class NotCausal(lab2["KVCache"]):
        def attend(self, layer, q, k, v):
            keys, values = self.append(layer, k, v)
            return labkit_attention(q, keys, values, None)

    assert_fails(evaluate("lab2.kv_cache", _forgetful_cache(lab2)), "pass 1, layer 0", "is the cache appended")
    assert_fails(evaluate("lab2.kv_cache", NotCausal), "pass 0, layer 0", "not causal")


def _cached_generate(
    cache_class,
    position_shift: int = 0,
    feed_everything: bool = False,
    extra_pass: bool = False,
    with_prompt: bool = False,
):
    def generate(model, prompt, steps):
        cache = cache_class(model.config.num_layers)
        logits = model.forward(torch.tensor(prompt), torch.arange(len(prompt)), cache.attend)
        tokens = []
        while True:
            tokens.append(int(logits[-1].argmax()))
            if len(tokens) == steps:
                if extra_pass:  # a wasted pass for a token nobody asked for
                    model.forward(torch.tensor(tokens[-1:]), torch.tensor([cache.length]), cache.attend)
                return prompt + tokens if with_prompt else tokens
            if feed_everything:
                sequence = prompt + tokens
                cache = cache_class(model.config.num_layers)
                logits = model.forward(torch.tensor(sequence), torch.arange(len(sequence)), cache.attend)
            else:
                position = torch.tensor([cache.length + position_shift])
                logits = model.forward(torch.tensor(tokens[-1:]), position, cache.attend)

    return generate


def _generate_verdict(cache_class, **mistake):
    """The check of exercise 2 on a decoding loop with one mistake, using ``cache_class`` as its KVCache."""
    return evaluate("lab2.generate_with_cache", _cached_generate(cache_class, **mistake), cache_class)


@pytest.mark.lab2
def test_decoding_with_cache_mistakes_are_named(lab2):
    assert_passes(_generate_verdict(lab2["KVCache"]))
    assert_fails(
        _generate_verdict(lab2["KVCache"], position_shift=1), "step 1", "off by +1", "number of tokens already cached"
    )
    assert_fails(_generate_verdict(lab2["KVCache"], feed_everything=True), "step 1", "only the newest")


@pytest.mark.lab2
def test_a_broken_cache_is_blamed_on_exercise_1_not_on_the_positions(lab2):
    result = _generate_verdict(_forgetful_cache(lab2))
    assert_fails(result, "does not pass exercise 1's check", "is the cache appended", "fix exercise 1 first")
    assert "position expected" not in result.message


@pytest.mark.lab2
def test_returning_the_prompt_too_is_named_not_blamed_on_feeding_back(lab2):
    result = _generate_verdict(lab2["KVCache"], with_prompt=True)
    assert_fails(result, "the prompt's", "return only the new tokens")
    assert "feed back" not in result.message.lower()


@pytest.mark.lab2
def test_a_wasted_forward_pass_fails_one_token_per_pass(lab2):
    assert_fails(
        _generate_verdict(lab2["KVCache"], extra_pass=True),
        "4 forward passes for 3 new tokens",
        "needs no pass after it",
    )


@pytest.mark.lab2
def test_a_square_mask_fails_on_a_step_of_several_tokens(lab2):
    class SquareMask(lab2["KVCache"]):
        def attend(self, layer, q, k, v):
            keys, values = self.append(layer, k, v)
            return labkit_attention(q, keys, values, labkit_causal_mask(len(q), len(q)))

    result = evaluate("lab2.kv_cache", SquareMask)
    assert_fails(result, "your function attend raised RuntimeError", "of your cell", "one row per new query")


@pytest.mark.lab2
def test_kv_bytes_mistakes_are_named():
    def only_keys(config, dtype):
        return config.num_layers * config.num_kv_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()

    def query_heads(config, dtype):
        return 2 * config.num_layers * config.num_heads * config.head_dim * torch.empty((), dtype=dtype).element_size()

    assert_fails(evaluate("lab2.kv_bytes_per_token", only_keys), "SmolLM2", "key and a value")
    assert_fails(evaluate("lab2.kv_bytes_per_token", query_heads), "num_kv_heads")


@pytest.mark.lab2
def test_capacity_mistakes_are_named():
    def weights_forgotten(memory, weights, per_token, context, fraction=0.9):
        return int(memory * fraction // (per_token * context))

    def negative(memory, weights, per_token, context, fraction=0.9):
        return math.floor((memory * fraction - weights) / (per_token * context))

    assert_fails(evaluate("lab2.conversations_that_fit", weights_forgotten), "expected 4", "subtract the weights")
    assert_fails(evaluate("lab2.conversations_that_fit", negative), "28 GB of weights", "never negative")


# --- lab 3 ----------------------------------------------------------------------------------


def _right_pad(prompts, pad_id):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id)
    is_real = torch.zeros(len(prompts), width, dtype=torch.bool)
    positions = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt)
        is_real[row, : len(prompt)] = True
        positions[row, : len(prompt)] = torch.arange(len(prompt))
    return ids, is_real, positions


@pytest.mark.lab3
def test_padding_mistakes_are_named(lab3):
    def from_row_start(prompts, pad_id):
        ids, is_real, _ = lab3["left_pad"](prompts, pad_id)
        return ids, is_real, torch.arange(ids.shape[1]).expand_as(ids).clone()

    def integer_flags(prompts, pad_id):
        ids, is_real, positions = lab3["left_pad"](prompts, pad_id)
        return ids, is_real.long(), positions

    def pads_are_zero(prompts, pad_id):
        return lab3["left_pad"](prompts, 0)

    assert_fails(evaluate("lab3.left_pad", _right_pad), "right padding", "LEFT")
    assert_fails(evaluate("lab3.left_pad", from_row_start), "start of the row", "first real token is at 0")
    assert_fails(evaluate("lab3.left_pad", integer_flags), "is_real has dtype torch.int64", "bool")
    for seed in range(5):  # the pad id is never 0, whatever the seed
        assert_fails(evaluate("lab3.left_pad", pads_are_zero, seed=seed), "ids at")


@pytest.mark.lab3
def test_mask_mistakes_are_named(lab3):
    right = lab3["padded_causal_mask"]

    def pads_visible(key_is_real, num_queries):
        return labkit_causal_mask(num_queries, key_is_real.shape[1])[None].expand(key_is_real.shape[0], -1, -1).clone()

    def not_causal(key_is_real, num_queries):
        return key_is_real[:, None, :].expand(-1, num_queries, -1).clone()

    assert_fails(evaluate("lab3.padded_causal_mask", pads_visible), "pads are visible")
    assert_fails(evaluate("lab3.padded_causal_mask", not_causal), "not causal")
    assert_fails(evaluate("lab3.padded_causal_mask", lambda r, n: right(r, n).transpose(1, 2)), "swapped")


def _pads_visible(key_is_real, num_queries):
    return labkit_causal_mask(num_queries, key_is_real.shape[1])[None].expand(key_is_real.shape[0], -1, -1).clone()


@pytest.mark.lab3
@pytest.mark.parametrize(
    "wrong, piece, phrase",
    [("left_pad", _right_pad, "right padding"), ("padded_causal_mask", _pads_visible, "pads are visible")],
)
def test_a_wrong_pad_or_mask_costs_only_its_own_point(lab3, wrong, piece, phrase):
    results = verdicts("lab3", with_function("lab3", piece, wrong))
    assert_one_point_lost(results, wrong, phrase)
    number = 1 if wrong == "left_pad" else 2
    assert_passes(
        results["generate_static_batch"],
        "your generate_static_batch is right",
        f"your {wrong} (exercise {number}) still fails",
    )
    assert "Note:" not in results["padding_waste"].message


def _batch_with(lab3, body: str):
    """The solved generate_static_batch with one line replaced (``old -> new``), defined in the lab's namespace."""
    old, new = body.split(" -> ")
    source = _solved_source("lab3", "generate_static_batch")
    assert old in source, old
    namespace = dict(lab3)
    exec(source.replace(old, new), namespace)
    return namespace["generate_static_batch"]


def _solved_source(lab: str, name: str) -> str:
    notebook = nbformat.read(SOURCES / LAB_FILES[lab], as_version=4)
    return next(cell.source for cell in notebook.cells if f"exercise:{lab}.{name}" in cell.metadata.get("tags", []))


@pytest.mark.lab3
@pytest.mark.parametrize(
    "edit, phrases",
    [
        pytest.param(
            "        if step == max(max_new_tokens) - 1:\n            break\n -> ",
            ("decode passes", "wasted"),
            id="one wasted pass at the end",
        ),
        pytest.param(
            "            if len(outputs[row]) < max_new_tokens[row]: -> "
            "            if len(outputs[row]) < max_new_tokens[row] and model.tokenizer.eos_token_id not in outputs[row]:",
            ("end-of-text",),
            id="a row stopped at end-of-text",
        ),
        pytest.param(
            "            if len(outputs[row]) < max_new_tokens[row]: -> "
            "            if len(outputs[row]) < max(max_new_tokens[row], 1):",
            ("none when it is 0",),
            id="one token for a row asked for none",
        ),
        pytest.param(
            "    next_positions = torch.tensor([len(p) for p in prompts], device=device) -> "
            "    next_positions = torch.full((rows,), width, device=device)",
            ("padded width",),
            id="positions from the padded width",
        ),
    ],
)
def test_static_batch_decoding_mistakes_are_named(lab3, edit, phrases):
    assert_fails(evaluate("lab3.generate_static_batch", _batch_with(lab3, edit)), *phrases)


@pytest.mark.lab3
def test_static_batch_mistakes_are_named(lab3):
    generate = lab3["generate_static_batch"]

    def until_shortest(model, prompts, max_new, pad_id):
        shortest = min(max_new)
        return [out[:shortest] for out in generate(model, prompts, [shortest] * len(prompts), pad_id)]

    assert_fails(evaluate("lab3.generate_static_batch", until_shortest), "LONGEST")


@pytest.mark.lab3
def test_waste_with_one_global_longest_is_named(lab3):
    def global_longest(output_lens, batch_size):
        useful = sum(output_lens)
        total = max(output_lens) * len(output_lens)
        return {"useful": useful, "padded": total - useful, "utilisation": useful / total}

    assert_fails(evaluate("lab3.padding_waste", global_longest), "ITS OWN longest")
