"""The job queue, kept in the database.

A job is claimed by one worker at a time, for a lease the worker keeps extending by heartbeats.
Every change a worker makes is conditional on still holding the job (its worker id and the
running status), so a worker that lost its lease, or a second attempt at finishing, changes
nothing. A reaper requeues jobs whose lease ran out (their worker died), up to max_attempts.

Claiming is atomic on both supported databases:
- PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED inside a transaction, then UPDATE by id;
  concurrent workers skip each other's rows instead of waiting on them.
- SQLite: UPDATE ... WHERE id = ? AND status = 'queued'; the row count says whether this worker
  won. SQLite serialises writers, and a "database is locked" is retried with backoff.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Concat, Right
from django.utils import timezone

from gate_app import kinds, progress
from gate_app.models import LOG_LIMIT, Job, Worker

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 30.0
WORKER_STALE_SECONDS = 30.0  # a worker not seen for this long counts as gone
NOTIFY_CHANNEL = "klineage_jobs"  # PostgreSQL LISTEN/NOTIFY channel that wakes idle workers
_CANDIDATES = 8  # queued ids one conditional-UPDATE claim tries before looking again

T = TypeVar("T")
JobRef = Job | int


class QueueError(ValueError):
    """A job that cannot be queued as asked."""


def _pk(job: JobRef) -> int:
    return job if isinstance(job, int) else job.pk


def _now() -> datetime:
    return timezone.now()


def _stamp(now: datetime) -> str:
    return now.strftime("%H:%M:%S")


def log_line(line: str, now: datetime | None = None) -> str:
    return f"[{_stamp(now or _now())}] {line}\n"


def _append_log(text: str):
    """Appended by the database, so writers never overwrite each other's lines; only the last
    LOG_LIMIT characters are kept."""
    return Right(Concat(F("log"), Value(text)), LOG_LIMIT)


def _append(line: str, now: datetime):
    return _append_log(log_line(line, now))


def _is_lock_error(exc: OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def retrying(action: Callable[[], T], attempts: int = 10) -> T:
    """Run `action`, retrying SQLite's "database is locked" with jittered exponential backoff.

    Only for work done outside an enclosing transaction (a failed statement inside one leaves
    it unusable). On PostgreSQL the error never arises and this is a plain call.
    """
    for attempt in range(attempts):
        try:
            return action()
        except OperationalError as exc:
            if not _is_lock_error(exc) or attempt == attempts - 1 or connection.in_atomic_block:
                raise
            delay = min(2.0, 0.02 * 2 ** attempt) * (0.5 + random.random())
            log.debug("database locked; retrying in %.2fs", delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


# Submitting ---------------------------------------------------------------------------------


def enqueue(kind: str, params: dict[str, Any] | None = None, *, owner=None, needs: str | None = None,
            idempotency_key: str | None = None, max_attempts: int = 3) -> Job:
    """Queue a job, or give back the job already queued under `idempotency_key`. It needs what its kind
    says for its parameters (gate_app.kinds) unless `needs` says otherwise.

    The row is written in the caller's transaction, so work and the records it refers to commit
    together; idle workers are woken once it commits (transaction.on_commit).
    """
    try:
        needs = needs or kinds.get(kind).needs(params or {})
    except kinds.KindError as exc:
        raise QueueError(str(exc)) from None
    if needs not in Job.Needs.values:
        raise QueueError(f"needs must be one of {Job.Needs.values}, not {needs!r}")
    if max_attempts < 1:
        raise QueueError("max_attempts must be at least 1")
    fields = dict(kind=kind, params=params or {}, needs=needs, owner=owner, max_attempts=max_attempts,
                  idempotency_key=idempotency_key or None)
    if idempotency_key:
        existing = Job.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
        try:
            with transaction.atomic():  # a savepoint: losing the race leaves the caller's transaction usable
                job = Job.objects.create(**fields)
        except IntegrityError:
            return Job.objects.get(idempotency_key=idempotency_key)
    else:
        job = Job.objects.create(**fields)
    transaction.on_commit(lambda: _announce(needs))
    return job


def _announce(needs: str) -> None:
    """Wake idle workers now rather than at their next poll (PostgreSQL only; others poll)."""
    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, needs])
    except Exception as exc:  # the job is committed; workers find it at their next poll anyway
        log.warning("could not notify workers: %s", exc)


# Working ------------------------------------------------------------------------------------


def claim(worker_id: str, capabilities: Iterable[str] = (Job.Needs.CPU,), kinds: Iterable[str] | None = None,
          lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Job | None:
    """The oldest queued job this worker can run, now running under its lease; None if none.

    `capabilities` is in order of preference: a GPU worker passes ("gpu", "cpu") so GPU work,
    which only it can do, goes first.
    """
    kinds = list(kinds) if kinds is not None else None
    skip_locked = connection.features.has_select_for_update_skip_locked
    for needs in capabilities:
        if skip_locked:
            job = retrying(lambda: _claim_skip_locked(worker_id, needs, kinds, lease_seconds))
        else:
            job = retrying(lambda: _claim_conditional(worker_id, needs, kinds, lease_seconds))
        if job is not None:
            return job
    return None


def _claimable(needs: str, kinds: list[str] | None):
    queued = Job.objects.filter(status=Job.Status.QUEUED, needs=needs)
    return queued.filter(kind__in=kinds) if kinds is not None else queued


def _claim_update(worker_id: str, lease_seconds: float) -> dict[str, Any]:
    now = _now()
    return dict(status=Job.Status.RUNNING, worker_id=worker_id, attempts=F("attempts") + 1,
                lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now, started_at=now,
                log=_append(f"claimed by {worker_id}", now))


def _claim_skip_locked(worker_id: str, needs: str, kinds: list[str] | None, lease_seconds: float) -> Job | None:
    with transaction.atomic():
        picked = (_claimable(needs, kinds).select_for_update(skip_locked=True).order_by("id")
                  .values_list("id", flat=True).first())
        if picked is None:
            return None
        Job.objects.filter(pk=picked).update(**_claim_update(worker_id, lease_seconds))
    return Job.objects.get(pk=picked)


def _claim_conditional(worker_id: str, needs: str, kinds: list[str] | None, lease_seconds: float) -> Job | None:
    while True:
        candidates = list(_claimable(needs, kinds).order_by("id").values_list("id", flat=True)[:_CANDIDATES])
        if not candidates:
            return None
        for pk in candidates:
            won = Job.objects.filter(pk=pk, status=Job.Status.QUEUED).update(**_claim_update(worker_id, lease_seconds))
            if won == 1:
                return Job.objects.get(pk=pk)
        # Other workers took every candidate between our read and our writes: look again.


def _owned(job: JobRef, worker_id: str):
    return Job.objects.filter(pk=_pk(job), worker_id=worker_id, status=Job.Status.RUNNING)


def heartbeat(job: JobRef, worker_id: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> bool:
    """Extend the lease; False when this worker no longer holds the job and must abandon it."""
    now = _now()
    return retrying(lambda: _owned(job, worker_id).update(
        lease_expires_at=now + timedelta(seconds=lease_seconds), heartbeat_at=now)) == 1


def cancel_requested(job: JobRef) -> bool:
    return Job.objects.filter(pk=_pk(job), cancel_requested=True).exists()


def report_progress(job: JobRef, worker_id: str, progress: dict[str, Any], new_log: str = "") -> bool:
    """Record progress and append log lines; False when this worker no longer holds the job."""
    fields: dict[str, Any] = {"progress": progress}
    if new_log:
        fields["log"] = _append_log(new_log)
    return retrying(lambda: _owned(job, worker_id).update(**fields)) == 1


def _finish(job: JobRef, worker_id: str, status: str, **fields: Any) -> bool:
    now = _now()
    done = retrying(lambda: _owned(job, worker_id).update(status=status, finished_at=now, lease_expires_at=None,
                                                           **fields)) == 1
    if done:
        _publish(_pk(job))
    return done


def complete(job: JobRef, worker_id: str, result: Any, new_log: str = "", detail: dict[str, Any] | None = None) -> bool:
    """Store the result and mark the job succeeded, once: True only for the call that did it.

    Only the worker holding the running job can complete it, so a retried job that an earlier
    worker also finished leaves exactly one result, and a repeated call changes nothing. `detail`
    is what the job kept in its progress beside the stage (an optimization's chart), kept too.
    """
    done = {**(detail or {}), "fraction": 1.0, "stage": "done", "message": "succeeded"}
    fields: dict[str, Any] = dict(result=result, progress=done)
    if new_log:
        fields["log"] = _append_log(new_log)
    return _finish(job, worker_id, Job.Status.SUCCEEDED, **fields)


def fail(job: JobRef, worker_id: str, error: str, new_log: str = "") -> bool:
    """Mark the job failed with the reason; not retried (the reaper retries only lost workers)."""
    fields: dict[str, Any] = dict(error=error[-8000:])
    if new_log:
        fields["log"] = _append_log(new_log)
    return _finish(job, worker_id, Job.Status.FAILED, **fields)


def mark_cancelled(job: JobRef, worker_id: str, new_log: str = "") -> bool:
    """The worker stopped a job whose cancel was requested."""
    fields: dict[str, Any] = {}
    if new_log:
        fields["log"] = _append_log(new_log)
    return _finish(job, worker_id, Job.Status.CANCELLED, **fields)


def release(job: JobRef, worker_id: str, reason: str = "worker shutting down") -> bool:
    """Give a running job back to the queue (graceful shutdown): not counted as an attempt.

    A job whose cancel was requested meanwhile is cancelled instead.
    """
    now = _now()
    if retrying(lambda: _owned(job, worker_id).filter(cancel_requested=True).update(
            status=Job.Status.CANCELLED, finished_at=now, lease_expires_at=None,
            log=_append(f"cancelled ({reason})", now))):
        _publish(_pk(job))
        return True
    released = retrying(lambda: _owned(job, worker_id).update(
        status=Job.Status.QUEUED, worker_id="", lease_expires_at=None, heartbeat_at=None,
        attempts=F("attempts") - 1, progress={"fraction": 0.0, "stage": "", "message": ""},
        log=_append(f"released by {worker_id} ({reason}); queued again", now))) == 1
    if released:
        _announce(Job.objects.filter(pk=_pk(job)).values_list("needs", flat=True).first() or "cpu")
        _publish(_pk(job))
    return released


def cancel(job: JobRef) -> str:
    """Cancel a job: a queued one at once, a running one by asking its worker, which stops its
    child processes and marks it cancelled. Returns the job's status afterwards."""
    now = _now()
    pk = _pk(job)
    if retrying(lambda: Job.objects.filter(pk=pk, status=Job.Status.QUEUED).update(
            status=Job.Status.CANCELLED, cancel_requested=True, finished_at=now, log=_append("cancelled", now))):
        _publish(pk)
        return Job.Status.CANCELLED
    if retrying(lambda: Job.objects.filter(pk=pk, status=Job.Status.RUNNING).update(
            cancel_requested=True, log=_append("cancel requested", now))):
        _publish(pk)
        return Job.Status.RUNNING
    return Job.objects.filter(pk=pk).values_list("status", flat=True).first() or ""


@dataclass
class ReapReport:
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.requeued or self.failed or self.cancelled)


