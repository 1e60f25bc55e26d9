// C = A^T B (torch.matmul(A.T, B)), one thread per output: A is K x M, B is K x N, both row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                       int K) {
    __shared__ float tile_a[16][17];
    __shared__ float tile_b[16][16];
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.x][threadIdx.y] = tile_k + threadIdx.y < K && blockIdx.y * 16 + threadIdx.x < M ? A[(tile_k + threadIdx.y) * M + blockIdx.y * 16 + threadIdx.x] : 0.0f;
        tile_b[threadIdx.y][threadIdx.x] = tile_k + threadIdx.y < K && c < N ? B[(tile_k + threadIdx.y) * N + c] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc += tile_a[threadIdx.y][k] * tile_b[k][threadIdx.x];
        __syncthreads();
    }
    if (r < M && c < N) {
        C[r * N + c] = acc;
    }
}
