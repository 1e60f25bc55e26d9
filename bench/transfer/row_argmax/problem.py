"""Row maximum with its index (the first on ties) over a 2-D fp32 tensor.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "row_argmax"

CASES = {
    "headline": {"rows": 16384, "cols": 2048},
    "ragged": {"rows": 1000, "cols": 3001},
    "narrow": {"rows": 4099, "cols": 30},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

OUTPUTS = {"value": {"shape": ["rows"], "dtype": "float32"}, "index": {"shape": ["rows"], "dtype": "int64"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}  # int64 outputs are compared exactly


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    x = torch.randn(rows, cols, generator=gen)
    return {"x": x.to(device)}


def reference(inputs: dict) -> dict:
    value, index = torch.max(inputs["x"], dim=-1)
    return {"value": value, "index": index}


def vendor(inputs: dict) -> dict:
    value, index = torch.max(inputs["x"], dim=-1)
    return {"value": value, "index": index}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 1.0 * n, "bytes": 4.0 * n + 12.0 * int(case["rows"])}
