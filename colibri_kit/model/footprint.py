"""Device memory footprint of a model on a target, and the fit check (docs/models.md, "Memory").

    CPU:                   footprint = weights + slots x arena
    CUDA, weights copied:  footprint = weights + slots x arena + upload     (the runtime default)
    CUDA, weights mapped:  footprint = weights + slots x arena              (COLIBRI_CUDA_WEIGHTS=map)

- weights: the `.colibri` file. The CPU backend reads it memory-mapped (one copy, shared by every
  context). The CUDA backend copies it once to the device (on a Jetson that is the same DRAM),
  shared by every context of the model (runtime/src/cuda/cuda_backend.c colibri_cuda_device), in
  chunks whose mapped pages it drops once staged, so the file's pages do not stay resident beside
  the copy; with COLIBRI_CUDA_WEIGHTS=map (integrated GPU) the mapped file itself is registered
  with the GPU instead;
- upload: while the first context uploads, two page-locked staging buffers and the mapped pages
  of the chunk being staged (3 x 16 MiB, runtime/src/cuda/cuda_backend.c CB_UPLOAD_CHUNK) exist
  besides the copy; the peak is counted;
- arena: what the runtime allocates per context, computed with the runtime's own plan: the CPU
  arena of runtime/src/core/arena.c (colibri_arena_plan) on CPU-only targets, the device arena of
  runtime/src/cuda/cuda_backend.c (colibri_cuda_plan, without the weights region, counted above) on
  CUDA targets (a model with a layer kind the CUDA backend does not run yet falls back to the
  CPU, `--backend auto`, so its footprint there is the CPU one: `cpu_fallback` says why). Both
  hold every layer's KV cache, as its kind keeps it (docs/runtime.md, "Layer kinds"): max_seq_len
  rows (the context length, chosen at convert time) for full attention, the window for a sliding
  window; it is reported apart. A recurrent layer (gated_deltanet: Qwen3.5, Qwen3-Next) keeps a
  fixed-size state instead (its convolution's last inputs and its delta-rule states, f32, the
  same at any context length), also reported apart (`state_bytes`). `kv_dtype` "f16" (`colibri --kv-cache f16`) stores it in half the bytes,
  on either backend;
- slots: contexts served at once (`colibri serve --slots`), each with its own arena.

The target's usable memory is its profile's `memory.total_mb - memory.reserve_mb` (the OS,
JetPack services and the CUDA context live in the reserve). `check_fits` refuses a model that
does not fit with the numbers and what would fit (another dtype, a shorter context).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model.format import (
    ALIGN, LARGE_TENSOR, PAGE, DType, Ffn, FfnFlag, Flag, Mixer, MixerFlag, ModelHeader,
    align_up, data_nbytes, data_start, expected_tensors, kv_staged, layer_kv_positions,
    layer_state_floats, pass_needs, read_model, scale_bytes,
)
from colibri_kit.profiles import Profile, require_profile

MIB = 1 << 20
# runtime/src/core/context.h COLIBRI_CHUNK: tokens per CPU pass; COLIBRI_MOE_SLOTS: expert input
# rows one MoE pass holds (never fewer than a chunk).
CPU_CHUNK = 512
CPU_MOE_SLOTS = 1024
CPU_ATT_HEADS = 8  # layers/kinds.h COLIBRI_ATT_HEADS: query heads per attention unit at most
# runtime/src/cuda/cuda_backend.c: CB_ALIGN, CB_MAX_CHUNK, CB_MIN_CHUNK, CB_ACT_BUDGET,
# CB_LOGIT_ROWS, CB_PART_BUDGET; colibri_abi.h: KV split.
CUDA_ALIGN = 256
CUDA_MAX_CHUNK = 256
CUDA_MIN_CHUNK = 32
CUDA_ACT_BUDGET = 32 << 20    # a device pass's per-token buffers at most (cb_token_bytes)
CUDA_LOGIT_ROWS = 32
CUDA_PRM_BYTES = 256  # cuda_backend.c CB_PRM_BYTES: the decode graph's parameter block
CUDA_PART_BUDGET = 64 << 20   # cuda_backend.c CB_PART_BUDGET
CUDA_KV_SPLIT = 256           # runtime/kernels/colibri_abi.h COLIBRI_CU_KV_SPLIT
CUDA_UPLOAD_CHUNK = 16 << 20  # cuda_backend.c CB_UPLOAD_CHUNK
# what a context's weight upload adds to the peak: two staging buffers + one chunk's mapped pages
CUDA_UPLOAD_PEAK = 3 * CUDA_UPLOAD_CHUNK
# COLIBRI_CUDA_WEIGHTS: how the CUDA backend holds the weights ("copy" is its default)
CUDA_WEIGHTS = ("copy", "map")
CUDA_FA_MAX_DH = 128          # colibri_abi.h COLIBRI_CU_FA_MAX_DH: widest head of tiled prefill
CUDA_MAX_SORT = 256           # colibri_abi.h COLIBRI_CU_MAX_SORT: experts the router kernels sort
CUDA_DN_MAX_DK = 256          # colibri_abi.h COLIBRI_CU_DN_MAX_DK: widest DeltaNet key head
DEFAULT_THREADS = 8  # CPU arena scratch is per thread (a few KiB each); Jetsons have 6..14 cores
# Bytes per cached K/V value: runtime/include/colibri.h colibri_kv_dtype.
KV_BYTES = {"f32": 4, "f16": 2}


def kv_value_bytes(kv_dtype: str) -> int:
    """Bytes of one cached K or V value; ModelError for a dtype the runtime does not have."""
    if kv_dtype not in KV_BYTES:
        raise ModelError(f"kv_dtype must be one of {', '.join(KV_BYTES)}, got {kv_dtype!r}")
    return KV_BYTES[kv_dtype]


def attention_score_rows(h: ModelHeader) -> int:
    """layers/attention.c colibri_attention_score_rows: the query heads of one KV group that a
    thread's attention unit holds at most (COLIBRI_ATT_HEADS = 8)."""
    group = h.n_heads // h.n_kv_heads if h.n_kv_heads else 1
    return max(1, min(group, CPU_ATT_HEADS))


