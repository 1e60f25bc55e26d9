"""A transposed matrix product tiled (untile_matmul's forward), then register-blocked (unblock_matmul's), on a real
GPU (sm_90; skipped elsewhere).

C = A^T B with A stored K x M (torch.matmul(A.T, B); tests/fixtures/gpu_problems/matmul_at, written for this test:
no corpus walk or card has seen it), whose naive kernel is one thread per output reading A[k * M + r] and
B[k * N + c] from global memory. Tiled, a 16 x 16 block stages a tile of each operand in shared memory per step of
16 along k, A's tile loaded along r (a row of A across the lanes) into a padded 16 x 17 tile; blocked, each thread
keeps a 4 x 4 block of outputs in registers, a block of threads 64 x 64 outputs. Each passes every case against the
kernel it came from under the gate's sanitizer, and its ratios against that kernel and torch.matmul(A.T, B) are
printed with whether the timing settled (run with -s). The same product spelled flat (one thread per output on a
1-D launch, `r = i / N`, `c = i % N`) is tiled too and gated against that flat kernel.

    python -m pytest tests/test_gpu_transposed_matmul.py -v -s -n 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_tools import (
    forwarded,
    module_cache,  # noqa: F401 (the module's fixture `cache`)
    passes_against,
)
from klineage.kernel import KernelState, load_kernel
from klineage.launch import LaunchPlan
from klineage.transforms import get

pytestmark = pytest.mark.gpu
MATMUL_AT = Path(__file__).resolve().parent / "fixtures" / "gpu_problems" / "matmul_at"
CASES = {"headline", "ragged", "small"}  # the problem's CASES (named here: a problem file runs only in the sandbox)
VENDOR = "torch.matmul(A.T, B)"



def test_the_tiled_transposed_product_passes_every_case_against_the_naive_kernel(cache):
    naive = load_kernel(MATMUL_AT / "naive")
    transform = get("untile_matmul")
    (site,) = transform.forward_sites(naive)
    assert (site.function, site.kind) == ("matmul_at", "function")  # the whole kernel: one thread per output
    tiled = transform.forward(naive, site).state
    assert "__shared__ float tile_a[16][17];" in tiled.source  # A^T's tile, loaded along r, padded over the banks
    passes_against(MATMUL_AT / "problem.py", tiled, naive, CASES, cache,
                   "the tiled A^T B", "the naive kernel", vendor=VENDOR)


def test_the_register_blocked_transposed_product_passes_every_case_against_the_tiled_kernel(cache):
    tiled = forwarded(load_kernel(MATMUL_AT / "naive"), "untile_matmul")
    transform = get("unblock_matmul")
    (site,) = transform.forward_sites(tiled)
    assert (site.function, site.kind) == ("matmul_at", "function")  # the tiled kernel, 4 x 4 outputs a thread
    blocked = transform.forward(tiled, site).state
    assert "__shared__ float block_a[64][17];" in blocked.source  # four of A^T's padded tiles, a block's 64 rows
    assert blocked.plan.launches[0].grid[:2] == ("cdiv(n, 64)", "cdiv(m, 64)")
    passes_against(MATMUL_AT / "problem.py", blocked, tiled, CASES, cache,
                   "the register-blocked A^T B", "the tiled kernel", vendor=VENDOR)


FLAT = """// C = A^T B, one thread per output on a 1-D launch: the flat index split into the output's row and column.
__global__ void matmul_at(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                          int N, int K) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    int r = i / N, c = i % N;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[k * M + r] * B[k * N + c];
    C[i] = acc;
}
"""


def test_the_tiled_product_of_a_flat_kernel_passes_every_case_against_it(cache):
    plan = LaunchPlan.from_toml((MATMUL_AT / "naive" / "launch.toml").read_text()
                                .replace('grid = ["cdiv(n, 16)", "cdiv(m, 16)"]', 'grid = ["cdiv(m * n, 256)"]')
                                .replace("block = [16, 16]", "block = [256]"))
    flat = KernelState(source=FLAT, plan=plan)
    tiled = forwarded(flat, "untile_matmul")
    assert "C[r * N + c] = acc;" in tiled.source and tiled.plan.launches[0].block == (16, 16, 1)
    passes_against(MATMUL_AT / "problem.py", tiled, flat, CASES, cache,
                   "the tiled A^T B of the flat kernel", "the flat kernel", vendor=VENDOR)
