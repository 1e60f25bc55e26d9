// Runs gdn/chunked_mma's kernel source on the CPU: every CUDA thread of a CTA is a fiber (ucontext),
// CTAs run one after another, and the PTX the kernel wraps (ldmatrix, mma.sync, cp.async) is emulated as
// the PTX ISA defines it. tests/test_corpus_gdn_mma.py builds it with the kernel's source, minus its PTX
// wrappers, spliced in at KERNEL_SOURCE.
//
// What it checks besides the numbers: warp-collective operations reached by all 32 lanes together and
// the same one; __syncthreads reached by every thread (a deadlock is an error); ldmatrix and cp.async
// addresses 16-byte aligned and inside the launch's dynamic shared memory; every cp.async committed and
// waited for; nothing written past the shared memory the plan asks for or outside any global buffer
// (guards); shared memory starts as NaN in every CTA. Races show up as results that change with the
// schedule: threads run in forward, reverse or seeded random order between blocking points, and
// cp.async copies land either when issued (eager) or only when their thread waits (late).
//
//   gdn_mma_emulator <dir> <order: forward|reverse|random|warps|warps_reverse> <seed> <copies: eager|late>
// reads <dir>/plan.txt and the inputs <dir>/<name>.bin, writes the outputs and scratch buffers as
// <dir>/<name>.bin; exits 1 with a message on
// stderr when a check fails.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdarg>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

// The kernels' `extern __shared__ unsigned char smem[]`: one CTA runs at a time, so one array serves.
extern "C" {
alignas(128) unsigned char smem[256 * 1024];
}

namespace emu {

[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char* fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    std::exit(1);
}

constexpr size_t SMEM_CAPACITY = 256 * 1024;
constexpr size_t STACK_BYTES = 256 * 1024;
enum Op { LDSM, LDSM_T, MMA, SYNCWARP };
enum State { READY, WAIT_WARP, WAIT_BLOCK, DONE };
// FORWARD, REVERSE, RANDOM: every thread that can run takes one step (to its next blocking point) per
// round, in that order; WARPS, WARPS_REVERSE: one warp runs until it blocks on __syncthreads (or ends)
// before the next starts, the widest skew between warps there can be.
enum Order { FORWARD, REVERSE, RANDOM, WARPS, WARPS_REVERSE };

struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    bool valid;
};

struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    uint3 tid;
    int warp = 0, lane = 0;
    State state = READY;
    uint64_t wait_gen = 0;
    std::vector<Copy> open;                  // issued, not committed
    std::vector<std::vector<Copy>> groups;   // committed, not waited for
};

struct Warp {
    int arrived = 0;
    uint64_t gen = 0;
    int op = -1;
    const unsigned char* addr[32];
    uint32_t a[32][4], b[32][2];
    float c[32][4];
    uint32_t r[32][4];
    float d[32][4];
};

unsigned char* const shared_mem = smem;
static_assert(sizeof(smem) == SMEM_CAPACITY, "one capacity");
size_t shared_bytes = 0;  // the launch's dynamic shared memory
std::vector<Fiber> fibers;
std::vector<Warp> warps;
int block_arrived = 0;
uint64_t block_gen = 0;
Fiber* cur = nullptr;
ucontext_t scheduler;
std::function<void()> body;
uint3 block_idx, grid_dim, block_dim;
Order order = FORWARD;
bool eager = true;
std::mt19937 rng(1);

void yield()
{
    swapcontext(&cur->ctx, &scheduler);
}

void check_shared(const void* p, size_t bytes, const char* what)
{
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < shared_mem || c + bytes > shared_mem + shared_bytes)
        die("%s: address %p is outside the %zu bytes of dynamic shared memory (offset %td)", what, p, shared_bytes,
            c - shared_mem);
    if ((c - shared_mem) % 16) die("%s: shared address offset %td is not 16-byte aligned", what, c - shared_mem);
}

