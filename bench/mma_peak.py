"""How fast can mma.sync go on this GPU? A ceiling for gemm/mma_sync, timed beside cuBLAS in one process.

    python bench/mma_peak.py --out results/mma-peak.json      (GPU host: nvcc, CuPy and torch)

Kernels with no global memory traffic, one per row of the table:
  mma   : each warp issues mma.sync m16n8k16 (bf16 in, fp32 accumulate) on a WT_M x WT_N grid of
          independent accumulators, operands in registers: the instruction's issue ceiling.
  ldsm  : the same, each k-step's fragments loaded with ldmatrix.x4 from a swizzled shared tile one
          step ahead (the expert's inner loop, 64 x 64 per warp, without cp.async and the epilogue).
Each is timed in rounds alternating with torch.matmul on the GEMM headline (4096^3 bf16, y = x @ W.T),
and reported as TFLOP/s and as a ratio over cuBLAS. The issue's target for gemm/mma_sync is 0.70x
cuBLAS: were every row below it, no mma.sync GEMM could meet it on this GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
from pathlib import Path

from klineage.gate.pipeline import git_commit
from klineage.toolchain import find_toolchain, run_tool

SOURCE = r"""
#include <cstdint>
__device__ __forceinline__ void mma(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// A tile 128 rows x 128 bytes, B tile 256 rows x 128 bytes, 16-byte chunks XOR-swizzled by row % 8.
__device__ __forceinline__ uint32_t swz(uint32_t base, int row, int chunk) {
  return base + row * 128 + ((chunk ^ (row & 7)) << 4);
}
template <int WT_M, int WT_N, bool LDSM>
__device__ void body(float* out, int iters) {
  __shared__ __align__(128) uint8_t tile[(128 + 256) * 128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < (128 + 256) * 128 / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(tile)[i] = 0x3c003c00u ^ (i & 0x00ff00ffu);  // small finite bf16 pairs
  __syncthreads();
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  const uint32_t b_base = a_base + 128 * 128;
  const int warp_m = (warp & 1) * 64, warp_n = (warp >> 1 & 3) * 64;
  float acc[WT_M][WT_N][4] = {};
  uint32_t a[2][WT_M][4], b[2][WT_N][2];
  auto load = [&](int slot, int ks) {
    for (int m = 0; m < WT_M; ++m)
      ldsm_x4(a[slot][m], swz(a_base, warp_m + m * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    for (int n = 0; n < WT_N; n += 2) {
      uint32_t r[4];
      ldsm_x4(r, swz(b_base, warp_n + n * 8 + (lane & 7) + (lane >> 4) * 8, 2 * ks + (lane >> 3 & 1)));
      b[slot][n][0] = r[0]; b[slot][n][1] = r[1]; b[slot][n + 1][0] = r[2]; b[slot][n + 1][1] = r[3];
    }
  };
  if (LDSM) {
    load(0, 0);
  } else {
    for (int s = 0; s < 2; ++s) {
      for (int m = 0; m < WT_M; ++m)
        for (int j = 0; j < 4; ++j) a[s][m][j] = 0x3c003c00u ^ (threadIdx.x + m + j);
      for (int n = 0; n < WT_N; ++n)
        for (int j = 0; j < 2; ++j) b[s][n][j] = 0x3c003c00u ^ (threadIdx.x + n + j);
    }
  }
#pragma unroll 1  // one loop body of two k-steps: its SASS is what the tests count
  for (int it = 0; it < iters; it += 2) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (LDSM) load(half ^ 1, (it + half + 1) & 3);
#pragma unroll
      for (int m = 0; m < WT_M; ++m)
#pragma unroll
        for (int n = 0; n < WT_N; ++n) mma(acc[m][n], a[half][m], b[half][n]);
    }
  }
  float sum = 0.f;
  for (int m = 0; m < WT_M; ++m)
    for (int n = 0; n < WT_N; ++n)
      for (int j = 0; j < 4; ++j) sum += acc[m][n][j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
extern "C" __global__ void __launch_bounds__(256, 1) mma_4x8(float* out, int iters) { body<4, 8, false>(out, iters); }
extern "C" __global__ void __launch_bounds__(256, 1) ldsm_4x8(float* out, int iters) { body<4, 8, true>(out, iters); }
extern "C" __global__ void __launch_bounds__(256, 2) mma_2x8(float* out, int iters) { body<2, 8, false>(out, iters); }
extern "C" __global__ void __launch_bounds__(256, 2) ldsm_2x8(float* out, int iters) { body<2, 8, true>(out, iters); }
"""

# (kernel, warp tile in MMA units (m, n), CTAs of 256 threads launched per SM; mma_4x8's registers let
# one stay resident, so its x2 row runs as two waves and checks that the count does not change the rate)
CONFIGS = [("mma_4x8", (4, 8), 1), ("mma_4x8", (4, 8), 2), ("mma_2x8", (2, 8), 2),
           ("ldsm_4x8", (4, 8), 1), ("ldsm_2x8", (2, 8), 2)]
GEMM = 4096  # the GEMM headline: M = N = K


def build(workdir: Path) -> Path:
    cu, cubin = workdir / "peak.cu", workdir / "peak.cubin"
    cu.write_text(SOURCE)
    toolchain = find_toolchain()
    run_tool([toolchain.nvcc, "-cubin", "-O3", "-arch=sm_90a", "-o", str(cubin), str(cu)],
             env=toolchain.environment(workdir), cwd=workdir)
    return cubin


def flops(tile: tuple[int, int], ctas: int, iters: int, sms: int) -> float:
    """Of one launch: every warp (8 per CTA) runs `iters` k-steps of tile[0] x tile[1] m16n8k16 MMAs."""
    return 2.0 * 16 * 8 * 16 * tile[0] * tile[1] * iters * 8 * sms * ctas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=8192, help="k-steps per warp (even)")
    args = parser.parse_args()

    import cupy
    import torch

    tmp = tempfile.TemporaryDirectory()  # CuPy loads the cubin at the first launch: keep it until then
    module = cupy.RawModule(path=str(build(Path(tmp.name))))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = cupy.empty(sms * 2 * 256, dtype=cupy.float32)
    x = torch.randn(GEMM, GEMM, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(GEMM, GEMM, device="cuda", dtype=torch.bfloat16)

    def timed(launch) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        launch()  # warm
        start.record()
        for _ in range(10):
            launch()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 10 * 1e3  # us per launch

    def kernel_launch(name: str, ctas: int):
        fn = module.get_function(name)
        return lambda: fn((sms * ctas,), (256,), (out, cupy.int32(args.iters)))

    rows: dict[str, list[float]] = {}
    cublas: list[float] = []
    for _ in range(args.rounds):
        cublas.append(timed(lambda: torch.matmul(x, w.T)))
        for name, _tile, ctas in CONFIGS:
            rows.setdefault(f"{name} x{ctas}", []).append(timed(kernel_launch(name, ctas)))
    cublas_us = statistics.median(cublas)
    cublas_tflops = 2.0 * GEMM ** 3 / cublas_us / 1e6
    table = []
    for name, tile, ctas in CONFIGS:
        us = statistics.median(rows[f"{name} x{ctas}"])
        tflops = flops(tile, ctas, args.iters, sms) / us / 1e6
        table.append({"kernel": name, "ctas_per_sm": ctas, "median_us": round(us, 2),
                      "tflops": round(tflops, 1), "vs_cublas": round(tflops / cublas_tflops, 3)})
    provenance = {"written_by": "bench/mma_peak.py", "git_commit": git_commit(), "gpu": torch.cuda.get_device_name(0),
                  "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    result = {"provenance": provenance, "gpu": provenance["gpu"], "sms": sms, "torch": torch.__version__,
              "cuda": torch.version.cuda, "iters": args.iters, "rounds": args.rounds,
              "cublas_4096_us": round(cublas_us, 2), "cublas_tflops": round(cublas_tflops, 1), "rows": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"cuBLAS 4096^3 bf16: {cublas_us:.1f} us, {cublas_tflops:.0f} TFLOP/s")
    for row in table:
        print(f"{row['kernel']:>9} x{row['ctas_per_sm']}: {row['tflops']:6.1f} TFLOP/s  {row['vs_cublas']:.3f}x cuBLAS")


if __name__ == "__main__":
    main()
