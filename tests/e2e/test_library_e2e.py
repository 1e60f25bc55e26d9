"""Browse the skill library in Chromium: open it from the navigation, filter, open a card, read its
preconditions and effect chart, download its SKILL.md, and follow a risk to the rejected attempt on
its lineage, at desktop and phone widths, with screenshots (KLINEAGE_SCREENSHOTS=1) under
test-artifacts/screenshots/ and nothing wider than the window."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from klineage.skills.skillmd import parse
from library_data import library_document, many_cards, real_cards, timed_lineage
from skills_app.card_import import import_library
from skills_app.importer import import_lineage

pytestmark = pytest.mark.e2e


@pytest.fixture
def site(live_server, transactional_db):
    """ORM work before the browser starts (Playwright's sync API runs an event loop)."""
    cards = real_cards()
    lineage, _ = import_lineage(timed_lineage().to_dict())
    import_library(library_document([c.to_dict() for c in cards] + many_cards(80)))
    risky = next(c for c in cards if c.risks and c.effects)
    return {"url": live_server.url, "lineage": lineage.id, "card": risky}


def test_filter_open_a_card_and_follow_a_risk(site, chromium):
    card = site["card"]
    for width, page in chromium.pages(accept_downloads=True):
        page.goto(site["url"] + "/")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Library").click()
        page.wait_for_url(re.compile(r"/library/$"))
        assert page.locator("h1").inner_text() == "Library corpus"  # the default library's name
        assert page.locator("#card-count").inner_text() == "84 of 84 cards"
        chromium.shoot(page, "library", width)

        page.select_option('select[name="surface"]', "loop")
        page.select_option('select[name="operator"]', "row_softmax")
        page.fill('input[name="q"]', "pragma unroll")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"surface=loop"))
        rows = page.locator("table.card-table tbody tr")
        assert rows.count() >= 2
        for text in rows.all_inner_texts():
            assert "unroll" in text
        chromium.shoot(page, "library-filtered", width)

        page.locator(f'a.card-link[href="/library/{card.short_id}/"]').click()
        page.wait_for_url(re.compile(f"/library/{card.short_id}/$"))
        assert card.intent in page.locator(".card-intent-lead").inner_text()
        checklist = page.locator(".checklist li")
        assert "Cols must be a multiple of 4" in checklist.first.inner_text()
        assert page.locator(".effect-chart svg rect.effect-bar").count() == len(card.effects)
        assert page.locator("table.diff tr.diff-add").count() >= 1
        chromium.shoot(page, "card", width)

        with page.expect_download() as download:
            page.get_by_role("link", name="Download SKILL.md").click()
        assert parse(Path(download.value.path()).read_text(encoding="utf-8")) == card

        page.locator("#risks ~ ul a.ref-link").first.click()
        page.wait_for_url(re.compile(f"/lineages/{site['lineage']}/#step-rejected-0$"))
        attempt = page.locator("#step-rejected-0")
        assert attempt.is_visible()
        assert "unroll" in attempt.locator("summary").inner_text()
        assert "incorrect" in attempt.locator("summary").inner_text()
        assert attempt.evaluate("element => element.open"), "the link opens the attempt it points at"
        top = page.evaluate("document.getElementById('step-rejected-0').getBoundingClientRect().top")
        assert -1 < top < 900  # scrolled to the attempt (its top may land a sub-pixel above the window)
        chromium.shoot(page, "card-risk-lineage", width)


@pytest.fixture
def two_libraries(live_server, transactional_db):
    cards = real_cards()
    import_library(library_document(cards))
    import_library(library_document(cards[:2], date="2026-12-01T12:00:00+00:00"), name="second")
    return {"url": live_server.url, "card": cards[0]}


def test_switch_libraries_and_reach_a_cards_copy_in_the_other(two_libraries, chromium):
    card = two_libraries["card"]
    for width, page in chromium.pages():
        page.goto(two_libraries["url"] + "/library/")
        switch = page.get_by_role("navigation", name="Skill libraries")
        assert "second 2 cards" in switch.inner_text()
        switch.get_by_role("link", name=re.compile("^second")).click()
        page.wait_for_url(re.compile(r"/libraries/second/$"))
        assert page.locator("h1").inner_text() == "Library second"
        assert page.locator("#card-count").inner_text() == "2 of 2 cards"
        page.locator(f'a.card-link[href="/libraries/second/{card.short_id}/"]').click()
        page.wait_for_url(re.compile(f"/libraries/second/{card.short_id}/$"))
        page.locator(".card-elsewhere a").click()  # its copy in the default library
        page.wait_for_url(re.compile(f"/library/{card.short_id}/$"))
        assert page.locator(".crumbs").inner_text().startswith("Library / corpus /")
        chromium.shoot(page, "card-other-library", width)
