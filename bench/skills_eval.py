"""Do the skills help? Every strategy, the same budget, from the naive end of every corpus lineage.

    python bench/skills_eval.py --gate gpu --budget 16 --out bench/results/skills.json

For each lineage in corpus/lineages (a workload: the expert it walked and the naive end it
reached; one per expert and gate mode, the longest walk), optimize the naive end with each
strategy (`klineage.optimize.Strategy`) under the same gate-evaluation budget, then gate the
library strategy's best kernel against the expert (paired timing, outside the budget: a
measurement, not a search step). Writes one JSON document:

- admission_rate: admitted cards / cards, over a library whose cards went through roundtrip
  admission (some card has a verification log); null, with a reason, when none did;
- roundtrip_min_vs_expert: the smallest, over workloads, of expert time / library-best time
  (1.0: the library climbs back to the expert; above: past it);
- vs_unconditioned_geomean: the geometric mean, over workloads, of the library's speedup over the
  naive end divided by the better of the two unconditioned strategies' speedups;
- workloads: per workload and strategy the stop, evaluations, wasted evaluations, steps and
  speedup (start time / best time, the product of the path's paired ratios).

A gate mode that times nothing (compile) gives no ratios: those keys are null with a "reason".
Numbers come from the gate's verdicts only; nothing is estimated.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import config, corpus  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.errors import KLineageError  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.verdict import Status, Verdict  # noqa: E402
from klineage.lineage import Lineage  # noqa: E402
from klineage.optimize import DEFAULT_POLICY, OptimizationResult, RewriterKind, Strategy, optimize  # noqa: E402
from klineage.optimize.command import bundled_library  # noqa: E402
from klineage.skills.card import CardStatus  # noqa: E402
from klineage.skills.induction import lineage_id  # noqa: E402
from klineage.skills.library import Library, corpus_lineages, lineage_index, load_library  # noqa: E402

NO_TIMING = "the {mode} gate times nothing (no GPU): no ratio can be measured, none is invented"
UNCONDITIONED = (Strategy.UNCONDITIONED_RANDOM, Strategy.UNCONDITIONED_GREEDY)


def admission(library: Library) -> dict[str, Any]:
    cards = library.cards
    admitted = sum(c.status is CardStatus.ADMITTED for c in cards)
    if not any(c.verification_log for c in cards):
        return {"value": None, "admitted": admitted, "cards": len(cards),
                "reason": "no card of this library went through roundtrip admission (no verification log): "
                          "the rate is unknown, not zero"}
    trialled = sum(bool(c.verification_log) for c in cards)
    return {"value": admitted / len(cards), "admitted": admitted, "cards": len(cards), "trialled": trialled,
            "admitted_of_trialled": admitted / trialled, "how": library.provenance.get("admission", ""),
            "reason": ""}


def versus_expert(problem: Path, best: Any, expert: Any, mode: GateMode) -> tuple[float | None, str, Verdict | None]:
    """Expert time / best time, paired; None with the reason when it cannot be measured."""
    if mode is GateMode.COMPILE_ONLY:
        return None, NO_TIMING.format(mode=mode.value), None
    try:
        verdict = run_gate(problem, best, against=expert, policy=DEFAULT_POLICY, mode=mode)
    except KLineageError as exc:
        return None, f"the gate could not time the best kernel against the expert: {exc}", None
    ratio = verdict.profile.get("ratios", {}).get("vs_baseline")
    if verdict.status is not Status.PASSED or not ratio:
        return None, f"the best kernel against the expert: {verdict.status.value}, no paired ratio", verdict
    return float(ratio["overall"]), "", verdict


def workload(lineage: Lineage, library: Library, args: argparse.Namespace, documents: Path | None,
             index: dict[str, Lineage]) -> tuple[dict[str, Any], list[Verdict]]:
    name = lineage_id(lineage)
    expert, naive = lineage.states[0].kernel, lineage.states[-1].kernel
    problem = corpus.problem_path(expert.plan.problem)
    mode = GateMode(args.gate)
    rewriter = RewriterKind(args.rewriter)
    row: dict[str, Any] = {"lineage": name, "operator": lineage.problem.operator,
                           "expert": {"name": expert.name, "fingerprint": expert.fingerprint},
                           "start": {"name": naive.name, "fingerprint": naive.fingerprint,
                                     "steps_from_expert": len(lineage.transitions)},
                           "lineage_gate": lineage.gate.value, "strategies": {}}
    results: dict[Strategy, OptimizationResult] = {}
    for strategy in Strategy:
        if strategy is Strategy.NO_LIBRARY and rewriter is RewriterKind.RULES:
            row["strategies"][strategy.value] = {"skipped": "the rewriter alone needs --rewriter llm"}
            continue
        print(f"  {lineage.problem.operator}: {strategy.value}", file=sys.stderr)
        try:
            result = optimize(problem, naive, strategy=strategy, library=library if strategy.uses_library else None,
                              budget=args.budget, gate_mode=mode, rewriter=rewriter, seed=args.seed,
                              statuses=args.statuses, lineages=index)
        except KLineageError as exc:
            row["strategies"][strategy.value] = {"error": str(exc)}
            continue
        results[strategy] = result
        if documents is not None:
            result.save(documents / f"{name.replace('@', '-').replace(':', '-')}-{strategy.value}.json")
        row["strategies"][strategy.value] = {
            "stop": result.stop.value, "message": result.message, "evaluations": result.stats.evaluations,
            "wasted": result.stats.wasted, "steps": [s.transform for s in result.steps], "speedup": result.speedup,
            "best": result.best.fingerprint, "llm_usage": result.llm_usage}
    verdicts = []
    library_run = results.get(Strategy.LIBRARY)
    if library_run is None:
        row["vs_expert"], row["vs_expert_reason"] = None, "the library strategy did not run"
    else:
        row["vs_expert"], row["vs_expert_reason"], verdict = versus_expert(problem, library_run.best, expert, mode)
        verdicts += [verdict] if verdict else []
    unconditioned = [results[s].speedup for s in UNCONDITIONED if s in results and results[s].speedup is not None]
    if library_run is None or library_run.speedup is None or len(unconditioned) != len(UNCONDITIONED):
        row["vs_unconditioned"] = None
        row["vs_unconditioned_reason"] = (NO_TIMING.format(mode=mode.value) if mode is GateMode.COMPILE_ONLY else
                                          "the library or an unconditioned strategy gave no speedup")
    else:
        row["vs_unconditioned"], row["vs_unconditioned_reason"] = library_run.speedup / max(unconditioned), ""
    return row, verdicts


def summary(rows: list[dict[str, Any]], key: str, combine: Any, what: str) -> dict[str, Any]:
    values = [r[key] for r in rows]
    if not rows:
        return {"value": None, "reason": "no corpus lineage to evaluate"}
    if any(v is None for v in values):
        reasons = sorted({r[f"{key}_reason"] for r in rows if r[key] is None})
        return {"value": None, "reason": f"{what} is unknown for {sum(v is None for v in values)} of {len(rows)} "
                                         f"workload(s): " + "; ".join(reasons)}
    return {"value": combine(values), "reason": ""}


def _repo_relative(path: str) -> str:
    """A path inside the checkout as the repository names it; any other as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(config.REPO_ROOT)) if resolved.is_relative_to(config.REPO_ROOT) else path


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def provenance(verdicts: list[Verdict], args: argparse.Namespace, library: str) -> dict[str, Any]:
    env = next((v.environment for v in verdicts if v.environment.get("gpu")), {})
    return {"gpu": env.get("gpu", "none"), "driver": env.get("driver", "unknown"),
            "cuda": env.get("cuda_runtime", "unknown"), "torch": env.get("torch", "unknown"),
            "toolchain": env.get("toolchain", "unknown"), "git_commit": git_commit(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "gate": args.gate,
            "budget": args.budget, "rewriter": args.rewriter, "seed": args.seed, "statuses": args.statuses,
            "library": library, "written_by": "bench/skills_eval.py"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gate", choices=[m.value for m in GateMode], default=config.gate_mode().value)
    parser.add_argument("--budget", type=int, default=16, help="gate evaluations per strategy and workload")
    parser.add_argument("--library", help="library JSON or SKILL.md folder (default: the bundled library)")
    parser.add_argument("--statuses", default="admitted", help="card statuses the library strategies retrieve")
    parser.add_argument("--rewriter", choices=[r.value for r in RewriterKind], default="rules")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lineages", default=str(config.corpus_dir() / "lineages"), help="folder of lineage JSON")
    parser.add_argument("--documents", help="also write every optimization document into this folder")
    parser.add_argument("--out", default=str(config.REPO_ROOT / "bench" / "results" / "skills.json"))
    parser.add_argument("--admission-only", action="store_true",
                        help="report the library's admission alone; run no optimization (nothing is gated)")
    args = parser.parse_args(argv)
    args.statuses = [s.strip() for s in args.statuses.split(",") if s.strip()]
    library_path = args.library or str(bundled_library())
    library = load_library(library_path)
    documents = Path(args.documents) if args.documents else None
    if documents is not None:
        documents.mkdir(parents=True, exist_ok=True)
    lineages, left_out = corpus_lineages(args.lineages)
    index = lineage_index(args.lineages)  # what the library strategy's cards point into, read once
    rows, verdicts = [], []
    for lineage in [] if args.admission_only else lineages:
        print(f"workload {lineage_id(lineage)}", file=sys.stderr)
        row, found = workload(lineage, library, args, documents, index)
        rows.append(row)
        verdicts += found
    skipped = {"value": None, "reason": "not run (--admission-only): no optimization was gated"}
    facts = provenance(verdicts, args, _repo_relative(library_path))
    if args.admission_only:
        facts.update(gate="none: nothing was gated here", gpu="none here; the admission trials ran where "
                                                               "admission_rate.how says")
    document = {"provenance": facts, "admission_rate": admission(library),
                "roundtrip_min_vs_expert": skipped if args.admission_only else
                summary(rows, "vs_expert", min, "the best kernel vs the expert"),
                "vs_unconditioned_geomean": skipped if args.admission_only else
                summary(rows, "vs_unconditioned", geomean, "the library vs the unconditioned strategies"),
                "definitions": {
                    "admission_rate": "admitted cards / cards of a library that went through roundtrip admission",
                    "roundtrip_min_vs_expert": "min over workloads of expert time / library-best time (paired)",
                    "vs_unconditioned_geomean": "geomean over workloads of library speedup / the better "
                                                "unconditioned speedup (random or greedy), same budget",
                    "speedup": "start time / best time: the product of the accepted steps' paired ratios"},
                "workloads": rows,
                "lineages_left_out": [{"file": p.name, "why": "a GPU walk, or a longer walk, of the same expert is kept"}
                                      for p in left_out]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: admission {document['admission_rate']['value']}, roundtrip min "
          f"{document['roundtrip_min_vs_expert']['value']}, vs unconditioned "
          f"{document['vs_unconditioned_geomean']['value']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
