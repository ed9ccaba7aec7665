"""What a kernel hands back is read bounded, refused unless plain and small, and judged under limits."""

from __future__ import annotations

import io
import os

import pytest
import torch

from labkit.grading.checks import get_exercise
from labkit.grading.judge import expected_outputs
from labkit.grading.judge_process import judge_result
from labkit.grading.result_check import ResultRefused, Size, budget_for, load_result, measure, read_result_file

BUDGET = Size(bytes=1 << 20, values=1000)


def saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_plain_data_is_measured_and_accepted():
    record = {"status": "ok", "outputs": [torch.zeros(3, 4), (1, 2.5, "text", None, True)]}
    assert measure(record).bytes == len("status") + 2 + len("outputs") + 48 + 8 * 4 + 4
    assert load_result(saved(record), BUDGET)["outputs"][0].shape == (3, 4)


@pytest.mark.parametrize(
    "value, refusal",
    [
        (torch.zeros(1).expand(1000, 1000), "is a view"),  # a zero-stride view: tiny file, huge tensor
        (torch.zeros(4, 6).t(), "is a view"),
        (torch.zeros(100)[10:20], "is a view"),  # a window into a larger storage
        (torch.nn.Parameter(torch.zeros(3)), "subclass of torch.Tensor"),
        (torch.zeros(3, dtype=torch.complex64), "ordinary dtype"),
        (torch.zeros(3).to_sparse(), "dense CPU tensors"),
        ({1: 2}, "a dict"),
        (object(), "only tensors, numbers"),
    ],
)
def test_anything_but_plain_owned_tensors_is_refused(value, refusal):
    with pytest.raises(ResultRefused, match=refusal):
        measure({"outputs": value})


def test_results_larger_than_the_expected_answer_allows_are_refused():
    budget = budget_for(torch.zeros(4, 7))
    assert budget.bytes == 1 << 20  # the floor: a small answer still leaves room for bookkeeping
    with pytest.raises(ResultRefused, match="more than the"):
        load_result(saved(torch.zeros(1 << 19)), budget)  # 2 MiB of data
    shared = torch.zeros(10)  # one small storage, referred to many times: the values are counted
    with pytest.raises(ResultRefused, match="values"):
        load_result(saved([shared] * 20_000), budget)
    with pytest.raises(ResultRefused, match="nested more than"):
        nested: list = []
        for _ in range(40):
            nested = [nested]
        measure(nested)


def test_result_files_are_read_bounded_and_never_through_links_or_pipes(tmp_path):
    (tmp_path / "small.pt").write_bytes(b"x" * 10)
    assert read_result_file(tmp_path, "small.pt", 100) == b"x" * 10
    assert read_result_file(tmp_path, "absent.pt", 100) is None
    (tmp_path / "big.pt").write_bytes(b"x" * 101)
    with pytest.raises(ResultRefused, match="101 bytes, more than the 100"):
        read_result_file(tmp_path, "big.pt", 100)
    (tmp_path / "link.pt").symlink_to(tmp_path / "small.pt")
    with pytest.raises(ResultRefused, match="could not be opened as a plain file"):
        read_result_file(tmp_path, "link.pt", 100)
    os.mkfifo(tmp_path / "pipe.pt")  # opening it for reading would wait for a writer for ever
    with pytest.raises(ResultRefused, match="not a regular file"):
        read_result_file(tmp_path, "pipe.pt", 100)


def test_judging_runs_under_a_time_and_a_memory_limit(tmp_path):
    exercise = get_exercise("demo.add")
    expected = expected_outputs(exercise, 3)
    torch.save({"status": "ok", "message": "", "outputs": expected.clone()}, tmp_path / "result.pt")
    assert judge_result(exercise, tmp_path, "result.pt", expected, 60).status == "pass"
    stopped = judge_result(exercise, tmp_path, "result.pt", expected, 1e-6)  # no child answers that fast
    assert stopped.status == "timeout" and "took longer than" in stopped.message
    torch.save({"status": "ok", "message": "", "outputs": torch.zeros(250_000)}, tmp_path / "large.pt")
    starved = judge_result(exercise, tmp_path, "large.pt", expected, 60, memory_bytes=0)
    assert starved.status == "error" and "memory" in starved.message
