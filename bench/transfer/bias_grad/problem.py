"""Bias gradient of a linear layer: the sum of the output gradient over its rows, db[c] = sum_r dy[r, c], fp32.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel runs one thread per column, walking down every row.
"""

from __future__ import annotations

import torch

OPERATOR = "bias_grad"

CASES = {
    "headline": {"rows": 16384, "cols": 1024},  # a batch of tokens times a hidden size
    "ragged": {"rows": 3001, "cols": 777},
    "tall": {"rows": 262144, "cols": 64},
    "wide": {"rows": 64, "cols": 65536},
    "small": {"rows": 5, "cols": 33},
}
HEADLINE = "headline"

OUTPUTS = {"db": {"shape": ["cols"], "dtype": "float32"}}

# A sum of up to 262,144 float32 terms of unit scale, in another order than the float64 reference's. The
# rounding of a running sum grows with the partial sums (about sqrt(rows)): summed in row order, as the naive
# kernel does, tall's columns are off by up to 2.2e-2 and the headline's by 1.5e-3 (seeds 0-2, numpy on the
# CPU), where a sum that cancels toward zero leaves rtol nothing to scale, and their relative L2 error
# reaches 9.5e-6. So atol 5e-2 and rel_l2 3e-5, over twice the row-order error; one element dropped or
# counted twice moves its column by about 1 and the relative L2 by over 2e-4, which both still catch.
TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 5e-2, "rel_l2": 3e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xB1A5 + int(seed))
    return {"dy": torch.randn(int(case["rows"]), int(case["cols"]), generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    return {"db": inputs["dy"].double().sum(dim=0).float()}


def vendor(inputs: dict) -> dict:
    return {"db": inputs["dy"].sum(dim=0)}


def roofline(case: dict) -> dict:
    rows, cols = int(case["rows"]), int(case["cols"])
    return {"flops": 1.0 * rows * cols, "bytes": 4.0 * rows * cols + 4.0 * cols}
