// GEMM y = x @ W.T in bf16 with fp32 accumulation on Hopper: warpgroup MMA (wgmma) fed by the
// tensor memory accelerator (TMA), for shapes where K % 8 == 0 (every row of x and W then starts on
// a 16-byte boundary, which a TMA tensor map needs of its row stride).
//
// x is [M, K] row-major and W is [N, K] row-major, so both operands are K-major: x is the A operand
// of wgmma as stored, and W, read as a K x N column-major matrix, is the B operand as stored; neither
// needs the wgmma transpose bits.
//
// Mechanisms, each in its own helper below:
//   1. Warpgroup MMA: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 with both operands read
//      from shared memory through 64-bit matrix descriptors (wgmma_m64n256k16, smem_descriptor);
//      wgmma.fence / commit_group / wait_group keep one k-tile of MMAs in flight while the next
//      k-tile's barrier is awaited.
//   2. TMA loads: cp.async.bulk.tensor.2d global -> shared, one instruction per operand tile per
//      stage (tma_load_2d), described by tensor maps the launch plan builds (cuTensorMapEncodeTiled)
//      and passes as __grid_constant__ parameters. Rows and columns outside M, N or K arrive as
//      zeros (the map's out-of-bounds fill), so edge tiles need no separate code.
//   3. 128-byte swizzled shared tiles: a tile row is BLOCK_K bf16 = 128 bytes, and TMA stores
//      16-byte chunk c of row r at chunk position c ^ (r % 8) (tensor map swizzle 128B). The wgmma
//      descriptors declare the same 128B swizzle mode, so the MMA reads what TMA wrote, without
//      bank conflicts and without padding. Tiles start on 1024-byte boundaries (8 rows of 128
//      bytes, one whole swizzle pattern), so the descriptors' base offset is 0.
//   4. mbarrier pipeline: STAGES shared buffers, each with a "full" barrier (the producer's
//      arrive.expect_tx plus the TMA's complete_tx bytes) and an "empty" barrier (one arrive per
//      consumer warp once its MMAs on the stage have completed). Phases alternate parity per
//      round through the stages (mbar_wait).
//   5. Warp specialization: warpgroup 0 is the producer (one thread issues every TMA) and lowers
//      its register budget with setmaxnreg.dec; warpgroups 1 and 2 are consumers, each owning
//      WG_M = 64 rows of the CTA tile (a 64 x 256 fp32 accumulator, 128 registers per thread),
//      and raise theirs with setmaxnreg.inc.
//   6. Block-order swizzle (tile_coordinates): grouped rasterization, GROUP_M tile rows at a time,
//      so that CTAs resident together share x tile rows and W tile columns in L2.
//   7. Vectorized epilogue (store_accumulators_to_shared, store_tile_vectorized): accumulators are
//      rounded to bf16, packed in pairs, staged through padded shared memory (the pipeline
//      buffers, once every MMA has finished) and written to y with 16-byte coalesced stores,
//      bounds-checked per row and chunk. Where rows of y are not 16-byte aligned (N % 8 != 0)
//      the staged tile is written element by element (store_tile_scalar).
//
// Domain: K % 8 == 0 (declared in launch.toml). A tensor map's row stride (K * 2 bytes) must be a
// multiple of 16. M and N are arbitrary.

#include <cuda_bf16.h>
#include <cstdint>

