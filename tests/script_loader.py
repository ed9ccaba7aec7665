"""The benchmark scripts of scripts/ as modules, for their tests (scripts/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """Run scripts/<name>.py as a module (its ``main`` not called) and return it."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: a dataclass in the script looks its module up there
    spec.loader.exec_module(module)
    return module
