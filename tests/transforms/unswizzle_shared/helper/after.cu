// A swizzle helper (as in the implicit-GEMM convolution): chunk c of row r of a [16][8 x 16 B] tile
// lives at chunk slot c ^ (r & 7). The tile is written row-wise and read column-wise, both through
// the helper.
constexpr int ROWS = 16;
constexpr int CHUNKS = 8;
constexpr int ROW_BYTES = CHUNKS * 16;

__device__ __forceinline__ int swizzle(int row, int chunk)
{
    return row * ROW_BYTES + (chunk << 4);
}

__global__ void kernel(const float4* __restrict__ x, float4* __restrict__ y)
{
    __shared__ __align__(16) unsigned char tile[ROWS * ROW_BYTES];
    const int t = threadIdx.x;
    *reinterpret_cast<float4*>(tile + swizzle(t / CHUNKS, t % CHUNKS)) = x[t];
    __syncthreads();
    y[t] = *reinterpret_cast<const float4*>(tile + swizzle(t % ROWS, t / ROWS));
}
