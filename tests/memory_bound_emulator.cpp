// The memory-bound corpus kernels (tests/test_corpus_memory_bound.py) run on the CPU: the kernel's own
// source, every CUDA thread a fiber and CTAs one after another (tests/mma_emulator.h), so that indexing,
// masking, barriers and shuffles are exercised without a GPU. What a GPU adds (timing, the memory model
// beyond barriers) is the GPU gate's business.
//
// What the kernel source sees beyond mma_emulator.h: static __shared__ arrays become function statics
// (one CTA runs at a time, so every fiber of it shares them); __ldg is a plain load; __shfl_up_sync is
// a warp-collective exchange; the fast-math intrinsics are their accurate host functions. The test
// replaces a kernel's `extern __shared__` declaration with a pointer to the emulator's smem, and
// includes every kernel at KERNEL_SOURCE, each in a namespace of its own (their constants share names).
// Usage: emulator <dir> <order> <seed> <eager|late>, the plan in <dir>/plan.txt (mma_emulator.h's Plan);
// f32 scalars travel as the i32 of their bits.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "mma_emulator.h"

namespace mb {

float up_value[64][32];  // __shfl_up_sync's exchange, per warp and lane

float shfl_up(unsigned mask, float x, int offset)
{
    if (mask != 0xffffffffu) emu::die("__shfl_up_sync with mask %#x (the kernels' shuffles are warp-wide)", mask);
    const int w = emu::cur->warp, l = emu::cur->lane;
    up_value[w][l] = x;
    emu::collective(emu::SYNCWARP);  // every lane has written
    const float y = l >= offset ? up_value[w][l - offset] : x;
    emu::collective(emu::SYNCWARP);  // every lane has read before any lane writes again
    return y;
}

}  // namespace mb

#undef __shared__
#define __shared__ static
#define __ldg(p) (*(p))
#define __shfl_up_sync(mask, x, offset) mb::shfl_up(mask, x, offset)
#define __expf(x) std::exp(x)
#define __logf(x) std::log(x)
#define __fmul_rn(a, b) ((a) * (b))
#define rsqrtf(x) (1.0f / std::sqrt(x))
using std::max;
using std::min;

#include KERNEL_SOURCE

