"""POST /api/uploads/ (operators; multipart), the /upload/ page's uploads for scripts, through the same
checks and storage (gate_app.uploads): who may upload, CSRF under a session and none under a token,
what an accepted upload stores and queues (the probe job the page queues, a CPU job outside the GPU
job quota), the uploaded problem never imported by the web process, every bad input refused with 400
and a message and nothing stored; GET /api/uploads/ listing, filtering and ordering uploads; and the
endpoint in the OpenAPI schema. Real SQLite, the real engine, no mocks."""

from __future__ import annotations

import json
import sys

import pytest
from django.contrib.auth.models import Group, User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.authtoken.models import Token

import test_uploads
from accounts import logged_in, make_user
from gate_app import queue, submit
from gate_app.models import Job
from gate_app.uploads import LIMITS, record_probe
from skills_app.apps import REVIEWER_GROUP
from skills_app.models import Kernel, KernelState, Problem
from test_uploads import BINARY, PROBLEM, SOURCE, _stored_nothing, files, plan

pytestmark = pytest.mark.django_db

URL = "/api/uploads/"


# The upload page's fixtures, the same here: a data dir of the test's own (autouse) and an operator.
data_dir = test_uploads.data_dir
operator = test_uploads.operator


def _refusal(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"detail", "findings"}, body
    return body


# Who may upload ------------------------------------------------------------------------------------


def test_anonymous_visitors_viewers_and_reviewers_are_refused(client, data_dir):
    assert client.post(URL, files(PROBLEM)).status_code in (401, 403)
    viewer = logged_in(make_user("vic"))
    refused = viewer.post(URL, files(PROBLEM))
    assert refused.status_code == 403 and "operator group" in refused.json()["detail"]
    reviewer = make_user("rita")
    reviewer.groups.add(Group.objects.get(name=REVIEWER_GROUP))
    assert logged_in(reviewer).post(URL, files(PROBLEM)).status_code == 403
    _stored_nothing(data_dir)


def test_a_superuser_passes_without_the_group():
    admin = logged_in(User.objects.create_superuser("root", password="pw-root-1"))
    assert admin.post(URL, files(PROBLEM)).status_code == 201
    assert Problem.objects.get().upload_name == "uploaded/softmax_copy"


def test_csrf_is_enforced_under_a_session(data_dir):
    strict = logged_in(make_user("olga", operator=True), enforce_csrf_checks=True)
    refused = strict.post(URL, files(PROBLEM))
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    _stored_nothing(data_dir)
    token = strict.get("/upload/").cookies["csrftoken"].value
    assert strict.post(URL, files(PROBLEM), HTTP_X_CSRFTOKEN=token).status_code == 201
    # the form's hidden field is accepted too
    again = strict.post(URL, {**files(source=SOURCE, launch=plan()), "csrfmiddlewaretoken": token})
    assert again.status_code == 201, again.content


def test_a_token_needs_no_csrf_and_must_be_an_operators(data_dir):
    operator, viewer = make_user("olga", operator=True), make_user("vic")
    strict = Client(enforce_csrf_checks=True)
    assert strict.post(URL, files(PROBLEM), HTTP_AUTHORIZATION="Token not-a-token").status_code in (401, 403)
    viewer_key = Token.objects.create(user=viewer).key
    assert strict.post(URL, files(PROBLEM), HTTP_AUTHORIZATION=f"Token {viewer_key}").status_code == 403
    _stored_nothing(data_dir)
    key = Token.objects.create(user=operator).key
    created = strict.post(URL, files(PROBLEM), HTTP_AUTHORIZATION=f"Token {key}")
    assert created.status_code == 201, created.content
    assert Job.objects.get().owner == operator


