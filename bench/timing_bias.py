"""Does pairing move a timing? Two views of the gate's paired timing, for GPU walks.

    python bench/timing_bias.py scan WALK.gpu.json... [--sass] [--tolerance 0.05]    (any machine)
    python bench/timing_bias.py probe WALK.gpu.json STEP [STEP...] [--placement P]   (GPU host)
    python bench/timing_bias.py placement WALK.gpu.json STEP                          (GPU host)

scan: from the recorded verdicts (no GPU), each inner state's two medians (as the baseline of the
step before, as the candidate of its own step) and where they disagree; `--sass` compiles the
disagreeing steps' parent and child here (a minute or more per big scalarized state on two cores)
and says where they are the same machine code, so the ratio the walk recorded for them can only be
the pairing's.
probe: on the GPU, one runner process per row, the way the gate runs it, for a step's parent A and
child B: A vs B as the walk timed them, with a second, separately loaded copy of A as a control;
the roles swapped (B vs A, a copy of B); and A against a copy of itself. A sound pairing gives
every control ratio 1.
placement: which loaded copy is slow, and does reloading move it? Copies of the step's parent A,
each row a script of loads, unloads and timings in a fresh process (the first version of this
command, in bench/logs/gpu-session-s14.txt call 3, also set the buffers' allocation order apart
from the load order: the slow copy followed the load order). It runs the runner's own loading
and timing code in its process, not in the sandbox: corpus states only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from klineage import config, corpus, devices
from klineage.errors import KLineageError
from klineage.gate import execute
from klineage.gate.compile import compile_kernel
from klineage.gate.machine_code import CodeIdentity, same_machine_code
from klineage.gate.pipeline import contender
from klineage.gate.policy import GatePolicy, Placement
from klineage.lineage import Lineage
from klineage.walk.timing_audit import (
    PAIRING_TOLERANCE,
    code_identities,
    state_timings,
    step_timings,
)


def scan(paths: list[Path], tolerance: float, sass: bool) -> int:
    print(f"{'walk':34s} {'states':>6s} {'disagree':>8s} {'worst':>6s}  steps judged on the same SASS")
    for path in paths:
        lineage = Lineage.load(path)
        steps = step_timings(lineage)
        states = state_timings(steps)
        off = [s for s in states if s.disagrees(tolerance)]
        worst = max(states, key=lambda s: abs(s.bias - 1.0)).bias if states else 1.0
        same = ""
        if sass and off:
            # a step whose parent or child disagrees with itself: is its ratio the edit's or the pairing's?
            suspect = {s.index for s in off} | {s.index - 1 for s in off}
            same = ", ".join(f"{s.index} ({s.transform}, ratio {s.ratio:.3f})"
                             for s in code_identities(lineage, steps, suspect) if s.code is CodeIdentity.SAME)
        print(f"{path.name:34s} {len(states):6d} {len(off):8d} {worst:6.3f}  {same}")
    return 0


def _walk_timing(path: Path):
    """The walk, its problem (path and probe), this GPU and the walk's forward-timing policy and case."""
    lineage = Lineage.load(path)
    problem = corpus.problem_path(lineage.problem.operator)
    probed = execute.probe_problem(problem, config.cache_dir())
    device = devices.lookup(execute.gpu_name())
    policy = GatePolicy.from_dict(lineage.policy["forward_timing"])
    return lineage, problem, probed, device, policy, policy.timing_case or probed.info.headline


