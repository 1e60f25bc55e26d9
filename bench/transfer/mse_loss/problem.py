"""Mean squared error of two fp32 vectors, summed into one value: loss = sum((a - b)^2) / n.

Held out for the transfer benchmark (issue 27): no corpus walk or card has seen this operator; `library build`
never reads bench/transfer/. Its naive kernel sums each thread's grid-stride slice and adds the thread's share to
the loss with one atomic. One atomic per element cannot be the naive kernel: adding 16.7 million float32 shares of
about 1.2e-7 to a total near 2 loses most of each to rounding (2.8% off the float64 mean on the headline in numpy,
4e-4 already at a million elements), far outside any tolerance torch's own mse_loss meets.
"""

from __future__ import annotations

import torch

OPERATOR = "mse_loss"

CASES = {
    "headline": {"n": 16777216},
    "ragged": {"n": 1000003},
    "small": {"n": 4099},
}
HEADLINE = "headline"

OUTPUTS = {"loss": {"shape": [1], "dtype": "float32"}}

# a sum of up to 65,536 per-thread float32 partials (256 blocks of 256) in an order the atomics choose: its rounding
# differs run to run (within 6e-6 of the float64 mean on the headline, ragged and a 300,007-element case, simulated
# in numpy over five orders and on the CPU emulator), so each run is judged against the reference on its own
TOLERANCES = {"float32": {"rtol": 1e-4, "atol": 1e-6, "rel_l2": 1e-4}}
RUN_TO_RUN = "within_tolerance"


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0x3E5 + int(seed))
    n = int(case["n"])
    return {"a": torch.randn(n, generator=gen).to(device), "b": torch.randn(n, generator=gen).to(device)}


def reference(inputs: dict) -> dict:
    a, b = inputs["a"].double(), inputs["b"].double()
    return {"loss": ((a - b) ** 2).mean().reshape(1).float()}


def vendor(inputs: dict) -> dict:
    return {"loss": torch.nn.functional.mse_loss(inputs["a"], inputs["b"]).reshape(1)}


def roofline(case: dict) -> dict:
    n = int(case["n"])
    return {"flops": 3.0 * n, "bytes": 8.0 * n}
