// A load of a dependent vector type into a const variable: it moves into a temporary filled one
// component at a time, right before the declaration.
template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

__device__ __forceinline__ float total(float v) { return v; }
__device__ __forceinline__ float total(float4 v) { return (v.x + v.y) + (v.z + v.w); }

template <int V>
__device__ __forceinline__ float row_sum(const float* __restrict__ xr, int cols)
{
    using Vec = typename VecOf<V>::type;
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(xr);
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols / V; j += blockDim.x) {
        const Vec v = __ldg(xv + j);
        s += total(v);
    }
    return s;
}

__global__ void kernel(const float* __restrict__ x, float* __restrict__ partial, int cols)
{
    const float* xr = x + static_cast<size_t>(blockIdx.x) * cols;
    const float s = cols % 4 == 0 ? row_sum<4>(xr, cols) : row_sum<1>(xr, cols);
    partial[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
