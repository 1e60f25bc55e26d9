"""The bundled corpus imported once per test worker, for the dashboard's tests.

`corpus` imports problems (probed in the sandbox; cached by fingerprint under the cache dir, so
only a cold machine pays for it), kernels and recorded verdicts, and deletes them again when the
module is done. On SQLite the run's first import is followed by a snapshot of the whole test
database (sqlite3's backup API), kept in memory and, for the other xdist worker (whose test database
has the same migrations), in the run's shared folder (tests/shared_cache.py); later modules restore
that snapshot instead of importing again and get the first import's report. Elsewhere (PostgreSQL)
each module imports afresh.
Tests that read it also take `db`, so whatever they change is rolled back. The run's first import
fails if it compiles a kernel: it reads recorded evidence and must judge nothing.
Test modules import the fixture: `from dashboard_data import corpus  # noqa: F401`; end-to-end tests
(transactional, a live server) call `corpus_rows()` instead.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import sqlite3
from pathlib import Path

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from klineage.gate import machine_code, pipeline
from shared_cache import SHARED_ENV
from skills_app.importer import ImportReport, import_corpus
from skills_app.models import Kernel, KernelState, Problem, Verdict

# This worker's test database just after the run's first import, and that import's report.
_snapshot: tuple[sqlite3.Connection, ImportReport] | None = None
_DATABASE, _REPORT = "corpus-import.sqlite3", "corpus-import.report.pickle"  # the run's, in its shared folder


def _no_compile(state, *args, **kwargs):
    """An import reads recorded evidence; on a clean machine every compile here cost seconds (hundreds
    of them ran CI out of time once), so one is an error wherever it comes from."""
    raise AssertionError(f"importing the corpus compiled {state.name}: a lookup of recorded evidence must "
                         f"judge nothing")


def clear_dashboard_rows() -> None:
    Verdict.objects.all().delete()
    Kernel.objects.all().delete()
    KernelState.objects.all().delete()
    Problem.objects.all().delete()


def corpus_rows() -> ImportReport:
    """The corpus in the test database, and the report of its import: restored from the run's snapshot
    (this worker's, or read from the shared folder), or (the run's first time) imported and snapshotted.
    Needs database access and no open transaction (backup refuses a target in one): a module fixture's
    unblocked database, or a `transactional_db` test's (the end-to-end tests, whose live server reads the
    same database)."""
    global _snapshot
    if _snapshot is None and connection.vendor == "sqlite" and os.environ.get(SHARED_ENV):
        folder = Path(os.environ[SHARED_ENV])
        with open(folder / "corpus-import.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker's import, if it is under way, is waited for
            if not (folder / _REPORT).is_file():
                report = _import()
                with sqlite3.connect(folder / "corpus-import.sqlite3.tmp") as file:
                    _snapshot[0].backup(file)
                file.close()
                os.replace(folder / "corpus-import.sqlite3.tmp", folder / _DATABASE)
                (folder / "corpus-import.report.tmp").write_bytes(pickle.dumps(report))
                os.replace(folder / "corpus-import.report.tmp", folder / _REPORT)  # written last: the pair is whole
                return report
            memory, file = sqlite3.connect(":memory:"), sqlite3.connect(folder / _DATABASE)
            file.backup(memory)
            file.close()
            _snapshot = memory, pickle.loads((folder / _REPORT).read_bytes())
    if _snapshot is not None:
        connection.ensure_connection()
        _snapshot[0].backup(connection.connection)
        # A transactional test's flush since the snapshot may have renumbered content types.
        ContentType.objects.clear_cache()
        return _snapshot[1]
    return _import()


def _import() -> ImportReport:
    """The corpus imported into the test database, and (SQLite) this worker's snapshot of it."""
    global _snapshot
    clear_dashboard_rows()
    with pytest.MonkeyPatch.context() as patch:
        for module in (pipeline, machine_code):
            patch.setattr(module, "compile_kernel", _no_compile)
        report = import_corpus()
    if connection.vendor == "sqlite":
        copy = sqlite3.connect(":memory:")
        connection.connection.backup(copy)
        _snapshot = copy, report
    return report


@pytest.fixture(scope="module")
def corpus(django_db_setup, django_db_blocker) -> ImportReport:
    # Module-scoped, so this runs outside any test's transaction.
    with django_db_blocker.unblock():
        report = corpus_rows()
    yield report
    with django_db_blocker.unblock():
        clear_dashboard_rows()
