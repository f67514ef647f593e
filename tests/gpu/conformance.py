"""The kernel conformance checks, shared by the real GPU (test_kernels_gpu.py: pycuda or the
driver; run_conformance.py without pytest) and the host emulation (test_kernels_emu.py): each
check runs one kernel of
runtime/kernels/colibri_kernels.cu through `gpu` and compares it with kernel_reference.py.

`gpu` provides: put(array) -> device pointer, zeros(shape, dtype), get(ptr, shape, dtype),
run(kernel, format, grid, block, *args) (format: "P" pointer, "i" int, "f" float; checked against
the compiled PTX signature where there is one) and routing_mode (the build's
COLIBRI_ROUTING_MODE). Shapes: the *_SHAPES lists (the GPU and the emulation run them all; the
emulation ran a subset while its threads were OS threads).
"""

from __future__ import annotations

import numpy as np

import kernel_reference as ref
from colibri_kit.model.format import DType

DTYPES = [DType.F32, DType.F16, DType.BF16, DType.INT8, DType.Q4]
EPS32 = 2.0 ** -23

EMBED_SHAPES = [(37, 16, 5), (1000, 48, 33), (3, 4096, 1)]                       # V, Dp, n
RMSNORM_SHAPES = [(1, 64, 50, 64), (7, 33, 33, 33), (3, 1000, 999, 1024), (40, 8, 8, 8),
                  (2, 4096, 4096, 4096)]                                           # rows, len, D, stride
LINEAR_SHAPES = [(1, 8, 1), (37, 64, 5), (300, 1000, 3), (129, 256, 9), (64, 4096, 1),
                 (5, 45, 2), (2048, 2048, 1), (17, 24, 33)]  # rows, cols, n: vector + scalar paths
# n, H, Hkv, Dh, pos0, q/k norm (0 none, 1 per head, 2 full width)
QK_ROPE_SHAPES = [(3, 4, 2, 8, 0, 0), (1, 2, 1, 64, 1000, 1), (5, 8, 2, 128, 100000, 2),
                  (2, 3, 3, 6, 7, 1), (4, 6, 2, 10, 250, 2), (33, 2, 1, 24, 5, 0)]
# n, pos0, H, Hkv, Dh. KV ranges are 256 positions (COLIBRI_CU_KV_SPLIT): one range, the last
# position of a range (255), the first of the next (256), a chunk whose tokens have 2 and 3 ranges
# (510..512), odd head sizes, and 2000-token contexts (8 ranges)
ATTENTION_SHAPES = [(5, 0, 4, 2, 16), (1, 37, 4, 2, 16), (3, 300, 8, 1, 128), (4, 9, 6, 3, 10),
                    (1, 0, 2, 2, 64), (1, 255, 2, 1, 40), (1, 256, 3, 3, 24), (3, 510, 2, 1, 10),
                    (2, 767, 4, 2, 33), (1, 2000, 32, 8, 128), (3, 1998, 2, 1, 72)]
KV_SPLIT = 256  # runtime/kernels/colibri_abi.h COLIBRI_CU_KV_SPLIT
# cb_attention_prefill (colibri_abi.h COLIBRI_CU_FA_*): 16 query rows a block, KV tiles of 32.
# n, pos0, H, Hkv, Dh: n not a multiple of 16 (1, 2 and 3 row tiles), positions crossing KV tiles
# (32) and the split-KV range boundary (256), GQA groups of 1..3, heads of 10..128 (the maximum)
FA_ROWS, FA_KEYS, FA_MAX_DH = 16, 32, 128
PREFILL_SHAPES = [(5, 0, 4, 2, 16), (17, 0, 2, 1, 64), (20, 250, 2, 1, 24), (33, 30, 3, 3, 10),
                  (3, 510, 2, 1, 128), (18, 60, 6, 2, 40), (32, 1000, 2, 2, 128),
                  (40, 1990, 4, 2, 64)]
TOPK_SHAPES = [(2, 1), (7, 2), (8, 2), (33, 4), (64, 8), (64, 1), (60, 16)]         # E, k
# E, k, D, Dp, n: E from 2 to the sort's 256; D not a multiple of 32; Dp a multiple of 16 (the
# vector path; int8 needs 16 | Dp, f32/f16/bf16 8 | Dp) or odd (37: the scalar path); q4 rows
# with a partial last group; Dp = 8192, the fused kernel's shared-memory bound
FFN_ROUTE_SHAPES = [(2, 1, 45, 48, 3), (8, 2, 40, 64, 5), (60, 8, 100, 112, 2),
                    (64, 8, 37, 37, 2), (128, 2, 300, 320, 2), (256, 8, 1000, 1024, 1),
                    (8, 2, 8190, 8192, 1)]
ROUTE_THREADS = 512  # runtime/kernels/colibri_abi.h COLIBRI_CU_ROUTE_THREADS
DISPATCH_SHAPES = [(1, 2, 8), (5, 2, 8), (32, 8, 64), (17, 3, 64), (32, 1, 2), (9, 4, 5)]
EXPERT_SHAPES = [(1, 2, 8, 20, 64), (6, 2, 8, 37, 48), (32, 8, 64, 24, 64), (3, 1, 4, 96, 4096)]
# the tensor-core expert kernels (sm_80+; n, k, E, F, Dp): F and Dp not multiples of the 16-row
# tile, expert slot counts not multiples of the 8-token tile, K (Dp for up, F for down) not a
# multiple of the 8-column k-step, empty experts (E > n*k), one expert with 40 slots (two passes
# of 32), and a 32-token prefill chunk over 8 experts
EXPERT_MMA_SHAPES = [(6, 2, 8, 37, 44), (40, 1, 1, 20, 24), (32, 2, 8, 70, 64), (3, 2, 16, 16, 8),
                     (32, 8, 64, 24, 64), (17, 4, 8, 300, 1024)]
MMA_DTYPES = [DType.F32, DType.F16, DType.BF16, DType.INT8]  # q4 stays on the SIMT kernels
# cb_linear_mma (rows, cols, n): one row (the shared gate), rows/cols/n off the 16/8/8 tiles,
# more than one 32-token block row
LINEAR_MMA_SHAPES = [(1, 8, 9), (37, 64, 5), (17, 24, 33), (70, 100, 40), (5, 45, 12),
                     (300, 1000, 32)]


def dot_bound(absdot: np.ndarray, cols: int) -> np.ndarray:
    """Worst-case f32 error of the kernels' dot products: each lane adds cols/32 products in
    order, then 5 butterfly levels; plus the f32 rounding of the reference."""
    return (cols / 32 + 12) * EPS32 * absdot + 1e-30


def mma_bound(absdot: np.ndarray, cols: int) -> np.ndarray:
    """Worst-case error of the tensor-core kernels' dot products: an f32 weight or activation is
    carried as two tf32 parts (hi + lo, within 2^-22 of it), so a product is within 3 x 2^-22
    (6 ulps of 2^-23) of exact; at most 3 products per column are summed in f32, in 8-term mma
    steps, whose rounding the bound allows once per term, twice over (NVIDIA does not specify the
    mma's internal rounding; the emulation adds in sequence). A wrong fragment index is an error
    of the order of the dot itself, far above this."""
    return (6 * cols + 16) * EPS32 * absdot + 1e-30


def weight_args(gpu, w: ref.Weight) -> tuple[int, int]:
    raw = gpu.put(w.raw)
    if w.scales is None:
        sc = 0
    elif w.dtype == DType.Q4:  # f16 group scales, as in the file
        sc = gpu.put(np.ascontiguousarray(w.scales.astype(np.float16)))
    else:
        sc = gpu.put(w.scales.astype(np.float32))
    return raw, sc


# ---------------------------------------------------------------- per-kernel conformance


def check_embed(gpu, dtype, V, Dp, n):
    rng = np.random.default_rng(V + Dp)
    table = ref.make_weight(rng.standard_normal((V, Dp)).astype(np.float32), dtype)
    ids = rng.integers(0, V, n).astype(np.int32)
    ids[0], ids[-1] = 0, V - 1
    x = gpu.zeros((n, Dp))
    raw, sc = weight_args(gpu, table)
    gpu.run("cb_embed", "PiPPPi", (n, 1), 256, x, np.int32(Dp), gpu.put(ids), raw, sc,
            np.int32(dtype))
    np.testing.assert_array_equal(gpu.get(x, (n, Dp)), ref.cb_embed(ids, table))


