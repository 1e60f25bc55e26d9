// Conv2d fp16 NHWC x KRSC -> NHWC as an implicit GEMM on tensor cores, for ANY channel count.
//
// The same kernel as implicit_gemm (read that header first: GEMM M = N*P*Q pixels, N = F filters,
// K = R*S*C taps, 192 x 128 x 64 tiles, 4-stage cp.async ring, swizzled ldmatrix, mma.sync m16n8k16
// with fp32 accumulation, shared-memory epilogue), plus a second way of filling a stage for when
// C % 8 != 0 (an RGB stem layer, C = 3). Then a run of 8 consecutive k is no longer 8 channels of
// one pixel: it spans several taps, and a pixel row is not 16-byte aligned, so no 16-byte copy can
// fetch it. The gather path reads those 8 values one fp16 at a time into registers (each with its
// own tap and padding test), packs them and writes the same swizzled 16-byte shared chunk the copy
// would have written: everything downstream of the stage (ldmatrix, MMA, epilogue) is unchanged.
// The choice is made once per CTA from C (uniform, so every barrier is reached by all threads).
// The gather is synchronous (a thread waits for its loads before storing them), so that path
// overlaps memory with math only across warps; it exists for coverage of thin-channel layers, whose
// K is small, not for speed.
//
// Mechanisms, one region each below:
//   tiles          BLOCK_M x BLOCK_N output tile per CTA, stepped along K by BLOCK_K
//   im2col loader  per-thread precomputed pixel coordinates; the tap (r, s, c) carried per K-step
//   cp.async       16-byte global->shared copies, zero-fill for padding/out-of-range (src-size 0)
//   pipeline       STAGES-deep ring of shared-memory stages, cp.async groups, one barrier per step
//   swizzle        XOR of the 16-byte chunk index with (row % 8): conflict-free ldmatrix and copies
//   ldmatrix       ldmatrix.x4 builds A and B fragments (four 8x8 matrices per instruction)
//   mma            mma.sync m16n8k16 row.col f32.f16.f16.f32, register-blocked per warp
//   epilogue       fp32 -> fp16x2 into shared memory, then 128-bit coalesced stores of whole rows
//
// Sizing for the headline (M = 25088, F = 128, K = 576 on 132 SMs): a 192 x 128 tile gives
// ceil(25088 / 192) = 131 CTAs, one per SM in a single wave; smaller tiles (128 x 128 -> 196 CTAs)
// would leave 64 SMs doing two tiles while the rest idle half the time. One big tile per SM also
// reads the weights once per SM (131 x 147 KB from L2), not once per small tile.
// 8 warps as 4 (M) x 2 (N), each owning 48 x 64 of the tile: 3 x 8 = 24 independent MMAs per
// 16-wide K slice keep the tensor pipe busy, and 48 x 64 spends (48 + 64) * 32 B of ldmatrix traffic
// per 48 * 64 * 16 MACs, below what shared memory can feed.

#include <cuda_fp16.h>
#include <cstdint>

// ---- tiles -------------------------------------------------------------------------------------
constexpr int BLOCK_M = 192;  // output pixels per CTA
constexpr int BLOCK_N = 128;  // filters per CTA
constexpr int BLOCK_K = 64;   // taps per pipeline stage: 64 fp16 = one 128-byte shared row
constexpr int WARPS_M = 4;
constexpr int WARPS_N = 2;
constexpr int STAGES = 4;     // shared-memory ring depth: STAGES - 1 K-steps of copies in flight
constexpr int THREADS = WARPS_M * WARPS_N * 32;
constexpr int WARP_TILE_M = BLOCK_M / WARPS_M;  // 48
constexpr int WARP_TILE_N = BLOCK_N / WARPS_N;  // 64
constexpr int MMA_M = 16;
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;
constexpr int M_FRAGS = WARP_TILE_M / MMA_M;  // 3 MMA rows per warp
constexpr int N_FRAGS = WARP_TILE_N / MMA_N;  // 8 MMA columns per warp
constexpr int K_SLICES = BLOCK_K / MMA_K;     // 4 MMA steps per stage
constexpr int VEC = 8;                        // fp16 per 16-byte copy
constexpr int CHUNKS_PER_ROW = BLOCK_K / VEC;               // 8 16-byte chunks per shared row
constexpr int ROW_BYTES = BLOCK_K * 2;                      // 128
constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;     // 32 rows copied per pass of all threads
constexpr int A_PASSES = BLOCK_M / ROWS_PER_PASS;           // 6 input-pixel rows per thread
constexpr int B_PASSES = BLOCK_N / ROWS_PER_PASS;           // 4 filter rows per thread
constexpr int A_STAGE_BYTES = BLOCK_M * ROW_BYTES;          // 24 KiB
constexpr int B_STAGE_BYTES = BLOCK_N * ROW_BYTES;          // 16 KiB
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;  // 40 KiB
constexpr int OUT_PITCH = BLOCK_N + 8;  // fp16 per epilogue row: +16 bytes shifts rows by 4 banks
constexpr int OUT_BYTES = BLOCK_M * OUT_PITCH * 2;          // 51 KiB, reuses the stage ring
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;            // 160 KiB of dynamic shared memory
constexpr int OUT_CHUNKS_PER_ROW = BLOCK_N / VEC;           // 16 16-byte output chunks per row
constexpr int INVALID_COORD = -(1 << 28);  // image coordinate of rows past M: never inside the image

