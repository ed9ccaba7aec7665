"""Search excerpts that work when the book is opened from disk: every page's text shipped beside the search page.

Why: Sphinx's search shows an excerpt of each result by fetching the result's page. A book opened as a file
(file://) may not fetch another file, so every result came without its excerpt and logged an error in the
reader's console. After the build this extension writes ``_static/search_pages.js``: each page's main text,
cut to its sections (the anchors results point at), with the hidden code, scripts and figures left out. The
search page loads it with ``offline_search.js``, which answers Sphinx's requests for those pages from it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bs4 import BeautifulSoup, Comment
from sphinx.application import Sphinx

STATIC = Path(__file__).with_name("offline_search_static")
PAGES_JS = "search_pages.js"
LEFT_OUT = "script, style, svg, img, .headerlink, details.above-input, .cell_input, .quiz-explanation"  # hidden code
INLINE = {"a", "abbr", "b", "cite", "code", "em", "i", "kbd", "mark", "small", "span", "strong", "sub", "sup", "var"}


def searchable_text(html: str) -> str:
    """A page's main content as Sphinx's excerpt code reads it: <section id=...> around plain text."""
    main = BeautifulSoup(html, "html.parser").select_one('[role="main"]')
    if main is None:
        return ""
    main = main.select_one("article") or main  # the page itself, not the theme's buttons and contents list
    for comment in main.find_all(string=lambda text: isinstance(text, Comment)):
        comment.extract()
    for tag in main.select(LEFT_OUT):
        tag.decompose()
    for tag in main.find_all(True):
        if tag.name == "section" and tag.get("id"):
            tag.attrs = {"id": tag["id"]}
            continue
        if tag.name not in INLINE:
            tag.append(" ")  # a heading's last word and the next paragraph's first stay two words
        tag.unwrap()
    return '<div role="main">' + re.sub(r"\s+", " ", main.decode_contents()).strip() + "</div>"


def write_pages(app: Sphinx, exception: Exception | None) -> None:
    """``_static/search_pages.js``: ``{"book/sale.html": "<div role=main>...", ...}`` for every page built."""
    if exception is not None or app.builder.name != "html":
        return
    out = Path(app.outdir)
    pages = {}
    for docname in sorted(app.env.found_docs):
        page = out / f"{docname}{app.builder.out_suffix}"
        if page.is_file():
            pages[page.relative_to(out).as_posix()] = searchable_text(page.read_text(encoding="utf-8"))
    text = json.dumps(pages, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    (out / "_static" / PAGES_JS).write_text(f"window.SEARCH_PAGES = {text};\n", encoding="utf-8")


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def add_to_search_page(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: object) -> None:
    if pagename == "search":
        app.add_js_file(PAGES_JS)
        app.add_js_file("offline_search.js")


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("builder-inited", add_static_path)
    app.connect("html-page-context", add_to_search_page)
    app.connect("build-finished", write_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
