// Rotary embedding in the half-split ("rotate_half") layout: one thread per pair (r * 2 * half + j,
// r * 2 * half + j + half) of a row of 2 * half elements, its cos and sin at r * half + j.
__global__ void kernel(const float* __restrict__ x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                       float* __restrict__ y, int rows, int half) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < rows * half) {
        int r = p / half, j = p % half;
        int a = r * 2 * half + j;
        int b = a + half;
        float x1 = x[a], x2 = x[b];
        float c = cos_t[r * half + j], s = sin_t[r * half + j];
        y[a] = x1 * c - x2 * s;
        y[b] = x2 * c + x1 * s;
    }
}
