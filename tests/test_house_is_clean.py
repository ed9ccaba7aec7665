"""What a maintainer inherits stays readable: no machine or tracker named (such references go stale the day they are
written), no function too long to hold in one's head, no data kept beside a script that no script reads."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Where a reader of the course or of labkit's code would meet them (tests may name the issue they hold to).
READER_FACING = [
    "labkit",
    "scripts",
    "book",
    "labs",
    "README.md",
    "_toc.yml",
    "_config.yml",
    "Makefile",
    "environment.yml",
]
MACHINE_PATH = re.compile(r"(?<![\w.~])/(work|home/[a-z_][\w-]*|root|Users/[\w-]+)/")
TRACKER_ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)


def tracked_text(paths: list[str]) -> dict[str, str]:
    names = subprocess.run(["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True)
    texts = {}
    for name in names.stdout.split():
        try:
            texts[name] = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # a binary file, or one deleted in this checkout
            continue
    return texts


def offending_lines(pattern: re.Pattern[str], texts: dict[str, str]) -> list[str]:
    return [
        f"{name}:{number}: {line.strip()[:100]}"
        for name, text in texts.items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line)
    ]


def test_no_file_names_a_folder_of_the_machine_it_was_written_on():
    texts = tracked_text(["."])
    texts.pop("tests/test_house_is_clean.py")  # its own examples below
    found = offending_lines(MACHINE_PATH, texts)
    assert not found, "use a path relative to the checkout or to ~ instead of:\n" + "\n".join(found)


def test_no_reader_facing_file_cites_the_project_tracker():
    found = offending_lines(TRACKER_ISSUE, tracked_text(READER_FACING))
    assert not found, "say what the issue said, not its number (it means nothing outside the tracker):\n" + "\n".join(
        found
    )


def test_the_patterns_catch_what_they_are_for():
    assert MACHINE_PATH.search("mkdir -p /work/llama-build") and MACHINE_PATH.search("see /home/alice/x")
    assert not MACHINE_PATH.search("mkdir -p ~/llama-build") and not MACHINE_PATH.search("https://a.b/work/x")
    assert TRACKER_ISSUE.search("the goal (issue 33)") and TRACKER_ISSUE.search("Issues 34.5")
    assert not TRACKER_ISSUE.search("github.com/pytorch/pytorch/issues/184982")


MAX_FUNCTION_LINES = 60  # a screen: a longer function is cut into named steps


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (N lines, line L)`` for each function or method of ``source`` over ``limit`` lines, docstring included."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_in_labkit_is_over_sixty_lines():
    found = {
        path: names
        for path in sorted(tracked_text(["labkit"]))
        if path.endswith(".py")
        if (names := long_functions((ROOT / path).read_text(encoding="utf-8")))
    }
    assert not found, f"cut these into named steps (at most {MAX_FUNCTION_LINES} lines each): {found}"


def test_the_length_check_sees_a_long_function_and_passes_a_short_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def long():\n{body}") == [f"long ({MAX_FUNCTION_LINES + 1} lines, line 1)"]
    method = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    assert long_functions(f"class A:\n    async def short(self):\n{method}") == []


DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".npz", ".pt")


def test_data_outside_tests_is_read_by_something_outside_tests():
    """Data only tests read lives under tests/; data kept elsewhere is named by a script, labkit or the book."""
    readers = tracked_text(["labkit", "scripts", "book", "labs/source", "Makefile"])
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    data = [name for name in names if name.endswith(DATA_SUFFIXES) and not name.startswith("tests/")]
    unread = [name for name in data if not any(Path(name).name in text for text in readers.values())]
    assert not unread, f"read only by tests (or by nothing): move them under tests/ or delete them: {unread}"
