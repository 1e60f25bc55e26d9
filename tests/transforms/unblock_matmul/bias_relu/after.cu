// C = relu(alpha * A B + bias): A is M x K, B is K x N, row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
                       float* __restrict__ C, int M, int N, int K, float alpha) {
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][16];
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.y][threadIdx.x] = r < M && tile_k + threadIdx.x < K ? A[r * K + tile_k + threadIdx.x] : 0.0f;
        tile_b[threadIdx.y][threadIdx.x] = tile_k + threadIdx.y < K && c < N ? B[(tile_k + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];
        __syncthreads();
    }
    if (r < M && c < N) {
        float v = alpha * acc + bias[c];
        C[r * N + c] = v > 0.0f ? v : 0.0f;
    }
}
