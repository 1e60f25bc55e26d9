// Scale each element and sum what was written.
__global__ void kernel(const float* x, float* y, float* total, float scale, int n) {
    float s = 0.0f;
    if ((((size_t)x | (size_t)y) & 15) == 0) {
        for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += blockDim.x * gridDim.x) {
            const float4 x4 = reinterpret_cast<const float4*>(x)[v];
            float4 y4;
            {
                y4.x = scale * x4.x;
                s += y4.x;
            }
            {
                y4.y = scale * x4.y;
                s += y4.y;
            }
            {
                y4.z = scale * x4.z;
                s += y4.z;
            }
            {
                y4.w = scale * x4.w;
                s += y4.w;
            }
            reinterpret_cast<float4*>(y)[v] = y4;
        }
        for (int i = (n / 4) * 4 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
            y[i] = scale * x[i];
            s += y[i];
        }
    } else {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
            y[i] = scale * x[i];
            s += y[i];
        }
    }
    atomicAdd(total, s);
}
