"""Bias add, GELU and a per-channel scale: out[r, c] = gelu(x[r, c] + bias[c]) * scale[c] (erf form), for
scalarize_row_gather's column-broadcast GPU test (its own operator, not a corpus or transfer one). The odd case's
row length (1001) does not divide by four: the forwarded kernel's scalar path must give the same bits there."""

from __future__ import annotations

import torch

OPERATOR = "bias_gelu_scale"

CASES = {
    "headline": {"rows": 8192, "cols": 4096},
    "odd": {"rows": 3001, "cols": 1001},
    "small": {"rows": 3, "cols": 8},
}
HEADLINE = "headline"

OUTPUTS = {"out": {"shape": ["rows", "cols"], "dtype": "float32"}}

# CUDA's erff and torch's erf may differ in the last bits
TOLERANCES = {"float32": {"rtol": 1e-5, "atol": 1e-6, "rel_l2": 1e-6}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xB1A5 + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    x = torch.randn(rows, cols, generator=gen) * 2.0
    bias = torch.randn(cols, generator=gen)
    scale = torch.empty(cols).uniform_(0.5, 1.5, generator=gen)
    return {"x": x.to(device), "bias": bias.to(device), "scale": scale.to(device)}


def reference(inputs: dict) -> dict:
    x, bias, scale = (inputs[k].double() for k in ("x", "bias", "scale"))
    return {"out": (torch.nn.functional.gelu(x + bias) * scale).float()}


def vendor(inputs: dict) -> dict:
    return {"out": torch.nn.functional.gelu(inputs["x"] + inputs["bias"]) * inputs["scale"]}


def roofline(case: dict) -> dict:
    rows, cols = int(case["rows"]), int(case["cols"])
    return {"flops": 0.0, "bytes": 8.0 * rows * cols + 8.0 * cols}
