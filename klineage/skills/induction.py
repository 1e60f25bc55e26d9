"""Induction: lift accepted lineage transitions into skill cards.

Rules (each here, in one place):
- Grouping. Every accepted transition is a forward step (child -> parent). Transitions of all the
  lineages are grouped by (transform, feature delta), the delta being the card's `provides`.
- Loci. Lineage features live at kernel function names, which do not travel between kernels. A
  card names a locus by its role in the state the evidence comes from: `kernel` for a `__global__`
  function (the state shows `global_fn` there), `<file>` for file scope, `device` for any other
  function. Cards from different kernels with the same mechanism at the same role thus group.
- provides = the features the forward step adds: the transition's `features_removed` (what the
  backward step took away), at their roles (SASS changes sit at kernel entries: role `kernel`).
- requires = the features the forward step's anchor function needs, present at that function both
  in the child (before the forward step) and in the parent (after it), that are not provided, and
  that either share a mechanism family with a provided feature (`FAMILIES`: shared staging for
  ldmatrix, vector types for vector loads ...) or are removed by a transform this one depends on
  (transform U with this transform's name in `U.after`: the walk removed U's mechanism only after
  this one, so its forward needs it). For a group: the features every transition requires.
- conflicts = mechanism features (`klineage.walk.audit.MECHANISMS`) that were present at the
  anchor function of a state where a gate-judged proposal of the same transform was refused
  (compile error, incorrect, crash, timeout, resource limit, static check) and at the anchor
  function of no state where a transition of it was accepted, minus provides.
- intent from the catalog (`Transform.intent`); anchor kind, key and snippet, and `vector` (the
  forward diff) from the representative transition: the one with the smallest forward diff (ties:
  lineage id, index). carrier: for each key, the distinct values the group used.
- effects: one per timed transition (forward status verified or slower): the paired ratio child
  time / parent time, overall and per trial, on the timing case (the policy's `timing_case`, else
  the problem's headline). Untimed (compile-only) transitions give none.
- risks: measured failures only: the group's transform's gate-judged rejections, one risk per
  (category, reason), naming the cases that failed and linking every rejection, and from steps timed
  on every case the cases where the step made the kernel slower (by how much) and any case the gate
  refused. diagnostics: the rewriter's non-matches (`not_applicable`, `audit_mismatch`), grouped the
  same way: they say where the transform did not apply, not how the skill fails. `no_change`,
  `gate_error` and `repeated` are neither.
- preconditions (`predicates.separate`), where case parameters are known (`problems`): sound
  cases are those a state reached by the forward step passed; unsound ones those a refused
  proposal of the transform failed (incorrect or crash), and those the parent skipped as outside
  its declared domain while the child judged them (the precondition's source names which of
  "correctness" and "domain" gave labels). No separation: a risk "inconsistent_evidence".
  When the parent declares a `supports` domain the child does not, and no case separates, the
  declared predicate is the precondition (source "declared").
- scope: the lineages' operators, language cuda, the plan's arch as platform (sm_90 -> sm90), the
  dtypes of the problems' cases, and prior_actions: the transforms whose forward steps come before
  this one in any source lineage (higher transition indices).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from klineage.features.feature import Feature
from klineage.features.source import FILE_LOCUS
from klineage.gate.machine_code import CodeIdentity
from klineage.gate.policy import Placement
from klineage.lineage import (
    CaseOutcome,
    FeatureChange,
    FeatureLevel,
    ForwardStatus,
    Lineage,
    Rejection,
    RejectionCategory,
    State,
    Transition,
)
from klineage.problem import ProblemInfo
from klineage.skills.card import (
    DEFAULT_REQUIRED_RATIO,
    CardAnchor,
    CardStatus,
    Effect,
    Precondition,
    Ref,
    RefKind,
    Risk,
    Scope,
    SkillCard,
)
from klineage.skills.facts import case_facts, kernel_facts, launch_facts, layout_facts
from klineage.skills.predicates import Labelled, separate
from klineage.skills.when import SAME_CODE, WhenKind, induce_when, kernel_rows, per_case
from klineage.walk.audit import MECHANISMS
from klineage.walk.timing_audit import PerCaseTiming

KERNEL_ROLE = "kernel"
DEVICE_ROLE = "device"

# Mechanism families: features that work together; a forward step adding one member needs the others
# that are already there at its function to stay.
FAMILIES: dict[str, frozenset[str]] = {
    "shared_staging": frozenset({"shared_array", "dynamic_shared", "xor_swizzle", "ldmatrix", "ldsm", "stsm",
                                 "cp_async", "cp_async_wait", "ldgsts", "tma", "mbarrier", "multistage_pipeline"}),
    "tensor_core": frozenset({"ldmatrix", "ldsm", "mma_sync", "hmma", "wmma", "wgmma", "hgmma", "imma"}),
    "async_copy": frozenset({"cp_async", "cp_async_wait", "ldgsts", "tma", "utmaldg", "utmastg", "mbarrier",
                             "multistage_pipeline"}),
    "vector_access": frozenset({"vector_type_float4", "vector_type_float2", "vector_type_int4", "vector_type_int2",
                                "vector_type_half2", "vector_type_bf162", "ldg_128", "ldg_64", "stg_128", "stg_64"}),
    "read_only": frozenset({"restrict_ptr", "ldg", "ldg_const"}),
    "warp_exchange": frozenset({"shfl"}),
}
REFUSED = frozenset({RejectionCategory.COMPILE_ERROR, RejectionCategory.INCORRECT, RejectionCategory.CRASH,
                     RejectionCategory.TIMEOUT, RejectionCategory.RESOURCE_LIMIT, RejectionCategory.STATIC_CHECK})
UNSOUND = frozenset({RejectionCategory.INCORRECT, RejectionCategory.CRASH})
NOT_RISKS = frozenset({RejectionCategory.NO_CHANGE, RejectionCategory.GATE_ERROR,
                       RejectionCategory.REPEATED})  # a repeat is the earlier rejection's evidence, not new
# The rewriter declined, or applied without the declared removal: nothing was measured to fail. These are
# diagnostics ("did not apply here"), kept apart from the risks.
DIAGNOSTICS = frozenset({RejectionCategory.NOT_APPLICABLE, RejectionCategory.AUDIT_MISMATCH})
SLOWER_RISK = "slower"
PLACEMENT_DOUBT = "placement_doubt"  # a diagnostic: a case timing the pairing moved, not evidence

Cases = Mapping[str, Mapping[str, Any]]  # case name -> parameters
# (lineage, step index) -> the step's ratio and rounds re-timed with places exchanged, or None
Retimed = Callable[[Lineage, int], "tuple[float, tuple[float, ...]] | None"]
# (lineage, step index) -> the step timed on every case (timing_audit.percase_timing), or None
PerCase = Callable[[Lineage, int], "PerCaseTiming | None"]
# (lineage, step index) -> whether its child runs its parent's machine code (walk.step_code.StepCodes.of)
StepCode = Callable[[Lineage, int], CodeIdentity]


def lineage_id(lineage: Lineage) -> str:
    """A lineage's name in refs: expert name, its fingerprint prefix and the gate mode."""
    return f"{lineage.expert.name}@{lineage.expert.fingerprint[:12]}:{lineage.gate.value}"


