"""What each kind of job does, and the context a handler runs in.

A handler never runs engine work in the worker's own process: it hands a payload to a child
(`python -m gate_app.child`) in a session of its own, reads its progress as it goes, and the
worker can stop the child's whole process tree at any moment (cancel, lost lease, shutdown).

`gate`, `walk`, `optimize` and `probe` have handlers; a walk's lineage, an optimization's result and
an uploaded problem's probe are stored in the database by the worker itself, once its child has
produced them. The test-only
`sleep` kind exists only when KLINEAGE_JOB_TEST_HANDLERS is on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from gate_app import progress as progress_events
from gate_app import queue
from gate_app.childproc import PARENT_ENV, kill_tree, wait_gone
from gate_app.models import Job

TEST_KINDS = ("sleep",)
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


def test_handlers_enabled() -> bool:
    return bool(getattr(settings, "KLINEAGE_JOB_TEST_HANDLERS", False))


def known_kinds() -> set[str]:
    return set(Job.Kind.values) | (set(TEST_KINDS) if test_handlers_enabled() else set())


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
        """Run `payload` in `python -m gate_app.child`; its result, or JobError / JobAborted.
        `on_event` gets each {"event": ...} the child sends (an optimization's attempts)."""
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


# Gate -----------------------------------------------------------------------------------------

GATE_MODES = ("gpu", "replay", "compile")
GATE_STAGES = {"probe": 0.05, "static": 0.1, "compile": 0.2, "features": 0.4, "run": 0.5, "sanitize": 0.85,
               "done": 1.0}
_GATE_KEYS = {"problem", "kernel", "against", "mode", "cases", "policy", "record"}


def gate_needs(mode: str) -> str:
    """Compile-only and replayed gates run anywhere; only a real run needs a GPU."""
    return Job.Needs.GPU if mode == "gpu" else Job.Needs.CPU


def gate_params(problem: str, kernel: str, *, against: str | None = None, mode: str = "gpu",
                cases: list[str] | None = None, policy: dict[str, Any] | None = None,
                record: bool = False) -> dict[str, Any]:
    """Checked parameters of a gate job: bundled corpus names or uploaded ones (`uploaded/<name>`,
    checked against the database here, resolved from the data dir in the child), a known mode, a
    valid policy."""
    from gate_app import uploads
    from klineage import corpus
    from klineage.errors import KLineageError
    from klineage.gate.policy import GatePolicy
    from klineage.uploads import is_uploaded

    if mode not in GATE_MODES:
        raise queue.QueueError(f"mode must be one of {GATE_MODES}, not {mode!r}")
    try:
        if is_uploaded(problem):
            uploads.check_problem(problem)
        else:
            corpus.problem_path(problem)
        for name in filter(None, (kernel, against)):
            if is_uploaded(name):
                uploads.kernel_problem(name)
            else:
                corpus.kernel_entry(name)
        GatePolicy.from_dict(policy or {})
    except KLineageError as exc:
        raise queue.QueueError(str(exc)) from None
    if cases is not None and (not isinstance(cases, list) or not all(isinstance(c, str) for c in cases)):
        raise queue.QueueError("cases must be a list of case names")
    params: dict[str, Any] = {"problem": problem, "kernel": kernel, "mode": mode}
    if against:
        params["against"] = against
    if cases:
        params["cases"] = cases
    if policy:
        params["policy"] = policy
    if record:
        params["record"] = True
    return params


def enqueue_gate(problem: str, kernel: str, *, against: str | None = None, mode: str = "gpu",
                 cases: list[str] | None = None, policy: dict[str, Any] | None = None, record: bool = False,
                 owner=None, idempotency_key: str | None = None, max_attempts: int = 3) -> Job:
    params = gate_params(problem, kernel, against=against, mode=mode, cases=cases, policy=policy, record=record)
    return queue.enqueue(Job.Kind.GATE, params, owner=owner, needs=gate_needs(mode),
                         idempotency_key=idempotency_key, max_attempts=max_attempts)


def run_gate_job(ctx: JobContext) -> dict[str, Any]:
    """Judge a kernel on a problem (bundled or uploaded); the result is the verdict's dictionary."""
    params = ctx.params
    unknown = set(params) - _GATE_KEYS
    if unknown:
        raise JobError(f"unknown gate parameters: {sorted(unknown)}")
    if params.get("mode", "gpu") not in GATE_MODES:
        raise JobError(f"unknown gate mode {params.get('mode')!r}")
    ctx.stage_fractions = GATE_STAGES
    ctx.progress("start", f"{params.get('kernel')} on {params.get('problem')} ({params.get('mode', 'gpu')})", 0.01)
    return ctx.run_child({"kind": "gate", **params})


def run_sleep_job(ctx: JobContext) -> dict[str, Any]:
    """Test only: a child that sleeps, optionally beside a grandchild in its own session."""
    keys = ("seconds", "steps", "grandchild", "fail", "echo")
    result = ctx.run_child({"kind": "sleep", **{k: ctx.params[k] for k in keys if k in ctx.params}})
    return {**result, "worker_id": ctx.worker_id}


def handlers() -> dict[str, Callable[[JobContext], Any]]:
    from gate_app.work import run_optimize_job, run_probe_job, run_walk_job

    found: dict[str, Callable[[JobContext], Any]] = {Job.Kind.GATE.value: run_gate_job,
                                                     Job.Kind.WALK.value: run_walk_job,
                                                     Job.Kind.OPTIMIZE.value: run_optimize_job,
                                                     Job.Kind.PROBE.value: run_probe_job}
    if test_handlers_enabled():
        found["sleep"] = run_sleep_job
    return found
