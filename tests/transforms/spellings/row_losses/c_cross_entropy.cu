// Mean cross-entropy against soft targets: the row's max, then its log-sum-exp and the targets' dot product.
__global__ void row_loss(const float* logits, const float* target, float* loss, int rows, int cols) {
    int r = threadIdx.x + blockIdx.x * blockDim.x;
    if (r >= rows) return;
    const float* x = logits + (size_t)r * cols;
    float m = -INFINITY;
    for (int c = 0; c < cols; ++c) m = fmaxf(m, x[c]);
    float s = 0.0f, t = 0.0f;
    for (int c = 0; c < cols; ++c) {
        s += expf(x[c] - m);
        t += target[(size_t)r * cols + c] * x[c];
    }
    atomicAdd(&loss[0], logf(s) + m - t / rows);
}
