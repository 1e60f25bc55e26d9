"""Scaled, causally masked softmax over attention scores: y = softmax(scale * x + mask) along the key axis.

x holds the scores of bh = batch * heads attention maps, each sq queries x sk keys (fp32, shape
(bh, sq, sk)). Query i sees keys j <= i + (sk - sq) (the queries are the last sq positions of a
sequence of sk); masked keys get probability 0. The unfused PyTorch path (scale, masked_fill,
softmax) reads and writes the scores three times; a fused kernel reads only the visible keys once and
writes y once, so the roofline counts the visible half of x, not all of it.

Cases:
- headline     64 x 1024 x 1024: 256 MiB of scores, 128 MiB of them visible, 256 MiB written.
- ragged       6 x 301 x 1003: sk odd (no 16-byte aligned rows), queries offset by 702 keys.
- long_keys    2 x 3 x 9973: few queries over a long prime key length (decode-like).
- short        130 x 30 x 30: rows shorter than a warp.
- mid_aligned  12 x 512 x 1540: sk divisible by 4 but by no block tile.
- small        3 x 7 x 33: the smallest; the sanitizer runs here.

Inputs: per-map scales from 0.5 to 30 (some maps nearly one-hot after scaling), some maps offset by
hundreds (exp overflows without the max shift), drawn from a CPU generator.
"""

from __future__ import annotations

import torch

OPERATOR = "causal_softmax"

CASES = {
    "headline": {"bh": 64, "sq": 1024, "sk": 1024, "scale": 0.125},
    "ragged": {"bh": 6, "sq": 301, "sk": 1003, "scale": 0.0883883476},
    "long_keys": {"bh": 2, "sq": 3, "sk": 9973, "scale": 0.125},
    "short": {"bh": 130, "sq": 30, "sk": 30, "scale": 0.25},
    "mid_aligned": {"bh": 12, "sq": 512, "sk": 1540, "scale": 0.0883883476},
    "small": {"bh": 3, "sq": 7, "sk": 33, "scale": 0.125},
}
HEADLINE = "headline"

SWEEP = {  # timed only: row length against the register cache, alignment, and rows against the SMs
    "rows_few": {"bh": 1, "sq": 64, "sk": 4096, "scale": 0.125},  # 64 rows: half the SMs idle
    "rows_many": {"bh": 256, "sq": 512, "sk": 512, "scale": 0.125},  # 131072 short rows
    "keys_long": {"bh": 8, "sq": 256, "sk": 8192, "scale": 0.125},  # rows past the register cache
    "keys_short": {"bh": 1024, "sq": 64, "sk": 64, "scale": 0.125},
    "keys_unaligned": {"bh": 64, "sq": 1023, "sk": 1023, "scale": 0.125},  # no float4 rows
    "decode": {"bh": 1024, "sq": 1, "sk": 2048, "scale": 0.125},  # one query per map
    # Rows between the few and the many, at keys the register cache holds: where a block-wide
    # reduction starts to pay against the rows' count (it paid at 6,144 rows and more, not at 1,024).
    "rows_2k": {"bh": 4, "sq": 512, "sk": 1024, "scale": 0.125},
    "rows_4k": {"bh": 8, "sq": 512, "sk": 1024, "scale": 0.125},
    "rows_16k": {"bh": 16, "sq": 1024, "sk": 1024, "scale": 0.125},
    "rows_32k_short": {"bh": 64, "sq": 512, "sk": 256, "scale": 0.125},
    # A launch that is nearly all latency: one to eight short rows, where a step that buys bandwidth
    # or instructions has little left to buy.
    "row_one": {"bh": 1, "sq": 1, "sk": 64, "scale": 0.125},
    "rows_tiny": {"bh": 1, "sq": 8, "sk": 128, "scale": 0.125},
    "decode_short": {"bh": 8, "sq": 1, "sk": 256, "scale": 0.125},
}

OUTPUTS = {"y": {"shape": ["bh", "sq", "sk"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}

MATH = "fp32"


def make_inputs(case: dict, seed: int, device) -> dict:
    """x of shape (bh, sq, sk), fp32, deterministic per seed on every device."""
    bh, sq, sk = int(case["bh"]), int(case["sq"]), int(case["sk"])
    gen = torch.Generator(device="cpu").manual_seed(0xCA5A0000 + int(seed))
    spread = torch.empty(bh, 1, 1).uniform_(0.5, 30.0, generator=gen)
    far = (torch.rand(bh, 1, 1, generator=gen) < 0.2).float()
    offset = far * torch.empty(bh, 1, 1).uniform_(-800.0, 800.0, generator=gen)
    x = torch.randn(bh, sq, sk, generator=gen).mul_(spread).add_(offset)
    return {"x": x.contiguous().to(device)}


def _mask(sq: int, sk: int, device) -> torch.Tensor:
    """True where the key is hidden from the query: j > i + (sk - sq)."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu_(sk - sq + 1)


def reference(inputs: dict, case: dict) -> dict:
    x = inputs["x"].to(torch.float64) * float(case["scale"])
    x = x.masked_fill(_mask(int(case["sq"]), int(case["sk"]), x.device), float("-inf"))
    return {"y": torch.softmax(x, dim=-1).to(torch.float32)}


def vendor(inputs: dict, case: dict) -> dict:
    x = inputs["x"] * float(case["scale"])
    return {"y": torch.softmax(x.masked_fill(_mask(int(case["sq"]), int(case["sk"]), x.device), float("-inf")), -1)}


def visible(case: dict) -> int:
    """Visible (query, key) pairs per map: query i sees min(sk, i + 1 + sk - sq) keys."""
    sq, sk = int(case["sq"]), int(case["sk"])
    return sum(min(sk, i + 1 + sk - sq) for i in range(sq))


def roofline(case: dict) -> dict:
    # Per visible element: max, scale-and-subtract (one fma), exp, add, multiply = 5 flops.
    # Bytes: the visible scores read once, every output written once (masked ones as zeros).
    bh = int(case["bh"])
    seen = bh * visible(case)
    return {"flops": 5.0 * seen, "bytes": 4.0 * seen + 4.0 * bh * int(case["sq"]) * int(case["sk"])}
