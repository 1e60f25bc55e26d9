"""Column maximum with its index: values[c], indices[c] = max over r of x[r, c] (torch.max(x, dim=0)).

x is a 2-D fp32 tensor; the answer is the largest value of each column and the first row holding it
(ties go to the smallest row index, as torch.max does). Memory-bound: x is read once, the outputs are
one row. A column reduction is the other access pattern from a row reduction: consecutive threads
must take consecutive columns for coalesced reads, and tall matrices need the rows split across
blocks and the partial answers merged.

Cases:
- headline     16384 x 4096: 256 MiB read.
- ragged       1001 x 3001: a width that no vector or block divides.
- tall_narrow  100003 x 7: seven columns, a hundred thousand rows.
- wide_short   3 x 50001: three rows, many columns.
- mid_aligned  2053 x 1540: width divisible by 4 but by no block tile.
- small        33 x 65: the smallest; the sanitizer runs here.

Inputs: columns of several kinds (scaled normals, large offsets, small integers with many ties at the
maximum, constant columns where every row ties), drawn from a CPU generator.
"""

from __future__ import annotations

import torch

OPERATOR = "column_max"

CASES = {
    "headline": {"rows": 16384, "cols": 4096},
    "ragged": {"rows": 1001, "cols": 3001},
    "tall_narrow": {"rows": 100003, "cols": 7},
    "wide_short": {"rows": 3, "cols": 50001},
    "mid_aligned": {"rows": 2053, "cols": 1540},
    "small": {"rows": 33, "cols": 65},
}
HEADLINE = "headline"

SWEEP = {  # timed only: column count against the SMs, row count against the split, alignment
    "cols_few": {"rows": 65536, "cols": 256},  # one block of columns: the row split carries the parallelism
    "cols_many": {"rows": 1024, "cols": 65536},
    "rows_one_split": {"rows": 128, "cols": 131072},  # every column one chunk
    "rows_long": {"rows": 1048576, "cols": 64},
    "cols_unaligned": {"rows": 16384, "cols": 4095},  # no float4 rows
    "square": {"rows": 8192, "cols": 8192},
}

OUTPUTS = {"values": {"shape": ["cols"], "dtype": "float32"}, "indices": {"shape": ["cols"], "dtype": "int64"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}  # a maximum is exact

MATH = "fp32"

_NORMAL, _OFFSET, _INTEGER, _CONSTANT = range(4)
_WEIGHTS = torch.tensor([0.55, 0.15, 0.25, 0.05], dtype=torch.float64)


def make_inputs(case: dict, seed: int, device) -> dict:
    """x of shape (rows, cols), fp32, deterministic per seed on every device."""
    rows, cols = int(case["rows"]), int(case["cols"])
    gen = torch.Generator(device="cpu").manual_seed(0xC01A0000 + int(seed))
    kinds = torch.multinomial(_WEIGHTS, cols, replacement=True, generator=gen)
    if cols >= len(_WEIGHTS):  # every kind appears at least once
        kinds[torch.randperm(cols, generator=gen)[: len(_WEIGHTS)]] = torch.arange(len(_WEIGHTS))
    is_kind = [(kinds == k).float()[None, :] for k in range(len(_WEIGHTS))]
    scale = torch.empty(1, cols).uniform_(0.5, 10.0, generator=gen)
    offset = torch.empty(1, cols).uniform_(-500.0, 500.0, generator=gen)
    levels = torch.randint(2, 6, (1, cols), generator=gen).float()  # 2 to 5 integer levels: many ties
    constant = torch.empty(1, cols).uniform_(-50.0, 50.0, generator=gen)
    x = torch.randn(rows, cols, generator=gen)
    x.mul_(is_kind[_NORMAL] * scale + is_kind[_OFFSET]).add_(is_kind[_OFFSET] * offset + is_kind[_CONSTANT] * constant)
    integers = torch.floor(torch.rand(rows, cols, generator=gen) * levels) - 2.0
    x.add_(is_kind[_INTEGER] * integers)
    return {"x": x.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    values, indices = torch.max(inputs["x"].to(torch.float64), dim=0)
    return {"values": values.to(torch.float32), "indices": indices}


def vendor(inputs: dict) -> dict:
    values, indices = torch.max(inputs["x"], dim=0)
    return {"values": values, "indices": indices}


def roofline(case: dict) -> dict:
    # One compare per element; x read once, values (4 bytes) and indices (8 bytes) written once.
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 1.0 * n, "bytes": 4.0 * n + 12.0 * int(case["cols"])}
