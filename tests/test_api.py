"""The read-only API: lists, details, filters, ordering, pagination, access, and its OpenAPI schema."""

from __future__ import annotations

import json

import pytest
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from dashboard_data import corpus  # noqa: F401
from skills_app.models import Kernel, KernelState, Problem, Verdict

pytestmark = pytest.mark.django_db

RESOURCES = {"problems": Problem, "kernels": Kernel, "kernel-states": KernelState, "verdicts": Verdict}


def _get(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, (url, response.content[:500])
    return response.json()


@pytest.mark.parametrize("resource", sorted(RESOURCES))
def test_lists_count_every_row(client, corpus, resource):
    body = _get(client, f"/api/{resource}/")
    assert body["count"] == RESOURCES[resource].objects.count() > 0
    assert len(body["results"]) == min(body["count"], 50)


def test_pagination(client, corpus):
    first = _get(client, "/api/kernels/?page_size=5")
    assert len(first["results"]) == 5 and first["previous"] is None
    assert "page=2" in first["next"] and "page_size=5" in first["next"]
    second = _get(client, first["next"].split("testserver", 1)[1])
    assert {k["name"] for k in first["results"]}.isdisjoint(k["name"] for k in second["results"])
    last_page = -(-first["count"] // 5)
    assert _get(client, f"/api/kernels/?page_size=5&page={last_page}")["next"] is None
    assert client.get("/api/kernels/?page=999").status_code == 404


def test_kernel_detail_by_a_name_with_slashes(client, corpus):
    body = _get(client, "/api/kernels/row_softmax/warp_vec4/")
    kernel = Kernel.objects.get(name="row_softmax/warp_vec4")
    assert body["fingerprint"] == kernel.fingerprint and body["arch"] == "sm_90"
    assert body["operator"] == "row_softmax" and body["problem"] == kernel.problem.fingerprint
    assert body["latest_verdict"]["status"] == "passed"
    assert body["states"] == [kernel.fingerprint]
    assert body["page"] == "/kernels/row_softmax/warp_vec4/"
    assert "float4" in body["description"]
    assert client.get("/api/kernels/row_softmax/nothing/").status_code == 404


def test_kernel_state_detail_is_the_engine_document(client, corpus):
    state = KernelState.objects.get(name="row_softmax_naive")
    body = _get(client, f"/api/kernel-states/{state.fingerprint}/")
    assert body["source"] == state.source and body["plan"] == state.plan
    assert body["kernel"] == "row_softmax/naive" and body["entries"] == ["row_softmax_naive"]
    listed = _get(client, "/api/kernel-states/?name=row_softmax_naive")["results"]
    assert [row["fingerprint"] for row in listed] == [state.fingerprint] and "source" not in listed[0]


def test_verdict_detail_is_the_whole_document(client, corpus):
    verdict = Verdict.objects.get(reason="race")
    body = _get(client, f"/api/verdicts/{verdict.key}/")
    assert body["document"] == verdict.document
    assert body["kernel"] == "adversarial/race_no_barrier" and body["served_from"] == "recorded"
    assert body["policy"] == verdict.policy
    assert "document" not in _get(client, "/api/verdicts/")["results"][0]


def test_problem_detail(client, corpus):
    problem = Problem.objects.get(operator="topk")
    body = _get(client, f"/api/problems/{problem.fingerprint}/")
    assert body["info"] == problem.info and body["current"] is True
    assert body["cases"] == [case["name"] for case in problem.info["cases"]]
    assert body["page"] == "/problems/topk/"


@pytest.mark.parametrize(("url", "expected"), [
    ("/api/kernels/?problem=gemm", {"gemm/mma_sync", "gemm/mma_sync_any", "gemm/naive", "gemm/wgmma_tma"}),
    ("/api/kernels/?problem=topk&status=passed", {"topk/radix_select"}),
    ("/api/kernels/?arch=sm_90a", {"gemm/wgmma_tma", "conv2d/implicit_wgmma", "fmha/flash_wgmma"}),
    ("/api/kernels/?problem=gemm&status=none", {"gemm/naive"}),
    ("/api/kernels/?problem=gemm&status=passed", {"gemm/mma_sync", "gemm/mma_sync_any", "gemm/wgmma_tma"}),
    ("/api/kernels/?arch=sm_90a&problem=topk", set()),
    ("/api/kernels/?problem=gdn", {"gdn/chunked", "gdn/chunked_mma", "gdn/recurrent"}),
    ("/api/kernels/?suite=adversarial&q=bounds", {"adversarial/read_out_of_bounds", "adversarial/write_out_of_bounds",
                                                   "adversarial/copy_out_of_bounds"}),
])
def test_kernel_filters(client, corpus, url, expected):
    assert {row["name"] for row in _get(client, url)["results"]} == expected


def test_status_none_lists_exactly_the_kernels_without_a_verdict(client, corpus):
    # Which experts have a recorded verdict of their current source changes with every GPU session,
    # so the expectation comes from the stored verdicts; kernels never gated are always in it.
    listed = {row["name"] for row in _get(client, "/api/kernels/?problem=conv2d&status=none")["results"]}
    unjudged = {k.name for k in Kernel.objects.filter(operator="conv2d")
                if not Verdict.objects.filter(state=k.current_state).exists()}
    assert listed == unjudged and "conv2d/direct" in listed
    # their GPU walks' verdicts are recorded
    assert not {"conv2d/implicit_gemm", "conv2d/implicit_gemm_any"} & listed


def test_verdict_filters(client, corpus):
    race = _get(client, "/api/verdicts/?status=rejected&reason=race")["results"]
    assert {row["key"] for row in race} == set(Verdict.objects.filter(reason="race").values_list("key", flat=True))
    by_kernel = _get(client, "/api/verdicts/?kernel=row_softmax/warp_vec4")["results"]
    assert by_kernel and {row["kernel"] for row in by_kernel} == {"row_softmax/warp_vec4"}
    # By state name: the bundled kernel's verdicts and those of the states its walks reached (same name).
    by_name = _get(client, "/api/verdicts/?kernel=row_softmax_warp_vec4&page_size=500")["results"]
    assert {row["key"] for row in by_name} > {row["key"] for row in by_kernel}
    assert _get(client, "/api/verdicts/?created_after=2100-01-01T00:00:00Z")["count"] == 0
    for gpu, query in (("NVIDIA H200", "NVIDIA%20H200"), ("none", "none")):  # "none": compile-only verdicts
        assert _get(client, f"/api/verdicts/?gpu={query}")["count"] == Verdict.objects.filter(gpu=gpu).count() > 0
    assert client.get("/api/verdicts/?status=sideways").status_code == 400


def test_problem_and_state_filters(client, corpus):
    current = _get(client, "/api/problems/?current=true")["results"]
    assert {row["operator"] for row in current} == set(
        Problem.objects.filter(current=True).values_list("operator", flat=True))
    page = _get(client, "/api/kernel-states/?operator=gemm&arch=sm_90&page_size=500")
    assert page["count"] <= 500, "the walks' states outgrew one page: filter further"
    # States a walk reached belong to no bundled kernel (kernel null); the bundled ones are all there.
    kernels = {row["kernel"] for row in page["results"]} - {None}
    assert kernels == {"gemm/mma_sync", "gemm/mma_sync_any", "gemm/naive"}


def test_ordering(client, corpus):
    names = [row["name"] for row in _get(client, "/api/kernels/?ordering=-name&page_size=100")["results"]]
    assert names == sorted(names, reverse=True)
    created = [row["created"] for row in _get(client, "/api/verdicts/?ordering=created&page_size=100")["results"]]
    assert created == sorted(created)
    newest = [row["created"] for row in _get(client, "/api/verdicts/?page_size=100")["results"]]
    assert newest == sorted(newest, reverse=True)  # the default: newest first
    # A field not offered for ordering is ignored rather than leaking internals.
    plain = [
        row["name"] for row in _get(client, "/api/kernels/?ordering=current_state__source&page_size=100")["results"]
    ]
    assert plain == [row["name"] for row in _get(client, "/api/kernels/?page_size=100")["results"]]


def test_read_only(client, corpus, django_user_model):
    assert client.post("/api/kernels/", {"name": "x"}).status_code in (401, 403)
    client.force_login(django_user_model.objects.create_user("ada"))  # no password: force_login needs none
    assert client.post("/api/kernels/", {"name": "x"}, content_type="application/json").status_code in (403, 405)
    key = Verdict.objects.values_list("key", flat=True).first()
    assert client.delete(f"/api/verdicts/{key}/").status_code in (403, 405)
    assert Verdict.objects.filter(key=key).exists()


def test_read_closed_needs_sign_in(client, corpus, settings, django_user_model):
    settings.KLINEAGE_READ_OPEN = False
    assert client.get("/api/kernels/").status_code == 403
    assert client.get("/api/verdicts/").status_code == 403
    client.force_login(django_user_model.objects.create_user("ada"))  # no password: force_login needs none
    assert client.get("/api/kernels/").status_code == 200


def _schema() -> dict:
    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(json.dumps(schema))  # plain JSON types, as served


def test_schema_is_valid_openapi_3_with_every_path():
    schema = _schema()
    assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache, dict(GENERATOR_STATS._warn_cache)
    validate_schema(schema)  # drf-spectacular's bundled OpenAPI 3 JSON schema
    assert schema["openapi"].startswith("3.")
    for path in ("/api/problems/", "/api/problems/{fingerprint}/", "/api/kernels/", "/api/kernels/{name}/",
                 "/api/kernel-states/", "/api/kernel-states/{fingerprint}/", "/api/verdicts/",
                 "/api/verdicts/{key}/"):
        assert path in schema["paths"], path
        assert set(schema["paths"][path]) == {"get", "parameters"} or set(schema["paths"][path]) == {"get"}
    kernel_list = schema["paths"]["/api/kernels/"]["get"]
    parameters = {p["name"] for p in kernel_list["parameters"]}
    assert {"problem", "status", "arch", "ordering", "page", "page_size"} <= parameters
    status = next(p for p in kernel_list["parameters"] if p["name"] == "status")
    assert set(status["schema"]["enum"]) == {"passed", "compiled", "rejected", "error", "none"}
    for path in ("/api/lineages/", "/api/lineages/{id}/", "/api/lineage-steps/", "/api/lineage-steps/{id}/"):
        assert path in schema["paths"], path
        assert set(schema["paths"][path]) - {"parameters"} == {"get"}, path  # read-only
    assert set(schema["paths"]["/api/reviews/"]) - {"parameters"} == {"post"}  # reviews: create only
    lineage_list = {p["name"] for p in schema["paths"]["/api/lineages/"]["get"]["parameters"]}
    assert {"problem", "termination", "rewriter", "assurance", "ordering", "page", "page_size"} <= lineage_list
    step_list = {p["name"] for p in schema["paths"]["/api/lineage-steps/"]["get"]["parameters"]}
    assert {"lineage", "kind", "transform", "forward_status", "category", "reviewed", "ordering"} <= step_list
    review = schema["components"]["schemas"]["ReviewRequest"]["properties"]
    assert set(review) == {"step", "verdict", "comment"}


def test_schema_passes_openapi_spec_validator():
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator is a dev dependency")
    validator.validate(_schema())


def test_schema_endpoint_serves_it(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/verdicts/{key}/" in response.json()["paths"]
