"""When a timing may decide: the settle check on synthetic trial data (no GPU), and what an
unsettled verdict means to the verdict, the cache, the optimizer, admission and the CLI."""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import pytest

from klineage.gate.cache import GateCache, earlier_gate_keys, verdict_key
from klineage.gate.policy import GatePolicy
from klineage.gate.timing import (
    AGREEMENT_LIMIT,
    SPREAD_LIMIT,
    PairedRatio,
    Settlement,
    Settling,
    TimingStats,
    cover_s,
    keep_covered,
    settle_record,
)
from klineage.gate.verdict import GATE_VERSION, Status, Verdict
from test_admission import cards  # noqa: F401  (the admission tests' cards fixture)

FACTS = dict(kernel="a" * 64, problem="b" * 64, cases=["small"], gpu="NVIDIA H200", toolchain="t",
             policy=GatePolicy().fingerprint, against="none", mode="gpu")
COVER_US = 100.0  # the GPU work the runner queues before each timed call, hiding the host's dispatch


def measured(kernel_us: float, trials: int = 3, reps: int = 40, jitter: float = 0.01, host_us=None,
             seed: int = 0) -> list[list[float]]:
    """Samples as the runner's events see them: the kernel's time with a little noise, plus whatever
    of the host's dispatch time the cover does not hide (`host_us`: a draw per call)."""
    rng = random.Random(seed)
    trials_out = []
    for _ in range(trials):
        samples = []
        for _ in range(reps):
            leak = max(0.0, host_us(rng) - COVER_US) if host_us else 0.0
            samples.append(kernel_us * (1 + rng.gauss(0, jitter)) + leak)
        trials_out.append(samples)
    return trials_out


def settle(**contenders: list[list[float]]) -> Settling:
    stats = {role: TimingStats.of(trials) for role, trials in contenders.items()}
    ratios = {f"vs_{role}": PairedRatio.of(stats["candidate"], s) for role, s in stats.items() if role != "candidate"}
    return Settling.of(stats, ratios)


def test_steady_contenders_settle():
    check = settle(candidate=measured(10.0, seed=1), vendor=measured(12.0, seed=2))
    assert check.settlement is Settlement.SETTLED
    assert check.ratios == {"vs_vendor": Settlement.SETTLED}
    assert check.reasons == () and check.trials == 3
    assert check.spreads["candidate"] < SPREAD_LIMIT and check.disagreement["vs_vendor"] < AGREEMENT_LIMIT


def test_the_issue_measurement_is_unsettled():
    """conv2d's first gate after machine start: vendor p10 15.6, median 46.1, p90 69.9 us; trial
    ratios 3.94, 3.84 and 2.49 reported as a confident 3.85x."""
    candidate = TimingStats(11.97, 11.9, 12.1, 90, (11.97, 11.95, 12.0))
    vendor = TimingStats(46.1, 15.6, 69.9, 90, (47.16, 45.89, 29.88))
    check = Settling.of({"candidate": candidate, "vendor": vendor},
                        {"vs_vendor": PairedRatio(3.85, (3.94, 3.84, 2.49))})
    assert check.settlement is Settlement.UNSETTLED
    assert check.ratios["vs_vendor"] is Settlement.UNSETTLED
    assert any(r.startswith("vendor spread 1.178 > 0.5") for r in check.reasons), check.reasons
    assert any("vs_vendor trial ratios disagree by 0.377" in r for r in check.reasons), check.reasons


def test_trial_ratios_that_drift_are_unsettled_though_each_trial_is_tight():
    """Clocks rising between trials: every trial is steady, their ratios are not."""
    candidate = [[10.0] * 20, [10.0] * 20, [10.0] * 20]
    vendor = [[20.0] * 20, [17.0] * 20, [14.0] * 20]
    check = settle(candidate=candidate, vendor=vendor)
    assert check.spreads["vendor"] <= SPREAD_LIMIT
    assert check.settlement is Settlement.UNSETTLED
    assert check.reasons == (f"vs_vendor trial ratios disagree by 0.353 > {AGREEMENT_LIMIT}",)


