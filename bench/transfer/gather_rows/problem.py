"""Gather rows of a table by index: out[i, :] = table[idx[i], :].

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/.
"""

from __future__ import annotations

import torch

OPERATOR = "gather_rows"

CASES = {
    "headline": {"rows": 65536, "cols": 1024, "table": 50000},
    "ragged": {"rows": 1001, "cols": 769, "table": 3001},
    "small": {"rows": 33, "cols": 257, "table": 40},
}
HEADLINE = "headline"

OUTPUTS = {"out": {"shape": ["rows", "cols"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x7EA5 + int(seed))
    rows, cols, size = int(case["rows"]), int(case["cols"]), int(case["table"])
    table = torch.randn(size, cols, generator=gen)
    idx = torch.randint(0, size, (rows,), generator=gen, dtype=torch.int32)
    return {"table": table.to(device), "idx": idx.to(device)}


def reference(inputs: dict) -> dict:
    return {"out": inputs["table"][inputs["idx"].long()]}


def vendor(inputs: dict) -> dict:
    return {"out": inputs["table"][inputs["idx"].long()]}


def roofline(case: dict) -> dict:
    n = int(case["rows"]) * int(case["cols"])
    return {"flops": 0.0, "bytes": 8.0 * n}
