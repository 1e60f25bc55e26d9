"""Fused residual add and RMS norm in bf16, the pre-norm step of a transformer block.

For bf16 tensors x and residual of shape (rows, d) and a bf16 weight of d:
    h = bf16(x + residual)                              (the new residual stream, an output)
    y = bf16(h / sqrt(mean(h^2) + 1e-6) * weight)       (the normalised input of the next layer)
with the sum, the statistics and the scaling in fp32 or better. Memory-bound: x and residual read
once, h and y written once (8 bytes per element); a kernel that keeps the row on chip reads nothing twice.

Cases:
- headline     16384 x 4096: 256 MiB read, 256 MiB written.
- ragged       1000 x 3001: an odd width, so rows after the first are not 16-byte aligned.
- long_rows    7 x 16392: rows longer than the register cache (divisible by 8).
- narrow       4099 x 30: rows shorter than a warp.
- mid_aligned  2053 x 1544: width divisible by 8 but by no block tile.
- small        33 x 257: the smallest; the sanitizer runs here.
"""

from __future__ import annotations

import torch

OPERATOR = "add_rms_norm"

CASES = {
    "headline": {"rows": 16384, "d": 4096},
    "ragged": {"rows": 1000, "d": 3001},
    "long_rows": {"rows": 7, "d": 16392},
    "narrow": {"rows": 4099, "d": 30},
    "mid_aligned": {"rows": 2053, "d": 1544},
    "small": {"rows": 33, "d": 257},
}
HEADLINE = "headline"

SWEEP = {  # timed only: row length against the register cache and the pack, rows against the SMs
    "rows_few": {"rows": 64, "d": 8192},  # fewer rows than SMs
    "rows_many": {"rows": 131072, "d": 1024},
    "d_short": {"rows": 65536, "d": 128},
    "d_long": {"rows": 1024, "d": 32768},  # past the register cache: re-read
    "d_unaligned": {"rows": 16384, "d": 4100},  # divisible by 4, not 8: no 16-byte packs
    "one_wave": {"rows": 1056, "d": 8192},
}

OUTPUTS = {"y": {"shape": ["rows", "d"], "dtype": "bfloat16"}, "h": {"shape": ["rows", "d"], "dtype": "bfloat16"}}

TOLERANCES = {"bfloat16": {"rtol": 2e-2, "atol": 2e-2, "rel_l2": 1e-2}}

MATH = "fp32"

EPS = 1e-6


def make_inputs(case: dict, seed: int, device) -> dict:
    """x, residual (rows, d) and weight (d,), bf16; per-row scales from 0.01 to 50 (the norm removes them)."""
    rows, d = int(case["rows"]), int(case["d"])
    gen = torch.Generator(device="cpu").manual_seed(0xAD0A0000 + int(seed))
    scale = torch.empty(rows, 1).uniform_(-2.0, 1.7, generator=gen).exp_()
    x = torch.randn(rows, d, generator=gen).mul_(scale)
    residual = torch.randn(rows, d, generator=gen).mul_(scale * 3.0)
    weight = torch.empty(d).uniform_(0.2, 2.0, generator=gen)
    to = dict(dtype=torch.bfloat16, device=device)
    return {"x": x.to(**to), "residual": residual.to(**to), "weight": weight.to(**to)}


def reference(inputs: dict) -> dict:
    h = (inputs["x"].to(torch.float64) + inputs["residual"].to(torch.float64)).to(torch.bfloat16)
    hd = h.to(torch.float64)
    y = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + EPS) * inputs["weight"].to(torch.float64)
    return {"y": y.to(torch.bfloat16), "h": h}


def vendor(inputs: dict) -> dict:
    h = inputs["x"] + inputs["residual"]
    hf = h.float()
    y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * inputs["weight"].float()).to(torch.bfloat16)
    return {"y": y, "h": h}


def roofline(case: dict) -> dict:
    # Per element: add, square-accumulate (2), scale and weight (2) = 5 flops; bf16 x, residual in, h, y out.
    n = int(case["rows"]) * int(case["d"])
    return {"flops": 5.0 * n, "bytes": 4 * 2.0 * n + 2.0 * int(case["d"])}
