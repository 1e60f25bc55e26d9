"""The per-user quota of GPU jobs queued or running (KLINEAGE_GPU_JOB_QUOTA), enforced in the
database: on the page, through the API, and under concurrent submissions from many threads on
SQLite and PostgreSQL, where exactly the quota's worth get through."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client

from gate_app import queue, submit
from gate_app.apps import OPERATOR_GROUP
from gate_app.models import Job
from services import job_database, postgres_server, postgres_template, sqlite_template  # noqa: F401  (fixtures)

WALK = {"action": "walk", "walk-kernel": "row_softmax/warp_vec4", "walk-problem": "", "walk-rewriter": "rules",
        "walk-mode": "gpu", "walk-max_steps": "3", "walk-max_rejections": "2"}


def _operator(name: str) -> User:
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get(name=OPERATOR_GROUP))
    return user


def _gpu_walk() -> dict:
    return submit.walk_params("row_softmax/warp_vec4", mode="gpu", max_steps=2, max_rejections=1)


@pytest.mark.django_db
def test_the_page_refuses_past_the_quota_and_says_why(settings):
    settings.KLINEAGE_GPU_JOB_QUOTA = 2
    operator = _operator("olga")
    client = Client()
    client.force_login(operator)
    assert [client.post("/optimize/", WALK).status_code for _ in range(2)] == [302, 302]
    refused = client.post("/optimize/", WALK)
    assert refused.status_code == 400
    assert "you have 2 GPU job(s) queued or running and the quota is 2" in refused.content.decode()
    assert Job.objects.filter(owner=operator).count() == 2
    # work that needs no GPU is not counted
    assert client.post("/optimize/", {**WALK, "walk-mode": "compile"}).status_code == 302
    assert client.post("/optimize/", {**WALK, "walk-mode": "replay"}).status_code == 302
    # another operator has a quota of their own
    other = Client()
    other.force_login(_operator("otto"))
    assert other.post("/optimize/", WALK).status_code == 302
    # a finished or cancelled job frees its place
    queue.cancel(Job.objects.filter(owner=operator, needs="gpu").first())
    assert client.post("/optimize/", WALK).status_code == 302
    assert client.post("/optimize/", WALK).status_code == 400


@pytest.mark.django_db
def test_the_api_answers_429_past_the_quota(settings):
    settings.KLINEAGE_GPU_JOB_QUOTA = 1
    client = Client()
    client.force_login(_operator("olga"))
    body = {"kind": "walk", "params": {"kernel": "row_softmax/warp_vec4", "mode": "gpu"}}
    assert client.post("/api/jobs/", body, content_type="application/json").status_code == 201
    refused = client.post("/api/jobs/", body, content_type="application/json")
    assert refused.status_code == 429 and "the quota is 1" in refused.json()["detail"]
    assert Job.objects.count() == 1


def test_concurrent_submissions_never_pass_the_quota(job_database, settings):
    """Sixteen threads, each with its own database connection, submit at the same moment for one
    user: exactly the quota's worth are queued and the rest are refused, on both databases."""
    settings.KLINEAGE_GPU_JOB_QUOTA = 4
    owner = _operator("olga")
    params = _gpu_walk()
    threads_n = 16
    start = threading.Barrier(threads_n)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt() -> None:
        try:
            start.wait()
            try:
                queue.retrying(lambda: submit.submit(Job.Kind.WALK, params, owner=owner))
                outcome = "queued"
            except submit.QuotaExceeded:
                outcome = "refused"
            with lock:
                outcomes.append(outcome)
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["queued"] * 4 + ["refused"] * 12, outcomes
    assert Job.objects.filter(owner=owner, needs="gpu", status="queued").count() == 4
