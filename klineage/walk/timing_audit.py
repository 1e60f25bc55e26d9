"""Whether a GPU walk's paired timings agree with themselves.

Every inner state of a walk is timed twice: as the baseline of the step before it (against its
parent) and as the candidate of its own step (against its child). Both are medians of the same
machine code on the same GPU, so they should agree; where they do not, the pairing itself moved the
number and the step's child/parent ratio measures the pairing, not the edit. Where a step leaves the
machine code unchanged (klineage.gate.machine_code), the true ratio is 1 and
any other measured ratio is that artifact. The cause is where each module's code lands (docs/perf-notes.md,
session 15); a step re-timed with its two kernels exchanging places (`retime_step`, bench/retime.py on
the GPU) has a ratio the places cannot move. A step timed on every case of its problem and its SWEEP cases
(`percase_step`, bench/percase.py on the GPU) gives per-case effects (`percase_timing`), from which
induction learns where a card pays (klineage.skills.when). Everything else here reads recorded verdicts
(replay): no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from klineage import config, corpus
from klineage.config import GateMode
from klineage.errors import DocumentError, KLineageError
from klineage.gate.cache import GateCache
from klineage.gate.machine_code import CodeIdentity, MachineCode, identity, machine_code
from klineage.gate.pipeline import Runner, earlier_sweep_verdict, recorded_verdict, run_gate
from klineage.gate.policy import GatePolicy, Placement, TimingScope
from klineage.gate.verdict import Finding, Status, Verdict
from klineage.lineage import DEFAULT_FORWARD_RATIO, ForwardStatus, Lineage

# A step timed on every case (percase_step) caps each trial at this many seconds (a trial ends sooner
# once its spread settles): at the walk's 3 s a GEMM step's fourteen cases took about 80 s of GPU time
# (bench/percase.py --estimate), at 1 s about 30 s; the library's 53 card steps then needed about 970 s,
# more than one device call. A trial of a kernel under a millisecond still runs hundreds of launches in
# 0.5 s, and a case whose timing does not settle is re-measured with more trials by the gate itself.
PERCASE_TRIAL_SECONDS = 0.5
PAIRING_TOLERANCE = 0.05  # |median as candidate / median as baseline - 1| above this: the pairing moved it


class Pairing(str, Enum):
    """Whether a step's forward ratio is evidence, judged by its two states' own medians."""

    CONSISTENT = "consistent"  # its parent and child each timed alike in both of their pairings
    # its parent or child timed further apart than the tolerance in its two pairings, and the ratio is
    # nearer to the required one than that factor: verified or slower, the pairing could have decided it
    BIASED = "biased"
    OUTWEIGHED = "outweighed"  # a state timed apart too, but the ratio clears the required one by more
    UNCHECKED = "unchecked"  # a state timed in one pairing only (a walk's first or last), or no recorded timing
    EXCHANGED = "exchanged"  # re-timed with parent and child exchanging places: its ratio is evidence


DOUBTFUL = frozenset({Pairing.BIASED, Pairing.OUTWEIGHED})  # what bench/retime.py re-times


@dataclass(frozen=True)
class StepPairing:
    index: int
    pairing: Pairing
    note: str
    ratio: float | None = None  # exchanged: the re-timed child time / parent time


@dataclass(frozen=True)
class StepTiming:
    """One forward timing: the parent (candidate) against its child (baseline), medians in us."""

    index: int
    transform: str
    candidate_us: float
    baseline_us: float
    code: CodeIdentity = CodeIdentity.UNCHECKED

    def __post_init__(self):
        if self.candidate_us <= 0 or self.baseline_us <= 0:
            raise DocumentError(f"step {self.index}", "timed medians must be > 0")

    @property
    def ratio(self) -> float:
        """child time / parent time, as the walk judged it."""
        return self.baseline_us / self.candidate_us


@dataclass(frozen=True)
class StateTiming:
    """One inner state's two medians: as the baseline of step `index - 1`, as the candidate of `index`."""

    index: int
    as_baseline_us: float
    as_candidate_us: float

    @property
    def bias(self) -> float:
        """> 1: the state timed slower as the candidate; 1 is what sound pairing gives."""
        return self.as_candidate_us / self.as_baseline_us

    def disagrees(self, tolerance: float) -> bool:
        return abs(self.bias - 1.0) > tolerance


