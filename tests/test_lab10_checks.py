"""The checks of lab 10: the solved answers pass, typical wrong answers fail with a message that names them.

The answers are the solution cells of the lab source itself (so the tests cannot drift from the
notebook), and each wrong answer is that solution with one typical mistake edited in. Each is judged
under several seeds: a wrong answer must fail, named, under every one of them.
"""

from __future__ import annotations

import pytest
import torch
from lab_sources import solved_exercise

from labkit.capacity import SALE_EXAMPLE, plan, sale_load, size_fleet
from labkit.grading import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.labs import hints
from labkit.labs.lab10.course import course_round_trips
from labkit.labs.lab10.fleet import EXACT_MULTIPLES
from labkit.labs.lab10.runs import model_with_weights
from labkit.models import tiny_model
from labkit.models.quant import quantize_model

pytestmark = pytest.mark.lab10
FUNCTIONS = {
    "lab10.int8": ("quantize_int8", "dequantize_int8"),
    "lab10.int4": ("quantize_int4", "dequantize_int4"),
    "lab10.quality": ("measure_quality",),
    "lab10.fleet": ("fewest_gpus",),
}


def answer(exercise_id: str, edits: tuple[tuple[str, str], ...] = ()) -> tuple:
    """The solved functions of an exercise from the lab source, with each (old, new) edit applied to its cell first."""
    return solved_exercise(exercise_id, FUNCTIONS[exercise_id], edits)


INT8_SCALE = "scale = weight.abs().amax(dim=1) / 127"
INT8_CODES = "codes = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)"
INT4_CODES = "codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15)"
INT4_BACK = "return (codes.float() - zero_per_column) * scale_per_column"
INT4_ZERO = "zero = torch.round(-low / scale)"
INT8_ZERO_ROW = "    scale = scale.clamp(min=1e-8)  # a row of zeros: codes 0, not 0 / 0\n"
INT4_ZERO_GROUP = "    scale = scale.clamp(min=1e-8)  # a group of zeros: zero point and codes 0, not 0 / 0\n"
FLEET_REPLICAS = "math.ceil(load_per_s / replica.promise_load_per_s)"
SEEDS = (0, 1, 2)

