// One split of a column sum: block row y sums rows [y * SPLIT, y * SPLIT + SPLIT) of each column into its own row
// of partial sums.
constexpr int SPLIT = 4;

__global__ void kernel(const float* __restrict__ dy, int rows, int cols, float* __restrict__ split_sum) {
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
