"""Uploads end to end with a real `manage.py gate_worker` subprocess: an uploaded copy of the bundled
row_softmax problem probed in the sandboxed runner (its cases and outputs recorded on its row), a
problem whose file fails to load refused with the reason, a compile-mode gate job of an uploaded
kernel on the uploaded problem (both resolved from the data dir in the job's child), and a running
job cancelled from its page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts import logged_in, make_user
from gate_app import queue, submit
from gate_app.models import Job
from klineage import config
from klineage.gate.execute import probe_problem
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from shared_cache import PROBES, share
from skills_app.models import Problem
from test_gate_worker import WorkerProcess, _finished, _wait_job
from test_uploads import PROBLEM, SOURCE, files, plan


@pytest.fixture
def worker(sqlite_job_database, tmp_path, monkeypatch, sleep_kind):
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(tmp_path / "data"))  # the web side and the worker share it
    process = WorkerProcess(sqlite_job_database, tmp_path / "data", "--cpu-only", "--poll-interval", "0.1")
    yield process
    process.cleanup()


@pytest.fixture
def operator() -> Client:
    return logged_in(make_user("olga", operator=True))


def test_an_uploaded_problem_is_probed_by_a_real_worker(worker, operator, shared_cache, tmp_path):
    assert operator.post("/upload/", files(PROBLEM)).status_code == 302
    job = _finished(Job.objects.get(kind="probe").pk, timeout_s=180)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    # what the bundled problem probes to: the run's probe of it (tests/shared_cache.py)
    probes = share(tmp_path / "probes", shared_cache, PROBES)
    bundled = probe_problem(config.corpus_dir() / "problems" / "row_softmax.py", probes).info
    problem = Problem.objects.get(upload_name="uploaded/softmax_copy")
    assert (problem.probe, problem.operator, problem.probe_error, problem.numerics) == ("sound", "row_softmax", "", [])
    assert [c["name"] for c in problem.cases] == [c.name for c in bundled.cases]
    assert problem.info["outputs"] == [o.to_dict() for o in bundled.outputs]
    assert problem.info["path"] == problem.path and problem.fingerprint == bundled.fingerprint
    assert job.result == {"problem": "uploaded/softmax_copy", "probe": "sound", "operator": "row_softmax",
                          "cases": [c.name for c in bundled.cases], "refused": ""}
    page = operator.get("/upload/").content.decode()
    assert "probed: sound" in page and f'href="/jobs/{job.pk}/">job #{job.pk}</a>' in page


def test_a_problem_that_fails_to_load_is_refused_with_the_reason(worker, operator):
    broken = b"import os\nOPERATOR = 'broken'\nraise RuntimeError('no GPU kernels for you')\n"
    operator.post("/upload/", files(broken, problem_name="broken.py"))
    job = _finished(Job.objects.get(kind="probe").pk, timeout_s=120)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    problem = Problem.objects.get()
    assert problem.probe == "refused" and problem.info == {}
    assert problem.probe_error == ("uploaded/broken: raised RuntimeError while loading: no GPU kernels for you")
    assert job.result["refused"] == problem.probe_error
    with pytest.raises(queue.QueueError, match="refused by its probe"):
        submit.gate_params("uploaded/broken", "row_softmax/naive", mode="compile")


def test_a_compile_mode_gate_job_of_an_uploaded_kernel(worker, operator):
    operator.post("/upload/", files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    gate = submit.enqueue_gate("uploaded/softmax_copy", "uploaded/my_softmax", mode="compile")
    job = _finished(gate.pk, timeout_s=180)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    assert job.result["status"] == "compiled" and job.result["compile"]["status"] == "ok"
    assert job.result["kernel"]["name"] == "my_softmax"
    assert job.result["problem"]["fingerprint"] == Problem.objects.get().fingerprint
    assert "compile: nvcc" in job.log


def test_a_running_job_is_cancelled_from_its_page(worker, operator):
    owner = User.objects.get(username="olga")
    job = queue.enqueue("sleep", {"seconds": 60, "steps": 60}, owner=owner)
    _wait_job(job.pk, lambda j: j.status == Job.Status.RUNNING and "child process" in j.log, 30, "running")
    page = operator.post(f"/jobs/{job.pk}/cancel", follow=True).content.decode()
    assert f"Cancel requested: job {job.pk}&#x27;s worker is stopping it" in page
    job = _finished(job.pk, timeout_s=30)
    assert job.status == Job.Status.CANCELLED
