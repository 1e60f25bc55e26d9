"""The lineage document: round trip, validation, deterministic bytes. Built from real kernel
states (the corpus's warp_vec4 and simplifications of it), no gate needed."""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
import time

import pytest

from klineage import corpus
from klineage.config import GateMode
from klineage.documents import document_files
from klineage.errors import DocumentError
from klineage.gate.verdict import Reason, Status
from klineage.kernel import KernelState
from klineage.lineage import (
    Assurance,
    CaseOutcome,
    CaseResult,
    Evidence,
    FeatureChange,
    FeatureLevel,
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
    VerdictSummary,
    unified_diff,
)
from klineage.transforms.base import Anchor

PASSED = VerdictSummary(Status.PASSED, None, (CaseResult("headline", CaseOutcome.PASSED),
                                               CaseResult("ragged", CaseOutcome.PASSED)))


def chain_of_states(count: int) -> list[KernelState]:
    """The expert, then `count` states, each with one more `#pragma unroll` line removed."""
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    states = [expert]
    for _ in range(count):
        states.append(states[-1].with_source(states[-1].source.replace("#pragma unroll\n", "", 1)))
    assert len({s.fingerprint for s in states}) == count + 1
    return states


def build(steps: int = 2, rejections: int = 1, termination: Termination = Termination.COMPLETE,
          gate: GateMode = GateMode.GPU, limits: Limits = Limits(16, 4)) -> Lineage:
    kernels = chain_of_states(steps)
    states = tuple(State(k.fingerprint, k.source, k.plan.to_dict(), PASSED,
                         {"source": [{"locus": "softmax_row", "name": "unroll_pragma"}], "sass": {"counts": []}})
                   for k in kernels)
    transitions = tuple(
        Transition(index=i, transform="unroll", anchor=Anchor("softmax_row", "loop", f"i#{i}:unroll", "#pragma unroll"),
                   parent=kernels[i].fingerprint, child=kernels[i + 1].fingerprint,
                   backward_diff=unified_diff(kernels[i], kernels[i + 1]),
                   forward_diff=unified_diff(kernels[i + 1], kernels[i]),
                   features_removed=(FeatureChange(FeatureLevel.SASS, "row_softmax_warp_vec4", "ldl"),),
                   features_added=(),
                   forward=ForwardCheck(ForwardStatus.VERIFIED, "gives back the parent",
                                        PairedTiming(1.02, (1.01, 1.03, 1.02))),
                   carrier={"unroll": "full"})
        for i in range(steps))
    rejected = tuple(
        Rejection(step=min(j, steps), parent=kernels[min(j, steps)].fingerprint, transform="devectorize",
                  anchor=Anchor("softmax_row", "declaration", "xv") if j % 2 == 0 else None,
                  category=RejectionCategory.INCORRECT, reason=Reason.INCORRECT, cases_failed=("ragged",),
                  evidence=Evidence(message="worst at (3, 7)", stage="correctness", case="ragged",
                                    worst={"seed": 1, "worst_index": [3, 7], "rel_l2": 0.5}))
        for j in range(rejections))
    return Lineage(expert=KernelRef(kernels[0].name, kernels[0].fingerprint),
                   problem=ProblemRef("row_softmax", "f" * 64), rewriter="rules", gate=gate,
                   policy={"state": {"seeds": 3}}, limits=limits, states=states, transitions=transitions,
                   rejections=rejected, termination=Outcome(termination, "no eligible proposal remains"),
                   stats=Stats(steps, rejections, steps + rejections + 1, 12.5))


def test_round_trip_is_exact():
    lineage = build()
    data = lineage.to_dict()
    again = Lineage.from_dict(json.loads(json.dumps(data)))
    assert again == lineage
    assert again.to_json() == lineage.to_json()
    assert Lineage.from_json(lineage.to_json()).to_json() == lineage.to_json()


def test_save_and_load(tmp_path):
    lineage = build()
    path = lineage.save(tmp_path / "deep" / "lineage.json")
    assert Lineage.load(path) == lineage
    assert path.read_bytes() == lineage.to_json().encode("utf-8")
    with pytest.raises(DocumentError, match="no such lineage"):
        Lineage.load(tmp_path / "missing.json")


def test_a_gz_path_is_saved_compressed_and_the_same_bytes_every_time(tmp_path):
    """bench/walks/ keeps its walks gzip-compressed; saved twice (a second later: no timestamp in
    the header), a walk gives the same file, so a re-saved walk shows no diff."""
    lineage = build()
    first = lineage.save(tmp_path / "a.gpu.json.gz").read_bytes()
    time.sleep(1.1)
    second = lineage.save(tmp_path / "b.gpu.json.gz").read_bytes()
    assert first == second and first[:2] == b"\x1f\x8b"
    assert gzip.decompress(first) == lineage.to_json().encode("utf-8")
    assert Lineage.load(tmp_path / "a.gpu.json.gz") == lineage


