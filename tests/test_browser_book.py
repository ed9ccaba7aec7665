"""The built book, clicked through in a real browser, as a reader meets it.

Why: a page can build cleanly and still break in the reader's browser: a script that throws, a
figure that never loads, math left as raw TeX without a network, an answer that will not unfold,
a link to a page or anchor that is not there. These tests open every page of the book this test
session built (`html`, shared with test_book.py) in Debian's chromium through Playwright.
"""

from __future__ import annotations

import functools
import io
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from browser_helpers import chromium_browser, new_tab, screenshot  # noqa: F401  (the `browser` fixture)
from test_book import built_book  # noqa: F401  (the `html` fixture: the book, built once per session)

pytestmark = pytest.mark.browser
SCREENSHOT_PAGES = ("capacity_planning", "kv_memory")  # a screenshot of each in test-artifacts/, its pixels checked


def book_pages(root: Path) -> list[Path]:
    """Every HTML page a reader can reach; Sphinx's own folders (_static, _sources, ...) are not pages."""
    return sorted(page for page in root.rglob("*.html") if not page.relative_to(root).parts[0].startswith("_"))


class LinksAndAnchors(HTMLParser):
    """A page's link targets (<a> and <link> hrefs, a redirect's <meta http-equiv="refresh">) and its anchors (ids, names)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.anchors: set[str] = set()
        self.redirects = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {key: value or "" for key, value in attrs}
        self.anchors.update(value for key, value in attr.items() if key in ("id", "name") and value)
        if tag in ("a", "link") and attr.get("href"):
            self.hrefs.append(attr["href"])
        if tag == "meta" and attr.get("http-equiv", "").lower() == "refresh":
            self.redirects = True
            self.hrefs.append(attr.get("content", "").partition("url=")[2])


@functools.cache  # each page is parsed once per session, however many tests and links look at it
def read_links(page: Path) -> LinksAndAnchors:
    parsed = LinksAndAnchors()
    parsed.feed(page.read_text(encoding="utf-8"))
    return parsed


def broken_links(root: Path) -> list[str]:
    """'page -> target (why)' for every link inside the book whose file or anchor does not exist."""
    broken = []
    for page in book_pages(root):
        for href in read_links(page).hrefs:
            url = urlsplit(href)
            if url.scheme or url.netloc:
                continue  # another site, mail or javascript: not the book's to check
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(root)} -> {href}"
            if not target.is_file():
                broken.append(f"{where} (no such file)")
            elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in read_links(target).anchors:
                broken.append(f"{where} (no such anchor)")
    return broken


def test_the_link_checker_names_the_page_and_target_of_a_broken_link(tmp_path: Path) -> None:
    """A hand-made book with one good link, a missing page and a missing anchor."""
    (tmp_path / "a.html").write_text('<h2 id="sec">A</h2>')
    (tmp_path / "index.html").write_text(
        '<a href="a.html#sec">ok</a> <a href="#top" id="top">self</a> <a href="https://example.org/x.html">away</a>'
        '<a href="missing.html">gone</a> <a href="a.html#nowhere">lost</a>'
    )
    (tmp_path / "old.html").write_text('<meta http-equiv="Refresh" content="0; url=moved.html" />')
    assert broken_links(tmp_path) == [
        "index.html -> missing.html (no such file)",
        "index.html -> a.html#nowhere (no such anchor)",
        "old.html -> moved.html (no such file)",
    ]


def test_every_internal_link_and_anchor_resolves(html: Path) -> None:
    pages = book_pages(html)
    assert len(pages) > 10, f"expected the book's chapters and labs in {html}, found {len(pages)} pages"
    broken = broken_links(html)
    assert not broken, "broken links (page -> target):\n" + "\n".join(broken)


def open_page(browser, page: Path, query: str = ""):
    """A fresh tab showing the page (with ``?query``, if given) once MathJax has finished, and the errors it logged."""
    tab = new_tab(browser, viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: errors.append(f"uncaught {error}"))
    tab.goto(page.as_uri() + (f"?{query}" if query else ""), wait_until="load")
    tab.evaluate("() => window.MathJax?.startup?.promise")  # typesetting finishes after the load event
    return tab, errors


@pytest.fixture(scope="module")
def opened(browser):
    """Each page opened once for this module's tests, which read it, then click its answers and checks.

    Loading a page and typesetting its math is most of what these tests cost; the errors list of a
    tab keeps collecting, so a click that throws is still seen by the test that made it.
    """
    tabs: dict[Path, tuple] = {}

    def tab_for(page: Path):
        if page not in tabs:
            tabs[page] = open_page(browser, page)
        return tabs[page]

    yield tab_for
    for tab, _ in tabs.values():
        tab.close()


# What the browser sees on a page: formulas left untypeset, MathJax errors, images that did not load,
# and TeX a reader sees as such: a macro MathJax printed literally inside a typeset formula (`\text{kv\_heads}`
# shows "kv\_heads"), or TeX left in the prose (`\_`, `\(`, `$$`, `$\alpha$`), outside code.
PAGE_PROBLEMS_JS = r"""() => {
    const tex = /\\[_([]|\\[a-zA-Z]+\{|\$\$|\$[^$\s][^$]*\\[a-zA-Z]/;
    const literalTeX = [];
    for (const item of window.MathJax?.startup?.document?.math ?? []) {
        for (const [, text] of MathJax.startup.toMML(item.root).matchAll(/<mtext[^>]*>([^<]*)<\/mtext>/g)) {
            if (text.includes('\\')) literalTeX.push(`in a formula: ${text}`);
        }
    }
    const skip = 'pre, code, script, style, textarea, mjx-container';
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
        acceptNode: node => node.parentElement.closest(skip) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
    });
    while (walker.nextNode()) {
        const text = walker.currentNode.textContent;
        if (tex.test(text)) literalTeX.push(`in the text: ${text.trim().slice(0, 100)}`);
    }
    return {
        untypeset: [...document.querySelectorAll('.math')].filter(m => !m.querySelector('mjx-container')).length,
        mathErrors: document.querySelectorAll('mjx-merror').length,
        literalTeX,
        brokenImages: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src),
    };
}"""


def reader_pages(root: Path) -> list[Path]:
    """The pages a reader stays on: redirects (the root index.html) are left to the link checker."""
    return [page for page in book_pages(root) if not read_links(page).redirects]


def test_every_page_loads_without_errors_with_its_figures_and_math(html: Path, opened) -> None:
    problems = []
    for page in reader_pages(html):
        tab, errors = opened(page)
        seen = tab.evaluate(PAGE_PROBLEMS_JS)
        name = page.relative_to(html)
        problems += [f"{name}: console error: {error}" for error in errors]
        problems += [f"{name}: figure did not load: {src}" for src in seen["brokenImages"]]
        if seen["untypeset"] or seen["mathErrors"]:
            problems.append(f"{name}: {seen['untypeset']} formulas not typeset, {seen['mathErrors']} MathJax errors")
        problems += [f"{name}: TeX shown to the reader {where}" for where in seen["literalTeX"]]
        if page.stem in SCREENSHOT_PAGES:
            problems += blank_screen(tab, name)
            screenshot(tab, f"book-browser-{page.stem}")
    assert not problems, "\n".join(problems)


def blank_screen(tab, name: Path) -> list[str]:
    """What is wrong with the pixels the reader sees first on a page: one colour (a blank page), or no dark ink
    (no text drawn); empty when text and figures are on the screen."""
    from matplotlib.image import imread

    pixels = imread(io.BytesIO(tab.screenshot()), format="png")[..., :3]
    ink = (pixels.mean(axis=2) < 0.5).mean()
    if pixels.std() <= 0.05:
        return [f"{name}: the screen is nearly one colour (blank page?)"]
    return [] if ink > 0.005 else [f"{name}: the screen has almost no dark pixels (no text drawn?)"]


def test_the_math_check_flags_tex_a_reader_would_see(html: Path, browser, tmp_path: Path) -> None:
    """A hand-made page with the KV formula as it once was, a stray `\\_` and a price, on the book's own MathJax."""
    mathjax = (html / "_static" / "mathjax" / "tex-chtml.js").as_uri()
    page = tmp_path / "formula.html"
    page.write_text(
        f'<script>window.MathJax = {{"options": {{"processHtmlClass": "math"}}}}</script>'
        f'<script defer src="{mathjax}"></script>'
        r'<div class="math">\[2 \times \text{kv\_heads} \times \text{KV heads}\]</div>'
        r"<p>The cache holds head\_dim numbers; <code>a\_b</code> is code; a GPU-hour costs $2.00.</p>"
    )
    tab, _ = open_page(browser, page)
    seen = tab.evaluate(PAGE_PROBLEMS_JS)
    tab.close()
    assert seen["untypeset"] == 0 and seen["mathErrors"] == 0, seen
    assert seen["literalTeX"] == [
        r"in a formula: kv\_heads",
        r"in the text: The cache holds head\_dim numbers;",
    ], seen["literalTeX"]


