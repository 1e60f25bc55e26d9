"""Row softmax: y[r, c] = exp(x[r, c] - max_r) / sum_c' exp(x[r, c'] - max_r), over a 2-D fp32 tensor.

The bundled first example. It is memory-bound: a kernel reads x once and writes y once (8 bytes
per element) and does a handful of arithmetic operations per element, so the roofline floor is
bandwidth. Row maxima must be subtracted before exponentiating: some rows sit near +-1000, where
exp overflows fp32 without it.

Cases:
- headline     16384 x 4096: 256 MiB in, 256 MiB out, so timings sit far above launch overhead.
- ragged       1000 x 3001: a column count that no tile or vector width divides, and rows whose
               starts are not 16-byte aligned.
- long_rows    7 x 9973: few, long rows (prime width); a row larger than any per-thread cache.
- narrow       4099 x 30: rows shorter than a warp, so most lanes of a row's warp have nothing.
- mid_aligned  2053 x 1540: width divisible by 4 (vector loads apply) but by no block tile.
- small        33 x 257: the smallest; the sanitizer runs here.

Inputs mix distributions row by row (scaled normals, uniform ranges, constant rows, rows offset by
hundreds, near-one-hot rows of large spread), drawn from a CPU `torch.Generator` so that the same
seed gives the same values on every device.
"""

from __future__ import annotations

import torch

OPERATOR = "row_softmax"

CASES = {
    "headline": {"rows": 16384, "cols": 4096},
    "ragged": {"rows": 1000, "cols": 3001},
    "long_rows": {"rows": 7, "cols": 9973},
    "narrow": {"rows": 4099, "cols": 30},
    "mid_aligned": {"rows": 2053, "cols": 1540},
    "small": {"rows": 33, "cols": 257},
}
HEADLINE = "headline"

SWEEP = {  # timed only (klineage.problem): row length, alignment and how many rows fill the GPU
    "rows_few": {"rows": 64, "cols": 4096},  # far fewer rows than 132 SMs can take
    "rows_many": {"rows": 65536, "cols": 1024},  # many waves of short-ish rows
    "cols_short": {"rows": 16384, "cols": 64},  # two elements a lane
    "cols_long": {"rows": 512, "cols": 32768},  # long reductions over few rows
    "cols_unaligned": {"rows": 8192, "cols": 4095},  # not a multiple of 4: no float4 rows
    "cols_odd_short": {"rows": 8192, "cols": 129},
    "one_wave": {"rows": 1056, "cols": 4096},  # 132 x 8 rows
    "cols_mid": {"rows": 4096, "cols": 2048},
}

OUTPUTS = {"y": {"shape": ["rows", "cols"], "dtype": "float32"}}

# The fp32 defaults, written out so the problem says what it demands. A correct fp32 kernel lands
# near 1e-6 relative (one rounding per exp, a log2(cols)-deep sum); fp16 arithmetic lands near 1e-3.
TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}

MATH = "fp32"

# Row kinds, drawn per row with these weights: most rows are ordinary, a few stress the kernel.
_NORMAL, _UNIFORM, _OFFSET, _SPIKY, _CONSTANT = range(5)
_WEIGHTS = torch.tensor([0.45, 0.25, 0.12, 0.12, 0.06], dtype=torch.float64)


def make_inputs(case: dict, seed: int, device) -> dict:
    """x of shape (rows, cols), fp32, deterministic per seed on every device."""
    rows, cols = int(case["rows"]), int(case["cols"])
    gen = torch.Generator(device="cpu").manual_seed(0x5EED0000 + int(seed))

    kinds = torch.multinomial(_WEIGHTS, rows, replacement=True, generator=gen)
    if rows >= len(_WEIGHTS):  # every kind appears at least once, in a seed-dependent row
        where = torch.randperm(rows, generator=gen)[: len(_WEIGHTS)]
        kinds[where] = torch.arange(len(_WEIGHTS))
    kinds = kinds.unsqueeze(1)

    # Per-row parameters: a scale and a centre for each row.
    scale = torch.empty(rows, 1).uniform_(0.5, 4.0, generator=gen)
    half_width = torch.empty(rows, 1).uniform_(1.0, 20.0, generator=gen)
    sign = torch.randint(0, 2, (rows, 1), generator=gen).float() * 2 - 1
    offset = sign * torch.empty(rows, 1).uniform_(100.0, 1000.0, generator=gen)
    spike_scale = torch.empty(rows, 1).uniform_(20.0, 60.0, generator=gen)
    constant = torch.empty(rows, 1).uniform_(-50.0, 50.0, generator=gen)

    # Each row is a * normal + b * uniform + c with per-row coefficients chosen by its kind: one
    # pass over the big tensors instead of one per kind (the headline case has 67M elements).
    is_kind = [(kinds == k).float() for k in range(len(_WEIGHTS))]
    a = is_kind[_NORMAL] * scale + is_kind[_OFFSET] + is_kind[_SPIKY] * spike_scale  # spiky: nearly one-hot
    b = is_kind[_UNIFORM] * half_width
    c = is_kind[_OFFSET] * offset + is_kind[_CONSTANT] * constant  # offset: exp(x) overflows without the max shift

    x = torch.randn(rows, cols, generator=gen).mul_(a)
    x.addcmul_(torch.rand(rows, cols, generator=gen).mul_(2).sub_(1), b).add_(c)
    return {"x": x.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    # float64 then one rounding to fp32: the reference is the correctly rounded truth (to within
    # fp64 error), so the whole tolerance is left to the kernel; an fp32 torch.softmax would spend
    # part of it on its own rounding.
    x = inputs["x"]
    return {"y": torch.softmax(x.to(torch.float64), dim=-1).to(torch.float32)}


def vendor(inputs: dict) -> dict:
    return {"y": torch.softmax(inputs["x"], dim=-1)}


def roofline(case: dict) -> dict:
    # Per element: 1 compare (max), 1 subtract, 1 exp, 1 add (sum), 1 multiply (by 1/sum) = 5 flops.
    # Bytes: x read once and y written once, fp32; a second read of a row that fits on chip is free.
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 5.0 * n, "bytes": 2.0 * 4 * n}
