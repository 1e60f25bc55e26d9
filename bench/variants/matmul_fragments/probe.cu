// Probe (README.md here): is a register-blocked matmul with 16-byte shared fragments worth a forward?
// naive, the blocked form unblock_matmul writes today, that form with its k loop unrolled (zero-padded tiles),
// and a form whose micro tile is contiguous (A stored k-major in shared) read as float4, against cuBLAS.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#ifdef WITH_CUBLAS
#include <cublas_v2.h>
#endif

__global__ void naive(const float* a, const float* b, float* c, int m, int n, int k) {
    int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y, z = blockIdx.z;
    if (row < m && col < n) {
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) sum += a[(size_t)z * m * k + row * k + i] * b[(size_t)z * k * n + i * n + col];
        c[(size_t)z * m * n + row * n + col] = sum;
    }
}

template <bool UNROLL>
__global__ void blocked(const float* a, const float* b, float* c, int m, int n, int k) {
    __shared__ float block_a[64][16];
    __shared__ float block_b[16][64];
    int z = blockIdx.z;
    a += (size_t)z * m * k; b += (size_t)z * k * n;
    int block_c = blockIdx.x * 64 + threadIdx.x, block_r = blockIdx.y * 64 + threadIdx.y;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += 16) {
        for (int q = 0; q < 4; ++q) {
            block_a[threadIdx.y + 16 * q][threadIdx.x] = block_r + 16 * q < m && k0 + threadIdx.x < k ? a[(block_r + 16 * q) * k + k0 + threadIdx.x] : 0.0f;
            block_b[threadIdx.y][threadIdx.x + 16 * q] = k0 + threadIdx.y < k && block_c + 16 * q < n ? b[(k0 + threadIdx.y) * n + block_c + 16 * q] : 0.0f;
        }
        __syncthreads();
        if (UNROLL) {
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                float ra[4], rb[4];
                for (int q = 0; q < 4; ++q) { ra[q] = block_a[threadIdx.y + 16 * q][i]; rb[q] = block_b[i][threadIdx.x + 16 * q]; }
                for (int p = 0; p < 4; ++p) for (int q = 0; q < 4; ++q) acc[p][q] += ra[p] * rb[q];
            }
        } else {
            for (int i = 0; i < 16 && k0 + i < k; ++i) {
                float ra[4], rb[4];
                for (int q = 0; q < 4; ++q) { ra[q] = block_a[threadIdx.y + 16 * q][i]; rb[q] = block_b[i][threadIdx.x + 16 * q]; }
                for (int p = 0; p < 4; ++p) for (int q = 0; q < 4; ++q) acc[p][q] += ra[p] * rb[q];
            }
        }
        __syncthreads();
    }
    for (int p = 0; p < 4; ++p) for (int q = 0; q < 4; ++q) {
        int row = block_r + 16 * p, col = block_c + 16 * q;
        if (row < m && col < n) c[(size_t)z * m * n + row * n + col] = acc[p][q];
    }
}

// MICRO x MICRO contiguous outputs a thread, 16 x 16 threads: a (16 MICRO)^2 tile; A kept k-major in shared.
template <int MICRO>
__global__ void fragments(const float* a, const float* b, float* c, int m, int n, int k) {
    constexpr int T = 16 * MICRO;
    __shared__ __align__(16) float sa[16][T + 4];
    __shared__ __align__(16) float sb[16][T];
    int z = blockIdx.z;
    a += (size_t)z * m * k; b += (size_t)z * k * n;
    int tx = threadIdx.x, ty = threadIdx.y, row0 = blockIdx.y * T, col0 = blockIdx.x * T;
    float acc[MICRO][MICRO];
#pragma unroll
    for (int p = 0; p < MICRO; ++p)
#pragma unroll
        for (int q = 0; q < MICRO; ++q) acc[p][q] = 0.0f;
    for (int k0 = 0; k0 < k; k0 += 16) {
#pragma unroll
        for (int q = 0; q < MICRO; ++q) {
            int r = ty + 16 * q;
            sa[tx][r] = row0 + r < m && k0 + tx < k ? a[(row0 + r) * k + k0 + tx] : 0.0f;
            sb[ty][tx + 16 * q] = k0 + ty < k && col0 + tx + 16 * q < n ? b[(k0 + ty) * n + col0 + tx + 16 * q] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            float ra[MICRO], rb[MICRO];
#pragma unroll
            for (int v = 0; v < MICRO; v += 4) {
                float4 x = *reinterpret_cast<const float4*>(&sa[i][ty * MICRO + v]);
                float4 y = *reinterpret_cast<const float4*>(&sb[i][tx * MICRO + v]);
                ra[v] = x.x; ra[v + 1] = x.y; ra[v + 2] = x.z; ra[v + 3] = x.w;
                rb[v] = y.x; rb[v + 1] = y.y; rb[v + 2] = y.z; rb[v + 3] = y.w;
            }
#pragma unroll
            for (int p = 0; p < MICRO; ++p)
#pragma unroll
                for (int q = 0; q < MICRO; ++q) acc[p][q] += ra[p] * rb[q];
        }
        __syncthreads();
    }
#pragma unroll
    for (int p = 0; p < MICRO; ++p)
#pragma unroll
        for (int q = 0; q < MICRO; ++q) {
            int row = row0 + ty * MICRO + p, col = col0 + tx * MICRO + q;
            if (row < m && col < n) c[(size_t)z * m * n + row * n + col] = acc[p][q];
        }
}