def check_f16_every_value(gpu):
    """Every f16 bit pattern through the kernels' f16 -> f32 conversion (the hardware cvt on a
    GPU, its stand-in in the emulation): the embedding gather of a 16 x 4096 f16 table holding
    all 65536 patterns gives NumPy's exact conversion (subnormals, +-0, +-inf and NaN included;
    NaN compared as NaN, every other value bit for bit)."""
    table = ref.Weight(np.arange(65536, dtype=np.uint16).view(np.float16).reshape(16, 4096),
                       DType.F16)
    ids = np.arange(16, dtype=np.int32)
    x = gpu.zeros((16, 4096))
    gpu.run("cb_embed", "PiPPPi", (16, 1), 256, x, np.int32(4096), gpu.put(ids),
            gpu.put(table.raw), 0, np.int32(DType.F16))
    got = gpu.get(x, (16, 4096)).reshape(-1)
    want = table.raw.reshape(-1).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def check_rmsnorm(gpu, rows, length, true_len, stride, in_place):
    rng = np.random.default_rng(rows * length)
    x = rng.standard_normal((rows, stride)).astype(np.float32)
    x[:, true_len:] = 0.0
    w = (1 + 0.1 * rng.standard_normal(length)).astype(np.float32)
    xd = gpu.put(x)
    yd = xd if in_place else gpu.zeros((rows, stride))
    gpu.run("cb_rmsnorm", "PiPiPiifPi", (rows, 1), 256, yd, np.int32(stride), xd,
            np.int32(stride), gpu.put(w), np.int32(length), np.int32(true_len), np.float32(1e-5),
            0, np.int32(0))
    got = gpu.get(yd, (rows, stride))[:, :length]
    want = ref.cb_rmsnorm(x, w, length, true_len, 1e-5)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    # the decode graph's k-norm: rows start *pos_d * pos_rows rows into the buffer (the cache
    # rows of the step's position), in place; the same bits, no other row touched
    pos = 3
    big = np.full(((pos + 1) * rows, stride), 5.0, np.float32)
    big[pos * rows:] = x
    bd = gpu.put(big)
    gpu.run("cb_rmsnorm", "PiPiPiifPi", (rows, 1), 256, bd, np.int32(stride), bd,
            np.int32(stride), gpu.put(w), np.int32(length), np.int32(true_len), np.float32(1e-5),
            gpu.put(np.array([pos], np.int32)), np.int32(rows))
    moved = gpu.get(bd, ((pos + 1) * rows, stride))
    np.testing.assert_array_equal(moved[pos * rows:, :length], got)
    np.testing.assert_array_equal(moved[:pos * rows], 5.0)


def check_linear(gpu, dtype, rows, cols, n, mma: bool = False):
    """mma: cb_linear_mma (sm_80+; grid 64 rows x 32 tokens, the tensor-core error bound, the
    same bits on a second launch)."""
    kernel, bound_of = ("cb_linear_mma", mma_bound) if mma else ("cb_linear", dot_bound)
    grid = ((rows + 63) // 64, (n + 31) // 32) if mma else ((rows + 3) // 4, (n + 3) // 4)
    rng = np.random.default_rng(rows * 7 + cols)
    w = ref.make_weight(rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols),
                        dtype)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    prev = rng.standard_normal((n, rows)).astype(np.float32)
    raw, sc = weight_args(gpu, w)
    absdot = np.abs(x).astype(np.float64) @ np.abs(w.f32() * w.scale()[:, None]).T
    for with_bias, accumulate in ((False, False), (True, False), (False, True)):
        runs = []
        for _ in range(2 if mma else 1):
            y = gpu.put(prev)
            gpu.run(kernel, "PiPiiPPiiiPiP", grid, 128,
                    y, np.int32(rows), gpu.put(x), np.int32(cols), np.int32(n), raw, sc,
                    np.int32(dtype), np.int32(rows), np.int32(cols),
                    gpu.put(bias) if with_bias else 0, np.int32(accumulate), 0)
            runs.append(gpu.get(y, (n, rows)))
        got = runs[0]
        assert all(r.tobytes() == got.tobytes() for r in runs)
        want = ref.cb_linear(x, w, bias if with_bias else None, prev if accumulate else None)
        extra = (np.abs(prev) if accumulate else 0) + (np.abs(bias) if with_bias else 0)
        assert np.all(np.abs(got - want) <= bound_of(absdot + extra, cols)), \
            (with_bias, accumulate, np.abs(got - want).max())


