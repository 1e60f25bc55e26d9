"""The skill card: one conditional procedural skill lifted from accepted lineage transitions.

A card says what a forward step does (`intent`, `anchor`, `vector`, `carrier`), when it is sound
(`preconditions`, each a predicate in `klineage.expr` syntax over case facts with a sentence and
its evidence counts), what it buys (`effects`: measured paired speed ratios per source case), how
it fails (`risks`, from rejected proposals), where it was seen (`scope`) and how it composes
(`requires` / `provides` / `conflicts`: sets of `{locus, name}` features; a card applies where its
requires are present, its provides absent and none of its conflicts present).

Identity: `id` is the sha256 of the canonical JSON of the transform, the feature delta (`provides`)
and the scope minus `prior_actions` (context that grows with every new lineage). Everything else
(effects, risks, evidence, status) may grow without changing who the card is. `short_id` is the
12-character prefix used for display and folder names.

Cards are frozen and validate themselves: a wrong status, an empty intent, a predicate that
`klineage.expr` refuses, or an id that does not match the content raise `DocumentError` naming the
field. `to_dict`/`from_dict` are versioned (`CARD_VERSION`) and refuse unknown keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from klineage import codec, expr
from klineage.documents import enum, listed, need, nonblank, number, text, whole
from klineage.errors import DocumentError, ExpressionError
from klineage.features.feature import Feature
from klineage.fingerprint import document_text, parse_document
from klineage.gate.policy import Placement

CARD_VERSION = 1
SHORT_ID = 12
# The paired ratio a step must reach to count as faster: the optimize loop takes a candidate only at
# >= this over the best (median and every trial), and retrieval calls a card gaining when the median of
# its effects reaches it. Defined here, not in klineage.optimize.result, because klineage.optimize
# imports klineage.skills (retrieval importing optimize would close an import cycle).
DEFAULT_REQUIRED_RATIO = 1.01
# "operator:case@kernel": one kernel's measurement of a case that a card's steps timed on several kernels
KERNEL_MARK = "@"


def measured_case(key: str) -> str:
    """The "operator:case" a measured row names, without the kernel a card timed on several adds."""
    return key.split(KERNEL_MARK, 1)[0]


class CardStatus(str, Enum):
    CANDIDATE = "candidate"  # induced from lineages, not yet roundtrip-verified
    ADMITTED = "admitted"  # passed a held-out roundtrip
    RETIRED = "retired"  # withdrawn (a roundtrip or later evidence contradicted it)
    IMPORTED = "imported"  # read from a SKILL.md folder; admitted only once a trial on this gate passes


class RefKind(str, Enum):
    TRANSITION = "transition"
    REJECTION = "rejection"


def _texts(value: Any, where: str) -> tuple[str, ...]:
    return tuple(nonblank(v, f"{where}[{i}]") for i, v in enumerate(listed(value, where)))


@codec.part("ref")
@dataclass(frozen=True, order=True)
class Ref:
    """A pointer into a lineage: transition `index` (or rejection position `index`) of lineage `lineage`.
    The lineage id is `klineage.skills.induction.lineage_id`: expert name, fingerprint prefix, gate mode."""

    lineage: str
    kind: RefKind
    index: int

    def __post_init__(self) -> None:
        nonblank(self.lineage, "ref.lineage")
        if not isinstance(self.kind, RefKind):
            object.__setattr__(self, "kind", enum(RefKind, self.kind, "ref.kind"))
        whole(self.index, "ref.index")

    def __str__(self) -> str:
        return f"{self.lineage}#{'t' if self.kind is RefKind.TRANSITION else 'r'}{self.index}"


@codec.part("anchor")
@dataclass(frozen=True)
class CardAnchor:
    """The code surface the forward step acts on: the anchor kind ("loop", "function", "parameter" ...),
    the key and function of a representative site, and a representative snippet."""

    kind: str
    snippet: str = ""
    function: str = ""
    key: str = ""

    def __post_init__(self) -> None:
        nonblank(self.kind, "anchor.kind")
        for name in ("snippet", "function", "key"):
            text(getattr(self, name), f"anchor.{name}")


@dataclass(frozen=True)
class Precondition:
    """A structured predicate over case facts (`klineage.expr` syntax: numeric case parameters, and
    `<param>_is_<value>` booleans for text parameters such as dtypes), one readable sentence, and
    the evidence that supports it: the cases where the step was sound and the predicate holds
    (`holds`), those where it was refused and the predicate fails (`fails`), and the source of
    the labels ("correctness", "domain", "declared", or "timing": where the step paid, from per-case
    effects, klineage.skills.when), and for a timing predicate its leave-one-case-out accuracy. A timing
    predicate may have exceptions (its sentence counts them): its `holds` are all the decided cases where
    it holds and its `fails` all those where it fails, paid or not."""

    expression: str
    sentence: str
    holds: tuple[str, ...] = ()
    fails: tuple[str, ...] = ()
    source: str = "correctness"
    loo_accuracy: float | None = None
    # a timing predicate's names, valued on each measured case: what the card page draws its effects against
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # leave-one-case-out accuracy with each kernel left out with all its cases instead: how the search carries
    # to a kernel it never saw; None where the card was measured on one kernel
    kernel_loo_accuracy: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str) or not self.expression.strip():
            raise DocumentError("precondition.expression", f"must be a non-empty expression, not {self.expression!r}")
        try:
            expr.parse(self.expression)
        except ExpressionError as exc:
            raise DocumentError("precondition.expression", f"bad predicate {self.expression!r}: {exc}") from None
        nonblank(self.sentence, "precondition.sentence")
        nonblank(self.source, "precondition.source")
        object.__setattr__(self, "holds", tuple(self.holds))
        object.__setattr__(self, "fails", tuple(self.fails))
        if not isinstance(self.facts, dict) or not all(isinstance(v, dict) for v in self.facts.values()):
            raise DocumentError("precondition.facts", "must map each case to its facts")
        for name in ("loo_accuracy", "kernel_loo_accuracy"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= number(value, f"precondition.{name}") <= 1.0:
                raise DocumentError(f"precondition.{name}", f"must be between 0 and 1, not {value!r}")

    @property
    def names(self) -> set[str]:
        return expr.names(self.expression)

    def check(self, facts: dict[str, Any]) -> bool:
        """Whether the predicate holds for a case's facts (see `predicates.case_facts`)."""
        return bool(expr.evaluate(self.expression, facts))

    def holds_on(self, case: str) -> bool | None:
        """Whether it holds on a measured case: from the facts recorded for it (a timing predicate
        records every case it was induced over, the undecided ones too, which are in neither `holds`
        nor `fails`), else (and where a fact it names is missing there) from those two lists; None for a case
        it says nothing about."""
        if case in self.facts:
            try:
                return self.check(self.facts[case])
            except ExpressionError:  # a fact the case lacks: where induction put it says (unknown fails)
                pass
        if case in self.holds or case in self.fails:
            return case in self.holds
        # a case measured on several kernels: it holds there where it holds on every kernel's row
        kernels = [k for k in (*self.facts, *self.holds, *self.fails) if k != case and measured_case(k) == case]
        answers = {self.holds_on(k) for k in kernels}
        return answers.pop() if len(answers) == 1 else None

    def held(self, case: str) -> bool:
        """Whether `case` ("operator:case") is among those where the predicate holds and the step paid,
        on some kernel it was measured on."""
        return any(measured_case(k) == case for k in self.holds)

    def to_dict(self) -> dict[str, Any]:
        return {"expression": self.expression, "sentence": self.sentence, "holds": list(self.holds),
                "fails": list(self.fails), "source": self.source,
                # absent unless measured: libraries written before timing predicates keep their bytes
                **({"loo_accuracy": self.loo_accuracy} if self.loo_accuracy is not None else {}),
                **({"kernel_loo_accuracy": self.kernel_loo_accuracy} if self.kernel_loo_accuracy is not None else {}),
                **({"facts": self.facts} if self.facts else {})}

    @classmethod
    def from_dict(cls, data: Any, where: str = "precondition") -> Precondition:
        data = need(data, ("expression", "sentence", "holds", "fails", "source"), where,
                    optional=("loo_accuracy", "kernel_loo_accuracy", "facts"))
        try:
            return cls(data["expression"], data["sentence"], _texts(data["holds"], f"{where}.holds"),
                       _texts(data["fails"], f"{where}.fails"), data["source"], data.get("loo_accuracy"),
                       data.get("facts", {}), data.get("kernel_loo_accuracy"))
        except DocumentError as exc:
            raise DocumentError(where, str(exc)) from None


