"""An uploaded kernel's plan is evaluated for every case of its problem before anything is stored: a
plan that cannot launch some case is refused naming the case and the expression."""

from __future__ import annotations

import pytest

from accounts import logged_in, make_user
from klineage import config
from klineage.gate import execute
from shared_cache import PROBES, share
from skills_app.models import Kernel, Problem

pytestmark = pytest.mark.django_db

CORPUS = config.corpus_dir()
SOURCE = (CORPUS / "kernels" / "row_softmax" / "naive" / "kernel.cu").read_text()
PLAN = (CORPUS / "kernels" / "row_softmax" / "naive" / "launch.toml").read_text()


@pytest.fixture(scope="module")
def probed(tmp_path_factory, shared_cache):
    """What the sandboxed probe finds in the bundled row_softmax problem: its real cases (the run's probe of it,
    tests/shared_cache.py)."""
    cache = share(tmp_path_factory.mktemp("cache"), shared_cache, PROBES)
    return execute.probe_problem(CORPUS / "problems" / "row_softmax.py", cache)


@pytest.fixture(autouse=True)
def bundled_problem(probed, tmp_path, monkeypatch):
    monkeypatch.setenv("KLINEAGE_DATA_DIR", str(tmp_path / "data"))
    Problem.objects.create(operator="row_softmax", fingerprint=probed.info.fingerprint, info=probed.info.to_dict(),
                           path="corpus/problems/row_softmax.py", bundled=True, current=True)


def _upload(grid: str):
    from django.core.files.uploadedfile import SimpleUploadedFile

    assert 'grid = ["rows"]' in PLAN
    plan = PLAN.replace('name = "row_softmax_naive"', 'name = "planned"')
    plan = plan.replace('grid = ["rows"]', f'grid = ["{grid}"]')
    files = {"source": SimpleUploadedFile("kernel.cu", SOURCE.encode()),
             "plan": SimpleUploadedFile("launch.toml", plan.encode())}
    return logged_in(make_user("olga", operator=True)).post("/upload/", files, follow=True).content.decode()


def test_a_plan_failing_on_one_case_is_refused_naming_it(probed):
    assert any(c.params["cols"] == 30 for c in probed.info.cases), "the case this test aims at"
    page = _upload("rows + 0 // (cols - 30)")
    assert "the launch plan does not work for case &#x27;narrow&#x27;" in page
    assert "rows + 0 // (cols - 30)" in page and "division by zero" in page
    assert not Kernel.objects.exists()


def test_a_complex_result_is_refused_at_upload():
    page = _upload("(-8)**0.5")
    assert "does not work for case" in page and "not a real number" in page
    assert not Kernel.objects.exists()


def test_a_plan_outside_the_hardware_limits_for_a_case_is_refused():
    page = _upload("rows * 1000000")  # the headline case's 16384 rows: 1.6e10 blocks
    assert "does not work for case &#x27;headline&#x27;" in page and "outside the hardware limits" in page


def test_a_plan_that_works_for_every_case_is_stored():
    page = _upload("rows")
    assert "passed the static check and is stored" in page
    assert Kernel.objects.filter(name="uploaded/planned").exists()
