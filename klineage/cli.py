"""`klineage ...`: a thin face over the engine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from klineage import __version__, cli_options, config, corpus, kernel_export
from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate import recorded_command  # `klineage recorded` lives beside the store
from klineage.gate.policy import GatePolicy, Placement
from klineage.optimize import command as optimize_command  # `klineage optimize` lives beside its loop
from klineage.skills import command as library_command  # `klineage library` lives beside the library


def parser() -> argparse.ArgumentParser:
    """The `klineage` command line; `klineage kernel export` lives beside the folder writer."""
    top = argparse.ArgumentParser(prog="klineage", description="Learn when GPU-kernel optimizations are sound.")
    top.add_argument("--version", action="version", version=f"klineage {__version__}")
    commands = top.add_subparsers(dest="command", required=True)

    gate = commands.add_parser(
        "gate", help="judge a kernel: static check, compile, correctness, profile",
        parents=[cli_options.problem(), cli_options.kernel(), cli_options.gate(), cli_options.placement(),
                 cli_options.record("the verdict"), cli_options.json_output("the verdict")],
        epilog="exit status: 0 passed (or compiled); 1 rejected, or the gate failed; 2 bad input; 3 passed, but the "
               "timing never settled: no speed decision (docs/gate.md)")
    gate.add_argument("--against", help="a baseline kernel to time against, or 'vendor' (the problem's vendor path)")
    gate.add_argument("--compile-only", action="store_true", help="static check, compile and features; run nothing")
    gate.add_argument("--cases", help="comma-separated case names (default: every case the kernel supports)")
    gate.add_argument("--seeds", type=int, default=3)
    gate.add_argument("--no-timing", action="store_true")
    gate.add_argument("--sanitize", choices=["never", "on_pass", "always"], default="on_pass")
    # Not optimize's --require: here 0 (the default) asks nothing, there unset means DEFAULT_REQUIRED_RATIO.
    gate.add_argument("--require", type=float, default=0.0, help="paired acceptance: candidate >= R x baseline")

    walk = commands.add_parser(
        "walk", help="walk an expert kernel backward, one gated simplification at a time",
        parents=[cli_options.kernel(), cli_options.gate("a dry walk: unverified"),
                 cli_options.placement("the forward timings"),
                 cli_options.record("every verdict the walk used", scope="GPU walk"),
                 cli_options.jobs(6, "this many states of the guessed walk", "while prefetching"),
                 cli_options.out("the lineage JSON", "var/lineages/<kernel>-<gate>.json"),
                 cli_options.code_check("a step whose child runs its parent's machine code is recorded same_code and "
                                        "its forward not timed", "every verified forward is timed (with --as-in: "
                                        "the earlier walk's)")])
    walk.add_argument("--problem", help="problem file or bundled problem (default: the plan's problem)")
    # Not optimize's --rewriter: the same two choices, but optimize's are its RewriterKind, which the walk has not.
    walk.add_argument("--rewriter", choices=["rules", "llm"], default="rules")
    walk.add_argument("--max-steps", type=int, default=16)
    walk.add_argument("--max-rejections", type=int, default=4)
    walk.add_argument("--prefetch", metavar="LINEAGE",
                      help="GPU walk: first gate the states of this earlier walk of the expert (e.g. its dry walk) "
                           "side by side; the walk then finds what the guess got right in the cache")
    walk.add_argument("--prefetch-share", metavar="I/N", type=_share, default=(0, 1),
                      help="prefetch only states I, I+N, I+2N, ... of the guess (N GPUs share one prefetch)")
    walk.add_argument("--prefetch-only", action="store_true",
                      help="stop after the prefetch: no walk, no lineage (with --record, the verdicts are kept)")
    walk.add_argument("--as-in", metavar="LINEAGE",
                      help="walk with the transforms, limits, timing placement and code check of this earlier walk "
                           "(to replay it: --gate replay)")

    problems = commands.add_parser("problems", help="list bundled problems, or describe problem files of any format",
                                   parents=[cli_options.json_output("the list, or the descriptions,")])
    problems.add_argument("paths", nargs="*", metavar="PATH",
                          help="problem files (this project's, the reference's, KernelBench, FlashInfer definitions)")
    kernels = commands.add_parser("kernels", help="list bundled kernels", parents=[cli_options.json_output("the list")])
    kernels.add_argument("--adversarial", action="store_true", help="list the adversarial suite instead")
    optimize_command.add_parser(commands)
    library_command.add_parser(commands)
    kernel_export.add_parser(commands)
    recorded_command.add_parser(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"gate": _gate, "walk": _walk, "problems": _problems, "kernels": _kernels,
                "optimize": optimize_command.run, "library": library_command.run,
                "kernel": kernel_export.run, "recorded": recorded_command.run}[args.command](args)
    except KLineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _gate(args: argparse.Namespace) -> int:
    from klineage.gate.pipeline import run_gate
    from klineage.gate.policy import Sanitize
    from klineage.gate.verdict import Reason
    from klineage.report import print_verdict, progress_display

    mode = GateMode.COMPILE_ONLY if args.compile_only else config.gate_mode(GateMode(args.gate) if args.gate else None)
    against = corpus.kernel_entry(args.against).load() if args.against and args.against != "vendor" else None
    policy = GatePolicy(seeds=args.seeds, timing=not args.no_timing, sanitize=Sanitize(args.sanitize),
                        require_ratio=args.require, placement=Placement(args.placement))
    kernel = corpus.kernel_entry(args.kernel).load()
    cases = [c.strip() for c in args.cases.split(",")] if args.cases else None
    with progress_display(enabled=not args.json) as progress:
        verdict = run_gate(corpus.problem_path(args.problem), kernel, against=against, cases=cases, policy=policy,
                           mode=mode, progress=progress, record=args.record)
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=1))
    else:
        print_verdict(verdict)
    if verdict.findings and verdict.findings[0].reason is Reason.PLAN_ERROR:
        # The plan cannot be evaluated or does not fit the kernel: bad input (exit 2), not a kernel the gate judged.
        print(f"error: the launch plan is wrong: {verdict.findings[0].message}", file=sys.stderr)
        return 2
    if verdict.status.value not in ("passed", "compiled"):
        return 1
    return 3 if verdict.unsettled else 0


def _share(text: str) -> tuple[int, int]:
    """`I/N` of --prefetch-share, with 0 <= I < N."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise argparse.ArgumentTypeError(f"'{text}' is not I/N with 0 <= I < N (e.g. 1/2: the second of two shares)")
    return int(index), int(count)


