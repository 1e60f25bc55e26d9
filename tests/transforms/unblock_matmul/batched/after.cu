// C[b] = scale * A[b] B[b] + beta * C[b] for a batch of small matrices (attention-sized heads), one layer of
// blocks per matrix: A is batch x M x K, B is batch x K x N, C is batch x M x N, all row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K, float scale, float beta) {
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][16];
    int b = blockIdx.z;
    A += b * M * K;
    B += b * K * N;
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.y][threadIdx.x] = r < M && tile_k + threadIdx.x < K ? A[r * K + tile_k + threadIdx.x] : 0.0f;
        tile_b[threadIdx.y][threadIdx.x] = tile_k + threadIdx.y < K && c < N ? B[(tile_k + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc = fmaf(tile_a[threadIdx.y][k], tile_b[k][threadIdx.x], acc);
        __syncthreads();
    }
    if (r < M && c < N) {
        float v = scale * acc;
        if (beta != 0.0f) v += beta * C[b * M * N + r * N + c];
        C[b * M * N + r * N + c] = v;
    }
}
