"""A lineage at a glance: one table row per step and the cumulative speedup by step, in forward terms.

Every step is read in the forward direction, the skill's: from the simpler kernel (the step's child)
to the one with the mechanism (its parent). A step's ratio is child time / parent time, so above 1
the mechanism made the kernel faster. The chart multiplies the paired ratios from the simplest state
reached up to the expert: each pair was timed on its own, so the product estimates the end-to-end
speedup rather than measuring it, and the page says so.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from klineage.skills.standing import Pace, forward_words, pace, ratio_text
from klineage.skills.titles import anchor_where, forward_verb
from skills_app.models import LineageStep

CHART_WIDTH, CHART_HEIGHT, PAD = 640, 220, 36
# grid multipliers by the decades the chart spans: over one, a few; within a few percent, fine ones
TICKS_COARSE = (1, 2, 5)
TICKS_MEDIUM = (1, 1.2, 1.5, 2, 3, 5, 7)
TICKS_FINE = (1, 1.02, 1.05, 1.1, 1.2, 1.5, 2, 3, 5, 7)


def sass_totals(state: dict[str, Any]) -> Counter[str]:
    """SASS instruction counts of a state, by instruction class over all functions."""
    totals: Counter[str] = Counter()
    for row in ((state.get("features") or {}).get("sass") or {}).get("counts", []):
        totals[row.get("name", "?")] += int(row.get("count", 0))
    return totals


def sass_delta(without: Counter[str], with_: Counter[str], top: int = 4) -> list[dict[str, Any]]:
    """The largest changes in instruction counts from `without` to `with_`, largest first."""
    changes = [(name, with_[name] - without[name]) for name in set(without) | set(with_)]
    changes = sorted((c for c in changes if c[1]), key=lambda c: (-abs(c[1]), c[0]))[:top]
    return [{"name": name, "delta": delta, "text": f"{delta:+,} {name}"} for name, delta in changes]


def step_row(step: LineageStep, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One step as the overview shows it."""
    timing = step.forward_timing or {}
    overall = timing.get("overall")
    per_trial = [float(v) for v in timing.get("per_trial", [])]
    required = float(timing.get("required", 0.99))
    words = forward_words(step.forward_status, overall, per_trial, required)
    change = abs(overall - 1.0) * 100 if overall else None
    accepted = step.kind == LineageStep.Kind.ACCEPTED
    parent = states.get(step.parent_state.fingerprint, {}) if step.parent_state_id else {}
    child = states.get(step.child_state.fingerprint, {}) if step.child_state_id else {}
    return {
        "step": step,
        "accepted": accepted,
        "verb": forward_verb(step.transform),
        "where": anchor_where(step.anchor or {}),
        "ratio": ratio_text(overall, required) if overall else "",
        "trials": ", ".join(ratio_text(v, required) for v in per_trial),
        "faster": overall is not None and pace(overall) is Pace.FASTER,
        "change": change,
        "words": words if accepted else None,
        "rejection": (step.evidence or {}).get("stage", "") if not accepted else "",
        "sass": sass_delta(sass_totals(child), sass_totals(parent)) if accepted and child and parent else [],
        "anchor_id": f"step-{step.kind}-{step.index}",
    }


def speedup_chart(accepted: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Cumulative speedup over the simplest state, applying accepted steps naive -> expert (highest
    index first), on a log scale; an untimed step carries the running product on, drawn hollow."""
    if not accepted:
        return None
    ordered = sorted(accepted, key=lambda r: -r["step"].index)
    running, points = 1.0, [{"label": "simplest state", "value": 1.0, "timed": True, "step": None}]
    for row in ordered:
        overall = (row["step"].forward_timing or {}).get("overall")
        if overall:
            running *= float(overall)
        points.append({"label": f"step {row['step'].index}: {row['verb']}", "value": running, "timed": bool(overall),
                       "step": row["step"].index, "href": row.get("href", f"#{row['anchor_id']}")})
    if not any(p["timed"] for p in points[1:]):
        return None
    logs = [math.log10(p["value"]) for p in points]
    low, high = min(0.0, *logs), max(0.0, *logs)
    span = (high - low) or 1.0
    inner_w, inner_h = CHART_WIDTH - 2 * PAD, CHART_HEIGHT - 2 * PAD
    step_x = inner_w / max(1, len(points) - 1)
    for i, (point, log) in enumerate(zip(points, logs)):
        point["x"] = round(PAD + i * step_x, 1)
        point["y"] = round(PAD + inner_h * (high - log) / span, 1)
        point["text"] = ratio_text(point["value"])
    ticks = _ticks(low, high)
    return {
        "points": points,
        "line": " ".join(f"{p['x']},{p['y']}" for p in points),
        "ticks": [{"y": round(PAD + inner_h * (high - math.log10(t)) / span, 1), "label": f"{t:g}x"} for t in ticks],
        "width": CHART_WIDTH, "height": CHART_HEIGHT, "pad": PAD, "right": CHART_WIDTH - PAD,
        "bottom": CHART_HEIGHT - PAD, "final": points[-1]["text"], "untimed": sum(not p["timed"] for p in points),
    }


def _ticks(low: float, high: float, most: int = 6) -> list[float]:
    """Round ratios between 10**low and 10**high for the chart's grid, 1 always among them."""
    width = high - low
    steps = TICKS_COARSE if width > 1 else TICKS_MEDIUM if width > 0.3 else TICKS_FINE
    found = sorted({round(m * 10 ** e, 6) for e in range(math.floor(low) - 1, math.ceil(high) + 1) for m in steps
                    if low - 1e-9 <= math.log10(m * 10 ** e) <= high + 1e-9})
    while len(found) > most:
        found = found[::2] if 1.0 in found[::2] else found[1::2]
    return found