def _prefetch(args: argparse.Namespace, problem, expert, mode: GateMode, progress, placement) -> list:
    """Judge the guessed walk's states side by side; give back the states to compile ahead of the
    walk: those of the guessed steps whose forward timing no store holds, in walk order."""
    from klineage.gate.pipeline import default_cache
    from klineage.gate.prefetch import prefetch
    from klineage.report import console
    from klineage.walk.prefetch import guessed_walk, untimed_states
    from klineage.walk.walker import DEFAULT_POLICY, forward_timing_policy

    if mode is not GateMode.GPU:
        raise KLineageError("--prefetch speeds up a GPU walk; this walk's gate is " + mode.value)
    guess, cache = guessed_walk(args.prefetch, expert), default_cache()
    states = [state.kernel for state in guess.states]
    index, count = args.prefetch_share
    done = prefetch(problem, states[index::count], DEFAULT_POLICY, cache, jobs=args.jobs, progress=progress,
                    keep=args.record)
    console.print(f"prefetched {done.states} states: " + ", ".join(f"{n} {s}" for s, n in sorted(done.judged.items()))
                  + "".join(f"\n  could not judge {e}" for e in done.errors))
    if args.prefetch_only:
        return []
    untimed = untimed_states(problem, guess, forward_timing_policy(DEFAULT_POLICY, placement), cache)
    return [state for state in states if state.fingerprint in untimed]


