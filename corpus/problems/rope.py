"""Rotary position embedding (the rotate-half form of GPT-NeoX and Llama) applied to bf16 queries or keys.

x has shape (b, s, h, d), bf16; cos and sin are fp32 tables of shape (s, d/2) (angle s * theta_i).
With x1 = x[..., :d/2] and x2 = x[..., d/2:]:
    y[..., :d/2] = x1 * cos - x2 * sin,    y[..., d/2:] = x2 * cos + x1 * sin,
computed in fp32 and rounded once to bf16. Memory-bound: x read once and y written once (4 bytes per
element pair each way); the tables are small and stay in cache.

Cases:
- headline   8 x 4096 x 32 x 128: 256 MiB in, 256 MiB out.
- ragged     3 x 77 x 5 x 80: half-rows of 40 elements (five 16-byte packs), an odd token count.
- unaligned  2 x 37 x 3 x 18: half-rows of 9 elements; no 16-byte pack fits.
- long_seq   1 x 16384 x 4 x 64: one sequence, long tables.
- decode     16 x 1 x 64 x 128: one token per sequence, many heads.
- small      1 x 5 x 2 x 6: the smallest; the sanitizer runs here.
"""

from __future__ import annotations

import torch

OPERATOR = "rope"

CASES = {
    "headline": {"b": 8, "s": 4096, "h": 32, "d": 128},
    "ragged": {"b": 3, "s": 77, "h": 5, "d": 80},
    "unaligned": {"b": 2, "s": 37, "h": 3, "d": 18},
    "long_seq": {"b": 1, "s": 16384, "h": 4, "d": 64},
    "decode": {"b": 16, "s": 1, "h": 64, "d": 128},
    "small": {"b": 1, "s": 5, "h": 2, "d": 6},
}
HEADLINE = "headline"

SWEEP = {  # timed only: head size against the 16-byte pack, and how many packs fill the GPU
    "tokens_few": {"b": 1, "s": 64, "h": 8, "d": 128},  # 4096 packs: a fraction of one wave
    "tokens_many": {"b": 32, "s": 4096, "h": 16, "d": 64},
    "head_small": {"b": 8, "s": 4096, "h": 64, "d": 16},  # one pack per half-row
    "head_large": {"b": 2, "s": 4096, "h": 8, "d": 256},
    "head_unaligned": {"b": 8, "s": 2048, "h": 32, "d": 100},  # half 50: no packs
    "one_wave": {"b": 1, "s": 1056, "h": 32, "d": 128},
    # Head sizes whose half is not a multiple of 8 at full size, and packable heads on a handful of
    # tokens: which of the two (alignment, too little work) decides whether the packs pay.
    "head_72": {"b": 8, "s": 2048, "h": 32, "d": 72},  # half 36
    "head_120": {"b": 4, "s": 4096, "h": 16, "d": 120},  # half 60
    "head_40": {"b": 8, "s": 4096, "h": 32, "d": 40},  # half 20
    "tokens_tiny": {"b": 1, "s": 16, "h": 8, "d": 128},  # 1024 packs: four blocks
    "decode_small": {"b": 4, "s": 1, "h": 32, "d": 64},  # 512 packs
    "decode_batch": {"b": 64, "s": 1, "h": 32, "d": 128},  # 16384 packs, one token each
}

OUTPUTS = {"y": {"shape": ["b", "s", "h", "d"], "dtype": "bfloat16"}}

TOLERANCES = {"bfloat16": {"rtol": 2e-2, "atol": 2e-2, "rel_l2": 1e-2}}

MATH = "fp32"

BASE = 10000.0


def make_inputs(case: dict, seed: int, device) -> dict:
    """x (b, s, h, d) bf16 with per-head scales; cos, sin (s, d/2) fp32 from the standard frequencies."""
    b, s, h, d = (int(case[k]) for k in ("b", "s", "h", "d"))
    gen = torch.Generator(device="cpu").manual_seed(0x20BE0000 + int(seed))
    scale = torch.empty(1, 1, h, 1).uniform_(0.2, 8.0, generator=gen)
    x = torch.randn(b, s, h, d, generator=gen).mul_(scale).to(torch.bfloat16)
    half = d // 2
    inv_freq = BASE ** (-torch.arange(half, dtype=torch.float64) * 2.0 / d)
    angle = torch.arange(s, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return {"x": x.contiguous().to(device), "cos": angle.cos().float().to(device),
            "sin": angle.sin().float().to(device)}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference(inputs: dict) -> dict:
    y = _rotate(inputs["x"].to(torch.float64), inputs["cos"].to(torch.float64), inputs["sin"].to(torch.float64))
    return {"y": y.to(torch.bfloat16)}


def vendor(inputs: dict) -> dict:
    return {"y": _rotate(inputs["x"].float(), inputs["cos"], inputs["sin"]).to(torch.bfloat16)}


def roofline(case: dict) -> dict:
    # Per pair: 4 multiplies, 2 adds. Bytes: x read and y written once (bf16); the tables once (fp32).
    pairs = int(case["b"]) * int(case["s"]) * int(case["h"]) * (int(case["d"]) // 2)
    tables = 2 * int(case["s"]) * (int(case["d"]) // 2)
    return {"flops": 6.0 * pairs, "bytes": 2.0 * 2 * 2 * pairs + 4.0 * tables}
