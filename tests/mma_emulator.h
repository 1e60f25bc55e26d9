// What the CPU emulators of mma.sync kernels share (tests/gdn_mma_emulator.cpp,
// tests/fmha_mma_emulator.cpp): each runs a kernel's own source on the CPU, every CUDA thread of a CTA a
// fiber (ucontext), CTAs one after another, with the PTX the kernel wraps emulated as the PTX ISA defines
// it. An emulator includes this header, defines the kernel's PTX wrappers on the operations below (with
// the checks its kernel's calling convention allows), includes the kernel source, and drives the
// launches of a plan (read_plan, launch, finish).
//
// Here: the scheduler (threads run in forward, reverse or seeded random order between blocking points,
// or one warp at a time); warp-collective operations, reached by all 32 lanes together and the same one
// (ldmatrix.x4 plain and .trans, mma.sync m16n8k16 bf16 or f16 -> f32, shfl.sync.bfly, __syncwarp);
// __syncthreads reached by every thread (a deadlock is an error); cp.async with its commit groups and
// wait_group N, copies landing either when issued (eager) or only when a wait retires their group
// (late), and every cp.async committed and every group waited for by the end of the CTA; shared memory,
// NaN at the start of every CTA and never written past what the launch asks for, addressed either by
// generic pointer (check_shared) or by shared-window address (shared_at, __cvta_generic_to_shared, with
// the window at window_base); and the plan: guarded global buffers, inputs left unmodified.
//
// EMU_SMEM_ALIGN, defined before the include: the alignment of the dynamic shared memory's host array
// (what the kernel's `extern __shared__ __align__(N)` may rely on; default 1024).
#pragma once

#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
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
#include <utility>
#include <vector>

#ifndef EMU_SMEM_ALIGN
#define EMU_SMEM_ALIGN 1024
#endif

// The kernels' `extern __shared__ unsigned char smem[]`: one CTA runs at a time, so one array serves.
extern "C" {
alignas(EMU_SMEM_ALIGN) unsigned char smem[256 * 1024];
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
    std::fflush(stderr);
    std::_Exit(1);  // no destructors: the caller may be a fiber running on a stack they would free
}

constexpr size_t SMEM_CAPACITY = 256 * 1024;
static_assert(sizeof(smem) == SMEM_CAPACITY, "one capacity");
constexpr size_t STACK_BYTES = 256 * 1024;
enum Op { LDSM, LDSM_T, MMA_BF16, MMA_F16, SHFL, SYNCWARP };
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
    std::vector<std::vector<Copy>> groups;   // committed, not retired (oldest first)
};

struct Warp {
    int arrived = 0;
    uint64_t gen = 0;
    int op = -1;
    int shfl_offset = -1;
    const unsigned char* addr[32];
    uint32_t a[32][4], b[32][2];
    float c[32][4];
    uint32_t r[32][4];
    float d[32][4];
    uint32_t value[32], result[32];
};

uint32_t window_base = 1024;  // the shared-window address of smem[0]
size_t shared_bytes = 0;      // the launch's dynamic shared memory
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
std::vector<std::pair<const unsigned char*, size_t>> inputs;  // the plan's input buffers

void yield()
{
    swapcontext(&cur->ctx, &scheduler);
}

// A generic pointer into shared memory: inside the launch's dynamic shared memory, 16-byte aligned.
void check_shared(const void* p, size_t bytes, const char* what)
{
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < smem || c + bytes > smem + shared_bytes)
        die("%s: address %p is outside the %zu bytes of dynamic shared memory (offset %td)", what, p, shared_bytes,
            c - smem);
    if ((c - smem) % 16) die("%s: shared address offset %td is not 16-byte aligned", what, c - smem);
}

