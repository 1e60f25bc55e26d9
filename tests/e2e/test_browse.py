"""Browse the dashboard in Chromium: home -> kernels -> a kernel -> its verdict, at desktop and
phone widths, saving screenshots (KLINEAGE_SCREENSHOTS=1) under test-artifacts/screenshots/ and checking
nothing overflows."""

from __future__ import annotations

import re

import pytest

from dashboard_data import corpus_rows
from skills_app.models import Kernel, Verdict

pytestmark = pytest.mark.e2e


@pytest.fixture
def site(live_server, transactional_db):
    """The live server with the corpus imported; ORM work happens here, before the browser starts
    (Playwright's sync API runs an event loop, inside which Django refuses synchronous queries)."""
    corpus_rows()  # this worker's snapshot of an import, once one was made
    kernel = Kernel.objects.get(name="row_softmax/warp_vec4")
    problem_kernels = set(Kernel.objects.filter(operator="gemm").values_list("name", flat=True))
    verdicts = {v.key for v in Verdict.objects.filter(state=kernel.current_state)}
    memcheck = Verdict.objects.get(reason="memcheck").key
    return {"url": live_server.url, "kernel": kernel.name, "verdicts": verdicts, "gemm": problem_kernels,
            "memcheck": memcheck, "suite": Kernel.objects.filter(adversarial=True).count()}


def test_browse_home_kernels_kernel_verdict(site, chromium):
    for width, page in chromium.pages():
        page.goto(site["url"] + "/")
        assert page.locator('[data-stat="suite"]').inner_text() == f"{site['suite']}/{site['suite']}"
        assert page.get_by_role("heading", name="Latest evidence").is_visible()
        chromium.shoot(page, "home", width)

        page.get_by_role("navigation", name="Main").get_by_role("link", name="Kernels").click()
        page.wait_for_url(re.compile(r"/kernels/$"))
        assert page.locator("h1").inner_text() == "Kernels"
        chromium.shoot(page, "kernels", width)

        page.select_option('select[name="problem"]', "gemm")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(re.compile(r"problem=gemm"))
        links = page.locator("table.kernel-table tbody tr td:first-child a").all_inner_texts()
        assert set(links) == site["gemm"]
        page.get_by_role("link", name="Clear").click()

        page.get_by_role("link", name=site["kernel"], exact=True).click()
        page.wait_for_url(re.compile(re.escape(site["kernel"]) + "/$"))
        assert page.locator("h1").inner_text() == site["kernel"]
        assert page.locator("pre.code .tok-cuda", has_text="__global__").count() >= 1
        assert page.locator(".bar-svg").count() >= 2
        chromium.shoot(page, "kernel", width)

        page.locator(".verdict-card .verdict-head a.mono").first.click()
        page.wait_for_url(re.compile(r"/verdicts/[0-9a-f]{64}/$"))
        assert page.url.rstrip("/").rsplit("/", 1)[-1] in site["verdicts"]
        # the newest verdict first: recorded on the GPU that ran it (the corpus's are on an H200 or an H100)
        assert re.search(r"recorded on NVIDIA H[12]00[\w ]*, commit", page.locator(".provenance-label").inner_text())
        assert page.get_by_role("heading", name="Stages").is_visible()
        chromium.shoot(page, "verdict", width)

        page.goto(f"{site['url']}/verdicts/{site['memcheck']}/")
        assert "Invalid __global__ read" in page.locator("#findings pre.excerpt").first.inner_text()
        chromium.shoot(page, "verdict-rejected", width)

        page.goto(site["url"] + "/problems/row_softmax/")
        assert page.locator("#cases tbody tr").count() >= 4
        chromium.shoot(page, "problem", width)
