"""Does the library help on kernels it has never seen? The transfer benchmark (issue 27).

    python bench/transfer_eval.py --gate gpu --budget 24 --jobs 6 --out bench/results/transfer.json

For every held-out operator in bench/transfer/ (a problem file and a naive kernel, one thread per output
or per row; no corpus walk or card has seen them, and `library build` never reads the folder), optimize
the naive kernel with the bundled library and with the two unconditioned strategies under the same
budget of gate evaluations, then gate the naive kernel, and the library's best kernel once more against the
naive kernel (a paired ratio, outside the budget), each with the problem's vendor path (torch eager) timed
beside it: the search itself times no vendor.
Writes one JSON document:

- operators: how many operators ran;
- library_geomean_vs_naive: geometric mean over operators of naive time / library-best time (paired);
- library_beats_eager_fraction: the fraction of operators where the library's best is faster than eager;
- vs_unconditioned_geomean: geometric mean of the library's speedup over the naive kernel divided by the
  better of the two unconditioned strategies' speedups (each from its own run: a product of the step ratios along
  its own path, so two runs ending on one kernel can differ by the noise of their paths);
- vs_unconditioned_paired_geomean: the same comparison from the judging gates, paired: the library's best over
  naive divided by the better unconditioned search's best over naive, both gated against the naive kernel in the
  same way (1 where both ended on the same kernel);
- ceiling_geomean_vs_naive: geometric mean over operators of the roofline floor's speedup over the naive kernel
  (1 / the naive kernel's floor_fraction): what library_geomean_vs_naive would be were every best kernel at the
  memory (or math) bound;
- by_budget: at each budget N from 1 to the runs' own, the geometric mean over operators of each strategy's speedup
  had it stopped after N gate evaluations (read off the run's speedups_by_budget), and of the library's over the
  better unconditioned search's then ("vs_unconditioned"): how soon the cards pay, not only where the runs end;
- where_measured: the same three over the operators that gave theirs, named ("operators", out of "of"):
  what a partial run measured, kept apart from the headline numbers, which stay null until every operator did;
- rows: one per (operator, kernel, comparison): {"workload", "kernel", "vs", "ratio", "correct", "floor_fraction"},
  ratio = the other's time / this kernel's time (above 1: this kernel is faster), null with a "reason" when the
  gate measured none; floor_fraction = the roofline floor's time / this kernel's time on the headline case.
  torch.compile is not a path the gate can time, so it has no row.
- runs: per operator and strategy, the run's stop, evaluations, steps and speedups; `saved` (absent at 0): the
  candidates it did not gate because their card's timing precondition failed on the operator's problem.

Numbers come from the gate's verdicts only. A gate mode that times nothing (compile) gives null ratios
and null summaries, each with its reason. With `--record` every verdict (the searches' and the judging gates')
is kept in the recorded store, so `--gate replay` gives the same document again with no GPU, as long as the
code proposes the same kernels. `--only op1,op2` runs some operators (a part; `partial` is set);
`--merge part1.json part2.json ... --out FILE` gates nothing: it joins the parts' rows and runs and computes
the summaries again (null, with the reason, while some operator is in no part). An operator in two parts is
refused, unless `--replace`: then the later part's measurement stands (re-measured operators merged into an earlier
result). The merged provenance lists under "parts" which commit measured which operators, and when.

`--pending PART...` gates nothing either: it prints, comma-separated, the operators that none of the parts measured
on this machine's GPU (`klineage.gate.execute.gpu_name`) with the settings these arguments would record, so that a
GPU session of either card runs what that card still lacks (`bench/gpu_session.sh transfer:pending`).

`--merge ... --replay-budgets --library LIB` gives runs of parts written before runs kept speedups_by_budget theirs:
each search is replayed off its recorded verdicts and taken only where the replay is the run its part describes.

The library's row is the strategy `klineage optimize` runs by default (library_then_catalog: the cards, then the
catalog's forwards with the budget they leave); `--library-strategy library` measures the cards alone instead. The
part records which (`provenance.library_strategy`), and parts of two strategies never merge.

    python bench/transfer_eval.py --gate gpu --budget 8 --jobs 4 --only rms_norm,layer_norm --out part1.json
    python bench/transfer_eval.py --merge part1.json part2.json --out bench/results/transfer.json
    python bench/transfer_eval.py --merge bench/results/transfer.json part3.json --replace --out OUT.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klineage import cli_options  # noqa: E402
from klineage.config import GateMode  # noqa: E402
from klineage.errors import KLineageError  # noqa: E402
from klineage.fingerprint import sha256_json  # noqa: E402
from klineage.gate.pipeline import git_commit, run_gate  # noqa: E402
from klineage.gate.verdict import Status, Verdict  # noqa: E402
from klineage.kernel import load_kernel  # noqa: E402
from klineage.optimize import DEFAULT_POLICY, Strategy, optimize  # noqa: E402
from klineage.optimize.result import (  # noqa: E402
    CodeCheck,
    Stop,
    better_unconditioned,
    library_run,
    run_speedup_within,
)
from klineage.optimize.run_log import LOG_HELP, logged  # noqa: E402
from klineage.optimize.strategies import (  # noqa: E402
    DEFAULT_ORDERING,
    DEFAULT_STRATEGY,
    LIBRARY_STRATEGIES,
    RIVALS,
    UNCONDITIONED,
    Ordering,
)
from klineage.skills.library import bundled_library, load_library  # noqa: E402

BENCH = Path(__file__).resolve().parent / "transfer"
# The search times candidates against their parent only; the two judging gates also time torch eager beside them,
# which is what the eager rows compare with.
JUDGE_POLICY = DEFAULT_POLICY.with_(vendor=True)
# What a part must share with the others to be merged: its numbers answer the same question only then.
SETTINGS = ("gpu", "gate", "budget", "seed", "library", "library_fingerprint", "library_strategy", "rivals",
            "ordering", "code_check")
# A setting older parts did not record, read as the value they ran with.
SETTING_DEFAULTS = {"library_strategy": Strategy.LIBRARY.value, "rivals": 0, "ordering": Ordering.AS_PLANNED.value,
                    "code_check": CodeCheck.NONE.value}
SUMMARIES = ("library_geomean_vs_naive", "library_beats_eager_fraction", "vs_unconditioned_geomean",
             "vs_unconditioned_paired_geomean", "ceiling_geomean_vs_naive")


def operators() -> list[str]:
    return sorted(p.name for p in BENCH.iterdir() if (p / "problem.py").is_file() and (p / "naive").is_dir())


def ratio_of(verdict: Verdict | None, role: str) -> tuple[float | None, str]:
    """The verdict's paired ratio against `role` ("baseline" or "vendor"): their time / the kernel's."""
    if verdict is None:
        return None, "not gated"
    if verdict.status is not Status.PASSED:
        return None, f"the gate said {verdict.status.value}"
    if f"vs_{role}" not in verdict.profile.get("ratios", {}):
        return None, f"the gate timed no {role}"
    ratio = verdict.paired_ratio(f"vs_{role}")  # None where the timing never settled: no ratio to report
    return (ratio.overall, "") if ratio else (None, "the timing did not settle")


def gate(problem: Path, kernel: Any, mode: GateMode, record: bool, against: Any = None) -> tuple[Verdict | None, str]:
    """A judging gate, recorded with the search's verdicts when `record` on the GPU gate (so --gate replay gives
    its rows back); as the search does, a compile-only gate records nothing."""
    try:
        return run_gate(problem, kernel, against=against, policy=JUDGE_POLICY, mode=mode,
                        record=record and mode is GateMode.GPU), ""
    except KLineageError as exc:
        return None, f"the gate could not judge it: {exc}"


def floor_fraction(verdict: Verdict | None) -> float | None:
    """The gated kernel's share of the problem's roofline floor on the timed case (floor time / its median time):
    1.0 would be the memory (or math) bound itself. None where the gate timed nothing or the timing never settled."""
    if verdict is None or verdict.status is not Status.PASSED or verdict.unsettled:
        return None
    return verdict.profile.get("roofline", {}).get("fraction", {}).get("candidate")


def row(workload: str, kernel: str, vs: str, verdict: Verdict | None, role: str, why: str = "") -> dict[str, Any]:
    ratio, reason = ratio_of(verdict, role) if verdict is not None else (None, why or "not gated")
    # correct on every case only when the gate ran them all and passed; nothing ran under compile: unknown
    correct = None if verdict is None or verdict.status is Status.COMPILED else verdict.status is Status.PASSED
    return {"workload": workload, "kernel": kernel, "vs": vs, "ratio": ratio, "correct": correct,
            "floor_fraction": floor_fraction(verdict)} | ({"reason": reason} if reason else {})


def search(name: str, strategy: Strategy, mode: GateMode, budget: int, seed: int, jobs: int, library: Any,
           rivals: int, ordering: Ordering, code_check: CodeCheck, record: bool = False,
           log: str | None = None) -> dict[str, Any]:
    """One strategy's run from the operator's naive kernel, summarised (its best kernel under "best");
    its progress and events appended to `log` as they happen, when given."""
    problem, naive = BENCH / name / "problem.py", load_kernel(BENCH / name / "naive")
    result = optimize(problem, naive, strategy=strategy, budget=budget, gate_mode=mode,
                      library=library if strategy.uses_library else None, seed=seed, jobs=jobs, record=record,
                      rivals=rivals, ordering=ordering, code_check=code_check,
                      **logged(log, workload=name, strategy=strategy.value))
    return {"stop": result.stop.value, "message": result.message, "evaluations": result.stats.evaluations,
            **result.stats.saved_entry(),  # candidates a failed precondition or the code check kept from the gate
            "steps": [s.transform for s in result.steps], "speedup": result.speedup,
            "speedups_by_budget": result.speedups_by_budget(), "best": result.best,
            "best_fingerprint": result.best.fingerprint}


def with_budgets(document: dict[str, Any], library: Any) -> dict[str, Any]:
    """The document with speedups_by_budget on every search run that lacks them (parts written before runs kept
    them), from the same search replayed off its recorded verdicts: taken only where the replay is that very run
    (same evaluations, stop, best kernel and speedup), else a ValueError naming the run."""
    prov = document["provenance"]
    for name, runs in document["runs"].items():
        for strategy, run in runs.items():
            if "speedups_by_budget" in run or "evaluations" not in run:
                continue  # a run with them already, or one that failed to start
            try:
                again = search(name, Strategy(strategy), GateMode.REPLAY, prov["budget"], prov.get("seed", 0),
                               prov.get("jobs", 1), library, setting(prov, "rivals"),
                               Ordering(setting(prov, "ordering")), CodeCheck(setting(prov, "code_check")))
            except KLineageError as exc:
                raise ValueError(f"{name} {strategy}: its search does not replay ({exc})") from None
            keys = ("evaluations", "stop", "best_fingerprint", "speedup")
            differs = [f"{k} {again[k]!r}, not {run[k]!r}" for k in keys if again[k] != run[k]]
            if differs:
                raise ValueError(f"{name} {strategy}: the replay is not the run its part describes "
                                 f"({', '.join(differs)})")
            run["speedups_by_budget"] = again["speedups_by_budget"]
    return document


def replayed_library(part: dict[str, Any], path: str) -> Any:
    """The library at `path`, refused unless it is the one the part's library strategy drew on."""
    library = load_library(path)
    drew_on = part["provenance"].get("library_fingerprint")
    if drew_on != sha256_json(library.to_dict()):
        raise ValueError(f"the part of {', '.join(part['runs'])} drew on library {str(drew_on)[:12]}, not on "
                         f"{path}: --library must name the library the part ran with")
    return library


