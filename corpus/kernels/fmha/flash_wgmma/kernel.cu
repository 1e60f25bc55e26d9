// Attention forward, o = softmax(q k^T / sqrt(D) [+ causal mask]) v in fp16, as a flash-attention
// kernel for Hopper: warpgroup MMA (wgmma) fed by the tensor memory accelerator (TMA), for
// D = HEAD_DIM = 128 and any sequence length S.
//
// Work comes in tiles of (BLOCK_M = 128 query rows, one batch * head); a persistent grid of at most
// one CTA per SM walks them. A CTA has three warpgroups: a producer that issues every TMA load, and
// two consumers of WG_M = 64 query rows each. For a tile, the CTA walks the key sequence in tiles of
// BLOCK_N = 128 keys; for each key tile a consumer computes its 64 x 128 scores with one wgmma
// chain, folds them into an online softmax in registers (running row max m, row sum l) and
// accumulates P V into 64 x 128 fp32 output registers, rescaled whenever the running max grows.
// The S x S score matrix never leaves the chip.
//
// Mechanisms, each in its own helper below:
//   1. Warpgroup MMA, both products m64n128k16 with fp32 accumulators:
//      S = Q K^T (wgmma_qk): A = Q and B = K from shared memory through 128B-swizzle matrix
//      descriptors; both are K-major as stored (the reduction runs over d, and rows of q and k are
//      contiguous in d), so neither needs a transpose bit.
//      O += P V (wgmma_pv): A = P from registers (wgmma's register-A form), B = V from shared
//      memory. V is stored key-major ([key][d], d contiguous), i.e. MN-major for the B operand
//      (N = d is the contiguous dimension, K = keys), so the instruction's transpose-B bit is set
//      and the descriptor describes the MN-major canonical layout (v_descriptor).
//   2. TMA loads (tma_load_3d): q, k and v are seen as [B*H][S][D] through 3-D tensor maps (built
//      by the launch plan), so a box never crosses into the next head and rows at or past S arrive
//      as zeros. The 128B swizzle limits a box row to 128 bytes = SPAN = 64 fp16, so every tile is
//      two boxes, one per 64-column span of d, each stored as its own [rows][64] swizzled block.
//   3. 128-byte swizzle: TMA stores 16-byte chunk c of a 128-byte row r at chunk c ^ (r % 8), and
//      the descriptors declare the same mode, so wgmma reads what TMA wrote without bank conflicts.
//      Every block starts on a 1024-byte boundary (a whole swizzle pattern): base offset 0.
//   4. mbarrier pipeline: K and V tiles have separate STAGES-deep (2) rings, each stage with a
//      "full" barrier (producer arrive.expect_tx + TMA complete_tx) and an "empty" barrier (one
//      arrive per consumer warp once its wgmma reading the stage has completed), so the consumers
//      can start Q K^T while the V tile is still arriving. The producer loads in the order the
//      consumers need: K_0, then K_i before V_(i-1). The Q tile has a full and an empty barrier
//      too: the next tile's Q is loaded as soon as the last Q K^T of the current one is done.
//   5. Warp specialization (setmaxnreg): the producer warpgroup gives registers back
//      (PRODUCER_REGS), the consumers claim CONSUMER_REGS for S (64), O (64) and P (32 registers).
//   6. Intra-warpgroup overlap (consume_tile): in iteration i a consumer issues S_i = Q K_i^T and
//      then O += P_(i-1) V_(i-1) back to back, waits for S_i only, and runs the softmax of S_i while
//      the P V product is still on the tensor cores.
//   7. Inter-warpgroup ping-pong (schedule_wait / schedule_pass): two named barriers make the two
//      consumers take turns issuing their wgmma, so one warpgroup's softmax (MUFU, FMA) runs while
//      the other's MMAs occupy the tensor cores.
//   8. Online softmax in the wgmma accumulator layout (online_softmax): the scale is folded into
//      log2(e) / sqrt(D), so a probability is one FFMA and one exp2f (a single MUFU.EX2 under
//      --ftz=true); the four lanes of a quad hold a row, so row maxima take two xor-shuffles
//      (quad_max); row sums stay per thread until the epilogue (quad_sum).
//   9. P in registers (pack_p): the accumulator layout of a 64 x 16 slice of S is, register for
//      register, the A-fragment layout of one k16 step of P V, so P is only rounded to fp16 and
//      packed in pairs: P register i = (s[2 i], s[2 i + 1]).
//  10. Masking (mask_scores): keys at or past S (ragged tails) and, when causal, keys after the
//      query row get -inf before the softmax, so their probabilities are exactly 0. Key tiles run
//      from the last to the first, so the only tile that can need a mask (the ragged tail or the
//      causal diagonal) comes first; key tiles wholly after a causal query tile are never loaded.
//  11. Persistent tile schedule (scheduled_tile, tile_coordinates): CTA b takes tiles b, then
//      2 G - 1 - b, 2 G + b, ... (G CTAs; a snake, so that rounds of descending cost balance).
//      Without the mask, tiles are head-major (the CTAs running together share K and V in L2);
//      with it, heaviest query tiles first. The producer runs ahead into the next tile while the
//      consumers finish the current one; the launch plan sizes the grid (PERSISTENT = 0 gives one
//      CTA per tile, the same code).
//  12. Epilogue (store_output): O is divided by the row sum, rounded to fp16, staged in the
//      warpgroup's own block of shared memory (rows padded by 16 bytes: conflict-free 4-byte
//      writes and 16-byte reads; each warp reads back only its own rows), and written with 16-byte
//      stores, each row checked against S.
//
// Domain: D == HEAD_DIM (declared in launch.toml). Rows of q, k, v and o are 256 bytes, so the
// tensor maps' strides (D * 2 and S * D * 2 bytes) are multiples of 16 for every S.

