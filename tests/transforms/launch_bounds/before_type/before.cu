// The attribute before the return type.
__global__ __launch_bounds__(64) void kernel(float* y)
{
    y[threadIdx.x] = static_cast<float>(threadIdx.x);
}
