// GEMM y = x @ W.T in bf16 with fp32 accumulation on mma.sync tensor cores, warp-specialized for
// sm_90a, for shapes where K % 8 == 0 (every row of x and W then starts on a 16-byte boundary).
//
// x is [M, K] row-major and W is [N, K] row-major: both operands are K-major, x is the "row" A
// operand of mma.m16n8k16 and W (a K x N column-major matrix) the "col" B operand, both loaded with
// the same non-transposing ldmatrix.
//
// The math is the corpus mma_sync kernel's (CTA tile 128 x 256 x 64, 8 warps of 64 x 64, ldmatrix.x4
// fragments double-buffered in registers); what changes is who does the memory work:
//   1. Warp specialization: 3 warpgroups. Warpgroup 0 only copies (the producer); warpgroups 1-2
//      (8 warps) only do ldmatrix + mma.sync (the consumers), so their issue slots and their time
//      at barriers no longer go to cp.async address math and __syncthreads.
//   2. setmaxnreg: the producer drops to PRODUCER_REGS and the consumers rise to CONSUMER_REGS, so
//      384 threads launch (<= 168 registers each) while a consumer still holds its 128 accumulators.
//   3. mbarrier ring: STAGES XOR-swizzled shared tiles, each with a "full" barrier (completed by
//      cp.async.mbarrier.arrive.noinc of the 128 producer threads once their copies have landed)
//      and an "empty" barrier (one arrival per consumer warp once it has read the stage).
//   4. 16-byte cp.async.cg copies; out-of-range rows and the K tail are zero-filled (src-size 0).
//   5. Grouped block rasterization (GROUP_M tile rows) for L2 reuse.
//   6. Epilogue: the consumers alone (named barrier 1) stage the bf16 tile through the ring's
//      shared memory (padded rows) and write it with 16-byte stores (element stores if N % 8 != 0).
//
// Domain: K % 8 == 0 (launch.toml). M and N are arbitrary.

#include <cuda_bf16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, roles, pipeline and vector constants
// ---------------------------------------------------------------------------------------------
constexpr int BLOCK_M = 128;                       // CTA tile rows (of x and y)
constexpr int BLOCK_N = 256;                       // CTA tile columns (rows of W, columns of y)
constexpr int BLOCK_K = 64;                        // K slice per pipeline stage
constexpr int STAGES = 4;                          // ring depth
constexpr int WARPS_M = 2;                         // consumer warps along M
constexpr int WARPS_N = 4;                         // consumer warps along N
constexpr int WARP_SIZE = 32;
constexpr int WARPGROUP_THREADS = 128;
constexpr int PRODUCER_THREADS = WARPGROUP_THREADS;                  // warpgroup 0
constexpr int CONSUMER_WARPS = WARPS_M * WARPS_N;                    // 8
constexpr int CONSUMER_THREADS = CONSUMER_WARPS * WARP_SIZE;         // 256: warpgroups 1-2
constexpr int THREADS = PRODUCER_THREADS + CONSUMER_THREADS;         // 384
constexpr int PRODUCER_REGS = 40;                  // setmaxnreg.dec: pointers, masks, counters
constexpr int CONSUMER_REGS = 232;                 // setmaxnreg.inc: 128 accumulators + 64 fragment regs
constexpr int REGISTER_FILE = 65536;
constexpr int CONSUMER_BARRIER = 1;                // named barrier of the consumers (0 is __syncthreads)
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
constexpr int RING_BYTES = STAGES * STAGE_BYTES;   // 192 KiB
constexpr int BARRIER_BYTES = 2 * STAGES * 8;      // a full and an empty mbarrier per stage
constexpr int SMEM_BYTES = RING_BYTES + BARRIER_BYTES;  // the plan's dynamic shared memory
constexpr int LOAD_ROWS_PER_PASS = PRODUCER_THREADS / CHUNKS_PER_ROW;  // 16 tile rows per producer pass
constexpr int PASS_BYTES = LOAD_ROWS_PER_PASS * ROW_BYTES;           // 2 KiB of a tile per pass
constexpr int A_LOADS = BLOCK_M / LOAD_ROWS_PER_PASS;                // 8 cp.async per thread per A tile
constexpr int B_LOADS = BLOCK_N / LOAD_ROWS_PER_PASS;                // 16 cp.async per thread per B tile
constexpr int GROUP_M = 8;                         // tile rows per rasterization group
constexpr int EPI_PAD = 8;                         // bf16 of padding per staged output row
constexpr int EPI_STRIDE = BLOCK_N + EPI_PAD;      // 264 bf16 = 528 bytes per staged row
constexpr int EPI_CHUNKS_PER_ROW = BLOCK_N / VEC;  // 32 16-byte chunks per output tile row
constexpr int EPI_VEC_PASSES = BLOCK_M * EPI_CHUNKS_PER_ROW / CONSUMER_THREADS;  // 16
constexpr int EPI_SCALAR_PASSES = BLOCK_M * BLOCK_N / CONSUMER_THREADS;          // 128

