"""Layer norm: y = (x - mean) / sqrt(var + 1e-5) * w + b over the rows of a 2-D fp32 tensor.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "layer_norm"

CASES = {
    "headline": {"rows": 16384, "cols": 2048},
    "ragged": {"rows": 1000, "cols": 3001},
    "narrow": {"rows": 4099, "cols": 30},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

SWEEP = {
    # Timed only, by a gate that times every case (bench/row_cache_when.py): rows whose length divides by 4 or
    # not, short and long, a grid under one wave of the H200's SMs, a row too long for a 2,048-column cache.
    "cols64": {"rows": 131072, "cols": 64},
    "cols256": {"rows": 32768, "cols": 256},
    "cols1000": {"rows": 8192, "cols": 1000},
    "cols1026": {"rows": 8192, "cols": 1026},
    "cols2048_few": {"rows": 256, "cols": 2048},
    "cols2052": {"rows": 4096, "cols": 2052},
}

OUTPUTS = {"y": {"shape": ["rows", "cols"], "dtype": "float32"}}

# fp32 sums over a row of thousands leave about 2e-5 absolute near zero outputs (the naive kernel's worst on the
# H200: 2.5e-5; relative L2 about 1e-6), so atol 1e-4 as for the other row reductions here.
TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-4, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    rows, cols = int(case["rows"]), int(case["cols"])
    x = torch.randn(rows, cols, generator=gen) * 2 + torch.randn(rows, 1, generator=gen) * 5
    w = torch.rand(cols, generator=gen) + 0.5
    b = torch.randn(cols, generator=gen)
    return {"x": x.to(device), "w": w.to(device), "b": b.to(device)}


def reference(inputs: dict) -> dict:
    x = inputs["x"].double()
    y = torch.nn.functional.layer_norm(x, (x.shape[-1],), inputs["w"].double(), inputs["b"].double(), 1e-5)
    return {"y": y.float()}


def vendor(inputs: dict) -> dict:
    x = inputs["x"]
    return {"y": torch.nn.functional.layer_norm(x, (x.shape[-1],), inputs["w"], inputs["b"], 1e-5)}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 7.0 * n, "bytes": 8.0 * n}