def test_predict_first_answers_unfold_when_clicked(html: Path, opened) -> None:
    from playwright.sync_api import expect

    unfolded = 0
    for page in reader_pages(html):
        if 'class="dropdown admonition"' not in page.read_text(encoding="utf-8"):
            continue
        tab, _ = opened(page)
        shown = tab.locator(".dropdown.admonition > :not(.admonition-title)").evaluate_all(
            "bodies => bodies.filter(body => body.checkVisibility({visibilityProperty: true})).length"
        )
        assert not shown, f"{page.name}: {shown} answers are shown before the reader asks"
        for answer in tab.locator(".dropdown.admonition").all():
            body = answer.locator(":scope > :not(.admonition-title)").first
            answer.locator(".toggle-button").click()
            expect(body, f"{page.name}: an answer stayed folded after a click").to_be_visible()
            unfolded += 1
        if page.name == "kv_memory.html":
            screenshot(tab, "book-browser-answer-open")
    assert unfolded >= 10, f"only {unfolded} 'predict first' answers found in the whole book"


# A check's options as the reader sees them now: whether each explanation shows, what it says, the script's verdict
# (its class), the answer's length; and the score line. One read per click: the script unfolds in the click's handler.
CHECK_STATE_JS = """box => ({
    options: [...box.querySelectorAll('.quiz-option')].map(option => {
        const explanation = option.querySelector('.quiz-explanation');
        return {shown: explanation.checkVisibility({visibilityProperty: true}), text: explanation.innerText,
                right: option.classList.contains('quiz-right'),
                length: option.querySelector('.quiz-answer').innerText.trim().length};
    }),
    score: box.querySelector('.quiz-score')?.textContent ?? '',
})"""


