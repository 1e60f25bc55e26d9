#define CUDA_KERNEL_LOOP(i, n) for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)

__global__ void softplus(const float* __restrict__ x, float* __restrict__ y, int n) {
    CUDA_KERNEL_LOOP(index, n) {
        y[index] = x[index] > 20.0f ? x[index] : log1pf(expf(x[index]));
    }
}