// The four 8 x 8 b16 matrices of an ldmatrix.x4: matrix i's row r starts at addr[8 i + r].
void exec_ldsm(Warp& w, bool trans)
{
    for (int l = 0; l < 32; ++l) check_shared(w.addr[l], 16, trans ? "ldmatrix.trans" : "ldmatrix");
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
            uint16_t lo, hi;
            if (!trans) {
                const unsigned char* row = w.addr[8 * i + l / 4];
                std::memcpy(&lo, row + 4 * (l % 4), 2);
                std::memcpy(&hi, row + 4 * (l % 4) + 2, 2);
            } else {
                std::memcpy(&lo, w.addr[8 * i + 2 * (l % 4)] + 2 * (l / 4), 2);
                std::memcpy(&hi, w.addr[8 * i + 2 * (l % 4) + 1] + 2 * (l / 4), 2);
            }
            w.r[l][i] = uint32_t(lo) | (uint32_t(hi) << 16);
        }
}

float bf16_bits_to_float(uint32_t bits16)
{
    const uint32_t f = bits16 << 16;
    float x;
    std::memcpy(&x, &f, 4);
    return x;
}

// mma.m16n8k16.row.col, bf16 -> f32. Lane l = 4 g + t holds A rows g, g + 8 at columns 2t, 2t + 1 (a0, a1)
// and 2t + 8, 2t + 9 (a2, a3); B rows (k) 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of column g; C rows g
// (c0, c1) and g + 8 (c2, c3) at columns 2t, 2t + 1. The lower index is the low half of each register.
void exec_mma(Warp& w)
{
    float A[16][16], Bm[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
            A[arow[i]][acol[i]] = bf16_bits_to_float(w.a[l][i] & 0xFFFF);
            A[arow[i]][acol[i] + 1] = bf16_bits_to_float(w.a[l][i] >> 16);
        }
        for (int i = 0; i < 2; ++i) {
            Bm[2 * t + 8 * i][g] = bf16_bits_to_float(w.b[l][i] & 0xFFFF);
            Bm[2 * t + 8 * i + 1][g] = bf16_bits_to_float(w.b[l][i] >> 16);
        }
        C[g][2 * t] = w.c[l][0];
        C[g][2 * t + 1] = w.c[l][1];
        C[g + 8][2 * t] = w.c[l][2];
        C[g + 8][2 * t + 1] = w.c[l][3];
    }
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            float acc = C[m][n];
            for (int k = 0; k < 16; ++k) acc += A[m][k] * Bm[k][n];  // exact products, fp32 sums
            C[m][n] = acc;
        }
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        w.d[l][0] = C[g][2 * t];
        w.d[l][1] = C[g][2 * t + 1];
        w.d[l][2] = C[g + 8][2 * t];
        w.d[l][3] = C[g + 8][2 * t + 1];
    }
}

// All 32 lanes must arrive at the same operation; the last one to arrive performs it for the warp.
void collective(Op op)
{
    Warp& w = warps[cur->warp];
    if (w.arrived == 0)
        w.op = op;
    else if (w.op != op)
        die("warp %d: lanes reach different warp-collective operations (%d and %d)", cur->warp, w.op, op);
    if (++w.arrived == 32) {
        if (op == LDSM || op == LDSM_T) exec_ldsm(w, op == LDSM_T);
        if (op == MMA) exec_mma(w);
        w.arrived = 0;
        ++w.gen;
        cur->state = READY;  // everyone, the last lane included, goes back through the scheduler
    } else {
        cur->state = WAIT_WARP;
        cur->wait_gen = w.gen;
    }
    yield();
}

void syncthreads()
{
    if (warps[cur->warp].arrived) die("__syncthreads while warp %d is inside a warp-collective operation", cur->warp);
    if (++block_arrived == int(fibers.size())) {
        block_arrived = 0;
        ++block_gen;
        cur->state = READY;
    } else {
        cur->state = WAIT_BLOCK;
        cur->wait_gen = block_gen;
    }
    yield();
}

void do_copies(const std::vector<Copy>& copies)
{
    for (const Copy& c : copies) {
        if (c.valid)
            std::memcpy(c.dst, c.src, 16);
        else
            std::memset(c.dst, 0, 16);
    }
}

void trampoline()
{
    body();
    cur->state = DONE;
    swapcontext(&cur->ctx, &scheduler);
}

