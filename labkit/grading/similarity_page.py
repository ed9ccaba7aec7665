"""The similarity report as files: DIR/similarity.html for a reviewer, DIR/similarity.json for machines.

The page is one self-contained file (its style inline, no script, no external asset). Every text a
submission controls (its cells, names drawn from its code) is shown as text: characters that
`str.isprintable` rejects (bidi overrides, other controls) as visible escapes (`report_text.escaped`),
then `html.escape`, so nothing in a cell can become markup or reorder what a reviewer reads.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from labkit.grading.report_text import escaped
from labkit.grading.similarity import CLASSMATE, MIN_CHARACTERS, REFERENCE, ClassSimilarity, Pair

HTML_FILE = "similarity.html"
JSON_FILE = "similarity.json"

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 110em; }
table.pair { border-collapse: collapse; width: 100%; table-layout: fixed; }
table.pair td { vertical-align: top; border: 1px solid #ccc; padding: 0.3em; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.85em; }
mark { background: #ffd27f; }
.findings td, .findings th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
"""


def _visible(text: str) -> str:
    """`text` as HTML text: the grader's one rule for learner text (`escaped`), then `html.escape`."""
    return html.escape(escaped(text, keep_newlines=True))


def _whole_lines(source: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The matched spans widened to the lines they touch (copydetect's start inside a line's tokens)."""
    widened = []
    for start, end in sorted(spans):
        line_start = source.rfind("\n", 0, start) + 1
        line_end = source.find("\n", max(end - 1, start))
        widened.append((line_start, len(source) if line_end < 0 else line_end))
    return widened


def _highlighted(source: str, spans: list[tuple[int, int]]) -> str:
    """The cell with its matched lines marked."""
    parts, done = [], 0
    for start, end in _whole_lines(source, spans):
        start = max(start, done)
        if end <= start:
            continue
        parts += [_visible(source[done:start]), "<mark>", _visible(source[start:end]), "</mark>"]
        done = end
    parts.append(_visible(source[done:]))
    return "".join(parts)


def _pair_section(pair: Pair) -> list[str]:
    other = pair.other if pair.kind == CLASSMATE else f"reference: {pair.other}"
    return [
        f"<h3>{_visible(pair.submission)} and {_visible(other)}: {pair.score:.2f}</h3>",
        f"<p>Share of each cell's code found in the other: {pair.shares[0]:.0%} and {pair.shares[1]:.0%}.</p>",
        '<table class="pair"><tr>',
        f"<th>{_visible(pair.submission)}</th><th>{_visible(other)}</th></tr><tr>",
        *(f"<td><pre>{_highlighted(source, spans)}</pre></td>" for source, spans in zip(pair.sources, pair.spans)),
        "</tr></table>",
    ]


def to_html(report: ClassSimilarity) -> str:
    """The whole page: per exercise its threshold, the pairs above it side by side and the cells too short
    to compare; then the source scan's findings; then the notes."""
    lines = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Similarity report</title>',
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Similarity report</h1>",
        "<p>Each exercise cell compared with labkit's answer and with every classmate's cell of the same exercise "
        "(copydetect; the starter code does not count). A listed pair is a reason to read both cells, not a verdict: "
        "grades are unchanged.</p>",
    ]
    if report.problem:
        lines.append(f"<p><strong>The similarity report could not be made:</strong> {_visible(report.problem)}</p>")
    for exercise, limit in report.thresholds.items():
        pairs = [pair for pair in report.pairs if pair.exercise == exercise]
        lines += [
            f"<h2>{_visible(exercise)}</h2>",
            f"<p>Flagged at a score of {limit:.2f} or more: {len(pairs)} pair(s).</p>",
        ]
        short = report.too_short.get(exercise, [])
        if short:
            names = ", ".join("labkit's answer" if name == REFERENCE else _visible(name) for name in short)
            lines.append(
                f"<p>Too short to compare (under {MIN_CHARACTERS} characters of code outside the starter): {names}</p>"
            )
        for pair in pairs:
            lines += _pair_section(pair)
    lines.append("<h2>Source scan</h2>")
    if not report.findings:
        lines.append("<p>No exercise cell reaches around a check.</p>")
    else:
        lines.append("<p>Code that reaches around a check, for review (nothing here failed an exercise).</p>")
        lines.append(
            '<table class="findings"><tr><th>submission</th><th>exercise</th><th>line</th><th>what</th><th>why</th></tr>'
        )
        for name, findings in report.findings.items():
            for finding in findings:
                cells = (name, finding.exercise, str(finding.line), finding.what, finding.why)
                lines.append("<tr>" + "".join(f"<td>{_visible(cell)}</td>" for cell in cells) + "</tr>")
        lines.append("</table>")
    if report.notes:
        lines += ["<h2>Notes</h2>", "<ul>", *(f"<li>{_visible(note)}</li>" for note in report.notes), "</ul>"]
    lines.append("</body></html>")
    return "\n".join(lines) + "\n"


def write_similarity(report: ClassSimilarity, out_dir: Path) -> list[Path]:
    """Write DIR/similarity.html and DIR/similarity.json; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    page, data = out_dir / HTML_FILE, out_dir / JSON_FILE
    page.write_text(to_html(report), encoding="utf-8")
    data.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return [page, data]
