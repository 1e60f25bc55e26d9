__global__ void rotary(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int pairs) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int n = pairs;
    if (i >= n) return;
    const float x0 = __ldg(&x[2 * i]), x1 = __ldg(&x[2 * i + 1]);
    const float c = __ldg(&cos_t[i]), s = __ldg(&sin_t[i]);
    y[2 * i] = x0 * c - x1 * s;
    y[2 * i + 1] = x0 * s + x1 * c;
}
