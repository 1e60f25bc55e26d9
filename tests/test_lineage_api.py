"""The API over lineages, their steps and reviews: read-only lists and details with filters,
ordering and pagination; reviews created only by reviewers."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from dashboard_data import corpus  # noqa: F401
from lineage_data import with_rejections
from skills_app.importer import import_lineage
from skills_app.models import Lineage, LineageStep, Review

pytestmark = pytest.mark.django_db


@pytest.fixture
def lineages(corpus) -> tuple[Lineage, Lineage]:
    dry = Lineage.objects.get(source_path="corpus/lineages/row_softmax_warp_vec4.dry.json")
    branched, _ = import_lineage(with_rejections())
    return dry, branched


def _get(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, (url, response.content[:500])
    return response.json()


def test_lineage_list_and_detail(client, lineages):
    dry, branched = lineages
    body = _get(client, "/api/lineages/")
    assert body["count"] == Lineage.objects.count()
    assert {dry.id, branched.id} <= {r["id"] for r in body["results"]}
    row = next(r for r in body["results"] if r["id"] == dry.id)
    assert row["assurance"] == "unverified_compile_only" and row["page"] == f"/lineages/{dry.id}/"
    assert row["expert_fingerprint"] == dry.expert_state.fingerprint and "document" not in row
    detail = _get(client, f"/api/lineages/{dry.id}/")
    assert detail["document"] == dry.document


def test_lineage_filters_and_ordering(client, lineages):
    dry, branched = lineages
    found = _get(client, "/api/lineages/?problem=row_softmax&termination=step_limit")["results"]
    assert {dry.id, branched.id} <= {r["id"] for r in found}
    assert {r["operator"] for r in found} == {"row_softmax"}
    gpu = _get(client, "/api/lineages/?assurance=gpu_verified")["results"]
    assert gpu and {r["gate_mode"] for r in gpu} == {"gpu"}  # the committed GPU walks, nothing else
    assert _get(client, "/api/lineages/?rewriter=llm")["count"] == 0
    rows = _get(client, "/api/lineages/?ordering=-rejected_count&page_size=100")["results"]
    counts = [r["rejected_count"] for r in rows]
    assert counts == sorted(counts, reverse=True)
    ordered = [r["id"] for r in rows]
    assert ordered.index(branched.id) < ordered.index(dry.id)


def test_step_list_filters_pagination_and_detail(client, lineages):
    dry, branched = lineages
    body = _get(client, f"/api/lineage-steps/?lineage={branched.id}&page_size=3")
    assert body["count"] == branched.steps.count() == branched.accepted_count + 2
    assert len(body["results"]) == 3 and body["next"]
    rejected = _get(client, f"/api/lineage-steps/?lineage={branched.id}&kind=rejected")["results"]
    assert [r["rejection_category"] for r in rejected] == ["compile_error", "audit_mismatch"]
    assert rejected[0]["child"] is None and rejected[0]["evidence"]["stage"] == "compile"
    assert _get(client, f"/api/lineage-steps/?lineage={branched.id}&category=compile_error")["count"] == 1
    # across lineages: every compile error the corpus walks met too, and nothing else
    assert _get(client, "/api/lineage-steps/?category=compile_error")["count"] == \
        LineageStep.objects.filter(rejection_category="compile_error").count() > 1
    assert _get(client, f"/api/lineage-steps/?lineage={dry.id}&transform=unroll")["count"] == \
        dry.steps.filter(transform="unroll").count() > 0
    step = dry.steps.get(kind="accepted", index=0)
    detail = _get(client, f"/api/lineage-steps/{step.id}/")
    assert detail["backward_diff"] == step.backward_diff and detail["disputed"] is False
    assert "backward_diff" not in _get(client, "/api/lineage-steps/?page_size=1")["results"][0]


def test_steps_filter_by_whether_their_timing_is_evidence(client, lineages):
    conv = Lineage.objects.get(source_path="bench/walks/conv2d_implicit_gemm_any.gpu.json.gz")
    everywhere = _get(client, "/api/lineage-steps/?pairing=exchanged&page_size=1")["count"]
    # every doubtful step re-timed: 34 here, 21 in two GEMM walks, 2 in conv2d/implicit_gemm
    assert everywhere == LineageStep.objects.filter(pairing="exchanged").count() == 57
    retimed = _get(client, f"/api/lineage-steps/?lineage={conv.id}&pairing=exchanged&page_size=100")["results"]
    assert len(retimed) == 34 and all(
        r["retimed_ratio"] > 0 and "exchanging places" in r["pairing_note"] for r in retimed
    )
    assert _get(client, "/api/lineage-steps/?pairing=biased")["count"] == 0
    conv.steps.filter(kind="accepted", index__in=[13, 14]).update(pairing="biased", pairing_note="timed apart")
    biased = _get(client, f"/api/lineage-steps/?lineage={conv.id}&pairing=biased&page_size=100")["results"]
    assert [r["index"] for r in biased] == [13, 14] and {r["pairing_note"] for r in biased} == {"timed apart"}
    response = client.get("/api/lineage-steps/?pairing=maybe")
    assert response.status_code == 400 and "pairing" in response.json()


def test_steps_are_read_only(client, lineages, django_user_model):
    step = LineageStep.objects.first()
    client.force_login(django_user_model.objects.create_user("ada"))  # no password: force_login needs none
    assert client.delete(f"/api/lineage-steps/{step.id}/").status_code in (403, 405)
    assert client.post("/api/lineages/", {}, content_type="application/json").status_code in (403, 405)


def test_review_create_is_permission_checked(client, lineages, django_user_model):
    dry, _ = lineages
    step = dry.steps.get(kind="accepted", index=1)
    payload = {"step": step.id, "verdict": "dispute", "comment": "the unroll changed the summation order"}
    assert client.post("/api/reviews/", payload, content_type="application/json").status_code in (401, 403)
    client.force_login(django_user_model.objects.create_user("eve"))
    assert client.post("/api/reviews/", payload, content_type="application/json").status_code == 403
    assert not Review.objects.exists()

    reviewer = django_user_model.objects.create_user("grace")  # logged in with force_login: no password
    reviewer.groups.add(Group.objects.get(name="reviewer"))
    client.force_login(reviewer)
    bare = client.post("/api/reviews/", {**payload, "comment": ""}, content_type="application/json")
    assert bare.status_code == 400 and "comment" in bare.json()
    response = client.post("/api/reviews/", payload, content_type="application/json")
    assert response.status_code == 201, response.content
    assert response.json()["reviewer"] == "grace" and response.json()["verdict"] == "dispute"
    assert _get(client, f"/api/lineage-steps/{step.id}/")["disputed"] is True
    assert _get(client, "/api/lineage-steps/?reviewed=true")["count"] == 1
    assert client.get("/api/reviews/").status_code == 405  # create only
