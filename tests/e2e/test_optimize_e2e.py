"""Optimize in Chromium against the real thing: `manage.py serve` (the dashboard and its local gate
worker, as `make run` starts them) over a SQLite file holding an operator and cards induced from
the bundled dry lineage. The operator logs in, submits a compile-only optimization of
row_softmax/naive, watches the job page chart the run, reloads it mid-run (the chart comes back
from the job row), and sees the run end with the optimized kernel; screenshots (KLINEAGE_SCREENSHOTS=1) at
desktop and phone widths under test-artifacts/screenshots/."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from django.contrib.auth.models import Group, User

from gate_app.apps import OPERATOR_GROUP
from gate_app.childproc import kill_tree
from gate_app.models import Job
from klineage import config
from klineage.lineage import Lineage as EngineLineage
from klineage.skills import induce
from klineage.skills.library import Library
from services import REPO, free_port, sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from shared_cache import share
from skills_app.card_import import import_library

pytestmark = pytest.mark.e2e

PASSWORD = "operator-pw-2026"
# gate evaluations, by window width: apart, so each job's page names its own; the claim holds for any budget, and
# every evaluation of the first job is a real compile-only gate
BUDGETS = {1280: 3, 390: 2}
DRY_LINEAGE = config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.dry.json"


@pytest.fixture
def server(sqlite_job_database, tmp_path, shared_cache):
    """The operator and the library go in first (ORM work before the browser's event loop starts),
    then the server and its worker, on the same SQLite file. The worker's gates take their problem probes
    and compiles from the run's (tests/shared_cache.py): what is checked here is the pages, not the gate."""
    user = User.objects.create_user("olga", password=PASSWORD)
    user.groups.add(Group.objects.get(name=OPERATOR_GROUP))
    import_library(Library(tuple(induce([EngineLineage.load(DRY_LINEAGE)])), {"lineages": ["dry"]}).to_dict())
    port = free_port()
    cache = share(tmp_path / "data" / "cache", shared_cache)
    env = {**os.environ, "DATABASE_URL": sqlite_job_database.url, "KLINEAGE_DATA_DIR": str(tmp_path / "data"),
           "KLINEAGE_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=2)
            break
        except OSError as exc:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError((tmp_path / "serve.log").read_text()) from exc
            time.sleep(0.3)
    yield url
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        proc.wait()
    log.close()


def test_an_operator_optimizes_a_kernel_and_watches_it_finish(server, chromium):
    expect = pytest.importorskip("playwright.sync_api").expect
    jobs: list[int] = []
    for width, page in chromium.pages(BUDGETS):
        budget = BUDGETS[width]
        page.goto(server + "/accounts/login/?next=/optimize/")
        page.get_by_label("Username").fill("olga")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(re.compile(r"/optimize/$"))
        assert page.get_by_role("navigation", name="Main").get_by_role("link", name="Optimize").is_visible()

        form = page.locator('form:has(input[name="action"][value="optimize"])')
        form.get_by_label("Start kernel").select_option("row_softmax/naive")
        form.get_by_label("candidate", exact=True).check()
        form.get_by_label("Gate budget").fill(str(budget))
        form.locator('select[name="optimize-mode"]').select_option("compile")
        chromium.shoot(page, "optimize-form", width)
        form.get_by_role("button", name="Start the optimization").click()
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        jobs.append(int(page.url.rstrip("/").rsplit("/", 1)[1]))
        assert page.locator("h1").inner_text().endswith("optimize")

        # the chart fills in as candidates are gated; a reload draws the run so far again
        summary = page.locator('[data-chart="summary"]')
        expect(summary).to_contain_text(re.compile(r"[1-9]\d* candidates? tried"), timeout=120_000)
        if "succeeded" not in page.locator('[data-field="status"]').inner_text():
            page.reload()
            expect(summary).to_contain_text(re.compile(r"[1-9]\d* candidates? tried"))

        # it ends with the outcome, rendered once the job is done: compile-only, nothing is shown faster
        expect(page.get_by_role("heading", name="No faster kernel")).to_be_visible(timeout=180_000)
        assert "Nothing can be shown faster without a GPU" in page.locator("#optimized").inner_text()
        assert page.locator('[data-field="status"]').inner_text() == "succeeded"
        expect(summary).to_contain_text(f"of {budget} gate evaluations")
        assert "compile-only: nothing is timed" in page.locator('[data-chart="speedup"]').inner_text()
        outcomes = page.locator('[data-chart="outcomes"] svg')
        assert outcomes.get_attribute("aria-label") == "Candidates by outcome"
        assert "untimed" in outcomes.text_content()
        assert page.locator('[data-chart="recent"] tr').count() >= 1
        assert "No skill was applied" in page.locator("#optimized").inner_text()
        assert "row_softmax_naive" in page.locator("#optimized").inner_text()
        chromium.shoot(page, "optimize-job", width)
        chromium.shoot_element(page.locator("#optimize-run"), f"optimize-run-{width}")

    done = {job.pk: job for job in Job.objects.filter(pk__in=jobs)}
    assert [done[pk].status for pk in jobs] == ["succeeded", "succeeded"]
    assert all(done[pk].owner.username == "olga" and done[pk].result["gate"] == "compile" for pk in jobs)


def test_a_timed_run_is_drawn_as_a_best_speedup_line(live_server, transactional_db, chromium):
    """A GPU run's chart as its worker keeps it in the job row (no GPU here, so the row is written
    as the worker would): the page draws the best-so-far steps, one dot per gated candidate. Only the
    page is read, so the live server serves it: no `serve` and worker are started for it."""
    chart = {"budget": 10, "evaluations": 6, "tried": 7, "steps": 2, "speedup": 1.32, "timed": True,
             "points": [[2, 1.0, 1.5], [3, 1.18, 2.9], [4, 1.18, 4.0], [5, 1.32, 5.2], [6, 1.32, 6.4]],
             "outcomes": {"faster": 2, "not_faster": 2, "rejected": 1, "not_applicable": 2},
             "recent": [{"index": 6, "transform": "unroll", "card": "c38e5885c282", "status": "not_faster",
                         "ratio": 0.98, "message": "passed; 0.980x the best, short of 1.01"}]}
    job = Job.objects.create(kind="optimize", needs="gpu", status="running",
                             params={"kernel": "row_softmax/naive", "problem": "row_softmax", "mode": "gpu",
                                     "strategy": "library", "budget": 10},
                             progress={"fraction": 0.6, "stage": "attempt", "message": "#6 unroll", "chart": chart})
    url = live_server.url
    with chromium.launch() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/jobs/{job.pk}/")
        speedup = page.locator('[data-chart="speedup"] svg')
        assert speedup.get_attribute("aria-label") == "Best speedup by gate evaluation"
        assert speedup.locator("circle").count() == 5
        path = speedup.locator("path").get_attribute("d")
        assert path.startswith("M") and path.count("V") == 4 and path.count("H") == 5  # steps, then to the budget
        assert page.locator('[data-chart="summary"]').inner_text() == (
            "7 candidates tried · 6 of 10 gate evaluations · 2 taken · best speedup 1.320x")
        assert speedup.locator("circle title").first.text_content() == "gate evaluations 2: 1.00"
        assert page.locator('[data-chart="outcomes"] svg rect').count() == 4
        assert "0.980" in page.locator('[data-chart="recent"]').inner_text()
        chromium.shoot_element(page.locator("#optimize-run"), "optimize-run-timed-1280")
