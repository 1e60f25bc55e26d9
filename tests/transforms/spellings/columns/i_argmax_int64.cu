// The row of each column's largest value (torch.argmax(dy, dim=0)), its index kept as int64_t as torch keeps it.
__global__ void bias_grad(const float* dy, float* db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float best = -INFINITY;
    int64_t at = 0;
    for (int r = 0; r < rows; ++r) {
        float v = dy[r * cols + c];
        if (v > best) { best = v; at = r; }
    }
    db[c] = (float)at;
}
