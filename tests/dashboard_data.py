"""The bundled corpus imported once per test module, for the dashboard's tests.

`corpus` imports problems (probed in the sandbox; cached by fingerprint under the cache dir, so
only a cold machine pays for it), kernels and recorded verdicts, and deletes them again when the
module is done. Tests that read it also take `db`, so whatever they change is rolled back.
Test modules import the fixture: `from dashboard_data import corpus  # noqa: F401`.
"""

from __future__ import annotations

import pytest

from skills_app.importer import ImportReport, import_corpus
from skills_app.models import Kernel, KernelState, Problem, Verdict


def clear_dashboard_rows() -> None:
    Verdict.objects.all().delete()
    Kernel.objects.all().delete()
    KernelState.objects.all().delete()
    Problem.objects.all().delete()


@pytest.fixture(scope="module")
def corpus(django_db_setup, django_db_blocker) -> ImportReport:
    with django_db_blocker.unblock():
        clear_dashboard_rows()
        report = import_corpus()
    yield report
    with django_db_blocker.unblock():
        clear_dashboard_rows()
