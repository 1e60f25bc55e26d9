"""bench/row_cache_when.py: where the 16-byte row cache pays, replayed off the H200's recorded verdicts. The
committed document (bench/results/row_cache_when.json) is what the script measures again, case for case, and its
when is what induction makes of its rows."""

from __future__ import annotations

import json

import pytest

from bench_tools import bench_script
from klineage import config
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.skills.when import induce_when, per_case

DOCUMENT = config.REPO_ROOT / "bench" / "results" / "row_cache_when.json"


@pytest.fixture(scope="module")
def script():
    return bench_script("row_cache_when")


@pytest.fixture(scope="module")
def document():
    return json.loads(DOCUMENT.read_text())


def test_rms_norms_cases_replay_as_recorded(script, document, tmp_path):
    measured = script.measure("rms_norm", GateMode.REPLAY, GateCache(tmp_path, config.recorded_dir()))
    recorded = next(o for o in document["operators"] if o["operator"] == "rms_norm")
    assert measured["vector"] == recorded["vector"] and measured["parent"] == recorded["parent"]
    assert sorted(measured["cases"], key=lambda c: c["case"]) == sorted(recorded["cases"], key=lambda c: c["case"])
    assert len(measured["cases"]) == 10 and all(c["ratio"] for c in measured["cases"])


def test_the_when_is_what_induction_makes_of_the_rows(document):
    rows = per_case([(f"{o['operator']}:{c['case']}", c["ratio"], c["facts"])
                     for o in document["operators"] for c in o["cases"] if c["ratio"] is not None])
    when = induce_when(rows)
    assert document["provenance"]["gpu"] == "NVIDIA H200" and document["provenance"]["gate"] == "gpu"
    assert (when.kind.value, when.sentence) == (document["when"]["kind"], document["when"]["sentence"])
    assert when.precondition is not None and when.precondition.expression == document["when"]["precondition"]
    assert len(rows) == 40
