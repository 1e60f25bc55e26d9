// A view of a dependent type (float or float4 by instantiation), as in row softmax: the store of a
// computed vector goes through a temporary, one component at a time.
template <int V> struct VecOf;
template <> struct VecOf<1> { using type = float; };
template <> struct VecOf<4> { using type = float4; };

__device__ __forceinline__ float scale(float v, float s) { return v * s; }
__device__ __forceinline__ float4 scale(float4 v, float s) { return make_float4(v.x * s, v.y * s, v.z * s, v.w * s); }

template <int V>
__device__ __forceinline__ void scale_row(const float* __restrict__ xr, float* __restrict__ yr, int cols, float s)
{
    using Vec = typename VecOf<V>::type;
    const Vec* __restrict__ xv = reinterpret_cast<const Vec*>(xr);
    Vec* __restrict__ yv = reinterpret_cast<Vec*>(yr);
    for (int j = threadIdx.x; j < cols / V; j += blockDim.x) {
        const Vec yv_val = scale(__ldg(xv + j), s);
        for (int e = 0; e < static_cast<int>(sizeof(Vec) / sizeof(float)); ++e)
            reinterpret_cast<float*>(yv + j)[e] = reinterpret_cast<const float*>(&yv_val)[e];
    }
}

__global__ void kernel(const float* __restrict__ x, float* __restrict__ y, int cols, float s)
{
    const float* xr = x + static_cast<size_t>(blockIdx.x) * cols;
    float* yr = y + static_cast<size_t>(blockIdx.x) * cols;
    if (cols % 4 == 0)
        scale_row<4>(xr, yr, cols, s);
    else
        scale_row<1>(xr, yr, cols, s);
}
