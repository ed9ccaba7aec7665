"""Serving without a model: hardware figures and the four-constant cost model.

The simulator, which drives the engine's step loop and schedulers on the cost model's
clock, is :func:`labkit.sim.simulator.simulate`; :func:`labkit.sim.fleet.simulate_fleet` runs
several of its engines behind a router (round-robin, least-loaded or cache-aware) on one clock. None of it
loads torch or the model code; :mod:`labkit.sim.calibrate` times a real engine that its caller
builds and passes in, and :mod:`labkit.sim.serving` predicts a load test's rate sweep from a quick calibration.
"""

from labkit.engine.fleet_run import FleetRequest, FleetRun
from labkit.sim.cost_model import MODELS, CostModel, ModelSpec, PassTime, SequenceWork, get_model
from labkit.sim.fleet import simulate_fleet
from labkit.sim.hardware import PRESETS, Hardware, get_hardware, probe_this_machine
from labkit.sim.serving import RatePrediction, predict_sweep, predicted_highest_rate, quick_calibration

__all__ = [
    "MODELS",
    "PRESETS",
    "CostModel",
    "FleetRequest",
    "FleetRun",
    "Hardware",
    "ModelSpec",
    "PassTime",
    "RatePrediction",
    "SequenceWork",
    "get_hardware",
    "get_model",
    "predict_sweep",
    "predicted_highest_rate",
    "probe_this_machine",
    "quick_calibration",
    "simulate_fleet",
]
