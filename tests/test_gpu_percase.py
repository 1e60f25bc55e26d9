"""Timing every case on a real GPU (skipped without one): the expert softmax against the naive one on each
case and each SWEEP case, paired and interleaved; the per-case ratios are read back as a step's effects."""

from __future__ import annotations

import os

import pytest

from klineage import corpus
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize, TimingScope
from klineage.gate.verdict import Status
from klineage.walk.timing_audit import case_ratios, compiled_facts

pytestmark = pytest.mark.gpu
SOFTMAX = corpus.problem_path("row_softmax")


def test_every_case_and_sweep_case_is_timed_against_the_baseline(tmp_path):
    recorded = os.environ.get("KLINEAGE_RECORDED_DIR")
    cache = GateCache(tmp_path / "cache", recorded or None)
    policy = GatePolicy(seeds=1, sanitize=Sanitize.NEVER, vendor=False, trial_seconds=1.0,
                        timing_scope=TimingScope.EVERY_CASE)
    expert, naive = (corpus.kernel_entry(f"row_softmax/{name}").load() for name in ("warp_vec4", "naive"))
    verdict = run_gate(SOFTMAX, expert, against=naive, policy=policy, cache=cache, record=bool(recorded))
    assert verdict.status is Status.PASSED, verdict.findings
    rows = {r.case: r for r in case_ratios(verdict)}
    swept = [c.split(":")[1] for c in verdict.provenance["key_parts"]["cases"] if c.startswith("sweep:")]
    assert len(swept) >= 6 and set(rows) == set(verdict.cases) | set(swept)
    headline = verdict.profile["ratios"]["vs_baseline"]["overall"]
    assert verdict.profile["case"] == "headline" and rows["headline"].ratio == headline
    assert all(r.ratio is not None and r.ratio > 0 and len(r.per_trial) == policy.trials for r in rows.values()), rows
    assert compiled_facts(verdict)["registers"] > 0


def test_a_case_asking_more_shared_memory_than_the_case_before_it_still_launches(tmp_path):
    """group_norm's smem_vec4 asks 65,536 bytes of dynamic shared memory on its headline, 65,520 on the SWEEP
    case hw_unaligned and 65,536 again on one_wave, timed after it: the limit set for one case must not
    stand lower than a later case asks (it did: one_wave's launch failed, "invalid argument")."""
    cache = GateCache(tmp_path / "cache", None)
    policy = GatePolicy(seeds=1, sanitize=Sanitize.NEVER, vendor=False, trial_seconds=0.5,
                        timing_scope=TimingScope.EVERY_CASE)
    expert, naive = (corpus.kernel_entry(f"group_norm/{name}").load() for name in ("smem_vec4", "naive"))
    verdict = run_gate(corpus.problem_path("group_norm"), expert, against=naive, policy=policy, cache=cache)
    assert verdict.status is Status.PASSED, verdict.findings
    rows = {r.case: r for r in case_ratios(verdict)}
    assert {"hw_unaligned", "one_wave"} <= set(rows) and rows["one_wave"].ratio > 0, rows
