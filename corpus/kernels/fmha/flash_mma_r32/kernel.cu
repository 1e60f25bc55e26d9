// Attention forward, o = softmax(q k^T / sqrt(D)) v in fp16, as a flash-attention kernel on
// Ampere-style tensor cores (mma.sync), for D = HEAD_DIM = 128 and any sequence length S, with
// 32 query rows (two m16 tiles) per warp.
//
// Why 32 rows per warp. With one m16 tile per warp (fmha/flash_mma), each K or V fragment that a
// warp loads with ldmatrix feeds exactly one MMA, and every warp loads the whole K and V tile:
// per 128 query rows and 64-key tile, 8 warps issue 512 ldmatrix.x4 (256 KiB of shared-memory
// reads) for 1024 MMAs. Here a warp owns WARP_M_TILES (2) m16 tiles, so each K and V fragment
// feeds two MMAs; 4 warps cover the same 128 rows with 256 ldmatrix.x4 of K and V plus 64 of Q,
// 320 in all (160 KiB), for the same 1024 MMAs. The price is registers: the output accumulators
// double to 128 per thread, so Q cannot stay in registers as well (another 64); it stays in shared
// memory and its A fragments are re-read every key tile, one k-step at a time (FlashAttention-2's
// d = 128 forward configuration on sm80 does the same: 4 warps for 128 rows, Q from shared memory).
//
// One CTA per (BLOCK_M query rows, batch * head). The S x S score matrix never leaves the chip:
// the CTA walks the key sequence in tiles of BLOCK_N keys, and for each tile computes the scores
// of its query rows, folds them into an online softmax (running row max m and row sum l) and
// accumulates P v into fp32 output registers, rescaled whenever the running max grows.
//
// Mechanisms, each in its own helper below:
//   1. Tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for S = Q K^T and for
//      O += P V (mma_f16_16816); every B fragment (K or V) serves all WARP_M_TILES m16 tiles of the
//      warp before the next one is loaded.
//   2. Q in shared memory: the CTA's BLOCK_M x HEAD_DIM Q tile is copied once (its own cp.async
//      group) and stays for the whole key loop; each k-step of Q K^T ldmatrix.x4-loads the A
//      fragments of the warp's m16 tiles (load_q_fragments) just before they are used.
//   3. ldmatrix fragment loads of K (non-transposed: K rows are the "col" B operand of Q K^T,
//      load_k_fragments) and of V (ldmatrix.trans: V is stored key-major, the B operand of P V
//      must be the transpose, load_v_fragments). Every fragment address is a per-lane base moved
//      by an immediate (another m16 tile or 16-key block) and one XOR (another k-step or d pair),
//      so no table of addresses is held through the key loop (fragment_address).
//   4. cp.async pipeline: STAGES shared-memory buffers, each holding one K tile and one V tile,
//      filled by 16-byte cp.async.cg with one commit group per key tile (cp_async_16,
//      cp_async_commit, cp_async_wait, load_tile_async for Q, load_kv_tile_async for K and V).
//      Rows past S are zero-filled through the src-size operand; a tile wholly below S takes a
//      path without bounds checks.
//   5. XOR-swizzled shared layout (swizzle_offset): a tile row is HEAD_DIM fp16 = 256 bytes = 16
//      chunks of 16 bytes, and chunk c of row r is stored at chunk c ^ (r % 8). The 8 rows of
//      every ldmatrix phase and the 8 chunks of every cp.async phase then fall in 8 different
//      16-byte bank groups, without padding.
//   6. Online softmax in registers (online_softmax_update): the scale is folded into log2(e), so
//      every exponential is one FFMA and one exp2f (fast_exp2); row maxima are reduced over
//      the quad of lanes that share a row with two shuffles (quad_max); the per-thread partial
//      row sums are reduced once, at the end (quad_sum); O is rescaled by exp2(m_old - m_new).
//      A lane holds 2 rows of each m16 tile, 2 * WARP_M_TILES rows in all.
//   7. P stays in registers (pack_p_fragment): the accumulator layout of two adjacent n8 score
//      tiles is, element for element, the A-operand layout of one k16 step of P V, so P is only
//      rounded to fp16 and packed in pairs, never written to shared memory.
//   8. Masking (mask_scores): keys past S (ragged) and keys after the query row (causal) get
//      -inf scores, so their probabilities are exactly 0; per row of a lane both are one bound on
//      the key's column in the tile (mask_bound). Whether a tile needs the mask is decided per warp
//      (a warp-uniform branch on the warp's own 32 rows), and a warp whose rows all come before
//      every key of a tile (causal) skips that tile's work; key tiles wholly after a causal query
//      tile are never visited by the CTA (causal tile skipping), and query tiles run heaviest
//      first (reversed block order).
//   9. Epilogue (store_output): O is divided by l, rounded to fp16, staged in the warp's own rows
//      of the (no longer needed) Q tile, and written back with 16-byte coalesced stores.
//
// Registers. 128 O accumulators, 64 score accumulators, 4 row maxima, 4 row sums and a k-step of Q
// and K fragments per thread leave about 30 of the 255 registers for addresses, loop state and
// latency hiding. ptxas -O3 then packs the loop too tightly and spills a few bytes (or, short of
// spilling, shuffles the accumulators between registers with ~100 moves per key tile); at ptxas
// -O1 (-Xptxas=-O1 in launch.toml) it allocates about 246 registers with no spill and no moves,
// and still issues each k-step's ldmatrix ahead of the MMAs that use them.
//
// Domain: D == HEAD_DIM (the cases all have D = 128). Every row of q, k, v and o is 256 bytes, so
// every 16-byte chunk is aligned (buffers are 256-byte aligned); S is arbitrary.

