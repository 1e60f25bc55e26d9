"""`manage.py gate_worker` as real processes against real databases: compile-only gates with real
nvcc, pickup latency, a worker killed with SIGKILL mid-job, graceful SIGTERM, several workers."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gate_app import queue, submit
from gate_app.childproc import alive, kill_tree
from gate_app.models import Job
from job_kinds import ENV
from services import REPO, job_database, postgres_server, postgres_template, sqlite_template  # noqa: F401  (fixtures)
from shared_cache import PROBES, share
from threads import worker_environ

LEASE = "2"  # seconds: short, so a dead worker's job comes back quickly


pytestmark = pytest.mark.usefixtures("sleep_kind")  # tests/job_kinds.py


class WorkerProcess:
    def __init__(self, database, data_dir: Path, *args: str, env: dict[str, str] | None = None):
        # the run's environment before tests/threads.py pinned the thread pools: a GPU worker picks its jobs'
        # share of the cores itself unless OMP_NUM_THREADS was given (test_gpu_worker_takes_gpu_work_first_on_its_gpu)
        env = {**worker_environ(), "DATABASE_URL": database.url, "KLINEAGE_DATA_DIR": str(data_dir),
               **ENV, "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("REDIS_URL", None)
        # --skip-checks: Django's system checks import every view for the URL check, about 0.8 s of each of the
        # file's twenty starts before `ready`; a worker that runs them is started by
        # test_gpu_worker_without_a_gpu_refuses_to_start, tests/test_job_progress.py and `serve` (tests/test_serve.py)
        self.proc = subprocess.Popen([sys.executable, "manage.py", "gate_worker", "--skip-checks", "--json-log", *args],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                pass

    def output(self) -> str:
        return "\n".join(self.lines)

    def event(self, name: str, timeout_s: float = 30, **match) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in list(self.events):
                if event.get("event") == name and all(event.get(k) == v for k, v in match.items()):
                    return event
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no {name} event {match}; output:\n{self.output()}")

    def named(self, name: str) -> list[dict]:
        return [e for e in list(self.events) if e.get("event") == name]

    @property
    def worker_id(self) -> str:
        return self.event("ready")["worker"]

    def terminate(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.wait()


@pytest.fixture
def start_worker(job_database, tmp_path):
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(job_database, tmp_path / "data", *args, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.cleanup()


def _wait_job(job_id: int, until, timeout_s: float, what: str) -> Job:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = Job.objects.get(pk=job_id)
        if until(job):
            return job
        time.sleep(0.05)
    job = Job.objects.get(pk=job_id)
    raise AssertionError(f"job {job_id} not {what} after {timeout_s}s: {job.status}\n{job.log}")


def _finished(job_id: int, timeout_s: float = 60) -> Job:
    return _wait_job(job_id, lambda job: job.finished, timeout_s, "finished")


def _pids(job_id: int) -> tuple[int, int]:
    job = _wait_job(job_id, lambda job: "grandchild " in job.log, 30, "running its grandchild")
    return int(job.log.split("child process ")[1].split()[0]), int(job.log.split("grandchild ")[1].split()[0])


def _gone(pids, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory) -> Path:
    """The compile test's own nvcc builds: made by its first database's worker, reused by the other's (what
    nvcc makes of a kernel does not depend on the database the job sits in)."""
    return tmp_path_factory.mktemp("gate-worker-nvcc")


def test_compile_only_gate_jobs_with_real_nvcc(start_worker, tmp_path, shared_cache, nvcc_builds):
    gpu_job = submit.enqueue_gate("row_softmax", "row_softmax/naive", mode="gpu")
    # the problem's probe is the run's (tests/shared_cache.py); the compiles are this test's own, with nvcc
    cache = share(share(tmp_path / "data" / "cache", shared_cache, PROBES), nvcc_builds, ("compile",))
    worker = start_worker("--lease-seconds", "10", env={"KLINEAGE_CACHE_DIR": str(cache)})
    ready = worker.event("ready")
    has_gpu = "gpu" in ready["capabilities"]
    if not has_gpu:
        assert worker.event("gpu_waiting")["count"] == 1, "a worker without a GPU says which jobs wait for one"
    started = time.monotonic()
    kernels = ["row_softmax/naive", "row_softmax/warp_vec4"]
    jobs = [submit.enqueue_gate("row_softmax", kernel, mode="compile").pk for kernel in kernels]
    for job_id, kernel in zip(jobs, kernels):
        job = _finished(job_id, timeout_s=60)
        assert job.status == Job.Status.SUCCEEDED, job.error + job.log
        assert job.result["status"] == "compiled"
        assert job.result["kernel"]["name"] == kernel.replace("/", "_")
        assert job.result["compile"]["status"] == "ok"
        assert job.progress["fraction"] == 1.0
        assert "compile: nvcc" in job.log
    assert time.monotonic() - started < 60
    if not has_gpu:
        gpu_job.refresh_from_db()
        assert gpu_job.status == Job.Status.QUEUED
        assert queue.describe(gpu_job)["waiting"].startswith("waits for a GPU worker")
    assert worker.terminate() == 0


def test_pickup_latency_is_under_a_second(start_worker, record_property):
    worker = start_worker("--lease-seconds", LEASE)  # the default poll interval
    worker.event("ready")
    time.sleep(1.0)  # idle, as a worker waiting for work is
    latencies = []
    for _ in range(5):
        job = _finished(queue.enqueue("sleep", {"seconds": 0}).pk, timeout_s=20)
        assert job.status == Job.Status.SUCCEEDED
        latencies.append((job.started_at - job.created_at).total_seconds())
        time.sleep(0.3)
    record_property("pickup_latency_s", latencies)
    print(f"pickup latency (s): {[round(x, 3) for x in latencies]}")
    assert max(latencies) < 1.0, latencies
    assert worker.terminate() == 0


def test_a_worker_killed_mid_job_loses_nothing_and_duplicates_nothing(start_worker):
    first = start_worker("--lease-seconds", LEASE)
    first.event("ready")
    job_id = queue.enqueue("sleep", {"seconds": 2, "grandchild": True}).pk
    pids = _pids(job_id)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=10)
    # Its child notices the death of its parent and takes its grandchild with it.
    assert _gone(pids), f"processes {pids} outlived their killed worker"

    second = start_worker("--lease-seconds", LEASE)
    job = _finished(job_id, timeout_s=30)
    assert job.status == Job.Status.SUCCEEDED, job.log
    assert job.attempts == 2
    assert job.result["worker_id"] == second.worker_id
    assert second.event("requeued", job=job_id)
    assert f"lease of {first.worker_id} expired" in job.log
    assert second.terminate() == 0  # and every line it printed has been read
    stored = [e for w in (first, second) for e in w.named("completed") if e["job"] == job_id and e["stored"]]
    assert len(stored) == 1, "completed exactly once"


def test_sigterm_lets_the_current_job_finish(start_worker):
    worker = start_worker("--lease-seconds", LEASE, "--drain-seconds", "10")
    worker.event("ready")
    job_id = queue.enqueue("sleep", {"seconds": 1.5}).pk
    worker.event("claimed", job=job_id)
    assert worker.terminate(timeout_s=15) == 0
    job = Job.objects.get(pk=job_id)
    assert job.status == Job.Status.SUCCEEDED
    assert worker.event("stopped")


def test_sigterm_gives_a_long_job_back_without_counting_an_attempt(start_worker):
    worker = start_worker("--lease-seconds", LEASE, "--drain-seconds", "0.5")
    worker.event("ready")
    job_id = queue.enqueue("sleep", {"seconds": 120, "grandchild": True}).pk
    pids = _pids(job_id)
    stopped_at = time.monotonic()
    assert worker.terminate(timeout_s=15) == 0
    assert time.monotonic() - stopped_at < 10, "it did not wait for the job"
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts, job.worker_id) == (Job.Status.QUEUED, 0, "")
    assert "queued again" in job.log
    assert _gone(pids)
    assert worker.event("released", job=job_id)["released"] is True


def test_several_workers_share_the_queue_each_job_once(start_worker):
    workers = [start_worker("--lease-seconds", "10", "--poll-interval", "0.2") for _ in range(3)]
    for worker in workers:
        worker.event("ready")
    ids = [queue.enqueue("sleep", {"seconds": 0.05, "echo": n}).pk for n in range(12)]
    for job_id in ids:
        assert _finished(job_id, timeout_s=60).status == Job.Status.SUCCEEDED
    for worker in workers:
        assert worker.terminate() == 0
    stored = [e["job"] for w in workers for e in w.named("completed") if e["stored"]]
    assert sorted(stored) == sorted(ids)
    assert sum(1 for w in workers if w.named("completed")) > 1, "the work was shared"


def test_gpu_worker_takes_gpu_work_first_on_its_gpu(start_worker):
    # KLINEAGE_GPU_NAME stands in for nvidia-smi, so this runs on machines without a GPU too.
    cpu_job = queue.enqueue("sleep", {"seconds": 0}).pk
    gpu_job = queue.enqueue("sleep", {"seconds": 0}, needs="gpu").pk
    worker = start_worker("--gpu", "3", "--lease-seconds", LEASE, env={"KLINEAGE_GPU_NAME": "Test GPU"})
    assert worker.event("ready")["capabilities"] == ["gpu", "cpu"]
    first, second = _finished(gpu_job), _finished(cpu_job)
    assert first.status == second.status == Job.Status.SUCCEEDED
    assert first.started_at < second.started_at, "GPU work first"
    assert first.result["cuda_visible_devices"] == "3", "the job's process sees only the worker's GPU"
    assert 1 <= int(first.result["omp_num_threads"]) <= os.cpu_count(), "CPU threads shared among the GPUs"
    assert first.result["sees_database_url"] is False, "the job's process gets none of the web server's secrets"
    assert worker.terminate() == 0


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="this machine has a GPU")
@pytest.mark.parametrize("job_database", ["sqlite"], indirect=True)  # refused before the database is touched
def test_gpu_worker_without_a_gpu_refuses_to_start(job_database, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KLINEAGE_GPU_NAME", "REDIS_URL")}
    done = subprocess.run([sys.executable, "manage.py", "gate_worker", "--gpu", "0"], cwd=REPO, timeout=60,
                          env={**env, "DATABASE_URL": job_database.url, "KLINEAGE_DATA_DIR": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "--gpu 0: no GPU here" in done.stderr
