"""The upload page (operators only): problem files and kernels checked without running any of their
code, stored content-addressed under the data dir and recorded as rows marked uploaded; every bad
input refused with a message and nothing stored; the same content twice stored once; uploaded names
usable by jobs; and cancel on the job page (its owner or staff, POST with CSRF)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from accounts import logged_in, make_user
from gate_app import queue, submit
from gate_app.models import Job
from gate_app.uploads import record_probe
from klineage import config
from klineage.problem_formats import python_fingerprint
from skills_app.models import Kernel, KernelState, Problem

pytestmark = pytest.mark.django_db

CORPUS = config.corpus_dir()
PROBLEM = (CORPUS / "problems" / "row_softmax.py").read_bytes()
SOURCE = (CORPUS / "kernels" / "row_softmax" / "naive" / "kernel.cu").read_bytes()
PLAN = (CORPUS / "kernels" / "row_softmax" / "naive" / "launch.toml").read_text()


def plan(name: str = "my_softmax", problem: str = "row_softmax", extra: str = "") -> bytes:
    return (PLAN.replace('name = "row_softmax_naive"', f'name = "{name}"')
            .replace('problem = "row_softmax"', f'problem = "{problem}"') + extra).encode()


def files(problem: bytes | None = None, source: bytes | None = None, launch: bytes | None = None, *,
          problem_name: str = "softmax_copy.py", source_name: str = "kernel.cu", plan_name: str = "launch.toml"):
    chosen = {"problem": (problem_name, problem), "source": (source_name, source), "plan": (plan_name, launch)}
    return {key: SimpleUploadedFile(name, data) for key, (name, data) in chosen.items() if data is not None}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"




@pytest.fixture
def operator() -> Client:
    return logged_in(make_user("olga", operator=True))


def _stored_nothing(data_dir: Path) -> None:
    assert not Problem.objects.exists() and not Kernel.objects.exists() and not KernelState.objects.exists()
    assert not Job.objects.exists()
    assert not (data_dir / "uploads").exists()


def _refusal(response) -> str:
    assert response.status_code == 400
    return response.content.decode().split('data-errors="upload"')[1].split("</div>")[0]


# Who may upload ------------------------------------------------------------------------------------


def test_anonymous_visitors_and_viewers_are_refused(client, data_dir):
    page = client.get("/upload/")
    assert page.status_code == 302 and page["Location"].startswith("/accounts/login/?next=/upload/")
    assert client.post("/upload/", files(PROBLEM)).status_code == 302
    viewer = logged_in(make_user("vic"))
    assert viewer.get("/upload/").status_code == 403
    assert viewer.post("/upload/", files(PROBLEM)).status_code == 403
    assert b">Upload</a>" not in viewer.get("/jobs/").content
    _stored_nothing(data_dir)


def test_a_superuser_passes_without_the_group(data_dir):
    admin = logged_in(User.objects.create_superuser("root", password="pw-root-1"))
    assert admin.post("/upload/", files(PROBLEM)).status_code == 302
    assert Problem.objects.get().upload_name == "uploaded/softmax_copy"


def test_csrf_is_enforced(data_dir):
    strict = logged_in(make_user("olga", operator=True), enforce_csrf_checks=True)
    assert strict.post("/upload/", files(PROBLEM)).status_code == 403
    _stored_nothing(data_dir)
    token = strict.get("/upload/").cookies["csrftoken"].value
    assert strict.post("/upload/", {**files(PROBLEM), "csrfmiddlewaretoken": token}).status_code == 302


# What an accepted upload stores ------------------------------------------------------------------------


def test_a_problem_is_stored_as_text_and_queued_for_its_probe_once(operator, data_dir):
    response = operator.post("/upload/", files(PROBLEM), follow=True)
    problem = Problem.objects.get()
    job = Job.objects.get()
    assert (problem.upload_name, problem.probe, problem.operator, problem.info) == (
        "uploaded/softmax_copy", "pending", "", {})
    assert problem.uploaded and not problem.bundled and not problem.current
    stored = data_dir / problem.path
    assert stored == data_dir / "uploads" / "problems" / problem.fingerprint / "softmax_copy.py"
    assert stored.read_bytes() == PROBLEM
    assert (data_dir / "uploads" / "names" / "problems" / "softmax_copy").read_text() == problem.fingerprint
    assert (job.kind, job.needs, job.params, job.owner.username) == ("probe", "cpu",
                                                                     {"problem": "uploaded/softmax_copy"}, "olga")
    text = response.content.decode()
    assert f"Problem uploaded/softmax_copy stored; its probe: waiting for its probe (job #{job.pk})." in text
    assert f'href="/jobs/{job.pk}/">job #{job.pk}</a>' in text

    again = operator.post("/upload/", files(PROBLEM), follow=True).content.decode()
    assert "Problem uploaded/softmax_copy was already uploaded" in again and f"(job #{job.pk})" in again
    assert Problem.objects.count() == 1 and Job.objects.count() == 1


def test_a_cancelled_probe_is_queued_again_by_the_same_upload(operator):
    operator.post("/upload/", files(PROBLEM))
    first = Job.objects.get()
    queue.cancel(first)
    operator.post("/upload/", files(PROBLEM))
    assert Problem.objects.count() == 1
    second = Job.objects.exclude(pk=first.pk).get()
    assert second.kind == "probe" and second.status == "queued"


def test_a_kernel_for_a_bundled_problem_is_stored_after_the_static_check(operator, data_dir):
    response = operator.post("/upload/", files(source=SOURCE, launch=plan()), follow=True)
    assert "Kernel uploaded/my_softmax passed the static check and is stored." in response.content.decode()
    kernel = Kernel.objects.get()
    state = kernel.current_state
    assert (kernel.name, kernel.origin, kernel.operator, state.kernel) == ("uploaded/my_softmax", "uploaded",
                                                                          "row_softmax", kernel)
    folder = data_dir / "uploads" / "kernels" / state.fingerprint
    assert (folder / "kernel.cu").read_bytes() == SOURCE and (folder / "launch.toml").read_bytes() == plan()
    assert not Job.objects.exists()  # a kernel needs no probe

    assert "was already uploaded" in operator.post("/upload/", files(source=SOURCE, launch=plan()),
                                                   follow=True).content.decode()
    assert Kernel.objects.count() == 1 and KernelState.objects.count() == 1

    page = operator.get("/kernels/uploaded/my_softmax/").content.decode()
    assert 'href="/optimize/?kernel=uploaded/my_softmax#optimize-heading">Optimize from here</a>' in page
    assert 'href="/optimize/?kernel=uploaded/my_softmax#fit-heading">Which cards fit?</a>' in page
    assert 'href="/optimize/?kernel=uploaded/my_softmax#walk-heading">Walk</a>' in page
    viewer = logged_in(make_user("vic")).get("/kernels/uploaded/my_softmax/").content.decode()
    assert "Optimize from here" not in viewer and "uploaded/my_softmax" in viewer


def test_a_problem_and_a_kernel_naming_it_in_one_upload(operator):
    operator.post("/upload/", files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    kernel = Kernel.objects.get()
    assert kernel.operator == "uploaded/softmax_copy" and kernel.problem == Problem.objects.get()
    # a later kernel may name it too, while its probe is pending
    operator.post("/upload/", files(source=SOURCE, launch=plan("second", problem="uploaded/softmax_copy")))
    assert Kernel.objects.get(name="uploaded/second").problem.upload_name == "uploaded/softmax_copy"
    page = operator.get("/upload/").content.decode()
    assert "uploaded/softmax_copy" in page and 'href="/kernels/uploaded/second/"' in page


def test_the_uploader_is_the_signed_in_operator_whatever_the_form_sends(operator):
    nina = make_user("nina", operator=True)
    # A field naming someone else is not the form's: the uploader comes from the session alone.
    chosen = {**files(PROBLEM, SOURCE, plan()), "uploaded_by": str(nina.pk), "uploaded_by_id": str(nina.pk)}
    assert operator.post("/upload/", chosen).status_code == 302
    olga = User.objects.get(username="olga")
    assert Problem.objects.get().uploaded_by == olga and Kernel.objects.get().uploaded_by == olga
    # The same content again, by another operator: nothing new, and the first uploader stays.
    logged_in(nina).post("/upload/", files(PROBLEM, SOURCE, plan()))
    assert Problem.objects.get().uploaded_by == olga and Kernel.objects.get().uploaded_by == olga
    logged_in(nina).post("/upload/", files(source=SOURCE, launch=plan("second")))
    Problem.objects.update(uploaded_by=None)  # as a row uploaded before uploaders were recorded

    page = operator.get("/upload/").content.decode()
    problem_row = page[page.index('id="problem-uploadedsoftmax_copy"'):].split("</tr>")[0]
    assert 'title="uploaded before uploaders were recorded, or the account is deleted">unknown</span>' in problem_row
    kernels = page[page.index('id="kernels-heading"'):]
    mine = kernels[kernels.index('href="/kernels/uploaded/my_softmax/"'):].split("</li>")[0]
    theirs = kernels[kernels.index('href="/kernels/uploaded/second/"'):].split("</li>")[0]
    assert 'uploaded by olga <span class="muted small">' in mine
    assert 'uploaded by nina <span class="muted small">' in theirs
    nina.delete()  # the upload stays, its uploader is forgotten
    assert Kernel.objects.get(name="uploaded/second").uploaded_by is None


def test_a_kernel_uploaded_beside_a_problem_it_does_not_name(operator):
    operator.post("/upload/", files(PROBLEM, SOURCE, plan()))
    kernel = Kernel.objects.get()
    assert kernel.operator == "row_softmax" and kernel.problem is None  # the bundled one, not imported here


def test_uploaded_names_on_the_optimize_page_and_in_jobs(operator):
    operator.post("/upload/", files(PROBLEM, SOURCE, plan(problem="uploaded/softmax_copy")))
    page = operator.get("/optimize/?kernel=uploaded/my_softmax").content.decode()
    assert '<option value="uploaded/my_softmax" selected>' in page
    assert '<option value="uploaded/softmax_copy">' in page

    walk = submit.walk_params("uploaded/my_softmax", mode="compile")
    assert walk["problem"] == "uploaded/softmax_copy"  # the plan's problem by default
    assert submit.optimize_params("uploaded/my_softmax", problem="row_softmax", mode="compile")["problem"] == \
        "row_softmax"
    gate = submit.gate_params("uploaded/softmax_copy", "uploaded/my_softmax", against="row_softmax/naive",
                                mode="compile")
    assert gate == {"problem": "uploaded/softmax_copy", "kernel": "uploaded/my_softmax",
                    "against": "row_softmax/naive", "mode": "compile"}

    for call, message in [
        (lambda: submit.walk_params("uploaded/nope", mode="compile"), "no uploaded kernel 'uploaded/nope'"),
        (lambda: submit.walk_params("uploaded/my_softmax", problem="uploaded/nope"), "no uploaded problem"),
        (lambda: submit.gate_params("uploaded/nope", "row_softmax/naive"), "no uploaded problem"),
        (lambda: submit.gate_params("row_softmax", "uploaded/../../etc"), "no uploaded kernel"),
        (lambda: submit.walk_params("row_softmax/none"), "no bundled kernel"),
        (lambda: submit.walk_params("row_softmax/naive", problem="softmax_copy"), "no bundled problem"),
    ]:
        with pytest.raises(queue.QueueError, match=message):
            call()

    record_probe("uploaded/softmax_copy", None, "raised ValueError while loading: no")
    with pytest.raises(queue.QueueError, match="was refused by its probe: raised ValueError"):
        submit.gate_params("uploaded/softmax_copy", "uploaded/my_softmax", mode="compile")
    refused = operator.post("/upload/", files(source=SOURCE, launch=plan("third", problem="uploaded/softmax_copy")))
    assert "which its probe refused" in _refusal(refused)


def test_the_probe_result_is_recorded_on_the_row(operator):
    operator.post("/upload/", files(PROBLEM))
    row = Problem.objects.get()
    probe = {"version": 1, "numerics": [], "inputs": {}, "problem": {
        "operator": "row_softmax", "path": "/tmp/x.py", "fingerprint": row.fingerprint,
        "cases": [{"name": "small", "params": {"rows": 4}}], "headline": "small",
        "outputs": [{"name": "y", "shape": ["rows"], "dtype": "float32"}], "tolerances": {}, "roofline": {},
        "has_vendor": False, "has_check": False, "legacy": False}}
    row = record_probe(row.upload_name, probe, "")
    assert (row.probe, row.operator, row.probe_error, row.info["path"]) == ("sound", "row_softmax", "", row.path)
    assert [c["name"] for c in row.cases] == ["small"]
    row = record_probe(row.upload_name, {**probe, "numerics": ["reference output 'y' is near zero"]}, "")
    assert (row.probe, row.probe_error) == ("refused", "reference output 'y' is near zero")


# Bad input: a message, and nothing stored -------------------------------------------------------------


BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))


@pytest.mark.parametrize("chosen, message", [
    ({}, "choose a problem file, or a kernel"),
    (files(source=SOURCE), "a kernel needs both files"),
    (files(launch=plan()), "a kernel needs both files"),
    (files(PROBLEM, problem_name="softmax.txt"), "the problem file must be a .py file, not &#x27;softmax.txt&#x27;"),
    (files(PROBLEM, problem_name="soft max.py"), "name &#x27;soft max&#x27; must be 1 to 64 letters"),
    (files(b"x = 1\n" * 50_000), "is 300000 bytes; the limit is 262144"),
    (files(BINARY), "is a binary file (it holds NUL bytes)"),
    (files(b"caf\xe9 = 1\n"), "is not UTF-8 text (byte 3)"),
    (files(b" \n\n"), "is empty"),
    (files(source=SOURCE, launch=b"name = 'x\n[[launch]"), "launch.toml: not valid TOML"),
    (files(source=SOURCE, launch=plan(problem="nope")), "names problem &#x27;nope&#x27;, which is neither a bundled"),
    (files(source=SOURCE, launch=plan(problem="uploaded/nope")), "names problem &#x27;uploaded/nope&#x27;"),
    (files(source=SOURCE, launch=plan(name="a/b")), "name &#x27;a/b&#x27; must be 1 to 64"),
    (files(source=SOURCE, launch=plan(extra='colour = "red"\n')), "unknown keys [&#x27;colour&#x27;]"),
    (files(source=SOURCE, launch=plan(), source_name="softmax.cu"), "names its source &#x27;kernel.cu&#x27;"),
    (files(source=SOURCE, launch=plan(), plan_name="launch.txt"), "must be a .toml file"),
    (files(source=BINARY, launch=plan()), "the kernel source &#x27;kernel.cu&#x27; is a binary file"),
    # one bad file refuses the whole upload: the good problem beside it is not stored either
    (files(PROBLEM, SOURCE, plan(problem="uploaded/other")), "names problem &#x27;uploaded/other&#x27;"),
])
def test_bad_input_is_refused_with_a_message_and_stores_nothing(operator, data_dir, chosen, message):
    assert message in _refusal(operator.post("/upload/", chosen))
    _stored_nothing(data_dir)


def test_an_oversize_file_is_refused_before_it_is_read(operator, data_dir):
    assert "is 600000 bytes; the limit is 524288" in _refusal(operator.post("/upload/", files(b"#" * 600_000)))
    _stored_nothing(data_dir)


def test_a_body_larger_than_any_upload_is_refused_before_anything_reads_it(operator, data_dir):
    from klineage_web.body_limit import largest_body

    response = operator.post("/upload/", files(b"#" * (largest_body() + 1)))
    assert response.status_code == 413
    assert f"the most any page here accepts is {largest_body()} bytes" in response.content.decode()
    _stored_nothing(data_dir)
    # The largest legitimate upload still goes through to the per-file checks.
    assert "the limit is 524288" in _refusal(operator.post("/upload/", files(b"#" * 524_289)))


def test_a_kernel_the_static_check_refuses_is_stored_nowhere_with_its_findings(operator, data_dir):
    cheat = b"#include <cublas_v2.h>\n" + SOURCE
    refusal = _refusal(operator.post("/upload/", files(source=cheat, launch=plan())))
    assert "the gate&#x27;s static check refused uploaded/my_softmax: nothing was stored" in refusal
    assert "<code>include</code> line 1:" in refusal and "cublas_v2.h" in refusal
    wrong_entry = plan().replace(b'entry = "row_softmax_naive"', b'entry = "softmax_rows"')
    assert "<code>plan_entry</code>" in _refusal(operator.post("/upload/", files(source=SOURCE, launch=wrong_entry)))
    _stored_nothing(data_dir)


def test_duplicate_names_and_contents_are_refused(operator, data_dir):
    operator.post("/upload/", files(PROBLEM, SOURCE, plan()))
    other = PROBLEM + b"\n# another version\n"
    assert "an uploaded problem named uploaded/softmax_copy already exists with other content" in _refusal(
        operator.post("/upload/", files(other)))
    assert "has the same content as uploaded/softmax_copy: use that name" in _refusal(
        operator.post("/upload/", files(PROBLEM + b"\n\n", problem_name="again.py")))  # trailing blanks: the same
    assert "an uploaded kernel named uploaded/my_softmax already exists with other content" in _refusal(
        operator.post("/upload/", files(source=SOURCE + b"\n// tuned\n", launch=plan())))
    assert Problem.objects.count() == 1 and Kernel.objects.count() == 1 and Job.objects.count() == 1


def test_a_copy_of_a_bundled_problem_is_refused_by_name(operator, data_dir):
    Problem.objects.create(operator="row_softmax", fingerprint=python_fingerprint(PROBLEM.decode()),
                           info={}, path="corpus/problems/row_softmax.py", bundled=True, current=True)
    assert "has the same content as the bundled problem row_softmax: use that name" in _refusal(
        operator.post("/upload/", files(PROBLEM)))
    assert Problem.objects.count() == 1 and not Job.objects.exists() and not (data_dir / "uploads").exists()


def test_a_problem_nested_past_the_parser_is_a_clear_answer_not_a_server_error(operator, data_dir):
    """The web side only reads a problem file (its fingerprint parses it); nesting that makes Python's
    parser give up (RecursionError, MemoryError) must not reach the user as a 500."""
    for body in (b"x = " + b"a" + b"[0]" * 60000 + b"\n", b"x = " + b"-" * 200000 + b"1\n"):
        response = operator.post("/upload/", files(body, problem_name="nested.py"))
        assert response.status_code in (302, 400), response.status_code
        Problem.objects.all().delete()
        Job.objects.all().delete()


# Cancel on the job page ----------------------------------------------------------------------------


def test_cancel_by_its_owner_or_staff_only(data_dir):
    owner, other = make_user("ada", operator=True), make_user("bob", operator=True)
    staff = make_user("sam", is_staff=True)
    job = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "compile"},
                        owner=owner)
    assert Client().post(f"/jobs/{job.pk}/cancel").status_code == 302  # to log in
    assert logged_in(other).post(f"/jobs/{job.pk}/cancel").status_code == 403
    assert "Cancel this job" not in logged_in(other).get(f"/jobs/{job.pk}/").content.decode()
    assert logged_in(owner).get(f"/jobs/{job.pk}/cancel").status_code == 405
    strict = logged_in(owner, enforce_csrf_checks=True)
    assert strict.post(f"/jobs/{job.pk}/cancel").status_code == 403
    job.refresh_from_db()
    assert job.status == "queued"

    page = strict.get(f"/jobs/{job.pk}/")
    assert "Cancel this job" in page.content.decode()
    done = strict.post(f"/jobs/{job.pk}/cancel", {"csrfmiddlewaretoken": page.cookies["csrftoken"].value},
                       follow=True)
    assert done.redirect_chain == [(f"/jobs/{job.pk}/", 302)]
    assert f"Job {job.pk} is cancelled." in done.content.decode()
    job.refresh_from_db()
    assert job.status == "cancelled" and "Cancel this job" not in done.content.decode()
    again = logged_in(owner).post(f"/jobs/{job.pk}/cancel", follow=True).content.decode()
    assert f"Job {job.pk} has already finished (cancelled): nothing to cancel." in again

    running = queue.enqueue("gate", {"problem": "row_softmax", "kernel": "row_softmax/naive", "mode": "compile"},
                            owner=owner)
    Job.objects.filter(pk=running.pk).update(status="running", worker_id="w1")
    text = logged_in(staff).post(f"/jobs/{running.pk}/cancel", follow=True).content.decode()
    assert "Cancel requested: job" in text and "worker is stopping it" in text
    assert Job.objects.get(pk=running.pk).cancel_requested
    assert logged_in(owner).post("/jobs/999999/cancel").status_code == 404