// ---------------------------------------------------------------------------------------------
// Tiling, pipeline and warp-role constants
// ---------------------------------------------------------------------------------------------
constexpr int BLOCK_M = 128;                        // CTA tile rows (of x and y)
constexpr int BLOCK_N = 256;                        // CTA tile columns (rows of W, columns of y)
constexpr int BLOCK_K = 64;                         // K slice per pipeline stage: 128 bytes of bf16
constexpr int STAGES = 4;                           // shared-memory pipeline depth
constexpr int WARP_SIZE = 32;
constexpr int WARPGROUP_THREADS = 128;              // 4 warps issue one wgmma together
constexpr int PRODUCER_WARPGROUPS = 1;
constexpr int CONSUMER_WARPGROUPS = 2;
constexpr int THREADS = (PRODUCER_WARPGROUPS + CONSUMER_WARPGROUPS) * WARPGROUP_THREADS;  // 384
constexpr int CONSUMER_THREADS = CONSUMER_WARPGROUPS * WARPGROUP_THREADS;                 // 256
constexpr int CONSUMER_WARPS = CONSUMER_THREADS / WARP_SIZE;                               // 8
constexpr int WG_M = BLOCK_M / CONSUMER_WARPGROUPS; // 64 rows per consumer warpgroup
constexpr int WGMMA_M = 64;                         // wgmma .m64nNk16: M is fixed at 64 per warpgroup
constexpr int WGMMA_N = BLOCK_N;                    // one wgmma covers the whole tile width
constexpr int WGMMA_K = 16;                         // bf16 wgmma consumes K in steps of 16
constexpr int K_STEPS = BLOCK_K / WGMMA_K;          // 4 wgmma per stage per consumer warpgroup
constexpr int ACC_REGS = WGMMA_M * WGMMA_N / WARPGROUP_THREADS;  // 128 fp32 accumulators per thread
constexpr int ACC_TILE_N = 8;                       // accumulators come in 8-column groups of 4 registers
constexpr int ACC_ROW_HALF = 8;                     // registers 2, 3 of a group sit 8 rows below 0, 1
constexpr int ROWS_PER_WARP = 16;                   // a warp's share of the 64 accumulator rows
constexpr int ELEMENT_BYTES = 2;                    // bf16
constexpr int ROW_BYTES = BLOCK_K * ELEMENT_BYTES;  // 128: one tile row is one swizzle span
constexpr int SWIZZLE_BYTES = 128;                  // tensor map swizzle 128B = wgmma swizzle mode 1
constexpr int SWIZZLE_ROWS = 8;                     // the XOR pattern repeats every 8 rows
constexpr int SWIZZLE_ATOM_BYTES = SWIZZLE_ROWS * SWIZZLE_BYTES;  // 1024: tiles align to this
constexpr int A_STAGE_BYTES = BLOCK_M * ROW_BYTES;  // 16 KiB of x per stage
constexpr int B_STAGE_BYTES = BLOCK_N * ROW_BYTES;  // 32 KiB of W per stage
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;  // what one stage's TMA loads deliver
constexpr int WG_A_BYTES = WG_M * ROW_BYTES;        // 8 KiB: offset of consumer 1's rows in an A stage
constexpr int PIPELINE_BYTES = STAGES * STAGE_BYTES;       // 192 KiB
constexpr int BARRIER_BYTES = 2 * STAGES * 8;              // a full and an empty mbarrier per stage
constexpr int SMEM_ALIGN = SWIZZLE_ATOM_BYTES;             // the base is rounded up to this at run time
constexpr int SMEM_BYTES = SMEM_ALIGN + PIPELINE_BYTES + BARRIER_BYTES;  // the plan's dynamic shared memory
constexpr int PRODUCER_REGS = 40;                   // setmaxnreg.dec: the producer needs few registers
constexpr int CONSUMER_REGS = 232;                  // setmaxnreg.inc: 128 accumulators plus addressing
constexpr int GROUP_M = 8;                          // tile rows per rasterization group
// wgmma shared-memory matrix descriptor fields (PTX ISA, "matrix descriptor format")
constexpr int DESC_ADDR_MASK = 0x3FFFF;             // 18 address bits, stored >> 4 in bits 0-13
constexpr int DESC_LBO_BYTES = 16;                  // leading byte offset: unused by swizzled K-major tiles
constexpr int DESC_SBO_BYTES = SWIZZLE_ATOM_BYTES;  // stride byte offset: 8-row groups are 1024 bytes apart
constexpr int DESC_SWIZZLE_128B = 1;                // bits 62-63: 1 = 128-byte swizzle
constexpr int DESC_K_STEP = WGMMA_K * ELEMENT_BYTES >> 4;  // +2 in the address field per k16 step (32 bytes)
// Epilogue
constexpr int VEC = 8;                              // bf16 per 16-byte chunk
constexpr int CHUNK_BYTES = 16;
constexpr int EPI_PAD = 8;                          // bf16 of padding per staged output row
constexpr int EPI_STRIDE = BLOCK_N + EPI_PAD;       // 264 bf16 = 528 bytes per staged row
constexpr int EPI_WG_BYTES = WG_M * EPI_STRIDE * ELEMENT_BYTES;  // 33 KiB staging per consumer warpgroup
constexpr int EPI_CHUNKS_PER_ROW = BLOCK_N / VEC;  // 32 16-byte chunks per output tile row
constexpr int EPI_VEC_PASSES = WG_M * EPI_CHUNKS_PER_ROW / WARPGROUP_THREADS;  // 16
constexpr int EPI_SCALAR_PASSES = WG_M * BLOCK_N / WARPGROUP_THREADS;          // 128
// Named barriers (0 is __syncthreads): all consumers, then one per consumer warpgroup.
constexpr int CONSUMERS_BARRIER = 1;
constexpr int WARPGROUP_BARRIER_BASE = 2;

