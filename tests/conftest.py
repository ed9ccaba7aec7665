"""Shared fixtures: the default model is loaded once per test session."""

import pytest


@pytest.fixture(scope="session")
def default_model():
    from labkit.models import load_model

    # fp32 everywhere so the 1e-4 logit tolerances mean the same on CPU and GPU
    return load_model("default", dtype="float32")