def cpu_arena_bytes(h: ModelHeader, threads: int = DEFAULT_THREADS, int8_act: bool = False,
                    kv_dtype: str = "f32") -> int:
    """runtime/src/core/arena.c colibri_arena_plan, byte for byte (release build)."""
    return _cpu_arena_plan(h, threads, int8_act, kv_dtype, engine=False)


def _cpu_arena_plan(h: ModelHeader, threads: int, int8_act: bool, kv_dtype: str,
                    engine: bool, sequence_only: bool = False) -> int:
    """colibri_arena_plan's regions in its order; `engine`: the batch engine's arena (no KV rows,
    no recurrent state: the slots' contexts hold them; an LM head stage at the end);
    `sequence_only`: a context that only holds its sequence for an engine (every per-row buffer
    and the threads' scratch empty, the caches kept)."""
    kv_size = kv_value_bytes(kv_dtype)
    used = 0

    def take(n: int, size: int = 4) -> None:
        nonlocal used
        used = align_up(used, 64) + n * size

    T = 0 if sequence_only else min(h.max_seq_len, CPU_CHUNK)
    threads = 0 if sequence_only else threads
    dp, qd = h.embed_dim_pad, h.n_heads * h.head_dim
    kvd, E, K = h.n_kv_heads * h.head_dim, h.num_experts, h.top_k
    F, Fs, S = h.expert_size, h.shared_expert_size, h.max_seq_len
    mix, in_cols = pass_needs(h)  # the kinds' mixer scratch per token, their widest input
    max_cols = max(dp, qd, F, Fs, 16, in_cols)
    q8 = int8_act and h.dtype in (DType.INT8, DType.Q4)
    for n in (T * dp, T * dp, T * qd, T * kvd, T * kvd, T * qd, T * dp, T * h.head_dim, T, T * mix):
        take(n)  # ... the RoPE table, the rows' positions, the mixer scratch
    stage = T * kvd if kv_staged(h) else 0  # a pass's K/V rows on their way to a short ring
    take(stage, kv_size)
    take(stage, kv_size)
    rows = 0 if engine else kv_rows(h)  # every layer's K rows, then V rows, as its kind keeps them
    take(rows * kvd, kv_size)
    take(rows * kvd, kv_size)
    take(0 if engine else state_bytes(h) // 4)  # the recurrent layers' states
    slots = min(T * K, max(T, CPU_MOE_SLOTS))
    for n in (T * E, T * K, T * K, E, E + 1, E, T * K, T * K,
              slots * dp, slots * F, slots * F, T * K * dp, T * Fs, T * Fs, T * dp):
        take(n)
    take((slots + T) * max_cols if q8 else 0, 1)
    take(slots + T if q8 else 0)
    take(threads * 2 * max_cols)
    take(threads * attention_score_rows(h) * S)  # a thread's attention unit: a GQA group's heads
    if engine:
        take(min(T, CPU_LSTAGE_ROWS) * h.vocab_size)
    return align_up(used, 64)


def cuda_arena_bytes(h: ModelHeader, copy_weights: bool = False, weights_bytes: int = 0,
                     kv_dtype: str = "f32") -> int:
    """runtime/src/cuda/cuda_backend.c colibri_cuda_plan: the device arena (weights mapped, not copied,
    on an integrated GPU unless copy_weights; the KV cache in f32 or f16)."""
    S, H, Dh, Dp = h.max_seq_len, h.n_heads, h.head_dim, h.embed_dim_pad
    E, k, F, V = h.num_experts, h.top_k, h.expert_size, h.vocab_size
    Fs, L, kvd = h.shared_expert_size, h.n_layers, h.n_kv_heads * h.head_dim
    kv_size = kv_value_bytes(kv_dtype)
    ranges = -(-S // CUDA_KV_SPLIT)  # split attention: partials per (token, head) and range

    def part_tokens(chunk: int) -> int:  # decode's one; every chunk token for too-wide heads
        return 1 if Dh <= CUDA_FA_MAX_DH else chunk

    mix = pass_needs(h)[0]  # the mixers' per-token scratch (DeltaNet, gated attention's gate)
    per_token = 4 * (2 * Dp + H * Dh + (H * Dh + 2 * kvd) + H * Dh + E + 4 * k + k * F + k * Dp
                     + 2 + ((Fs + Dp + 1) if h.has(Flag.SHARED_EXPERT) else 0) + mix)
    La = sum(1 for i in range(L) if layer_kv_positions(h, i))  # layers with a KV cache
    c = min(CUDA_MAX_CHUNK, S)
    while c > CUDA_MIN_CHUNK and c * per_token > CUDA_ACT_BUDGET:
        c //= 2
    while c > 1 and part_tokens(c) * H * ranges * (Dh + 2) * 4 > CUDA_PART_BUDGET:
        c //= 2
    logit_rows = min(c, CUDA_LOGIT_ROWS)
    sizes = [c * Dp * 4, c * Dp * 4, c * H * Dh * 4, c * (H * Dh + 2 * kvd) * 4, c * H * Dh * 4,
             part_tokens(c) * H * ranges * (Dh + 2) * 4, c * E * 4,
             c * k * 4, c * k * 4, (E + 1) * 4, E * 4, c * k * 4, c * k * 4, c * k * F * 4,
             c * k * Dp * 4]
    if h.has(Flag.SHARED_EXPERT):
        sizes += [c * Fs * 4, c * Dp * 4, c * 4]
    sizes += [2 * 4, logit_rows * V * 4, c * 4, c * 4, CUDA_PRM_BYTES, S * (Dh // 2) * 2 * 4,
              La * S * kvd * kv_size, La * S * kvd * kv_size, L * (6 * E + 6) * 8,
              c * mix * 4, state_bytes(h)]  # the hybrid layers' scratch, the recurrent state
    # gpt-oss: the expert biases' pointer tables (cuda_backend.c cb_oss_bias_bytes); the cache
    # above keeps every position of a sliding layer too (cb_oss_attention reads its window)
    if any(r.ffn_params[0] & FfnFlag.EXPERT_BIAS for r in h.layer_records()):
        sizes.append(L * 3 * E * 8)
    if copy_weights:
        sizes.append(weights_bytes)
    return sum(align_up(n, CUDA_ALIGN) for n in sizes)


def cuda_unsupported(h: ModelHeader) -> str:
    """Why the CUDA backend does not run this model ("" when it does): it runs attention (full,
    sliding, Qwen's gated attention with one rotary width) or gated_deltanet (key heads up to 256
    lanes) + moe layers, up to 256 experts, gpt-oss's sinks, biases, YaRN and mxfp4 experts, but
    not mxfp4 outside the experts, q4 experts with gpt-oss's biases/clamp, sinks/windows with heads
    over 256, or partial RoPE with YaRN (runtime/src/cuda/cuda_backend.c cb_check_model)."""
    if h.num_experts > CUDA_MAX_SORT:
        return (f"{h.num_experts} experts: the CUDA router kernels sort at most {CUDA_MAX_SORT} "
                "(colibri_abi.h COLIBRI_CU_MAX_SORT)")
    for i, r in enumerate(h.layer_records()):
        if r.mixer not in (Mixer.ATTENTION, Mixer.SLIDING_ATTENTION, Mixer.GATED_DELTANET) \
                or r.ffn != Ffn.MOE:
            return (f"layer {i} is {r.label()}: the CUDA backend runs attention (full or sliding) "
                    "or gated_deltanet + moe layers only")
        if r.mixer == Mixer.GATED_DELTANET and r.mixer_params[2] > CUDA_DN_MAX_DK:
            return (f"layer {i} (gated_deltanet): key head dim {r.mixer_params[2]} exceeds the CUDA "
                    f"kernel's {CUDA_DN_MAX_DK} (colibri_abi.h COLIBRI_CU_DN_MAX_DK)")
        oss_attention = r.mixer_flags & MixerFlag.SINKS or (
            r.mixer == Mixer.SLIDING_ATTENTION and r.window < h.max_seq_len)
        if oss_attention and h.head_dim > 256:
            return (f"layer {i}: attention sinks / a sliding window with head_dim {h.head_dim}; "
                    "the CUDA kernel holds at most 256")
        edt = h.expert_dtype if h.expert_dtype is not None else h.dtype
        oss_experts = edt == DType.MXFP4 or r.ffn_params[0] & (FfnFlag.EXPERT_BIAS | FfnFlag.CLAMPED_SWIGLU)
        if oss_experts and edt == DType.Q4:
            return (f"layer {i}: q4 experts with gpt-oss's expert biases or clamped SwiGLU, which "
                    "the CUDA kernels do not compute")
    widths = {r.mixer_params[0] if r.mixer_flags & MixerFlag.PARTIAL_ROPE else 0
              for r in h.layer_records() if r.mixer != Mixer.GATED_DELTANET}
    if len(widths) > 1:
        return "attention layers of different rotary widths: the CUDA backend keeps one RoPE table"
    if widths - {0} and h.has(Flag.QK_NORM_FULL):
        return "partial RoPE with a full-width q/k norm, which the CUDA kernels do not compute"
    if widths - {0} and h.has(Flag.ROPE_YARN):
        return ("partial RoPE with YaRN scaling, which the CUDA kernels do not compute (one RoPE "
                "table: YaRN's full width or the partial one)")
    if h.dtype == DType.MXFP4:  # the CUDA kernels read mxfp4 experts only
        return ("mxfp4 embedding, attention or LM head weights, which the CUDA kernels do not read "
                "(only mxfp4 experts; convert with --expert-dtype mxfp4)")
    return ""


def state_bytes(h: ModelHeader) -> int:
    """The recurrent layers' fixed-size states per context (runtime/src/core/arena.c), f32."""
    return 4 * sum(layer_state_floats(h, i) for i in range(h.n_layers))


def kv_rows(h: ModelHeader) -> int:
    """K (or V) rows of every layer together: max_seq_len per full attention layer, the window
    (at most max_seq_len) per sliding-window layer."""
    return sum(layer_kv_positions(h, i) for i in range(h.n_layers))


def kv_cache_bytes(h: ModelHeader, kv_dtype: str = "f32") -> int:
    """K and V caches of every layer (runtime/src/core/arena.c), inside either arena."""
    return 2 * kv_rows(h) * h.n_kv_heads * h.head_dim * kv_value_bytes(kv_dtype)


def cuda_kv_cache_bytes(h: ModelHeader, kv_dtype: str = "f32") -> int:
    """K and V caches in the CUDA device arena (colibri_cuda_plan kv_bytes): every layer keeps
    max_seq_len positions, sliding layers too (no ring on the GPU: cb_oss_attention reads the
    window of the full cache); a recurrent layer keeps its state instead."""
    La = sum(1 for i in range(h.n_layers) if layer_kv_positions(h, i))
    return 2 * La * h.max_seq_len * h.n_kv_heads * h.head_dim * kv_value_bytes(kv_dtype)


def estimate_file_bytes(h: ModelHeader, dtype: DType | None = None) -> int:
    """Bytes up to the end of the tensor data of the `.colibri` file the converter would write
    for this geometry and dtype (the writer's layout: tensors in table order, 64-byte aligned,
    4096 for 64 KiB and larger). A version-2 metadata section (tokenizer blobs) follows it."""
    hh = replace(h, dtype=int(dtype if dtype is not None else h.dtype))
    specs = expected_tensors(hh)
    pos = data_start(hh)
    for s in specs.values():  # each tensor in its own dtype (f32, the model's, the experts')
        dt = DType(s.dtype)
        for n in (data_nbytes(dt, s.rows, s.cols), scale_bytes(dt, s.rows, s.cols)):
            if n:
                pos = align_up(pos, PAGE if n >= LARGE_TENSOR else ALIGN) + n
    return pos


@dataclass(frozen=True)
class Footprint:
    target: str
    backend: str        # "cuda" (device arena) or "cpu" (CPU arena)
    weights: int        # bytes of the model file
    arena: int          # per slot, KV cache included (CUDA: without the weights' copy)
    kv_cache: int       # per slot, part of arena
    slots: int
    available: int | None  # target memory minus its reserve; None: the profile sets no memory
    kv_dtype: str = "f32"  # how the KV cache is stored (colibri --kv-cache)
    # "file": the mapped file (CPU); "copied": one device copy (CUDA default); "mapped": the
    # mapped file registered with the GPU (CUDA, COLIBRI_CUDA_WEIGHTS=map). Each is one copy,
    # shared by every slot.
    weights_mode: str = "file"
    cpu_fallback: str = ""  # a CUDA target whose backend does not run the model: why
    state: int = 0      # per slot, part of arena: recurrent layers' fixed-size states

    @property
    def upload(self) -> int:
        """Transient bytes of the chunked upload (copied weights only)."""
        return min(CUDA_UPLOAD_PEAK, 3 * self.weights) if self.weights_mode == "copied" else 0

    @property
    def total(self) -> int:
        return self.weights + self.slots * self.arena + self.upload

    @property
    def fits(self) -> bool:
        return self.available is None or self.total <= self.available

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "backend": self.backend, "weights_bytes": self.weights,
                "arena_bytes": self.arena, "kv_cache_bytes": self.kv_cache, "slots": self.slots,
                "total_bytes": self.total, "available_bytes": self.available, "fits": self.fits,
                "kv_dtype": self.kv_dtype, "weights_mode": self.weights_mode,
                "upload_bytes": self.upload, "cpu_fallback": self.cpu_fallback,
                "state_bytes": self.state}

    def weights_text(self) -> str:
        """The weights' part of the total, in words."""
        w = f"weights {self.weights / MIB:,.1f}"
        if self.weights_mode != "copied":
            return w + (" mapped" if self.weights_mode == "mapped" else "")
        return f"{w} copied + upload {self.upload / MIB:,.0f}"

    def line(self) -> str:
        avail = "no memory limit in the profile" if self.available is None else \
            f"available {self.available / MIB:,.0f} MiB -> {'fits' if self.fits else 'DOES NOT FIT'}"
        return (f"{self.target}: {self.total / MIB:,.1f} MiB = {self.weights_text()} + "
                f"{self.slots} x arena {self.arena / MIB:,.1f} (KV cache {self.kv_cache / MIB:,.1f} "
                f"{self.kv_dtype}{f', recurrent state {self.state / MIB:,.1f}' if self.state else ''}) "
                f"[{self.backend}{', CUDA falls back: ' + self.cpu_fallback if self.cpu_fallback else ''}]; "
                f"{avail}")


def _target_memory(p: Profile) -> tuple[str, int | None, str]:
    """The target's backend, usable memory and KV cache storage (its service's kv_cache)."""
    backend = "cuda" if p.cuda is not None else "cpu"
    mem = getattr(p, "memory", None)
    avail = None if mem is None else (mem.total_mb - mem.reserve_mb) * MIB
    return backend, avail, p.service.kv_cache if p.service is not None else "f32"


def footprint(h: ModelHeader, profile: Profile, weights_bytes: int | None = None, slots: int = 1,
              threads: int = DEFAULT_THREADS, kv_dtype: str | None = None,
              cuda_weights: str = "copy") -> Footprint:
    """The footprint of a model with header ``h`` on ``profile`` (weights: the file size, or the
    converter's estimate for this header when not given) with a ``kv_dtype`` KV cache (None: the
    target's ``service.kv_cache``, f32 unless set), the CUDA backend holding the weights as
    ``cuda_weights`` says (COLIBRI_CUDA_WEIGHTS: "copy", its default, or "map")."""
    require_profile(profile, "footprint")
    if slots < 1:
        raise ModelError(f"slots must be >= 1, got {slots}")
    if cuda_weights not in CUDA_WEIGHTS:
        raise ModelError(f"cuda_weights must be one of {', '.join(CUDA_WEIGHTS)}, got {cuda_weights!r}")
    backend, avail, target_kv = _target_memory(profile)
    fallback = cuda_unsupported(h) if backend == "cuda" else ""
    if fallback:  # --backend auto runs it on the CPU
        backend = "cpu"
    kv_dtype = target_kv if kv_dtype is None else kv_dtype
    kv_value_bytes(kv_dtype)
    weights = estimate_file_bytes(h) if weights_bytes is None else weights_bytes
    arena = cuda_arena_bytes(h, kv_dtype=kv_dtype) if backend == "cuda" else \
        cpu_arena_bytes(h, threads, kv_dtype=kv_dtype)
    mode = "file" if backend == "cpu" else "copied" if cuda_weights == "copy" else "mapped"
    kv = cuda_kv_cache_bytes(h, kv_dtype) if backend == "cuda" else kv_cache_bytes(h, kv_dtype)
    return Footprint(profile.name, backend, weights, arena, kv, slots, avail, kv_dtype, mode,
                     fallback, state_bytes(h))


def model_footprint(path: str | os.PathLike[str], profile: Profile, slots: int = 1,
                    kv_dtype: str | None = None, cuda_weights: str = "copy") -> Footprint:
    """The footprint of the model file at ``path`` on the target ``profile``."""
    require_profile(profile, "model_footprint")
    m = read_model(path)
    return footprint(m.header, profile, Path(path).stat().st_size, slots, kv_dtype=kv_dtype,
                     cuda_weights=cuda_weights)


def suggestions(h: ModelHeader, profile: Profile, slots: int = 1) -> list[str]:
    """What would fit the target ``profile``: other dtypes at this context length, and the
    longest context at this dtype (a whole number of 256 positions)."""
    require_profile(profile, "suggestions")
    out = []
    for dt in (DType.Q4, DType.INT8, DType.F16, DType.F32):
        if dt == h.dtype:
            continue
        fp = footprint(replace(h, dtype=int(dt)), profile, slots=slots)
        if fp.fits:
            out.append(f"--dtype {dt.name.lower()} ({fp.total / MIB:,.0f} MiB)")
    if DType.MXFP4 not in (h.dtype, h.expert_dtype):  # the experts alone in 4.25 bits per weight
        fp = footprint(replace(h, expert_dtype=int(DType.MXFP4)), profile, slots=slots)
        if fp.fits:
            out.append(f"--expert-dtype mxfp4 ({fp.total / MIB:,.0f} MiB)")
    lo, hi = 0, (h.max_seq_len - 1) // 256  # shorter contexts, in whole 256-position steps
    while lo < hi:  # the arena grows with max_seq_len: the longest that fits
        mid = (lo + hi + 1) // 2
        if footprint(replace(h, max_seq_len=mid * 256), profile, slots=slots).fits:
            lo = mid
        else:
            hi = mid - 1
    if lo > 0:
        fp = footprint(replace(h, max_seq_len=lo * 256), profile, slots=slots)
        out.append(f"--max-seq-len {lo * 256} ({fp.total / MIB:,.0f} MiB)")
    # the mapped file needs no upload staging: where only that is missing, it is named
    mapped = footprint(h, profile, slots=slots, cuda_weights="map")
    if mapped.backend == "cuda" and mapped.fits:
        out.append(f"COLIBRI_CUDA_WEIGHTS=map in the runtime's environment ({mapped.total / MIB:,.0f} "
                   "MiB: no upload staging; its GPU read speed on a Jetson is not yet measured, "
                   "docs/cuda.md)")
    return out


def check_fits(h: ModelHeader, profile: Profile, weights_bytes: int | None = None,
               slots: int = 1) -> Footprint:
    """Raise ModelError when the model does not fit the memory of the target ``profile``, with
    the numbers and what would fit. Returns the footprint when it fits (or the profile sets no
    memory)."""
    require_profile(profile, "check_fits")
    fp = footprint(h, profile, weights_bytes, slots)
    if fp.fits:
        return fp
    assert fp.available is not None
    how = ", one device copy shared by the slots" if fp.weights_mode == "copied" else ""
    upload = f" + upload staging {fp.upload / MIB:,.0f} MiB" if fp.upload else ""
    what = suggestions(h, profile, slots)
    experts = "" if h.expert_dtype is None else f", experts {DType(h.expert_dtype).name.lower()}"
    hint = ("would fit: " + ", ".join(what)) if what else \
        "no dtype or context length fits this target; choose a smaller model or a larger target"
    raise ModelError(
        f"model does not fit target {profile.name!r}: needs {fp.total / MIB:,.0f} MiB (weights "
        f"{fp.weights / MIB:,.0f} MiB as {DType(h.dtype).name.lower()}{experts}{how} + {slots} slot(s) x "
        f"arena {fp.arena / MIB:,.0f} MiB incl. KV cache {fp.kv_cache / MIB:,.0f} MiB at "
        f"max_seq_len {h.max_seq_len}{f' and recurrent state {fp.state / MIB:,.0f} MiB' if fp.state else ''}"
        f"{upload}), the target has {fp.available / MIB:,.0f} MiB available "
        f"(memory.total_mb - memory.reserve_mb of its profile); {hint}")


def check_model_fits(path: str | os.PathLike[str], profile: Profile, slots: int = 1) -> Footprint:
    """The deploy check: the model file at ``path`` on the target ``profile`` with ``slots``
    contexts. Raises ModelError (numbers, and a dtype or context that would fit) when it does
    not fit."""
    require_profile(profile, "check_model_fits")
    m = read_model(path)
    try:
        return check_fits(m.header, profile, Path(path).stat().st_size, slots)
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None


# ---- continuous batching: the engine's arena (issue 26) ------------------------------------------

CPU_LSTAGE_ROWS = 16  # arena.c LSTAGE_ROWS: rows of the LM head an engine computes at once


def cpu_engine_arena_bytes(h: ModelHeader, threads: int = DEFAULT_THREADS, int8_act: bool = False,
                           kv_dtype: str = "f32") -> int:
    """The batch engine's arena (runtime/src/core/arena.c colibri_arena_plan with engine = 1),
    byte for byte: the per-step buffers of one pass of up to CPU_CHUNK rows from every slot
    (activations, the mixer scratch, the routing and expert slots, a ring's K/V stage), the
    threads' scratch and the LM head stage of CPU_LSTAGE_ROWS x vocab floats; no KV rows and no
    recurrent state (each slot's context holds its own: cpu_arena_bytes with threads = 1).
    `colibri serve` prints it in its ready line (memory.engine_arena_bytes)."""
    return _cpu_arena_plan(h, threads, int8_act, kv_dtype, engine=True)


def cpu_sequence_arena_bytes(h: ModelHeader, int8_act: bool = False, kv_dtype: str = "f32") -> int:
    """A sequence-only context's arena (colibri_options.sequence_only: a served slot with
    batching on), byte for byte: its KV rows and recurrent state, no pass buffers."""
    return _cpu_arena_plan(h, 0, int8_act, kv_dtype, engine=False, sequence_only=True)


def serve_arena_bytes(h: ModelHeader, slots: int, threads: int = DEFAULT_THREADS,
                      int8_act: bool = False, kv_dtype: str = "f32") -> int:
    """What `colibri serve --slots N` allocates besides the weights with continuous batching on
    (the CPU default): the engine's arena on `threads` threads plus N sequence-only contexts,
    each with its sequence's KV rows and recurrent state and nothing else (every pass is the
    engine's). The prefix cache (--prefix-cache-mb) comes on top."""
    return cpu_engine_arena_bytes(h, threads, int8_act, kv_dtype) + \
        slots * cpu_sequence_arena_bytes(h, int8_act, kv_dtype)