def test_a_noisy_candidate_is_unsettled_whatever_the_vendor_graph_says():
    noisy = measured(10.0, host_us=lambda rng: rng.uniform(0, 400), seed=3)
    check = settle(candidate=noisy, vendor_graph=measured(12.0, seed=4))
    assert check.settlement is Settlement.UNSETTLED
    assert check.reasons[0].startswith("candidate spread")


def test_a_settled_vendor_graph_excuses_the_host_bound_eager_vendor():
    """Both are reported; the eager ratio stays marked unsettled, the graph's decides."""
    eager = measured(12.0, host_us=lambda rng: rng.uniform(0, 2000), seed=5)
    check = settle(candidate=measured(10.0, seed=6), vendor=eager, vendor_graph=measured(12.0, seed=7))
    assert check.ratios == {"vs_vendor": Settlement.UNSETTLED, "vs_vendor_graph": Settlement.SETTLED}
    assert check.settlement is Settlement.SETTLED and check.reasons == ()


def test_a_baseline_ratio_is_never_excused_by_the_vendor_graph():
    drifting = [[20.0] * 20, [17.0] * 20, [14.0] * 20]
    check = settle(candidate=measured(10.0, seed=8), baseline=drifting, vendor_graph=measured(12.0, seed=9))
    assert check.settlement is Settlement.UNSETTLED
    assert check.ratios["vs_baseline"] is Settlement.UNSETTLED


@pytest.mark.parametrize("seed", range(60))
def test_a_vendor_burning_random_host_time_never_gives_a_confident_wrong_ratio(seed):
    """The noisy-vendor test on the runner's measurement model: whatever the host burns before each
    launch, the check either says unsettled or the ratio is within 5% of the true one."""
    rng = random.Random(seed)
    kernel_us, vendor_us = rng.uniform(5, 50), rng.uniform(5, 50)
    burn = rng.choice([50, 150, 400, 2000])
    check_stats = {"candidate": TimingStats.of(measured(kernel_us, seed=seed)),
                   "vendor": TimingStats.of(measured(vendor_us, host_us=lambda r: r.uniform(0, burn), seed=seed + 1))}
    ratio = PairedRatio.of(check_stats["candidate"], check_stats["vendor"])
    check = Settling.of(check_stats, {"vs_vendor": ratio})
    true = vendor_us / kernel_us
    assert check.settlement is Settlement.UNSETTLED or abs(ratio.overall / true - 1) <= 0.05, (
        burn, ratio.overall, true, check.to_dict())


def test_exposed_samples_are_left_out_unless_they_are_most_of_a_trial():
    assert keep_covered([10.0, 10.1, 10.2], [30.0, 45.0]) == [10.0, 10.1, 10.2]
    assert keep_covered([10.0], [30.0, 45.0]) == [10.0, 30.0, 45.0]  # host-bound: the settle check judges all
    assert keep_covered([], []) == []
    assert cover_s(300_000) == pytest.approx(100e-6)  # the least a cover lasts: at 3 GHz, above any SM clock


@pytest.mark.parametrize("seed", range(20))
def test_a_vendor_exposed_after_a_long_round_settles_once_its_exposed_calls_are_left_out(seed):
    """The s21 pattern: beside a 149-ms naive GEMM, the vendor's call that opens a round (the host just
    waited out the last one) sometimes outlasts the cover; its events then time the host too. Unmarked,
    those samples make the vendor unsettled; marked exposed and left out, the rest give its true time."""
    rng = random.Random(seed)
    vendor_us, cover_us = 200.0, 100.0
    trials_kept, trials_all = [], []
    for _ in range(3):
        covered, exposed = [], []
        for rep in range(20):
            host = rng.uniform(0, 400) if rep % 2 == 0 else rng.uniform(0, 20)  # opens every other round
            sample = vendor_us * (1 + rng.gauss(0, 0.01)) + max(0.0, host - cover_us)
            (exposed if host > cover_us else covered).append(sample)
        trials_kept.append(keep_covered(covered, exposed))
        trials_all.append(covered + exposed)
    candidate = measured(149_000.0, reps=20, seed=seed)
    kept = settle(candidate=candidate, vendor=trials_kept)
    assert kept.settlement is Settlement.SETTLED
    assert settle(candidate=candidate, vendor=trials_all).settlement is Settlement.UNSETTLED  # the premise
    assert TimingStats.of(trials_kept).median_us == pytest.approx(vendor_us, rel=0.02)
    assert TimingStats.of(trials_all).median_us > TimingStats.of(trials_kept).median_us


