"""End-to-end tests drive Debian's Chromium through Playwright against pytest-django's live server;
the `chromium` fixture launches it, opens a page at each window width, checks that nothing is wider than
the window and, with KLINEAGE_SCREENSHOTS=1, takes the screenshots."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# Screenshots are for a person to look at (no assertion reads them) and PNGs of whole long pages were about a
# third of these tests' time, so they are taken on request: KLINEAGE_SCREENSHOTS=1 pytest tests/e2e
SCREENSHOTS_ENV = "KLINEAGE_SCREENSHOTS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


class Chromium:
    """Chromium for one test, started when the test opens it: after the test's ORM work, since
    Playwright's sync API runs an event loop, inside which Django refuses synchronous queries.
    Screenshots, when asked for (SCREENSHOTS_ENV), go under test-artifacts/screenshots/."""

    screenshots = Path(settings.BASE_DIR) / "test-artifacts" / "screenshots"
    taking = os.environ.get(SCREENSHOTS_ENV) == "1"

    @contextlib.contextmanager
    def launch(self):
        sync_api = pytest.importorskip("playwright.sync_api")
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()

    def pages(self, widths: Iterable[int] = (1280, 390), **options) -> Iterator[tuple[int, Any]]:
        """A fresh page for each window width, as (width, page); once the test is done with a page, it
        must have had no script error and no failed request."""
        with self.launch() as browser:
            for width in widths:
                context = browser.new_context(viewport={"width": width, "height": 900}, **options)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # A request the browser cancels because the page navigated on (net::ERR_ABORTED, e.g. a
                # favicon still loading when a test clicks a link) is not a failure of the site.
                page.on("requestfailed", lambda request: None if "ERR_ABORTED" in (request.failure or "")
                        else errors.append(f"failed: {request.url} ({request.failure})"))
                yield width, page
                assert errors == [], errors
                context.close()

    def shoot(self, page, name: str, width: int) -> None:
        """The page must be no wider than the window; a full-page screenshot of it when they are taken."""
        if self.taking:
            self.screenshots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(self.screenshots / f"{name}-{width}.png"), full_page=True)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        if overflow > 0:
            # the culprits: elements and runs of text past the window's edge, not clipped by a box
            # inside it that scrolls or hides them (a long unbroken word has no element of its own)
            wide = page.evaluate("""() => {
              const w = document.documentElement.clientWidth + 1;
              const clipped = n => { for (let p = n.parentElement; p; p = p.parentElement)
                if (getComputedStyle(p).overflowX !== 'visible' && p.getBoundingClientRect().right <= w) return true;
                return false; };
              const text = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
              const found = [];
              for (let n = text.nextNode(); n && found.length < 8; n = text.nextNode()) {
                const range = document.createRange(); range.selectNodeContents(n);
                if (range.getBoundingClientRect().right > w && !clipped(n))
                  found.push(n.parentElement.tagName + '.' + n.parentElement.className + ' "' + n.textContent.trim().slice(0, 60) + '"');
              }
              for (const e of document.querySelectorAll('body *'))
                if (found.length < 8 && e.getBoundingClientRect().right > w && !clipped(e))
                  found.push(e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right));
              return found; }""")  # noqa: E501  (JavaScript run in the page, kept as written)
            raise AssertionError(f"{name} at {width} px is {overflow} px wider than the window: {wide}")

    def shoot_element(self, locator, name: str) -> None:
        """A screenshot of one element when they are taken; either way the element must be there and visible
        (what taking its screenshot waits for)."""
        if self.taking:
            self.screenshots.mkdir(parents=True, exist_ok=True)
            locator.screenshot(path=str(self.screenshots / f"{name}.png"))
        else:
            locator.wait_for(state="visible")


@pytest.fixture
def chromium() -> Chromium:
    return Chromium()

