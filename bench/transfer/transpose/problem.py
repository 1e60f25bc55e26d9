"""Transpose of a 2-D fp32 tensor: y[c, r] = x[r, c].

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "transpose"

CASES = {
    "headline": {"rows": 16384, "cols": 4096},
    "ragged": {"rows": 1000, "cols": 3001},
    "narrow": {"rows": 4099, "cols": 30},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["cols", "rows"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    x = torch.randn(rows, cols, generator=gen)
    return {"x": x.to(device)}


def reference(inputs: dict) -> dict:
    return {"y": inputs["x"].t().contiguous()}


def vendor(inputs: dict) -> dict:
    return {"y": inputs["x"].t().contiguous()}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 0.0, "bytes": 8.0 * n}
