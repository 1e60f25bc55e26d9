"""Who may submit walks and optimizations, on the /optimize/ page and through POST /api/jobs/:
anonymous visitors and plain viewers are refused, operators (the "operator" group) and superusers
pass; CSRF is enforced; a refused submission says why next to the form and queues nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from accounts import logged_in, make_user
from gate_app.apps import OPERATOR_GROUP
from gate_app.models import Job

pytestmark = pytest.mark.django_db

WALK = {"action": "walk", "walk-kernel": "row_softmax/warp_vec4", "walk-problem": "", "walk-rewriter": "rules",
        "walk-mode": "compile", "walk-max_steps": "3", "walk-max_rejections": "2"}
OPTIMIZE = {
    "action": "optimize",
    "optimize-kernel": "row_softmax/naive",
    "optimize-problem": "",
    "optimize-strategy": "library",
    "optimize-rewriter": "rules",
    "optimize-statuses": ["admitted", "candidate"],
    "optimize-scope": "all",
    "optimize-budget": "8",
    "optimize-mode": "compile",
    "optimize-seed": "0",
}


def _operator(name: str = "olga") -> User:
    return make_user(name, operator=True)


def test_the_operator_group_holds_the_submit_permission():
    group = Group.objects.get(name=OPERATOR_GROUP)
    assert [p.codename for p in group.permissions.all()] == ["add_job"]
    assert _operator().has_perm("gate_app.add_job")
    assert not User.objects.create_user("vic").has_perm("gate_app.add_job")


def test_anonymous_visitors_are_sent_to_log_in_and_queue_nothing(client):
    page = client.get("/optimize/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/?next=/optimize/")
    assert client.post("/optimize/", WALK).status_code == 302
    assert client.post("/api/jobs/", {"kind": "walk", "params": {"kernel": "row_softmax/warp_vec4"}},
                       content_type="application/json").status_code in (401, 403)
    assert not Job.objects.exists()


def test_viewers_are_refused(client):
    viewer = logged_in(User.objects.create_user("vic"))
    assert viewer.get("/optimize/").status_code == 403
    assert viewer.post("/optimize/", WALK).status_code == 403
    refused = viewer.post("/api/jobs/", {"kind": "walk", "params": {"kernel": "row_softmax/warp_vec4"}},
                          content_type="application/json")
    assert refused.status_code == 403 and "operator group" in refused.json()["detail"]
    assert not Job.objects.exists()
    assert b">Optimize</a>" not in viewer.get("/jobs/").content  # no nav link to a page they cannot use


def test_an_operator_sees_both_forms_and_the_nav_link():
    page = logged_in(_operator()).get("/optimize/?kernel=row_softmax/warp_vec4")
    assert page.status_code == 200
    text = page.content.decode()
    assert ">Optimize</a>" in text and 'aria-current="page">Optimize' in text
    assert "Optimize a kernel" in text and "Walk an expert kernel backward" in text and "Gate a kernel" in text
    assert '<option value="row_softmax/warp_vec4" selected>' in text  # ?kernel= preselects
    assert 'value="llm"' not in text  # no model configured here: the LLM rewriter is not offered
    assert "GPU jobs you have queued or running" in text
    assert 'href="/optimize/">Optimize or walk a kernel' in logged_in(_operator("otto")).get("/jobs/").content.decode()


def test_an_operator_queues_a_walk_and_lands_on_its_page():
    operator = _operator()
    response = logged_in(operator).post("/optimize/", WALK)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.kind, job.owner, job.needs, job.status) == ("walk", operator, "cpu", "queued")
    assert job.params == {"problem": "row_softmax", "kernel": "row_softmax/warp_vec4", "rewriter": "rules",
                          "mode": "compile", "max_steps": 3, "max_rejections": 2}


def test_an_operator_queues_an_optimization():
    response = logged_in(_operator()).post("/optimize/", OPTIMIZE)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.kind == "optimize" and job.needs == "cpu"
    assert job.params == {"problem": "row_softmax", "kernel": "row_softmax/naive", "rewriter": "rules",
                          "strategy": "library", "statuses": ["admitted", "candidate"], "scope": "all", "budget": 8,
                          "mode": "compile", "seed": 0, "time_limit_s": None}


def test_an_optimization_may_carry_a_time_limit_in_minutes():
    operator = _operator()
    client = logged_in(operator)
    client.post("/optimize/", {**OPTIMIZE, "optimize-time_limit_min": "5"})
    job = Job.objects.get()
    assert job.params["time_limit_s"] == 300
    assert "library strategy, budget 8, time limit 300 s" in client.get(f"/jobs/{job.pk}/").content.decode()
    refused = logged_in(operator).post("/optimize/", {**OPTIMIZE, "optimize-time_limit_min": "0"})
    assert refused.status_code == 400 and Job.objects.count() == 1


def test_an_operator_queues_a_gate_run_against_a_baseline():
    operator = _operator()
    gate = {"action": "gate", "gate-kernel": "row_softmax/warp_vec4", "gate-problem": "",
            "gate-against": "row_softmax/naive", "gate-mode": "gpu"}
    response = logged_in(operator).post("/optimize/", gate)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert (job.kind, job.owner, job.needs) == ("gate", operator, "gpu")
    assert job.params == {"problem": "row_softmax", "kernel": "row_softmax/warp_vec4", "against": "row_softmax/naive",
                          "mode": "gpu"}
    refused = logged_in(operator).post("/optimize/", {**gate, "gate-mode": "sideways"})
    assert refused.status_code == 400 and Job.objects.count() == 1
    assert "sideways is not one of the available choices" in refused.content.decode()


def test_a_superuser_passes_without_the_group():
    admin = User.objects.create_superuser("root", password="pw-root-1")
    assert logged_in(admin).post("/optimize/", {**WALK, "walk-mode": "gpu"}).status_code == 302
    assert Job.objects.get().needs == "gpu"


@pytest.mark.parametrize("change, message", [
    ({"walk-kernel": "adversarial/hang"}, "Select a valid choice"),
    ({"walk-problem": "gemm"}, None),  # a problem that is not the kernel's is allowed (the gate judges it)
    ({"walk-rewriter": "llm"}, "Select a valid choice"),
    ({"walk-max_steps": "0"}, "greater than or equal to 1"),
    ({"walk-mode": "fast"}, "Select a valid choice"),
])
def test_form_errors_are_shown_and_queue_nothing(change, message):
    response = logged_in(_operator()).post("/optimize/", {**WALK, **change})
    if message is None:
        assert response.status_code == 302
        return
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Job.objects.exists()


def test_an_engine_refusal_is_shown_against_the_form():
    """The rule rewriter has no forward plan without cards: the strategy is refused by name."""
    response = logged_in(_operator()).post("/optimize/", {**OPTIMIZE, "optimize-strategy": "no_library"})
    assert response.status_code == 400
    errors = response.content.decode().split('data-errors="optimize"')[1].split("</div>")[0]
    assert "no_library strategy needs the LLM rewriter" in errors
    assert not Job.objects.exists()


def test_csrf_is_enforced():
    strict = logged_in(_operator(), enforce_csrf_checks=True)
    assert strict.post("/optimize/", WALK).status_code == 403
    page = strict.get("/optimize/")
    token = page.cookies["csrftoken"].value
    assert strict.post("/optimize/", {**WALK, "csrfmiddlewaretoken": token}).status_code == 302
    # the API under a session needs the token too
    assert strict.post("/api/jobs/", {"kind": "walk", "params": {"kernel": "row_softmax/warp_vec4"}},
                       content_type="application/json").status_code == 403
    assert Job.objects.count() == 1


def test_the_api_queues_checked_jobs():
    operator = _operator()
    api = logged_in(operator)
    created = api.post("/api/jobs/", {"kind": "optimize", "params": {"kernel": "row_softmax/naive", "mode": "compile",
                                                                       "budget": 4}},
                       content_type="application/json")
    assert created.status_code == 201, created.content
    body = created.json()
    job = Job.objects.get(pk=body["id"])
    assert body["url"] == f"/jobs/{job.pk}/" and body["status"] == "queued" and body["needs"] == "cpu"
    assert job.owner == operator and job.params["budget"] == 4 and job.params["statuses"] == ["admitted"]

    for params, message in [({"kernel": "nope/none"}, "no bundled kernel"),
                            ({"kernel": "row_softmax/naive", "budget": 1}, "budget must be a whole number from 2"),
                            ({"kernel": "row_softmax/naive", "colour": "red"}, "unknown: colour"),
                            ({"problem": "row_softmax"}, "needs kernel")]:
        refused = api.post("/api/jobs/", {"kind": "optimize", "params": params}, content_type="application/json")
        assert refused.status_code == 400 and message in str(refused.json()["params"]), refused.json()
    wrong_kind = api.post("/api/jobs/", {"kind": "gate", "params": {"kernel": "row_softmax/naive"}},
                          content_type="application/json")
    assert wrong_kind.status_code == 400 and "optimize, walk" in str(wrong_kind.json()["kind"])
    assert Job.objects.count() == 1


def test_the_llm_rewriter_is_offered_only_where_a_model_is_configured(monkeypatch):
    monkeypatch.setenv("KLINEAGE_LLM_MODEL", "local-model")
    client = logged_in(_operator())
    assert 'value="llm"' in client.get("/optimize/").content.decode()
    assert client.post("/optimize/", {**WALK, "walk-rewriter": "llm"}).status_code == 302
    assert Job.objects.get().params["rewriter"] == "llm"
    # no_library needs the model: with one configured it is accepted
    assert client.post("/optimize/", {**OPTIMIZE, "optimize-rewriter": "llm",
                                      "optimize-strategy": "no_library"}).status_code == 302
