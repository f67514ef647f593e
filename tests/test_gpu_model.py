"""The decode performance model (benchmarks/gpu_model.py, docs/cuda.md "Performance model"):
its byte counts are what the .colibri writer really lays out, per kind and dtype, and agree with
the bandwidth figure gpu-check computes from a file's tensor table."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_kit.model.footprint import kv_cache_bytes
from colibri_kit.model.format import DType, Flag, Kind, ModelHeader, padded_dim, read_model
from colibri_kit.model.tiny import write_random_model
from colibri_kit.paths import project_root

ROOT = project_root()


def _load(rel: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


gm = _load("benchmarks/gpu_model.py", "gpu_model")

# The backend's host C built with sanitizers, and the stand-in libcuda.so.1 that logs every
# cuLaunchKernel (tests/gpu/stub_libcuda.c), as tests/test_cuda_host.py builds them.
from test_cuda_host import host_unit, run_unit, stub_driver  # noqa: E402,F401

# Which record kinds each of the model's kinds is made of (docs/format.md tensor kinds).
KINDS = {
    "attention weights": {Kind.WQ, Kind.WK, Kind.WV, Kind.WO, Kind.BQ, Kind.BK, Kind.BV,
                          Kind.Q_NORM, Kind.K_NORM, Kind.ATTN_SINKS, Kind.BO},
    "norms": {Kind.ATTN_NORM, Kind.FFN_NORM, Kind.OUTPUT_NORM},
    "router": {Kind.ROUTER, Kind.ROUTER_BIAS},
    "shared expert": {Kind.SHARED_W1, Kind.SHARED_W3, Kind.SHARED_W2, Kind.SHARED_GATE},
}
EXPERTS = {Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2, Kind.EXPERT_B1, Kind.EXPERT_B3,
           Kind.EXPERT_B2}

# Flag mixes of the four families: mixtral (none), qwen2_moe, qwen3_moe (+ tied here), olmoe.
FLAG_CASES = {
    "plain": 0,
    "shared-gate-bias": int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS),
    "qknorm-head-tied": int(Flag.QK_NORM_HEAD | Flag.TIED_EMBEDDINGS),
    "qknorm-full": int(Flag.QK_NORM_FULL),
}


def small_header(dtype: DType, flags: int) -> ModelHeader:
    # hidden 72 pads to 128; FFN 40 and head_dim 10 leave a partial q4 group on every row kind
    return ModelHeader(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=48,
                       embed_dim=72, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=10, top_k=2,
                       routing=0, dtype=int(dtype), embed_dim_pad=padded_dim(72, 64),
                       pad_multiple=64, flags=flags,
                       shared_expert_size=24 if flags & Flag.SHARED_EXPERT else 0)


def _size(r) -> int:
    return r.nbytes + r.scale_nbytes


def per_kind_from_file(path: Path, kinds_of: dict | None = None) -> dict[str, int]:
    """Bytes per decoded token, from the file's tensor table: every tensor once, one embedding
    row, top_k of the E routed experts, the LM head (the embedding when tied)."""
    m = read_model(path)
    h, recs = m.header, list(m.records.values())
    out = {k: sum(_size(r) for r in recs if r.kind in kinds)
           for k, kinds in (kinds_of or KINDS).items()}
    emb = m.record(Kind.TOK_EMBED)
    assert _size(emb) % emb.rows == 0
    out["embedding row"] = _size(emb) // emb.rows
    experts = sum(_size(r) for r in recs if r.kind in EXPERTS)
    assert experts % h.num_experts == 0      # every expert the same size
    out["routed experts (top-k)"] = experts // h.num_experts * h.top_k
    out["LM head"] = _size(emb if h.has(Flag.TIED_EMBEDDINGS) else m.record(Kind.LM_HEAD))
    return out


@pytest.mark.parametrize("flags", list(FLAG_CASES.values()), ids=list(FLAG_CASES))
@pytest.mark.parametrize("dtype", list(DType), ids=[d.name.lower() for d in DType])
def test_bytes_per_token_are_the_writers_layout(tmp_path: Path, dtype: DType, flags: int):
    h = small_header(dtype, flags)
    path = write_random_model(tmp_path / "m.colibri", h)
    written = read_model(path)
    model = gm.bytes_per_token(written.header, 0)
    assert model.pop("KV cache") == 0
    assert model == per_kind_from_file(path)
    assert gm.weights_in_file(written.header) == sum(_size(r) for r in written.records.values())


@pytest.mark.parametrize("expert_dtype", [None, DType.MXFP4], ids=["f32", "mxfp4-experts"])
def test_gptoss_bytes_per_token_are_the_writers_layout(tmp_path: Path, expert_dtype):
    """gpt-oss (#23): sinks, o_proj / router / expert biases counted with their kinds, mxfp4
    experts at their own dtype; a sliding layer (window 6 of 48) reads its window of the cache."""
    from colibri_kit.model.format import LayerRecord, Mixer, Ffn, MixerFlag, gptoss_moe_params

    params = gptoss_moe_params(1.702, 7.0)
    flags = int(MixerFlag.SINKS | MixerFlag.O_BIAS)
    layers = (LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 6, flags, (0, 0, 0, 0), params),
              LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, flags, (0, 0, 0, 0), params))
    h = replace(small_header(DType.F32, int(Flag.QKV_BIAS)), layers=layers,
                expert_dtype=None if expert_dtype is None else int(expert_dtype))
    written = read_model(write_random_model(tmp_path / "m.colibri", h))
    model = gm.bytes_per_token(written.header, 0)
    assert model.pop("KV cache") == 0
    assert model == per_kind_from_file(tmp_path / "m.colibri")
    assert gm.weights_in_file(written.header) == sum(_size(r) for r in written.records.values())
    kvd = h.n_kv_heads * h.head_dim
    assert gm.bytes_per_token(written.header, 20)["KV cache"] == 2 * (6 + 20) * kvd * gm.KV_BYTES
    assert not gm.route_fused(written.header)  # the router bias keeps the three launches


def test_kv_cache_read_at_full_context_is_the_whole_cache():
    h = small_header(DType.F16, 0)
    assert gm.bytes_per_token(h, h.max_seq_len)["KV cache"] == kv_cache_bytes(h)
    assert gm.bytes_per_token(h, 7)["KV cache"] * h.max_seq_len == 7 * kv_cache_bytes(h)


@pytest.mark.parametrize("flags", ["shared-gate-bias", "qknorm-head-tied"])
@pytest.mark.parametrize("dtype", [DType.F16, DType.INT8, DType.Q4], ids=["f16", "int8", "q4"])
def test_total_agrees_with_gpu_checks_bandwidth_figure(tmp_path: Path, dtype: DType, flags: str):
    """scripts/gpu_check_run.py turns decode tok/s into GB/s with its own count of the bytes a
    token reads (from the file's table): the model's total is the same number, tied embeddings
    (the LM head reads the whole embedding) included."""
    run = _load("scripts/gpu_check_run.py", "gpu_check_run")
    h = small_header(dtype, FLAG_CASES[flags])
    path = write_random_model(tmp_path / "m.colibri", h)
    assert run.decode_bytes_per_token(path) == sum(gm.bytes_per_token(h, 0).values())


@pytest.mark.parametrize("streams", [1, 2])
def test_kernels_per_token_are_the_backends_launches(host_unit: Path, stub_driver, tmp_path: Path,
                                                     streams: int):
    """The model's launches per decoded token = what the real cuda_backend.c issues for one
    token on tests/gpu/host_unit.c's model (2 layers, shared expert + gate, per-head q/k norm,
    qkv bias, tied embeddings), logged by the stand-in driver: without CUDA graphs (a driver
    lacking them) one cuLaunchKernel per kernel plus the copies; with them, after the capture on
    the first decode step, the graph's nodes are those kernels and each further token is one
    cuGraphLaunch between its two copies (the launches-per-token figure: 1)."""
    flags = int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QK_NORM_HEAD | Flag.QKV_BIAS
                | Flag.TIED_EMBEDDINGS)
    h = ModelHeader(num_experts=8, expert_size=20, vocab_size=50, max_seq_len=64, embed_dim=24,
                    n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, top_k=2, routing=0,
                    dtype=int(DType.F32), embed_dim_pad=32, pad_multiple=32, flags=flags,
                    shared_expert_size=12)
    n = gm.launches_per_token(h)
    logs = {}
    for lib in ("nograph", "full"):
        log = tmp_path / f"{lib}.log"
        proc = run_unit(host_unit, "open", str(streams), "1", "1", "3",
                        env={"COLIBRI_LIBCUDA": str(stub_driver[lib]), "STUB_LOG": str(log)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        logs[lib] = log.read_text().splitlines()
    launches = [ln for ln in logs["nograph"] if ln.startswith("launch ")]
    assert len(launches) == 4 * n.kernels  # 4 one-token forwards
    graph = logs["full"]
    end = next(i for i, ln in enumerate(graph) if ln.startswith("end capture"))
    assert sum(ln.startswith("capture ") for ln in graph[:end]) == n.graph_nodes
    per_token = [ln for ln in graph[end + 1:] if ln.startswith(("launch ", "graph launch"))]
    assert per_token == [f"graph launch stream 0 nodes {n.graph_nodes}"] * 4
    assert n.graph_calls == 3 and n.graph_nodes == n.kernels  # a 64-position cache: no merge
    assert gm.launches_per_token(replace(h, max_seq_len=300)).graph_nodes == n.kernels + 2
    # 8 experts: the FFN norm, router and top-k are one launch; with more router rows than the
    # fused kernel has warps (or the fusion switched off) they are three, as the backend issues
    # them with COLIBRI_CUDA_FUSE_ROUTE=0
    assert gm.route_fused(h) and n.per_layer == 15
    log = tmp_path / "split.log"
    proc = run_unit(host_unit, "open", str(streams), "1", "1",
                    env={"COLIBRI_LIBCUDA": str(stub_driver["nograph"]), "STUB_LOG": str(log),
                         "COLIBRI_CUDA_FUSE_ROUTE": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    split = gm.launches_per_token(replace(h, num_experts=gm.ROUTE_WARPS + 1))
    assert sum(ln.startswith("launch ") for ln in log.read_text().splitlines()) == split.kernels
    assert split.kernels == n.kernels + 2 * h.n_layers


def test_route_fusion_rule_uses_the_kernels_limits():
    """gpu_model's copy of the fusion rule (E <= warps of cb_ffn_route's block, Dp <= its
    shared-memory row) has colibri_abi.h's numbers."""
    abi = (ROOT / "runtime" / "kernels" / "colibri_abi.h").read_text()

    def define(name: str) -> int:
        import re

        return int(re.search(rf"#define {name} (\d+)", abi).group(1))

    assert gm.ROUTE_WARPS == define("COLIBRI_CU_ROUTE_THREADS") // define("COLIBRI_CU_WARP")
    assert gm.ROUTE_MAX_DP == define("COLIBRI_CU_ROUTE_MAX_DP")


