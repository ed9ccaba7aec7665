"""Learner text in the grader's reports is data: bounded, printable, and unable to pose as report structure.

A submission controls much of what its reports say: its exception messages, what its cells
raised, even its file name. Every such text goes through `report_text` before any report holds
it (at most `MAX_TEXT_BYTES`, with the cut stated; characters that XML cannot hold or UTF-8
cannot encode shown as escapes), then through the format's own guard: `code_block` for Markdown (every line indented four
spaces, so no line of it can start markup: not for a CommonMark renderer, which shows it as code,
nor for anything that reads the file line by line, such as `grep '^#'` or a page that concatenates
reports),
`csv_cell` for a spreadsheet (OWASP's rule against CSV injection: a cell a spreadsheet would read
as a formula is quoted with a leading apostrophe). JSON and XML writers escape the rest.
"""

from __future__ import annotations

import re

MAX_TEXT_BYTES = 64 << 10  # one message, one error, or all of a submission's notes together
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Characters XML 1.0 cannot hold (C0 controls but tab and newline; lone surrogates; U+FFFE/U+FFFF).
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\ud800-\udfff\ufffe\uffff]")


def report_text(text: str, limit: int = MAX_TEXT_BYTES) -> str:
    """`text` fit for any report: unprintable characters escaped, then cut to `limit` bytes of UTF-8."""
    text = _UNPRINTABLE.sub(lambda match: f"\\u{ord(match.group()):04x}", str(text))
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = "\n… {} bytes cut"
    kept = data[: max(0, limit - len(cut.format(len(data)).encode()))].decode(errors="ignore")
    return kept + cut.format(len(data) - len(kept.encode()))


def report_lines(lines: list[str], limit: int = MAX_TEXT_BYTES) -> list[str]:
    """`lines` fit for a report, at most `limit` bytes of them in all (then how many more were cut)."""
    kept: list[str] = []
    for position, line in enumerate(lines):
        left = limit - sum(len(line.encode()) for line in kept)
        if left <= 0:
            return [*kept, f"… {len(lines) - position} more cut"]
        kept.append(report_text(line, left))
    return kept


def code_block(text: str) -> list[str]:
    """Markdown lines showing `text` verbatim as an indented code block; put a blank line before it.

    A fence could be closed by a line of the text, and a fenced line still starts with `#` for any
    reader that is not a renderer. An indented code block ends only at a line indented less than
    four spaces, and every line of this one is indented four: the text can neither end it nor start
    a line of the file."""
    return ["    " + line for line in text.split("\n")]


def csv_cell(value: str) -> str:
    """A CSV cell a spreadsheet shows as text: one that would start a formula gets a leading apostrophe."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value
