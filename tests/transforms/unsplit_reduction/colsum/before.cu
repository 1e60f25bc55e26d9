// Column sum (a bias gradient), one thread per column walking down every row.
constexpr int SPLIT = 128;  // the steps a chunk reduces

__global__ void kernel(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols, float* __restrict__ split_sum) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        const int split_first = (int)blockIdx.y * SPLIT;
        for (int r = split_first; r < rows && r < split_first + SPLIT; ++r) {
            sum += dy[(size_t)r * cols + c];
        }
        split_sum[(size_t)blockIdx.y * cols + c] = sum;
    }
}

__global__ void kernel_merge(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols, const float* __restrict__ split_sum) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) {
        float sum = 0.0f;
        for (int split = 0; split < (rows + SPLIT - 1) / SPLIT; ++split) {
            sum += split_sum[(size_t)split * cols + c];
        }
        db[c] = sum * 0.5f;
    }
}
