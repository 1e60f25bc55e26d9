__global__ void rotary(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int pairs) {
    int p = threadIdx.x + blockIdx.x * blockDim.x;
    if (p >= pairs) return;
    const float c = cos_t[p], s = sin_t[p];
    const float re = x[p * 2], im = x[p * 2 + 1];
    y[p * 2 + 1] = re * s + im * c;
    y[p * 2] = re * c - im * s;
}
