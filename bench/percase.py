"""Re-time a GPU walk's steps on every case of its problem and every sweep case (GPU host), or estimate it.

    python bench/percase.py WALK.gpu.json [--steps 3,5,8 | --all] [--share I/N] [--placement exchanged]
    python bench/percase.py WALK.gpu.json --estimate      # no GPU: seconds each step will take, from its records
    python bench/percase.py WALK... --lanes 8 [--per-card 1]  # no GPU: gpu_session.sh --lanes arguments, balanced
    python bench/percase.py WALK.gpu.json --audit [--steps ...]  # no GPU: the recorded cases the pairing moved

A walk times each step's parent against its child on the headline case only: what the step buys there,
not where it pays. Here each chosen step (by default those that are the source of an effect of a card
of the bundled library, corpus/library/library.json, or of `--library`) is timed again under the walk's forward-timing
policy with `timing_scope = every_case` (each case, and each SWEEP case both kernels support, paired and
interleaved as before), its verdict recorded (KLINEAGE_RECORDED_DIR): induction then reads per-case
effects from the recordings with no GPU (klineage.skills.when). `--share I/N`: this lane's share.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

from klineage import config, corpus
from klineage.config import GateMode
from klineage.errors import KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.compile import compile_kernel
from klineage.gate.machine_code import CodeIdentity
from klineage.gate.pipeline import default_cache, run_gate
from klineage.gate.policy import GatePolicy, Placement
from klineage.gate.warm import WarmRunner
from klineage.lineage import ForwardStatus, Lineage
from klineage.skills.induction import lineage_id
from klineage.walk.step_code import StepCodes
from klineage.walk.timing_audit import PERCASE_TRIAL_SECONDS, case_ratios, percase_step, percase_timing

LIBRARY = config.REPO_ROOT / "corpus" / "library" / "library.json"
STEP_CODES = config.corpus_dir() / "step_code.json"
FIXED_S = 1.0  # a step through the warm runner: its two kernels loaded, the inputs made (a cold runner: 5-10 s)


def library_steps(lineage: Lineage, per_card: int = 0, library: Path = LIBRARY, by_effect: bool = False) -> list[int]:
    """The steps of `lineage` that are the source of an effect of a card in the library; with `per_card`,
    at most that many a card, those whose headline effect was furthest from 1 first (what a card
    buys is where its precondition matters). In step order, or with `by_effect` in that same order
    over all cards (a stage cut by its time limit has timed the steps that moved their headline most).
    Never a step whose child runs its parent's machine code (`changed_steps`): timed per case, it would
    measure the pairing's noise, and induction leaves it out of the card anyway."""
    me = lineage_id(lineage)
    changed = set(changed_steps(lineage, range(len(lineage.transitions))))
    chosen: dict[int, float] = {}
    for card in json.loads(library.read_text(encoding="utf-8"))["cards"]:
        mine = sorted((e for e in card["effects"] if e["source"]["lineage"] == me and e["source"]["index"] in changed),
                      key=lambda e: (-abs(math.log(e["ratio"])), e["source"]["index"]))
        chosen.update({e["source"]["index"]: abs(math.log(e["ratio"])) for e in mine[:per_card or None]})
    return sorted(chosen, key=lambda i: (-chosen[i], i) if by_effect else (0, i))


def changed_steps(lineage: Lineage, indices: Iterable[int]) -> list[int]:
    """`indices` less the steps whose child runs its parent's machine code: marked `same_code` by a walk with the
    code check, or found so by the step-code record (corpus/step_code.json, bench/step_code.py) where there is one."""
    codes = _step_codes()
    return [i for i in indices if lineage.transitions[i].forward.status is not ForwardStatus.SAME_CODE
            and (codes is None or codes.of(lineage, i) is not CodeIdentity.SAME)]


@functools.cache
def _step_codes() -> StepCodes | None:
    return StepCodes.load(STEP_CODES) if STEP_CODES.exists() else None


def estimate_s(lineage: Lineage, index: int, cases: int, placement: Placement) -> float | None:
    """Seconds step `index` will take timed on `cases` cases. Where it was timed on every case before (an
    earlier, shorter sweep included), what that took: the gate's stages, its case profiles scaled to
    `cases`. Else the headline model: the runner's fixed cost plus the recorded headline profile once a
    case, which undercounts (a case's inputs, warm-up and rounds are not in a headline profile: 7 s for
    embedding_bag's step 12 on 24 cases, which took 41 s on the H200). Twice the profiles with places
    exchanged; None where nothing is recorded."""
    twice = 2 if placement is Placement.EXCHANGED else 1
    before = timed_before(lineage, index)
    if before is not None:
        rest, per_case = before
        return rest + per_case * cases * twice
    policy = GatePolicy.from_dict(lineage.policy["forward_timing"])
    try:
        verdict = run_gate(corpus.problem_path(lineage.problem.operator), lineage.states[index].kernel,
                           against=lineage.states[index + 1].kernel, policy=policy, mode=GateMode.REPLAY,
                           cache=GateCache(None, config.recorded_dir()))
    except KLineageError:
        return None
    profile = float(verdict.timings.get("run.profile", 0.0))
    correctness = float(verdict.timings.get("run.correctness", 0.0))
    cut = min(1.0, PERCASE_TRIAL_SECONDS / policy.trial_seconds)  # a trial that ran to its limit runs to the new one
    return FIXED_S + correctness + profile * cut * cases * twice


