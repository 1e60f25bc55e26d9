// GEMM y = x @ W.T in bf16 with fp32 accumulation, on Ampere-style tensor cores (mma.sync), for
// shapes where K % 8 == 0 (every row of x and W then starts on a 16-byte boundary).
//
// x is [M, K] row-major and W is [N, K] row-major, so both operands are K-major: x is the "row"
// A operand of mma.m16n8k16 and W, read as a K x N column-major matrix, is the "col" B operand.
// Both are loaded with the same non-transposing ldmatrix.
//
// Mechanisms, each in its own helper below:
//   1. Tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (mma_bf16_16816).
//   2. ldmatrix fragment loads: ldmatrix.sync.aligned.m8n8.x4 (ldmatrix_x4, load_a_fragments,
//      load_b_fragments), double-buffered in registers: the fragments of k-step s+1 load while
//      the MMAs of k-step s issue.
//   3. Multi-stage cp.async pipeline: STAGES shared-memory buffers filled by 16-byte
//      cp.async.cg with commit_group / wait_group (cp_async_16, cp_async_commit, cp_async_wait,
//      load_a_tile_async, load_b_tile_async). Out-of-range rows and the K tail are zero-filled
//      through the src-size operand, so edge tiles need no separate code.
//   4. 128-bit vectorized global loads: each cp.async moves one 16-byte chunk (VEC bf16), and 8
//      consecutive threads cover one 128-byte row of a tile.
//   5. XOR-swizzled shared layout (swizzle_offset): a tile row is BLOCK_K bf16 = 128 bytes = 8
//      chunks, and chunk c of row r is stored at chunk position c ^ (r % 8). The 8 row addresses
//      of every ldmatrix phase, and the 8 chunks of every cp.async phase, then hit 8 different
//      16-byte bank groups: no bank conflicts, and no padding.
//   6. Register blocking: a CTA tile of BLOCK_M x BLOCK_N, 8 warps as WARPS_M x WARPS_N, each
//      warp owns WARP_M x WARP_N = 64 x 64 outputs (4 x 8 MMA tiles, 128 fp32 accumulators per
//      thread), so each fragment loaded from shared memory feeds 4 or 8 MMAs.
//   7. Block-order swizzle (tile_coordinates): grouped rasterization, GROUP_M tile rows at a time,
//      so that the CTAs resident together share A tile rows and B tile columns in L2.
//   8. Vectorized epilogue (store_accumulators_to_shared, store_tile_vectorized): accumulators are
//      rounded to bf16, packed in pairs, staged through shared memory (rows padded by EPI_PAD, which
//      keeps the fragment writes conflict-free) and written to y as 16-byte coalesced stores. Where
//      rows of y are not 16-byte aligned (N % 8 != 0) the same staged tile is written element by
//      element (store_tile_scalar).
//
// Domain: K % 8 == 0 (declared in launch.toml). cp.async of 16 bytes needs a 16-byte aligned
// source, which holds for every row of x and W exactly when K % 8 == 0 (buffers are 256-byte
// aligned). M and N are arbitrary.

