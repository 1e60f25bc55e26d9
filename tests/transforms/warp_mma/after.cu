// Golden case of warp_mma: a warpgroup computes D (64 x 16, fp32) = A (64 x 16) B (16 x 16) with one
// wgmma whose bf16 operands are K-major tiles in shared memory with the 128-byte swizzle.
#include <cstdint>
#include <cuda_bf16.h>

constexpr int ACC_REGS = 8;  // 64 x 16 fp32 over 128 threads

__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr)
{
    uint64_t desc = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);  // start address, bits 0-13
    desc |= static_cast<uint64_t>(1024 >> 4) << 32;                       // 8-row groups 1024 bytes apart
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

__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[ACC_REGS], uint64_t desc_a, uint64_t desc_b)
{
    // scalarized asm volatile: wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {d[0 .. 7]}, desc_a, desc_b, 0;
    //     verbatim: asm volatile("{\n"
    //     verbatim:              ".reg .pred accumulate;\n"
    //     verbatim:              "setp.ne.b32 accumulate, %10, 0;\n"
    //     verbatim:              "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
    //     verbatim:              "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, accumulate, 1, 1, 0, 0;\n"
    //     verbatim:              "}\n"
    //     verbatim:              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
    //     verbatim:              : "l"(desc_a), "l"(desc_b), "n"(0));
    {
        // This warp's 16 rows of the warpgroup's 64 x 16 tile with mma.sync: its accumulators
        // 4 j .. 4 j + 3 are the C fragment of the n8 tile j. Both operands are K-major tiles with the
        // 128-byte swizzle, read through their descriptors (start address, bits 0-13, in 16-byte units;
        // 8-row groups the stride byte offset apart, bits 32-45; rows of a group 128 bytes apart).
        const unsigned long long wgmma_da = desc_a;
        const unsigned long long wgmma_db = desc_b;
        if ((wgmma_da >> 62) != 1 || (wgmma_db >> 62) != 1 || ((wgmma_da >> 49) & 7) != 0 || ((wgmma_db >> 49) & 7) != 0)
            __trap();  // another swizzle mode, or a base offset: not emulated
        auto wgmma_swizzle = [](unsigned wgmma_at) { return wgmma_at ^ (((wgmma_at >> 7) & 7) << 4); };
        const unsigned wgmma_a0 = static_cast<unsigned>(wgmma_da & 0x3FFF) << 4;
        const unsigned wgmma_b0 = static_cast<unsigned>(wgmma_db & 0x3FFF) << 4;
        const unsigned wgmma_sa = static_cast<unsigned>((wgmma_da >> 32) & 0x3FFF) << 4;
        const unsigned wgmma_sb = static_cast<unsigned>((wgmma_db >> 32) & 0x3FFF) << 4;
        const unsigned wgmma_lane = threadIdx.x & 31;
        const unsigned wgmma_row0 = 16 * ((threadIdx.x >> 5) & 3);  // warp w of the warpgroup: rows 16 w ..
        if ((0) == 0) {  // scale-d = 0: D = A B
#pragma unroll
            for (int wgmma_i = 0; wgmma_i < 8; ++wgmma_i) d[wgmma_i] = 0.0f;
        }
        unsigned wgmma_af[4];  // A rows 16 w + (l % 16), k = 8 (l / 16) .. + 7: matrices a0 .. a3
        {
            const unsigned wgmma_r = wgmma_row0 + (wgmma_lane & 15);
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(wgmma_af[0]), "=r"(wgmma_af[1]), "=r"(wgmma_af[2]), "=r"(wgmma_af[3])
                         : "r"(wgmma_swizzle(wgmma_a0 + (wgmma_r >> 3) * wgmma_sa + (wgmma_r & 7) * 128 + (wgmma_lane >> 4) * 16)));
        }
#pragma unroll
        for (int wgmma_j = 0; wgmma_j < 2; wgmma_j += 2) {  // n8 tiles j and j + 1
            const unsigned wgmma_r = 8 * wgmma_j + (wgmma_lane & 7) + ((wgmma_lane >> 4) << 3);
            unsigned wgmma_bf[4];  // b0, b1 of tile j, then of tile j + 1
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(wgmma_bf[0]), "=r"(wgmma_bf[1]), "=r"(wgmma_bf[2]), "=r"(wgmma_bf[3])
                         : "r"(wgmma_swizzle(wgmma_b0 + (wgmma_r >> 3) * wgmma_sb + (wgmma_r & 7) * 128 + ((wgmma_lane >> 3) & 1) * 16)));
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[4 * wgmma_j + 0]), "+f"(d[4 * wgmma_j + 1]), "+f"(d[4 * wgmma_j + 2]), "+f"(d[4 * wgmma_j + 3])
                         : "r"(wgmma_af[0]), "r"(wgmma_af[1]), "r"(wgmma_af[2]), "r"(wgmma_af[3]), "r"(wgmma_bf[0]), "r"(wgmma_bf[1]));
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(d[4 * (wgmma_j + 1) + 0]), "+f"(d[4 * (wgmma_j + 1) + 1]), "+f"(d[4 * (wgmma_j + 1) + 2]), "+f"(d[4 * (wgmma_j + 1) + 3])
                         : "r"(wgmma_af[0]), "r"(wgmma_af[1]), "r"(wgmma_af[2]), "r"(wgmma_af[3]), "r"(wgmma_bf[2]), "r"(wgmma_bf[3]));
        }
    }
}

extern "C" __global__ void kernel(float* out)
{
    __shared__ __align__(1024) __nv_bfloat16 a[64 * 64];
    __shared__ __align__(1024) __nv_bfloat16 b[16 * 64];
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) a[i] = __float2bfloat16(static_cast<float>(i % 7));
    for (int i = threadIdx.x; i < 16 * 64; i += blockDim.x) b[i] = __float2bfloat16(static_cast<float>(i % 5));
    __syncthreads();
    float d[ACC_REGS];
    wgmma_fence();
    wgmma_m64n16k16(d, smem_descriptor(static_cast<uint32_t>(__cvta_generic_to_shared(a))),
                    smem_descriptor(static_cast<uint32_t>(__cvta_generic_to_shared(b))));
    wgmma_commit();
    wgmma_wait_all();
    for (int i = 0; i < ACC_REGS; ++i) out[threadIdx.x * ACC_REGS + i] = d[i];
}