static_assert(CHUNKS_PER_ROW == 8, "the swizzle permutes exactly eight 16-byte chunks per row");
static_assert(THREADS % CHUNKS_PER_ROW == 0 && BLOCK_M % ROWS_PER_PASS == 0 && BLOCK_N % ROWS_PER_PASS == 0,
              "every thread copies whole passes of A and B");
static_assert(WARP_TILE_M % MMA_M == 0 && WARP_TILE_N % (2 * MMA_N) == 0, "warp tile made of MMA tiles");
static_assert(M_FRAGS * MMA_M % 8 == 0 && WARP_TILE_N % 8 == 0, "fragment rows start on swizzle periods");
static_assert(OUT_BYTES <= SMEM_BYTES, "the epilogue tile fits in the stage ring");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");

struct ConvShape {
    int N, H, W, C, F, R, S, P, Q, stride, pad;
    int M;  // N * P * Q
    int K;  // R * S * C
};

// ---- swizzle -----------------------------------------------------------------------------------
// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows][BLOCK_K] fp16 tile. Rows are
// 128 bytes, so without the XOR the 8 rows an ldmatrix phase reads would all start in bank 0 (8-way
// conflict); XOR-ing the chunk with row % 8 puts those 8 rows' chunks in 8 different bank groups.
// The copies write whole rows, which stay conflict-free under any permutation of their chunks.
__device__ __forceinline__ uint32_t swizzle(int row, int chunk)
{
    return static_cast<uint32_t>(row * ROW_BYTES + ((chunk ^ (row & 7)) << 4));
}

// ---- cp.async ----------------------------------------------------------------------------------
// 16 bytes global -> shared without passing through registers (LDGSTS). src_bytes = 0 writes
// sixteen zero bytes and reads nothing: that is the convolution's zero padding and the guard for
// rows past M, filters past F and taps past K, with no branch around the copy. .cg caches in L2
// only: a stage is read from shared memory, so an L1 copy would only evict; the R*S re-reads of each
// input pixel (one per tap) and the weights shared by all CTAs are served from L2.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid)
{
    const int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(__cvta_generic_to_global(gmem)), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most `PENDING` of this thread's most recent groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(PENDING) : "memory");
}

// ---- gather (C % 8 != 0) ------------------------------------------------------------------------
// A 16-byte shared store of four packed words: the gather path's counterpart of one cp.async.
__device__ __forceinline__ void st_shared_16(uint32_t smem_addr, const uint32_t (&v)[4])
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(smem_addr), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
}

// Put fp16 value h in half e % 2 of word e / 2 (little-endian: element e sits at byte 2e).
__device__ __forceinline__ void pack_half(uint32_t (&v)[4], int e, __half h)
{
    const uint32_t bits = __half_as_ushort(h);
    v[e >> 1] |= (e & 1) ? (bits << 16) : bits;
}

