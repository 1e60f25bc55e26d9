"""The skills evaluation measured on the GPU stands on its recorded verdicts.

bench/results/skills-parts/ holds one folder per set of GPU runs that share a library (parts of
different libraries do not merge): the parts that bench/gpu_session.sh's `skills:` stage wrote on
the H200 (bench/results/skills.json merges the newest set), `library.json` (the library they ran
with) and `docs/`, the optimization documents that came back. Documents the device did not send
back (it returns a limited number of files) were made again on the CPU by replaying the recorded
GPU verdicts with the same code and library; they sit in `docs/replayed/` and say `gate: replay`.
The planner may change after a measurement (which candidate to try is code); what was measured may
not. So CI checks every number against the recorded verdicts with the replay gate, without running
a planner: each document's gated attempts, steps and speedup; each part's strategy rows against
its documents; and each workload's start gate and library-best-vs-expert ratio, gated again."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from bench_tools import bench_script
from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache, VerdictStore, read_verdict_file
from klineage.gate.pipeline import default_cache, run_gate
from klineage.gate.verdict import Status
from klineage.lineage import Lineage, VerdictSummary
from klineage.optimize import DEFAULT_POLICY, OptimizationResult
from klineage.optimize.result import AttemptStatus
from klineage.skills.induction import lineage_id
from klineage.skills.library import corpus_lineages

FOLDER = config.REPO_ROOT / "bench" / "results" / "skills-parts"
PARTS = sorted(FOLDER.glob("*/skills-*.json"))
MEASURED = sorted(FOLDER.glob("*/docs/*.json"))
REPLAYED = sorted(FOLDER.glob("*/docs/replayed/*.json"))
DOCS = MEASURED + REPLAYED
HEADLINE = FOLDER / "headline.txt"  # the parts bench/results/skills.json merges


def _rows(runs: Path | None = None):
    """(part name, workload row) of every part, or of the parts of one set of runs."""
    return [(part.stem, row) for part in PARTS if runs in (None, part.parent)
            for row in json.loads(part.read_text())["workloads"]]


def _runs_of(document: Path) -> Path:
    return document.parent.parent if document.parent.name == "docs" else document.parent.parent.parent


@functools.cache
def _recorded() -> list[dict]:
    """Every recorded verdict's JSON, read once a test process (the rows search them all)."""
    return [read_verdict_file(path) for path in VerdictStore(config.recorded_dir()).files()]


def _lineage(name: str) -> Lineage:
    return next(lin for lin in corpus_lineages()[0] if lineage_id(lin) == name)


def test_every_part_and_document_was_measured_on_the_gpu():
    assert PARTS and MEASURED
    assert all(json.loads(p.read_text())["provenance"]["gate"] == "gpu" for p in PARTS)
    assert all(json.loads(d.read_text())["gate"] == "gpu" for d in MEASURED)
    for replayed in REPLAYED:  # a stand-in for a document that did not come back, never for one that did
        assert json.loads(replayed.read_text())["gate"] == "replay"
        assert not (replayed.parent.parent / replayed.name).exists()
        ran = {strategy for _, row in _rows(_runs_of(replayed)) for strategy in row["strategies"]}
        assert replayed.stem.rsplit("-", 1)[-1] in ran


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.stem)
def test_a_document_agrees_with_its_recorded_verdicts(path: Path):
    result = OptimizationResult.from_dict(json.loads(path.read_text()))  # validates best/speedup/note
    store: GateCache = default_cache()
    gated = [a for a in result.attempts if a.key]
    assert len(gated) + 1 == result.stats.evaluations  # the start kernel's gate call is the first
    for attempt in gated:
        found = store.lookup(attempt.key)
        assert found is not None, f"attempt {attempt.index}: verdict {attempt.key[:12]} is not recorded"
        verdict = found[0]
        assert verdict.kernel["fingerprint"] == attempt.candidate
        assert VerdictSummary.of(verdict) == attempt.verdict
        ratio = verdict.profile.get("ratios", {}).get("vs_baseline")
        if attempt.status in (AttemptStatus.FASTER, AttemptStatus.NOT_FASTER) and ratio:
            assert attempt.ratio.overall == ratio["overall"] and list(attempt.ratio.per_trial) == ratio["per_trial"]
        assert (verdict.status is Status.PASSED) == (attempt.status in (AttemptStatus.FASTER,
                                                                        AttemptStatus.NOT_FASTER))
    assert result.speedup == pytest.approx(math.prod(s.ratio.overall for s in result.steps))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.stem)
def test_a_part_reports_what_its_documents_say(path: Path):
    result = OptimizationResult.from_dict(json.loads(path.read_text()))
    rows = [row for _, row in _rows(_runs_of(path)) if row["start"]["fingerprint"] == result.start.fingerprint
            and result.strategy.value in row["strategies"]]
    assert len(rows) == 1
    row, expected = rows[0]["strategies"][result.strategy.value], bench_script("skills_eval").strategy_row(result)
    if "speedups_by_budget" not in row:  # a part written before rows kept them: merge reads them off this document
        del expected["speedups_by_budget"]
    assert row == expected


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.stem)
def test_a_smaller_budget_never_gives_more(path: Path):
    """speedup_within(N): the run under N evaluations; it never falls as N grows, and at the run's
    own count it is the run's speedup."""
    result = OptimizationResult.from_dict(json.loads(path.read_text()))
    curve = [result.speedup_within(n) for n in range(1, result.stats.evaluations + 1)]
    assert curve[0] == 1.0 and curve == sorted(curve)
    assert curve[-1] == pytest.approx(result.speedup, rel=1e-12)


def test_the_headline_is_the_merge_of_the_parts_it_names(tmp_path):
    """bench/results/skills.json is what --merge makes of the parts HEADLINE lists, nothing added."""
    names = [line for line in HEADLINE.read_text().splitlines() if line and not line.startswith("#")]
    out = tmp_path / "merged.json"
    assert (
        bench_script("skills_eval").main(["--merge", *(str(FOLDER / name) for name in names), "--out", str(out)]) == 0
    )
    merged = json.loads(out.read_text())
    committed = json.loads((FOLDER.parent / "skills.json").read_text())
    for document in (merged, committed):
        for key in ("date", "git_commit"):  # when and from which checkout the merge ran
            document["provenance"].pop(key)
    assert merged == committed


@pytest.mark.parametrize("row", [r for _, r in _rows()], ids=lambda r: r["lineage"].split("@")[0])
def test_each_workload_start_and_vs_expert_are_recorded(row):
    lineage = _lineage(row["lineage"])
    expert, naive = lineage.states[0].kernel, lineage.states[-1].kernel
    assert (expert.fingerprint, naive.fingerprint) == (row["expert"]["fingerprint"], row["start"]["fingerprint"])
    start = run_gate(corpus.problem_path(lineage.problem.operator), naive, policy=DEFAULT_POLICY, mode=GateMode.REPLAY)
    assert start.status is Status.PASSED
    if "library" not in row["strategies"]:  # a part of the other strategies only: nothing was gated against the expert
        assert row["vs_expert"] is None and "library strategy did not run" in row["vs_expert_reason"]
        return
    # The library's best kernel against the expert (its state may be in no document that came back).
    best = row["strategies"]["library"]["best"]
    against = [v for v in _recorded()
               if v["kernel"]["fingerprint"] == best and v["provenance"]["key_parts"]["against"] == expert.fingerprint
               and v["provenance"]["key_parts"]["policy"] == DEFAULT_POLICY.fingerprint]
    assert len(against) == 1 and against[0]["profile"]["ratios"]["vs_baseline"]["overall"] == row["vs_expert"]
