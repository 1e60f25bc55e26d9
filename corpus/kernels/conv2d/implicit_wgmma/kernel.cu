// Conv2d fp16 NHWC x KRSC -> NHWC on Hopper, stride 1: an implicit GEMM on warpgroup MMA (wgmma)
// whose A operand is read straight out of input halos that the tensor memory accelerator (TMA)
// loads once per output patch, instead of being gathered tap by tap (im2col) from L2.
//
// The GEMM (as in conv2d/implicit_gemm): D[M, F] = A[M, K] * B[K, F], M = N*P*Q output pixels,
// K = R*S*C taps in the order of w's inner dimensions, B[k, f] = w[f, r, s, c], and
// A[m, k] = x[n, p - pad + r, q - pad + s, c] (zero outside the image).
//
// The observation this kernel is built on: take the M rows of one wgmma to be an 8 x 8 patch of
// output pixels (8 rows p0.., 8 columns q0..). For a fixed tap (r, s) and 64 channels, the A rows
// are then the 8 x 8 input pixels at (p0 - pad + r.., q0 - pad + s..): a window of the patch's input
// halo shifted by the tap. A TMA box of 64 channels x 8 columns x (R + 7) rows starting at input
// column q0 - pad + s lands in shared memory as (R + 7) rows of 8 pixels, each pixel's 64 channels
// one 128-byte line and each box row of 8 pixels exactly one 1024-byte 128B-swizzle atom. Tap
// (r, s) is that box from box row r on: 8 groups of 8 lines, groups 1024 bytes apart -- precisely
// the canonical K-major 128B-swizzled wgmma operand, starting on a swizzle atom. So one box per
// filter column s (and per 64 channels) serves all R filter rows of the patch, and every A operand
// is an ordinary descriptor (start address, SBO 1024, base offset 0), the same as a GEMM's.
//
// Per patch that moves S * (R + 7) * 8 pixels (240 for 3x3) through L2 instead of the R*S*64 = 576
// pixels of an im2col gather: on the headline, 3x3 C=64, A traffic is 30 KiB per patch instead of
// 72 KiB. TMA fills the conv's zero padding itself: box coordinates may be negative or run past the
// image, and out-of-bounds elements arrive as zeros; channels past C in a 64-channel box do too, so
// any C % 8 == 0 works (C = 40 is one box of 64 channels, 24 of them zero).
//
// Mechanisms, each in its own helper below:
//   1. Patches (patch_origin): the output is cut into 8 x 8 pixel patches, linear index
//      (n, patch row, patch column); CTA b takes patches 3b, 3b + 1, 3b + 2, one per consumer
//      warpgroup, and the filter tile blockIdx.y * 128 .. + 127. Headline: 392 patches -> 131 CTAs
//      of 192 pixels x 128 filters, one wave on 132 SMs (the last CTA has two patches).
//   2. Halo loads (halo_box_coords, halo_barrier, first_read_of_box): per patch, c_chunks * S TMA
//      boxes (4-D map over x, 128B swizzle) into the consumer's halo slot, each counted on an mbarrier
//      of its own. The producer issues them in the order the K loop first reads them, box i of every
//      patch right after filter block i, and a consumer waits for a box only at its first read, so
//      its first MMAs wait for one 10 KiB box, not for the whole 30 KiB halo (headline).
//   3. Filter ring (k_block_tap, rotated_k_block, next_k_block_tap): the K loop runs over K blocks
//      (r, s, 64-channel chunk), stepping from one tap to the next without divisions; each block's
//      128 filters x 64 channels (16 KiB, a 3-D map over w) go through a STAGES-deep full/empty
//      mbarrier ring shared by the three consumers (as in gemm/wgmma_tma).
//      Each CTA starts its K loop at a different block (blockIdx.x % k_blocks) so that the 131 CTAs
//      do not all read the same 16 KiB of w from the same L2 slices at the same moment.
//   4. Warpgroup MMA (wgmma_m64n128k16, smem_descriptor, a_operand): per K block, 4 wgmma
//      m64n128k16 f32.f16.f16 per consumer, A from its halo slot (box (chunk, s) + r box rows),
//      B from the ring stage; one group stays in flight while the next stage and box are awaited.
//   5. Warp roles: warpgroups 0..2 are consumers, each owning one patch (a 64 x 128 fp32
//      accumulator, 64 registers per thread); the warp after them is the producer (one thread issues
//      every TMA). One warp, not a warpgroup: its registers count against every resident CTA.
//   6. Epilogue (store_accumulators_to_shared, store_tile_vectorized): accumulators rounded to
//      fp16x2, staged in the consumer's own halo slot (free once its MMAs have completed) with a
//      padded pitch, then written as 16-byte chunks of whole output pixels (256 contiguous bytes
//      per pixel on the headline), masked to p < P, q < Q, f < F; element stores when rows of y are
//      not 16-byte aligned (F % 8 != 0).
//
// Sizing for the headline (M = 25088, F = 128, K = 576 on 132 SMs): per CTA, 3 x 30 KiB of halos and
// 9 x 16 KiB of filters cross L2 (234 KiB, 30 MiB for the launch, where the 192 x 128 im2col tiles of
// conv2d/implicit_gemm move 48 MiB), and 3 x 36 wgmma m64n128k16 run on its SM (about 3.5 us at the
// tensor cores' peak). Shared memory: 3 halo slots of 30 KiB and 8 stages of 16 KiB, 219 KiB, so one
// CTA per SM; registers: 64 accumulators per consumer thread. The prologue before a consumer's first
// MMA is filter block 0 and box 0 of patches 0 .. j (26, 36, 46 KiB issued ahead of consumer 0, 1, 2,
// where a barrier per halo made it 46, 76, 106 KiB); the rest of the halos and filters land under the
// MMAs. The filters are now most of the L2 traffic; halving it would take TMA multicast of each
// filter block to a 2-CTA cluster.
//
// Domain (launch.toml): stride 1 (a box row must be 8 consecutive input pixels), C % 8 == 0 (a
// tensor map's row strides are multiples of 16 bytes), and a patch's boxes fit its halo slot:
// cdiv(C, 64) * S * (R + 7) <= HALO_CAPACITY_ROWS (30: 3x3 up to 64 channels, 1x1 up to 192).

