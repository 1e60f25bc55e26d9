// The attribute before the return type.
__global__ void kernel(float* y)
{
    y[threadIdx.x] = static_cast<float>(threadIdx.x);
}
