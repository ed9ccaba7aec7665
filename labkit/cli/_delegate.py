"""Plug a subcommand whose logic lives in another part of labkit into the CLI, imported only when run."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


def delegate(module_name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """``add_arguments`` and ``run`` that call the same-named functions of ``module_name``."""

    def add_arguments(parser: argparse.ArgumentParser) -> None:
        module = importlib.import_module(module_name)
        parser.description = module.__doc__
        module.add_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module_name).run(args)

    return add_arguments, run
