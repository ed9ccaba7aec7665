"""A Sphinx extension for what the theme leaves hard to read: the book's own page rules and one search control.

Why: a reader on a phone, in dark mode or looking for the search met four snags: inline code such as
``--kv-offloading-backend`` could not wrap and widened a 390 px page by up to 75 px; the computed figures, drawn
black on white, were only dimmed in dark mode, a glaring grey card on a dark page; the dials table squeezed its
first column to a word a line; and the theme's top bar held nothing but a second search field beside the one in
the sidebar. The rules are in page_style_static/page_style.css (tests/test_page_style.py measures them in
Chromium); the top bar goes by emptying its one item, the theme option ``navbar_persistent``.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config

STATIC = Path(__file__).with_name("page_style_static")


def one_search_control(app: Sphinx, config: Config) -> None:
    """Leave the theme's top bar empty (so it is not drawn): the sidebar's field and the page's button search."""
    config.html_theme_options = {**(config.html_theme_options or {}), "navbar_persistent": []}


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("config-inited", one_search_control)
    app.connect("builder-inited", add_static_path)
    app.add_css_file("page_style.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
