"""Serving without a model: hardware figures and the four-constant cost model.

The simulator, which drives the engine's step loop and schedulers on the cost model's
clock, is :func:`labkit.sim.simulator.simulate`. None of it loads torch or the model code;
:mod:`labkit.sim.calibrate` times a real engine that its caller builds and passes in.
"""

from labkit.sim.cost_model import MODELS, CostModel, ModelSpec, PassTime, SequenceWork, get_model
from labkit.sim.hardware import PRESETS, Hardware, get_hardware, probe_this_machine

__all__ = [
    "MODELS",
    "PRESETS",
    "CostModel",
    "Hardware",
    "ModelSpec",
    "PassTime",
    "SequenceWork",
    "get_hardware",
    "get_model",
    "probe_this_machine",
]
