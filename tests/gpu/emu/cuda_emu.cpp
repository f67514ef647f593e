// Host emulation of the CUDA execution model, just enough to run runtime/kernels/colibri_kernels.cu
// on a CPU (tests/gpu/test_kernels_emu.py). It is a cross-check of the kernels' logic (indexing,
// fixed-shape reductions, the bitonic network, dispatch, tiling), not of NVRTC's code generation:
// the real kernels are compiled by NVRTC/ptxas in tests/test_cuda_host.py and run on a GPU by
// tests/gpu/test_kernels_pycuda.py.
//
// Model: blocks run one after another; the threads of a block are fibers (coroutines with their
// own stacks) on the calling OS thread, switched only at a barrier, so __syncthreads is a block barrier and
// __shfl_xor_sync/__syncwarp are per-warp barriers with an exchange slot. Fibers, not OS threads:
// a barrier then costs a user-space switch per thread instead of a futex wake and a kernel context
// switch per thread on a 2-core machine (the CUDA tests' time in CI, issue 25's CI budget), and
// the interleaving is the same on every run. __shared__ variables become function statics (one
// block alive at a time). "Device memory" is host memory: pointers are host addresses.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

struct uint3_ { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };

// The running fiber's indices: each fiber stores its own back after every switch (emu_yield), so
// a value the compiler keeps in a register across a barrier is still this fiber's.
static uint3_ threadIdx, blockIdx;
static uint3_ blockDim, gridDim;

// A barrier of `expected` fibers: the last to arrive opens it (bumps gen) and goes on; the others
// yield until gen moves. `g_blocked` counts fibers waiting at a barrier that has not opened: when
// it reaches the number of live fibers nobody can open one, which on a GPU is a hang (a
// __syncthreads some threads skip); here it is a message and an abort.
struct Barrier { unsigned expected, count, gen; };