static_assert(ROW_BYTES == SWIZZLE_BYTES, "a tile row must be exactly one 128-byte swizzle span");
static_assert(WG_M == WGMMA_M, "each consumer warpgroup owns one wgmma M extent");
static_assert(BLOCK_N % 8 == 0 && BLOCK_N <= 256, "wgmma N is a multiple of 8 up to 256");
static_assert(BLOCK_M <= 256 && BLOCK_N <= 256 && BLOCK_K * ELEMENT_BYTES <= SWIZZLE_BYTES,
              "a TMA box is at most 256 per dimension and its inner extent fits the swizzle span");
static_assert(A_STAGE_BYTES % SWIZZLE_ATOM_BYTES == 0 && B_STAGE_BYTES % SWIZZLE_ATOM_BYTES == 0 &&
              WG_A_BYTES % SWIZZLE_ATOM_BYTES == 0, "every tile starts on a whole swizzle pattern");
static_assert(ACC_REGS == WGMMA_N / ACC_TILE_N * 4, "4 accumulators per 8-column group");
static_assert(CONSUMER_WARPGROUPS * EPI_WG_BYTES <= PIPELINE_BYTES, "the staged output fits in the pipeline buffers");
static_assert((EPI_STRIDE * ELEMENT_BYTES) % CHUNK_BYTES == 0, "staged rows keep 16-byte alignment");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0, "setmaxnreg counts are multiples of 8");
static_assert(PRODUCER_WARPGROUPS * WARPGROUP_THREADS * PRODUCER_REGS +
              CONSUMER_WARPGROUPS * WARPGROUP_THREADS * CONSUMER_REGS <= 65536,
              "the rebalanced register budgets fit the SM's register file");
static_assert(STAGES >= 2, "a pipeline needs at least two stages");
static_assert(SMEM_BYTES <= 232448, "fits the 227 KiB of shared memory a Hopper block may opt into");

using bf16 = __nv_bfloat16;

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
// Mechanism 2: TMA. One 2-D box (inner coordinate first) from global memory into shared memory;
// its bytes count towards the transaction total of `bar`.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_descriptor(const TensorMap* map)
{
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TensorMap* map, uint32_t bar, int inner, int outer)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
                 : "memory");
}

// ---------------------------------------------------------------------------------------------
// Mechanism 5: register rebalancing between the warp roles (every thread of a warpgroup executes it).
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

