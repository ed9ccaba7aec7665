"""Lab 6, chunked prefill: its three exercises' checks, a module each (importing this package registers them)."""

from __future__ import annotations

# the exercises number in the order their modules are imported: the notebook's
# isort: off
from labkit.labs.lab6 import schedule  # noqa: F401
from labkit.labs.lab6.budget import MAX_BUDGET, budget_cases, largest_budget
from labkit.labs.lab6.chunks import chunks_oracle
# isort: on

# the course's answers by the names their exercises declare (labkit.labs.lab6.largest_budget, ...), and what the
# tests read
__all__ = ["MAX_BUDGET", "budget_cases", "chunks_oracle", "largest_budget"]