def by_budget(runs: dict[str, dict[str, Any]], names: list[str], budget: int) -> list[dict[str, Any]]:
    """At each budget from 1 to the runs' own: the geometric mean over operators of each strategy's speedup had it
    stopped there, and of the library's over the better unconditioned search's; null with the reason where some
    operator's run cannot tell (a part written before runs kept their speedups_by_budget)."""
    curve = []
    for n in range(1, budget + 1):
        point: dict[str, Any] = {"budget": n}
        # a failed run, or one whose start failed, measured nothing at any budget
        at = {name: {s: (run_speedup_within(run, n) if "evaluations" in run
                         and run.get("stop") != Stop.START_FAILED.value else None)
                     for s, run in runs[name].items()} for name in names}
        strategies = sorted({s for name in names for s in at[name]})
        for s in strategies:
            values = [at[name].get(s) for name in names]
            point[s] = geomean(values) if names and None not in values else None
        versus = []
        for name in names:
            mine = next((at[name][s.value] for s in LIBRARY_STRATEGIES if s.value in at[name]), None)
            theirs = [at[name].get(s.value) for s in UNCONDITIONED]
            versus.append(mine / max(theirs) if mine and None not in theirs else None)
        point["vs_unconditioned"] = geomean(versus) if names and None not in versus else None
        if None in point.values():
            point["reason"] = "some operator's run cannot tell its speedup at this budget"
        curve.append(point)
    return curve


