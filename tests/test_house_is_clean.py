"""What a maintainer inherits names no machine and no tracker: such references go stale the day they are written."""

from __future__ import annotations

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