#include <cuda_bf16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, pipeline and vector constants
// ---------------------------------------------------------------------------------------------
constexpr int BLOCK_M = 128;                       // CTA tile rows (of x and y)
constexpr int BLOCK_N = 256;                       // CTA tile columns (rows of W, columns of y)
constexpr int BLOCK_K = 64;                        // K slice per pipeline stage
constexpr int STAGES = 4;                          // cp.async pipeline depth
constexpr int WARPS_M = 2;                         // warps along M
constexpr int WARPS_N = 4;                         // warps along N
constexpr int WARP_SIZE = 32;
constexpr int THREADS = WARPS_M * WARPS_N * WARP_SIZE;  // 256
constexpr int WARP_M = BLOCK_M / WARPS_M;          // 64 rows per warp
constexpr int WARP_N = BLOCK_N / WARPS_N;          // 64 columns per warp
constexpr int MMA_M = 16;                          // mma.m16n8k16
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;
constexpr int WARP_TILES_M = WARP_M / MMA_M;       // 4 MMA tiles along M per warp
constexpr int WARP_TILES_N = WARP_N / MMA_N;       // 8 MMA tiles along N per warp
constexpr int K_STEPS = BLOCK_K / MMA_K;           // 4 MMA k-steps per stage
constexpr int VEC = 8;                             // bf16 per 16-byte chunk (one cp.async)
constexpr int CHUNK_BYTES = 16;
constexpr int CHUNKS_PER_ROW = BLOCK_K / VEC;      // 8 chunks in a 128-byte tile row
constexpr int ROW_BYTES = BLOCK_K * 2;             // 128
constexpr int SWIZZLE_ROWS = 8;                    // the XOR pattern repeats every 8 rows
constexpr int A_STAGE_BYTES = BLOCK_M * ROW_BYTES; // 16 KiB
constexpr int B_STAGE_BYTES = BLOCK_N * ROW_BYTES; // 32 KiB
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;   // 192 KiB: the plan's dynamic shared memory
constexpr int LOAD_ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;  // 32 tile rows per pass of the CTA
constexpr int A_LOADS = BLOCK_M / LOAD_ROWS_PER_PASS;         // 4 cp.async per thread per A tile
constexpr int B_LOADS = BLOCK_N / LOAD_ROWS_PER_PASS;         // 8 cp.async per thread per B tile
constexpr int GROUP_M = 8;                         // tile rows per rasterization group
constexpr int EPI_PAD = 8;                         // bf16 of padding per staged output row
constexpr int EPI_STRIDE = BLOCK_N + EPI_PAD;      // 264 bf16 = 528 bytes per staged row
constexpr int EPI_CHUNKS_PER_ROW = BLOCK_N / VEC;  // 32 16-byte chunks per output tile row
constexpr int EPI_VEC_PASSES = BLOCK_M * EPI_CHUNKS_PER_ROW / THREADS;  // 16
constexpr int EPI_SCALAR_PASSES = BLOCK_M * BLOCK_N / THREADS;          // 128

static_assert(THREADS % CHUNKS_PER_ROW == 0 && BLOCK_M % LOAD_ROWS_PER_PASS == 0 &&
              BLOCK_N % LOAD_ROWS_PER_PASS == 0, "the loaders cover whole tiles");
static_assert(CHUNKS_PER_ROW == SWIZZLE_ROWS, "the XOR swizzle assumes 8 chunks per row");
static_assert(LOAD_ROWS_PER_PASS % SWIZZLE_ROWS == 0, "a loader pass keeps each thread's swizzle phase");
static_assert(K_STEPS % 2 == 0, "register double buffering alternates fragments across k-steps");
static_assert(WARP_TILES_N % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
static_assert(BLOCK_M * EPI_STRIDE * 2 <= SMEM_BYTES, "the staged output tile fits in the pipeline buffers");
static_assert((EPI_STRIDE * 2) % CHUNK_BYTES == 0, "staged rows keep 16-byte alignment");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");

using bf16 = __nv_bfloat16;

// A (x) fragments of one k-step: 4 registers (8 bf16) per m16 tile. B (W) fragments: 2 registers
// (4 bf16) per n8 tile.
struct Fragments {
    uint32_t a[WARP_TILES_M][4];
    uint32_t b[WARP_TILES_N][2];
};

// ---------------------------------------------------------------------------------------------
// Mechanism 5: XOR swizzle of the shared tiles.
// Byte offset of 16-byte chunk `chunk` (0..7) of tile row `row` in a [rows][BLOCK_K] bf16 tile.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk)
{
    return static_cast<uint32_t>(row * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES));
}

// ---------------------------------------------------------------------------------------------
// Mechanism 3 (with 4): cp.async primitives. 16 bytes global -> shared, bypassing L1 (.cg);
// src_bytes < 16 zero-fills the rest (0: nothing is read, the chunk becomes zeros).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `PENDING` of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Mechanism 3: the per-thread view of the global -> shared tile copies.
// Thread t copies chunk (t % 8) of tile rows t / 8 + 32 * i: 8 consecutive threads read one
// 128-byte row segment (coalesced), and the 8 chunks of a row land in 8 different bank groups.
// ---------------------------------------------------------------------------------------------
struct TileLoader {
    const bf16* a_src;      // x: this thread's chunk in tile row 0 of its pass, at k = 0
    const bf16* b_src;      // W: likewise
    const bf16* a_base;     // fallback address for zero-filled chunks (never read)
    const bf16* b_base;
    long long row_step;     // elements between the rows of two passes: LOAD_ROWS_PER_PASS * K
    uint32_t a_valid;       // bit i: row of pass i of the A tile is < M
    uint32_t b_valid;       // bit i: row of pass i of the B tile is < N
    uint32_t smem_offset;   // swizzled byte offset of this thread's chunk in pass 0
    int k_chunk;            // this thread's k offset within the tile: (t % 8) * VEC
    int K;
};

