// y = x * scale where the byte mask keeps the element, else 0: a float array and a byte array side by side.
__global__ void kernel(const float* __restrict__ x, const unsigned char* __restrict__ mask, float* __restrict__ y,
                       int n, float scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = mask[i] ? x[i] * scale : 0.0f;
}