def retime_step(lineage: Lineage, index: int, mode: GateMode = GateMode.REPLAY, cache: GateCache | None = None,
                record: bool = False) -> Verdict:
    """Step `index`'s forward timing again, as the walk timed it but with parent and child exchanging
    places between trials (GPU: bench/retime.py; replay: its recorded verdict, else ReplayMiss)."""
    _require_gpu_walk(lineage)
    policy = GatePolicy.from_dict(lineage.policy["forward_timing"]).with_(placement=Placement.EXCHANGED)
    return _step_gate(lineage, index, policy, mode, cache, record)


def _step_gate(lineage: Lineage, index: int, policy: GatePolicy, mode: GateMode, cache: GateCache | None,
               record: bool, runner: Runner | None = None) -> Verdict:
    """Step `index`'s forward gated under `policy`: measured on a GPU (through `runner`, a warm runner
    of the walk's problem, when given), or in replay what is recorded (nothing judged on a miss: ReplayMiss;
    timed on every case, the verdict of an earlier, shorter sweep where none covers today's)."""
    problem, kernel, against = (corpus.problem_path(lineage.problem.operator), lineage.states[index].kernel,
                                lineage.states[index + 1].kernel)
    cache = cache or GateCache(None, config.recorded_dir())
    if mode is GateMode.REPLAY:
        return earlier_sweep_verdict(problem, kernel, against=against, policy=policy, cache=cache)
    return run_gate(problem, kernel, against=against, policy=policy, mode=mode,
                    judged_under=GatePolicy.from_dict(lineage.policy["state"]), cache=cache, record=record,
                    runner=runner)


def exchanged_ratio(verdict: Verdict) -> tuple[float, tuple[float, ...]] | None:
    """child time / parent time of a passed re-timing, overall and per round; None where it gave none
    or its timing did not settle."""
    ratio = verdict.paired_ratio() if verdict.status is Status.PASSED else None
    return (ratio.overall, ratio.per_trial) if ratio else None


def retimed_effect(lineage: Lineage, index: int, cache: GateCache | None = None
                   ) -> tuple[float, tuple[float, ...]] | None:
    """Step `index`'s recorded re-timing with places exchanged, overall and per round, if a GPU walk's
    step has one (induction's `retimed`: the card's effect then is that measurement)."""
    if lineage.gate is not GateMode.GPU:
        return None
    try:
        return exchanged_ratio(retime_step(lineage, index, cache=cache))
    except KLineageError:  # not re-timed: a replay miss
        return None


@dataclass(frozen=True)
class CaseRatio:
    """One case of a step timed on every case: child time / parent time overall and per round, or
    why the case was not timed (`untimed`). `doubt`: why the ratio is not evidence, where the pairing
    moved it (`audit_cases`): a state timed apart on this case in its two pairings by more than
    the ratio's distance from the required one."""

    case: str
    ratio: float | None
    per_trial: tuple[float, ...] = ()
    untimed: str = ""
    doubt: str = ""

    @property
    def evidence(self) -> bool:
        return self.ratio is not None and not self.doubt


def percase_step(lineage: Lineage, index: int, mode: GateMode = GateMode.REPLAY, cache: GateCache | None = None,
                 record: bool = False, placement: Placement = Placement.AS_LOADED,
                 runner: Runner | None = None) -> Verdict:
    """Step `index`'s forward timing on every case of its problem and every sweep case both kernels
    support, paired and interleaved as the walk timed its headline, each trial cut at
    PERCASE_TRIAL_SECONDS (GPU: bench/percase.py; replay: its recorded verdict, else ReplayMiss)."""
    _require_gpu_walk(lineage)
    walk = GatePolicy.from_dict(lineage.policy["forward_timing"])
    policy = walk.with_(timing_scope=TimingScope.EVERY_CASE, placement=placement,
                        trial_seconds=min(walk.trial_seconds, PERCASE_TRIAL_SECONDS))
    return _step_gate(lineage, index, policy, mode, cache, record, runner)


