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
- library_wasted: the library strategy's gate evaluations on candidates it did not take, as a
  fraction of all its evaluations (and of its candidates' alone); `saved` (absent at 0, as in the runs'
  stats): the candidates it did not gate because their card's timing precondition failed on the problem;
- workloads: per workload and strategy the stop, evaluations, wasted evaluations, steps,
  speedup (start time / best time, the product of the path's paired ratios) and
  speedups_by_budget (what the run had reached under each smaller budget: what compares a run that
  went further with one cut after N evaluations).

A gate mode that times nothing (compile) gives no ratios: those keys are null with a "reason".
Numbers come from the gate's verdicts only; nothing is estimated.

In parts, one per GPU lane (`bench/gpu_session.sh` stage `skills:SPEC`):

    python bench/skills_eval.py --gate gpu --record --only topk,gemm:library --out part1.json
    python bench/skills_eval.py --merge part1.json part2.json --out bench/results/skills.json

`--hold-out-operator` measures transfer instead of the roundtrip: each workload's library
strategies see neither the walks of its operator nor the cards learnt only from them, as a new
kernel of a new operator would (its paths then come from the other operators' walks).

`--only OPERATOR|EXPERT|LINEAGE_ID[:STRATEGY],...` runs those workloads (all strategies, or the one
named). The document is rewritten after every strategy, so a run cut by a timeout keeps what
finished; until the run ends, and always for a part, it carries `partial`: its summaries cover
only what it holds. `--merge` gates nothing: it joins the parts' rows and computes the
per-workload comparisons and the summaries again over the whole corpus (a workload no part ran
is listed in `not_run`, and then the summaries are null: unknown is not a number).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import cli_options, config, corpus  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.errors import KLineageError  # noqa: E402
from klineage.gate.pipeline import default_cache, git_commit, run_gate  # noqa: E402
from klineage.gate.verdict import Status, Verdict  # noqa: E402
from klineage.lineage import Lineage  # noqa: E402
from klineage.optimize import DEFAULT_POLICY, OptimizationResult, RewriterKind, Strategy, optimize  # noqa: E402
from klineage.optimize.command import seconds  # noqa: E402
from klineage.optimize.result import ENDED, CodeCheck, run_speedup_within  # noqa: E402
from klineage.optimize.run_log import LOG_HELP, logged  # noqa: E402
from klineage.optimize.strategies import DEFAULT_ORDERING, RIVALS, UNCONDITIONED, Ordering  # noqa: E402
from klineage.skills.card import CardStatus  # noqa: E402
from klineage.skills.induction import lineage_id  # noqa: E402
from klineage.skills.library import Library, bundled_library, corpus_lineages, lineage_index, load_library  # noqa: E402

NO_TIMING = "the {mode} gate times nothing (no GPU): no ratio can be measured, none is invented"
# The roundtrip's strategies: the paper's comparison. library_then_catalog is the product's library with the
# catalog after it; against the unconditioned searches it would measure the catalog twice.
STRATEGIES = (Strategy.LIBRARY, *UNCONDITIONED, Strategy.GENERATED_ONLY, Strategy.NO_LIBRARY)
PARTIAL_NOTE = ("the summaries cover only the workloads and strategies this document holds: not the headline "
                "(join the parts with --merge; a run that is not complete was cut short)")
DOCUMENTS = "docs"  # next to a part: its optimization documents, as bench/results/skills-parts keeps them
# one experiment's parts share these
AGREE = ("gate", "budget", "rewriter", "seed", "statuses", "library", "held_out", "rivals", "ordering", "code_check")
MEASURED_ON = ("gpu", "driver", "cuda", "torch", "toolchain", "git_commit")  # these may differ between lanes
DEFINITIONS = {
    "admission_rate": "admitted cards / cards of a library that went through roundtrip admission",
    "roundtrip_min_vs_expert": "min over workloads of expert time / library-best time (paired)",
    "vs_unconditioned_geomean": "geomean over workloads of library speedup / the better unconditioned speedup "
                                "(random or greedy, of those that ran: each row's vs_unconditioned_over), at one "
                                "budget (a run cut after N evaluations, by its time limit or budget, is compared "
                                "with the other run's speedup under N: its own if it ended on its own within N, "
                                "else read off its speedups_by_budget; each row's vs_unconditioned_budgets)",
    "library_wasted": "the library strategy's evaluations on candidates it did not take / all its evaluations "
                      "(of_candidates: / its evaluations of candidates, the start kernel's left out)",
    "speedup": "start time / best time: the product of the accepted steps' paired ratios"}


class MergeError(Exception):
    pass


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


def select(specs: list[str], lineages: list[Lineage]) -> dict[str, set[Strategy]]:
    """--only: lineage id -> the strategies to run on it. ValueError names a spec that selects nothing."""
    def matching(name: str) -> list[str]:
        return [lineage_id(lin) for lin in lineages if name in (lin.problem.operator, lin.expert.name, lineage_id(lin))]

    chosen: dict[str, set[Strategy]] = {}
    for spec in specs:
        found, strategies = matching(spec), set(STRATEGIES)
        if not found and ":" in spec:  # a lineage id holds a colon itself: only a suffix that is no id names a strategy
            workload, _, strategy = spec.rpartition(":")
            found = matching(workload)
            if found and strategy not in {s.value for s in STRATEGIES}:
                raise ValueError(f"--only {spec}: no strategy '{strategy}' (strategies: "
                                 f"{', '.join(s.value for s in STRATEGIES)})")
            strategies = {Strategy(strategy)} if found else strategies
        if not found:
            known = sorted({lin.problem.operator for lin in lineages} | {lin.expert.name for lin in lineages})
            raise ValueError(f"--only {spec}: matches no workload (operators and experts: {', '.join(known)}; "
                             f"or a lineage id: {', '.join(lineage_id(lin) for lin in lineages)})")
        for name in found:
            chosen.setdefault(name, set()).update(strategies)
    return chosen


def versus_expert(problem: Path, best: Any, expert: Any, mode: GateMode,
                  record: bool = False) -> tuple[float | None, str, Verdict | None]:
    """Expert time / best time, paired and settled; None with the reason when it cannot be measured."""
    if mode is GateMode.COMPILE_ONLY:
        return None, NO_TIMING.format(mode=mode.value), None
    try:
        verdict = run_gate(problem, best, against=expert, policy=DEFAULT_POLICY, mode=mode)
    except KLineageError as exc:
        return None, f"the gate could not time the best kernel against the expert: {exc}", None
    if record and mode is GateMode.GPU:
        default_cache().keep(verdict)  # as optimize(record=True) does: replay serves the headline's ratio too
    ratio = verdict.paired_ratio()  # None where the timing never settled: such a ratio is no measurement
    if verdict.status is not Status.PASSED or ratio is None:
        return None, f"the best kernel against the expert: {verdict.describe()}, no settled paired ratio", verdict
    return ratio.overall, "", verdict


def started(problem: Path, start: Any, mode: GateMode) -> Verdict:
    """The start kernel's verdict, which the run has just stored: read back, not gated again."""
    return run_gate(problem, start, policy=DEFAULT_POLICY, mode=mode)


def compare(row: dict[str, Any], mode: GateMode, expert: tuple[float | None, str] | None) -> None:
    """Set the row's vs_expert and vs_unconditioned from its strategy rows: one run's, or the merged
    parts'. `expert` is (ratio, reason) of the library's best gated against the expert, as the part
    that ran the library strategy measured it; None when the library strategy did not run."""
    row["vs_expert"], row["vs_expert_reason"] = expert or (None, "the library strategy did not run")
    ran = [s for s in UNCONDITIONED if s.value in row["strategies"]]
    speedups = [row["strategies"].get(s.value, {}).get("speedup") for s in (Strategy.LIBRARY, *ran)]
    row["vs_unconditioned"], row["vs_unconditioned_over"], row["vs_unconditioned_reason"] = None, [], (
        NO_TIMING.format(mode=mode.value) if mode is GateMode.COMPILE_ONLY else
        "not run: library" if Strategy.LIBRARY.value not in row["strategies"] else
        "not run: " + ", ".join(s.value for s in UNCONDITIONED) if not ran else
        "the library or an unconditioned strategy gave no speedup" if None in speedups else "")
    if not row["vs_unconditioned_reason"]:  # the library against each, at the budget the two runs share
        library, ratios, budgets = row["strategies"][Strategy.LIBRARY.value], [], {}
        for s in ran:
            mine, theirs, budgets[s.value], why = at_one_budget(library, row["strategies"][s.value])
            if why:
                row["vs_unconditioned_reason"] = why
                break
            ratios.append(mine / theirs)
        else:  # against the better of the unconditioned strategies that ran
            row["vs_unconditioned"], row["vs_unconditioned_over"] = min(ratios), [s.value for s in ran]
            row["vs_unconditioned_budgets"] = budgets


def at_one_budget(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, float | None, int | None, str]:
    """Two strategy runs' speedups at the budget they share, that budget (None: both ended on their
    own), and why they cannot be compared ('' when they can). A run cut after N evaluations (its time
    limit, its budget) is a budget-N run; the other one's speedup at N is its own when it ended on
    its own within N, else read off its speedups_by_budget (the attempts it had made by then)."""
    shared = min((r["evaluations"] for r in (a, b) if r["stop"] not in ENDED), default=None)
    if shared is None:
        return a["speedup"], b["speedup"], None, ""
    mine, theirs = run_speedup_within(a, shared), run_speedup_within(b, shared)
    if mine is None or theirs is None:
        late = a if mine is None else b
        return None, None, shared, (f"not at one budget: a run was cut after {shared} evaluation(s), another "
                                    f"stopped ({late['stop']}) after {late['evaluations']} and its row cannot "
                                    f"tell its speedup at {shared}")
    return mine, theirs, shared, ""


def strategy_row(result: OptimizationResult) -> dict[str, Any]:
    return {"stop": result.stop.value, "message": result.message, "evaluations": result.stats.evaluations,
            "wasted": result.stats.wasted, **result.stats.saved_entry(),
            "steps": [s.transform for s in result.steps], "speedup": result.speedup,
            "best": result.best.fingerprint, "llm_usage": result.llm_usage,
            "speedups_by_budget": result.speedups_by_budget()}


def workload(lineage: Lineage, library: Library, args: argparse.Namespace, documents: Path | None,
             index: dict[str, Lineage], strategies: set[Strategy]) -> Iterator[tuple[dict[str, Any], list[Verdict]]]:
    """Run the chosen strategies on one workload; yield the row so far (and the new verdicts) after
    each, so that the caller writes it before the next one starts."""
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
    measured = None  # (ratio, reason) of the library's best against the expert, once the library ran
    if args.hold_out_operator:
        library, index = held_out(library, index, lineage.problem.operator)
    for strategy in (s for s in STRATEGIES if s in strategies):
        verdicts: list[Verdict] = []
        if strategy is Strategy.NO_LIBRARY and rewriter is RewriterKind.RULES:
            row["strategies"][strategy.value] = {"skipped": "the rewriter alone needs --rewriter llm"}
        else:
            print(f"  {lineage.problem.operator}: {strategy.value}", file=sys.stderr)
            try:
                result = optimize(problem, naive, strategy=strategy, budget=args.budget, gate_mode=mode,
                                  library=library if strategy.uses_library else None, rewriter=rewriter,
                                  seed=args.seed, statuses=args.statuses, lineages=index, record=args.record,
                                  jobs=args.jobs, time_limit_s=args.time_limit_s, rivals=args.rivals,
                                  ordering=args.ordering, code_check=args.code_check,
                                  **logged(args.log, workload=name, strategy=strategy.value))
            except KLineageError as exc:
                row["strategies"][strategy.value] = {"error": str(exc)}
            else:
                if documents is not None:
                    result.save(documents / document_name(name, strategy.value))
                row["strategies"][strategy.value] = strategy_row(result)
                verdicts = [started(problem, naive, mode)]  # where it ran, for the provenance of any part
                if strategy is Strategy.LIBRARY:  # right away: no part has the library's row without this
                    ratio, reason, verdict = versus_expert(problem, result.best, expert, mode, args.record)
                    measured = (ratio, reason)
                    verdicts += [verdict] if verdict else []
        compare(row, mode, measured)
        yield row, verdicts


def summary(rows: list[dict[str, Any]], key: str, combine: Any, what: str) -> dict[str, Any]:
    values = [r[key] for r in rows]
    if not rows:
        return {"value": None, "reason": "no corpus lineage to evaluate"}
    if any(v is None for v in values):
        reasons = sorted({r[f"{key}_reason"] for r in rows if r[key] is None})
        return {"value": None, "reason": f"{what} is unknown for {sum(v is None for v in values)} of {len(rows)} "
                                         f"workload(s): " + "; ".join(reasons)}
    return {"value": combine(values), "reason": ""}


def summaries(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"roundtrip_min_vs_expert": summary(rows, "vs_expert", min, "the best kernel vs the expert"),
            "vs_unconditioned_geomean": summary(rows, "vs_unconditioned", geomean,
                                                "the library vs the unconditioned strategies"),
            "library_wasted": wasted(rows)}


def wasted(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The library strategy's gate evaluations spent on candidates it did not take, over all of its
    runs: of every evaluation (the budget's unit, the start kernel's included) and of the candidates'."""
    runs = [r["strategies"].get(Strategy.LIBRARY.value) for r in rows]
    if not runs or None in runs:
        return {"value": None, "reason": "the library strategy did not run on every workload"}
    spent, lost = sum(r["evaluations"] for r in runs), sum(r["wasted"] for r in runs)
    candidates = spent - len(runs)  # each run's first evaluation gates its start kernel
    return {"value": lost / spent, "wasted": lost, "evaluations": spent, "candidate_evaluations": candidates,
            "of_candidates": lost / candidates if candidates else None,
            **({"saved": saved} if (saved := sum(r.get("saved", 0) for r in runs)) else {}), "reason": ""}


def held_out(library: Library, index: dict[str, Lineage], operator: str) -> tuple[Library, dict[str, Lineage]]:
    """What a kernel of an operator no walk covers would meet: the walks of the other operators, and
    the cards learnt from at least one of them (a card learnt from this operator too keeps its other
    fields, its effects included: they rank it, they do not place it)."""
    walks = {name: lin for name, lin in index.items() if lin.problem.operator != operator}
    cards = tuple(c for c in library.cards if any(ref.lineage in walks for ref in c.evidence))
    return Library(cards, {**library.provenance, "held_out_operator": operator}), walks


def _repo_relative(path: str) -> str:
    """A path inside the checkout as the repository names it; any other as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(config.REPO_ROOT)) if resolved.is_relative_to(config.REPO_ROOT) else path


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def provenance(verdicts: list[Verdict], args: argparse.Namespace, library: str) -> dict[str, Any]:
    env = next((v.environment for v in verdicts if v.environment.get("gpu")), {})
    return {"gpu": env.get("gpu", "none"), "driver": env.get("driver", "unknown"),
            "cuda": env.get("cuda_runtime", "unknown"), "torch": env.get("torch", "unknown"),
            "toolchain": env.get("toolchain", "unknown"), "git_commit": git_commit(),
            "date": now(), "gate": args.gate, "budget": args.budget, "rewriter": args.rewriter, "seed": args.seed,
            "statuses": args.statuses, "time_limit_s": args.time_limit_s,
            "library": library, "written_by": "bench/skills_eval.py"} | (
        {"held_out": "operator"} if args.hold_out_operator else {}) | (  # absent otherwise: earlier parts still merge
        {"rivals": args.rivals} if args.rivals else {}) | (  # likewise: parts written before rivals ran with none
        # and before orderings, as planned
        {"ordering": args.ordering} if args.ordering != Ordering.AS_PLANNED.value else {}) | (
        # and before the code check, with none
        {"code_check": args.code_check} if args.code_check != CodeCheck.NONE.value else {})


def left_out_of(paths: list[Path]) -> list[dict[str, str]]:
    return [{"file": p.name, "why": "a GPU walk, or a longer walk, of the same expert is kept"} for p in paths]


def write(path: Path, document: dict[str, Any]) -> None:
    """Atomically: a temp file in the same folder, then os.replace; a kill mid-write keeps the last whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temp, path)


def evaluate(args: argparse.Namespace, library: Library, library_ref: str, lineages: list[Lineage],
             left_out: list[Path], chosen: dict[str, set[Strategy]] | None) -> dict[str, Any]:
    """Run the chosen workloads (all when `chosen` is None), writing the document after every strategy."""
    documents = Path(args.documents) if args.documents else None
    if documents is not None:
        documents.mkdir(parents=True, exist_ok=True)
    index = lineage_index(args.lineages)  # what the library strategy's cards point into, read once
    rows: list[dict[str, Any]] = []
    verdicts: list[Verdict] = []

    def document(current: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
        facts = provenance(verdicts, args, library_ref)
        doc: dict[str, Any] = {"provenance": facts, "admission_rate": admission(library)}
        if args.admission_only:
            facts.update(gate="none: nothing was gated here",
                         gpu="none here; the admission trials ran where admission_rate.how says")
            skipped = {"value": None, "reason": "not run (--admission-only): no optimization was gated"}
            doc.update(roundtrip_min_vs_expert=skipped, vs_unconditioned_geomean=skipped, library_wasted=skipped)
        else:
            doc.update(summaries(current))
        if chosen is not None or not complete:
            doc["partial"] = {"only": args.only, "complete": complete, "note": PARTIAL_NOTE}
        return doc | {"definitions": DEFINITIONS, "workloads": current, "lineages_left_out": left_out_of(left_out)}

    for lineage in [] if args.admission_only else lineages:
        name = lineage_id(lineage)
        if chosen is not None and name not in chosen:
            continue
        print(f"workload {name}", file=sys.stderr)
        row: dict[str, Any] = {}
        for row, found in workload(lineage, library, args, documents, index, set(STRATEGIES) if chosen is None
                                   else chosen[name]):
            verdicts += found
            write(Path(args.out), document(rows + [row], complete=False))
        rows.append(row)
    return document(rows, complete=True)


def document_name(workload: str, strategy: str) -> str:
    return f"{workload.replace('@', '-').replace(':', '-')}-{strategy}.json"


def with_budgets(run: dict[str, Any], document: Path) -> dict[str, Any]:
    """A part's strategy row, with speedups_by_budget from its optimization document when the row
    predates them and the document (in the docs folder beside the part) is that very run."""
    if "speedups_by_budget" in run or "evaluations" not in run or not document.is_file():
        return run  # a row with its budgets already, a skipped or failed strategy, or no document kept
    try:
        result = OptimizationResult.from_dict(json.loads(document.read_text(encoding="utf-8")))
    except (OSError, ValueError, KLineageError) as exc:
        raise MergeError(f"{document}: not a readable optimization document ({exc})") from None
    if (result.stats.evaluations, result.stop.value, result.best.fingerprint, result.speedup) != (
            run["evaluations"], run["stop"], run["best"], run["speedup"]):
        raise MergeError(f"{document} is not the run its part's row describes")
    return run | {"speedups_by_budget": result.speedups_by_budget()}


def merge(files: list[str], lineages: list[Lineage], left_out: list[Path], library: Library,
          library_ref: str) -> dict[str, Any]:
    """One document from parts: every strategy row from the part that ran it, the comparisons and
    summaries computed again over the corpus. Gates nothing. MergeError says why parts do not fit."""
    parts: list[tuple[str, dict[str, Any]]] = []
    for file in files:
        try:
            doc = json.loads(Path(file).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MergeError(f"{file}: not a readable JSON document ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("provenance"), dict) or "workloads" not in doc:
            raise MergeError(f"{file}: not a skills_eval document (no provenance or workloads)")
        parts.append((file, doc))
    for key in AGREE:
        values = {json.dumps(doc["provenance"].get(key)): file for file, doc in parts}
        if len(values) > 1:
            raise MergeError(f"the parts differ in {key}: " + "; ".join(f"{file}: {v}" for v, file in values.items()))
    facts = parts[0][1]["provenance"]
    if facts["library"] != library_ref:
        raise MergeError(f"the parts ran with library {facts['library']}, --library gives {library_ref}")
    try:
        mode = GateMode(facts["gate"])
    except ValueError:
        raise MergeError(f"gate {facts['gate']!r} is no gate mode: an --admission-only document has no "
                         f"workloads to merge") from None

    rows: dict[str, dict[str, Any]] = {}
    ran_by: dict[tuple[str, str], str] = {}  # (workload, strategy) -> the part's file
    first: dict[str, str] = {}  # workload -> the first part's file that has it
    measured: dict[str, tuple[float | None, str]] = {}  # workload -> vs_expert from the part that ran the library
    corpus_ids = [lineage_id(lin) for lin in lineages]
    for file, doc in parts:
        for part_row in doc["workloads"]:
            name = part_row["lineage"]
            if name not in corpus_ids:
                raise MergeError(f"{file}: workload {name} is not in the corpus read here: merge with the "
                                 f"--lineages the parts ran on")
            header = {k: v for k, v in part_row.items() if k != "strategies" and not k.startswith("vs_")}
            row = rows.setdefault(name, header | {"strategies": {}})
            first.setdefault(name, file)
            if header != {k: v for k, v in row.items() if k != "strategies" and not k.startswith("vs_")}:
                raise MergeError(f"{name}: {first[name]} and {file} do not describe the same workload")
            for strategy, result in part_row["strategies"].items():
                result = with_budgets(result, Path(file).parent / DOCUMENTS / document_name(name, strategy))
                if strategy in row["strategies"]:
                    if result != row["strategies"][strategy]:  # identical rows (a skipped one) are no conflict
                        raise MergeError(f"{name} {strategy}: both {ran_by[name, strategy]} and {file} ran it, "
                                         f"with different results; keep one")
                    continue
                row["strategies"][strategy], ran_by[name, strategy] = result, file
                if strategy == Strategy.LIBRARY.value:
                    measured[name] = (part_row["vs_expert"], part_row["vs_expert_reason"])
    merged = []
    for name in (n for n in corpus_ids if n in rows):
        row = rows[name]
        row["strategies"] = {s.value: row["strategies"][s.value] for s in STRATEGIES if s.value in row["strategies"]}
        compare(row, mode, measured.get(name))
        merged.append(row)
    expected = [s.value for s in STRATEGIES  # the rule rewriter alone is no strategy (skipped by design)
                if not (s is Strategy.NO_LIBRARY and facts["rewriter"] == RewriterKind.RULES.value)]
    ran = {n: rows[n]["strategies"] if n in rows else {} for n in corpus_ids}
    not_run = [{"lineage": n, "strategies": [s for s in expected if s not in ran[n]]}
               for n in corpus_ids if any(s not in ran[n] for s in expected)]
    missing = [n for n in corpus_ids if n not in rows]
    if missing or not_run:  # the headline needs every strategy on every workload
        unknown = {"value": None, "reason": (
            f"{len(missing)} corpus workload(s) ran in no part ({', '.join(missing)})" if missing else
            f"{len(not_run)} workload(s) did not run every strategy (not_run)") + ": unknown is not a number"}
        whole = [row for row in merged if row["vs_expert"] is not None and row["vs_unconditioned"] is not None]
        totals = {"roundtrip_min_vs_expert": unknown, "vs_unconditioned_geomean": unknown, "library_wasted": unknown,
                  "measured_subset": {"note": "over the workloads where both were measured only: not the headline",
                                      "workloads": [row["lineage"] for row in whole], **summaries(whole)}}
    else:
        totals = summaries(merged)

    def joined(key: str) -> Any:
        seen: dict[str, list[str]] = {}
        for file, doc in parts:
            seen.setdefault(str(doc["provenance"].get(key, "unknown")), []).append(Path(file).name)
        if len(seen) == 1:
            return next(iter(seen))
        return "mixed: " + "; ".join(f"{value} ({', '.join(names)})" for value, names in seen.items())

    limits = {json.dumps(doc["provenance"].get("time_limit_s")) for _, doc in parts}  # may differ by part, too
    provenance_ = ({key: joined(key) for key in MEASURED_ON} | {"date": now()} |
                   {k: facts[k] for k in AGREE if k in facts} |
                   {"time_limit_s": json.loads(limits.pop()) if len(limits) == 1 else joined("time_limit_s")} |
                   {"written_by": "bench/skills_eval.py --merge",
                    "parts": [{"file": _repo_relative(file), "partial": doc.get("partial"), **doc["provenance"]}
                              for file, doc in parts]})
    return {"provenance": provenance_, "admission_rate": admission_of(parts, library), **totals,
            "definitions": DEFINITIONS, "workloads": merged, "not_run": not_run,
            "lineages_left_out": left_out_of(left_out)}


def admission_of(parts: list[tuple[str, dict[str, Any]]], library: Library) -> dict[str, Any]:
    """The admission of the library the parts ran with, as they recorded it (the library file may
    have been rebuilt since); the library given here only where no part recorded it."""
    recorded = {json.dumps(doc["admission_rate"], sort_keys=True): file
                for file, doc in parts if "admission_rate" in doc}
    if len(recorded) > 1:
        raise MergeError("the parts ran with the library admitted differently: "
                         + "; ".join(f"{file}: {value}" for value, file in recorded.items()))
    return json.loads(next(iter(recorded))) if recorded else admission(library)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[cli_options.code_check(
        "the searches do not gate a candidate that runs its best kernel's machine code",
        "they gate every candidate (parts written before the check ran so)")])
    parser.add_argument("--gate", choices=[m.value for m in GateMode], default=config.gate_mode().value)
    parser.add_argument("--budget", type=int, default=16, help="gate evaluations per strategy and workload")
    parser.add_argument("--library", help="library JSON or SKILL.md folder (default: the bundled library)")
    parser.add_argument("--statuses", default="admitted", help="card statuses the library strategies retrieve")
    parser.add_argument("--rewriter", choices=[r.value for r in RewriterKind], default="rules")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rivals", type=int, default=RIVALS,
                        help=f"candidates a first improvement rules out, gated beside it (default {RIVALS}; 0: none)")
    parser.add_argument("--ordering", choices=[o.value for o in Ordering], default=DEFAULT_ORDERING.value,
                        help=f"how the library strategies order each round (default {DEFAULT_ORDERING.value}; parts "
                             f"written before orderings existed ran {Ordering.AS_PLANNED.value})")
    parser.add_argument("--lineages", default=str(config.corpus_dir() / "lineages"), help="folder of lineage JSON")
    parser.add_argument("--documents", help="also write every optimization document into this folder")
    parser.add_argument("--out", default=str(config.REPO_ROOT / "bench" / "results" / "skills.json"))
    parser.add_argument("--log", metavar="FILE", help=LOG_HELP)
    parser.add_argument("--time-limit-s", type=seconds, metavar="SECONDS",
                        help="each strategy run stops gating once it has taken this long: a run cut after N "
                             "evaluations compares only with runs that ended on their own within N")
    parser.add_argument("--hold-out-operator", action="store_true",
                        help="the library strategies of each workload see neither the walks of its operator nor "
                             "the cards learnt only from them: a new kernel's situation (transfer, not roundtrip)")
    parser.add_argument("--jobs", type=int, default=1, help="GPU gate: candidates whose correctness is judged "
                                                             "side by side before each is timed alone")
    parser.add_argument("--record", action="store_true",
                        help="GPU gate: keep every verdict used in the recorded store (KLINEAGE_RECORDED_DIR), "
                             "so that replay serves this run")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--admission-only", action="store_true",
                      help="report the library's admission alone; run no optimization (nothing is gated)")
    what.add_argument("--only", metavar="SPEC[,SPEC...]",
                      help="run a part: SPEC is an operator, expert or lineage id, optionally :STRATEGY")
    what.add_argument("--merge", nargs="+", metavar="FILE", help="join part documents into one; gates nothing")
    args = parser.parse_args(argv)
    args.statuses = [s.strip() for s in args.statuses.split(",") if s.strip()]
    only, args.only = args.only, [s.strip() for s in (args.only or "").split(",") if s.strip()]
    if only is not None and not args.only:
        parser.error("--only needs at least one SPEC")
    library_path = args.library or str(bundled_library())
    library = load_library(library_path)
    lineages, left_out = corpus_lineages(args.lineages)
    if args.merge:
        try:
            document = merge(args.merge, lineages, left_out, library, _repo_relative(library_path))
        except MergeError as exc:
            parser.error(f"--merge: {exc}")
    else:
        try:
            chosen = select(args.only, lineages) if args.only else None
        except ValueError as exc:
            parser.error(str(exc))
        document = evaluate(args, library, _repo_relative(library_path), lineages, left_out, chosen)
    out = Path(args.out)
    write(out, document)
    print(f"wrote {out}: admission {document['admission_rate']['value']}, roundtrip min "
          f"{document['roundtrip_min_vs_expert']['value']}, vs unconditioned "
          f"{document['vs_unconditioned_geomean']['value']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
