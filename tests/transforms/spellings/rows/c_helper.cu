__device__ __forceinline__ float sq(float v) { return v * v; }
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float ss = 0.0f;
    for (int j = 0; j < cols; ++j) ss += sq(xr[j]);
    float s = rsqrtf(ss / cols + 1e-6f);
    for (int j = 0; j < cols; ++j) yr[j] = xr[j] * s * w[j];
}