def test_the_uploader_is_the_requests_user_and_no_field_names_another(operator, data_dir):
    nina = make_user("nina", operator=True)
    for field in ("uploaded_by", "uploaded_by_id"):  # a client-sent uploader is refused, nothing stored
        body = _refusal(operator.post(URL, {**files(PROBLEM, SOURCE, plan()), field: "nina"}))
        assert body["detail"].startswith(f"unknown field(s): {field};"), body
    _stored_nothing(data_dir)

    answered = operator.post(URL, files(PROBLEM, SOURCE, plan())).json()
    olga = User.objects.get(username="olga")
    assert Problem.objects.get().uploaded_by == olga and Kernel.objects.get().uploaded_by == olga
    assert answered["problem"]["uploaded_by"] == "olga" and answered["kernel"]["uploaded_by"] == "olga"
    # The same content again, from another operator's token: nothing new, the first uploader stays.
    key = Token.objects.create(user=nina).key
    again = Client(enforce_csrf_checks=True).post(
        URL, files(PROBLEM, SOURCE, plan()), HTTP_AUTHORIZATION=f"Token {key}"
    )
    assert again.status_code == 200 and again.json()["kernel"]["uploaded_by"] == "olga"
    second = Client().post(URL, files(source=SOURCE, launch=plan("second")), HTTP_AUTHORIZATION=f"Token {key}")
    assert second.json()["kernel"]["uploaded_by"] == "nina"
    assert Kernel.objects.get(name="uploaded/second").uploaded_by == nina


def test_listing_follows_read_access(client, operator, settings):
    operator.post(URL, files(PROBLEM))
    assert client.get(URL).json()["count"] == 1  # KLINEAGE_READ_OPEN is on in the tests
    settings.KLINEAGE_READ_OPEN = False
    assert client.get(URL).status_code == 403
    assert logged_in(make_user("vic")).get(URL).json()["count"] == 1


# What an accepted upload stores ----------------------------------------------------------------------


def test_a_problem_is_stored_and_its_probe_job_queued_as_the_page_does(operator, data_dir):
    response = operator.post(URL, files(PROBLEM))
    assert response.status_code == 201, response.content
    body = response.json()
    problem, job = Problem.objects.get(), Job.objects.get()
    assert (problem.upload_name, problem.probe, problem.info) == ("uploaded/softmax_copy", "pending", {})
    stored = data_dir / problem.path
    assert stored == data_dir / "uploads" / "problems" / problem.fingerprint / "softmax_copy.py"
    assert stored.read_bytes() == PROBLEM
    assert (job.kind, job.needs, job.params, job.owner.username) == ("probe", "cpu",
                                                                     {"problem": "uploaded/softmax_copy"}, "olga")
    assert body["probe_job"] == {"id": job.pk, "status": "queued", "needs": "cpu", "url": f"/jobs/{job.pk}/"}
    row = body["problem"]
    assert row["kind"] == "problem" and row["name"] == "uploaded/softmax_copy"
    assert row["fingerprint"] == problem.fingerprint and row["probe"] == "pending" and row["probe_job"] == job.pk
    assert row["url"] == f"/api/problems/{problem.fingerprint}/" and row["page"] is None
    assert operator.get(row["url"]).json()["upload_name"] == "uploaded/softmax_copy"
    assert body["kernel"] is None and body["unchanged"] == []
    assert body["messages"] == [f"Problem uploaded/softmax_copy stored; its probe: waiting for its probe "
                                f"(job #{job.pk})."]

    again = operator.post(URL, files(PROBLEM))  # the same content: nothing new, the same job
    assert again.status_code == 200
    assert again.json()["unchanged"] == ["uploaded/softmax_copy"] and again.json()["probe_job"]["id"] == job.pk
    assert Problem.objects.count() == 1 and Job.objects.count() == 1

    queue.cancel(job)  # a cancelled probe is queued again, as by the page
    requeued = operator.post(URL, files(PROBLEM)).json()["probe_job"]["id"]
    assert requeued != job.pk and Job.objects.get(pk=requeued).status == "queued"