// ---- im2col loader -----------------------------------------------------------------------------
// Thread t always copies chunk column t % 8 (the same 8 taps k0..k0+7 of a K-step) of rows
// t / 8 + 32 * i. The pixel geometry of those rows is fixed for the whole K loop, so it is computed
// once: for each row the input coordinates of its (r, s) = (0, 0) tap and that pixel's offset.
struct ALoader {
    int ih0[A_PASSES];   // p * stride - pad (INVALID_COORD for rows past M)
    int iw0[A_PASSES];   // q * stride - pad
    int base[A_PASSES];  // element offset of pixel (n, ih0, iw0) in x; may lie outside x, never read so
};

__device__ __forceinline__ void init_a_loader(ALoader& ld, const ConvShape& sh, int block_m0, int row0)
{
    const int pq = sh.P * sh.Q;
#pragma unroll
    for (int i = 0; i < A_PASSES; ++i) {
        const int m = block_m0 + row0 + i * ROWS_PER_PASS;
        if (m < sh.M) {
            const int n = m / pq;
            const int rem = m - n * pq;
            const int p = rem / sh.Q;
            const int q = rem - p * sh.Q;
            ld.ih0[i] = p * sh.stride - sh.pad;
            ld.iw0[i] = q * sh.stride - sh.pad;
            ld.base[i] = ((n * sh.H + ld.ih0[i]) * sh.W + ld.iw0[i]) * sh.C;
        } else {
            ld.ih0[i] = INVALID_COORD;
            ld.iw0[i] = INVALID_COORD;
            ld.base[i] = 0;
        }
    }
}

// The tap of a GEMM column k = (r*S + s)*C + c. With C % 8 == 0, k..k+7 share r and s: one tap per
// 16-byte copy; otherwise the gather steps the tap one channel at a time (next_channel). A thread's column advances by BLOCK_K every K-step; instead of dividing by C and S
// each step, the tap is carried like a mixed-radix counter: BLOCK_K = (dr*S + ds)*C + dc once, then
// each step adds (dr, ds, dc) with at most one carry per digit (dc < C, ds < S).
struct Tap {
    int k, r, s, c;
};

struct TapStep {
    int dr, ds, dc;
};

__device__ __forceinline__ Tap first_tap(const ConvShape& sh, int k)
{
    Tap t;
    t.k = k;
    const int rs = k / sh.C;
    t.c = k - rs * sh.C;
    t.r = rs / sh.S;
    t.s = rs - t.r * sh.S;
    return t;
}

__device__ __forceinline__ TapStep tap_step(const ConvShape& sh)
{
    const int rs = BLOCK_K / sh.C;
    return TapStep{rs / sh.S, rs % sh.S, BLOCK_K % sh.C};
}

__device__ __forceinline__ void advance_tap(Tap& t, const TapStep& d, const ConvShape& sh)
{
    t.k += BLOCK_K;
    t.c += d.dc;
    t.s += d.ds;
    t.r += d.dr;
    if (t.c >= sh.C) { t.c -= sh.C; t.s += 1; }  // selects, not branches
    if (t.s >= sh.S) { t.s -= sh.S; t.r += 1; }
}

// The tap of column k + 1.
__device__ __forceinline__ void next_channel(Tap& t, const ConvShape& sh)
{
    t.k += 1;
    t.c += 1;
    if (t.c == sh.C) { t.c = 0; t.s += 1; }
    if (t.s == sh.S) { t.s = 0; t.r += 1; }
}

// Copy one K-step (BLOCK_K taps) of A and B into a stage. Taps past K (r >= R) zero-fill.
__device__ __forceinline__ void load_stage(uint32_t a_smem, uint32_t b_smem, const __half* __restrict__ x,
                                           const __half* __restrict__ w, const ConvShape& sh, const ALoader& ld,
                                           const Tap& tap, int block_n0, int row0, int chunk)
{
    const bool k_inside = tap.r < sh.R;
    const int tap_offset = (tap.r * sh.W + tap.s) * sh.C + tap.c;  // relative to a row's (0, 0) tap
    // A: the im2col gather, 16 bytes of one input pixel per copy; outside the image -> zeros.
#pragma unroll
    for (int i = 0; i < A_PASSES; ++i) {
        const int ih = ld.ih0[i] + tap.r;
        const int iw = ld.iw0[i] + tap.s;
        const bool inside = k_inside && static_cast<unsigned>(ih) < static_cast<unsigned>(sh.H) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(sh.W);
        const __half* src = inside ? x + (ld.base[i] + tap_offset) : x;  // a safe address when not read
        cp_async_16(a_smem + swizzle(row0 + i * ROWS_PER_PASS, chunk), src, inside);
    }
    // B: filters are rows of the [F][K] weight matrix, already K-contiguous: a plain 2-D tile copy.
#pragma unroll
    for (int j = 0; j < B_PASSES; ++j) {
        const int f = block_n0 + row0 + j * ROWS_PER_PASS;
        const bool inside = k_inside && f < sh.F;
        const __half* src = inside ? w + (static_cast<size_t>(f) * sh.K + tap.k) : w;
        cp_async_16(b_smem + swizzle(row0 + j * ROWS_PER_PASS, chunk), src, inside);
    }
}

