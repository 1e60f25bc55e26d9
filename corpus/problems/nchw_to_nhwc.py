"""Channels-last conversion: y[s, p, c] = x[s, c, p], NCHW to NHWC (x.permute(0, 2, 3, 1).contiguous()).

x has shape (n, c, hw) (the spatial dimensions flattened), fp32; y has shape (n, hw, c). Every sample
is an independent c x hw transpose, so reads along hw and writes along c cannot both be coalesced
without staging a tile on chip. Memory-bound: x read once, y written once.

Cases:
- headline  32 x 256 x 8192: 256 MiB in, 256 MiB out.
- ragged    3 x 67 x 1517: neither side divides a tile.
- rgb       16 x 3 x 50176: three channels (an image batch at 224 x 224): tiles mostly empty on one side.
- wide_c    2 x 2048 x 49: 7 x 7 maps with many channels.
- mid       4 x 96 x 3136: 56 x 56 maps.
- small     2 x 5 x 33: the smallest; the sanitizer runs here.
"""

from __future__ import annotations

import torch

OPERATOR = "nchw_to_nhwc"

CASES = {
    "headline": {"n": 32, "c": 256, "hw": 8192},
    "ragged": {"n": 3, "c": 67, "hw": 1517},
    "rgb": {"n": 16, "c": 3, "hw": 50176},
    "wide_c": {"n": 2, "c": 2048, "hw": 49},
    "mid": {"n": 4, "c": 96, "hw": 3136},
    "small": {"n": 2, "c": 5, "hw": 33},
}
HEADLINE = "headline"

SWEEP = {  # timed only: tile fill on either side, samples against the SMs
    "samples_few": {"n": 1, "c": 64, "hw": 4096},  # 256 tiles: about two per SM
    "samples_many": {"n": 256, "c": 64, "hw": 3136},
    "channels_few": {"n": 64, "c": 4, "hw": 50176},
    "channels_many": {"n": 8, "c": 4096, "hw": 256},
    "unaligned": {"n": 32, "c": 255, "hw": 8191},
    "square": {"n": 4, "c": 4096, "hw": 4096},
    # Images with 2, 6 and 8 channels: output rows of 8, 24 and 32 bytes, around the 12 and 16 of rgb
    # and channels_few, where the rows are too short for the tile to write whole sectors.
    "channels_two": {"n": 64, "c": 2, "hw": 50176},
    "channels_six": {"n": 32, "c": 6, "hw": 50176},
    "channels_eight": {"n": 32, "c": 8, "hw": 50176},
    # Few channels at other sizes: whether short rows pay on their own or only on large images (the
    # one small case, 5 channels on 33 pixels, did not), and rows of 4, 20 and 28 bytes.
    "channels_one": {"n": 64, "c": 1, "hw": 50176},
    "channels_five": {"n": 32, "c": 5, "hw": 50176},
    "channels_seven": {"n": 32, "c": 7, "hw": 50176},
    "rgb_small": {"n": 2, "c": 3, "hw": 1024},
    "channels_four_mid": {"n": 4, "c": 4, "hw": 4096},
    "channels_two_mid": {"n": 8, "c": 2, "hw": 12544},
}

OUTPUTS = {"y": {"shape": ["n", "hw", "c"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}  # a copy is exact

MATH = "fp32"


def make_inputs(case: dict, seed: int, device) -> dict:
    """x (n, c, hw) fp32: per-channel offsets and scales, so a channel mix-up changes the values."""
    n, c, hw = int(case["n"]), int(case["c"]), int(case["hw"])
    gen = torch.Generator(device="cpu").manual_seed(0x4C4C0000 + int(seed))
    offset = torch.empty(1, c, 1).uniform_(-100.0, 100.0, generator=gen)
    x = torch.randn(n, c, hw, generator=gen).add_(offset)
    return {"x": x.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    return {"y": inputs["x"].permute(0, 2, 1).contiguous()}


def vendor(inputs: dict) -> dict:
    return {"y": inputs["x"].permute(0, 2, 1).contiguous()}


def roofline(case: dict) -> dict:
    n = int(case["n"]) * int(case["c"]) * int(case["hw"])
    return {"flops": 0.0, "bytes": 2.0 * 4 * n}
