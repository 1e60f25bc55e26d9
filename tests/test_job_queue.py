"""The job queue on real databases, SQLite and PostgreSQL: exclusive claims under concurrency,
leases, the reaper, idempotent completion, cancellation of a running child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from gate_app import queue, submit
from gate_app.childproc import alive
from gate_app.kinds import MODULE_ENV
from gate_app.models import Job
from gate_app.worker import Capabilities, JobWorker
from job_kinds import ENV
from services import REPO, job_database, postgres_server, postgres_template, sqlite_template  # noqa: F401  (fixtures)

CPU = Capabilities(("cpu",), "", "", "test")


pytestmark = pytest.mark.usefixtures("sleep_kind")  # tests/job_kinds.py


def _jobs(count: int, **fields) -> list[int]:
    return [queue.enqueue("sleep", {"seconds": 0, "n": n}, **fields).pk for n in range(count)]


def _claim_all(worker_id: str, start: threading.Barrier, claimed: list, errors: list) -> None:
    try:
        start.wait()
        while (job := queue.claim(worker_id, ["cpu"], lease_seconds=30)) is not None:
            claimed.append((worker_id, job.pk))
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))
    finally:
        connections.close_all()


def test_claim_is_exclusive_across_threads(job_database):
    ids = _jobs(120)
    start = threading.Barrier(8)
    claimed: list[tuple[str, int]] = []
    errors: list[str] = []
    threads = [threading.Thread(target=_claim_all, args=(f"w{n}", start, claimed, errors)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    got = sorted(pk for _, pk in claimed)
    assert got == sorted(ids), "every job claimed exactly once"
    assert len({worker for worker, _ in claimed}) > 1, "the claims were really concurrent"
    rows = Job.objects.filter(pk__in=ids)
    assert all(job.status == Job.Status.RUNNING and job.attempts == 1 for job in rows)
    owners = dict(claimed)
    assert all(job.worker_id in owners for job in rows)


_CLAIMER = """
import json, os, sys, time
import django
os.environ["DJANGO_SETTINGS_MODULE"] = "klineage_web.settings"
django.setup()
from gate_app import queue
queue.Job.objects.exists()  # connected before the start line
print("ready", flush=True)
sys.stdin.readline()
got = []
while (job := queue.claim(sys.argv[1], ["cpu"], kinds=["sleep"])) is not None:
    got.append(job.pk)
