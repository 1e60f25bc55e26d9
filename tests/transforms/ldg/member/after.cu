// The x component of float4 loads: the call is the operand of a member access.
__global__ void kernel(const float4* __restrict__ v, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (*(v + i)).x + __ldg(v + i).w;
}
