"""The forward loop: optimize a kernel with skill cards (or a baseline strategy) under the gate.

Decisions (each one here, in one place):
- The start kernel is gated first (gate call 1 of the budget) and must pass (in a compile-only
  run: compile); otherwise the run stops `start_failed` and tries nothing.
- A round is the work at one best kernel. The strategy's planner yields candidates; a candidate
  without a kernel (the card or transform does not apply) is recorded `not_applicable`, one whose
  kernel is the best itself, a kernel of the path, or one already judged this round `duplicate`;
  one of a LIBRARY card alone (rule rewriter; at one site, or at all of them) none of whose
  measurements would have been a step at `required_ratio` is `passed_over` (it could be taken only
  by beating its own evidence; its paths and its whole mechanism are still tried); none of these
  costs a gate call. Nor does one that runs the best kernel's machine code (`CodeCheck.SASS`, the
  default: the same SASS and ptxas resources in every function, launched alike; klineage.gate.machine_code),
  recorded `same_code`: its true ratio is 1, so no paired ratio could take it. (On the held-out operators'
  H100 searches, which ran without the check, such kernels were 65 of 319 gated candidates, mostly a
  `__launch_bounds__` or `__ldg` nvcc had already applied, and one was timed faster by 1% in every trial:
  bench/results/same_code.json.) Every other candidate is gated against the best: correctness on every
  case, then paired timing of candidate and best interleaved (`run_gate(..., against=best)`).
- A candidate is taken only on a paired improvement: it passed, and best time / candidate time is
  at least `required_ratio` in the median and in every trial (`PairedRatio.accepts`). A pass
  without a paired ratio is not taken (unknown fails). First-improvement strategies take the first
  such candidate and replan from it; UNCONDITIONED_GREEDY gates the whole round and takes the
  fastest.
- Rivals (rule rewriter, first improvement): a step can rule out the round's better rewrites of the same
  code (bias_grad's column loop has three: a warp per column, 4 lanes per column, chunks of rows then a
  merge; a shuffle card's path taken first left none of them a site, 3.2x where the best was 13.4x). So
  before a faster candidate is taken, the round's other candidates whose transform has a forward site at
  the best kernel and none at the candidate (at most `RIVALS`, one per transform, in the planner's order)
  are gated against the best as well, and the fastest accepted one is taken. A candidate of a transform
  the step itself applied is no rival (its other sites are still there after the step). The run's
  document keeps its `rivals` (0 in documents written before rivals existed), so a replay is that run.
- Compile-only: nothing runs, nothing is timed, so nothing can be shown to improve. Candidates are
  recorded `untimed` and never taken; the result says so (`COMPILE_ONLY_NOTE`).
- The budget counts every gate call, the start's included; the run never makes more. It stops
  `budget` when a candidate needs a gate call and none is left, `no_candidate` when a round
  yields no candidate kernel at all, `no_improvement` when a round is tried out without a step,
  `gate_error` when the gate cannot judge a candidate (harness failure, replay miss: the gate
  call counts; nothing after it would be trusted), `llm_budget` when the model budget is spent,
  `time_limit` when `time_limit_s` has passed (checked before each gate call, after the budget).
- Wasted evaluations: gated candidates that were not taken.
- Lookahead (PAIRS, the default for every strategy): a mechanism can cost time alone and pay only
  with the next one (the GEMM walk measured cp.async 0.89x and the swizzle 0.82x on a kernel
  without tensor cores, mma.sync 58.9x after them). When a round is tried out without a step, the
  candidates that passed but were not faster (the best few, by ratio) become stepping stones: the
  planner is asked at each, and each kernel it gives is gated against the best as one composite
  candidate (transform `A+B`); the first paired improvement is taken as one step. Composites cost
  gate calls like any candidate and are bounded by the budget.
- Prefetch (jobs > 1): a window of the round's next candidates (never more than gate calls left)
  has its correctness judged side by side first, under the policy's untimed twin; each gate call
  then reuses that verdict and only times (`GatePolicy.correctness_twin`). Prefetching decides
  nothing and costs no budget; candidates it judged that the round never reaches cost GPU time only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from klineage import config
from klineage.config import GateMode
from klineage.documents import choice
from klineage.errors import KLineageError, ReplayMiss
from klineage.gate.cache import GateCache
from klineage.gate.machine_code import CodeIdentity, MachineCode, identity, machine_code
from klineage.gate.pipeline import Runner, default_cache, run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.prefetch import prefetch
from klineage.gate.timing import PairedRatio
from klineage.gate.verdict import Status, Verdict
from klineage.gate.warm import serial_runner
from klineage.kernel import KernelState
from klineage.lineage import Lineage, ProblemRef, VerdictSummary, unified_diff
from klineage.optimize.result import (
    COMPILE_ONLY_NOTE,
    DEFAULT_REQUIRED_RATIO,
    Attempt,
    AttemptStatus,
    CodeCheck,
    EventKind,
    LibraryRef,
    OptimizationEvent,
    OptimizationResult,
    Stats,
    Step,
    Stop,
)
from klineage.optimize.strategies import (
    DEFAULT_ORDERING,
    RIVALS,
    Candidate,
    Ordering,
    RewriterKind,
    RunMemory,
    Selection,
    Strategy,
    planner,
)
from klineage.rewriters.llm_budget import BudgetExhausted
from klineage.skills.card import CardStatus
from klineage.specialize import specialized
from klineage.transforms import catalog
from klineage.transforms.base import Direction, Rewrite, Transform

Progress = Callable[[str, str, "float | None"], None]
SAME_CODE_NOTE = ("not gated: it runs the best kernel's machine code (the same SASS and ptxas resources in every "
                  "function, launched alike), so its true ratio is 1 and it cannot be a step")
STEPPING_STONES = 3  # passed-but-slower candidates of a round tried as the first half of a composite


class Lookahead(str, Enum):
    NONE = "none"  # one candidate per step
    PAIRS = "pairs"  # when no single candidate improves, try two in a row as one step
EventSink = Callable[[OptimizationEvent], None]

# Every candidate: correctness on every case with several seeds, sanitizers on a pass, and paired
# timing against the best (the vendor path is not needed to compare two kernels).
DEFAULT_POLICY = GatePolicy(seeds=3, timing=True, vendor=False, sanitize=Sanitize.ON_PASS)


def _quiet_progress(stage: str, message: str, fraction: float | None) -> None:
    pass


def _quiet_events(event: OptimizationEvent) -> None:
    pass


def optimize(problem_path: str | Path, start: KernelState, *, strategy: Strategy | str, library: Any = None,
             budget: int, gate_mode: GateMode | str, rewriter: RewriterKind | str = RewriterKind.RULES, seed: int = 0,
             statuses: Sequence[CardStatus | str] = (CardStatus.ADMITTED,), policy: GatePolicy = DEFAULT_POLICY,
             required_ratio: float = DEFAULT_REQUIRED_RATIO, cache: GateCache | None = None,
             progress: Progress | None = None, on_event: EventSink | None = None,
             transforms: Sequence[Transform] | None = None, llm: Any = None,
             lineages: Mapping[str, Lineage] | None = None, lookahead: Lookahead = Lookahead.PAIRS,
             record: bool = False, jobs: int = 1, time_limit_s: float | None = None,
             rivals: int = RIVALS, ordering: Ordering | str = DEFAULT_ORDERING,
             code_check: CodeCheck | str = CodeCheck.SASS) -> OptimizationResult:
    """Optimize `start` on the problem with `strategy`, spending at most `budget` gate calls.

    `library` is a `klineage.skills.library.Library`, or the path of one (a library JSON file or a
    folder of SKILL.md), needed by LIBRARY and GENERATED_ONLY; only cards whose status is in
    `statuses` are retrieved. `rewriter` "llm" materializes cards through the LLM rewriter (`llm`,
    else one configured from the environment) under its token/dollar budget.
    `progress(stage, message, fraction)` hears what is happening (fraction: gate calls spent /
    budget); `on_event(OptimizationEvent)` hears every attempt and every step, with the best
    speedup so far. `transforms` is the unconditioned strategies' pool (default: the catalog).
    `lineages` (lineage id -> lineage; default: the bundled ones) lend the LIBRARY strategy the
    anchors its cards' evidence names. `jobs` > 1 (GPU gate, rule rewriter) judges the correctness of
    the next `jobs` candidates side by side before they are gated one at a time (Prefetch, above).
    `record` (GPU gate) keeps every verdict the run used, measured now or served from this machine's
    cache, in the recorded store, so that replay can serve the run. `time_limit_s` bounds the run's
    wall clock: no candidate is gated once it has passed (stop `time_limit`; a gate call under way
    finishes, so that every evaluation counted was judged whole; with `jobs` > 1 so does a window
    of correctness twins begun before the limit). `rivals` bounds the candidates a first improvement
    would rule out that are gated beside it (Rivals, above; 0: none, the first improvement is taken).
    `ordering` is how a library strategy orders each round (`strategies.Ordering`; the document keeps it, and a
    replay of a run written before orderings existed passes AS_PLANNED). `code_check` is what is compared before a
    candidate is gated (`CodeCheck`; the document keeps it, and a replay of a run written before the check passes NONE).
    Strategy, rewriter, gate mode, statuses, ordering and code check may be given by their values ("library",
    "compile")."""
    strategy = Strategy.parse(strategy)
    rewriter = RewriterKind.parse(rewriter)
    gate_mode = choice(GateMode, gate_mode, "gate mode")
    ordering = Ordering.parse(ordering)
    code_check = choice(CodeCheck, code_check, "code check")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise KLineageError(f"the budget is a whole number of gate evaluations >= 1, not {budget!r}")
    if required_ratio < 1:
        raise KLineageError(f"an improvement needs a required ratio >= 1, not {required_ratio}")
    if isinstance(rivals, bool) or not isinstance(rivals, int) or rivals < 0:
        raise KLineageError(f"rivals is a whole number of candidates >= 0, not {rivals!r}")
    if time_limit_s is not None and not time_limit_s > 0:
        raise KLineageError(f"the time limit is a number of seconds > 0, not {time_limit_s!r}")
    allowed = _statuses(statuses)
    if strategy.uses_library and library is None:
        raise KLineageError(f"strategy {strategy.value} draws on a skill library: give one (--library)")
    library_ref = None
    if library is not None:
        where = ""
        if isinstance(library, (str, Path)):
            from klineage.skills.library import load_library

            where, library = str(library), load_library(library)
        where = where or str(library.provenance.get("folder", "") or library.provenance.get("path", ""))
        library_ref = LibraryRef(where, allowed, len(library.cards), sum(c.status in allowed for c in library.cards))
    cards = tuple(library.cards) if library is not None else ()
    if rewriter is RewriterKind.LLM and llm is None:
        from klineage.rewriters.llm import LLMRewriter

        llm = LLMRewriter()
    problem_path = Path(problem_path).resolve()
    problem = None
    if strategy.uses_library:
        from klineage.gate.execute import probe_problem

        problem = probe_problem(problem_path, config.cache_dir()).info
    if lineages is None and strategy.lends_walks:
        from klineage.skills.library import lineage_index

        lineages = lineage_index()
    memory = RunMemory()
    plan = planner(strategy, rewriter, cards=cards, problem=problem, statuses=allowed,
                   transforms=list(catalog().values() if transforms is None else transforms), seed=seed, llm=llm,
                   lineages=lineages, required_ratio=required_ratio, ordering=ordering, memory=memory)
    with serial_runner(problem_path, gate_mode) as runner:
        run = _Run(problem_path, start, strategy, rewriter, gate_mode, budget, seed, required_ratio, policy, cache,
                   progress or _quiet_progress, on_event or _quiet_events, plan, library_ref, llm,
                   choice(Lookahead, lookahead, "lookahead"), record, jobs, time_limit_s, rivals, runner=runner,
                   ordering=ordering, memory=memory, code_check=code_check)
        return run.go()


def _statuses(values: Sequence[CardStatus | str]) -> tuple[CardStatus, ...]:
    found = [choice(CardStatus, value, "card status") for value in values]
    if not found:
        raise KLineageError("choose at least one card status")
    return tuple(dict.fromkeys(found))


class _GateFailed(Exception):
    def __init__(self, message: str):
        self.message = message


@dataclass
class _Run:
    problem: Path
    start: KernelState
    strategy: Strategy
    rewriter: RewriterKind
    mode: GateMode
    budget: int
    seed: int
    required: float
    policy: GatePolicy
    cache: GateCache | None
    progress: Progress
    on_event: EventSink
    plan: Callable[[KernelState], Iterator[Candidate]]
    library: LibraryRef | None
    llm: Any
    lookahead: Lookahead
    keep_verdicts: bool = False  # optimize(record=...); `record` names the attempt log
    jobs: int = 1
    time_limit_s: float | None = None
    rivals: int = RIVALS
    runner: Runner | None = None  # the warm runner of this run's one-at-a-time gates (klineage.gate.warm)
    ordering: Ordering = Ordering.AS_PLANNED
    memory: RunMemory = field(default_factory=RunMemory)  # what the planner's MEASURED ordering reads
    code_check: CodeCheck = CodeCheck.NONE
    codes: dict[str, MachineCode | None] = field(default_factory=dict)  # machine code by kernel fingerprint
    began: float = field(default_factory=time.monotonic)
    attempts: list[Attempt] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    evaluations: int = 0
    seconds: float = 0.0
    kernels: dict[str, KernelState] = field(default_factory=dict)  # every kernel gated, by fingerprint
    start_verdict: Verdict | None = None
    problem_ref: ProblemRef | None = None

    @property
    def best(self) -> KernelState:
        return self.steps[-1].state if self.steps else self.start

    @property
    def speedup(self) -> float | None:
        if self.mode is GateMode.COMPILE_ONLY:
            return None
        product = 1.0
        for step in self.steps:
            product *= step.ratio.overall
        return product

    @property
    def fraction(self) -> float:
        return self.evaluations / self.budget

    def go(self) -> OptimizationResult:
        self.progress("optimize", f"{self.strategy.value}: gating the start kernel {self.start.name}", 0.0)
        try:
            verdict = self.gate(self.start, None, "the start kernel")
        except _GateFailed as failure:
            raise KLineageError(f"the gate could not judge the start kernel: {failure.message}") from None
        self.start_verdict = verdict
        self.problem_ref = ProblemRef(verdict.problem["operator"], verdict.problem["fingerprint"])
        if verdict.status is not Status.passing(self.mode):
            return self.finish(Stop.START_FAILED, f"the start kernel does not pass the gate: {verdict.describe(300)}")
        while True:
            stop = self.round()
            if stop is not None:
                return self.finish(*stop)

    def round(self) -> tuple[Stop, str] | None:
        """Work at the current best; None when a step was taken (plan again from the new best)."""
        parent = self.best
        index = len(self.steps)
        path = {self.start.fingerprint, *(s.child for s in self.steps)}
        judged: set[str] = set()
        offered = 0
        faster: list[Attempt] = []
        candidates = self.ahead(self.plan(parent), parent)
        stop: tuple[Stop, str] | None = None
        while True:
            candidate = self.next_candidate(candidates)
            if not isinstance(candidate, Candidate):
                stop = candidate
                break
            attempt = self.attempt(index, parent, candidate, path, judged)
            offered += candidate.rewrite is not None
            if attempt.status is AttemptStatus.GATE_ERROR:
                return Stop.GATE_ERROR, f"the gate could not judge {candidate}: {attempt.message}"
            if attempt.status is AttemptStatus.FASTER:
                faster.append(attempt)
                if self.strategy.selection is Selection.FIRST_IMPROVEMENT:
                    if self.rewriter is RewriterKind.RULES and self.rivals:
                        stop = self.gate_rivals(index, parent, attempt, path, judged, faster)
                    break
        if faster:
            self.take(max(faster, key=lambda a: a.ratio.overall), parent)
            return stop
        if stop is not None:
            return stop
        if self.lookahead is Lookahead.PAIRS:
            stones = [a for a in self.attempts if a.round == index and a.status is AttemptStatus.NOT_FASTER]
            outcome = self.pairs(index, parent, path, judged, stones)
            if outcome is True:  # a composite step was taken: plan again from the new best
                return None
            if outcome is not None:  # the run must stop
                return outcome
        if not offered:
            return Stop.NO_CANDIDATE, f"no candidate kernel at step {index}: {self.nothing_applies()}"
        return Stop.NO_IMPROVEMENT, (f"{offered} candidate kernel(s) at step {index} were dealt with; none was taken"
                                     + (f" ({COMPILE_ONLY_NOTE})" if self.mode is GateMode.COMPILE_ONLY else ""))

    def next_candidate(self, candidates: Iterator[Candidate]) -> Candidate | tuple[Stop, str] | None:
        """The planner's next candidate; the reason to stop when no gate call (or model call) is
        left; None when the planner has nothing more."""
        if self.evaluations >= self.budget:
            return Stop.BUDGET, f"all {self.budget} gate evaluations are spent"
        if self.time_limit_s is not None and time.monotonic() - self.began >= self.time_limit_s:
            return Stop.TIME_LIMIT, (f"the {self.time_limit_s:g} s time limit passed after {self.evaluations} of "
                                     f"{self.budget} gate evaluations")
        try:
            return next(candidates, None)
        except BudgetExhausted as exc:
            return Stop.LLM_BUDGET, str(exc)

    def gate_rivals(self, index: int, parent: KernelState, first: Attempt, path: set[str], judged: set[str],
                    faster: list[Attempt]) -> tuple[Stop, str] | None:
        """Gate the candidates at `parent` that taking `first` would rule out (Rivals, above), adding the
        faster ones to `faster`; the reason to stop when the budget or the time runs out among them."""
        found = ruled_out(self.plan(parent), parent, self.kernels[first.candidate], first.transform,
                          path | judged, self.rivals)
        if found:
            self.progress("optimize", f"step {index}: {first.transform} is faster; gating the {len(found)} "
                                      f"candidate(s) it would rule out: " + ", ".join(c.transform for c in found),
                          self.fraction)
        candidates = self.ahead(iter(found), parent)
        while True:
            candidate = self.next_candidate(candidates)
            if not isinstance(candidate, Candidate):
                return candidate
            attempt = self.attempt(index, parent, candidate, path, judged,
                                   why=f"a rival of attempt {first.index} ({first.transform}), which rules it out")
            if attempt.status is AttemptStatus.GATE_ERROR:
                return Stop.GATE_ERROR, f"the gate could not judge {candidate}: {attempt.message}"
            if attempt.status is AttemptStatus.FASTER:
                faster.append(attempt)

    def ahead(self, candidates: Iterator[Candidate], against: KernelState) -> Iterator[Candidate]:
        """The planner's candidates, to be gated against `against`; with jobs > 1, each window of them has
        its correctness twins judged side by side first, so that their gate calls below only time. A window
        never holds more candidates than gate calls are left, nor one that runs `against`'s machine code
        (never gated); the LLM planner is never read ahead (each candidate is a paid model call)."""
        if self.jobs <= 1 or self.mode is not GateMode.GPU or self.rewriter is RewriterKind.LLM:
            yield from candidates
            return
        while self.evaluations < self.budget:
            window = list(itertools.islice(candidates, self.jobs))
            if not window:
                return
            fresh = {c.state.fingerprint: c.state for c in window
                     if c.state is not None and not c.not_gated and c.state.fingerprint not in self.kernels
                     and not self.same_code(c.state, against)}
            if len(fresh) > 1:
                self.progress("optimize", f"judging the correctness of {len(fresh)} candidates side by side",
                              self.fraction)
                prefetch(self.problem, list(fresh.values())[:self.budget - self.evaluations],
                         self.policy.correctness_twin(), self.cache or default_cache(), jobs=self.jobs)
            yield from window

    def pairs(self, index: int, parent: KernelState, path: set[str], judged: set[str],
              stones: list[Attempt]) -> bool | tuple[Stop, str] | None:
        """Composite candidates on the best few stepping stones; True when one was taken."""
        for stone in sorted(stones, key=lambda a: -a.ratio.overall)[:STEPPING_STONES]:
            first = self.kernels[stone.candidate]
            candidates = self.ahead(self.plan(first), parent)
            while True:
                candidate = self.next_candidate(candidates)
                if not isinstance(candidate, Candidate):
                    if candidate is not None:
                        return candidate
                    break
                if candidate.rewrite is None or candidate.not_gated or candidate.state.fingerprint == first.fingerprint:
                    continue  # nothing to add on this stone: no gate call, no record
                both = Rewrite(f"{stone.transform}+{candidate.transform}", Direction.FORWARD, candidate.rewrite.anchor,
                               candidate.state, adds=candidate.rewrite.adds, removes=candidate.rewrite.removes,
                               note=f"on top of attempt {stone.index} ({stone.transform})")
                attempt = self.attempt(index, parent, Candidate(both.transform, candidate.card, both.anchor, both,
                                                                score=candidate.score), path, judged)
                if attempt.status is AttemptStatus.GATE_ERROR:
                    return Stop.GATE_ERROR, f"the gate could not judge {both.transform}: {attempt.message}"
                if attempt.status is AttemptStatus.FASTER:
                    self.take(attempt, parent)
                    return True
        return None

    def nothing_applies(self) -> str:
        if not self.strategy.uses_library:
            return "no transform applies"
        said = "no card applies"
        if self.library is not None and not self.library.eligible:
            allowed = ", ".join(s.value for s in self.library.statuses)
            said = (f"none of the library's {self.library.cards} card(s) has an allowed status ({allowed}); "
                    f"allow more statuses (e.g. admitted,candidate)")
        if self.strategy is Strategy.LIBRARY_THEN_CATALOG:
            return f"{said}, and no catalog transform applies"
        return said

    def attempt(self, index: int, parent: KernelState, candidate: Candidate, path: set[str],
                judged: set[str], why: str = "") -> Attempt:
        """The candidate dealt with and recorded; `why` (a gated candidate's reason to be gated) ends its message."""
        common = dict(index=len(self.attempts), round=index, parent=parent.fingerprint,
                      transform=candidate.transform, card=candidate.card, anchor=candidate.anchor,
                      score=candidate.score)
        self.progress("optimize", f"step {index}: {candidate}", self.fraction)
        state = candidate.state
        if state is None:
            return self.record(Attempt(**common, candidate="", status=AttemptStatus.NOT_APPLICABLE,
                                       message=" ".join(candidate.reason.split())[:400]))
        if state.fingerprint in path or state.fingerprint in judged:
            what = ("the best kernel itself" if state.fingerprint == parent.fingerprint else
                    "a kernel of the path" if state.fingerprint in path else "a kernel already judged at this step")
            return self.record(Attempt(**common, candidate=state.fingerprint, status=AttemptStatus.DUPLICATE,
                                       message=f"the rewrite gives {what} ({state.fingerprint[:12]})"))
        if candidate.precondition_failed:
            return self.record(Attempt(**common, candidate=state.fingerprint, status=AttemptStatus.PRECONDITION_FAILED,
                                       message=candidate.precondition_failed))
        if candidate.passed_over:
            return self.record(Attempt(**common, candidate=state.fingerprint, status=AttemptStatus.PASSED_OVER,
                                       message=candidate.passed_over))
        judged.add(state.fingerprint)
        if self.same_code(state, parent):
            return self.record(Attempt(**common, candidate=state.fingerprint, status=AttemptStatus.SAME_CODE,
                                       message=SAME_CODE_NOTE))
        try:
            verdict = self.gate(state, parent, f"step {index} ({candidate})")
        except _GateFailed as failure:
            return self.record(Attempt(**common, candidate=state.fingerprint, status=AttemptStatus.GATE_ERROR,
                                       message=failure.message, evaluation=self.evaluations))
        status, ratio, message = self.judge(verdict)
        if status in (AttemptStatus.NOT_FASTER, AttemptStatus.REJECTED):
            self.memory.unpaid(candidate.transform, candidate.anchor, status.value.replace("_", " "))
        message = "; ".join(filter(None, (message, why, candidate.put_last and f"put last: {candidate.put_last}",
                                          candidate.instance)))
        return self.record(Attempt(**common, candidate=state.fingerprint, status=status, message=message,
                                   evaluation=self.evaluations, key=str(verdict.provenance.get("key", "")),
                                   verdict=VerdictSummary.of(verdict), ratio=ratio))

    def same_code(self, kernel: KernelState, best: KernelState) -> bool:
        """Whether the code check finds that `kernel` runs `best`'s machine code. Where it cannot tell (a
        kernel that does not compile, a toolchain that cannot disassemble) the gate judges, as without it."""
        if self.code_check is CodeCheck.NONE:
            return False
        return identity(self.machine_code(kernel), self.machine_code(best)) is CodeIdentity.SAME

    def machine_code(self, kernel: KernelState) -> MachineCode | None:
        if kernel.fingerprint not in self.codes:
            self.codes[kernel.fingerprint] = machine_code(kernel)
        return self.codes[kernel.fingerprint]

    def judge(self, verdict: Verdict) -> tuple[AttemptStatus, PairedRatio | None, str]:
        if verdict.status is Status.ERROR:
            return AttemptStatus.GATE_ERROR, None, verdict.describe(300)
        if verdict.status is Status.REJECTED:
            return AttemptStatus.REJECTED, None, verdict.describe(300)
        if verdict.status is Status.COMPILED:
            return AttemptStatus.UNTIMED, None, "compiled; compile-only gate: not run, not timed, not accepted"
        if verdict.unsettled:
            return AttemptStatus.UNSETTLED, None, verdict.describe(300) + "; not accepted, not refused"
        found = verdict.profile.get("ratios", {}).get("vs_baseline")
        if not found:
            return AttemptStatus.NOT_FASTER, None, ("passed, but the gate gave no paired ratio against the best "
                                                    "(unknown fails)")
        ratio = PairedRatio(float(found["overall"]), tuple(float(r) for r in found["per_trial"]))
        trials = ", ".join(f"{r:.3f}" for r in ratio.per_trial)
        text = f"best time / candidate time {ratio.overall:.3f} (trials {trials}), required {self.required}"
        if ratio.accepts(self.required):
            return AttemptStatus.FASTER, ratio, "passed; " + text
        return AttemptStatus.NOT_FASTER, ratio, "passed, not faster: " + text

    def take(self, attempt: Attempt, parent: KernelState) -> None:
        """Move the path to the kernel of a faster attempt."""
        state = self.kernels[attempt.candidate]
        step = Step(len(self.steps), attempt.index, attempt.transform, attempt.card, attempt.anchor,
                    parent.fingerprint, state, attempt.ratio, unified_diff(parent, state, "best", "candidate"))
        self.steps.append(step)
        self.memory.stepped()
        self.progress("optimize", f"step {step.index}: took {attempt.transform} ({attempt.ratio.overall:.3f}x); "
                                  f"{self.speedup:.3f}x over the start", self.fraction)
        self.on_event(OptimizationEvent(EventKind.STEP, attempt, self.evaluations, self.budget, len(self.steps),
                                        state.fingerprint, self.speedup))

    def record(self, attempt: Attempt) -> Attempt:
        self.attempts.append(attempt)
        self.on_event(OptimizationEvent(EventKind.ATTEMPT, attempt, self.evaluations, self.budget, len(self.steps),
                                        self.best.fingerprint, self.speedup))
        self.progress("optimize", f"attempt {attempt.index}: {attempt.status.value} {attempt.transform}",
                      self.fraction)
        return attempt

    def gate(self, kernel: KernelState, against: KernelState | None, role: str) -> Verdict:
        """One counted gate call. A gate that cannot judge raises _GateFailed (the call still counts)."""
        self.kernels[kernel.fingerprint] = kernel

        def forward(stage: str, message: str) -> None:
            self.progress(stage, f"{role}: {message}", self.fraction)

        self.evaluations += 1
        try:
            verdict = run_gate(self.problem, kernel, against=against, policy=self.policy, mode=self.mode,
                               cache=self.cache, progress=forward, runner=self.runner)
        except ReplayMiss as miss:
            raise _GateFailed(f"no recorded verdict for {role} ({kernel.fingerprint[:12]}"
                              + (f" against {against.fingerprint[:12]}" if against else "") + f"): {miss}") from None
        except KLineageError as exc:
            raise _GateFailed(str(exc)) from None
        if self.keep_verdicts and self.mode is GateMode.GPU:
            # keep, not run_gate(record=True): that skips this machine's cache and would measure again
            # what it holds (a caller running every strategy gates the same start kernel each time)
            (self.cache or default_cache()).keep(verdict)
        self.seconds += sum(float(v) for v in verdict.timings.values())
        return verdict

    def finish(self, stop: Stop, message: str) -> OptimizationResult:
        self.progress("optimize", f"{stop.value}: {message}", self.fraction)
        gated = sum(a.status.gated for a in self.attempts)
        return OptimizationResult(
            problem=self.problem_ref, start=self.start, start_verdict=VerdictSummary.of(self.start_verdict),
            strategy=self.strategy, rewriter=self.rewriter, gate=self.mode, budget=self.budget, seed=self.seed,
            required_ratio=self.required, policy=self.policy.to_dict(), library=self.library,
            attempts=tuple(self.attempts), steps=tuple(self.steps), stop=stop, message=message,
            stats=Stats(self.evaluations, gated - len(self.steps), len(self.steps), round(self.seconds, 3),
                        sum(a.status is AttemptStatus.PRECONDITION_FAILED for a in self.attempts),
                        sum(a.status is AttemptStatus.SAME_CODE for a in self.attempts)),
            llm_usage=self.llm.spent.to_dict() if self.llm is not None else None, rivals=self.rivals,
            ordering=self.ordering, code_check=self.code_check)


def ruled_out(candidates: Iterator[Candidate], parent: KernelState, child: KernelState, taken: str,
              seen: set[str], limit: int = RIVALS) -> list[Candidate]:
    """The candidate kernels at `parent` that stepping to `child` (by the transforms `taken`, joined by '+')
    rules out: the first of each catalog transform that has a forward site at `parent` and none at `child`,
    at most `limit`, in the planner's order. Kernels in `seen`, not to be gated (passed over, a failed
    precondition) or of a transform the step applied are left out."""
    known = catalog()
    own = set(taken.split("+"))
    verdicts: dict[str, bool] = {}  # transform -> whether the step rules it out
    found: list[Candidate] = []
    for candidate in candidates:
        if len(found) >= limit:
            break
        name = candidate.transform
        if (candidate.state is None or candidate.not_gated or name in own or name not in known
                or candidate.state.fingerprint in seen):
            continue
        if name not in verdicts:
            verdicts[name] = _rules_out(known[name], parent, child)
            if verdicts[name]:
                found.append(candidate)
    return found


def _rules_out(transform: Transform, parent: KernelState, child: KernelState) -> bool:
    try:
        return (bool(transform.forward_sites(specialized(parent).state))
                and not transform.forward_sites(specialized(child).state))
    except Exception:  # noqa: BLE001 - a transform whose analysis fails is no rival (the planner reports it)
        return False


__all__ = ["DEFAULT_POLICY", "EventSink", "Progress", "optimize", "ruled_out"]
