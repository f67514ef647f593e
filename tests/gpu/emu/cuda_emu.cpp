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

// The byte size of each parameter of kernel `name`, from its C++ signature: what a real driver
// reads from the cubin's parameter table (EIATTR_KPARAM_INFO) when cuLaunchKernel copies the
// arguments into a graph node. The stand-in driver's stream capture copies that many bytes per
// argument (tests/gpu/stub_libcuda.c). Returns the count, or -1 (unknown kernel / too many).
extern "C" int emu_param_sizes(const char *name, std::size_t *sizes, int max) {
#define K(fn) if (std::strcmp(name, #fn) == 0) return param_sizes(fn, sizes, max);
    K(cb_embed) K(cb_rmsnorm) K(cb_linear) K(cb_qk_rope_kv) K(cb_attention)
    K(cb_attention_prefill) K(cb_attention_merge) K(cb_router_topk)
    K(cb_dispatch) K(cb_expert_up) K(cb_expert_down) K(cb_moe_combine)
#undef K
    return -1;
}

// Like cuLaunchKernel: args[i] points at the i-th parameter's value. 0 on success.
extern "C" int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned bx, void **args) {
#define K(fn) if (std::strcmp(name, #fn) == 0) { launch(fn, gx, gy, bx, args); return 0; }
    K(cb_embed) K(cb_rmsnorm) K(cb_linear) K(cb_qk_rope_kv) K(cb_attention)
    K(cb_attention_prefill) K(cb_attention_merge) K(cb_router_topk)
    K(cb_dispatch) K(cb_expert_up) K(cb_expert_down) K(cb_moe_combine)
#undef K
    return -1;
}
