// Host emulation of the CUDA execution model, just enough to run runtime/kernels/colibri_kernels.cu
// on a CPU (tests/gpu/test_kernels_emu.py). It is a cross-check of the kernels' logic (indexing,
// fixed-shape reductions, the bitonic network, dispatch, tiling), not of NVRTC's code generation:
// the real kernels are compiled by NVRTC/ptxas in tests/test_cuda_host.py and run on a GPU by
// tests/gpu/test_kernels_pycuda.py.
//
// Model: blocks run one after another; the threads of a block are real std::threads, so
// __syncthreads is a block barrier and __shfl_xor_sync/__syncwarp are per-warp barriers with an
// exchange slot. __shared__ variables become function statics (one block alive at a time).
// "Device memory" is host memory: pointers are host addresses.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct uint3_ { unsigned x, y, z; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };

static thread_local uint3_ threadIdx, blockIdx;
static uint3_ blockDim, gridDim;

struct Warp {
    std::barrier<> bar{32};
    float slot[32];
    unsigned mma_a[32][4], mma_b[32][2]; // each lane's A and B fragments of one mma
};
static std::barrier<> *g_block_bar;
static std::vector<std::unique_ptr<Warp>> g_warps;

static inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
static inline void __syncwarp(unsigned = 0xffffffffu) {
    g_warps[threadIdx.x / 32]->bar.arrive_and_wait();
}
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    Warp &w = *g_warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x & 31;
    w.slot[lane] = v;
    w.bar.arrive_and_wait();
    const float r = w.slot[lane ^ (unsigned)o];
    w.bar.arrive_and_wait();
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
    Warp &w = *g_warps[threadIdx.x / 32];
    const unsigned lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) w.mma_a[lane][i] = a[i];
    for (int i = 0; i < 2; i++) w.mma_b[lane][i] = b[i];
    w.bar.arrive_and_wait();
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
    w.bar.arrive_and_wait(); // nobody deposits the next mma's fragments before all have read
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

// One OS thread per CUDA thread of a block, reused for every block of the launch: the threads
// walk the blocks in order and meet at `between` before the next one, so blocks never overlap.
static void run_grid(unsigned gx, unsigned gy, unsigned bx, const std::function<void()> &body) {
    gridDim = {gx, gy, 1};
    blockDim = {bx, 1, 1};
    std::barrier<> block_bar((std::ptrdiff_t)bx), between((std::ptrdiff_t)bx);
    g_block_bar = &block_bar;
    g_warps.clear();
    for (unsigned w = 0; w < (bx + 31) / 32; w++) g_warps.emplace_back(new Warp);
    std::vector<std::thread> threads;
    threads.reserve(bx);
    for (unsigned t = 0; t < bx; t++)
        threads.emplace_back([=, &body, &between] {
            threadIdx = {t, 0, 0};
            for (unsigned by = 0; by < gy; by++)
                for (unsigned bxi = 0; bxi < gx; bxi++) {
                    blockIdx = {bxi, by, 0};
                    body();
                    between.arrive_and_wait();
                }
        });
    for (auto &th : threads) th.join();
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