def locus_role(state: State, locus: str) -> str:
    if locus == FILE_LOCUS:
        return FILE_LOCUS
    rows = state.features.get("source", []) if isinstance(state.features, dict) else []
    if any(r.get("locus") == locus and r.get("name") == "global_fn" for r in rows):
        return KERNEL_ROLE
    return DEVICE_ROLE


def source_names(state: State, locus: str) -> set[str]:
    rows = state.features.get("source", []) if isinstance(state.features, dict) else []
    return {r["name"] for r in rows if r.get("locus") == locus}


def _role_features(state: State, changes: tuple[FeatureChange, ...]) -> frozenset[Feature]:
    """SASS loci are kernel entries (device helpers are inlined): their role is always `kernel`."""
    return frozenset(Feature(KERNEL_ROLE if c.level is FeatureLevel.SASS else locus_role(state, c.locus), c.name)
                     for c in changes)


@dataclass(frozen=True)
class _Step:
    lineage: Lineage
    transition: Transition

    @property
    def ref(self) -> Ref:
        return Ref(lineage_id(self.lineage), RefKind.TRANSITION, self.transition.index)

    @property
    def parent(self) -> State:
        return self.lineage.state(self.transition.parent)

    @property
    def child(self) -> State:
        return self.lineage.state(self.transition.child)

    @property
    def provides(self) -> frozenset[Feature]:
        return _role_features(self.parent, self.transition.features_removed)

    @property
    def function(self) -> str:
        return self.transition.anchor.function


