"""Lineage import: the engine checks the document, import is idempotent, a malformed document
stores nothing, and the stored rows give the document back."""

from __future__ import annotations

import copy
import json

import pytest
from django.contrib.auth.models import Group, Permission

from klineage import config
from klineage.documents import document_files
from klineage.lineage import Lineage as EngineLineage
from lineage_data import dry_walk, with_rejections
from skills_app.importer import ImportRefused, export_lineage, import_corpus, import_lineage, lineage_id
from skills_app.models import KernelState, Lineage, LineageStep, Review

pytestmark = pytest.mark.django_db


def _counts() -> tuple[int, int, int]:
    return Lineage.objects.count(), LineageStep.objects.count(), KernelState.objects.count()


def test_import_stores_lineage_steps_and_states():
    document = dry_walk()
    lineage, action = import_lineage(document)
    assert action == "created"
    assert lineage.assurance == Lineage.Assurance.UNVERIFIED and lineage.unverified
    assert lineage.gate_mode == "compile" and lineage.rewriter == "rules"
    assert lineage.termination_kind == document["termination"]["kind"]
    assert lineage.expert_state.fingerprint == document["expert"]["fingerprint"]
    assert lineage.accepted_count == len(document["transitions"]) == lineage.steps.filter(kind="accepted").count()
    fingerprints = {s["fingerprint"] for s in document["states"]}
    assert set(KernelState.objects.values_list("fingerprint", flat=True)) >= fingerprints
    first = lineage.steps.get(kind="accepted", index=0)
    transition = document["transitions"][0]
    assert first.transform == transition["transform"]
    assert first.parent_state.fingerprint == transition["parent"]
    assert first.child_state.fingerprint == transition["child"]
    assert first.backward_diff == transition["backward_diff"]
    assert first.features_removed == transition["features_removed"]
    assert first.forward_status == "untimed" and first.forward_timing is None


def test_import_is_idempotent_and_keyed_by_content():
    document = dry_walk()
    first, _ = import_lineage(document)
    before = _counts()
    again, action = import_lineage(copy.deepcopy(document))
    assert action == "unchanged" and again.pk == first.pk and _counts() == before
    assert first.id == lineage_id(EngineLineage.from_dict(document))
    other, action = import_lineage(with_rejections(document))
    assert action == "created" and other.pk != first.pk
    assert _counts()[2] == before[2]  # the same states, stored once


def test_rejections_are_stored_with_their_branch_and_evidence():
    document = with_rejections()
    lineage, _ = import_lineage(document)
    rejected = list(lineage.steps.filter(kind="rejected").order_by("index"))
    assert [r.branch_step for r in rejected] == [1, len(document["transitions"])]
    assert rejected[0].rejection_category == "compile_error" and rejected[0].rejection_reason == "compile_error"
    assert "identifier" in rejected[0].evidence["log"]
    assert rejected[0].parent_state.fingerprint == document["states"][1]["fingerprint"]
    assert rejected[0].child_state is None
    assert rejected[1].anchor is None and rejected[1].evidence["audit"]["found"] == "still present"


def test_export_gives_the_engine_document_back():
    document = with_rejections()
    lineage, _ = import_lineage(document)
    assert export_lineage(lineage) == document
    assert json.dumps(lineage.to_document(), sort_keys=True) == json.dumps(document, sort_keys=True)


@pytest.mark.parametrize("spoil", [
    lambda d: d.pop("termination"),
    lambda d: d.__setitem__("version", 99),
    lambda d: d["transitions"][3].__setitem__("parent", "0" * 64),  # the chain breaks mid-way
    lambda d: d.__setitem__("assurance", "gpu_verified"),  # contradicts the compile gate
    lambda d: d["states"][5].__setitem__("source", d["states"][5]["source"] + "// edited\n"),  # fingerprint lies
    lambda d: d["stats"].__setitem__("accepted", 1),
    lambda d: d["transitions"][-1]["forward"].__setitem__("status", "verified"),  # verified without timing
])
def test_malformed_document_is_refused_whole(spoil):
    document = dry_walk()
    spoil(document)
    before = _counts()
    with pytest.raises(ImportRefused) as refused:
        import_lineage(document, where="broken.json")
    assert "broken.json" in str(refused.value)
    assert _counts() == before  # not even the states that came before the fault


