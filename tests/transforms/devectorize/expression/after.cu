// A 64-bit load in a const declaration: the vector is rebuilt from two scalar loads.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const float2* __restrict__ x2 = reinterpret_cast<const float2*>(x);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 2) {
        const float2 p = make_float2(__ldg(x + 2 * i), __ldg(x + 2 * i + 1));
        y[i] = p.x * p.y;
    }
}
