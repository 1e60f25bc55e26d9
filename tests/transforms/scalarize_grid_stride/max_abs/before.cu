// The largest magnitude of each thread's grid-stride slice; a second pass reduces the partials.
__global__ void kernel(const float* x, float* partial, int n) {
    float m = 0.0f;
    if ((((size_t)x) & 15) == 0) {
        for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < n / 4; v += blockDim.x * gridDim.x) {
            const float4 x4 = reinterpret_cast<const float4*>(x)[v];
            {
                m = fmaxf(m, fabsf(x4.x));
            }
            {
                m = fmaxf(m, fabsf(x4.y));
            }
            {
                m = fmaxf(m, fabsf(x4.z));
            }
            {
                m = fmaxf(m, fabsf(x4.w));
            }
        }
        for (int i = (n / 4) * 4 + blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
            m = fmaxf(m, fabsf(x[i]));
        }
    } else {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
            m = fmaxf(m, fabsf(x[i]));
        }
    }
    partial[blockIdx.x * blockDim.x + threadIdx.x] = m;
}
