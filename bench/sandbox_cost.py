"""What the sandbox (bubblewrap, its cgroup, the staged problem) adds to the processes it holds.

    python bench/sandbox_cost.py [--repeats N] [--gpu] [--out bench/results/sandbox_cost.json]

Times, with and without the sandbox (KLINEAGE_UNSAFE_NO_SANDBOX=1), interleaved so that the machine's
load drifts over both alike:
- `bwrap true`: an empty sandbox's start and end against starting `true` directly;
- `probe`: the runner's start, probing the bundled row_softmax problem (uncached);
- with --gpu: a whole gate call, `--gate gpu` of row_softmax/naive with the sanitizer off, each call in a
  fresh cache (probe, compile and GPU run: every sandboxed process of a gate), and one gate with the
  sanitizers on, under the sandbox, to show compute-sanitizer works inside it.
Writes median, min, max and interquartile range per row, the median difference, and that difference as
a share of the unsandboxed median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import config, corpus  # noqa: E402
from klineage.gate import execute  # noqa: E402
from klineage.gate.jail import Access, Jail  # noqa: E402
from klineage.gate.pipeline import git_commit  # noqa: E402

MODES = {"bubblewrap": "0", "none": "1"}  # KLINEAGE_UNSAFE_NO_SANDBOX for each


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def empty_sandbox() -> None:
    with tempfile.TemporaryDirectory() as work:
        argv, env, _ = Jail(Access.CPU, Path(work)).command(["true"], {"PATH": "/usr/bin:/bin"})
        subprocess.run(argv, env=env, check=True)


def probe() -> None:
    execute.probe_problem(corpus.problem_path("row_softmax"))  # no cache: the runner starts every time


def gpu_gate(sanitize: str = "never") -> dict:
    from klineage.gate.cache import GateCache
    from klineage.gate.pipeline import run_gate
    from klineage.gate.policy import GatePolicy, Sanitize

    with tempfile.TemporaryDirectory() as cache:
        os.environ["KLINEAGE_CACHE_DIR"] = cache  # a cold probe and compile each call
        kernel = corpus.kernel_entry("row_softmax/naive").load()
        verdict = run_gate(corpus.problem_path("row_softmax"), kernel, policy=GatePolicy(sanitize=Sanitize(sanitize)),
                           cache=GateCache(None, None))
    return {"status": verdict.status.value, "timings": verdict.timings, "sanitizer": verdict.sanitizer,
            "environment": verdict.environment}


def interleaved(name: str, action: Callable[[], object], repeats: int) -> list[dict]:
    """`repeats` timings per mode, alternating modes; one untimed call per mode first (imports, caches)."""
    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(repeats + 1):
        for mode, unsafe in MODES.items():
            os.environ[config.UNSAFE_NO_SANDBOX] = unsafe
            seconds = timed(action)
            if round_:
                samples[mode].append(round(seconds, 4))
    os.environ.pop(config.UNSAFE_NO_SANDBOX, None)
    rows = [{"what": name, "sandbox": mode, "unit": "s", "samples": s, **summary(s)} for mode, s in samples.items()]
    added = rows[0]["median"] - rows[1]["median"]
    rows[0]["added_median_s"] = round(added, 4)
    rows[0]["added_share_of_unsandboxed"] = round(added / rows[1]["median"], 4) if rows[1]["median"] else None
    for row in rows:
        print(f"{name:28s} {row['sandbox']:10s} median {row['median']:8.3f} s  "
              f"[{row['min']:.3f} .. {row['max']:.3f}]  IQR {row['iqr']:.3f}", flush=True)
    print(f"{'':28s} added {added:+.3f} s ({rows[0]['added_share_of_unsandboxed']:+.1%} of the unsandboxed median)")
    return rows


def summary(samples: list[float]) -> dict:
    quartiles = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"median": round(statistics.median(samples), 4), "min": min(samples), "max": max(samples),
            "iqr": round(quartiles[2] - quartiles[0], 4), "n": len(samples)}


def provenance(args: argparse.Namespace, isolation: tuple[str, ...], gpu: dict | None) -> dict:
    bwrap = config.bwrap_path()
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip() if bwrap else None
    return {"written_by": "bench/sandbox_cost.py", "git_commit": git_commit(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "host": platform.node(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg(), "bwrap": bwrap, "bwrap_version": version,
            "isolation": list(isolation), "repeats": args.repeats, "python": sys.version.split()[0],
            "gpu": (gpu or {}).get("environment", {}).get("gpu", "none")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gpu", action="store_true", help="also time whole --gate gpu calls (needs a GPU)")
    parser.add_argument("--out", type=Path, default=config.REPO_ROOT / "bench" / "results" / "sandbox_cost.json")
    args = parser.parse_args()
    os.environ.pop("KLINEAGE_CACHE_DIR", None)
    rows = interleaved("bwrap true", empty_sandbox, args.repeats * 4)
    rows += interleaved("probe row_softmax", probe, args.repeats)
    gpu = None
    if args.gpu:
        rows += interleaved("gate gpu row_softmax/naive", gpu_gate, args.repeats)
        os.environ[config.UNSAFE_NO_SANDBOX] = "0"
        gpu = gpu_gate("on_pass")  # the sanitizers inside the sandbox: memcheck and racecheck must report
        print(f"sanitized gate under the sandbox: {gpu['status']}, sanitizer {json.dumps(gpu['sanitizer'])[:600]}")
    with tempfile.TemporaryDirectory() as work:  # the limits that applied on this host, in words
        from klineage.gate import sandbox

        isolation = sandbox.run(["true"], cwd=Path(work), timeout_s=30, env={"PATH": "/usr/bin:/bin"},
                                jail=Jail(Access.CPU, Path(work))).isolation
    document = {"provenance": provenance(args, isolation, gpu), "rows": rows,
                "sanitized_gate": {k: v for k, v in (gpu or {}).items() if k != "environment"} or None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
