"""scripts/openvino_offline.py, the parts that need OpenVINO GenAI but no exported model: the servers' sampling
per request, labkit's prompt ids as its input, a clear error for a folder without a model. openvino-genai is an
optional tool (README, "OpenVINO GenAI beside them"), so these are skipped where it is not installed."""

from __future__ import annotations

import importlib.util

import pytest
from script_loader import load_script

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openvino_genai") is None,
    reason="openvino_genai is not importable: the optional `pip install openvino-genai` (README, "
    "'OpenVINO GenAI beside them') was not run in this environment",
)


@pytest.fixture(scope="module")
def offline():
    return load_script("openvino_offline")


@pytest.fixture(scope="module")
def workload(offline):
    return offline.trace_workload(offline.WORKLOADS["W1"], "W1", 3)


def test_each_request_is_greedy_ignores_eos_and_asks_the_traces_tokens(offline, workload):
    configs = offline.generation_configs(workload)
    assert [c.max_new_tokens for c in configs] == [spec.output_len for spec in workload]
    assert all(c.ignore_eos and c.is_greedy_decoding() for c in configs)


def test_the_prompts_are_the_ids_labkit_computes_on_one_row_each(offline, workload):
    import openvino

    ids = {id(spec.prompt): list(range(1, 4 + n)) for n, spec in enumerate(workload)}
    tensors = offline.prompt_tensors(workload, lambda messages: ids[id(messages)])
    assert [t.data.tolist() for t in tensors] == [[ids[id(spec.prompt)]] for spec in workload]
    assert {t.element_type for t in tensors} == {openvino.Type.i64}


def test_a_folder_without_an_exported_model_says_how_to_export_one(offline, tmp_path):
    with pytest.raises(SystemExit, match="no OpenVINO model in .*openvino_model.xml is missing.*optimum-cli"):
        offline.open_pipeline(tmp_path)


def test_the_cpu_precision_names_compute_and_kv_cache(offline):
    compute, _, cache = offline.cpu_precision().partition("+")
    assert compute and cache.endswith("-kv")
