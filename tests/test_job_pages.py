"""Job pages that end where they should: a finished job shows no progress bar or attempt count, a gate
job links its verdict, a walk job shows its steps as a table, each kind's own parts come from the page its
registry entry names (a new kind adds its parts without editing gate_app/job.html), the jobs list names each
job's target, an operator can run a job again, and the walk form's default step limit walks
row_softmax/warp_vec4."""

from __future__ import annotations

import re

import pytest

from accounts import logged_in, make_user
from gate_app.forms import WalkForm
from gate_app.kinds import MODULE_ENV
from gate_app.models import Job
from lineage_data import vendor_verdict
from skills_app.importer import store_verdict

pytestmark = pytest.mark.django_db

GATE_PARAMS = {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "compile"}


def test_a_failed_job_shows_no_progress_and_no_attempt_count(client):
    failed = Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS, status=Job.Status.FAILED, attempts=1,
                                max_attempts=3, error="nvcc failed")
    page = client.get(f"/jobs/{failed.pk}/").content.decode()
    assert "attempt <span" not in page and "failed after 1 attempt" in page
    assert '<p data-running hidden>' in page and "nvcc failed" in page
    queued = Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS)
    page = client.get(f"/jobs/{queued.pk}/").content.decode()
    assert 'attempt <span data-field="attempts">0</span> of 3' in page and '<p data-running>' in page


def test_a_finished_gate_job_links_its_verdict(client):
    key, document = vendor_verdict("a" * 64, "row_softmax_naive", 1.0, [1.0, 1.0, 1.0])
    store_verdict(key, document)
    result = {**document, "provenance": {**document["provenance"], "key": key}}
    job = Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS, status=Job.Status.SUCCEEDED, result=result)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f'<a href="/verdicts/{key}/" class="mono">verdict {key[:12]}</a>' in page
    assert "Target: <strong class=\"mono\">row_softmax/naive</strong> on <span class=\"mono\">row_softmax</span>" \
        in page
    unknown = {**result, "provenance": {**result["provenance"], "key": "b" * 64}}
    job = Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS, status=Job.Status.SUCCEEDED, result=unknown)
    assert "not among the dashboard's stored verdicts" in client.get(f"/jobs/{job.pk}/").content.decode()


PROBE_NOTE = "the uploaded problem up_prob, loaded in the sandboxed runner"
RESULT_OPEN = re.compile(r"<details open>\s*<summary>Result document</summary>")


@pytest.mark.usefixtures("sleep_kind")  # tests/job_kinds.py: a kind with no page of its own
@pytest.mark.parametrize("kind, params, parts", [
    ("gate", GATE_PARAMS, {"result open"}),
    ("walk", {**GATE_PARAMS, "max_steps": 2}, set()),
    ("optimize", {**GATE_PARAMS, "budget": 8}, {"run"}),
    ("probe", {"problem": "up_prob"}, {"note"}),
    ("sleep", {"seconds": 1}, set()),
])
def test_each_kind_s_page_shows_its_own_parts_only(client, kind, params, parts):
    page = client.get(f"/jobs/{Job.objects.create(kind=kind, params=params).pk}/").content.decode()
    shown = {"note": PROBE_NOTE in page, "run": 'id="optimize-run"' in page,
             "result open": bool(RESULT_OPEN.search(page))}
    assert {part for part, there in shown.items() if there} == parts
    assert "<summary>Result document</summary>" in page and "<summary>Log</summary>" in page


def test_a_new_kind_fills_the_job_page_from_its_own_page(client, monkeypatch, tmp_path, settings):
    """A kind's page extends gate_app/job.html and fills its kind_ blocks, so a new kind adds its parts
    (a note under the status, its sections, the result document open) with no edit to the job page."""
    (tmp_path / "nap_kind.py").write_text(
        "from gate_app.kinds import Device, JobKind\n"
        "KINDS = (JobKind('nap', 'nap', Device.CPU, handler='m:h', runner='m:r', page='nap_job.html'),)\n")
    (tmp_path / "nap_job.html").write_text(
        '{% extends "gate_app/job.html" %}'
        '{% block kind_note %}<p id="nap-note">a nap of {{ job.params.minutes }} min</p>{% endblock %}'
        '{% block kind_sections %}<section id="nap-dreams">no dreams yet</section>{% endblock %}'
        '{% block kind_result_open %} open{% endblock %}')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(MODULE_ENV, "nap_kind")
    engine = settings.TEMPLATES[0]
    settings.TEMPLATES = [{**engine, "DIRS": [*engine["DIRS"], tmp_path]}]
    page = client.get(f"/jobs/{Job.objects.create(kind='nap', params={'minutes': 5}).pk}/").content.decode()
    assert '<span class="muted">nap</span>' in page and "Status: <strong data-field=\"status\">queued" in page
    note, dreams, log = (page.index(s) for s in ('<p id="nap-note">a nap of 5 min</p>',
                                                  '<section id="nap-dreams">', "<summary>Log</summary>"))
    assert page.index('data-field="status"') < note < page.index('data-field="transport"') < dreams < log
    assert RESULT_OPEN.search(page)


def test_the_jobs_list_names_each_target(client):
    Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS)
    page = client.get("/jobs/").content.decode()
    assert '<th scope="col">Target</th>' in page
    assert '<span class="mono wrap-anywhere">row_softmax/naive</span> <span class="muted">· compile</span>' in page


def test_an_operator_runs_a_job_again_with_its_parameters():
    owner = make_user("ada", operator=True)
    done = Job.objects.create(kind=Job.Kind.GATE, params=GATE_PARAMS, status=Job.Status.FAILED, owner=owner)
    client = logged_in(owner)
    assert f'action="/jobs/{done.pk}/again"' in client.get(f"/jobs/{done.pk}/").content.decode()
    response = client.post(f"/jobs/{done.pk}/again")
    again = Job.objects.exclude(pk=done.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{again.pk}/"
    assert again.params == GATE_PARAMS and again.owner == owner and again.status == Job.Status.QUEUED
    plain = logged_in(make_user("bob"))
    assert "Run again" not in plain.get(f"/jobs/{done.pk}/").content.decode()
    assert plain.post(f"/jobs/{done.pk}/again").status_code == 403


def test_the_walk_form_defaults_to_enough_steps_for_row_softmax():
    assert WalkForm.base_fields["max_steps"].initial >= 23


def test_a_refused_form_says_so_at_the_top_of_the_page():
    client = logged_in(make_user("ada", operator=True))
    response = client.post("/optimize/", {"action": "walk", "walk-kernel": "row_softmax/warp_vec4",
                                          "walk-mode": "compile", "walk-max_steps": "999",
                                          "walk-max_rejections": "4"})
    page = response.content.decode()
    assert response.status_code == 400
    top = page[page.index('id="refused-walk"'):page.index('id="optimize-heading"')]
    assert "Nothing was started" in top and "Most steps: Ensure this value is less than or equal to 64." in top
    assert 'href="#walk-heading"' in top
