// One split of a column sum: block row y sums rows [y * SPLIT, y * SPLIT + SPLIT) of each column into its own row
// of partial sums.
constexpr int SPLIT = 4;

__global__ void kernel(const float* __restrict__ dy, int rows, int cols, float* __restrict__ split_sum) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (cols % 4 == 0 && (((size_t)dy | (size_t)split_sum) & 15) == 0) {
        const int c4 = c;  // columns 4 * c4 .. 4 * c4 + 3
        if (c4 < cols / 4) {
            float sum_x = 0.0f;
            float sum_y = 0.0f;
            float sum_z = 0.0f;
            float sum_w = 0.0f;
            const int split_first = (int)blockIdx.y * SPLIT;
            for (int r = split_first; r < rows && r < split_first + SPLIT; ++r) {
                const float4 dy4 = reinterpret_cast<const float4*>(dy + (size_t)r * cols)[c4];
                sum_x += dy4.x;
                sum_y += dy4.y;
                sum_z += dy4.z;
                sum_w += dy4.w;
            }
            reinterpret_cast<float4*>(split_sum + (size_t)blockIdx.y * cols)[c4] = make_float4(
                sum_x,
                sum_y,
                sum_z,
                sum_w);
        }
    } else if (c < cols) {
        float sum = 0.0f;
        const int split_first = (int)blockIdx.y * SPLIT;
        for (int r = split_first; r < rows && r < split_first + SPLIT; ++r) {
            sum += dy[(size_t)r * cols + c];
        }
        split_sum[(size_t)blockIdx.y * cols + c] = sum;
    }
}