def test_a_problem_and_a_kernel_naming_it(operator, data_dir):
    response = operator.post(URL, files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    assert response.status_code == 201, response.content
    body = response.json()
    kernel = Kernel.objects.get()
    state = kernel.current_state
    assert (kernel.name, kernel.origin, kernel.operator, kernel.problem) == (
        "uploaded/my_softmax", "uploaded", "uploaded/softmax_copy", Problem.objects.get())
    folder = data_dir / "uploads" / "kernels" / state.fingerprint
    assert (folder / "kernel.cu").read_bytes() == SOURCE
    assert (folder / "launch.toml").read_bytes() == plan(problem="uploaded/softmax_copy")
    row = body["kernel"]
    assert (row["kind"], row["name"], row["fingerprint"], row["problem"]) == (
        "kernel", "uploaded/my_softmax", state.fingerprint, "uploaded/softmax_copy")
    assert (row["probe"], row["probe_job"]) == (None, None)
    assert row["url"] == "/api/kernels/uploaded/my_softmax/" and row["page"] == "/kernels/uploaded/my_softmax/"
    assert operator.get(row["url"]).json()["origin"] == "uploaded"
    assert body["problem"]["name"] == "uploaded/softmax_copy"
    assert body["probe_job"]["id"] == Job.objects.get().pk  # only the problem is probed
    assert "Kernel uploaded/my_softmax passed the static check and is stored." in body["messages"]
    # usable by jobs right away, as from the page
    assert submit.walk_params("uploaded/my_softmax", mode="compile")["problem"] == "uploaded/softmax_copy"


def test_a_kernel_alone_queues_nothing(operator):
    response = operator.post(URL, files(source=SOURCE, launch=plan()))
    assert response.status_code == 201
    body = response.json()
    assert body["problem"] is None and body["probe_job"] is None and body["kernel"]["problem"] == "row_softmax"
    assert not Job.objects.exists()
    again = operator.post(URL, files(source=SOURCE, launch=plan()))
    assert again.status_code == 200 and again.json()["unchanged"] == ["uploaded/my_softmax"]
    assert Kernel.objects.count() == 1 and KernelState.objects.count() == 1


def test_the_probe_is_a_cpu_job_outside_the_gpu_quota(operator, settings):
    """The page queues the probe without the quota (it needs no GPU); so does the API."""
    settings.KLINEAGE_GPU_JOB_QUOTA = 1
    owner = User.objects.get(username="olga")
    queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "gpu"}, owner=owner,
                  needs="gpu")
    assert submit.gpu_jobs_held(owner) == 1
    response = operator.post(URL, files(PROBLEM))
    assert response.status_code == 201 and response.json()["probe_job"]["needs"] == "cpu"
    assert submit.gpu_jobs_held(owner) == 1


def test_the_web_process_never_imports_the_uploaded_problem(operator, tmp_path):
    marker = tmp_path / "imported"
    text = (f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
            "raise SystemExit('this file ran in the web process')\n").encode()
    response = operator.post(URL, files(text, problem_name="side_effect.py"))
    assert response.status_code == 201, response.content
    assert not marker.exists()
    assert not [name for name, module in list(sys.modules.items())
                if "side_effect" in name or "side_effect" in str(getattr(module, "__file__", "") or "")]
    assert Problem.objects.get().probe == "pending"  # its sandboxed probe job is what reads it


# Bad input: 400, a message, and nothing stored -------------------------------------------------------


CHEAT = b"#include <cublas_v2.h>\n" + SOURCE


