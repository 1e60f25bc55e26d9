"""Replay of verdicts recorded on the H200 (committed under recorded/): CI re-runs the example and
the adversarial suite on real measurements without a GPU. A change to a kernel, the problem or
the gate policy changes the key, and the miss says to record again on a GPU host."""

from __future__ import annotations

import pytest

from klineage import config, corpus
from klineage.config import GateMode
from klineage.gate.cache import GateCache
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Sanitize
from klineage.gate.verdict import Status
from shared_cache import share

SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def recorded(tmp_path, shared_cache, monkeypatch) -> GateCache:
    """No verdict of its own; the probes, compiles, SASS features and artifact reports that replay makes to
    reject an adversarial kernel without a GPU are the run's (tests/shared_cache.py): tests/test_artifact_policy.py
    compiles and checks the same evasion suite."""
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(share(tmp_path / "cache", shared_cache)))
    return GateCache(tmp_path / "empty-local-cache", config.recorded_dir())


def replay(name: str, cache: GateCache, **kwargs):
    return run_gate(SOFTMAX, corpus.kernel_entry(name).load(), mode=GateMode.REPLAY, cache=cache, **kwargs)


def test_example_kernels_replay_as_passed_and_faster_than_vendor(recorded):
    naive = replay("row_softmax/naive", recorded, policy=GatePolicy())
    expert = replay("row_softmax/warp_vec4", recorded, policy=GatePolicy(),
                    against=corpus.kernel_entry("row_softmax/naive").load())
    for verdict in (naive, expert):
        assert verdict.status is Status.PASSED
        assert verdict.provenance["served_from"] == "recorded"
        assert verdict.environment["gpu"] == config.replay_gpu()
    assert expert.profile["ratios"]["vs_baseline"]["overall"] > 1.0
    assert expert.profile["ratios"]["vs_vendor"]["overall"] > 1.0


@pytest.mark.parametrize("entry", corpus.list_kernels(adversarial=True), ids=lambda e: e.name)
def test_every_adversarial_kernel_replays_rejected_with_its_expected_reason(recorded, entry):
    verdict = replay(entry.name, recorded, policy=GatePolicy(sanitize=Sanitize.ALWAYS))
    assert verdict.status is Status.REJECTED
    assert verdict.reason.value == entry.expectation["reason"], verdict.findings
