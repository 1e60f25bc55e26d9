#include <cfloat>
__global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* in = x + row * cols;
    float* out = y + row * cols;
    float mx = -FLT_MAX;
    for (int j = 0; j < cols; ++j) if (in[j] > mx) mx = in[j];
    float sum = 0.f;
    for (int j = 0; j < cols; ++j) { float e = __expf(in[j] - mx); out[j] = e; sum += e; }
    float inv = 1.f / sum;
    for (int j = 0; j < cols; ++j) out[j] *= inv;
}
