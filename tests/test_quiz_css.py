"""The quiz box keeps its side padding under the theme's own stylesheet, measured in Chromium.

Why: pydata-sphinx-theme unsets the side padding of every ``.docutils.container``, and a quiz box is one;
a selector of less weight in book/_ext/quiz_static/quiz.css lost to it (the box computed to 9.6px 0px). Here
the theme's stylesheet and the quiz's are loaded on a page holding a box as the book renders it.
"""

from __future__ import annotations

from pathlib import Path

import pydata_sphinx_theme
import pytest
from browser_helpers import chromium_browser, new_tab  # noqa: F401  (the `browser` fixture)

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
THEME_CSS = next(Path(pydata_sphinx_theme.__file__).parent.rglob("pydata-sphinx-theme.css"))


def padding(browser, tmp_path: Path, quiz_css: str) -> list[str]:
    """The computed padding (top, right, bottom, left) of a quiz box under the theme's CSS and ``quiz_css``."""
    (tmp_path / "quiz.css").write_text(quiz_css, encoding="utf-8")
    page = tmp_path / "page.html"
    page.write_text(
        f'<html><head><link rel="stylesheet" href="{THEME_CSS.as_uri()}"><link rel="stylesheet" href="quiz.css">'
        '</head><body><main class="bd-main"><div class="bd-content"><article class="bd-article">'
        '<div class="quiz quiz-salt-1 docutils container" id="box"><p>A question?</p></div>'
        "</article></div></main></body></html>",
        encoding="utf-8",
    )
    tab = new_tab(browser)
    try:
        tab.goto(page.as_uri())
        return tab.evaluate(
            "() => { const s = getComputedStyle(document.getElementById('box'));"
            " return [s.paddingTop, s.paddingRight, s.paddingBottom, s.paddingLeft]; }"
        )
    finally:
        tab.close()


def test_the_quiz_box_has_side_padding(browser, tmp_path: Path) -> None:
    css = (REPO / "book/_ext/quiz_static/quiz.css").read_text(encoding="utf-8")
    top, right, bottom, left = padding(browser, tmp_path, css)
    assert right == left and float(left.removesuffix("px")) >= 8, (top, right, bottom, left)


def test_a_weaker_selector_loses_the_side_padding_to_the_theme(browser, tmp_path: Path) -> None:
    """The old selector, measured the same way: the theme's rule wins and the sides compute to 0 (the bug)."""
    weak = "article .quiz { padding: 0.6em 1em; }"
    assert padding(browser, tmp_path, weak)[1] == "0px"
