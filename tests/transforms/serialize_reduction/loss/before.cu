// Mean cross-entropy of rows of logits: one thread per row takes its log-sum-exp, then adds its term of the mean
// to the one loss with an atomic.
__global__ void kernel(const float* __restrict__ logits, const int* __restrict__ target, float* __restrict__ loss,
                       int rows, int n) {
    int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, logits[row * n + j]);
    for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    float s = 0.0f;
    for (int j = lane; j < n; j += 32) s += expf(logits[row * n + j] - m);
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    const float term = logf(s) + m - logits[row * n + target[row]];
    if (lane == 0) atomicAdd(loss, term / rows);
}