def timed_before(lineage: Lineage, index: int) -> tuple[float, float] | None:
    """(seconds of the gate besides its case profiles, seconds a case) of the step's recorded timing on
    every case, as loaded; None where it was never timed so."""
    try:
        verdict = percase_step(lineage, index)
    except KLineageError:
        return None
    timed = len(verdict.profile.get("per_case", {}))
    every = float(verdict.timings.get("run.profile_every_case", 0.0))
    total = sum(float(v) for stage, v in verdict.timings.items() if "." not in stage)  # top-level stages only
    return (total - every, every / timed) if timed and every else None


def plan_lanes(walks: list[Path], lanes: int, per_card: int, placement: Placement, library: Path = LIBRARY) -> int:
    """gpu_session.sh --lanes arguments timing the walks' card steps on every case, the steps dealt out
    longest first to the lane with the least estimated seconds (each lane's stages name their steps)."""
    jobs = []
    for path in walks:
        lineage = Lineage.load(path)
        cases = _case_count(lineage)
        timed = {t.index for t in lineage.transitions if t.forward.timing is not None}
        name = path.name.split(".gpu.json")[0]
        jobs += [(estimate_s(lineage, i, cases, placement) or 60.0, name, i)
                 for i in library_steps(lineage, per_card, library) if i in timed]
    loads = [[0.0, {}] for _ in range(lanes)]
    for seconds, name, index in sorted(jobs, reverse=True):
        lane = min(loads, key=lambda load: load[0])
        lane[0] += seconds
        lane[1].setdefault(name, []).append(index)
    for i, (seconds, _steps) in enumerate(loads):
        print(f"# lane {i}: about {seconds:.0f} s (compiles not counted)")
    print("--lanes " + " ".join('"' + " ".join(f"percase:{name}:{','.join(map(str, sorted(idx)))}"
                                                for name, idx in sorted(steps.items())) + '"'
                                for _, steps in loads))
    return 0


def precompile(lineage: Lineage, steps: list[int], pool: ThreadPoolExecutor) -> dict[int, list[Future]]:
    """Start compiling the kernels of the states the steps time, in step order, on `pool` (side by side),
    into the compile cache the gate reads; each step's builds, so that a step is timed as soon as its two
    kernels are built while later ones compile. The gate compiles one kernel at a time: nvcc for a fresh
    machine's hundred states would otherwise hold the GPU idle for minutes, and a stage cut by its time
    limit before the last compile would time nothing (conv2d_implicit_gemm_any, whose states take up to
    26 s each, timed no step in 120 s when every compile came first). A kernel that fails to compile is
    left for its gate to report."""
    def build(kernel):
        try:
            compile_kernel(kernel, cache_dir=config.cache_dir())
        except KLineageError:
            pass

    started: dict[str, Future] = {}
    for step in steps:
        for i in (step, step + 1):
            kernel = lineage.states[i].kernel
            if kernel.fingerprint not in started:
                started[kernel.fingerprint] = pool.submit(build, kernel)
    return {step: [started[lineage.states[i].kernel.fingerprint] for i in (step, step + 1)] for step in steps}


def audit(lineage: Lineage, steps: list[int]) -> int:
    """Each step's recorded per-case timing with the cases its pairing moved (timing_audit.audit_cases),
    and the steps to time again with places exchanged: those with a moved case, and those no neighbouring
    step was timed beside on every case (nothing to check them against)."""
    near = sorted({i for s in steps for i in (s - 1, s, s + 1) if 0 <= i < len(lineage.transitions)})
    timings = {i: percase_timing(lineage, i) for i in near}  # each read once: a step and its neighbours
    again = []
    for index in steps:
        row = f"{index:4d} {lineage.transitions[index].transform:22s}"
        timing = timings[index]
        if timing is None:
            print(f"{row} not timed on every case")
            continue
        moved = [r for r in timing.rows if r.doubt]
        checked = any(timings.get(i) is not None for i in (index - 1, index + 1))
        if timing.placement is Placement.EXCHANGED:
            print(f"{row} places exchanged: evidence on all {len(timing.rows)} cases")
        elif moved:
            again.append(index)
            print(f"{row} {len(moved)} of {len(timing.rows)} cases moved by the pairing: "
                  + "; ".join(f"{r.case} {r.ratio:.3f} ({r.doubt})" for r in moved))
        elif not checked:
            again.append(index)
            print(f"{row} unchecked: no neighbouring step was timed on every case")
        else:
            print(f"{row} consistent on all {len(timing.rows)} cases")
    print(f"time again with places exchanged: {','.join(map(str, again)) or 'none'}")
    return 0


