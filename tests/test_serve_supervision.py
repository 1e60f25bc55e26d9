"""`manage.py serve` supervises its gate worker: after `kill -9` of the worker mid-job, the job goes
back to the queue at once (not when its lease runs out), a new worker starts and finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gate_app import queue
from gate_app.models import Job
from job_kinds import ENV
from services import REPO, free_port, sqlite_job_database, sqlite_template  # noqa: F401  (fixtures)
from web_server import gate_workers, wait_for

LEASE_SECONDS = 30  # the worker's default: the requeue must come well before it would expire


pytestmark = pytest.mark.usefixtures("sleep_kind")  # tests/job_kinds.py


def _wait(what: str, until, timeout_s: float):
    found = wait_for(until, timeout_s)
    assert found, f"not {what} within {timeout_s} s"
    return found


def test_a_killed_worker_is_restarted_and_its_job_requeued_at_once(sqlite_job_database, tmp_path):  # noqa: F811
    env = {**os.environ, "DATABASE_URL": sqlite_job_database.url, "KLINEAGE_DATA_DIR": str(tmp_path),
           **ENV, "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    server = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{free_port()}"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stdout), daemon=True)
    reader.start()
    try:
        first = _wait("a worker running", lambda: gate_workers(server.pid), 60)[0]
        job_id = queue.enqueue("sleep", {"seconds": 3}).pk
        running = _wait("the job claimed", lambda: Job.objects.filter(pk=job_id, status="running").first(), 60)
        os.kill(first, signal.SIGKILL)
        killed_at = time.monotonic()
        _wait("the job requeued", lambda: f"worker {running.worker_id} died" in Job.objects.get(pk=job_id).log, 20)
        assert time.monotonic() - killed_at < LEASE_SECONDS / 2
        second = _wait("another worker", lambda: [p for p in gate_workers(server.pid) if p != first], 30)[0]
        done = _wait("the job finished", lambda: Job.objects.filter(pk=job_id, status__in=Job.TERMINAL).first(), 60)
        assert done.status == Job.Status.SUCCEEDED, done.log
        assert done.attempts == 2 and done.result["worker_id"] != running.worker_id
        assert second != first
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        reader.join(timeout=5)
    output = "".join(lines)
    assert f"killed by signal {signal.SIGKILL.value}" in output, output
    assert f"job(s) {job_id} back to the queue" in output
    assert output.count("gate worker started") == 2


def test_reap_worker_takes_back_only_the_dead_workers_jobs(sqlite_job_database):  # noqa: F811
    dead, alive = (queue.enqueue("sleep", {"seconds": 1}).pk for _ in range(2))
    assert queue.claim("dead-worker", ["cpu"], lease_seconds=300).pk == dead
    assert queue.claim("live-worker", ["cpu"], lease_seconds=300).pk == alive
    report = queue.reap_worker("dead-worker")
    assert report.requeued == [dead] and not report.failed
    assert Job.objects.get(pk=dead).status == Job.Status.QUEUED
    assert "worker dead-worker died; queued again (attempt 1 of 3 used)" in Job.objects.get(pk=dead).log
    assert Job.objects.get(pk=alive).status == Job.Status.RUNNING  # its lease is far from expired