def check_linear_strided_rows_into_kv_cache(gpu):
    """y_stride/x_stride != cols: the K/V projection writes rows of the cache in place."""
    rng = np.random.default_rng(3)
    rows, cols, n, ystride = 24, 64, 6, 40
    w = ref.make_weight(rng.standard_normal((rows, cols)).astype(np.float32), DType.F16)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    y0 = np.full((n, ystride), 7.0, np.float32)
    y = gpu.put(y0)
    raw, sc = weight_args(gpu, w)
    gpu.run("cb_linear", "PiPiiPPiiiPiP", ((rows + 3) // 4, (n + 3) // 4), 128, y,
            np.int32(ystride), gpu.put(x), np.int32(cols), np.int32(n), raw, sc,
            np.int32(DType.F16), np.int32(rows), np.int32(cols), 0, np.int32(0), 0)
    got = gpu.get(y, (n, ystride))
    np.testing.assert_allclose(got[:, :rows], ref.cb_linear(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[:, rows:], 7.0)  # nothing past the row touched
    # the decode graph's parameter block: a one-token step writes the cache row of the position
    # read on the device (y itself is the cache's row 0), the same bits as the host-offset write
    pos = 4
    cache = gpu.put(np.full((n, ystride), 7.0, np.float32))
    gpu.run("cb_linear", "PiPiiPPiiiPiP", ((rows + 3) // 4, 1), 128, cache, np.int32(ystride),
            gpu.put(x[pos:pos + 1]), np.int32(cols), np.int32(1), raw, sc, np.int32(DType.F16),
            np.int32(rows), np.int32(cols), 0, np.int32(0), gpu.put(np.array([pos], np.int32)))
    stepped = gpu.get(cache, (n, ystride))
    np.testing.assert_array_equal(stepped[pos, :rows], got[pos, :rows])
    np.testing.assert_array_equal(np.delete(stepped, pos, axis=0), 7.0)  # only that row


def rope_table(positions: int, dh: int, theta: float = 10000.0) -> np.ndarray:
    """The host's table (cuda_backend.c colibri_cuda_rope_table: bit for bit this one, checked in
    tests/test_cuda_host.py), [positions, Dh/2, (cos, sin)]."""
    c, s = ref.rope_cos_sin(np.arange(positions), dh, theta)
    return np.ascontiguousarray(np.stack([c, s], axis=-1), np.float32)


def kv_cache(gpu, rows: int, kvd: int, kv_f16: bool, fill: float = 7.0) -> int:
    """A KV cache of `rows` positions, every value `fill` (f32, or f16 bits)."""
    a = np.full((rows, kvd), fill, np.float32)
    return gpu.put(a.astype(np.float16) if kv_f16 else a)


def read_cache(gpu, ptr: int, rows: int, kvd: int, kv_f16: bool) -> np.ndarray:
    return gpu.get(ptr, (rows, kvd), np.float16 if kv_f16 else np.float32)


def run_qk_rope_kv(gpu, q: int, qkv: int, kc: int, vc: int, n: int, H: int, Hkv: int, dh: int,
                   pos0: int, table: int, qn: int, kn: int, norm: int, eps: float, kv_f16: bool,
                   pos_d: int = 0) -> None:
    gpu.run("cb_qk_rope_kv", "PPPPiiiiiPPPifiP", (n, H + Hkv), 256, q, qkv, kc, vc, np.int32(n),
            np.int32(H), np.int32(Hkv), np.int32(dh), np.int32(pos0), table, qn, kn,
            np.int32(norm), np.float32(eps), np.int32(kv_f16), pos_d)


def former_qk_rope(gpu, qkv: np.ndarray, H: int, Hkv: int, dh: int, pos0: int, norm: int,
                   qn: np.ndarray, kn: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The sequence cb_qk_rope_kv replaced, for the f32 bit-identity check: q/k norm as its own
    cb_rmsnorm launch (256 threads, cuda_backend.c's), then the former cb_rope's f32 expression
    (a*c - b*s, b*c + a*s, each product and difference rounded to f32: NumPy's, and the
    emulation's with contraction off)."""
    n, HD, kvd = qkv.shape[0], H * dh, Hkv * dh
    out = []
    for part, heads, w in ((qkv[:, :HD], H, qn), (qkv[:, HD:HD + kvd], Hkv, kn)):
        x = np.ascontiguousarray(part)
        if norm:
            rows, width = (n * heads, dh) if norm == 1 else (n, heads * dh)
            xd = gpu.put(x)
            gpu.run("cb_rmsnorm", "PiPiPiifPi", (rows, 1), 256, xd, np.int32(width), xd,
                    np.int32(width), gpu.put(w), np.int32(width), np.int32(width),
                    np.float32(eps), 0, np.int32(0))
            x = gpu.get(xd, x.shape)
        out.append(ref.cb_rope(x, heads, dh, pos0, 10000.0))
    return out[0], out[1]


def check_qk_rope_kv(gpu, n, H, Hkv, dh, pos0, norm, kv_f16):
    """q/k norm + RoPE + the KV-cache write in one launch: against the NumPy reference; only the
    chunk's cache rows written; in the emulation (exact f32, no contraction) bit for bit the
    former separate launches' result, and an f16 cache holds those values rounded to nearest
    even (NumPy's float16 bits); the decode graph's launch (position from the parameter block)
    gives the plain launch's bits."""
    rng = np.random.default_rng(n * 100 + dh + pos0 + norm)
    HD, kvd, eps, S = H * dh, Hkv * dh, 1e-6, pos0 + n + 2
    qkv = (3 * rng.standard_normal((n, HD + 2 * kvd))).astype(np.float32)
    wq, wk = (dh, dh) if norm == 1 else (HD, kvd)
    qn = (1 + 0.1 * rng.standard_normal(wq)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(wk)).astype(np.float32)
    table, qnd, knd = gpu.put(rope_table(S, dh)), gpu.put(qn), gpu.put(kn)
    qkvd = gpu.put(qkv)
    qd = gpu.put(np.full((n, HD), np.nan, np.float32))  # every q value must be written
    kd, vd = kv_cache(gpu, S, kvd, kv_f16), kv_cache(gpu, S, kvd, kv_f16)
    run_qk_rope_kv(gpu, qd, qkvd, kd, vd, n, H, Hkv, dh, pos0, table, qnd if norm else 0,
                   knd if norm else 0, norm, eps, kv_f16)
    got_q = gpu.get(qd, (n, HD))
    got_k, got_v = read_cache(gpu, kd, S, kvd, kv_f16), read_cache(gpu, vd, S, kvd, kv_f16)
    for c in (got_k, got_v):  # the chunk's rows only
        assert np.all(c[:pos0] == 7.0) and np.all(c[pos0 + n:] == 7.0)
    want_q, want_k, want_v = ref.cb_qk_rope_kv(qkv, H, Hkv, dh, pos0, 10000.0, norm, qn, kn, eps)
    rows = slice(pos0, pos0 + n)
    tol = 1e-5 * max(np.abs(want_q).max(), np.abs(want_k).max())
    np.testing.assert_allclose(got_q, want_q, rtol=0, atol=tol)
    if kv_f16:  # within rounding of the f16 value of each element (a half-way point may flip)
        for got, want in ((got_k, want_k), (got_v, want_v)):
            np.testing.assert_allclose(got[rows].astype(np.float32), want, rtol=2.0 ** -10,
                                       atol=tol)
        np.testing.assert_array_equal(got_v[rows].view(np.uint16),
                                      want_v.astype(np.float16).view(np.uint16))
    else:
        np.testing.assert_allclose(got_k[rows], want_k, rtol=0, atol=tol)
        np.testing.assert_array_equal(got_v[rows], want_v)
    if getattr(gpu, "exact_f32", False):
        old_q, old_k = former_qk_rope(gpu, qkv, H, Hkv, dh, pos0, norm, qn, kn, eps)
        np.testing.assert_array_equal(got_q.view(np.uint32), old_q.view(np.uint32))
        if kv_f16:
            np.testing.assert_array_equal(got_k[rows].view(np.uint16),
                                          old_k.astype(np.float16).view(np.uint16))
        else:
            np.testing.assert_array_equal(got_k[rows].view(np.uint32), old_k.view(np.uint32))
    # decode graph: the last token alone at position 0 + *pos_d, written to that cache row
    pos_d = gpu.put(np.array([pos0 + n - 1], np.int32))
    q1 = gpu.zeros((1, HD))
    k1, v1 = kv_cache(gpu, S, kvd, kv_f16), kv_cache(gpu, S, kvd, kv_f16)
    run_qk_rope_kv(gpu, q1, gpu.put(qkv[n - 1:]), k1, v1, 1, H, Hkv, dh, 0, table,
                   qnd if norm else 0, knd if norm else 0, norm, eps, kv_f16, pos_d)
    np.testing.assert_array_equal(gpu.get(q1, (1, HD))[0].view(np.uint32),
                                  got_q[n - 1].view(np.uint32))
    for mine, full in ((k1, got_k), (v1, got_v)):
        np.testing.assert_array_equal(read_cache(gpu, mine, S, kvd, kv_f16), np.concatenate(
            [np.full((pos0 + n - 1, kvd), 7.0), full[pos0 + n - 1:pos0 + n],
             np.full((2, kvd), 7.0)]).astype(full.dtype))


def check_f16_kv_store(gpu):
    """The f16 cache's store (the hardware cvt.rn.f16.f32 on a GPU, its stand-in in the
    emulation) through cb_qk_rope_kv's V path (a plain copy): every half-way point between two
    consecutive finite halves (ties to even), random f32 bit patterns of every exponent, and the
    edges (largest half, overflow at 65520, subnormals, 2^-25, signed zeros, infinities) give
    NumPy's float16 bits (round to nearest even, the CPU cache's rounding); NaN stays NaN."""
    halves = np.arange(0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((halves[:-1] + halves[1:]) / 2).astype(np.float32)  # exact in f32
    rnd = np.random.default_rng(11).integers(0, 2 ** 32, 20000, dtype=np.uint64)
    edges = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e6, 2.0 ** -24,
                      2.0 ** -25, 2.0 ** -25 * 1.0000001, 3 * 2.0 ** -26, 2.0 ** -14,
                      np.inf, -np.inf, np.nan], np.float32)
    vals = np.concatenate([mids, -mids, rnd.astype(np.uint32).view(np.float32), edges])
    dh = 64
    n = -(-vals.size // dh)
    v = np.zeros(n * dh, np.float32)
    v[:vals.size] = vals
    qkv = np.concatenate([np.ones((n, 2 * dh), np.float32), v.reshape(n, dh)], axis=1)
    kd, vd = kv_cache(gpu, n, dh, True), kv_cache(gpu, n, dh, True)
    run_qk_rope_kv(gpu, gpu.zeros((n, dh)), gpu.put(qkv), kd, vd, n, 1, 1, dh, 0,
                   gpu.put(rope_table(n, dh)), 0, 0, 0, 1e-6, True)
    got = read_cache(gpu, vd, n, dh, True).reshape(-1)[:vals.size]
    with np.errstate(over="ignore"):  # the overflow to infinity is one of the cases
        want = vals.astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


def run_attention(gpu, out: int, q: int, kc: int, vc: int, n: int, pos0: int, H: int, Hkv: int,
                  dh: int, graph_ranges: int = 0, kv_f16: bool = False) -> None:
    """cb_attention over the KV ranges of the chunk's last token, then cb_attention_merge when a
    token has more than one range: cuda_backend.c's launches. graph_ranges > 0: the decode
    graph's launches instead, the position read from a parameter block and a fixed grid of that
    many ranges (the cache's), the merge launched whenever there can be two."""
    ns = graph_ranges or -(-(pos0 + n) // KV_SPLIT)
    pos_d = gpu.put(np.array([pos0], np.int32)) if graph_ranges else 0
    p0 = 0 if graph_ranges else pos0
    part = gpu.zeros((n, H, ns, dh + 2))
    gpu.run("cb_attention", "PPPPPiiiiiiP", (H * ns, n), 128, out, part, q, kc, vc, np.int32(ns),
            np.int32(p0), np.int32(H), np.int32(Hkv), np.int32(dh), np.int32(kv_f16), pos_d)
    if ns > 1:
        gpu.run("cb_attention_merge", "PPiiiiP", (H, n), 128, out, part, np.int32(ns),
                np.int32(p0), np.int32(H), np.int32(dh), pos_d)


def attention_inputs(n: int, pos0: int, H: int, Hkv: int, dh: int, kv_f16: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q [n, H*dh] and a cache of pos0 + n + 3 positions: (q, K, V as stored: f32 or f16, K, V
    as the kernels read them: f32)."""
    rng = np.random.default_rng(n * 1000 + pos0 + dh)
    S, kvd = pos0 + n + 3, Hkv * dh
    q = rng.standard_normal((n, H * dh)).astype(np.float32)
    kc = rng.standard_normal((S, kvd)).astype(np.float32)
    vc = rng.standard_normal((S, kvd)).astype(np.float32)
    if kv_f16:
        return q, kc.astype(np.float16), vc.astype(np.float16), ref.f16_round(kc), ref.f16_round(vc)
    return q, kc, vc, kc, vc


def check_attention(gpu, n, pos0, H, Hkv, dh, kv_f16=False):
    q, kst, vst, kc, vc = attention_inputs(n, pos0, H, Hkv, dh, kv_f16)
    S = kc.shape[0]
    qd, kd, vd = gpu.put(q), gpu.put(kst), gpu.put(vst)
    out = gpu.put(np.full((n, H * dh), np.nan, np.float32))  # every output must be written
    run_attention(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16=kv_f16)
    got = gpu.get(out, (n, H * dh))
    want = ref.cb_attention(q, kc, vc, pos0, H, Hkv, dh)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(vc).max())
    run_attention(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16=kv_f16)
    np.testing.assert_array_equal(gpu.get(out, (n, H * dh)), got)  # run to run: same bits
    # a token's split-KV bits do not depend on the chunk it came in (its KV ranges follow its
    # own position), so the last token alone (a decode step) gives the same
    one = gpu.zeros((1, H * dh))
    run_attention(gpu, one, qd + (n - 1) * H * dh * 4, kd, vd, 1, pos0 + n - 1, H, Hkv, dh,
                  kv_f16=kv_f16)
    np.testing.assert_array_equal(gpu.get(one, (1, H * dh))[0], got[n - 1])
    # and so does the decode graph's launch: position on the device, every range of the cache
    # launched (those past the step's return), the merge always launched
    fixed = gpu.zeros((1, H * dh))
    run_attention(gpu, fixed, qd + (n - 1) * H * dh * 4, kd, vd, 1, pos0 + n - 1, H, Hkv, dh,
                  graph_ranges=-(-S // KV_SPLIT) + 1, kv_f16=kv_f16)
    np.testing.assert_array_equal(gpu.get(fixed, (1, H * dh))[0], got[n - 1])


def run_prefill(gpu, out: int, q: int, kc: int, vc: int, n: int, pos0: int, H: int, Hkv: int,
                dh: int, kv_f16: bool) -> None:
    """cb_attention_prefill as cuda_backend.c launches it for a chunk of n tokens at pos0."""
    gpu.run("cb_attention_prefill", "PPPPiiiiii", (-(-n // FA_ROWS), H), 128, out, q, kc, vc,
            np.int32(n), np.int32(pos0), np.int32(H), np.int32(Hkv), np.int32(dh),
            np.int32(kv_f16))


def check_attention_prefill(gpu, n, pos0, H, Hkv, dh, kv_f16):
    """The tiled prefill kernel: against NumPy; every output written; the same bits run to run;
    a token's bits depend only on its position, not on the chunk it came in (the chunk cut in
    two at an odd place, and the last token alone, give the whole chunk's bits); within
    tolerance of the split-KV kernel (decode), whose bits it need not have."""
    assert dh <= FA_MAX_DH
    q, kst, vst, kc, vc = attention_inputs(n, pos0, H, Hkv, dh, kv_f16)
    HD = H * dh
    qd, kd, vd = gpu.put(q), gpu.put(kst), gpu.put(vst)
    out = gpu.put(np.full((n, HD), np.nan, np.float32))
    run_prefill(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16)
    got = gpu.get(out, (n, HD))
    want = ref.cb_attention(q, kc, vc, pos0, H, Hkv, dh)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(vc).max())
    run_prefill(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16)
    np.testing.assert_array_equal(gpu.get(out, (n, HD)).view(np.uint32), got.view(np.uint32))
    cut = n // 2 + 1 if n > 1 else 1
    parts = gpu.put(np.full((n, HD), np.nan, np.float32))
    run_prefill(gpu, parts, qd, kd, vd, cut, pos0, H, Hkv, dh, kv_f16)
    if cut < n:
        run_prefill(gpu, parts + cut * HD * 4, qd + cut * HD * 4, kd, vd, n - cut, pos0 + cut, H,
                    Hkv, dh, kv_f16)
    np.testing.assert_array_equal(gpu.get(parts, (n, HD)).view(np.uint32), got.view(np.uint32))
    last = gpu.zeros((1, HD))
    run_prefill(gpu, last, qd + (n - 1) * HD * 4, kd, vd, 1, pos0 + n - 1, H, Hkv, dh, kv_f16)
    np.testing.assert_array_equal(gpu.get(last, (1, HD))[0].view(np.uint32),
                                  got[n - 1].view(np.uint32))
    split = gpu.zeros((n, HD))
    run_attention(gpu, split, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16=kv_f16)
    np.testing.assert_allclose(got, gpu.get(split, (n, HD)), rtol=0,
                               atol=4e-5 * np.abs(vc).max())


def check_router_topk(gpu, E, k, renorm):
    rng = np.random.default_rng(E * 31 + k)
    n = 9
    logits = rng.standard_normal((n, E)).astype(np.float32) * 3
    logits[1, :] = 0.5                      # all tied: experts 0..k-1
    logits[2, E // 2:] = logits[2, : E - E // 2]  # pairwise ties across halves
    logits[3, -1] = logits[3].max() + 1     # best is the last expert
    logits[4, 0] = -np.inf                  # an expert that can never win
    idx = gpu.zeros((n, k), np.int32)
    wts = gpu.zeros((n, k))
    gpu.run("cb_router_topk", "PiiiPP", (n, 1), 32, gpu.put(logits), np.int32(E), np.int32(k),
            np.int32(renorm), idx, wts)
    want_idx, want_w = ref.cb_router_topk(logits, k, renorm, gpu.routing_mode)
    np.testing.assert_array_equal(gpu.get(idx, (n, k), np.int32), want_idx)
    np.testing.assert_allclose(gpu.get(wts, (n, k)), want_w, rtol=1e-6, atol=1e-7)
    assert list(gpu.get(idx, (n, k), np.int32)[1]) == list(range(k))


def check_router_topk_nan(gpu, E, k):
    """NaN router logits (issue 12): the k experts are all < E, numbers first (larger first), then
    the NaN experts in index order, as route.c and NumPy's stable argsort of -key order them.
    Only the indices are compared: with NaN the weights are NaN too."""
    n = 4
    logits = np.tile((np.arange(E, dtype=np.float32) * 7 % 5) - 2, (n, 1))
    logits[0, :] = np.nan                   # every expert NaN
    logits[1, ::2] = np.nan                 # every other one
    logits[2, E // 2:] = np.nan             # the upper half
    logits[3, 1::3] = np.nan
    idx = gpu.zeros((n, k), np.int32)
    wts = gpu.zeros((n, k))
    gpu.run("cb_router_topk", "PiiiPP", (n, 1), 32, gpu.put(logits), np.int32(E), np.int32(k),
            np.int32(1), idx, wts)
    got = gpu.get(idx, (n, k), np.int32)
    assert got.min() >= 0 and got.max() < E, got
    if gpu.routing_mode == ref.LINEAR_SCORE:
        want = np.argsort(-logits.astype(np.float64), axis=1, kind="stable")[:, :k]
    else:  # one NaN makes the softmax total NaN, so every probability is NaN: index order
        want = np.tile(np.arange(k), (n, 1))
    np.testing.assert_array_equal(got, want)


def _nan_rows(w: ref.Weight, rows: list[int]) -> ref.Weight:
    """The router rows `rows` made to give NaN logits, in each dtype's own way: a NaN element
    (f32, f16, bf16), a NaN row scale (int8) or a NaN group scale (q4)."""
    raw = w.raw.copy()
    scales = None if w.scales is None else w.scales.copy()
    for r in rows:
        if w.dtype == DType.F32 or w.dtype == DType.F16:
            raw[r, 0] = np.nan
        elif w.dtype == DType.BF16:
            raw[r, 0] = 0x7fc0
        elif w.dtype == DType.Q4:
            scales[r, 0] = np.nan
        else:
            scales[r] = np.nan
    return ref.Weight(raw, w.dtype, scales, w.q4_cols)


def check_ffn_route(gpu, dtype, E, k, D, Dp, n, nan=False):
    """cb_ffn_route (FFN norm + router GEMV + top-k in one block per token) against the three
    kernels it replaces, cb_rmsnorm -> cb_linear (router) -> cb_router_topk, launched as
    cuda_backend.c launches them: h, the chosen experts and their weights are bit for bit the
    same, with renormalisation on and off. nan: NaN router logits (a few experts' rows, and one
    token whose input holds a NaN, so every logit is NaN)."""
    rng = np.random.default_rng(E * 1000 + D + int(dtype))
    x = np.zeros((n, Dp), np.float32)
    x[:, :D] = rng.standard_normal((n, D)).astype(np.float32) * 2
    if n > 1:
        x[1, :D] = x[0, :D]                 # two identical tokens: identical routing
    norm_w = np.zeros(Dp, np.float32)
    norm_w[:D] = 1 + 0.1 * rng.standard_normal(D).astype(np.float32)
    w = ref.make_weight(rng.standard_normal((E, Dp)).astype(np.float32) * 3 / np.sqrt(D), dtype)
    if nan:
        w = _nan_rows(w, sorted({0, E // 2, E - 1}))
        x[n - 1, D // 2] = np.nan
    raw, sc = weight_args(gpu, w)
    xd, nwd, eps = gpu.put(x), gpu.put(norm_w), np.float32(1e-5)
    for renorm in (0, 1):
        # the three launches (cuda_backend.c without fusion)
        h3, logits = gpu.zeros((n, Dp)), gpu.zeros((n, E))
        idx3, wts3 = gpu.zeros((n, k), np.int32), gpu.zeros((n, k))
        gpu.run("cb_rmsnorm", "PiPiPiifPi", (n, 1), 256, h3, np.int32(Dp), xd, np.int32(Dp), nwd,
                np.int32(Dp), np.int32(D), eps, 0, np.int32(0))
        gpu.run("cb_linear", "PiPiiPPiiiPiP", ((E + 3) // 4, (n + 3) // 4), 128, logits,
                np.int32(E), h3, np.int32(Dp), np.int32(n), raw, sc, np.int32(dtype), np.int32(E),
                np.int32(Dp), 0, np.int32(0), 0)
        gpu.run("cb_router_topk", "PiiiPP", (n, 1), 32, logits, np.int32(E), np.int32(k),
                np.int32(renorm), idx3, wts3)
        # the fused kernel
        h1 = gpu.put(np.full((n, Dp), 7.0, np.float32))  # every element must be written
        idx1 = gpu.put(np.full((n, k), -5, np.int32))
        wts1 = gpu.put(np.full((n, k), 7.0, np.float32))
        gpu.run("cb_ffn_route", "PPiPifPPiiiiPP", (n, 1), ROUTE_THREADS, h1, xd, np.int32(Dp),
                nwd, np.int32(D), eps, raw, sc, np.int32(dtype), np.int32(E), np.int32(k),
                np.int32(renorm), idx1, wts1)
        np.testing.assert_array_equal(gpu.get(h1, (n, Dp)).view(np.uint32),
                                      gpu.get(h3, (n, Dp)).view(np.uint32))
        got_idx = gpu.get(idx1, (n, k), np.int32)
        np.testing.assert_array_equal(got_idx, gpu.get(idx3, (n, k), np.int32))
        np.testing.assert_array_equal(gpu.get(wts1, (n, k)).view(np.uint32),
                                      gpu.get(wts3, (n, k)).view(np.uint32))
        assert got_idx.min() >= 0 and got_idx.max() < E
        if not nan:
            # and both route as route.c does on the same logits (the choice is exact on given
            # logits; which logits the GEMV rounds to is the dot-product checks' business)
            want_idx, _ = ref.cb_router_topk(gpu.get(logits, (n, E)), k, bool(renorm),
                                             gpu.routing_mode)
            np.testing.assert_array_equal(got_idx, want_idx)
            if n > 1:
                np.testing.assert_array_equal(got_idx[0], got_idx[1])


def check_dispatch(gpu, n, k, E):
    rng = np.random.default_rng(n * k * E)
    idx = np.stack([rng.choice(E, k, replace=False) for _ in range(n)]).astype(np.int32)
    off, perm, slot = gpu.zeros(E + 1, np.int32), gpu.zeros(n * k, np.int32), gpu.zeros(
        n * k, np.int32)
    active = gpu.put(np.full(E, 12345, np.int32))  # every entry must be written
    gpu.run("cb_dispatch", "PiiiPPPP", (1, 1), 256, gpu.put(idx), np.int32(n), np.int32(k),
            np.int32(E), off, perm, slot, active)
    w_off, w_perm, w_slot = ref.cb_dispatch(idx, E)
    np.testing.assert_array_equal(gpu.get(off, E + 1, np.int32), w_off)
    got_active = gpu.get(active, E, np.int32)
    np.testing.assert_array_equal(got_active, ref.active_experts(w_off))
    # the expert kernels' grid: min(E, n*k) groups cover every expert with slots
    groups = min(E, n * k)
    assert set(got_active[:groups]) - {-1} == set(idx.reshape(-1).tolist())
    np.testing.assert_array_equal(gpu.get(perm, n * k, np.int32), w_perm)
    np.testing.assert_array_equal(gpu.get(slot, n * k, np.int32), w_slot)


def _pointer_table(gpu, ptrs: list[int]) -> int:
    return gpu.put(np.array(ptrs, np.uint64))


def check_grouped_experts(gpu, dtype, n, k, E, F, Dp, mma: bool = False):
    """expert_up (SwiGLU) + expert_down over the dispatch of random routing, then the combine.
    mma: the tensor-core twins (cb_expert_up_mma / cb_expert_down_mma: 64 rows a block, the
    tensor-core error bound), each launched twice to check the same bits come back."""
    up, down = ("cb_expert_up_mma", "cb_expert_down_mma") if mma else ("cb_expert_up",
                                                                        "cb_expert_down")
    rows_per_block = 64 if mma else 4
    bound_of = mma_bound if mma else dot_bound
    rng = np.random.default_rng(n + k + E + F)
    h = rng.standard_normal((n, Dp)).astype(np.float32)
    w1 = [ref.make_weight(rng.standard_normal((F, Dp)).astype(np.float32) / np.sqrt(Dp), dtype)
          for _ in range(E)]
    w3 = [ref.make_weight(rng.standard_normal((F, Dp)).astype(np.float32) / np.sqrt(Dp), dtype)
          for _ in range(E)]
    w2 = [ref.make_weight(rng.standard_normal((Dp, F)).astype(np.float32) / np.sqrt(F), dtype)
          for _ in range(E)]
    idx = np.stack([rng.choice(E, k, replace=False) for _ in range(n)]).astype(np.int32)
    offsets, perm, slot_of = ref.cb_dispatch(idx, E)
    tabs = {}
    for name, ws in (("w1", w1), ("w3", w3), ("w2", w2)):
        pairs = [weight_args(gpu, w) for w in ws]
        tabs[name] = _pointer_table(gpu, [p for p, _ in pairs])
        tabs["s" + name[1]] = _pointer_table(gpu, [s for _, s in pairs])
    act = gpu.zeros((n * k, F))
    hd, offd, permd = gpu.put(h), gpu.put(offsets), gpu.put(perm)
    # routed experts only: min(E, n*k) groups, group g serves active[g] (cb_dispatch)
    actd, groups = gpu.put(ref.active_experts(offsets)), min(E, n * k)
    up_grid = ((F + rows_per_block - 1) // rows_per_block, groups)
    gpu.run(up, "PiPiPPPPPPPi", up_grid, 128, act, np.int32(F), hd,
            np.int32(Dp), permd, offd, actd, tabs["w1"], tabs["w3"], tabs["s1"], tabs["s3"],
            np.int32(dtype))
    got_act = gpu.get(act, (n * k, F))
    if mma:  # same inputs, same bits
        again = gpu.zeros((n * k, F))
        gpu.run(up, "PiPiPPPPPPPi", up_grid, 128, again, np.int32(F), hd, np.int32(Dp), permd,
                offd, actd, tabs["w1"], tabs["w3"], tabs["s1"], tabs["s3"], np.int32(dtype))
        assert gpu.get(again, (n * k, F)).tobytes() == got_act.tobytes()
    want_act = ref.cb_expert_up(h, perm, offsets, w1, w3, F)
    # error bound: dot-product bounds of g and u carried through silu(g) * u (|silu'| <= 1.1),
    # plus a few roundings and expf's 2 ulp on the result
    bound = np.zeros_like(want_act, dtype=np.float64)
    for e in range(E):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b == en:
            continue
        x = h[perm[b:en]].astype(np.float64)
        g = x @ (w1[e].f32() * w1[e].scale()[:, None]).T.astype(np.float64)
        u = x @ (w3[e].f32() * w3[e].scale()[:, None]).T.astype(np.float64)
        bg = bound_of(np.abs(x) @ np.abs(w1[e].f32() * w1[e].scale()[:, None]).T, Dp)
        bu = bound_of(np.abs(x) @ np.abs(w3[e].f32() * w3[e].scale()[:, None]).T, Dp)
        silu = g / (1 + np.exp(-g))
        bound[b:en] = 2 * (1.1 * np.abs(u) * bg + np.abs(silu) * bu + 8 * EPS32 * np.abs(silu * u))
    assert np.all(np.abs(got_act - want_act) <= bound + 1e-30), np.abs(got_act - want_act).max()
    eo = gpu.zeros((n * k, Dp))
    act_in = gpu.put(want_act)  # isolate the down projection from the up one's rounding
    down_grid = ((Dp + rows_per_block - 1) // rows_per_block, groups)
    gpu.run(down, "PiPiPPPPi", down_grid, 128, eo, np.int32(Dp),
            act_in, np.int32(F), offd, actd, tabs["w2"], tabs["s2"], np.int32(dtype))
    got_eo = gpu.get(eo, (n * k, Dp))
    if mma:
        again = gpu.zeros((n * k, Dp))
        gpu.run(down, "PiPiPPPPi", down_grid, 128, again, np.int32(Dp), act_in, np.int32(F),
                offd, actd, tabs["w2"], tabs["s2"], np.int32(dtype))
        assert gpu.get(again, (n * k, Dp)).tobytes() == got_eo.tobytes()
    want_eo = ref.cb_expert_down(want_act, offsets, w2, Dp)
    absdot = np.zeros_like(want_eo, dtype=np.float64)
    for e in range(E):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b < en:
            absdot[b:en] = np.abs(want_act[b:en]).astype(np.float64) @ np.abs(
                w2[e].f32() * w2[e].scale()[:, None]).T
    assert np.all(np.abs(got_eo - want_eo) <= bound_of(absdot, F)), np.abs(got_eo - want_eo).max()
    if mma:
        return  # the combine does not depend on which kernels made eo

    # combine: routed in rank order, then the gated shared expert
    x = rng.standard_normal((n, Dp)).astype(np.float32)
    wts = rng.random((n, k)).astype(np.float32)
    s = rng.standard_normal((n, Dp)).astype(np.float32)
    gate = rng.standard_normal(n).astype(np.float32)
    for shared, gated in ((False, False), (True, False), (True, True)):
        xd = gpu.put(x)
        gpu.run("cb_moe_combine", "PiiPPPPP", (n, 1), 256, xd, np.int32(Dp), np.int32(k),
                gpu.put(want_eo), gpu.put(slot_of), gpu.put(wts), gpu.put(s) if shared else 0,
                gpu.put(gate) if gated else 0)
        want = ref.cb_moe_combine(x, want_eo, slot_of, wts, s if shared else None,
                                  gate if gated else None)
        np.testing.assert_allclose(gpu.get(xd, (n, Dp)), want, rtol=1e-5, atol=1e-5)




# ---------------------------------------------------------------- gpt-oss kernels (#23)

OSS_DTYPES = [DType.F32, DType.F16, DType.BF16, DType.INT8, DType.MXFP4]
# (n, k, E, F, Dp): Dp not a multiple of 16 or 32 (mxfp4's last block padded), decode and prefill
OSS_EXPERT_SHAPES = [(1, 2, 4, 20, 45), (5, 2, 4, 37, 64), (9, 4, 8, 40, 90)]
# (n, pos0, H, Hkv, dh, window, sinks): windows shorter than the prompt, across 128-key tiles
OSS_ATTENTION_SHAPES = [(5, 0, 4, 2, 16, 0, True), (6, 3, 4, 2, 10, 4, True),
                        (1, 200, 2, 1, 24, 128, True), (3, 140, 2, 2, 64, 0, False),
                        (4, 130, 2, 1, 200, 7, True), (2, 300, 3, 1, 8, 0, True)]


def _oss_weight_args(gpu, w: ref.Weight) -> tuple[int, int]:
    """Device copies of a weight and its scales: int8 f32 row scales, mxfp4 the E8M0 bytes."""
    if w.dtype == DType.MXFP4:
        return gpu.put(w.raw), gpu.put(np.ascontiguousarray(w.scales, np.uint8))
    return weight_args(gpu, w)


def _dense(w: ref.Weight) -> np.ndarray:
    return (w.f32() * w.scale()[:, None]).astype(np.float64)


def check_oss_experts(gpu, dtype, n, k, E, F, Dp, biases: bool = True, clamp: bool = True):
    """cb_oss_expert_up (expert biases + clamped SwiGLU) and cb_oss_expert_down (+ bias) over a
    random dispatch, against NumPy with the dot-product error bound of check_grouped_experts.
    Gate/up values are spread over [-12, 12] so the clamp at limit 7 is exercised."""
    rng = np.random.default_rng(n * 7 + E + F + Dp)
    alpha, limit = (1.702, 7.0) if clamp else (0.0, 0.0)
    h = rng.standard_normal((n, Dp)).astype(np.float32)
    def mk(rows, cols, gain):
        return ref.make_weight((rng.standard_normal((rows, cols)) * gain / np.sqrt(cols))
                               .astype(np.float32), dtype)
    w1 = [mk(F, Dp, 6.0) for _ in range(E)]
    w3 = [mk(F, Dp, 6.0) for _ in range(E)]
    w2 = [mk(Dp, F, 1.0) for _ in range(E)]
    b1 = [rng.standard_normal(F).astype(np.float32) for _ in range(E)] if biases else None
    b3 = [rng.standard_normal(F).astype(np.float32) for _ in range(E)] if biases else None
    b2 = [rng.standard_normal(Dp).astype(np.float32) for _ in range(E)] if biases else None
    idx = np.stack([rng.choice(E, k, replace=False) for _ in range(n)]).astype(np.int32)
    offsets, perm, _ = ref.cb_dispatch(idx, E)
    tabs = {}
    for name, ws in (("w1", w1), ("w3", w3), ("w2", w2)):
        pairs = [_oss_weight_args(gpu, w) for w in ws]
        tabs[name] = _pointer_table(gpu, [p for p, _ in pairs])
        tabs["s" + name[1]] = _pointer_table(gpu, [s for _, s in pairs])
    btab = {nm: _pointer_table(gpu, [gpu.put(b) for b in bs]) if bs else 0
            for nm, bs in (("b1", b1), ("b3", b3), ("b2", b2))}
    hd, offd, permd = gpu.put(h), gpu.put(offsets), gpu.put(perm)
    actd, groups = gpu.put(ref.active_experts(offsets)), min(E, n * k)
    act = gpu.put(np.full((n * k, F), np.nan, np.float32))  # every slot's row must be written
    gpu.run("cb_oss_expert_up", "PiPiPPPPPPPiPPff", ((F + 3) // 4, groups), 128, act,
            np.int32(F), hd, np.int32(Dp), permd, offd, actd, tabs["w1"], tabs["w3"],
            tabs["s1"], tabs["s3"], np.int32(dtype), btab["b1"], btab["b3"], np.float32(alpha),
            np.float32(limit))
    got = gpu.get(act, (n * k, F))
    want = ref.cb_oss_expert_up(h, perm, offsets, w1, w3, F, b1, b3, alpha, limit)
    bound = np.zeros_like(want, dtype=np.float64)
    clamped = 0
    for e in range(E):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b == en:
            continue
        x = h[perm[b:en]].astype(np.float64)
        g = x @ _dense(w1[e]).T + (b1[e] if biases else 0)
        u = x @ _dense(w3[e]).T + (b3[e] if biases else 0)
        bg = dot_bound(np.abs(x) @ np.abs(_dense(w1[e])).T, Dp)
        bu = dot_bound(np.abs(x) @ np.abs(_dense(w3[e])).T, Dp)
        clamped += int(np.sum(g > limit) + np.sum(np.abs(u) > limit)) if clamp else 0
        gc, uc = (np.minimum(g, limit), np.clip(u, -limit, limit)) if clamp else (g, u)
        glu = gc / (1 + np.exp(-(alpha if clamp else 1.0) * gc))
        # |d act/d g| <= (|u| + 1) * 1.1 * max(1, alpha); |d act/d u| <= |glu|; a few roundings
        bound[b:en] = 2 * ((np.abs(uc) + 1) * 2.0 * bg + np.abs(glu) * bu
                           + 8 * EPS32 * np.abs((uc + 1) * glu))
    assert not clamp or clamped > 0, "the shape never reaches the clamp"
    assert np.all(np.abs(got - want) <= bound + 1e-30), np.nanmax(np.abs(got - want))
    eo = gpu.put(np.full((n * k, Dp), np.nan, np.float32))
    gpu.run("cb_oss_expert_down", "PiPiPPPPiP", ((Dp + 3) // 4, groups), 128, eo, np.int32(Dp),
            gpu.put(want), np.int32(F), offd, actd, tabs["w2"], tabs["s2"], np.int32(dtype),
            btab["b2"])
    got_eo = gpu.get(eo, (n * k, Dp))
    want_eo = ref.cb_oss_expert_down(want, offsets, w2, Dp, b2)
    absdot = np.zeros_like(want_eo, dtype=np.float64)
    for e in range(E):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b < en:
            absdot[b:en] = np.abs(want[b:en]).astype(np.float64) @ np.abs(_dense(w2[e])).T
    assert np.all(np.abs(got_eo - want_eo) <= dot_bound(absdot, F) + (EPS32 * np.abs(want_eo))
                  ), np.nanmax(np.abs(got_eo - want_eo))


def run_oss_attention(gpu, out: int, q: int, kc: int, vc: int, n: int, pos0: int, H: int,
                      Hkv: int, dh: int, kv_f16: bool, window: int, sinks: int,
                      pos_d: int = 0) -> None:
    gpu.run("cb_oss_attention", "PPPPiiiiiiiPP", (H, n), 128, out, q, kc, vc, np.int32(n),
            np.int32(pos0), np.int32(H), np.int32(Hkv), np.int32(dh), np.int32(kv_f16),
            np.int32(window), sinks, pos_d)


def check_oss_attention(gpu, n, pos0, H, Hkv, dh, window, with_sinks, kv_f16=False):
    """cb_oss_attention against NumPy (sinks, window); every output written; the same bits run to
    run; the last token alone (a decode step), and with its position read from a parameter block
    (the decode graph), gives the chunk's bits for it."""
    q, kst, vst, kc, vc = attention_inputs(n, pos0, H, Hkv, dh, kv_f16)
    rng = np.random.default_rng(n + pos0 + dh)
    sinks = (rng.standard_normal(H) * 2).astype(np.float32) if with_sinks else None
    HD = H * dh
    qd, kd, vd = gpu.put(q), gpu.put(kst), gpu.put(vst)
    sd = gpu.put(sinks) if with_sinks else 0
    out = gpu.put(np.full((n, HD), np.nan, np.float32))
    run_oss_attention(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16, window, sd)
    got = gpu.get(out, (n, HD))
    want = ref.cb_oss_attention(q, kc, vc, pos0, H, Hkv, dh, window, sinks)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(vc).max())
    if window and pos0 + n > window:  # the window matters: full attention differs
        full = ref.cb_oss_attention(q, kc, vc, pos0, H, Hkv, dh, 0, sinks)
        assert np.abs(full - want).max() > 1e-3
    run_oss_attention(gpu, out, qd, kd, vd, n, pos0, H, Hkv, dh, kv_f16, window, sd)
    np.testing.assert_array_equal(gpu.get(out, (n, HD)).view(np.uint32), got.view(np.uint32))
    last = gpu.zeros((1, HD))
    run_oss_attention(gpu, last, qd + (n - 1) * HD * 4, kd, vd, 1, pos0 + n - 1, H, Hkv, dh,
                      kv_f16, window, sd)
    np.testing.assert_array_equal(gpu.get(last, (1, HD))[0].view(np.uint32),
                                  got[n - 1].view(np.uint32))
    graph = gpu.zeros((1, HD))
    run_oss_attention(gpu, graph, qd + (n - 1) * HD * 4, kd, vd, 1, 0, H, Hkv, dh, kv_f16,
                      window, sd, gpu.put(np.array([pos0 + n - 1], np.int32)))
    np.testing.assert_array_equal(gpu.get(graph, (1, HD))[0].view(np.uint32),
                                  got[n - 1].view(np.uint32))


def oss_cases(add) -> None:
    for dt in OSS_DTYPES:
        for shape in OSS_EXPERT_SHAPES:
            add("oss_experts", check_oss_experts, dt, *shape)
    add("oss_experts_no_bias_silu", check_oss_experts, DType.MXFP4, 5, 2, 4, 37, 64,
        biases=False, clamp=False)
    for shape in OSS_ATTENTION_SHAPES:
        for kv_f16 in (False, True):
            add("oss_attention", check_oss_attention, *shape, kv_f16)


# ---------------------------------------------------------------- every check, named

def _mma_or_absent(check, kernel: str):
    """A tensor-core check on sm_80+; below, the image must lack the kernel (the backend then
    keeps the SIMT kernels)."""
    def run(gpu):
        if gpu.sm < 80:
            assert not gpu.has_function(kernel), f"sm_{gpu.sm} image has {kernel}"
            return
        check(gpu)
    return run


def cases() -> list[tuple[str, object]]:
    """(id, check(gpu)) for every kernel check at every shape and option the suite runs: what
    test_kernels_gpu.py parametrizes over and run_conformance.py (no pytest) walks."""
    out: list[tuple[str, object]] = []

    def add(name, fn, *args, **kw):
        out.append(("-".join([name, *(getattr(a, "name", str(a)) for a in args),
                              *(f"{k}={v}" for k, v in kw.items())]),
                    lambda gpu, fn=fn, args=args, kw=kw: fn(gpu, *args, **kw)))

    for dt in DTYPES:
        for shape in EMBED_SHAPES:
            add("embed", check_embed, dt, *shape)
    add("f16_every_value", check_f16_every_value)
    for shape in RMSNORM_SHAPES:
        for in_place in (False, True):
            add("rmsnorm", check_rmsnorm, *shape, in_place)
    for dt in DTYPES:
        for shape in LINEAR_SHAPES:
            add("linear", check_linear, dt, *shape)
    add("linear_strided_rows_into_kv_cache", check_linear_strided_rows_into_kv_cache)
    for shape in QK_ROPE_SHAPES:
        for kv_f16 in (False, True):
            add("qk_rope_kv", check_qk_rope_kv, *shape, kv_f16)
    add("f16_kv_store", check_f16_kv_store)
    for shape in ATTENTION_SHAPES:
        for kv_f16 in (False, True):
            add("attention", check_attention, *shape, kv_f16)
    for shape in PREFILL_SHAPES:
        for kv_f16 in (False, True):
            add("attention_prefill", check_attention_prefill, *shape, kv_f16)
    for shape in TOPK_SHAPES:
        for renorm in (True, False):
            add("router_topk", check_router_topk, *shape, renorm)
    for E, k in ((16, 12), (60, 16)):
        add("router_topk_nan", check_router_topk_nan, E, k)
    for dt in DTYPES:
        for shape in FFN_ROUTE_SHAPES:
            for nan in (False, True):
                add("ffn_route", check_ffn_route, dt, *shape, nan=nan)
    for shape in DISPATCH_SHAPES:
        add("dispatch", check_dispatch, *shape)
    for dt in DTYPES:
        for shape in EXPERT_SHAPES:
            add("grouped_experts", check_grouped_experts, dt, *shape)
    for dt in MMA_DTYPES:
        for shape in EXPERT_MMA_SHAPES:
            name, fn = f"grouped_experts_mma-{dt.name}-" + "-".join(map(str, shape)), \
                _mma_or_absent(lambda g, dt=dt, s=shape: check_grouped_experts(g, dt, *s, mma=True),
                               "cb_expert_up_mma")
            out.append((name, fn))
    for dt in MMA_DTYPES:
        for shape in LINEAR_MMA_SHAPES:
            out.append((f"linear_mma-{dt.name}-" + "-".join(map(str, shape)),
                        _mma_or_absent(lambda g, dt=dt, s=shape: check_linear(g, dt, *s, mma=True),
                                       "cb_linear_mma")))
    oss_cases(add)  # gpt-oss (#23)
    out += hybrid_cases()
    return out


# ---------------------------------------------------------------- hybrid-family kernels (#24)

# DeltaNet (n, C, W): one token and a prompt, widths below/above a block of 256, W 1..4
DN_CONV_SHAPES = [(1, 40, 4), (7, 300, 4), (5, 33, 1), (3, 17, 2)]
# (n, Hk, Hv, Dk, Dv): GQA-like value heads per key head 1..3, dims off 32, Dv above the
# block's 128 threads, Qwen's 128 x 128 heads
DN_RECUR_SHAPES = [(3, 1, 2, 10, 14), (4, 2, 2, 16, 8), (2, 1, 3, 33, 130), (2, 1, 1, 128, 128)]
# partial RoPE (n, H, Hkv, Dh, R, pos0, norm): Qwen3.5's R = Dh/4, odd pair counts, R = 2
PARTIAL_ROPE_SHAPES = [(3, 4, 2, 24, 6, 0, 1), (1, 2, 1, 256, 64, 1000, 1), (5, 3, 3, 16, 2, 30, 0),
                       (2, 2, 2, 10, 8, 7, 1)]


def check_dn_conv(gpu, n, C, W):
    """The causal convolution + SiLU and its state against NumPy; the same tokens cut into two
    passes (and one by one) give the one pass's bits: the recurrence a prompt runs is decode's."""
    rng = np.random.default_rng(n * 1000 + C + W)
    qkv = rng.standard_normal((n, C)).astype(np.float32)
    st = rng.standard_normal((max(W - 1, 1), C)).astype(np.float32)[:W - 1]
    w = rng.standard_normal((C, W)).astype(np.float32)
    wd = gpu.put(w)

    def run(rows: np.ndarray, state: int) -> np.ndarray:
        m = rows.shape[0]
        ud = gpu.put(np.full((m, C), np.nan, np.float32))  # every output written
        gpu.run("cb_dn_conv", "PPPPiii", ((C + 255) // 256, 1), 256, ud, gpu.put(rows), state, wd,
                np.int32(m), np.int32(C), np.int32(W))
        return gpu.get(ud, (m, C))

    sd = gpu.put(st if W > 1 else np.zeros(1, np.float32))
    got = run(qkv, sd)
    want, want_st = ref.cb_dn_conv(qkv, st, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * W)
    if W > 1:
        np.testing.assert_array_equal(gpu.get(sd, (W - 1, C)), want_st.astype(np.float32))
    for cut in sorted({1, n // 2}):
        if cut >= n:
            continue
        sd2 = gpu.put(st if W > 1 else np.zeros(1, np.float32))
        parts = [run(qkv[:cut], sd2)] + [run(qkv[j:j + 1], sd2) for j in range(cut, n)]
        np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), got.view(np.uint32))


def check_dn_recur(gpu, n, Hk, Hv, Dk, Dv):
    """The gated delta rule + gated RMSNorm over a pass against NumPy (float64), its state too;
    the same tokens one by one give the pass's bits, state included."""
    rng = np.random.default_rng(n * 7 + Hk * 11 + Hv * 13 + Dk + Dv)
    kd, vd = Hk * Dk, Hv * Dv
    C, eps = 2 * kd + vd, 1e-6
    u = rng.standard_normal((n, C)).astype(np.float32)
    z = rng.standard_normal((n, vd)).astype(np.float32)
    b = rng.standard_normal((n, Hv)).astype(np.float32)
    a = rng.standard_normal((n, Hv)).astype(np.float32)
    a_log = (0.5 * rng.standard_normal(Hv)).astype(np.float32)
    dt = rng.standard_normal(Hv).astype(np.float32)
    nw = (1 + 0.1 * rng.standard_normal(Dv)).astype(np.float32)
    S0 = (0.3 * rng.standard_normal((Hv, Dk, Dv))).astype(np.float32)
    fixed = [gpu.put(x) for x in (a_log, dt, nw)]

    def run(j0: int, j1: int, Sd: int) -> np.ndarray:
        m = j1 - j0
        od = gpu.put(np.full((m, vd), np.nan, np.float32))
        gpu.run("cb_dn_recur", "PPPPPPPPPiiiiif", (Hv, 1), 128, od, Sd, gpu.put(u[j0:j1]),
                gpu.put(z[j0:j1]), gpu.put(b[j0:j1]), gpu.put(a[j0:j1]), *fixed, np.int32(m),
                np.int32(Hk), np.int32(Hv), np.int32(Dk), np.int32(Dv), np.float32(eps))
        return gpu.get(od, (m, vd))

    Sd = gpu.put(S0)
    got = run(0, n, Sd)
    want, want_S = ref.cb_dn_recur(S0, u, z, b, a, a_log, dt, nw, Hk, Hv, Dk, Dv, eps)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    got_S = gpu.get(Sd, (Hv, Dk, Dv))
    np.testing.assert_allclose(got_S, want_S, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want_S).max()))
    S1 = gpu.put(S0)
    steps = np.concatenate([run(j, j + 1, S1) for j in range(n)])
    np.testing.assert_array_equal(steps.view(np.uint32), got.view(np.uint32))
    np.testing.assert_array_equal(gpu.get(S1, (Hv, Dk, Dv)).view(np.uint32), got_S.view(np.uint32))


def check_qk_rope_partial_kv(gpu, n, H, Hkv, dh, R, pos0, norm, kv_f16):
    """Per-head q/k norm + RoPE on the first R lanes + the KV write against NumPy; only the chunk's
    cache rows written; the decode graph's launch (position from the parameter block) gives the
    plain launch's bits."""
    rng = np.random.default_rng(n * 100 + dh + R + pos0)
    HD, kvd, eps, S, theta = H * dh, Hkv * dh, 1e-6, pos0 + n + 2, 10000.0
    qkv = (3 * rng.standard_normal((n, HD + 2 * kvd))).astype(np.float32)
    qn = (1 + 0.1 * rng.standard_normal(dh)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(dh)).astype(np.float32)
    table = gpu.put(ref.rope_partial_table(S, R, theta))

    def run(rows: np.ndarray, p0: int, pos_d: int):
        m = rows.shape[0]
        qd = gpu.put(np.full((m, HD), np.nan, np.float32))
        kd, vd = kv_cache(gpu, S, kvd, kv_f16), kv_cache(gpu, S, kvd, kv_f16)
        gpu.run("cb_qk_rope_partial_kv", "PPPPiiiiiPPPifiP", (m, H + Hkv), 256, qd, gpu.put(rows),
                kd, vd, np.int32(H), np.int32(Hkv), np.int32(dh), np.int32(R),
                np.int32(p0), table, gpu.put(qn) if norm else 0, gpu.put(kn) if norm else 0,
                np.int32(norm), np.float32(eps), np.int32(kv_f16), pos_d)
        return (gpu.get(qd, (m, HD)), read_cache(gpu, kd, S, kvd, kv_f16),
                read_cache(gpu, vd, S, kvd, kv_f16))

    got_q, got_k, got_v = run(qkv, pos0, 0)
    for c in (got_k, got_v):
        assert np.all(c[:pos0] == 7.0) and np.all(c[pos0 + n:] == 7.0)
    want_q, want_k, want_v = ref.cb_qk_rope_partial_kv(qkv, H, Hkv, dh, R, pos0, theta, norm, qn,
                                                       kn, eps)
    rows = slice(pos0, pos0 + n)
    tol = 1e-5 * max(np.abs(want_q).max(), np.abs(want_k).max())
    np.testing.assert_allclose(got_q, want_q, rtol=0, atol=tol)
    rt = 2.0 ** -10 if kv_f16 else 0
    np.testing.assert_allclose(got_k[rows].astype(np.float32), want_k, rtol=rt, atol=tol)
    np.testing.assert_allclose(got_v[rows].astype(np.float32), want_v, rtol=rt, atol=0)
    q1, k1, _ = run(qkv[n - 1:], 0, gpu.put(np.array([pos0 + n - 1], np.int32)))
    np.testing.assert_array_equal(q1[0].view(np.uint32), got_q[n - 1].view(np.uint32))
    last = pos0 + n - 1
    np.testing.assert_array_equal(k1[last], got_k[last])


def check_sigmoid_gate(gpu, n, HD):
    """att *= sigmoid(gate), every element of the n rows, nothing past them."""
    rng = np.random.default_rng(n + HD)
    att = rng.standard_normal((n + 1, HD)).astype(np.float32)
    gate = (4 * rng.standard_normal((n, HD))).astype(np.float32)
    ad = gpu.put(att)
    gpu.run("cb_sigmoid_gate", "PPi", (n, 1), 256, ad, gpu.put(gate), np.int32(HD))
    got = gpu.get(ad, (n + 1, HD))
    want = att[:n].astype(np.float64) / (1 + np.exp(-gate.astype(np.float64)))
    np.testing.assert_allclose(got[:n], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[n], att[n])


def check_zero(gpu, count, blocks):
    """cb_zero clears exactly `count` floats with any grid (the state reset)."""
    buf = gpu.put(np.full(count + 3, 5.0, np.float32))
    gpu.run("cb_zero", "Pi", (blocks, 1), 256, buf, np.int32(count))
    got = gpu.get(buf, (count + 3,))
    assert np.all(got[:count] == 0.0) and np.all(got[count:] == 5.0), got


def hybrid_cases() -> list[tuple[str, object]]:
    """The hybrid-family checks, named as cases() names its own (cases() appends them)."""
    out: list[tuple[str, object]] = []

    def add(name, fn, *args):
        out.append(("-".join([name, *map(str, args)]),
                    lambda gpu, fn=fn, args=args: fn(gpu, *args)))

    for shape in DN_CONV_SHAPES:
        add("dn_conv", check_dn_conv, *shape)
    for shape in DN_RECUR_SHAPES:
        add("dn_recur", check_dn_recur, *shape)
    for shape in PARTIAL_ROPE_SHAPES:
        for kv_f16 in (False, True):
            add("qk_rope_partial_kv", check_qk_rope_partial_kv, *shape, kv_f16)
    for n, HD in ((1, 24), (3, 600)):
        add("sigmoid_gate", check_sigmoid_gate, n, HD)
    for count, blocks in ((1, 1), (1000, 2), (70000, 8)):
        add("zero", check_zero, count, blocks)
    return out
