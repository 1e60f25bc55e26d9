"""The job worker behind `manage.py gate_worker`: one process per GPU (or one without a GPU for
compile-only and replayed work).

It claims a job, runs its handler with a monitor thread beside it that heartbeats the lease,
watches for a cancel request and enforces the shutdown deadline, then stores the outcome. It
runs the reaper now and then, so jobs of dead workers go back to the queue while any worker
lives. SIGTERM (or SIGINT) lets the current job finish within `drain_seconds`, else stops it
and gives it back to the queue without counting an attempt; a second signal stops at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from django.conf import settings
from django.db import DatabaseError, connection

from gate_app import queue
from gate_app.handlers import JobAborted, JobContext, JobError, handlers
from gate_app.models import Job


@dataclass(frozen=True)
class Capabilities:
    needs: tuple[str, ...]  # in order of preference
    gpu: str  # CUDA_VISIBLE_DEVICES for the children; empty without a GPU
    gpu_name: str
    note: str  # how this was decided, for the start-up message


def detect_capabilities(gpu: str | None, cpu_only: bool = False) -> Capabilities:
    """A GPU worker runs GPU jobs first and CPU jobs when there are none; without a GPU only CPU
    jobs (compile-only and replayed gates). `gpu` is an index from --gpu; None means look."""
    from klineage.errors import KLineageError
    from klineage.gate import execute

    cpu = Capabilities((Job.Needs.CPU,), "", "", "")
    if cpu_only:
        return Capabilities(cpu.needs, "", "", "--cpu-only")
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # gpu_name() asks nvidia-smi about this index
        try:
            name = execute.gpu_name()
        except KLineageError as exc:
            raise KLineageError(f"--gpu {gpu}: {exc}") from None
        return Capabilities((Job.Needs.GPU, Job.Needs.CPU), gpu, name, f"--gpu {gpu}")
    try:
        name = execute.gpu_name()
    except KLineageError as exc:
        return Capabilities(cpu.needs, "", "", str(exc))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return Capabilities((Job.Needs.GPU, Job.Needs.CPU), visible, name, "found with nvidia-smi")


def _child_env(capabilities: Capabilities) -> dict[str, str]:
    """What a GPU worker's jobs are told: their GPU, its name (sparing each gate a call to nvidia-smi),
    and a share of the CPU cores: the runner builds inputs on the CPU with torch, whose thread pool
    otherwise takes every core, so the runners of a multi-GPU host would oversubscribe it."""
    if not capabilities.gpu:
        return {}
    from klineage.gate import execute

    threads = max(1, (os.cpu_count() or 1) // execute.gpu_count())
    return {"CUDA_VISIBLE_DEVICES": capabilities.gpu, "KLINEAGE_GPU_NAME": capabilities.gpu_name,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or str(threads)}


def default_worker_id(gpu: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{'gpu' + gpu if gpu else 'cpu'}:{uuid.uuid4().hex[:6]}"


class _Waker:
    """Sleeps between polls; on PostgreSQL, wakes at once when a job is queued (LISTEN/NOTIFY)."""

    def __init__(self) -> None:
        self._listen = None
        if connection.vendor == "postgresql":
            try:
                import psycopg

                self._listen = psycopg.connect(**connection.get_connection_params(), autocommit=True)
                self._listen.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
            except Exception:  # polling alone still works
                self._listen = None

    def wait(self, seconds: float, stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while not stop():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._listen is not None:
                try:
                    for _ in self._listen.notifies(timeout=min(left, 0.25), stop_after=1):
                        return
                    continue
                except Exception:
                    self._listen = None
            time.sleep(min(left, 0.05))

    def close(self) -> None:
        if self._listen is not None:
            try:
                self._listen.close()
            except Exception:
                pass


class JobWorker:
    def __init__(self, *, capabilities: Capabilities, worker_id: str | None = None, lease_seconds: float = 30.0,
                 poll_interval: float = 0.5, heartbeat_seconds: float | None = None,
                 reap_seconds: float | None = None, drain_seconds: float = 10.0, once: bool = False,
                 json_log: bool = False, out: TextIO = sys.stdout, install_signals: bool = True):
        self.capabilities = capabilities
        self.worker_id = worker_id or default_worker_id(capabilities.gpu)
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        # Three heartbeats per lease: one lost write or a slow moment does not lose the job.
        self.heartbeat_seconds = heartbeat_seconds or max(0.2, lease_seconds / 3)
        self.reap_seconds = reap_seconds or max(1.0, min(lease_seconds / 2, 15.0))
        self.drain_seconds = drain_seconds
        self.once = once
        self.json_log = json_log
        self.out = out
        self.install_signals = install_signals
        self.handlers = handlers()
        self.child_env = _child_env(capabilities)
        # Without a cross-process layer (Redis) nobody outside this process hears events.
        self.publish = bool(getattr(settings, "KLINEAGE_CROSS_PROCESS_PROGRESS", False))
        self.stopping = False
        self._stop_at: float | None = None  # monotonic deadline for the current job after a signal
        self._last_reap = 0.0
        self._last_seen = 0.0
        self._last_gpu_check = 0.0
        self._gpu_waiting_reported = 0
        self.current: JobContext | None = None

    # Output -------------------------------------------------------------------------------

    def say(self, text: str, **event: Any) -> None:
        if self.json_log:
            line = json.dumps({"t": round(time.time(), 3), "worker": self.worker_id, "message": text, **event})
        else:
            line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.out.write(line + "\n")
        self.out.flush()

    # Signals ------------------------------------------------------------------------------

    def request_stop(self, immediate: bool = False) -> None:
        """What SIGTERM does; callable from tests. Flags only: the loops act on them."""
        now = time.monotonic()
        if self.stopping or immediate:
            self._stop_at = now
        else:
            self._stop_at = now + self.drain_seconds
        self.stopping = True

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self.request_stop()

    # The loop -----------------------------------------------------------------------------

    def run(self) -> int:
        if self.install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        kinds = sorted(self.handlers)
        caps = list(self.capabilities.needs)
        queue.register_worker(self.worker_id, host=socket.gethostname(), pid=os.getpid(), gpu=self.capabilities.gpu,
                              gpu_name=self.capabilities.gpu_name, capabilities=caps, kinds=kinds)
        if Job.Needs.GPU in caps:
            self.say(f"worker {self.worker_id} ready on GPU {self.capabilities.gpu or 'default'} "
                     f"({self.capabilities.gpu_name}); runs {', '.join(kinds)} jobs, GPU work first",
                     event="ready", capabilities=caps)
        else:
            self.say(f"worker {self.worker_id} ready without a GPU ({self.capabilities.note}); runs only "
                     f"compile-only and replayed work ({', '.join(kinds)} jobs that need no GPU)",
                     event="ready", capabilities=caps)
            self._report_gpu_waiting()
        waker = _Waker()
        failures = 0
        try:
            while not self.stopping:
                try:
                    self._housekeeping()
                    job = queue.claim(self.worker_id, caps, kinds, self.lease_seconds)
                    if job is not None:
                        self._run(job)
                    failures = 0
                except DatabaseError as exc:
                    # The database went away (a restart, a network blip): wait and reconnect. A job
                    # held meanwhile comes back through the reaper once its lease runs out.
                    failures += 1
                    pause = min(30.0, 0.5 * 2 ** min(failures, 6))
                    self.say(f"database error ({type(exc).__name__}: {exc}); retrying in {pause:.1f}s",
                             event="database_error")
                    connection.close()
                    waker.wait(pause, lambda: self.stopping)
                    continue
                if self.once:
                    break
                if job is None:
                    waker.wait(self.poll_interval, lambda: self.stopping)
        finally:
            waker.close()
            try:
                queue.worker_stopped(self.worker_id)
            except DatabaseError:
                pass
            self.say(f"worker {self.worker_id} stopped", event="stopped")
            connection.close()
        return 0

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= self.reap_seconds:
            self._last_reap = now
            report = queue.reap()
            for pk in report.requeued:
                self.say(f"job {pk}: its worker's lease expired; queued again", event="requeued", job=pk)
            for pk in report.failed:
                self.say(f"job {pk}: lease expired on its last attempt; failed", event="reaped_failed", job=pk)
            for pk in report.cancelled:
                self.say(f"job {pk}: cancelled (its worker is gone)", event="reaped_cancelled", job=pk)
        if now - self._last_seen >= 5.0:
            self._last_seen = now
            queue.worker_seen(self.worker_id)
        if Job.Needs.GPU not in self.capabilities.needs and now - self._last_gpu_check >= 30.0:
            self._report_gpu_waiting()

    def _report_gpu_waiting(self) -> None:
        """A worker without a GPU says when GPU work is queued that it cannot take (when the
        count changes), so an operator running only CPU workers sees why those jobs sit."""
        self._last_gpu_check = time.monotonic()
        waiting = queue.waiting_for_gpu()
        if waiting and waiting != self._gpu_waiting_reported:
            gpu_workers = sum(1 for w in queue.live_workers() if Job.Needs.GPU in w.capabilities)
            self.say(f"{waiting} queued job(s) need a GPU and wait for a GPU worker "
                     + (f"({gpu_workers} running)" if gpu_workers else
                        "(none is running: `manage.py gate_worker --gpu N` on a machine with one)"),
                     event="gpu_waiting", count=waiting, gpu_workers=gpu_workers)
        self._gpu_waiting_reported = waiting

    def _monitor(self, ctx: JobContext, done: threading.Event) -> None:
        """Beside the handler: heartbeat the lease, notice a cancel, enforce the shutdown deadline."""
        tick = min(0.25, self.heartbeat_seconds / 2)
        next_beat = time.monotonic() + self.heartbeat_seconds
        next_cancel = 0.0
        try:
            while not done.wait(tick):
                now = time.monotonic()
                if self._stop_at is not None and now >= self._stop_at:
                    ctx.abort("shutdown")
                    return
                try:
                    if now >= next_beat:
                        next_beat = now + self.heartbeat_seconds
                        if not queue.heartbeat(ctx.job.pk, self.worker_id, self.lease_seconds):
                            ctx.abort("lost")
                            return
                        if now - self._last_seen >= 5.0:
                            self._last_seen = now
                            queue.worker_seen(self.worker_id, ctx.job.pk)
                    if now >= next_cancel:
                        next_cancel = now + 0.5
                        if queue.cancel_requested(ctx.job.pk):
                            ctx.abort("cancel")
                            return
                except Exception as exc:  # a database hiccup: try again next tick; the lease has slack
                    self.say(f"job {ctx.job.pk}: monitor error {type(exc).__name__}: {exc}", event="monitor_error")
        finally:
            connection.close()  # this thread's own connection

    def _run(self, job: Job) -> None:
        started = time.monotonic()
        ctx = JobContext(job, self.worker_id, child_env=self.child_env, publish=self.publish)
        self.current = ctx
        self.say(f"job {job.pk} ({job.kind}) claimed, attempt {job.attempts} of {job.max_attempts}",
                 event="claimed", job=job.pk, attempt=job.attempts, waited_s=_waited(job))
        done = threading.Event()
        monitor = threading.Thread(target=self._monitor, args=(ctx, done), name=f"job-{job.pk}-monitor", daemon=True)
        monitor.start()
        outcome, value = "fail", ""
        try:
            handler = self.handlers.get(job.kind)
            if handler is None:
                raise JobError(f"this worker has no handler for {job.kind!r} jobs")
            value = handler(ctx)
            outcome = "complete"
        except JobAborted:
            outcome = "aborted"
        except JobError as exc:
            value = str(exc)
        except Exception as exc:
            value = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        finally:
            done.set()
            monitor.join()
            self.current = None
        seconds = round(time.monotonic() - started, 3)
        reason = ctx.abort_reason
        if outcome == "complete":
            stored = queue.complete(job.pk, self.worker_id, value, ctx.take_log(), ctx.detail)
            self.say(f"job {job.pk}: succeeded in {seconds}s" if stored else
                     f"job {job.pk}: finished in {seconds}s but no longer held by this worker; result dropped",
                     event="completed", job=job.pk, stored=stored, seconds=seconds)
        elif outcome == "fail":
            stored = queue.fail(job.pk, self.worker_id, value, ctx.take_log())
            self.say(f"job {job.pk}: failed in {seconds}s: {value.splitlines()[0] if value else ''}",
                     event="failed", job=job.pk, stored=stored, seconds=seconds)
        elif reason == "cancel":
            ctx.log(f"cancelled; stopped processes {ctx.killed_pids}")
            queue.mark_cancelled(job.pk, self.worker_id, ctx.take_log())
            self.say(f"job {job.pk}: cancelled after {seconds}s; stopped its processes {ctx.killed_pids}",
                     event="cancelled", job=job.pk, pids=ctx.killed_pids)
        elif reason == "shutdown":
            ctx.log("stopped for shutdown")
            queue.report_progress(job.pk, self.worker_id, job.progress, ctx.take_log())
            released = queue.release(job.pk, self.worker_id)
            self.say(f"job {job.pk}: stopped for shutdown and given back to the queue",
                     event="released", job=job.pk, released=released)
        else:
            self.say(f"job {job.pk}: lease lost (another worker may hold it now); abandoned",
                     event="lost", job=job.pk)


def _waited(job: Job) -> float | None:
    if job.started_at and job.created_at:
        return round((job.started_at - job.created_at).total_seconds(), 3)
    return None