def probe(path: Path, indices: list[int], placement: Placement) -> int:
    lineage, problem, probed, device, policy, case = _walk_timing(path)
    policy = policy.with_(placement=placement)
    print(f"{path.name}: case {case}, {device.name}, kernels timed {placement.value}; "
          f"medians in us, ratio = other / first")
    print(f"{'step':>4s} {'row':14s} {'first':>10s} {'second':>10s} {'control':>10s} {'2nd/1st':>8s} {'ctl/1st':>8s}")
    for index in indices:
        parent, child = lineage.states[index].kernel, lineage.states[index + 1].kernel
        same = same_machine_code(parent, child).value
        rows = {"A, B, A copy": (parent, child, parent), "B, A, B copy": (child, parent, child),
                "A, A copy": (parent, parent)}
        for label, kernels in rows.items():
            medians, placed = _time(problem, probed, device, policy, case, kernels)
            first = medians[0]
            ratios = [m / first for m in medians[1:]]
            cells = [f"{m:10.1f}" for m in medians] + [" " * 10] * (3 - len(medians))
            print(f"{index:4d} {label:14s} {' '.join(cells)} " + " ".join(f"{r:8.3f}" for r in ratios)
                  + (f"   (SASS {same})" if label.startswith("A, B") else ""))
            for role, by_place in placed.get("medians_us", {}).items():  # exchanged: each arrangement's median
                print(f"{'':19s}{role:9s} " + " ".join(f"{t:10.1f}" for t in by_place))
    return 0


# label: a script run in one fresh process: +X loads module X (A0, A1, ...: copies of the parent A;
# B: the child; Z: the walk's last state, a small module that shifts the rest), -X unloads it,
# T times every loaded module alone (a profile each, in load order)
PLACEMENT_ROWS = {
    "A A": "+A0 +A1 T",
    "B untimed, A A": "+B +A0 +A1 -B T",
    "A A A A": "+A0 +A1 +A2 +A3 T",
    "reload both, swapped": "+A0 +A1 T -A0 -A1 +A1 +A0 T",
    "reload both, unloaded last first": "+A0 +A1 T -A1 -A0 +A1 +A0 T",
    "reload the first": "+A0 +A1 T -A0 +A0 T",
    "reload three, rotated": "+A0 +A1 +A2 T -A0 -A1 -A2 +A1 +A2 +A0 T",
    "A A A A, eager module loading": "+A0 +A1 +A2 +A3 T",
    "eight copies": "+A0 +A1 +A2 +A3 +A4 +A5 +A6 +A7 T",
    "Z untimed, eight copies": "+Z +A0 +A1 +A2 +A3 +A4 +A5 +A6 +A7 -Z T",
    "swap places: reload in reverse": "+A0 +B T -A0 -B +B +A0 T",
}
# rows run with more environment: is it CUDA's lazy loading (the default since 12.2) that places them?
PLACEMENT_ENV = {"A A A A, eager module loading": {"CUDA_MODULE_LOADING": "EAGER"}}


def _contenders(probed, device, case: str, kernels) -> list:
    roles = ["candidate", "baseline", "control"][:len(kernels)]
    return [contender(role, kernel, compile_kernel(kernel, cache_dir=config.cache_dir()), probed, [case], device)
            for role, kernel in zip(roles, kernels)]


def placement(path: Path, index: int) -> int:
    lineage, problem, probed, device, policy, case = _walk_timing(path)
    a, b, z = _contenders(probed, device, case, [lineage.states[i].kernel for i in (index, index + 1, -1)])
    print(f"{path.name} step {index}: copies of its parent A, case {case}, {device.name}; "
          f"medians in us of each loaded module timed alone, in load order", flush=True)
    with tempfile.TemporaryDirectory() as work:
        specs = {}
        for name, c in (("A", a), ("B", b), ("Z", z)):
            cubin = Path(work) / f"{name}.cubin"
            cubin.write_bytes(c.compiled.cubin_bytes(c.state.plan.arch))
            specs[name] = {**c.spec, "cubin": str(cubin)}
        request = Path(work) / "request.json"
        request.write_text(
            json.dumps({"problem": str(problem), "case": case, "policy": policy.to_dict(), "specs": specs})
        )
        for label in PLACEMENT_ROWS:
            out = subprocess.run(
                [sys.executable, __file__, "_row", str(request), label],
                capture_output=True,
                text=True,
                env={**os.environ, **PLACEMENT_ENV.get(label, {})},
            )
            if out.returncode:
                raise SystemExit(f"{label}: {out.stderr[-2000:]}")
            for medians in json.loads(out.stdout.splitlines()[-1]):
                cells = " ".join(f"{k}:{v:8.1f}" for k, v in medians.items())
                print(f"  {label:34s} {cells}", flush=True)
                label = ""
    return 0