@dataclass(frozen=True)
class Effect:
    """A measured paired speed ratio of the forward step on one case: child time / parent time
    (> 1: the step makes the kernel faster), overall and per timing trial. `placement`: exchanged
    when the step was re-timed with parent and child exchanging places (the walk's own pairing can
    be moved by where each module loads: klineage.walk.timing_audit), its rounds as the trials."""

    case: str
    operator: str
    ratio: float
    per_trial: tuple[float, ...]
    source: Ref
    placement: Placement = Placement.AS_LOADED

    def __post_init__(self) -> None:
        nonblank(self.case, "effect.case")
        nonblank(self.operator, "effect.operator")
        number(self.ratio, "effect.ratio", positive=True)
        object.__setattr__(self, "per_trial", tuple(self.per_trial))
        for i, r in enumerate(self.per_trial):
            number(r, f"effect.per_trial[{i}]", positive=True)
        if not isinstance(self.source, Ref):
            raise DocumentError("effect.source", f"must be a Ref, not {self.source!r}")
        object.__setattr__(self, "placement", enum(Placement, self.placement, "effect.placement"))

    @property
    def spread(self) -> float:
        """(max - min) of the trial ratios over the overall ratio; 0 with fewer than two trials."""
        if len(self.per_trial) < 2:
            return 0.0
        return (max(self.per_trial) - min(self.per_trial)) / self.ratio

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "operator": self.operator, "ratio": self.ratio, "per_trial": list(self.per_trial),
                "spread": self.spread, "source": self.source.to_dict(),
                # as loaded is left out: a library built before re-timings keeps its documents and digests
                **({"placement": self.placement.value} if self.placement is not Placement.AS_LOADED else {})}

    @classmethod
    def from_dict(cls, data: Any, where: str = "effect") -> Effect:
        data = need(data, ("case", "operator", "ratio", "per_trial", "source"), where, optional=("spread", "placement"))
        per_trial = tuple(listed(data["per_trial"], f"{where}.per_trial"))
        source = Ref.from_dict(data["source"], f"{where}.source")
        placement = enum(Placement, data.get("placement", Placement.AS_LOADED.value), f"{where}.placement")
        return cls(data["case"], data["operator"], data["ratio"], per_trial, source, placement)


