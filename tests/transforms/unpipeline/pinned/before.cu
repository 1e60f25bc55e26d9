// y = diag(w) A x for a row-major fp32 matrix A [M, K] with K % 4 == 0, a vector x [K] and row
// weights w [M] (M % 4 == 0). Each block sums ROWS rows with 16 threads per row. The block's weights
// arrive first, in a commit group of their own ahead of the ring (as attention's query tile does);
// A's row slices stream through a STAGES-deep ring of shared stages filled by 16-byte cp.async
// copies (zeros past M and K); the 16 partial sums of a row meet in a static shared array.
#include <cstdint>

constexpr int THREADS = 128;
constexpr int ROWS = 8;                                // rows of A per block
constexpr int LANES = THREADS / ROWS;                  // 16 threads per row
constexpr int TILE_K = 16;                             // columns of A per stage: one per lane
constexpr int STAGES = 3;                              // ring depth
constexpr int CHUNKS = ROWS * TILE_K / 4;              // 16-byte chunks per stage
constexpr int STAGE_BYTES = ROWS * TILE_K * 4;         // 512 bytes
constexpr int PARTIAL_STRIDE = LANES + 1;              // padded row of partial sums
constexpr int WEIGHT_BYTES = ROWS * 4;                // the block's row weights, before the ring
constexpr int WEIGHT_CHUNKS = WEIGHT_BYTES / 16;
static_assert(CHUNKS <= THREADS, "one chunk per thread at most");
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

// Thread t < WEIGHT_CHUNKS copies the weights of rows row0 + 4 t .. row0 + 4 t + 3 (zeros past M).
__device__ __forceinline__ void load_weights(uint32_t dst, const float* w, int M, int row0)
{
    const int t = threadIdx.x;
    if (t < WEIGHT_CHUNKS) {
        const int row = row0 + 4 * t;
        cp_async_16(dst + t * 16, row < M ? w + row : w, row < M ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
kernel(const float* __restrict__ a, const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
       int M, int K)
{
    extern __shared__ __align__(16) float smem[];
    __shared__ float partial[ROWS * PARTIAL_STRIDE];
    const uint32_t weights_smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t smem_base = weights_smem + WEIGHT_BYTES;
    const float* ring = smem + WEIGHT_BYTES / 4;
    const int row0 = blockIdx.x * ROWS;
    const int r = threadIdx.x / LANES;  // the row this thread sums
    const int lane = threadIdx.x % LANES;
    const int k_tiles = (K + TILE_K - 1) / TILE_K;
    float sum = 0.0f;

    // The weights, in a group of their own ahead of the ring's.
    load_weights(weights_smem, w, M, row0);
    cp_async_commit();

    // Prologue: STAGES - 1 tiles in flight, one group each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        load_tile(smem_base + s * STAGE_BYTES, a, M, K, row0, s * TILE_K);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();  // the weights have landed (for this thread) ...
    __syncthreads();              // ... and for every thread
    const float weight = smem[r];

    // Wait for tile kt, then refill the stage every thread finished reading in iteration kt - 1.
    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int s = kt % STAGES;
        const int refill = (kt + STAGES - 1) % STAGES;
        load_tile(smem_base + refill * STAGE_BYTES, a, M, K, row0, (kt + STAGES - 1) * TILE_K);
        cp_async_commit();
        const int k = kt * TILE_K + lane;
        sum += ring[s * (STAGE_BYTES / 4) + r * TILE_K + lane] * (k < K ? x[k] : 0.0f);
    }

    // Epilogue: drain the trailing zero-fills, then add up each row's weighted partial sums.
    cp_async_wait<0>();
    partial[r * PARTIAL_STRIDE + lane] = weight * sum;
    __syncthreads();
    if (threadIdx.x < ROWS && row0 + threadIdx.x < M) {
        float total = 0.0f;
        for (int i = 0; i < LANES; ++i) total += partial[threadIdx.x * PARTIAL_STRIDE + i];
        y[row0 + threadIdx.x] = total;
    }
}