static_assert(PRODUCER_THREADS % CHUNKS_PER_ROW == 0 && BLOCK_M % LOAD_ROWS_PER_PASS == 0 &&
              BLOCK_N % LOAD_ROWS_PER_PASS == 0, "the producer covers whole tiles");
static_assert(CHUNKS_PER_ROW == SWIZZLE_ROWS, "the XOR swizzle assumes 8 chunks per row");
static_assert(LOAD_ROWS_PER_PASS % SWIZZLE_ROWS == 0, "a producer pass keeps each thread's swizzle phase");
static_assert(K_STEPS % 2 == 0, "register double buffering alternates fragments across k-steps");
static_assert(WARP_TILES_N % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
static_assert(BLOCK_M * EPI_STRIDE * 2 <= RING_BYTES, "the staged output tile fits in the ring");
static_assert((EPI_STRIDE * 2) % CHUNK_BYTES == 0, "staged rows keep 16-byte alignment");
static_assert(RING_BYTES % 8 == 0, "mbarriers need 8-byte alignment");
static_assert(SMEM_BYTES <= 227 * 1024, "the ring and its barriers fit sm_90's opt-in shared memory");
static_assert(STAGES >= 2, "a ring needs at least two stages");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(PRODUCER_REGS >= 24 && CONSUMER_REGS <= 256, "setmaxnreg range");
static_assert(PRODUCER_THREADS * PRODUCER_REGS + CONSUMER_THREADS * CONSUMER_REGS <= REGISTER_FILE,
              "both roles' registers fit the register file together");
static_assert(CONSUMER_THREADS % WARPGROUP_THREADS == 0, "setmaxnreg acts on whole warpgroups");

using bf16 = __nv_bfloat16;

// A (x) fragments of one k-step: 4 registers (8 bf16) per m16 tile. B (W) fragments: 2 registers
// (4 bf16) per n8 tile.
struct Fragments {
    uint32_t a[WARP_TILES_M][4];
    uint32_t b[WARP_TILES_N][2];
};

// ---------------------------------------------------------------------------------------------
// XOR swizzle: byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][BLOCK_K] tile.
// The 8 chunks of a cp.async phase and the 8 rows of an ldmatrix phase hit 8 different bank groups.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk)
{
    return static_cast<uint32_t>(row * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES));
}

// ---------------------------------------------------------------------------------------------
// cp.async, mbarrier, setmaxnreg and named-barrier primitives (shared::cta addresses).
// ---------------------------------------------------------------------------------------------
// 16 bytes global -> shared, bypassing L1; src_bytes 0 reads nothing and writes 16 zero bytes.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}

// Arrive on `bar` once every earlier cp.async of this thread has landed. noinc: the arrival counts
// against the barrier's expected count (so full barriers expect one per producer thread).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}

// No copy may still be in flight when the producer's threads exit.
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}

// Release: this thread's (and, after __syncwarp, its warp's) earlier shared reads are done.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

// Block until the phase of parity `parity` has completed (acquire: its copies are visible).
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n"
                     ".reg .pred ready;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, ready;\n"
                     "}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(REGS));
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(REGS));
}

template <int ID, int COUNT>
__device__ __forceinline__ void named_barrier_sync()
{
    asm volatile("bar.sync %0, %1;\n" :: "n"(ID), "n"(COUNT) : "memory");
}

// ---------------------------------------------------------------------------------------------
// The producer: thread t (0..127) copies chunk t % 8 of tile rows t / 8 + 16 i. Eight consecutive
// threads read one 128-byte row segment (coalesced); rows 16 apart share a swizzle phase, so pass
// i lands PASS_BYTES below pass 0.
// ---------------------------------------------------------------------------------------------
// One operand's PASSES copies for one K tile. `rows`: rows of the matrix from this thread's pass-0
// row on (<= 0: none; 0 as well when the chunk is past K). The passes inside the matrix are a prefix,
// so the source pointer advances only while in range: a zero-filled chunk (src-size 0) still names
// an in-bounds address, and each copy costs one compare, one predicated 64-bit add and the cp.async.
template <int PASSES>
__device__ __forceinline__ void copy_tile_rows(uint32_t dst, const bf16* src, const bf16* fallback, int rows,
                                               long long row_step)
{
    const bf16* from = rows > 0 ? src : fallback;
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
        const bool ok = i * LOAD_ROWS_PER_PASS < rows;
        if (i > 0 && ok) from += row_step;
        cp_async_16(dst + i * PASS_BYTES, from, ok ? CHUNK_BYTES : 0);
    }
}

