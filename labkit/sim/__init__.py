"""Serving without a model: hardware figures, the four-constant cost model, and (soon) a simulator."""

from labkit.sim.cost_model import MODELS, CostModel, ModelSpec, PassTime, SequenceWork, get_model
from labkit.sim.hardware import PRESETS, Hardware, get_hardware, probe_this_machine

__all__ = ["MODELS", "PRESETS", "CostModel", "Hardware", "ModelSpec", "PassTime", "SequenceWork",
           "get_hardware", "get_model", "probe_this_machine"]