// Fill one K-step of A and B without alignment: each thread still owns chunk `chunk` (8 columns) of
// the same rows as in load_stage, but reads its 8 values one by one, each with its own tap. One row
// at a time (the 8-tap walk is redone per row: a few integer ops) keeps few registers live.
__device__ __forceinline__ void gather_stage(uint32_t a_smem, uint32_t b_smem, const __half* __restrict__ x,
                                             const __half* __restrict__ w, const ConvShape& sh, const ALoader& ld,
                                             const Tap& tap, int block_n0, int row0, int chunk)
{
#pragma unroll
    for (int i = 0; i < A_PASSES; ++i) {  // unrolled: the per-row arrays of ld stay in registers
        uint32_t v[4] = {};
        Tap t = tap;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int ih = ld.ih0[i] + t.r;
            const int iw = ld.iw0[i] + t.s;
            const bool inside = t.r < sh.R && static_cast<unsigned>(ih) < static_cast<unsigned>(sh.H) &&
                                static_cast<unsigned>(iw) < static_cast<unsigned>(sh.W);
            if (inside) pack_half(v, e, __ldg(x + (ld.base[i] + (t.r * sh.W + t.s) * sh.C + t.c)));
            next_channel(t, sh);
        }
        st_shared_16(a_smem + swizzle(row0 + i * ROWS_PER_PASS, chunk), v);
    }
#pragma unroll 1
    for (int j = 0; j < B_PASSES; ++j) {
        const int f = block_n0 + row0 + j * ROWS_PER_PASS;
        uint32_t v[4] = {};
        if (f < sh.F) {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                if (tap.k + e < sh.K) pack_half(v, e, __ldg(w + (static_cast<size_t>(f) * sh.K + tap.k + e)));
            }
        }
        st_shared_16(b_smem + swizzle(row0 + j * ROWS_PER_PASS, chunk), v);
    }
}

// One K-step into a stage, by 16-byte cp.async copies (ALIGNED: C % 8 == 0) or by the gather.
template <bool ALIGNED>
__device__ __forceinline__ void fill_stage(uint32_t a_smem, uint32_t b_smem, const __half* __restrict__ x,
                                           const __half* __restrict__ w, const ConvShape& sh, const ALoader& ld,
                                           const Tap& tap, int block_n0, int row0, int chunk)
{
    if constexpr (ALIGNED)
        load_stage(a_smem, b_smem, x, w, sh, ld, tap, block_n0, row0, chunk);
    else
        gather_stage(a_smem, b_smem, x, w, sh, ld, tap, block_n0, row0, chunk);
}

// ---- ldmatrix ----------------------------------------------------------------------------------
// Four 8x8 fp16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// every lane receives its two elements of matrix i (row lane / 4, columns 2 * (lane % 4) + {0, 1}),
// which is exactly the mma.sync operand layout.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

// A fragment of rows row0..row0+15, taps 16*slice..+15: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15)
// in the order a0..a3 of m16n8k16: lane l addresses row l % 16, chunk 2*slice + l / 16.
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], uint32_t a_smem, int row0, int slice, int lane)
{
    ldmatrix_x4(a, a_smem + swizzle(row0 + (lane & 15), 2 * slice + (lane >> 4)));
}