@pytest.mark.parametrize("chosen, message", [
    ({}, "choose a problem file, or a kernel"),
    (files(source=SOURCE), "a kernel needs both files"),
    (files(launch=plan()), "a kernel needs both files"),
    # names
    (files(PROBLEM, problem_name="softmax.txt"), "the problem file must be a .py file, not 'softmax.txt'"),
    (files(PROBLEM, problem_name="soft max.py"), "name 'soft max' must be 1 to 64 letters"),
    (files(PROBLEM, problem_name="-x.py"), "name '-x' must be 1 to 64 letters"),
    (files(source=SOURCE, launch=plan(name="a/b")), "name 'a/b' must be 1 to 64"),
    (files(source=SOURCE, launch=plan(), source_name="softmax.cu"), "names its source 'kernel.cu'"),
    (files(source=SOURCE, launch=plan(), plan_name="launch.txt"), "must be a .toml file"),
    # sizes and encodings
    (files(b"x = 1\n" * 50_000), "is 300000 bytes; the limit is 262144"),
    (files(source=SOURCE, launch=plan(extra="#" * 70_000 + "\n")), "the limit is 65536"),
    (files(BINARY), "is a binary file (it holds NUL bytes)"),
    (files(b"caf\xe9 = 1\n"), "is not UTF-8 text (byte 3)"),
    (files(b" \n\n"), "is empty"),
    (files(source=BINARY, launch=plan()), "the kernel source 'kernel.cu' is a binary file"),
    # the launch plan
    (files(source=SOURCE, launch=b"name = 'x\n[[launch]"), "launch.toml: not valid TOML"),
    (files(source=SOURCE, launch=plan(extra='colour = "red"\n')), "unknown keys ['colour']"),
    (files(source=SOURCE, launch=plan(problem="nope")), "names problem 'nope', which is neither a bundled"),
    (files(source=SOURCE, launch=plan(problem="uploaded/nope")), "names problem 'uploaded/nope'"),
    # one bad file refuses the whole upload: the good problem beside it is not stored either
    (files(PROBLEM, SOURCE, plan(problem="uploaded/other")), "names problem 'uploaded/other'"),
    (files(PROBLEM, CHEAT, plan()), "the gate's static check refused uploaded/my_softmax: nothing was stored"),
    # what the API's fields take
    ({**files(PROBLEM), "kernel": SimpleUploadedFile("kernel.cu", SOURCE)},
     "unknown field(s): kernel; an upload's fields are problem, source, plan"),
    ({"problem": "x = 1\n"}, "the problem file: The submitted data was not a file"),
    (files(b"", problem_name="empty.py"), "the problem file: The submitted file is empty."),
])
def test_bad_input_is_refused_with_a_message_and_stores_nothing(operator, data_dir, chosen, message):
    body = _refusal(operator.post(URL, chosen))
    assert message in body["detail"], body
    _stored_nothing(data_dir)


def test_a_kernel_the_static_check_refuses_is_stored_nowhere_with_its_findings(operator, data_dir):
    body = _refusal(operator.post(URL, files(source=CHEAT, launch=plan())))
    assert body["detail"] == "the gate's static check refused uploaded/my_softmax: nothing was stored"
    rules = {(finding["rule"], finding["line"]) for finding in body["findings"]}
    assert ("include", 1) in rules and "cublas_v2.h" in body["findings"][0]["message"]
    wrong_entry = plan().replace(b'entry = "row_softmax_naive"', b'entry = "softmax_rows"')
    body = _refusal(operator.post(URL, files(source=SOURCE, launch=wrong_entry)))
    assert [finding["rule"] for finding in body["findings"]] == ["plan_entry"]
    _stored_nothing(data_dir)


def test_an_oversize_file_is_refused_before_it_is_read_and_an_oversize_body_before_it_is_parsed(operator, data_dir):
    from klineage_web.body_limit import largest_body

    largest = max(LIMITS.values())
    assert f"is 600000 bytes; the limit is {largest}" in _refusal(operator.post(URL, files(b"#" * 600_000)))["detail"]
    too_big = operator.post(URL, files(b"#" * (largest_body() + 1)))
    assert too_big.status_code == 413
    assert f"the most any page here accepts is {largest_body()} bytes" in too_big.content.decode()
    _stored_nothing(data_dir)


def test_only_multipart_is_accepted(operator, data_dir):
    response = operator.post(URL, json.dumps({"problem": PROBLEM.decode()}), content_type="application/json")
    assert response.status_code == 415
    _stored_nothing(data_dir)