#include <cuda_fp16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, pipeline and vector constants
// ---------------------------------------------------------------------------------------------
constexpr int HEAD_DIM = 128;                        // D
constexpr int BLOCK_M = 128;                         // query rows per CTA
constexpr int BLOCK_N = 64;                          // keys per pipeline tile
constexpr int WARPS = 4;                             // each warp owns WARP_ROWS query rows
constexpr int STAGES = 2;                            // K/V tiles in flight (cp.async ring)
constexpr int WARP_SIZE = 32;
constexpr int THREADS = WARPS * WARP_SIZE;           // 128
constexpr int MMA_M = 16;                            // mma.m16n8k16
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;
constexpr int WARP_ROWS = BLOCK_M / WARPS;           // 32 query rows per warp
constexpr int WARP_M_TILES = WARP_ROWS / MMA_M;      // 2 m16 tiles per warp
constexpr int D_STEPS = HEAD_DIM / MMA_K;            // 8 k-steps of Q K^T
constexpr int S_TILES = BLOCK_N / MMA_N;             // 8 n8 tiles of scores per m16 tile and key tile
constexpr int PV_STEPS = BLOCK_N / MMA_K;            // 4 k-steps of P V per key tile
constexpr int O_TILES = HEAD_DIM / MMA_N;            // 16 n8 tiles of output per m16 tile
constexpr int VEC = 8;                               // fp16 per 16-byte chunk (one cp.async)
constexpr int CHUNK_BYTES = 16;
constexpr int CHUNKS_PER_ROW = HEAD_DIM / VEC;       // 16 chunks in a 256-byte row
constexpr int ROW_BYTES = HEAD_DIM * 2;              // 256
constexpr int SWIZZLE_ROWS = 8;                      // the XOR pattern repeats every 8 rows
constexpr int LOAD_ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;  // 8 rows per pass of the CTA
constexpr int Q_LOADS = BLOCK_M / LOAD_ROWS_PER_PASS;         // 16 cp.async per thread for Q
constexpr int KV_LOADS = BLOCK_N / LOAD_ROWS_PER_PASS;        // 8 cp.async per thread per K or V tile
constexpr int Q_TILE_BYTES = BLOCK_M * ROW_BYTES;    // 32 KiB
constexpr int KV_TILE_BYTES = BLOCK_N * ROW_BYTES;   // 16 KiB
constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;       // a K tile, then a V tile
constexpr int SMEM_BYTES = Q_TILE_BYTES + STAGES * STAGE_BYTES;  // 96 KiB: two CTAs fit an SM
constexpr int OUT_PASSES = WARP_ROWS * CHUNKS_PER_ROW / WARP_SIZE;  // 16 16-byte stores per lane
constexpr int ACC_ROW_HALF = 8;                      // accumulators c2, c3 sit 8 rows below c0, c1
constexpr float LOG2E = 1.4426950408889634f;
constexpr float INV_SQRT_HEAD_DIM = 0.08838834764831845f;  // 1 / sqrt(128)
constexpr float SCALE_LOG2 = LOG2E * INV_SQRT_HEAD_DIM;     // the softmax scale in base 2: an FFMA immediate

