"""Shared fixtures: the default model is loaded once per test session."""

import pytest


@pytest.fixture(scope="session")
def default_model():
    from labkit.models import load_model

    return load_model("default", device="cpu", dtype="float32")