@codec.part("risk")
@dataclass(frozen=True)
class Risk:
    """A failure mode: the rejection category (or "inconsistent_evidence", or "slower": per-case timings
    where the step made the kernel slower), a description, the evidence. On a card's `risks`, measured
    failures only; a card's `diagnostics` use the same shape for what is no failure of the skill: its
    transform did not apply (`not_applicable`) or applied without the declared removal (`audit_mismatch`)."""

    category: str
    description: str
    evidence: tuple[Ref, ...] = ()

    def __post_init__(self) -> None:
        nonblank(self.category, "risk.category")
        nonblank(self.description, "risk.description")
        object.__setattr__(self, "evidence", tuple(self.evidence))
        if not all(isinstance(r, Ref) for r in self.evidence):
            raise DocumentError("risk.evidence", "must be Refs")


@dataclass(frozen=True)
class Scope:
    operators: tuple[str, ...]
    language: str = "cuda"
    platform: str = "sm90"
    dtypes: tuple[str, ...] = ()
    prior_actions: tuple[str, ...] = ()  # transforms whose forward steps came before this one

    def __post_init__(self) -> None:
        for name in ("operators", "dtypes", "prior_actions"):
            object.__setattr__(self, name, tuple(sorted(set(_texts(getattr(self, name), f"scope.{name}")))))
        if not self.operators:
            raise DocumentError("scope.operators", "a card comes from at least one operator")
        nonblank(self.language, "scope.language")
        nonblank(self.platform, "scope.platform")

    def identity(self) -> dict[str, Any]:
        return {"operators": list(self.operators), "language": self.language, "platform": self.platform,
                "dtypes": list(self.dtypes)}

    def to_dict(self) -> dict[str, Any]:
        return {**self.identity(), "prior_actions": list(self.prior_actions)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "scope") -> Scope:
        data = need(data, ("operators", "language", "platform", "dtypes", "prior_actions"), where)
        return cls(_texts(data["operators"], f"{where}.operators"), data["language"], data["platform"],
                   _texts(data["dtypes"], f"{where}.dtypes"), _texts(data["prior_actions"], f"{where}.prior_actions"))


