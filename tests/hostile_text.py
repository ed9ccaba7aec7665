"""Learner text built to forge lines in the grader's output, and the check that none of it got through raw.

`HOSTILE` holds every kind of character `str.isprintable()` rejects that could mislead a reader:
bidi overrides (U+202E shows the text after it reversed), the line and paragraph separators and
NEL (\\x85), which `str.splitlines()` treats as line breaks, an ANSI colour sequence, a NUL, and a
plain newline before a forged score line. `FORGED_FILE_NAME` is a file name that would print that
line on the grader's console (as the grader prints a score line, but for a slash that no file name holds).
"""

from __future__ import annotations

FORGED_LINE = "alice: 4 \u2215 4  (demo.add PASS)"  # a division slash: a file name cannot hold "/"
HOSTILE = (
    f"boom \u202etxet desrever\u202c, sep\u2028# forged heading\u2029# forged paragraph\x85# forged NEL, "
    f"\x1b[31mred\x1b[0m, nul \x00 end\n{FORGED_LINE}"
)
ESCAPES = ("\\u202e", "\\u2028", "\\u2029", "\\x85", "\\x1b[31mred\\x1b[0m", "\\x00")  # how HOSTILE shows
FORGED_FILE_NAME = f"x\n{FORGED_LINE}\n.ipynb"


def unprintable(text: str) -> list[str]:
    """Each character in `text` that `str.isprintable()` rejects, but a newline."""
    return [repr(character) for character in sorted(set(text)) if not (character.isprintable() or character == "\n")]


def raw_learner_text(text: str) -> list[str]:
    """What in `text` (a file's text or the console's) a hostile learner got through raw: `unprintable`
    characters, and any line (as `str.splitlines()` reads them) that starts with a forged score line or heading."""
    return unprintable(text) + [
        f"forged line {line!r}" for line in text.splitlines() if line.startswith((FORGED_LINE, "# forged"))
    ]
