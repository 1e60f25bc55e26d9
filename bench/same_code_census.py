"""How many of a benchmark's gate calls went to kernels that run their best kernel's machine code? (CPU)

    KLINEAGE_REPLAY_GPU="NVIDIA H100 80GB HBM3" python bench/same_code_census.py \
        --part bench/results/transfer-h100.json --out bench/results/same_code.json

Each search of a transfer document (bench/transfer_eval.py: every operator, every strategy) is replayed off the
verdicts the GPU named by KLINEAGE_REPLAY_GPU recorded, with the document's settings, as it ran: before the code
check (`CodeCheck.NONE`), so every candidate is gated as it was. Each candidate gated against a best kernel is
compiled here and compared with that kernel (klineage.gate.machine_code): where both run the same machine code the
gate call could not have given a step, its true ratio being 1. The loop now keeps such kernels from the gate
(`CodeCheck.SASS`, the default); this counts what that saves on runs that were measured without it, and names the
transforms behind them. A search whose replay is not the run the document records (a verdict missing, another
path) is reported with the difference, uncounted.

Writes {"provenance", "gated", "same_code", "by_strategy": {strategy: {"gated", "same_code"}},
"by_transform": {transform: same-code kernels}, "by_status": {attempt status: same-code kernels}, "errors", "rows":
[{"workload", "strategy", "round", "transform", "candidate", "code", "status"}]}, one row per gated candidate, `code`
as klineage.gate.machine_code.CodeIdentity, `status` the attempt's (klineage.optimize.result.AttemptStatus).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klineage import config  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.errors import KLineageError  # noqa: E402
from klineage.gate.machine_code import same_machine_code  # noqa: E402
from klineage.gate.pipeline import git_commit  # noqa: E402
from klineage.kernel import load_kernel  # noqa: E402
from klineage.optimize import CodeCheck, Strategy, loop, optimize  # noqa: E402
from klineage.optimize.strategies import Ordering  # noqa: E402
from klineage.skills.library import load_library  # noqa: E402

BENCH = ROOT / "bench" / "transfer"


def census(name: str, strategy: Strategy, settings: dict[str, Any], library: Any,
           run: dict[str, Any]) -> list[dict[str, Any]]:
    """The search replayed, with each gated candidate's machine code compared with its best's; a KLineageError
    where the replay is not the run the document describes (`run`: its evaluations, stop and best kernel)."""
    rows: list[dict[str, Any]] = []
    gate = loop.run_gate

    def observed(problem, kernel, *, against=None, **kwargs):
        if against is not None:  # the start kernel's gate has no best to compare with
            rows.append({"workload": name, "strategy": strategy.value, "candidate": kernel.fingerprint,
                         "code": same_machine_code(kernel, against).value})
        return gate(problem, kernel, against=against, **kwargs)

    loop.run_gate = observed  # the loop's one gate function: what each call is handed is seen here
    try:
        result = optimize(BENCH / name / "problem.py", load_kernel(BENCH / name / "naive"), strategy=strategy,
                          library=library if strategy.uses_library else None, budget=settings["budget"],
                          gate_mode=GateMode.REPLAY, seed=settings.get("seed", 0), jobs=settings.get("jobs", 1),
                          rivals=settings.get("rivals", 0), code_check=CodeCheck.NONE,
                          ordering=Ordering(settings.get("ordering", Ordering.AS_PLANNED.value)))
    finally:
        loop.run_gate = gate
    found = {"evaluations": result.stats.evaluations, "stop": result.stop.value,
             "best_fingerprint": result.best.fingerprint}
    differs = [f"{key} {value!r}, not {run[key]!r}" for key, value in found.items() if run.get(key) != value]
    if differs:
        raise KLineageError(f"the replay is not the recorded run ({', '.join(differs)}): {result.message}")
    attempts = {a.candidate: a for a in result.attempts if a.status.gated}
    for row in rows:
        attempt = attempts[row["candidate"]]
        row.update(round=attempt.round, transform=attempt.transform, status=attempt.status.value)
    return rows


def report(part: Path) -> dict[str, Any]:
    document = json.loads(part.read_text(encoding="utf-8"))
    settings = document["provenance"]
    if settings.get("code_check", CodeCheck.NONE.value) != CodeCheck.NONE.value:
        raise KLineageError(f"{part}: its searches ran with the code check; there is nothing left to count")
    library = load_library(ROOT / settings["library"])
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    for name in sorted(document["runs"]):
        for strategy, run in document["runs"][name].items():
            try:
                rows += census(name, Strategy(strategy), settings, library, run)
            except KLineageError as exc:
                errors.append(f"{name} {strategy}: {exc}")
    same = [r for r in rows if r["code"] == "same"]
    strategies = sorted({r["strategy"] for r in rows})
    return {"provenance": {"part": str(part.relative_to(ROOT)) if part.is_relative_to(ROOT) else str(part),
                           "replayed_gpu": config.replay_gpu(), "git_commit": git_commit(),
                           "settings": {k: settings.get(k) for k in ("budget", "seed", "jobs", "rivals", "ordering",
                                                                       "library")},
                           "written_by": "bench/same_code_census.py"},
            "gated": len(rows), "same_code": len(same),
            "by_strategy": {s: {"gated": sum(r["strategy"] == s for r in rows),
                                "same_code": sum(r["strategy"] == s for r in same)} for s in strategies},
            "by_transform": dict(Counter(r["transform"] for r in same).most_common()),
            # what the gate made of them: a same-code kernel taken as faster was a step of noise
            "by_status": dict(Counter(r["status"] for r in same).most_common()),
            "errors": errors, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default=str(ROOT / "bench" / "results" / "transfer-h100.json"),
                        help="a transfer document whose searches to replay (its provenance gives the settings)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "same_code.json"))
    args = parser.parse_args(argv)
    try:
        result = report(Path(args.part).resolve())
    except KLineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"{result['same_code']} of {result['gated']} gated candidates ran their best kernel's machine code; "
          + ", ".join(f"{s} {v['same_code']} of {v['gated']}" for s, v in result["by_strategy"].items())
          + (f"; {len(result['errors'])} search(es) did not replay" if result["errors"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
