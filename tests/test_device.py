"""The CPU report and the thread choice: what `labkit info` tells a learner about this machine."""

import pytest
import torch

from labkit import device
from labkit.cli import main as labkit_main

AVX2_EPYC = {"model name": "AMD EPYC 7B12", "flags": "fpu sse2 avx fma f16c avx2 bmi2"}
SAPPHIRE_RAPIDS = {
    "model name": "Intel(R) Xeon(R) Platinum 8488C",
    "flags": "avx2 avx512f avx512bw avx512_bf16 amx_tile amx_bf16",
}


@pytest.mark.parametrize(
    "cpuinfo, expected",
    [
        (AVX2_EPYC, {"AVX2": True, "AVX-512": False, "AMX": False, "native bf16": False}),
        (SAPPHIRE_RAPIDS, {"AVX2": True, "AVX-512": True, "AMX": True, "native bf16": True}),
        ({}, {"AVX2": None, "AVX-512": None, "AMX": None, "native bf16": None}),  # not Linux: unknown, not "no"
    ],
)
def test_cpu_features_read_the_flags(monkeypatch, cpuinfo, expected):
    monkeypatch.setattr(device, "_cpuinfo", lambda: cpuinfo)
    features = device.cpu_features()
    assert {key: features[key] for key in expected} == expected
    assert features["cpu"] == cpuinfo.get("model name", features["cpu"]) and features["cpu"]


def test_threads_leave_one_core_free_and_obey_labkit_threads(monkeypatch):
    monkeypatch.delenv("LABKIT_THREADS", raising=False)
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 2)
    assert device.cpu_threads() == (1, "one of 2 cores left free for other programs")
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 16)
    assert device.cpu_threads()[0] == 15
    monkeypatch.setattr(device, "_TORCH_DEFAULT_THREADS", 1)
    assert device.cpu_threads()[0] == 1
    monkeypatch.setenv("LABKIT_THREADS", "3")
    assert device.cpu_threads() == (3, "set by LABKIT_THREADS")
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("LABKIT_THREADS", bad)
        with pytest.raises(ValueError, match="LABKIT_THREADS.*positive whole number"):
            device.cpu_threads()


def test_loading_a_model_sets_the_thread_count(monkeypatch, default_model):
    from labkit.models import load_model

    before = torch.get_num_threads()
    monkeypatch.setenv("LABKIT_THREADS", "2")
    try:
        load_model("default", dtype="float32", progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("prepack", ["1", "0"])
def test_labkit_info_says_which_matmul_path_runs_and_why(monkeypatch, capsys, prepack, default_model):
    monkeypatch.setenv("LABKIT_PREPACK", prepack)
    assert labkit_main(["info", "--device", "cpu", "--dtype", "float32", "--bandwidth", "100"]) == 0
    out = capsys.readouterr().out
    for line in ("cpu:", "AVX2:", "AVX-512:", "AMX:", "native bf16:", "torch threads:", "matmuls:"):
        assert line in out
    from labkit.engine.int8_choice import choose_int8_backend

    int8 = next(line for line in out.splitlines() if "--quantization int8 runs on:" in line)
    assert int8.endswith(choose_int8_backend().reason)  # the kernel chosen by trying, and why (or why none)
    matmuls = next(line for line in out.splitlines() if "matmuls:" in line)
    if prepack == "0":
        assert matmuls.endswith("plain F.linear (LABKIT_PREPACK=0)")
    else:
        from labkit.models.fast_linear import matmul_path

        assert matmuls.endswith(
            matmul_path(torch.device("cpu"), torch.float32, default_model.weight_bytes()).describe()
        )


def test_available_memory_counts_the_page_cache_the_os_would_drop(tmp_path):
    # Right after reading big files: little is free, much is cache. The KV pool must not shrink for that.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16000000 kB\nMemFree: 500000 kB\nMemAvailable: 12000000 kB\nCached: 11000000 kB\n")
    assert device.available_ram_bytes(meminfo) == 12000000 * 1024
    assert device.available_ram_bytes(tmp_path / "absent") == device.os.sysconf("SC_PHYS_PAGES") * device.os.sysconf(
        "SC_PAGE_SIZE"
    )


def test_the_kv_pool_says_how_it_was_sized():
    from labkit.kv.pool_sizing import CPU_KV_CACHE_CAP_BYTES, kv_pool_size

    cpu = torch.device("cpu")
    blocks, why = kv_pool_size(1000, 16, cpu, 0.5, max_useful_tokens=160)
    assert blocks == 10 and "max_num_seqs × max_model_len = 160 tokens" in why and "RAM available" in why
    blocks, why = kv_pool_size(1000, 16, cpu, 0.9, max_useful_tokens=10**12)
    assert blocks * 16 * 1000 <= CPU_KV_CACHE_CAP_BYTES and f"{blocks} blocks of 16 tokens" in why
