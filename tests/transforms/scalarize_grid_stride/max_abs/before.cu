// The largest magnitude of each thread's slice, in the `while` spelling; a second pass reduces the partials.
__global__ void kernel(const float* x, float* partial, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
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
        i += (n / 4) * 4;
        while (i < n) {
            m = fmaxf(m, fabsf(x[i]));
            i += blockDim.x * gridDim.x;
        }
    } else {
        while (i < n) {
            m = fmaxf(m, fabsf(x[i]));
            i += blockDim.x * gridDim.x;
        }
    }
    partial[blockIdx.x * blockDim.x + threadIdx.x] = m;
}
