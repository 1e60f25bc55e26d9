"""End-to-end tests drive Debian's Chromium through Playwright against pytest-django's live server."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=f"needs Chromium at {CHROMIUM}: apt-get install chromium")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)
