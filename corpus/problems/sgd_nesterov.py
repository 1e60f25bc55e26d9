"""One SGD step with Nesterov momentum and weight decay (torch.optim.SGD's update), as new tensors.

For fp32 vectors p (parameters), g (gradient) and buf (momentum buffer), with LR = 0.01,
MOMENTUM = 0.9 and WEIGHT_DECAY = 1e-4:
    d = g + WEIGHT_DECAY * p
    buf_new = MOMENTUM * buf + d
    p_new = p - LR * (d + MOMENTUM * buf_new)
The optimizer would update p and buf in place; here the results are new outputs and the inputs stay
unmodified (the gate checks that). Memory-bound: three vectors read, two written, 20 bytes per element.

Cases:
- headline   33554432 elements: 384 MiB read, 256 MiB written.
- ragged     1000003: not a multiple of 4 (a scalar tail after the float4 body).
- tail3      16777219: a large vector with a three-element tail.
- one_block  1000: fewer elements than one block of threads covers with float4.
- tiny       7.
- small      4099: the sanitizer runs here.
"""

from __future__ import annotations

import torch

OPERATOR = "sgd_nesterov"

CASES = {
    "headline": {"n": 33554432},
    "ragged": {"n": 1000003},
    "tail3": {"n": 16777219},
    "one_block": {"n": 1000},
    "tiny": {"n": 7},
    "small": {"n": 4099},
}
HEADLINE = "headline"

SWEEP = {  # timed only: sizes around the grid-stride grid, and unaligned tails
    "grid_fraction": {"n": 65536},  # fewer float4 than one wave of threads
    "one_wave": {"n": 1081344},  # 132 SMs x 2048 threads x 4
    "mid": {"n": 4194304},
    "large": {"n": 134217728},  # 2.5 GiB of traffic
    "unaligned_large": {"n": 33554431},
    "l2_resident": {"n": 1048576},  # 20 MiB of traffic: fits in the 50 MiB L2
}

OUTPUTS = {"p_new": {"shape": ["n"], "dtype": "float32"}, "buf_new": {"shape": ["n"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 1e-5, "atol": 1e-6, "rel_l2": 1e-6}}

MATH = "fp32"

LR = 0.01
MOMENTUM = 0.9
WEIGHT_DECAY = 1e-4


def make_inputs(case: dict, seed: int, device) -> dict:
    """p, g, buf: fp32 vectors of n; gradients with rare large outliers, buffers of either sign."""
    n = int(case["n"])
    gen = torch.Generator(device="cpu").manual_seed(0x5CD00000 + int(seed))
    p = torch.randn(n, generator=gen)
    g = torch.randn(n, generator=gen).mul_(0.01)
    g.add_((torch.rand(n, generator=gen) < 0.001).float() * torch.randn(n, generator=gen) * 10.0)
    buf = torch.randn(n, generator=gen).mul_(0.05)
    return {"p": p.to(device), "g": g.to(device), "buf": buf.to(device)}


def _step(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = g + WEIGHT_DECAY * p
    buf_new = MOMENTUM * buf + d
    return p - LR * (d + MOMENTUM * buf_new), buf_new


def reference(inputs: dict) -> dict:
    p_new, buf_new = _step(*(inputs[k].to(torch.float64) for k in ("p", "g", "buf")))
    return {"p_new": p_new.to(torch.float32), "buf_new": buf_new.to(torch.float32)}


def vendor(inputs: dict) -> dict:
    p_new, buf_new = _step(inputs["p"], inputs["g"], inputs["buf"])
    return {"p_new": p_new, "buf_new": buf_new}


def roofline(case: dict) -> dict:
    # Per element: 2 (decay), 2 (momentum), 2 + 2 (update) = 8 flops; 3 reads and 2 writes of 4 bytes.
    n = int(case["n"])
    return {"flops": 8.0 * n, "bytes": 20.0 * n}
