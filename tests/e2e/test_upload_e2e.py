"""Upload in Chromium against `manage.py serve` (the dashboard and its local worker, as in
test_optimize_e2e): the operator uploads a kernel whose plan names a problem that does not exist
and is told so, uploads it right, follows it to its kernel page, presses "Optimize from here" and
runs a compile-only optimization of it to the end."""

from __future__ import annotations

import re

import pytest
from test_optimize_e2e import PASSWORD, server  # noqa: F401  (fixture)

from gate_app.models import Job
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from test_uploads import SOURCE, plan

pytestmark = pytest.mark.e2e


def _choose(page, source: bytes, launch: bytes) -> None:
    page.get_by_label("Kernel source (.cu)").set_input_files(
        {"name": "kernel.cu", "mimeType": "text/plain", "buffer": source})
    page.get_by_label("Launch plan (launch.toml)").set_input_files(
        {"name": "launch.toml", "mimeType": "text/plain", "buffer": launch})


def test_an_operator_uploads_a_kernel_and_optimizes_from_it(server, chromium):  # noqa: F811
    expect = pytest.importorskip("playwright.sync_api").expect
    for width, page in chromium.pages((1280,)):
        page.goto(server + "/accounts/login/?next=/upload/")
        page.get_by_label("Username").fill("olga")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(r"/upload/$"))
        assert page.get_by_role("navigation", name="Main").get_by_role("link", name="Upload").is_visible()

        _choose(page, SOURCE, plan("e2e_softmax", problem="softmax"))
        page.get_by_role("button", name="Upload", exact=True).click()
        refusal = page.locator('[data-errors="upload"]')
        expect(refusal).to_contain_text("names problem 'softmax', which is neither a bundled problem")
        assert "None yet." in page.locator("#kernels-heading + p").inner_text()

        _choose(page, SOURCE, plan("e2e_softmax"))
        page.get_by_role("button", name="Upload", exact=True).click()
        expect(page.locator("[data-messages]")).to_contain_text(
            "Kernel uploaded/e2e_softmax passed the static check and is stored.")
        chromium.shoot(page, "upload", width)

        page.get_by_role("link", name="uploaded/e2e_softmax").click()
        page.wait_for_url(re.compile(r"/kernels/uploaded/e2e_softmax/$"))
        assert "uploaded" in page.locator(".facts").first.inner_text()
        page.get_by_role("link", name="Optimize from here").click()
        page.wait_for_url(re.compile(r"/optimize/\?kernel=uploaded/e2e_softmax#optimize-heading$"))

        form = page.locator('form:has(input[name="action"][value="optimize"])')
        expect(form.get_by_label("Start kernel")).to_have_value("uploaded/e2e_softmax")
        form.get_by_label("candidate", exact=True).check()
        form.get_by_label("Gate budget").fill("2")
        form.locator('select[name="optimize-mode"]').select_option("compile")
        form.get_by_role("button", name="Start the optimization").click()
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        assert "uploaded/e2e_softmax on row_softmax" in page.locator("#job").inner_text()
        expect(page.get_by_role("heading", name="No faster kernel")).to_be_visible(timeout=240_000)
        assert page.locator('[data-field="status"]').inner_text() == "succeeded"
        assert "e2e_softmax" in page.locator("#optimized").inner_text()
        chromium.shoot(page, "upload-optimize-job", width)
    job = Job.objects.get(kind="optimize")
    assert job.params["kernel"] == "uploaded/e2e_softmax" and job.result["gate"] == "compile"