def workload(name: str, args: argparse.Namespace, library: Any) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                                         list[Verdict]]:
    problem, naive = BENCH / name / "problem.py", load_kernel(BENCH / name / "naive")
    mode = GateMode(args.gate)
    runs: dict[str, Any] = {}
    for strategy in (Strategy(args.library_strategy), *UNCONDITIONED):
        print(f"  {name}: {strategy.value}", file=sys.stderr)
        try:
            runs[strategy.value] = search(name, strategy, mode, args.budget, args.seed, args.jobs, library, args.rivals,
                                          Ordering(args.ordering), CodeCheck(args.code_check), args.record, args.log)
        except KLineageError as exc:
            runs[strategy.value] = {"error": str(exc)}
    verdicts: list[Verdict] = []
    naive_verdict, why = gate(problem, naive, mode, args.record)
    rows = [row(name, "naive", "eager", naive_verdict, "vendor", why)]
    verdicts += [naive_verdict] if naive_verdict else []
    best = runs.get(args.library_strategy, {}).get("best")
    if best is None:
        rows += [row(name, "library_best", vs, None, "", "the library strategy did not run")
                 for vs in ("naive", "eager")]
    else:
        versus_naive, why = gate(problem, best, mode, args.record, against=naive)
        verdicts += [versus_naive] if versus_naive else []
        rows += [row(name, "library_best", "naive", versus_naive, "baseline", why),
                 row(name, "library_best", "eager", versus_naive, "vendor", why)]
    searched = better_unconditioned(runs)
    if searched is None:
        rows.append(row(name, "unconditioned_best", "naive", None, "", "no unconditioned search measured a speedup"))
    else:
        # the same judging gate as the library's best: the two are compared as paired ratios over one naive kernel
        versus_naive, why = gate(problem, searched["best"], mode, args.record, against=naive)
        verdicts += [versus_naive] if versus_naive else []
        rows.append(row(name, "unconditioned_best", "naive", versus_naive, "baseline", why))
    summary = {strategy: {k: v for k, v in run.items() if k != "best"} for strategy, run in runs.items()}
    return rows, summary, verdicts


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summaries(rows: list[dict[str, Any]], runs: dict[str, dict[str, Any]], names: list[str],
              of: int | None = None) -> dict[str, Any]:
    """The three headline numbers, each null with its reason unless every operator gave its inputs; and
    under "where_measured" the same three over the operators that did, named, so a partial run still
    says what it measured without passing for the whole benchmark."""
    def ratios(kernel: str, vs: str) -> dict[str, float | None]:
        return {r["workload"]: r["ratio"] for r in rows if r["kernel"] == kernel and r["vs"] == vs}

    def versus_unconditioned(name: str) -> float | None:
        # a run that could not gate its starting kernel measured nothing: its speedup of 1 is no ratio
        ran = runs[name]
        speedups = [None if run.get("stop") == Stop.START_FAILED.value else run.get("speedup")
                    for run in (library_run(ran), *(ran.get(s.value, {}) for s in UNCONDITIONED))]
        return speedups[0] / max(speedups[1:]) if None not in speedups else None

    def versus_paired() -> dict[str, float | None]:
        library, searched = ratios("library_best", "naive"), ratios("unconditioned_best", "naive")
        return {name: library[name] / searched[name] if library.get(name) and searched.get(name) else None
                for name in names}

    # the most any kernel could gain over the naive one: the roofline floor over the naive kernel's time
    ceilings = {r["workload"]: 1.0 / r["floor_fraction"] if r.get("floor_fraction") else None
                for r in rows if r["kernel"] == "naive" and r["vs"] == "eager"}
    inputs = {"library_geomean_vs_naive": (ratios("library_best", "naive"), geomean),
              "library_beats_eager_fraction": (ratios("library_best", "eager"),
                                               lambda values: sum(v > 1.0 for v in values) / len(values)),
              "vs_unconditioned_geomean": ({name: versus_unconditioned(name) for name in names}, geomean),
              "vs_unconditioned_paired_geomean": (versus_paired(), geomean),
              "ceiling_geomean_vs_naive": (ceilings, geomean)}
    out: dict[str, Any] = {}
    measured: dict[str, Any] = {}
    for key, (by_operator, summary) in inputs.items():
        known = {name: value for name, value in by_operator.items() if value is not None}
        everyone = bool(by_operator) and len(known) == len(by_operator) == len(names)
        out[key] = summary(list(known.values())) if everyone else None
        if not everyone:
            out[f"{key}_reason"] = "some operator has no ratio (its rows say why)"
        measured[key] = {"value": summary(list(known.values())) if known else None, "operators": sorted(known),
                         "of": of or len(names)}
    return out | {"where_measured": measured}


