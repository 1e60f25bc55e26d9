"""Group norm over an NCHW fp32 activation: the channels of each sample split into G groups, each group
normalised by its own mean and variance, then a per-channel scale and shift (torch.nn.functional.group_norm).

x has shape (n, c, hw) (the spatial dimensions flattened); group g of sample s is the contiguous block
x[s, g*c/G : (g+1)*c/G, :], so a group is one long contiguous row of (c/G) * hw elements. Memory-bound:
a kernel reads x once and writes y once; the group statistics need the group twice (mean, then the
squared deviations), which a kernel that keeps the group on chip reads from DRAM only once.

Cases:
- headline     32 x 256 x 4096, 64 groups: 128 MiB in, 128 MiB out; groups of 16384 elements (64 KiB).
- ragged       5 x 60 x 1001, 12 groups: hw odd, so no group starts 16-byte aligned past the first.
- big_groups   2 x 64 x 16384, 4 groups: 262144-element groups, larger than any block's shared memory.
- tiny_groups  64 x 96 x 49, 32 groups: 7 x 7 maps, 147-element groups (fewer than a block of threads).
- one_group    3 x 40 x 1024, 1 group (layer norm over a sample).
- small        2 x 6 x 37, 3 groups: the smallest; the sanitizer runs here.

Inputs: per-(sample, group) offsets and scales (some groups offset by up to 120 standard deviations,
where a one-pass fp32 sum-of-squares variance loses the digits the tolerance needs), weight and bias
drawn around 1 and 0.
"""

from __future__ import annotations

import torch

OPERATOR = "group_norm"

CASES = {
    "headline": {"n": 32, "c": 256, "hw": 4096, "groups": 64},
    "ragged": {"n": 5, "c": 60, "hw": 1001, "groups": 12},
    "big_groups": {"n": 2, "c": 64, "hw": 16384, "groups": 4},
    "tiny_groups": {"n": 64, "c": 96, "hw": 49, "groups": 32},
    "one_group": {"n": 3, "c": 40, "hw": 1024, "groups": 1},
    "small": {"n": 2, "c": 6, "hw": 37, "groups": 3},
}
HEADLINE = "headline"

SWEEP = {  # timed only: group length against shared memory, alignment, and how many groups fill the GPU
    "groups_few": {"n": 2, "c": 256, "hw": 4096, "groups": 32},  # 64 groups: half the SMs idle
    "groups_many": {"n": 128, "c": 256, "hw": 1024, "groups": 64},  # 8192 groups of 4096
    "group_long": {"n": 8, "c": 512, "hw": 16384, "groups": 8},  # 1M-element groups: re-read from L2/DRAM
    "group_short": {"n": 256, "c": 128, "hw": 64, "groups": 32},  # 256-element groups
    "hw_unaligned": {"n": 32, "c": 256, "hw": 4095, "groups": 64},  # no float4 groups
    "one_wave": {"n": 33, "c": 128, "hw": 4096, "groups": 32},  # 1056 groups: 8 per SM
}

OUTPUTS = {"y": {"shape": ["n", "c", "hw"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-5, "rel_l2": 1e-5}}

MATH = "fp32"

EPS = 1e-5


def make_inputs(case: dict, seed: int, device) -> dict:
    """x (n, c, hw), weight (c,), bias (c,): fp32, deterministic per seed on every device."""
    n, c, hw, groups = (int(case[k]) for k in ("n", "c", "hw", "groups"))
    gen = torch.Generator(device="cpu").manual_seed(0x6E0B0000 + int(seed))
    scale = torch.empty(n, groups, 1).uniform_(0.5, 5.0, generator=gen)
    # One group in four sits far from zero (up to 120 standard deviations): a one-pass E[x^2] - E[x]^2
    # variance in fp32 cancels there; a mean rounded to fp32 still leaves y within the tolerance.
    far = (torch.rand(n, groups, 1, generator=gen) < 0.25).float()
    offset = torch.empty(n, groups, 1).uniform_(-3.0, 3.0, generator=gen) + far * torch.empty(
        n, groups, 1).uniform_(-60.0, 60.0, generator=gen)
    x = torch.randn(n, groups, (c // groups) * hw, generator=gen).mul_(scale).add_(offset).reshape(n, c, hw)
    weight = torch.empty(c).uniform_(0.5, 1.5, generator=gen)
    bias = torch.empty(c).uniform_(-0.5, 0.5, generator=gen)
    return {"x": x.contiguous().to(device), "weight": weight.to(device), "bias": bias.to(device)}


def reference(inputs: dict, case: dict) -> dict:
    x = inputs["x"].to(torch.float64)
    y = torch.nn.functional.group_norm(x, int(case["groups"]), inputs["weight"].to(torch.float64),
                                       inputs["bias"].to(torch.float64), EPS)
    return {"y": y.to(torch.float32)}


def vendor(inputs: dict, case: dict) -> dict:
    return {"y": torch.nn.functional.group_norm(inputs["x"], int(case["groups"]), inputs["weight"], inputs["bias"], EPS)}


def roofline(case: dict) -> dict:
    # Per element: add (mean), subtract + multiply-add (variance), subtract, multiply, multiply-add (affine).
    elems = int(case["n"]) * int(case["c"]) * int(case["hw"])
    return {"flops": 7.0 * elems, "bytes": 2.0 * 4 * elems + 2.0 * 4 * int(case["c"])}
