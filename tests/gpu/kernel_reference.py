"""NumPy reference of every CUDA kernel in runtime/kernels/colibri_kernels.cu, argument for
argument, plus `backend_forward`: the kernels composed in exactly the order
runtime/src/cuda/cuda_backend.c issues them.

Two uses:
* tests/gpu/test_kernels_gpu.py compares each GPU kernel with its function here;
* tests/test_cuda_host.py checks, on the CPU, that `backend_forward` (i.e. the backend's plan of
  kernels, buffers, strides and KV-cache layout) reproduces colibri_kit.model.reference, so the
  per-kernel references are known to add up to the model's forward pass.

Weights are passed as (raw array, dtype, scales): f32 as float32, f16 as float16, bf16 as uint16
bit patterns, int8 as int8 with one f32 scale per row, as in the `.colibri` file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from colibri_kit.model.format import NONE, DType, Flag, Kind, Routing, bf16_bits_to_f32

SOFTMAX_TOPK = 1   # COLIBRI_ROUTING_SOFTMAX_TOPK
LINEAR_SCORE = 2   # COLIBRI_ROUTING_LINEAR_SCORE


@dataclass
class Weight:
    raw: np.ndarray               # [rows, cols] in the stored dtype (q4: [rows, groups * 16] bytes)
    dtype: int
    scales: np.ndarray | None = None
    q4_cols: int = 0              # q4 and mxfp4 only: the true column count

    @property
    def rows(self) -> int:
        return self.raw.shape[0]

    @property
    def cols(self) -> int:
        return self.q4_cols if self.dtype in (DType.Q4, DType.MXFP4) else self.raw.shape[1]

    def f32(self) -> np.ndarray:
        """Element values without the int8 row scale (the kernels apply it after the dot); q4
        values are dequantised with their group scales (exact in f32)."""
        if self.dtype == DType.BF16:
            return bf16_bits_to_f32(self.raw)
        if self.dtype == DType.Q4:
            from colibri_kit.model.format import dequantize_q4

            return dequantize_q4(self.raw, self.scales, self.rows, self.q4_cols)
        if self.dtype == DType.MXFP4:  # E8M0 bytes per 32 columns (gpt-oss, #23)
            from colibri_kit.model.format import dequantize_mxfp4

            return dequantize_mxfp4(self.raw, self.scales, self.rows, self.q4_cols)
        return self.raw.astype(np.float32)

    def scale(self) -> np.ndarray:
        if self.dtype == DType.INT8:
            assert self.scales is not None
            return self.scales.astype(np.float32)
        return np.ones(self.rows, np.float32)


def make_weight(a: np.ndarray, dtype: int) -> Weight:
    """Encode f32 `a` [rows, cols] the way the converter does."""
    from colibri_kit.model.format import f32_to_bf16_bits, quantize_int8

    a = np.ascontiguousarray(a, np.float32)
    if dtype == DType.F32:
        return Weight(a, dtype)
    if dtype == DType.F16:
        return Weight(a.astype(np.float16), dtype)
    if dtype == DType.BF16:
        return Weight(f32_to_bf16_bits(a), dtype)
    if dtype == DType.Q4:
        from colibri_kit.model.format import quantize_q4

        packed, d = quantize_q4(a)
        return Weight(packed, dtype, d, q4_cols=a.shape[1])
    if dtype == DType.MXFP4:
        from colibri_kit.model.format import quantize_mxfp4

        blocks, e8m0 = quantize_mxfp4(a)
        return Weight(blocks, dtype, e8m0, q4_cols=a.shape[1])
    q, s = quantize_int8(a)
    return Weight(q, dtype, s)


# ---------------------------------------------------------------- one function per kernel


def cb_embed(ids: np.ndarray, table: Weight) -> np.ndarray:
    """x[t] = dequant(table[ids[t]])."""
    return (table.f32()[ids] * table.scale()[ids][:, None]).astype(np.float32)


def cb_rmsnorm(x: np.ndarray, w: np.ndarray, length: int, true_len: int, eps: float) -> np.ndarray:
    """Rows of x (already reshaped to [rows, >= length]) -> [rows, length]."""
    x = x[:, :length].astype(np.float32)
    ss = np.sum(x[:, :true_len].astype(np.float64) ** 2, axis=1)
    inv = (1.0 / np.sqrt((ss / true_len).astype(np.float32) + np.float32(eps))).astype(np.float32)
    return (w[:length][None, :] * (x * inv[:, None])).astype(np.float32)


def cb_linear(x: np.ndarray, w: Weight, bias: np.ndarray | None = None,
              y: np.ndarray | None = None) -> np.ndarray:
    """y[t, r] (+)= scale[r] * (W[r] . x[t]) (+ bias[r]); accumulate when y is given."""
    dot = (x.astype(np.float64) @ w.f32().T.astype(np.float64)) * w.scale()[None, :]
    if bias is not None:
        dot = dot + bias[None, :]
    if y is not None:
        dot = y.astype(np.float64) + dot
    return dot.astype(np.float32)


def rope_cos_sin(pos: np.ndarray, dh: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's angles: e = f32(2i)/f32(Dh), inv = f32(1/theta^e) (double pow), angle in f32,
    cos/sin in double rounded to f32."""
    half = dh // 2
    e = (np.arange(half, dtype=np.float32) * np.float32(2)) / np.float32(dh)
    inv = (1.0 / np.power(np.float64(theta), e.astype(np.float64))).astype(np.float32)
    ang = (pos.astype(np.float32)[:, None] * inv[None, :]).astype(np.float32)
    return (np.cos(ang.astype(np.float64)).astype(np.float32),
            np.sin(ang.astype(np.float64)).astype(np.float32))