#include <cuda_fp16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, pipeline and warp-role constants
// ---------------------------------------------------------------------------------------------
constexpr int HEAD_DIM = 128;                        // D
constexpr int BLOCK_M = 128;                         // query rows per CTA
constexpr int BLOCK_N = 128;                         // keys per pipeline tile
constexpr int STAGES = 2;                            // K tiles (and V tiles) in flight
constexpr int WARP_SIZE = 32;
constexpr int WARPGROUP_THREADS = 128;               // 4 warps issue one wgmma together
constexpr int PRODUCER_WARPGROUPS = 1;
constexpr int CONSUMER_WARPGROUPS = 2;
constexpr int THREADS = (PRODUCER_WARPGROUPS + CONSUMER_WARPGROUPS) * WARPGROUP_THREADS;  // 384
constexpr int CONSUMER_THREADS = CONSUMER_WARPGROUPS * WARPGROUP_THREADS;                 // 256
constexpr int CONSUMER_WARPS = CONSUMER_THREADS / WARP_SIZE;                               // 8
constexpr int WG_M = BLOCK_M / CONSUMER_WARPGROUPS;  // 64 query rows per consumer warpgroup
constexpr int WGMMA_M = 64;                          // wgmma .m64nNk16: M is fixed at 64 per warpgroup
constexpr int WGMMA_K = 16;                          // fp16 wgmma consumes K in steps of 16
constexpr int S_N = BLOCK_N;                         // Q K^T: one instruction covers the tile's keys
constexpr int O_N = HEAD_DIM;                        // P V: one instruction covers all of d
constexpr int QK_STEPS = HEAD_DIM / WGMMA_K;         // 8 wgmma per S tile (reduction over d)
constexpr int PV_STEPS = BLOCK_N / WGMMA_K;          // 8 wgmma per P V (reduction over keys)
constexpr int S_REGS = WGMMA_M * S_N / WARPGROUP_THREADS;  // 64 fp32 scores per thread
constexpr int O_REGS = WGMMA_M * O_N / WARPGROUP_THREADS;  // 64 fp32 outputs per thread
constexpr int P_REGS = S_REGS / 2;                   // 32 registers of fp16 pairs
constexpr int P_REGS_PER_STEP = 4;                   // the A fragment of one k16 step
constexpr int ACC_TILE_N = 8;                        // accumulators come in 8-column groups of 4 registers
constexpr int ACC_ROW_HALF = 8;                      // registers 2, 3 of a group sit 8 rows below 0, 1
constexpr int ROWS_PER_WARP = 16;                    // a warp's share of a warpgroup's 64 rows
constexpr int ROWS_PER_THREAD = 2;                   // rows lane / 4 and lane / 4 + 8 of the warp's 16
constexpr int QUAD = 4;                              // lanes sharing a row
constexpr int ELEMENT_BYTES = 2;                     // fp16
constexpr int SWIZZLE_BYTES = 128;                   // tensor map swizzle 128B = descriptor swizzle mode 1
constexpr int SWIZZLE_ROWS = 8;                      // the XOR pattern repeats every 8 rows
constexpr int SWIZZLE_ATOM_BYTES = SWIZZLE_ROWS * SWIZZLE_BYTES;  // 1024: blocks align to this
constexpr int CHUNK_BYTES = 16;                      // the swizzle permutes 16-byte chunks
constexpr int SPAN = SWIZZLE_BYTES / ELEMENT_BYTES;  // 64 columns of d per box and per shared block
constexpr int D_SPANS = HEAD_DIM / SPAN;             // 2 boxes per tile
constexpr int SPAN_STEPS = SPAN / WGMMA_K;           // 4 k16 steps of Q K^T per span
constexpr int Q_SPAN_BYTES = BLOCK_M * SWIZZLE_BYTES;      // 16 KiB: one box of Q
constexpr int Q_TILE_BYTES = D_SPANS * Q_SPAN_BYTES;       // 32 KiB
constexpr int WG_Q_BYTES = WG_M * SWIZZLE_BYTES;           // 8 KiB: consumer 1's rows within a Q span
constexpr int KV_SPAN_BYTES = BLOCK_N * SWIZZLE_BYTES;     // 16 KiB: one box of K or V
constexpr int KV_TILE_BYTES = D_SPANS * KV_SPAN_BYTES;     // 32 KiB: one stage of K or of V
constexpr int STAGE_PAD_BYTES = 16;                       // staged output rows are padded by one 16-byte chunk
constexpr int STAGE_ROW_BYTES = HEAD_DIM * ELEMENT_BYTES + STAGE_PAD_BYTES;  // 272: 68 words, so 8 rows start 4 banks apart
constexpr int WG_O_BYTES = WG_M * STAGE_ROW_BYTES;         // 17 KiB: a warpgroup's staged output
constexpr int K_RING_OFFSET = Q_TILE_BYTES;                // [Q][K stages][V stages][O staging][barriers]
constexpr int V_RING_OFFSET = K_RING_OFFSET + STAGES * KV_TILE_BYTES;
constexpr int O_STAGE_OFFSET = V_RING_OFFSET + STAGES * KV_TILE_BYTES;
constexpr int TILES_BYTES = O_STAGE_OFFSET + CONSUMER_WARPGROUPS * WG_O_BYTES;  // 194 KiB
constexpr int MBAR_BYTES = 8;
constexpr int BARRIERS = 2 + 4 * STAGES;             // Q full, Q empty; K full, K empty, V full, V empty per stage
constexpr int BARRIER_BYTES = BARRIERS * MBAR_BYTES;
constexpr int SMEM_ALIGN = SWIZZLE_ATOM_BYTES;       // the base is rounded up to this at run time
constexpr int SMEM_BYTES = SMEM_ALIGN + TILES_BYTES + BARRIER_BYTES;  // the plan's dynamic shared memory
constexpr int PERSISTENT = 1;                        // the plan's grid: min(SMs, tiles) CTAs; 0: one CTA per tile
constexpr int PRODUCER_REGS = 40;                    // setmaxnreg.dec: one thread issuing TMA needs few
constexpr int CONSUMER_REGS = 232;                   // setmaxnreg.inc: S, O and P plus softmax state
// wgmma shared-memory matrix descriptor fields (PTX ISA, "matrix descriptor format")
constexpr int DESC_ADDR_MASK = 0x3FFFF;              // 18 address bits, stored >> 4 in bits 0-13
constexpr int DESC_SWIZZLE_128B = 1;                 // bits 62-63: 1 = 128-byte swizzle
constexpr int DESC_K_LBO_BYTES = 16;                 // K-major, swizzled: the leading offset is unused
constexpr int DESC_SBO_BYTES = SWIZZLE_ATOM_BYTES;   // 8-row groups (of M/N rows, or of V's keys) 1024 bytes apart
constexpr int DESC_V_LBO_BYTES = KV_SPAN_BYTES;      // MN-major: the next 64 columns of d are one span further
constexpr int QK_STEP_BYTES = WGMMA_K * ELEMENT_BYTES;     // 32: a k16 step inside a 128-byte row
constexpr int PV_STEP_BYTES = WGMMA_K * SWIZZLE_BYTES;     // 2048: 16 key rows of V
// Softmax
constexpr double LOG2E = 1.4426950408889634;
constexpr double INV_SQRT_HEAD_DIM = 0.08838834764831844;  // 1 / sqrt(HEAD_DIM): the problem's softmax scale
constexpr float SCALE_LOG2 = static_cast<float>(LOG2E * INV_SQRT_HEAD_DIM);  // one rounding to fp32
constexpr int SOFTMAX_CHAINS = 4;                    // independent max / sum chains per row (latency, not count)
// Epilogue
constexpr int VEC = CHUNK_BYTES / ELEMENT_BYTES;     // 8 fp16 per 16-byte store
constexpr int CHUNKS_PER_ROW = HEAD_DIM / VEC;       // 16 chunks in a 256-byte output row
constexpr int OUT_PASSES = ROWS_PER_WARP * CHUNKS_PER_ROW / WARP_SIZE;  // 8 16-byte stores per lane
// Named barriers (0 is __syncthreads): the ping-pong pair, one waited on by each consumer warpgroup.
constexpr int SCHEDULE_BARRIER_BASE = 1;
constexpr int SCHEDULE_BARRIER_THREADS = CONSUMER_THREADS;  // one warpgroup syncs, the other arrives

