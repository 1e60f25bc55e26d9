"""The jobs list page: real jobs from the queue, filters, and what a waiting job waits for."""

from __future__ import annotations

import pytest

from gate_app import queue
from gate_app.models import Job

pytestmark = pytest.mark.django_db


def test_jobs_page_lists_jobs_and_says_why_a_gpu_job_waits(client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        gpu_job = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "gpu"},
                                needs=Job.Needs.GPU)
        cpu_job = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "compile"})
    page = client.get("/jobs/")
    assert page.status_code == 200
    text = page.content.decode()
    assert f"#{gpu_job.pk}" in text and f"#{cpu_job.pk}" in text
    assert "No worker has reported yet" in text
    assert "GPU" in text.split(f"#{gpu_job.pk}")[1].split("</tr>")[0]


def test_jobs_page_filters_by_status(client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        kept = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "compile"})
        gone = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/warp_vec4", "mode": "compile"})
    queue.cancel(gone)
    text = client.get("/jobs/?status=queued").content.decode()
    assert f"#{kept.pk}" in text and f"#{gone.pk}<" not in text
