"""Dropout's forward with a given mask: y = x * scale where mask, else 0; the mask one byte per element, fp32 data.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "masked_scale"

CASES = {
    "headline": {"n": 16777216, "scale": 1.25},
    "ragged": {"n": 1000003, "scale": 2.0},
    "small": {"n": 4099, "scale": 1.25},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-6, "atol": 1e-7, "rel_l2": 1e-6}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xD0 + int(seed))
    n = int(case["n"])
    mask = (torch.rand(n, generator=gen) < 0.8).to(torch.uint8)
    return {"x": torch.randn(n, generator=gen).to(device), "mask": mask.to(device)}


def reference(inputs: dict, case: dict) -> dict:
    kept = inputs["x"].double() * float(case["scale"])
    return {"y": torch.where(inputs["mask"].bool(), kept, torch.zeros_like(kept)).float()}


def vendor(inputs: dict, case: dict) -> dict:
    return {"y": inputs["x"] * inputs["mask"] * float(case["scale"])}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 2.0 * n, "bytes": 9.0 * n}
