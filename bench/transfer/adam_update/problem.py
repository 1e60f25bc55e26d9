"""One fused Adam step (lr 1e-3, betas 0.9/0.999, eps 1e-8, step 10) over fp32 parameter vectors.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "adam_update"

CASES = {
    "headline": {"n": 16777216},
    "ragged": {"n": 1000003},
    "small": {"n": 4099},
}
HEADLINE = "headline"

OUTPUTS = {name: {"shape": ["n"], "dtype": "float32"} for name in ("p_out", "m_out", "v_out")}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    n = int(case["n"])
    p, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 0.1
    m, v = torch.randn(n, generator=gen) * 0.01, torch.rand(n, generator=gen) * 1e-3
    return {"p": p.to(device), "g": g.to(device), "m": m.to(device), "v": v.to(device)}


def reference(inputs: dict) -> dict:
    p, g, m, v = (inputs[k].double() for k in ("p", "g", "m", "v"))
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    m_hat, v_hat = m / (1 - 0.9 ** 10), v / (1 - 0.999 ** 10)
    p = p - 1e-3 * m_hat / (v_hat.sqrt() + 1e-8)
    return {"p_out": p.float(), "m_out": m.float(), "v_out": v.float()}


def vendor(inputs: dict) -> dict:
    p, g, m, v = (inputs[k] for k in ("p", "g", "m", "v"))
    m = torch.lerp(m, g, 0.1)
    v = v * 0.999 + 0.001 * g * g
    p = p - 1e-3 * (m / (1 - 0.9 ** 10)) / ((v / (1 - 0.999 ** 10)).sqrt() + 1e-8)
    return {"p_out": p, "m_out": m, "v_out": v}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 14.0 * n, "bytes": 28.0 * n}
