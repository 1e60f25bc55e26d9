"""A walk job end to end: queued through gate_app.submit, run by a real `manage.py gate_worker`
subprocess whose child walks row_softmax/warp_vec4 with a compile-only gate (real nvcc), and the
lineage imported by the worker so the lineage pages show it."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import User

from gate_app import submit
from gate_app.models import Job
from services import sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from skills_app.models import Lineage, LineageStep
from test_gate_worker import WorkerProcess


def _finished(job_id: int, timeout_s: float) -> Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if job.finished:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished after {timeout_s}s:\n{Job.objects.get(pk=job_id).log}")


@pytest.fixture
def worker(sqlite_job_database, tmp_path):
    process = WorkerProcess(sqlite_job_database, tmp_path / "data", "--cpu-only", "--poll-interval", "0.1")
    yield process
    process.cleanup()


def test_walk_job_in_compile_mode_ends_with_its_lineage_in_the_database(worker, client):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/warp_vec4", mode="compile", max_steps=2, max_rejections=2)
    assert params["problem"] == "row_softmax"  # the kernel's own problem by default
    job = submit.submit(Job.Kind.WALK, params, owner=owner)
    assert job.needs == Job.Needs.CPU and job.owner == owner

    job = _finished(job.pk, timeout_s=240)
    assert job.status == Job.Status.SUCCEEDED, f"{job.error}\n{job.log}"
    result = job.result
    assert result["expert"] == "row_softmax_warp_vec4" and result["gate"] == "compile"
    assert result["assurance"] == "unverified_compile_only"
    assert result["termination"]["kind"] == "step_limit" and result["stats"]["accepted"] == 2
    assert result["imported"] == "created"

    lineage = Lineage.objects.get(id=result["lineage"])
    assert lineage.operator == "row_softmax" and lineage.accepted_count == 2
    assert LineageStep.objects.filter(lineage=lineage, kind=LineageStep.Kind.ACCEPTED).count() == 2
    # progress streamed from the child: the walker's step lines, in the log and the fraction
    assert "walk: step 0: accepted" in job.log and "walk: step 1: accepted" in job.log
    assert "import: storing the lineage" in job.log
    assert job.progress == {"fraction": 1.0, "stage": "done", "message": "succeeded"}

    # the lineage page and the job page both show it
    page = client.get(result["url"])
    assert page.status_code == 200 and b"row_softmax_warp_vec4" in page.content
    assert result["url"].encode() in client.get(f"/jobs/{job.pk}/").content


def test_a_replay_walk_without_recordings_fails_with_the_reason_and_stores_nothing(worker):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/naive", mode="replay", max_steps=1, max_rejections=1)
    job = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=120)
    assert job.status == Job.Status.FAILED and job.result is None
    assert job.error.startswith("ReplayMiss: ") and "no recorded verdict for the expert" in job.error
    assert job.attempts == 1  # an engine error is final: not retried
    assert not Lineage.objects.exists()


def test_the_same_walk_twice_imports_one_lineage(worker):
    owner = User.objects.create_user("ada")
    params = submit.walk_params("row_softmax/warp_vec4", mode="compile", max_steps=1, max_rejections=1)
    first = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=240)
    second = _finished(submit.submit(Job.Kind.WALK, params, owner=owner).pk, timeout_s=240)
    assert (first.result["imported"], second.result["imported"]) == ("created", "unchanged")
    assert first.result["lineage"] == second.result["lineage"]
    assert Lineage.objects.count() == 1
