"""The gate's version in verdict keys: replay serves what an earlier gate recorded and says so; a live
gate never gets another version's verdict; `klineage gate` prints the timing's settlement and exits
3 when it never settled."""

from __future__ import annotations

import dataclasses

import pytest

from klineage import cli, config, corpus
from klineage.config import GateMode
from klineage.gate.cache import SERVING_NOTES, GateCache, VerdictStore, earlier_gate_keys
from klineage.gate.pipeline import _locate, run_gate, stored_verdict
from klineage.gate.policy import GatePolicy
from klineage.gate.verdict import GATE_VERSION, Status

SOFTMAX = corpus.problem_path("row_softmax")


@pytest.fixture()
def recorded(tmp_path) -> GateCache:
    return GateCache(tmp_path / "empty-local-cache", config.recorded_dir())


def naive():
    return corpus.kernel_entry("row_softmax/naive").load()


def test_replay_serves_an_earlier_gates_verdict_as_what_it_is(recorded):
    verdict = run_gate(SOFTMAX, naive(), mode=GateMode.REPLAY, cache=recorded, policy=GatePolicy())
    assert verdict.status is Status.PASSED and verdict.gate_version == 1 < GATE_VERSION
    assert verdict.provenance["earlier_gate"] == (f"made by gate version 1; the gate is now version {GATE_VERSION}: "
                                                  f"served as recorded, not judged again")
    assert verdict.settlement is None  # that gate had no settle check: nothing is claimed for it
    located = _locate(SOFTMAX, naive(), None, None, GatePolicy(), GateMode.REPLAY)
    assert located.parts["gate"] == GATE_VERSION
    assert verdict.provenance["key"] == earlier_gate_keys(located.parts)[0] != located.key


def test_a_live_lookup_never_finds_another_versions_verdict(recorded):
    """What a GPU gate would be served for the same facts (a lookup by this version's key): nothing, so
    it measures. Replay, and so `stored_verdict` asked in replay, serves the earlier version's verdict
    and says so."""
    assert recorded.lookup(_locate(SOFTMAX, naive(), None, None, GatePolicy(), GateMode.REPLAY).key) is None
    replayed = stored_verdict(SOFTMAX, naive(), policy=GatePolicy(), mode=GateMode.REPLAY, cache=recorded)
    assert replayed.gate_version < GATE_VERSION and "earlier_gate" in replayed.provenance


def test_keeping_a_replayed_verdict_stores_it_without_the_serving_notes(recorded, tmp_path):
    verdict = run_gate(SOFTMAX, naive(), mode=GateMode.REPLAY, cache=recorded, policy=GatePolicy())
    keeper = GateCache(None, tmp_path / "kept")
    keeper.keep(verdict)
    kept = VerdictStore(tmp_path / "kept").get(verdict.provenance["key"])
    assert "earlier_gate" not in kept.provenance and "served_from" not in kept.provenance
    assert kept.to_dict() == recorded.recorded.get(verdict.provenance["key"]).to_dict()


def test_cli_prints_an_earlier_gate_and_exits_0(capsys):
    code = cli.main(["gate", "row_softmax", "row_softmax/naive", "--gate", "replay"])
    out = capsys.readouterr().out
    assert code == 0
    assert "earlier gate: made by gate version 1" in out
    assert "timing: not checked for settling" in out


def test_cli_says_unsettled_and_exits_3(tmp_path, monkeypatch, capsys):
    """A recorded store holding, under this gate version's key, the recorded verdict with an unsettled
    settlement written into it (synthetic, for the printout and the exit status only)."""
    earlier = run_gate(SOFTMAX, naive(), mode=GateMode.REPLAY, cache=GateCache(None, config.recorded_dir()),
                       policy=GatePolicy())
    located = _locate(SOFTMAX, naive(), None, None, GatePolicy(), GateMode.REPLAY)
    settlement = {"state": "unsettled", "trials": 6, "reasons": ["vendor spread 1.178 > 0.5"], "attempts": [{}, {}],
                  "ratios": {"vs_vendor": "unsettled"}, "limits": {"spread": 0.5, "agreement": 0.1}}
    provenance = {k: v for k, v in earlier.provenance.items() if k not in SERVING_NOTES}
    unsettled = dataclasses.replace(earlier, profile={**earlier.profile, "settlement": settlement},
                                    provenance={**provenance, "key": located.key, "gate_version": GATE_VERSION})
    VerdictStore(tmp_path / "recorded").put(located.key, unsettled)
    monkeypatch.setenv("KLINEAGE_RECORDED_DIR", str(tmp_path / "recorded"))
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "cache"))
    code = cli.main(["gate", "row_softmax", "row_softmax/naive", "--gate", "replay"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3
    assert "timing: unsettled after 2 attempt(s): vendor spread 1.178 > 0.5. No acceptance decision" in out
    assert "vs_vendor" in out and "unsettled)" in out
    assert "earlier gate" not in out
