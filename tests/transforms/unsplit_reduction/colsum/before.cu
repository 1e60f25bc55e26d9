// Column sum (a bias gradient), one thread per column walking down every row.
__global__ void kernel(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols, int split_steps, float* __restrict__ split_sum) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        const int split_first = (int)blockIdx.y * split_steps;
        for (int r = split_first; r < rows && r < split_first + split_steps; ++r) {
            sum += dy[(size_t)r * cols + c];
        }
        split_sum[(size_t)blockIdx.y * cols + c] = sum;
    }
}

__global__ void kernel_merge(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols, int split_steps, const float* __restrict__ split_sum) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        for (int split = 0; split < (rows + split_steps - 1) / split_steps; ++split) {
            sum += split_sum[(size_t)split * cols + c];
        }
        db[c] = sum * 0.5f;
    }
}