@codec.part("basis")
@dataclass(frozen=True)
class TrialBasis:
    """What a trial's outcome rests on besides its target: the gate mode, the GPU ("none" when
    nothing ran), the gate policy's fingerprint, the problem file's fingerprint, the digest of the
    card's content without its log and status (`admission_rule.card_digest`: its effects set the ratio
    required) and the kernel the card made of the target ("" when it made none). Two trials of
    one target on equal bases are the same evidence."""

    gate: str
    gpu: str
    policy: str
    problem: str
    card: str
    candidate: str = ""

    def __post_init__(self) -> None:
        for key in ("gate", "gpu", "policy", "problem", "card"):
            nonblank(getattr(self, key), f"basis.{key}")
        text(self.candidate, "basis.candidate")


@codec.part("trial")
@dataclass(frozen=True)
class Trial:
    """One roundtrip trial: the card materialized on `state` (a fingerprint outside its source
    lineage). `basis` is None for a trial logged before bases were: its evidence is unknown."""

    state: str
    passed: bool
    ratio: float | None = None
    message: str = ""
    basis: TrialBasis | None = codec.omitted(None)  # absent, not null: logs written before bases keep their bytes

    def __post_init__(self) -> None:
        nonblank(self.state, "trial.state")
        if not isinstance(self.passed, bool):
            raise DocumentError("trial.passed", f"must be true or false, not {self.passed!r}")
        if self.ratio is not None:
            number(self.ratio, "trial.ratio", positive=True)
        text(self.message, "trial.message")
        if self.basis is not None and not isinstance(self.basis, TrialBasis):
            raise DocumentError("trial.basis", f"must be a TrialBasis, not {self.basis!r}")


def _features(value: Any, where: str) -> frozenset[Feature]:
    if isinstance(value, (set, frozenset)):
        value = sorted(value)
    items = listed(value, where)
    out = []
    for i, item in enumerate(items):
        out.append(item if isinstance(item, Feature) else Feature.from_dict(item, f"{where}[{i}]"))
    return frozenset(out)


def card_id(transform: str, provides: frozenset[Feature], scope: Scope) -> str:
    """sha256 over the canonical JSON of transform, feature delta and scope (without prior_actions)."""
    payload = {"transform": transform, "provides": [f.to_dict() for f in sorted(provides)],
               "scope": scope.identity()}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_KEYS = ("version", "id", "transform", "intent", "anchor", "vector", "carrier", "preconditions", "effects", "risks",
         "scope", "requires", "provides", "conflicts", "evidence", "verification_log", "status")


