"""Scatter-add of rows: out[idx[i], :] += src[i, :] into a zeroed table (fp32 atomics: any order of the adds
lands within the tolerance).

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "scatter_add"

CASES = {
    "headline": {"rows": 65536, "cols": 256, "table": 4096},
    "ragged": {"rows": 1001, "cols": 97, "table": 300},
    "small": {"rows": 33, "cols": 31, "table": 5},
}
HEADLINE = "headline"

OUTPUTS = {"out": {"shape": ["table", "cols"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-4, "rel_l2": 1e-5}}
# fp32 atomics add in whatever order the hardware takes them (index_add_ on CUDA too): two runs may differ in
# the last bits, so each run is judged against the reference rather than against the other bit for bit.
RUN_TO_RUN = "within_tolerance"


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    rows, cols, size = int(case["rows"]), int(case["cols"]), int(case["table"])
    src = torch.randn(rows, cols, generator=gen)
    idx = torch.randint(0, size, (rows,), generator=gen, dtype=torch.int32)
    return {"src": src.to(device), "idx": idx.to(device)}


def reference(inputs: dict, case: dict) -> dict:
    src, idx = inputs["src"].double(), inputs["idx"].long()
    out = torch.zeros(int(case["table"]), src.shape[1], dtype=torch.float64, device=src.device)
    return {"out": out.index_add_(0, idx, src).float()}


def vendor(inputs: dict, case: dict) -> dict:
    src, idx = inputs["src"], inputs["idx"].long()
    out = torch.zeros(int(case["table"]), src.shape[1], device=src.device)
    return {"out": out.index_add_(0, idx, src)}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 1.0 * n, "bytes": 12.0 * n}