#include <cuda_fp16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, pipeline and warp-role constants
// ---------------------------------------------------------------------------------------------
constexpr int PATCH_P = 8;                          // output rows per patch: the 8 core groups of a wgmma A
constexpr int PATCH_Q = 8;                          // output columns per patch: the 8 rows of one core group
constexpr int PATCH_PIXELS = PATCH_P * PATCH_Q;     // 64 = wgmma M
constexpr int CONSUMER_WARPGROUPS = 3;              // one patch each
constexpr int PATCHES_PER_CTA = CONSUMER_WARPGROUPS;
constexpr int BLOCK_M = PATCHES_PER_CTA * PATCH_PIXELS;  // 192 output pixels per CTA
constexpr int BLOCK_N = 128;                        // filters per CTA = wgmma N
constexpr int BOX_C = 64;                           // channels per K block: 128 bytes of fp16
constexpr int WARP_SIZE = 32;
constexpr int WARPGROUP_THREADS = 128;              // 4 warps issue one wgmma together
constexpr int WARPS_PER_WARPGROUP = WARPGROUP_THREADS / WARP_SIZE;
constexpr int CONSUMER_THREADS = CONSUMER_WARPGROUPS * WARPGROUP_THREADS;  // warps 0 .. 11: wgmma needs aligned warpgroups
constexpr int PRODUCER_THREADS = WARP_SIZE;         // one warp after the consumers; one thread of it issues TMA
constexpr int THREADS = CONSUMER_THREADS + PRODUCER_THREADS;  // 416
constexpr int WGMMA_M = 64;                         // wgmma .m64nNk16: M is fixed at 64 per warpgroup
constexpr int WGMMA_N = BLOCK_N;                    // one wgmma covers all 128 filters of the tile
constexpr int WGMMA_K = 16;                         // fp16 wgmma consumes K in steps of 16
constexpr int K_STEPS = BOX_C / WGMMA_K;            // 4 wgmma per K block per consumer
constexpr int ACC_REGS = WGMMA_M * WGMMA_N / WARPGROUP_THREADS;  // 64 fp32 accumulators per thread
constexpr int ACC_TILE_N = 8;                       // accumulators come in 8-column groups of 4 registers
constexpr int ACC_ROW_HALF = 8;                     // registers 2, 3 of a group sit 8 rows below 0, 1
constexpr int ROWS_PER_WARP = 16;                   // a warp's share of the 64 accumulator rows
constexpr int ELEMENT_BYTES = 2;                    // fp16
constexpr int ROW_BYTES = BOX_C * ELEMENT_BYTES;    // 128: one pixel's (or filter's) 64 channels
constexpr int SWIZZLE_BYTES = 128;                  // tensor map swizzle 128B = wgmma swizzle mode 1
constexpr int SWIZZLE_ROWS = 8;                     // the XOR pattern repeats every 8 lines
constexpr int SWIZZLE_ATOM_BYTES = SWIZZLE_ROWS * SWIZZLE_BYTES;  // 1024: operands start on these
constexpr int HALO_ROW_BYTES = PATCH_Q * ROW_BYTES; // 1024: one box row of 8 pixels = one swizzle atom
constexpr int HALO_CAPACITY_ROWS = 30;              // box rows per halo slot: cdiv(C, 64) * S * (R + 7) at most
constexpr int HALO_SLOT_BYTES = HALO_CAPACITY_ROWS * HALO_ROW_BYTES;  // 30 KiB per consumer
constexpr int HALO_BYTES = CONSUMER_WARPGROUPS * HALO_SLOT_BYTES;     // 90 KiB
constexpr int HALO_BOXES_MAX = HALO_CAPACITY_ROWS / PATCH_P;  // 3 boxes per slot at most: a box has R + 7 >= 8 rows
constexpr int STAGES = 8;                           // filter ring depth (9 K blocks on the headline)
constexpr int B_STAGE_BYTES = BLOCK_N * ROW_BYTES;  // 16 KiB: 128 filters x 64 channels
constexpr int RING_BYTES = STAGES * B_STAGE_BYTES;  // 128 KiB
constexpr int MBARRIER_BYTES = 8;                  // one mbarrier object (.b64)
constexpr int HALO_BARRIERS = CONSUMER_WARPGROUPS * HALO_BOXES_MAX;  // one per halo box a slot can hold
constexpr int BARRIER_BYTES = (2 * STAGES + HALO_BARRIERS) * MBARRIER_BYTES;  // full, empty per stage; halo boxes
constexpr int SMEM_ALIGN = SWIZZLE_ATOM_BYTES;      // the base is rounded up to this at run time
constexpr int SMEM_BYTES = SMEM_ALIGN + HALO_BYTES + RING_BYTES + BARRIER_BYTES;  // the plan's dynamic shared memory
// wgmma shared-memory matrix descriptor fields (PTX ISA, "matrix descriptor format")
constexpr int DESC_ADDR_MASK = 0x3FFFF;             // 18 address bits, stored >> 4 in bits 0-13
constexpr int DESC_LBO_BYTES = 16;                  // leading byte offset: unused by swizzled K-major operands
constexpr int DESC_SBO_BYTES = SWIZZLE_ATOM_BYTES;  // stride byte offset: 8-line groups are 1024 bytes apart
constexpr int DESC_SWIZZLE_128B = 1;                // bits 62-63: 1 = 128-byte swizzle
constexpr int DESC_K_STEP = WGMMA_K * ELEMENT_BYTES >> 4;  // +2 in the address field per k16 step (32 bytes)
// Epilogue
constexpr int VEC = 8;                              // fp16 per 16-byte chunk
constexpr int CHUNK_BYTES = 16;
constexpr int EPI_PAD = 8;                          // fp16 of padding per staged output row
constexpr int EPI_STRIDE = BLOCK_N + EPI_PAD;       // 136 fp16 = 272 bytes per staged row
constexpr int EPI_BYTES = WGMMA_M * EPI_STRIDE * ELEMENT_BYTES;  // 17 KiB, inside the consumer's halo slot
constexpr int EPI_CHUNKS_PER_ROW = BLOCK_N / VEC;   // 16 16-byte chunks per output pixel
constexpr int EPI_VEC_PASSES = WGMMA_M * EPI_CHUNKS_PER_ROW / WARPGROUP_THREADS;  // 8
constexpr int EPI_SCALAR_PASSES = WGMMA_M * BLOCK_N / WARPGROUP_THREADS;          // 64
// Named barriers (0 is __syncthreads): one per consumer warpgroup.
constexpr int WARPGROUP_BARRIER_BASE = 1;

