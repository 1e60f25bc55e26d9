"""`klineage optimize`: the forward loop from the command line, with a live bar and a final table.

Lives beside the loop so the CLI module only registers it. Exit status: 0 when the run ended on
its own terms (budget, nothing left to try), 1 when the start kernel failed the gate or the gate
could not judge a candidate, 2 on an error (unknown problem or kernel, malformed library ...).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from klineage import cli_options, config, corpus
from klineage.config import GateMode
from klineage.errors import KLineageError

DEFAULT_BUDGET = 16


def seconds(text: str) -> float:
    """An argparse type: a time limit, a finite number of seconds > 0 (bench/skills_eval.py shares it)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"a time limit is a number of seconds > 0, not {text!r}")
    return value


def add_parser(commands: Any) -> argparse.ArgumentParser:
    from klineage.optimize.strategies import (
        DEFAULT_ORDERING,
        DEFAULT_STRATEGY,
        RIVALS,
        Ordering,
        RewriterKind,
        Strategy,
    )

    sub = commands.add_parser(
        "optimize", help="optimize a kernel with skill cards under the gate (or a baseline strategy, same budget)",
        parents=[cli_options.problem(), cli_options.library(folders=True),
                 cli_options.gate("nothing runs: nothing can be accepted"),
                 cli_options.jobs(1, "the correctness of this many candidates", "before timing each alone"),
                 cli_options.out("the result", "var/optimizations/<kernel>-<strategy>-<gate>.json"),
                 cli_options.json_output("the result document"),
                 cli_options.code_check("a candidate that runs the best kernel's machine code (the same SASS and "
                                        "resources, launched alike) is recorded same_code and not gated",
                                        "gate every candidate")])
    sub.add_argument("--from", dest="start", required=True, metavar="KERNEL",
                     help="the kernel to start from: a folder with launch.toml, or a bundled kernel name")
    sub.add_argument("--statuses", default="admitted",
                     help="comma-separated card statuses to retrieve (admitted, candidate, retired, imported); default "
                          "admitted")
    sub.add_argument("--strategy", choices=[s.value for s in Strategy], default=DEFAULT_STRATEGY.value,
                     help=f"where candidates come from (default {DEFAULT_STRATEGY.value}: the cards, then the "
                          "catalog's forwards with the budget they leave)")
    sub.add_argument("--rewriter", choices=[r.value for r in RewriterKind], default=RewriterKind.RULES.value,
                     help="rules: the catalog's mechanical forwards; llm: the LLM rewriter applies each card")
    sub.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                     help=f"gate evaluations, the start kernel's included (default {DEFAULT_BUDGET})")
    sub.add_argument("--seed", type=int, default=0, help="the random order of unconditioned_random")
    sub.add_argument("--require", type=float, help="paired improvement needed to take a candidate (default 1.01)")
    sub.add_argument("--lookahead", choices=["pairs", "none"], default="pairs",
                     help="pairs (default): when no single candidate is faster, try two in a row as one step")
    sub.add_argument("--rivals", type=int, default=RIVALS, metavar="N",
                     help=f"before a first improvement is taken, gate up to N candidates it would rule out and take "
                          f"the fastest (default {RIVALS}; 0: take the first improvement)")
    sub.add_argument("--ordering", choices=[o.value for o in Ordering], default=DEFAULT_ORDERING.value,
                     help="how a library strategy orders each round: measured (default) tries after the rest what "
                          "this run or the library measured paying less than a step; as_planned: the cards' order, "
                          "then the catalog's")
    sub.add_argument("--time-limit-s", type=seconds, metavar="SECONDS",
                     help="stop gating candidates once the run has taken this long (stop: time_limit)")
    sub.add_argument("--save", metavar="DIR", help="also write the best kernel as a kernel folder (kernel.cu + "
                                                   "launch.toml) that `klineage gate` takes as it is")
    return sub


def run(args: argparse.Namespace) -> int:
    from klineage.optimize.loop import optimize
    from klineage.optimize.result import DEFAULT_REQUIRED_RATIO, Stop
    from klineage.optimize.strategies import Strategy
    from klineage.report import console
    from klineage.skills.library import bundled_library

    mode = config.gate_mode(GateMode(args.gate) if args.gate else None)
    problem = corpus.problem_path(args.problem)
    start = corpus.kernel_entry(args.start).load()
    strategy = Strategy(args.strategy)
    library = args.library
    if library is None and strategy.uses_library:
        if not bundled_library().is_file():
            raise KLineageError(f"strategy {strategy.value} needs a library: give --library (no bundled library at "
                                f"{bundled_library()})")
        library = str(bundled_library())
    statuses = [s.strip() for s in args.statuses.split(",") if s.strip()]
    if library is not None and "admitted" in statuses:
        _say_short_of_todays_rule(library)
    with _bar(args.budget, enabled=not args.json) as (progress, on_event):
        result = optimize(problem, start, strategy=strategy, library=library, budget=args.budget, gate_mode=mode,
                          rewriter=args.rewriter, seed=args.seed, statuses=statuses,
                          required_ratio=args.require if args.require is not None else DEFAULT_REQUIRED_RATIO,
                          progress=progress, on_event=on_event, lookahead=args.lookahead, jobs=args.jobs,
                          time_limit_s=args.time_limit_s, rivals=args.rivals, ordering=args.ordering,
                          code_check=args.code_check)
    out = Path(args.out) if args.out else (config.data_dir() / "optimizations" /
                                           f"{start.name}-{strategy.value}-{mode.value}.json")
    result.save(out)
    if args.save:
        from klineage.kernel_export import write_kernel_folder

        write_kernel_folder(result.best, args.save)
    if args.json:
        print(result.to_json(), end="")
    else:
        _print(result, out, console)
        if args.save:
            console.print(f"best kernel ({result.best.fingerprint[:12]}) saved as a kernel folder: {args.save}")
    return 1 if result.stop in (Stop.START_FAILED, Stop.GATE_ERROR) else 0


