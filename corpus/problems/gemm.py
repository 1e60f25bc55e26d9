"""GEMM: y = x @ W.T, with x [M, K], W [N, K] and y [M, N] in bfloat16, products summed in fp32.

The compute-bound workload of the corpus. W is stored [N, K] (a linear layer's weight), so both
operands are K-major: for a tensor-core `mma ... .row.col` the A operand is x as stored and the B
operand is W as stored; no transpose is needed anywhere. Flops 2*M*N*K run on the bf16 tensor
cores; the roofline floor at the headline is compute (137 GFLOP against 100 MB of traffic).

Cases:
- headline   4096 x 4096 x 4096: cuBLAS takes about 190 us on an H200, far above launch overhead.
- ragged     4095 x 4097 x 4100: no dimension divides by any tile size, and K % 8 = 4, so rows of
             x and W start 8 bytes past 16-byte boundaries and rows of y at odd bf16 offsets.
- ragged_mn  1999 x 3001 x 2056: ragged M and N at scale and a partial last K tile (2056 % 64 = 8),
             with K % 8 == 0, so that kernels which need 16-byte aligned rows of x and W (and
             declare `K % 8 == 0`) still meet edge tiles, odd output rows and many tile groups.
- skinny     16 x 4096 x 4096: a decode-like shape; a kernel tiled only over M and N gets few
             blocks, so the case exposes parallelism that only split-K or small tiles recover.
- odd_k      1000 x 1000 x 1001: K odd, so no row of x or W is even 4-byte aligned.
- small      64 x 80 x 96: smaller than one tile in every dimension; the sanitizer runs here.

Inputs mix distributions row by row, from a CPU `torch.Generator` (the same values on every
device). Rows of x are normal with a per-row scale, uniform with a per-row half-width, or sparse
(most entries exactly zero); rows of W are normal or uniform with a per-row scale and variance
1/K, so an output has a standard deviation near the product of its two row scales (0.25 to 8),
whatever K is. The values are then rounded to bfloat16.
"""

from __future__ import annotations

import math

import torch

OPERATOR = "gemm"

CASES = {
    "headline": {"M": 4096, "N": 4096, "K": 4096},
    "ragged": {"M": 4095, "N": 4097, "K": 4100},
    "ragged_mn": {"M": 1999, "N": 3001, "K": 2056},
    "skinny": {"M": 16, "N": 4096, "K": 4096},
    "odd_k": {"M": 1000, "N": 1000, "K": 1001},
    "small": {"M": 64, "N": 80, "K": 96},
}
HEADLINE = "headline"

SWEEP = {  # timed only (klineage.problem): where tiles, waves and alignment change what pays
    "grid_small": {"M": 1024, "N": 1024, "K": 4096},  # 64 output tiles of 128 x 128: fewer than 132 SMs
    "grid_one_wave": {"M": 1536, "N": 1408, "K": 2048},  # 132 tiles: one wave
    "grid_large": {"M": 8192, "N": 8192, "K": 1024},  # 4096 tiles, short K
    "k_short": {"M": 4096, "N": 4096, "K": 64},  # one or two K tiles: the pipeline never fills
    "k_long": {"M": 1024, "N": 1024, "K": 16384},  # a long reduction over few tiles
    "k_unaligned": {"M": 2048, "N": 2048, "K": 2056},  # K % 8 == 0 but not a multiple of 16, 32 or 64
    "mn_unaligned": {"M": 2047, "N": 2049, "K": 2048},  # partial tiles at both edges
    "skinny_m64": {"M": 64, "N": 8192, "K": 4096},  # a small batch
    # Where the tensor cores have almost nothing to do: one 128 x 128 tile, a few short ones, and a
    # rank-16 update whose time goes to writing the output rather than to the reduction.
    "tile_one": {"M": 128, "N": 128, "K": 64},
    "tiles_four": {"M": 256, "N": 256, "K": 128},
    "k_tiny": {"M": 4096, "N": 4096, "K": 16},
}

OUTPUTS = {"y": {"shape": ["M", "N"], "dtype": "bfloat16"}}

# Why these bounds. Products of two bf16 values are exact in fp32 (8-bit significands make a 16-bit
# product), so a kernel that accumulates in fp32 differs from the fp32 reference only by summation
# order: about sqrt(K) * 2^-24 of the partial sums' size, ~1e-5 here, far below one bf16 step.
# Both results are then rounded to bf16 once, so they agree or differ by one bf16 step where a
# rounding boundary falls between them; one step is at most 2^-7 (0.78%) of the value.
# - rtol 2e-2 admits that step with room to spare (and two steps: a vendor split-K that rounds
#   partial sums to bf16 still passes), but not a kernel that rounds per k-chunk or sums in bf16.
# - atol 1e-2 covers outputs that cancel to near zero, where a bf16 step means nothing relative;
#   outputs have standard deviations of 0.25 to 8, so 1e-2 is about 1% of a typical value.
# - rel_l2 5e-3 (tighter than the 1e-2 default): rounding the exact result to bf16 alone costs
#   ~1.1e-3 relative L2 (a uniform error of half a step, 2^-9 / sqrt(3)), and two fp32-accumulating
#   results disagree far less than that, since they differ only where a boundary separates them.
#   A kernel whose error is several bf16 steps on typical elements (bf16 accumulation, inputs
#   rounded to fp8, a dropped K tail on few rows) fails here even if each element is within rtol.
TOLERANCES = {"bfloat16": {"rtol": 2e-2, "atol": 1e-2, "rel_l2": 5e-3}}