def test_not_a_document_is_refused():
    for value in (None, [], "lineage", {"version": 1}):
        with pytest.raises(ImportRefused, match="lineage"):
            import_lineage(value)
    assert _counts() == (0, 0, 0)


def _corpus_without_lineages(tmp_path):
    """The bundled corpus's problems and kernels in a folder of its own, with an empty lineages/."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for part in ("problems", "kernels", "adversarial"):
        (corpus / part).symlink_to(config.corpus_dir() / part)
    (corpus / "lineages").mkdir()
    return corpus


def _no_recorded(tmp_path):
    """An empty recorded store: the tests below look at lineages only, and reading and storing the ~1,700 recorded
    verdicts (and auditing the walks' timings against them) was most of each import's time."""
    empty = tmp_path / "recorded"
    empty.mkdir(exist_ok=True)
    return empty


def test_a_gpu_walk_without_recorded_verdicts_is_unchecked(tmp_path):
    walks = tmp_path / "walks"
    walks.mkdir()
    (walks / "row_softmax_warp_vec4.gpu.json").symlink_to(
        config.corpus_dir() / "lineages" / "row_softmax_warp_vec4.gpu.json"
    )
    empty = tmp_path / "recorded"
    empty.mkdir()
    import_corpus(corpus_root=_corpus_without_lineages(tmp_path), walks_root=walks, recorded_root=empty)
    steps = LineageStep.objects.filter(kind=LineageStep.Kind.ACCEPTED)
    assert steps.exists() and set(steps.values_list("pairing", flat=True)) == {"unchecked"}
    assert steps.first().pairing_note.startswith("no recorded timing to audit")


def test_another_corpus_folder_brings_no_walks_unless_named(tmp_path):
    corpus, recorded = _corpus_without_lineages(tmp_path), _no_recorded(tmp_path)
    import_corpus(corpus_root=corpus, recorded_root=recorded)
    assert Lineage.objects.count() == 0
    walks = config.bench_walks_dir()
    import_corpus(corpus_root=corpus, walks_root=walks, recorded_root=recorded)
    assert sorted(Lineage.objects.values_list("source_path", flat=True)) == \
        [f"bench/walks/{p.name}" for p in document_files(walks, "*.gpu.json")]


def test_a_malformed_committed_lineage_refuses_the_whole_corpus(tmp_path):
    corpus = _corpus_without_lineages(tmp_path)
    broken = dry_walk()
    broken["transitions"][0]["index"] = 5
    (corpus / "lineages" / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ImportRefused, match="broken.json"):
        import_corpus(corpus_root=corpus, recorded_root=_no_recorded(tmp_path))
    assert Lineage.objects.count() == 0 and KernelState.objects.count() == 0


def test_a_corrupt_compressed_walk_refuses_the_whole_corpus(tmp_path):
    corpus, walks = _corpus_without_lineages(tmp_path), tmp_path / "walks"
    walks.mkdir()
    (walks / "broken.gpu.json.gz").write_bytes(b"\x1f\x8b\x08 cut short")
    with pytest.raises(ImportRefused, match="broken.gpu.json.gz: not a readable gzip file"):
        import_corpus(corpus_root=corpus, walks_root=walks, recorded_root=_no_recorded(tmp_path))
    assert Lineage.objects.count() == 0 and KernelState.objects.count() == 0


def test_reviewer_group_holds_the_review_permission():
    group = Group.objects.get(name="reviewer")
    assert group.permissions.filter(codename="add_review", content_type__app_label="skills_app").exists()
    assert Permission.objects.filter(codename="add_review").count() == 1


def test_disputed_follows_the_latest_review(django_user_model):
    lineage, _ = import_lineage(dry_walk())
    step = lineage.steps.get(kind="accepted", index=2)
    user = django_user_model.objects.create_user("ada")  # a reviewer who never logs in: no password
    assert not step.disputed and step.latest_review is None
    Review.objects.create(step=step, reviewer=user, verdict="dispute", comment="the unroll changed the order")
    assert LineageStep.objects.get(pk=step.pk).disputed
    Review.objects.create(step=step, reviewer=user, verdict="confirm", comment="rechecked")
    assert not LineageStep.objects.get(pk=step.pk).disputed
