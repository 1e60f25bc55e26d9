"""The derived to_dict/from_dict (klineage/codec.py): on the real corpus library and the stored optimization
results, every part it derives writes the very dictionary its hand-written pair wrote (the same keys in the same
order, the same values: written out below as they were), reads back equal, and a bad value is refused with an
error naming the field where the reader reads it."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from typing import Any

import pytest

from klineage import codec
from klineage.config import REPO_ROOT
from klineage.errors import DocumentError
from klineage.fingerprint import document_text
from klineage.optimize.result import OptimizationResult, Stats
from klineage.skills.card import CardAnchor, Ref, Risk, Trial, TrialBasis
from klineage.skills.library import Library, bundled_library, load_library


def _ref(r: Ref) -> dict[str, Any]:
    return {"lineage": r.lineage, "kind": r.kind.value, "index": r.index}


def _basis(b: TrialBasis) -> dict[str, Any]:
    return {key: getattr(b, key) for key in ("gate", "gpu", "policy", "problem", "card", "candidate")}


# The hand-written to_dict of each part before it was derived, as the golden.
BEFORE = {
    Ref: _ref,
    CardAnchor: lambda a: {"kind": a.kind, "snippet": a.snippet, "function": a.function, "key": a.key},
    Risk: lambda r: {"category": r.category, "description": r.description, "evidence": [_ref(e) for e in r.evidence]},
    TrialBasis: _basis,
    Trial: lambda t: {"state": t.state, "passed": t.passed, "ratio": t.ratio, "message": t.message,
                      **({"basis": _basis(t.basis)} if t.basis is not None else {})},
    Stats: lambda s: {"evaluations": s.evaluations, "wasted": s.wasted, "accepted": s.accepted, "seconds": s.seconds,
                      **({"saved": s.saved} if s.saved else {})},
}


def optimization_results() -> list[OptimizationResult]:
    found = []
    for path in sorted((REPO_ROOT / "bench" / "results").rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("kind") == "optimization":
            found.append(OptimizationResult.from_dict(data))
    return found


def corpus_parts() -> list[Any]:
    """Every derived part in the bundled library and the stored optimization results, plus the shapes the
    corpus happens not to hold (a trial logged before bases, a run that saved gate calls)."""
    parts: list[Any] = []
    for card in load_library(bundled_library()).cards:
        parts += [card.anchor, *card.evidence, *(e.source for e in card.effects), *card.risks, *card.diagnostics]
        parts += [r for risk in (*card.risks, *card.diagnostics) for r in risk.evidence]
        parts += [*card.verification_log, *(t.basis for t in card.verification_log if t.basis is not None)]
    parts += [result.stats for result in optimization_results()]
    trial = next(p for p in parts if isinstance(p, Trial))
    stats = next(p for p in parts if isinstance(p, Stats))
    return parts + [dataclasses.replace(trial, basis=None, ratio=None), dataclasses.replace(stats, saved=3)]


def test_the_corpus_holds_every_derived_part():
    kinds = {type(p) for p in corpus_parts()}
    assert kinds == set(BEFORE)
    assert len(optimization_results()) >= 10


def test_every_derived_part_writes_the_dictionary_it_wrote_before_and_reads_back_equal():
    for part in corpus_parts():
        written = part.to_dict()
        assert json.dumps(written) == json.dumps(BEFORE[type(part)](part)), part  # keys, their order, values
        assert type(part).from_dict(json.loads(json.dumps(written)), "x") == part


def test_the_bundled_library_reads_and_writes_back_to_its_own_bytes():
    path = bundled_library()
    assert document_text(load_library(path).to_dict()) == path.read_text(encoding="utf-8")


def test_a_number_read_is_kept_as_written():
    trial = Trial.from_dict({"state": "s", "passed": True, "ratio": 2, "message": ""})
    assert json.dumps(trial.to_dict()) == '{"state": "s", "passed": true, "ratio": 2, "message": ""}'


def _library_with(change) -> tuple[dict[str, Any], int]:
    data = json.loads(bundled_library().read_text(encoding="utf-8"))
    index = next(i for i, c in enumerate(data["cards"]) if c["verification_log"] and c["effects"])
    change(data["cards"][index])
    return data, index


@pytest.mark.parametrize("change, where, message", [
    (lambda c: c["verification_log"][0].update(passed="yes"), "verification_log[0].passed",
     "must be true or false, not 'yes'"),
    (lambda c: c["verification_log"][0]["basis"].update(gate=""), "verification_log[0].basis.gate",
     "must be a non-empty string, not ''"),
    (lambda c: c["verification_log"][0]["basis"].pop("gpu"), "verification_log[0].basis", "missing 'gpu'"),
    (lambda c: c["verification_log"][0].update(color="red"), "verification_log[0]", "unknown keys ['color']"),
    (lambda c: c["effects"][0]["source"].update(index=-1), "effects[0].source.index",
     "must be a whole number >= 0, not -1"),
    (lambda c: c["effects"][0]["source"].update(kind="guess"), "effects[0].source.kind", "unknown value 'guess'"),
    (lambda c: c["anchor"].update(snippet=None), "anchor.snippet", "must be a string, not None"),
])
def test_a_bad_value_is_refused_naming_the_field_where_it_is_read(change, where, message):
    data, index = _library_with(change)
    with pytest.raises(DocumentError) as error:
        Library.from_dict(data)
    assert error.value.where == f"library.cards[{index}].{where}"
    assert error.value.message.startswith(message)


def test_a_run_read_without_saved_calls_saves_none_and_a_bad_count_is_named():
    assert Stats.from_dict({"evaluations": 3, "wasted": 1, "accepted": 1, "seconds": 2.5}).saved == 0
    with pytest.raises(DocumentError, match=r"^result\.stats\.saved: must be a whole number >= 0, not -2$"):
        Stats.from_dict({"evaluations": 3, "wasted": 1, "accepted": 1, "seconds": 2.5, "saved": -2}, "result.stats")
    with pytest.raises(DocumentError, match=r"^stats\.seconds: must be a finite number, not 'slow'$"):
        Stats.from_dict({"evaluations": 3, "wasted": 1, "accepted": 1, "seconds": "slow"})


class Colour(str, Enum):
    RED = "red"


@codec.part("inner")
@dataclasses.dataclass(frozen=True)
class Inner:
    colours: tuple[Colour, ...]
    weight: float | None


def test_a_derived_part_with_a_nested_part_reads_and_writes():
    @codec.part("outer")
    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner
        name: str = codec.omitted("")

    outer = Outer.from_dict({"inner": {"colours": ["red"], "weight": None}})
    assert outer == Outer(Inner((Colour.RED,), None)) and outer.to_dict() == {"inner": {"colours": ["red"],
                                                                                         "weight": None}}
    with pytest.raises(DocumentError, match=r"^outer\.inner\.colours\[1\]: unknown value 'blue'"):
        Outer.from_dict({"inner": {"colours": ["red", "blue"], "weight": 1}})


def test_only_a_frozen_dataclass_of_known_field_types_is_derived():
    with pytest.raises(TypeError, match="not a frozen dataclass"):
        codec.part("loose")(dataclasses.make_dataclass("Loose", [("a", int)]))

    @codec.part("odd")
    @dataclasses.dataclass(frozen=True)
    class Odd:
        table: dict

    with pytest.raises(TypeError, match="no rule for a field of type"):
        Odd.from_dict({"table": {}})
