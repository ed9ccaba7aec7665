"""What a kernel hands back is read bounded, refused unless plain and small, and judged under limits."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch

from labkit.grading.checks import get_exercise
from labkit.grading.judge import expected_outputs
from labkit.grading.judge_process import judge_result
from labkit.grading.kernel_side import record_bytes
from labkit.grading.request import build_request, request_bytes
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


@pytest.mark.parametrize(
    "outputs, written_as",
    [
        ([3, 1, 4], b"{"),  # plain JSON data: JSON
        (None, b"{"),
        (torch.zeros(2, 3), b"PK"),  # a tensor, a tuple or a nan: torch.save, which keeps them
        ((1, 2), b"PK"),
        ([float("nan")], b"PK"),
    ],
)
def test_a_record_is_saved_as_json_where_json_holds_it_exactly(outputs, written_as):
    record = {"status": "ok", "message": "", "outputs": outputs}
    data = record_bytes(record)
    assert data.startswith(written_as)
    loaded = load_result(data, BUDGET)
    assert type(loaded["outputs"]) is type(outputs) and repr(loaded) == repr(record)  # repr: nan == nan


@pytest.mark.parametrize(
    "data, refusal",
    [
        (b'{"status": "ok", "outputs": [NaN]}', "could not be loaded safely"),  # the kernel writes no nan as JSON
        (b"[" * 100_000 + b"]" * 100_000, "could not be loaded safely"),  # deeper than the parser goes
        (b'{"status": "ok", "outputs": ' + b"[" * 40 + b"]" * 40 + b"}", "nested more than"),
        (b'{"outputs": "' + b"x" * (2 << 20) + b'"}', "more than the"),
        (b"\xff\xfe not JSON", "could not be loaded safely"),
    ],
)
def test_a_crafted_json_result_is_refused(data, refusal):
    with pytest.raises(ResultRefused, match=refusal):
        load_result(data, BUDGET)


# The grader's agent in a kernel whose notebook never imported torch: a request whose functions are missing,
# the hint counts and the device report, all without importing it.
KERNEL_WITHOUT_TORCH = """
import json, sys
import labkit.grading.kernel_side as kernel_side
from labkit.grading.kernel_device import save_kernel_device
request, result, hints, device = sys.argv[1:]
kernel_side.save_attempt(request, result, {})
kernel_side.save_hint_counts(hints)
save_kernel_device(device)
print(json.dumps("torch" in sys.modules))
"""


def test_the_kernel_side_needs_no_torch_where_the_notebook_never_imported_it(tmp_path):
    request = tmp_path / "request.pkl"
    request.write_bytes(request_bytes(build_request(get_exercise("demo.add"), 3)))  # its inputs are tensors
    paths = [str(request), *(str(tmp_path / name) for name in ("result", "hints.json", "device.json"))]
    done = subprocess.run(
        [sys.executable, "-c", KERNEL_WITHOUT_TORCH, *paths], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is False
    record = load_result((tmp_path / "result").read_bytes(), BUDGET)
    assert record["status"] == "missing" and "`add`" in record["message"]
    assert not (tmp_path / "device.json").exists()  # no torch, so no Triton kernel: nothing to report
