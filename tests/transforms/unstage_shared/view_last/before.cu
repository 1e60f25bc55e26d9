// Reverse each row of an n-column matrix: the block stages its row in a float view of its dynamic
// shared bytes.

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float* row = reinterpret_cast<float*>(smem);
    const float* xr = x + static_cast<long long>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] = xr[i];
    __syncthreads();
    float* yr = y + static_cast<long long>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = row[n - 1 - i];
}
