// y = x W^T + b (a linear layer), one thread per output: x is M x K, W is N x K, both row-major.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                       float* __restrict__ y, int M, int N, int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < M && c < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k) acc += x[r * K + k] * w[c * K + k];
        y[r * N + c] = acc + b[c];
    }
}