bool runnable(const Fiber& f)
{
    switch (f.state) {
    case READY: return true;
    case WAIT_WARP: return warps[f.warp].gen != f.wait_gen;
    case WAIT_BLOCK: return block_gen != f.wait_gen;
    default: return false;
    }
}

void run_cta(uint3 block)
{
    const int n = int(block.x * block.y * block.z);
    if (n % 32) die("block of %d threads is not whole warps", n);
    fibers.resize(n);
    warps.assign(n / 32, Warp());
    block_arrived = 0;
    block_gen = 0;
    std::memset(shared_mem, 0xFF, SMEM_CAPACITY);  // NaN as bf16 and as fp32
    for (int i = 0; i < n; ++i) {
        Fiber& f = fibers[i];
        f.stack.resize(STACK_BYTES);
        f.tid = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
        f.warp = i / 32;
        f.lane = i % 32;
        f.state = READY;
        f.open.clear();
        f.groups.clear();
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, trampoline, 0);
    }
    std::vector<int> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = i;
    const int nwarps = n / 32;
    for (;;) {
        if (order == REVERSE) std::reverse(ids.begin(), ids.end());
        if (order == RANDOM) std::shuffle(ids.begin(), ids.end(), rng);
        bool ran = false, all_done = true;
        int only_warp = -1;  // warp-serial orders: only the first warp (in order) that can run
        if (order == WARPS || order == WARPS_REVERSE)
            for (int k = 0; k < nwarps && only_warp < 0; ++k) {
                const int w = order == WARPS ? k : nwarps - 1 - k;
                for (int l = 0; l < 32; ++l)
                    if (runnable(fibers[w * 32 + l])) only_warp = w;
            }
        for (int i : ids) {
            Fiber& f = fibers[i];
            if (f.state == DONE) continue;
            all_done = false;
            if (!runnable(f) || (only_warp >= 0 && f.warp != only_warp)) continue;
            f.state = READY;
            cur = &f;
            swapcontext(&scheduler, &f.ctx);
            ran = true;
        }
        if (all_done) break;
        if (!ran) die("deadlock: no thread can run (a barrier or collective not reached by all)");
    }
    for (const Fiber& f : fibers)
        if (!f.open.empty() || !f.groups.empty())
            die("thread %d ended with cp.async copies never committed or waited for", f.warp * 32 + f.lane);
    for (size_t i = shared_bytes; i < SMEM_CAPACITY; ++i)
        if (shared_mem[i] != 0xFF) die("shared memory written at byte %zu, past the %zu the launch has", i, shared_bytes);
}

void launch(uint3 grid, uint3 block, size_t shared, std::function<void()> fn)
{
    if (shared > SMEM_CAPACITY) die("launch asks for %zu bytes of shared memory", shared);
    shared_bytes = shared;
    grid_dim = grid;
    block_dim = block;
    body = std::move(fn);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                block_idx = order == REVERSE || order == WARPS_REVERSE ? make_uint3(grid.x - 1 - x, grid.y - 1 - y, grid.z - 1 - z)
                                             : make_uint3(x, y, z);
                run_cta(block);
            }
}

}  // namespace emu

// ---- the kernel's PTX wrappers, emulated ------------------------------------------------------------
__forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row)
{
    emu::warps[emu::cur->warp].addr[emu::cur->lane] = static_cast<const unsigned char*>(row);
    emu::collective(emu::LDSM);
    for (int i = 0; i < 4; ++i) r[i] = emu::warps[emu::cur->warp].r[emu::cur->lane][i];
}

__forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row)
{
    emu::warps[emu::cur->warp].addr[emu::cur->lane] = static_cast<const unsigned char*>(row);
    emu::collective(emu::LDSM_T);
    for (int i = 0; i < 4; ++i) r[i] = emu::warps[emu::cur->warp].r[emu::cur->lane][i];
}

__forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    emu::Warp& w = emu::warps[emu::cur->warp];
    const int l = emu::cur->lane;
    for (int i = 0; i < 4; ++i) {
        w.a[l][i] = a[i];
        w.c[l][i] = d[i];
    }
    w.b[l][0] = b0;
    w.b[l][1] = b1;
    emu::collective(emu::MMA);
    for (int i = 0; i < 4; ++i) d[i] = emu::warps[emu::cur->warp].d[l][i];
}

