// Reverse each row of an n-column matrix: the block stages its row in a float view of its dynamic
// shared bytes.

extern "C" __global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const float* xr = x + static_cast<long long>(blockIdx.x) * n;
    float* yr = y + static_cast<long long>(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[n - 1 - i];
}
