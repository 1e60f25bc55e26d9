"""Batched small matrix-vector product: y[b, i] = sum_k A[b, i, k] * x[b, k].

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "batched_matvec"

CASES = {
    "headline": {"batch": 4096, "m": 64, "k": 256},
    "ragged": {"batch": 1001, "m": 33, "k": 97},
    "small": {"batch": 7, "m": 5, "k": 3},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["batch", "m"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-4, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    b, m, k = int(case["batch"]), int(case["m"]), int(case["k"])
    return {"a": torch.randn(b, m, k, generator=gen).to(device), "x": torch.randn(b, k, generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.bmm(inputs["a"].double(), inputs["x"].double().unsqueeze(-1)).squeeze(-1).float()}


def vendor(inputs: dict) -> dict:
    return {"y": torch.bmm(inputs["a"], inputs["x"].unsqueeze(-1)).squeeze(-1)}


def roofline(case: dict) -> dict:
    b, m, k = int(case["batch"]), int(case["m"]), int(case["k"])
    return {"flops": 2.0 * b * m * k, "bytes": 4.0 * (b * m * k + b * k + b * m)}
