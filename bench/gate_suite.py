"""The gate's GPU evidence, in one run on a GPU host:

- the bundled example problem through the gate, timed against its vendor path (and one kernel
  against the other), verdicts recorded for replay;
- the adversarial suite: every kernel must be rejected with its expected reason;
- the gate's own cost per candidate: cold and cached compile, cached verdict, GPU run.

    python bench/gate_suite.py --out bench/results

Writes `adversarial.json`, `gate_cost.json` and `example.json` under --out, and records verdicts
into the recorded store (KLINEAGE_RECORDED_DIR). Prints a short table at the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import config, corpus  # noqa: E402
from klineage.gate.cache import GateCache  # noqa: E402
from klineage.gate.compile import compile_kernel  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.policy import GatePolicy, Sanitize  # noqa: E402
from klineage.gate.verdict import Verdict  # noqa: E402

PROBLEM = "row_softmax"


def provenance(verdict: Verdict | None) -> dict:
    env = verdict.environment if verdict else {}
    return {"gpu": env.get("gpu", "unknown"), "driver": env.get("driver", "unknown"),
            "cuda": env.get("cuda_runtime", "unknown"), "torch": env.get("torch", "unknown"),
            "toolchain": env.get("toolchain", "unknown"), "git_commit": git_commit(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "written_by": "bench/gate_suite.py"}


def write(out: Path, name: str, verdict: Verdict | None, rows: list[dict], **extra) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {"provenance": provenance(verdict), **extra, "rows": rows}
    (out / name).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def kernel_ref(verdict: Verdict) -> dict:
    return {"name": verdict.kernel["name"], "fingerprint": verdict.kernel["fingerprint"]}


def example(cache: GateCache, problem: Path) -> tuple[list[dict], list[Verdict]]:
    rows, verdicts = [], []
    naive = corpus.kernel_entry("row_softmax/naive").load()
    for name, against in (("row_softmax/naive", None), ("row_softmax/warp_vec4", naive)):
        kernel = corpus.kernel_entry(name).load()
        started = time.monotonic()
        verdict = run_gate(problem, kernel, against=against, policy=GatePolicy(), cache=cache, record=True)
        seconds = time.monotonic() - started
        verdicts.append(verdict)
        ratios = verdict.profile.get("ratios", {})
        fractions = verdict.profile.get("roofline", {}).get("fraction", {})
        for vs, ratio in ratios.items():
            rows.append({"workload": PROBLEM, "kernel": kernel_ref(verdict), "vs": vs.removeprefix("vs_"),
                         "ratio": ratio["overall"], "ratio_trials": ratio["per_trial"],
                         "correct": verdict.passed, "status": verdict.status.value,
                         "reason": verdict.reason.value if verdict.reason else None,
                         "roofline_fraction": fractions.get("candidate"),
                         "median_us": verdict.profile["contenders"]["candidate"]["median_us"],
                         "case": verdict.profile.get("case"), "gate_seconds": seconds})
        if not ratios:
            rows.append({"workload": PROBLEM, "kernel": kernel_ref(verdict), "vs": None, "ratio": None,
                         "correct": verdict.passed, "status": verdict.status.value,
                         "reason": verdict.reason.value if verdict.reason else None,
                         "findings": [f.to_dict() for f in verdict.findings],
                         "error": verdict.environment.get("error", "")[:3000], "gate_seconds": seconds})
    return rows, verdicts


def adversarial(cache: GateCache, problem: Path, save=lambda rows, verdict: None) -> list[dict]:
    """Every adversarial kernel through the strict gate; `save` is called after each row so a
    run cut short by its time limit still leaves what it measured."""
    rows = []
    measured = None  # the last verdict that ran on the GPU: its environment is the file's provenance
    policy = GatePolicy(sanitize=Sanitize.ALWAYS)
    for entry in corpus.list_kernels(adversarial=True):
        expected = entry.expectation.get("reason")
        kernel = entry.load()
        started = time.monotonic()
        try:
            verdict = run_gate(problem, kernel, policy=policy, cache=cache, record=True)
        except Exception as exc:  # a harness failure is a row too: the runner must survive everything
            rows.append({"workload": PROBLEM, "kernel": {"name": kernel.name, "fingerprint": kernel.fingerprint},
                         "vs": "expectation", "ratio": None, "correct": False, "accepted": None,
                         "reason": None, "expected": expected, "matches": False,
                         "error": f"{type(exc).__name__}: {exc}"[:2000], "seconds": time.monotonic() - started})
            save(rows, measured)
            continue
        if verdict.environment.get("gpu"):
            measured = verdict
        reason = verdict.reason.value if verdict.reason else None
        rows.append({"workload": PROBLEM, "kernel": kernel_ref(verdict), "vs": "expectation", "ratio": None,
                     "correct": verdict.passed, "accepted": verdict.passed, "status": verdict.status.value,
                     "reason": reason, "expected": expected, "matches": reason == expected,
                     "all_reasons": [f.reason.value for f in verdict.findings],
                     "message": verdict.findings[0].message[:500] if verdict.findings else "",
                     "error": verdict.environment.get("error", "")[:2000],
                     "sanitizer": {tool: {k: r.get(k) for k in ("status", "errors", "seconds")}
                                   for tool, r in verdict.sanitizer.items()},
                     "seconds": time.monotonic() - started})
        save(rows, measured)
    return rows


def gate_cost(problem: Path) -> tuple[list[dict], Verdict | None]:
    """Cold and cached compile, cached verdict lookup and GPU run, on a fresh cache."""
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="klineage-cost-"))
    try:
        cache = GateCache(scratch, None)
        for name in ("row_softmax/naive", "row_softmax/warp_vec4"):
            kernel = corpus.kernel_entry(name).load()
            started = time.perf_counter()
            cold = compile_kernel(kernel, cache_dir=scratch)
            cold_s = time.perf_counter() - started
            started = time.perf_counter()
            warm = compile_kernel(kernel, cache_dir=scratch)
            warm_s = time.perf_counter() - started
            policy = GatePolicy(sanitize=Sanitize.NEVER)
            started = time.perf_counter()
            verdict = run_gate(problem, kernel, policy=policy, cache=cache)
            first_s = time.perf_counter() - started
            started = time.perf_counter()
            again = run_gate(problem, kernel, policy=policy, cache=cache)
            cached_s = time.perf_counter() - started
            rows.append({"workload": PROBLEM, "kernel": kernel_ref(verdict), "vs": None, "ratio": None,
                         "correct": verdict.passed, "cold_compile_s": cold_s, "cached_compile_s": warm_s,
                         "compile_was_cached": warm.cached and not cold.cached,
                         "full_gate_s": first_s, "gpu_run_s": verdict.timings.get("run"),
                         "stage_seconds": verdict.timings, "cached_verdict_s": cached_s,
                         "served_from": again.provenance.get("served_from")})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows, verdict


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--only", choices=["example", "adversarial", "cost"], action="append")
    args = parser.parse_args()
    out = Path(args.out)
    problem = corpus.problem_path(PROBLEM)
    cache = GateCache(config.cache_dir(), config.recorded_dir())
    parts = args.only or ["example", "adversarial", "cost"]
    summary = []
    verdict = None
    if "example" in parts:
        rows, verdicts = example(cache, problem)
        verdict = verdicts[-1]
        write(out, "example.json", verdict, rows)
        summary += [f"example  {r['kernel']['name']:<28} vs {str(r['vs']):<9} "
                    f"{format(r['ratio'], '.3f') + 'x' if r['ratio'] else '-':>8}  {r['status']}" for r in rows]
    if "adversarial" in parts:
        def save(rows: list[dict], measured: Verdict | None) -> None:
            write(out, "adversarial.json", measured, rows,
                  rejected=sum(1 for r in rows if r["accepted"] is False), total=len(rows),
                  matching_reason=sum(1 for r in rows if r["matches"]))

        rows = adversarial(cache, problem, save)
        summary += [f"advers.  {r['kernel']['name']:<28} {str(r['reason']):<22} expected {r['expected']:<20} "
                    f"{'OK' if r['matches'] else 'MISMATCH'}" for r in rows]
    if "cost" in parts:
        rows, measured = gate_cost(problem)
        write(out, "gate_cost.json", measured, rows)
        summary += [f"cost     {r['kernel']['name']:<28} cold {r['cold_compile_s']:.2f}s cached "
                    f"{r['cached_compile_s'] * 1000:.1f}ms verdict {r['cached_verdict_s'] * 1000:.1f}ms "
                    f"gpu {r['gpu_run_s'] or 0:.1f}s" for r in rows]
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
