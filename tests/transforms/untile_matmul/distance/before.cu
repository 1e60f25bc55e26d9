// C = the Euclidean distances between the rows of A (M x K) and the rows of B (N x K), one thread per pair.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                       int K) {
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][17];
    int c = blockIdx.x * 16 + threadIdx.x;
    int r = blockIdx.y * 16 + threadIdx.y;
    float acc = 0.0f;
    for (int tile_k = 0; tile_k < K; tile_k += 16) {
        tile_a[threadIdx.y][threadIdx.x] = r < M && tile_k + threadIdx.x < K ? A[r * K + tile_k + threadIdx.x] : 0.0f;
        tile_b[threadIdx.x][threadIdx.y] = tile_k + threadIdx.x < K && blockIdx.x * 16 + threadIdx.y < N ? B[(blockIdx.x * 16 + threadIdx.y) * K + tile_k + threadIdx.x] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16 && tile_k + k < K; ++k) acc += (tile_a[threadIdx.y][k] - tile_b[k][threadIdx.x]) * (tile_a[threadIdx.y][k] - tile_b[k][threadIdx.x]);
        __syncthreads();
    }
    if (r < M && c < N) {
        C[r * N + c] = sqrtf(acc);
    }
}