// The switch between fibers. On x86-64 a few instructions (the SysV callee-saved registers pushed
// on the old stack, the stack pointer swapped, popped from the new one): glibc's swapcontext also
// saves the signal mask, a system call per switch, which was a third of the emulated tests' time.
// Elsewhere (or with -DCB_EMU_UCONTEXT) ucontext, portable and slower. The kernels change neither
// MXCSR nor the x87 control word, so those are not saved.
#if defined(__x86_64__) && !defined(CB_EMU_UCONTEXT)
struct FiberCtx { void *sp; };
extern "C" void cb_emu_switch(void **save_sp, void *next_sp);
asm(".text\n.p2align 4\n.type cb_emu_switch,@function\ncb_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size cb_emu_switch, .-cb_emu_switch\n");
static inline void ctx_switch(FiberCtx &from, FiberCtx &to) { cb_emu_switch(&from.sp, to.sp); }
static inline void ctx_jump(FiberCtx &to) { void *dead; cb_emu_switch(&dead, to.sp); }
// A fresh stack as cb_emu_switch leaves one: six zero registers, then `entry` as the return
// address, then a zero fake return address so `entry` starts with the stack aligned as after a
// call (rsp = 8 mod 16).
static void ctx_make(FiberCtx &c, char *stack, std::size_t size, void (*entry)()) {
    auto *top = reinterpret_cast<std::uintptr_t *>(
        reinterpret_cast<std::uintptr_t>(stack + size) & ~std::uintptr_t{15});
    *--top = 0;
    *--top = reinterpret_cast<std::uintptr_t>(entry);
    for (int i = 0; i < 6; i++) *--top = 0;
    c.sp = top;
}
#else
struct FiberCtx { ucontext_t uc; };
static inline void ctx_switch(FiberCtx &from, FiberCtx &to) { swapcontext(&from.uc, &to.uc); }
static inline void ctx_jump(FiberCtx &to) { setcontext(&to.uc); }
static void ctx_make(FiberCtx &c, char *stack, std::size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

struct Fiber {
    FiberCtx ctx;
    char *stack;
    uint3_ tid, bid;
    bool done;
};
static constexpr std::size_t kStack = 256 * 1024, kGuard = 4096; // kernels keep small locals
static std::vector<std::unique_ptr<Fiber>> g_fibers;                 // grown, never shrunk
static FiberCtx g_launcher;
static unsigned g_nfib, g_cur, g_live, g_blocked;
static const std::function<void()> *g_body;
static Barrier g_block_bar, g_between;

struct Warp {
    Barrier bar;
    float slot[32];
    unsigned mma_a[32][4], mma_b[32][2]; // each lane's A and B fragments of one mma
};
static std::vector<Warp> g_warps;

[[noreturn]] static void emu_die(const char *what) {
    std::fprintf(stderr, "cuda_emu: %s (block %u,%u, %u threads)\n", what, blockIdx.x, blockIdx.y,
                 blockDim.x);
    std::abort();
}

static unsigned next_live(unsigned from) {
    unsigned n = from;
    do n = (n + 1) % g_nfib; while (g_fibers[n]->done);
    return n;
}

// Switch to the next live fiber; back here when the ring comes round again.
static void emu_yield() {
    const unsigned me = g_cur, next = next_live(me);
    if (next == me) return;
    g_cur = next;
    Fiber &f = *g_fibers[me];
    ctx_switch(f.ctx, g_fibers[next]->ctx);
    threadIdx = f.tid;
    blockIdx = f.bid;
}

static void emu_wait(Barrier &b) {
    const unsigned gen = b.gen;
    if (++b.count == b.expected) {
        b.count = 0;
        b.gen++;
        g_blocked -= b.expected - 1;
        return;
    }
    if (++g_blocked == g_live) emu_die("deadlock: every thread waits at a barrier no one can open");
    while (b.gen == gen) emu_yield();
}

static inline void __syncthreads() { emu_wait(g_block_bar); }
static inline void __syncwarp(unsigned = 0xffffffffu) { emu_wait(g_warps[threadIdx.x / 32].bar); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    Warp &w = g_warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x & 31;
    w.slot[lane] = v;
    emu_wait(w.bar);
    const float r = w.slot[lane ^ (unsigned)o];
    emu_wait(w.bar);
    return r;
}
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
// The kernels' f16 -> f32 on the GPU is the hardware cvt.f32.f16 (inline PTX, compiled only
// under __CUDA_ARCH__); here the same exact conversion by float arithmetic: the 15 magnitude bits
// placed as an f32's (exponent bias 15 vs 127) and scaled by 2^112, which is exact for normals
// and subnormals alike; inf/NaN keep an all-ones exponent.
static inline float cb_emu_half_to_float(unsigned short h) {
    const unsigned sign = ((unsigned)h & 0x8000u) << 16, mag = (unsigned)h & 0x7fffu;
    float f;
    if (mag >= 0x7c00u) f = __uint_as_float(0x7f800000u | ((mag & 0x3ffu) << 13));
    else f = __uint_as_float(mag << 13) * 0x1p112f;
    unsigned bits;
    std::memcpy(&bits, &f, 4);
    return __uint_as_float(bits | sign);
}
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

// cvt.rna.tf32.f32 (PTX ISA, "cvt": f32 -> tf32, .rna = round to nearest, ties away from zero):
// keep the sign, exponent and top 10 mantissa bits, i.e. clear the low 13 bits after adding half
// of their weight to the magnitude (sign-magnitude, so a tie goes away from zero; a carry moves
// into the exponent as rounding up should, up to infinity). Infinity stays itself and NaN stays
// a NaN (a quiet one, in case rounding would clear its only payload bits).
static inline unsigned cb_emu_tf32(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return (u & 0x7fffffu) ? (u | 0x400000u) & 0xffffe000u : u;
    return (u + 0x1000u) & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 d, a, b, d for one warp, exactly as its
// fragments are laid out in the PTX ISA (section "Warp-level Matrix Fragments for mma.m16n8k8",
// the .tf32 tables). With g = lane / 4 and t = lane % 4, lane holds
//   A (16 x 8): a[0] = A[g][t], a[1] = A[g+8][t], a[2] = A[g][t+4], a[3] = A[g+8][t+4]
//   B (8 x 8):  b[0] = B[t][g], b[1] = B[t+4][g]
//   C, D (16 x 8, f32): d[q] = D[g + 8*(q/2)][2t + q%2]
// Each lane deposits its A and B fragments in the warp's exchange, all meet at the barrier, and
// each lane computes its own four D elements (C is the same lane's d): d += A[m][k] * B[k][n] for
// k = 0..7 in order, f32 adds. tf32 operands carry 11 significant bits, so each product is exact
// in f32; the hardware ignores an operand's low 13 bits, and so does this. The hardware's own
// order and rounding of the 8-term sum is not specified by NVIDIA: this is one exact model of
// the instruction's definition, D = A B + C, not of its rounding (docs/cuda.md states the
// tolerance the GPU is held to).
static inline void cb_emu_mma_tf32(float *d, const unsigned *a, const unsigned *b) {
    Warp &w = g_warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) w.mma_a[lane][i] = a[i];
    for (int i = 0; i < 2; i++) w.mma_b[lane][i] = b[i];
    emu_wait(w.bar);
    for (unsigned q = 0; q < 4; q++) {
        const unsigned m = g + 8 * (q >> 1), n = 2 * t + (q & 1);
        float acc = d[q];
        for (unsigned k = 0; k < 8; k++) {
            const unsigned av = w.mma_a[(m & 7) * 4 + (k & 3)][(m >> 3) + 2 * (k >> 2)];
            const unsigned bv = w.mma_b[n * 4 + (k & 3)][k >> 2];
            const float p = __uint_as_float(av & 0xffffe000u) * __uint_as_float(bv & 0xffffe000u);
            acc = acc + p;
        }
        d[q] = acc;
    }
    emu_wait(w.bar); // nobody deposits the next mma's fragments before all have read
}

// The kernels' f32 -> f16 store (the f16 KV cache) on the GPU is the hardware cvt.rn.f16.f32
// (inline PTX, round to nearest even); here the compiler's own conversion to _Float16 (GCC/Clang
// on x86-64 and AArch64: IEEE round to nearest even, overflow to infinity, subnormals kept), not
// the runtime's half_from_float, so the conformance suite compares two independent roundings.
static inline unsigned short cb_emu_float_to_half(float f) {
    const _Float16 h = (_Float16)f;
    unsigned short bits;
    std::memcpy(&bits, &h, 2);
    return bits;
}
using std::cos; using std::exp; using std::pow; using std::sin;
#include <math.h>  // expf, fmaxf, sqrtf (C names, as CUDA spells them)

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)  // a register budget for ptxas; nothing to do on a CPU

