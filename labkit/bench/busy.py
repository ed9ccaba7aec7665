"""Competing load for a benchmark: plain Python spin loops, one per busy core, for as long as a run lasts.

A learner's laptop is rarely idle; ``labkit bench --busy 1`` measures what is left of the
engine's speed when another program keeps one core busy.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

SPIN = "while True: pass"


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[list[subprocess.Popen]]:
    """Keep ``count`` cores busy with spin loops inside the ``with`` block; they are killed after it."""
    if count < 0:
        raise ValueError(f"--busy {count}: the number of busy cores cannot be negative")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield spinners
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()
