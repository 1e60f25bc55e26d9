// A column maximum and its row: the first row on ties (a strict >), the exit form of the guard.
__global__ void kernel(const float* x, float* values, long long* indices, int rows, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float best = x[col];
    int where = 0;
    for (int r = 1; r < rows; ++r) {
        const float v = x[static_cast<size_t>(r) * cols + col];
        if (v > best) {
            best = v;
            where = r;
        }
    }
    values[col] = best;
    indices[col] = where;
}