__device__ __forceinline__ TileLoader make_tile_loader(const bf16* x, const bf16* w, int M, int N, int K,
                                                       int m0, int n0, int tid)
{
    TileLoader ld;
    const int row = tid / CHUNKS_PER_ROW;
    const int chunk = tid % CHUNKS_PER_ROW;
    ld.k_chunk = chunk * VEC;
    ld.K = K;
    ld.row_step = static_cast<long long>(LOAD_ROWS_PER_PASS) * K;
    ld.a_base = x;
    ld.b_base = w;
    ld.a_src = x + static_cast<long long>(m0 + row) * K + ld.k_chunk;
    ld.b_src = w + static_cast<long long>(n0 + row) * K + ld.k_chunk;
    ld.a_valid = 0;
    ld.b_valid = 0;
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i)
        ld.a_valid |= (m0 + row + i * LOAD_ROWS_PER_PASS < M ? 1u : 0u) << i;
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i)
        ld.b_valid |= (n0 + row + i * LOAD_ROWS_PER_PASS < N ? 1u : 0u) << i;
    ld.smem_offset = swizzle_offset(row, chunk);
    return ld;
}

// Byte offset of this thread's chunk in loader pass i: rows LOAD_ROWS_PER_PASS apart share a
// swizzle phase, so pass i is pass 0 moved down by LOAD_ROWS_PER_PASS rows.
__device__ __forceinline__ uint32_t pass_offset(uint32_t smem_offset, int i)
{
    return smem_offset + static_cast<uint32_t>(i * LOAD_ROWS_PER_PASS * ROW_BYTES);
}

// Issue the cp.async copies of passes [FIRST, FIRST + COUNT) of one operand's tile for K tile kt.
// Rows past the matrix edge and chunks past K are zero-filled (src-size 0).
template <int FIRST, int COUNT>
__device__ __forceinline__ void load_rows_async(uint32_t stage_smem, const bf16* src, const bf16* base,
                                                uint32_t valid, long long row_step, uint32_t smem_offset,
                                                bool k_ok)
{
#pragma unroll
    for (int i = FIRST; i < FIRST + COUNT; ++i) {
        const bool ok = k_ok && ((valid >> i) & 1u);
        const bf16* from = ok ? src + i * row_step : base;
        cp_async_16(stage_smem + pass_offset(smem_offset, i), from, ok ? CHUNK_BYTES : 0);
    }
}

// The A (x) tile, BLOCK_M x BLOCK_K, of K tile kt into its stage.
__device__ __forceinline__ void load_a_tile_async(const TileLoader& ld, uint32_t a_stage, int kt)
{
    const int k = kt * BLOCK_K;
    const bool k_ok = k + ld.k_chunk < ld.K;  // K % 8 == 0: a chunk is wholly inside K or wholly outside
    load_rows_async<0, A_LOADS>(a_stage, ld.a_src + k, ld.a_base, ld.a_valid, ld.row_step, ld.smem_offset, k_ok);
}

// Half of the B (W) tile, BLOCK_N x BLOCK_K, of K tile kt: HALF 0 or 1 (spread over two k-steps).
template <int HALF>
__device__ __forceinline__ void load_b_tile_async(const TileLoader& ld, uint32_t b_stage, int kt)
{
    const int k = kt * BLOCK_K;
    const bool k_ok = k + ld.k_chunk < ld.K;
    load_rows_async<HALF * (B_LOADS / 2), B_LOADS / 2>(b_stage, ld.b_src + k, ld.b_base, ld.b_valid,
                                                       ld.row_step, ld.smem_offset, k_ok);
}

