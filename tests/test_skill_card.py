"""The skill card document: validation that names the field, a content-derived id, a lossless round trip."""

from __future__ import annotations

import copy
import json

import pytest

from klineage.errors import DocumentError
from klineage.features.feature import Feature
from klineage.gate.policy import Placement
from klineage.skills.card import (
    CARD_VERSION,
    CardAnchor,
    CardStatus,
    Effect,
    Precondition,
    Ref,
    RefKind,
    Risk,
    Scope,
    SkillCard,
    Trial,
    card_id,
)

LINEAGE = "warp_vec4@0123456789ab:gpu"


def make_card(**changes) -> SkillCard:
    fields = dict(
        transform="devectorize",
        intent="Move global memory in 128-bit vector accesses.",
        anchor=CardAnchor("declaration", "const float4* xv = reinterpret_cast<const float4*>(x);", "row", "xv"),
        vector="--- child/kernel.cu\n+++ parent/kernel.cu\n@@ -1 +1 @@\n-float a = x[i];\n+float4 a = xv[i];\n",
        scope=Scope(("row_softmax",), dtypes=("float32",), prior_actions=("restrict",)),
        carrier={"vector_width": [4]},
        preconditions=(Precondition("cols % 4 == 0", "cols must be a multiple of 4", ("headline",), ("ragged",)),),
        effects=(Effect("headline", "row_softmax", 1.25, (1.24, 1.25, 1.27), Ref(LINEAGE, RefKind.TRANSITION, 3)),),
        risks=(Risk("incorrect", "misaligned tail", (Ref(LINEAGE, RefKind.REJECTION, 0),)),),
        requires=frozenset(),
        provides=frozenset({Feature("kernel", "vector_type_float4")}),
        conflicts=frozenset({Feature("kernel", "xor_swizzle")}),
        evidence=(Ref(LINEAGE, RefKind.TRANSITION, 3),),
    )
    fields.update(changes)
    return SkillCard(**fields)


def test_round_trip_is_lossless_and_versioned():
    card = make_card(verification_log=(Trial("f" * 64, True, 1.2, "held out"),))
    data = card.to_dict()
    assert data["version"] == CARD_VERSION
    assert SkillCard.from_dict(json.loads(json.dumps(data))) == card
    assert SkillCard.from_json(card.to_json()) == card
    assert card.to_json() == SkillCard.from_json(card.to_json()).to_json()


def test_id_is_content_derived_and_stable():
    # A golden value: the id must not change between runs, processes or versions of this code.
    expected = "c38e5885c282d8d9443a806682b1f13f2ac4741e584133839f9334e57ef40276"
    assert card_id("unroll", frozenset({Feature("device", "unroll_pragma")}), Scope(("row_softmax",))) == expected
    card = make_card()
    assert card.id == card_id(card.transform, card.provides, card.scope)
    assert card.short_id == card.id[:12]
    # Growing evidence, effects, risks, status or prior actions does not change who the card is.
    grown = make_card(effects=(), risks=(), evidence=(), status=CardStatus.ADMITTED,
                      scope=Scope(("row_softmax",), dtypes=("float32",), prior_actions=("unroll", "restrict")))
    assert grown.id == card.id
    # The transform, the delta and the scope do.
    assert make_card(transform="ldg").id != card.id
    assert make_card(provides=frozenset({Feature("kernel", "vector_type_float2")})).id != card.id
    assert make_card(scope=Scope(("gemm",), dtypes=("float32",))).id != card.id


def test_given_id_must_match_content():
    card = make_card()
    assert make_card(id=card.id) == card
    with pytest.raises(DocumentError, match="card.id.*does not match its content"):
        make_card(id="0" * 64)
    data = card.to_dict()
    data["transform"] = "ldg"
    with pytest.raises(DocumentError, match="card.id"):
        SkillCard.from_dict(data)


def test_unknown_status_is_named():
    data = make_card().to_dict()
    data["status"] = "approved"
    message = r"card.status: unknown value 'approved' \(one of: candidate, admitted, retired, imported\)"
    with pytest.raises(DocumentError, match=message):
        SkillCard.from_dict(data)
    with pytest.raises(DocumentError, match="card.status"):
        make_card(status="approved")
    assert make_card(status="admitted").status is CardStatus.ADMITTED