def test_no_ratio_and_no_trials_is_unsettled_not_a_crash():
    stats = {"candidate": TimingStats(10.0, 9.9, 10.1, 5, (10.0,)), "vendor": TimingStats(12.0, 11.9, 12.1, 5, ())}
    check = Settling.of(stats, {"vs_vendor": PairedRatio(1.2, ())})
    assert check.settlement is Settlement.UNSETTLED
    assert check.to_dict()["disagreement"] == {"vs_vendor": None}


def test_settle_record_is_json_and_keeps_every_attempt():
    first = settle(candidate=measured(10.0, seed=10), vendor=[[20.0] * 20, [17.0] * 20, [14.0] * 20])
    second = settle(candidate=measured(10.0, trials=6, seed=11), vendor=measured(20.0, trials=6, seed=12))
    record = json.loads(json.dumps(settle_record([first, second]), allow_nan=False))
    assert record["state"] == "settled" and record["trials"] == 6
    assert [a["state"] for a in record["attempts"]] == ["unsettled", "settled"]
    assert record["limits"] == {"spread": SPREAD_LIMIT, "agreement": AGREEMENT_LIMIT}


# What an unsettled verdict means


def timed_verdict(state: str | None, ratio=(1.3, (1.31, 1.29, 1.3))) -> Verdict:
    profile = {"case": "headline", "contenders": {}, "ratios": {"vs_baseline": {"overall": ratio[0],
                                                                                 "per_trial": list(ratio[1])}}}
    if state:
        profile["settlement"] = {"state": state, "reasons": ["vendor spread 1.180 > 0.5"], "trials": 6,
                                 "attempts": [], "limits": {"spread": SPREAD_LIMIT, "agreement": AGREEMENT_LIMIT}}
    return Verdict(status=Status.PASSED, kernel={"name": "k", "fingerprint": "a" * 64},
                   problem={"operator": "p", "fingerprint": "b" * 64}, cases=("headline",),
                   policy=GatePolicy().to_dict(), profile=profile,
                   provenance={"key": "c" * 64, "gate_version": 2} if state else {"key": "c" * 64})


def test_an_unsettled_verdict_has_no_deciding_ratio():
    unsettled = timed_verdict("unsettled")
    assert unsettled.unsettled and unsettled.settlement is Settlement.UNSETTLED
    assert unsettled.paired_ratio() is None
    assert unsettled.describe() == "passed, timing: unsettled (vendor spread 1.180 > 0.5)"
    settled = timed_verdict("settled")
    assert not settled.unsettled and settled.paired_ratio() == PairedRatio(1.3, (1.31, 1.29, 1.3))
    earlier = timed_verdict(None)  # a gate before the settle check: what it measured, as it was
    assert earlier.settlement is None and earlier.gate_version == 1 and earlier.paired_ratio().overall == 1.3


def test_an_unknown_settlement_is_refused():
    data = timed_verdict("unsettled").to_dict()
    data["profile"]["settlement"]["state"] = "mostly"
    with pytest.raises(Exception, match="unknown timing settlement 'mostly'"):
        Verdict.from_dict(data)


def test_an_unsettled_verdict_is_stored_but_never_served_as_final(tmp_path):
    key, parts = verdict_key(**FACTS)
    cache = GateCache(tmp_path / "local", tmp_path / "recorded")
    cache.store(key, timed_verdict("unsettled"), record=True)
    assert cache.lookup(key) is None  # a live gate measures again
    served, origin = cache.lookup(key, final_only=False)
    assert served.unsettled and origin == "cache"
    assert cache.replay(key, parts)[0].unsettled  # replay shows what was measured
    cache.store(key, timed_verdict("settled"))
    assert cache.lookup(key)[0].settlement is Settlement.SETTLED