@dataclass(frozen=True)
class SkillCard:
    transform: str
    intent: str
    anchor: CardAnchor
    vector: str  # the forward diff sketch (unified diff, naive -> expert)
    scope: Scope
    carrier: dict[str, Any] = field(default_factory=dict)  # tuning key -> the distinct values seen
    preconditions: tuple[Precondition, ...] = ()
    effects: tuple[Effect, ...] = ()
    risks: tuple[Risk, ...] = ()
    diagnostics: tuple[Risk, ...] = ()  # rewriter non-matches: "did not apply here", never a risk
    requires: frozenset[Feature] = frozenset()
    provides: frozenset[Feature] = frozenset()
    conflicts: frozenset[Feature] = frozenset()
    evidence: tuple[Ref, ...] = ()
    verification_log: tuple[Trial, ...] = ()
    status: CardStatus = CardStatus.CANDIDATE
    id: str = ""  # empty: derived from the content; given: must match it
    version: int = CARD_VERSION

    def __post_init__(self) -> None:
        if self.version != CARD_VERSION:
            raise DocumentError("card", f"unsupported version {self.version!r} (this is {CARD_VERSION})")
        nonblank(self.transform, "card.transform")
        if not isinstance(self.intent, str) or not self.intent.strip():
            raise DocumentError("card.intent", f"a card needs an intent (one sentence), not {self.intent!r}")
        if not isinstance(self.anchor, CardAnchor):
            raise DocumentError("card.anchor", f"must be a CardAnchor, not {self.anchor!r}")
        text(self.vector, "card.vector")
        if not isinstance(self.scope, Scope):
            raise DocumentError("card.scope", f"must be a Scope, not {self.scope!r}")
        if not isinstance(self.carrier, dict):
            raise DocumentError("card.carrier", "must be an object")
        try:
            json.dumps(self.carrier, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise DocumentError("card.carrier", f"must be plain JSON: {exc}") from None
        if isinstance(self.status, str) and not isinstance(self.status, CardStatus):
            object.__setattr__(self, "status", enum(CardStatus, self.status, "card.status"))
        if not isinstance(self.status, CardStatus):
            raise DocumentError("card.status", f"unknown value {self.status!r}")
        checks = (("preconditions", Precondition), ("effects", Effect), ("risks", Risk), ("diagnostics", Risk),
                  ("evidence", Ref),
                  ("verification_log", Trial))
        for name, kind in checks:
            value = tuple(getattr(self, name))
            for i, item in enumerate(value):
                if not isinstance(item, kind):
                    raise DocumentError(f"card.{name}[{i}]", f"must be a {kind.__name__}, not {item!r}")
            object.__setattr__(self, name, value)
        for name in ("requires", "provides", "conflicts"):
            object.__setattr__(self, name, _features(getattr(self, name), f"card.{name}"))
        clash = self.provides & self.conflicts
        if clash:
            raise DocumentError("card.conflicts", f"{sorted(map(str, clash))} are both provided and conflicting")
        derived = card_id(self.transform, self.provides, self.scope)
        if not self.id:
            object.__setattr__(self, "id", derived)
        elif self.id != derived:
            raise DocumentError("card.id", f"{self.id[:SHORT_ID]} does not match its content ({derived[:SHORT_ID]}): "
                                           f"the transform, provides or scope changed")

    @property
    def short_id(self) -> str:
        return self.id[:SHORT_ID]

    def applies(self, present: set[Feature] | frozenset[Feature]) -> bool:
        """Whether the card composes onto a state with these features: requires present, provides
        absent, no conflict present."""
        present = frozenset(present)
        return self.requires <= present and not (self.provides & present) and not (self.conflicts & present)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version, "id": self.id, "transform": self.transform, "intent": self.intent,
            "anchor": self.anchor.to_dict(), "vector": self.vector, "carrier": self.carrier,
            "preconditions": [p.to_dict() for p in self.preconditions], "effects": [e.to_dict() for e in self.effects],
            "risks": [r.to_dict() for r in self.risks], "scope": self.scope.to_dict(),
            "requires": [f.to_dict() for f in sorted(self.requires)],
            "provides": [f.to_dict() for f in sorted(self.provides)],
            "conflicts": [f.to_dict() for f in sorted(self.conflicts)],
            "evidence": [r.to_dict() for r in self.evidence],
            "verification_log": [t.to_dict() for t in self.verification_log], "status": self.status.value,
            # absent when empty: a card without diagnostics keeps the bytes it had before they existed
            **({"diagnostics": [d.to_dict() for d in self.diagnostics]} if self.diagnostics else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "card") -> SkillCard:
        data = need(data, _KEYS, where, optional=("diagnostics",))
        if data["version"] != CARD_VERSION:
            raise DocumentError(where, f"unsupported version {data['version']!r} (this is {CARD_VERSION})")
        if not isinstance(data["carrier"], dict):
            raise DocumentError(f"{where}.carrier", "must be an object")

        def many(key: str, kind: Any) -> tuple[Any, ...]:
            items = listed(data[key], f"{where}.{key}")
            return tuple(kind.from_dict(v, f"{where}.{key}[{i}]") for i, v in enumerate(items))

        return cls(
            transform=data["transform"], intent=data["intent"],
            anchor=CardAnchor.from_dict(data["anchor"], f"{where}.anchor"), vector=data["vector"],
            scope=Scope.from_dict(data["scope"], f"{where}.scope"), carrier=dict(data["carrier"]),
            preconditions=many("preconditions", Precondition), effects=many("effects", Effect),
            risks=many("risks", Risk), diagnostics=many("diagnostics", Risk) if "diagnostics" in data else (),
            requires=_features(data["requires"], f"{where}.requires"),
            provides=_features(data["provides"], f"{where}.provides"),
            conflicts=_features(data["conflicts"], f"{where}.conflicts"), evidence=many("evidence", Ref),
            verification_log=many("verification_log", Trial),
            status=enum(CardStatus, data["status"], f"{where}.status"), id=nonblank(data["id"], f"{where}.id"),
            version=data["version"],
        )

    def to_json(self) -> str:
        return document_text(self.to_dict())

    @classmethod
    def from_json(cls, text: str, where: str = "card") -> SkillCard:
        """`where` also leads every field's name in errors (an embedded card is named after its SKILL.md file)."""
        data = parse_document(text, where)
        return cls.from_dict(data, where)
