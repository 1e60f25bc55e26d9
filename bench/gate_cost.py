"""What a gate costs per candidate, cold runner against warm runner (issue 29), on a GPU host.

For each workload, its candidates are gated one after another with an empty verdict cache each
(nothing is served): first each in a cold runner (a new runner process per gate, as today), then all
through one warm runner (klineage.gate.warm), under two policies: a walk state's (untimed) and a
timed gate against the vendor (where GDN's vendor builds its Triton kernels: once per runner).

    python bench/gate_cost.py --out PART.json [--workloads row_softmax,gemm,gdn]
    python bench/gate_cost.py --merge PART.json... --into bench/results/gate_cost.json   # no GPU

Rows: {workload, candidate, policy, runner, seconds, status, same_as_cold, phases}; `summary` per
workload and policy: the mean seconds per candidate cold; warm, its first candidate (which starts the
runner: torch, the problem, and for GDN FLA's Triton build) and the rest (steady), each over cold;
whether the warm verdicts agree with the cold ones. `--merge` joins parts measured in separate
calls into the `warm_runner` entry of the gate suite's gate_cost.json (its other entries kept).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import config, corpus  # noqa: E402
from klineage.gate.cache import GateCache  # noqa: E402
from klineage.gate.compile import compile_kernel  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.policy import GatePolicy, Sanitize  # noqa: E402
from klineage.gate.verdict import GATE_VERSION, Verdict  # noqa: E402
from klineage.gate.warm import WarmRunner  # noqa: E402

WORKLOADS = {
    "row_softmax": ["row_softmax/naive", "row_softmax/warp_vec4", "row_softmax/naive"],
    "gemm": ["gemm/naive", "gemm/mma_sync", "gemm/naive"],
    # two: a cold GDN gate against the vendor spends about 100 s building FLA's Triton kernels
    "gdn": ["gdn/recurrent", "gdn/chunked"],
}
POLICIES = {"state": GatePolicy(seeds=3, timing=False, sanitize=Sanitize.NEVER),
            "timed": GatePolicy(seeds=1, sanitize=Sanitize.NEVER)}


def judged(verdict: Verdict) -> tuple:
    """What must agree between the cold and the warm verdict of one candidate."""
    return (verdict.status.value, [(f.reason.value, f.case) for f in verdict.findings],
            [(r["case"], r["kernel"], r["passed"]) for r in verdict.correctness])


def gate(problem: Path, name: str, policy: GatePolicy, scratch: Path,
         runner: WarmRunner | None) -> tuple[Verdict, float]:
    started = time.monotonic()
    cache = GateCache(Path(tempfile.mkdtemp(dir=scratch)), None)
    verdict = run_gate(problem, corpus.kernel_entry(name).load(), policy=policy, cache=cache, runner=runner)
    return verdict, time.monotonic() - started


def measure(workload: str, policy_name: str, scratch: Path) -> list[dict[str, Any]]:
    problem = Path(corpus.problem_path(workload))
    policy = POLICIES[policy_name]
    for name in set(WORKLOADS[workload]):  # compiled before either runner is timed: both find the cubins cached
        compile_kernel(corpus.kernel_entry(name).load(), cache_dir=config.cache_dir())
    rows, cold = [], {}
    for index, name in enumerate(WORKLOADS[workload]):
        verdict, seconds = gate(problem, name, policy, scratch, None)
        cold[index] = judged(verdict)
        rows.append(row(workload, name, policy_name, "cold", verdict, seconds, True))
    with WarmRunner(problem) as runner:
        for index, name in enumerate(WORKLOADS[workload]):
            verdict, seconds = gate(problem, name, policy, scratch, runner)
            rows.append(row(workload, name, policy_name, "warm", verdict, seconds, judged(verdict) == cold[index]))
        for r in rows[-len(WORKLOADS[workload]):]:
            r["warm_runners_started"] = runner.started
    return rows


def row(workload: str, name: str, policy: str, runner: str, verdict: Verdict, seconds: float,
        same: bool) -> dict[str, Any]:
    line = {"workload": workload, "candidate": name, "policy": policy, "runner": runner, "seconds": round(seconds, 2),
            "status": verdict.describe(200), "same_as_cold": same,
            "phases": {k: round(v, 2) for k, v in verdict.timings.items()}, "gpu": verdict.environment.get("gpu")}
    print(json.dumps({k: line[k] for k in ("workload", "candidate", "policy", "runner", "seconds", "status")}),
          flush=True)
    return line


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per workload and policy: mean seconds per candidate cold, the warm runner's first candidate
    (its start counted there) and its later ones (steady), each over cold; a warm stream cut short
    (by a stage's time limit) says how many of its candidates ran."""
    out = []
    for workload, policy in sorted({(r["workload"], r["policy"]) for r in rows}):
        mine = [r for r in rows if r["workload"] == workload and r["policy"] == policy]
        cold = [r["seconds"] for r in mine if r["runner"] == "cold"]
        warm = [r["seconds"] for r in mine if r["runner"] == "warm"]
        mean_cold = statistics.mean(cold)
        steady = statistics.mean(warm[1:]) if len(warm) > 1 else None
        out.append({"workload": workload, "policy": policy, "cold_candidates": len(cold),
                    "warm_candidates": len(warm), "cold_s": round(mean_cold, 2),
                    "warm_first_s": round(warm[0], 2) if warm else None,
                    "warm_steady_s": round(steady, 2) if steady is not None else None,
                    "steady_over_cold": round(steady / mean_cold, 3) if steady is not None else None,
                    "warm_over_cold": round(statistics.mean(warm) / mean_cold, 3) if warm else None,
                    "complete": len(warm) == len(cold),
                    "verdicts_agree": all(r["same_as_cold"] for r in mine)})
    return out


