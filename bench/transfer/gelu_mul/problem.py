"""Fused gated GELU: out = gelu(gate) * up (erf form), elementwise over fp32 vectors.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "gelu_mul"

CASES = {
    "headline": {"n": 16777216},
    "ragged": {"n": 1000003},
    "small": {"n": 4099},
}
HEADLINE = "headline"

OUTPUTS = {"out": {"shape": ["n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    n = int(case["n"])
    return {"gate": (torch.randn(n, generator=gen) * 3).to(device), "up": torch.randn(n, generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    g, u = inputs["gate"].double(), inputs["up"].double()
    return {"out": (torch.nn.functional.gelu(g) * u).float()}


def vendor(inputs: dict) -> dict:
    return {"out": torch.nn.functional.gelu(inputs["gate"]) * inputs["up"]}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 10.0 * n, "bytes": 12.0 * n}
