"""Generate learner notebooks from the solved lab sources; --check fails on a stale one.

    labkit make-labs [--source labs/source] [--out labs] [--check]

Each `SOURCE/labN_topic.ipynb` (solved, solutions marked) becomes `OUT/labN_topic.ipynb`
for learners; the lab id is the file name up to the first underscore. With --check
nothing is written: the command exits 1 and names every learner notebook that is
missing or differs from what its source generates.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `labkit make-labs` options."""
    parser.add_argument(
        "--source", type=Path, default=Path("labs/source"), help="folder of solved lab notebooks (default labs/source)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("labs"), help="folder for the learner notebooks (default labs)"
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any learner notebook is stale")


def run(args: argparse.Namespace) -> int:
    """Generate (or check) every learner notebook; print what was done."""
    try:  # here rather than at the top, so `labkit --help` works without the [labs] extra
        from labkit.grading.learner_notebook import SourceError, learner_text
    except ImportError as error:
        print(f"error: labkit make-labs needs {error.name}; install it with: pip install 'labkit[labs]'")
        return 2
    if not args.source.is_dir():
        print(f"error: no lab source folder {args.source}; pass --source")
        return 2
    sources = sorted(args.source.glob("*.ipynb"))
    if not sources:
        print(f"no lab sources in {args.source}; nothing to do")
        return 0
    stale = []
    for source_path in sources:
        target = args.out / source_path.name
        try:
            text = learner_text(source_path, args.out)
        except SourceError as error:
            print(f"error: {error}")
            return 2
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current == text:
            print(f"up to date: {target}")
        elif args.check:
            stale.append(target)
            problem = "is missing" if current is None else f"differs from what {source_path} generates"
            print(f"stale: {target} {problem}")
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")
    if stale:
        print(f"{len(stale)} learner notebook(s) stale: run `labkit make-labs` and commit the result")
        return 1
    return 0