def _row(request_path: Path, label: str) -> int:
    """One placement row, in this process: its script's loads, unloads and timings."""
    from klineage.gate import runner
    from klineage.problem import load_problem

    request = json.loads(request_path.read_text())
    problem = load_problem(request["problem"])
    policy = {**request["policy"], "vendor": False}
    device = runner.Device(runner.Progress(None))
    loaded: dict[str, runner.LoadedKernel] = {}
    timings = []
    try:
        for token in PLACEMENT_ROWS[label].split():
            if token.startswith("+"):
                loaded[token[1:]] = runner.LoadedKernel(device, {**request["specs"][token[1]], "role": "candidate"})
            elif token.startswith("-"):
                loaded.pop(token[1:]).unload()
            else:
                medians = {}
                for name, kernel in loaded.items():
                    result: dict = {"findings": []}
                    runner.profile(device, problem, [kernel], request["case"], policy, result)
                    if result["findings"]:
                        raise SystemExit(str(result["findings"]))
                    medians[name] = result["profile"]["contenders"]["candidate"]["median_us"]
                timings.append(medians)
        print(json.dumps(timings))
    finally:
        device.close()
    return 0


def _time(problem: Path, probed, device, policy: GatePolicy, case: str, kernels) -> tuple[list[float], dict]:
    """One runner process timing the kernels in this load order; each role's median, and where the
    policy exchanges their places, each role's median in each arrangement."""
    contenders = _contenders(probed, device, case, kernels)
    roles = [c.role for c in contenders]
    request = {"mode": "run", "problem": str(problem), "cases": [case], "seeds": [0], "timing_case": case,
               "kernels": [c.spec for c in contenders]}
    cubins = {c.role: c.compiled.cubin_bytes(c.state.plan.arch) for c in contenders}
    outcome = execute.run_on_gpu(request, cubins, policy)
    timed = outcome.result.get("profile", {}).get("contenders")
    if not timed:
        raise SystemExit(f"no timing came back: {outcome.findings or outcome.error or outcome.output_excerpt}")
    return [float(timed[role]["median_us"]) for role in roles], outcome.result["profile"].get("placement", {})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("scan", help="each state's two recorded medians, from the recorded verdicts")
    s.add_argument("walks", nargs="+", type=Path)
    s.add_argument("--tolerance", type=float, default=PAIRING_TOLERANCE,
                   help=f"|bias - 1| above this disagrees ({PAIRING_TOLERANCE})")
    s.add_argument("--sass", action="store_true", help="compile the disagreeing steps and compare their SASS")
    p = sub.add_parser("probe", help="time a step's parent and child with controls, on this GPU")
    p.add_argument("walk", type=Path)
    p.add_argument("steps", nargs="+", type=int)
    p.add_argument("--placement", default=Placement.AS_LOADED.value, choices=[p.value for p in Placement],
                   help="where the kernels are timed: as_loaded (the walks' gate) or exchanged")
    q = sub.add_parser("placement", help="copies of a step's parent, loaded and allocated in different orders")
    q.add_argument("walk", type=Path)
    q.add_argument("step", type=int)
    r = sub.add_parser("_row")  # one placement row, run by `placement` in a fresh process
    r.add_argument("request", type=Path)
    r.add_argument("label", choices=PLACEMENT_ROWS)
    args = parser.parse_args(argv)
    try:
        if args.command == "scan":
            return scan(args.walks, args.tolerance, args.sass)
        if args.command == "placement":
            return placement(args.walk, args.step)
        if args.command == "_row":
            return _row(args.request, args.label)
        return probe(args.walk, args.steps, Placement(args.placement))
    except KLineageError as exc:  # no GPU, a replay miss, a malformed walk: say so, no traceback
        print(f"timing_bias: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
