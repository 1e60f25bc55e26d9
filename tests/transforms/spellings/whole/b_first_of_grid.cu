// The mean of every element by the first thread of the first block; every other thread of the grid idles.
__global__ void whole(const float* __restrict__ x, float* __restrict__ out, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float total = 0.f;
        for (int i = 0; i < n; ++i) total += x[i];
        out[0] = total / n;
    }
}