def _dependents(transform: str) -> set[str]:
    """The features removed by the transforms `transform` depends on: every U with `transform` in
    `U.after` (the walk had to remove this mechanism before U's, so this forward step needs U's)."""
    from klineage.transforms import catalog

    names: set[str] = set()
    for other in catalog().values():
        if transform in other.after:
            names |= set(other.removes)
    return names


def _requires(step: _Step) -> frozenset[Feature]:
    provided = {f.name for f in step.provides}
    family = set().union(*(members for members in FAMILIES.values() if members & provided)) if provided else set()
    needed = family | _dependents(step.transition.transform)
    here = source_names(step.child, step.function) & source_names(step.parent, step.function)
    role = locus_role(step.parent, step.function)
    return frozenset(Feature(role, n) for n in sorted(here & needed) if n not in provided)


def _conflicts(transform: str, steps: list[_Step], rejections: list[tuple[Lineage, int, Rejection]],
               provides: frozenset[Feature]) -> frozenset[Feature]:
    accepted: set[Feature] = set()
    for step in steps:
        role = locus_role(step.parent, step.function)
        accepted |= {Feature(role, n) for n in source_names(step.parent, step.function)}
    refused: set[Feature] = set()
    for lineage, _, rejection in rejections:
        if rejection.category not in REFUSED or rejection.anchor is None:
            continue
        state = lineage.state(rejection.parent)
        function = rejection.anchor.function
        role = locus_role(state, function)
        refused |= {Feature(role, n) for n in source_names(state, function) if n in MECHANISMS[FeatureLevel.SOURCE]}
    return frozenset(refused - accepted - provides)


def _risks(rejections: list[tuple[Lineage, int, Rejection]], diagnostics: bool = False) -> list[Risk]:
    """One risk per (category, reason) of the gate-judged rejections; with `diagnostics`, the same of
    the rewriter's non-matches instead."""
    grouped: dict[tuple[str, str], list[tuple[Ref, Rejection]]] = {}
    for lineage, position, rejection in rejections:
        if rejection.category in NOT_RISKS or (rejection.category in DIAGNOSTICS) != diagnostics:
            continue
        key = (rejection.category.value, rejection.reason.value if rejection.reason else "")
        grouped.setdefault(key, []).append((Ref(lineage_id(lineage), RefKind.REJECTION, position), rejection))
    risks = []
    for (category, reason), items in sorted(grouped.items()):
        cases = sorted({c for _, r in items for c in r.cases_failed})
        message = next((" ".join(r.evidence.message.split()) for _, r in items if r.evidence.message), "")
        text = (f"its transform did not apply here ({category}{', ' + reason if reason else ''}) {len(items)} time(s)"
                if diagnostics else
                f"removing it was refused ({category}{', ' + reason if reason else ''}) {len(items)} time(s)")
        if cases:
            text += f"; cases failed: {', '.join(cases)}"
        if message:
            text += f"; first evidence: {message[:240]}"
        risks.append(Risk(category, text, tuple(sorted(ref for ref, _ in items))))
    return risks


def _measured_risks(steps: list[_Step], timed: Mapping[Ref, PerCaseTiming]) -> list[Risk]:
    """Failures the steps timed on every case measured: a case where the forward step made the kernel
    slower than 1 / DEFAULT_REQUIRED_RATIO (by how much, on which case), and a parent the gate refused
    on a case (its finding)."""
    slower: list[tuple[str, float, Ref]] = []
    refused: list[Risk] = []
    for step in steps:
        every = timed.get(step.ref)
        if every is None:
            continue
        operator = step.lineage.problem.operator
        slower += [(f"{operator}:{r.case}", r.ratio, step.ref) for r in every.rows
                   if r.evidence and r.ratio < 1.0 / DEFAULT_REQUIRED_RATIO]
        for finding in every.findings:
            refused.append(Risk(finding.reason.value, f"the forward step's kernel was refused on case "
                                f"{operator}:{finding.case or '?'} when timed on every case ({finding.reason.value}): "
                                f"{' '.join(finding.message.split())[:240]}", (step.ref,)))
    risks = refused
    if slower:
        worst = sorted(slower, key=lambda s: s[1])
        cases = "; ".join(f"{case} {ratio:.3f}x ({1 / ratio - 1:.1%} slower)" for case, ratio, _ in worst[:8])
        risks.append(Risk(SLOWER_RISK, f"made the kernel slower on {len(slower)} case(s), child time / parent "
                                       f"time: {cases}{' ...' if len(worst) > 8 else ''}",
                          tuple(sorted({ref for _, _, ref in slower}))))
    return risks