__forceinline__ void cp_async16(void* dst, const void* src, bool valid)
{
    emu::check_shared(dst, 16, "cp.async destination");
    if (valid && reinterpret_cast<uintptr_t>(src) % 16) emu::die("cp.async source %p is not 16-byte aligned", src);
    const emu::Copy copy{static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), valid};
    if (emu::eager)
        emu::do_copies({copy});
    else
        emu::cur->open.push_back(copy);
}

__forceinline__ void cp_async_commit()
{
    emu::cur->groups.push_back(std::move(emu::cur->open));
    emu::cur->open.clear();
}

__forceinline__ void cp_async_wait_all()
{
    for (const auto& group : emu::cur->groups) emu::do_copies(group);
    emu::cur->groups.clear();
}

#define __launch_bounds__(...)
#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define __syncthreads() emu::syncthreads()
#define __syncwarp(...) emu::collective(emu::SYNCWARP)

#include KERNEL_SOURCE

// ---- the driver ---------------------------------------------------------------------------------------
namespace {

size_t dtype_size(const std::string& dtype)
{
    if (dtype == "bfloat16") return 2;
    if (dtype == "float32") return 4;
    emu::die("unknown dtype %s", dtype.c_str());
}

}  // namespace

struct Arg {
    bool buffer;
    std::string name;
    long long value;
};

