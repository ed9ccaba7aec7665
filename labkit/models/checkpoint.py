"""Reading a checkpoint folder (config.json, safetensors weights) without importing transformers.

labkit runs its own forward pass, so it needs only the shape and the tensors by name, and importing transformers
for them costs about six seconds per process on a small CPU (every notebook kernel, grader kernel and server).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"  # a checkpoint sharded into several safetensors files


def is_checkpoint(folder: Path) -> bool:
    """A folder labkit can read by itself: a config and safetensors weights."""
    return (folder / CONFIG_FILE).is_file() and (
        (folder / WEIGHTS_FILE).is_file() or (folder / WEIGHTS_INDEX).is_file()
    )


def read_config(folder: Path) -> SimpleNamespace:
    """config.json's fields as attributes, as transformers' config object offers them to ModelConfig."""
    return SimpleNamespace(**json.loads((folder / CONFIG_FILE).read_text()))


def read_weights(folder: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint by its Hugging Face name, in ``dtype`` on ``device``."""
    from safetensors.torch import load_file

    if (folder / WEIGHTS_INDEX).is_file():
        shards = sorted(set(json.loads((folder / WEIGHTS_INDEX).read_text())["weight_map"].values()))
    else:
        shards = [WEIGHTS_FILE]
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        for name, tensor in load_file(folder / shard).items():
            weights[name] = tensor.to(device=device, dtype=dtype)
    return weights
