// KL divergence summed over rows, each row's term added to the loss by its thread.
__global__ void row_loss(const float* p, const float* q, float* loss, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float acc = 0.0f;
    for (int c = 0; c < cols; ++c) {
        float pv = p[r * cols + c];
        acc += pv * (logf(pv) - logf(q[r * cols + c]));
    }
    atomicAdd(loss, acc / rows);
}