def _case_count(lineage: Lineage) -> int:
    from klineage.gate.execute import probe_problem

    info = probe_problem(corpus.problem_path(lineage.problem.operator), config.cache_dir()).info
    return len(info.cases) + len(info.sweep)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("walk", type=Path, nargs="+", help="one walk (several with --lanes)")
    parser.add_argument("--steps", default="", help="comma-separated step indices (default: the library's card steps)")
    parser.add_argument("--all", action="store_true", help="every step the walk timed")
    parser.add_argument("--per-card", type=int, default=0, help="at most this many of each card's steps (0: all)")
    parser.add_argument("--by-effect", action="store_true",
                        help="the library's card steps furthest from 1 on their headline first (default: step order)")
    parser.add_argument("--share", default="0/1", help="I/N: this lane's share of the steps")
    parser.add_argument("--placement", default=Placement.AS_LOADED.value, choices=[p.value for p in Placement])
    parser.add_argument("--jobs", type=int, default=8, help="kernels compiled side by side before any is timed")
    parser.add_argument("--estimate", action="store_true", help="print each step's expected GPU seconds; time nothing")
    parser.add_argument("--lanes", type=int, default=0, help="print balanced gpu_session.sh lanes for the walks")
    parser.add_argument("--audit", action="store_true",
                        help="print the recorded cases the pairing moved, and the steps to time with places exchanged")
    parser.add_argument("--library", type=Path, default=LIBRARY,
                        help="the library whose card steps are timed (default: the bundled one)")
    args = parser.parse_args(argv)
    if args.lanes:
        return plan_lanes(args.walk, args.lanes, args.per_card, Placement(args.placement), args.library)
    if len(args.walk) != 1:
        parser.error("one walk (several only with --lanes)")
    args.walk = args.walk[0]
    try:
        lane, lanes = (int(x) for x in args.share.split("/"))
        lineage = Lineage.load(args.walk)
        placement = Placement(args.placement)
        timed = [t.index for t in lineage.transitions if t.forward.timing is not None]
        if args.steps:
            chosen = [int(x) for x in args.steps.split(",")]
        else:
            chosen = changed_steps(lineage, timed) if args.all else [
                i for i in library_steps(lineage, args.per_card, args.library, args.by_effect) if i in timed]
        chosen = chosen[lane::lanes]
    except (ValueError, KLineageError) as exc:
        print(f"percase: {exc}", file=sys.stderr)
        return 2
    if args.audit:
        return audit(lineage, chosen)
    if args.estimate:
        cases = _case_count(lineage)
        estimates = {i: estimate_s(lineage, i, cases, placement) for i in chosen}
        known = [s for s in estimates.values() if s is not None]
        print(f"{args.walk.name}: {len(chosen)} step(s) x {cases} cases, {placement.value}: about "
              f"{sum(known):.0f} s of GPU time ({len(known)} estimated from records; compiles not counted)")
        print(" ".join(f"{i}:{s:.0f}s" if s is not None else f"{i}:?" for i, s in estimates.items()))
        return 0
    print(f"{args.walk.name}: {len(chosen)} step(s) timed on every case, {placement.value}; child time / parent time")
    cache = default_cache()
    # one warm runner for the walk's problem: torch, the problem and its inputs loaded once, not per step
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool, \
            WarmRunner(corpus.problem_path(lineage.problem.operator)) as runner:
        builds = precompile(lineage, chosen, pool)
        for index in chosen:
            wait(builds[index])
            started, row = time.monotonic(), f"{index:4d} {lineage.transitions[index].transform:22s}"
            try:
                verdict = percase_step(lineage, index, GateMode.GPU, cache, record=True, placement=placement,
                                       runner=runner)
            except KLineageError as exc:
                print(f"{row} gate error: {exc}", flush=True)
                continue
            rows = case_ratios(verdict)
            cells = ", ".join(f"{r.case} {r.ratio:.3f}" if r.ratio is not None else f"{r.case} untimed"
                              for r in rows)
            print(f"{row} {verdict.status.value}: {cells or verdict.describe()} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
        print(f"warm runners started: {runner.started}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
