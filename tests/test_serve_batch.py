"""`colibri serve` with continuous batching and the prompt prefix cache (issue 26; docs/serve.md,
"Batching" and "Prompt prefix cache"), against the product build (dist/host).

Batch invariance through the service: requests of different prompt and answer lengths, greedy
and sampled (their own seeds, temperatures, top-p), streamed and not, sent together in two join
orders, get exactly the ids each gets alone (one request in flight) and, greedy, what `colibri
generate` gives; /metrics shows that passes did carry several sequences. Prefix reuse: a shared
system prompt is restored, not computed (hits, tokens saved), and the answers are the ids of
computing everything again; a warm system prompt from the command line and from a rendered
systemd unit (the profile's service.warm_prompts, base64 on ExecStart) is restored for the first
request; the cache stays within its bytes (LRU evictions); a sliding-window model, whose
snapshots restore only whole, keeps a shared prefix met twice as its own entry and reuses it.
The same through the real `openai` client, batched on 3 threads against each alone on 1, while
a sixth client leaves mid-answer. `--no-batching` keeps the per-slot path. Join/leave under load, cancellation, the queue and the
drain run with batching on in test_serve_load.py (batching is the default)."""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from serve_support import Server, write_chat_model, write_load_model

from colibri_kit.model.format import DEFAULT_LAYER, DType, Ffn, LayerRecord, Mixer, ModelHeader, \
    Routing, padded_dim
from colibri_kit.model.tiny import write_random_model
from colibri_kit.service import parse_service, render_unit, verify_unit

SYSTEM = "Be a brief robot."  # the tiny chat model holds 128 positions (id = byte)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_chat_model(tmp_path_factory.mktemp("serve-batch") / "tiny.colibri")


@pytest.fixture(scope="module")
def load_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_load_model(tmp_path_factory.mktemp("serve-batch-load") / "load.colibri")


def complete(srv: Server, body: dict) -> list[int]:
    """One request (streamed or not); its generated ids."""
    status, _, out = srv.call("POST", "/v1/completions", {"model": srv_model(srv), **body}, timeout=300)
    assert status == 200, out
    if not body.get("stream"):
        return json.loads(out)["choices"][0]["token_ids"]
    ids = []
    for ev in out.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            ch = json.loads(ev[6:])["choices"]
            if ch:
                ids += ch[0]["token_ids"]
    return ids


def srv_model(srv: Server) -> str:
    return next(json.loads(line)["model"] for line in srv.lines if '"event": "ready"' in line)


