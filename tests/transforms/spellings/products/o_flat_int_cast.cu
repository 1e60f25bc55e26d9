// A flat product with its index written as PyTorch extensions write it, the block's coordinate cast to int (the
// same value: every coordinate is below 2^31), leaving past the outputs, a leaky relu after the sum.
__global__ void product(const float* A, const float* B, float* C, int M, int N, int K) {
    const int idx = (int)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= M * N) return;
    int row = idx / N;
    int col = idx % N;
    float total = 0.0f;
    for (int k = 0; k < K; ++k) total += A[row * K + k] * B[k * N + col];
    C[idx] = total > 0.0f ? total : 0.01f * total;
}
