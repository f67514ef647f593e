"""A NumPy forward pass over a `.colibri` file, written to be read next to docs/format.md.

It is the expected answer for the C runtime (tests and the on-device smoke test), so it favours
clarity over speed: one token at a time, every step of "Forward pass" spelled out, weights
dequantised to float32 (or float64) once at load.

    ref = Reference("model.colibri")
    logits = ref.forward([1, 2, 3])       # [3, V]; continues from the KV cache position
    new_ids = ref.generate([1, 2, 3], 8)  # greedy; resets first
    ref.routing                           # experts chosen, per token, per layer
    Reference("model.colibri", kv_dtype="f16")  # K and V rounded to float16 in the cache, as
                                                # the runtime's --kv-cache f16 stores them

Each layer's cache is what its kind keeps (docs/runtime.md, "Layer kinds"): max_seq_len rows for
full attention, a ring of min(W, max_seq_len) rows for a sliding window of W positions (position
p in row p % rows), so a prompt several windows long wraps it as the runtime's does; a
gated_deltanet layer (Qwen3.5, Qwen3-Next) keeps its convolution's last W-1 inputs and one
[Dk, Dv] delta-rule state per value head, updated one token at a time.

gpt-oss's parts follow transformers' GptOssForCausalLM: YaRN RoPE (``rope_frequencies``),
attention sinks, q/k/v/o biases, the router bias with top-k then softmax over the chosen logits
(equal to softmax, top-k, renormalise), expert biases and the clamped SwiGLU; mxfp4 weights are
dequantised exactly (format.dequantize_mxfp4).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from colibri_kit.errors import ModelError
from colibri_kit.model.format import (
    NONE, ColibriModel, DeltaNetGeometry, FfnFlag, Flag, Kind, Mixer, MixerFlag, ModelHeader, Routing,
    layer_kv_positions, layer_window, read_model, rotary_width,
)


def rope_frequencies(h: ModelHeader) -> tuple[np.ndarray, float]:
    """The frequency of each RoPE pair (float64, Dh/2 values) and the factor cos and sin are
    multiplied by, as runtime/src/core/rope.c computes them: theta^(-2i/Dh), or with the
    ROPE_YARN flag transformers' _compute_yarn_parameters (modeling_rope_utils.py): a ramp
    between the plain frequencies and them divided by ``factor``, over the pairs between the
    correction dimensions of beta_fast and beta_slow, and YaRN's attention factor."""
    dim, base = h.head_dim, float(h.rope_theta)
    plain = base ** (-2.0 * np.arange(dim // 2, dtype=np.float64) / dim)
    y = h.yarn
    if y is None:
        return plain, 1.0

    def correction_dim(rotations: float) -> float:
        return dim * math.log(y.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(y.beta_fast), correction_dim(y.beta_slow)
    if y.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0.0), min(high, dim - 1.0)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # the share of the plain frequency
    return (plain / y.factor) * (1.0 - keep) + plain * keep, float(np.float32(y.attention_factor))


@dataclass(frozen=True)
class Route:
    """The routing decision of one layer for one token."""

    experts: tuple[int, ...]  # in decreasing probability (ties: lower index first)
    weights: tuple[float, ...]
    margin: float  # router logit of the last chosen expert minus the best unchosen one (inf if none)


KV_DTYPES = ("f32", "f16")  # the runtime's colibri_kv_dtype (docs/runtime.md, "Memory")


class Reference:
    # Keep dequantised weights in memory when they fit in this many bytes; larger models are
    # dequantised tensor by tensor on every use (slow, but memory stays near one tensor).
    CACHE_LIMIT = 2 << 30

    def __init__(self, model: str | os.PathLike[str] | ColibriModel, dtype: type = np.float32,
                 cache: bool | None = None, kv_dtype: str = "f32") -> None:
        if kv_dtype not in KV_DTYPES:
            raise ModelError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
        # f16: K and V are rounded to IEEE half (NumPy: round to nearest even, subnormals kept)
        # when stored and used widened, for this token too: what the runtime's cache holds.
        self.kv_f16 = kv_dtype == "f16"
        self.model = model if isinstance(model, ColibriModel) else read_model(model)
        self.h = self.model.header
        self.dtype = np.dtype(dtype)
        h = self.h
        if cache is None:
            cache = sum(r.rows * r.cols for r in self.model) * self.dtype.itemsize <= self.CACHE_LIMIT
        self.cache = cache
        self.w: dict[tuple[int, int, int], np.ndarray] = {}
        self.group = h.n_heads // h.n_kv_heads
        # Frequency of pair i: theta^(-2i/Dh), or YaRN's; cos and sin times rope_scale
        self.inv_freq, self.rope_scale = rope_frequencies(h)
        # per layer: [rows, Hkv, Dh], rows as the layer's kind keeps them
        self.windows = [layer_window(h, i) for i in range(h.n_layers)]
        self.k_cache = [np.zeros((layer_kv_positions(h, i), h.n_kv_heads, h.head_dim), self.dtype)
                        for i in range(h.n_layers)]
        self.v_cache = [np.zeros_like(k) for k in self.k_cache]
        # gated_deltanet layers: (conv inputs [W-1, C], states [Hv, Dk, Dv]) per layer
        self.recurrent: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for i in range(h.n_layers):
            if h.layer(i).mixer == Mixer.GATED_DELTANET:
                g = DeltaNetGeometry.of(h.layer(i))
                self.recurrent[i] = (np.zeros((g.width - 1, g.channels), self.dtype),
                                     np.zeros((g.hv, g.dk, g.dv), self.dtype))
        self.pos = 0
        self.routing: list[list[Route]] = []  # [token][layer], since the last reset

    # -- weights ---------------------------------------------------------------------------
    def W(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> np.ndarray:  # noqa: N802
        """One weight tensor, dequantised to the reference's dtype (padded shape)."""
        key = (int(kind), layer, expert)
        w = self.w.get(key)
        if w is None:
            w = self.model.tensor(kind, layer, expert).astype(self.dtype)
            if self.cache:
                self.w[key] = w
        return w

    def vec(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> np.ndarray:
        return self.W(kind, layer, expert)[0]

    # -- building blocks -------------------------------------------------------------------
    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
        """weight * x / sqrt(mean of the first n squares + eps); n is the true width (D, not Dp)."""
        ms = np.sum(x * x) / n
        return weight * (x / np.sqrt(ms + self.dtype.type(self.h.norm_eps)))

    def rope(self, v: np.ndarray, pos: int, width: int | None = None) -> np.ndarray:
        """Rotate-half RoPE on [heads, Dh]: pair i with i + R/2 at theta^(-2i/R) on the first R
        lanes (R = Dh, or the rotary width of a PARTIAL_ROPE layer); the rest pass through."""
        r = self.h.head_dim if width is None else width
        half = r // 2
        inv = self.inv_freq if r == self.h.head_dim else \
            self.h.rope_theta ** (-2.0 * np.arange(half, dtype=np.float64) / r)
        ang = pos * inv
        cos, sin = np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)
        if self.rope_scale != 1.0:  # YaRN's attention factor, applied in float as transformers does
            cos, sin = cos * self.dtype.type(self.rope_scale), sin * self.dtype.type(self.rope_scale)
        a, b = v[:, :half], v[:, half:r]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, v[:, r:]], axis=1)

    def ffn(self, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray, x: np.ndarray) -> np.ndarray:
        g = w1 @ x
        silu = g / (1 + np.exp(-g))
        return w2 @ (silu * (w3 @ x))

    def expert(self, layer: int, e: int, x: np.ndarray) -> np.ndarray:
        """Routed expert ``e`` of ``layer`` on x: SwiGLU, or gpt-oss's with biases and clamps."""
        r = self.h.layer(layer)
        w1, w3, w2 = (self.W(k, layer, e) for k in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2))
        if not r.ffn_params[0]:
            return self.ffn(w1, w3, w2, x)
        g, u = w1 @ x, w3 @ x
        if r.ffn_params[0] & FfnFlag.EXPERT_BIAS:
            g, u = g + self.vec(Kind.EXPERT_B1, layer, e), u + self.vec(Kind.EXPERT_B3, layer, e)
        if r.ffn_params[0] & FfnFlag.CLAMPED_SWIGLU:  # transformers' GptOssExperts._apply_gate
            alpha, limit = (self.dtype.type(v) for v in r.swiglu)
            g = np.minimum(g, limit)
            u = np.clip(u, -limit, limit)
            a = (u + 1) * (g * (1 / (1 + np.exp(-(g * alpha)))))
        else:
            a = (g / (1 + np.exp(-g))) * u
        y = w2 @ a
        if r.ffn_params[0] & FfnFlag.EXPERT_BIAS:
            y = y + self.vec(Kind.EXPERT_B2, layer, e)
        return y

    def route(self, layer: int, x: np.ndarray) -> Route:
        h = self.h
        r = self.W(Kind.ROUTER, layer) @ x
        if h.layer(layer).ffn_params[0] & FfnFlag.ROUTER_BIAS:
            r = r + self.vec(Kind.ROUTER_BIAS, layer)
        p = np.exp(r - np.max(r))
        p = p / np.sum(p)
        order = np.argsort(-p, kind="stable")[: h.top_k]  # stable sort: ties to the lower index
        w = p[order]
        if h.routing == Routing.RENORMALISE:
            w = w / np.sum(w)
        rest = np.argsort(-p, kind="stable")[h.top_k:]
        margin = float(r[order[-1]] - r[rest[0]]) if rest.size else float("inf")
        return Route(tuple(int(e) for e in order), tuple(float(v) for v in w), margin)

    # -- one layer -------------------------------------------------------------------------
    def attention(self, layer: int, x: np.ndarray, pos: int) -> np.ndarray:
        h = self.h
        dh = h.head_dim
        hn = self.rmsnorm(x, self.vec(Kind.ATTN_NORM, layer), h.embed_dim)
        q = self.W(Kind.WQ, layer) @ hn
        k = self.W(Kind.WK, layer) @ hn
        v = self.W(Kind.WV, layer) @ hn
        if h.has(Flag.QKV_BIAS):
            q = q + self.vec(Kind.BQ, layer)
            k = k + self.vec(Kind.BK, layer)
            v = v + self.vec(Kind.BV, layer)
        if h.has(Flag.QK_NORM_FULL):
            q = self.rmsnorm(q, self.vec(Kind.Q_NORM, layer), q.size)
            k = self.rmsnorm(k, self.vec(Kind.K_NORM, layer), k.size)
        q = q.reshape(h.n_heads, dh)
        k = k.reshape(h.n_kv_heads, dh)
        if h.has(Flag.QK_NORM_HEAD):
            q = np.stack([self.rmsnorm(r, self.vec(Kind.Q_NORM, layer), dh) for r in q])
            k = np.stack([self.rmsnorm(r, self.vec(Kind.K_NORM, layer), dh) for r in k])
        record = h.layer(layer)
        width = rotary_width(h, record)
        q, k = self.rope(q, pos, width), self.rope(k, pos, width)
        if self.kv_f16:
            k = k.astype(np.float16).astype(self.dtype)
            v = v.astype(np.float16).astype(self.dtype)
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        kc[pos % len(kc)] = k
        vc[pos % len(vc)] = v.reshape(h.n_kv_heads, dh)
        # causal: positions 0..pos; a sliding window of W: max(0, pos - W + 1)..pos (transformers'
        # sliding_window_overlay keeps kv_idx > q_idx - sliding_window)
        window = self.windows[layer]
        first = 0 if window is None else max(0, pos - window + 1)
        rows = np.arange(first, pos + 1) % len(kc)
        out = np.empty((h.n_heads, dh), self.dtype)
        scale = self.dtype.type(1.0 / np.sqrt(dh))
        flags = h.layer(layer).mixer_flags
        sinks = self.vec(Kind.ATTN_SINKS, layer) if flags & MixerFlag.SINKS else None
        for head in range(h.n_heads):
            kv = head // self.group
            keys = kc[rows, kv]  # [positions, Dh]
            vals = vc[rows, kv]
            s = (keys @ q[head]) * scale
            # a sink joins the softmax as one more logit and gets no value (gpt-oss)
            mx = np.max(s) if sinks is None else max(np.max(s), sinks[head])
            a = np.exp(s - mx)
            total = np.sum(a) + (0 if sinks is None else np.exp(sinks[head] - mx))
            out[head] = (a / total) @ vals
        out = out.reshape(-1)
        if flags & MixerFlag.OUTPUT_GATE:  # Qwen3.5 / Qwen3-Next gated attention
            out = out * self.sigmoid(self.W(Kind.ATTN_GATE, layer) @ hn)
        o = self.W(Kind.WO, layer) @ out
        return o + self.vec(Kind.BO, layer) if flags & MixerFlag.O_BIAS else o

    def sigmoid(self, v: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-v))

    def deltanet(self, layer: int, x: np.ndarray) -> np.ndarray:
        """A Gated DeltaNet step (runtime/src/layers/deltanet.c's header has the formulas)."""
        h = self.h
        g = DeltaNetGeometry.of(h.layer(layer))
        hn = self.rmsnorm(x, self.vec(Kind.ATTN_NORM, layer), h.embed_dim)
        mixed = self.W(Kind.DN_QKV, layer) @ hn
        z = (self.W(Kind.DN_Z, layer) @ hn).reshape(g.hv, g.dv)
        b = self.W(Kind.DN_B, layer) @ hn
        a = self.W(Kind.DN_A, layer) @ hn
        conv, state = self.recurrent[layer]
        window = np.concatenate([conv, mixed[None, :]])  # [W, C]: oldest first
        taps = self.W(Kind.DN_CONV, layer)  # [C, W]
        u = np.sum(taps.T * window, axis=0)
        u = u / (1 + np.exp(-u))  # silu
        conv[:] = window[1:]
        q = u[:g.kd].reshape(g.hk, g.dk)
        k = u[g.kd:2 * g.kd].reshape(g.hk, g.dk)
        v = u[2 * g.kd:].reshape(g.hv, g.dv)
        eps = self.dtype.type(1e-6)
        q = q / np.sqrt(np.sum(q * q, axis=1, keepdims=True) + eps) / self.dtype.type(np.sqrt(g.dk))
        k = k / np.sqrt(np.sum(k * k, axis=1, keepdims=True) + eps)
        beta = self.sigmoid(b)
        sp = a + self.vec(Kind.DN_DT_BIAS, layer)
        sp = np.where(sp > 20, sp, np.log1p(np.exp(np.minimum(sp, 20))))  # softplus
        decay = np.exp(-np.exp(self.vec(Kind.DN_A_LOG, layer)) * sp)
        per_key = g.hv // g.hk
        out = np.empty((g.hv, g.dv), self.dtype)
        w = self.vec(Kind.DN_NORM, layer)
        for head in range(g.hv):
            qh, kh = q[head // per_key], k[head // per_key]
            s = state[head] * decay[head]
            delta = (v[head] - kh @ s) * beta[head]
            s = s + np.outer(kh, delta)
            state[head] = s
            o = qh @ s
            out[head] = self.rmsnorm(o, w, g.dv) * (z[head] / (1 + np.exp(-z[head])))
        return self.W(Kind.DN_OUT, layer) @ out.reshape(-1)

    def moe(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, Route]:
        h = self.h
        hn = self.rmsnorm(x, self.vec(Kind.FFN_NORM, layer), h.embed_dim)
        route = self.route(layer, hn)
        y = np.zeros_like(x)
        for e, wt in zip(route.experts, route.weights):
            y += self.dtype.type(wt) * self.expert(layer, e, hn)
        if h.has(Flag.SHARED_EXPERT):
            s = self.ffn(self.W(Kind.SHARED_W1, layer), self.W(Kind.SHARED_W3, layer),
                         self.W(Kind.SHARED_W2, layer), hn)
            if h.has(Flag.SHARED_EXPERT_GATE):
                g = np.dot(self.vec(Kind.SHARED_GATE, layer), hn)
                s = s * (1 / (1 + np.exp(-g)))
            y += s
        return y, route

    # -- public API ------------------------------------------------------------------------
    def reset(self) -> None:
        self.pos = 0
        self.routing = []
        for c in (*self.k_cache, *self.v_cache):
            c[:] = 0
        for conv, state in self.recurrent.values():
            conv[:] = 0
            state[:] = 0

    def step(self, token: int) -> np.ndarray:
        """One token at the current position -> logits [V]."""
        h = self.h
        if not 0 <= token < h.vocab_size:
            raise ModelError(f"token id {token} is outside the vocabulary (0..{h.vocab_size - 1})")
        if self.pos >= h.max_seq_len:
            raise ModelError(f"sequence longer than the model's max_seq_len {h.max_seq_len}")
        x = self.W(Kind.TOK_EMBED)[token].copy()
        routes = []
        for layer in range(h.n_layers):
            if layer in self.recurrent:
                x = x + self.deltanet(layer, x)
            else:
                x = x + self.attention(layer, x, self.pos)
            y, r = self.moe(layer, x)
            x = x + y
            routes.append(r)
        self.routing.append(routes)
        self.pos += 1
        xn = self.rmsnorm(x, self.vec(Kind.OUTPUT_NORM), h.embed_dim)
        head = self.W(Kind.TOK_EMBED) if h.has(Flag.TIED_EMBEDDINGS) else self.W(Kind.LM_HEAD)
        return head @ xn

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Logits [len(ids), V] for tokens at the next positions (prefill or decode)."""
        return np.stack([self.step(int(t)) for t in ids])

    def generate(self, ids: Sequence[int], max_new: int) -> list[int]:
        """Greedy continuation from a fresh cache: the ``max_new`` new token ids (argmax, ties to
        the lower id; does not stop at EOS)."""
        self.reset()
        logits = self.forward(ids)[-1]
        out: list[int] = []
        for i in range(max_new):
            tok = int(np.argmax(logits))
            out.append(tok)
            if i + 1 < max_new:
                logits = self.step(tok)
        return out
