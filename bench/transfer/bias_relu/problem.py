"""Bias and ReLU over a matrix: y = relu(x + b), b broadcast down the rows, fp32.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel is written on a 2-D launch, a row per blockIdx.y, as people often
write a matrix's elementwise kernels.
"""

from __future__ import annotations

import torch

OPERATOR = "bias_relu"

CASES = {
    "headline": {"rows": 16384, "cols": 1024},
    "ragged": {"rows": 1000, "cols": 3001},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["rows", "cols"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-6, "atol": 1e-6, "rel_l2": 1e-6}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xB1A5 + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    return {"x": torch.randn(rows, cols, generator=gen).to(device), "b": torch.randn(cols, generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.relu(inputs["x"].double() + inputs["b"].double()).float()}


def vendor(inputs: dict) -> dict:
    return {"y": torch.relu(inputs["x"] + inputs["b"])}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 2.0 * n, "bytes": 8.0 * n + 4.0 * int(case["cols"])}