def test_missing_intent_is_named():
    with pytest.raises(DocumentError, match="card.intent: a card needs an intent"):
        make_card(intent="  ")
    data = make_card().to_dict()
    del data["intent"]
    with pytest.raises(DocumentError, match="card: missing 'intent'"):
        SkillCard.from_dict(data)


def test_bad_predicate_expression_is_named():
    with pytest.raises(DocumentError, match="precondition.expression: bad predicate 'import os'"):
        Precondition("import os", "never")
    with pytest.raises(DocumentError, match="precondition.expression: bad predicate"):
        Precondition("dtype == 'float16'", "dtype must be float16")  # no string literals: use dtype_is_float16
    with pytest.raises(DocumentError, match="precondition.expression"):
        Precondition("", "empty")
    data = make_card().to_dict()
    data["preconditions"][0]["expression"] = "K %% 8"
    with pytest.raises(DocumentError, match=r"card.preconditions\[0\].*bad predicate"):
        SkillCard.from_dict(data)
    with pytest.raises(DocumentError, match="precondition.sentence"):
        Precondition("K % 8 == 0", "")


def test_precondition_checks_case_facts():
    pre = Precondition("K % 8 == 0 and dtype_is_float16", "K must be a multiple of 8, and dtype must be float16")
    assert pre.names == {"K", "dtype_is_float16"}
    assert pre.check({"K": 64, "dtype_is_float16": True})
    assert not pre.check({"K": 60, "dtype_is_float16": True})


def test_malformed_documents_are_named():
    good = make_card().to_dict()
    cases = [
        (lambda d: d.update(extra=1), r"card: unknown keys \['extra'\]"),
        (lambda d: d.update(version=2), "unsupported version 2"),
        (lambda d: d["effects"][0].update(ratio=-1.0), r"effect.ratio: must be > 0"),
        (lambda d: d["effects"][0].update(per_trial="fast"), r"card.effects\[0\].per_trial: must be a list"),
        (lambda d: d["evidence"][0].update(kind="guess"), r"card.evidence\[0\].kind: unknown value 'guess'"),
        (lambda d: d["provides"].append({"locus": "kernel"}), r"card.provides\[1\]"),
        (lambda d: d["scope"].update(operators=[]), "scope.operators: a card comes from at least one operator"),
        (lambda d: d.update(carrier=[1]), "card.carrier: must be an object"),
        (lambda d: d["risks"][0].update(description=""), r"card.risks\[0\].description: must be a non-empty"),
    ]
    for mutate, message in cases:
        data = copy.deepcopy(good)
        mutate(data)
        with pytest.raises(DocumentError, match=message):
            SkillCard.from_dict(data)


def test_provides_and_conflicts_must_not_overlap():
    with pytest.raises(DocumentError, match="card.conflicts"):
        make_card(conflicts=frozenset({Feature("kernel", "vector_type_float4")}))


def test_applies_composes_on_features():
    card = make_card(requires=frozenset({Feature("kernel", "global_fn")}))
    assert card.applies({Feature("kernel", "global_fn")})
    assert not card.applies(set())  # requires missing
    assert not card.applies({Feature("kernel", "global_fn"), Feature("kernel", "vector_type_float4")})  # provided
    assert not card.applies({Feature("kernel", "global_fn"), Feature("kernel", "xor_swizzle")})  # conflict


def test_effect_spread_and_ref_text():
    effect = make_card().effects[0]
    assert effect.spread == pytest.approx((1.27 - 1.24) / 1.25)
    assert str(effect.source) == f"{LINEAGE}#t3"
    assert Effect("h", "op", 1.0, (1.0,), effect.source).spread == 0.0


def test_an_effect_re_timed_with_places_exchanged_says_so():
    effect = make_card().effects[0]
    assert "placement" not in effect.to_dict()  # as loaded: a library built before re-timings keeps its bytes
    retimed = Effect("h", "op", 1.003, (1.008, 1.003, 0.999), effect.source, Placement.EXCHANGED)
    assert retimed.to_dict()["placement"] == "exchanged" and Effect.from_dict(retimed.to_dict()) == retimed
    assert Effect.from_dict(effect.to_dict()).placement is Placement.AS_LOADED
    with pytest.raises(DocumentError, match=r"effect.placement.*unknown value 'swapped'"):
        Effect.from_dict({**retimed.to_dict(), "placement": "swapped"})

