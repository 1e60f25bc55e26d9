"""Hard swish, x * relu6(x + 3) / 6, elementwise over an fp32 vector.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel is written as PyTorch extensions write one: a template over the
element type with a 64-bit count, launched as its float instance, which the file instantiates.
"""

from __future__ import annotations

import torch

OPERATOR = "hardswish"

CASES = {
    "headline": {"n": 16777216},
    "ragged": {"n": 1000003},
    "small": {"n": 4099},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-5, "atol": 1e-6, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x4A5D + int(seed))
    return {"x": (torch.randn(int(case["n"]), generator=gen) * 4).to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.nn.functional.hardswish(inputs["x"].double()).float()}


def vendor(inputs: dict) -> dict:
    return {"y": torch.nn.functional.hardswish(inputs["x"])}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 5.0 * n, "bytes": 8.0 * n}