// B fragments of two adjacent 8-filter columns: B is stored [filter][k] (k contiguous), i.e. the
// "col" operand, so a non-transposed ldmatrix of filter rows yields b0/b1 directly. Matrices
// (filters 0-7, k 0-7), (0-7, k 8-15), (8-15, k 0-7), (8-15, k 8-15) -> b[0..1] of column pair 0,
// b[2..3] of column pair 1. Lane l addresses filter (l % 8) + 8 * (l / 16), chunk 2*slice + (l / 8) % 2.
__device__ __forceinline__ void load_b_fragments(uint32_t (&b)[4], uint32_t b_smem, int col0, int slice, int lane)
{
    ldmatrix_x4(b, b_smem + swizzle(col0 + (lane & 7) + ((lane >> 4) << 3), 2 * slice + ((lane >> 3) & 1)));
}

// ---- mma ---------------------------------------------------------------------------------------
// D (16x8 fp32) += A (16x16 fp16, row-major) * B (16x8 fp16, column-major). fp32 accumulation keeps
// the 576-term sums within one fp16 rounding of the exact result.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One K_SLICE (16 taps) of a stage: M_FRAGS x N_FRAGS MMAs on the warp's 48 x 64 register block,
// 24 independent accumulators, each A fragment reused 8 times and each B fragment 3 times.
__device__ __forceinline__ void compute_slice(float (&acc)[M_FRAGS][N_FRAGS][4], uint32_t a_smem, uint32_t b_smem,
                                              int slice, int warp_row0, int warp_col0, int lane)
{
    uint32_t a[M_FRAGS][4];
    uint32_t b[N_FRAGS / 2][4];
#pragma unroll
    for (int i = 0; i < M_FRAGS; ++i) load_a_fragment(a[i], a_smem, warp_row0 + i * MMA_M, slice, lane);
#pragma unroll
    for (int j = 0; j < N_FRAGS / 2; ++j) load_b_fragments(b[j], b_smem, warp_col0 + j * 2 * MMA_N, slice, lane);
#pragma unroll
    for (int i = 0; i < M_FRAGS; ++i) {
#pragma unroll
        for (int j = 0; j < N_FRAGS; ++j) mma_16816(acc[i][j], a[i], b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]);
    }
}

// ---- epilogue ----------------------------------------------------------------------------------
// Accumulator (i, j) of lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 2t, 2t+1.
// Those pairs go to shared memory as fp16x2 (32-bit stores; the padded pitch puts the 8 rows of a
// store 4 banks apart, conflict-free), then the tile leaves as 16-byte chunks of whole output rows:
// consecutive threads write consecutive 16 bytes of y, fully coalesced, each row written once.
__device__ __forceinline__ void stage_accumulators(__half* out_s, const float (&acc)[M_FRAGS][N_FRAGS][4],
                                                   int warp_row0, int warp_col0, int lane)
{
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < M_FRAGS; ++i) {
#pragma unroll
        for (int j = 0; j < N_FRAGS; ++j) {
            const int row = warp_row0 + i * MMA_M + g;
            const int col = warp_col0 + j * MMA_N + 2 * t;
            *reinterpret_cast<__half2*>(out_s + row * OUT_PITCH + col) = __floats2half2_rn(acc[i][j][0], acc[i][j][1]);
            *reinterpret_cast<__half2*>(out_s + (row + 8) * OUT_PITCH + col) =
                __floats2half2_rn(acc[i][j][2], acc[i][j][3]);
        }
    }
}

__device__ __forceinline__ void store_tile(__half* __restrict__ y, const __half* out_s, const ConvShape& sh,
                                           int block_m0, int block_n0)
{
    const bool vector_rows = (sh.F % VEC) == 0;  // every output row starts 16-byte aligned
    for (int idx = threadIdx.x; idx < BLOCK_M * OUT_CHUNKS_PER_ROW; idx += THREADS) {
        const int row = idx / OUT_CHUNKS_PER_ROW;
        const int chunk = idx % OUT_CHUNKS_PER_ROW;
        const int m = block_m0 + row;
        const int f0 = block_n0 + chunk * VEC;
        if (m >= sh.M || f0 >= sh.F) continue;
        const __half* src = out_s + row * OUT_PITCH + chunk * VEC;
        __half* dst = y + static_cast<size_t>(m) * sh.F + f0;
        if (vector_rows) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
            for (int e = 0; e < VEC && f0 + e < sh.F; ++e) dst[e] = src[e];
        }
    }
}

