// out[i] = the sum of the four lanes of table[idx[i]]: a lookup of float4 rows; one thread per output.
__global__ void kernel(const float4* __restrict__ table, const int* __restrict__ idx, float* __restrict__ out,
                       int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = table[idx[i]].x + table[idx[i]].y + table[idx[i]].z + table[idx[i]].w;
}
