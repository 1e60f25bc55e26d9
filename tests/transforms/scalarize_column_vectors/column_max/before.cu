// A column maximum and its row: the first row on ties (a strict >), the exit form of the guard.
__global__ void kernel(const float* x, float* values, long long* indices, int rows, int cols) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (cols % 4 == 0 && (((size_t)x | (size_t)values) & 15) == 0) {
        const int col4 = col;  // columns 4 * col4 .. 4 * col4 + 3
        if (col4 < cols / 4) {
            const float4 x4 = reinterpret_cast<const float4*>(x)[col4];
            float best_x = x4.x;
            float best_y = x4.y;
            float best_z = x4.z;
            float best_w = x4.w;
            int where_x = 0;
            int where_y = 0;
            int where_z = 0;
            int where_w = 0;
            for (int r = 1; r < rows; ++r) {
                const float4 x4_1 = reinterpret_cast<const float4*>(x + static_cast<size_t>(r) * cols)[col4];
                const float v_x = x4_1.x;
                const float v_y = x4_1.y;
                const float v_z = x4_1.z;
                const float v_w = x4_1.w;
                if (v_x > best_x) {
                    best_x = v_x;
                    where_x = r;
                }
                if (v_y > best_y) {
                    best_y = v_y;
                    where_y = r;
                }
                if (v_z > best_z) {
                    best_z = v_z;
                    where_z = r;
                }
                if (v_w > best_w) {
                    best_w = v_w;
                    where_w = r;
                }
            }
            reinterpret_cast<float4*>(values)[col4] = make_float4(best_x, best_y, best_z, best_w);
            indices[(4 * col4)] = where_x;
            indices[(4 * col4 + 1)] = where_y;
            indices[(4 * col4 + 2)] = where_z;
            indices[(4 * col4 + 3)] = where_w;
        }
    } else {
        if (col >= cols) return;
        float best = x[col];
        int where = 0;
        for (int r = 1; r < rows; ++r) {
            const float v = x[static_cast<size_t>(r) * cols + col];
            if (v > best) {
                best = v;
                where = r;
            }
        }
        values[col] = best;
        indices[col] = where;
    }
}