// A barrier among COUNT threads only, so that one role can synchronize without the other. The id is
// a compile-time constant, so ptxas reserves only the barriers actually used.
template <int ID, int COUNT>
__device__ __forceinline__ void named_barrier()
{
    asm volatile("bar.sync %0, %1;\n" :: "n"(ID), "n"(COUNT) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Mechanisms 1 and 3: wgmma descriptors and instructions.
// A K-major bf16 tile of rows x 64 written by TMA with the 128B swizzle: rows are 128 bytes, 8-row
// groups 1024 bytes apart (the stride byte offset); the K extent of one wgmma (16 bf16, 32 bytes)
// lies inside one swizzle span, so the leading byte offset is not used. The hardware applies the
// swizzle to the address bits, which is why advancing the start address by 32 bytes selects the
// next k16 slice of every row (DESC_K_STEP).
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

// D (64 x 256 fp32, per warpgroup) += A (64 x 16 bf16, K-major) * B (16 x 256 bf16, K-major), both
// read from shared memory; scale-d = 1 (accumulate), no negation, no transposes.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[ACC_REGS], uint64_t desc_a, uint64_t desc_b)
{
    asm volatile("{\n"
                 ".reg .pred accumulate;\n"
                 "setp.ne.b32 accumulate, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, "
                 "%8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, "
                 "%24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, "
                 "%40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, "
                 "%56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, "
                 "%72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, "
                 "%88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, "
                 "%104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, "
                 "%120, %121, %122, %123, %124, %125, %126, %127}, "
                 "%128, %129, accumulate, 1, 1, 0, 0;\n"
                 "}\n"
                 :
                   "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "n"(1));
}

// ---------------------------------------------------------------------------------------------
// Mechanism 6: block-order swizzle. Linear block id -> (tile row, tile column): column-major
// inside groups of GROUP_M tile rows, so consecutive blocks walk down GROUP_M rows of x tiles
// before moving to the next W tile column. The last group may have fewer rows.
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
// Mechanism 7: epilogue. In the wgmma m64nNk16 accumulator layout, warp w of the warpgroup holds
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

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even, lo in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Accumulators -> the warpgroup's padded [WG_M][EPI_STRIDE] bf16 staging tile. The 8 rows of one
// store are 528 bytes (4 banks) apart, so the 32 lanes hit 32 different banks.
__device__ __forceinline__ void store_accumulators_to_shared(bf16* stage, const float (&d)[ACC_REGS], int warp, int lane)
{
    const int row = accumulator_row(warp, lane);
#pragma unroll
    for (int g = 0; g < ACC_REGS / 4; ++g) {
        const int col = accumulator_col(g, lane);
        *reinterpret_cast<uint32_t*>(stage + row * EPI_STRIDE + col) = pack_bf16x2(d[4 * g], d[4 * g + 1]);
        *reinterpret_cast<uint32_t*>(stage + (row + ACC_ROW_HALF) * EPI_STRIDE + col) =
            pack_bf16x2(d[4 * g + 2], d[4 * g + 3]);
    }
}

// Staged row and column of a warpgroup thread's 16-byte chunk in pass p: thread t writes chunk
// t % 32 of row t / 32 + 4 p, so each warp writes one 512-byte row segment.
__device__ __forceinline__ void epilogue_chunk(int t, int p, int& row, int& col)
{
    const int id = t + p * WARPGROUP_THREADS;
    row = id / EPI_CHUNKS_PER_ROW;
    col = (id % EPI_CHUNKS_PER_ROW) * VEC;
}

// 16-byte stores of the warpgroup's staged rows; rows of y must be 16-byte aligned (N % 8 == 0), so
// a chunk is wholly inside N or wholly outside.
__device__ __forceinline__ void store_tile_vectorized(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int t)
{
#pragma unroll 4
    for (int p = 0; p < EPI_VEC_PASSES; ++p) {
        int row, col;
        epilogue_chunk(t, p, row, col);
        const int gm = m0 + row;
        const int gn = n0 + col;
        if (gm < M && gn < N) {
            const uint4 v = *reinterpret_cast<const uint4*>(stage + row * EPI_STRIDE + col);
            *reinterpret_cast<uint4*>(y + static_cast<long long>(gm) * N + gn) = v;
        }
    }
}

// Element-wise stores of the staged rows, for rows of y that are not 16-byte aligned.
__device__ __forceinline__ void store_tile_scalar(const bf16* stage, bf16* y, int M, int N, int m0, int n0, int t)
{
#pragma unroll 4
    for (int p = 0; p < EPI_SCALAR_PASSES; ++p) {
        const int id = t + p * WARPGROUP_THREADS;
        const int row = id / BLOCK_N;
        const int col = id % BLOCK_N;
        const int gm = m0 + row;
        const int gn = n0 + col;
        if (gm < M && gn < N)
            y[static_cast<long long>(gm) * N + gn] = stage[row * EPI_STRIDE + col];
    }
}

// ---------------------------------------------------------------------------------------------
// The two roles.
// ---------------------------------------------------------------------------------------------
struct Pipeline {
    uint32_t tiles;  // shared address of stage 0 (1024-byte aligned); stage s at tiles + s * STAGE_BYTES
    uint32_t full;   // shared address of full barrier 0; barrier s at full + 8 s
    uint32_t empty;  // likewise for the empty barriers
};

// Producer (one thread): for every K tile, wait until its stage is free, announce the bytes and
// issue the two TMA loads (x rows m0.., W rows n0.., columns k0..; out-of-bounds parts become zeros).
__device__ __forceinline__ void produce(const Pipeline& pipe, const TensorMap* map_x, const TensorMap* map_w,
                                        int m0, int n0, int k_tiles)
{
    int stage = 0;
    uint32_t phase = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mbar_wait(pipe.empty + 8 * stage, phase ^ 1);  // the consumers released this stage's last round
        const uint32_t full = pipe.full + 8 * stage;
        const uint32_t a_tile = pipe.tiles + stage * STAGE_BYTES;
        mbar_arrive_expect_tx(full, STAGE_BYTES);
        tma_load_2d(a_tile, map_x, full, kt * BLOCK_K, m0);
        tma_load_2d(a_tile + A_STAGE_BYTES, map_w, full, kt * BLOCK_K, n0);
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
}

// Consumer warpgroup: for every K tile, wait for its stage, issue K_STEPS wgmma on its 64 rows of
// x and all 256 rows of W, and release the previous stage once the MMAs reading it are done (one
// group stays in flight while the next stage is awaited).
__device__ __forceinline__ void consume(const Pipeline& pipe, float (&acc)[ACC_REGS], int consumer, int lane,
                                        int k_tiles)
{
    int stage = 0;
    uint32_t phase = 0;
    int previous = 0;
    for (int kt = 0; kt < k_tiles; ++kt) {
        mbar_wait(pipe.full + 8 * stage, phase);
        const uint32_t a_tile = pipe.tiles + stage * STAGE_BYTES + consumer * WG_A_BYTES;
        const uint64_t desc_a = smem_descriptor(a_tile);
        const uint64_t desc_b = smem_descriptor(pipe.tiles + stage * STAGE_BYTES + A_STAGE_BYTES);
        fence_accumulators(acc);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks)
            wgmma_m64n256k16(acc, desc_a + ks * DESC_K_STEP, desc_b + ks * DESC_K_STEP);
        wgmma_commit();
        fence_accumulators(acc);
        wgmma_wait<1>();  // the group of K tile kt - 1 has finished reading its stage
        if (kt > 0 && lane == 0)
            mbar_arrive(pipe.empty + 8 * previous);
        previous = stage;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
    wgmma_wait<0>();
    fence_accumulators(acc);
}

// ---------------------------------------------------------------------------------------------
// The kernel: one CTA of 3 warpgroups per BLOCK_M x BLOCK_N output tile; grid = tiles_m * tiles_n (1-D).
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
gemm_bf16_wgmma_tma(const __grid_constant__ TensorMap map_x, const __grid_constant__ TensorMap map_w,
                    bf16* __restrict__ y, int M, int N, int K)
{
    extern __shared__ __align__(1024) unsigned char smem[];

    const int tid = threadIdx.x;
    const int warpgroup = tid / WARPGROUP_THREADS;
    const int lane = tid % WARP_SIZE;

    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M;
    const int tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    int tile_m, tile_n;
    tile_coordinates(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);
    const int m0 = tile_m * BLOCK_M;
    const int n0 = tile_n * BLOCK_N;
    const int k_tiles = (K + BLOCK_K - 1) / BLOCK_K;

    // Stages from the first 1024-byte boundary (whole swizzle patterns), barriers after them.
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    Pipeline pipe;
    pipe.tiles = (raw + SMEM_ALIGN - 1) & ~static_cast<uint32_t>(SMEM_ALIGN - 1);
    pipe.full = pipe.tiles + PIPELINE_BYTES;
    pipe.empty = pipe.full + 8 * STAGES;

    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(pipe.full + 8 * s, 1);                // the producer's arrive; TMA adds the bytes
            mbar_init(pipe.empty + 8 * s, CONSUMER_WARPS);  // one arrive per consumer warp
        }
        // Make the initialized barriers visible to the TMA unit (the async proxy) before any load.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        tma_prefetch_descriptor(&map_x);
        tma_prefetch_descriptor(&map_w);
    }
    __syncthreads();

    if (warpgroup == 0) {
        release_registers<PRODUCER_REGS>();
        if (tid == 0)
            produce(pipe, &map_x, &map_w, m0, n0, k_tiles);
        return;
    }

    claim_registers<CONSUMER_REGS>();
    const int consumer = warpgroup - PRODUCER_WARPGROUPS;  // 0 or 1: rows consumer * WG_M .. of the tile
    const int t = tid - warpgroup * WARPGROUP_THREADS;       // thread within the warpgroup
    float acc[ACC_REGS];
#pragma unroll
    for (int i = 0; i < ACC_REGS; ++i) acc[i] = 0.0f;
    consume(pipe, acc, consumer, lane, k_tiles);

    // Epilogue: every MMA of both consumers has finished reading the pipeline buffers before any
    // thread overwrites them with staged output.
    named_barrier<CONSUMERS_BARRIER, CONSUMER_THREADS>();
    bf16* staged = reinterpret_cast<bf16*>(smem + (pipe.tiles - raw) + consumer * EPI_WG_BYTES);
    store_accumulators_to_shared(staged, acc, t / WARP_SIZE, lane);
    if (consumer == 0)  // each warpgroup reads back only its own staged rows
        named_barrier<WARPGROUP_BARRIER_BASE, WARPGROUP_THREADS>();
    else
        named_barrier<WARPGROUP_BARRIER_BASE + 1, WARPGROUP_THREADS>();
    const int rows_m0 = m0 + consumer * WG_M;
    const bool rows_aligned = (N % VEC == 0) && ((reinterpret_cast<uintptr_t>(y) % CHUNK_BYTES) == 0);
    if (rows_aligned)
        store_tile_vectorized(staged, y, M, N, rows_m0, n0, t);
    else
        store_tile_scalar(staged, y, M, N, rows_m0, n0, t);
}
