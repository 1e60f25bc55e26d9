"""Timing statistics and the paired acceptance test, independent of any GPU.

Samples come from the runner: per contender, per trial, a list of kernel times in
microseconds measured with device events after an L2 flush, contenders interleaved.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: list[float]) -> float:
    """(p90 - p10) / median: how settled a set of samples is."""
    median = statistics.median(values)
    return (percentile(values, 90) - percentile(values, 10)) / median if median > 0 else float("inf")


@dataclass(frozen=True)
class TimingStats:
    median_us: float  # median of the per-trial medians
    p10_us: float
    p90_us: float
    count: int
    trial_medians_us: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"median_us": self.median_us, "p10_us": self.p10_us, "p90_us": self.p90_us,
                "count": self.count, "trial_medians_us": list(self.trial_medians_us)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingStats:
        return cls(data["median_us"], data["p10_us"], data["p90_us"], data["count"],
                   tuple(data["trial_medians_us"]))

    @classmethod
    def of(cls, trials: list[list[float]], arrangements: int = 1) -> TimingStats:
        """From each trial's samples. With `arrangements` > 1 the trials come in rounds of that
        many, one per arrangement of the kernels' places; a round counts as one trial, its median
        the geometric mean of its trials' medians, so every round weighs every place alike."""
        if arrangements == 1:
            trials = [t for t in trials if t]
        elif any(not t for t in trials) or len(trials) % arrangements:
            raise ValueError(f"need whole rounds of {arrangements} trials, each with samples")
        if not trials:
            raise ValueError("no timed samples")
        everything = [v for t in trials for v in t]
        medians = [statistics.median(t) for t in trials]
        rounds = tuple(medians) if arrangements == 1 else tuple(
            statistics.geometric_mean(medians[i:i + arrangements]) for i in range(0, len(medians), arrangements))
        return cls(statistics.median(rounds), percentile(everything, 10), percentile(everything, 90),
                   len(everything), rounds)


@dataclass(frozen=True)
class PairedRatio:
    """How much faster the candidate is than a reference: reference time / candidate time."""

    overall: float
    per_trial: tuple[float, ...]

    def accepts(self, required: float) -> bool:
        """The paper's test, kept strict: the ratio holds in the median and in every trial."""
        return self.overall >= required and all(r >= required for r in self.per_trial)

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall, "per_trial": list(self.per_trial)}

    @classmethod
    def of(cls, candidate: TimingStats, reference: TimingStats) -> PairedRatio:
        pairs = zip(candidate.trial_medians_us, reference.trial_medians_us)
        return cls(reference.median_us / candidate.median_us, tuple(r / c for c, r in pairs))


def roofline_floor_us(flops: float, nbytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The time no implementation can beat: the larger of the compute and the memory floors."""
    return max(flops / flops_per_s if flops_per_s else 0.0, nbytes / bytes_per_s) * 1e6
