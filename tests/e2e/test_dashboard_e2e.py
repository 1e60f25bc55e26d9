"""The dashboard read at a glance in Chromium: the largest lineage's overview (chart drawn, filters
and orders working, a diff fetched when opened, the first screen small), card badges that agree with
their measurements, and the dead ends (404, 403 naming the role, Log in keeping the page), at desktop
and phone widths with screenshots (KLINEAGE_SCREENSHOTS=1) under test-artifacts/screenshots/."""

from __future__ import annotations

import gzip
import re

import pytest
from django.contrib.auth.models import Group

from accounts import make_user
from dashboard_data import corpus_rows
from skills_app.card_import import import_library_files
from skills_app.models import Lineage

pytestmark = pytest.mark.e2e

FIRST_SCREEN_LIMIT = 150_000


@pytest.fixture
def site(live_server, transactional_db):
    """ORM work before the browser starts (Playwright's sync API runs an event loop)."""
    corpus_rows()  # this worker's snapshot of an import, once one was made
    import_library_files()
    make_user("bob")
    make_user("grace").groups.add(Group.objects.get(name="reviewer"))
    gdn = Lineage.objects.get(source_path="bench/walks/gdn_chunked_mma.gpu.json.gz")
    return {"url": live_server.url, "gdn": gdn.id, "gdn_steps": gdn.accepted_count + gdn.rejected_count}


def test_the_largest_lineage_overview(site, chromium):
    for width, page in chromium.pages():
        response = page.goto(f"{site['url']}/lineages/{site['gdn'][:12]}/")  # the short id shown on pages
        assert page.url.endswith(f"/lineages/{site['gdn']}/")
        html = response.body()
        assert len(gzip.compress(html)) < FIRST_SCREEN_LIMIT and b'<tr class="diff-' not in html
        chart = page.locator("figure.speedup-chart svg")
        assert chart.is_visible() and chart.locator("circle").count() == 65
        assert "estimates the end-to-end speedup" in page.locator("figure.speedup-chart figcaption").inner_text()
        rows = page.locator("#step-table tbody tr")
        assert rows.count() == site["gdn_steps"]
        assert page.locator("#step-count").inner_text() == f"{site['gdn_steps']} steps shown"
        chromium.shoot(page, "lineage-overview", width)

        page.locator('#step-filters input[name="rejected"]').uncheck()
        assert page.locator("#step-count").inner_text() == "64 steps shown"
        page.fill('#step-filters input[name="change"]', "5")
        shown = int(page.locator("#step-count").inner_text().split()[0])
        assert 0 < shown < 64
        for text in page.locator("#step-table tbody tr:not([hidden]) td.num.mono").all_inner_texts():
            ratio = float(re.match(r"([0-9.]+)x", text).group(1))
            assert abs(ratio - 1) * 100 > 5
        assert page.locator(".timeline .branches:visible").count() == 0
        chromium.shoot_element(page.locator("#step-filters"), f"lineage-filters-{width}")

        step = page.locator("#step-accepted-0")
        step.locator("details.diff-details summary").click()
        step.locator("table.diff tr.diff-add").first.wait_for()  # fetched when opened
        assert "without the step" in step.locator("table.diff").inner_text()
        chromium.shoot(page, "lineage-overview-filtered", width)

        page.locator(".order-links a", has_text="naive → expert").click()
        page.wait_for_url(re.compile(r"order=forward"))
        assert page.locator(".timeline > li").first.get_attribute("class") == "tl-state tl-naive"
        assert page.locator("#step-table tbody tr").first.get_attribute("data-kind") in ("accepted", "rejected")
        page.locator('#step-table a[href$="#step-accepted-0"]').click()  # on another part of the timeline
        page.wait_for_url(re.compile(r"part=3#step-accepted-0$"))
        assert page.locator("#step-accepted-0").is_visible()


