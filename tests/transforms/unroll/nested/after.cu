// Fill a per-thread 4 x 4 x 4 register block, then write its sum: braceless nested loops, each
// inner loop with its own pragma (the outermost has none).
__global__ void kernel(float* y)
{
    float acc[4][4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = static_cast<float>(i + j + e);
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
            for (int e = 0; e < 4; ++e) sum += acc[i][j][e];
    y[threadIdx.x] = sum;
}