def reap(now: datetime | None = None) -> ReapReport:
    """Requeue running jobs whose lease expired before `now` (their worker is gone), or fail them
    once they have used max_attempts; a job whose cancel was requested is cancelled instead."""
    now = now or _now()
    return _reap(Job.objects.filter(status=Job.Status.RUNNING, lease_expires_at__lt=now), now,
                 requeued="lease of {who} expired", failed="lease expired after {tried} attempts (last worker {who})")


def reap_worker(worker_id: str, now: datetime | None = None) -> ReapReport:
    """The same for the jobs of one worker known to be dead (its supervisor saw it exit), at once
    rather than when its lease runs out; the worker is marked stopped."""
    now = now or _now()
    worker_stopped(worker_id)
    return _reap(Job.objects.filter(status=Job.Status.RUNNING, worker_id=worker_id), now,
                 requeued="worker {who} died", failed="worker {who} died on attempt {tried}, the last allowed")


def _reap(running, now: datetime, *, requeued: str, failed: str) -> ReapReport:
    """Requeue, fail or cancel the `running` jobs; the log says why in words formatted with the job's
    worker (`who`) and attempts used (`tried`)."""
    report = ReapReport()
    rows = running.values("id", "worker_id", "attempts", "max_attempts", "cancel_requested", "needs")
    for row in list(rows):
        pk, who, tried, most = row["id"], row["worker_id"], row["attempts"], row["max_attempts"]
        # The same conditions again in the UPDATE: a heartbeat or a finish that came in meanwhile wins.
        still = running.filter(pk=pk, worker_id=who)
        if row["cancel_requested"]:
            done = retrying(lambda: still.update(status=Job.Status.CANCELLED, finished_at=now, lease_expires_at=None,
                                                 log=_append(f"cancelled (worker {who} gone)", now)))
            target = report.cancelled
        elif tried < most:
            done = retrying(lambda: still.update(
                status=Job.Status.QUEUED, worker_id="", lease_expires_at=None, heartbeat_at=None,
                log=_append(f"{requeued.format(who=who)}; queued again (attempt {tried} of {most} used)", now)))
            target = report.requeued
        else:
            reason = failed.format(who=who, tried=tried)
            done = retrying(lambda: still.update(status=Job.Status.FAILED, error=reason, finished_at=now,
                                                 lease_expires_at=None, log=_append(reason, now)))
            target = report.failed
        if done:
            target.append(pk)
            _publish(pk)
            if target is report.requeued:
                _announce(row["needs"])
    return report


