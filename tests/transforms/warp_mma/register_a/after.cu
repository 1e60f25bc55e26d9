// Golden case of warp_mma, register-A form: a warpgroup computes D (64 x 128, fp32) += A (64 x 16)
// B (16 x 128) with one wgmma that takes A from four registers per thread and B, in f16, from an
// MN-major tile in shared memory with the 128-byte swizzle (imm-trans-b = 1): each 128-byte line
// holds 64 columns of one k row, 8-row groups of k are 1024 bytes apart (SBO) and the second 64
// columns are one block of 16 k rows further (LBO).
#include <cstdint>
#include <cuda_fp16.h>

constexpr int ACC_REGS = 64;            // 64 x 128 fp32 over 128 threads
constexpr int BLOCK_BYTES = 16 * 128;   // 16 k rows of 64 columns

__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t smem_addr)
{
    uint64_t desc = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);  // start address, bits 0-13
    desc |= static_cast<uint64_t>(BLOCK_BYTES >> 4) << 16;                // next 64 columns: leading byte offset
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;                       // 8-row groups of k 1024 bytes apart
    desc |= static_cast<uint64_t>(1) << 62;                               // 128-byte swizzle
    return desc;
}

__device__ __forceinline__ void wgmma_fence()
{
    // scalarized asm volatile (clobbers "memory"): wgmma.fence.sync.aligned ;
    //     verbatim: asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    {
        ;  // no warpgroup MMA is left: nothing to order or wait for
    }
}

__device__ __forceinline__ void wgmma_commit()
{
    // scalarized asm volatile (clobbers "memory"): wgmma.commit_group.sync.aligned ;
    //     verbatim: asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    {
        ;  // no warpgroup MMA is left: nothing to order or wait for
    }
}

__device__ __forceinline__ void wgmma_wait_all()
{
    // scalarized asm volatile (clobbers "memory"): wgmma.wait_group.sync.aligned ;
    //     verbatim: asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    {
        ;  // no warpgroup MMA is left: nothing to order or wait for
    }
}