static_assert(HEAD_DIM == 128, "INV_SQRT_HEAD_DIM is 1 / sqrt(128)");
static_assert(WARP_ROWS % MMA_M == 0, "a warp owns whole m16 tiles of query rows");
static_assert(WARP_M_TILES >= 1 && WARP_M_TILES <= 2,
              "O takes 64 fp32 registers per m16 tile: more than two tiles per warp cannot fit 255 registers");
static_assert(THREADS % CHUNKS_PER_ROW == 0 && BLOCK_M % LOAD_ROWS_PER_PASS == 0 &&
              BLOCK_N % LOAD_ROWS_PER_PASS == 0, "the loaders cover whole tiles");
static_assert(LOAD_ROWS_PER_PASS % SWIZZLE_ROWS == 0, "a loader pass keeps each thread's swizzle phase");
static_assert(CHUNKS_PER_ROW % SWIZZLE_ROWS == 0, "the XOR keeps a chunk inside its row");
static_assert(S_TILES == 2 * PV_STEPS, "two n8 score tiles make one k16 step of P V");
static_assert(O_TILES % 2 == 0 && S_TILES % 2 == 0, "B fragments load two n8 tiles per ldmatrix.x4");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 227 * 1024, "the Q tile and the K/V ring fit in one CTA's shared memory");

// ---------------------------------------------------------------------------------------------
// Mechanism 5: XOR swizzle. Byte offset of 16-byte chunk `chunk` (0..15) of row `row` in a
// [rows][HEAD_DIM] fp16 tile (Q, K, V and the output staging all use it).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t swizzle_offset(int row, int chunk)
{
    return static_cast<uint32_t>(row * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) * CHUNK_BYTES));
}

// ---------------------------------------------------------------------------------------------
// Mechanism 4: cp.async primitives. 16 bytes global -> shared, bypassing L1 (.cg); src_bytes 0
// reads nothing and writes 16 zero bytes.
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
// Mechanism 4: one tile of PASSES * LOAD_ROWS_PER_PASS rows (Q, K or V) global -> shared.
// Thread t copies chunk t % 16 of rows t / 16 + LOAD_ROWS_PER_PASS i: 16 consecutive threads read
// one 256-byte row (coalesced), and the 8 chunks of every 8-lane phase land in 8 different bank
// groups. Rows at or past S are zero-filled: their scores are masked, and zero values keep 0 * v
// finite.
// ---------------------------------------------------------------------------------------------
template <int PASSES>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const __half* head, int row0, int S, int tid)
{
    const int row = tid / CHUNKS_PER_ROW;
    const int chunk = tid % CHUNKS_PER_ROW;
    const uint32_t offset = swizzle_offset(row, chunk);
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
        const int r = row0 + row + i * LOAD_ROWS_PER_PASS;
        const bool ok = r < S;
        const __half* src = ok ? head + static_cast<long long>(r) * HEAD_DIM + chunk * VEC : head;
        // Rows LOAD_ROWS_PER_PASS apart share a swizzle phase: pass i is pass 0 moved down.
        cp_async_16(smem_tile + offset + static_cast<uint32_t>(i * LOAD_ROWS_PER_PASS * ROW_BYTES), src,
                    ok ? CHUNK_BYTES : 0);
    }
}