def _walk(args: argparse.Namespace) -> int:
    from pathlib import Path

    from klineage.gate.machine_code import CodeCheck
    from klineage.gate.prefetch import warming
    from klineage.lineage import Termination
    from klineage.report import console, progress_display, table
    from klineage.walk.walker import walk

    mode = config.gate_mode(GateMode(args.gate) if args.gate else None)
    expert = corpus.kernel_entry(args.kernel).load()
    problem = corpus.problem_path(args.problem or expert.plan.problem)
    if args.rewriter == "llm":
        try:
            from klineage.rewriters.llm import LLMRewriter
        except ImportError as exc:
            raise KLineageError(f"the LLM rewriter is not available ({exc}); use --rewriter rules") from None
        rewriter = LLMRewriter()
    else:
        rewriter = None  # the rule rewriter over the catalog
    transforms, limits, placement = None, (args.max_steps, args.max_rejections), Placement(args.placement)
    code_check = CodeCheck(args.code_check)
    if args.as_in:
        from klineage.lineage import Lineage as LineageDocument
        from klineage.walk.walker import transforms_named

        earlier = LineageDocument.load(args.as_in)
        transforms, limits = transforms_named(earlier), (earlier.limits.max_steps, earlier.limits.max_rejections)
        placement = GatePolicy.from_dict(earlier.policy["forward_timing"]).placement
        code_check = CodeCheck(earlier.policy.get("code_check", CodeCheck.NONE.value))  # absent: made before it
    if args.prefetch_only and not args.prefetch:
        raise KLineageError("--prefetch-only needs --prefetch LINEAGE: the walk whose states to judge")
    with progress_display() as progress:
        ahead = _prefetch(args, problem, expert, mode, progress, placement) if args.prefetch else []
        if args.prefetch_only:
            return 0
        with warming(ahead):
            lineage = walk(problem, expert, rewriter, gate_mode=mode, max_steps=limits[0],
                           max_rejections=limits[1], progress=progress, record=args.record, transforms=transforms,
                           placement=placement, code_check=code_check)
    out = Path(args.out) if args.out else config.data_dir() / "lineages" / f"{expert.name}-{mode.value}.json"
    lineage.save(out)

    def short(anchor: object) -> str:
        text = " ".join(str(anchor or "-").split())
        return text if len(text) <= 60 else text[:57] + "..."

    if mode is GateMode.COMPILE_ONLY:
        console.print("[bold yellow]DRY WALK[/] compile-only gate: nothing ran, nothing was timed; "
                      "every step is unverified")
    table(f"Lineage of {expert.name} on {lineage.problem.operator} ({lineage.rewriter} rewriter, {mode.value} gate)",
          ["step", "transform", "anchor", "forward", "child time / parent"],
          [[str(t.index), t.transform, short(t.anchor), t.forward.status.value,
            f"{t.forward.timing.overall:.3f}" if t.forward.timing else "-"] for t in lineage.transitions])
    if lineage.rejections:
        table("Rejected", ["step", "transform", "anchor", "category", "why"],
              [[str(r.step), r.transform, short(r.anchor), r.category.value,
                (r.reason.value + ": " if r.reason else "") + " ".join(r.evidence.message.split())[:100]]
               for r in lineage.rejections])
    stats = lineage.stats
    console.print(f"[bold]{lineage.termination.kind.value}[/]: {lineage.termination.message}")
    console.print(f"  {stats.accepted} accepted, {stats.rejected} rejected, {stats.gate_evaluations} gate "
                  f"evaluations ({stats.seconds:.1f} s of gate time); lineage written to {out}")
    return 1 if lineage.termination.kind is Termination.UNKNOWN else 0


def _problems(args: argparse.Namespace) -> int:
    from klineage.gate.execute import probe_problem

    if args.paths:
        return _describe_problems(args.paths, args.json)
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


def _describe_problems(paths: list[str], as_json: bool) -> int:
    """What a problem file loads as (probed in the sandbox): its inputs, outputs and cases."""
    from klineage.gate.execute import probe_problem

    described = []
    for path in paths:
        probe = probe_problem(corpus.problem_path(path), config.cache_dir())
        info = probe.info
        described.append({"path": path, "format": info.source_format, "operator": info.operator,
                          "inputs": probe.inputs, "outputs": [o.to_dict() for o in info.outputs],
                          "cases": [c.to_dict() for c in info.cases], "headline": info.headline,
                          "vendor": info.has_vendor, "tolerances": {k: t.to_dict() for k, t in info.tolerances.items()},
                          "numerics": list(probe.numerics)})
    if as_json:
        print(json.dumps(described, indent=1))
    else:
        from klineage.report import table

        for d in described:
            table(f"{d['path']} ({d['format']}: {d['operator']}; inputs on the smallest case)",
                  ["", "name", "shape", "dtype"],
                  [["input", n, str(v["shape"]), v["dtype"]] for n, v in d["inputs"].items()]
                  + [["output", o["name"], str(o["shape"]), o["dtype"]] for o in d["outputs"]]
                  + [["case", c["name"], json.dumps(c["params"]), ""] for c in d["cases"]])
    return 0 if all(not d["numerics"] for d in described) else 1


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
