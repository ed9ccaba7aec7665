"""The reference list labelled as the text cites: "[Kwon et al., 2023]", not pybtex's alpha "[KLZ+23]".

Why: the chapters cite author-year (``bibtex_reference_style: author_year``); the list's default alpha labels
dropped the year's century and matched nothing a reader saw in the text. ``bibtex_default_style: authoryear``
selects this style. Two sources by one author in one year carry their own year letter in references.bib
(2025a, 2025b), so text and list agree on one label per source.
"""

from __future__ import annotations

from pybtex.backends.plaintext import Backend as PlainText
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.application import Sphinx

# One plain-text backend for every label: render_as("text") looks the backend up among the installed packages' entry
# points on every call (pybtex's find_plugin), 51 references times their authors: seconds of every build.
PLAIN_TEXT = PlainText()


def _last_name(person) -> str:
    return Text.from_latex(" ".join(person.last_names)).render(PLAIN_TEXT)


def author_year_label(entry) -> str:
    """One author, two joined by "and", or the first "et al."; the year as references.bib gives it."""
    people = entry.persons.get("author", [])
    names = [_last_name(person) for person in people]
    if not names:
        who = Text.from_latex(entry.fields.get("title", "")).render(PLAIN_TEXT)
    elif len(names) <= 2:
        who = " and ".join(names)
    else:
        who = f"{names[0]} et al."
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        for entry in sorted_entries:
            yield author_year_label(entry)


class AuthorYearStyle(UnsrtStyle):
    default_label_style = "authoryear"


register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
# sphinxcontrib-bibtex asks pybtex for the plain-text backend once per citation in the text (80 of them), and each
# ask searched every installed package's entry points (10 ms); registered here, the backend is found at once.
register_plugin("pybtex.backends", "plaintext", PlainText, force=True)
register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)


def setup(app: Sphinx) -> dict[str, bool]:
    return {"parallel_read_safe": True, "parallel_write_safe": True}