def _say_short_of_todays_rule(path: str) -> None:
    """On stderr, the admitted cards of the library that today's admission rule would not admit: the run takes
    them as admitted, as the library says (its measurements ran so); the reader should know."""
    from klineage.skills.admission_rule import short_of_todays_rule
    from klineage.skills.library import load_library

    drifted = [(card, said) for card in load_library(path).admitted() for said in [short_of_todays_rule(card)] if said]
    if drifted:
        print(f"note: {len(drifted)} admitted card(s) of {path} would not be admitted by today's rule; this run takes "
              f"them as the library says (`klineage library show` names them):", file=sys.stderr)
        for card, said in drifted:
            print(f"  {card.short_id} {card.transform}: {said}", file=sys.stderr)


@contextmanager
def _bar(budget: int, enabled: bool) -> Iterator[tuple[Callable[[str, str, float | None], None],
                                                       Callable[[Any], None]]]:
    """A rich progress bar over the gate budget, with the stage, what it is doing and the best
    speedup so far; disabled, two silent callbacks."""
    if not enabled:
        yield (lambda stage, message, fraction: None), (lambda event: None)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from klineage.report import console

    bar = Progress(TextColumn("[bold]{task.fields[stage]}[/]"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("gate calls  best {task.fields[best]}"), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=console, transient=True)
    task = bar.add_task("starting", total=budget, stage="optimize", best="-")

    def update(stage: str, message: str, fraction: float | None) -> None:
        fields: dict[str, Any] = {"stage": stage, "description": " ".join(message.split())[:90]}
        if fraction is not None:
            fields["completed"] = round(fraction * budget)
        bar.update(task, **fields)

    def event(event: Any) -> None:
        best = "untimed" if event.speedup is None else f"{event.speedup:.3f}x"
        bar.update(task, completed=event.evaluations, best=best)

    with bar:
        yield update, event


def _print(result: Any, out: Path, console: Any) -> None:
    from klineage.report import table

    def short(anchor: Any) -> str:
        text = f"{anchor.kind}:{anchor.key}" if anchor is not None else "-"
        return text if len(text) <= 28 else text[:25] + "..."

    def named(transform: str) -> str:  # a path names every card's transform: first and last, and how many
        parts = transform.split("+")
        return transform if len(parts) <= 2 else f"{parts[0]}+...+{parts[-1]} ({len(parts)} cards)"

    if result.gate is GateMode.COMPILE_ONLY:
        console.print(f"[bold yellow]DRY RUN[/] {result.note}")
    taken = {s.attempt for s in result.steps}
    rows = []
    for a in result.attempts:
        why = f"{a.ratio.overall:.3f}x" if a.ratio else " ".join(a.message.split())[:80]
        rows.append([str(a.index), str(a.round), named(a.transform), a.card[:8] or "-", short(a.anchor),
                     a.status.value + (" (taken)" if a.index in taken else ""), why])
    table(f"Optimization of {result.start.name} on {result.problem.operator} ({result.strategy.value}, "
          f"{result.rewriter.value} rewriter, {result.gate.value} gate)",
          ["#", "step", "transform", "card", "anchor", "status", "ratio or why"], rows)
    if result.steps:
        table("Path", ["step", "transform", "card", "anchor", "best / new time"],
              [[str(s.index), named(s.transform), s.card[:8] or "-", short(s.anchor), f"{s.ratio.overall:.3f}"]
               for s in result.steps])
    stats = result.stats
    speed = "untimed" if result.speedup is None else f"{result.speedup:.3f}x over the start"
    console.print(f"[bold]{result.stop.value}[/]: {result.message}")
    saved = f", {stats.saved} saved by failed timing preconditions" if stats.saved else ""
    console.print(f"  {stats.evaluations} of {result.budget} gate evaluations ({stats.wasted} wasted{saved}), "
                  f"{stats.accepted} step(s) taken, best {result.best.fingerprint[:12]}: {speed}; "
                  f"written to {out}")


__all__ = ["DEFAULT_BUDGET", "add_parser", "run"]
