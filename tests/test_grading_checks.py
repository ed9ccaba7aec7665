"""In-notebook checks: the demo exercises pass right answers and explain wrong ones."""

from __future__ import annotations

import os

import pytest
import torch

from labkit.grading import CheckResult, check, compare_sequences, compare_tensors, compare_tokens, evaluate
from labkit.grading.attempt import to_plain_data
from labkit.grading.checks import get_exercise
from labkit.grading.feedback import to_html
from labkit.grading.judge import expected_outputs
from labkit.grading.judge_process import judge_result


def correct_add(a, b):
    return a + b


def correct_softmax(x):
    shifted = x - x.max(dim=-1, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)


def correct_greedy(logits):
    return logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize(
    "exercise_id, function",
    [("demo.add", correct_add), ("demo.softmax", correct_softmax), ("demo.greedy_tokens", correct_greedy)],
)
def test_correct_answers_pass_with_full_points(exercise_id, function):
    result = evaluate(exercise_id, function)
    assert isinstance(result, CheckResult)
    assert result.passed and result.status == "pass"
    assert result.points == result.max_points == get_exercise(exercise_id).points
    assert result.message.startswith(f"PASS {exercise_id}")


def test_wrong_values_name_the_first_differing_element():
    result = evaluate("demo.add", lambda a, b: a - b)
    assert not result.passed and result.points == 0 and result.status == "fail"
    assert "First difference: sum at row 0, column 0: expected" in result.message
    assert "Hint: Add the two tensors" in result.message


def test_transposed_output_gets_the_transpose_hint():
    result = evaluate("demo.add", lambda a, b: (a + b).T)
    assert "shape (4, 3), expected (row=3, column=4)" in result.message
    assert "wrong order" in result.message


def test_softmax_over_the_wrong_axis_and_overflow_fail_differently():
    wrong_axis = evaluate("demo.softmax", lambda x: torch.softmax(x, dim=0))
    assert "First difference: probability at row 0, column 0" in wrong_axis.message
    naive = evaluate("demo.softmax", lambda x: x.exp() / x.exp().sum(dim=-1, keepdim=True))
    assert "got nan" in naive.message and "nan or inf" in naive.message


def test_token_list_shifted_by_one_is_recognised():
    skipped = evaluate("demo.greedy_tokens", lambda logits: logits.argmax(dim=-1).tolist()[1:] + [0])
    assert "tokens at position 0" in skipped.message and "ahead" in skipped.message
    repeated = evaluate("demo.greedy_tokens", lambda logits: [0] + logits.argmax(dim=-1).tolist()[:-1])
    assert "behind" in repeated.message
    short = evaluate("demo.greedy_tokens", lambda logits: logits.argmax(dim=-1).tolist()[:-1])
    assert "got 5, expected 6" in short.message and "stops too early" in short.message


def test_not_implemented_says_not_done_without_a_traceback():
    def add(a, b):
        raise NotImplementedError("Exercise demo.add: replace this line with your code")

    result = evaluate("demo.add", add)
    assert result.status == "not_done" and result.points == 0
    assert result.message.startswith("NOT DONE demo.add: write `add` in place of the `raise")
    assert "Traceback" not in result.message


def test_other_errors_show_the_learners_last_line():
    def add(a, b):
        total = a + b
        return total[10]

    result = evaluate("demo.add", add)
    assert result.status == "error"
    assert "IndexError" in result.message
    assert "in add, line" in result.message and "return total[10]" in result.message
    assert "Traceback" not in result.message


def test_output_the_grader_cannot_carry_is_an_error_not_a_crash():
    class Opaque:
        pass

    result = evaluate("demo.add", lambda a, b: Opaque())
    assert result.status == "error" and "Opaque" in result.message


