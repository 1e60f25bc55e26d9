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
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_wait_all()
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[ACC_REGS], uint64_t desc_a, uint64_t desc_b)
{
    asm volatile("{\n"
                 ".reg .pred accumulate;\n"
                 "setp.ne.b32 accumulate, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, accumulate, 1, 1, 0, 0;\n"
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(desc_a), "l"(desc_b), "n"(0));
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
