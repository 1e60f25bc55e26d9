// Gather: y[i] = x[idx[i]], both reads through the read-only cache.
__global__ void kernel(const float* __restrict__ x, const int* __restrict__ idx, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = *(x + __ldg(&idx[i]));
}
