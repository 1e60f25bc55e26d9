// y = a * x + y: x is read through the read-only path because it is const __restrict__.
__global__ void kernel(const float* x, float* __restrict__ y, float a, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