CASES = [
    # (exercise, edits, expected status, words the message must contain)
    ("lab10.int8", (), PASS, "PASS"),
    (
        "lab10.int8",
        ((INT8_SCALE, "scale = weight.abs().max().repeat(weight.shape[0]) / 127"),),
        FAIL,
        "per-tensor scale",
    ),
    (
        "lab10.int8",
        (
            (INT8_SCALE, "scale = weight.abs().amax(dim=0) / 127"),
            ("weight / scale[:, None]", "weight / scale[None, :]"),
        ),
        FAIL,
        "an output channel is a row",
    ),
    (  # with the dequantizer written for the same layout, which fails on labkit's codes: the scale is named first
        "lab10.int8",
        (
            (INT8_SCALE, "scale = weight.abs().amax(dim=0) / 127"),
            ("weight / scale[:, None]", "weight / scale[None, :]"),
            ("return codes.float() * scale[:, None]", "return codes.float() * scale[None, :]"),
        ),
        FAIL,
        "an output channel is a row",
    ),
    ("lab10.int8", ((INT8_ZERO_ROW, ""),), PASS, "PASS"),  # scale 0 for a row of zeros: its codes cast to 0
    (
        "lab10.int8",
        ((INT8_ZERO_ROW, ""), (INT8_CODES, INT8_CODES.replace(".to(torch.int8)", ""))),
        FAIL,
        "0 / 0 is NaN",
    ),
    ("lab10.int8", ((INT8_CODES, INT8_CODES.replace("torch.round", "torch.floor")),), FAIL, "floor(w / scale)"),
    (
        "lab10.int8",
        ((INT8_CODES, "codes = (weight / scale[:, None]).clamp(-127, 127).to(torch.int8)"),),
        FAIL,
        "truncates",
    ),
    ("lab10.int8", ((INT8_SCALE, INT8_SCALE.replace("127", "128")),), FAIL, "divided by 128"),
    ("lab10.int8", ((INT8_CODES, INT8_CODES.replace(".to(torch.int8)", "")),), FAIL, "torch.int8"),
    (
        "lab10.int8",
        (("return codes.float() * scale[:, None]", "return codes.float() / scale[:, None]"),),
        FAIL,
        "multiply",
    ),
    (
        "lab10.int8",
        (("return codes.float() * scale[:, None]", "return codes.float() * scale[None, :]"),),
        FAIL,
        "scale[:, None]",
    ),
    ("lab10.int4", (), PASS, "PASS"),
    ("lab10.int4", ((INT4_CODES, INT4_CODES.replace(" + zero[..., None]", "")),), FAIL, "add the zero point"),
    (
        "lab10.int4",
        (
            (INT4_CODES, INT4_CODES.replace(" + zero[..., None]", "")),
            ("zero = torch.round(-low / scale)", "zero = 0 * low"),
        ),
        FAIL,
        "forgot the zero point",
    ),
    ("lab10.int4", ((INT4_BACK, "return codes.float() * scale_per_column"),), FAIL, "forgot the zero point"),
    ("lab10.int4", ((INT4_CODES, INT4_CODES.replace("torch.round(groups", "torch.floor(groups")),), FAIL, "floor"),
    (
        "lab10.int4",
        (
            ("    rows, columns = weight.shape\n", "    weight = weight.T\n    rows, columns = weight.shape\n"),
            ("return codes.to(torch.uint8), scale, zero.to(torch.uint8)", "return codes.T, scale.T, zero.T"),
        ),
        FAIL,
        "groups run down the columns",
    ),
    (  # with the dequantizer written for the same layout, which fails on labkit's codes: the groups are named first
        "lab10.int4",
        (
            ("    rows, columns = weight.shape\n", "    weight = weight.T\n    rows, columns = weight.shape\n"),
            ("return codes.to(torch.uint8), scale, zero.to(torch.uint8)", "return codes.T, scale.T, zero.T"),
            (
                "    columns = codes.shape[1]\n",
                "    codes, scale, zero = codes.T, scale.T, zero.T\n    columns = codes.shape[1]\n",
            ),
            (INT4_BACK, INT4_BACK + ".T"),
        ),
        FAIL,
        "groups run down the columns",
    ),
    (
        "lab10.int4",
        (
            ("zero_per_column = zero.float()", "zero_per_column = zero"),
            (INT4_BACK, "return (codes - zero_per_column).float() * scale_per_column"),
        ),
        FAIL,
        "uint8 arithmetic wraps around",
    ),
    (
        "lab10.int4",
        (("F.pad(weight, (0, -columns % group_size))", "F.pad(weight, (0, group_size - columns % group_size))"),),
        FAIL,
        "One group too many",
    ),
    (
        "lab10.int4",
        ((INT4_CODES, "codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)"),),
        FAIL,
        "round((w - low) / scale)",
    ),
    ("lab10.int4", ((INT4_ZERO, "zero = (-low / scale).floor()"),), FAIL, "truncates. Round first"),
    ("lab10.int4", ((INT4_ZERO, "zero = torch.round(low / scale)"),), FAIL, "You wrote round(low / scale)"),
    ("lab10.int4", ((INT4_ZERO_GROUP, ""),), PASS, "PASS"),  # scale 0 for a group of zeros: NaN casts to 0
    (
        "lab10.int4",
        ((".amin(dim=2).clamp(max=0)", ".amin(dim=2)"), (".amax(dim=2).clamp(min=0)", ".amax(dim=2)")),
        FAIL,
        "hold 0",
    ),
    ("lab10.int4", (("scale = (high - low) / 15", "scale = (high - low) / 16"),), FAIL, "not 16"),
    (
        "lab10.int4",
        (("    rows, columns = weight.shape\n", "    rows, columns = weight.shape\n    group_size = columns\n"),),
        FAIL,
        "int8's per-channel scheme",
    ),
    (
        "lab10.int4",
        (("    rows, columns = weight.shape\n", "    rows, columns = weight.shape\n    group_size = 128\n"),),
        FAIL,
        "Use the group_size you are given",
    ),
    (
        "lab10.int4",
        (("F.pad(weight, (0, -columns % group_size))", "weight[:, : columns - columns % group_size]"),),
        FAIL,
        "still a group",
    ),
    (
        "lab10.int4",
        (("scale.repeat_interleave(group_size, dim=1)", "scale.repeat(1, group_size)"),),
        FAIL,
        "repeat_interleave",
    ),
    ("lab10.int4", (("return codes.to(torch.uint8), scale,", "return codes, scale,"),), FAIL, "torch.uint8"),
    ("lab10.quality", (), PASS, "PASS"),
    (
        "lab10.quality",
        (("quality(model, quantized,", "quality(model, model,"),),
        FAIL,
        "compared the model with itself",
    ),
    (
        "lab10.quality",
        (("model_with_weights(model, round_trip)", "model_with_weights(model, list(round_trips.values())[-1])"),),
        FAIL,
        "Every scheme got the same model",
    ),
    ("lab10.quality", (("quality(model, quantized,", "quality(quantized, model,"),), FAIL, "the wrong way round"),
    (
        "lab10.quality",
        (("model_with_weights(model, round_trip)", "quantize_model(model, scheme)"),),
        FAIL,
        "quantize_model builds labkit's own quantized model",
    ),
    (
        "lab10.quality",
        (
            (
                "quality(model, quantized, prompts, n_tokens)\n",
                "quality(model, quantized, prompts, n_tokens).agreement\n",
            ),
        ),
        FAIL,
        "returned a dict whose 'int8' is a float",
    ),
    ("lab10.quality", (("    return results\n", "    return list(results.values())\n"),), FAIL, "returned a list"),
    ("lab10.fleet", (), PASS, "PASS"),
    (
        "lab10.fleet",
        (("replica.promise_load_per_s", "replica.request_ceiling_per_s"),),
        FAIL,
        "not the request ceiling",
    ),
    ("lab10.fleet", (("math.ceil(", "int("),), FAIL, "You rounded the replicas down"),
    ("lab10.fleet", ((FLEET_REPLICAS, FLEET_REPLICAS.replace("math.ceil", "int") + " + 1"),), FAIL, "int(x) + 1"),
    ("lab10.fleet", (("    return best\n", "    return best or (8, 1)\n"),), FAIL, "no split keeps this promise"),
    ("lab10.fleet", (("math.ceil(", "1 + math.ceil("),), FAIL, "ceil(load / what one replica carries"),
    (
        "lab10.fleet",
        (("ways * replicas < best[0] * best[1]", "replicas < best[1]"),),
        FAIL,
        "count each fleet's GPUs",
    ),
    ("lab10.fleet", (("for ways in (1, 2, 4, 8):", "for ways in (8,):"),), FAIL, "Try every split"),
    (
        "lab10.fleet",
        (
            (
                "        try:\n            replica = plan(**inputs, tensor_parallel=ways)\n"
                "        except ValueError:  # the model does not fit split this few ways\n            continue\n",
                "        replica = plan(**inputs, tensor_parallel=ways)\n",
            ),
        ),
        FAIL,
        "try / except ValueError",
    ),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "exercise_id, edits, status, words",
    [pytest.param(*case, id=f"{case[0]}-{index}-{case[3][:24]}") for index, case in enumerate(CASES)],
)
def test_check_verdict(exercise_id, edits, status, words, seed):
    result = evaluate(exercise_id, *answer(exercise_id, edits), seed=seed)
    assert result.status == status, result.message
    assert words in result.message, result.message


