"""The job queue under load: many compile-only gate jobs through several `manage.py gate_worker`
processes on one machine, on SQLite and on PostgreSQL. Counts jobs lost (never succeeded) and
duplicated (a result stored more than once), and measures throughput.

    python bench/jobs_load.py                      # SQLite and, where installed, PostgreSQL
    python bench/jobs_load.py --database sqlite --jobs 200 --no-chaos

Each database gets two runs:
- steady: --jobs jobs (default 1000) through --workers workers (default 4);
- kill-9: --chaos-jobs jobs (default 300); once a third are done one worker is killed with
  SIGKILL mid-job and a replacement started; the reaper must give its job to another worker.

The jobs alternate between the bundled row_softmax kernels. The compile and verdict caches are
warmed first, so after the first compile a job costs what the queue and the job's child process
cost, which is what this measures. PostgreSQL is a throw-away cluster (tests/services.py), or
--postgres-url. Writes bench/results/jobs.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "klineage_web.settings")

from worker_pool import Worker  # noqa: E402

KERNELS = ["row_softmax/naive", "row_softmax/warp_vec4"]
PROBLEM = "row_softmax"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 4)


def warm_caches(env: dict[str, str]) -> None:
    for kernel in KERNELS:
        done = subprocess.run([sys.executable, "-m", "klineage", "gate", PROBLEM, kernel, "--compile-only", "--json"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"warming {kernel} failed: {done.stderr[-2000:]}")


def run_once(database, *, scenario: str, jobs: int, workers: int, lease: float, data_dir: Path,
             cache_dir: Path, timeout_s: float) -> dict:
    from django.db import connection, transaction

    import services
    from gate_app import submit
    from gate_app.models import Job

    services.migrate(database.config)
    env = {**os.environ, "DATABASE_URL": database.url, "KLINEAGE_DATA_DIR": str(data_dir),
           "KLINEAGE_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    with services.use_database(database.config):
        pool = [Worker(f"{scenario}-w{n}", env, lease) for n in range(workers)]
        try:
            for worker in pool:
                worker.wait_ready()
            load_before = os.getloadavg()[0]
            clock = time.monotonic()
            with transaction.atomic():  # one commit: every job is there when the clock starts
                ids = [submit.enqueue_gate(PROBLEM, KERNELS[n % len(KERNELS)], mode="compile", max_attempts=3).pk
                       for n in range(jobs)]
            enqueue_s = time.monotonic() - clock
            killed = None
            deadline = clock + timeout_s
            while time.monotonic() < deadline:
                finished = Job.objects.filter(pk__in=ids, status__in=Job.TERMINAL).count()
                if finished == jobs:
                    break
                if scenario == "kill-9" and killed is None and finished >= jobs // 3:
                    # Kill a worker that is in the middle of a job, then replace it.
                    victim = next((w for w in pool if Job.objects.filter(status=Job.Status.RUNNING,
                                                                          worker_id=w.name).exists()), pool[0])
                    held = list(Job.objects.filter(status=Job.Status.RUNNING, worker_id=victim.name)
                                .values_list("pk", flat=True))
                    victim.proc.send_signal(signal.SIGKILL)
                    victim.proc.wait()
                    killed = {"worker": victim.name, "held_jobs": held,
                              "at_s": round(time.monotonic() - clock, 2)}
                    pool.append(Worker(f"{scenario}-w{len(pool)}", env, lease))
                time.sleep(0.1)
            seconds = time.monotonic() - clock
            load_after = os.getloadavg()[0]
        finally:
            codes = [w.stop() for w in pool]
        rows = list(Job.objects.filter(pk__in=ids).values("pk", "status", "attempts", "created_at", "started_at",
                                                          "finished_at", "result", "error"))
        vendor_version = _database_version(connection)
    stored = Counter(e["job"] for w in pool for e in w.named("completed") if e.get("stored"))
    claimed = Counter(e["job"] for w in pool for e in w.named("claimed"))
    succeeded = [r for r in rows if r["status"] == "succeeded"]
    compiled = [r for r in succeeded if (r["result"] or {}).get("status") == "compiled"]
    run_s = [(r["finished_at"] - r["started_at"]).total_seconds() for r in succeeded]
    return {
        "database": database.vendor, "database_version": vendor_version, "scenario": scenario, "jobs": jobs,
        "workers": workers, "lease_seconds": lease,
        "seconds": round(seconds, 2), "throughput_jobs_per_s": round(len(succeeded) / seconds, 2),
        "enqueue_jobs_per_s": round(jobs / enqueue_s, 1),
        "succeeded": len(succeeded), "verdicts_compiled": len(compiled),
        "failed": sum(1 for r in rows if r["status"] == "failed"),
        "lost": jobs - len(succeeded),
        "duplicated": sum(1 for count in stored.values() if count > 1),
        "ran_twice": sum(1 for count in claimed.values() if count > 1),  # e.g. the killed worker's job
        "jobs_per_worker": dict(Counter(e["worker"] for w in pool for e in w.named("completed") if e.get("stored"))),
        "job_run_s_p50": percentile(run_s, 0.5), "job_run_s_p95": percentile(run_s, 0.95),
        "killed": killed, "worker_exit_codes": codes,
        # Other work on the machine slows the runs down: the 1-minute load average before and after.
        "load_average": [round(load_before, 2), round(load_after, 2)],
        "errors": sorted({r["error"][:200] for r in rows if r["error"]})[:5],
    }


def _database_version(connection) -> str:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            return "PostgreSQL " + cursor.fetchone()[0]
    return "SQLite " + sqlite3.sqlite_version


def provenance(databases: list[str], args) -> dict:
    from klineage.gate.pipeline import git_commit
    from klineage.toolchain import find_toolchain

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gate_app", "bench/jobs_load.py"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    return {
        "written_by": "bench/jobs_load.py", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "queue_code_modified": bool(dirty),
        "machine": {"host": platform.node(), "cpu": cpu, "cpus": os.cpu_count(), "os": platform.platform(),
                    "python": platform.python_version()},
        "toolchain": find_toolchain().key, "databases": databases,
        "workload": {"kind": "gate", "mode": "compile", "problem": PROBLEM, "kernels": KERNELS,
                     "caches": "compile and verdict caches warmed before the runs"},
        "arguments": {"jobs": args.jobs, "workers": args.workers, "chaos_jobs": args.chaos_jobs,
                      "lease_seconds": args.lease, "chaos_lease_seconds": args.chaos_lease},
        "headline": "top-level throughput is the first row's (steady run on the first database); "
                    "lost and duplicated are totals over all rows",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--postgres-url", help="an existing, empty PostgreSQL database (default: a throw-away cluster)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--chaos-jobs", type=int, default=300)
    parser.add_argument("--chaos-lease", type=float, default=3.0)
    parser.add_argument("--no-chaos", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed for one run")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "jobs.json")
    args = parser.parse_args()

    import django

    root = Path(tempfile.mkdtemp(prefix="klineage-jobs-load-"))
    os.environ["KLINEAGE_DATA_DIR"] = str(root / "data")
    django.setup()
    import services

    cache_dir = root / "cache"
    warm_env = {**os.environ, "KLINEAGE_CACHE_DIR": str(cache_dir)}
    warm_caches(warm_env)

    wanted = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    if "postgresql" in wanted and not args.postgres_url and services.postgres_bin_dir() is None:
        if args.database == "postgresql":
            raise SystemExit(services.PG_MISSING)
        print(f"skipping PostgreSQL: {services.PG_MISSING}", file=sys.stderr)
        wanted.remove("postgresql")
    rows = []
    server = None
    with ExitStack() as stack:
        for vendor in wanted:
            for scenario in ["steady"] + ([] if args.no_chaos else ["kill-9"]):
                if vendor == "sqlite":
                    database = services.database_for(f"sqlite:///{root / f'{scenario}.sqlite3'}")
                elif args.postgres_url:
                    database = services.database_for(args.postgres_url)
                else:
                    if server is None:
                        server = stack.enter_context(services.postgres_cluster())
                    name = f"jobs_{scenario.replace('-', '_')}"
                    server.create_database(name)
                    database = services.database_for(server.url(name))
                jobs = args.jobs if scenario == "steady" else args.chaos_jobs
                lease = args.lease if scenario == "steady" else args.chaos_lease
                print(f"{vendor} {scenario}: {jobs} jobs, {args.workers} workers ...", file=sys.stderr, flush=True)
                row = run_once(database, scenario=scenario, jobs=jobs, workers=args.workers, lease=lease,
                               data_dir=root / "data", cache_dir=cache_dir, timeout_s=args.timeout)
                print(f"  {row['seconds']}s, {row['throughput_jobs_per_s']} jobs/s, lost {row['lost']}, "
                      f"duplicated {row['duplicated']}, ran twice {row['ran_twice']}", file=sys.stderr, flush=True)
                rows.append(row)
    document = {
        "provenance": provenance([r["database_version"] for r in rows if r["scenario"] == "steady"], args),
        "rows": rows,
        "lost": sum(r["lost"] for r in rows),
        "duplicated": sum(r["duplicated"] for r in rows),
        "throughput_jobs_per_s": rows[0]["throughput_jobs_per_s"] if rows else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if document["lost"] == 0 and document["duplicated"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
