"""Continuous batching of the newer families through `colibri serve` and the real `openai` client
(issue 26's open goals; docs/serve.md, "Batching"): a Qwen3.5-style hybrid (gated_deltanet layers,
each sequence with its own conv + delta state inside one pass, around gated full attention) and a
gpt-oss-style model (mxfp4 experts, attention sinks on a sliding-window ring and on full
attention, the clamped SwiGLU).

For each: four clients of different prompt and answer lengths (greedy and sampled, their own
seeds; streamed and not) sent together, in two join orders, to a 4-slot server on 3 threads and
again on 2 threads get exactly the ids each gets alone on a 1-slot server on 1 thread (batch and
thread invariance through the service); /metrics shows batching on and passes that carried
several sequences; greedy answers equal `colibri generate`. The hybrid's shared prompt prefix is
stored whole and its recurrent state restored for a later request, with the same ids.

The C-level bit checks of the same two families (logits, join orders, 1-3 threads, f16 KV, int8
activations) are test_batch.py's "hybrid" and "gptoss" rows."""

from __future__ import annotations

import random
from pathlib import Path

import openai
import pytest
from serve_support import Server
from test_batch import GPTOSS_FFN, GPTOSS_FLAGS, header
from test_qwen35 import DN, GATED, hybrid_header
from test_serve_batch import generate, openai_ids, ready_line, released_at_once

from colibri_kit.model.format import DType, Ffn, LayerRecord, Mixer
from colibri_kit.model.tiny import write_random_model

MODELS = {
    # DN, gated attention, DN, DN: the 3:1 pattern of the family, deltanet first and last
    "qwen35": hybrid_header((DN, GATED, DN, DN), max_seq_len=192),
    "gptoss": header(n_layers=2, expert_dtype=int(DType.MXFP4), expert_size=64, norm_eps=1e-5,
                     max_seq_len=192, name="gptoss-batch",
                     layers=(LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 16, GPTOSS_FLAGS, (0, 0, 0, 0), GPTOSS_FFN),
                             LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, GPTOSS_FLAGS, (0, 0, 0, 0), GPTOSS_FFN))),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-batch-hybrid")
    return {k: write_random_model(root / f"{k}.colibri", h, seed=11) for k, h in MODELS.items()}


