// y = A x for a row-major fp32 matrix A [M, K] with K % 4 == 0, in the manner of a tensor-core GEMM
// main loop: a STAGES-deep cp.async ring of K tiles, each tile consumed in STEPS k-steps whose
// operands are loaded one k-step ahead into registers (the first k-step of the next tile at the
// last k-step of this one), and the copies of a tile spread over the first k-steps.
#include <cstdint>

constexpr int THREADS = 128;
constexpr int ROWS = 8;                          // rows of A per block
constexpr int LANES = THREADS / ROWS;            // 16 threads per row
constexpr int TILE_K = 128;                      // columns of A per stage
constexpr int STEPS = 4;                         // k-steps per tile
constexpr int STEP_K = TILE_K / STEPS;           // 32 columns per k-step: two per lane
constexpr int STAGES = 1;                        // ring depth
constexpr int CHUNKS_PER_ROW = TILE_K / 4;       // 16-byte chunks per tile row
constexpr int STAGE_BYTES = ROWS * TILE_K * 4;   // 4 KiB
static_assert(ROWS * CHUNKS_PER_ROW == 2 * THREADS, "two chunks per thread per tile");
static_assert(STEP_K == 2 * LANES, "two columns per lane per k-step");

__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// Half HALF of K tile kt: chunk c = tid + HALF * THREADS is row c / 32, columns 4 (c % 32) + 0..3.
template <int HALF>
__device__ __forceinline__ void load_half(uint32_t stage, const float* a, int M, int K, int row0, int kt)
{
    const int c = threadIdx.x + HALF * THREADS;
    const int row = row0 + c / CHUNKS_PER_ROW;
    const int col = kt * TILE_K + 4 * (c % CHUNKS_PER_ROW);
    const bool inside = row < M && col < K;
    cp_async_16(stage + c * 16, inside ? a + static_cast<long long>(row) * K + col : a, inside ? 16 : 0);
}

// The two values of k-step ks this thread multiplies: row r, columns ks * STEP_K + lane (+ LANES).
__device__ __forceinline__ void load_step(float (&v)[2], const float* stage, int r, int lane, int ks)
{
    v[0] = stage[r * TILE_K + ks * STEP_K + lane];
    v[1] = stage[r * TILE_K + ks * STEP_K + lane + LANES];
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y, int M, int K)
{
    extern __shared__ __align__(16) float smem[];
    const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int row0 = blockIdx.x * ROWS;
    const int r = threadIdx.x / LANES;
    const int lane = threadIdx.x % LANES;
    const int k_tiles = (K + TILE_K - 1) / TILE_K;
    float sum = 0.0f;

    // Prologue: K tiles 0 .. STAGES - 2 in flight, one group each.
#pragma unroll
    for (int s = 0; s < 1; ++s) {
        const uint32_t stage = smem_base + s * STAGE_BYTES;
        load_half<0>(stage, a, M, K, row0, s);
        load_half<1>(stage, a, M, K, row0, s);
        cp_async_commit();
    }
    cp_async_wait<0>();           // K tile 0 has landed ...
    __syncthreads();              // ... for every thread

    int read_stage = 0;
    int write_stage = STAGES - 1;
    float v[2][2];  // register double buffer: k-step ks uses v[ks % 2]
    load_step(v[0], smem, r, lane, 0);
    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
        for (int ks = 0; ks < STEPS; ++ks) {
            if (ks == STEPS - 1) {
                __syncthreads();  // every warp is done reading the stage before it is refilled
                // Copies of K tile kt + STAGES - 1, spread over the first two k-steps.
                const int fetch = kt + 1;
                load_half<0>(smem_base + write_stage * STAGE_BYTES, a, M, K, row0, fetch);
                load_half<1>(smem_base + write_stage * STAGE_BYTES, a, M, K, row0, fetch);
                cp_async_commit();  // one group per K tile
                write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;
                // The next tile's group is complete everywhere, and every read of the stage the
                // next iteration refills is over.
                cp_async_wait<0>();
                __syncthreads();
                read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
            }
            load_step(v[(ks + 1) % 2], smem + read_stage * (STAGE_BYTES / 4), r, lane, (ks + 1) % STEPS);

            const int k = kt * TILE_K + ks * STEP_K + lane;
            sum += v[ks % 2][0] * (k < K ? x[k] : 0.0f) + v[ks % 2][1] * (k + LANES < K ? x[k + LANES] : 0.0f);
        }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset, LANES);
    if (lane == 0 && row0 + r < M) y[row0 + r] = sum;
}