def released_at_once(call: Callable[[int], list[int]], n: int, order: list[int]) -> list[list[int]]:
    """call(0..n-1) on n threads started in `order`, all released at once by a barrier; the
    results in index order."""
    out: list[list[int] | None] = [None] * n
    go = threading.Barrier(n)

    def run(i: int) -> None:
        go.wait()
        out[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(o is not None for o in out)
    return out  # type: ignore[return-value]


def together(srv: Server, bodies: list[dict], order: list[int]) -> list[list[int]]:
    """The requests sent at once, started in `order`; their ids in the bodies' order."""
    return released_at_once(lambda i: complete(srv, bodies[i]), len(bodies), order)


def generate(binary: Path, model: Path, prompt: list[int], n: int) -> list[int]:
    proc = subprocess.run([str(binary), "--threads", "1", "generate", str(model), "--ids",
                           ",".join(map(str, prompt)), "--max-new", str(n)],
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout)["new_ids"]


def ready_line(srv: Server) -> dict:
    return next(json.loads(line) for line in srv.lines if '"event": "ready"' in line)


def test_requests_batched_together_equal_each_alone(host_colibri: Path, load_model: Path) -> None:
    rng = random.Random(26)
    bodies = []
    for i in range(6):
        body = {"prompt": [rng.randrange(2000) for _ in range(rng.choice([3, 40, 90, 150]))],
                "max_tokens": rng.choice([20, 60, 120]), "stream": i % 2 == 1}
        if i >= 2:  # sampled, each with its own seed
            body.update(temperature=0.6 + 0.1 * i, seed=1000 + i, top_p=0.95 if i % 2 else 1.0)
        else:
            body["temperature"] = 0
        bodies.append(body)
    srv = Server(host_colibri, load_model, "--slots", "6", "--threads", "2").start()
    try:
        assert ready_line(srv)["batching"] is True
        alone = [complete(srv, b) for b in bodies]  # one request in flight at a time
        before = srv.metrics()
        first = together(srv, bodies, list(range(6)))
        second = together(srv, bodies, [5, 2, 4, 0, 3, 1])
        after = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert first == alone and second == alone
    for b, ids in zip(bodies, alone):
        assert len(ids) == b["max_tokens"]  # the load model has no EOS id
    for b, ids in zip(bodies[:2], alone[:2]):  # greedy: what `colibri generate` gives
        assert ids == generate(host_colibri, load_model, b["prompt"], b["max_tokens"])
    passes = after["colibri_batch_passes_total"] - before["colibri_batch_passes_total"]
    seqs = after["colibri_batch_sequences_total"] - before["colibri_batch_sequences_total"]
    assert passes > 0 and seqs / passes > 2, (passes, seqs)  # passes did carry several requests


def openai_ids(client: openai.OpenAI, model: str, body: dict) -> list[int]:
    """One request through the `openai` client (streamed or not); its generated ids."""
    args = {k: v for k, v in body.items() if k != "stream"}
    if not body.get("stream"):
        return client.completions.create(model=model, **args).choices[0].token_ids
    chunks = client.completions.create(model=model, stream=True, **args)
    return [i for c in chunks if c.choices for i in (c.choices[0].token_ids or [])]


def test_openai_clients_batched_on_more_threads_while_one_leaves(host_colibri: Path, load_model: Path) -> None:
    """Real `openai` clients, five at once on a 3-thread engine, and a sixth that joins with them
    and leaves after its first tokens: the five get the ids each gets alone on a 1-thread server
    with one slot (batch and thread invariance together); the one that left is cancelled and its
    slot comes back."""
    rng = random.Random(126)
    bodies = [{"prompt": [rng.randrange(2000) for _ in range(n)], "max_tokens": m, "stream": i % 2 == 0,
               **({"temperature": 0} if i == 0 else {"temperature": 0.8, "seed": 77 + i, "top_p": 0.9})}
              for i, (n, m) in enumerate([(5, 40), (120, 25), (33, 70), (1, 50), (64, 30)])]
    alone_srv = Server(host_colibri, load_model, "--slots", "1", "--threads", "1").start()
    try:
        client = openai.OpenAI(base_url=alone_srv.base + "/v1", api_key="unused-on-loopback", max_retries=0)
        alone = [openai_ids(client, load_model.stem, b) for b in bodies]
    finally:
        assert alone_srv.stop() == 0
    srv = Server(host_colibri, load_model, "--slots", "6", "--threads", "3").start()
    try:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="unused-on-loopback", max_retries=0,
                               timeout=600)
        before = srv.metrics()
        got: list[list[int] | None] = [None] * len(bodies)
        left: list[int] = []
        go = threading.Barrier(len(bodies) + 1)

        def run(i: int) -> None:
            go.wait()
            got[i] = openai_ids(client, load_model.stem, bodies[i])

        def leave() -> None:
            go.wait()
            stream = client.completions.create(model=load_model.stem, prompt=[7] * 50, max_tokens=400,
                                               temperature=0, stream=True)
            for chunk in stream:
                left.extend((chunk.choices[0].token_ids or []) if chunk.choices else [])
                if len(left) >= 3:
                    break
            stream.close()  # the client goes away mid-answer

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
        threads.append(threading.Thread(target=leave))
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        entry = srv.wait_log(lambda e: e.get("finish_reason") == "cancelled", timeout=120)
        after = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert got == alone
    assert len(left) >= 3 and entry["completion_tokens"] < 400
    assert after["colibri_requests_cancelled_total"] - before["colibri_requests_cancelled_total"] == 1
    passes = after["colibri_batch_passes_total"] - before["colibri_batch_passes_total"]
    seqs = after["colibri_batch_sequences_total"] - before["colibri_batch_sequences_total"]
    assert passes > 0 and seqs / passes > 1.5, (passes, seqs)