typedef void (*Kernel)(const float*, const float*, float*, int, int, int);

static float time_it(Kernel kern, dim3 grid, dim3 block, const float* a, const float* b, float* c, int m, int n, int k) {
    cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
    for (int w = 0; w < 5; ++w) kern<<<grid, block>>>(a, b, c, m, n, k);
    std::vector<float> runs;
    for (int r = 0; r < 7; ++r) {
        cudaEventRecord(s);
        for (int it = 0; it < 30; ++it) kern<<<grid, block>>>(a, b, c, m, n, k);
        cudaEventRecord(e); cudaEventSynchronize(e);
        float ms; cudaEventElapsedTime(&ms, s, e); runs.push_back(ms * 1000.0f / 30);
    }
    std::sort(runs.begin(), runs.end());
    return runs[3];
}

int main() {
    struct Shape { const char* name; int batch, m, n, k; } shapes[] = {
        {"bmm 1024x64^3", 1024, 64, 64, 64}, {"bmm ragged 100x50x70x33", 100, 50, 70, 33},
        {"gemm 1024^3", 1, 1024, 1024, 1024}, {"gemm 4096x4096x1024", 1, 4096, 4096, 1024}, {"bmm 256x128^3", 256, 128, 128, 128}};
    for (auto& sh : shapes) {
        size_t na = (size_t)sh.batch * sh.m * sh.k, nb = (size_t)sh.batch * sh.k * sh.n, nc = (size_t)sh.batch * sh.m * sh.n;
        std::vector<float> ha(na), hb(nb), ref(nc), out(nc);
        srand(7);
        for (auto& x : ha) x = (rand() % 2001 - 1000) / 1000.0f;
        for (auto& x : hb) x = (rand() % 2001 - 1000) / 1000.0f;
        float *a, *b, *c;
        cudaMalloc(&a, na * 4); cudaMalloc(&b, nb * 4); cudaMalloc(&c, nc * 4);
        cudaMemcpy(a, ha.data(), na * 4, cudaMemcpyHostToDevice); cudaMemcpy(b, hb.data(), nb * 4, cudaMemcpyHostToDevice);
        dim3 b16(16, 16);
        auto g = [&](int t) { return dim3((sh.n + t - 1) / t, (sh.m + t - 1) / t, sh.batch); };
        float t_naive = time_it(naive, g(16), b16, a, b, c, sh.m, sh.n, sh.k);
        cudaMemcpy(ref.data(), c, nc * 4, cudaMemcpyDeviceToHost);
        struct V { const char* name; Kernel k; int tile; } vs[] = {
            {"blocked", blocked<false>, 64}, {"blocked_unrolled", blocked<true>, 64},
            {"fragments4", fragments<4>, 64}, {"fragments8", fragments<8>, 128}};
        float t_blocked = 0;
        printf("%-26s naive %8.1f us\n", sh.name, t_naive);
        for (auto& v : vs) {
            cudaMemset(c, 0, nc * 4);
            float t = time_it(v.k, g(v.tile), b16, a, b, c, sh.m, sh.n, sh.k);
            cudaMemcpy(out.data(), c, nc * 4, cudaMemcpyDeviceToHost);
            double err = 0; for (size_t i = 0; i < nc; ++i) err = std::max(err, (double)fabsf(out[i] - ref[i]));
            if (!t_blocked) t_blocked = t;
            printf("  %-18s %8.1f us  %5.2fx naive  %5.2fx blocked  maxerr %.2e %s\n", v.name, t, t_naive / t, t_blocked / t, err,
                   cudaGetLastError() == cudaSuccess ? "" : "CUDA ERROR");
        }
#ifdef WITH_CUBLAS
        cublasHandle_t h; cublasCreate(&h);
        float one = 1, zero = 0;
        auto run = [&]() { cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, sh.n, sh.m, sh.k, &one, b, sh.n, (long long)sh.k * sh.n,
                                                     a, sh.k, (long long)sh.m * sh.k, &zero, c, sh.n, (long long)sh.m * sh.n, sh.batch); };
        for (int w = 0; w < 5; ++w) run();
        cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
        std::vector<float> runs;
        for (int r = 0; r < 7; ++r) { cudaEventRecord(s); for (int it = 0; it < 30; ++it) run(); cudaEventRecord(e); cudaEventSynchronize(e);
            float ms; cudaEventElapsedTime(&ms, s, e); runs.push_back(ms * 1000 / 30); }
        std::sort(runs.begin(), runs.end());
        printf("  %-18s %8.1f us  %5.2fx naive  %5.2fx blocked\n", "cublas", runs[3], t_naive / runs[3], t_blocked / runs[3]);
        cublasDestroy(h);
#endif
        cudaFree(a); cudaFree(b); cudaFree(c);
    }
    return 0;
}