namespace {

size_t dtype_size(const std::string& name, const std::string& dtype)
{
    if (dtype == "bfloat16") return 2;
    if (dtype == "float32" || dtype == "int32") return 4;
    if (dtype == "int64") return 8;
    emu::die("unknown dtype %s for buffer %s", dtype.c_str(), name.c_str());
}

// One launch of the plan: the entry named `l.entry` of the included kernel, its arguments by position.
struct Call {
    emu::Plan& plan;
    const emu::Launch& l;
    float* f32(size_t i) { return static_cast<float*>(plan.buffer(l, i, "float32")); }
    int* i32p(size_t i) { return static_cast<int*>(plan.buffer(l, i, "int32")); }
    int64_t* i64(size_t i) { return static_cast<int64_t*>(plan.buffer(l, i, "int64")); }
    __nv_bfloat16* bf16(size_t i) { return static_cast<__nv_bfloat16*>(plan.buffer(l, i, "bfloat16")); }
    int i32(size_t i) { return plan.i32(l, i); }
    float scalar_f32(size_t i)
    {
        const int bits = plan.i32(l, i);
        float v;
        std::memcpy(&v, &bits, 4);
        return v;
    }
    void run(std::function<void()> body) { emu::launch(l.grid, l.block, l.shared, std::move(body)); }
};

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 5) emu::die("usage: %s <dir> <order> <seed> <eager|late>", argv[0]);
    emu::set_schedule(argv[2], argv[3], argv[4]);
    emu::Plan plan(argv[1], dtype_size);
    for (const emu::Launch& l : plan.launches) {
        Call c{plan, l};
        const std::string& e = l.entry;
        if (e == "group_norm_naive") { auto x = c.f32(0); auto w = c.f32(1); auto b = c.f32(2); auto y = c.f32(3);
            int n = c.i32(4), ch = c.i32(5), hw = c.i32(6), g = c.i32(7);
            c.run([=] { group_norm_naive(x, w, b, y, n, ch, hw, g); }); continue; }
        if (e == "group_norm_smem_vec4") { auto x = c.f32(0); auto w = c.f32(1); auto b = c.f32(2); auto y = c.f32(3);
            int n = c.i32(4), ch = c.i32(5), hw = c.i32(6), g = c.i32(7), cl = c.i32(8);
            c.run([=] { group_norm_smem_vec4(x, w, b, y, n, ch, hw, g, cl); }); continue; }
        if (e == "causal_softmax_naive") { auto x = c.f32(0); auto y = c.f32(1);
            int bh = c.i32(2), sq = c.i32(3), sk = c.i32(4); float s = c.scalar_f32(5);
            c.run([=] { causal_softmax_naive(x, y, bh, sq, sk, s); }); continue; }
        if (e == "causal_softmax_warp_vec4") { auto x = c.f32(0); auto y = c.f32(1);
            int bh = c.i32(2), sq = c.i32(3), sk = c.i32(4); float s = c.scalar_f32(5);
            c.run([=] { causal_softmax_warp_vec4(x, y, bh, sq, sk, s); }); continue; }
        if (e == "rope_naive") { auto x = c.bf16(0); auto co = c.f32(1); auto si = c.f32(2); auto y = c.bf16(3);
            int b = c.i32(4), s = c.i32(5), h = c.i32(6), d = c.i32(7);
            c.run([=] { rope_naive(x, co, si, y, b, s, h, d); }); continue; }
        if (e == "rope_pack8") { auto x = c.bf16(0); auto co = c.f32(1); auto si = c.f32(2); auto y = c.bf16(3);
            int b = c.i32(4), s = c.i32(5), h = c.i32(6), d = c.i32(7);
            c.run([=] { rope_pack8(x, co, si, y, b, s, h, d); }); continue; }
        if (e == "column_max_naive") { auto x = c.f32(0); auto v = c.f32(1); auto i = c.i64(2);
            int r = c.i32(3), k = c.i32(4);
            c.run([=] { column_max_naive(x, v, i, r, k); }); continue; }
        if (e == "column_max_split") { auto x = c.f32(0); auto pv = c.f32(1); auto pi = c.i32p(2);
            int r = c.i32(3), k = c.i32(4);
            c.run([=] { column_max_split(x, pv, pi, r, k); }); continue; }
        if (e == "column_max_merge") { auto pv = c.f32(0); auto pi = c.i32p(1); auto v = c.f32(2); auto i = c.i64(3);
            int ch = c.i32(4), k = c.i32(5);
            c.run([=] { column_max_merge(pv, pi, v, i, ch, k); }); continue; }
        if (e == "logcumsumexp_naive") { auto x = c.f32(0); auto y = c.f32(1); int r = c.i32(2), k = c.i32(3);
            c.run([=] { logcumsumexp_naive(x, y, r, k); }); continue; }
        if (e == "logcumsumexp_block_scan") { auto x = c.f32(0); auto y = c.f32(1); int r = c.i32(2), k = c.i32(3);
            c.run([=] { logcumsumexp_block_scan(x, y, r, k); }); continue; }
        if (e == "nchw_to_nhwc_naive") { auto x = c.f32(0); auto y = c.f32(1); int n = c.i32(2), ch = c.i32(3), hw = c.i32(4);
            c.run([=] { nchw_to_nhwc_naive(x, y, n, ch, hw); }); continue; }
        if (e == "nchw_to_nhwc_smem_tile") { auto x = c.f32(0); auto y = c.f32(1);
            int n = c.i32(2), ch = c.i32(3), hw = c.i32(4);
            c.run([=] { nchw_to_nhwc_smem_tile(x, y, n, ch, hw); }); continue; }
        if (e == "embedding_bag_naive") { auto w = c.f32(0); auto ix = c.i64(1); auto o = c.f32(2);
            int bags = c.i32(3), bag = c.i32(4), d = c.i32(5);
            c.run([=] { embedding_bag_naive(w, ix, o, bags, bag, d); }); continue; }
        if (e == "embedding_bag_gather_vec4") { auto w = c.f32(0); auto ix = c.i64(1); auto o = c.f32(2);
            int bags = c.i32(3), bag = c.i32(4), d = c.i32(5);
            c.run([=] { embedding_bag_gather_vec4(w, ix, o, bags, bag, d); }); continue; }
        if (e == "sgd_nesterov_naive") { auto p = c.f32(0); auto g = c.f32(1); auto b = c.f32(2); auto po = c.f32(3);
            auto bo = c.f32(4); int n = c.i32(5);
            c.run([=] { sgd_nesterov_naive(p, g, b, po, bo, n); }); continue; }
        if (e == "sgd_nesterov_vec4_grid") { auto p = c.f32(0); auto g = c.f32(1); auto b = c.f32(2); auto po = c.f32(3);
            auto bo = c.f32(4); int n = c.i32(5);
            c.run([=] { sgd_nesterov_vec4_grid(p, g, b, po, bo, n); }); continue; }
        if (e == "add_rms_norm_naive") { auto x = c.bf16(0); auto r = c.bf16(1); auto w = c.bf16(2); auto y = c.bf16(3);
            auto h = c.bf16(4); int rows = c.i32(5), d = c.i32(6);
            c.run([=] { add_rms_norm_naive(x, r, w, y, h, rows, d); }); continue; }
        if (e == "add_rms_norm_pack8_regs") { auto x = c.bf16(0); auto r = c.bf16(1); auto w = c.bf16(2);
            auto y = c.bf16(3); auto h = c.bf16(4); int rows = c.i32(5), d = c.i32(6);
            c.run([=] { add_rms_norm_pack8_regs(x, r, w, y, h, rows, d); }); continue; }
        emu::die("unknown entry %s", e.c_str());
    }
    plan.finish();
    return 0;
}
