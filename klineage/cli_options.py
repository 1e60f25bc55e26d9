"""The arguments several `klineage` subcommands share, each defined here once, as argparse parent parsers.

A subcommand takes them with `parents=[...]`. Where subcommands give a shared flag a different default or
say something of their own about it (`--jobs` prefetches a walk's states but trials a library's cards), that
difference is a parameter of the helper, so the flag's name, type, choices and the common part of its help
stay in one place. Kept apart from `klineage/cli.py` so that the modules of the subcommands living beside
their engine parts (`skills/command.py`, `optimize/command.py`) import these and never the CLI itself.
"""

from __future__ import annotations

import argparse

from klineage.config import GateMode
from klineage.gate.policy import Placement


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)  # the subcommand's own parser adds -h


def problem() -> argparse.ArgumentParser:
    """The positional PROBLEM."""
    parent = _parent()
    parent.add_argument("problem", help="problem file, or the name of a bundled problem")
    return parent


def kernel() -> argparse.ArgumentParser:
    """The positional KERNEL."""
    parent = _parent()
    parent.add_argument("kernel", help="kernel folder (with launch.toml), or a bundled kernel name")
    return parent


def gate(compile_means: str = "") -> argparse.ArgumentParser:
    """--gate MODE, unset by default (then KLINEAGE_GATE decides, else gpu); `compile_means` says what a
    compile-only gate leaves this subcommand with."""
    parent = _parent()
    parent.add_argument("--gate", choices=[m.value for m in GateMode],
                        help="gpu, replay (recorded verdicts) or compile" + (f" ({compile_means})" if compile_means
                                                                              else ""))
    return parent


def placement(timings: str = "") -> argparse.ArgumentParser:
    """--placement: where the timed kernels sit; `timings` names the timings it applies to."""
    parent = _parent()
    parent.add_argument("--placement", choices=[p.value for p in Placement], default=Placement.AS_LOADED.value,
                        help=(f"{timings}: " if timings else "") + "where the timed kernels sit: as_loaded, or "
                        "exchanged (each timed in every kernel's place between trials: for kernels whose time moves "
                        "with where their code lands, docs/perf-notes.md)")
    return parent


def code_check(sass_means: str, none_means: str) -> argparse.ArgumentParser:
    """--code-check: what is compared before a kernel is gated against another (klineage.gate.machine_code);
    `sass_means` and `none_means` say what each choice does in this subcommand."""
    from klineage.gate.machine_code import CodeCheck  # compiles and disassembles: only where it is asked for

    parent = _parent()
    parent.add_argument("--code-check", choices=[c.value for c in CodeCheck], default=CodeCheck.SASS.value,
                        help=f"{CodeCheck.SASS.value} (default): {sass_means}; {CodeCheck.NONE.value}: {none_means}")
    return parent


def jobs(default: int, what: str, when: str) -> argparse.ArgumentParser:
    """--jobs N: how many kernels a GPU gate judges side by side (`what`: which kernels; `when`: in which part
    of the subcommand); the rest of the subcommand times one kernel at a time."""
    parent = _parent()
    parent.add_argument("--jobs", type=int, default=default,
                        help=f"GPU gate: judge {what} side by side {when} (default {default})")
    return parent


def record(what: str, scope: str = "") -> argparse.ArgumentParser:
    """--record: also keep `what` (verdicts) in the committed recorded store that replay serves; `scope`
    names the gate mode it is for, when only one."""
    parent = _parent()
    parent.add_argument("--record", action="store_true",
                        help=(f"{scope}: " if scope else "") + f"also keep {what} in the recorded store (commit it "
                                                               "for replay)")
    return parent


def library(*, folders: bool, role: str = "") -> argparse.ArgumentParser:
    """--library PATH: the skill library to read (`folders`: a folder of SKILL.md files too), unset by default
    (the bundled one); `role` says what else the subcommand does with it."""
    parent = _parent()
    parent.add_argument("--library", help="library JSON file" + (" or SKILL.md folder" if folders else "")
                        + (f" {role}" if role else "") + " (default: the bundled library, "
                        "corpus/library/library.json)")
    return parent


def out(what: str, default: str) -> argparse.ArgumentParser:
    """--out PATH: where the subcommand writes `what`, and where it does without it."""
    parent = _parent()
    parent.add_argument("--out", help=f"where to write {what} (default: {default})")
    return parent


def json_output(what: str) -> argparse.ArgumentParser:
    """--json: print `what` as JSON instead of tables or lines of text."""
    parent = _parent()
    parent.add_argument("--json", action="store_true", help=f"print {what} as JSON")
    return parent