static_assert(WG_M == WGMMA_M, "each consumer warpgroup owns one wgmma M extent");
static_assert(S_N % 8 == 0 && S_N <= 256 && O_N % 8 == 0 && O_N <= 256, "wgmma N is a multiple of 8 up to 256");
static_assert(HEAD_DIM % SPAN == 0 && SPAN % WGMMA_K == 0 && BLOCK_N % WGMMA_K == 0, "whole k16 steps");
static_assert(BLOCK_M <= 256 && BLOCK_N <= 256, "a TMA box is at most 256 rows");
static_assert(Q_SPAN_BYTES % SWIZZLE_ATOM_BYTES == 0 && WG_Q_BYTES % SWIZZLE_ATOM_BYTES == 0 &&
              KV_SPAN_BYTES % SWIZZLE_ATOM_BYTES == 0 && PV_STEP_BYTES % SWIZZLE_ATOM_BYTES == 0,
              "every block and every V k-step starts on a whole swizzle pattern");
static_assert(WGMMA_K == 2 * SWIZZLE_ROWS, "a k16 step of V is two 8-key groups, SBO apart");
static_assert(S_REGS == S_N / ACC_TILE_N * 4 && O_REGS == O_N / ACC_TILE_N * 4, "4 accumulators per 8-column group");
static_assert(S_N == 128 && O_N == 128, "the wgmma asm below is written for m64n128k16: 64 accumulators per thread");
static_assert(P_REGS == PV_STEPS * P_REGS_PER_STEP, "P covers every k16 step of P V");
static_assert(STAGE_ROW_BYTES % CHUNK_BYTES == 0 && (STAGE_ROW_BYTES / 4) % 32 == 4,
              "staged rows keep 16-byte alignment, and consecutive rows start 4 banks apart");
static_assert(TILES_BYTES % MBAR_BYTES == 0, "the mbarriers after the tiles are 8-byte aligned");
static_assert(PERSISTENT == 0 || PERSISTENT == 1, "the grid is persistent or one CTA per tile");
static_assert(DESC_V_LBO_BYTES >> 4 < (1 << 14) && DESC_SBO_BYTES >> 4 < (1 << 14), "14-bit offset fields");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(PRODUCER_WARPGROUPS * WARPGROUP_THREADS * PRODUCER_REGS +
              CONSUMER_WARPGROUPS * WARPGROUP_THREADS * CONSUMER_REGS <= 65536,
              "the rebalanced register budgets fit the SM's register file");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");
static_assert(CONSUMER_WARPGROUPS == 2, "the ping-pong schedule alternates two consumer warpgroups");
static_assert(SMEM_BYTES <= 232448, "fits the 227 KiB of shared memory a Hopper block may opt into");

// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-byte aligned. Declared here so that
// the kernel needs no driver header; the runner passes it by value in the parameter buffer.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

// ---------------------------------------------------------------------------------------------
// Mechanism 4: mbarrier primitives (shared::cta addresses).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}

// The producer announces how many bytes the stage's TMA loads will deliver, and arrives.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

// Block until the phase with parity `parity` has completed. A fresh barrier counts its (odd)
// predecessor phase as complete, so waiting for parity 1 first returns at once.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done = 0;
    do {
        asm volatile("{\n"
                     ".reg .pred ready;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 ready, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, ready;\n"
                     "}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// ---------------------------------------------------------------------------------------------
// Mechanism 2: TMA. One 3-D box (d, row, batch*head; innermost first) from global memory into
// shared memory; its bytes (out-of-bounds zeros included) count towards the transactions of `bar`.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_descriptor(const TensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TensorMap* map, uint32_t bar, int d0, int row,
                                            int head)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(d0), "r"(row), "r"(head), "r"(bar)
                 : "memory");
}