def test_the_optimizer_neither_takes_nor_refuses_an_unsettled_candidate():
    from klineage.optimize.loop import _Run
    from klineage.optimize.result import AttemptStatus

    run = SimpleNamespace(required=1.02)
    status, ratio, message = _Run.judge(run, timed_verdict("unsettled"))
    assert status is AttemptStatus.UNSETTLED and ratio is None
    assert "timing: unsettled" in message and "not accepted, not refused" in message
    assert _Run.judge(run, timed_verdict("settled"))[0] is AttemptStatus.FASTER


def test_admission_calls_an_unsettled_trial_inconclusive(cards, gate_cache):
    """The real compile-only verdict of the trial, with the timing an unsettled GPU gate reports."""
    from klineage import corpus
    from klineage.skills.admission import admit
    from klineage.skills.trial_reading import TrialOutcome, trial_outcome
    from test_admission import compile_gate, tiny_target, with_effect

    def gate(problem_path, kernel, against, case=""):
        verdict = compile_gate(gate_cache)(problem_path, kernel, against, case)
        return dataclasses.replace(verdict, status=Status.PASSED, profile=timed_verdict("unsettled").profile)

    card = with_effect(cards["launch_bounds"], 1.2)
    updated, [trial] = admit(card, [tiny_target()], corpus.problem_path, gate)
    assert trial_outcome(trial) is TrialOutcome.INCONCLUSIVE and not trial.passed and trial.ratio is None
    assert "timing: unsettled" in trial.message
    assert updated.status is card.status


def test_the_gate_version_is_in_every_new_key_and_an_old_key_stays_what_it_was():
    new_key, parts = verdict_key(**FACTS)
    old_key, old_parts = verdict_key(**FACTS, gate=1)
    assert parts["gate"] == GATE_VERSION == 2 and "gate" not in old_parts and new_key != old_key
    assert earlier_gate_keys(parts) == [old_key]


def test_the_fidelity_summary_calls_a_settled_outlier_wrong_and_passes_over_unsettled_runs():
    from bench_tools import bench_script

    fidelity = bench_script("timing_fidelity")
    rows = [{"vs": "vendor", "ratio": r, "settled": s} for r, s in
            [(1.20, True), (1.22, True), (1.19, True), (3.85, False), (1.40, True)]]
    result = fidelity.summary(rows)
    assert result["settled_ratio"] == pytest.approx(1.21) and result["settled_runs"] == 4
    assert result["wrong"] == [4] and result["met"] == 4  # 1.40 is settled and 16% off: a confident wrong ratio
    assert fidelity.summary([{"vs": "vendor", "ratio": 2.0, "settled": False}])["settled_ratio"] is None


def test_fidelity_rows_say_per_ratio_whether_it_settled():
    from bench_tools import bench_script

    verdict = timed_verdict("unsettled")
    [row] = bench_script("timing_fidelity").rows_of(verdict, "row_softmax/mid_aligned", run=0)
    assert row["vs"] == "baseline" and row["ratio"] == 1.3 and row["correct"] and not row["settled"]
    assert row["verdict_settlement"] == "unsettled" and row["reasons"] == ["vendor spread 1.180 > 0.5"]


def test_a_recorded_unsettled_timing_gives_way_to_a_later_measurement(tmp_path):
    """A GPU walk that met an unsettled timing, then measured the same facts again: replay must serve
    what the walk went on with."""
    key, _ = verdict_key(**FACTS)
    cache = GateCache(tmp_path / "local", tmp_path / "recorded")
    unsettled, settled = (dataclasses.replace(timed_verdict(state), provenance={"key": key, "gate_version": 2})
                          for state in ("unsettled", "settled"))
    cache.keep(unsettled)
    assert cache.recorded.get(key).unsettled
    cache.keep(settled)
    assert cache.recorded.get(key).settlement is Settlement.SETTLED
    cache.keep(unsettled)  # a settled recording is never replaced
    assert cache.recorded.get(key).settlement is Settlement.SETTLED
