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
p in row p % rows), so a prompt several windows long wraps it as the runtime's does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from colibri_kit.errors import ModelError
from colibri_kit.model.format import (
    NONE, ColibriModel, Flag, Kind, Routing, layer_kv_positions, layer_window, read_model,
)


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
        half = h.head_dim // 2
        # Frequency of pair i is theta^(-2i/Dh).
        self.inv_freq = (h.rope_theta ** (-2.0 * np.arange(half, dtype=np.float64) / h.head_dim))
        # per layer: [rows, Hkv, Dh], rows as the layer's kind keeps them
        self.windows = [layer_window(h, i) for i in range(h.n_layers)]
        self.k_cache = [np.zeros((layer_kv_positions(h, i), h.n_kv_heads, h.head_dim), self.dtype)
                        for i in range(h.n_layers)]
        self.v_cache = [np.zeros_like(k) for k in self.k_cache]
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

    def vec(self, kind: Kind, layer: int = NONE) -> np.ndarray:
        return self.W(kind, layer)[0]

    # -- building blocks -------------------------------------------------------------------
    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, n: int) -> np.ndarray:
        """weight * x / sqrt(mean of the first n squares + eps); n is the true width (D, not Dp)."""
        ms = np.sum(x * x) / n
        return weight * (x / np.sqrt(ms + self.dtype.type(self.h.norm_eps)))

    def rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        """Rotate-half RoPE on [heads, Dh]: pair i with i + Dh/2."""
        half = self.h.head_dim // 2
        ang = pos * self.inv_freq
        cos, sin = np.cos(ang).astype(self.dtype), np.sin(ang).astype(self.dtype)
        a, b = v[:, :half], v[:, half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=1)

    def ffn(self, w1: np.ndarray, w3: np.ndarray, w2: np.ndarray, x: np.ndarray) -> np.ndarray:
        g = w1 @ x
        silu = g / (1 + np.exp(-g))
        return w2 @ (silu * (w3 @ x))

    def route(self, layer: int, x: np.ndarray) -> Route:
        h = self.h
        r = self.W(Kind.ROUTER, layer) @ x
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
        q, k = self.rope(q, pos), self.rope(k, pos)
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
        for head in range(h.n_heads):
            kv = head // self.group
            keys = kc[rows, kv]  # [positions, Dh]
            vals = vc[rows, kv]
            s = (keys @ q[head]) * scale
            a = np.exp(s - np.max(s))
            a = a / np.sum(a)
            out[head] = a @ vals
        return self.W(Kind.WO, layer) @ out.reshape(-1)

    def moe(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, Route]:
        h = self.h
        hn = self.rmsnorm(x, self.vec(Kind.FFN_NORM, layer), h.embed_dim)
        route = self.route(layer, hn)
        y = np.zeros_like(x)
        for e, wt in zip(route.experts, route.weights):
            y += self.dtype.type(wt) * self.ffn(self.W(Kind.EXPERT_W1, layer, e), self.W(Kind.EXPERT_W3, layer, e),
                                                self.W(Kind.EXPERT_W2, layer, e), hn)
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