def test_headers_are_the_converters():
    """The real-size models are built from their config.json by the converter's own mapping."""
    q = gm.header_for(gm.QWEN15_MOE_A27B, DType.INT8)
    assert (q.num_experts, q.top_k, q.expert_size, q.shared_expert_size) == (60, 4, 1408, 5632)
    assert q.has(Flag.SHARED_EXPERT) and q.has(Flag.SHARED_EXPERT_GATE) and q.has(Flag.QKV_BIAS)
    m = gm.header_for(gm.MIXTRAL_8X7B, DType.Q4)
    assert (m.embed_dim, m.n_layers, m.head_dim, m.flags) == (4096, 32, 128, 0)
    b = gm.header_for(gm.BENCH_MIXTRAL, DType.F16)
    assert (b.embed_dim, b.n_layers, b.expert_size, b.n_heads, b.n_kv_heads, b.head_dim) == (
        1024, 8, 2816, 16, 4, 64)
    from colibri_kit.model.format import Mixer

    h = gm.header_for(gm.QWEN35_35B_A3B, DType.INT8)  # the hybrid layer list: 3 DeltaNet : 1 gated
    kinds = [r.mixer for r in h.layer_records()]
    assert kinds[3::4] == [Mixer.ATTENTION] * 10
    assert kinds.count(Mixer.GATED_DELTANET) == 30 and h.layer(0).mixer_params == (16, 32, 128, 128)
    assert h.layer(3).mixer_params[0] == 64 and (h.num_experts, h.top_k, h.head_dim) == (256, 8, 256)


