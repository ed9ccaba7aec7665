"""The checks of lab 10: the solved answers pass, typical wrong answers fail with a message that names them.

The answers are the solution cells of the lab source itself (so the tests cannot drift from the
notebook), and each wrong answer is that solution with one typical mistake edited in.
"""

from __future__ import annotations

import pytest
import torch
from lab_sources import solved_exercise

from labkit.grading import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS
from labkit.labs import hints
from labkit.labs.lab10.runs import course_round_trips, model_with_weights
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
        (("model_with_weights(model, round_trip)", "model_with_weights(model, round_trips['int4'])"),),
        FAIL,
        "Every scheme got the same model",
    ),
    ("lab10.quality", (("quality(model, quantized,", "quality(quantized, model,"),), FAIL, "the original first"),
    ("lab10.fleet", (), PASS, "PASS"),
    (
        "lab10.fleet",
        (("replica.promise_load_per_s", "replica.request_ceiling_per_s"),),
        FAIL,
        "not the request ceiling",
    ),
    ("lab10.fleet", (("math.ceil(", "int("),), FAIL, "Round the replicas up"),
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


@pytest.mark.parametrize(
    "exercise_id, edits, status, words",
    [pytest.param(*case, id=f"{case[0]}-{'solved' if not case[1] else case[3][:24]}") for case in CASES],
)
def test_check_verdict(exercise_id, edits, status, words):
    result = evaluate(exercise_id, *answer(exercise_id, edits))
    assert result.status == status, result.message
    assert words in result.message, result.message


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