#include "colibri_kernels.cu"

// A fiber's life: walk the blocks in order, meeting the others at `between` before the next one
// so blocks never overlap; the last fiber to finish returns to the launcher.
static void fiber_main() {
    Fiber &f = *g_fibers[g_cur];
    threadIdx = f.tid;
    for (unsigned by = 0; by < gridDim.y; by++)
        for (unsigned bxi = 0; bxi < gridDim.x; bxi++) {
            blockIdx = f.bid = {bxi, by, 0};
            (*g_body)();
            emu_wait(g_between);
        }
    f.done = true;
    if (--g_live == 0) ctx_jump(g_launcher);
    if (g_blocked == g_live) emu_die("deadlock: threads wait at a barrier the finished ones skipped");
    g_cur = next_live(g_cur);
    ctx_jump(g_fibers[g_cur]->ctx);
}

static Fiber &fiber(unsigned i) {
    while (g_fibers.size() <= i) {
        void *m = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED) emu_die("cannot map a fiber stack");
        mprotect(m, kGuard, PROT_NONE); // a stack overflow faults instead of corrupting a neighbour
        auto f = std::make_unique<Fiber>();
        f->stack = static_cast<char *>(m);
        g_fibers.push_back(std::move(f));
    }
    return *g_fibers[i];
}

static void run_grid(unsigned gx, unsigned gy, unsigned bx, const std::function<void()> &body) {
    if (bx == 0 || gx == 0 || gy == 0) return;
    gridDim = {gx, gy, 1};
    blockDim = {bx, 1, 1};
    g_block_bar = {bx, 0, 0};
    g_between = {bx, 0, 0};
    g_warps.assign((bx + 31) / 32, Warp{});
    for (unsigned w = 0; w < g_warps.size(); w++) // a last, partial warp has fewer lanes
        g_warps[w].bar = {bx - 32 * w < 32 ? bx - 32 * w : 32, 0, 0};
    g_body = &body;
    g_nfib = g_live = bx;
    g_blocked = 0;
    for (unsigned t = 0; t < bx; t++) {
        Fiber &f = fiber(t);
        f.tid = {t, 0, 0};
        f.done = false;
        ctx_make(f.ctx, f.stack + kGuard, kStack, fiber_main);
    }
    g_cur = 0;
    ctx_switch(g_launcher, g_fibers[0]->ctx);
}

