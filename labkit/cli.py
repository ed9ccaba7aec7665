"""One ``labkit`` command; each subcommand lives in the module that does the work."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module. Each module defines add_arguments(parser) and run(args) -> int,
# and its docstring's first line is the subcommand's help.
SUBCOMMANDS = {
    "info": "labkit.info",
    "bench": "labkit.bench",
    "grade": "labkit.grading.grade",
    "make-labs": "labkit.grading.make_labs",
    "plan": "labkit.plan_cli",
    "calibrate": "labkit.calibrate_cli",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        help_line = (module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else None
        module.add_arguments(sub.add_parser(name, help=help_line, description=module.__doc__))
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as err:  # bad input or setup: the message names the fix
        print(f"labkit {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
