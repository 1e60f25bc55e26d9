"""The transfer benchmark's budget curve as an SVG line chart (templates/_budget_curve.html): each strategy's
geometric-mean speedup over the naive kernels had every run stopped after N gate evaluations, N from 1 to the
budget, on a log scale from 1x. SVG user units: a 320 by 150 view box."""

from __future__ import annotations

import math
from typing import Any

# drawn in this order, the library last so that it lies on top; each with its line's CSS class
SERIES = (("unconditioned_greedy", "greedy search", "curve-greedy"),
          ("unconditioned_random", "random search", "curve-random"),
          ("library", "library", "curve-library"), ("library_then_catalog", "library, then catalog", "curve-library"))
LEFT, RIGHT, TOP, BOTTOM = 34.0, 312.0, 8.0, 118.0


def budget_curve(points: list[dict[str, Any]], caption: str) -> dict[str, Any] | None:
    """The chart of a document's `by_budget` points; a strategy is drawn only where every point has its value (a
    gap would read as a fall), and no chart where none is complete or there are fewer than two budgets."""
    if len(points) < 2:
        return None
    drawn = [(key, name, css) for key, name, css in SERIES
             if all(isinstance(p.get(key), (int, float)) and p[key] > 0 for p in points)]
    if not drawn:
        return None
    budgets = [p["budget"] for p in points]
    top = math.log(max(p[key] for p in points for key, _, _ in drawn) * 1.15)

    def x(budget: int) -> float:
        return round(LEFT + (RIGHT - LEFT) * (budget - budgets[0]) / (budgets[-1] - budgets[0]), 1)

    def y(value: float) -> float:
        return round(BOTTOM - (BOTTOM - TOP) * math.log(max(value, 1.0)) / top, 1)  # top >= log(1.15) > 0

    ticks = [v for v in (1, 2, 4, 8, 16, 32) if math.log(v) <= top]
    series = [{"name": name, "css": css,
               "points": " ".join(f"{x(p['budget'])},{y(p[key])}" for p in points),
               "marks": [{"x": x(p["budget"]), "y": y(p[key]), "budget": p["budget"], "value": p[key]} for p in points]}
              for key, name, css in drawn]
    return {"series": series, "caption": caption, "left": LEFT, "right": RIGHT, "tick_label_x": LEFT - 4,
            "x_ticks": [{"x": x(b), "y": BOTTOM + 12, "label": b} for b in budgets],
            "y_ticks": [{"y": y(v), "text_y": y(v) + 3, "label": f"{v}×"} for v in ticks]}
