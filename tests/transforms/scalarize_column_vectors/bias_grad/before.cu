// A bias gradient: one thread per column adds up its column, row after row.
__global__ void kernel(const float* __restrict__ dy, float* __restrict__ db, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (cols % 4 == 0 && (((size_t)dy | (size_t)db) & 15) == 0) {
        const int c4 = c;  // columns 4 * c4 .. 4 * c4 + 3
        if (c4 < cols / 4) {
            float sum_x = 0.0f;
            float sum_y = 0.0f;
            float sum_z = 0.0f;
            float sum_w = 0.0f;
            for (int r = 0; r < rows; r++) {
                const float4 dy4 = reinterpret_cast<const float4*>(dy + (size_t)r * cols)[c4];
                sum_x += dy4.x;
                sum_y += dy4.y;
                sum_z += dy4.z;
                sum_w += dy4.w;
            }
            reinterpret_cast<float4*>(db)[c4] = make_float4(sum_x, sum_y, sum_z, sum_w);
        }
    } else if (c < cols) {
        float sum = 0.0f;
        for (int r = 0; r < rows; r++) {
            sum += dy[(size_t)r * cols + c];
        }
        db[c] = sum;
    }
}
