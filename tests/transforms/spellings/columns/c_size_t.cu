__global__ void bias_grad(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols) {
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= (size_t)cols) return;
    float s = 0.0f;
    for (size_t r = 0; r < (size_t)rows; ++r) s += dy[r * cols + c];
    db[c] = s;
}
