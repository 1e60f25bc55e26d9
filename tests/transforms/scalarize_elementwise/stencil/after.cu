// y = a 3-point smoothing of x, zero beyond its ends: each element reads its neighbours at other indexes than
// its own (a gather every lane does for itself), and the index is a value too; one thread per element.
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float left = i > 0 ? x[i - 1] : 0.0f;
        float right = i + 1 < n ? x[i + 1] : 0.0f;
        y[i] = 0.25f * left + 0.5f * x[i] + 0.25f * right;
    }
}
