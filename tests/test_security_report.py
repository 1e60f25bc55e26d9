"""bench/security_report.py (issue 28): its live sandbox rows with the real bubblewrap, the document's shape, and
that the report fails when the sandbox is off."""

import json

import pytest

from bench_tools import bench_script
from klineage import config, corpus

security_report = bench_script("security_report")

pytestmark = pytest.mark.skipif(config.bwrap_path() is None, reason="bubblewrap is not installed")

ATTEMPTS = ("read the secret key file", "read the SQLite database", "make user 'mallory' superuser",
            "/environ", "connect to a server on 127.0.0.1", "write into KLINEAGE_CACHE_DIR", "setsid double-fork",
            "write a marker into the host's /tmp")
SHAPE = {"attack": str, "expected": str, "outcome": str, "passed": bool}


@pytest.fixture
def sandboxed(monkeypatch):
    monkeypatch.delenv(config.UNSAFE_NO_SANDBOX, raising=False)
    monkeypatch.delenv("KLINEAGE_BWRAP", raising=False)


def test_every_sandbox_attempt_through_both_paths_is_refused(sandboxed):
    rows = security_report.sandbox_rows()
    for path in security_report.PATHS:
        mine = [r for r in rows if f"via {path})" in r["attack"]]
        assert [sum(a in r["attack"] for r in mine) for a in ATTEMPTS] == [1] * len(ATTEMPTS), mine
    assert len(rows) == 2 * len(ATTEMPTS) + 1 and "#include" in rows[-1]["attack"]
    failed = [r for r in rows if not r["passed"]]
    assert not failed, failed
    assert all(r["expected"] == security_report.REFUSED for r in rows)


def test_without_the_sandbox_the_report_fails(monkeypatch):
    """The same attacks, unsandboxed, succeed, and their rows say so: the report is not a constant.
    The setsid grandchild is left out: the job's cgroup, which stays on without bwrap where this process may
    create one, still ends it."""
    monkeypatch.setenv(config.UNSAFE_NO_SANDBOX, "1")
    rows = security_report.sandbox_rows(paths=("probe_problem",))
    held = [r["attack"] for r in rows if r["passed"] and "setsid" not in r["attack"]]
    assert held == [], held
    assert "uid" in rows[0]["outcome"] and "succeeded" in rows[0]["outcome"]


def test_every_adversarial_kernel_has_a_row_judged_against_its_expect_toml(tmp_path):
    rows, provenance = security_report.evasion_rows()
    names = {entry.load().plan.name for entry in corpus.list_kernels(adversarial=True)}
    assert len(rows) == len(names) and all(any(r["attack"].startswith(n + " ") for r in rows) for n in names)
    assert provenance["gpu"] and provenance["date"] and provenance["git_commit"]
    # A measured reason that differs from the expectation fails its row; a kernel never measured fails too.
    measured = json.loads(security_report.ADVERSARIAL.read_text(encoding="utf-8"))
    measured["rows"][0]["reason"] = "accepted"
    dropped = measured["rows"].pop()["kernel"]["name"]
    changed = tmp_path / "adversarial.json"
    changed.write_text(json.dumps(measured), encoding="utf-8")
    failed = [r["attack"] for r in security_report.evasion_rows(changed)[0] if not r["passed"]]
    assert len(failed) == 2 and any(a.startswith(dropped + ":") for a in failed), failed


def test_the_committed_document_has_the_issue_shape_and_every_row_passed():
    document = json.loads((config.REPO_ROOT / "bench" / "results" / "security.json").read_text(encoding="utf-8"))
    assert set(document) == {"provenance", "rows"}
    assert {"date", "git_commit", "machine", "sources"} <= set(document["provenance"])
    sources = document["provenance"]["sources"]
    assert sources["sandbox"]["live"] and not sources["evasion"]["live"] and not sources["web"]["live"]
    assert sources["evasion"]["measured"]["gpu"] == "NVIDIA H200"
    for r in document["rows"]:
        assert {k: type(v) for k, v in r.items()} == SHAPE, r
    assert sum(s["rows"] for s in sources.values()) == len(document["rows"])
    assert all(r["passed"] for r in document["rows"])
