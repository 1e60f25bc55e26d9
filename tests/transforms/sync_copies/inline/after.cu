// Transpose of a 32 x 32 fp32 tile per block: each thread copies one element into shared memory
// with a 4-byte cp.async.ca, waits for its copy, and after the barrier writes the element its
// mirror thread copied.
#include <cstdint>

constexpr int TILE = 32;

extern "C" __global__ void __launch_bounds__(TILE * TILE)
kernel(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ float tile[TILE][TILE + 1];
    const int tx = threadIdx.x % TILE;
    const int ty = threadIdx.x / TILE;
    const float* src = x + blockIdx.x * TILE * TILE + ty * TILE + tx;
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&tile[ty][tx]));
    {
        const unsigned int copied = __ldca(reinterpret_cast<const unsigned int*>(src));
        asm volatile("st.shared.u32 [%0], %1;\n"
                     :: "r"(dst), "r"(copied) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    y[blockIdx.x * TILE * TILE + ty * TILE + tx] = tile[tx][ty];
}
