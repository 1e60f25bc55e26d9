"""Where does gemm/mma_sync lose to cuBLAS? One launch of each on the GEMM headline, for Nsight Compute.

    ncu --profile-from-start off --clock-control none --section ... python bench/profile_gemm.py

The corpus kernel is compiled by the gate's own compile step (same flags, same cubin) and launched
with its launch plan's grid, block and shared memory (x, W, y, M, N, K: the plan of every GEMM
expert without tensor maps). After warm-up launches of both, the profiled range holds one launch of
the expert and one of torch.matmul (cuBLAS), so ncu reports them side by side: tensor-pipe
utilisation, issue slots, warp stall reasons. A diagnosis, not a timing: the gate measures ratios.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from klineage import config, corpus, expr
from klineage.gate.compile import compile_kernel, resolve_entry
from klineage.kernel import KernelState
from klineage.launch import ArgKind

GEMM = 4096  # the headline: M = N = K, y = x @ W.T


def geometry(state: KernelState, size: int = GEMM) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Grid, block and dynamic shared bytes of the kernel's one launch on a size^3 GEMM."""
    launches = state.plan.launches
    if len(launches) != 1 or any(a.kind is ArgKind.TENSOR_MAP for a in launches[0].args):
        raise SystemExit(f"{state.name}: profile_gemm launches one kernel taking x, W, y, M, N, K")
    env = {**state.constants, "M": size, "N": size, "K": size}
    return (tuple(expr.evaluate_int(g, env) for g in launches[0].grid),
            tuple(expr.evaluate_int(b, env) for b in launches[0].block), expr.evaluate_int(launches[0].shared, env))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="gemm/mma_sync")
    args = parser.parse_args()

    import cupy
    import torch

    state = corpus.kernel_entry(args.kernel).load()
    compiled = compile_kernel(state, cache_dir=config.cache_dir())
    if not compiled.ok:
        raise SystemExit(f"{args.kernel} does not compile:\n{compiled.log[-2000:]}")
    grid, block, shared = geometry(state)
    (launch,) = state.plan.launches
    work = tempfile.TemporaryDirectory()  # CuPy loads the cubin at the first launch: keep it until then
    cubin = Path(work.name) / "kernel.cubin"
    cubin.write_bytes(compiled.cubin_bytes(state.plan.arch))
    kernel = cupy.RawModule(path=str(cubin)).get_function(resolve_entry(compiled, launch.entry))
    kernel.max_dynamic_shared_size_bytes = shared

    x = torch.randn(GEMM, GEMM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(GEMM, GEMM, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(GEMM, GEMM, device="cuda", dtype=torch.bfloat16)
    scalars = [cupy.int32(GEMM)] * 3

    def expert() -> None:  # pointers travel as 64-bit integers
        kernel(grid, block, (*(cupy.uint64(t.data_ptr()) for t in (x, w, y)), *scalars), shared_mem=shared)

    for _ in range(3):  # warm: module load, cuBLAS heuristics, clocks
        expert()
        torch.matmul(x, w.T)
    torch.cuda.synchronize()
    error = (y.float() - torch.matmul(x, w.T).float()).abs().max().item()
    print(f"{args.kernel}: grid {grid}, block {block}, {shared} B shared; max |y - cuBLAS| = {error:.3g}")
    torch.cuda.cudart().cudaProfilerStart()
    expert()
    torch.matmul(x, w.T)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