// Mechanism 4: the K and V tiles of one key tile into one stage ([K tile][V tile]), thread t
// copying what load_tile_async would: chunk t % 16 of rows t / 16 + LOAD_ROWS_PER_PASS i of both.
// `dst` is the stage's address plus the thread's swizzled offset (swizzle_offset(t / 16, t % 16)),
// `first` the element offset of the thread's first chunk in k and v (head, row and chunk), and
// `rows_left` how many rows exist from the thread's first on (S - row0 - t / 16). When the
// thread's last row exists (all of them do, in every tile but the last), no row is checked.
__device__ __forceinline__ void load_kv_tile_async(uint32_t dst, const __half* k, const __half* v, long long first,
                                                   int rows_left)
{
    if ((KV_LOADS - 1) * LOAD_ROWS_PER_PASS < rows_left) {
#pragma unroll
        for (int i = 0; i < KV_LOADS; ++i) {
            const long long at = first + i * LOAD_ROWS_PER_PASS * HEAD_DIM;
            const uint32_t to = dst + static_cast<uint32_t>(i * LOAD_ROWS_PER_PASS * ROW_BYTES);
            cp_async_16(to, k + at, CHUNK_BYTES);
            cp_async_16(to + KV_TILE_BYTES, v + at, CHUNK_BYTES);
        }
    } else {
#pragma unroll
        for (int i = 0; i < KV_LOADS; ++i) {
            const bool ok = i * LOAD_ROWS_PER_PASS < rows_left;
            const long long at = ok ? first + i * LOAD_ROWS_PER_PASS * HEAD_DIM : 0;  // 0: any valid address
            const uint32_t to = dst + static_cast<uint32_t>(i * LOAD_ROWS_PER_PASS * ROW_BYTES);
            cp_async_16(to, k + at, ok ? CHUNK_BYTES : 0);
            cp_async_16(to + KV_TILE_BYTES, v + at, ok ? CHUNK_BYTES : 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 3: ldmatrix. Four 8x8 b16 matrices; lanes 8j..8j+7 give the row addresses of matrix
// j. Plain: register j of lane l receives row l / 4, columns 2 (l % 4), 2 (l % 4) + 1 of matrix j.
// .trans: register j of lane l receives rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr));
}

// Per-lane ldmatrix addresses. Rows of every 8-lane phase start at a multiple of 8, so the swizzle
// phase of a lane's row is lane % 8, whatever m16 tile, key block or k-step it reads.
//
// Every fragment address is a per-lane base, fixed for the whole kernel, moved in two ways that
// cost no index arithmetic (fragment_address):
//   - a whole block of 16 rows further down (m16 tile mt, key block np or j): + 16 ROW_BYTES, the
//     same swizzle phase (an immediate offset of the ldmatrix);
//   - chunk 2 x + h instead of chunk h (h = 0, 1: the lane's half of a k16 step or d pair): the
//     chunk bits of the swizzled offset are (2 x + h) ^ (row % 8) = 2 x ^ (h ^ (row % 8)), so the
//     offset is swizzle_offset(row, h) ^ (x * PAIR_BYTES) (one LOP3).
// The XOR is applied to the shared-memory address, tile base included: the bases are multiples of
// TILE_ALIGN (256) bytes, whose low 8 bits hold the in-row offset, so the XOR leaves them intact.
// A base that changes every key tile (the K and V stages) cannot be hoisted out of the key loop as
// a table of precomputed addresses (which, at 32 rows per warp, would not fit in registers).
constexpr int PAIR_BYTES = 2 * CHUNK_BYTES;          // two 16-byte chunks: one k16 step of a row
constexpr int ROW_BLOCK_BYTES = MMA_M * ROW_BYTES;   // 16 rows: one m16 tile or one key block
constexpr int TILE_ALIGN = 256;                      // a row: the XOR acts below it
static_assert(Q_TILE_BYTES % TILE_ALIGN == 0 && KV_TILE_BYTES % TILE_ALIGN == 0 && ROW_BYTES == TILE_ALIGN,
              "every tile starts at a multiple of TILE_ALIGN bytes of the 1024-aligned dynamic shared memory");

__device__ __forceinline__ uint32_t fragment_address(uint32_t lane_address, int pair, int block)
{
    return (lane_address ^ static_cast<uint32_t>(pair * PAIR_BYTES)) + static_cast<uint32_t>(block * ROW_BLOCK_BYTES);
}

// Q (A operand of m16 tile mt, 16 rows x k16): lane l points at row 16 mt + l % 16 of the warp's
// rows, half l / 16 of k-step ks; matrices 0..3 are (rows 0-7, k 0-7), (rows 8-15, k 0-7),
// (rows 0-7, k 8-15), (rows 8-15, k 8-15): registers a0..a3 of the mma A fragment.
// Address: fragment_address(q_tile + q_lane_offset(warp, lane), ks, mt).
__device__ __forceinline__ uint32_t q_lane_offset(int warp, int lane)
{
    return swizzle_offset(warp * WARP_ROWS + lane % 16, lane / 16);
}

// K (B operand of Q K^T, keys as n): lane l points at key 16 np + l % 8 + 8 (l / 16), half
// (l / 8) % 2 of k-step ks; matrices 0..3 are (keys 0-7, d 0-7), (keys 0-7, d 8-15),
// (keys 8-15, d 0-7), (keys 8-15, d 8-15): b0, b1 of n8 tile 2 np, then of tile 2 np + 1.
// Address: fragment_address(k_tile + k_lane_offset(lane), ks, np).
__device__ __forceinline__ uint32_t k_lane_offset(int lane)
{
    return swizzle_offset(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
}

// V (B operand of P V, keys as k, d as n), read transposed: lane l points at key
// 16 j + l % 8 + 8 ((l / 8) % 2), d chunk 2 dp + l / 16; matrices 0..3 are (keys 0-7, d 0-7),
// (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15), which .trans turns into b0, b1 of
// d tile 2 dp, then of d tile 2 dp + 1.
// Address: fragment_address(v_tile + v_lane_offset(lane), dp, j).
__device__ __forceinline__ uint32_t v_lane_offset(int lane)
{
    return swizzle_offset(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
}

// Mechanism 2: the A fragments of k-step ks for each of the warp's m16 tiles, from the Q tile
// (q_lane = the Q tile's address + q_lane_offset).
__device__ __forceinline__ void load_q_fragments(uint32_t (&qf)[WARP_M_TILES][4], uint32_t q_lane, int ks)
{
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt) ldmatrix_x4(qf[mt], fragment_address(q_lane, ks, mt));
}

// K fragments of k-step ks for n8 score tiles 2 np and 2 np + 1 (k_lane = K tile + k_lane_offset).
__device__ __forceinline__ void load_k_fragments(uint32_t (&kf)[4], uint32_t k_lane, int ks, int np)
{
    ldmatrix_x4(kf, fragment_address(k_lane, ks, np));
}

// V fragments of P V k-step j for output d tiles 2 dp and 2 dp + 1 (v_lane = V tile + v_lane_offset).
__device__ __forceinline__ void load_v_fragments(uint32_t (&vf)[4], uint32_t v_lane, int j, int dp)
{
    ldmatrix_x4_trans(vf, fragment_address(v_lane, dp, j));
}

// ---------------------------------------------------------------------------------------------
// Mechanism 1: one tensor-core MMA, D (16x8 fp32) += A (16x16 fp16, row) * B (16x8 fp16, col).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// S = Q K^T for one key tile: D_STEPS x S_TILES x WARP_M_TILES MMAs. Per k-step, the Q fragments
// of the warp's m16 tiles, then each K fragment pair, used by every m16 tile.
__device__ __forceinline__ void compute_scores(float (&s)[WARP_M_TILES][S_TILES][4], uint32_t q_lane,
                                               uint32_t k_lane)
{
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D_STEPS; ++ks) {
        uint32_t qf[WARP_M_TILES][4];
        load_q_fragments(qf, q_lane, ks);
#pragma unroll
        for (int np = 0; np < S_TILES / 2; ++np) {
            uint32_t kf[4];
            load_k_fragments(kf, k_lane, ks, np);
#pragma unroll
            for (int mt = 0; mt < WARP_M_TILES; ++mt) {
                mma_f16_16816(s[mt][2 * np], qf[mt], kf[0], kf[1]);
                mma_f16_16816(s[mt][2 * np + 1], qf[mt], kf[2], kf[3]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 8: masking. Accumulator c_i of lane l in n8 tile nt of m16 tile mt holds row
// row_top + 16 mt + 8 (i / 2) and key key0 + col, col = 8 nt + 2 (l % 4) + i % 2 (its column in
// the key tile); row_top is the query row of the lane's c0 in m16 tile 0. A key is masked when it
// is past S (col >= S - key0) or, causal, after the row (col > row - key0). For each of the
// lane's rows both are one bound, col < col_end, and 2 (l % 4) moves to that side of the compare,
// so every element is one compare of a compile-time 8 nt + i % 2 with the row's bound.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int mask_bound(int key0, int row, int S, bool causal, int lane)
{
    const int col_end = causal ? min(S - key0, row - key0 + 1) : S - key0;
    return col_end - 2 * (lane % 4);
}

__device__ __forceinline__ void mask_scores(float (&s)[WARP_M_TILES][S_TILES][4], int key0, int row_top, int S,
                                            bool causal, int lane)
{
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int bound = mask_bound(key0, row_top + mt * MMA_M + h * ACC_ROW_HALF, S, causal, lane);
#pragma unroll
            for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (nt * MMA_N + e >= bound) s[mt][nt][2 * h + e] = -INFINITY;
        }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 6: online softmax.
// ---------------------------------------------------------------------------------------------
// 2^x through exp2f, CUDA's precise function (2 ulp, 2^-inf = +0), never an approximate intrinsic.
// The plan builds with --ftz=true, under which exp2f is a single MUFU.EX2 (without it, a range
// fix-up for subnormal results adds a compare and two multiplies per call). Flushing costs nothing
// here: a probability below 2^-126 rounds to 0 in fp16 P anyway (the smallest fp16 is 2^-24), adds
// nothing visible to a row sum >= 1, and an alpha that small multiplies contributions that the new
// maximum outweighs by 2^126. So each probability is one FFMA and one MUFU.EX2.
__device__ __forceinline__ float fast_exp2(float x)
{
    return exp2f(x);
}

// Max / sum over the 4 lanes of a quad (lanes 4g .. 4g+3 hold the same two rows of an m16 tile).
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Fold one tile of raw scores (q.k, unscaled) into the running state of the lane's rows: for m16
// tile mt, r = 0 is the row of c0, c1 and r = 1 the row of c2, c3. m is the running max of raw
// scores, l this thread's partial sum of probabilities relative to m. The scores become
// probabilities 2^(s c - m c), with c = log2(e) / sqrt(D) (one FFMA each), and O is rescaled by
// 2^(m_old c - m_new c). A row that has seen only masked keys keeps m = -inf; its reference point
// is then 0, not -inf, so that no inf - inf appears (alpha and every p are exactly 0).
__device__ __forceinline__ void online_softmax_update(float (&s)[WARP_M_TILES][S_TILES][4],
                                                      float (&o)[WARP_M_TILES][O_TILES][4],
                                                      float (&m)[WARP_M_TILES][2], float (&l)[WARP_M_TILES][2],
                                                      float scale_log2)
{
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float tile_max = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < S_TILES; ++nt)
                tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
            const float m_new = fmaxf(m[mt][r], quad_max(tile_max));
            const float m_scaled = (m_new == -INFINITY) ? 0.0f : m_new * scale_log2;
            const float alpha = fast_exp2(m[mt][r] * scale_log2 - m_scaled);
            m[mt][r] = m_new;
            float sum = 0.0f;
#pragma unroll
            for (int nt = 0; nt < S_TILES; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float p = fast_exp2(fmaf(s[mt][nt][2 * r + e], scale_log2, -m_scaled));
                    s[mt][nt][2 * r + e] = p;
                    sum += p;
                }
            l[mt][r] = l[mt][r] * alpha + sum;
#pragma unroll
            for (int dt = 0; dt < O_TILES; ++dt) {
                o[mt][dt][2 * r] *= alpha;
                o[mt][dt][2 * r + 1] *= alpha;
            }
        }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 7: P from the score accumulators to the A operand of P V, in registers.
// A fragment of k-step j: a0 a1 = (row g, k 2t, 2t+1), a2 a3 = (row g+8, k 2t, 2t+1),
// a4 a5 = (row g, k 8+2t, 9+2t), a6 a7 = (row g+8, k 8+2t, 9+2t), with g = l / 4, t = l % 4.
// Score tile 2j holds keys 16j..16j+7 as (c0 c1 at row g, c2 c3 at row g+8, keys 2t, 2t+1), tile
// 2j+1 keys 16j+8..16j+15 likewise: so register 0 is tile 2j's (c0, c1), register 1 its (c2, c3),
// registers 2 and 3 the same of tile 2j+1. Only the rounding to fp16 happens here.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void pack_p_fragment(uint32_t (&a)[4], const float (&s)[S_TILES][4], int j)
{
    a[0] = pack_half2(s[2 * j][0], s[2 * j][1]);
    a[1] = pack_half2(s[2 * j][2], s[2 * j][3]);
    a[2] = pack_half2(s[2 * j + 1][0], s[2 * j + 1][1]);
    a[3] = pack_half2(s[2 * j + 1][2], s[2 * j + 1][3]);
}

// O += P V for one key tile: PV_STEPS x O_TILES x WARP_M_TILES MMAs; each V fragment pair is used
// by every m16 tile of the warp.
__device__ __forceinline__ void accumulate_pv(float (&o)[WARP_M_TILES][O_TILES][4],
                                              const float (&p)[WARP_M_TILES][S_TILES][4], uint32_t v_lane)
{
#pragma unroll
    for (int j = 0; j < PV_STEPS; ++j) {
        uint32_t a[WARP_M_TILES][4];
#pragma unroll
        for (int mt = 0; mt < WARP_M_TILES; ++mt) pack_p_fragment(a[mt], p[mt], j);
#pragma unroll
        for (int dp = 0; dp < O_TILES / 2; ++dp) {
            uint32_t vf[4];
            load_v_fragments(vf, v_lane, j, dp);
#pragma unroll
            for (int mt = 0; mt < WARP_M_TILES; ++mt) {
                mma_f16_16816(o[mt][2 * dp], a[mt], vf[0], vf[1]);
                mma_f16_16816(o[mt][2 * dp + 1], a[mt], vf[2], vf[3]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 9: epilogue. Each warp stages its WARP_ROWS rows (normalised, fp16) in its own rows
// of the Q tile, which only this warp ever reads (its Q fragments, whose last use the output
// depends on), so a __syncwarp is the only ordering needed. A 4-byte write of (c0, c1) of d tile
// dt by lane l goes to row g, chunk dt, bytes 4t: the 8 rows of a store hit 8 swizzled chunks, so
// 32 banks. Then lane l reads 16-byte chunks l % 16 of rows 2 p + l / 16 and stores them to o.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void store_output(__half* o_head, const float (&o)[WARP_M_TILES][O_TILES][4],
                                             const float (&l)[WARP_M_TILES][2], unsigned char* q_smem, int q0,
                                             int S, int warp, int lane)
{
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float total = quad_sum(l[mt][r]);
            inv[r] = total > 0.0f ? 1.0f / total : 0.0f;
        }
        const int row_top = warp * WARP_ROWS + mt * MMA_M + lane / 4;
#pragma unroll
        for (int dt = 0; dt < O_TILES; ++dt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint32_t at = swizzle_offset(row_top + r * ACC_ROW_HALF, dt) + 4 * (lane % 4);
                *reinterpret_cast<uint32_t*>(q_smem + at) =
                    pack_half2(o[mt][dt][2 * r] * inv[r], o[mt][dt][2 * r + 1] * inv[r]);
            }
    }
    __syncwarp();
#pragma unroll
    for (int p = 0; p < OUT_PASSES; ++p) {
        const int id = p * WARP_SIZE + lane;
        const int row = warp * WARP_ROWS + id / CHUNKS_PER_ROW;
        const int chunk = id % CHUNKS_PER_ROW;
        if (q0 + row < S) {
            const uint4 v = *reinterpret_cast<const uint4*>(q_smem + swizzle_offset(row, chunk));
            *reinterpret_cast<uint4*>(o_head + static_cast<long long>(q0 + row) * HEAD_DIM + chunk * VEC) = v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The kernel: grid (cdiv(S, BLOCK_M), B * H), THREADS threads, SMEM_BYTES of dynamic shared memory
// laid out as [Q tile][stage 0: K, V][stage 1: K, V]...
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fmha_flash_mma_r32(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
                   __half* __restrict__ o, int S, int causal)
{
    // 1024-byte aligned (PTX .align): every tile starts at a multiple of TILE_ALIGN, as the XOR of
    // fragment_address needs.
    extern __shared__ __align__(1024) unsigned char smem[];

    const int tid = threadIdx.x;
    const int lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE;
    // Heaviest query tiles first: under the causal mask the last tiles visit the most keys.
    const int q_tile = gridDim.x - 1 - blockIdx.x;
    const int q0 = q_tile * BLOCK_M;
    const long long head = static_cast<long long>(blockIdx.y) * S * HEAD_DIM;
    const __half* q_head = q + head;
    // The K/V loader's per-thread part: row tid / 16, chunk tid % 16 of every tile.
    const long long kv_first = head + (tid / CHUNKS_PER_ROW) * HEAD_DIM + (tid % CHUNKS_PER_ROW) * VEC;
    const int kv_rows = S - tid / CHUNKS_PER_ROW;
    const uint32_t kv_dst = swizzle_offset(tid / CHUNKS_PER_ROW, tid % CHUNKS_PER_ROW);
    const bool is_causal = causal != 0;

    // Key tiles this query tile needs: all of them, or (causal) up to its last valid row.
    const int last_row_end = min(q0 + BLOCK_M, S);
    const int n_tiles = (is_causal ? last_row_end + BLOCK_N - 1 : S + BLOCK_N - 1) / BLOCK_N;

    const uint32_t q_tile_smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t stages_smem = q_tile_smem + Q_TILE_BYTES;

    // Prologue: Q in its own commit group, then key tiles 0 .. STAGES-2, one group each (a group
    // is committed even when empty, so the wait counts below hold for any n_tiles). The first
    // iteration's wait covers the Q group too: it is older than key tile 0's.
    load_tile_async<Q_LOADS>(q_tile_smem, q_head, q0, S, tid);
    cp_async_commit();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (st < n_tiles) {
            const uint32_t stage = stages_smem + st * STAGE_BYTES;
            load_kv_tile_async(stage + kv_dst, k, v, kv_first + st * BLOCK_N * HEAD_DIM, kv_rows - st * BLOCK_N);
        }
        cp_async_commit();
    }

    float o_acc[WARP_M_TILES][O_TILES][4];
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt)
#pragma unroll
        for (int dt = 0; dt < O_TILES; ++dt)
#pragma unroll
            for (int i = 0; i < 4; ++i) o_acc[mt][dt][i] = 0.0f;
    float m[WARP_M_TILES][2];
    float l[WARP_M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < WARP_M_TILES; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            m[mt][r] = -INFINITY;
            l[mt][r] = 0.0f;
        }
    const float scale_log2 = SCALE_LOG2;
    const int warp_row0 = q0 + warp * WARP_ROWS;  // the warp's first query row
    const int row_top = warp_row0 + lane / 4;      // the row of c0 of the lane's first m16 tile
    const uint32_t q_lane = q_tile_smem + q_lane_offset(warp, lane);
    const uint32_t k_lane0 = stages_smem + k_lane_offset(lane);
    const uint32_t v_lane0 = stages_smem + KV_TILE_BYTES + v_lane_offset(lane);

    for (int t = 0; t < n_tiles; ++t) {
        // Key tile t (and, at t = 0, Q) has landed for every thread, and every warp has finished
        // (or skipped) tile t - 1, whose stage (the one written next) may now be overwritten.
        cp_async_wait<STAGES - 2>();
        __syncthreads();

        const int fetch = t + STAGES - 1;
        if (fetch < n_tiles) {
            const uint32_t stage = stages_smem + (static_cast<uint32_t>(fetch) % STAGES) * STAGE_BYTES;
            load_kv_tile_async(stage + kv_dst, k, v, kv_first + static_cast<long long>(fetch) * BLOCK_N * HEAD_DIM,
                               kv_rows - fetch * BLOCK_N);
        }
        cp_async_commit();

        const uint32_t stage_offset = (static_cast<uint32_t>(t) % STAGES) * STAGE_BYTES;
        const uint32_t k_lane = k_lane0 + stage_offset;
        const uint32_t v_lane = v_lane0 + stage_offset;

        const int key0 = t * BLOCK_N;
        // Causal: every key of this tile comes after every row of this warp (a warp-uniform
        // branch): its probabilities would all be 0, so the warp skips the tile.
        if (is_causal && key0 > warp_row0 + WARP_ROWS - 1) continue;

        float s[WARP_M_TILES][S_TILES][4];
        compute_scores(s, q_lane, k_lane);
        // Only a tile that reaches past S or crosses the diagonal of this warp's rows has keys to
        // mask (a warp-uniform branch).
        if (key0 + BLOCK_N > S || (is_causal && key0 + BLOCK_N - 1 > warp_row0))
            mask_scores(s, key0, row_top, S, is_causal, lane);
        online_softmax_update(s, o_acc, m, l, scale_log2);
        accumulate_pv(o_acc, s, v_lane);
    }

    cp_async_wait<0>();  // only empty groups can remain; drained before the kernel ends
    store_output(o + head, o_acc, l, smem, q0, S, warp, lane);
}
