"""Source features read from the parse tree, each credited to the function that uses it."""

from pathlib import Path

import pytest

from klineage.features.feature import Feature
from klineage.features.source import FEATURE_NAMES, FILE_LOCUS, source_features

FIXTURE = Path(__file__).parent / "fixtures" / "static" / "hgemm_mma.cu"


def names(source: str, locus: str = "k") -> set[str]:
    return {f.name for f in source_features(source) if f.locus == locus}


def kernel(body: str, params: str = "float* x") -> str:
    return f"__global__ void k({params}) {{\n{body}\n}}\n"


def test_realistic_kernel_exact_features():
    assert source_features(FIXTURE.read_text()) == tuple(Feature(locus, name) for locus, name in [
        ("hgemm", "atomic"),
        ("hgemm", "cp_async"),  # through the CP_ASYNC_CG macro, inside a lambda
        ("hgemm", "cp_async_wait"),
        ("hgemm", "global_fn"),
        ("hgemm", "launch_bounds"),
        ("hgemm", "multistage_pipeline"),  # CP_ASYNC_WAIT(1): one group stays in flight
        ("hgemm", "restrict_ptr"),
        ("hgemm", "shared_array"),
        ("hgemm", "syncthreads"),
        ("hgemm", "unroll_pragma"),
        ("hgemm", "vector_type_float2"),
        ("hgemm", "xor_swizzle"),  # via the swizzle() helper and a local initialised from it
        ("ldmatrix_x4", "ldmatrix"),
        ("mma_16816", "mma_sync"),
        ("scale_rows", "global_fn"),
        ("scale_rows", "ldg"),
        ("scale_rows", "restrict_ptr"),
        ("scale_rows", "vector_type_float4"),
        ("swizzle", "xor_swizzle"),  # the helper returns a phase XOR that indexes shared memory
        ("warp_sum", "shfl"),
        ("warp_sum", "unroll_pragma"),
    ])


CASES = [
    ("global_fn", kernel("")),
    ("launch_bounds", "__global__ void __launch_bounds__(256, 2) k(float* x) {}"),
    ("restrict_ptr", kernel("", "const float* __restrict__ x")),
    ("ldg", kernel("float v = __ldg(&x[0]);")),
    ("ldg", kernel('float v; asm("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(x));')),
    ("unroll_pragma", kernel("#pragma unroll 4\nfor (int i = 0; i < 4; ++i) x[i] = 0;")),
    ("vector_type_float4", kernel("reinterpret_cast<float4*>(x)[0] = {};")),
    ("vector_type_float4", kernel("float4 v = ((const float4*)x)[0];")),
    ("vector_type_float2", kernel("float2 v;")),
    ("vector_type_int4", kernel("int4 v;")),
    ("vector_type_int4", kernel("uint4 v = *reinterpret_cast<const uint4*>(x);")),
    ("vector_type_int2", kernel("int2 v;")),
    ("vector_type_half2", kernel("half2 v;")),
    ("vector_type_half2", kernel("__half2 v;")),
    ("vector_type_bf162", kernel("__nv_bfloat162 v;")),
    ("shared_array", kernel("__shared__ float tile[32][33];")),
    ("dynamic_shared", kernel("extern __shared__ float smem[];")),
    ("syncthreads", kernel("__syncthreads();")),
    ("syncthreads", kernel('asm volatile("bar.sync 0;");')),
    ("syncwarp", kernel("__syncwarp();")),
    ("cp_async", kernel('asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(0), "l"(x));')),
    ("cp_async", kernel("__pipeline_memcpy_async(dst, x, 16);")),
    ("cp_async", kernel("cuda::memcpy_async(dst, x, 16, barrier);")),
    ("cp_async_wait", kernel('asm volatile("cp.async.wait_group 0;");')),
    ("cp_async_wait", kernel('asm volatile("cp.async.commit_group;");')),
    ("cp_async_wait", kernel("__pipeline_wait_prior(0);")),
    ("multistage_pipeline", kernel('asm volatile("cp.async.wait_group 2;");')),
    ("multistage_pipeline", kernel("__pipeline_wait_prior(1);")),
    ("multistage_pipeline", "constexpr int STAGES = 2;\ntemplate <int N> __device__ void wait()\n"
                            '{ asm volatile("cp.async.wait_group %0;" :: "n"(N)); }\n' + kernel("wait<STAGES - 2>();")),
    ("ldmatrix", kernel('asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(a));')),
    ("mma_sync", kernel('asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 ..." :: );')),
    ("mma_sync", kernel("wmma::mma_sync(c, a, b, c);")),
    ("wmma", kernel("wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;")),
    ("wgmma", kernel('asm volatile("wgmma.fence.sync.aligned;");')),
    ("tma", kernel('asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes '
                   '[%0], [%1, {%2, %3}], [%4];" :: "r"(a), "l"(m), "r"(0), "r"(0), "r"(b));')),
    ("mbarrier", kernel('asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(a), "r"(1));')),
    ("mbarrier", kernel('asm volatile("{\\n" ".reg .pred p;\\n" "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;"'
                        ' "\\n}" :: "r"(a), "r"(0));')),
    ("shfl", kernel("float v = __shfl_down_sync(0xffffffff, x[0], 1);")),
    ("shfl", kernel("float v = __shfl_sync(0xffffffff, x[0], 0);")),
    ("fast_math", kernel("x[0] = __expf(x[0]) + __fdividef(1.f, x[1]);")),
    ("fast_math", kernel('asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x[0]));')),
    ("atomic", kernel("atomicAdd(x, 1.f);")),
    ("atomic", kernel("atomicCAS((int*)x, 0, 1);")),
    ("xor_swizzle", kernel("__shared__ float s[8][8];\ns[threadIdx.y][threadIdx.x ^ (threadIdx.y & 7)] = x[0];")),
    ("printf", kernel('printf("%f\\n", x[0]);')),
]