def test_no_batching_is_the_per_slot_path(host_colibri: Path, load_model: Path) -> None:
    srv = Server(host_colibri, load_model, "--slots", "2", "--threads", "1", "--no-batching").start()
    try:
        ready = ready_line(srv)
        assert ready["batching"] == "--no-batching" and ready["threads"] == 1
        assert ready["prefix_cache_mb"].startswith("needs continuous batching")
        got = complete(srv, {"prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0})
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert got == generate(host_colibri, load_model, [5, 6, 7], 12)
    assert m["colibri_batching"] == 0 and m["colibri_batch_passes_total"] == 0


def chat(srv: Server, user: str, system: str = SYSTEM, n: int = 12) -> dict:
    body = {"model": srv_model(srv), "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": user}],
            "max_tokens": n, "temperature": 0}
    status, _, out = srv.call("POST", "/v1/chat/completions", body)
    assert status == 200, out
    return json.loads(out)["choices"][0]


def generate_chat(binary: Path, model: Path, user: str, n: int = 12) -> list[int]:
    proc = subprocess.run([str(binary), "--threads", "1", "generate", str(model), "--prompt", user,
                           "--chat", "--system", SYSTEM, "--max-new", str(n), "--json"],
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout)["ids"]


def test_shared_system_prompt_is_restored_not_computed(host_colibri: Path, chat_model: Path) -> None:
    srv = Server(host_colibri, chat_model, "--slots", "2", "--threads", "1").start()
    try:
        cap = ready_line(srv)["prefix_cache_mb"]
        assert isinstance(cap, float) and cap > 0  # one slot's KV cache by default
        users = ["Where is 7?", "Open it.", "Time?"]
        got = [chat(srv, u)["token_ids"] for u in users]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    for u, ids in zip(users, got):
        assert ids == generate_chat(host_colibri, chat_model, u)  # bitwise: the same ids
    # ChatML: "<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n" is shared
    head = len(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n".encode())
    assert m["colibri_prefix_cache_hits_total"] == 2 and m["colibri_prefix_cache_misses_total"] == 1
    assert m["colibri_prefix_cache_tokens_saved_total"] >= 2 * head
    assert 0 < m["colibri_prefix_cache_bytes"] <= m["colibri_prefix_cache_capacity_bytes"]


def test_warm_system_prompt_serves_the_first_request(host_colibri: Path, chat_model: Path) -> None:
    srv = Server(host_colibri, chat_model, "--slots", "1", "--threads", "1", "--warm-system", SYSTEM).start()
    try:
        ready = ready_line(srv)
        head = len(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n".encode())
        assert ready["warm_prompts"] == 1 and ready["warm_tokens"] == head  # id = byte
        got = chat(srv, "Hello")["token_ids"]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert got == generate_chat(host_colibri, chat_model, "Hello")
    assert m["colibri_prefix_cache_hits_total"] == 1 and m["colibri_prefix_cache_misses_total"] == 0
    assert m["colibri_prefix_cache_tokens_saved_total"] == head


def test_warm_prompts_from_the_rendered_unit(host_colibri: Path, chat_model: Path) -> None:
    """The profile's service.warm_prompts as the unit's ExecStart passes them (base64), with text
    a unit's command line could not carry as it is: spaces, quotes, '%', '$', newlines."""
    awkward = 'L1\n100% "q" $HOME; \\ e'
    spec = parse_service({"warm_prompts": [SYSTEM, {"prompt": "def f():"}, awkward]})
    unit = render_unit(spec)
    verify_unit(unit)
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.split("=", 1)[1])
    args = argv[argv.index("--warm-prompts-b64"):argv.index("--warm-prompts-b64") + 2]
    srv = Server(host_colibri, chat_model, "--slots", "1", "--threads", "1", "--prefix-cache-mb", "1",
                 *args).start()
    try:
        ready = ready_line(srv)
        got = chat(srv, "Hi", system=awkward)["token_ids"]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert ready["warm_prompts"] == 3
    assert ready["warm_tokens"] > len(SYSTEM) + len(awkward.encode()) + len("def f():")
    assert m["colibri_prefix_cache_entries"] >= 3 and m["colibri_prefix_cache_hits_total"] == 1
    head = len(f"<|im_start|>system\n{awkward}<|im_end|>\n<|im_start|>user\n".encode())
    assert m["colibri_prefix_cache_tokens_saved_total"] == head  # the awkward text arrived intact
    assert got and all(0 <= i < 256 for i in got)


def test_warm_prompts_that_cannot_be_computed_stop_the_start(host_colibri: Path, chat_model: Path,
                                                             load_model: Path) -> None:
    srv = Server(host_colibri, load_model, "--warm-system", SYSTEM)  # no tokenizer
    srv.proc = subprocess.Popen(srv.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = srv.proc.communicate(timeout=120)
    assert srv.proc.returncode == 1 and "warm prompt 1 (system): the model has no tokenizer" in err
    for args, words in ((["--prefix-cache-mb", "0", "--warm-system", SYSTEM], "the prefix cache, which is off"),
                        (["--warm-prompts-b64", "bm90IGpzb24="], "not base64 of a JSON list"),
                        (["--warm-prompt", "x" * 4000], "tokens: it must be 1..127")):
        proc = subprocess.run([str(host_colibri), "serve", str(chat_model), "--port", "0", *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and words in proc.stderr, (args, proc.stderr)


def test_prefix_cache_stays_within_its_bytes(host_colibri: Path, load_model: Path) -> None:
    # the load model keeps 4 layers x 4 KV heads x 32 x 2 (K, V) x 4 bytes = 4 KiB per position:
    # 1 MiB holds about 250 positions, so 150-position prompts evict each other
    srv = Server(host_colibri, load_model, "--slots", "1", "--threads", "1", "--prefix-cache-mb", "1").start()
    try:
        for i in range(4):
            complete(srv, {"prompt": [(i * 37 + k) % 2000 for k in range(150)], "max_tokens": 2,
                           "temperature": 0})
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert m["colibri_prefix_cache_capacity_bytes"] == 1 << 20
    assert 0 < m["colibri_prefix_cache_bytes"] <= 1 << 20
    assert m["colibri_prefix_cache_entries"] == 1 and m["colibri_prefix_cache_evictions_total"] == 3


def test_sliding_window_model_reuses_a_shared_prefix_whole(host_colibri: Path, tmp_path: Path) -> None:
    """A ring's snapshot restores to its own position only: the second request meeting a shared
    prefix stores it on the way as an entry of its own, which the third one restores."""
    pad = 64
    h = ModelHeader(num_experts=4, expert_size=32, vocab_size=300, max_seq_len=256, embed_dim=48,
                    n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, top_k=2,
                    routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(48, pad),
                    pad_multiple=pad, norm_eps=1e-6, rope_theta=10000.0, name="ring",
                    layers=(LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 16), DEFAULT_LAYER))
    model = write_random_model(tmp_path / "ring.colibri", h, seed=9)
    shared = [(k * 31 + 5) % 300 for k in range(60)]
    prompts = [shared + [200 + i, 7, 9 + i] for i in range(3)]
    srv = Server(host_colibri, model, "--slots", "1", "--threads", "1").start()
    try:
        got = [complete(srv, {"prompt": p, "max_tokens": 16, "temperature": 0}) for p in prompts]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    for p, ids in zip(prompts, got):
        assert ids == generate(host_colibri, model, p, 16)
    assert m["colibri_prefix_cache_hits_total"] == 1 and m["colibri_prefix_cache_misses_total"] == 2
    assert m["colibri_prefix_cache_tokens_saved_total"] == len(shared)


def test_prompt_rows_cap_keeps_the_ids(host_colibri: Path, load_model: Path) -> None:
    """--prompt-rows (docs/serve.md, "Batching"): with prompts held to 8 rows a step while others
    decode, long prompts joining decoding requests take many steps and every greedy answer is
    still what `colibri generate` gives; the ready line says the cap; the profile key renders it
    (only when set) and bad values are refused by the kit and by serve."""
    rng = random.Random(261)
    bodies = [{"prompt": [rng.randrange(2000) for _ in range(n)], "max_tokens": m, "temperature": 0}
              for n, m in ((3, 90), (150, 20), (90, 30), (40, 10))]
    srv = Server(host_colibri, load_model, "--slots", "4", "--threads", "2", "--prompt-rows", "8").start()
    try:
        assert ready_line(srv)["prompt_rows"] == 8
        before = srv.metrics()
        got = together(srv, bodies, [0, 1, 2, 3])
        after = srv.metrics()
    finally:
        assert srv.stop() == 0
    for b, ids in zip(bodies, got):
        assert ids == generate(host_colibri, load_model, b["prompt"], b["max_tokens"])
    rows = after["colibri_batch_rows_total"] - before["colibri_batch_rows_total"]
    assert rows == sum(len(b["prompt"]) + b["max_tokens"] - 1 for b in bodies), rows
    spec = parse_service({"prompt_rows": 64})
    args = spec.serve_args()
    assert args[args.index("--prompt-rows") + 1] == "64"
    assert "--prompt-rows" not in parse_service({}).serve_args()  # default: the unit is unchanged
    for bad in (0, 513, "64", True):
        with pytest.raises(Exception, match=r"service\.prompt_rows: .* an integer 1\.\.512"):
            parse_service({"prompt_rows": bad})
    for bad in ("0", "513", "x"):
        proc = subprocess.run([str(host_colibri), "serve", str(load_model), "--prompt-rows", bad],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--prompt-rows must be 1..512" in proc.stderr, proc.stderr


def test_requests_reading_a_cached_prefix_in_place_while_others_evict(host_colibri: Path,
                                                                      load_model: Path) -> None:
    """A restored prefix is read in place (colibri_seq_share), so its entry must outlive every
    request reading it: two requests continue one cached 150-position prefix while two others,
    whose own 150 positions do not fit beside it in 1 MiB (~250 positions), want to store theirs.
    Every answer has the bits of its request alone, nobody reads an entry once all are done, and
    the cache stays within its bytes."""
    rng = random.Random(27)
    shared = [rng.randrange(2000) for _ in range(150)]
    # the readers answer longer than the others, which store theirs while the readers decode
    bodies = [{"prompt": shared + [rng.randrange(2000) for _ in range(4)], "max_tokens": 64,
               "temperature": 0} for _ in range(2)]
    bodies += [{"prompt": [rng.randrange(2000) for _ in range(150)], "max_tokens": 4,
                "temperature": 0} for _ in range(2)]
    srv = Server(host_colibri, load_model, "--slots", "4", "--threads", "2", "--prefix-cache-mb",
                 "1").start()
    try:
        alone = [complete(srv, b) for b in bodies]        # one in flight: each stores its own
        complete(srv, {"prompt": shared + [1, 2], "max_tokens": 2, "temperature": 0})
        hits = srv.metrics()["colibri_prefix_cache_hits_total"]
        assert complete(srv, bodies[0]) == alone[0]       # the shared prefix, restored alone
        assert srv.metrics()["colibri_prefix_cache_hits_total"] == hits + 1
        rounds = [together(srv, bodies, order) for order in ([0, 2, 1, 3], [3, 1, 2, 0]) * 3]
        m = srv.metrics()
    finally:
        assert srv.stop() == 0
    assert all(r == alone for r in rounds), (alone, rounds)
    assert m["colibri_prefix_cache_readers"] == 0
    assert 0 < m["colibri_prefix_cache_bytes"] <= m["colibri_prefix_cache_capacity_bytes"] == 1 << 20
