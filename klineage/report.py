"""Terminal output: verdict tables and a live progress line (rich)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from klineage.gate.verdict import Verdict

console = Console()


def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    grid = Table(title=title, title_justify="left")
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*row)
    console.print(grid)


LOGGED_STAGES = ("walk", "prefetch", "optimize", "admit")  # what a log (not a terminal) is told


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[Callable[[str, str], None]]:
    """A spinner naming the current stage and what it is doing, with the elapsed time."""
    if not enabled:
        yield lambda stage, message: None
        return
    started = time.monotonic()
    if not console.is_terminal:  # a log file: one line per step of the top-level work, not a spinner
        def line(stage: str, message: str) -> None:
            if stage in LOGGED_STAGES:
                console.print(f"[{time.monotonic() - started:7.1f} s] {stage}: {message}", markup=False,
                              highlight=False, soft_wrap=True)

        yield line
        return
    with console.status("starting") as status:
        def update(stage: str, message: str) -> None:
            status.update(f"[bold]{stage}[/bold] {message}  [dim]{time.monotonic() - started:5.1f} s[/dim]")

        yield update


def print_settlement(verdict: Verdict) -> None:
    """One line: whether the timing settled (and may decide), or what kept it unsettled."""
    settlement = verdict.profile.get("settlement")
    if not settlement:
        console.print("  [dim]timing: not checked for settling (a verdict of an earlier gate)[/dim]")
    elif verdict.unsettled:
        console.print(f"  [bold yellow]timing: unsettled[/] after {len(settlement['attempts'])} attempt(s): "
                      f"{'; '.join(settlement['reasons'])}. No acceptance decision; not cached as final")
    else:
        console.print(f"  timing: settled ({settlement['trials']} trials, spread <= {settlement['limits']['spread']}, "
                      f"trial ratios within {settlement['limits']['agreement']:.0%})")


def print_verdict(verdict: Verdict) -> None:
    colour = {"passed": "green", "compiled": "cyan", "rejected": "red", "error": "yellow"}[verdict.status.value]
    origin = verdict.provenance.get("served_from", "measured")
    console.print(f"[bold {colour}]{verdict.status.value.upper()}[/] {verdict.kernel['name']} on "
                  f"{verdict.problem['operator']}  [dim]({origin}; {verdict.kernel['fingerprint'][:12]})[/dim]")
    for finding in verdict.findings:
        where = f" [{finding.case}]" if finding.case else ""
        console.print(f"  [red]{finding.reason.value}[/]{where} {finding.stage}: {finding.message}")
    if verdict.environment.get("error"):
        console.print(f"  [yellow]harness error:[/] {verdict.environment['error'][:2000]}")
    resources = verdict.compile.get("resources", {}).get(verdict.compile.get("arch", ""), {})
    if resources:
        rows = [[entry, str(r["registers"]), str(r["shared_bytes"]), str(r["stack_bytes"]), str(r["spill_store_bytes"])]
                for entry, r in resources.items()]
        table("Resources", ["entry", "registers", "static smem", "stack", "spill stores"], rows)
    if verdict.correctness:
        rows = []
        for record in verdict.correctness:
            worst = max((o.get("rel_l2", 0.0) or 0.0 for s in record["seeds"] for o in s.get("outputs", {}).values()),
                        default=0.0)
            rows.append([record["case"], record["kernel"], str(len(record["seeds"])),
                         "yes" if record["passed"] else "NO", f"{worst:.2e}"])
        table("Correctness", ["case", "kernel", "seeds", "passed", "worst rel L2"], rows)
    profile = verdict.profile
    if profile.get("contenders"):
        fractions = profile.get("roofline", {}).get("fraction", {})
        rows = [[role, f"{s['median_us']:.1f}", f"{s['p10_us']:.1f}", f"{s['p90_us']:.1f}", str(s["count"]),
                 f"{fractions.get(role, 0):.0%}"] for role, s in profile["contenders"].items()]
        table(f"Timing, case {profile['case']} (us)", ["contender", "median", "p10", "p90", "count", "roofline"], rows)
        by_ratio = (profile.get("settlement") or {}).get("ratios", {})
        for name, ratio in profile.get("ratios", {}).items():
            trials = ", ".join(f"{r:.3f}" for r in ratio["per_trial"])
            state = f", {by_ratio[name]}" if name in by_ratio else ""
            console.print(f"  candidate {name}: [bold]{ratio['overall']:.3f}x[/] (trials {trials}{state})")
        print_settlement(verdict)
    for tool, report in verdict.sanitizer.items():
        console.print(f"  {tool}: {report.get('status')} ({report.get('errors')} errors)")
    if verdict.provenance.get("earlier_gate"):
        console.print(f"  [yellow]earlier gate:[/] {verdict.provenance['earlier_gate']}")
    if verdict.timings:
        console.print("  [dim]" + ", ".join(f"{k} {v:.2f} s" for k, v in verdict.timings.items()) + "[/dim]")