def _doubted(steps: list[_Step], timed: Mapping[Ref, PerCaseTiming]) -> list[Risk]:
    """A case timing the pairing audit found moved by where the modules loaded (`timing_audit.audit_cases`):
    left out of the card's effects, its risks and its *when*, and said here, one line a step."""
    found = []
    for step in steps:
        every = timed.get(step.ref)
        doubted = [r for r in every.rows if r.doubt] if every is not None else []
        if doubted:
            operator = step.lineage.problem.operator
            found.append(Risk(PLACEMENT_DOUBT, "left out of the effects, timed as loaded on every case: "
                              + "; ".join(f"{operator}:{r.case} {r.ratio:.3f}x ({r.doubt})" for r in doubted),
                              (step.ref,)))
    return found


def _same_code(steps: list[_Step], timed: Mapping[Ref, PerCaseTiming]) -> list[Risk]:
    """The steps whose child runs its parent's machine code, in one line: left out of the effects, with
    what their timings measured (the pairing's noise about a true ratio of 1)."""
    if not steps:
        return []
    ratios = [r.ratio for s in steps for r in (timed[s.ref].rows if s.ref in timed else ()) if r.evidence]
    ratios += [s.transition.forward.timing.overall for s in steps
               if s.ref not in timed and s.transition.forward.timing is not None]
    measured = f"; timed at {min(ratios):.3f}x to {max(ratios):.3f}x on {len(ratios)} case(s)" if ratios else ""
    return [Risk(SAME_CODE, f"left out of the effects: {len(steps)} step(s) whose child runs its parent's machine code "
                            f"(the same SASS and resources, launched alike), so nvcc had already done what the "
                            f"forward spells out and their true ratio is 1{measured}",
                 tuple(sorted(s.ref for s in steps)))]


def _case_table(problems: Mapping[str, Any] | None, operator: str) -> dict[str, dict[str, Any]] | None:
    if not problems or operator not in problems:
        return None
    known = problems[operator]
    if isinstance(known, ProblemInfo):
        return {c.name: dict(c.params) for c in known.cases + known.sweep}
    return {name: dict(params) for name, params in known.items()}


def _headline(problems: Mapping[str, Any] | None, operator: str) -> str:
    known = (problems or {}).get(operator)
    return known.headline if isinstance(known, ProblemInfo) else "headline"


def _labels(steps: list[_Step], rejections: list[tuple[Lineage, int, Rejection]],
            problems: Mapping[str, Any] | None) -> tuple[list[Labelled], str]:
    """Per-case labels with parameters, and the source of the labels."""
    rows: list[Labelled] = []
    sources: set[str] = set()
    for step in steps:
        table = _case_table(problems, step.lineage.problem.operator)
        if table is None:
            continue
        parent = {c.case: c.outcome for c in step.parent.verdict.cases}
        child = {c.case: c.outcome for c in step.child.verdict.cases}
        for case, outcome in parent.items():
            if case not in table:
                continue
            if outcome is CaseOutcome.PASSED:
                rows.append(Labelled(case, table[case], True))
                sources.add("correctness")
            elif outcome is CaseOutcome.SKIPPED and child.get(case) not in (None, CaseOutcome.SKIPPED):
                rows.append(Labelled(case, table[case], False))
                sources.add("domain")
    for lineage, _, rejection in rejections:
        table = _case_table(problems, lineage.problem.operator)
        if table is None or rejection.category not in UNSOUND:
            continue
        failed = [Labelled(c, table[c], False) for c in rejection.cases_failed if c in table]
        rows.extend(failed)
        sources |= {"correctness"} if failed else set()
    return rows, "+".join(sorted(sources)) or "correctness"


def _declared(steps: list[_Step]) -> Precondition | None:
    for step in steps:
        parent, child = step.parent.plan, step.child.plan
        supports = parent.get("supports", "")
        if supports and supports != child.get("supports", ""):
            reason = parent.get("supports_reason", "") or f"the expert declares it supports only {supports}"
            return Precondition(supports, reason, source="declared")
    return None


def _platform(steps: list[_Step]) -> str:
    arches = sorted({str(s.parent.plan.get("arch", "sm_90")) for s in steps})
    return ",".join(a.replace("_", "") for a in arches)


