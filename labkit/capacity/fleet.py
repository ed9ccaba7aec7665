"""Sizing a fleet: the fewest GPUs, over tensor-parallel sizes and replicas, that carry a load.

Past one GPU, ``plan(..., tensor_parallel=N, replicas=R)`` splits each replica's model N ways
(:mod:`labkit.capacity.parallel` holds the split and its all-reduces) and runs R replicas
side by side; :func:`size_fleet` searches N and R for the fewest GPUs that carry a load
within the promise (the 10x sale: ``size_fleet(sale_load(10), **SALE_70B_EXAMPLE)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from labkit.capacity.planner import CapacityPlan, plan
from labkit.capacity.report import render_fleet
from labkit.sim.cost_model import ModelSpec
from labkit.sim.hardware import Hardware


@dataclass(frozen=True)
class FleetOption:
    """One tensor-parallel size tried by :func:`size_fleet`: its replica plan and how many replicas, or why not."""

    tensor_parallel: int
    replicas: int | None = None
    plan: CapacityPlan | None = None  # of the fleet: one replica's figures, and the fleet's totals
    why_not: str = ""

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.tensor_parallel * self.replicas


@dataclass(frozen=True)
class FleetSizing:
    """The fewest GPUs that carry ``load_per_s`` within the promise, and every split that was tried."""

    load_per_s: float
    options: tuple[FleetOption, ...]

    @property
    def best(self) -> FleetOption:
        """The option with the fewest GPUs; of equals, the one with the most spare load."""
        fitting = [o for o in self.options if o.replicas is not None]
        return min(fitting, key=lambda o: (o.gpus, -o.plan.carried_load_per_s * o.replicas))

    def to_dict(self) -> dict:
        return {
            "load_per_s": self.load_per_s,
            "best": {"tensor_parallel": self.best.tensor_parallel, "replicas": self.best.replicas},
            "options": [
                {
                    "tensor_parallel": o.tensor_parallel,
                    "replicas": o.replicas,
                    "gpus": o.gpus,
                    "why_not": o.why_not,
                    "plan": None if o.plan is None else o.plan.to_dict(),
                }
                for o in self.options
            ],
        }

    def __str__(self) -> str:
        return render_fleet(self)


def size_fleet(
    load_per_s: float,
    hardware: Hardware | str,
    model: ModelSpec | str,
    prompt_len: int,
    answer_len: int,
    *,
    tensor_parallel: tuple[int, ...] = (1, 2, 4, 8),
    **settings,
) -> FleetSizing:
    """How many GPUs carry ``load_per_s`` requests/s: for each tensor-parallel size, the replicas needed.

    Each size N gets R = ceil(load / what one replica carries) replicas (within ``promise_s`` if
    given, else at the request ceiling); a size at which the model does not fit is listed with
    the reason. ``settings`` are :func:`plan`'s keywords. The 10x sale of the 70B bot under its
    50 ms promise: ``size_fleet(sale_load(10), **SALE_70B_EXAMPLE).best``.
    """
    if not load_per_s > 0:
        raise ValueError(f"load_per_s must be positive, got {load_per_s!r}; e.g. sale_load(10) for the 10x sale")
    if "replicas" in settings:
        raise ValueError("size_fleet chooses the replicas; drop replicas=")
    options = []
    for ways in tensor_parallel:
        try:
            replica = plan(hardware, model, prompt_len, answer_len, tensor_parallel=ways, **settings)
        except ValueError as error:
            options.append(FleetOption(ways, why_not=str(error)))
            continue
        replicas = max(1, math.ceil(load_per_s / replica.carried_load_per_s - 1e-9))  # 1e-9: 10 x 5.9 / 5.9 is 10
        options.append(FleetOption(ways, replicas, replace(replica, replicas=replicas)))
    if all(o.plan is None for o in options):
        raise ValueError(
            f"no tensor-parallel size of {tuple(tensor_parallel)} fits the model; the first reason: "
            f"{options[0].why_not}"
        )
    return FleetSizing(load_per_s, tuple(options))