// ---------------------------------------------------------------------------------------------
// Mechanism 2: ldmatrix. Four 8x8 b16 matrices; lanes 8j..8j+7 give the row addresses of matrix j,
// and register j of lane l receives row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

// Per-lane ldmatrix addressing, fixed for the whole kernel.
// A, m16 x k16 tile: lane l points at row (l % 16), chunk (l / 16) of the k-step, so matrices
// 0..3 are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15):
// registers a0..a3 of the mma A fragment.
// B, two n8 x k16 tiles (rows of W): lane l points at row (l % 8) + 8 (l / 16), chunk (l / 8) % 2,
// so matrices 0..3 are (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15):
// registers b0, b1 of the first n8 tile, then b0, b1 of the second.
// Tile rows of a warp start at multiples of 8, so row % 8 == l % 8 and the swizzle XOR of a lane
// is a per-lane constant: the address of k-step s is row_offset + ((2 s + half) ^ (l % 8)) * 16.
struct FragmentAddressing {
    uint32_t a_row;   // byte offset of this lane's A row (warp row 0, m16 tile 0) in an A stage
    uint32_t b_row;   // byte offset of this lane's B row (warp column 0, n16 pair 0) in a B stage
    int a_half;       // which 8-wide half of the k16 step this lane addresses in A
    int b_half;
    int phase;        // row % 8, the swizzle phase
};

__device__ __forceinline__ FragmentAddressing make_fragment_addressing(int warp_m, int warp_n, int lane)
{
    FragmentAddressing fa;
    const int a_row = warp_m * WARP_M + (lane % 16);
    const int b_row = warp_n * WARP_N + (lane % 8) + 8 * (lane / 16);
    fa.a_row = static_cast<uint32_t>(a_row * ROW_BYTES);
    fa.b_row = static_cast<uint32_t>(b_row * ROW_BYTES);
    fa.a_half = lane / 16;
    fa.b_half = (lane / 8) % 2;
    fa.phase = lane % SWIZZLE_ROWS;
    return fa;
}

// Byte offset in an A stage of this lane's ldmatrix row for m16 tile `mt` at k-step `ks`.
__device__ __forceinline__ uint32_t a_fragment_offset(const FragmentAddressing& fa, int ks, int mt)
{
    return fa.a_row +
           static_cast<uint32_t>(mt * MMA_M * ROW_BYTES + ((2 * ks + fa.a_half) ^ fa.phase) * CHUNK_BYTES);
}

// Byte offset in a B stage of this lane's ldmatrix row for n8 tiles 2 np, 2 np + 1 at k-step `ks`.
__device__ __forceinline__ uint32_t b_fragment_offset(const FragmentAddressing& fa, int ks, int np)
{
    return fa.b_row +
           static_cast<uint32_t>(np * 2 * MMA_N * ROW_BYTES + ((2 * ks + fa.b_half) ^ fa.phase) * CHUNK_BYTES);
}

// A fragments of k-step `ks` for the warp's WARP_TILES_M m16 tiles.
__device__ __forceinline__ void load_a_fragments(Fragments& f, const FragmentAddressing& fa, uint32_t a_stage, int ks)
{
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt)
        ldmatrix_x4(f.a[mt], a_stage + a_fragment_offset(fa, ks, mt));
}