@pytest.mark.parametrize("multiple", EXACT_MULTIPLES)
def test_the_exact_multiples_are_whole_in_floats_and_cost_int_plus_one_a_gpu(multiple):
    load = sale_load(multiple)
    assert load / plan(**SALE_EXAMPLE).promise_load_per_s == multiple
    assert size_fleet(load, **SALE_EXAMPLE).best.gpus == multiple
    carried = {n: plan(**SALE_EXAMPLE, tensor_parallel=n).promise_load_per_s for n in (1, 2, 4, 8)}
    assert min(n * (int(load / c) + 1) for n, c in carried.items()) > multiple


def test_a_broadcasting_mistake_names_the_learners_line_and_the_axis():
    wrong = answer("lab10.int8", (("weight / scale[:, None]", "weight / scale"),))
    result = evaluate("lab10.int8", *wrong)
    assert result.status == FAIL and "your function quantize_int8 raised RuntimeError" in result.message
    assert "scale[:, None]" in result.message and "Traceback" not in result.message


def test_unfinished_exercise_says_not_done():
    def fewest_gpus(load_per_s, inputs):
        raise NotImplementedError("Exercise lab10.fleet: replace this line with your code")

    result = evaluate("lab10.fleet", fewest_gpus)
    assert result.status == NOT_DONE and "NOT DONE" in result.message


@pytest.mark.parametrize("exercise_id", sorted(FUNCTIONS))
def test_every_exercise_has_at_least_two_tiers_of_hints(exercise_id):
    assert len(hints.tiers(exercise_id)) >= 2


class TestModelWithWeights:
    def test_the_course_round_trips_are_labkits_quantized_weights(self):
        model = tiny_model("llama", seed=0)
        for scheme, round_trip in course_round_trips().items():
            quantized = quantize_model(model, scheme)
            copy = model_with_weights(model, round_trip)
            x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
            for mine, theirs in zip(copy.layers, quantized.layers):
                assert torch.allclose(mine.qkv(x), theirs.qkv(x), atol=1e-5)
            ids = [1, 5, 9, 2]
            assert torch.allclose(copy.prefill(ids)[0], quantized.prefill(ids)[0], atol=1e-4)

    def test_the_original_is_untouched(self):
        model = tiny_model("llama", seed=0)
        before = model.prefill([1, 2, 3])[0]
        model_with_weights(model, lambda w: torch.zeros_like(w))
        assert torch.equal(model.prefill([1, 2, 3])[0], before)

    def test_a_round_trip_of_the_wrong_shape_is_refused(self):
        with pytest.raises(ValueError, match="same shape: dequantize\\(quantize\\(weight\\)\\)"):
            model_with_weights(tiny_model("llama", seed=0), lambda w: w[:, :1])