def test_expected_time_is_the_larger_bound():
    h = gm.header_for(gm.GPUCHECK_LARGE, DType.F16)
    n = gm.launches_per_token(h)
    total = sum(gm.bytes_per_token(h, 1024).values())
    for d in gm.DEVICES:
        for graph in (False, True):
            us, bound = gm.expected_us(h, d, 1024, 0.7, graph)
            bw, la = gm.bandwidth_bound_us(total, d, 0.7), gm.launch_bound_us(n, graph)
            assert us == max(bw, la) and bound == ("bw" if bw >= la else "launch")
    # a graph issues fewer host calls than one launch per kernel
    assert gm.launch_bound_us(n, True) < gm.launch_bound_us(n, False)


def test_report_names_every_device_source_and_model():
    text = gm.report(1024, 0.7)
    for d in gm.DEVICES:
        assert d.name in text and d.source in text
    for name in gm.MODELS:
        assert f"{name}: hidden" in text


# ---- hybrid models (#24): gated_deltanet + gated attention layers --------------------------

DN_KINDS = {Kind.DN_QKV, Kind.DN_Z, Kind.DN_B, Kind.DN_A, Kind.DN_CONV, Kind.DN_A_LOG,
            Kind.DN_DT_BIAS, Kind.DN_NORM, Kind.DN_OUT}


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.Q4], ids=["f32", "f16", "q4"])
def test_hybrid_bytes_are_the_writers_layout(tmp_path: Path, dtype: DType):
    """A Qwen3.5-like layer list: the attention weights (with the output gate) and the DeltaNet
    weights are the file's tensors, the KV cache is the attention layers' only, and the state
    traffic is the kernels' passes over the footprint's state (conv rows read + written once,
    the delta-rule state read + written twice)."""
    from test_qwen35 import DN, GATED, hybrid_header

    from colibri_kit.model.footprint import state_bytes

    h = hybrid_header((DN, GATED, DN), dtype=int(dtype))
    path = write_random_model(tmp_path / "h.colibri", h)
    written = read_model(path)
    model = gm.bytes_per_token(written.header, 0)
    assert model.pop("KV cache") == 0
    recs = list(written.records.values())
    want = per_kind_from_file(path, {**KINDS, "attention weights": KINDS["attention weights"]
                                     | {Kind.ATTN_GATE}, "deltanet weights": DN_KINDS})
    state = model.pop("recurrent state")
    assert model == want
    hk, hv, dk, dv = DN.mixer_params
    c, w = 2 * hk * dk + hv * dv, DN.window
    conv, rec = 4 * (w - 1) * c, 4 * hv * dk * dv
    assert state_bytes(h) == 2 * (conv + rec) and state == 2 * (2 * conv + 4 * rec)
    assert gm.weights_in_file(written.header) == sum(_size(r) for r in recs)
    assert gm.bytes_per_token(h, 10)["KV cache"] == 1 * 2 * 10 * h.n_kv_heads * h.head_dim * 4