def bodies_for(seed: int) -> list[dict]:
    """Four requests: prompt lengths on both sides of the sliding window (16) and of a step's
    decode rows, greedy and sampled, streamed and not."""
    rng = random.Random(seed)
    shape = [(3, 30), (70, 12), (17, 40), (1, 25)]
    return [{"prompt": [rng.randrange(300) for _ in range(n)], "max_tokens": m, "stream": i % 2 == 1,
             **({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": 40 + i, "top_p": 0.9})}
            for i, (n, m) in enumerate(shape)]


def clients_at_once(client: openai.OpenAI, model: str, bodies: list[dict], order: list[int]) -> list[list[int]]:
    """One `openai` request per body, all released at once, threads started in `order`."""
    return released_at_once(lambda i: openai_ids(client, model, bodies[i]), len(bodies), order)


def client_for(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=600)


@pytest.mark.parametrize("name", list(MODELS))
def test_clients_batched_equal_each_alone(host_colibri: Path, models: dict[str, Path], name: str) -> None:
    model = models[name]
    bodies = bodies_for(26 + len(name))
    alone_srv = Server(host_colibri, model, "--slots", "1", "--threads", "1").start()
    try:
        client = client_for(alone_srv)
        alone = [openai_ids(client, model.stem, b) for b in bodies]
    finally:
        assert alone_srv.stop() == 0
    for b, ids in zip(bodies, alone):
        assert len(ids) == b["max_tokens"]  # random models have no EOS id: every answer is full
    for b, ids in zip(bodies[::2], alone[::2]):  # greedy: what `colibri generate` gives
        assert ids == generate(host_colibri, model, b["prompt"], b["max_tokens"])
    for threads, order in (("3", [0, 1, 2, 3]), ("2", [3, 1, 0, 2])):
        srv = Server(host_colibri, model, "--slots", "4", "--threads", threads).start()
        try:
            assert ready_line(srv)["batching"] is True, ready_line(srv)
            got = clients_at_once(client_for(srv), model.stem, bodies, order)
            m = srv.metrics()
        finally:
            assert srv.stop() == 0
        assert got == alone, (threads, order)
        assert m["colibri_batching"] == 1
        passes, seqs = m["colibri_batch_passes_total"], m["colibri_batch_sequences_total"]
        # some passes carried several sequences (how many depends on when each client's request
        # arrives on a loaded host, so only that some did: the bits above are the contract)
        assert passes > 0 and seqs > passes, (passes, seqs)
        # where the steps' time went: each part inside the one that holds it, none left out
        t = {k: m[f"colibri_batch_{k}_seconds_total"] for k in ("busy", "step", "pass", "mixer", "ffn", "head", "sample")}
        assert 0 < t["mixer"] + t["ffn"] + t["head"] <= t["pass"] <= t["pass"] + t["sample"] <= t["step"] <= t["busy"], t
        assert min(t["mixer"], t["ffn"], t["head"], t["sample"]) > 0, t


def test_hybrid_prefix_state_restored_among_batched_clients(host_colibri: Path, models: dict[str, Path]) -> None:
    """A prompt prefix met twice is stored whole (a recurrent state restores to its own position
    only); a third request restores it while others are in flight, and every answer is the ids
    of computing everything alone."""
    model = models["qwen35"]
    rng = random.Random(35)
    shared = [rng.randrange(300) for _ in range(40)]
    bodies = [{"prompt": shared + [rng.randrange(300) for _ in range(n)], "max_tokens": m, "temperature": 0}
              for n, m in [(3, 20), (30, 12), (9, 25)]]
    alone = [generate(host_colibri, model, b["prompt"], b["max_tokens"]) for b in bodies]
    srv = Server(host_colibri, model, "--slots", "3", "--threads", "2").start()
    try:
        client = client_for(srv)
        first = [openai_ids(client, model.stem, b) for b in bodies[:2]]  # the prefix met twice
        got = clients_at_once(client, model.stem, bodies, [2, 0, 1])
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert first == alone[:2] and got == alone
    assert m["colibri_prefix_cache_hits_total"] >= 1 and m["colibri_prefix_cache_tokens_saved_total"] >= 40


def test_engine_and_slot_arenas_as_the_footprint_counts(host_colibri: Path, models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """The ready line's memory (the engine's per-step buffers, each slot's context) equals the
    kit's footprint (serve_arena_bytes) byte for byte, each slot a sequence-only context (its
    caches, no pass buffers): the hybrid (recurrent states in the slots,
    none in the engine), gpt-oss (a ring's K/V stage) and an int8 model with int8 activations."""
    from colibri_kit.model.footprint import (cpu_arena_bytes, cpu_engine_arena_bytes,
                                             cpu_sequence_arena_bytes, serve_arena_bytes)
    from colibri_kit.model.format import read_model

    int8 = write_random_model(tmp_path / "int8.colibri", header(dtype=int(DType.INT8)), seed=2)
    for model, globals_ in ((models["qwen35"], ()), (models["gptoss"], ()), (int8, ("--int8-act",))):
        h = read_model(model).header
        srv = Server(host_colibri, model, "--slots", "3", "--threads", "2", *globals_).start()
        try:
            mem = ready_line(srv)["memory"]
        finally:
            assert srv.stop() == 0
        act = bool(globals_)
        assert mem == {"engine_arena_bytes": cpu_engine_arena_bytes(h, 2, act),
                       "slot_arena_bytes": cpu_sequence_arena_bytes(h, act)}, model.name
        # a slot holds its caches only: less than a context that runs its own passes
        assert mem["slot_arena_bytes"] < cpu_arena_bytes(h, 1, act), model.name
        assert serve_arena_bytes(h, 3, 2, act) == mem["engine_arena_bytes"] + 3 * mem["slot_arena_bytes"]
        assert mem["engine_arena_bytes"] > 16 * h.vocab_size * 4  # the LM head stage is in it