def setting(provenance: dict[str, Any], key: str) -> Any:
    return provenance.get(key, SETTING_DEFAULTS.get(key))


def settings_of(args: argparse.Namespace, library: Any, gpu: str) -> dict[str, Any]:
    """The SETTINGS a run with these arguments records, on `gpu`."""
    return {"gpu": gpu, "gate": args.gate, "budget": args.budget, "seed": args.seed,
            "library": shown_path(Path(args.library)),
            # what the cards were, not where they lay: parts drawn from different cards never merge
            "library_fingerprint": sha256_json(library.to_dict()),
            "library_strategy": args.library_strategy, "rivals": args.rivals, "ordering": args.ordering,
            "code_check": args.code_check}


def pending(parts: list[dict[str, Any]], names: list[str], wanted: dict[str, Any]) -> list[str]:
    """The operators of `names` that no part ran with the settings `wanted`."""
    done = {name for part in parts if all(setting(part["provenance"], k) == v for k, v in wanted.items())
            for name in part["runs"]}
    return [name for name in names if name not in done]


def sources(part: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a part's operators were measured: one entry per run of the script (a merged part keeps its list)."""
    provenance = part["provenance"]
    return provenance.get("parts") or [{"operators": sorted(part["runs"]), "git_commit": provenance.get("git_commit"),
                                        "date": provenance.get("date")}]


def merged(parts: list[dict[str, Any]], names: list[str], replace: bool = False) -> dict[str, Any]:
    """One document from the parts: their rows and runs joined. An operator in two parts is a ValueError, unless
    `replace`: then the later part's measurement replaces the earlier one (a re-measured operator)."""
    rows, runs, measured_in = [], {}, []
    for part in parts:
        first, this = parts[0]["provenance"], part["provenance"]
        differs = [f"{k} {setting(this, k)!r}, not {setting(first, k)!r}" for k in SETTINGS
                   if setting(this, k) != setting(first, k)]
        if differs:
            raise ValueError(f"the part of {', '.join(part['runs'])} ran with other settings ({'; '.join(differs)}): "
                             "its numbers do not answer the same question")
        twice = set(part["runs"]) & set(runs)
        if twice and not replace:
            raise ValueError(f"operator(s) {', '.join(sorted(twice))} are in two parts (--replace takes the later)")
        rows = [r for r in rows if r["workload"] not in twice] + part["rows"]
        runs = {name: run for name, run in runs.items() if name not in twice} | part["runs"]
        measured_in = [s | {"operators": [o for o in s["operators"] if o not in twice]} for s in measured_in]
        measured_in = [s for s in measured_in if s["operators"]] + sources(part)
    ran = [name for name in names if name in runs]
    # the settings all parts share; where and when each operator was measured is in "parts"
    shared = {k: v for k, v in parts[0]["provenance"].items() if k not in ("git_commit", "date", "note", "parts")}
    document = {"provenance": shared | {"merged_from": len(measured_in), "parts": measured_in},
                "operators": len(ran), **summaries(rows, runs, ran, of=len(names)),
                "by_budget": by_budget(runs, ran, setting(parts[0]["provenance"], "budget")),
                "rows": rows, "runs": runs}
    missing = sorted(set(names) - set(runs))
    if missing:
        document["partial"] = f"no part ran {', '.join(missing)}"
        for key in SUMMARIES:
            document[key], document[f"{key}_reason"] = None, "not every operator ran"
    return document


def shown_path(path: Path) -> str:
    """The library's path as the document names it: relative to the checkout where it lies inside it."""
    root = Path(__file__).resolve().parent.parent
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def write(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[cli_options.code_check(
        "the searches do not gate a candidate that runs its best kernel's machine code",
        "they gate every candidate (parts written before the check ran so)")])
    parser.add_argument("--gate", choices=[m.value for m in (GateMode.GPU, GateMode.REPLAY, GateMode.COMPILE_ONLY)],
                        default="gpu", help="gpu; replay: the recorded verdicts (no GPU); compile: nothing timed")
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rivals", type=int, default=RIVALS,
                        help=f"the searches' rivals: candidates a first improvement rules out, gated beside it "
                             f"(default {RIVALS}; parts written before rivals existed ran with 0)")
    parser.add_argument("--ordering", choices=[o.value for o in Ordering], default=DEFAULT_ORDERING.value,
                        help=f"how the library strategy orders each round (default {DEFAULT_ORDERING.value}; parts "
                             f"written before orderings existed ran {Ordering.AS_PLANNED.value})")
    parser.add_argument("--record", action="store_true", help="keep every verdict in the recorded store")
    parser.add_argument("--only", default="", help="comma-separated operators (default: all)")
    parser.add_argument("--merge", nargs="+", default=[], metavar="PART", help="join these parts' documents")
    parser.add_argument("--pending", nargs="+", default=[], metavar="PART",
                        help="print the operators none of these parts ran on this GPU with these settings; run nothing")
    parser.add_argument("--replace", action="store_true",
                        help="with --merge: an operator in two parts takes the later part's measurement")
    parser.add_argument("--replay-budgets", action="store_true",
                        help="with --merge: give runs written before they kept speedups_by_budget theirs, by "
                             "replaying each search off its recorded verdicts (checked to be the same run)")
    parser.add_argument("--note", default="", help="with --merge: a note on how the parts ran, kept in provenance")
    parser.add_argument("--library", default=str(bundled_library()),
                        help="the library the library strategy draws on (default: the bundled one)")
    parser.add_argument("--library-strategy", choices=[s.value for s in LIBRARY_STRATEGIES],
                        default=DEFAULT_STRATEGY.value,
                        help="library_then_catalog (optimize's default): the catalog's forwards with the budget the "
                             "cards leave; library: its cards alone")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "transfer.json"))
    parser.add_argument("--log", metavar="FILE", help=LOG_HELP)
    args = parser.parse_args(argv)
    names = operators()
    if args.merge:
        parts = [json.loads(Path(part).read_text(encoding="utf-8")) for part in args.merge]
        try:
            if args.replay_budgets:
                parts = [with_budgets(part, replayed_library(part, args.library)) for part in parts]
            document = merged(parts, names, replace=args.replace)
        except ValueError as exc:
            parser.error(str(exc))
        if args.note:
            document["provenance"]["note"] = args.note
        write(Path(args.out), document)
        print(json.dumps({k: v for k, v in document.items() if k not in ("rows", "runs")}, indent=1))
        return 0
    if args.pending:
        from klineage.gate.execute import gpu_name

        parts = [json.loads(Path(part).read_text(encoding="utf-8")) for part in args.pending]
        print(",".join(pending(parts, names, settings_of(args, load_library(args.library), gpu_name()))))
        return 0
    chosen = [n.strip() for n in args.only.split(",") if n.strip()] or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown operator(s) {', '.join(unknown)} (known: {', '.join(names)})")
    library = load_library(args.library)
    rows, runs, verdicts = [], {}, []
    for name in chosen:
        found, runs[name], gated = workload(name, args, library)
        rows += found
        verdicts += gated
    env = next((v.environment for v in verdicts if v.environment.get("gpu")), {})
    settings = settings_of(args, library, env.get("gpu", "none"))
    document = {"provenance": {"gpu": settings["gpu"], "driver": env.get("driver", "unknown"),
                               "torch": env.get("torch", "unknown"), "git_commit": git_commit(),
                               "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                               **settings, "jobs": args.jobs, "written_by": "bench/transfer_eval.py"},
                "operators": len(chosen), **summaries(rows, runs, chosen),
                "by_budget": by_budget(runs, chosen, args.budget), "rows": rows, "runs": runs}
    if chosen != names:
        document["partial"] = f"ran {len(chosen)} of {len(names)} operators"
    write(Path(args.out), document)
    print(json.dumps({k: v for k, v in document.items() if k not in ("rows", "runs")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