def test_card_badges_agree_with_their_measurements(site, chromium):
    for width, page in chromium.pages():
        page.goto(site["url"] + "/library/")
        row = page.locator(".card-table tr", has=page.locator('a[href="/library/535855ae6206/"]'))
        assert row.locator(".badge").inner_text() == "admitted · slower on 1 of 1 case, 2 of 3 trials slower"
        assert row.locator(".card-link").inner_text() == "pipeline copies through shared-memory stages"
        chromium.shoot(page, "library-words", width)
        row.locator(".card-link").click()
        page.wait_for_url(re.compile(r"/library/535855ae6206/$"))
        assert "Slower on conv2d/headline (0.770x)" in page.locator(".standing-sentence").inner_text()
        chromium.shoot(page, "card-words", width)


def test_dead_ends_lead_somewhere(site, chromium):
    for width, page in chromium.pages():
        response = page.goto(site["url"] + "/lineages/ffffffffffff/")
        assert response.status == 404 and page.locator("h1").inner_text() == "Nothing here"
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Library").click()
        page.wait_for_url(re.compile(r"/library/$"))
        chromium.shoot(page, "library-after-404", width)

        page.goto(site["url"] + "/optimize/")
        page.wait_for_url(re.compile(r"/accounts/login/\?next=/optimize/$"))
        page.fill('input[name="username"]', "bob")
        page.fill('input[name="password"]', "pw-bob-1")
        page.locator("main form button[type=submit]").click()
        page.wait_for_load_state()
        assert "This needs the operator role" in page.locator(".error-page").inner_text()
        chromium.shoot(page, "forbidden", width)
        page.locator("form[action='/accounts/logout/'] button").click()

        page.goto(site["url"] + "/library/?status=admitted")
        page.locator(".account a", has_text="Log in").click()
        page.fill('input[name="username"]', "bob")
        page.fill('input[name="password"]', "pw-bob-1")
        page.locator("main form button[type=submit]").click()
        page.wait_for_url(re.compile(r"/library/\?status=admitted$"))
        page.locator("form[action='/accounts/logout/'] button").click()


def test_compare_leaderboard_and_a_review_with_the_diff_inline(site, chromium):
    for width, page in chromium.pages():
        page.goto(site["url"] + "/problems/row_softmax/")
        page.get_by_role("link", name="Leaderboard").click()
        page.wait_for_url(re.compile(r"/problems/row_softmax/leaderboard/$"))
        first = page.locator("table.leaderboard").first.locator("tbody tr")
        assert first.count() > 3 and "µs" in first.first.inner_text()
        chromium.shoot(page, "leaderboard", width)
        # a kernel only recorded verdicts know (a roundtrip's composite) has no stored source to compare
        unstored = [row for row in first.all()[1:] if row.get_by_role("link", name="compare with #1").count() == 0]
        assert unstored and all(row.locator(".no-compare").count() == 1 for row in unstored)
        first.get_by_role("link", name="compare with #1").first.click()
        page.wait_for_url(re.compile(r"/compare/\?a=[0-9a-f]{64}&b=[0-9a-f]{64}$"))
        assert page.locator("#sass-compare tbody tr").count() > 1
        chromium.shoot(page, "compare", width)

        page.goto(site["url"] + "/accounts/login/?next=/review/")
        page.fill('input[name="username"]', "grace")
        page.fill('input[name="password"]', "pw-grace-1")
        page.locator("main form button[type=submit]").click()
        page.wait_for_url(re.compile(r"/review/$"))
        item = page.locator(".review-item").first
        item.locator("table.diff tr.diff-add").first.wait_for()  # the forward diff, fetched inline
        assert "child/parent time" in item.inner_text()
        chromium.shoot(page, "review-queue", width)
        item.get_by_role("button", name="Confirm").click()
        page.wait_for_url(re.compile(r"/review/$"))
        assert page.locator(".messages li").count() == 1  # once, not twice
        assert "Recorded: confirm" in page.locator(".messages").inner_text()
        page.locator("form[action='/accounts/logout/'] button").click()
