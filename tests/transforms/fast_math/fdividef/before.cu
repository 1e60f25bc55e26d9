// Normalise by a per-element denominator: the call binds as one operand of the product.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ d, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * __fdividef(x[i] + 1.0f, d[i]);
}
