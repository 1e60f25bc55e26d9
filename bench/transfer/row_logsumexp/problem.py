"""Log-sum-exp over the rows of a 2-D fp32 tensor: y[r] = max + log(sum(exp(x[r] - max))).

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel is written as PyTorch extensions write one: a template over the
element and accumulator types, launched as its float instance, which the file instantiates.
"""

from __future__ import annotations

import torch

OPERATOR = "row_logsumexp"

CASES = {
    "headline": {"rows": 16384, "cols": 2048},
    "ragged": {"rows": 1000, "cols": 3001},
    "narrow": {"rows": 4099, "cols": 30},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["rows"], "dtype": "float32"}}

# a row's fp32 sum of thousands of terms, whatever order its lanes add them in
TOLERANCES = {"float32": {"rtol": 1e-5, "atol": 1e-4, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x15E + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    x = torch.randn(rows, cols, generator=gen) * 4 + torch.randn(rows, 1, generator=gen) * 100
    return {"x": x.to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.logsumexp(inputs["x"].double(), dim=-1).float()}


def vendor(inputs: dict) -> dict:
    return {"y": torch.logsumexp(inputs["x"], dim=-1)}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 4.0 * n, "bytes": 4.0 * n}