static_assert(PATCH_PIXELS == WGMMA_M && BLOCK_M == PATCHES_PER_CTA * WGMMA_M,
              "a patch is exactly one wgmma M extent, and a CTA tile is whole patches");
static_assert(PATCH_Q == SWIZZLE_ROWS, "a patch row is one 8-line core group of the A operand");
static_assert(ROW_BYTES == SWIZZLE_BYTES, "a pixel's channels of a K block are exactly one 128-byte swizzle line");
static_assert(HALO_ROW_BYTES == SWIZZLE_ATOM_BYTES, "every box row, hence every tap's A operand, starts on an atom");
static_assert(HALO_SLOT_BYTES % SWIZZLE_ATOM_BYTES == 0 && B_STAGE_BYTES % SWIZZLE_ATOM_BYTES == 0,
              "every slot and stage starts on a whole swizzle pattern");
static_assert(BLOCK_N % 8 == 0 && BLOCK_N <= 256, "wgmma N is a multiple of 8 up to 256");
static_assert(BLOCK_N <= 256 && PATCH_Q <= 256, "a TMA box is at most 256 per dimension");
static_assert(ACC_REGS == WGMMA_N / ACC_TILE_N * 4, "4 accumulators per 8-column group");
static_assert(EPI_BYTES <= HALO_SLOT_BYTES, "the staged output fits in the consumer's halo slot");
static_assert((EPI_STRIDE * ELEMENT_BYTES) % CHUNK_BYTES == 0, "staged rows keep 16-byte alignment");
static_assert(HALO_SLOT_BYTES < (1 << 20), "a halo box's bytes fit an mbarrier transaction count");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");
static_assert(CONSUMER_WARPGROUPS <= 3, "warpgroup_barrier names one barrier per consumer, for up to three");
static_assert(SMEM_BYTES <= 232448, "fits the 227 KiB of shared memory a Hopper block may opt into");

// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-byte aligned. Declared here so that
// the kernel needs no driver header; the runner passes it by value in the parameter buffer.
struct alignas(64) TensorMap {
    unsigned long long opaque[16];
};

struct ConvShape {
    int N, P, Q, F, C, R, S, pad;
    int patches_p;  // cdiv(P, PATCH_P)
    int patches_q;  // cdiv(Q, PATCH_Q)
    int patches;    // N * patches_p * patches_q
    int c_chunks;   // cdiv(C, BOX_C): 64-channel K blocks per tap
    int k_blocks;   // R * S * c_chunks
    int boxes;      // c_chunks * S: halo boxes per patch, at most HALO_BOXES_MAX in the domain
    int box_bytes;  // (R + PATCH_P - 1) * HALO_ROW_BYTES: one halo box in shared memory
};

__device__ __forceinline__ ConvShape make_shape(int N, int P, int Q, int F, int C, int R, int S, int pad)
{
    ConvShape sh;
    sh.N = N; sh.P = P; sh.Q = Q; sh.F = F; sh.C = C; sh.R = R; sh.S = S; sh.pad = pad;
    sh.patches_p = (P + PATCH_P - 1) / PATCH_P;
    sh.patches_q = (Q + PATCH_Q - 1) / PATCH_Q;
    sh.patches = N * sh.patches_p * sh.patches_q;
    sh.c_chunks = (C + BOX_C - 1) / BOX_C;
    sh.k_blocks = R * S * sh.c_chunks;
    sh.boxes = sh.c_chunks * S;
    sh.box_bytes = (R + PATCH_P - 1) * HALO_ROW_BYTES;
    return sh;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 1: patches. Linear patch index -> image and the patch's first output row and column;
// patch columns vary fastest, so a CTA's three patches are neighbours along q (their halos overlap
// in L2) and consecutive CTAs walk along the image rows.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void patch_origin(int patch, const ConvShape& sh, int& n, int& p0, int& q0)
{
    const int per_image = sh.patches_p * sh.patches_q;
    n = patch / per_image;
    const int rest = patch - n * per_image;
    const int row = rest / sh.patches_q;
    p0 = row * PATCH_P;
    q0 = (rest - row * sh.patches_q) * PATCH_Q;
}

// Output pixel of accumulator / staged row m of a patch: core group m / 8 is patch row, line m % 8
// patch column (the A operand's 8-line groups are box rows, its lines consecutive input columns).
__device__ __forceinline__ void patch_pixel(int m, int& dp, int& dq)
{
    dp = m / PATCH_Q;
    dq = m % PATCH_Q;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 3: the K loop. K block kb = (tap r*S + s) * c_chunks + chunk, the order of w's inner
// dimensions; step i of a CTA's loop handles block rotated_k_block(i, first) = (i + first) mod
// k_blocks, whose tap the loops reach by next_k_block_tap from the tap of block first.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void k_block_tap(int kb, const ConvShape& sh, int& r, int& s, int& chunk)
{
    const int tap = kb / sh.c_chunks;
    chunk = kb - tap * sh.c_chunks;
    r = tap / sh.S;
    s = tap - r * sh.S;
}

__device__ __forceinline__ int rotated_k_block(int step, int first, int k_blocks)
{
    const int kb = step + first;
    return kb >= k_blocks ? kb - k_blocks : kb;
}

// The tap of the next step, from this step's: chunk fastest, then s, then r, and from the last K
// block back to block 0 -- k_block_tap(rotated_k_block(step + 1, ..)) without its two integer
// divisions, which would otherwise sit between a stage's arrival and the next TMA or wgmma.
__device__ __forceinline__ void next_k_block_tap(const ConvShape& sh, int& r, int& s, int& chunk)
{
    if (++chunk < sh.c_chunks)
        return;
    chunk = 0;
    if (++s < sh.S)
        return;
    s = 0;
    if (++r == sh.R)
        r = 0;
}

// ---------------------------------------------------------------------------------------------
// Mechanism 2: halos. Box (chunk, s) of a patch holds channels chunk*64 .. +63 of input rows
// p0 - pad .. p0 - pad + R + 6 and columns q0 - pad + s .. + 7 (tensor map coordinates, innermost
// first: channel, column, row, image); it sits at box index chunk * S + s of the consumer's slot.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int halo_box_index(int chunk, int s, const ConvShape& sh)
{
    return chunk * sh.S + s;
}

// Every box has an mbarrier of its own (consumer j's box b: barrier j * HALO_BOXES_MAX + b), so that a
// consumer's first K block waits for the one box it reads, not for the whole halo (30 KiB and 3 boxes
// on the headline). Each is used once per launch (phase 0): the producer's arrive announces
// box_bytes, the box's TMA delivers them.
__device__ __forceinline__ uint32_t halo_barrier(uint32_t halo_full, int consumer, int box)
{
    return halo_full + (consumer * HALO_BOXES_MAX + box) * MBARRIER_BYTES;
}

// The order in which a CTA's K loop first reads its boxes. K blocks are r-major over (s, chunk), and
// k_blocks = R * boxes, so any `boxes` consecutive steps of the rotated loop read every box exactly
// once: steps 0 .. boxes - 1 each read a box no earlier step read, and later steps only boxes read
// before. The producer issues the box of step i (for every patch) right after filter block i, and a
// consumer waits on that box's barrier at step i only.
__device__ __forceinline__ bool first_read_of_box(int step, const ConvShape& sh)
{
    return step < sh.boxes;
}

__device__ __forceinline__ void halo_box_coords(int chunk, int s, int p0, int q0, const ConvShape& sh, int& c, int& w,
                                                int& h)
{
    c = chunk * BOX_C;
    w = q0 - sh.pad + s;
    h = p0 - sh.pad;
}

// The A operand of tap (r, s), channel chunk `chunk`: box (chunk, s) from box row r on. Row m of
// the operand is then input pixel (p0 - pad + m / 8 + r, q0 - pad + m % 8 + s): 8-line groups
// (patch rows) HALO_ROW_BYTES = SBO apart, lines (patch columns) 128 bytes apart.
__device__ __forceinline__ uint32_t a_operand(uint32_t slot, int r, int s, int chunk, const ConvShape& sh)
{
    return slot + halo_box_index(chunk, s, sh) * sh.box_bytes + r * HALO_ROW_BYTES;
}

// ---------------------------------------------------------------------------------------------
// mbarrier primitives (shared::cta addresses).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, int arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(arrivals) : "memory");
}

// The producer announces how many bytes the TMA loads counted on `bar` will deliver, and arrives.
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
// TMA: one box (inner coordinate first) from global memory into shared memory; its bytes,
// out-of-bounds zeros included, count towards the transaction total of `bar`.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_descriptor(const TensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const TensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

// A barrier among the 128 threads of consumer warpgroup `consumer` only. The ids are compile-time
// constants, so ptxas reserves only the barriers actually used.
template <int ID>
__device__ __forceinline__ void named_barrier()
{
    asm volatile("bar.sync %0, %1;\n" :: "n"(ID), "n"(WARPGROUP_THREADS) : "memory");
}

__device__ __forceinline__ void warpgroup_barrier(int consumer)
{
    if (consumer == 0)
        named_barrier<WARPGROUP_BARRIER_BASE>();
    else if (consumer == 1)
        named_barrier<WARPGROUP_BARRIER_BASE + 1>();
    else
        named_barrier<WARPGROUP_BARRIER_BASE + 2>();
}

// ---------------------------------------------------------------------------------------------
// Mechanism 4: wgmma descriptors and instructions. A K-major fp16 operand written by TMA with the
// 128B swizzle: lines of 128 bytes, 8-line groups 1024 bytes apart (the stride byte offset); the K
// extent of one wgmma (16 fp16, 32 bytes) lies inside one line, so the leading byte offset is not
// used. The hardware applies the swizzle to the address bits, which is why advancing the start
// address by 32 bytes selects the next k16 slice of every line (DESC_K_STEP).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr)
{
    uint64_t desc = static_cast<uint64_t>((smem_addr & DESC_ADDR_MASK) >> 4);  // bits 0-13
    desc |= static_cast<uint64_t>(DESC_LBO_BYTES >> 4) << 16;                    // bits 16-29
    desc |= static_cast<uint64_t>(DESC_SBO_BYTES >> 4) << 32;                    // bits 32-45
    desc |= static_cast<uint64_t>(DESC_SWIZZLE_128B) << 62;                      // bits 62-63 (base offset 0)
    return desc;
}

// Order earlier register accesses of the accumulators before the wgmma that follow.
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

// Keep the compiler from moving accumulator reads or writes across the asynchronous MMAs.
__device__ __forceinline__ void fence_accumulators(float (&d)[ACC_REGS])
{
#pragma unroll
    for (int i = 0; i < ACC_REGS; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// D (64 x 128 fp32, per warpgroup) += A (64 x 16 fp16, K-major) * B (16 x 128 fp16, K-major), both
// read from shared memory; scale-d = 1 (accumulate), no negation, no transposes.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[ACC_REGS], uint64_t desc_a, uint64_t desc_b)
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
                 : "l"(desc_a), "l"(desc_b), "n"(1));
}

// ---------------------------------------------------------------------------------------------
// Mechanism 6: epilogue. In the wgmma m64nNk16 accumulator layout, warp w of the warpgroup holds
// rows 16 w .. 16 w + 15; accumulators 4 g + {0, 1} of lane l sit at row l / 4, columns
// 8 g + 2 (l % 4) + {0, 1} of the warp's rows, and 4 g + {2, 3} eight rows below.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ int accumulator_row(int warp, int lane)
{
    return warp * ROWS_PER_WARP + lane / 4;
}

__device__ __forceinline__ int accumulator_col(int group, int lane)
{
    return group * ACC_TILE_N + 2 * (lane % 4);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi)
{
    const __half2 v = __floats2half2_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Accumulators -> the warpgroup's padded [WGMMA_M][EPI_STRIDE] fp16 staging tile. The 8 rows of one
// store are 272 bytes (4 banks) apart, so the 32 lanes hit 32 different banks.
__device__ __forceinline__ void store_accumulators_to_shared(__half* stage, const float (&d)[ACC_REGS], int warp,
                                                             int lane)
{
    const int row = accumulator_row(warp, lane);
#pragma unroll
    for (int g = 0; g < ACC_REGS / 4; ++g) {
        const int col = accumulator_col(g, lane);
        *reinterpret_cast<uint32_t*>(stage + row * EPI_STRIDE + col) = pack_half2(d[4 * g], d[4 * g + 1]);
        *reinterpret_cast<uint32_t*>(stage + (row + ACC_ROW_HALF) * EPI_STRIDE + col) =
            pack_half2(d[4 * g + 2], d[4 * g + 3]);
    }
}

// Staged row (patch pixel) and column of a warpgroup thread's 16-byte chunk in pass p: thread t
// writes chunk t % 16 of row t / 16 + 8 p, so a warp writes two whole 256-byte pixels.
__device__ __forceinline__ void epilogue_chunk(int t, int p, int& row, int& col)
{
    const int id = t + p * WARPGROUP_THREADS;
    row = id / EPI_CHUNKS_PER_ROW;
    col = (id % EPI_CHUNKS_PER_ROW) * VEC;
}

// Element offset of y[n, p, q, f] (NHWC, 64-bit: N*P*Q*F may pass 2^31).
__device__ __forceinline__ long long output_offset(int n, int p, int q, int f, const ConvShape& sh)
{
    return ((static_cast<long long>(n) * sh.P + p) * sh.Q + q) * sh.F + f;
}

// 16-byte stores of the warpgroup's staged patch; rows of y are 16-byte aligned (F % 8 == 0), so a
// chunk is wholly inside F or wholly outside. Pixels past P or Q (edge patches) are not written.
__device__ __forceinline__ void store_tile_vectorized(const __half* stage, __half* y, const ConvShape& sh, int n,
                                                      int p0, int q0, int f0, int t)
{
#pragma unroll 4
    for (int pass = 0; pass < EPI_VEC_PASSES; ++pass) {
        int row, col, dp, dq;
        epilogue_chunk(t, pass, row, col);
        patch_pixel(row, dp, dq);
        const int p = p0 + dp;
        const int q = q0 + dq;
        const int f = f0 + col;
        if (p < sh.P && q < sh.Q && f < sh.F) {
            const uint4 v = *reinterpret_cast<const uint4*>(stage + row * EPI_STRIDE + col);
            *reinterpret_cast<uint4*>(y + output_offset(n, p, q, f, sh)) = v;
        }
    }
}

// Staged row and column of a warpgroup thread's element in pass p of the element-wise path: each
// warp stores 32 consecutive filters of one pixel.
__device__ __forceinline__ void epilogue_element(int t, int p, int& row, int& col)
{
    const int id = t + p * WARPGROUP_THREADS;
    row = id / BLOCK_N;
    col = id % BLOCK_N;
}

// Element-wise stores of the staged patch, for rows of y that are not 16-byte aligned.
__device__ __forceinline__ void store_tile_scalar(const __half* stage, __half* y, const ConvShape& sh, int n, int p0,
                                                  int q0, int f0, int t)
{
#pragma unroll 4
    for (int pass = 0; pass < EPI_SCALAR_PASSES; ++pass) {
        int row, col, dp, dq;
        epilogue_element(t, pass, row, col);
        patch_pixel(row, dp, dq);
        const int p = p0 + dp;
        const int q = q0 + dq;
        const int f = f0 + col;
        if (p < sh.P && q < sh.Q && f < sh.F)
            y[output_offset(n, p, q, f, sh)] = stage[row * EPI_STRIDE + col];
    }
}

// ---------------------------------------------------------------------------------------------
// The two roles.
// ---------------------------------------------------------------------------------------------
struct Pipeline {
    uint32_t halo;       // shared address of consumer 0's halo slot (1024-aligned); slot j at + j * HALO_SLOT_BYTES
    uint32_t ring;       // filter stage 0; stage s at ring + s * B_STAGE_BYTES
    uint32_t full;       // full barrier of stage 0; stage s at full + 8 s
    uint32_t empty;      // likewise for the empty barriers
    uint32_t halo_full;  // halo box barriers, HALO_BOXES_MAX per consumer (halo_barrier)
};

// Producer (one thread). The filter ring: wait until a stage is free, announce its bytes, issue
// the K block's box (filters f0.., channels chunk*64.., tap r*S + s; filters past F and channels
// past C become zeros). The halos: each box counted on its own barrier (halo_barrier).
struct RingCursor {
    int stage = 0;
    uint32_t phase = 0;
};

// The producer thread's index math, done before the block barrier (while thread 0 initialises the
// barriers) rather than between it and the first TMA: its patches' origins (those past the last
// patch are computed, never used) and the tap of its first K block.
struct ProducerPlan {
    int n[PATCHES_PER_CTA], p0[PATCHES_PER_CTA], q0[PATCHES_PER_CTA];
    int r, s, chunk;
};

__device__ __forceinline__ ProducerPlan plan_production(int first_patch, int first_k_block, const ConvShape& sh)
{
    ProducerPlan plan;
#pragma unroll
    for (int j = 0; j < PATCHES_PER_CTA; ++j) patch_origin(first_patch + j, sh, plan.n[j], plan.p0[j], plan.q0[j]);
    k_block_tap(first_k_block, sh, plan.r, plan.s, plan.chunk);
    return plan;
}

__device__ __forceinline__ void load_filter_block(const Pipeline& pipe, const TensorMap* map_w, const ConvShape& sh,
                                                  int r, int s, int chunk, int f0, RingCursor& ring)
{
    mbar_wait(pipe.empty + MBARRIER_BYTES * ring.stage, ring.phase ^ 1);  // the consumers released its last round
    const uint32_t full = pipe.full + MBARRIER_BYTES * ring.stage;
    mbar_arrive_expect_tx(full, B_STAGE_BYTES);
    tma_load_3d(pipe.ring + ring.stage * B_STAGE_BYTES, map_w, full, chunk * BOX_C, r * sh.S + s, f0);
    if (++ring.stage == STAGES) {
        ring.stage = 0;
        ring.phase ^= 1;
    }
}

// Box (chunk, s) of consumer j's patch (image n, origin p0, q0) into its place in the slot.
__device__ __forceinline__ void load_halo_box(const Pipeline& pipe, const TensorMap* map_x, const ConvShape& sh, int j,
                                              int n, int p0, int q0, int chunk, int s)
{
    const int box = halo_box_index(chunk, s, sh);
    const uint32_t bar = halo_barrier(pipe.halo_full, j, box);
    int c, w, h;
    halo_box_coords(chunk, s, p0, q0, sh, c, w, h);
    mbar_arrive_expect_tx(bar, sh.box_bytes);
    tma_load_4d(pipe.halo + j * HALO_SLOT_BYTES + box * sh.box_bytes, map_x, bar, c, w, h, n);
}

// Issue order = the consumers' order of need, so that the first MMAs wait for as few bytes as
// possible: filter block i (every consumer reads it), then, while step i is a box's first read, that
// box of patch 0, 1, 2 (consumer j's first K block needs 16 KiB + (j + 1) boxes of 10 KiB on the
// headline, not 16 KiB + (j + 1) whole halos of 30 KiB); the remaining filter blocks as stages free up.
// No box waits behind a ring stage while STAGES > boxes (the expert: 8 > 3).
__device__ __forceinline__ void produce(const Pipeline& pipe, const TensorMap* map_x, const TensorMap* map_w,
                                        const ConvShape& sh, const ProducerPlan& plan, int active, int f0)
{
    RingCursor ring;
    int r = plan.r, s = plan.s, chunk = plan.chunk;  // the tap of step 0: K block first_k_block
    for (int step = 0; step < sh.k_blocks; ++step) {
        load_filter_block(pipe, map_w, sh, r, s, chunk, f0, ring);
        if (first_read_of_box(step, sh)) {
#pragma unroll
            for (int j = 0; j < PATCHES_PER_CTA; ++j)
                if (j < active)
                    load_halo_box(pipe, map_x, sh, j, plan.n[j], plan.p0[j], plan.q0[j], chunk, s);
        }
        next_k_block_tap(sh, r, s, chunk);
    }
}

// Consumer warpgroup: for every K block wait for its halo box (at the box's first read only) and for
// its stage, issue K_STEPS wgmma (A: the tap's window of the halo; B: the stage), and release the
// previous stage once the MMAs reading it are done (one group stays in flight while the next stage
// is awaited). Every box is waited for by step boxes - 1, so the whole slot has landed before the
// epilogue reuses it.
__device__ __forceinline__ void consume(const Pipeline& pipe, float (&acc)[ACC_REGS], int consumer, int lane,
                                        const ConvShape& sh, int first_k_block)
{
    const uint32_t slot = pipe.halo + consumer * HALO_SLOT_BYTES;
    int stage = 0;
    uint32_t phase = 0;
    int previous = 0;
    int r, s, chunk;
    k_block_tap(first_k_block, sh, r, s, chunk);  // step 0; later steps by next_k_block_tap
    for (int step = 0; step < sh.k_blocks; ++step) {
        if (first_read_of_box(step, sh))  // later steps read only boxes already waited for
            mbar_wait(halo_barrier(pipe.halo_full, consumer, halo_box_index(chunk, s, sh)), 0);
        mbar_wait(pipe.full + MBARRIER_BYTES * stage, phase);
        const uint64_t desc_a = smem_descriptor(a_operand(slot, r, s, chunk, sh));
        const uint64_t desc_b = smem_descriptor(pipe.ring + stage * B_STAGE_BYTES);
        fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks)
            wgmma_m64n128k16(acc, desc_a + ks * DESC_K_STEP, desc_b + ks * DESC_K_STEP);
        wgmma_commit();
        fence_accumulators(acc);
        wgmma_wait<1>();  // the group of the previous K block has finished reading its stage
        if (step > 0 && lane == 0)
            mbar_arrive(pipe.empty + MBARRIER_BYTES * previous);
        previous = stage;
        next_k_block_tap(sh, r, s, chunk);
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
}

// ---------------------------------------------------------------------------------------------
// The kernel: one CTA of 3 consumer warpgroups and a producer warp per 3 patches x 128 filters;
// grid = (cdiv(patches, PATCHES_PER_CTA), cdiv(F, BLOCK_N)).
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
conv2d_implicit_wgmma(const __grid_constant__ TensorMap map_x, const __grid_constant__ TensorMap map_w,
                      __half* __restrict__ y, int N, int P, int Q, int F, int C, int R, int S, int pad)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const ConvShape sh = make_shape(N, P, Q, F, C, R, S, pad);

    const int tid = threadIdx.x;
    const int warpgroup = tid / WARPGROUP_THREADS;
    const int lane = tid % WARP_SIZE;
    const int first_patch = blockIdx.x * PATCHES_PER_CTA;
    const int active = min(PATCHES_PER_CTA, sh.patches - first_patch);  // consumers with a patch: 1 .. 3
    const int f0 = blockIdx.y * BLOCK_N;
    const int first_k_block = blockIdx.x % sh.k_blocks;

    // Halo slots and filter stages from the first 1024-byte boundary (whole swizzle patterns),
    // barriers after them.
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    Pipeline pipe;
    pipe.halo = (raw + SMEM_ALIGN - 1) & ~static_cast<uint32_t>(SMEM_ALIGN - 1);
    pipe.ring = pipe.halo + HALO_BYTES;
    pipe.full = pipe.ring + RING_BYTES;
    pipe.empty = pipe.full + MBARRIER_BYTES * STAGES;
    pipe.halo_full = pipe.empty + MBARRIER_BYTES * STAGES;

    ProducerPlan plan;  // see plan_production: before the block barrier, off the first TMA's path
    if (tid == CONSUMER_THREADS)
        plan = plan_production(first_patch, first_k_block, sh);

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(pipe.full + MBARRIER_BYTES * s, 1);  // the producer's arrive; TMA adds the bytes
            mbar_init(pipe.empty + MBARRIER_BYTES * s, active * WARPS_PER_WARPGROUP);  // one per active consumer warp
        }
        for (int b = 0; b < HALO_BARRIERS; ++b)  // the producer's arrive; TMA adds the box's bytes
            mbar_init(pipe.halo_full + MBARRIER_BYTES * b, 1);
        // Make the initialized barriers visible to the TMA unit (the async proxy) before any load.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        tma_prefetch_descriptor(&map_x);
        tma_prefetch_descriptor(&map_w);
    }
    __syncthreads();

    if (tid >= CONSUMER_THREADS) {
        if (tid == CONSUMER_THREADS)
            produce(pipe, &map_x, &map_w, sh, plan, active, f0);
        return;
    }

    const int consumer = warpgroup;  // patch first_patch + consumer
    if (consumer >= active)  // the last CTA may have fewer patches; its idle consumers are not counted
        return;
    const int t = tid - warpgroup * WARPGROUP_THREADS;  // thread within the warpgroup
    float acc[ACC_REGS];
#pragma unroll
    for (int i = 0; i < ACC_REGS; ++i) acc[i] = 0.0f;
    consume(pipe, acc, consumer, lane, sh, first_k_block);

    // Epilogue: every wgmma of this warpgroup has completed in the warp that waited for it; the
    // barrier makes sure no warp overwrites halo bytes that another warp's last MMAs still read.
    // Only this warpgroup ever reads its slot, so nothing else needs to wait.
    warpgroup_barrier(consumer);
    const uint32_t slot = pipe.halo + consumer * HALO_SLOT_BYTES;
    __half* staged = reinterpret_cast<__half*>(smem + (slot - raw));
    store_accumulators_to_shared(staged, acc, t / WARP_SIZE, lane);
    warpgroup_barrier(consumer);  // each warpgroup reads back only its own staged rows
    int n, p0, q0;
    patch_origin(first_patch + consumer, sh, n, p0, q0);
    const bool rows_aligned = (F % VEC == 0) && ((reinterpret_cast<uintptr_t>(y) % CHUNK_BYTES) == 0);
    if (rows_aligned)
        store_tile_vectorized(staged, y, sh, n, p0, q0, f0, t);
    else
        store_tile_scalar(staged, y, sh, n, p0, q0, f0, t);
}
