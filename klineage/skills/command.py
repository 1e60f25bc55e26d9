"""`klineage library build|show|export|import`: the skill library from the command line.

- build: induce cards from lineage files (default: the bundled `corpus/lineages/`, one walk per
  expert and gate mode, the longest) and write the library JSON (default:
  `corpus/library/library.json`) with its provenance;
- show: the library's cards as a table, or one card (by id or short id) as JSON;
- export: one SKILL.md folder per card, for coding agents;
- import: the cards of a SKILL.md folder join a library as `imported` (a report line per file);
- admit: held-out roundtrip trials of the cards (`admission_run.admit_cards`) on the bundled
  kernels and the other lineages' states, under the gate mode asked for (gpu on a GPU host; compile
  or replay here, where every trial is inconclusive), written back into the library with every
  trial logged, after every card trialled; run again on the file it wrote, it resumes (`--redo`
  trials every card again), and `--budget-s` starts no card that would end past the budget.
Kept beside the library so that `klineage/cli.py` only wires it in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from klineage import cli_options, config
from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate.policy import Placement

if TYPE_CHECKING:
    from collections.abc import Collection

    from klineage.skills.library import Library
    from klineage.walk.step_code import StepCodes


def add_parser(commands: argparse._SubParsersAction) -> None:
    library = commands.add_parser("library", help="build, show or export the skill library")
    actions = library.add_subparsers(dest="library_command", required=True)
    build = actions.add_parser("build", help="induce the cards of lineage files into a library JSON",
                               parents=[cli_options.out("the library", "corpus/library/library.json")])
    build.add_argument("lineages", nargs="*", help="lineage JSON files (default: corpus/lineages/, longest walk "
                                                   "per expert and gate mode)")
    build.add_argument("--note", default="", help="a sentence for the provenance")
    build.add_argument("--keep-trials", metavar="LIBRARY", action="append", default=[],
                       help="carry the admission trials (and status) of this library's unchanged cards over; "
                            "repeatable: of several, each card keeps the longest log (lanes that trialled "
                            "different cards join)")
    build.add_argument("--per-case", choices=["use", "ignore"], default="use",
                       help="use the steps' recorded per-case timings (bench/percase.py) as the cards' effects and "
                            "to induce when they pay, or ignore them (a library admitted before they were measured "
                            "stays reproducible until it is admitted again); recorded in the provenance")
    build.add_argument("--step-code", metavar="FILE", default=None,
                       help="which steps ran their parent's machine code (bench/step_code.py): their timings are left "
                            "out of the cards' effects, said in their diagnostics (default: corpus/"
                            "step_code.json where it exists; 'none' reads no record); recorded in the provenance")
    show = actions.add_parser("show", help="list the library's cards, or print one",
                              parents=[cli_options.library(folders=True),
                                       cli_options.json_output("the whole library document")])
    show.add_argument("card", nargs="?", help="a card id or unique id prefix: print that card as JSON")
    fit = actions.add_parser("fit", help="which cards would act on a kernel, and why each other card would not "
                                         "(retrieval, without a compile or a gate)",
                             parents=[cli_options.kernel(), cli_options.library(folders=True),
                                      cli_options.json_output("every card's fit")])
    fit.add_argument("--problem", help="problem file or bundled problem name (default: the one the kernel's plan "
                                       "names)")
    fit.add_argument("--statuses", default="admitted",
                     help="comma-separated card statuses to consider (default admitted)")
    fit.add_argument("--all", action="store_true", help="list the cards that would not act too, with why")
    export = actions.add_parser("export", help="write one <transform>-<short id>/SKILL.md per card",
                                parents=[cli_options.library(folders=True)])
    export.add_argument("folder")
    written_over = cli_options.out("the library", "over the one read")
    take = actions.add_parser("import", help="add the cards of a SKILL.md folder to a library, as 'imported'",
                              parents=[cli_options.library(folders=False, role="to add to"), written_over,
                                       cli_options.json_output("the per-file report")])
    take.add_argument("folder", help="a folder of SKILL.md files (this project's, the reference's, agent skills)")
    admit = actions.add_parser(
        "admit", help="held-out roundtrip trials; admitted cards are written back",
        parents=[cli_options.library(folders=False), written_over, cli_options.gate(),
                 cli_options.placement("the trials' timing"),
                 cli_options.record("every trial's verdict", scope="GPU gate"),
                 cli_options.jobs(1, "the correctness of about this many cards' trial kernels",
                                  "before each trial times alone"),
                 cli_options.code_check("a target where the card's kernel runs the target's own machine code (the "
                                        "compiler already did it) is no target", "any target where the card applies")])
    admit.add_argument("--lineages", nargs="+", default=[], metavar="WALK",
                       help="lineage files the library was built from besides corpus/lineages (e.g. "
                            "bench/walks/*.gpu.json.gz): their steps give the held-out cases of the cards they source")
    admit.add_argument("--card", action="append", default=[], help="a card id or prefix (repeatable; default: all)")
    admit.add_argument("--limit", type=int, default=3, help="targets gated per card")
    admit.add_argument("--redo", action="store_true",
                       help="trial every chosen card, also those the library already decides on the same evidence")
    admit.add_argument("--rejudge", action="store_true",
                       help="run no gate: judge the chosen cards' timed trials again under today's rule, from the "
                            "paired ratios they recorded")
    admit.add_argument("--measurements", nargs="+", default=[], metavar="LIBRARY",
                       help="earlier libraries whose trials a trial of the same kernel on the same target, case, "
                            "policy and GPU reads instead of gating it again (a card a new walk renamed keeps its "
                            "evidence), judged against the card's own required ratio")
    admit.add_argument("--budget-s", type=float, metavar="SECONDS",
                       help="start no card once this many seconds have passed, nor one that would end past them "
                            "(judged by the longest card so far); the rest are left undecided for a re-run")


def run(args: argparse.Namespace) -> int:
    return {"build": _build, "show": _show, "fit": _fit, "export": _export, "import": _import, "admit": _admit}[
        args.library_command](args)


def _step_codes(given: str | None) -> StepCodes | None:
    """The step-code record `--step-code` names: the bundled one where none is named and it exists, none for 'none'."""
    from klineage.walk.step_code import StepCodes

    if given == "none":
        return None
    path = Path(given) if given else config.corpus_dir() / "step_code.json"
    return StepCodes.load(path) if given or path.exists() else None


def _build(args: argparse.Namespace) -> int:
    from klineage.lineage import Lineage
    from klineage.skills.library import (
        build_library,
        bundled_library,
        corpus_lineages,
        default_provenance,
        problem_infos,
        save_library,
    )
    from klineage.walk.timing_audit import percase_timing, retimed_effect

    if args.lineages:
        lineages, left_out = [Lineage.load(p) for p in args.lineages], []
    else:
        lineages, left_out = corpus_lineages()
    if not lineages:
        raise KLineageError("no lineage to build a library from")
    problems = problem_infos({lineage.problem.operator for lineage in lineages})
    codes = _step_codes(args.step_code)
    provenance = {**default_provenance(lineages, args.note), "per_case": args.per_case,
                  **({"step_code": {"toolchain": codes.toolchain, "same": codes.same()}} if codes else {})}
    library = build_library(lineages, problems, provenance, retimed_effect,
                            percase_timing if args.per_case == "use" else None,
                            codes.of if codes else None)
    for earlier in args.keep_trials:
        from klineage.skills.admission import carry_trials

        before = _load(earlier)
        library, carried, history = carry_trials(library, before)
        print(f"carried the trials and status of {carried} card(s) over from {earlier} (unchanged, or changed "
              f"only in effects under which every recorded trial reads the same)"
              + (f"; {history} changed card(s) keep their trials as history, candidates again" if history else ""))
        _say_kept_out(library, before)
    out = save_library(library, args.out or bundled_library())
    for path in left_out:
        print(f"left out {path.name}: a GPU walk, or a longer walk, of the same expert is used")
    statuses = {}
    for card in library.cards:
        statuses[card.status.value] = statuses.get(card.status.value, 0) + 1
    print(f"{len(library.cards)} cards ({', '.join(f'{n} {s}' for s, n in sorted(statuses.items())) or 'none'}) "
          f"from {len(lineages)} lineages written to {out}")
    return 0


def _say_kept_out(library, earlier) -> None:
    """Each card admitted in `earlier` that its per-case effects now keep out (admission_rule.when_allows)."""
    from klineage.skills.card import CardStatus
    from klineage.skills.when import unpaid_when

    was = {card.id: card.status for card in earlier.cards}
    for card in library.cards:
        unpaid = unpaid_when(card)
        if was.get(card.id) is CardStatus.ADMITTED and card.status is not CardStatus.ADMITTED and unpaid is not None:
            print(f"{card.short_id} {card.transform:20s} admitted -> {card.status.value}: {unpaid.sentence}")


def _load(path: str | None):
    from klineage.skills.library import bundled_library, load_library

    return load_library(path or bundled_library())


def _show(args: argparse.Namespace) -> int:
    library = _load(args.library)
    if args.card:
        print(library.by_id(args.card).to_json(), end="")
        return 0
    if args.json:
        print(json.dumps(library.to_dict(), indent=1, sort_keys=True))
        return 0
    import statistics

    from klineage.report import console, table
    from klineage.skills.admission_rule import short_of_todays_rule
    from klineage.skills.when import card_when, when_label

    drift = {c.id: short_of_todays_rule(c) for c in library.cards}  # rejudges each card's trials: once, here
    # A card timed per case has dozens of effects: the median and the *when* say what they do.
    table(f"Skill library ({len(library.cards)} cards)", ["id", "transform", "status", "operators", "provides",
                                                          "median of effects", "when it pays", "evidence"],
          [[c.short_id, c.transform, c.status.value + (" (not by today's rule)" if drift[c.id] else ""),
            ", ".join(c.scope.operators),
            ", ".join(map(str, sorted(c.provides))) or "-",
            f"{statistics.median(e.ratio for e in c.effects):.2f}x of {len(c.effects)}" if c.effects else "untimed",
            when_label(card_when(c)), str(len(c.evidence))]
           for c in library.cards])
    for key, value in sorted(library.provenance.items()):
        console.print(f"  {key}: {value}")
    for card in library.cards:
        if drift[card.id]:
            console.print(f"  {card.short_id} {card.transform}: {drift[card.id]}")
    return 0


def _fit(args: argparse.Namespace) -> int:
    """Every card's fit on the kernel (`retrieval.assess`): the proposed ones in the order the optimizer
    would try them, then, with --all, the others with why. The problem is probed in the sandbox."""
    from klineage import config, corpus
    from klineage.gate.execute import probe_problem
    from klineage.report import console, table
    from klineage.skills.card import SHORT_ID, CardStatus
    from klineage.skills.library import lineage_index
    from klineage.skills.retrieval import Fit, assess

    library = _load(args.library)
    state = corpus.kernel_entry(args.kernel).load()
    problem = probe_problem(corpus.problem_path(args.problem or state.plan.problem), config.cache_dir()).info
    statuses = tuple(CardStatus(s.strip()) for s in args.statuses.split(",") if s.strip())
    found = [a.to_dict() for a in assess(state, problem, library.cards, statuses=statuses, lineages=lineage_index(),
                                         every_case=True)]
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    proposed = [a for a in found if a["fit"] == Fit.PROPOSED.value]
    table(f"{len(proposed)} of {len(found)} cards would be tried on {state.name} ({problem.operator}, headline "
          f"{problem.headline}; a card with no forward site found here is tried at its walks' anchors)",
          ["#", "card", "transform", "status", "when it pays", "sites", "why"],
          [[str(i), a["card"][:SHORT_ID], a["transform"], a["status"],
            a["when"] + (f"; ruled out on {', '.join(a['fails_on'])}" if a["fails_on"] else ""),
            str(a["sites"]) if a["sites"] else "none found", "; ".join(a["reasons"])]
           for i, a in enumerate(proposed, 1)])
    if args.all:
        table("the other cards, and why not", ["card", "transform", "fit", "why"],
              [[a["card"][:SHORT_ID], a["transform"], a["fit"], a["why"]] for a in found if a not in proposed])
    else:
        console.print(f"  {len(found) - len(proposed)} other card(s) would not be tried here: --all says why")
    return 0


def _export(args: argparse.Namespace) -> int:
    from klineage.skills.skillmd import export_skillmd

    library = _load(args.library)
    written = export_skillmd(list(library.cards), args.folder)
    print(f"{len(written)} SKILL.md files written under {args.folder}")
    return 0


def _import(args: argparse.Namespace) -> int:
    """Cards read from SKILL.md files join the library as `imported`, without the trials they carry (those
    were judged by another gate): only a trial on this gate admits them. A report line per file."""
    import dataclasses

    from klineage.skills.card import CardStatus
    from klineage.skills.library import Library, bundled_library, save_library
    from klineage.skills.skillmd import FileReport, ImportOutcome, read_folder

    library = _load(args.library)
    known = {c.id: c for c in library.cards}
    reports, taken = [], []
    for report in read_folder(args.folder):
        if report.card is not None and report.card.id in known:
            report = FileReport(report.path, report.form, ImportOutcome.REFUSED,
                                f"card {report.card.short_id} is already in the library "
                                f"({known[report.card.id].status.value})")
        elif report.card is not None:
            taken.append(dataclasses.replace(report.card, status=CardStatus.IMPORTED, verification_log=()))
        reports.append(report)
    out = Path(args.out or args.library or bundled_library())
    if taken:
        save_library(Library(cards=(*library.cards, *taken), provenance=library.provenance), out)
    if args.json:
        print(json.dumps([{"path": r.path, "form": r.form, "outcome": r.outcome.value, "message": r.message}
                          for r in reports], indent=1))
    else:
        for r in reports:
            print(f"{r.outcome.value:8} {r.form:12} {r.path}: {r.message}")
        print(f"{len(taken)} card(s) imported into {out}" if taken else "nothing imported")
    return 0 if taken or not reports else 1


def _rejudge(library: Library, chosen: Collection[str], out: Path) -> int:
    import dataclasses
    import datetime as dt

    from klineage.skills.admission_rule import rejudge
    from klineage.skills.library import save_library
    from klineage.skills.trial_reading import trial_outcome

    cards, changed, decided = [], 0, 0
    for card in library.cards:
        if card.id in chosen:
            updated, trials = rejudge(card)
            for trial in trials:
                print(f"{card.short_id} {card.transform:20} {trial.ratio:.3f}x -> {trial_outcome(trial).value}; "
                      f"{card.status.value} -> {updated.status.value}")
            if not trials and updated.status is not card.status:
                print(f"{card.short_id} {card.transform:20} same trials, today's status rule; "
                      f"{card.status.value} -> {updated.status.value}")
            changed += len(trials)
            decided += updated.status is not card.status
            card = updated
        cards.append(card)
    provenance = dict(library.provenance)
    if changed or decided:
        when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        provenance["admission"] = (f"{provenance.get('admission', 'roundtrip trials')}; {changed} trial(s) "
                                   f"re-judged from their recorded ratios and {decided} status(es) decided again "
                                   f"on {when} (no gate ran)")
    save_library(dataclasses.replace(library, cards=tuple(cards), provenance=provenance), out)
    print(f"{changed} trial(s) of {len(chosen)} card(s) judged otherwise now, {decided} status(es) changed; "
          f"written to {out}")
    return 0


def _admit(args: argparse.Namespace) -> int:
    import dataclasses
    import datetime as dt
    import time

    from klineage import corpus
    from klineage.gate.machine_code import CodeCheck
    from klineage.lineage import Lineage
    from klineage.report import progress_display
    from klineage.skills.admission import held_out_targets, measurements
    from klineage.skills.admission_run import CardOutcome, CardRun, admit_cards, gate_of, setting_for
    from klineage.skills.induction import lineage_id
    from klineage.skills.library import bundled_library, corpus_lineages, problem_infos, save_library
    from klineage.skills.trial_reading import trial_outcome

    started = time.monotonic()  # the budget counts from here: a wrapper's timeout counts loading too
    if args.budget_s is not None and args.budget_s < 0:
        raise KLineageError(f"--budget-s must be 0 or more seconds, not {args.budget_s:g}")
    source = Path(args.library) if args.library else bundled_library()
    out = Path(args.out) if args.out else source
    library = _load(str(source))
    named = list(dict.fromkeys(library.by_id(c).id for c in args.card))  # in the order given, each once
    chosen = named or {c.id for c in library.cards}
    if args.rejudge:
        return _rejudge(library, chosen, out)
    mode = config.gate_mode(GateMode(args.gate) if args.gate else None)
    setting = setting_for(mode, Placement(args.placement))
    lineages, _ = corpus_lineages()
    given = {lineage_id(lin): lin for lin in map(Lineage.load, args.lineages)}
    lineages = [lin for lin in lineages if lineage_id(lin) not in given] + list(given.values())
    states = {entry.name: entry.load() for entry in corpus.list_kernels()}
    problems = problem_infos({s.plan.problem for s in states.values()} | {lin.problem.operator for lin in lineages})
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    where = f" on an {setting.gpu}" if mode is GateMode.GPU else ""
    earlier = [_load(path) for path in args.measurements]
    read = {"measurements_read": [lib.provenance.get("admission", path)
                                  for lib, path in zip(earlier, args.measurements)]}
    library = dataclasses.replace(library, provenance={
        **library.provenance, "admission": f"roundtrip trials under the {mode.value} gate{where} on {when}",
        **(read if earlier else {})})
    counts: dict[str, int] = {}
    reported: list[CardRun] = []

    def report(run: CardRun) -> None:
        reported.append(run)
        outcomes = [trial_outcome(t).value for t in run.trials] or [run.outcome.value]
        for outcome in outcomes:
            counts[outcome] = counts.get(outcome, 0) + 1
        took = f" ({run.seconds:.1f} s)" if run.trials else ""
        print(f"[{len(reported)}/{len(chosen)}] {run.card.short_id} {run.card.transform:20} "
              f"{run.card.status.value:10} {', '.join(outcomes)}{took}")

    with progress_display() as show:
        current = ""

        def progress(stage: str, message: str) -> None:
            nonlocal current
            if stage == "admit":  # "[i/n] <card> <transform>: what now"
                current = message.split(":")[0]
                show(stage, message)
            else:  # a gate stage, named after the card it judges
                show(stage, f"{current}: {message}")

        updated, runs = admit_cards(
            library, chosen, lambda c: held_out_targets(c, lineages, states, args.limit, problems,
                                                        CodeCheck(args.code_check)), corpus.problem_path,
            gate_of(setting, progress, args.record), setting, lambda partial: save_library(partial, out),
            problems=problems,
            limit=args.limit, redo=args.redo, deadline=None if args.budget_s is None else started + args.budget_s,
            progress=progress, on_card=report, jobs=args.jobs,
            measured=measurements(earlier))
    save_library(updated, out)
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no card"
    print(f"{summary}; admitted cards {len(library.admitted())} -> {len(updated.admitted())}; written to {out}")
    left = sum(run.outcome is CardOutcome.LEFT_UNDECIDED for run in runs)
    if left:
        print(f"the {args.budget_s:g} s budget is spent: {left} card(s) left undecided; run admit again with "
              f"--library {out} to resume")
    return 0
