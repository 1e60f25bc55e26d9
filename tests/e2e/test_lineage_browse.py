"""Browse a lineage in Chromium: the list, the timeline, a step's diff, a rejected attempt, and a
reviewer disputing a step, at desktop and phone widths, with screenshots (KLINEAGE_SCREENSHOTS=1) under
test-artifacts/screenshots/ and nothing wider than the window."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

from dashboard_data import corpus_rows
from lineage_data import with_rejections
from skills_app.importer import import_lineage
from skills_app.models import Lineage, Review

pytestmark = pytest.mark.e2e

PASSWORD = "reviewer-pw-2026"


@pytest.fixture
def site(live_server, transactional_db):
    """ORM work before the browser starts (Playwright's sync API runs an event loop)."""
    corpus_rows()  # this worker's snapshot of an import, once one was made
    dry = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")
    branched, _ = import_lineage(with_rejections())
    user = User.objects.create_user("grace", password=PASSWORD)
    user.groups.add(Group.objects.get(name="reviewer"))
    return {"url": live_server.url, "dry": dry.id, "branched": branched.id, "expert": dry.expert_name}


def test_browse_lineage_and_review_a_step(site, chromium):
    for width, page in chromium.pages():
        page.goto(site["url"] + "/")
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Lineages").click()
        page.wait_for_url(re.compile(r"/lineages/$"))
        assert page.locator("h1").inner_text() == "Lineages"
        chromium.shoot(page, "lineages", width)

        page.locator(f'a[href="/lineages/{site["dry"]}/"]').click()
        page.wait_for_url(re.compile(site["dry"] + "/$"))
        assert "Dry walk · unverified." in page.locator(".banner-dry").inner_text()
        step = page.locator("#step-accepted-0")
        assert "launch_bounds" in step.locator("h3").inner_text()
        assert step.locator("table.diff").count() == 0  # diffs load when opened
        step.locator("details.diff-details summary").click()
        added = step.locator("table.diff tr.diff-add").first  # forward: the bound the walk removed comes back
        assert "__launch_bounds__" in added.inner_text()
        assert "adds source" in added.locator(".diff-note").inner_text()
        assert step.locator("table.diff tr.diff-del").count() >= 1
        chromium.shoot(page, "lineage", width)
        chromium.shoot_element(step, f"lineage-step-{width}")

        page.goto(f"{site['url']}/lineages/{site['branched']}/")
        attempt = page.locator("#step-rejected-0")
        assert not attempt.locator("pre.excerpt").is_visible()
        attempt.locator("summary").click()
        assert "is undefined" in attempt.locator("pre.excerpt").inner_text()
        assert "compile_error" in attempt.inner_text()
        chromium.shoot(page, "lineage-rejected", width)
        chromium.shoot_element(page.locator("#step-accepted-1"), f"lineage-branch-{width}")

        page.goto(site["url"] + "/review/")
        page.locator(".notice a", has_text="Log in").click()
        page.fill('input[name="username"]', "grace")
        page.fill('input[name="password"]', PASSWORD)
        page.locator("main form button[type=submit]").click()
        page.wait_for_url(re.compile(r"/review/$"))
        item = page.locator(".review-item").first
        item.locator('input[name="comment"]').fill(f"checked at {width} px: rounding may differ")
        item.get_by_role("button", name="Dispute").click()
        page.wait_for_url(re.compile(r"/review/$"))
        assert "Recorded: dispute" in page.locator(".messages").inner_text()
        chromium.shoot(page, "review", width)

        page.locator("#recent-reviews a").first.click()  # the review just made
        page.wait_for_url(re.compile(r"/lineages/[0-9a-f]{64}/#step-"))
        anchor = page.url.rsplit("#", 1)[1]
        disputed = page.locator(f"#{anchor}")
        assert f"checked at {width} px" in disputed.text_content()  # a rejected attempt stays collapsed
        assert disputed.locator(".badge-disputed").count() >= 1
        chromium.shoot(page, "lineage-disputed", width)
        chromium.shoot_element(disputed, f"lineage-disputed-step-{width}")

    assert Review.objects.filter(verdict="dispute").count() == 2