def test_duplicate_names_and_contents_are_refused(operator):
    assert operator.post(URL, files(PROBLEM, SOURCE, plan())).status_code == 201
    for chosen, message in [
        (files(PROBLEM + b"\n# another version\n"),
         "an uploaded problem named uploaded/softmax_copy already exists with other content"),
        (files(PROBLEM + b"\n\n", problem_name="again.py"), "has the same content as uploaded/softmax_copy"),
        (files(source=SOURCE + b"\n// tuned\n", launch=plan()),
         "an uploaded kernel named uploaded/my_softmax already exists with other content"),
    ]:
        assert message in _refusal(operator.post(URL, chosen))["detail"]
    assert Problem.objects.count() == 1 and Kernel.objects.count() == 1 and Job.objects.count() == 1


def test_a_kernel_naming_a_problem_its_probe_refused(operator):
    operator.post(URL, files(PROBLEM))
    record_probe("uploaded/softmax_copy", None, "raised ValueError while loading: no")
    body = _refusal(operator.post(URL, files(source=SOURCE, launch=plan(problem="uploaded/softmax_copy"))))
    assert "which its probe refused: raised ValueError while loading: no" in body["detail"]
    assert not Kernel.objects.exists()


# Listing -------------------------------------------------------------------------------------------


def _names(client, query: str = "") -> list[str]:
    response = client.get(URL + query)
    assert response.status_code == 200, response.content
    return [f"{row['kind']}:{row['name']}" for row in response.json()["results"]]


