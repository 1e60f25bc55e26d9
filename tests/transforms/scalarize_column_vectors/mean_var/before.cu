// A column's mean and variance in two passes; an integer count of the rows that are not below the mean.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ mean, float* __restrict__ var,
                       int* __restrict__ above, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (cols % 4 == 0 && (((size_t)x | (size_t)mean | (size_t)var | (size_t)above) & 15) == 0) {
        const int c4 = c;  // columns 4 * c4 .. 4 * c4 + 3
        if (c4 < cols / 4) {
            float sum_x = 0.0f;
            float sum_y = 0.0f;
            float sum_z = 0.0f;
            float sum_w = 0.0f;
            for (int r = 0; r < rows; ++r) {
                const float4 x4 = reinterpret_cast<const float4*>(x + r * cols)[c4];
                sum_x += x4.x;
                sum_y += x4.y;
                sum_z += x4.z;
                sum_w += x4.w;
            }
            const float m_x = rows > 0 ? sum_x / rows : 0.0f;
            const float m_y = rows > 0 ? sum_y / rows : 0.0f;
            const float m_z = rows > 0 ? sum_z / rows : 0.0f;
            const float m_w = rows > 0 ? sum_w / rows : 0.0f;
            float squares_x = 0.0f;
            float squares_y = 0.0f;
            float squares_z = 0.0f;
            float squares_w = 0.0f;
            int count_x = 0;
            int count_y = 0;
            int count_z = 0;
            int count_w = 0;
            for (int r = 0; r < rows; ++r) {
                const float4 x4_1 = reinterpret_cast<const float4*>(x + r * cols)[c4];
                const float d_x = x4_1.x - m_x;
                const float d_y = x4_1.y - m_y;
                const float d_z = x4_1.z - m_z;
                const float d_w = x4_1.w - m_w;
                squares_x = fmaf(d_x, d_x, squares_x);
                squares_y = fmaf(d_y, d_y, squares_y);
                squares_z = fmaf(d_z, d_z, squares_z);
                squares_w = fmaf(d_w, d_w, squares_w);
                count_x += d_x >= 0.0f ? 1 : 0;
                count_y += d_y >= 0.0f ? 1 : 0;
                count_z += d_z >= 0.0f ? 1 : 0;
                count_w += d_w >= 0.0f ? 1 : 0;
            }
            reinterpret_cast<float4*>(mean)[c4] = make_float4(m_x, m_y, m_z, m_w);
            reinterpret_cast<float4*>(var)[c4] = make_float4(
                rows > 1 ? squares_x / (rows - 1) : 0.0f,
                rows > 1 ? squares_y / (rows - 1) : 0.0f,
                rows > 1 ? squares_z / (rows - 1) : 0.0f,
                rows > 1 ? squares_w / (rows - 1) : 0.0f);
            reinterpret_cast<int4*>(above)[c4] = make_int4(count_x, count_y, count_z, count_w);
        }
    } else if (c < cols) {
        float sum = 0.0f;
        for (int r = 0; r < rows; ++r) {
            sum += x[r * cols + c];
        }
        const float m = rows > 0 ? sum / rows : 0.0f;
        float squares = 0.0f;
        int count = 0;
        for (int r = 0; r < rows; ++r) {
            const float d = x[r * cols + c] - m;
            squares = fmaf(d, d, squares);
            count += d >= 0.0f ? 1 : 0;
        }
        mean[c] = m;
        var[c] = rows > 1 ? squares / (rows - 1) : 0.0f;
        above[c] = count;
    }
}