MATH = "bf16"

# Row kinds of x, drawn per row with these weights.
_X_NORMAL, _X_UNIFORM, _X_SPARSE = range(3)
_X_WEIGHTS = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
_SPARSE_DENSITY = 0.1  # fraction of nonzero entries in a sparse row


def _x(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    kinds = torch.multinomial(_X_WEIGHTS, rows, replacement=True, generator=gen)
    if rows >= len(_X_WEIGHTS):  # every kind appears at least once, in a seed-dependent row
        where = torch.randperm(rows, generator=gen)[: len(_X_WEIGHTS)]
        kinds[where] = torch.arange(len(_X_WEIGHTS))
    kinds = kinds.unsqueeze(1)
    is_kind = [(kinds == k).float() for k in range(len(_X_WEIGHTS))]
    scale = torch.empty(rows, 1).uniform_(0.5, 4.0, generator=gen)
    half_width = torch.empty(rows, 1).uniform_(0.5, 3.0, generator=gen)
    # Sparse rows are normal rows with most entries zeroed, scaled up so their outputs stay O(1).
    a = (is_kind[_X_NORMAL] + is_kind[_X_SPARSE] / math.sqrt(_SPARSE_DENSITY)) * scale
    b = is_kind[_X_UNIFORM] * half_width * math.sqrt(3.0)  # unit variance before the half-width
    x = torch.randn(rows, cols, generator=gen).mul_(a)
    x.addcmul_(torch.rand(rows, cols, generator=gen).mul_(2).sub_(1), b)
    keep = torch.rand(rows, cols, generator=gen) < _SPARSE_DENSITY
    x.mul_(keep | (kinds != _X_SPARSE))
    return x


def _w(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    # Variance 1/cols per entry: an output sums cols products, so its scale does not grow with K.
    uniform = torch.rand(rows, 1, generator=gen) < 0.3
    scale = torch.empty(rows, 1).uniform_(0.5, 2.0, generator=gen) / math.sqrt(cols)
    a = scale * (~uniform)
    b = scale * uniform * math.sqrt(3.0)
    w = torch.randn(rows, cols, generator=gen).mul_(a)
    w.addcmul_(torch.rand(rows, cols, generator=gen).mul_(2).sub_(1), b)
    return w


def make_inputs(case: dict, seed: int, device) -> dict:
    """x [M, K] and W [N, K], bfloat16, contiguous, deterministic per seed on every device."""
    m, n, k = int(case["M"]), int(case["N"]), int(case["K"])
    gen = torch.Generator(device="cpu").manual_seed(0x6E770000 + int(seed))
    x = _x(m, k, gen).to(torch.bfloat16)
    w = _w(n, k, gen).to(torch.bfloat16)
    return {"x": x.contiguous().to(device), "W": w.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    # fp32, then one rounding to bf16: the computation a correct kernel performs, up to summation
    # order. Every bf16 value is exact in fp32 and every product of two is exact too, so the only
    # error left is the fp32 sums' (~1e-5 relative), far below one bf16 step; fp64 would buy
    # nothing visible at bf16 and cost time at 4096^3. Not a bf16 matmul: cuBLAS may then reduce
    # split-K partials in bf16 (torch allows "reduced precision reduction" by default), and the CPU
    # path differs again, so the reference would depend on the library and the device. Even if
    # TF32 were enabled globally, the result would not change: a bf16 significand (8 bits) fits in
    # TF32's 11, so rounding these inputs to TF32 is exact.
    x, w = inputs["x"], inputs["W"]
    return {"y": (x.float() @ w.float().T).to(torch.bfloat16)}


def vendor(inputs: dict) -> dict:
    # cuBLAS (cublasLt) bf16 GEMM with fp32 accumulation, as a bf16 model would call it.
    return {"y": torch.matmul(inputs["x"], inputs["W"].T)}


def roofline(case: dict) -> dict:
    # One multiply and one add per (m, n, k); x and W read once and y written once, 2 bytes each.
    m, n, k = int(case["M"]), int(case["N"]), int(case["K"])
    return {"flops": 2.0 * m * n * k, "bytes": 2.0 * (m * k + n * k + m * n)}
