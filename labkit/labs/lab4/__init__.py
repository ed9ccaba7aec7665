"""Lab 4, continuous batching: the checks for its four exercises, a module per part (importing this package registers all four).

- ``continuous_schedule(state) -> SchedulerOutput`` (``lab4.continuous_schedule`` and ``lab4.ten_replies``,
  :mod:`~labkit.labs.lab4.schedule`): running requests get their next tokens, then waiting requests join from the
  head of the queue while a batch slot, free blocks and the token budget allow. Served on the tiny model as the
  engine's policy, each request's tokens compared with the request decoded alone, every decision watched for idle
  slots and overfull batches, and the steps of the lesson's ten replies counted against static batching.
- ``choose_victim(state, request) -> Request`` (``lab4.preemption``, :mod:`~labkit.labs.lab4.preemption`): whom to
  preempt when the blocks run out. Plugged into continuous batching on a pool too small for the workload; every
  choice must be the newest running request (vLLM's), and the tokens must still equal solo decoding.
- ``serving_metrics(trace, slo) -> dict`` (``lab4.serving_metrics``, :mod:`~labkit.labs.lab4.serving_metrics`):
  mean TTFT, TPOT and ITL (ms) and goodput (requests/s) from a seeded trace, checked against
  ``labkit.metrics.summarize`` on the same trace.

The names below are the ones the notebook, the tests and lab 9 read from this package.
"""

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
