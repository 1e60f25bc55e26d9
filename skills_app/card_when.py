"""The card page's "when it pays": each measured case's effect drawn against the card's timing precondition.

`when_chart` reads the card document only: its effects (per case, the median over its steps, as
`klineage.skills.when.card_when` reads them) and its timing precondition's per-case facts. The x axis is
the fact the predicate names (log scale where its values span more than 8x), else the cases in order of
their effect; the y axis is child time / parent time on a log scale, with the required ratio and 1.0
marked; a filled point paid (reached the required ratio), a hollow one did not; the threshold of a
one-atom `name >= v` / `name <= v` predicate is a vertical line. SVG user units, a 320 x 180 view box.
"""

from __future__ import annotations

import math
import re
from typing import Any

from klineage.skills.card import SkillCard as EngineCard
from klineage.skills.facts import meaning
from klineage.skills.when import REPEATABILITY, SOURCE, card_when

WIDTH, HEIGHT = 320, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 312, 10, 150
_THRESHOLD = re.compile(r"^\s*(\w+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*$")


def _scale(values: list[float], low: int, high: int, log: bool):
    lo, hi = min(values), max(values)
    if log:
        lo, hi = math.log(lo), math.log(hi)
    span = (hi - lo) or 1.0

    def place(v: float) -> float:
        v = math.log(v) if log else v
        return round(low + (high - low) * (v - lo) / span, 1)
    return place


def when_chart(document: dict[str, Any]) -> dict[str, Any]:
    """What the `_card_when.html` partial draws and lists for one card document."""
    when = card_when(EngineCard.from_dict(document))
    p = when.precondition
    out: dict[str, Any] = {"kind": when.kind.value, "sentence": when.sentence, "required": when.required,
                           "precondition": p.to_dict() if p else None, "loo": when.loo_accuracy,
                           "cases": len(when.cases), "paid": len(when.paid), "points": [], "chart": None,
                           "spread": f"{REPEATABILITY:.1%}"}
    if p is not None:  # how the decided cases fall on each side, counted from the measurements, exceptions too
        out["terms"] = [{"name": n, "meaning": meaning(n, document["scope"].get("operators", ()))}
                        for n in sorted(p.names)]
        paid = set(when.paid)
        out["split"] = {"held": len(p.holds), "held_paid": sum(c in paid for c in p.holds),
                        "failed": len(p.fails), "failed_paid": sum(c in paid for c in p.fails),
                        "kernel_loo": p.kernel_loo_accuracy}
    if not when.cases:
        return out
    names = sorted(p.names) if p else []
    axis = next((n for n in names if all(isinstance((p.facts.get(r.case) or {}).get(n), (int, float))
                                         and not isinstance((p.facts.get(r.case) or {}).get(n), bool)
                                         for r in when.cases)), None)
    rows = [{"case": r.case, "ratio": r.ratio, "paid": r.paid, "outcome": r.outcome.value,
             "holds": p.holds_on(r.case) if p else None,
             "facts": (p.facts.get(r.case) or {}) if p else {}, "x_value": (p.facts.get(r.case) or {}).get(axis)
             if axis else None} for r in when.cases]
    rows.sort(key=lambda r: (r["x_value"] if axis else r["ratio"], r["case"]))
    xs = [float(r["x_value"]) for r in rows] if axis else [float(i) for i in range(len(rows))]
    positive = all(x > 0 for x in xs)
    log_x = bool(axis) and positive and max(xs) / min(xs) > 8
    place_x = _scale(xs, LEFT, RIGHT, log_x)
    ratios = [r["ratio"] for r in rows] + [when.required, 1.0]
    low_up = _scale([max(ratios) * 1.02, min(ratios) / 1.02], TOP, BOTTOM, True)

    def place_y(ratio: float) -> float:  # faster (a larger ratio) is higher: SVG's y grows downwards
        return round(TOP + BOTTOM - low_up(ratio), 1)
    for row, x in zip(rows, xs):
        row.update(x=place_x(x), y=place_y(row["ratio"]))
    top, bottom = max(r["ratio"] for r in rows), min(r["ratio"] for r in rows)
    chart = {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": RIGHT, "top": TOP, "bottom": BOTTOM,
             "axis": axis or "", "log_x": log_x, "required_y": place_y(when.required), "one_y": place_y(1.0),
             "threshold": None,
             # the extremes labelled on each axis, so the picture reads without the table
             "y_labels": [{"y": place_y(v), "text": f"{v:.2f}×"} for v in dict.fromkeys((top, bottom))
                          if abs(place_y(v) - place_y(when.required)) > 8],
             "x_labels": [{"x": place_x(v), "text": f"{v:g}"} for v in dict.fromkeys((min(xs), max(xs)))]
             if axis else []}
    match = _THRESHOLD.match(p.expression) if p else None
    if match and axis == match.group(1):
        value = float(match.group(3))
        if (not log_x or value > 0) and min(xs) <= value <= max(xs):
            chart["threshold"] = {"x": place_x(value), "label": f"{axis} {match.group(2)} {match.group(3)}"}
    out.update(points=rows, chart=chart)
    return out


def soundness_preconditions(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The card's preconditions that say when it is sound (the partial shows where it pays)."""
    return [p for p in document["preconditions"] if p["source"] != SOURCE]
