"""Timing statistics and the paired acceptance test, independent of any GPU.

Samples come from the runner: per contender, per trial, a list of kernel times in
microseconds measured with device events after an L2 flush, contenders interleaved.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import Enum
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


# When a timing may decide anything. Limits read from the H200 recordings (recorded/, 909 timed
# verdicts): steady kernels' (p90 - p10) / median stays under 0.4 (conv2d's 450-us kernels
# reach it with trial ratios agreeing to 4%), trial ratios against a baseline agree within 4%;
# the eager vendors that misled (a host-bound launch) spread 1.1 to 3.5.
SPREAD_LIMIT = 0.5  # a contender whose samples spread wider than this is not measured, only sampled
AGREEMENT_LIMIT = 0.10  # (max - min) / overall of one ratio's per-trial values
RETRY_TRIALS = 2  # an unsettled timing is measured again with this many times the trials (at most 10)


# A timed call is covered by a GPU sleep of a number of SM cycles queued before it; no GPU's SM clock
# reaches this, so the sleep lasts at least cycles / FASTEST_SM_HZ seconds.
FASTEST_SM_HZ = 3.0e9


def cover_s(cycles: int) -> float:
    """The least time a cover of `cycles` SM cycles keeps the GPU busy."""
    return cycles / FASTEST_SM_HZ


def keep_covered(covered: list[float], exposed: list[float]) -> list[float]:
    """One contender's samples of a trial: those whose dispatch the cover hid, without the exposed ones
    (the host was slower than the cover, so the events may have timed the host too). Where most were
    exposed, the contender is host-bound, not unlucky: every sample stays, and the settle check judges
    them (a host-bound eager vendor is then timed from its CUDA graph)."""
    return list(covered) if len(covered) >= len(exposed) else list(covered) + list(exposed)


class Settlement(str, Enum):
    """How a timing ended: only a settled one may accept or refuse a kernel."""

    SETTLED = "settled"
    UNSETTLED = "unsettled"  # noisy even after warming the clocks and more trials: no decision


@dataclass(frozen=True)
class Settling:
    """The settle check of one measurement: each contender's spread, each ratio's trial disagreement,
    and what failed. A ratio against the eager vendor is excused where the vendor's CUDA graph settled
    (the eager launch is host-bound; the graph times the same GPU work without the host)."""

    settlement: Settlement
    trials: int
    spreads: dict[str, float]
    disagreement: dict[str, float]
    ratios: dict[str, Settlement]
    reasons: tuple[str, ...]

    @classmethod
    def of(cls, stats: dict[str, TimingStats], ratios: dict[str, PairedRatio]) -> Settling:
        spreads = {role: _stats_spread(s) for role, s in stats.items()}
        disagreement = {name: (max(r.per_trial) - min(r.per_trial)) / r.overall if r.per_trial and r.overall > 0
                        else float("inf") for name, r in ratios.items()}
        reasons = [f"{role} spread {value:.3f} > {SPREAD_LIMIT}" for role, value in spreads.items()
                   if not value <= SPREAD_LIMIT]
        by_ratio = {}
        for name, value in disagreement.items():
            noisy = [r for r in ("candidate", name.removeprefix("vs_")) if not spreads.get(r, 0.0) <= SPREAD_LIMIT]
            if not value <= AGREEMENT_LIMIT:
                reasons.append(f"{name} trial ratios disagree by {value:.3f} > {AGREEMENT_LIMIT}")
            by_ratio[name] = Settlement.SETTLED if value <= AGREEMENT_LIMIT and not noisy else Settlement.UNSETTLED
        deciding = dict(by_ratio)
        if deciding.get("vs_vendor_graph") is Settlement.SETTLED:
            deciding.pop("vs_vendor", None)
        candidate_settled = spreads.get("candidate", 0.0) <= SPREAD_LIMIT
        settled = candidate_settled and all(s is Settlement.SETTLED for s in deciding.values())
        if settled:
            reasons = []
        trials = max((len(s.trial_medians_us) for s in stats.values()), default=0)
        return cls(Settlement.SETTLED if settled else Settlement.UNSETTLED, trials, spreads, disagreement, by_ratio,
                   tuple(reasons))

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.settlement.value, "trials": self.trials, "spreads": self.spreads,
                "disagreement": {k: _json_number(v) for k, v in self.disagreement.items()},
                "ratios": {k: v.value for k, v in self.ratios.items()}, "reasons": list(self.reasons)}


def _stats_spread(stats: TimingStats) -> float:
    return (stats.p90_us - stats.p10_us) / stats.median_us if stats.median_us > 0 else float("inf")


def _json_number(value: float) -> float | None:
    return value if value != float("inf") else None


def settle_record(attempts: list[Settling]) -> dict[str, Any]:
    """The verdict's `profile.settlement`: the last attempt decides; earlier ones are kept as evidence."""
    last = attempts[-1]
    return {**last.to_dict(), "limits": {"spread": SPREAD_LIMIT, "agreement": AGREEMENT_LIMIT},
            "attempts": [a.to_dict() for a in attempts]}
