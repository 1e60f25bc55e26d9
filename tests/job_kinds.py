"""The test-only `sleep` job kind: a child that sleeps in steps, optionally beside a grandchild in a session
of its own (as the engine's sandboxed runner is), so the tests of the queue, the worker and their
supervision can start, watch, cancel and kill real processes in seconds.

It joins the registry (gate_app.kinds) wherever KLINEAGE_JOB_KINDS_MODULE names this module (ENV): a test
sets it in its own process, and the workers it starts (and their jobs' children) inherit it. No pytest
here: those processes import this module too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from gate_app.kinds import MODULE_ENV, Device, JobKind

MODULE = "tests.job_kinds"  # importable from the repository root, where workers and job children run
SLEEP_KEYS = frozenset({"seconds", "steps", "grandchild", "fail", "echo"})


def run_sleep_job(ctx) -> dict[str, Any]:
    """The worker's side: the child's result, with the id of the worker that ran it."""
    return {**ctx.run_child(dict(ctx.params)), "worker_id": ctx.worker_id}


def run_sleep_payload(payload: dict[str, Any], channel) -> dict[str, Any]:
    """The child's side: sleeps `seconds` in `steps`, reporting each; fails with `fail` when given; says what
    it saw of its environment."""
    grandchild = None
    if payload.get("grandchild"):
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      start_new_session=True)
        channel.progress("spawned", f"grandchild {grandchild.pid}")
    seconds = float(payload.get("seconds", 1.0))
    steps = max(1, int(payload.get("steps", 4)))
    for step in range(steps):
        time.sleep(seconds / steps)
        channel.progress("sleep", f"step {step + 1} of {steps}", (step + 1) / steps)
    if grandchild is not None:
        grandchild.kill()
        grandchild.wait()
    if payload.get("fail"):
        raise RuntimeError(str(payload["fail"]))
    return {"slept": seconds, "pid": os.getpid(), "echo": payload.get("echo"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "sees_database_url": "DATABASE_URL" in os.environ}


KINDS = (JobKind("sleep", "sleep (tests only)", Device.CPU, handler=f"{__name__}:run_sleep_job",
                 runner=f"{__name__}:run_sleep_payload", optional=SLEEP_KEYS),)

ENV = {MODULE_ENV: MODULE}  # what a worker started by a test needs in its environment

