"""Lab 4, continuous batching: its four exercises' checks, a module per part (importing this package registers them);
the names below are the ones the notebook, the tests and lab 9 read from this package."""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.common.scheduling import SCHEDULING_ANSWERS, check_decisions
from labkit.labs.lab4.schedule import SEATS, ten_replies
from labkit.labs.lab4.preemption import PREEMPT_DIALS, oldest, preemption_requests, recomputed_tokens, serve_choosing
from labkit.labs.lab4.serving_metrics import metric_mistakes, metrics_expected, metrics_inputs
# isort: on

__all__ = [
    "PREEMPT_DIALS",
    "SCHEDULING_ANSWERS",
    "SEATS",
    "check_decisions",
    "metric_mistakes",
    "metrics_expected",
    "metrics_inputs",
    "oldest",
    "preemption_requests",
    "recomputed_tokens",
    "serve_choosing",
    "ten_replies",
]
