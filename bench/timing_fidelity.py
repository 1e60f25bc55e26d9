"""Can the gate's timing mislead? Two experiments on a GPU host (issue 29):

- repeated gates of a short-kernel expert against its vendor (row_softmax/warp_vec4 on the 10-us
  case mid_aligned by default), each a fresh runner process with an empty verdict cache; run this
  first after the machine starts, so the first gate meets cold clocks. Each must end within 5% of
  the settled ratio (the median of the settled runs) or say `unsettled`;
- the noisy vendor: the same expert against torch.softmax behind 0-2 ms of random host time per
  call, once capturable in a CUDA graph and once not (a host synchronisation first).

    python bench/timing_fidelity.py --out bench/results/timing_fidelity.json [--repeats 20] [--case mid_aligned]

Rows: {workload, kernel, vs, ratio, correct, settled} and the numbers behind them (trial ratios,
spreads, attempts, seconds); `summary` holds the settled ratio and how many runs met the criterion.
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

from klineage import corpus  # noqa: E402
from klineage.gate.cache import GateCache  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.policy import GatePolicy, Sanitize  # noqa: E402
from klineage.gate.timing import AGREEMENT_LIMIT, SPREAD_LIMIT  # noqa: E402
from klineage.gate.verdict import GATE_VERSION, Status, Verdict  # noqa: E402

EXPERT = "row_softmax/warp_vec4"
TOLERANCE = 0.05  # a settled run must land this close to the settled ratio

# Appended to a copy of the bundled row_softmax problem: its vendor then burns random host time.
NOISY_VENDOR = '''

import random as _random
import time as _time

HEADLINE = "{case}"
_quiet_vendor = vendor


def vendor(inputs: dict) -> dict:
    """torch.softmax, after burning 0-2 ms of host time: a host-bound library path, exaggerated.{note}"""
    {sync}_time.sleep(_random.uniform(0.0, 0.002))
    return _quiet_vendor(inputs)
'''
NOISY = {  # name -> (docstring note, first statement)
    "noisy_vendor": ("", ""),
    "noisy_vendor_uncapturable": (" Synchronises first: no CUDA graph can hold it.",
                                  "torch.cuda.synchronize() if inputs['x'].is_cuda else None\n    "),
}


def noisy_problem(folder: Path, name: str, case: str) -> Path:
    """A copy of the row_softmax problem whose vendor is the noisy one named (a key of NOISY), its
    headline `case`."""
    note, sync = NOISY[name]
    source = Path(corpus.problem_path("row_softmax")).read_text(encoding="utf-8")
    path = folder / f"{name}.py"
    path.write_text(source + NOISY_VENDOR.format(case=case, note=note, sync=sync), encoding="utf-8")
    return path


def rows_of(verdict: Verdict, workload: str, **extra: Any) -> list[dict[str, Any]]:
    """One row per ratio the verdict timed (one row saying so where it timed none)."""
    profile = verdict.profile
    settlement = profile.get("settlement") or {}
    base = {"workload": workload, "kernel": verdict.kernel["name"], "correct": verdict.status is Status.PASSED,
            "verdict_settlement": settlement.get("state"), "reasons": settlement.get("reasons", []),
            "attempts": [{"trials": a["trials"], "state": a["state"]} for a in settlement.get("attempts", [])],
            "spreads": settlement.get("spreads", {}), "vendor_launch": profile.get("vendor_launch"),
            "key": verdict.provenance.get("key"), **extra}
    ratios = profile.get("ratios") or {}
    if not ratios:
        return [{**base, "vs": None, "ratio": None, "settled": False, "status": verdict.describe(300)}]
    return [{**base, "vs": name.removeprefix("vs_"), "ratio": ratio["overall"], "per_trial": ratio["per_trial"],
             "settled": settlement.get("ratios", {}).get(name) == "settled" and settlement.get("state") == "settled"}
            for name, ratio in ratios.items()]


def summary(rows: list[dict[str, Any]], vs: str = "vendor") -> dict[str, Any]:
    """The settled ratio (median of the settled runs) and which runs met the criterion: within
    TOLERANCE of it, or unsettled. A settled run outside it is a confident wrong ratio."""
    mine = [r for r in rows if r["vs"] == vs]
    settled = [r["ratio"] for r in mine if r["settled"]]
    if not settled:
        return {"vs": vs, "runs": len(mine), "settled_runs": 0, "settled_ratio": None, "met": 0, "wrong": []}
    centre = statistics.median(settled)
    wrong = [i for i, r in enumerate(mine) if r["settled"] and abs(r["ratio"] / centre - 1) > TOLERANCE]
    return {"vs": vs, "runs": len(mine), "settled_runs": len(settled), "settled_ratio": centre,
            "met": len(mine) - len(wrong), "wrong": wrong, "tolerance": TOLERANCE}


def gate(problem: Path, policy: GatePolicy, cases: list[str], scratch: Path) -> tuple[Verdict, float]:
    """One gate in a fresh runner, with an empty verdict cache of its own (nothing is served)."""
    started = time.monotonic()
    cache = GateCache(Path(tempfile.mkdtemp(dir=scratch)), None)
    verdict = run_gate(problem, corpus.kernel_entry(EXPERT).load(), cases=cases, policy=policy, cache=cache)
    return verdict, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--case", default="mid_aligned", help="the timed case (row_softmax's)")
    args = parser.parse_args(argv)
    policy = GatePolicy(seeds=1, sanitize=Sanitize.NEVER, timing_case=args.case)
    cases = sorted({args.case, "small"})
    scratch = Path(tempfile.mkdtemp(prefix="timing-fidelity-"))
    rows: list[dict[str, Any]] = []
    measured: Verdict | None = None
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for run in range(args.repeats):  # first: the first gate after the machine started meets cold clocks
        verdict, seconds = gate(corpus.problem_path("row_softmax"), policy, cases, scratch)
        measured = verdict if verdict.environment.get("gpu") else measured
        rows += rows_of(verdict, f"row_softmax/{args.case}", run=run, seconds=round(seconds, 2))
        print(f"run {run}: {verdict.describe(200)}; " + ", ".join(
            f"vs {r['vs']} {r['ratio']:.3f} ({'settled' if r['settled'] else 'unsettled'})"
            for r in rows if r.get("run") == run and r["ratio"] is not None), flush=True)
    for name in NOISY:
        verdict, seconds = gate(noisy_problem(scratch, name, args.case), policy, cases, scratch)
        rows += rows_of(verdict, name, seconds=round(seconds, 2))
        print(f"{name}: {verdict.describe(300)}", flush=True)
    repeated = [r for r in rows if "run" in r]
    env = measured.environment if measured else {}
    document = {
        "provenance": {"gpu": env.get("gpu", "unknown"), "driver": env.get("driver", "unknown"),
                       "torch": env.get("torch", "unknown"), "sm_clock_mhz_at_start": env.get("sm_clock_mhz"),
                       "git_commit": git_commit(), "gate_version": GATE_VERSION, "started": started,
                       "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                       "limits": {"spread": SPREAD_LIMIT, "agreement": AGREEMENT_LIMIT},
                       "policy": policy.to_dict(), "cases": cases,
                       "note": "each gate a fresh runner process with an empty verdict cache; the repeated "
                               "gates ran first in the session"},
        "summary": {"repeated": [summary(repeated, vs) for vs in sorted({r["vs"] for r in repeated if r["vs"]})]},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(document["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