@pytest.mark.parametrize("name, source", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_each_feature(name, source):
    assert name in names(source)


def test_every_feature_name_has_a_case():
    assert {name for name, _ in CASES} == set(FEATURE_NAMES)


def test_features_are_sorted_unique_and_credited_to_their_function():
    source = ("__device__ float helper(float v) { __syncthreads(); __syncthreads(); return __expf(v); }\n"
              + kernel("x[0] = helper(x[0]);\n__syncwarp();"))
    assert source_features(source) == (
        Feature("helper", "fast_math"), Feature("helper", "syncthreads"),
        Feature("k", "global_fn"), Feature("k", "syncwarp"),
    )


def test_namespace_scope_features_have_the_file_locus():
    source = "using namespace nvcuda::wmma;\n__shared__ float tile[64];\n" + kernel("")
    assert {f for f in source_features(source) if f.locus == FILE_LOCUS} == {
        Feature(FILE_LOCUS, "wmma"), Feature(FILE_LOCUS, "shared_array")}


def test_comments_strings_and_lookalikes_are_not_features():
    source = kernel(
        "// __syncthreads(); cp.async float4\n"
        'printf("cp.async mma.sync __shfl_sync");\n'
        "int my__syncthreads_counter = 0;\n"
        "#pragma nounroll\n"
        "for (int i = 0; i < 4; ++i) x[i] = 0;\n"
        "extern __shared__ float dyn[];\n"
        "__shared__ float scalar;\n"
        'asm volatile("cp.async.bulk.commit_group;");'
    )
    assert names(source) == {"global_fn", "printf", "dynamic_shared", "cp_async_wait"}


def test_macro_features_are_credited_where_the_macro_is_used():
    source = (
        '#define CP_ASYNC(dst, src) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src))\n'
        "#define LOAD(dst, src) CP_ASYNC(dst, src)\n"
        '#define UNUSED() asm volatile("wgmma.fence.sync.aligned;")\n'
        "#define SELF SELF + 1\n"
        "__device__ void loader(unsigned d, const float* s) { LOAD(d, s); }\n"
        + kernel("int y = SELF;")
    )
    features = source_features(source)
    assert Feature("loader", "cp_async") in features
    assert not any(f.name in ("cp_async", "wgmma") for f in features if f.locus != "loader")


def test_xor_swizzle_needs_shared_memory_and_an_xor_index():
    assert "xor_swizzle" not in names(kernel("x[threadIdx.x ^ 1] = 0;"))  # global memory
    assert "xor_swizzle" not in names(kernel("__shared__ float s[64];\nint m = threadIdx.x ^ 1;\ns[threadIdx.x] = m;"))
    via_local = kernel("__shared__ float s[8][64];\nint c = (threadIdx.x & 7) ^ (threadIdx.x >> 3);\n"
                       "int slot = c * 4 + 1;\ns[1][slot] = 0;")
    assert "xor_swizzle" in names(via_local)
    via_alias = kernel("extern __shared__ char raw[];\nfloat* s = reinterpret_cast<float*>(raw);\n"
                       "s[threadIdx.x ^ (blockIdx.x % 4)] = 0;")
    assert "xor_swizzle" in names(via_alias)
    via_macro = "#define SWZ(r, c) ((c) ^ ((r) & 7))\n" + kernel("__shared__ float s[64][8];\ns[1][SWZ(1, 2)] = 0;")
    assert "xor_swizzle" in names(via_macro)


# A swizzle helper returning a byte offset that inline asm uses as a shared-memory address (the GEMM
# and conv experts' layout): the helper carries the feature, and so does every helper of its family.
ASM_HELPERS = """
constexpr int ROW_BYTES = 128;
constexpr int SWIZZLE_ROWS = 8;
struct Addressing { int phase; int half; };
__device__ __forceinline__ unsigned swizzle_offset(int row, int chunk)
{
    return static_cast<unsigned>(row * ROW_BYTES + ((chunk ^ (row % SWIZZLE_ROWS)) * 16));
}
__device__ __forceinline__ Addressing make_addressing(int lane)
{
    Addressing fa;
    fa.phase = lane % SWIZZLE_ROWS;
    fa.half = lane / 16;
    return fa;
}
__device__ __forceinline__ unsigned fragment_offset(const Addressing& fa, int ks)
{
    return static_cast<unsigned>(((2 * ks + fa.half) ^ fa.phase) * 16);
}
__device__ __forceinline__ void ldsm(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void copy16(unsigned smem_addr, const void* g)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(smem_addr), "l"(g));
}
__global__ void k(const float* x, unsigned base)
{
    unsigned r[4];
    Addressing fa = make_addressing(threadIdx.x % 32);
    unsigned offset = swizzle_offset(threadIdx.x / 8, threadIdx.x % 8);
    copy16(base + offset, x);
    ldsm(r, base + fragment_offset(fa, 1));
}
"""


def test_swizzle_helpers_whose_offsets_reach_shared_asm():
    features = {(f.locus, f.name) for f in source_features(ASM_HELPERS)}
    assert {("swizzle_offset", "xor_swizzle"), ("fragment_offset", "xor_swizzle")} <= features
    assert ("k", "xor_swizzle") not in features and ("make_addressing", "xor_swizzle") not in features


def test_a_phase_xor_helper_that_never_reaches_shared_memory_is_no_swizzle():
    source = ASM_HELPERS.replace('"r"(addr)', '"r"(0u)').replace('"r"(smem_addr)', '"r"(0u)')
    assert not any(f.name == "xor_swizzle" for f in source_features(source))


@pytest.mark.parametrize("exchange", [
    "s[threadIdx.x ^ 1] = x[0];",  # a butterfly partner through shared memory
    "int lane = threadIdx.x & 31;\nfor (int offset = 16; offset > 0; offset /= 2) s[lane ^ offset] = x[0];",
    "s[(threadIdx.x & 31) ^ 16] = x[0];",  # a lane id, not a row phase: a shuffle's scratch exchange
    "s[(threadIdx.x % 32) ^ 8] = x[0];",
    "for (int j = 1; j < 64; j *= 2) { int i = threadIdx.x; s[i ^ j] = s[i]; }",  # a bitonic partner
])
def test_lane_exchanges_are_not_swizzles(exchange):
    assert "xor_swizzle" not in names(kernel("__shared__ float s[64];\n" + exchange))


def test_lane_exchange_helpers_are_not_swizzles():
    source = ("__device__ int partner(int lane, int offset) { return (lane & 31) ^ offset; }\n"
              "__device__ int bitonic(int i, int j) { return i ^ j; }\n"
              + kernel("__shared__ float s[64];\ns[partner(threadIdx.x, 4)] = s[bitonic(threadIdx.x, 2)];"))
    assert not any(f.name == "xor_swizzle" for f in source_features(source))
