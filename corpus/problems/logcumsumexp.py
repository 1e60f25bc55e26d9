"""Log-cumulative-sum-exp along the rows: y[r, c] = log(sum over c' <= c of exp(x[r, c'])) (torch.logcumsumexp).

An inclusive scan whose operator is log-add-exp, a (+) b = max(a, b) + log(1 + exp(-|a - b|)),
over a 2-D fp32 tensor. Memory-bound when the scan is parallel: x read once, y written once, a few
transcendental operations per element. The operator is associative but not exactly so in floating
point: the reference scans sequentially in fp64, and a parallel scan lands within a few fp32 ulps.

Cases:
- headline     16384 x 4096: 256 MiB in, 256 MiB out.
- ragged       1000 x 3001: a width that no tile or vector divides.
- long_rows    7 x 99991: few, long rows (prime width): many tiles carried along one row.
- narrow       4099 x 30: rows shorter than a warp.
- mid_aligned  2053 x 1540: width divisible by 4 but by no tile.
- small        33 x 257: the smallest; the sanitizer runs here.

Inputs mix row kinds: scaled normals, rows offset by hundreds (exp overflows without the max shift),
decreasing rows (the running value barely moves) and rows with rare large spikes.
"""

from __future__ import annotations

import torch

OPERATOR = "logcumsumexp"

CASES = {
    "headline": {"rows": 16384, "cols": 4096},
    "ragged": {"rows": 1000, "cols": 3001},
    "long_rows": {"rows": 7, "cols": 99991},
    "narrow": {"rows": 4099, "cols": 30},
    "mid_aligned": {"rows": 2053, "cols": 1540},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

SWEEP = {  # timed only: row length against the tile, alignment, and rows against the SMs
    "rows_few": {"rows": 64, "cols": 65536},  # fewer rows than SMs: long serial tile chains
    "rows_many": {"rows": 131072, "cols": 512},
    "cols_short": {"rows": 65536, "cols": 64},
    "cols_tile": {"rows": 8192, "cols": 2048},  # exactly one tile per row
    "cols_unaligned": {"rows": 16384, "cols": 4095},  # no float4 rows
    "one_wave": {"rows": 1056, "cols": 8192},
    # A handful of rows, down to one: a launch whose work is a single short scan chain.
    "one_row": {"rows": 1, "cols": 64},
    "rows_tiny": {"rows": 4, "cols": 256},
    "one_long_row": {"rows": 1, "cols": 8192},
}

OUTPUTS = {"y": {"shape": ["rows", "cols"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 2e-5, "rel_l2": 1e-5}}

MATH = "fp32"

_NORMAL, _OFFSET, _FALLING, _SPIKY = range(4)
_WEIGHTS = torch.tensor([0.5, 0.2, 0.15, 0.15], dtype=torch.float64)


def make_inputs(case: dict, seed: int, device) -> dict:
    """x of shape (rows, cols), fp32, deterministic per seed on every device."""
    rows, cols = int(case["rows"]), int(case["cols"])
    gen = torch.Generator(device="cpu").manual_seed(0x1C5E0000 + int(seed))
    kinds = torch.multinomial(_WEIGHTS, rows, replacement=True, generator=gen)
    if rows >= len(_WEIGHTS):
        kinds[torch.randperm(rows, generator=gen)[: len(_WEIGHTS)]] = torch.arange(len(_WEIGHTS))
    is_kind = [(kinds == k).float()[:, None] for k in range(len(_WEIGHTS))]
    scale = torch.empty(rows, 1).uniform_(0.5, 4.0, generator=gen)
    offset = torch.empty(rows, 1).uniform_(-600.0, 600.0, generator=gen)
    slope = torch.empty(rows, 1).uniform_(0.001, 0.05, generator=gen)
    position = torch.arange(cols, dtype=torch.float32)[None, :]
    x = torch.randn(rows, cols, generator=gen)
    x.mul_(is_kind[_NORMAL] * scale + is_kind[_OFFSET] + is_kind[_FALLING] * 0.1 + is_kind[_SPIKY])
    x.add_(is_kind[_OFFSET] * offset - is_kind[_FALLING] * slope * position)
    spikes = (torch.rand(rows, cols, generator=gen) < 0.002).float() * 40.0
    x.add_(is_kind[_SPIKY] * spikes)
    return {"x": x.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    return {"y": torch.logcumsumexp(inputs["x"].to(torch.float64), dim=1).to(torch.float32)}


def vendor(inputs: dict) -> dict:
    return {"y": torch.logcumsumexp(inputs["x"], dim=1)}


def roofline(case: dict) -> dict:
    # Per element, one log-add-exp: max, subtract, abs, exp, add, log, add = 7 flops.
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 7.0 * n, "bytes": 2.0 * 4 * n}
