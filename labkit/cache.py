"""Where labkit keeps what it computes once and reuses: converted models, calibrations.

A module of its own, with no torch, so the simulator and the planner can find the cache
without loading the model code.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "LABKIT_CACHE"


def cache_root() -> Path:
    """Where labkit keeps converted models and calibrations: $LABKIT_CACHE, else ~/.cache/labkit."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "labkit").expanduser()
