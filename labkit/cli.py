"""One ``labkit`` command; each subcommand lives in the module that does the work."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). Each module defines add_arguments(parser) and
# run(args) -> int. Only the module of the subcommand given is imported, so a light one
# (``labkit plan``) never pays for torch.
SUBCOMMANDS = {
    "info": ("labkit.info", "device, model, KV bytes per token and the single-stream decode bound"),
    "plan": ("labkit.plan_cli", "the napkin capacity plan (no model, no torch)"),
    "bench": ("labkit.bench", "labkit's engine against Hugging Face generate on real ShareGPT prompts"),
    "calibrate": ("labkit.calibrate_cli", "fit the simulator's cost model to this machine's engine"),
    "make-labs": ("labkit.grading.make_labs", "learner notebooks from the solved lab sources"),
    "grade": ("labkit.grading.grade", "grade submitted lab notebooks"),
    "serve": ("labkit.serve.serve_cli", "an OpenAI-compatible server over the engine, vLLM's metric names"),
    "loadtest": ("labkit.serve.loadtest_cli", "load any OpenAI-compatible server as vllm bench serve does"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    module = None
    for name, (module_name, help_line) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_line, description=help_line)
        if name == chosen:
            module = importlib.import_module(module_name)
            command.description = module.__doc__
            module.add_arguments(command)
    args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except (ValueError, FileNotFoundError, OSError) as err:  # bad input or setup: the message names the fix
        print(f"labkit {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
