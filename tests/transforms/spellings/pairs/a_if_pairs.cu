__global__ void rotary(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int pairs) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < pairs) {
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        y[2 * i] = x0 * cos_t[i] - x1 * sin_t[i];
        y[2 * i + 1] = x0 * sin_t[i] + x1 * cos_t[i];
    }
}