def merge(parts: list[Path], into: Path) -> int:
    """Join parts measured in separate device calls into `into`'s `warm_runner` entry. A later part's
    rows replace an earlier part's of the same workload and policy (a re-measurement on newer code);
    the earlier part stays in the provenance, marked with what was replaced."""
    documents = [json.loads(p.read_text(encoding="utf-8")) for p in parts]
    latest = {(r["workload"], r["policy"]): i for i, d in enumerate(documents) for r in d["rows"]}
    rows = [r for i, d in enumerate(documents) for r in d["rows"] if latest[(r["workload"], r["policy"])] == i]
    for i, d in enumerate(documents):
        replaced = sorted({f"{w} {p}" for w, p in ((r["workload"], r["policy"]) for r in d["rows"])
                           if latest[(w, p)] != i})
        if replaced:
            d["provenance"] = {**d["provenance"], "replaced_by_later_parts": replaced}
    target = json.loads(into.read_text(encoding="utf-8")) if into.is_file() else {}
    target["warm_runner"] = {"provenance": {"parts": [{"file": p.name, **d["provenance"]}
                                                      for p, d in zip(parts, documents)]},
                             "summary": summary(rows), "rows": rows}
    into.write_text(json.dumps(target, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(target["warm_runner"]["summary"], indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--merge", type=Path, nargs="+", help="parts written by --out, joined; no GPU")
    parser.add_argument("--into", type=Path, default=Path("bench/results/gate_cost.json"))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.into)
    if args.out is None:
        parser.error("--out (measure) or --merge (join parts)")
    scratch = Path(tempfile.mkdtemp(prefix="gate-cost-"))
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    rows: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        for policy in args.policies.split(","):
            rows += measure(workload, policy, scratch)
            document = {"provenance": {"git_commit": git_commit(), "gate_version": GATE_VERSION, "started": started,
                                       "gpu": next((r["gpu"] for r in rows if r["gpu"]), "unknown"),
                                       "policies": {k: p.to_dict() for k, p in POLICIES.items()},
                                       "note": "each gate with an empty verdict cache; compile cache shared"},
                        "summary": summary(rows), "rows": rows}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")  # after every part
    print(json.dumps(summary(rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
