"""One ``labkit`` command, one module per subcommand, one way to fail.

Each subcommand module (in this package, or in the part of labkit that :data:`ELSEWHERE` names)
defines ``add_arguments(parser)`` and ``run(args) -> int``, and its docstring is what
``labkit SUBCOMMAND --help`` shows. Only the module of the subcommand given
is imported, so a light one (``labkit plan``) answers without loading torch. ``plan``,
``info``, ``bench`` and ``calibrate`` take ``--json``: one JSON document on stdout, for
scripts and notebooks, with any progress on stderr.

A mistake in the input or the setup (a ``ValueError`` or an ``OSError`` from anywhere below)
prints one message on stderr that names the input and the fix, and exits with status 2, no
traceback; ``--debug`` shows the traceback instead. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys

# subcommand -> one line of help; its module is labkit.cli.<subcommand, "-" written "_">, or ELSEWHERE's
SUBCOMMANDS = {
    "info": "this machine, the model, its size, KV bytes per token and the single-stream decode bound",
    "plan": "the napkin capacity plan: conversations that fit, step time, tokens/s, cost (no torch)",
    "bench": "labkit's engine against Hugging Face generate on real ShareGPT prompts",
    "calibrate": "fit the simulator's cost model to this machine's engine, and check its predictions",
    "make-labs": "generate the learner notebooks from the solved lab sources",
    "grade": "grade submitted lab notebooks",
    "make-autograder": "write a Gradescope autograder bundle (setup.sh, run_autograder) for one lab",
    "serve": "an OpenAI-compatible server over the engine, vLLM's metric names",
    "route": "an OpenAI-compatible router over several labkit serve replicas: round-robin, least or cache-aware",
    "loadtest": "load any OpenAI-compatible server as vllm bench serve does",
}
# the subcommands whose module lives in the part of labkit that owns their code
ELSEWHERE = {
    "make-labs": "labkit.grading.make_labs",
    "grade": "labkit.grading.grade",
    "make-autograder": "labkit.grading.autograder_bundle",
    "serve": "labkit.serve.serve_cli",
    "route": "labkit.serve.route_cli",
    "loadtest": "labkit.serve.loadtest_cli",
}
USAGE_ERROR = 2  # argparse's own status for a bad command line
USER_ERRORS = (ValueError, OSError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="labkit",
        description="The course's toolkit on the command line.",
        epilog="labkit SUBCOMMAND --help shows a subcommand's options.",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    chosen = next((arg for arg in argv if arg in SUBCOMMANDS), None)
    module = None
    for name, help_line in SUBCOMMANDS.items():
        command = sub.add_parser(
            name, help=help_line, description=help_line, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        # also accepted after the subcommand; SUPPRESS keeps a --debug given before it
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if name == chosen:
            module = importlib.import_module(ELSEWHERE.get(name) or f"labkit.cli.{name.replace('-', '_')}")
            command.description = module.__doc__
            module.add_arguments(command)
    args = parser.parse_args(argv)
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:  # the reader stopped early (`labkit plan --json | head`): nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail
        return 0
    except USER_ERRORS as error:
        if args.debug:
            raise
        print(
            f"labkit {args.command}: error: {error}\n(labkit --debug {args.command} ... shows the traceback)",
            file=sys.stderr,
        )
        return USAGE_ERROR


def say_for(args: argparse.Namespace):
    """Where a subcommand's human-readable lines go: stdout, or stderr when ``--json`` keeps stdout for JSON."""
    return functools.partial(print, file=sys.stderr if getattr(args, "json", False) else sys.stdout, flush=True)


def print_json(data) -> None:
    """What ``--json`` prints: one JSON document on stdout (numbers such as numpy's as floats)."""
    print(json.dumps(data, indent=1, default=float))