__device__ __forceinline__ void run_producer(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                             int M, int N, int K, int m0, int n0, int ptid,
                                             uint32_t ring, uint32_t full_bars, uint32_t empty_bars, int k_tiles)
{
    const int row = ptid / CHUNKS_PER_ROW;
    const int chunk = ptid % CHUNKS_PER_ROW;
    const long long row_step = static_cast<long long>(LOAD_ROWS_PER_PASS) * K;
    const bf16* a_src = x + static_cast<long long>(m0 + row) * K + chunk * VEC;
    const bf16* b_src = w + static_cast<long long>(n0 + row) * K + chunk * VEC;
    const int a_rows = M - (m0 + row);
    const int b_rows = N - (n0 + row);
    const uint32_t own = swizzle_offset(row, chunk);
    int k_left = K - chunk * VEC;  // > 0 while this thread's chunk of the K tile is inside K

    int stage = 0;
    uint32_t phase = 0;  // parity of the ring's current lap
    for (int kt = 0; kt < k_tiles; ++kt) {
        // Slot free once the consumers released it on the previous lap. On lap 0 this waits on
        // parity 1 of a fresh barrier (in phase 0), which counts as the completed preceding phase
        // and returns at once: the first STAGES tiles need no special case.
        mbarrier_wait(empty_bars + stage * 8, phase ^ 1u);
        const uint32_t a_dst = ring + stage * STAGE_BYTES + own;
        // K % 8 == 0: a chunk is wholly inside K or wholly past it (then zero-filled).
        const bool k_ok = k_left > 0;
        copy_tile_rows<A_LOADS>(a_dst, a_src, x, k_ok ? a_rows : 0, row_step);
        copy_tile_rows<B_LOADS>(a_dst + A_STAGE_BYTES, b_src, w, k_ok ? b_rows : 0, row_step);
        cp_async_arrive_noinc(full_bars + stage * 8);
        a_src += BLOCK_K;
        b_src += BLOCK_K;
        k_left -= BLOCK_K;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1u;
        }
    }
    cp_async_wait_all();
}

// ---------------------------------------------------------------------------------------------
// ldmatrix fragments. Four 8x8 b16 matrices; lanes 8j..8j+7 give the row addresses of matrix j,
// and register j of lane l receives row l / 4, columns 2 (l % 4) + {0, 1} of matrix j.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

// Per-lane ldmatrix addressing, fixed for the whole kernel.
// A, m16 x k16: lane l points at row l % 16, k half l / 16 -> matrices (r0-7,k0-7), (r8-15,k0-7),
// (r0-7,k8-15), (r8-15,k8-15) = a0..a3. B, two n8 x k16 tiles: lane l points at row l % 8 + 8 (l / 16),
// k half (l / 8) % 2 -> b0, b1 of the first n8 tile, then of the second.
// Warp rows start at multiples of 8, so the swizzle phase of a lane is the constant l % 8.
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

__device__ __forceinline__ uint32_t a_fragment_offset(const FragmentAddressing& fa, int ks, int mt)
{
    return fa.a_row +
           static_cast<uint32_t>(mt * MMA_M * ROW_BYTES + ((2 * ks + fa.a_half) ^ fa.phase) * CHUNK_BYTES);
}

__device__ __forceinline__ uint32_t b_fragment_offset(const FragmentAddressing& fa, int ks, int np)
{
    return fa.b_row +
           static_cast<uint32_t>(np * 2 * MMA_N * ROW_BYTES + ((2 * ks + fa.b_half) ^ fa.phase) * CHUNK_BYTES);
}

// Fragments of k-step `ks` of the stage at `stage` (A tile first, B tile after it).
__device__ __forceinline__ void load_fragments(Fragments& f, const FragmentAddressing& fa, uint32_t stage, int ks)
{
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt)
        ldmatrix_x4(f.a[mt], stage + a_fragment_offset(fa, ks, mt));
