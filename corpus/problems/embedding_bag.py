"""Embedding bag (sum): out[b, :] = sum over l of weight[indices[b, l], :] (F.embedding_bag, mode 'sum').

A gather-reduce: each of `bags` output rows is the sum of `bag` rows of an fp32 table of `num` rows
of width d, picked by int64 indices (duplicates allowed). Memory-bound: every gathered row is read
from the table (repeated rows may hit in cache, so the roofline counts each occurrence), the indices
read once, the output written once.

Cases:
- headline   8192 bags x 16 of 512-wide rows from 100000: 256 MiB gathered from a 195 MiB table.
- ragged     1001 bags x 7 of 97-wide rows from 3001: a width no vector divides.
- lookup     4096 bags x 1 of 256-wide rows from 50000: a plain embedding lookup.
- long_bags  16 bags x 1024 of 64-wide rows from 7919: few, long bags.
- wide       64 bags x 4 of 4100-wide rows from 200.
- small      5 bags x 3 of 33-wide rows from 11: the smallest; the sanitizer runs here.

Indices are skewed (a few popular rows, as in real vocabularies) and bags repeat rows.
"""

from __future__ import annotations

import torch

OPERATOR = "embedding_bag"

CASES = {
    "headline": {"bags": 8192, "bag": 16, "d": 512, "num": 100000},
    "ragged": {"bags": 1001, "bag": 7, "d": 97, "num": 3001},
    "lookup": {"bags": 4096, "bag": 1, "d": 256, "num": 50000},
    "long_bags": {"bags": 16, "bag": 1024, "d": 64, "num": 7919},
    "wide": {"bags": 64, "bag": 4, "d": 4100, "num": 200},
    "small": {"bags": 5, "bag": 3, "d": 33, "num": 11},
}
HEADLINE = "headline"

SWEEP = {  # timed only: row width against the block, bag length, bags against the SMs
    "bags_few": {"bags": 64, "bag": 64, "d": 512, "num": 100000},  # fewer blocks than SMs
    "bags_many": {"bags": 65536, "bag": 8, "d": 128, "num": 100000},
    "rows_narrow": {"bags": 32768, "bag": 16, "d": 32, "num": 100000},  # a block mostly idle
    "rows_wide": {"bags": 2048, "bag": 8, "d": 4096, "num": 20000},
    "rows_unaligned": {"bags": 8192, "bag": 16, "d": 511, "num": 100000},  # no float4 rows
    "bag_long": {"bags": 512, "bag": 256, "d": 256, "num": 100000},
    # The headline's bags at other widths, and bag counts between the few and the many: where the
    # float4 path and the scalar one part ways, and from how many blocks on either pays.
    "width_384": {"bags": 8192, "bag": 16, "d": 384, "num": 100000},
    "width_1024": {"bags": 8192, "bag": 16, "d": 1024, "num": 100000},
    "width_257": {"bags": 16384, "bag": 8, "d": 257, "num": 100000},  # scalar path
    "width_256": {"bags": 16384, "bag": 8, "d": 256, "num": 100000},
    "bags_1k": {"bags": 1024, "bag": 16, "d": 256, "num": 100000},
    "lookup_many": {"bags": 65536, "bag": 1, "d": 64, "num": 100000},
    # The headline's bags and width with bags from one row to 32, a narrower row at its bag length, and
    # long bags on the scalar path: whether the length of a bag decides where independent loads pay.
    "bag_1": {"bags": 8192, "bag": 1, "d": 512, "num": 100000},
    "bag_4": {"bags": 8192, "bag": 4, "d": 512, "num": 100000},
    "bag_8": {"bags": 8192, "bag": 8, "d": 512, "num": 100000},
    "bag_32": {"bags": 8192, "bag": 32, "d": 512, "num": 100000},
    "narrow_bag16": {"bags": 8192, "bag": 16, "d": 128, "num": 100000},
    "unaligned_bag64": {"bags": 2048, "bag": 64, "d": 511, "num": 100000},
}

OUTPUTS = {"out": {"shape": ["bags", "d"], "dtype": "float32"}}

# A bag is an fp32 sum of up to 1024 rows of O(1) values: in any order it carries ~1e-4 of absolute
# rounding error where the sum cancels, so atol is wider than the fp32 default; rel_l2 stays tight.
TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 2e-3, "rel_l2": 1e-5}}

MATH = "fp32"


def make_inputs(case: dict, seed: int, device) -> dict:
    """weight (num, d) fp32 with per-row scales; indices (bags, bag) int64, skewed towards low rows."""
    bags, bag, d, num = (int(case[k]) for k in ("bags", "bag", "d", "num"))
    gen = torch.Generator(device="cpu").manual_seed(0xE3BA0000 + int(seed))
    weight = torch.randn(num, d, generator=gen).mul_(torch.empty(num, 1).uniform_(0.1, 3.0, generator=gen))
    # Half the lookups uniform over the table, half from a power law: popular rows repeat within bags.
    uniform = torch.randint(0, num, (bags, bag), generator=gen)
    skewed = (torch.rand(bags, bag, generator=gen).pow(4.0) * num).long().clamp_(max=num - 1)
    pick = torch.rand(bags, bag, generator=gen) < 0.5
    indices = torch.where(pick, skewed, uniform)
    return {"weight": weight.contiguous().to(device), "indices": indices.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    out = torch.nn.functional.embedding_bag(inputs["indices"], inputs["weight"].to(torch.float64), mode="sum")
    return {"out": out.to(torch.float32)}


def vendor(inputs: dict) -> dict:
    return {"out": torch.nn.functional.embedding_bag(inputs["indices"], inputs["weight"], mode="sum")}


def roofline(case: dict) -> dict:
    # One add per gathered element; bytes: every gathered row, the indices, the output once each.
    bags, bag, d = int(case["bags"]), int(case["bag"]), int(case["d"])
    return {"flops": 1.0 * bags * bag * d, "bytes": 4.0 * bags * bag * d + 8.0 * bags * bag + 4.0 * bags * d}