def test_each_check_option_shows_its_own_explanation_when_clicked(html: Path, opened) -> None:
    """Every option of every check, clicked: its own explanation unfolds with the script's verdict, and the
    positions the script marks right are the sources' and spread over the book as the build demands."""
    from quiz import spread_problems_by_page
    from test_book import chapter_checks, chapter_docs, right_position

    marked = []
    for doc in chapter_docs():
        tab, errors = opened(html / f"{doc}.html")
        boxes = tab.locator(".quiz").all()
        assert len(boxes) == len(chapter_checks(doc)), f"{doc}: {len(boxes)} checks on the page"
        for box, check in zip(boxes, chapter_checks(doc)):
            options = box.locator(".quiz-option .quiz-answer").all()
            assert 3 <= len(options) <= 4, f"{doc}: {len(options)} options in a check"
            before = box.evaluate(CHECK_STATE_JS)["options"]
            assert not any(option["shown"] for option in before), f"{doc}: an option is explained before it is picked"
            right = []
            for picked, answer in enumerate(options):
                answer.click()
                seen = box.evaluate(CHECK_STATE_JS)
                shown = [option["shown"] for option in seen["options"]]
                assert shown[picked], f"{doc}: option {picked + 1} stayed unexplained after a click"
                assert not any(shown[picked + 1 :]), f"{doc}: a click unfolded another option"
                verdict = "Right." if seen["options"][picked]["right"] else "Not this one."
                right += [picked] if verdict == "Right." else []
                assert verdict in seen["options"][picked]["text"], f"{doc}: option {picked + 1} lacks {verdict!r}"
            assert right == [right_position(check)], f"{doc}: the script marks {right} right in {check['question']!r}"
            marked.append((doc, right[0], tuple(option["length"] for option in seen["options"])))
            assert "at the first try" in seen["score"], f"{doc}: no score after a pick: {seen['score']!r}"
            box.locator(".quiz-retry").click()
            after = box.evaluate(CHECK_STATE_JS)["options"]
            assert not any(option["shown"] for option in after), f"{doc}: 'Try again' left an option unfolded"
        if doc == "book/kv_memory":
            screenshot(tab, "book-browser-check-answered")
        assert not errors, f"{doc}: console errors: {errors}"
    assert not spread_problems_by_page(marked), spread_problems_by_page(marked)


# Every result of a finished search that is a page (not an index entry, which has a description) has its excerpt.
EXCERPTS_SHOWN_JS = """() => {
    const status = document.querySelector('#search-results .search-summary')?.textContent ?? '';
    const pages = [...document.querySelectorAll('#search-results li')].filter(item => !item.querySelector('span'));
    return /found \\d+ page/.test(status) && pages.every(item => item.querySelector('p.context'));
}"""


def test_search_in_the_book_opened_from_disk_shows_excerpts_and_logs_no_error(html: Path, browser) -> None:
    """Opened as files (file://), the search page may not fetch the pages it found: their text ships with it."""
    tab, errors = open_page(browser, html / "search.html", "q=prefill")
    tab.wait_for_function(EXCERPTS_SHOWN_JS)
    excerpts = tab.locator("#search-results p.context").all_inner_texts()
    screenshot(tab, "book-browser-search")
    tab.close()
    assert len(excerpts) >= 5, f"a search for 'prefill' showed {len(excerpts)} excerpts"
    assert all("prefill" in excerpt.lower() for excerpt in excerpts), excerpts
    assert not errors, f"the search page logged errors: {errors[:3]}"


PHONE = {"width": 390, "height": 844}


def test_no_page_is_wider_than_a_phone(html: Path, opened) -> None:
    """At 390 px nothing pushes a page sideways: inline code and addresses wrap, tables and code scroll inside.

    The module's last test: it leaves every tab at a phone's width, where the tests above read and clicked them at
    1280 px (resizing each back would lay every page out once more)."""
    wide = []
    for page in reader_pages(html):
        tab, _ = opened(page)
        tab.set_viewport_size(PHONE)
        width = tab.evaluate("() => document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            wide.append(f"{page.relative_to(html)}: {width} px")
    assert not wide, "pages wider than a 390 px phone:\n" + "\n".join(wide)