@pytest.mark.parametrize("damage", [lambda raw: raw[:len(raw) // 2], lambda raw: b"not gzip" + raw,
                                    lambda raw: raw[:20] + bytes(40) + raw[60:]], ids=["cut", "header", "data"])
def test_a_corrupt_gz_file_is_refused_by_name(tmp_path, damage):
    path = build().save(tmp_path / "walk.gpu.json.gz")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DocumentError, match=f"^{re.escape(str(path))}: not a readable gzip file"):
        Lineage.load(path)


def test_a_folder_holding_a_walk_plain_and_compressed_is_refused(tmp_path):
    build().save(tmp_path / "walk.gpu.json")
    assert document_files(tmp_path) == [tmp_path / "walk.gpu.json"]
    build().save(tmp_path / "walk.gpu.json.gz")
    with pytest.raises(DocumentError, match="walk.gpu.json stored both plain and as .gz"):
        document_files(tmp_path)


def test_bytes_do_not_depend_on_key_order_or_construction():
    first = build().to_json()
    assert build().to_json() == first
    data = json.loads(first)

    def shuffled(value):
        if isinstance(value, dict):
            items = list(value.items())
            random.Random(7).shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(value, list):
            return [shuffled(v) for v in value]
        return value

    assert Lineage.from_dict(shuffled(data)).to_json() == first
    assert first.endswith("\n") and "created" not in data, "no wall-clock timestamps"
    assert list(json.loads(first)) == sorted(data), "keys are sorted"


def test_top_level_shape():
    data = build().to_dict()
    assert data["version"] == 1 and data["gate"] == "gpu" and data["assurance"] == "gpu_verified"
    assert data["termination"] == {"kind": "complete", "message": "no eligible proposal remains"}
    assert data["transitions"][0]["forward"]["status"] == "verified"
    assert data["transitions"][0]["forward"]["timing"] == {"overall": 1.02, "per_trial": [1.01, 1.03, 1.02],
                                                          "required": 0.99}
    assert data["rejections"][0]["category"] == "incorrect" and data["rejections"][0]["reason"] == "incorrect"
    assert data["states"][0]["verdict"]["cases"][0] == {"case": "headline", "outcome": "passed"}
    assert data["transitions"][0]["forward_diff"].startswith("--- a/kernel.cu\n+++ b/kernel.cu\n")
    assert "+#pragma unroll" in data["transitions"][0]["forward_diff"]


def test_compile_only_lineage_is_labelled_unverified():
    lineage = build(gate=GateMode.COMPILE_ONLY)
    assert lineage.assurance is Assurance.UNVERIFIED
    data = lineage.to_dict()
    assert data["assurance"] == "unverified_compile_only"
    data["assurance"] = "gpu_verified"
    with pytest.raises(DocumentError, match="contradicts gate mode compile"):
        Lineage.from_dict(data)


def test_broken_chain_is_refused():
    data = build(steps=3).to_dict()
    data["transitions"][1]["parent"] = data["transitions"][2]["child"]
    with pytest.raises(DocumentError, match="do not chain"):
        Lineage.from_dict(data)
    data = build(steps=2).to_dict()
    data["transitions"][0]["parent"] = data["transitions"][1]["child"]
    with pytest.raises(DocumentError, match="is not the expert"):
        Lineage.from_dict(data)


def test_indices_must_be_contiguous():
    data = build(steps=2).to_dict()
    data["transitions"][1]["index"] = 2
    with pytest.raises(DocumentError, match="without gaps"):
        Lineage.from_dict(data)


def test_states_must_follow_the_chain():
    data = build(steps=2).to_dict()
    data["states"].reverse()
    with pytest.raises(DocumentError, match="states must be the expert"):
        Lineage.from_dict(data)
    data = build(steps=1).to_dict()
    data["states"][1]["source"] += "// tampered\n"
    with pytest.raises(DocumentError, match="fingerprint does not match"):
        Lineage.from_dict(data)


def test_rejections_must_branch_from_the_chain():
    data = build(steps=2, rejections=1).to_dict()
    data["rejections"][0]["parent"] = data["transitions"][1]["child"]
    with pytest.raises(DocumentError, match="is not the state of step 0"):
        Lineage.from_dict(data)
    data = build(steps=1, rejections=1).to_dict()
    data["rejections"][0]["step"] = 5
    with pytest.raises(DocumentError, match="past the last transition"):
        Lineage.from_dict(data)