// ---------------------------------------------------------------------------------------------
// Mechanisms 5 and 7: register rebalancing (every thread of a warpgroup executes it) and named
// barriers among some threads only.
// ---------------------------------------------------------------------------------------------
template <int REGS>
__device__ __forceinline__ void release_registers()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(REGS));
}

template <int REGS>
__device__ __forceinline__ void claim_registers()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(REGS));
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}

// Ping-pong: consumer c waits on barrier SCHEDULE_BARRIER_BASE + c until the other consumer has
// issued its MMAs (bar.arrive on it), issues its own, then passes the turn. Each barrier counts
// the 128 threads that wait on it plus the 128 of the other warpgroup that arrive.
__device__ __forceinline__ void schedule_wait(int consumer)
{
    named_barrier_sync(SCHEDULE_BARRIER_BASE + consumer, SCHEDULE_BARRIER_THREADS);
}

__device__ __forceinline__ void schedule_pass(int consumer)
{
    named_barrier_arrive(SCHEDULE_BARRIER_BASE + (consumer ^ 1), SCHEDULE_BARRIER_THREADS);
}

// ---------------------------------------------------------------------------------------------
// Mechanisms 1 and 3: shared-memory matrix descriptors and operand addresses (shared::cta bytes).
// ---------------------------------------------------------------------------------------------
// The 64-bit descriptor: start address >> 4 in bits 0-13, leading byte offset >> 4 in bits 16-29,
// stride byte offset >> 4 in bits 32-45, base offset 0 (bits 49-51: every block starts on a whole
// swizzle pattern), swizzle mode in bits 62-63.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes)
{
    return static_cast<uint64_t>((address & DESC_ADDR_MASK) >> 4) |
           static_cast<uint64_t>(leading_bytes >> 4) << 16 |
           static_cast<uint64_t>(stride_bytes >> 4) << 32 |
           static_cast<uint64_t>(DESC_SWIZZLE_128B) << 62;
}

// K-major operands (Q as A, K as B of Q K^T): rows of 128 bytes (64 values of d), 8-row groups
// DESC_SBO_BYTES apart; a k16 step starts QK_STEP_BYTES further along the row.
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t address)
{
    return smem_descriptor(address, DESC_K_LBO_BYTES, DESC_SBO_BYTES);
}

// MN-major B operand (V of P V, transposed): along N (= d) 64 contiguous values per 128-byte row,
// the next 64 one span (DESC_V_LBO_BYTES) further; along K (= keys) rows 128 bytes apart and
// 8-key groups DESC_SBO_BYTES apart.
__device__ __forceinline__ uint64_t v_descriptor(uint32_t address)
{
    return smem_descriptor(address, DESC_V_LBO_BYTES, DESC_SBO_BYTES);
}

// Q (A of Q K^T), k16 step ks (d = 16 ks ..): consumer c's 64 rows of the span holding those d.
__device__ __forceinline__ uint32_t q_operand_address(uint32_t q_tile, int consumer, int ks)
{
    return q_tile + (ks / SPAN_STEPS) * Q_SPAN_BYTES + consumer * WG_Q_BYTES + (ks % SPAN_STEPS) * QK_STEP_BYTES;
}

// K (B of Q K^T, keys as N), k16 step ks: all BLOCK_N keys of the span holding d = 16 ks ..
__device__ __forceinline__ uint32_t k_operand_address(uint32_t k_tile, int ks)
{
    return k_tile + (ks / SPAN_STEPS) * KV_SPAN_BYTES + (ks % SPAN_STEPS) * QK_STEP_BYTES;
}

// V (B of P V, keys as K, d as N), k16 step kk: keys 16 kk .. 16 kk + 15 of the first span (the
// descriptor's leading offset reaches the second).
__device__ __forceinline__ uint32_t v_operand_address(uint32_t v_tile, int kk)
{
    return v_tile + kk * PV_STEP_BYTES;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 1: warpgroup MMA.
// ---------------------------------------------------------------------------------------------
// Make register writes (of S, O or P) by ordinary instructions visible to the wgmma that follow.
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Wait until at most PENDING committed wgmma groups of this warp are still running.
template <int PENDING>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(PENDING) : "memory");
}

// Keep the compiler from moving reads or writes of registers an asynchronous wgmma owns across
// the instructions that hand them over (issue, wait).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i]) :: "memory");
}

template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i]) :: "memory");
}