#pragma unroll
    for (int np = 0; np < WARP_TILES_N / 2; ++np) {
        uint32_t r[4];
        ldmatrix_x4(r, stage + A_STAGE_BYTES + b_fragment_offset(fa, ks, np));
        f.b[2 * np][0] = r[0];
        f.b[2 * np][1] = r[1];
        f.b[2 * np + 1][0] = r[2];
        f.b[2 * np + 1][1] = r[3];
    }
}

// D (16x8 fp32) += A (16x16 bf16, row) * B (16x8 bf16, col).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The warp's 64 x 64 block for one k-step, 4 x 8 MMAs; the n order snakes so that consecutive MMAs
// share an operand.
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
// Block-order swizzle: column-major inside groups of GROUP_M tile rows, so CTAs resident together
// share A tile rows and B tile columns in L2. The last group may have fewer rows.
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
// Epilogue. Accumulators (c0, c1) of lane l sit at row l / 4, columns 2 (l % 4) + {0, 1} of their
// 16x8 tile, (c2, c3) 8 rows below; packed to bf16x2 into a [BLOCK_M][EPI_STRIDE] staging tile whose
// 528-byte rows put a warp's 8 rows 4 banks apart (conflict-free).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

constexpr int ACC_ROW_HALF = 8;

__device__ __forceinline__ void store_accumulators_to_shared(bf16* stage,
                                                             const float (&acc)[WARP_TILES_M][WARP_TILES_N][4],
                                                             int warp_m, int warp_n, int lane)
{
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt) {
#pragma unroll
        for (int nt = 0; nt < WARP_TILES_N; ++nt) {
            const int row = warp_m * WARP_M + mt * MMA_M + lane / 4;
            const int col = warp_n * WARP_N + nt * MMA_N + 2 * (lane % 4);
            *reinterpret_cast<uint32_t*>(stage + row * EPI_STRIDE + col) = pack_bf16x2(acc[mt][nt][0], acc[mt][nt][1]);
            *reinterpret_cast<uint32_t*>(stage + (row + ACC_ROW_HALF) * EPI_STRIDE + col) =
                pack_bf16x2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    }
}

