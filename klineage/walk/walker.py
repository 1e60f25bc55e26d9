"""The backward walk: from an expert kernel, one gated and audited simplification at a time.

Decisions (each one here, in one place):
- The expert is gated first and must pass (in a compile-only walk: compile); otherwise the walk
  ends `unknown` with the gate's reason, and the lineage holds the expert alone.
- At each state the rewriter's proposals are taken in order. The first that passes the gate and
  the audit is accepted; the walk then moves to its child and asks again.
- A proposal without a rewrite (the transform does not apply) is recorded as `not_applicable`, and
  one whose rewrite gives back its parent or an earlier state as `no_change`. Neither costs a gate
  evaluation and neither counts toward the rejection limit: they are evidence of preconditions,
  and a transform that finds sites it cannot rewrite must not exhaust the walk's budget.
- An edit refused for a reason that comes from the edit itself (compile error, static check, audit
  mismatch) is not gated again when a later state proposes the same edit (same transform, anchor,
  changed lines and plan change): it is recorded `repeated`, naming the earlier step, and neither
  costs an evaluation nor counts. Without this, one padding that a static_assert forbids is
  re-proposed after every accepted step and alone exhausts the rejection limit. Conservative: at
  worst a step that other steps would have made possible is missed; nothing unjudged is accepted.
- Every gated or audited refusal counts. When the count reaches `max_rejections` the walk ends
  `rejection_limit`; after `max_steps` accepted steps it ends `step_limit` (which does not prove
  the kernel naive); when the rewriter has nothing left that was not tried at this state, it ends
  `complete`. A gate that cannot judge (status error, or a rejection with reason `unknown`), or a
  rewriter that fails, ends it `unknown`; the lineage up to there is kept.
- The forward check of an accepted step: the transform's mechanical `forward` applied to the child
  at the same anchor must give back the parent's fingerprint (else `failed`; no inverse:
  `no_mechanical_forward`). On a GPU (or replaying one) the parent is then gated against the child
  with paired timing: child time / parent time must be >= 0.99 in the median and every trial
  (`verified`), else `slower`. A compile-only walk times nothing (`untimed`). A slower step is
  still accepted: the simplification is sound; its card simply promises no speed. With the code
  check (`CodeCheck.SASS`, the CLI's default) a step whose child runs its parent's machine code is
  `same_code` and not timed, in any gate mode: nvcc had already done what its forward spells out, its
  true ratio is 1, and a timing would measure the pairing's noise (klineage.walk.step_code says the
  same of walks made without the check). The lineage's policy records the check.
- Replay: every gate call is served from recorded verdicts; a miss raises ReplayMiss naming the
  kernel and the step it was needed for. A GPU walk with `record` keeps every verdict it used
  (measured now or found in this machine's cache) in the recorded store, so the walk replays whole.
- The forward timing gate checks correctness with one seed: both kernels already passed every seed
  as walk states, and the check there only guards the timed outputs. The parent's stored state
  verdict answers even that (`run_gate(judged_under=...)`), so only the timing runs.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klineage.config import GateMode
from klineage.errors import KLineageError, ReplayMiss
from klineage.gate.cache import GateCache
from klineage.gate.machine_code import CodeCheck, CodeIdentity, same_machine_code
from klineage.gate.pipeline import Runner, default_cache, run_gate
from klineage.gate.policy import GatePolicy, Placement, Sanitize
from klineage.gate.verdict import Reason, Status, Verdict
from klineage.gate.warm import serial_runner
from klineage.kernel import KernelState
from klineage.lineage import (
    DEFAULT_FORWARD_RATIO,
    Evidence,
    ForwardCheck,
    ForwardStatus,
    KernelRef,
    Limits,
    Lineage,
    Outcome,
    PairedTiming,
    ProblemRef,
    Rejection,
    RejectionCategory,
    State,
    Stats,
    Termination,
    Transition,
    unified_diff,
)
from klineage.rewriters.base import Attempt, AttemptOutcome, History, Proposal
from klineage.rewriters.rules import RulesRewriter
from klineage.transforms import catalog
from klineage.transforms.base import Anchor, Direction, NotApplicable, Rewrite, Transform
from klineage.walk.audit import audit

Progress = Callable[[str, str], None]

# States are judged on every case with several seeds and sanitizers on a pass; timing is done
# separately, pairwise, for the forward step only.
DEFAULT_POLICY = GatePolicy(seeds=3, timing=False, sanitize=Sanitize.ON_PASS)
# Refusals the edit's own text decides; an incorrect result or a crash may depend on the code
# around the edit, so those are tried again at a later state.
SELF_DECIDED = frozenset({RejectionCategory.COMPILE_ERROR, RejectionCategory.STATIC_CHECK,
                          RejectionCategory.AUDIT_MISMATCH})
MAX_PROPOSALS_PER_STATE = 64  # a rewriter that never runs dry (an LLM) cannot loop forever on one state

CATEGORY: dict[Reason, RejectionCategory] = {
    Reason.STATIC_CHECK: RejectionCategory.STATIC_CHECK,
    Reason.COMPILE_ERROR: RejectionCategory.COMPILE_ERROR,
    Reason.PLAN_ERROR: RejectionCategory.COMPILE_ERROR,
    Reason.RESOURCE_LIMIT: RejectionCategory.RESOURCE_LIMIT,
    Reason.LAUNCH_ERROR: RejectionCategory.RESOURCE_LIMIT,
    Reason.TIMEOUT: RejectionCategory.TIMEOUT,
    Reason.OUTPUT_FLOOD: RejectionCategory.CRASH,
    Reason.CRASH: RejectionCategory.CRASH,
    Reason.OUT_OF_BOUNDS_WRITE: RejectionCategory.CRASH,
    Reason.MEMCHECK: RejectionCategory.CRASH,
    Reason.RACE: RejectionCategory.INCORRECT,
    Reason.INPUT_MODIFIED: RejectionCategory.INCORRECT,
    Reason.STALE_OUTPUT: RejectionCategory.INCORRECT,
    Reason.UNWRITTEN_OUTPUT: RejectionCategory.INCORRECT,
    Reason.NAN_OUTPUT: RejectionCategory.INCORRECT,
    Reason.NONDETERMINISTIC: RejectionCategory.INCORRECT,
    Reason.INCORRECT: RejectionCategory.INCORRECT,
    Reason.TIMED_OUTPUT_INCORRECT: RejectionCategory.INCORRECT,
    Reason.UNKNOWN: RejectionCategory.GATE_ERROR,
}
assert set(CATEGORY) == set(Reason), "every gate reason has a rejection category"


def forward_timing_policy(state_policy: GatePolicy, placement: Placement = Placement.AS_LOADED) -> GatePolicy:
    """How a forward step is timed: against the child, one seed, no sanitizer (see the module doc);
    `exchanged` places for kernels big enough that where their code lands moves their time."""
    return state_policy.with_(seeds=1, timing=True, vendor=False, sanitize=Sanitize.NEVER, placement=placement)


def changed_lines(parent: KernelState, child: KernelState) -> tuple[tuple[str, ...], str]:
    """What an edit changes, wherever it lands: the removed and added source lines in order (no
    context, no line numbers) and the new launch plan where the plan changed."""
    diff = difflib.unified_diff(parent.source.splitlines(), child.source.splitlines(), n=0, lineterm="")
    lines = tuple(line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))
    plan = json.dumps(child.plan.to_dict(), sort_keys=True) if child.plan != parent.plan else ""
    return lines, plan


def _quiet(stage: str, message: str) -> None:
    pass


def transforms_named(lineage: Lineage) -> list[Transform]:
    """The catalog's transforms that a walk named (accepted or rejected), in catalog order: what a
    replay of it proposes. Transforms it never named had no site on its path, so leaving them out
    changes nothing; transforms added to the catalog since would propose steps it never judged."""
    named = {t.transform for t in lineage.transitions} | {r.transform for r in lineage.rejections}
    return [t for name, t in catalog().items() if name in named]


def walk(problem_path: str | Path, expert: KernelState, rewriter: Any = None, gate_mode: GateMode = GateMode.GPU,
         policy: GatePolicy = DEFAULT_POLICY, max_steps: int = 16, max_rejections: int = 4,
         cache: GateCache | None = None, progress: Progress | None = None,
         transforms: Iterable[Transform] | None = None,
         forward_ratio: float = DEFAULT_FORWARD_RATIO, record: bool = False,
         placement: Placement = Placement.AS_LOADED, code_check: CodeCheck = CodeCheck.NONE) -> Lineage:
    """Walk `expert` backward on the problem and return its lineage.

    `rewriter` defaults to the rule rewriter over `transforms` (the catalog when None); the same
    transforms resolve proposal names for the audit and the forward check. `placement`: where the
    forward timings keep the parent and child while timing them (`Placement`). `code_check`: SASS marks a
    step whose child runs its parent's machine code `same_code`, untimed; NONE (a replay of a walk made
    before the check) times every verified forward."""
    limits = Limits(max_steps, max_rejections)
    pool = list(catalog().values() if transforms is None else transforms)
    rewriter = rewriter if rewriter is not None else RulesRewriter(pool)
    with serial_runner(problem_path, gate_mode) as runner:
        return _Walk(Path(problem_path), expert, rewriter, gate_mode, policy, limits, cache or default_cache(),
                     progress or _quiet, {t.name: t for t in pool}, forward_ratio, record, placement, runner,
                     code_check).run()


@dataclass
class _Walk:
    problem: Path
    expert: KernelState
    rewriter: Any
    mode: GateMode
    policy: GatePolicy
    limits: Limits
    cache: GateCache
    progress: Progress
    transforms: dict[str, Transform]
    forward_ratio: float
    record: bool
    placement: Placement
    runner: Runner | None  # the warm runner of its one-at-a-time gates (klineage.gate.warm); None: cold ones
    code_check: CodeCheck = CodeCheck.NONE
    history: History = field(default_factory=History)
    states: list[State] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    refused_edits: dict[tuple, Rejection] = field(default_factory=dict)  # see SELF_DECIDED
    counted: int = 0
    evaluations: int = 0
    seconds: float = 0.0
    problem_ref: ProblemRef | None = None

    @property
    def timing_policy(self) -> GatePolicy:
        return forward_timing_policy(self.policy, self.placement)

    # the loop

    def run(self) -> Lineage:
        verdict = self.gate(self.expert, "the expert")
        self.problem_ref = ProblemRef(verdict.problem["operator"], verdict.problem["fingerprint"])
        self.states.append(State.of(self.expert, verdict))
        if verdict.status is not Status.passing(self.mode):
            return self.finish(Termination.UNKNOWN, f"the expert does not pass the gate: {verdict.describe()}")
        state, visited = self.expert, {self.expert.fingerprint}
        while True:
            if len(self.transitions) >= self.limits.max_steps:
                return self.finish(Termination.STEP_LIMIT, f"stopped after {self.limits.max_steps} steps; mechanisms "
                                                           f"may remain (a limit does not prove the kernel naive)")
            result = self.step(state, verdict, visited)
            if isinstance(result, Outcome):
                return self.finish(result.kind, result.message)
            state, verdict = result
            visited.add(state.fingerprint)

    def step(self, state: KernelState, verdict: Verdict, visited: set[str]) -> tuple[KernelState, Verdict] | Outcome:
        """Take proposals at `state` until one is accepted or the walk must stop. The rewriter is
        asked again after it runs dry, with the history so far, until it offers nothing new."""
        index = len(self.transitions)
        seen: set[tuple[str, Anchor | None, str]] = set()
        while True:
            fresh = False
            try:
                for item in _guarded(lambda: self.rewriter.propose(state, self.history)):
                    proposal = self.adapt(item)
                    key = (proposal.transform, proposal.anchor,
                           proposal.rewrite.state.fingerprint if proposal.rewrite else proposal.not_applicable_reason)
                    if key in seen:
                        continue
                    seen.add(key)
                    fresh = True
                    if len(seen) > MAX_PROPOSALS_PER_STATE:
                        return Outcome(Termination.UNKNOWN, f"the rewriter made more than {MAX_PROPOSALS_PER_STATE} "
                                                            f"proposals at step {index} without one accepted")
                    result = self.consider(index, state, verdict, proposal, visited)
                    if result is not None:
                        return result
            except _RewriterFailed as failure:
                return Outcome(Termination.UNKNOWN, f"the rewriter failed at step {index}: {failure.error}")
            if not fresh:
                tried = sum(r.step == index for r in self.rejections)
                return Outcome(Termination.COMPLETE,
                               f"no eligible proposal remains after {index} step(s)"
                               + (f"; {tried} proposal(s) at the last state were not taken" if tried else ""))

    def consider(self, index: int, parent: KernelState, parent_verdict: Verdict, proposal: Proposal,
                 visited: set[str]) -> tuple[KernelState, Verdict] | Outcome | None:
        """Gate, audit and (if both pass) accept one proposal. None: rejected, go on."""
        self.progress("walk", f"step {index}: {proposal}")
        if proposal.rewrite is None:
            self.reject(index, parent, proposal, RejectionCategory.NOT_APPLICABLE,
                        evidence=Evidence(message=proposal.not_applicable_reason))
            return None
        rewrite = proposal.rewrite
        child = rewrite.state
        if child.fingerprint == parent.fingerprint or child.fingerprint in visited:
            what = "its parent" if child.fingerprint == parent.fingerprint else "an earlier state of the walk"
            self.reject(index, parent, proposal, RejectionCategory.NO_CHANGE,
                        evidence=Evidence(message=f"the rewrite gives back {what} ({child.fingerprint[:12]})"))
            return None
        edit = (proposal.transform, rewrite.anchor, changed_lines(parent, child))
        if edit in self.refused_edits:
            earlier = self.refused_edits[edit]
            self.reject(index, parent, proposal, RejectionCategory.REPEATED,
                        evidence=Evidence(message=f"the same edit was refused at step {earlier.step} "
                                                  f"({earlier.category.value}); not gated again"))
            return None
        try:
            verdict = self.gate(child, f"step {index} ({proposal})")
        except ReplayMiss:
            raise
        except KLineageError as exc:
            self.reject(index, parent, proposal, RejectionCategory.GATE_ERROR, evidence=Evidence(message=str(exc)))
            return Outcome(Termination.UNKNOWN, f"the gate could not judge step {index} ({proposal}): {exc}")
        if verdict.status is Status.ERROR:
            error = str(verdict.environment.get("error", ""))
            self.reject(index, parent, proposal, RejectionCategory.GATE_ERROR,
                        evidence=Evidence(message="the gate failed, not the kernel", stage="run", log=_excerpt(error)))
            return Outcome(Termination.UNKNOWN, f"the gate could not judge step {index} ({proposal})")
        if verdict.status is not Status.passing(self.mode):
            category = CATEGORY[verdict.reason] if verdict.reason else RejectionCategory.GATE_ERROR
            self.reject(index, parent, proposal, category, verdict.reason, _failed_cases(verdict),
                        _evidence(verdict))
            self.remember_refusal(edit, category)
            if category is RejectionCategory.GATE_ERROR:
                return Outcome(Termination.UNKNOWN, f"the gate could not judge step {index} ({proposal}): "
                                                    f"{verdict.describe()}")
            return self.limit_reached()
        transform = self.transforms.get(proposal.transform)
        checked = audit(parent_verdict, verdict, rewrite, transform, parent=parent)
        if not checked.ok:
            self.reject(index, parent, proposal, RejectionCategory.AUDIT_MISMATCH,
                        evidence=Evidence(message=checked.message, stage="audit", audit=checked.to_dict()))
            self.remember_refusal(edit, RejectionCategory.AUDIT_MISMATCH)
            return self.limit_reached()

        forward = self.forward_check(index, parent, child, proposal, transform)
        self.transitions.append(Transition(
            index=index, transform=proposal.transform, anchor=rewrite.anchor, parent=parent.fingerprint,
            child=child.fingerprint, backward_diff=unified_diff(parent, child, "parent", "child"),
            forward_diff=unified_diff(child, parent, "child", "parent"), features_removed=checked.removed,
            features_added=checked.added, forward=forward, carrier=dict(rewrite.carrier), note=rewrite.note))
        self.states.append(State.of(child, verdict))
        self.history.record(Attempt(index, parent.fingerprint, proposal.transform, rewrite.anchor,
                                    AttemptOutcome.ACCEPTED, evidence=checked.message))
        speed = f", child / parent {forward.timing.overall:.3f}" if forward.timing else ""
        self.progress("walk", f"step {index}: accepted {proposal} (forward {forward.status.value}{speed})")
        return child, verdict

    def remember_refusal(self, edit: tuple, category: RejectionCategory) -> None:
        if category in SELF_DECIDED:
            self.refused_edits.setdefault(edit, self.rejections[-1])

    def limit_reached(self) -> Outcome | None:
        if self.counted >= self.limits.max_rejections:
            return Outcome(Termination.REJECTION_LIMIT, f"{self.counted} rejections reached the limit "
                                                        f"({self.limits.max_rejections})")
        return None

    # the forward step

    def forward_check(self, index: int, parent: KernelState, child: KernelState, proposal: Proposal,
                      transform: Transform | None) -> ForwardCheck:
        name, anchor = proposal.transform, proposal.rewrite.anchor
        if transform is None or not transform.has_forward:
            status, message = ForwardStatus.NO_MECHANICAL_FORWARD, f"{name} has no mechanical forward rewrite"
        else:
            try:
                undone = transform.forward(child, anchor)
            except Exception as exc:  # NotApplicable included: an inverse that cannot undo its own step
                return ForwardCheck(ForwardStatus.FAILED, f"{name}.forward at {anchor} failed: {exc}")
            if undone.state.fingerprint != parent.fingerprint:
                return ForwardCheck(ForwardStatus.FAILED,
                                    f"{name}.forward at {anchor} gives {undone.state.fingerprint[:12]}, not the parent "
                                    f"{parent.fingerprint[:12]}:\n" + unified_diff(parent, undone.state, "parent",
                                                                                   "forward"))
            status, message = ForwardStatus.VERIFIED, f"{name}.forward at {anchor} gives back the parent"
            if self.code_check is CodeCheck.SASS and same_machine_code(parent, child) is CodeIdentity.SAME:
                return ForwardCheck(ForwardStatus.SAME_CODE, message + "; the child runs the parent's machine code "
                                                                       "(the same SASS and resources, launched alike): "
                                                                       "its true ratio is 1, not timed")
        if self.mode is GateMode.COMPILE_ONLY:
            status = ForwardStatus.UNTIMED if status is ForwardStatus.VERIFIED else status
            return ForwardCheck(status, message + "; compile-only walk: not timed")
        try:
            verdict = self.gate(parent, f"forward timing of step {index} ({proposal})", against=child,
                                policy=self.timing_policy, judged_under=self.policy)
        except ReplayMiss:
            raise
        except KLineageError as exc:
            return ForwardCheck(ForwardStatus.FAILED, message + f"; the timing gate could not run: {exc}")
        if verdict.status is not Status.PASSED:
            return ForwardCheck(ForwardStatus.FAILED, message + f"; the timing gate did not pass: {verdict.describe()}")
        if verdict.unsettled:  # unknown: the forward step is neither verified nor slower
            return ForwardCheck(ForwardStatus.FAILED,
                                message + f"; the timing could not be judged: {verdict.describe()}")
        ratio = verdict.profile.get("ratios", {}).get("vs_baseline")
        if not ratio:
            return ForwardCheck(ForwardStatus.FAILED, message + "; the timing gate gave no paired ratio vs the child")
        timing = PairedTiming(float(ratio["overall"]), tuple(float(r) for r in ratio["per_trial"]), self.forward_ratio)
        trials = ", ".join(f"{r:.3f}" for r in timing.per_trial)
        speed = f"child time / parent time {timing.overall:.3f} (trials {trials}), required {timing.required}"
        if not timing.accepted:
            return ForwardCheck(ForwardStatus.SLOWER, message + f"; {speed}", timing)
        return ForwardCheck(status, message + f"; {speed}", timing)

    # bookkeeping

    def gate(self, kernel: KernelState, role: str, against: KernelState | None = None,
             policy: GatePolicy | None = None, judged_under: GatePolicy | None = None) -> Verdict:
        def forward_progress(stage: str, message: str) -> None:
            self.progress(stage, f"{role}: {message}")

        try:
            verdict = run_gate(self.problem, kernel, against=against, policy=policy or self.policy, mode=self.mode,
                               cache=self.cache, progress=forward_progress, judged_under=judged_under,
                               runner=self.runner)
        except ReplayMiss as miss:
            raise ReplayMiss(f"replay walk of '{self.expert.name}' ({self.expert.fingerprint[:12]}): no recorded "
                             f"verdict for {role}, kernel '{kernel.name}' {kernel.fingerprint[:12]}"
                             + (f" against {against.fingerprint[:12]}" if against else "") + f". {miss}") from None
        if self.record and self.mode is GateMode.GPU:
            self.cache.keep(verdict)
        self.evaluations += 1
        self.seconds += sum(float(v) for v in verdict.timings.values())
        return verdict

    def reject(self, index: int, parent: KernelState, proposal: Proposal, category: RejectionCategory,
               reason: Reason | None = None, cases: tuple[str, ...] = (), evidence: Evidence = Evidence()) -> None:
        self.rejections.append(Rejection(index, parent.fingerprint, proposal.transform, proposal.anchor, category,
                                         reason, cases, evidence))
        self.counted += category.counts
        self.history.record(Attempt(index, parent.fingerprint, proposal.transform, proposal.anchor,
                                    AttemptOutcome.REJECTED, category.value, reason.value if reason else "",
                                    " ".join(evidence.message.split())[:300]))
        self.progress("walk", f"step {index}: {category.value} {proposal}")

    def adapt(self, item: Any) -> Proposal:
        """A Proposal as is; another rewriter's answer (transform, anchor, state, failed, reason,
        rationale, as the LLM rewriter gives) becomes one, declaring what its transform removes."""
        if isinstance(item, Proposal):
            return item
        name = str(getattr(item, "transform", "") or getattr(self.rewriter, "name", "rewriter"))
        anchor = getattr(item, "anchor", None)
        anchor = anchor if isinstance(anchor, Anchor) else None
        state = getattr(item, "state", None)
        if getattr(item, "failed", False) or not isinstance(state, KernelState):
            reason = str(getattr(item, "reason", "") or f"the rewriter gave no kernel ({type(item).__name__})")
            return Proposal(name, anchor, not_applicable_reason=reason)
        known = self.transforms.get(name)
        try:
            rewrite = Rewrite(name, Direction.BACKWARD, anchor or Anchor("<file>", "unnamed", name), state,
                              removes=known.removes if known else (), adds=known.adds if known else (),
                              note=str(getattr(item, "rationale", "") or ""))
        except NotApplicable as exc:
            return Proposal(name, anchor, not_applicable_reason=str(exc))
        return Proposal(name, rewrite.anchor, rewrite)

    def finish(self, kind: Termination, message: str) -> Lineage:
        self.progress("walk", f"{kind.value}: {message}")
        policy = {"state": self.policy.to_dict(), "forward_timing": self.timing_policy.to_dict(),
                  "forward_ratio": self.forward_ratio,
                  # kept only where it ran: a walk made before the check reads as none
                  **({"code_check": self.code_check.value} if self.code_check is not CodeCheck.NONE else {})}
        return Lineage(expert=KernelRef(self.expert.name, self.expert.fingerprint), problem=self.problem_ref,
                       rewriter=str(getattr(self.rewriter, "name", type(self.rewriter).__name__)), gate=self.mode,
                       policy=policy, limits=self.limits, states=tuple(self.states),
                       transitions=tuple(self.transitions), rejections=tuple(self.rejections),
                       termination=Outcome(kind, message),
                       stats=Stats(len(self.transitions), len(self.rejections), self.evaluations,
                                   round(self.seconds, 3)))


class _RewriterFailed(Exception):
    def __init__(self, error: Exception):
        self.error = error


def _guarded(propose: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """The rewriter's proposals; a failure of the rewriter itself (a spent budget, an endpoint)
    ends the walk cleanly instead of losing it."""
    try:
        iterator = iter(propose())
    except ReplayMiss:
        raise
    except KLineageError as exc:
        raise _RewriterFailed(exc) from exc
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except ReplayMiss:
            raise
        except KLineageError as exc:
            raise _RewriterFailed(exc) from exc
        yield item


def _failed_cases(verdict: Verdict) -> tuple[str, ...]:
    failed = {f.case for f in verdict.findings if f.case}
    failed |= {r["case"] for r in verdict.correctness
               if r.get("kernel", "candidate") == "candidate" and not r.get("passed", False)}
    return tuple(c for c in verdict.cases if c in failed) + tuple(sorted(failed - set(verdict.cases)))


def _evidence(verdict: Verdict) -> Evidence:
    first = verdict.findings[0]
    worst = {k: first.evidence[k] for k in ("kernel", "seed", "worst_index", "max_abs_err", "rel_l2")
             if k in first.evidence}
    log = first.evidence.get("log", "")
    return Evidence(message=first.message, stage=first.stage, case=first.case,
                    log=_excerpt(log) if isinstance(log, str) else "", worst=worst)


def _excerpt(log: str, lines: int = 24, chars: int = 2400) -> str:
    """The lines of a log that say what went wrong (an error, with the line after it), else its tail."""
    text = log.splitlines()
    keep: list[int] = []
    for i, line in enumerate(text):
        if "error" in line.lower() or "fatal" in line.lower():
            keep += [j for j in (i, i + 1) if j < len(text) and j not in keep]
    picked = [text[i] for i in keep[:lines]] if keep else text[-lines:]
    return "\n".join(picked)[-chars:]
