// C[b] = A[b]^T B[b]^T for a batch of small matrices, one thread per output element, one layer of blocks per
// matrix: A is batch x K x M, B is batch x N x K, C is batch x M x N, all row-major.
__global__ void kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M,
                       int N, int K) {
    __shared__ float block_a[64][17];
    __shared__ float block_b[16][65];
    int b = blockIdx.z;
    A += b * K * M;
    B += b * N * K;
    int block_c = blockIdx.x * 64 + threadIdx.x;
    int block_r = blockIdx.y * 64 + threadIdx.y;
    float block_acc[4][4];
    for (int block_i = 0; block_i < 4; ++block_i)
        for (int block_j = 0; block_j < 4; ++block_j) block_acc[block_i][block_j] = 0.0f;
    for (int block_k = 0; block_k < K; block_k += 16) {
        for (int block_i = 0; block_i < 4; ++block_i) {
            block_a[threadIdx.x + 16 * block_i][threadIdx.y] = block_k + threadIdx.y < K && blockIdx.y * 64 + threadIdx.x + 16 * block_i < M ? A[(block_k + threadIdx.y) * M + blockIdx.y * 64 + threadIdx.x + 16 * block_i] : 0.0f;
            block_b[threadIdx.x][threadIdx.y + 16 * block_i] = block_k + threadIdx.x < K && blockIdx.x * 64 + threadIdx.y + 16 * block_i < N ? B[(blockIdx.x * 64 + threadIdx.y + 16 * block_i) * K + block_k + threadIdx.x] : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < 16 && block_k + k < K; ++k) {
            float block_ra[4];
            float block_rb[4];
            for (int block_i = 0; block_i < 4; ++block_i) {
                block_ra[block_i] = block_a[threadIdx.y + 16 * block_i][k];
                block_rb[block_i] = block_b[k][threadIdx.x + 16 * block_i];
            }
            for (int block_i = 0; block_i < 4; ++block_i)
                for (int block_j = 0; block_j < 4; ++block_j) block_acc[block_i][block_j] = fmaf(block_ra[block_i], block_rb[block_j], block_acc[block_i][block_j]);
        }
        __syncthreads();
    }
    for (int block_i = 0; block_i < 4; ++block_i) {
        for (int block_j = 0; block_j < 4; ++block_j) {
            int r = block_r + 16 * block_i;
            int c = block_c + 16 * block_j;
            if (r < M && c < N) {
                float acc = block_acc[block_i][block_j];
                C[b * M * N + r * N + c] = acc;
            }
        }
    }
}
