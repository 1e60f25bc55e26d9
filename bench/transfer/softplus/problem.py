"""Softplus, log(1 + exp(x)) (x itself past 20), elementwise over an fp32 vector.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel is a grid-stride loop on a grid of a fixed size, as CUDA guides
teach.
"""

from __future__ import annotations

import torch

OPERATOR = "softplus"

CASES = {
    "headline": {"n": 16777216},
    "ragged": {"n": 1000003},
    "small": {"n": 4099},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-5, "atol": 1e-6, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x50F7 + int(seed))
    return {"x": (torch.randn(int(case["n"]), generator=gen) * 8).to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.nn.functional.softplus(inputs["x"].double(), threshold=20.0).float()}


def vendor(inputs: dict) -> dict:
    return {"y": torch.nn.functional.softplus(inputs["x"], threshold=20.0)}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 4.0 * n, "bytes": 8.0 * n}
