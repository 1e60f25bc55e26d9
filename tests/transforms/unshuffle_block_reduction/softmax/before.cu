// Softmax of one row a block: a block-wide max, then a block-wide sum, through one shared array.
#define THREADS 128
__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[THREADS];
    unsigned int t = threadIdx.x;
    const float* in = x + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = t; c < cols; c += THREADS) m = fmaxf(m, in[c]);
    {
        float red_v = m;
        for (int red_o = 16; red_o > 0; red_o >>= 1) red_v = fmaxf(red_v, __shfl_down_sync(0xffffffffu, red_v, red_o));
        if ((t & 31) == 0) red[t >> 5] = red_v;
        __syncthreads();
        if (t < 32) {
            const int red_n = blockDim.x >> 5;
            red_v = t < red_n ? red[t] : red_v;
            for (int red_o = 16; red_o > 0; red_o >>= 1) {
                float red_w = __shfl_down_sync(0xffffffffu, red_v, red_o);
                if (t + red_o < red_n) red_v = fmaxf(red_v, red_w);
            }
            if (t == 0) red[0] = red_v;
        }
        __syncthreads();
    }
    const float row_max = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < cols; c += THREADS) sum += __expf(in[c] - row_max);
    {
        float red_v = sum;
        for (int red_o = 16; red_o > 0; red_o >>= 1) red_v = red_v + __shfl_down_sync(0xffffffffu, red_v, red_o);
        if ((t & 31) == 0) red[t >> 5] = red_v;
        __syncthreads();
        if (t < 32) {
            const int red_n = blockDim.x >> 5;
            red_v = t < red_n ? red[t] : red_v;
            for (int red_o = 16; red_o > 0; red_o >>= 1) {
                float red_w = __shfl_down_sync(0xffffffffu, red_v, red_o);
                if (t + red_o < red_n) red_v = red_v + red_w;
            }
            if (t == 0) red[0] = red_v;
        }
        __syncthreads();
    }
    const float inv = 1.0f / red[0];
    for (int c = t; c < cols; c += THREADS) y[(long long)blockIdx.x * cols + c] = __expf(in[c] - row_max) * inv;
}