def test_listing_filters_and_orders_uploads(operator):
    operator.post(URL, files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    operator.post(URL, files(source=SOURCE, launch=plan("second")))
    operator.post(URL, files(b"OPERATOR = 'x'\n", problem_name="broken.py"))
    record_probe("uploaded/broken", None, "raised NameError while loading")

    body = operator.get(URL).json()
    assert body["count"] == 4
    assert _names(operator) == ["problem:uploaded/broken", "kernel:uploaded/second", "kernel:uploaded/my_softmax",
                                "problem:uploaded/softmax_copy"]  # newest first
    broken = body["results"][0]
    assert broken["probe"] == "refused" and broken["probe_error"] == "raised NameError while loading"
    assert broken["probe_job"] == Job.objects.get(params__problem="uploaded/broken").pk

    assert _names(operator, "?kind=kernel") == ["kernel:uploaded/second", "kernel:uploaded/my_softmax"]
    assert _names(operator, "?problem=uploaded/softmax_copy") == ["kernel:uploaded/my_softmax",
                                                                 "problem:uploaded/softmax_copy"]
    assert _names(operator, "?problem=row_softmax") == ["kernel:uploaded/second"]
    assert _names(operator, "?probe=pending") == ["problem:uploaded/softmax_copy"]
    assert _names(operator, "?probe=refused&kind=kernel") == []
    assert _names(operator, "?q=SOFT") == ["kernel:uploaded/my_softmax", "problem:uploaded/softmax_copy"]
    assert _names(operator, "?name=uploaded/second") == ["kernel:uploaded/second"]
    assert _names(operator, "?ordering=name") == ["problem:uploaded/broken", "kernel:uploaded/my_softmax",
                                                  "kernel:uploaded/second", "problem:uploaded/softmax_copy"]
    assert _names(operator, "?ordering=-kind,name") == ["problem:uploaded/broken", "problem:uploaded/softmax_copy",
                                                        "kernel:uploaded/my_softmax", "kernel:uploaded/second"]
    assert _names(operator, "?ordering=uploaded_at") == list(reversed(_names(operator)))

    first = operator.get(URL + "?page_size=3").json()
    assert len(first["results"]) == 3 and "page=2" in first["next"]
    assert len(operator.get(URL + "?page_size=3&page=2").json()["results"]) == 1

    for query, field, message in [("?kind=card", "kind", "not a valid choice"),
                                  ("?probe=maybe", "probe", "not a valid choice"),
                                  ("?ordering=size", "ordering", "unknown: size")]:
        refused = operator.get(URL + query)
        assert refused.status_code == 400 and message in str(refused.json()[field]), refused.json()


def test_a_listed_row_is_what_the_upload_answered(operator):
    answered = operator.post(URL, files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy"))).json()
    listed = {row["name"]: row for row in operator.get(URL).json()["results"]}
    assert listed["uploaded/softmax_copy"] == answered["problem"]
    assert listed["uploaded/my_softmax"] == answered["kernel"]


def test_listing_filters_and_orders_by_uploader(operator):
    operator.post(URL, files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    nina = make_user("nina", operator=True)
    logged_in(nina).post(URL, files(source=SOURCE, launch=plan("second")))
    logged_in(nina).post(URL, files(b"OPERATOR = 'x'\n", problem_name="broken.py"))
    Kernel.objects.filter(name="uploaded/my_softmax").update(
        uploaded_by=None
    )  # uploaded before uploaders were recorded

    listed = {row["name"]: row["uploaded_by"] for row in operator.get(URL).json()["results"]}
    assert listed == {"uploaded/softmax_copy": "olga", "uploaded/my_softmax": None, "uploaded/second": "nina",
                      "uploaded/broken": "nina"}
    assert _names(operator, "?uploaded_by=olga") == ["problem:uploaded/softmax_copy"]
    assert _names(operator, "?uploaded_by=nina") == ["problem:uploaded/broken", "kernel:uploaded/second"]
    assert _names(operator, "?uploaded_by=nina&kind=kernel") == ["kernel:uploaded/second"]
    assert _names(operator, "?uploaded_by=nobody") == []
    assert _names(operator, "?uploaded_by=NINA") == []  # usernames are matched exactly
    ordered = operator.get(URL + "?ordering=uploaded_by,name").json()["results"]
    by_uploader = [row["uploaded_by"] for row in ordered]
    assert by_uploader in (["nina", "nina", "olga", None], [None, "nina", "nina", "olga"])  # nulls: the database's
    nina.delete()  # the uploads stay, their uploader is forgotten
    assert _names(operator, "?uploaded_by=nina") == []
    assert operator.get(URL + "?name=uploaded/second").json()["results"][0]["uploaded_by"] is None


# The OpenAPI schema ----------------------------------------------------------------------------------


def test_the_schema_describes_the_endpoint():
    GENERATOR_STATS.reset()
    schema = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True)))
    assert not GENERATOR_STATS._warn_cache and not GENERATOR_STATS._error_cache, dict(GENERATOR_STATS._warn_cache)
    validate_schema(schema)
    operations = schema["paths"][URL]
    assert set(operations) - {"parameters"} == {"get", "post"}
    body = operations["post"]["requestBody"]["content"]
    assert list(body) == ["multipart/form-data"]
    request = schema["components"]["schemas"][body["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
    assert {name: field["format"] for name, field in request["properties"].items()} == {
        "problem": "binary", "source": "binary", "plan": "binary"}
    assert {"200", "201", "400"} <= set(operations["post"]["responses"])
    refusal = operations["post"]["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert set(schema["components"]["schemas"][refusal.rsplit("/", 1)[1]]["properties"]) == {"detail", "findings"}
    parameters = {p["name"] for p in operations["get"]["parameters"]}
    assert {"kind", "name", "problem", "probe", "q", "uploaded_by", "ordering", "page", "page_size"} <= parameters
    listed = operations["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    row = schema["components"]["schemas"][listed.rsplit("/", 1)[1]]["properties"]["results"]["items"]["$ref"]
    uploader = schema["components"]["schemas"][row.rsplit("/", 1)[1]]["properties"]["uploaded_by"]
    assert uploader["readOnly"] and uploader["nullable"]
    validator = pytest.importorskip("openapi_spec_validator", reason="openapi-spec-validator is a dev dependency")
    validator.validate(schema)