__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[ACC_REGS], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b)
{
    // scalarized asm volatile: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16
    //     {d[0 .. 63]}, {a0, a1, a2, a3}, desc_b, 1;
    //     verbatim: asm volatile("{\n"
    //     verbatim:              ".reg .pred accumulate;\n"
    //     verbatim:              "setp.ne.b32 accumulate, %69, 0;\n"
    //     verbatim:              "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
    //     verbatim:              "%0, %1, %2, %3, %4, %5, %6, %7, "
    //     verbatim:              "%8, %9, %10, %11, %12, %13, %14, %15, "
    //     verbatim:              "%16, %17, %18, %19, %20, %21, %22, %23, "
    //     verbatim:              "%24, %25, %26, %27, %28, %29, %30, %31, "
    //     verbatim:              "%32, %33, %34, %35, %36, %37, %38, %39, "
    //     verbatim:              "%40, %41, %42, %43, %44, %45, %46, %47, "
    //     verbatim:              "%48, %49, %50, %51, %52, %53, %54, %55, "
    //     verbatim:              "%56, %57, %58, %59, %60, %61, %62, %63}, "
    //     verbatim:              "{%64, %65, %66, %67}, %68, accumulate, 1, 1, 1;\n"
    //     verbatim:              "}\n"
    //     verbatim:              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
    //     verbatim:                "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
    //     verbatim:                "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
    //     verbatim:                "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
    //     verbatim:                "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
    //     verbatim:                "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
    //     verbatim:                "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
    //     verbatim:                "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
    //     verbatim:              : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "n"(1));
    {
        // This warp's 16 rows of the warpgroup's 64 x 128 tile with mma.sync: its accumulators
        // 4 j .. 4 j + 3 are the C fragment of the n8 tile j. A is in registers: wgmma's register-A
        // fragment in warp w is mma.m16n8k16's A fragment of rows 16 w .. 16 w + 15, used as it is.
        // B is an MN-major tile with the 128-byte swizzle, read through its descriptor (start address,
        // bits 0-13, in 16-byte units; k rows 128 bytes apart, 8-row groups of k the stride byte offset
        // apart, bits 32-45; 64-column blocks of n the leading byte offset apart, bits 16-29) and
        // transposed into B fragments by ldmatrix .trans.
        const unsigned long long wgmma_db = desc_b;
        if ((wgmma_db >> 62) != 1 || ((wgmma_db >> 49) & 7) != 0)
            __trap();  // another swizzle mode, or a base offset: not emulated
        auto wgmma_swizzle = [](unsigned wgmma_at) { return wgmma_at ^ (((wgmma_at >> 7) & 7) << 4); };
        const unsigned wgmma_b0 = static_cast<unsigned>(wgmma_db & 0x3FFF) << 4;
        const unsigned wgmma_lb = static_cast<unsigned>((wgmma_db >> 16) & 0x3FFF) << 4;
        const unsigned wgmma_sb = static_cast<unsigned>((wgmma_db >> 32) & 0x3FFF) << 4;
        const unsigned wgmma_lane = threadIdx.x & 31;
        const unsigned wgmma_af[4] = {a0, a1, a2, a3};  // a0 .. a7, two per register
        if ((1) == 0) {  // scale-d = 0: D = A B
#pragma unroll
            for (int wgmma_i = 0; wgmma_i < 64; ++wgmma_i) d[wgmma_i] = 0.0f;
        }
        // lanes 8 m .. 8 m + 7 address the 8 k rows of matrix m: k 0-7 (m even) or 8-15 (m odd)
        const unsigned wgmma_k = (wgmma_lane & 7) + (((wgmma_lane >> 3) & 1) << 3);
#pragma unroll
        for (int wgmma_j = 0; wgmma_j < 16; wgmma_j += 2) {  // n8 tiles j and j + 1
            const unsigned wgmma_n = 8 * wgmma_j + ((wgmma_lane >> 4) << 3);  // matrices 0, 1: tile j; 2, 3: j + 1
            unsigned wgmma_bf[4];  // b0, b1 of tile j, then of tile j + 1
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(wgmma_bf[0]), "=r"(wgmma_bf[1]), "=r"(wgmma_bf[2]), "=r"(wgmma_bf[3])
                         : "r"(wgmma_swizzle(wgmma_b0 + (wgmma_k >> 3) * wgmma_sb + (wgmma_k & 7) * 128 + (wgmma_n >> 6) * wgmma_lb + (wgmma_n & 63) * 2)));
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[4 * wgmma_j + 0]), "+f"(d[4 * wgmma_j + 1]), "+f"(d[4 * wgmma_j + 2]), "+f"(d[4 * wgmma_j + 3])
                         : "r"(wgmma_af[0]), "r"(wgmma_af[1]), "r"(wgmma_af[2]), "r"(wgmma_af[3]), "r"(wgmma_bf[0]), "r"(wgmma_bf[1]));
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[4 * (wgmma_j + 1) + 0]), "+f"(d[4 * (wgmma_j + 1) + 1]), "+f"(d[4 * (wgmma_j + 1) + 2]), "+f"(d[4 * (wgmma_j + 1) + 3])
                         : "r"(wgmma_af[0]), "r"(wgmma_af[1]), "r"(wgmma_af[2]), "r"(wgmma_af[3]), "r"(wgmma_bf[2]), "r"(wgmma_bf[3]));
        }
    }
}

extern "C" __global__ void kernel(float* out)
{
    __shared__ __align__(1024) __half b[2 * 16 * 64];
    for (int i = threadIdx.x; i < 2 * 16 * 64; i += blockDim.x) b[i] = __float2half(static_cast<float>(i % 5));
    __syncthreads();
    uint32_t a[4];
    for (int r = 0; r < 4; ++r) {
        const __half2 v = __floats2half2_rn(static_cast<float>(threadIdx.x % 3), static_cast<float>(r));
        a[r] = *reinterpret_cast<const uint32_t*>(&v);
    }
    float d[ACC_REGS];
    for (int i = 0; i < ACC_REGS; ++i) d[i] = 0.0f;
    wgmma_fence();
    wgmma_m64n128k16_rs(d, a[0], a[1], a[2], a[3],
                        mn_major_descriptor(static_cast<uint32_t>(__cvta_generic_to_shared(b))));
    wgmma_commit();
    wgmma_wait_all();
    for (int i = 0; i < ACC_REGS; ++i) out[threadIdx.x * ACC_REGS + i] = d[i];
}
