"""The grader's reference model must be the one converted: a changed file is an error, never a silent reference."""

from __future__ import annotations

import hashlib
import json

import pytest

from labkit.models import default_model


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A converted-looking default model folder whose record holds sizes and checksums."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    folder = default_model.default_model_dir()
    folder.mkdir(parents=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 64)
    record = {
        "files": {weights.name: weights.stat().st_size},
        "sha256": {weights.name: hashlib.sha256(weights.read_bytes()).hexdigest()},
    }
    (folder / default_model.MARKER).write_text(json.dumps(record))
    return folder


def test_a_weight_changed_in_place_is_caught_when_contents_are_verified(cache):
    weights = cache / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF  # same size: only the checksum can tell
    weights.write_bytes(bytes(data))
    assert default_model.ensure_converted(progress=False) == cache  # a learner's load checks sizes only
    with pytest.raises(default_model.ModelCacheError, match="model.safetensors has changed") as error:
        with default_model.contents_verified():
            default_model.ensure_converted(progress=False)
    assert "rm -rf" in str(error.value)


def test_an_intact_cache_passes_and_one_without_checksums_is_refused(cache):
    with default_model.contents_verified():
        assert default_model.ensure_converted(progress=False) == cache
    record = json.loads((cache / default_model.MARKER).read_text())
    del record["sha256"]
    (cache / default_model.MARKER).write_text(json.dumps(record))
    with pytest.raises(default_model.ModelCacheError, match="no checksums"):
        default_model.verify_cache(cache, contents=True)
