"""The context a job's handler runs in, and the worker's table of handlers (one per kind of
gate_app.kinds; those of the built-in kinds are in gate_app.work).

A handler never runs engine work in the worker's own process: it hands a payload to a child
(`python -m gate_app.child`) in a session of its own, reads its progress as it goes, and the
worker can stop the child's whole process tree at any moment (cancel, lost lease, shutdown).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from gate_app import kinds, queue
from gate_app import progress as progress_events
from gate_app.childproc import PARENT_ENV, kill_tree, wait_gone
from gate_app.models import Job

_LINE_LIMIT = 2000  # characters kept of one line of a child's stderr
_WRITE_EVERY_S = 0.5  # progress reaches the database at most this often (stage changes at once)
_WEB_SECRETS = ("DATABASE_URL", "REDIS_URL", "KLINEAGE_SECRET_KEY", "DJANGO_SETTINGS_MODULE")


class JobError(Exception):
    """The job cannot succeed: fail it with this message (no retry)."""


class JobAborted(Exception):
    """The worker stopped the job (cancel, lost lease or shutdown); the reason says which."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class JobContext:
    """What a handler gets: the job, progress reporting, and a child process the worker can kill."""

    def __init__(self, job: Job, worker_id: str, *, child_env: dict[str, str] | None = None,
                 publish: bool = True, stage_fractions: dict[str, float] | None = None):
        self.job = job
        self.params: dict[str, Any] = dict(job.params or {})
        self.worker_id = worker_id
        self.child_env = dict(child_env or {})
        self.publish = publish
        self.stage_fractions = dict(stage_fractions or {})
        self.abort_reason: str | None = None
        self.killed_pids: list[int] = []
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._progress: dict[str, Any] = {"fraction": 0.0, "stage": "", "message": ""}
        self.detail: dict[str, Any] = {}  # kept in the progress beside the stage: see set_detail
        self._pending_log = ""
        self._last_write = 0.0
        self._lost = False

    # Progress and log ---------------------------------------------------------------------

    def log(self, line: str) -> None:
        with self._lock:
            self._pending_log += queue.log_line(line[:_LINE_LIMIT])

    def progress(self, stage: str, message: str = "", fraction: float | None = None, log: bool = True) -> None:
        if fraction is None:
            fraction = self.stage_fractions.get(stage, self._progress["fraction"])
        changed = stage != self._progress["stage"]
        self._progress = {**self.detail, "fraction": round(max(self._progress["fraction"], min(1.0, fraction)), 3),
                          "stage": stage, "message": message[:500]}
        line = f"{stage}: {message}" if message else stage
        if log:
            self.log(line)
        if self.publish:
            progress_events.publish(self.job.pk, {"type": "progress", "job": self.job.pk,
                                                  "progress": dict(self._progress), "log": line if log else ""})
        if changed or time.monotonic() - self._last_write >= _WRITE_EVERY_S:
            self.flush()

    def set_detail(self, key: str, value: Any) -> None:
        """Keep `value` in the job's progress from the next progress() on, and in the finished job's
        too: what a page draws beyond the stage (an optimization's chart). Keep it small: every
        progress write and event carries it whole."""
        self.detail[key] = value

    def take_log(self) -> str:
        with self._lock:
            text, self._pending_log = self._pending_log, ""
        return text

    def flush(self) -> None:
        """Write progress and new log lines to the job row (only while this worker holds it)."""
        self._last_write = time.monotonic()
        if self._lost:
            return
        if not queue.report_progress(self.job.pk, self.worker_id, dict(self._progress), self.take_log()):
            self._lost = True
            self.abort("lost")

    # The child ----------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Stop the job's work now (from any thread): the child's whole process tree dies."""
        with self._lock:
            if self.abort_reason is None:
                self.abort_reason = reason
            child = self._child
        if child is not None and child.poll() is None:
            pids = kill_tree(child.pid)
            self.killed_pids.extend(pids)

    def run_child(self, payload: dict[str, Any], on_event: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """Run `payload` in `python -m gate_app.child`, by the runner of the job's kind; its result, or
        JobError / JobAborted. `on_event` gets each {"event": ...} the child sends (an optimization's attempts)."""
        payload = {**payload, "kind": self.job.kind}
        # The child runs engine code only: it never needs the web server's secrets.
        env = {k: v for k, v in os.environ.items() if k not in _WEB_SECRETS}
        env.update({**self.child_env, PARENT_ENV: str(os.getpid())})
        repo = str(settings.BASE_DIR)
        env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        with self._lock:
            if self.abort_reason is not None:
                raise JobAborted(self.abort_reason)
            child = subprocess.Popen([sys.executable, "-m", "gate_app.child"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo, env=env,
                                     start_new_session=True)
            self._child = child
        self.log(f"child process {child.pid} started")
        stderr_tail: list[str] = []

        def drain_stderr() -> None:
            assert child.stderr is not None
            for raw in child.stderr:
                text = raw.decode("utf-8", "replace").rstrip()
                if text:
                    stderr_tail.append(text)
                    del stderr_tail[:-40]
                    self.log(f"  {text}")

        reader = threading.Thread(target=drain_stderr, name=f"job-{self.job.pk}-stderr", daemon=True)
        reader.start()
        result: Any = None
        error: dict[str, Any] | None = None
        got_result = False
        try:
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(json.dumps(payload).encode())
                child.stdin.close()
            except BrokenPipeError:
                pass
            for raw in child.stdout:
                try:
                    message = json.loads(raw)
                except json.JSONDecodeError:
                    self.log(f"  {raw.decode('utf-8', 'replace').rstrip()}")
                    continue
                if "progress" in message:
                    step = message["progress"]
                    fraction = step.get("fraction")
                    self.progress(str(step.get("stage", "")), str(step.get("message", "")),
                                  float(fraction) if isinstance(fraction, (int, float)) else None)
                elif "event" in message:
                    if on_event is not None:
                        on_event(message["event"])
                elif "result" in message:
                    result, got_result = message["result"], True
                elif "error" in message:
                    error = message
            code = child.wait()
        finally:
            if child.poll() is None:  # the worker itself is failing: leave nothing behind
                self.killed_pids.extend(kill_tree(child.pid))
                child.wait()
            reader.join(timeout=5)
            with self._lock:
                self._child = None
        if self.abort_reason is not None:
            wait_gone(self.killed_pids, timeout_s=10)
            raise JobAborted(self.abort_reason)
        if error is not None:
            raise JobError(f"{error.get('type', 'error')}: {error.get('error', '')}")
        if not got_result:
            tail = "\n".join(stderr_tail[-10:])
            raise JobError(f"the job's process exited with code {code} and no result" + (f":\n{tail}" if tail else ""))
        self.log(f"child process {child.pid} finished")
        return result


def handlers() -> dict[str, Callable[[JobContext], Any]]:
    """Each kind's handler, by name; a job's parameters are checked against its kind's first."""
    return {name: functools.partial(_handle, kind) for name, kind in kinds.registry().items()}


def _handle(kind: kinds.JobKind, ctx: JobContext) -> Any:
    try:
        kind.check_keys(ctx.params)
    except kinds.KindError as exc:
        raise JobError(str(exc)) from None
    return kind.handle(ctx)