template <typename... A, std::size_t... I>
static void call_with(void (*k)(A...), void **args, std::index_sequence<I...>) {
    k(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}

template <typename... A>
static void launch(void (*k)(A...), unsigned gx, unsigned gy, unsigned bx, void **args) {
    run_grid(gx, gy, bx, [&] { call_with(k, args, std::index_sequence_for<A...>{}); });
}

template <typename... A>
static int param_sizes(void (*)(A...), std::size_t *sizes, int max) {
    const std::size_t s[] = {sizeof(A)...};
    const int n = (int)sizeof...(A);
    if (n > max) return -1;
    for (int i = 0; i < n; i++) sizes[i] = s[i];
    return n;
}

// Every kernel of colibri_kernels.cu the emulation can run, for the name lookups below.
#define CB_EMU_KERNELS(K)                                                                      \
    K(cb_embed) K(cb_rmsnorm) K(cb_linear) K(cb_qk_rope_kv) K(cb_attention)                   \
    K(cb_attention_prefill) K(cb_attention_merge) K(cb_router_topk) K(cb_ffn_route)           \
    K(cb_dispatch) K(cb_expert_up) K(cb_expert_down) K(cb_moe_combine)                        \
    K(cb_expert_up_mma) K(cb_expert_down_mma) K(cb_linear_mma)                              \
    K(cb_dn_conv) K(cb_dn_recur) K(cb_qk_rope_partial_kv) K(cb_sigmoid_gate) K(cb_zero)       \
    K(cb_oss_expert_up) K(cb_oss_expert_down) K(cb_oss_attention) /* gpt-oss (#23) */

// The byte size of each parameter of kernel `name`, from its C++ signature: what a real driver
// reads from the cubin's parameter table (EIATTR_KPARAM_INFO) when cuLaunchKernel copies the
// arguments into a graph node. The stand-in driver's stream capture copies that many bytes per
// argument (tests/gpu/stub_libcuda.c). Returns the count, or -1 (unknown kernel / too many).
extern "C" int emu_param_sizes(const char *name, std::size_t *sizes, int max) {
#define K(fn) if (std::strcmp(name, #fn) == 0) return param_sizes(fn, sizes, max);
    CB_EMU_KERNELS(K)
#undef K
    return -1;
}

// Like cuLaunchKernel: args[i] points at the i-th parameter's value. 0 on success.
extern "C" int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned bx, void **args) {
#define K(fn) if (std::strcmp(name, #fn) == 0) { launch(fn, gx, gy, bx, args); return 0; }
    CB_EMU_KERNELS(K)
#undef K
    return -1;
}

// One emulated warp executing one cb_mma_tf32 (the function the kernels call) on per-lane
// fragments: a[32][4], b[32][2] tf32 bit patterns, d[32][4] the accumulators in and the result
// out. tests/gpu/test_kernels_emu.py compares it with a NumPy model of the PTX ISA's fragment
// tables, so a wrong fragment index in this emulation fails there.
extern "C" void emu_mma_tf32_warp(const unsigned *a, const unsigned *b, float *d) {
    run_grid(1, 1, 32, [&] {
        const unsigned l = threadIdx.x;
        float acc[4] = {d[4 * l], d[4 * l + 1], d[4 * l + 2], d[4 * l + 3]};
        cb_mma_tf32(acc, a + 4 * l, b + 2 * l);
        for (int q = 0; q < 4; q++) d[4 * l + q] = acc[q];
    });
}

// cb_tf32 (the kernels' f32 -> tf32 rounding, cvt.rna.tf32.f32 on the GPU) over n values.
extern "C" void emu_tf32(const float *x, unsigned *out, int n) {
    for (int i = 0; i < n; i++) out[i] = cb_tf32(x[i]);
}
