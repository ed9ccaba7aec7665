"""Lab 9, the capstone: the checks for the learner's engine loop, policy, dashboard, admission and SLO sweep.

Six exercises, each checked in its own module (importing this package registers all six checks, in the order the
notebook shows them):

- ``engine_turn(llm, inbox, send)`` (``lab9.engine_turn``, :mod:`~labkit.labs.lab9.engine_turn`): one turn of a
  server's engine loop, driven with scripted clients on the tiny model.
- ``continuous_schedule(state)`` (``lab9.continuous_schedule``, :mod:`~labkit.labs.lab9.policy`): the learner's
  lab 4 policy, judged by lab 4's check first (where memory binds), then as the policy of a real ``labkit serve``.
- ``dashboard(before_text, after_text)`` (``lab9.dashboard``, :mod:`~labkit.labs.lab9.dashboard`): the numbers of a
  serving dashboard from two ``/metrics`` scrapes, compared with labkit's own reading of the same scrapes.
- ``admit(queue, promise_ms)`` (``lab9.admit``, :mod:`~labkit.labs.lab9.admission`): admission control, None to
  admit or Retry-After seconds; on queue snapshots, compared with ``labkit.serve.admission.retry_after`` and its
  typical misreadings.
- ``highest_rate(measure, rates, promise)`` (``lab9.highest_rate``, :mod:`~labkit.labs.lab9.highest_rate`): the
  highest request rate whose p99 latencies keep the promise with nothing lost, measuring as few rates as it can;
  compared with labkit's rule on replayed measurements.
- ``find_capacity(url, rates, promise)`` (``lab9.find_capacity``, :mod:`~labkit.labs.lab9.find_capacity`): the SLO
  sweep against a real server, whose every load is recorded; the answer must equal labkit's rule applied to exactly
  those measurements (:mod:`~labkit.labs.lab9.capacity`).
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab9 import engine_turn  # noqa: F401, I001
from labkit.labs.lab9 import policy  # noqa: F401
from labkit.labs.lab9 import dashboard  # noqa: F401
from labkit.labs.lab9 import admission  # noqa: F401
from labkit.labs.lab9.highest_rate import SEARCH
from labkit.labs.lab9 import find_capacity  # noqa: F401

__all__ = ["SEARCH"]
