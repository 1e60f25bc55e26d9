// Naive masked scale: one thread per element, the mask read as one byte.
__global__ void masked_scale(const float* __restrict__ x, const unsigned char* __restrict__ mask,
                             float* __restrict__ y, int n, float scale) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) y[idx] = mask[idx] ? x[idx] * scale : 0.0f;
}
