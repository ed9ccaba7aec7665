"""Measurements that decide what `labkit serve` runs, made once per machine and kept, so no timing race decides.

Whether bf16 beats fp32 here, and which int8 kernel is fastest, are timings: taken at every start,
a busy second can call them apart, and two starts of the same server would then compute with
different numerics (three starts of one server once timed bf16 at 0.94x, 0.81x and 0.74x fp32). So a
timing is taken once, written to a small JSON file in labkit's cache with the date, and every later
start reads it back: the same machine makes the same choice until someone asks for a new measurement
(``labkit info --remeasure``). The file is keyed by the CPU's name, torch's version and
:data:`PROBE_VERSION` (raise it when a probe changes what it measures): a kept value from another
CPU or torch is measured again. An unreadable file is measured again too, with a warning.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit.cache import cache_root

PROBE_VERSION = 2  # raise when a probe measures something different: kept values are then measured again
FILE_NAME = "measured-choices.json"
REMEASURE_HINT = "`labkit info --remeasure` to redo"


def kept_path() -> Path:
    """The file the kept measurements live in (in labkit's cache)."""
    return cache_root() / FILE_NAME


def machine_key() -> dict:
    """What a kept measurement holds for: this CPU, this torch, this version of the probes."""
    import torch

    from labkit.device import cpu_features

    return {"cpu": str(cpu_features()["cpu"]), "torch": torch.__version__, "probe version": PROBE_VERSION}


@dataclass(frozen=True)
class Kept:
    """A measurement's value, when it was taken and where it is kept; ``fresh`` if it was taken just now."""

    value: dict
    measured_on: str  # ISO date
    path: Path
    fresh: bool

    def provenance(self) -> str:
        """For a start-up line: when it was measured, where it is kept, how to redo it."""
        return f"measured on {self.measured_on}, kept in {self.path}; {REMEASURE_HINT}"


def kept_measurement(name: str, measure: Callable[[], dict], remeasure: bool = False) -> Kept:
    """The kept value of measurement ``name`` for this machine, or ``measure()``'s, taken now and kept.

    ``remeasure=True`` takes it again whatever is kept. A file from another CPU, torch or probe version
    starts afresh; an unreadable one is measured again with a warning saying so.
    """
    path, key = kept_path(), machine_key()
    measurements = _read(path, key)
    entry = measurements.get(name)
    if entry is not None and not remeasure:
        return Kept(entry["value"], entry["measured_on"], path, fresh=False)
    print(f"labkit: measuring {name} on this machine, once: it is kept in {path}", file=sys.stderr, flush=True)
    entry = {"value": measure(), "measured_on": datetime.date.today().isoformat()}
    measurements[name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # then renamed: a reader never sees half a file
    written.write_text(json.dumps({"machine": key, "measurements": measurements}, indent=1) + "\n")
    written.replace(path)
    return Kept(entry["value"], entry["measured_on"], path, fresh=True)


def _read(path: Path, key: dict) -> dict:
    """The measurements kept in ``path`` for ``key``; {} when there are none (or none for this machine)."""
    if not path.exists():
        return {}
    try:
        content = json.loads(path.read_text())
        measurements = content["measurements"]
        if not isinstance(measurements, dict) or not all(
            isinstance(entry["value"], dict) and isinstance(entry["measured_on"], str)
            for entry in measurements.values()
        ):
            raise ValueError("a measurement lacks its value or date")
    except (OSError, ValueError, KeyError, TypeError) as err:
        warnings.warn(f"{path} cannot be read ({err}); measuring again and rewriting it", stacklevel=3)
        return {}
    return measurements if content.get("machine") == key else {}
