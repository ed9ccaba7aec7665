"""What the browser tests share: where Debian's chromium is, how to drive it, where screenshots go.

Why: Playwright's own browser download is not reachable from CI (only the package registries
are), so the tests drive the system's chromium through Playwright for Python, and skip, saying
which piece is missing and how to install it, only when one of the two is absent.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A page that does what it should does it at once; these limits only stop a hang. They are minutes, not
# Playwright's 5 s (expect) and 30 s (actions), so that a busy machine (CI beside other jobs) moves no verdict.
WAIT_LIMIT_MS = 120_000


def chromium() -> str | None:
    """Debian's chromium, or None where it is not installed."""
    return shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def missing_browser() -> str | None:
    """Why no browser test can run here, or None when chromium and Playwright are both installed."""
    if chromium() is None:
        return "Debian's chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (pip install playwright; it is in labkit's dev extra)"
    return None


@pytest.fixture(scope="module", name="browser")
def chromium_browser() -> Iterator:
    """Debian's chromium, driven by Playwright with a fresh profile; closed whatever the tests do."""
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_LIMIT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS, timeout=WAIT_LIMIT_MS)
        try:
            yield launched
        finally:
            launched.close()


def new_tab(browser, **options):
    """A page whose waits and actions give up only after ``WAIT_LIMIT_MS`` (see there)."""
    tab = browser.new_page(**options)
    tab.set_default_timeout(WAIT_LIMIT_MS)
    return tab


def screenshot(page, name: str) -> None:
    """Keep what the browser shows as test-artifacts/NAME.png, for a person to look at after CI.

    The window only, where the test left it (a figure it moved, an answer it opened): a whole page, tens of
    thousands of pixels tall on a phone, took seconds to paint and encode each time, and no test reads it."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
