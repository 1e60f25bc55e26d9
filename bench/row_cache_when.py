"""Where does the 16-byte row cache pay? Its step in the transfer search, timed on every case, and its *when*.

For each of the four row operators of bench/transfer (rms_norm, layer_norm, l2_normalize, log_softmax), the
default search (`library_then_catalog`, budget 8) is replayed off the recorded verdicts; its last step fills and
writes the register row cache 16 bytes a lane at a time (`scalarize_row_cache`). That kernel is gated against
the kernel it came from (the same step backward: the cache one float a lane per 32 columns), paired, on every
case and every SWEEP case of the problem (rows whose length divides by 4 or not, short and long rows, a grid
under one wave, a row too long for the cache). Each case's ratio (parent time / vector time) and its facts (the
case's rows and cols, what the parent's launch plan makes of them, the rows its output is written in, the work
per thread) go to klineage.skills.when's induction, which writes a precondition only where the data force one
(leave-one-case-out and the other rules of that module). Both operators' parameters mean the same (rows of
`cols` floats), so they are kept.

    python bench/row_cache_when.py --gate gpu --out bench/results/row_cache_when.json   # on a GPU host, recorded
    python bench/row_cache_when.py --gate replay --out F                                # the same, from them
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klineage import config, devices  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.gate.cache import GateCache  # noqa: E402
from klineage.gate.execute import probe_problem  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.policy import TimingScope  # noqa: E402
from klineage.kernel import KernelState, load_kernel  # noqa: E402
from klineage.optimize import Strategy, optimize  # noqa: E402
from klineage.optimize.loop import DEFAULT_POLICY  # noqa: E402
from klineage.optimize.result import CodeCheck  # noqa: E402
from klineage.optimize.strategies import Ordering  # noqa: E402
from klineage.skills.facts import case_facts, launch_facts, layout_facts  # noqa: E402
from klineage.skills.library import bundled_library, load_library  # noqa: E402
from klineage.skills.when import induce_when, per_case  # noqa: E402
from klineage.transforms import get  # noqa: E402
from klineage.walk.timing_audit import PERCASE_TRIAL_SECONDS, case_ratios  # noqa: E402

OPERATORS = ("rms_norm", "layer_norm", "l2_normalize", "log_softmax")
POLICY = DEFAULT_POLICY.with_(timing_scope=TimingScope.EVERY_CASE, trial_seconds=PERCASE_TRIAL_SECONDS)


def vector_step(operator: str, cache: GateCache) -> tuple[KernelState, KernelState]:
    """(the kernel before the 16-byte row cache, the kernel with it) of the operator's default search, replayed as
    the H200 transfer run recorded it (before rivals, orderings and the code check existed)."""
    folder = ROOT / "bench" / "transfer" / operator
    result = optimize(folder / "problem.py", load_kernel(folder / "naive"), strategy=Strategy.LIBRARY_THEN_CATALOG,
                      library=load_library(bundled_library()), budget=8, gate_mode=GateMode.REPLAY, jobs=6,
                      cache=cache, rivals=0, ordering=Ordering.AS_PLANNED, code_check=CodeCheck.NONE)
    vector = next(s.state for s in reversed(result.steps) if "row_vec4" in s.state.source)
    transform = get("scalarize_row_cache")
    return transform.backward(vector, transform.find(vector)[0]).state, vector


def measure(operator: str, mode: GateMode, cache: GateCache) -> dict:
    problem = ROOT / "bench" / "transfer" / operator / "problem.py"
    parent, vector = vector_step(operator, GateCache(None, config.recorded_dir()))
    info = probe_problem(problem, cache_dir=config.cache_dir()).info
    verdict = run_gate(problem, vector, against=parent, policy=POLICY, mode=mode, cache=cache,
                       record=mode is GateMode.GPU)
    rows = []
    for timed in sorted(case_ratios(verdict), key=lambda timed: timed.case):
        params = dict(info.case(timed.case).params)
        launch = launch_facts(parent, params, devices.DEFAULT)
        facts = case_facts(params, launch, roofline=info.roofline.get(timed.case),
                           layout=layout_facts(info.outputs, params))
        attempts = verdict.profile["per_case"][timed.case].get("settlement", {}).get("attempts") or [{}]
        rows.append({"case": timed.case, "params": params, "ratio": timed.ratio, "per_trial": list(timed.per_trial),
                     "settled": attempts[-1].get("state") == "settled", "untimed": timed.untimed, "facts": facts})
    return {"operator": operator, "status": verdict.status.value, "gpu": verdict.environment.get("gpu", "none"),
            "parent": parent.fingerprint[:12],
            "vector": vector.fingerprint[:12], "findings": [str(f) for f in verdict.findings], "cases": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gate", choices=[GateMode.GPU.value, GateMode.REPLAY.value], default=GateMode.REPLAY.value)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    mode = GateMode(args.gate)
    cache = GateCache(config.cache_dir(), config.recorded_dir())
    operators = []
    for operator in OPERATORS:
        clock = time.monotonic()
        operators.append(measure(operator, mode, cache))
        print(f"{operator}: {operators[-1]['status']} in {time.monotonic() - clock:.0f} s", flush=True)
    effects = per_case([(f"{o['operator']}:{c['case']}", c["ratio"], c["facts"])
                        for o in operators for c in o["cases"] if c["ratio"] is not None])
    when = induce_when(effects)
    document = {
        "provenance": {"gpu": next((o["gpu"] for o in operators if o["gpu"] != "none"), "none"), "gate": mode.value,
                       "git_commit": git_commit(),
                       "date": datetime.now(UTC).isoformat(timespec="seconds"), "policy": POLICY.to_dict(),
                       "written_by": "bench/row_cache_when.py",
                       "ratio": "parent time / 16-byte row cache time, paired in one process, per case"},
        "operators": operators,
        "when": {"kind": when.kind.value, "sentence": when.sentence, "loo_accuracy": when.loo_accuracy,
                 "precondition": when.precondition.expression if when.precondition else None,
                 "candidates": list(when.candidates),
                 "cases": [{"case": r.case, "ratio": r.ratio, "outcome": r.outcome.value} for r in when.cases]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"when: {when.kind.value}: {when.sentence}")
    for row in document["when"]["cases"]:
        print(f"  {row['case']:28s} {row['ratio']:.3f} {row['outcome']}")
    unsettled = [f"{o['operator']}:{c['case']}" for o in operators for c in o["cases"] if not c["settled"]]
    print("timing settled on every case" if not unsettled else f"timing NOT settled on {', '.join(unsettled)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