def case_ratios(verdict: Verdict) -> list[CaseRatio]:
    """Each timed case of a verdict that timed every case, in the order timed. A rejected verdict keeps
    the cases timed before its finding (the finding is then the step's measured failure)."""
    rows = []
    for case, profile in verdict.profile.get("per_case", {}).items():
        ratio = profile.get("ratios", {}).get("vs_baseline")
        rows.append(CaseRatio(case, float(ratio["overall"]), tuple(float(r) for r in ratio["per_trial"])) if ratio
                    else CaseRatio(case, None, untimed=str(profile.get("untimed", "no paired ratio recorded"))))
    return rows


@dataclass(frozen=True)
class PerCaseTiming:
    """A step timed on every case: its cases, where its kernels sat, what ptxas said of its parent
    (`compiled_facts`), the verdict's findings (a case its
    parent failed on when timed: a measured risk) and the GPU it ran on."""

    rows: tuple[CaseRatio, ...]
    placement: Placement
    compiled: dict[str, int]
    findings: tuple[Finding, ...] = ()
    gpu: str = ""


def compiled_facts(verdict: Verdict) -> dict[str, int]:
    """What ptxas said of the verdict's kernel, the largest over its entries: registers a thread, static
    shared bytes a block, the stack frame a thread (local arrays and spills) and the bytes it spills
    (stores and loads): a step that adds registers pays differently where the kernel already spills."""
    entries = [e for arch in (verdict.compile.get("resources") or {}).values() for e in arch.values()]
    if not entries:
        return {}
    return {"registers": max(int(e.get("registers", 0)) for e in entries),
            "static_shared": max(int(e.get("shared_bytes", 0)) for e in entries),
            "stack_bytes": max(int(e.get("stack_bytes", 0)) for e in entries),
            "spill_bytes": max(int(e.get("spill_store_bytes", 0)) + int(e.get("spill_load_bytes", 0)) for e in entries)}


def percase_timing(lineage: Lineage, index: int, cache: GateCache | None = None) -> PerCaseTiming | None:
    """Step `index`'s recorded every-case timing, places exchanged if it was so timed, else as loaded;
    None where neither is recorded (induction's `percase`)."""
    if lineage.gate is not GateMode.GPU:
        return None
    for placement in (Placement.EXCHANGED, Placement.AS_LOADED):
        try:
            verdict = percase_step(lineage, index, cache=cache, placement=placement)
        except KLineageError:  # not recorded with this placement
            continue
        rows = case_ratios(verdict)
        if placement is Placement.AS_LOADED:  # exchanged places cannot move a ratio: nothing to audit
            rows = audit_cases(lineage, index, verdict, rows, cache)
        return PerCaseTiming(tuple(rows), placement, compiled_facts(verdict), verdict.findings,
                             str(verdict.provenance.get("key_parts", {}).get("gpu", "")))
    return None


def _case_medians(verdict: Verdict) -> dict[str, dict[str, float]]:
    """case -> contender ("candidate": the step's parent, "baseline": its child) -> median us."""
    return {case: {name: float(c["median_us"]) for name, c in profile.get("contenders", {}).items()}
            for case, profile in verdict.profile.get("per_case", {}).items()}


def _neighbour(lineage: Lineage, index: int, cache: GateCache | None) -> dict[str, dict[str, float]]:
    """Step `index`'s as-loaded per-case medians; empty where it was not timed on every case."""
    if not 0 <= index < len(lineage.states) - 1:
        return {}
    try:
        return _case_medians(percase_step(lineage, index, cache=cache))
    except KLineageError:  # not timed on every case: nothing to compare with
        return {}


