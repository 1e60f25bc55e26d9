// y = A x for a row-major fp32 matrix A [M, K] with K % 4 == 0 and a vector x [K]. Each block sums
// ROWS rows with 16 threads per row. A's row slices stream through a STAGES-deep ring of shared
// stages filled by 16-byte cp.async copies (zeros past M and K); the 16 partial sums of a row meet
// in shared memory at the end, reusing the ring.
#include <cstdint>

constexpr int THREADS = 128;
constexpr int ROWS = 8;                                // rows of A per block
constexpr int LANES = THREADS / ROWS;                  // 16 threads per row
constexpr int TILE_K = 16;                             // columns of A per stage: one per lane
constexpr int STAGES = 3;                              // ring depth
constexpr int CHUNKS = ROWS * TILE_K / 4;              // 16-byte chunks per stage
constexpr int STAGE_BYTES = ROWS * TILE_K * 4;         // 512 bytes
constexpr int PARTIAL_STRIDE = LANES + 1;              // padded row of partial sums
constexpr int PARTIAL_BYTES = ROWS * PARTIAL_STRIDE * 4;
static_assert(CHUNKS <= THREADS, "one chunk per thread at most");
static_assert(PARTIAL_BYTES <= STAGES * STAGE_BYTES, "the partial sums fit in the ring");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");

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

// Thread t < CHUNKS copies chunk t of the tile at column k0: row t / 4, columns k0 + 4 (t % 4) + 0..3.
__device__ __forceinline__ void load_tile(uint32_t stage, const float* a, int M, int K, int row0, int k0)
{
    const int t = threadIdx.x;
    if (t < CHUNKS) {
        const int row = row0 + t / (TILE_K / 4);
        const int col = k0 + 4 * (t % (TILE_K / 4));
        const bool inside = row < M && col < K;
        cp_async_16(stage + t * 16, inside ? a + static_cast<long long>(row) * K + col : a, inside ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ y, int M, int K)
{
    extern __shared__ __align__(16) float smem[];
    const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const int row0 = blockIdx.x * ROWS;
    const int r = threadIdx.x / LANES;  // the row this thread sums
    const int lane = threadIdx.x % LANES;
    const int k_tiles = (K + TILE_K - 1) / TILE_K;
    float sum = 0.0f;

    // Prologue: STAGES - 1 tiles in flight, one group each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        load_tile(smem_base + s * STAGE_BYTES, a, M, K, row0, s * TILE_K);
        cp_async_commit();
    }

    // Wait for tile kt, then refill the stage every thread finished reading in iteration kt - 1.
    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int s = kt % STAGES;
        const int refill = (kt + STAGES - 1) % STAGES;
        load_tile(smem_base + refill * STAGE_BYTES, a, M, K, row0, (kt + STAGES - 1) * TILE_K);
        cp_async_commit();
        const int k = kt * TILE_K + lane;
        sum += smem[s * (STAGE_BYTES / 4) + r * TILE_K + lane] * (k < K ? x[k] : 0.0f);
    }

    // Epilogue: drain the trailing zero-fills, then add up each row's partial sums in the ring.
    cp_async_wait<0>();
    __syncthreads();
    smem[r * PARTIAL_STRIDE + lane] = sum;
    __syncthreads();
    if (threadIdx.x < ROWS && row0 + threadIdx.x < M) {
        float total = 0.0f;
        for (int i = 0; i < LANES; ++i) total += smem[threadIdx.x * PARTIAL_STRIDE + i];
        y[row0 + threadIdx.x] = total;
    }
}