def cb_rope(x: np.ndarray, nheads: int, dh: int, pos0: int, theta: float) -> np.ndarray:
    """x [n, >= nheads*dh] -> rotated copy (columns past nheads*dh unchanged)."""
    n = x.shape[0]
    out = x.astype(np.float32).copy()
    c, s = rope_cos_sin(np.arange(pos0, pos0 + n), dh, theta)
    half = dh // 2
    v = out[:, : nheads * dh].reshape(n, nheads, dh)
    a, b = v[:, :, :half].copy(), v[:, :, half:].copy()
    v[:, :, :half] = a * c[:, None, :] - b * s[:, None, :]
    v[:, :, half:] = b * c[:, None, :] + a * s[:, None, :]
    out[:, : nheads * dh] = v.reshape(n, nheads * dh)
    return out


def f16_round(a: np.ndarray) -> np.ndarray:
    """What an f16 KV cache holds, as f32: round to nearest even (NumPy's float16 cast, the same
    rounding as the kernels' cvt.rn.f16.f32 and the CPU's half_from_float), widened exactly."""
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


QK_NORM_NONE, QK_NORM_HEAD, QK_NORM_FULL = 0, 1, 2  # cb_qk_rope_kv's `norm`


def cb_qk_rope_kv(qkv: np.ndarray, H: int, Hkv: int, dh: int, pos0: int, theta: float,
                  norm: int = QK_NORM_NONE, qn: np.ndarray | None = None,
                  kn: np.ndarray | None = None, eps: float = 1e-6
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qkv [n, H*dh + 2*Hkv*dh] (the Q/K/V projections' rows) -> q [n, H*dh] and the K and V
    rows [n, Hkv*dh] the cache gets (before an f16 cache's rounding): q/k norm (per head or full
    width), then RoPE at positions pos0.., V unchanged."""
    n = qkv.shape[0]
    HD, kvd = H * dh, Hkv * dh
    q, k, v = qkv[:, :HD], qkv[:, HD:HD + kvd], qkv[:, HD + kvd:HD + 2 * kvd]
    if norm == QK_NORM_HEAD:
        q = cb_rmsnorm(q.reshape(n * H, dh), qn, dh, dh, eps).reshape(n, HD)
        k = cb_rmsnorm(k.reshape(n * Hkv, dh), kn, dh, dh, eps).reshape(n, kvd)
    elif norm == QK_NORM_FULL:
        q = cb_rmsnorm(q, qn, HD, HD, eps)
        k = cb_rmsnorm(k, kn, kvd, kvd, eps)
    return (cb_rope(q, H, dh, pos0, theta), cb_rope(k, Hkv, dh, pos0, theta),
            v.astype(np.float32).copy())


def cb_attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int, H: int, Hkv: int,
                 dh: int) -> np.ndarray:
    """q [n, H*dh]; kc/vc [S, Hkv*dh] (one layer of the cache, as f32: an f16 cache widened) ->
    out [n, H*dh]. Both attention kernels (split-KV, tiled prefill) compute this."""
    n = q.shape[0]
    out = np.zeros((n, H * dh), np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(dh))
    for t in range(n):
        last = pos0 + t
        for h in range(H):
            g = h // (H // Hkv)
            keys = kc[: last + 1, g * dh:(g + 1) * dh].astype(np.float64)
            vals = vc[: last + 1, g * dh:(g + 1) * dh].astype(np.float64)
            s = (keys @ q[t, h * dh:(h + 1) * dh].astype(np.float64)) * scale
            p = np.exp(s - s.max())
            p = p / p.sum()
            out[t, h * dh:(h + 1) * dh] = p @ vals
    return out


def cb_router_topk(logits: np.ndarray, k: int, renorm: bool,
                   mode: int = SOFTMAX_TOPK) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the k experts (ties to the lower index) and weights, as route.c computes them."""
    n, E = logits.shape
    idx = np.zeros((n, k), np.int32)
    wts = np.zeros((n, k), np.float32)
    for t in range(n):
        lr = logits[t].astype(np.float32)
        mx = np.float32(lr.max())
        ex = np.exp(lr.astype(np.float64) - np.float64(mx))
        total = 0.0
        for v in ex:  # in index order, like route.c and the kernel
            total += float(v)
        if mode == SOFTMAX_TOPK:
            key = (ex / total).astype(np.float32)
        else:
            key = lr
        order = np.argsort(-key.astype(np.float64), kind="stable")[:k]
        idx[t] = order
        sel = key[order].astype(np.float64)
        if mode == SOFTMAX_TOPK:
            wts[t] = (sel / sel.sum()) if renorm else sel
        elif renorm:
            e = np.exp(sel - sel[0])
            wts[t] = e / e.sum()
        else:
            wts[t] = np.exp(sel - np.float64(mx)) / total
    return idx, wts


def cb_dispatch(idx: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token, rank) assignments grouped by expert in assignment order ->
    offsets [E+1], perm [n*k] (slot -> token), slot_of [n*k] ((t*k + j) -> slot)."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    counts = np.bincount(flat, minlength=E)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    order = np.argsort(flat, kind="stable")  # by expert, then assignment order
    slot_of = np.empty(n * k, np.int32)
    slot_of[order] = np.arange(n * k, dtype=np.int32)
    perm = (order // k).astype(np.int32)
    return offsets, perm, slot_of


def active_experts(offsets: np.ndarray) -> np.ndarray:
    """cb_dispatch's `active` [E]: the experts with slots in index order, then -1."""
    E = len(offsets) - 1
    have = np.flatnonzero(np.diff(offsets) > 0).astype(np.int32)
    return np.concatenate([have, np.full(E - len(have), -1, np.int32)])


def silu(g: np.ndarray) -> np.ndarray:
    return (g / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32)


def cb_expert_up(h: np.ndarray, perm: np.ndarray, offsets: np.ndarray, w1: list[Weight],
                 w3: list[Weight], F: int) -> np.ndarray:
    """act[slot] = silu(W1_e h[perm[slot]]) * (W3_e h[perm[slot]]) for each expert's slots."""
    act = np.zeros((len(perm), F), np.float32)
    for e in range(len(offsets) - 1):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b == en:
            continue
        x = h[perm[b:en]]
        act[b:en] = silu(cb_linear(x, w1[e])) * cb_linear(x, w3[e])
    return act


def cb_expert_down(act: np.ndarray, offsets: np.ndarray, w2: list[Weight], Dp: int) -> np.ndarray:
    eo = np.zeros((act.shape[0], Dp), np.float32)
    for e in range(len(offsets) - 1):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b < en:
            eo[b:en] = cb_linear(act[b:en], w2[e])
    return eo


def cb_moe_combine(x: np.ndarray, eo: np.ndarray, slot_of: np.ndarray, wts: np.ndarray,
                   s: np.ndarray | None = None, gate: np.ndarray | None = None) -> np.ndarray:
    n, k = wts.shape
    acc = np.zeros_like(x, dtype=np.float64)
    for j in range(k):
        acc += wts[:, j:j + 1].astype(np.float64) * eo[slot_of.reshape(n, k)[:, j]]
    if s is not None:
        g = 1.0 / (1.0 + np.exp(-gate.astype(np.float64))) if gate is not None else np.ones(n)
        acc += g[:, None] * s
    return (x + acc).astype(np.float32)


# ---------------------------------------------------------------- the backend's kernel plan


def _weight(model, kind: Kind, layer: int = NONE, expert: int = NONE) -> Weight:
    r = model.record(kind, layer, expert)
    raw = model.raw(kind, layer, expert)
    if r.dtype == DType.Q4:
        sc = model.scales(kind, layer, expert).astype(np.float16)  # exact: stored as f16
        return Weight(raw.reshape(r.rows, -1), r.dtype, sc, q4_cols=r.cols)
    view = {DType.F32: "<f4", DType.F16: "<f2", DType.BF16: "<u2", DType.INT8: "i1"}[DType(r.dtype)]
    return Weight(raw.view(view).reshape(r.rows, r.cols), r.dtype, model.scales(kind, layer, expert))


def _vec(model, kind: Kind, layer: int = NONE) -> np.ndarray:
    return model.tensor(kind, layer)[0]


class BackendForward:
    """The kernels in cuda_backend.c's order (cb_forward_chunk), on NumPy arrays laid out like the
    device buffers: x/h [n, Dp], Q/K/V projections' rows [n, H*Dh + 2*Hkv*Dh], q [n, H*Dh],
    K/V cache [L, S, Hkv*Dh] written in place (rounded to f16 with kv_dtype "f16")."""

    def __init__(self, model, mode: int = SOFTMAX_TOPK, kv_dtype: str = "f32") -> None:
        self.m = model
        self.h = model.header
        self.mode = mode
        self.kv_f16 = kv_dtype == "f16"
        h = self.h
        kvd = h.n_kv_heads * h.head_dim
        self.kc = np.zeros((h.n_layers, h.max_seq_len, kvd), np.float32)
        self.vc = np.zeros_like(self.kc)
        self.pos = 0
        self.routes: list[np.ndarray] = []  # per layer call: idx [n, k]

    def forward(self, ids: list[int], chunk: int = 32) -> np.ndarray:
        out = []
        for t in range(0, len(ids), chunk):
            out.append(self._chunk(np.asarray(ids[t:t + chunk], np.int32)))
        return np.concatenate(out)

    def _chunk(self, ids: np.ndarray) -> np.ndarray:
        m, h = self.m, self.h
        n, pos = len(ids), self.pos
        Dp, D, H, Hkv, Dh = h.embed_dim_pad, h.embed_dim, h.n_heads, h.n_kv_heads, h.head_dim
        HD, kvd, eps = H * Dh, Hkv * Dh, h.norm_eps
        x = cb_embed(ids, _weight(m, Kind.TOK_EMBED))
        for l in range(h.n_layers):
            hn = cb_rmsnorm(x, _vec(m, Kind.ATTN_NORM, l), Dp, D, eps)
            bias = h.has(Flag.QKV_BIAS)
            qkv = np.concatenate([
                cb_linear(hn, _weight(m, Kind.WQ, l), _vec(m, Kind.BQ, l) if bias else None),
                cb_linear(hn, _weight(m, Kind.WK, l), _vec(m, Kind.BK, l) if bias else None),
                cb_linear(hn, _weight(m, Kind.WV, l), _vec(m, Kind.BV, l) if bias else None)], axis=1)
            norm = QK_NORM_HEAD if h.has(Flag.QK_NORM_HEAD) else \
                QK_NORM_FULL if h.has(Flag.QK_NORM_FULL) else QK_NORM_NONE
            qn = _vec(m, Kind.Q_NORM, l) if norm else None
            kn = _vec(m, Kind.K_NORM, l) if norm else None
            q, k, v = cb_qk_rope_kv(qkv, H, Hkv, Dh, pos, h.rope_theta, norm, qn, kn, eps)
            self.kc[l, pos:pos + n] = f16_round(k) if self.kv_f16 else k
            self.vc[l, pos:pos + n] = f16_round(v) if self.kv_f16 else v
            att = cb_attention(q, self.kc[l], self.vc[l], pos, H, Hkv, Dh)
            x = cb_linear(att, _weight(m, Kind.WO, l), y=x)
            hn = cb_rmsnorm(x, _vec(m, Kind.FFN_NORM, l), Dp, D, eps)
            s = gate = None
            if h.has(Flag.SHARED_EXPERT):
                ident = np.arange(n, dtype=np.int32)
                offs = np.array([0, n], np.int32)
                sact = cb_expert_up(hn, ident, offs, [_weight(m, Kind.SHARED_W1, l)],
                                    [_weight(m, Kind.SHARED_W3, l)], h.shared_expert_size)
                s = cb_expert_down(sact, offs, [_weight(m, Kind.SHARED_W2, l)], Dp)
                if h.has(Flag.SHARED_EXPERT_GATE):
                    gate = cb_linear(hn, _weight(m, Kind.SHARED_GATE, l))[:, 0]
            # FFN norm (above), router, top-k: one cb_ffn_route launch when the backend fuses
            # them (E <= 16), with the three kernels' bits (tests/gpu/conformance.py)
            logits = cb_linear(hn, _weight(m, Kind.ROUTER, l))
            idx, wts = cb_router_topk(logits, h.top_k, h.routing == Routing.RENORMALISE, self.mode)
            self.routes.append(idx)
            offsets, perm, slot_of = cb_dispatch(idx, h.num_experts)
            E = h.num_experts
            w1 = [_weight(m, Kind.EXPERT_W1, l, e) for e in range(E)]
            w3 = [_weight(m, Kind.EXPERT_W3, l, e) for e in range(E)]
            w2 = [_weight(m, Kind.EXPERT_W2, l, e) for e in range(E)]
            act = cb_expert_up(hn, perm, offsets, w1, w3, h.expert_size)
            eo = cb_expert_down(act, offsets, w2, Dp)
            x = cb_moe_combine(x, eo, slot_of, wts, s, gate)
        xn = cb_rmsnorm(x, _vec(m, Kind.OUTPUT_NORM), Dp, D, eps)
        head = Kind.TOK_EMBED if h.has(Flag.TIED_EMBEDDINGS) else Kind.LM_HEAD
        self.pos += n
        return cb_linear(xn, _weight(m, head))


# ---- hybrid-family kernels (#24, Qwen3.5 / Qwen3-Next), float64 -------------------------------

def cb_dn_conv(qkv: np.ndarray, state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution + SiLU over a pass (runtime/src/layers/deltanet.c conv_task):
    qkv [n, C], the state's last W-1 inputs [W-1, C] (oldest first), taps w [C, W]. Returns the
    output [n, C] and the new state."""
    n, W = qkv.shape[0], w.shape[1]
    full = np.concatenate([state, qkv]).astype(np.float64)  # input s of the pass is row s + W-1
    u = np.stack([(full[j:j + W] * w.T.astype(np.float64)).sum(0) for j in range(n)])
    return u / (1.0 + np.exp(-u)), full[n:n + W - 1]


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum() + 1e-6)


def cb_dn_recur(S: np.ndarray, u: np.ndarray, z: np.ndarray, b: np.ndarray, a: np.ndarray,
                a_log: np.ndarray, dt_bias: np.ndarray, nw: np.ndarray, Hk: int, Hv: int,
                Dk: int, Dv: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule per value head, token by token, then the gated RMSNorm
    (runtime/src/layers/deltanet.c prepare + colibri_delta_step + recur_task; transformers'
    torch_recurrent_gated_delta_rule + RMSNormGated). S [Hv, Dk, Dv], u [n, 2 Hk Dk + Hv Dv],
    z [n, Hv Dv], b, a [n, Hv]. Returns o [n, Hv Dv] and the new S."""
    n, kd, vd = u.shape[0], Hk * Dk, Hv * Dv
    S = S.astype(np.float64).copy()
    u, z = u.astype(np.float64), z.astype(np.float64)
    o = np.zeros((n, vd))
    for h in range(Hv):
        kh = h // (Hv // Hk)
        for j in range(n):
            q = l2norm(u[j, kh * Dk:(kh + 1) * Dk]) / np.sqrt(Dk)
            k = l2norm(u[j, kd + kh * Dk:kd + (kh + 1) * Dk])
            v = u[j, 2 * kd + h * Dv:2 * kd + (h + 1) * Dv]
            beta = 1.0 / (1.0 + np.exp(-float(b[j, h])))
            x = float(a[j, h]) + float(dt_bias[h])
            decay = np.exp(-np.exp(float(a_log[h])) * (x if x > 20 else np.log1p(np.exp(x))))
            S[h] *= decay
            d = (v - S[h].T @ k) * beta
            S[h] += np.outer(k, d)
            oh = S[h].T @ q
            oh = nw * oh / np.sqrt((oh * oh).mean() + eps)
            zz = z[j, h * Dv:(h + 1) * Dv]
            o[j, h * Dv:(h + 1) * Dv] = oh * zz / (1.0 + np.exp(-zz))
    return o, S


def rope_partial_table(positions: int, R: int, theta: float) -> np.ndarray:
    """[positions, R/2, (cos, sin)] f32: angle p * theta^(-2i/R) in double, cos/sin in double
    rounded to f32 (runtime/src/layers/attention.c rope_partial; cuda_backend.c
    colibri_cuda_rope_table_partial)."""
    inv = np.array([theta ** (-2.0 * i / R) for i in range(R // 2)])
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.ascontiguousarray(np.stack([np.cos(ang), np.sin(ang)], -1), np.float32)


def cb_qk_rope_partial_kv(qkv: np.ndarray, H: int, Hkv: int, dh: int, R: int, pos0: int,
                          theta: float, norm: int, qn: np.ndarray, kn: np.ndarray, eps: float
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-head q/k RMSNorm (norm 1) then rotate-half on each head's first R lanes (Qwen3.5's
    partial RoPE); returns q [n, H dh], K and V rows [n, Hkv dh]."""
    n, HD, kvd, half = qkv.shape[0], H * dh, Hkv * dh, R // 2
    tab = rope_partial_table(pos0 + n, R, theta).astype(np.float64)
    outs = []
    for part, heads, w in ((qkv[:, :HD], H, qn), (qkv[:, HD:HD + kvd], Hkv, kn)):
        x = part.astype(np.float64).reshape(n, heads, dh).copy()
        if norm:
            x = w * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        c = tab[pos0:pos0 + n, :, 0][:, None, :]
        s = tab[pos0:pos0 + n, :, 1][:, None, :]
        x1, x2 = x[..., :half].copy(), x[..., half:R].copy()
        x[..., :half], x[..., half:R] = x1 * c - x2 * s, x2 * c + x1 * s
        outs.append(x.reshape(n, -1))
    return outs[0], outs[1], qkv[:, HD + kvd:].astype(np.float64)
# ---------------------------------------------------------------- gpt-oss kernels (#23)


def clamped_swiglu(g: np.ndarray, u: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's activation (transformers' GptOssExperts._apply_gate; layers/moe_experts.c):
    gate clamped above at limit, up to [-limit, limit], (up + 1) * g * sigmoid(alpha * g)."""
    g = np.minimum(g.astype(np.float64), limit)
    u = np.clip(u.astype(np.float64), -limit, limit)
    return ((u + 1.0) * g / (1.0 + np.exp(-alpha * g))).astype(np.float32)


def cb_oss_expert_up(h: np.ndarray, perm: np.ndarray, offsets: np.ndarray, w1: list[Weight],
                     w3: list[Weight], F: int, b1: list[np.ndarray] | None,
                     b3: list[np.ndarray] | None, alpha: float, limit: float) -> np.ndarray:
    """act[slot] = act(W1_e x + b1_e, W3_e x + b3_e), x = h[perm[slot]]; act: the clamped SwiGLU
    when limit > 0, else silu(g) * u."""
    act = np.zeros((len(perm), F), np.float32)
    for e in range(len(offsets) - 1):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b == en:
            continue
        x = h[perm[b:en]]
        g = cb_linear(x, w1[e], b1[e] if b1 else None)
        u = cb_linear(x, w3[e], b3[e] if b3 else None)
        act[b:en] = clamped_swiglu(g, u, alpha, limit) if limit > 0 else silu(g) * u
    return act


def cb_oss_expert_down(act: np.ndarray, offsets: np.ndarray, w2: list[Weight], Dp: int,
                       b2: list[np.ndarray] | None) -> np.ndarray:
    eo = np.zeros((act.shape[0], Dp), np.float32)
    for e in range(len(offsets) - 1):
        b, en = int(offsets[e]), int(offsets[e + 1])
        if b < en:
            eo[b:en] = cb_linear(act[b:en], w2[e], b2[e] if b2 else None)
    return eo


def cb_oss_attention(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int, H: int, Hkv: int,
                     dh: int, window: int, sinks: np.ndarray | None) -> np.ndarray:
    """cb_attention's formula over positions max(0, p - window + 1)..p (window 0: all), with
    head h's sink logit in the softmax's denominator (no value row), as transformers'
    eager_attention_forward for gpt-oss."""
    n = q.shape[0]
    out = np.zeros((n, H * dh), np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(dh))
    for t in range(n):
        p = pos0 + t
        first = max(0, p - window + 1) if window else 0
        for h in range(H):
            g = h // (H // Hkv)
            keys = kc[first: p + 1, g * dh:(g + 1) * dh].astype(np.float64)
            vals = vc[first: p + 1, g * dh:(g + 1) * dh].astype(np.float64)
            s = (keys @ q[t, h * dh:(h + 1) * dh].astype(np.float64)) * scale
            mx = max(s.max(), float(sinks[h])) if sinks is not None else s.max()
            e = np.exp(s - mx)
            total = e.sum() + (np.exp(float(sinks[h]) - mx) if sinks is not None else 0.0)
            out[t, h * dh:(h + 1) * dh] = (e / total) @ vals
    return out