def audit_cases(lineage: Lineage, index: int, verdict: Verdict, rows: list[CaseRatio],
                cache: GateCache | None = None, tolerance: float = PAIRING_TOLERANCE) -> list[CaseRatio]:
    """The rows of step `index` timed as loaded on every case, each case's pairing checked as
    `step_pairings` checks the headline: the step's parent was also the child of step `index - 1`,
    its child the parent of step `index + 1`. Where those steps were timed on every case too, each
    state has two medians on the case; where they differ by more than `tolerance`, where the modules
    loaded moved the number, by that factor. A ratio within that factor of the required one could be
    either side of it: its row gets a `doubt` and is no evidence of where the step pays. A ratio that
    clears it (or misses it) by more keeps its side; a case no neighbour timed stays unchecked."""
    mine = _case_medians(verdict)
    before, after = _neighbour(lineage, index - 1, cache), _neighbour(lineage, index + 1, cache)
    timing = next((t.forward.timing for t in lineage.transitions if t.index == index), None)
    need = timing.required if timing is not None else DEFAULT_FORWARD_RATIO
    audited = []
    for row in rows:
        here = mine.get(row.case, {})
        pairs = [(index, before.get(row.case, {}).get("baseline"), here.get("candidate")),
                 (index + 1, here.get("baseline"), after.get(row.case, {}).get("candidate"))]
        off = [(state, base, cand) for state, base, cand in pairs
               if base and cand and abs(cand / base - 1.0) > tolerance]
        if row.ratio is None or not off:
            audited.append(row)
            continue
        factor = max(max(cand / base, base / cand) for _, base, cand in off)
        if row.ratio / factor >= need or row.ratio * factor < need:
            audited.append(row)  # outweighed: its side of the required ratio stands
            continue
        medians = "; ".join(f"state {state} timed {cand:.1f} us as a parent and {base:.1f} us as a child"
                            for state, base, cand in off)
        audited.append(replace(row, doubt=f"{medians} on this case: the ratio {row.ratio:.3f} is within that "
                                          f"{factor:.2f}x of the required {need}, not evidence either way"))
    return audited


def _require_gpu_walk(lineage: Lineage) -> None:
    if lineage.gate is not GateMode.GPU:
        raise DocumentError("lineage", f"a {lineage.gate.value} walk timed nothing; audit a GPU walk")


def step_timings(lineage: Lineage, cache: GateCache | None = None) -> list[StepTiming]:
    """The recorded forward timings of a GPU walk, served from the recorded store like a replay (none for a
    `same_code` step, which a walk with the code check does not time)."""
    _require_gpu_walk(lineage)
    cache = cache or GateCache(None, config.recorded_dir())
    problem = corpus.problem_path(lineage.problem.operator)
    policy = GatePolicy.from_dict(lineage.policy["forward_timing"])
    states = [state.kernel for state in lineage.states]
    steps = []
    for step in lineage.transitions:
        if step.forward.status is ForwardStatus.SAME_CODE:  # its child runs its parent's code: nothing was timed
            continue
        verdict = recorded_verdict(problem, states[step.index], against=states[step.index + 1], policy=policy,
                                   cache=cache)
        contenders = verdict.profile.get("contenders", {})
        if "baseline" not in contenders:
            raise DocumentError(f"step {step.index}", "its recorded forward timing has no paired baseline")
        steps.append(StepTiming(step.index, step.transform, float(contenders["candidate"]["median_us"]),
                                float(contenders["baseline"]["median_us"])))
    return steps


def state_timings(steps: list[StepTiming]) -> list[StateTiming]:
    """Each state timed in two consecutive steps, with both of its medians."""
    by_index = {step.index: step for step in steps}
    return [StateTiming(i, by_index[i - 1].baseline_us, by_index[i].candidate_us)
            for i in sorted(by_index) if i - 1 in by_index]