int main(int argc, char** argv)
{
    if (argc != 5) emu::die("usage: %s <dir> <order> <seed> <eager|late>", argv[0]);
    const std::string dir = argv[1], order = argv[2], copies = argv[4];
    const std::map<std::string, emu::Order> orders = {{"forward", emu::FORWARD}, {"reverse", emu::REVERSE},
        {"random", emu::RANDOM}, {"warps", emu::WARPS}, {"warps_reverse", emu::WARPS_REVERSE}};
    if (!orders.count(order)) emu::die("unknown order %s", order.c_str());
    emu::order = orders.at(order);
    emu::rng.seed(std::atoi(argv[3]));
    emu::eager = copies == "eager";

    // plan.txt: "buffer <name> <dtype> <count> <input|output|scratch>" and
    // "launch <entry> gx gy gz bx by bz shared <args...>" with args "buf:<name>" or "i32:<value>".
    std::map<std::string, std::vector<unsigned char>> storage;
    std::map<std::string, std::pair<std::string, size_t>> meta;  // dtype, bytes
    std::map<std::string, unsigned char*> data;
    std::vector<std::string> inputs, outputs;
    struct Launch {
        std::string entry;
        uint3 grid, block;
        size_t shared;
        std::vector<Arg> args;
    };
    std::vector<Launch> launches;
    std::ifstream plan(dir + "/plan.txt");
    if (!plan) emu::die("no %s/plan.txt", dir.c_str());
    std::string line;
    constexpr size_t GUARD = 4096;
    while (std::getline(plan, line)) {
        std::istringstream in(line);
        std::string kind;
        in >> kind;
        if (kind == "buffer") {
            std::string name, dtype, role;
            size_t count;
            in >> name >> dtype >> count >> role;
            const size_t bytes = count * dtype_size(dtype);
            auto& raw = storage[name];
            raw.assign(bytes + 2 * GUARD + 256, 0xFF);
            unsigned char* start = raw.data() + GUARD;
            start += (256 - reinterpret_cast<uintptr_t>(start) % 256) % 256;
            data[name] = start;
            meta[name] = {dtype, bytes};
            if (role == "input") {
                std::ifstream f(dir + "/" + name + ".bin", std::ios::binary);
                if (!f.read(reinterpret_cast<char*>(start), bytes)) emu::die("cannot read %s.bin", name.c_str());
                inputs.push_back(name);
            } else {
                outputs.push_back(name);  // outputs and scratch are written back
            }
        } else if (kind == "launch") {
            Launch l;
            in >> l.entry >> l.grid.x >> l.grid.y >> l.grid.z >> l.block.x >> l.block.y >> l.block.z >> l.shared;
            std::string a;
            while (in >> a) {
                if (a.rfind("buf:", 0) == 0)
                    l.args.push_back({true, a.substr(4), 0});
                else if (a.rfind("i32:", 0) == 0)
                    l.args.push_back({false, "", std::atoll(a.c_str() + 4)});
                else
                    emu::die("bad argument %s", a.c_str());
            }
            launches.push_back(l);
        }
    }
    std::map<std::string, std::vector<unsigned char>> pristine;
    for (const auto& name : inputs) pristine[name].assign(data[name], data[name] + meta[name].second);

    for (const Launch& l : launches) {
        auto ptr = [&](size_t i, const char* dtype) -> void* {
            if (i >= l.args.size() || !l.args[i].buffer) emu::die("%s: argument %zu must be a buffer", l.entry.c_str(), i);
            const auto it = data.find(l.args[i].name);
            if (it == data.end()) emu::die("%s: unknown buffer %s", l.entry.c_str(), l.args[i].name.c_str());
            if (meta[l.args[i].name].first != dtype)
                emu::die("%s: argument %zu (%s) is %s, the kernel takes %s", l.entry.c_str(), i, l.args[i].name.c_str(),
                         meta[l.args[i].name].first.c_str(), dtype);
            return it->second;
        };
        auto i32 = [&](size_t i) -> int {
            if (i >= l.args.size() || l.args[i].buffer) emu::die("%s: argument %zu must be an i32", l.entry.c_str(), i);
            return int(l.args[i].value);
        };
        if (l.entry == "gdn_chunk_prep") {
            if (l.args.size() != 12) emu::die("gdn_chunk_prep takes 12 arguments, the plan passes %zu", l.args.size());
            auto q = (const bf16*)ptr(0, "bfloat16");
            auto k = (const bf16*)ptr(1, "bfloat16");
            auto g = (const float*)ptr(2, "float32");
            auto beta = (const bf16*)ptr(3, "bfloat16");
            auto x = (bf16*)ptr(4, "bfloat16");
            auto p = (bf16*)ptr(5, "bfloat16");
            auto gc = (float*)ptr(6, "float32");
            const int B = i32(7), T = i32(8), H = i32(9), HV = i32(10), DK = i32(11);
            emu::launch(l.grid, l.block, l.shared, [=] { gdn_chunk_prep(q, k, g, beta, x, p, gc, B, T, H, HV, DK); });
        } else if (l.entry == "gdn_chunk_state") {
            if (l.args.size() != 13) emu::die("gdn_chunk_state takes 13 arguments, the plan passes %zu", l.args.size());
            auto q = (const bf16*)ptr(0, "bfloat16");
            auto k = (const bf16*)ptr(1, "bfloat16");
            auto v = (const bf16*)ptr(2, "bfloat16");
            auto x = (const bf16*)ptr(3, "bfloat16");
            auto p = (const bf16*)ptr(4, "bfloat16");
            auto gc = (const float*)ptr(5, "float32");
            auto o = (bf16*)ptr(6, "bfloat16");
            const int B = i32(7), T = i32(8), H = i32(9), HV = i32(10), DK = i32(11), DV = i32(12);
            emu::launch(l.grid, l.block, l.shared, [=] { gdn_chunk_state(q, k, v, x, p, gc, o, B, T, H, HV, DK, DV); });
        } else {
            emu::die("unknown entry %s", l.entry.c_str());
        }
    }

    for (auto& [name, raw] : storage) {
        const unsigned char* start = data[name];
        const size_t bytes = meta[name].second;
        for (const unsigned char* p = raw.data(); p < start; ++p)
            if (*p != 0xFF) emu::die("buffer %s: written before its start (byte %td)", name.c_str(), p - start);
        for (const unsigned char* p = start + bytes; p < raw.data() + raw.size(); ++p)
            if (*p != 0xFF) emu::die("buffer %s: written past its end (byte %td)", name.c_str(), p - start);
    }
    for (const auto& name : inputs)
        if (std::memcmp(pristine[name].data(), data[name], meta[name].second))
            emu::die("input %s was modified", name.c_str());
    for (const auto& name : outputs) {
        std::ofstream f(dir + "/" + name + ".bin", std::ios::binary);
        f.write(reinterpret_cast<const char*>(data[name]), meta[name].second);
    }
    return 0;
}
