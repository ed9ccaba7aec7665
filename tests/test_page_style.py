"""The book's own page rules hold under the theme's stylesheets, measured in Chromium (book/_ext/page_style.py).

Why: a reader met inline code that widened a 390 px phone page to 413-465 px, figures only dimmed in dark mode
(a light grey card on a dark page) and a dials table whose first column shrank to a word a line. Each rule is
measured here on a small page marked up as the book renders it, under pydata-sphinx-theme's and
sphinx-book-theme's CSS, and each is shown to matter: without the book's rules the same page has the problem.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pydata_sphinx_theme
import pytest
import sphinx_book_theme
from browser_helpers import chromium_browser, new_tab  # noqa: F401  (the `browser` fixture)

REPO = Path(__file__).resolve().parents[1]
PAGE_CSS = REPO / "book/_ext/page_style_static/page_style.css"
THEME_CSS = [
    next(Path(pydata_sphinx_theme.__file__).parent.rglob("pydata-sphinx-theme.css")),
    next(Path(sphinx_book_theme.__file__).parent.rglob("sphinx-book-theme.css")),
]
# Sphinx's basic.css keeps each word of inline code on one line; the book's pages load it before the themes'.
SPHINX_BASIC = "span.pre { white-space: nowrap; }"
# A figure as the book draws it, black on white: the left half background, the right half ink.
FIGURE_SVG = (
    "data:image/svg+xml;utf8,<svg xmlns='http://www.w3.org/2000/svg' width='200' height='100'>"
    "<rect width='200' height='100' fill='white'/><rect x='100' width='100' height='100' fill='black'/></svg>"
)
CODE = '<code class="docutils literal notranslate"><span class="pre">{}</span></code>'


def open_page(browser, tmp_path: Path, body: str, css: str, theme: str = "light", width: int = 1280):
    """A tab showing ``body`` inside the book's article markup, under the themes' CSS and ``css``."""
    (tmp_path / "page_style.css").write_text(css, encoding="utf-8")
    links = "".join(f'<link rel="stylesheet" href="{sheet.as_uri()}">' for sheet in THEME_CSS)
    page = tmp_path / "page.html"
    page.write_text(
        f'<!DOCTYPE html><html data-theme="{theme}"><head><meta name="viewport" content="width=device-width">'
        f'<style>{SPHINX_BASIC}</style>{links}<link rel="stylesheet" href="page_style.css"></head><body>'
        '<div class="bd-container"><main class="bd-main"><div class="bd-content"><article class="bd-article">'
        f"{body}</article></div></main></div></body></html>",
        encoding="utf-8",
    )
    tab = new_tab(browser, viewport={"width": width, "height": 800})
    tab.goto(page.as_uri(), wait_until="load")
    return tab


def phone_page_width(browser, tmp_path: Path, css: str) -> int:
    """How wide a 390 px phone's page becomes with the book's longest inline code in a sentence."""
    words = ["vllm:spec_decode_num_accepted_tokens_total", "torch.nn.functional.scaled_dot_product_attention"]
    body = "<p>Divide " + " by ".join(CODE.format(word) for word in words) + " to read the rate.</p>"
    tab = open_page(browser, tmp_path, body, css, width=390)
    try:
        return tab.evaluate("() => document.documentElement.scrollWidth")
    finally:
        tab.close()


@pytest.mark.browser
def test_long_inline_code_wraps_on_a_phone(browser, tmp_path: Path) -> None:
    assert phone_page_width(browser, tmp_path, PAGE_CSS.read_text(encoding="utf-8")) <= 390


@pytest.mark.browser
def test_without_the_rule_long_inline_code_widens_a_phone_page(browser, tmp_path: Path) -> None:
    assert phone_page_width(browser, tmp_path, "") > 390


def figure_pixels(browser, tmp_path: Path, css: str, theme: str) -> tuple[float, float]:
    """The brightness (0 black, 1 white) of a computed figure's background and of its ink, as the reader sees them."""
    from matplotlib.image import imread

    body = f'<div class="cell_output docutils container"><img alt="a figure" src="{FIGURE_SVG}"></div>'
    tab = open_page(browser, tmp_path, body, css, theme=theme)
    try:
        shot = imread(io.BytesIO(tab.locator("img").screenshot()), format="png")[..., :3].mean(axis=2)
    finally:
        tab.close()
    rows, columns = shot.shape
    return float(shot[rows // 2, columns // 4]), float(shot[rows // 2, 3 * columns // 4])


@pytest.mark.browser
def test_figures_read_light_on_dark_in_dark_mode_and_stay_as_drawn_in_light_mode(browser, tmp_path: Path) -> None:
    css = PAGE_CSS.read_text(encoding="utf-8")
    background, ink = figure_pixels(browser, tmp_path, css, "dark")
    assert background < 0.15 and ink > 0.85, f"dark mode: background {background:.2f}, ink {ink:.2f}"
    background, ink = figure_pixels(browser, tmp_path, css, "light")
    assert background > 0.95 and ink < 0.05, f"light mode: background {background:.2f}, ink {ink:.2f}"


@pytest.mark.browser
def test_without_the_rule_a_dark_page_shows_figures_as_a_light_card(browser, tmp_path: Path) -> None:
    background, _ = figure_pixels(browser, tmp_path, "", "dark")
    assert background > 0.6, f"the theme alone: background {background:.2f}"


def first_column_width(browser, tmp_path: Path, css: str) -> float:
    """The width in px of the dials table's first column at 1280 px, two of its rows as the chapter has them."""
    rows = [
        ("memory handed to the KV cache (chapter 5)", CODE.format("--gpu-memory-utilization") + " (0.9 by default)",
         CODE.format("-c") + " (context, shared by all slots)", "number of KV blocks"),
        ("fewer bytes per weight (chapter 8)", CODE.format("--quantization") + " (or a pre-quantized AWQ/GPTQ checkpoint)",
         "the GGUF file's type (Q8_0, Q4_K_M, ...)",
         CODE.format("labkit serve --quantization int8") + " (int8 weights and activations, on a CPU); planned with "
         + CODE.format("labkit plan --weights int8") + " or " + CODE.format("int4") + "; measured on the model in lab 10"),
    ]  # fmt: skip
    cells = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    table = (
        f'<div style="width: 752px"><table class="first-column-wide table">{cells}</table></div>'  # 1280 px's column
    )
    tab = open_page(browser, tmp_path, table, css)
    try:
        return tab.evaluate("() => document.querySelector('td').getBoundingClientRect().width")
    finally:
        tab.close()


@pytest.mark.browser
def test_the_dials_table_keeps_its_first_column_readable(browser, tmp_path: Path) -> None:
    css = PAGE_CSS.read_text(encoding="utf-8")
    assert first_column_width(browser, tmp_path, css) >= 150
    assert first_column_width(browser, tmp_path, "") < 150, "the table no longer squeezes its first column"


def test_the_theme_top_bar_holds_no_second_search() -> None:
    """The theme's top bar would hold only a search field, beside the sidebar's: its one item is removed."""
    sys.path.insert(0, str(REPO / "book" / "_ext"))
    from page_style import one_search_control

    config = SimpleNamespace(html_theme_options={"launch_buttons": {}})
    one_search_control(None, config)  # type: ignore[arg-type]
    assert config.html_theme_options == {"launch_buttons": {}, "navbar_persistent": []}