// A shared-window address (what __cvta_generic_to_shared gave, moved by the kernel) -> host memory.
unsigned char* shared_at(uint32_t address, size_t bytes, const char* what)
{
    if (address < window_base || address - window_base + bytes > shared_bytes)
        die("%s: shared address %u is outside the %zu bytes of dynamic shared memory at %u", what, address,
            shared_bytes, window_base);
    if (address % 16) die("%s: shared address %u is not 16-byte aligned", what, address);
    return smem + (address - window_base);
}

uint32_t shared_address(const void* p)
{
    const unsigned char* c = static_cast<const unsigned char*>(p);
    if (c < smem || c >= smem + SMEM_CAPACITY) die("__cvta_generic_to_shared of a pointer outside shared memory");
    return window_base + uint32_t(c - smem);
}

// The four 8 x 8 b16 matrices of an ldmatrix.x4: matrix i's row r starts at addr[8 i + r]. Plain: lane l
// gets row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of each; .trans: element l / 4 of rows 2 (l % 4)
// and 2 (l % 4) + 1.
void exec_ldsm(Warp& w, bool trans)
{
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

float half_bits_to_float(uint32_t h)
{
    const uint32_t sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    float x;
    if (exponent == 0)
        x = std::ldexp(float(mantissa), -24);
    else if (exponent == 31)
        x = mantissa ? NAN : INFINITY;
    else
        x = std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
    return sign ? -x : x;
}

// mma.m16n8k16.row.col, bf16 or f16 (to_float of a 16-bit element) -> f32. Lane l = 4 g + t holds A rows
// g, g + 8 at columns 2t, 2t + 1 (a0, a1) and 2t + 8, 2t + 9 (a2, a3); B rows (k) 2t, 2t + 1 (b0) and
// 2t + 8, 2t + 9 (b1) of column g; C rows g (c0, c1) and g + 8 (c2, c3) at columns 2t, 2t + 1. The lower
// index is the low half of each register.
template <float (*to_float)(uint32_t)>
void exec_mma(Warp& w)
{
    float A[16][16], Bm[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const int arow[4] = {g, g + 8, g, g + 8}, acol[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
            A[arow[i]][acol[i]] = to_float(w.a[l][i] & 0xFFFF);
            A[arow[i]][acol[i] + 1] = to_float(w.a[l][i] >> 16);
        }
        for (int i = 0; i < 2; ++i) {
            Bm[2 * t + 8 * i][g] = to_float(w.b[l][i] & 0xFFFF);
            Bm[2 * t + 8 * i + 1][g] = to_float(w.b[l][i] >> 16);
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
        if (op == MMA_BF16) exec_mma<bf16_bits_to_float>(w);
        if (op == MMA_F16) exec_mma<half_bits_to_float>(w);
        if (op == SHFL)
            for (int l = 0; l < 32; ++l) w.result[l] = w.value[l ^ w.shfl_offset];
        w.arrived = 0;
        w.shfl_offset = -1;
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
    std::memset(smem, 0xFF, SMEM_CAPACITY);  // NaN as bf16, fp16 and fp32
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
        if (!f.open.empty()) die("thread %d ended with cp.async copies never committed", f.warp * 32 + f.lane);
    for (const Fiber& f : fibers)
        if (!f.groups.empty()) die("thread %d ended with cp.async groups never waited for", f.warp * 32 + f.lane);
    for (size_t i = shared_bytes; i < SMEM_CAPACITY; ++i)
        if (smem[i] != 0xFF) die("shared memory written at byte %zu, past the %zu the launch has", i, shared_bytes);
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
                block_idx = order == REVERSE || order == WARPS_REVERSE
                                ? make_uint3(grid.x - 1 - x, grid.y - 1 - y, grid.z - 1 - z)
                                : make_uint3(x, y, z);
                run_cta(block);
            }
}

// ---- the operations the kernels' PTX wrappers stand for, per thread ------------------------------------

// ldmatrix.x4 (op LDSM) or ldmatrix.x4.trans (LDSM_T): this lane gives the row at `row` (host memory,
// checked by the wrapper).
void ldmatrix_x4(uint32_t (&r)[4], const unsigned char* row, Op op)
{
    warps[cur->warp].addr[cur->lane] = row;
    collective(op);
    for (int i = 0; i < 4; ++i) r[i] = warps[cur->warp].r[cur->lane][i];
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16 (op MMA_BF16), f16 (MMA_F16)}, d = a b + d.
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, Op op)
{
    Warp& w = warps[cur->warp];
    const int l = cur->lane;
    for (int i = 0; i < 4; ++i) {
        w.a[l][i] = a[i];
        w.c[l][i] = d[i];
    }
    w.b[l][0] = b0;
    w.b[l][1] = b1;
    collective(op);
    for (int i = 0; i < 4; ++i) d[i] = warps[cur->warp].d[l][i];
}

// cp.async of 16 bytes (a zero fill unless valid), its addresses checked by the wrapper.
void cp_async(unsigned char* dst, const unsigned char* src, bool valid)
{
    const Copy copy{dst, src, valid};
    if (eager)
        do_copies({copy});
    else
        cur->open.push_back(copy);
}

// cp.async.commit_group
void commit_group()
{
    cur->groups.push_back(std::move(cur->open));
    cur->open.clear();
}

// cp.async.wait_group PENDING: every committed group but the newest PENDING has landed.
void wait_group(int pending)
{
    auto& groups = cur->groups;
    while (int(groups.size()) > pending) {
        do_copies(groups.front());
        groups.erase(groups.begin());
    }
}

// shfl.sync.bfly of a float across the whole warp.
float shfl_xor(unsigned mask, float x, int offset)
{
    if (mask != 0xffffffffu) die("__shfl_xor_sync with mask %#x (the kernel's shuffles are warp-wide)", mask);
    if (offset < 1 || offset > 31) die("__shfl_xor_sync lane offset %d", offset);
    Warp& w = warps[cur->warp];
    if (w.arrived > 0 && w.op == SHFL && w.shfl_offset != offset)
        die("warp %d: lanes shuffle with different offsets (%d and %d)", cur->warp, w.shfl_offset, offset);
    std::memcpy(&w.value[cur->lane], &x, 4);
    if (w.arrived == 0) w.shfl_offset = offset;
    const int lane = cur->lane;
    collective(SHFL);
    float y;
    std::memcpy(&y, &warps[cur->warp].result[lane], 4);
    return y;
}

// ---- the driver ----------------------------------------------------------------------------------------

// The command line's schedule: <order: forward|reverse|random|warps|warps_reverse> <seed> <copies: eager|late>.
void set_schedule(const std::string& name, const char* seed, const std::string& copies)
{
    const std::map<std::string, Order> orders = {{"forward", FORWARD}, {"reverse", REVERSE}, {"random", RANDOM},
        {"warps", WARPS}, {"warps_reverse", WARPS_REVERSE}};
    if (!orders.count(name)) die("unknown order %s", name.c_str());
    order = orders.at(name);
    rng.seed(std::atoi(seed));
    eager = copies == "eager";
}

struct Arg {
    bool buffer;
    std::string name;
    long long value;
};

struct Launch {
    std::string entry;
    uint3 grid, block;
    size_t shared;
    std::vector<Arg> args;
};

// <dir>/plan.txt: "buffer <name> <dtype> <count> <input|output|inout|scratch>" and
// "launch <entry> gx gy gz bx by bz shared <args...>" with args "buf:<name>" or "i32:<value>". Inputs are
// read from <dir>/<name>.bin, and so are inout outputs (an accumulator's start); outputs and scratch buffers are
// written back there by finish(). Every buffer
// sits 256-byte aligned between guards of 0xFF bytes.
struct Plan {
    static constexpr size_t GUARD = 4096;
    std::string dir;
    std::map<std::string, std::vector<unsigned char>> storage, pristine;
    std::map<std::string, std::pair<std::string, size_t>> meta;  // dtype, bytes
    std::map<std::string, unsigned char*> data;
    std::vector<std::string> inputs, outputs;
    std::vector<Launch> launches;

    // element_bytes(name, dtype): the size of an element of a buffer of that dtype (or die).
    Plan(const std::string& directory, size_t (*element_bytes)(const std::string&, const std::string&))
        : dir(directory)
    {
        std::ifstream plan(dir + "/plan.txt");
        if (!plan) die("no %s/plan.txt", dir.c_str());
        std::string line;
        while (std::getline(plan, line)) {
            std::istringstream in(line);
            std::string kind;
            in >> kind;
            if (kind == "buffer") {
                std::string name, dtype, role;
                size_t count;
                in >> name >> dtype >> count >> role;
                const size_t bytes = count * element_bytes(name, dtype);
                auto& raw = storage[name];
                raw.assign(bytes + 2 * GUARD + 256, 0xFF);
                unsigned char* start = raw.data() + GUARD;
                start += (256 - reinterpret_cast<uintptr_t>(start) % 256) % 256;
                data[name] = start;
                meta[name] = {dtype, bytes};
                if (role == "input" || role == "inout") {  // an inout output starts from its file's values
                    std::ifstream f(dir + "/" + name + ".bin", std::ios::binary);
                    if (!f.read(reinterpret_cast<char*>(start), bytes)) die("cannot read %s.bin", name.c_str());
                }
                if (role == "input") {
                    inputs.push_back(name);
                    emu::inputs.push_back({start, bytes});
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
                        die("bad argument %s", a.c_str());
                }
                launches.push_back(l);
            }
        }
        for (const auto& name : inputs) pristine[name].assign(data[name], data[name] + meta[name].second);
    }

    // Argument i of launch l: a buffer of `dtype`, or an i32.
    void* buffer(const Launch& l, size_t i, const char* dtype)
    {
        if (i >= l.args.size() || !l.args[i].buffer) die("%s: argument %zu must be a buffer", l.entry.c_str(), i);
        const auto it = data.find(l.args[i].name);
        if (it == data.end()) die("%s: unknown buffer %s", l.entry.c_str(), l.args[i].name.c_str());
        if (meta[l.args[i].name].first != dtype)
            die("%s: argument %zu (%s) is %s, the kernel takes %s", l.entry.c_str(), i, l.args[i].name.c_str(),
                meta[l.args[i].name].first.c_str(), dtype);
        return it->second;
    }

    int i32(const Launch& l, size_t i) const
    {
        if (i >= l.args.size() || l.args[i].buffer) die("%s: argument %zu must be an i32", l.entry.c_str(), i);
        return int(l.args[i].value);
    }

    // After the launches: the guards untouched, the inputs unmodified; the outputs written back.
    void finish()
    {
        for (auto& [name, raw] : storage) {
            const unsigned char* start = data[name];
            const size_t bytes = meta[name].second;
            for (const unsigned char* p = raw.data(); p < start; ++p)
                if (*p != 0xFF) die("buffer %s: written before its start (byte %td)", name.c_str(), p - start);
            for (const unsigned char* p = start + bytes; p < raw.data() + raw.size(); ++p)
                if (*p != 0xFF) die("buffer %s: written past its end (byte %td)", name.c_str(), p - start);
        }
        for (const auto& name : inputs)
            if (std::memcmp(pristine[name].data(), data[name], meta[name].second))
                die("input %s was modified", name.c_str());
        for (const auto& name : outputs) {
            std::ofstream f(dir + "/" + name + ".bin", std::ios::binary);
            f.write(reinterpret_cast<const char*>(data[name]), meta[name].second);
        }
    }
};

}  // namespace emu

// ---- what the kernel source sees ------------------------------------------------------------------------
#define __launch_bounds__(...)
#define threadIdx (emu::cur->tid)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define __syncthreads() emu::syncthreads()
#define __syncwarp(...) emu::collective(emu::SYNCWARP)
#define __shfl_xor_sync(mask, x, offset) emu::shfl_xor(mask, x, offset)
#define __cvta_generic_to_shared(p) emu::shared_address(p)