def step_pairings(lineage: Lineage, cache: GateCache | None = None, tolerance: float = PAIRING_TOLERANCE,
                  retimings: bool = True) -> list[StepPairing]:
    """Each accepted step of a GPU walk, with whether its parent and child agree with themselves;
    a step re-timed with places exchanged is judged by that, unless `retimings` is off (the walk's
    own pairings alone: which steps were doubtful)."""
    try:
        steps = step_timings(lineage, cache)
    except KLineageError as exc:  # a walk made elsewhere, whose verdicts are not recorded here
        return [StepPairing(t.index, Pairing.UNCHECKED, f"no recorded timing to audit ({exc})")
                for t in lineage.transitions]
    states = {state.index: state for state in state_timings(steps)}
    required = {t.index: t.forward.timing.required for t in lineage.transitions if t.forward.timing is not None}
    pairings = []
    for step in steps:
        retimed = retimings and _retimed(lineage, step, cache, required.get(step.index, DEFAULT_FORWARD_RATIO))
        if retimed:
            pairings.append(retimed)
            continue
        around = [states.get(step.index), states.get(step.index + 1)]
        off = [state for state in around if state is not None and state.disagrees(tolerance)]
        if off:
            factor = max(max(s.bias, 1 / s.bias) for s in off)
            need = required.get(step.index, DEFAULT_FORWARD_RATIO)
            decided = step.ratio / factor >= need or step.ratio * factor < need
            medians = "; ".join(f"state {s.index} timed {s.as_candidate_us:.1f} us as a candidate and "
                                f"{s.as_baseline_us:.1f} us as a baseline" for s in off)
            pairings.append(StepPairing(step.index, Pairing.OUTWEIGHED, f"{medians}: the ratio {step.ratio:.3f} clears "
                                        f"{need} by more than that {factor:.2f}x, its size is uncertain by it")
                            if decided else
                            StepPairing(step.index, Pairing.BIASED, f"{medians}: the ratio {step.ratio:.3f} is within "
                                        f"that {factor:.2f}x of the required {need}, not evidence either way"))
        elif None in around:
            once = step.index if around[0] is None else step.index + 1
            pairings.append(StepPairing(step.index, Pairing.UNCHECKED,
                                        f"state {once} was timed in one pairing only (the walk's first or last)"))
        else:
            pairings.append(StepPairing(step.index, Pairing.CONSISTENT,
                                        f"its parent and child each timed within {tolerance:.0%} in both pairings"))
    pairings += [StepPairing(t.index, Pairing.UNCHECKED, "not timed: its child runs its parent's machine code")
                 for t in lineage.transitions if t.forward.status is ForwardStatus.SAME_CODE]
    return sorted(pairings, key=lambda p: p.index)


def _retimed(lineage: Lineage, step: StepTiming, cache: GateCache | None, need: float) -> StepPairing | None:
    found = retimed_effect(lineage, step.index, cache)
    if found is None:  # not re-timed: the walk's own pairing is all there is
        return None
    overall, rounds = found
    verdict = "clears" if overall >= need and min(rounds) >= need else "misses"
    return StepPairing(step.index, Pairing.EXCHANGED,
                       f"re-timed with parent and child exchanging places: {overall:.3f} (rounds "
                       f"{', '.join(f'{r:.3f}' for r in rounds)}) {verdict} the required {need}; the walk's "
                       f"pairing gave {step.ratio:.3f}", overall)


def code_identities(lineage: Lineage, steps: list[StepTiming], indices: set[int]) -> list[StepTiming]:
    """The steps in `indices`, their parent's and child's SASS compared; each state is compiled and
    disassembled once, though consecutive steps share it (seconds to minutes per state)."""
    codes: dict[int, MachineCode | None] = {}

    def of(index: int) -> MachineCode | None:
        if index not in codes:
            codes[index] = machine_code(lineage.states[index].kernel)
        return codes[index]

    return [StepTiming(s.index, s.transform, s.candidate_us, s.baseline_us, identity(of(s.index), of(s.index + 1)))
            for s in steps if s.index in indices]