// 16-byte stores: consumer thread t writes chunk t % 32 of rows t / 32 + 8 p. Needs rows of y 16-byte
// aligned (N % 8 == 0): a chunk is then wholly in or out.
__device__ __forceinline__ void store_tile_vectorized(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int ctid)
{
#pragma unroll 4
    for (int p = 0; p < EPI_VEC_PASSES; ++p) {
        const int id = ctid + p * CONSUMER_THREADS;
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

// Element-wise stores, for rows of y that are not 16-byte aligned.
__device__ __forceinline__ void store_tile_scalar(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int ctid)
{
#pragma unroll 4
    for (int p = 0; p < EPI_SCALAR_PASSES; ++p) {
        const int id = ctid + p * CONSUMER_THREADS;
        const int row = id / BLOCK_N;
        const int col = id % BLOCK_N;
        const int gm = m0 + row;
        const int gn = n0 + col;
        if (gm < M && gn < N)
            y[static_cast<long long>(gm) * N + gn] = stage[row * EPI_STRIDE + col];
    }
}

// ---------------------------------------------------------------------------------------------
// The consumers: 8 warps of 64 x 64. K tile kt sits in slot kt % STAGES; its full barrier completes
// phase kt / STAGES, so the wait is on parity (kt / STAGES) & 1 (`phase`, flipped at each wrap).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void run_consumer(bf16* y, int M, int N, int m0, int n0, int ctid,
                                             unsigned char* smem, uint32_t ring, uint32_t full_bars,
                                             uint32_t empty_bars, int k_tiles)
{
    const int lane = ctid % WARP_SIZE;
    const int warp = ctid / WARP_SIZE;
    const int warp_m = warp / WARPS_N;
    const int warp_n = warp % WARPS_N;
    const FragmentAddressing fa = make_fragment_addressing(warp_m, warp_n, lane);

    float acc[WARP_TILES_M][WARP_TILES_N][4];
#pragma unroll
    for (int mt = 0; mt < WARP_TILES_M; ++mt)
#pragma unroll
        for (int nt = 0; nt < WARP_TILES_N; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

    int stage = 0;
    uint32_t phase = 0;
    uint32_t stage_base = ring;
    Fragments frag[2];  // register double buffer: k-step s uses frag[s % 2]
    if (k_tiles > 0) {
        mbarrier_wait(full_bars, 0);
        load_fragments(frag[0], fa, stage_base, 0);
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
        const bool more = kt + 1 < k_tiles;
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks) {
            if (ks == K_STEPS - 1) {
                // The last reads of this slot (k-step K_STEPS - 1's fragments) were issued at the
                // previous k-step: hand it back, one arrival per warp once all its lanes are past them.
                __syncwarp();
                if (lane == 0) mbarrier_arrive(empty_bars + stage * 8);
                if (++stage == STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
                stage_base = ring + stage * STAGE_BYTES;
                if (more) mbarrier_wait(full_bars + stage * 8, phase);
            }
            // Fragments of the next k-step: the first of the next K tile after the last k-step
            // (none after the last K tile: that slot is never filled again).
            if (ks < K_STEPS - 1 || more)
                load_fragments(frag[(ks + 1) % 2], fa, stage_base, (ks + 1) % K_STEPS);
            mma_warp_tile(acc, frag[ks % 2]);
        }
    }

    // Every consumer warp has waited on every full barrier, so no copy is in flight into the ring,
    // and the producer issues none after its last tile: only the consumers need to agree that all
    // their ldmatrix reads are done before the ring becomes the staging tile.
    named_barrier_sync<CONSUMER_BARRIER, CONSUMER_THREADS>();
    bf16* staged = reinterpret_cast<bf16*>(smem);
    store_accumulators_to_shared(staged, acc, warp_m, warp_n, lane);
    named_barrier_sync<CONSUMER_BARRIER, CONSUMER_THREADS>();
    const bool rows_aligned = (N % VEC == 0) && ((reinterpret_cast<uintptr_t>(y) % CHUNK_BYTES) == 0);
    if (rows_aligned)
        store_tile_vectorized(staged, y, M, N, m0, n0, ctid);
    else
        store_tile_scalar(staged, y, M, N, m0, n0, ctid);
}

// ---------------------------------------------------------------------------------------------
// Per-role setup. Each role works out its tile and ring addresses itself, after setmaxnreg: ptxas
// spills values that are live across the register-count change.
// ---------------------------------------------------------------------------------------------
struct CtaTile {
    int m0, n0, k_tiles;
};

__device__ __forceinline__ CtaTile cta_tile(int M, int N, int K)
{
    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    int tile_m, tile_n;
    tile_coordinates(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);
    // Producer and consumers both run exactly k_tiles stages.
    return {tile_m * BLOCK_M, tile_n * BLOCK_N, (K + BLOCK_K - 1) / BLOCK_K};
}

// Shared memory: the ring (stage s at s * STAGE_BYTES, A tile then B tile), then full[s] at
// RING_BYTES + 8 s and empty[s] at RING_BYTES + 8 (STAGES + s).
__device__ __forceinline__ uint32_t ring_address(unsigned char* smem)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem));
}

// ---------------------------------------------------------------------------------------------
// The kernel: one CTA per BLOCK_M x BLOCK_N output tile; grid = tiles_m * tiles_n (1-D).
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_bf16_mma_sync_ws(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, int M, int N, int K)
{
    extern __shared__ __align__(128) unsigned char smem[];

    if (threadIdx.x == 0) {
        const uint32_t ring = ring_address(smem);
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbarrier_init(ring + RING_BYTES + s * 8, PRODUCER_THREADS);           // full: one noinc cp.async arrival per producer thread
            mbarrier_init(ring + RING_BYTES + (STAGES + s) * 8, CONSUMER_WARPS);  // empty: one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();  // the only CTA-wide barrier: barriers initialised before anyone uses them

    // Warp-uniform role index (the shuffle tells the compiler it is uniform).
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / WARPGROUP_THREADS, 0);
    if (warpgroup == 0) {
        setmaxnreg_dec<PRODUCER_REGS>();
        const CtaTile t = cta_tile(M, N, K);
        const uint32_t ring = ring_address(smem);
        run_producer(x, w, M, N, K, t.m0, t.n0, threadIdx.x, ring, ring + RING_BYTES,
                     ring + RING_BYTES + STAGES * 8, t.k_tiles);
    } else {
        setmaxnreg_inc<CONSUMER_REGS>();
        const CtaTile t = cta_tile(M, N, K);
        const uint32_t ring = ring_address(smem);
        run_consumer(y, M, N, t.m0, t.n0, threadIdx.x - PRODUCER_THREADS, smem, ring, ring + RING_BYTES,
                     ring + RING_BYTES + STAGES * 8, t.k_tiles);
    }
}
