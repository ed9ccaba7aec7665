"""Timings that decide what runs are taken once per machine and kept; a bad or foreign file is measured again."""

import json

import pytest

from labkit import kept_measurements
from labkit.kept_measurements import kept_measurement


@pytest.fixture(autouse=True)
def kept_file(tmp_path, monkeypatch):
    path = tmp_path / "cache" / kept_measurements.FILE_NAME
    monkeypatch.setattr(kept_measurements, "kept_path", lambda: path)
    return path


def test_a_measurement_is_taken_once_then_read_back(kept_file):
    values = iter([{"speedup": 0.8}, {"speedup": 1.7}])
    first = kept_measurement("bf16", lambda: next(values))
    second = kept_measurement("bf16", lambda: next(values))
    assert first.fresh and not second.fresh and first.value == second.value == {"speedup": 0.8}
    assert str(kept_file) in second.provenance() and "--remeasure" in second.provenance()
    assert kept_measurement("bf16", lambda: next(values), remeasure=True).value == {"speedup": 1.7}
    assert kept_measurement("int8", lambda: {"x86": 1.0}).fresh  # another measurement, kept beside it
    assert set(json.loads(kept_file.read_text())["measurements"]) == {"bf16", "int8"}


@pytest.mark.parametrize("content", ["{not json", '{"measurements": {"bf16": {"value": 3}}}', "[]"])
def test_a_file_that_cannot_be_read_is_measured_again_with_a_warning(kept_file, content):
    kept_file.parent.mkdir(parents=True)
    kept_file.write_text(content)
    with pytest.warns(UserWarning, match="cannot be read.*measuring again"):
        kept = kept_measurement("bf16", lambda: {"speedup": 1.1})
    assert kept.fresh and json.loads(kept_file.read_text())["measurements"]["bf16"]["value"] == {"speedup": 1.1}


def test_a_measurement_kept_for_another_cpu_or_torch_is_taken_again(kept_file, monkeypatch):
    kept_measurement("bf16", lambda: {"speedup": 0.8})
    monkeypatch.setattr(kept_measurements, "machine_key", lambda: {"cpu": "another", "torch": "9", "probe version": 1})
    assert kept_measurement("bf16", lambda: {"speedup": 2.0}).value == {"speedup": 2.0}
