// Sum and sum of squares of each row (one thread per row), a braceless loop and an integer count.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ out, int rows, int n) {
    int row = blockIdx.x;
    const int lane = threadIdx.x;
    if (row < rows) {
        float sum = 0.0f, squares = 0.f;
        int count = 0;
        for (int j = lane; j < n; j += 256) {
            float v = x[row * n + j];
            sum += v;
            squares += v * v;
            count += v > 0.0f;
        }
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        {
            __shared__ float block_sum[8];
            if (lane % 32 == 0) block_sum[lane / 32] = sum;
            __syncthreads();
            sum = block_sum[0] + block_sum[1] + block_sum[2] + block_sum[3] + block_sum[4] + block_sum[5] + block_sum[6] + block_sum[7];
            __syncthreads();
        }
        for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
        {
            __shared__ float block_squares[8];
            if (lane % 32 == 0) block_squares[lane / 32] = squares;
            __syncthreads();
            squares = block_squares[0] + block_squares[1] + block_squares[2] + block_squares[3] + block_squares[4] + block_squares[5] + block_squares[6] + block_squares[7];
            __syncthreads();
        }
        for (int offset = 16; offset > 0; offset /= 2) count += __shfl_xor_sync(0xffffffffu, count, offset);
        {
            __shared__ int block_count[8];
            if (lane % 32 == 0) block_count[lane / 32] = count;
            __syncthreads();
            count = block_count[0] + block_count[1] + block_count[2] + block_count[3] + block_count[4] + block_count[5] + block_count[6] + block_count[7];
            __syncthreads();
        }
        out[2 * row] = sum / n;
        out[2 * row + 1] = squares - sum * sum / n + count;
    }
}