def _dtypes(steps: list[_Step], problems: Mapping[str, Any] | None) -> set[str]:
    out: set[str] = set()
    for step in steps:
        operator = step.lineage.problem.operator
        known = (problems or {}).get(operator)
        if isinstance(known, ProblemInfo):
            out |= {o.dtype for o in known.outputs if o.dtype in ("float64", "float32", "float16", "bfloat16",
                                                                   "int64", "int32", "int16", "int8", "uint8", "bool")}
        for params in (_case_table(problems, operator) or {}).values():
            out |= {v for k, v in params.items() if k.endswith("dtype") and isinstance(v, str)}
    return out


def _carrier(steps: list[_Step]) -> dict[str, list[Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for step in steps:
        for key, value in step.transition.carrier.items():
            merged.setdefault(key, {})[json.dumps(value, sort_keys=True)] = value
    return {key: [values[k] for k in sorted(values)] for key, values in sorted(merged.items())}


def _intent(transform: str, steps: list[_Step]) -> str:
    from klineage.transforms import catalog

    known = catalog().get(transform)
    if known is not None:
        return known.intent
    note = next((s.transition.note for s in steps if s.transition.note.strip()), "")
    return note.strip().splitlines()[0] if note.strip() else f"Put back the mechanism the '{transform}' step removed."


def _effects(steps: list[_Step], problems: Mapping[str, Any] | None, retimed: Retimed | None,
             timed: Mapping[Ref, PerCaseTiming]) -> list[Effect]:
    effects = []
    for step in steps:
        forward = step.transition.forward
        if forward.timing is None or forward.status not in (ForwardStatus.VERIFIED, ForwardStatus.SLOWER):
            continue
        operator = step.lineage.problem.operator
        every = timed.get(step.ref)
        if every is not None:  # one effect a case the step was timed on
            effects += [Effect(r.case, operator, r.ratio, r.per_trial, step.ref, every.placement)
                        for r in every.rows if r.evidence]
            continue
        timing_case = str(step.lineage.policy.get("forward_timing", {}).get("timing_case", "") or "")
        case = timing_case or _headline(problems, operator)
        again = retimed(step.lineage, step.transition.index) if retimed else None
        effects.append(Effect(case, operator, *again, step.ref, Placement.EXCHANGED) if again else
                       Effect(case, operator, forward.timing.overall, forward.timing.per_trial, step.ref))
    return effects


def _when(steps: list[_Step], effects: list[Effect], problems: Mapping[str, Any] | None,
          timed: Mapping[Ref, PerCaseTiming]) -> Precondition | None:
    """The timing precondition the card's per-case effects force (klineage.skills.when), if any. Each
    effect's case is valued by its parameters, by what its step's parent kernel's launch plan makes of
    them and by what ptxas said of that kernel where the step was timed on every case."""
    by_ref = {s.ref: s for s in steps}
    if not any(ref in timed for ref in by_ref):  # headline timings alone: one case an operator, nothing varies
        return None
    # A parameter's name means something only inside its own problem (conv2d's N is a batch, GEMM's N a
    # width): across operators, cases are compared by what the launch and ptxas make of them alone.
    across = len({e.operator for e in effects if e.source in by_ref}) > 1
    # Launch and ptxas facts belong to a kernel: where an operator's case was timed on several kernels'
    # steps, each kernel's measurement of it is its own row, so that none loses the facts they differ in.
    rows = []
    for key, effect in kernel_rows([e for e in effects if e.source in by_ref]):
        table = _case_table(problems, effect.operator)
        step = by_ref[effect.source]
        if table is None or effect.case not in table:
            continue
        params = table[effect.case]
        compiled = timed[effect.source].compiled if effect.source in timed else None
        known = problems.get(effect.operator) if problems else None
        roofline = known.roofline.get(effect.case) if isinstance(known, ProblemInfo) else None
        layout = layout_facts(known.outputs, params) if isinstance(known, ProblemInfo) else None
        rows.append((key, effect.ratio, case_facts({} if across else params, launch_facts(step.parent.kernel, params),
                                                   compiled, roofline, layout, kernel_facts(step.child.features))))
    when = induce_when(per_case(rows))
    if when.kind is not WhenKind.PRECONDITION:
        return None
    found = when.precondition
    names = sorted(found.names)
    # a text equality a case lacks is false there; a number it lacks stays unknown (the predicate failed there)
    values = {row.case: {n: row.facts.get(n, False) for n in names if n in row.facts or "_is_" in n}
              for row in when.cases}
    return replace(found, facts=values)


def _prior(steps: list[_Step]) -> set[str]:
    prior: set[str] = set()
    for step in steps:
        prior |= {t.transform for t in step.lineage.transitions if t.index > step.transition.index}
    return prior


def induce(lineages: list[Lineage], problems: Mapping[str, Any] | None = None,
           retimed: Retimed | None = None, percase: PerCase | None = None,
           step_code: StepCode | None = None) -> list[SkillCard]:
    """Cards from the accepted transitions of `lineages`, sorted by transform then id.

    `problems` maps an operator to its `ProblemInfo` (or to a table case name -> parameters); it
    supplies the case parameters that preconditions are searched over and the dtypes of the scope.
    Without it, cards carry no searched preconditions. `retimed` gives a step's ratio and rounds
    re-timed with parent and child exchanging places, if it was (`timing_audit.retimed_effect`):
    that measurement, which placement cannot move, is the effect rather than the walk's own. `percase`
    gives a step timed on every case (`timing_audit.percase_timing`): one effect a case, from which
    the card's timing precondition is induced (klineage.skills.when). `step_code` says which steps ran
    their parent's machine code (klineage.walk.step_code; a walk with the code check marks them `same_code`
    itself): their true ratio is 1, so their timings are left out of the card's effects, its *when* and its
    measured risks, and said in its diagnostics."""
    groups: dict[tuple[str, frozenset[Feature]], list[_Step]] = {}
    for lineage in lineages:
        for transition in lineage.transitions:
            step = _Step(lineage, transition)
            groups.setdefault((transition.transform, step.provides), []).append(step)
    refused: dict[str, list[tuple[Lineage, int, Rejection]]] = {}
    for lineage in lineages:
        for position, rejection in enumerate(lineage.rejections):
            refused.setdefault(rejection.transform, []).append((lineage, position, rejection))

    timed = {}
    for steps in groups.values():
        for step in steps:
            every = percase(step.lineage, step.transition.index) if percase else None
            if every is not None:
                timed[step.ref] = every
    cards = []
    for (transform, provides), steps in groups.items():
        steps.sort(key=lambda s: (lineage_id(s.lineage), s.transition.index))
        rejections = refused.get(transform, [])
        representative = min(steps, key=lambda s: (len(s.transition.forward_diff), lineage_id(s.lineage),
                                                   s.transition.index))
        anchor = representative.transition.anchor
        requires = frozenset.intersection(*(_requires(s) for s in steps))
        same = [s.transition.forward.status is ForwardStatus.SAME_CODE
                or (step_code is not None and step_code(s.lineage, s.transition.index) is CodeIdentity.SAME)
                for s in steps]
        unchanged = [s for s, alike in zip(steps, same) if alike]
        changed = [s for s, alike in zip(steps, same) if not alike]
        risks = _risks(rejections) + _measured_risks(changed, timed)
        preconditions: list[Precondition] = []
        rows, source = _labels(steps, rejections, problems)
        if rows:
            found = separate(rows)
            if found.found:
                preconditions.append(Precondition(found.expression, found.sentence, found.holds, found.fails, source))
            elif found.inconsistent:
                risks.append(Risk("inconsistent_evidence", f"no precondition: {found.sentence}",
                                  tuple(sorted({s.ref for s in steps} | {r.evidence[0] for r in risks if r.evidence}))))
        if not preconditions:
            declared = _declared(steps)
            if declared is not None:
                preconditions.append(declared)
        effects = _effects(changed, problems, retimed, timed)
        paying = _when(changed, effects, problems, timed)
        if paying is not None:
            preconditions.append(paying)
        scope = Scope(operators=tuple(sorted({s.lineage.problem.operator for s in steps})), language="cuda",
                      platform=_platform(steps), dtypes=tuple(sorted(_dtypes(steps, problems))),
                      prior_actions=tuple(sorted(_prior(steps))))
        cards.append(SkillCard(
            transform=transform, intent=_intent(transform, steps),
            anchor=CardAnchor(anchor.kind, anchor.snippet, anchor.function, anchor.key),
            vector=representative.transition.forward_diff, scope=scope, carrier=_carrier(steps),
            preconditions=tuple(preconditions), effects=tuple(effects), risks=tuple(risks),
            diagnostics=tuple(_risks(rejections, diagnostics=True) + _doubted(changed, timed)
                              + _same_code(unchanged, timed)),
            requires=requires, provides=provides,
            conflicts=_conflicts(transform, steps, rejections, provides) - requires,
            evidence=tuple(s.ref for s in steps), status=CardStatus.CANDIDATE))
    return sorted(cards, key=lambda c: (c.transform, c.id))
