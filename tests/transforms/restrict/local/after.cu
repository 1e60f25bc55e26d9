// Pairs of floats through a local restrict pointer, written star-first.
__device__ __forceinline__ float pair_sum(const float2* p, int i) { return p[i].x + p[i].y; }

__global__ void kernel(const float* x, float* y, int pairs)
{
    const float2 *xv = reinterpret_cast<const float2*>(x);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pairs) y[i] = xv[i].x - xv[i].y + pair_sum(xv, i);
}