// S (64 x 128 fp32, per warpgroup) (+)= Q (64 x 16 fp16, K-major, shared) * K^T (16 x 128, K-major,
// shared). ACCUMULATE = 0 for the first k16 step: scale-d = 0 ignores the old contents of s.
template <int ACCUMULATE>
__device__ __forceinline__ void wgmma_qk(float (&d)[S_REGS], uint64_t desc_q, uint64_t desc_k)
{
    asm volatile("{\n"
                 ".reg .pred accumulate;\n"
                 "setp.ne.b32 accumulate, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, "
                 "%8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, "
                 "%40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, "
                 "%56, %57, %58, %59, %60, %61, %62, %63}, "
                 "%64, %65, accumulate, 1, 1, 0, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(desc_q), "l"(desc_k), "n"(ACCUMULATE));
}

// O (64 x 128 fp32) += P (64 x 16 fp16, four registers per thread) * V (16 x 128, MN-major, shared):
// the register-A form, with the transpose-B immediate set (the last operand).
__device__ __forceinline__ void wgmma_pv(float (&d)[O_REGS], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint64_t desc_v)
{
    asm volatile("{\n"
                 ".reg .pred accumulate;\n"
                 "setp.ne.b32 accumulate, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, "
                 "%8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, "
                 "%40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, "
                 "%56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_v), "n"(1));
}

// S = Q K^T for one key tile: QK_STEPS chained wgmma (the first overwrites s), one commit group.
__device__ __forceinline__ void issue_scores(float (&s)[S_REGS], uint32_t q_tile, int consumer, uint32_t k_tile)
{
    fence_registers(s);
    wgmma_fence();
    wgmma_qk<0>(s, k_major_descriptor(q_operand_address(q_tile, consumer, 0)),
                k_major_descriptor(k_operand_address(k_tile, 0)));
#pragma unroll
    for (int ks = 1; ks < QK_STEPS; ++ks)
        wgmma_qk<1>(s, k_major_descriptor(q_operand_address(q_tile, consumer, ks)),
                    k_major_descriptor(k_operand_address(k_tile, ks)));
    wgmma_commit();
}

// O += P V for one key tile: PV_STEPS chained wgmma, P register step kk as the A fragment.
__device__ __forceinline__ void issue_pv(float (&o)[O_REGS], uint32_t (&p)[P_REGS], uint32_t v_tile)
{
    fence_registers(o);
    fence_registers(p);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk)
        wgmma_pv(o, p[P_REGS_PER_STEP * kk], p[P_REGS_PER_STEP * kk + 1], p[P_REGS_PER_STEP * kk + 2],
                 p[P_REGS_PER_STEP * kk + 3], v_descriptor(v_operand_address(v_tile, kk)));
    wgmma_commit();
}

// ---------------------------------------------------------------------------------------------
// The wgmma m64nNk16 accumulator layout: warp w of the warpgroup holds rows 16 w .. 16 w + 15;
// accumulator 4 j + i of lane l sits at row 16 w + l / 4 + 8 (i / 2), column 8 j + 2 (l % 4) + i % 2.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int accumulator_row(int warp, int lane, int i)
{
    return warp * ROWS_PER_WARP + lane / QUAD + ((i % 4) / 2) * ACC_ROW_HALF;
}

__device__ __forceinline__ int accumulator_col(int lane, int i)
{
    return (i / 4) * ACC_TILE_N + 2 * (lane % QUAD) + i % 2;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 10: masking. A key is masked when it is past the sequence or (causal) after the row.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ bool key_masked(int key, int row, int S, bool causal)
{
    return key >= S || (causal && key > row);
}

// Key tiles a query tile visits: all of them, or (causal) those up to its last valid row.
__device__ __forceinline__ int key_tile_count(int q0, int S, bool causal)
{
    const int keys = causal ? min(q0 + BLOCK_M, S) : S;
    return (keys + BLOCK_N - 1) / BLOCK_N;
}

// The i-th tile processed: the last first, so that the only tile that may need a mask comes first.
__device__ __forceinline__ int key_tile_start(int i, int n_tiles)
{
    return (n_tiles - 1 - i) * BLOCK_N;
}

// Whether any key of the key tile is masked for any row of the query tile (uniform across the CTA).
__device__ __forceinline__ bool tile_needs_mask(int key0, int q0, int S, bool causal)
{
    return key0 + BLOCK_N > S || (causal && key0 + BLOCK_N - 1 > q0);
}

// row_top: the query row of the thread's accumulators 4 j + {0, 1}.
__device__ __forceinline__ void mask_scores(float (&s)[S_REGS], int key0, int row_top, int S, bool causal, int lane)
{
#pragma unroll
    for (int i = 0; i < S_REGS; ++i) {
        const int key = key0 + accumulator_col(lane, i);
        const int row = row_top + ((i % 4) / 2) * ACC_ROW_HALF;
        if (key_masked(key, row, S, causal)) s[i] = -INFINITY;
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 11: the persistent tile schedule. Round r of CTA b (of G) is tile r G + b for even r
// and r G + G - 1 - b for odd r: every tile once, and a CTA that drew a heavy tile in one round
// draws a light one in the next.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int scheduled_tile(int round, int block, int grid)
{
    return round * grid + ((round % 2 == 0) ? block : grid - 1 - block);
}

// Linear tile -> (query tile, batch * head). Without the mask every tile costs the same; the
// query tiles of a head are adjacent, so the CTAs of a round share few heads' K and V in L2. With
// it, the heaviest query tiles (the last) of every head come first.
__device__ __forceinline__ void tile_coordinates(int tile, int q_tiles, int heads, bool causal, int& q_tile, int& head)
{
    if (causal) {
        q_tile = q_tiles - 1 - tile / heads;
        head = tile % heads;
    } else {
        q_tile = tile % q_tiles;
        head = tile / q_tiles;
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanism 8: online softmax.
// ---------------------------------------------------------------------------------------------
// 2^x through exp2f, CUDA's precise function (2 ulp, 2^-inf = +0). The plan builds with
// --ftz=true, under which exp2f is a single MUFU.EX2; flushing results below 2^-126 to zero costs
// nothing here (an fp16 P cannot hold them, and they add nothing visible to a row sum >= 1).
__device__ __forceinline__ float fast_exp2(float x)
{
    return exp2f(x);
}

// Max / sum over the 4 lanes of a quad (lanes 4g .. 4g+3 hold the same two rows).
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

// Fold one tile of raw scores (q.k, unscaled) into the running state of the thread's two rows
// (r = 0: accumulators 4 j + {0, 1}; r = 1: 4 j + {2, 3}): m is the running max of raw scores,
// l this thread's partial sum of probabilities relative to it, alpha = 2^(c m_old - c m_new) the
// factor O must be scaled by before the next P V, with c = log2(e) / sqrt(D). The scores become
// probabilities 2^(c s - c m) in place. A row that has seen only masked keys keeps m = -inf and
// uses 0 as its reference point, so no inf - inf appears (alpha and every p are exactly 0).
__device__ __forceinline__ void online_softmax(float (&s)[S_REGS], float (&m)[ROWS_PER_THREAD],
                                               float (&l)[ROWS_PER_THREAD], float (&alpha)[ROWS_PER_THREAD])
{
    // Row maxima: SOFTMAX_CHAINS independent chains per row instead of one chain of 32 FMNMX.
    float part[ROWS_PER_THREAD][SOFTMAX_CHAINS];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
        for (int c = 0; c < SOFTMAX_CHAINS; ++c) part[r][c] = -INFINITY;
#pragma unroll
    for (int j = 0; j < S_REGS / 4; ++j)
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& chain = part[r][(2 * j + e) % SOFTMAX_CHAINS];
                chain = fmaxf(chain, s[4 * j + 2 * r + e]);
            }
    float m_scaled[ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        float tile_max = part[r][0];
#pragma unroll
        for (int c = 1; c < SOFTMAX_CHAINS; ++c) tile_max = fmaxf(tile_max, part[r][c]);
        const float m_new = fmaxf(m[r], quad_max(tile_max));
        m_scaled[r] = (m_new == -INFINITY) ? 0.0f : m_new * SCALE_LOG2;
        alpha[r] = fast_exp2(m[r] * SCALE_LOG2 - m_scaled[r]);
        m[r] = m_new;
    }
    // Probabilities in place, and their sums, again in independent chains.
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
        for (int c = 0; c < SOFTMAX_CHAINS; ++c) part[r][c] = 0.0f;
#pragma unroll
    for (int j = 0; j < S_REGS / 4; ++j)
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float p = fast_exp2(fmaf(s[4 * j + 2 * r + e], SCALE_LOG2, -m_scaled[r]));
                s[4 * j + 2 * r + e] = p;
                part[r][(2 * j + e) % SOFTMAX_CHAINS] += p;
            }
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        float sum = part[r][0];
#pragma unroll
        for (int c = 1; c < SOFTMAX_CHAINS; ++c) sum += part[r][c];
        l[r] = l[r] * alpha[r] + sum;
    }
}

// O of row r times alpha[r], before the next P V adds to it.
__device__ __forceinline__ void rescale_output(float (&o)[O_REGS], const float (&alpha)[ROWS_PER_THREAD])
{
#pragma unroll
    for (int i = 0; i < O_REGS; ++i) o[i] *= alpha[(i % 4) / 2];
}

// ---------------------------------------------------------------------------------------------
// Mechanism 9: P from the score accumulators to the A fragments of P V. A fragment of k16 step
// kk, value v (PTX ISA, register-A layout of m64nNk16 for 16-bit types): row 16 w + l / 4 +
// 8 ((v / 2) % 2), key 16 kk + 2 (l % 4) + v % 2 + 8 (v / 4), packed two per register, value v
// in register v / 2. The score accumulator 8 kk + v has exactly that row and key (see
// accumulator_row/col), so register 4 kk + q holds accumulators 8 kk + 2 q and 8 kk + 2 q + 1.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void pack_p(uint32_t (&p)[P_REGS], const float (&s)[S_REGS])
{
#pragma unroll
    for (int i = 0; i < P_REGS; ++i) p[i] = pack_half2(s[2 * i], s[2 * i + 1]);
}

// ---------------------------------------------------------------------------------------------
// Mechanism 12: epilogue.
// ---------------------------------------------------------------------------------------------
// Byte offset of element (row, d) in a warpgroup's staging block: padded rows of STAGE_ROW_BYTES.
// A thread's addresses are one base plus compile-time offsets (no registers held across tiles).
__device__ __forceinline__ uint32_t staging_offset(int row, int d)
{
    return row * STAGE_ROW_BYTES + d * ELEMENT_BYTES;
}

// Row (of the warpgroup's 64) and 16-byte chunk (of 16) a lane stores in pass p: each warp
// stores its own 16 rows, half a warp per 256-byte row.
__device__ __forceinline__ void output_chunk(int warp, int lane, int p, int& row, int& chunk)
{
    const int id = p * WARP_SIZE + lane;
    row = warp * ROWS_PER_WARP + id / CHUNKS_PER_ROW;
    chunk = id % CHUNKS_PER_ROW;
}

// O / l -> fp16 -> the warpgroup's staging block -> o rows q_row0 .. q_row0 + 63 (those < S).
// `staging` is the generic address of the block. The 8 rows of one 4-byte store start 4 banks
// apart and its 4 lanes per row take the next 4 (32 banks); the 8 lanes of a 16-byte read phase
// read 8 consecutive chunks of one row (8 bank groups). A warp writes and reads back only its
// own 16 rows, so __syncwarp orders it against its own reads of the previous tile and its writes
// of this one.
__device__ __forceinline__ void store_output(__half* o_head, const float (&o)[O_REGS], const float (&l)[ROWS_PER_THREAD],
                                             unsigned char* staging, int q_row0, int S, int warp, int lane)
{
    __syncwarp();  // the warp's reads of its previous tile are done
    float inv[ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const float total = quad_sum(l[r]);
        inv[r] = total > 0.0f ? 1.0f / total : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < O_REGS; i += 2) {
        const float scale = inv[(i % 4) / 2];
        const uint32_t at = staging_offset(accumulator_row(warp, lane, i), accumulator_col(lane, i));
        *reinterpret_cast<uint32_t*>(staging + at) = pack_half2(o[i] * scale, o[i + 1] * scale);
    }
    __syncwarp();  // a warp reads back only the rows it wrote
#pragma unroll
    for (int p = 0; p < OUT_PASSES; ++p) {
        int row, chunk;
        output_chunk(warp, lane, p, row, chunk);
        if (q_row0 + row < S) {
            const uint4 v = *reinterpret_cast<const uint4*>(staging + staging_offset(row, chunk * VEC));
            *reinterpret_cast<uint4*>(o_head + static_cast<long long>(q_row0 + row) * HEAD_DIM + chunk * VEC) = v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The two roles.
// ---------------------------------------------------------------------------------------------
struct Smem {
    uint32_t q;        // shared address of the Q tile (1024-byte aligned); span h at q + h * Q_SPAN_BYTES
    uint32_t k;        // K stage s at k + s * KV_TILE_BYTES
    uint32_t v;        // V stage s at v + s * KV_TILE_BYTES
    uint32_t o;        // consumer c's output staging block at o + c * WG_O_BYTES
    uint32_t q_full;   // mbarriers (8 bytes each); stage s of a ring at base + 8 s
    uint32_t q_empty;
    uint32_t k_full;
    uint32_t k_empty;
    uint32_t v_full;
    uint32_t v_empty;
};

// What a tile is: its query rows, its head, how many key tiles it visits.
struct Tile {
    int q0;
    int head;
    int n_tiles;
};

__device__ __forceinline__ Tile make_tile(int tile, int S, int heads, bool causal)
{
    const int q_tiles = (S + BLOCK_M - 1) / BLOCK_M;
    Tile t;
    int q_tile;
    tile_coordinates(tile, q_tiles, heads, causal, q_tile, t.head);
    t.q0 = q_tile * BLOCK_M;
    t.n_tiles = key_tile_count(t.q0, S, causal);
    return t;
}

// Stage and phase parity of the j-th K (or V) tile through its ring, counted over all the CTA's tiles.
__device__ __forceinline__ int ring_stage(int j)
{
    return j % STAGES;
}

__device__ __forceinline__ uint32_t ring_parity(int j)
{
    return static_cast<uint32_t>((j / STAGES) & 1);
}

// The j-th K or V tile (keys key0 .., both spans of d) into its ring stage, once the consumers
// have released the stage's previous tile.
__device__ __forceinline__ void load_kv_tile(uint32_t ring, uint32_t full, uint32_t empty, const TensorMap* map,
                                             int j, int key0, int head)
{
    const int stage = ring_stage(j);
    mbar_wait(empty + MBAR_BYTES * stage, ring_parity(j) ^ 1);  // the first round passes at once
    const uint32_t bar = full + MBAR_BYTES * stage;
    const uint32_t tile = ring + stage * KV_TILE_BYTES;
    mbar_arrive_expect_tx(bar, KV_TILE_BYTES);
#pragma unroll
    for (int h = 0; h < D_SPANS; ++h) tma_load_3d(tile + h * KV_SPAN_BYTES, map, bar, h * SPAN, key0, head);
}

// Producer (one thread), for each of the CTA's tiles: Q once the consumers are done with the last
// one, then the key tiles in the consumers' order, K_0, K_1, V_0, K_2, V_1, ..., V_(n-1): K_i is
// loaded before V_(i-1) because iteration i of a consumer needs K_i first. `ring` counts the K
// (and V) tiles of the CTA's earlier tiles.
__device__ __forceinline__ void produce(const Smem& sm, const TensorMap* map_q, const TensorMap* map_k,
                                        const TensorMap* map_v, int S, int heads, bool causal)
{
    const int tiles = (S + BLOCK_M - 1) / BLOCK_M * heads;
    int ring = 0;
    for (int round = 0;; ++round) {
        const int index = scheduled_tile(round, blockIdx.x, gridDim.x);
        if (index >= tiles) break;
        const Tile t = make_tile(index, S, heads, causal);
        mbar_wait(sm.q_empty, static_cast<uint32_t>(round & 1) ^ 1);  // the first round passes at once
        mbar_arrive_expect_tx(sm.q_full, Q_TILE_BYTES);
#pragma unroll
        for (int h = 0; h < D_SPANS; ++h)
            tma_load_3d(sm.q + h * Q_SPAN_BYTES, map_q, sm.q_full, h * SPAN, t.q0, t.head);
        for (int i = 0; i <= t.n_tiles; ++i) {
            if (i < t.n_tiles)
                load_kv_tile(sm.k, sm.k_full, sm.k_empty, map_k, ring + i, key_tile_start(i, t.n_tiles), t.head);
            if (i > 0)
                load_kv_tile(sm.v, sm.v_full, sm.v_empty, map_v, ring + i - 1, key_tile_start(i - 1, t.n_tiles), t.head);
        }
        ring += t.n_tiles;
    }
}

// Consumer warpgroup c, one tile (its 64 query rows from t.q0 + 64 c): S_0 first, then for every
// further key tile i the overlapped pair S_i and P_(i-1) V_(i-1), finally P_(n-1) V_(n-1), and the
// epilogue. Each block of wgmma issues is one ping-pong turn; a stage is released (one arrive per
// warp) once the wgmma reading it have completed, and the Q tile once the last S has.
__device__ __forceinline__ void consume_tile(const Smem& sm, unsigned char* staging, __half* o_out, const Tile& t,
                                             int ring, int round, bool last_tile, int consumer, int warp, int lane,
                                             int S, bool causal)
{
    float o[O_REGS];
    float s[S_REGS];
    uint32_t p[P_REGS];
    float m[ROWS_PER_THREAD] = {-INFINITY, -INFINITY};
    float l[ROWS_PER_THREAD] = {0.0f, 0.0f};
    float alpha[ROWS_PER_THREAD] = {1.0f, 1.0f};
#pragma unroll
    for (int i = 0; i < O_REGS; ++i) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < S_REGS; ++i) s[i] = 0.0f;
    const int n_tiles = t.n_tiles;
    const int q0 = t.q0;
    const int row_top = q0 + consumer * WG_M + warp * ROWS_PER_WARP + lane / QUAD;

    mbar_wait(sm.q_full, static_cast<uint32_t>(round & 1));

    // Key tile 0: S_0 alone.
    {
        const int ks = ring_stage(ring);
        mbar_wait(sm.k_full + MBAR_BYTES * ks, ring_parity(ring));
        schedule_wait(consumer);
        issue_scores(s, sm.q, consumer, sm.k + ks * KV_TILE_BYTES);
        schedule_pass(consumer);
        wgmma_wait<0>();
        fence_registers(s);
        if (lane == 0) {
            mbar_arrive(sm.k_empty + MBAR_BYTES * ks);
            if (n_tiles == 1) mbar_arrive(sm.q_empty);  // the last read of this tile's Q is done
        }
        const int key0 = key_tile_start(0, n_tiles);
        if (tile_needs_mask(key0, q0, S, causal)) mask_scores(s, key0, row_top, S, causal, lane);
        online_softmax(s, m, l, alpha);
        pack_p(p, s);
    }

    for (int i = 1; i < n_tiles; ++i) {
        const int ks = ring_stage(ring + i);
        const int vs = ring_stage(ring + i - 1);
        mbar_wait(sm.k_full + MBAR_BYTES * ks, ring_parity(ring + i));
        schedule_wait(consumer);
        issue_scores(s, sm.q, consumer, sm.k + ks * KV_TILE_BYTES);
        rescale_output(o, alpha);  // O is idle: the last P V completed in the previous iteration
        mbar_wait(sm.v_full + MBAR_BYTES * vs, ring_parity(ring + i - 1));
        issue_pv(o, p, sm.v + vs * KV_TILE_BYTES);
        schedule_pass(consumer);

        wgmma_wait<1>();  // S_i is done; P V may still be running
        fence_registers(s);
        if (lane == 0) {
            mbar_arrive(sm.k_empty + MBAR_BYTES * ks);
            if (i == n_tiles - 1) mbar_arrive(sm.q_empty);
        }
        const int key0 = key_tile_start(i, n_tiles);
        if (tile_needs_mask(key0, q0, S, causal)) mask_scores(s, key0, row_top, S, causal, lane);
        online_softmax(s, m, l, alpha);

        wgmma_wait<0>();  // P_(i-1) V_(i-1) is done: its P registers and V stage are free
        fence_registers(o);
        fence_registers(p);
        if (lane == 0) mbar_arrive(sm.v_empty + MBAR_BYTES * vs);
        pack_p(p, s);
    }

    // The last P V. In the CTA's last tile consumer 1 does not pass its turn: consumer 0 has no
    // turn left to take, and every barrier phase then completes (each consumer takes n + 1 turns
    // per tile; consumer 0 is passed once before its first and after each of consumer 1's turns
    // but the very last).
    {
        const int vs = ring_stage(ring + n_tiles - 1);
        mbar_wait(sm.v_full + MBAR_BYTES * vs, ring_parity(ring + n_tiles - 1));
        schedule_wait(consumer);
        rescale_output(o, alpha);
        issue_pv(o, p, sm.v + vs * KV_TILE_BYTES);
        if (consumer == 0 || !last_tile) schedule_pass(consumer);
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(p);
        if (lane == 0) mbar_arrive(sm.v_empty + MBAR_BYTES * vs);
    }

    store_output(o_out + static_cast<long long>(t.head) * S * HEAD_DIM, o, l, staging, q0 + consumer * WG_M, S, warp,
                 lane);
}

// ---------------------------------------------------------------------------------------------
// The kernel: a 1-D grid of CTAs (min(SMs, tiles) when PERSISTENT; see launch.toml), THREADS
// threads, SMEM_BYTES of dynamic shared memory laid out (from its first 1024-byte boundary) as
// [Q][K stages][V stages][O staging][mbarriers]. heads = B * H.
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fmha_flash_wgmma(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                 const __grid_constant__ TensorMap map_v, __half* __restrict__ o, int S, int heads, int causal)
{
    extern __shared__ __align__(1024) unsigned char smem[];

    const int tid = threadIdx.x;
    const int warpgroup = tid / WARPGROUP_THREADS;
    const int lane = tid % WARP_SIZE;
    const bool is_causal = causal != 0;

    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    Smem sm;
    sm.q = (raw + SMEM_ALIGN - 1) & ~static_cast<uint32_t>(SMEM_ALIGN - 1);
    sm.k = sm.q + K_RING_OFFSET;
    sm.v = sm.q + V_RING_OFFSET;
    sm.o = sm.q + O_STAGE_OFFSET;
    sm.q_full = sm.q + TILES_BYTES;
    sm.q_empty = sm.q_full + MBAR_BYTES;
    sm.k_full = sm.q_empty + MBAR_BYTES;
    sm.k_empty = sm.k_full + MBAR_BYTES * STAGES;
    sm.v_full = sm.k_empty + MBAR_BYTES * STAGES;
    sm.v_empty = sm.v_full + MBAR_BYTES * STAGES;

    if (tid == 0) {
        mbar_init(sm.q_full, 1);                // the producer's arrive; TMA adds the bytes
        mbar_init(sm.q_empty, CONSUMER_WARPS);  // one arrive per consumer warp
        for (int st = 0; st < STAGES; ++st) {
            mbar_init(sm.k_full + MBAR_BYTES * st, 1);
            mbar_init(sm.k_empty + MBAR_BYTES * st, CONSUMER_WARPS);
            mbar_init(sm.v_full + MBAR_BYTES * st, 1);
            mbar_init(sm.v_empty + MBAR_BYTES * st, CONSUMER_WARPS);
        }
        // Make the initialized barriers visible to the TMA unit (the async proxy) before any load.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        tma_prefetch_descriptor(&map_q);
        tma_prefetch_descriptor(&map_k);
        tma_prefetch_descriptor(&map_v);
    }
    __syncthreads();

    if (warpgroup < PRODUCER_WARPGROUPS) {
        release_registers<PRODUCER_REGS>();
        if (tid == 0) produce(sm, &map_q, &map_k, &map_v, S, heads, is_causal);
        return;
    }

    claim_registers<CONSUMER_REGS>();
    const int consumer = warpgroup - PRODUCER_WARPGROUPS;  // 0 or 1: rows consumer * WG_M .. of a tile
    const int warp = (tid % WARPGROUP_THREADS) / WARP_SIZE;  // warp within the warpgroup
    unsigned char* staging = smem + (sm.o - raw) + consumer * WG_O_BYTES;
    if (consumer == 1) schedule_pass(consumer);  // consumer 0 takes the first turn

    const int tiles = (S + BLOCK_M - 1) / BLOCK_M * heads;
    int ring = 0;
    for (int round = 0;; ++round) {
        const int index = scheduled_tile(round, blockIdx.x, gridDim.x);
        if (index >= tiles) break;
        const Tile t = make_tile(index, S, heads, is_causal);
        const bool last_tile = scheduled_tile(round + 1, blockIdx.x, gridDim.x) >= tiles;
        consume_tile(sm, staging, o, t, ring, round, last_tile, consumer, warp, lane, S, is_causal);
        ring += t.n_tiles;
    }
}