def test_check_finds_functions_among_the_callers_globals(capsys):
    globals()["greedy_tokens"] = correct_greedy
    try:
        check("demo.greedy_tokens")
    finally:
        del globals()["greedy_tokens"]
    assert capsys.readouterr().out.startswith("PASS demo.greedy_tokens")
    check("demo.greedy_tokens")
    assert "MISSING demo.greedy_tokens" in capsys.readouterr().out


def test_bad_exercise_ids_and_argument_counts_are_clear_errors():
    with pytest.raises(ValueError, match="exercises of this lab: demo.add"):
        evaluate("demo.nope", correct_add)
    with pytest.raises(ValueError, match="expected a module labkit.labs.nolab or labkit.grading.exercises.nolab"):
        evaluate("nolab.x", correct_add)
    with pytest.raises(ValueError, match="should look like"):
        evaluate("nodot", correct_add)
    with pytest.raises(ValueError, match=r"needs 1 function\(s\) \(add\); got 2"):
        evaluate("demo.add", correct_add, correct_add)


def test_html_feedback_is_escaped_and_coloured():
    html = to_html(evaluate("demo.add", lambda a, b: (a + b).T))
    assert "#c62828" in html and "<b>First difference:</b>" in html
    assert "<script" not in to_html(CheckResult(False, 0, "FAIL x\nProblem: <script>", status="fail"))


def test_compare_tensors_uses_axis_names_and_exact_integers():
    expected = torch.zeros(2, 3, 4)
    got = expected.clone()
    got[1, 2, 0] = 0.5
    mismatch = compare_tensors(expected, got, dims=("layer", "position", "head"))
    assert mismatch is not None and "layer 1, position 2, head 0" in mismatch.difference
    assert compare_tensors(expected, got + 1e-7) is not None  # the 0.5 is still there
    assert compare_tensors(expected, expected + 1e-7) is None
    ids = torch.tensor([1, 2, 3])
    assert "dtype" in compare_tensors(ids, ids.float()).difference


def test_compare_sequences_locates_the_bad_step():
    expected = [torch.zeros(3), torch.zeros(3)]
    got = [torch.zeros(3), torch.tensor([0.0, 1.0, 0.0])]
    mismatch = compare_sequences(expected, got, compare_tensors, item="step")
    assert mismatch.difference.startswith("step 1, output at index [1]")
    assert "one per step" in compare_sequences(expected, got[:1], compare_tensors).difference


def test_compare_tokens_accepts_a_tensor_and_decodes():
    assert compare_tokens([5, 6], torch.tensor([5, 6])) is None
    mismatch = compare_tokens([5, 6], [5, 7], decode=lambda token: f"t{token}")
    assert "expected 6 ('t6'), got 7 ('t7')" in mismatch.difference
    assert "list of token ids" in compare_tokens([5], "5").difference


def test_plain_data_detaches_tensors_and_rejects_objects():
    weight = torch.nn.Parameter(torch.ones(2))
    plain = to_plain_data({"w": [weight * 2], "n": torch.tensor(3).item()})
    assert type(plain["w"][0]) is torch.Tensor and not plain["w"][0].requires_grad
    with pytest.raises(TypeError, match=r"the output\['x'\] is a builtins.object"):
        to_plain_data({"x": object()})


class _RunsACommand:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_grader_never_unpickles_code_from_the_kernel(tmp_path):
    exercise = get_exercise("demo.add")
    expected = expected_outputs(exercise, 1)
    marker = tmp_path / "pwned"
    torch.save({"status": "ok", "outputs": _RunsACommand(marker)}, tmp_path / "result.pt")
    result = judge_result(exercise, tmp_path, "result.pt", expected, 30)
    assert result.status == "error" and "loaded safely" in result.message
    assert not marker.exists()
    torch.save({"status": "pass", "points": 100}, tmp_path / "result.pt")
    assert "not in the grader's format" in judge_result(exercise, tmp_path, "result.pt", expected, 30).message
    assert "no result back" in judge_result(exercise, tmp_path, "absent.pt", expected, 30).message