// B fragments of k-step `ks` for the warp's WARP_TILES_N n8 tiles, two per ldmatrix.x4.
__device__ __forceinline__ void load_b_fragments(Fragments& f, const FragmentAddressing& fa, uint32_t b_stage, int ks)
{
#pragma unroll
    for (int np = 0; np < WARP_TILES_N / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, b_stage + b_fragment_offset(fa, ks, np));
        f.b[2 * np][0] = r[0];
        f.b[2 * np][1] = r[1];
        f.b[2 * np + 1][0] = r[2];
        f.b[2 * np + 1][1] = r[3];
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 1: one tensor-core MMA, D (16x8 fp32) += A (16x16 bf16, row) * B (16x8 bf16, col).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Mechanism 6: the warp's 64 x 64 register block for one k-step, 4 x 8 MMAs. The n order snakes
// (reversed on odd m tiles) so that consecutive MMAs share an operand.
__device__ __forceinline__ void mma_warp_tile(float (&acc)[WARP_TILES_M][WARP_TILES_N][4], const Fragments& f)
{
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt) {
#pragma unroll
        for (int j = 0; j < WARP_TILES_N; ++j) {
            const int nt = (mt % 2 == 0) ? j : WARP_TILES_N - 1 - j;
            mma_bf16_16816(acc[mt][nt], f.a[mt], f.b[nt]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 7: block-order swizzle. Linear block id -> (tile row, tile column): column-major
// inside groups of GROUP_M tile rows, so consecutive blocks walk down GROUP_M rows of A tiles
// before moving to the next B tile column. The last group may have fewer rows.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void tile_coordinates(int block, int tiles_m, int tiles_n, int& tile_m, int& tile_n)
{
    const int per_group = GROUP_M * tiles_n;
    const int group = block / per_group;
    const int first_m = group * GROUP_M;
    const int rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = block - group * per_group;
    tile_m = first_m + in_group % rows;
    tile_n = in_group / rows;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 8: epilogue. Accumulator fragment (c0, c1) of lane l sits at row l / 4, columns
// 2 (l % 4) + {0, 1} of its 16x8 tile, (c2, c3) 8 rows below. Packed to bf16x2 and written to a
// padded [BLOCK_M][EPI_STRIDE] staging tile: the 8 rows of a warp's write are 528 bytes apart,
// 4 banks apart, so the 32 lanes hit 32 different banks.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Tile row of accumulators (c0, c1) of MMA tile (mt, nt); (c2, c3) sit ACC_ROW_HALF rows below.
constexpr int ACC_ROW_HALF = 8;
__device__ __forceinline__ int accumulator_row(int warp_m, int mt, int lane)
{
    return warp_m * WARP_M + mt * MMA_M + lane / 4;
}

// Tile column of accumulator c0 (c1 is the next column) of MMA tile (mt, nt).
__device__ __forceinline__ int accumulator_col(int warp_n, int nt, int lane)
{
    return warp_n * WARP_N + nt * MMA_N + 2 * (lane % 4);
}

__device__ __forceinline__ void store_accumulators_to_shared(bf16* stage,
                                                             const float (&acc)[WARP_TILES_M][WARP_TILES_N][4],
                                                             int warp_m, int warp_n, int lane)
{
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt) {
#pragma unroll
        for (int nt = 0; nt < WARP_TILES_N; ++nt) {
            const int row = accumulator_row(warp_m, mt, lane);
            const int col = accumulator_col(warp_n, nt, lane);
            *reinterpret_cast<uint32_t*>(stage + row * EPI_STRIDE + col) = pack_bf16x2(acc[mt][nt][0], acc[mt][nt][1]);
            *reinterpret_cast<uint32_t*>(stage + (row + ACC_ROW_HALF) * EPI_STRIDE + col) =
                pack_bf16x2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    }
}

// 16-byte stores: thread t writes chunk t % 32 of rows t / 32 + 8 p; a warp writes one 512-byte
// row segment. Needs rows of y 16-byte aligned (N % 8 == 0): a chunk is then wholly in or out.
__device__ __forceinline__ void store_tile_vectorized(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int tid)
{
#pragma unroll 4
    for (int p = 0; p < EPI_VEC_PASSES; ++p) {
        const int id = tid + p * THREADS;
        const int row = id / EPI_CHUNKS_PER_ROW;
        const int col = (id % EPI_CHUNKS_PER_ROW) * VEC;
        const int gm = m0 + row;
        const int gn = n0 + col;
        if (gm < M && gn < N) {
            const uint4 v = *reinterpret_cast<const uint4*>(stage + row * EPI_STRIDE + col);
            *reinterpret_cast<uint4*>(y + static_cast<long long>(gm) * N + gn) = v;
        }
    }
}

// Element-wise stores of the staged tile, for rows of y that are not 16-byte aligned.
__device__ __forceinline__ void store_tile_scalar(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int tid)
{
#pragma unroll 4
    for (int p = 0; p < EPI_SCALAR_PASSES; ++p) {
        const int id = tid + p * THREADS;
        const int row = id / BLOCK_N;
        const int col = id % BLOCK_N;
        const int gm = m0 + row;
        const int gn = n0 + col;
        if (gm < M && gn < N)
            y[static_cast<long long>(gm) * N + gn] = stage[row * EPI_STRIDE + col];
    }
}

// ---------------------------------------------------------------------------------------------
// The kernel: one CTA per BLOCK_M x BLOCK_N output tile; grid = tiles_m * tiles_n (1-D).
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_bf16_mma_sync(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, int M, int N, int K)
{
    extern __shared__ __align__(128) unsigned char smem[];

    const int tid = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    int tile_m, tile_n;
    tile_coordinates(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);
    const int m0 = tile_m * BLOCK_M;
    const int n0 = tile_n * BLOCK_N;

    // Stage s: A tile at s * STAGE_BYTES, B tile right after it.
    const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const TileLoader ld = make_tile_loader(x, w, M, N, K, m0, n0, tid);
    const FragmentAddressing fa = make_fragment_addressing(warp_m, warp_n, lane);

    float acc[WARP_TILES_M][WARP_TILES_N][4];
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt)
#pragma unroll
        for (int nt = 0; nt < WARP_TILES_N; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;

    // Pipeline prologue: K tiles 0 .. STAGES-2 in flight, one commit group each (tiles past the
    // end of K are zero-fills).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        const uint32_t stage = smem_base + s * STAGE_BYTES;
        load_a_tile_async(ld, stage, s);
        load_b_tile_async<0>(ld, stage + A_STAGE_BYTES, s);
        load_b_tile_async<1>(ld, stage + A_STAGE_BYTES, s);
        cp_async_commit();
    }
    cp_async_wait<STAGES - 2>();  // K tile 0 has landed (for this thread) ...
    __syncthreads();              // ... and for every thread

    int read_stage = 0;            // stage holding K tile kt
    int write_stage = STAGES - 1;  // stage receiving K tile kt + STAGES - 1
    uint32_t read_base = smem_base;
    uint32_t write_base = smem_base + write_stage * STAGE_BYTES;

    Fragments frag[2];  // register double buffer: k-step s uses frag[s % 2]
    load_a_fragments(frag[0], fa, read_base, 0);
    load_b_fragments(frag[0], fa, read_base + A_STAGE_BYTES, 0);

    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks) {
            if (ks == K_STEPS - 1) {
                // Before reading the next stage: its cp.async group must be complete for every
                // thread. The barrier also ends every read of the stage that the next iteration
                // overwrites (its last fragments were loaded at k-step K_STEPS - 2).
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
                read_base = smem_base + read_stage * STAGE_BYTES;
            }
            // Fragments of the next k-step (the first of the next K tile after the last k-step).
            const int next = (ks + 1) % K_STEPS;
            load_a_fragments(frag[(ks + 1) % 2], fa, read_base, next);
            load_b_fragments(frag[(ks + 1) % 2], fa, read_base + A_STAGE_BYTES, next);

            // Global -> shared copies of K tile kt + STAGES - 1, spread over the first k-steps.
            // Past the last K tile they are zero-fills (k_ok fails) whose contents no MMA uses:
            // no branch, so the k-steps stay one straight-line block for the scheduler.
            const int fetch = kt + STAGES - 1;
            if (ks == 0) load_a_tile_async(ld, write_base, fetch);
            if (ks == 1) load_b_tile_async<0>(ld, write_base + A_STAGE_BYTES, fetch);
            if (ks == 2) {
                load_b_tile_async<1>(ld, write_base + A_STAGE_BYTES, fetch);
                cp_async_commit();  // one group per K tile, so the wait_group counts hold
                write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;
                write_base = smem_base + write_stage * STAGE_BYTES;
            }

            mma_warp_tile(acc, frag[ks % 2]);
        }
    }

    // Epilogue: drain the pipeline, then reuse its buffers as the staging tile.
    cp_async_wait<0>();
    __syncthreads();
    bf16* staged = reinterpret_cast<bf16*>(smem);
    store_accumulators_to_shared(staged, acc, warp_m, warp_n, lane);
    __syncthreads();
    const bool rows_aligned = (N % VEC == 0) && ((reinterpret_cast<uintptr_t>(y) % CHUNK_BYTES) == 0);
    if (rows_aligned)
        store_tile_vectorized(staged, y, M, N, m0, n0, tid);
    else
        store_tile_scalar(staged, y, M, N, m0, n0, tid);
}
