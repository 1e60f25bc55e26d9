"""Timing statistics and the paired acceptance test."""

import math

import pytest

from klineage.gate.timing import PairedRatio, TimingStats, percentile, roofline_floor_us, spread

# percentile


@pytest.mark.parametrize(
    "values, q, expected",
    [
        ([1, 2, 3, 4, 5], 0, 1),
        ([1, 2, 3, 4, 5], 100, 5),
        ([1, 2, 3, 4, 5], 50, 3),
        ([1, 2, 3, 4, 5], 25, 2),
        ([1, 2, 3, 4], 50, 2.5),
        ([10, 20], 10, 11),
        ([10, 20], 90, 19),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 90, 10),
        ([7], 10, 7),
        ([7], 90, 7),
    ],
)
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_sorts_its_input_without_changing_it():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 10) == pytest.approx(1.4)
    assert values == [5.0, 1.0, 4.0, 2.0, 3.0]


def test_percentile_of_nothing():
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


# spread


def test_spread():
    values = [float(v) for v in range(1, 12)]  # p10 2, p90 10, median 6
    assert spread(values) == pytest.approx(8 / 6)
    assert spread([5.0] * 10) == 0.0
    assert spread([0.0, 0.0, 0.0]) == math.inf


def test_spread_is_scale_free():
    values = [9.0, 10.0, 10.5, 11.0, 14.0]
    assert spread([v * 1000 for v in values]) == pytest.approx(spread(values))


# TimingStats


def test_timing_stats_of_trials_is_the_median_of_trial_medians():
    trials = [[10.0, 11.0, 100.0], [20.0, 21.0, 22.0], [12.0, 13.0, 14.0]]
    stats = TimingStats.of(trials)
    assert stats.trial_medians_us == (11.0, 21.0, 13.0)
    assert stats.median_us == 13.0  # not the median of all nine samples (14.0)
    assert stats.count == 9
    everything = [v for t in trials for v in t]
    assert stats.p10_us == pytest.approx(percentile(everything, 10))
    assert stats.p90_us == pytest.approx(percentile(everything, 90))
    assert stats.p10_us == pytest.approx(10.8)
    assert stats.p90_us == pytest.approx(37.6)


def test_timing_stats_skips_empty_trials():
    stats = TimingStats.of([[], [4.0, 6.0], []])
    assert stats.trial_medians_us == (5.0,)
    assert stats.median_us == 5.0
    assert stats.count == 2


def test_timing_stats_of_nothing():
    with pytest.raises(ValueError, match="no timed samples"):
        TimingStats.of([])
    with pytest.raises(ValueError, match="no timed samples"):
        TimingStats.of([[], []])


def test_exchanged_places_make_rounds_whose_median_is_the_geometric_mean_of_their_trials():
    """Two kernels exchange places between trials: a round is one trial per arrangement."""
    stats = TimingStats.of([[50.0, 52.0, 51.0], [36.0], [50.0], [37.0, 35.0], [49.0], [36.0]], arrangements=2)
    assert stats.trial_medians_us == pytest.approx((math.sqrt(51.0 * 36.0), math.sqrt(50.0 * 36.0),
                                                    math.sqrt(49.0 * 36.0)))
    assert stats.median_us == pytest.approx(math.sqrt(50.0 * 36.0))
    assert stats.count == 9
    # a copy in the slow place and one in the fast place, exchanged: the same time, ratio 1
    copy = TimingStats.of([[36.0], [51.0], [36.0], [50.0], [36.0], [49.0]], arrangements=2)
    assert PairedRatio.of(stats, copy).per_trial == pytest.approx((1.0, 1.0, 1.0))


@pytest.mark.parametrize("trials", [[[1.0], [2.0], [3.0]], [[1.0], [], [3.0], [4.0]]])
def test_exchanged_places_need_whole_rounds(trials):
    with pytest.raises(ValueError, match="need whole rounds of 2 trials"):
        TimingStats.of(trials, arrangements=2)


def test_timing_stats_round_trip():
    stats = TimingStats.of([[1.0, 2.0], [3.0, 4.0, 5.0]])
    data = stats.to_dict()
    assert data == {"median_us": 2.75, "p10_us": pytest.approx(1.4), "p90_us": pytest.approx(4.6), "count": 5,
                    "trial_medians_us": [1.5, 4.0]}
    assert TimingStats.from_dict(data) == stats


# PairedRatio


def stats(*medians: float) -> TimingStats:
    return TimingStats.of([[m] for m in medians])


def test_paired_ratio_is_reference_over_candidate():
    ratio = PairedRatio.of(candidate=stats(10.0, 12.0, 8.0), reference=stats(20.0, 18.0, 24.0))
    assert ratio.overall == pytest.approx(20.0 / 10.0)  # medians: 20 / 10
    assert ratio.per_trial == pytest.approx((2.0, 1.5, 3.0))
    assert ratio.to_dict() == {"overall": ratio.overall, "per_trial": list(ratio.per_trial)}


def test_accepts_requires_the_median_and_every_trial():
    ratio = PairedRatio(overall=1.3, per_trial=(1.4, 1.25, 1.3))
    assert ratio.accepts(1.25)
    assert ratio.accepts(1.0)
    assert not ratio.accepts(1.26)  # one trial falls short although the median clears it


def test_accepts_refuses_a_median_short_of_the_requirement():
    ratio = PairedRatio(overall=1.1, per_trial=(1.3, 1.3, 1.3))
    assert not ratio.accepts(1.2)
    assert ratio.accepts(1.1)


def test_one_slow_trial_fails_acceptance():
    candidate = stats(10.0, 10.0, 16.0)
    reference = stats(15.0, 15.0, 15.0)
    ratio = PairedRatio.of(candidate, reference)
    assert ratio.overall == pytest.approx(1.5)
    assert ratio.per_trial[2] == pytest.approx(15 / 16)
    assert not ratio.accepts(1.2)
    assert PairedRatio.of(stats(10.0, 10.0, 11.0), reference).accepts(1.2)


def test_a_slower_candidate_is_a_ratio_below_one():
    ratio = PairedRatio.of(candidate=stats(20.0), reference=stats(10.0))
    assert ratio.overall == 0.5
    assert not ratio.accepts(1.0)


# Roofline


def test_roofline_floor_picks_the_larger_floor():
    # 1 GFLOP on a 1 TFLOP/s unit: 1000 us; 1 GB at 1 TB/s: 1000 us; vary each.
    assert roofline_floor_us(1e9, 1e8, 1e12, 1e12) == pytest.approx(1000.0)  # compute-bound
    assert roofline_floor_us(1e8, 1e9, 1e12, 1e12) == pytest.approx(1000.0)  # memory-bound
    assert roofline_floor_us(2e9, 1e9, 1e12, 1e12) == pytest.approx(2000.0)
    assert roofline_floor_us(1e9, 3e9, 1e12, 1e12) == pytest.approx(3000.0)
    assert roofline_floor_us(67e12, 4.8e12, 67e12, 4.8e12) == pytest.approx(1e6)


def test_roofline_floor_without_a_compute_rate_is_the_memory_floor():
    assert roofline_floor_us(1e15, 4.8e9, 0.0, 4.8e12) == pytest.approx(1000.0)
    assert roofline_floor_us(0.0, 4.8e9, 67e12, 4.8e12) == pytest.approx(1000.0)
