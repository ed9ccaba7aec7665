"""A module imported on its first use, not when pytest collects the test file that names it.

Every pytest worker collects every test file before it runs anything, so a heavy import at the top
of one file (openai's client: 1.6 s) is paid by each worker, and by `pytest -m labN` for one lab.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``, loaded when one of its attributes is first read (Python's ``LazyLoader`` recipe)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