@pytest.mark.parametrize("path, value, words", [
    (("transitions", 0, "forward", "status"), "faster", "forward.status"),
    (("rejections", 0, "category"), "flaky", "category"),
    (("rejections", 0, "reason"), "bad_vibes", "reason"),
    (("termination", "kind"), "bored", "termination.kind"),
    (("gate",), "tpu", "lineage.gate"),
    (("states", 0, "verdict", "status"), "fine", "verdict.status"),
    (("states", 0, "verdict", "cases", 0, "outcome"), "maybe", "outcome"),
    (("transitions", 0, "features_removed", 0, "level"), "ptx", "level"),
])
def test_unknown_enum_values_are_refused(path, value, words):
    data = build(steps=1, rejections=1).to_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(DocumentError, match=words) as raised:
        Lineage.from_dict(data)
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("key", ["termination", "transitions", "stats", "expert"])
def test_missing_top_level_keys_are_refused(key):
    data = build().to_dict()
    del data[key]
    with pytest.raises(DocumentError, match=f"missing '{key}'"):
        Lineage.from_dict(data)


def test_unknown_keys_and_versions_are_refused():
    data = build().to_dict()
    data["created"] = "2026-01-01T00:00:00Z"
    with pytest.raises(DocumentError, match="unknown keys"):
        Lineage.from_dict(data)
    data = build().to_dict()
    data["version"] = 99
    with pytest.raises(DocumentError, match="unsupported version"):
        Lineage.from_dict(data)
    with pytest.raises(DocumentError, match="not JSON"):
        Lineage.from_json("{")


def test_stats_and_limits_must_agree():
    data = build(steps=2, rejections=1).to_dict()
    data["stats"]["accepted"] = 3
    with pytest.raises(DocumentError, match="disagree"):
        Lineage.from_dict(data)
    with pytest.raises(DocumentError, match="step_limit"):
        build(steps=2, termination=Termination.STEP_LIMIT, limits=Limits(3, 4))
    assert build(steps=2, termination=Termination.STEP_LIMIT, limits=Limits(2, 4)).termination.kind \
        is Termination.STEP_LIMIT
    with pytest.raises(DocumentError, match="exceed max_steps"):
        build(steps=2, limits=Limits(1, 4))
    with pytest.raises(DocumentError, match="rejection_limit"):
        build(rejections=1, termination=Termination.REJECTION_LIMIT, limits=Limits(16, 2))
    assert build(rejections=2, termination=Termination.REJECTION_LIMIT, limits=Limits(16, 2)).stats.rejected == 2
    with pytest.raises(DocumentError, match="max_rejections"):
        Limits(16, 0)


def test_only_gated_refusals_count_toward_the_limit():
    counted = {c for c in RejectionCategory if c.counts}
    assert RejectionCategory.NOT_APPLICABLE not in counted and RejectionCategory.NO_CHANGE not in counted
    assert RejectionCategory.GATE_ERROR not in counted
    assert {RejectionCategory.COMPILE_ERROR, RejectionCategory.INCORRECT, RejectionCategory.AUDIT_MISMATCH} <= counted


def test_forward_status_and_timing_must_agree():
    with pytest.raises(DocumentError, match="verified forward step needs"):
        ForwardCheck(ForwardStatus.VERIFIED, "no timing")
    with pytest.raises(DocumentError, match="verified forward step needs"):
        ForwardCheck(ForwardStatus.VERIFIED, "one slow trial", PairedTiming(1.0, (1.0, 0.98, 1.0)))
    with pytest.raises(DocumentError, match="slower forward step needs"):
        ForwardCheck(ForwardStatus.SLOWER, "fast", PairedTiming(1.0, (1.0, 1.0, 1.0)))
    assert ForwardCheck(ForwardStatus.SLOWER, "slow", PairedTiming(1.0, (1.0, 0.98, 1.0))).timing.accepted is False


def test_verdict_summary_reason_follows_status():
    with pytest.raises(DocumentError, match="rejected verdict has a reason"):
        VerdictSummary(Status.REJECTED, None, ())
    with pytest.raises(DocumentError, match="rejected verdict has a reason"):
        VerdictSummary(Status.PASSED, Reason.INCORRECT, ())


def test_plan_changes_show_in_the_diff():
    expert = corpus.kernel_entry("row_softmax/warp_vec4").load()
    plan = copy.deepcopy(expert.plan.to_dict())
    plan["launch"][0]["block"] = ["THREADS * 2"]
    from klineage.launch import LaunchPlan

    other = KernelState(expert.source, LaunchPlan.from_dict(plan))
    diff = unified_diff(expert, other)
    assert "--- a/launch.json" in diff and '+    "THREADS * 2"' in diff
    assert unified_diff(expert, expert) == ""
