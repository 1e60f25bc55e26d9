"""Gate workers across the GPUs of one host: one `gate_worker --gpu N` per GPU, PostgreSQL and Redis
on the host, a batch of real GPU gate jobs, and jobs per minute at 1, 2, ... N GPUs.

    python bench/multigpu.py                 # every GPU nvidia-smi lists; needs 2 or more
    python bench/multigpu.py --repeats 2     # a bigger batch

The batch: each bundled expert or baseline kernel below, gated on its problem under a few policies
(different seed counts, so every job has its own verdict key). Runs, in order:
- cold: N workers, empty compile cache: compilation competes with the GPUs for the CPU cores;
- warm 1..N: the compile cache kept, the verdict cache emptied before each run, so every job runs
  on its GPU again.
Per run: jobs per minute (from the first claim to the last finish), each GPU's busy share (time
a job held it, and nvidia-smi's utilization sampled every second), the most compute processes seen
on one GPU at once, jobs that ran more than once. Writes bench/results/multigpu.json.
PostgreSQL and Redis come from tests/services.py (binaries on PATH: initdb/postgres, redis-server).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

from worker_pool import Worker  # noqa: E402

# Kernels known to pass their problem's gate on the H200 (bench/logs), a mix of short and long jobs.
BATCH_KERNELS = [
    ("gemm", "gemm/mma_sync"), ("conv2d", "conv2d/implicit_gemm"), ("gemm", "gemm/mma_sync_any"),
    ("conv2d", "conv2d/implicit_gemm_any"), ("topk", "topk/radix_select"), ("row_softmax", "row_softmax/warp_vec4"),
    ("row_softmax", "row_softmax/naive"), ("topk", "topk/naive"),
]
# A shorter timing than the default gate's, so the batch fits a lent machine's time; still paired
# against the vendor path, and every case checked on `seeds` seeds.
BENCH_POLICY = {"trials": 2, "trial_seconds": 0.5, "sanitize": "never"}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def batch(repeats: int) -> list[tuple[str, str, dict]]:
    seeds = [1, 2, 3, 4][:max(1, min(4, repeats + 1))]
    return [(problem, kernel, {**BENCH_POLICY, "seeds": s}) for s in seeds for problem, kernel in BATCH_KERNELS]


def gpu_indices() -> list[str]:
    done = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=60)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


class GpuSampler:
    """nvidia-smi every `every_s`: utilization per GPU, and which compute processes each one runs."""

    def __init__(self, every_s: float = 1.0):
        self.every_s = every_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        bus = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout
        self.index_of_bus = {
            b.strip(): i.strip() for i, b in (line.split(",") for line in bus.splitlines() if "," in line)
        }

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic()
            util = self._query(["--query-gpu=index,utilization.gpu"])
            apps = self._query(["--query-compute-apps=gpu_bus_id,pid"])
            processes: dict[str, list[str]] = defaultdict(list)
            for bus, pid in apps:
                processes[self.index_of_bus.get(bus, bus)].append(pid)
            self.samples.append({"t": at, "util": {i: float(u) for i, u in util if u.replace(".", "").isdigit()},
                                 "processes": dict(processes)})
            self._stop.wait(max(0.0, self.every_s - (time.monotonic() - at)))

    @staticmethod
    def _query(args: list[str]) -> list[list[str]]:
        try:
            out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
        except subprocess.TimeoutExpired:
            return []
        return [[part.strip() for part in line.split(",")] for line in out.splitlines() if "," in line]

    def summary(self, start: float, end: float, gpus: list[str]) -> dict:
        window = [s for s in self.samples if start <= s["t"] <= end]
        return {
            "samples": len(window),
            "utilization_mean": {g: round(sum(s["util"].get(g, 0.0) for s in window) / max(1, len(window)) / 100, 3)
                                 for g in gpus},
            "max_processes_at_once": {g: max((len(s["processes"].get(g, [])) for s in window), default=0)
                                      for g in gpus},
            "distinct_processes": {g: len({p for s in window for p in s["processes"].get(g, [])}) for g in gpus},
        }


def _overlaps(intervals: list[tuple[float, float]]) -> int:
    ordered = sorted(intervals)
    return sum(1 for (_, end), (start, _) in zip(ordered, ordered[1:]) if start < end)


def run_batch(database, *, label: str, gpus: list[str], jobs: list[tuple[str, str, dict]], env: dict[str, str],
              sampler: GpuSampler, timeout_s: float) -> dict:
    from django.db import transaction

    import services
    from gate_app import submit
    from gate_app.models import Job

    with services.use_database(database.config):
        Job.objects.all().delete()
        pool = [Worker(f"{label}-gpu{g}", env, lease=30.0, placement=("--gpu", g)) for g in gpus]
        try:
            for worker in pool:
                worker.wait_ready(timeout_s=120)
            with transaction.atomic():  # every job is queued before any worker can claim one
                ids = [submit.enqueue_gate(problem, kernel, policy=policy, max_attempts=1).pk
                       for problem, kernel, policy in jobs]
            window = [time.monotonic(), time.monotonic() + timeout_s]
            while time.monotonic() < window[1]:
                if Job.objects.filter(pk__in=ids, status__in=Job.TERMINAL).count() == len(ids):
                    break
                time.sleep(0.2)
            window[1] = time.monotonic()
        finally:
            codes = [w.stop() for w in pool]
        rows = list(Job.objects.filter(pk__in=ids).values("pk", "status", "attempts", "worker_id", "started_at",
                                                          "finished_at", "result", "error", "params"))
    done = [r for r in rows if r["started_at"] and r["finished_at"]]
    if not done:
        raise RuntimeError(f"{label}: no job ran; errors: {[r['error'][:300] for r in rows][:3]}")
    first = min(r["started_at"] for r in done)
    last = max(r["finished_at"] for r in done)
    seconds = (last - first).total_seconds()
    per_gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in done:
        gpu = r["worker_id"].rsplit("gpu", 1)[-1]
        per_gpu[gpu].append(((r["started_at"] - first).total_seconds(), (r["finished_at"] - first).total_seconds()))
    succeeded = [r for r in rows if r["status"] == "succeeded"]
    verdicts = Counter((r["result"] or {}).get("status", "?") for r in succeeded)
    claimed = Counter(e["job"] for w in pool for e in w.named("claimed"))
    stored = Counter(e["job"] for w in pool for e in w.named("completed") if e.get("stored"))
    job_s = sorted(b - a for spans in per_gpu.values() for a, b in spans)
    # Outside the gate itself: the job's child process starting and importing, queue writes.
    outside = sorted((r["finished_at"] - r["started_at"]).total_seconds() -
                     sum(v for k, v in ((r["result"] or {}).get("timings") or {}).items() if "." not in k)
                     for r in succeeded)
    return {
        "label": label, "gpus": len(gpus), "jobs": len(rows), "succeeded": len(succeeded),
        "verdicts": dict(verdicts), "failed": [f"{r['params']['kernel']}: {r['error'][:200]}" for r in rows
                                               if r["status"] != "succeeded"],
        "seconds": round(seconds, 2), "jobs_per_min": round(60 * len(succeeded) / seconds, 2),
        "job_seconds_median": round(job_s[len(job_s) // 2], 2),
        "job_seconds_outside_gate_median": round(outside[len(outside) // 2], 2) if outside else None,
        "busy_share_by_jobs": {g: round(sum(b - a for a, b in spans) / seconds, 3) for g, spans in per_gpu.items()},
        "jobs_per_gpu": {g: len(spans) for g, spans in per_gpu.items()},
        "overlapping_jobs_on_one_gpu": sum(_overlaps(spans) for spans in per_gpu.values()),
        "ran_more_than_once": sum(1 for n in claimed.values() if n > 1) + sum(1 for r in rows if r["attempts"] > 1),
        "results_stored_twice": sum(1 for n in stored.values() if n > 1),
        "nvidia_smi": sampler.summary(*window, gpus),
        "worker_exit_codes": codes,
        "stage_seconds_median": _median_timings([(r["result"] or {}).get("timings") or {} for r in succeeded]),
    }


def _median_timings(timings: list[dict[str, float]]) -> dict[str, float]:
    """Where a job's time went: the median of each stage over the run's jobs."""
    names = sorted({name for t in timings for name in t})
    return {name: round(sorted(values)[len(values) // 2], 3)
            for name in names if (values := [t[name] for t in timings if name in t])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="policy variants per kernel, minus one (default 1)")
    parser.add_argument(
        "--no-cold",
        action="store_true",
        help="skip the run with a cold compile cache (compile the batch first instead)",
    )
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds allowed for one run")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "multigpu.json")
    args = parser.parse_args()
    gpus = gpu_indices()
    if len(gpus) < 2:
        raise SystemExit(f"need 2 or more GPUs, nvidia-smi lists {len(gpus)}")
    os.environ.update(NO_MULTICAST)
    root = Path(tempfile.mkdtemp(prefix="klineage-multigpu-"))
    cache = root / "cache"
    empty_recorded = root / "recorded"  # no committed verdict may answer a job
    empty_recorded.mkdir()
    os.environ.update({"KLINEAGE_DATA_DIR": str(root / "data"), "KLINEAGE_CACHE_DIR": str(cache),
                       "KLINEAGE_RECORDED_DIR": str(empty_recorded)})
    import django

    django.setup()
    import services

    jobs = batch(args.repeats)
    rows = []
    with services.postgres_cluster() as server, services.redis_server() as redis_url:
        server.create_database("multigpu")
        database = services.database_for(server.url("multigpu"))
        services.migrate(database.config)
        versions = service_versions(server, redis_url)
        env = {**os.environ, "DATABASE_URL": database.url, "REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
        if args.no_cold:
            warm_compile_cache(jobs, env)
        plan = ([] if args.no_cold else [("cold", gpus)]) + [(f"warm-{n}", gpus[:n]) for n in range(1, len(gpus) + 1)]
        with GpuSampler() as sampler:
            for label, chosen in plan:
                shutil.rmtree(cache / "verdicts", ignore_errors=True)
                print(f"{label}: {len(jobs)} jobs on GPUs {','.join(chosen)} ...", file=sys.stderr, flush=True)
                row = run_batch(database, label=label, gpus=chosen, jobs=jobs, env=env, sampler=sampler,
                                timeout_s=args.timeout)
                row["compile_cache"] = "cold" if label == "cold" else "warm"
                print(f"  {row['seconds']} s, {row['jobs_per_min']} jobs/min, busy {row['busy_share_by_jobs']}, "
                      f"failed {len(row['failed'])}, overlaps {row['overlapping_jobs_on_one_gpu']}, "
                      f"ran twice {row['ran_more_than_once']}", file=sys.stderr, flush=True)
                print(f"  per job (median s): {row['job_seconds_median']} in all, "
                      f"{row['job_seconds_outside_gate_median']} outside the gate, stages "
                      f"{json.dumps(row['stage_seconds_median'])}", file=sys.stderr, flush=True)
                rows.append(row)
    one = next(r for r in rows if r["label"] == "warm-1")["jobs_per_min"]
    for row in rows:
        row["efficiency"] = round(row["jobs_per_min"] / (row["gpus"] * one), 3) if one else None
    document = {"provenance": provenance(len(gpus), jobs, versions), "rows": rows,
                "target": "warm efficiency at N GPUs >= 0.85"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"{'run':8} {'gpus':>4} {'jobs/min':>9} {'efficiency':>10} {'busy (jobs)':>24}", file=sys.stderr)
    for row in rows:
        print(f"{row['label']:8} {row['gpus']:>4} {row['jobs_per_min']:>9} {str(row['efficiency']):>10} "
              f"{json.dumps(row['busy_share_by_jobs']):>24}", file=sys.stderr)
    bad = any(
        r["failed"] or r["overlapping_jobs_on_one_gpu"] or r["ran_more_than_once"] or set(r["verdicts"]) != {"passed"}
        for r in rows
    )
    return 1 if bad else 0


def warm_compile_cache(jobs: list[tuple[str, str, dict]], env: dict[str, str]) -> None:
    """Compile every kernel of the batch once, so that the first timed run starts warm too."""
    for problem, kernel in sorted({(p, k) for p, k, _ in jobs}):
        done = subprocess.run([sys.executable, "-m", "klineage", "gate", problem, kernel, "--compile-only"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {kernel} failed: {done.stderr[-2000:]}")


def service_versions(server, redis_url: str) -> dict:
    import redis

    with server.admin() as conn:
        postgres = conn.execute("SHOW server_version").fetchone()[0]
    client = redis.Redis.from_url(redis_url)
    try:
        return {"postgresql": postgres, "redis": client.info("server")["redis_version"]}
    finally:
        client.close()


def provenance(gpu_count: int, jobs: list, versions: dict) -> dict:
    from klineage.gate.pipeline import git_commit
    from klineage.toolchain import find_toolchain

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.splitlines()
    return {"written_by": "bench/multigpu.py", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "gpus": smi, "gpu_count": gpu_count, "cpus": os.cpu_count(),
            "host": platform.platform(), "python": platform.python_version(), "toolchain": find_toolchain().key,
            "services": versions, "batch": [{"problem": p, "kernel": k, "policy": pol} for p, k, pol in jobs]}


if __name__ == "__main__":
    sys.exit(main())
