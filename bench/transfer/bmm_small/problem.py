"""A batch of small matrix products, C[b] = A[b] B[b], fp32 (attention-sized heads, a mixture of experts' blocks).

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel is one thread per output on a 3-D grid, one layer per matrix.
"""

from __future__ import annotations

import torch

OPERATOR = "bmm_small"

CASES = {
    "headline": {"batch": 1024, "m": 64, "n": 64, "k": 64},
    "ragged": {"batch": 100, "m": 50, "n": 70, "k": 33},
    "small": {"batch": 3, "m": 17, "n": 9, "k": 5},
}
HEADLINE = "headline"

OUTPUTS = {"c": {"shape": ["batch", "m", "n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xB33 + int(seed))
    batch, m, n, k = (int(case[key]) for key in ("batch", "m", "n", "k"))
    return {"a": torch.randn(batch, m, k, generator=gen).to(device),
            "b": torch.randn(batch, k, n, generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    return {"c": torch.bmm(inputs["a"].double(), inputs["b"].double()).float()}


def vendor(inputs: dict) -> dict:
    return {"c": torch.bmm(inputs["a"], inputs["b"])}


def roofline(case: dict) -> dict:
    batch, m, n, k = (int(case[key]) for key in ("batch", "m", "n", "k"))
    return {"flops": 2.0 * batch * m * n * k, "bytes": 4.0 * batch * (m * k + k * n + m * n)}
