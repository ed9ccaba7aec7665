"""Learner text in the grader's output is data: bounded, printable, and unable to pose as structure.

A submission controls much of what its reports and the grader's console say: its exception
messages, what its cells raised, its metadata, even its file name. One rule holds for all of it,
wherever it goes: `escaped` writes every character `str.isprintable()` rejects as a visible escape
(`\\x1b`, `\\x85`, `\\u202e`, `\\u2028`, `\\x00`): C0 and C1 controls, Unicode line and paragraph
separators, bidi overrides and isolates, other format characters, surrogates, unassigned code
points. So no terminal sequence runs, no text is shown reordered, and no line break hides where a
`str.splitlines()` reader would see one. A backslash stays as it is: an escape shows what was there,
it is not meant to be decoded.

Newlines are decided per format. A message is several lines (a headline, the first difference, a
hint), kept where the format can hold them as data: Markdown (`code_block`: every line indented four
spaces, so no line of it can start markup, for a CommonMark renderer or for `grep '^#'`), JUnit XML
text (`xml_text`: each further line indented four spaces), JSON strings (which escape them) and
Gradescope's per-test output. Everywhere else text is one line, its newlines shown as `\\n`:
console lines, CSV cells (`csv_cell`, which also applies OWASP's rule against CSV injection: a cell
a spreadsheet would read as a formula gets a leading apostrophe), XML attributes, file paths.
`report_text` also bounds a text to `MAX_TEXT_BYTES`, with the cut stated.
"""

from __future__ import annotations

MAX_TEXT_BYTES = 64 << 10  # one message, one error, or all of a submission's notes together
_FORMULA_STARTS = ("=", "+", "-", "@")  # OWASP's tab and carriage return are escaped before this
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(character: str) -> str:
    """One unprintable character as Python writes it in a string literal: \\n, \\x1b, \\u202e, \\U000e0001."""
    code = ord(character)
    if character in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[character]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escaped_line(text: str) -> str:
    if text.isprintable():  # the honest case, checked at C speed
        return text
    return "".join(character if character.isprintable() else _escape(character) for character in text)


def escaped(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every character `str.isprintable()` rejects written as a visible escape; with
    `keep_newlines`, a newline ("\\n" only) stays one. The grader's one rule for learner text."""
    text = str(text)
    if keep_newlines:
        return "\n".join(map(_escaped_line, text.split("\n")))
    return _escaped_line(text)


def report_text(text: str, limit: int = MAX_TEXT_BYTES, *, keep_newlines: bool = True) -> str:
    """`text` fit for any report: `escaped`, then cut to `limit` bytes of UTF-8."""
    text = escaped(text, keep_newlines=keep_newlines)
    data = text.encode()
    if len(data) <= limit:
        return text
    cut = ("\n" if keep_newlines else " ") + "… {} bytes cut"
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
    """Markdown lines showing `text` (escaped) as an indented code block; put a blank line before it.

    A fence could be closed by a line of the text, and a fenced line still starts with `#` for any
    reader that is not a renderer. An indented code block ends only at a line indented less than
    four spaces, and every line of this one is indented four: the text can neither end it nor start
    a line of the file."""
    return ["    " + line for line in escaped(text, keep_newlines=True).split("\n")]


def xml_text(text: str) -> str:
    """`text` (escaped) for an XML element's text: its lines kept, each after the first indented four
    spaces, so that no line of the file starts with the learner's text."""
    return "\n    ".join(escaped(text, keep_newlines=True).split("\n"))


def csv_cell(value: str) -> str:
    """A CSV cell that stays on its row and shows as text in a spreadsheet: `escaped` to one line, and one
    that would start a formula gets a leading apostrophe."""
    value = escaped(value)
    return "'" + value if value.startswith(_FORMULA_STARTS) else value
