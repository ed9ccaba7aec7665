"""Admission control: answer 503 now rather than accept a request the server cannot serve in time.

A queue that grows past what the batch drains makes every request in it late; refusing the
newcomer at once, with ``Retry-After``, keeps the promise for those already accepted and tells
the client when to come back. When a request arrives, the server shows an admission hook what
it knows (a :class:`QueueSnapshot`) and the hook answers ``None`` to admit, or the seconds to
put in ``Retry-After``. Any callable ``admission(queue) -> int | float | None`` can be the hook;
:func:`admission_within` is labkit's rule (``labkit serve --max-queue-delay-ms``), which predicts
the wait from how fast seats have been freeing up. ``vllm serve`` has no such option (it queues
every request it accepts): the hook and ``--max-queue-delay-ms`` are labkit's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

AdmissionHook = Callable[["QueueSnapshot"], "int | float | None"]


@dataclass(frozen=True)
class QueueSnapshot:
    """What the server knows when a request arrives, before it accepts it."""

    waiting: int  # accepted, not yet started (the newcomer not counted)
    running: int  # started, not finished
    max_num_seqs: int  # seats in a step
    service_s: float | None  # median seconds from start to finish of the last 16 finished requests; None before any


def predicted_wait_s(queue: QueueSnapshot) -> float:
    """Seconds the newcomer would wait for a seat, if seats keep freeing up as they have.

    A request holds its seat ``service_s`` seconds, so ``max_num_seqs`` seats free up at
    ``max_num_seqs / service_s`` per second. Everyone already running or waiting is ahead of the
    newcomer; with the newcomer that makes ``running + waiting + 1`` people for
    ``max_num_seqs`` seats, so it is ``running + waiting + 1 - max_num_seqs``-th in line for a
    seat that frees up (and does not wait at all when that is 0 or less). Nothing measured yet
    (``service_s`` None): no reason to refuse, 0.0.
    """
    if queue.service_s is None:
        return 0.0
    place_in_line = max(0, queue.running + queue.waiting + 1 - queue.max_num_seqs)
    return place_in_line * queue.service_s / queue.max_num_seqs


def retry_after(queue: QueueSnapshot, promise_ms: float) -> int | None:
    """labkit's rule: None to admit; else whole seconds for Retry-After = max(1, ceil(wait - promise_s)).

    Admit when the predicted wait keeps the promise (``wait <= promise``); otherwise the client
    should come back once the excess wait has drained, and never sooner than a second.
    """
    wait_s = predicted_wait_s(queue)
    if wait_s * 1000.0 <= promise_ms:
        return None
    return max(1, math.ceil(wait_s - promise_ms / 1000.0))


def admission_within(promise_ms: float) -> AdmissionHook:
    """The rule as a hook for the server: admit a request only if it should start within ``promise_ms``."""
    if not promise_ms >= 0:  # also refuses NaN
        raise ValueError(f"the queueing promise must be 0 ms or more, got {promise_ms}")

    def within_promise(queue: QueueSnapshot) -> int | None:
        return retry_after(queue, promise_ms)

    within_promise.__name__ = within_promise.__qualname__ = f"admission_within({promise_ms:g} ms)"
    return within_promise
