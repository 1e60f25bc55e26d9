// Softmax of one row a block: a block-wide max, then a block-wide sum, through one shared array.
#define THREADS 128
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[THREADS];
    unsigned int t = threadIdx.x;
    const float* in = x + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = t; c < cols; c += THREADS) m = fmaxf(m, in[c]);
    red[t] = m;
    __syncthreads();  // every thread's max is in
    for (unsigned int s = THREADS / 2; s != 0; s /= 2) {
        if (t < s) {
            red[t] = fmaxf(red[t + s], red[t]);
        }
        __syncthreads();
    }
    const float row_max = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < cols; c += THREADS) sum += __expf(in[c] - row_max);
    red[t] = sum;
    __syncthreads();
    for (unsigned int s = THREADS >> 1; s > 0; s = s >> 1) {
        if (t < s) red[t] = red[t] + red[s + t];
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int c = t; c < cols; c += THREADS) y[(long long)blockIdx.x * cols + c] = __expf(in[c] - row_max) * inv;
}
