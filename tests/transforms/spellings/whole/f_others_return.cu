// The sum of absolute values by the grid's first thread, every other thread returning at once.
__global__ void whole(const float* __restrict__ x, float* __restrict__ out, int n) {
    if (threadIdx.x > 0 || blockIdx.x > 0) return;
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += fabsf(x[i]);
    out[0] = s;
}
