// Rotary embedding in the half-split ("rotate_half") layout: one thread per pair (r * 2 * half + j,
// r * 2 * half + j + half) of a row of 2 * half elements, its cos and sin at r * half + j.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int rows, int half) {
    int p = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (p + 3 < rows * half && half % 4 == 0 && (((size_t)x | (size_t)cos_t | (size_t)sin_t | (size_t)y) & 15) == 0) {
        int r = p / half, j = p % half;
        int a = r * 2 * half + j;
        int b = a + half;
        const float4 x_lo4 = *reinterpret_cast<const float4*>(x + a);
        const float4 x_hi4 = *reinterpret_cast<const float4*>(x + b);
        const float4 cos_t4 = *reinterpret_cast<const float4*>(cos_t + (r * half + j));
        const float4 sin_t4 = *reinterpret_cast<const float4*>(sin_t + (r * half + j));
        float4 y_lo4;
        float4 y_hi4;
        {
            float x1 = x_lo4.x, x2 = x_hi4.x;
            float c = cos_t4.x, s = sin_t4.x;
            y_lo4.x = x1 * c - x2 * s;
            y_hi4.x = x2 * c + x1 * s;
        }
        {
            float x1 = x_lo4.y, x2 = x_hi4.y;
            float c = cos_t4.y, s = sin_t4.y;
            y_lo4.y = x1 * c - x2 * s;
            y_hi4.y = x2 * c + x1 * s;
        }
        {
            float x1 = x_lo4.z, x2 = x_hi4.z;
            float c = cos_t4.z, s = sin_t4.z;
            y_lo4.z = x1 * c - x2 * s;
            y_hi4.z = x2 * c + x1 * s;
        }
        {
            float x1 = x_lo4.w, x2 = x_hi4.w;
            float c = cos_t4.w, s = sin_t4.w;
            y_lo4.w = x1 * c - x2 * s;
            y_hi4.w = x2 * c + x1 * s;
        }
        *reinterpret_cast<float4*>(y + a) = y_lo4;
        *reinterpret_cast<float4*>(y + b) = y_hi4;
    } else {
        for (int e = p; e < rows * half && e < p + 4; ++e) {
            int r = e / half, j = e % half;
            int a = r * 2 * half + j;
            int b = a + half;
            float x1 = x[a], x2 = x[b];
            float c = cos_t[r * half + j], s = sin_t[r * half + j];
            y[a] = x1 * c - x2 * s;
            y[b] = x2 * c + x1 * s;
        }
    }
}
