"""`klineage ...`: a thin face over the engine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from klineage import __version__, config, corpus
from klineage.config import GateMode
from klineage.errors import KLineageError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="klineage", description="Learn when GPU-kernel optimizations are sound.")
    parser.add_argument("--version", action="version", version=f"klineage {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    gate = commands.add_parser("gate", help="judge a kernel: static check, compile, correctness, profile")
    gate.add_argument("problem", help="problem file, or the name of a bundled problem")
    gate.add_argument("kernel", help="kernel folder (with launch.toml), or a bundled kernel name")
    gate.add_argument("--against", help="a baseline kernel to time against, or 'vendor' (the problem's vendor path)")
    gate.add_argument("--compile-only", action="store_true", help="static check, compile and features; run nothing")
    gate.add_argument("--gate", choices=[m.value for m in GateMode], help="gpu, replay (recorded verdicts) or compile")
    gate.add_argument("--cases", help="comma-separated case names (default: every case the kernel supports)")
    gate.add_argument("--seeds", type=int, default=3)
    gate.add_argument("--no-timing", action="store_true")
    gate.add_argument("--sanitize", choices=["never", "on_pass", "always"], default="on_pass")
    gate.add_argument("--require", type=float, default=0.0, help="paired acceptance: candidate >= R x baseline")
    gate.add_argument("--record", action="store_true", help="also store the verdict in the committed recorded store")
    gate.add_argument("--json", action="store_true", help="print the verdict as JSON")

    problems = commands.add_parser("problems", help="list bundled problems")
    problems.add_argument("--json", action="store_true")
    kernels = commands.add_parser("kernels", help="list bundled kernels")
    kernels.add_argument("--adversarial", action="store_true", help="list the adversarial suite instead")
    kernels.add_argument("--json", action="store_true")

    args = parser.parse_args(argv)
    try:
        return {"gate": _gate, "problems": _problems, "kernels": _kernels}[args.command](args)
    except KLineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _gate(args: argparse.Namespace) -> int:
    from klineage.gate.policy import GatePolicy, Sanitize
    from klineage.gate.pipeline import run_gate
    from klineage.report import print_verdict, progress_display

    mode = GateMode.COMPILE_ONLY if args.compile_only else config.gate_mode(GateMode(args.gate) if args.gate else None)
    against = corpus.kernel_entry(args.against).load() if args.against and args.against != "vendor" else None
    policy = GatePolicy(seeds=args.seeds, timing=not args.no_timing,
                        sanitize=Sanitize(args.sanitize), require_ratio=args.require)
    kernel = corpus.kernel_entry(args.kernel).load()
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None
    with progress_display(enabled=not args.json) as progress:
        verdict = run_gate(corpus.problem_path(args.problem), kernel, against=against, cases=cases, policy=policy,
                           mode=mode, progress=progress, record=args.record)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=1))
    else:
        print_verdict(verdict)
    return 0 if verdict.status.value in ("passed", "compiled") else 1


def _problems(args: argparse.Namespace) -> int:
    from klineage.gate.execute import probe_problem

    rows: list[dict[str, Any]] = []
    for path in corpus.list_problems():
        probe = probe_problem(path, config.cache_dir())
        info = probe.info
        rows.append({"name": path.stem, "operator": info.operator, "cases": [c.name for c in info.cases],
                     "headline": info.headline, "vendor": info.has_vendor, "legacy": info.legacy,
                     "sound": not probe.numerics})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from klineage.report import table

    table("Problems", ["name", "operator", "headline", "cases", "vendor path"],
          [[r["name"], r["operator"], r["headline"], ", ".join(r["cases"]), "yes" if r["vendor"] else "no"]
           for r in rows])
    return 0


def _kernels(args: argparse.Namespace) -> int:
    rows = []
    for entry in corpus.list_kernels(adversarial=args.adversarial):
        state = entry.load()
        row = {"name": entry.name, "problem": state.plan.problem, "arch": state.plan.arch,
               "supports": state.plan.supports or "every case", "fingerprint": state.fingerprint[:12]}
        if args.adversarial:
            row["expected"] = entry.expectation.get("reason", "?")
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from klineage.report import table

    columns = list(rows[0]) if rows else ["name"]
    table("Adversarial suite" if args.adversarial else "Kernels", columns, [[str(r[c]) for c in columns] for r in rows])
    return 0