print(json.dumps(got))
"""


def test_claim_is_exclusive_across_processes(job_database, tmp_path):
    ids = _jobs(120)
    env = {**os.environ, "DATABASE_URL": job_database.url, "KLINEAGE_DATA_DIR": str(tmp_path), **ENV}
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIMER, f"p{n}"], cwd=REPO, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(4)]
    for proc in procs:  # every process set up and connected before any claims
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    got = sorted(pk for claimed in results for pk in claimed)
    assert got == sorted(ids), "every job claimed exactly once"
    assert sum(1 for claimed in results if claimed) > 1, "more than one process won claims"


def test_claim_takes_oldest_first_and_respects_needs(job_database):
    gpu_job = queue.enqueue("sleep", {}, needs="gpu")
    first, second = _jobs(2)
    assert queue.claim("cpu-worker", ["cpu"]).pk == first
    assert queue.claim("cpu-worker", ["cpu"]).pk == second
    assert queue.claim("cpu-worker", ["cpu"]) is None, "a worker without a GPU never takes GPU work"
    gpu_job.refresh_from_db()
    assert gpu_job.status == Job.Status.QUEUED
    assert "waits for a GPU worker" in queue.waiting_reason(gpu_job)
    assert queue.claim("gpu-worker", ["gpu", "cpu"]).pk == gpu_job.pk


def test_claim_only_kinds_the_worker_handles(job_database):
    walk = queue.enqueue("walk", {"mode": "compile"})  # a CPU job, as its kind says for a compile-only gate
    assert queue.claim("w", ["cpu"], kinds=["gate", "sleep"]) is None
    queue.register_worker("w", host="h", pid=1, gpu="", gpu_name="", capabilities=["cpu"], kinds=["gate"])
    walk.refresh_from_db()
    assert "runs 'walk' jobs" in queue.waiting_reason(walk)


def test_enqueue_rejects_unknown_kind_and_bad_gate_params(job_database, monkeypatch):
    monkeypatch.delenv(MODULE_ENV)  # no test kinds: sleep is unknown
    with pytest.raises(queue.QueueError, match="unknown job kind"):
        queue.enqueue("sleep", {})
    with pytest.raises(queue.QueueError, match="no such"):
        submit.enqueue_gate("row_softmax", "row_softmax/no_such_kernel", mode="compile")
    with pytest.raises(queue.QueueError, match="mode"):
        submit.enqueue_gate("row_softmax", "row_softmax/naive", mode="fast")
    job = submit.enqueue_gate("row_softmax", "row_softmax/naive", mode="compile")
    assert job.needs == "cpu" and job.params == {"problem": "row_softmax", "kernel": "row_softmax/naive",
                                                 "mode": "compile"}
    assert submit.enqueue_gate("row_softmax", "row_softmax/naive", mode="gpu").needs == "gpu"
    assert submit.enqueue_gate("row_softmax", "row_softmax/naive", mode="replay").needs == "cpu"


def test_idempotency_key_returns_the_existing_job(job_database):
    first = queue.enqueue("sleep", {"a": 1}, idempotency_key="gate:abc")
    again = queue.enqueue("sleep", {"a": 1}, idempotency_key="gate:abc")
    assert again.pk == first.pk
    assert Job.objects.count() == 1

    keys: list[int] = []
    errors: list[str] = []
    start = threading.Barrier(6)

    def submit() -> None:
        try:
            start.wait()
            keys.append(queue.enqueue("sleep", {}, idempotency_key="race").pk)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(set(keys)) == 1 and len(keys) == 6
    assert Job.objects.filter(idempotency_key="race").count() == 1


def test_enqueue_inside_a_transaction_commits_with_it(job_database):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            queue.enqueue("sleep", {})
            raise RuntimeError("the surrounding work failed")
    assert Job.objects.count() == 0, "a rolled-back submission leaves no job"
    with transaction.atomic():
        job = queue.enqueue("sleep", {})
    assert Job.objects.get(pk=job.pk).status == Job.Status.QUEUED


def test_postgres_notifies_idle_workers_on_commit_only(job_database):
    if job_database.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; SQLite workers poll")
    import psycopg

    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as listener:
        listener.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
        with transaction.atomic():
            queue.enqueue("sleep", {}, needs="gpu")
            assert list(listener.notifies(timeout=0.3, stop_after=1)) == [], "nothing before the commit"
        heard = list(listener.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in heard] == [(queue.NOTIFY_CHANNEL, "gpu")]


def test_heartbeat_by_a_non_owner_fails(job_database):
    job_id = _jobs(1)[0]
    job = queue.claim("owner", ["cpu"], lease_seconds=2)
    assert job.pk == job_id
    assert queue.heartbeat(job_id, "intruder", lease_seconds=60) is False
    job.refresh_from_db()
    before = job.lease_expires_at
    assert queue.heartbeat(job_id, "owner", lease_seconds=60) is True
    job.refresh_from_db()
    assert job.lease_expires_at > before + timedelta(seconds=50)
    assert queue.report_progress(job_id, "intruder", {"fraction": 0.5}, "x\n") is False
    assert queue.complete(job_id, "intruder", {"forged": True}) is False


def test_expired_lease_is_requeued_and_the_old_owner_locked_out(job_database):
    job_id = _jobs(1)[0]
    queue.claim("first", ["cpu"], lease_seconds=0.5)
    assert not queue.reap(), "a live lease is left alone"
    time.sleep(0.7)
    report = queue.reap()
    assert report.requeued == [job_id]
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.worker_id, job.attempts) == (Job.Status.QUEUED, "", 1)
    assert "lease of first expired" in job.log
    assert queue.heartbeat(job_id, "first") is False, "the first worker must abandon it"
    second = queue.claim("second", ["cpu"], lease_seconds=30)
    assert (second.pk, second.attempts) == (job_id, 2)
    assert queue.complete(job_id, "first", {"by": "first"}) is False
    assert queue.complete(job_id, "second", {"by": "second"}) is True
    job.refresh_from_db()
    assert job.result == {"by": "second"}


def test_a_heartbeat_keeps_the_reaper_away(job_database):
    job_id = _jobs(1)[0]
    queue.claim("w", ["cpu"], lease_seconds=1)
    for _ in range(4):
        time.sleep(0.4)
        assert queue.heartbeat(job_id, "w", lease_seconds=1)
        assert not queue.reap()
    assert Job.objects.get(pk=job_id).status == Job.Status.RUNNING


def test_max_attempts_then_failed_with_the_reason(job_database):
    job_id = _jobs(1, max_attempts=2)[0]
    for attempt in (1, 2):
        job = queue.claim(f"w{attempt}", ["cpu"], lease_seconds=2)
        assert (job.pk, job.attempts) == (job_id, attempt)
        queue.reap(now=timezone.now() + timedelta(seconds=3))
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.FAILED
    assert job.error.startswith("lease expired after 2 attempts")
    assert job.finished_at is not None
    assert queue.claim("w3", ["cpu"]) is None


def test_complete_is_idempotent(job_database):
    job_id = _jobs(1)[0]
    queue.claim("w", ["cpu"])
    assert queue.complete(job_id, "w", {"n": 1}) is True
    assert queue.complete(job_id, "w", {"n": 2}) is False
    assert queue.fail(job_id, "w", "too late") is False
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result, job.error) == (Job.Status.SUCCEEDED, {"n": 1}, "")
    assert job.progress["fraction"] == 1.0


def test_release_on_shutdown_does_not_count_an_attempt(job_database):
    job_id = _jobs(1)[0]
    queue.claim("w", ["cpu"])
    assert queue.release(job_id, "w") is True
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts, job.worker_id) == (Job.Status.QUEUED, 0, "")
    assert queue.claim("w2", ["cpu"]).attempts == 1


def test_cancel_a_queued_job(job_database):
    job_id = _jobs(1)[0]
    assert queue.cancel(job_id) == Job.Status.CANCELLED
    assert queue.claim("w", ["cpu"]) is None
    assert queue.cancel(job_id) == Job.Status.CANCELLED


def test_cancel_of_a_dead_workers_job_is_finished_by_the_reaper(job_database):
    job_id = _jobs(1)[0]
    queue.claim("gone", ["cpu"], lease_seconds=1)
    assert queue.cancel(job_id) == Job.Status.RUNNING
    assert queue.reap(now=timezone.now() + timedelta(seconds=2)).cancelled == [job_id]
    assert Job.objects.get(pk=job_id).status == Job.Status.CANCELLED


def _worker(**options) -> JobWorker:
    return JobWorker(capabilities=CPU, lease_seconds=2, poll_interval=0.1, install_signals=False,
                     out=open(os.devnull, "w"), **options)


def _wait(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _pids(job_id: int) -> tuple[int, int] | None:
    log = Job.objects.get(pk=job_id).log
    if "grandchild" not in log:
        return None
    child = int(log.split("child process ")[1].split()[0])
    grandchild = int(log.split("grandchild ")[1].split()[0])
    return child, grandchild


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group (a killed one may linger as a zombie until reaped)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _in_thread(worker: JobWorker) -> threading.Thread:
    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_cancel_stops_the_running_child_and_its_whole_tree(job_database):
    job_id = queue.enqueue("sleep", {"seconds": 120, "grandchild": True}).pk
    worker = _worker(once=True)
    thread = _in_thread(worker)
    child, grandchild = _wait(lambda: _pids(job_id), what="the child to start its grandchild")
    assert alive(child) and alive(grandchild)
    assert os.getpgid(grandchild) == grandchild != os.getpgid(child), "the grandchild is in a session of its own"
    cancelled_at = time.monotonic()
    assert queue.cancel(job_id) == Job.Status.RUNNING
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert time.monotonic() - cancelled_at < 10
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.CANCELLED
    assert not alive(child) and not alive(grandchild)
    assert _group_members(child) == [] and _group_members(grandchild) == [], "both process groups are gone"


def test_shutdown_gives_a_long_job_back_and_stops_its_child(job_database):
    job_id = queue.enqueue("sleep", {"seconds": 120, "grandchild": True}).pk
    worker = _worker(drain_seconds=0.3)
    thread = _in_thread(worker)
    child, grandchild = _wait(lambda: _pids(job_id), what="the child to start")
    worker.request_stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts) == (Job.Status.QUEUED, 0)
    assert not alive(child) and not alive(grandchild)


def test_shutdown_lets_a_short_job_finish(job_database):
    job_id = queue.enqueue("sleep", {"seconds": 1.0}).pk
    worker = _worker(drain_seconds=10)
    thread = _in_thread(worker)
    _wait(lambda: Job.objects.get(pk=job_id).status == Job.Status.RUNNING, what="the claim")
    worker.request_stop()
    thread.join(timeout=15)
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.SUCCEEDED
    assert job.result["slept"] == 1.0


def test_a_failing_child_fails_the_job_without_retry(job_database):
    job_id = queue.enqueue("sleep", {"seconds": 0, "fail": "boom"}).pk
    _worker(once=True).run()
    connections.close_all()
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.FAILED
    assert "RuntimeError: boom" in job.error
    assert job.attempts == 1


def test_a_briefly_locked_sqlite_database_delays_a_claim_and_loses_nothing(job_database):
    """Another process holds SQLite's write lock for a second: the claim waits it out, then wins."""
    if job_database.vendor != "sqlite":
        pytest.skip("SQLite's file lock; PostgreSQL locks rows, covered by the concurrency tests")
    (job_id,) = _jobs(1)
    import sqlite3

    holder = sqlite3.connect(job_database.config["NAME"], timeout=5, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    released = threading.Event()

    def release_later() -> None:
        time.sleep(1.0)
        holder.execute("COMMIT")
        released.set()

    threading.Thread(target=release_later, daemon=True).start()
    started = time.monotonic()
    job = queue.claim("locked-out", ["cpu"], lease_seconds=30)
    waited = time.monotonic() - started
    holder.close()
    assert released.is_set() and waited >= 0.9, "the claim went through while the database was locked"
    assert job is not None and job.pk == job_id and job.status == Job.Status.RUNNING
    assert Job.objects.get(pk=job_id).worker_id == "locked-out"