def _publish(pk: int) -> None:
    """Tell open pages the job's new state, once the change is committed."""
    transaction.on_commit(lambda: publish_state(pk))


def publish_state(job_id: int) -> bool:
    """Send open pages the job's whole state as it now is in the database (after a status change)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return False
    return progress.publish(job_id, {"type": "state", "job": describe(job, log=False)})


# Workers ------------------------------------------------------------------------------------


def register_worker(worker_id: str, *, host: str, pid: int, gpu: str, gpu_name: str, capabilities: list[str],
                    kinds: list[str]) -> None:
    now = _now()
    retrying(lambda: Worker.objects.update_or_create(worker_id=worker_id, defaults=dict(
        host=host, pid=pid, gpu=gpu, gpu_name=gpu_name, capabilities=list(capabilities), kinds=list(kinds),
        seen_at=now, stopped_at=None, job=None)))


def worker_seen(worker_id: str, job: JobRef | None = None) -> None:
    retrying(lambda: Worker.objects.filter(worker_id=worker_id).update(
        seen_at=_now(), job_id=_pk(job) if job is not None else None))


def worker_stopped(worker_id: str) -> None:
    now = _now()
    retrying(lambda: Worker.objects.filter(worker_id=worker_id).update(seen_at=now, stopped_at=now, job=None))


def live_workers(now: datetime | None = None) -> list[Worker]:
    since = (now or _now()) - timedelta(seconds=WORKER_STALE_SECONDS)
    return list(Worker.objects.filter(stopped_at__isnull=True, seen_at__gte=since))


def waiting_reason(job: Job, workers: list[Worker] | None = None) -> str:
    """For a queued job, what it waits for, in words; empty for any other status."""
    if job.status != Job.Status.QUEUED:
        return ""
    workers = live_workers() if workers is None else workers
    able = [w for w in workers if job.needs in w.capabilities and job.kind in w.kinds]
    if not able:
        if job.needs == Job.Needs.GPU:
            running = f" (the {len(workers)} worker(s) running have none)" if workers else ""
            return ("waits for a GPU worker: none is running" + running +
                    "; start `manage.py gate_worker --gpu N` on a machine with a GPU")
        if not workers:
            return "waits for a worker: none is running; start `manage.py gate_worker`"
        return f"waits for a worker that runs {job.kind!r} jobs: none of those running does"
    ahead = _claimable(job.needs, [job.kind]).filter(id__lt=job.pk).count()
    return f"queued behind {ahead} job(s)" if ahead else "queued: next to be claimed"


def waiting_for_gpu() -> int:
    return Job.objects.filter(status=Job.Status.QUEUED, needs=Job.Needs.GPU).count()


def describe(job: Job, *, log: bool = True, workers: list[Worker] | None = None) -> dict[str, Any]:
    """The job as pages and the WebSocket see it (JSON-safe)."""

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    state = {
        "id": job.pk, "kind": job.kind, "status": job.status, "needs": job.needs, "params": job.params,
        "progress": job.progress, "attempts": job.attempts, "max_attempts": job.max_attempts,
        "worker_id": job.worker_id, "cancel_requested": job.cancel_requested, "error": job.error,
        "result": job.result if job.status in Job.TERMINAL else None,
        "owner": job.owner.get_username() if job.owner_id else None,
        "created_at": iso(job.created_at), "started_at": iso(job.started_at), "finished_at": iso(job.finished_at),
        "heartbeat_at": iso(job.heartbeat_at), "lease_expires_at": iso(job.lease_expires_at),
        "waiting": waiting_reason(job, workers),
        # Pages poll when workers' progress events cannot reach the web server (no Redis).
        "poll": not getattr(settings, "KLINEAGE_CROSS_PROCESS_PROGRESS", False),
    }
    if log:
        state["log"] = job.log
    return state
