"""Vector add in the reference KLineage implementation's legacy format.

Legacy problem files define `make_inputs(seed, device)` returning a tuple of tensors and
`torch_ref(*inputs)`; KLineage loads them as a single case named "default" whose outputs are
out0, out1, ... This file exists to prove that path keeps working.
"""

import torch

N = 100_003  # odd on purpose: no vector width or block size divides it


def make_inputs(seed, device):
    gen = torch.Generator(device="cpu").manual_seed(1000 + int(seed))
    a = torch.randn(N, generator=gen)
    b = torch.rand(N, generator=gen) * 8 - 4
    return a.to(device), b.to(device)


def torch_ref(a, b):
    return a + b
