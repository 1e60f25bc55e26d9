"""Admission: a card becomes `admitted` only after a held-out roundtrip.

Targets (`held_out_targets`) are held out from what the card was learnt on. First kernel states
outside the card's source lineages: the states of other lineages (other experts' walks) and
bundled kernels (naive ones included), never a state of a source lineage nor of another walk of
the same expert. Where those are fewer than asked, held-out cases: the child of one of the card's
source transitions (where its forward applies) timed on a case of that problem none of the
card's effects was measured on (the largest such case the kernel supports: its regime is nearest
the headline's), so the card must show its effect on a shape it never saw. A target qualifies
where the card's `requires` hold, none of its `conflicts` is present and its transform finds a
forward site; with the code check (`klineage library admit` runs it unless told `--code-check none`),
also where the kernel the card makes of it is not the target's own machine code. Without it the
unroll card's six GPU trials of the per-case library all timed kernels nvcc had already unrolled
(1.000x to 1.004x): they measured the compiler, not the card.

A trial (`admit`) applies the card at every site of a target (`materialize.apply_everywhere`),
gates the result against the target (`gate(problem_path, kernel, against, case)`, passed in so
tests and dry runs use the compile-only gate; `case` is the target's held-out case or ""), and
compares the paired ratio (target time / new time, > 1 faster, as the card's effects are) with
what the card declares: `admission_rule.required_ratio` says how much it must reach.
A card with a timing precondition is tried on a target's case where the precondition holds: the
target problem's headline where it holds there, else its largest case where it does (`fair_case`); a
target with no such case is no target for it.
Outcomes:
- PASSED: a timed passing verdict reaching `required` by more than the gate's run-to-run spread
  (`admission_rule.timed_outcome`);
- FAILED: the gate rejected the kernel, or it passed slower than `required`;
- INCONCLUSIVE: a timed passing verdict reaching `required` by less than that spread (neither reproduced
  nor refuted), and anything that is no timed judgement: a compile-only verdict, a gate error or
  miss, a passing verdict without a paired ratio, a card that declares no measured effect (a dry
  lineage's: nothing to reproduce; decided before any gate runs), a precondition failing on one of
  the target problem's cases (not a fair trial), no site applying. Unknown fails: an inconclusive trial never admits.
Every trial is recorded on the card's `verification_log` as a `card.Trial` (state: the target's
fingerprint; passed: outcome PASSED; message: starts with the outcome's value, `trial_outcome`
reads it back; basis: what else the outcome rests on, `trial_basis`, when `admit` is told the
gate's `GateSetting`). The status the trials give the card is `admission_rule.status_after`'s.
`klineage.skills.admission_run` admits a whole library card by card.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from klineage import devices
from klineage.config import GateMode
from klineage.documents import nonblank
from klineage.errors import DocumentError, KLineageError
from klineage.features.feature import Feature
from klineage.gate.execute import problem_fingerprint
from klineage.gate.machine_code import CodeCheck, CodeIdentity, same_machine_code
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import Status, Verdict
from klineage.kernel import KernelState
from klineage.lineage import Lineage
from klineage.problem import ProblemInfo
from klineage.skills.admission_rule import (
    card_digest,
    required_ratio,
    status_after,
    timed_outcome,
    when_allows,
    within_spread,
)
from klineage.skills.card import RefKind, SkillCard, Trial, TrialBasis
from klineage.skills.induction import lineage_id
from klineage.skills.library import Library
from klineage.skills.materialize import Applied, apply_everywhere
from klineage.skills.replay import replay_diff
from klineage.skills.retrieval import precondition_failure, size_of, state_features, timing_failure
from klineage.skills.trial_reading import Reading, TrialOutcome, reading
from klineage.skills.when import timing_precondition, unpaid_when
from klineage.transforms.base import Anchor

DEFAULT_LIMIT = 3  # targets gated per admission

# gate(problem path, kernel, against, timed case: "" for the headline) -> verdict
Gate = Callable[[str | Path, KernelState, KernelState | None, str], Verdict]


@dataclass(frozen=True)
class Target:
    """A held-out kernel state: its name (a bundled kernel's, or `<lineage id>@<step>`), its problem,
    the case a trial times (empty: the problem's headline; else a held-out case) and, for a state of
    a source lineage, the anchor of the card's transition there (a site no finder may place afresh)
    and its recorded forward diff (replayed where the card's transform has no mechanical forward)."""

    name: str
    problem: str
    state: KernelState
    case: str = ""
    anchors: tuple[Anchor, ...] = ()  # sites to apply the card at besides those its transform finds
    forward_diff: str = ""

    def __post_init__(self) -> None:
        for key in ("name", "problem"):
            nonblank(getattr(self, key), f"target.{key}")
        if not isinstance(self.state, KernelState):
            raise DocumentError("target.state", f"must be a KernelState, not {self.state!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "problem": self.problem, "fingerprint": self.state.fingerprint,
                **({"case": self.case} if self.case else {})}


@dataclass(frozen=True)
class GateSetting:
    """The gate a run of trials is judged by: its mode, the GPU it runs on ("none" when nothing
    runs) and its policy."""

    mode: GateMode
    gpu: str
    policy: GatePolicy

    def __post_init__(self) -> None:
        nonblank(self.gpu, "setting.gpu")


def carry_trials(rebuilt: Library, earlier: Library) -> tuple[Library, int, int]:
    """`rebuilt` with each card's trials in `earlier` joined to its log: those it lacks appended in
    `earlier`'s order. A trial stays evidence of the mechanism on its target whatever the card then
    declared (its basis names the content it judged). Where `earlier` holds the card's very content
    (same id and `card_digest`) and adds trials, its status comes too: a trial of that content
    decided it; so it does where `judged_alike` (only the measured effects changed, asking a trial
    for the same ratio). Joined from several libraries in turn (lanes that trialled different cards
    of one library), each card gathers every lane's trials and the status of the lane that added
    some. Any other changed card keeps its earlier trials as history and stays a candidate. Also
    how many cards kept their status and how many only their history."""
    known = {card.id: card for card in earlier.cards}
    cards, carried, history = [], 0, 0
    for card in rebuilt.cards:
        old = known.get(card.id)
        added = _missing(old.verification_log, card.verification_log) if old is not None else ()
        if added:
            same = card_digest(old) == card_digest(card) or judged_alike(old, card)
            card = dataclasses.replace(card, verification_log=card.verification_log + added,
                                       status=when_allows(card, old.status) if same else card.status)
            carried, history = carried + same, history + (not same)
        cards.append(card)
    provenance = dict(rebuilt.provenance)
    if (carried or history) and "admission" in earlier.provenance:
        how = _CARRIED.sub("", earlier.provenance["admission"])  # what a rebuild before this one carried is recounted
        provenance["admission"] = (f"{how}; trials of {carried} card(s) judged by the "
                                   f"same rule carried over to this build"
                                   + (f", and of {history} changed one(s) as history" if history else ""))
    return dataclasses.replace(rebuilt, cards=tuple(cards), provenance=provenance), carried, history


_CARRIED = re.compile(r"; trials of \d+ card\(s\) judged by the same rule carried over to this build"
                      r"(, and of \d+ changed one\(s\) as history)?")


def judged_alike(earlier: SkillCard, card: SkillCard) -> bool:
    """Whether a trial of `earlier` judged `card` by the same rule: they differ in their measured
    effects, risks and diagnostics alone (re-timed, say, timed on every case, or non-matches moved off
    the risks), and every timed trial in `earlier`'s log reads the same against the ratio each asks
    (`required_ratio`): the same ratio, or one that no recorded trial ratio lies between (a GEMM
    card's cases lowering its ask from 3.4x to 2.8x, with every trial at 5x or more). So the same
    target, kernel and gate give the same outcome. Its trials still name the earlier content: the
    next admission trials the card as it is."""
    def rest(c: SkillCard) -> dict:
        # risks and diagnostics describe the card; no trial reads them (materialize applies the transform)
        return {k: v for k, v in c.to_dict().items()
                if k not in ("verification_log", "status", "effects", "risks", "diagnostics")}
    if rest(earlier) != rest(card):
        return False
    before, now = required_ratio(earlier), required_ratio(card)
    if before == now:
        return True
    if before is None or now is None:
        return False
    timed = [t.ratio for t in earlier.verification_log if t.ratio is not None and reading(t) is not Reading.REJECTED]
    return all(timed_outcome(ratio, before) is timed_outcome(ratio, now) for ratio in timed)


def _missing(theirs: Sequence[Trial], mine: Sequence[Trial]) -> tuple[Trial, ...]:
    """`theirs` less `mine`, counting repeats (a trial logged twice is two trials), in their order."""
    left, missing = list(mine), []
    for trial in theirs:
        if trial in left:
            left.remove(trial)
        else:
            missing.append(trial)
    return tuple(missing)


def trial_basis(card: SkillCard, target: Target, applied: Applied | None, setting: GateSetting,
                problem_for: Callable[[str], str | Path]) -> TrialBasis:
    """The basis of a trial of the card on the target (`applied`: the card applied there, or None)."""
    return TrialBasis(setting.mode.value, setting.gpu, trial_policy(setting.policy, target.case).fingerprint,
                      problem_fingerprint(Path(problem_for(target.problem))), card_digest(card),
                      applied.state.fingerprint if applied else "")


def trial_policy(policy: GatePolicy, case: str) -> GatePolicy:
    """The gate policy of a trial timed on `case` (a target's held-out case; "" for the headline)."""
    return policy.with_(timing_case=case) if case else policy


@functools.lru_cache(maxsize=1024)
def _features(state: KernelState) -> frozenset[Feature]:
    """Every card of a library asks after the same states: parse each once (features are a pure
    function of the source; uncached, a 26-card library spent a minute here on the GPU host)."""
    return state_features(state)


def applied_to(card: SkillCard, target: Target) -> Applied | None:
    """The card applied at every site of the target (its transform's and the target's anchors);
    where none applies, the target's recorded forward diff replayed (a pipeline has no mechanical
    forward, and without this no held-out trial could ever admit it)."""
    applied = apply_everywhere(card, target.state, target.anchors)
    if applied is None and target.forward_diff and target.anchors:
        replayed = replay_diff(target.state, target.forward_diff)
        if replayed is not None:
            return Applied(card.id, replayed, target.anchors[:1], ("replayed the recorded forward diff",))
    return applied


def fair_case(card: SkillCard, target: Target, info: ProblemInfo | None) -> Target | None:
    """The target timed on a case where the card's timing precondition holds: as it is where the
    precondition holds on its case (or the card has none, or the problem is not known here), else on the
    largest case of its problem the kernel supports where it holds; None where it holds on none."""
    if info is None or timing_precondition(card) is None:
        return target
    if timing_failure(card, info, target.state, target.case) is None:
        return target
    facts = {**target.state.constants, **devices.DEFAULT.facts()}
    fair = [c for c in info.cases if target.state.plan.supports_case(c.params, facts)
            and timing_failure(card, info, target.state, c.name) is None]
    if not fair:
        return None
    case = max(fair, key=lambda c: (size_of(info, c.name) or 0.0, c.name)).name
    return dataclasses.replace(target, name=f"{target.name} on case {case} (where the card says it pays)", case=case)


def _qualifies(card: SkillCard, target: Target, code_check: CodeCheck = CodeCheck.NONE) -> bool:
    present = _features(target.state)
    if not card.requires <= present or card.conflicts & present:
        return False
    applied = applied_to(card, target)
    if applied is None:
        return False
    # a kernel that runs the target's own machine code (nvcc had already unrolled, already loaded read-only) times
    # at 1 whatever the card is worth: a trial there measures nothing of it
    return code_check is CodeCheck.NONE or same_machine_code(target.state, applied.state) is not CodeIdentity.SAME


def held_out_targets(card: SkillCard, lineages: Sequence[Lineage], corpus_states: Mapping[str, KernelState],
                     limit: int | None = None, problems: Mapping[str, ProblemInfo] | None = None,
                     code_check: CodeCheck = CodeCheck.NONE) -> list[Target]:
    """Qualifying states outside the card's source lineages: bundled kernels first (by name), then
    the other lineages' states, simplest first; each fingerprint once; then, when `problems`
    (operator -> ProblemInfo) is given, held-out cases of the card's source transitions; the first
    `limit` of them when given (a trial uses no more, and checking that a state qualifies costs a
    materialization). With `code_check` SASS a state where the card's kernel runs the state's own machine
    code (klineage.gate.machine_code) does not qualify: it costs two compiles a state checked."""
    sources = {ref.lineage for ref in card.evidence}
    source_lineages = [lin for lin in lineages if lineage_id(lin) in sources]
    experts = {lin.expert.fingerprint for lin in source_lineages}
    seen = {state.fingerprint for lin in source_lineages for state in lin.states}
    candidates = [Target(name, state.plan.problem, state) for name, state in sorted(corpus_states.items())]
    for lineage in sorted(lineages, key=lineage_id):
        if lineage_id(lineage) in sources or lineage.expert.fingerprint in experts:
            continue
        for step, state in reversed(list(enumerate(lineage.states))):
            candidates.append(Target(f"{lineage_id(lineage)}@{step}", lineage.problem.operator, state.kernel))
    targets = []
    for target in candidates:
        if target.state.fingerprint in seen:
            continue
        seen.add(target.state.fingerprint)
        if problems:
            target = fair_case(card, target, problems.get(target.problem))
        if target is not None and _qualifies(card, target, code_check):
            targets.append(target)
            if len(targets) == limit:
                return targets
    for target in _held_out_cases(card, source_lineages, problems or {}):
        if _qualifies(card, target, code_check):
            targets.append(target)
            if len(targets) == limit:
                break
    return targets


def _held_out_cases(card: SkillCard, source_lineages: Sequence[Lineage],
                    problems: Mapping[str, ProblemInfo]) -> list[Target]:
    """The children of the card's source transitions, each on the largest case of its problem that
    none of the card's effects was measured on and that the kernel supports. Where every such case
    was measured (the step was timed per case), the largest measured case where the card says it pays
    (its timing precondition holds; any case of a card without one), named a replication: a fresh
    measurement of an effect the card claims, since no case is left that it has not seen."""
    measured = {(e.operator, e.case) for e in card.effects}
    timing = timing_precondition(card)
    by_id = {lineage_id(lin): lin for lin in source_lineages}
    targets, seen = [], set()
    for ref in sorted(card.evidence):
        lineage = by_id.get(ref.lineage)
        info = problems.get(lineage.problem.operator) if lineage is not None else None
        if info is None or ref.kind is not RefKind.TRANSITION or ref.index + 1 >= len(lineage.states):
            continue
        child = lineage.states[ref.index + 1].kernel
        if child.fingerprint in seen:
            continue
        facts = {**child.constants, **devices.DEFAULT.facts()}
        supported = [c for c in info.cases if c.name != info.headline and child.plan.supports_case(c.params, facts)
                     and size_of(info, c.name)]
        held = [c for c in supported if (info.operator, c.name) not in measured]
        label = ""
        if not held:
            held = [c for c in supported if timing is None or timing.holds_on(f"{info.operator}:{c.name}")]
            label = " (measured per case already: a replication)"
        if not held:
            continue
        seen.add(child.fingerprint)
        case = max(held, key=lambda c: (size_of(info, c.name), c.name)).name
        step = lineage.transitions[ref.index]
        targets.append(Target(f"{ref.lineage}@{ref.index + 1} on case {case}{label}", info.operator, child, case,
                              (step.anchor,), step.forward_diff))
    return targets


# A trial's measurement: the target, the GPU, the gate policy (with the case timed), the problem file and the
# kernel the card made of the target. Not the card: two cards that make one kernel of one target are timed alike.
MeasurementKey = tuple[str, str, str, str, str]


def measurement_key(trial: Trial) -> MeasurementKey | None:
    """What `trial` measured, where it measured something a later trial may read instead of timing again: a
    paired ratio, or a rejection, judged on a GPU (live or replayed from recorded verdicts); else None."""
    if trial.ratio is None and reading(trial) is not Reading.REJECTED:
        return None
    return measured_as(trial.state, trial.basis)


def measured_as(state: str, basis: TrialBasis | None) -> MeasurementKey | None:
    """What a trial of `state` on `basis` measures (None: nothing on a GPU, or no kernel made)."""
    if basis is None or basis.gpu == "none" or not basis.candidate:
        return None
    return (state, basis.gpu, basis.policy, basis.problem, basis.candidate)


def measurements(libraries: Iterable[Library]) -> dict[MeasurementKey, Trial]:
    """Every trial's measurement in `libraries`, the later one where two measured the same (a re-run)."""
    return {key: trial for library in libraries for card in library.cards for trial in card.verification_log
            for key in [measurement_key(trial)] if key is not None}


def _trial(card: SkillCard, target: Target, problem_for: Callable[[str], str | Path], gate: Gate,
           problems: Mapping[str, ProblemInfo] | None, setting: GateSetting | None,
           measured: Mapping[MeasurementKey, Trial] | None = None) -> Trial:
    applied = applied_to(card, target)
    basis = trial_basis(card, target, applied, setting, problem_for) if setting else None

    def record(outcome: TrialOutcome, message: str, ratio: float | None = None) -> Trial:
        return Trial(target.state.fingerprint, outcome is TrialOutcome.PASSED, ratio,
                     f"{outcome.value}: {target.name}: {message}", basis)

    info = (problems or {}).get(target.problem)
    if info is not None:
        why = precondition_failure(card, info, target.state, target.case)
        if why:
            return record(TrialOutcome.INCONCLUSIVE, f"not a fair trial: {why}")
    if required_ratio(card) is None:  # checked before the gate: a trial that cannot admit costs no GPU time
        return record(TrialOutcome.INCONCLUSIVE, "the card declares no measured effect to reproduce")
    unpaid = unpaid_when(card)
    if unpaid is not None:  # likewise: its per-case effects keep it out whatever the trial shows
        return record(TrialOutcome.INCONCLUSIVE, f"its per-case effects do not say where it pays: {unpaid.sentence}")
    if applied is None:
        return record(TrialOutcome.INCONCLUSIVE, "no forward site applies")
    where = f"{len(applied.anchors)} site(s) -> {applied.state.fingerprint[:12]}"
    earlier = (measured or {}).get(measured_as(target.state.fingerprint, basis))
    if earlier is not None:  # this very kernel, target, case, policy and GPU were timed for another card's trial
        said = f"; measured by an earlier trial of this kernel on this target, case, policy and GPU ({earlier.message})"
        if earlier.ratio is None:
            return record(TrialOutcome.FAILED, f"{where}; rejected{said}")
        return _judged(card, earlier.ratio, where, record, said)
    try:
        verdict = gate(problem_for(target.problem), applied.state, target.state, target.case)
    except KLineageError as exc:
        return record(TrialOutcome.INCONCLUSIVE, f"{where}; the gate could not judge it: {exc}")
    if verdict.status is Status.REJECTED:
        finding = verdict.findings[0]
        return record(TrialOutcome.FAILED, f"{where}; rejected ({finding.reason.value}): "
                                           f"{' '.join(finding.message.split())[:240]}")
    if verdict.status is not Status.PASSED:
        return record(TrialOutcome.INCONCLUSIVE, f"{where}; {verdict.status.value} verdict: nothing ran or was "
                                                 f"timed, so nothing is reproduced")
    if verdict.unsettled:
        return record(TrialOutcome.INCONCLUSIVE, f"{where}; {verdict.describe(240)}: nothing is reproduced or refuted")
    ratio = verdict.profile.get("ratios", {}).get("vs_baseline")
    if not ratio or not ratio.get("overall"):
        return record(TrialOutcome.INCONCLUSIVE, f"{where}; passed, but no paired ratio against the target")
    return _judged(card, float(ratio["overall"]), where, record)


def _judged(card: SkillCard, ratio: float, where: str, record: Callable[..., Trial], said: str = "") -> Trial:
    """A timed trial's reading of its paired `ratio` against what the card requires (`said`: where the
    ratio was measured, when not by this trial's own gate call)."""
    required = required_ratio(card)
    outcome = timed_outcome(ratio, required)
    if outcome is TrialOutcome.FAILED:
        return record(outcome, f"{where}; passed at {ratio:.3f}x, below the {required:.3f}x the "
                               f"card's effects require{said}", ratio)
    if outcome is TrialOutcome.INCONCLUSIVE:
        return record(outcome, f"{where}; {within_spread(ratio, required)}{said}", ratio)
    return record(outcome, f"{where}; {ratio:.3f}x (required {required:.3f}x){said}", ratio)


def admit(card: SkillCard, targets: Sequence[Target], problem_for: Callable[[str], str | Path], gate: Gate, *,
          problems: Mapping[str, ProblemInfo] | None = None, limit: int = DEFAULT_LIMIT,
          setting: GateSetting | None = None,
          measured: Mapping[MeasurementKey, Trial] | None = None) -> tuple[SkillCard, list[Trial]]:
    """Trial the card on at most `limit` targets; the card with every trial logged and its new
    status, and the trials. `problem_for` maps a problem name to its file; `problems` (operator ->
    ProblemInfo) lets a trial check the card's preconditions on the target problem's cases;
    `setting` names the gate behind `gate`, so that each trial records its basis (without it, a
    trial's evidence is unknown and a resumed admission trials the card again); `measured` (`measurements`)
    holds earlier trials whose measurement a trial reads, judged against this card's required ratio, instead
    of timing the same kernel on the same target again (a card renamed by a new walk keeps its evidence)."""
    if limit < 1:
        raise KLineageError(f"admission needs at least one trial, not limit={limit}")
    trials = [_trial(card, target, problem_for, gate, problems, setting, measured) for target in list(targets)[:limit]]
    updated = dataclasses.replace(card, verification_log=card.verification_log + tuple(trials),
                                  status=status_after(card, trials))
    return updated, trials
