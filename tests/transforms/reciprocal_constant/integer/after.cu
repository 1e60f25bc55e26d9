// Hard swish written with an integer six: a float divided by an int divides as floats.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        const float r6 = fminf(fmaxf(v + 3.0f, 0.0f), 6.0f);
        y[i] = v * r6 / 6;
    }
}
