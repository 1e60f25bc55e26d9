// Sum of squares written for fix_grid_cap's tests: each thread sums a grid-stride slice, a warp adds its threads'
// sums by shuffles and one lane adds the warp's total with one atomic; the grid is sized to the GPU.
constexpr int BLOCKS_PER_SM = 8;

__global__ void kernel(const float* __restrict__ x, float* __restrict__ total, int n) {
    const int stride = gridDim.x * blockDim.x;
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) s += x[i] * x[i];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (threadIdx.x % 32 == 0) atomicAdd(total, s);
}
