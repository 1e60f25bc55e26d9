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

__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[ACC_REGS], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b)
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
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "n"(1));
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