// ---- kernel: pipeline --------------------------------------------------------------------------
template <bool ALIGNED>
__device__ __forceinline__ void conv_tile(const __half* __restrict__ x, const __half* __restrict__ w,
                                          __half* __restrict__ y, const ConvShape& sh, unsigned char* smem)
{
    const int block_m0 = blockIdx.x * BLOCK_M;
    const int block_n0 = blockIdx.y * BLOCK_N;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int warp_row0 = (warp % WARPS_M) * WARP_TILE_M;
    const int warp_col0 = (warp / WARPS_M) * WARP_TILE_N;
    const int copy_chunk = tid % CHUNKS_PER_ROW;
    const int copy_row0 = tid / CHUNKS_PER_ROW;

    const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    auto a_stage = [&](int s) { return smem_base + s * STAGE_BYTES; };
    auto b_stage = [&](int s) { return smem_base + s * STAGE_BYTES + A_STAGE_BYTES; };

    ALoader ld;
    init_a_loader(ld, sh, block_m0, copy_row0);

    float acc[M_FRAGS][N_FRAGS][4];
#pragma unroll
    for (int i = 0; i < M_FRAGS; ++i)
#pragma unroll
        for (int j = 0; j < N_FRAGS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int k_steps = (sh.K + BLOCK_K - 1) / BLOCK_K;
    const TapStep step = tap_step(sh);
    Tap tap = first_tap(sh, copy_chunk * VEC);  // the next K-step this thread copies

    // Prologue: put STAGES - 1 K-steps in flight, one cp.async group each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        fill_stage<ALIGNED>(a_stage(s), b_stage(s), x, w, sh, ld, tap, block_n0, copy_row0, copy_chunk);
        cp_async_commit();
        advance_tap(tap, step, sh);
    }

    // Main loop: wait for step kt's group, barrier (its data is visible to all warps, and every warp
    // has finished step kt - 1, whose stage is refilled now), compute kt while step kt + STAGES - 1
    // is issued. The copies go out after the first slice's MMAs, so their address arithmetic issues
    // while the tensor cores work. Steps past the end are issued too: their taps lie past K, so they
    // only zero-fill a stage that is never read again. No branch: the loop body is one basic block,
    // and every thread commits the same number of groups.
    for (int kt = 0; kt < k_steps; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int s = kt % STAGES;
        const int refill = (kt + STAGES - 1) % STAGES;
        compute_slice(acc, a_stage(s), b_stage(s), 0, warp_row0, warp_col0, lane);
        fill_stage<ALIGNED>(a_stage(refill), b_stage(refill), x, w, sh, ld, tap, block_n0, copy_row0, copy_chunk);
        cp_async_commit();
        advance_tap(tap, step, sh);
#pragma unroll
        for (int slice = 1; slice < K_SLICES; ++slice)
            compute_slice(acc, a_stage(s), b_stage(s), slice, warp_row0, warp_col0, lane);
    }

    // Epilogue: drain the trailing zero-fill copies (they target the ring the output tile reuses), let
    // every warp finish reading the ring, then stage the tile in it.
    cp_async_wait<0>();
    __syncthreads();
    __half* out_s = reinterpret_cast<__half*>(smem);
    stage_accumulators(out_s, acc, warp_row0, warp_col0, lane);
    __syncthreads();
    store_tile(y, out_s, sh, block_m0, block_n0);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
conv2d_implicit_gemm_any(const __half* __restrict__ x, const __half* __restrict__ w, __half* __restrict__ y,
                         int N, int H, int W, int C, int F, int R, int S, int P, int Q, int stride, int pad)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const ConvShape sh{N, H, W, C, F, R, S, P, Q, stride, pad, N * P * Q, R * S * C};
    // 16-byte copies need every pixel row (C fp16) and filter row (R*S*C fp16) 16-byte aligned; the
    // buffers themselves are 256-byte aligned. Uniform over the grid.
    if (C % VEC == 0)
        conv_tile<true>(x, w, y, sh, smem);
    else
        conv_tile<false>(x, w, y, sh, smem);
}
