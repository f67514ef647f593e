"""`colibri serve` under load and at its edges, on a random model (~1 ms a token on one quiet
thread, ~5 ms on a loaded one). Nothing here depends on that speed: requests that must overlap
are long (hundreds of tokens) and the tests wait on /health, never on a sleep: 16 `openai` clients against 4 slots and a queue of 4 (every
200 answer equals `colibri generate`, the rest are 503 with Retry-After, the service stays up),
a client that disconnects mid-generation frees its slot, and SIGTERM drains in-flight requests
(or, past the drain deadline, ends them with an error event) and exits 0; /health is 503
"full" while every slot and queue place is taken."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from pathlib import Path

import openai
import pytest
from serve_support import Server, generate_ids, write_load_model

MODEL_ID = "load"
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [11, 22, 33], [100, 200, 300, 400, 500], [1999, 0, 1999]]
MAX_TOKENS = 200  # long enough that all 16 clients arrive while the first 4 still generate


@pytest.fixture(scope="module")
def load_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_load_model(tmp_path_factory.mktemp("serve-load") / f"{MODEL_ID}.colibri")


@pytest.fixture(scope="module")
def server(host_colibri: Path, load_model: Path):
    srv = Server(host_colibri, load_model, "--slots", "4", "--threads", "1", "--max-queue", "4").start()
    yield srv
    assert srv.stop() == 0


def wait_idle(srv: Server, timeout: float = 20.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status, _, body = srv.call("GET", "/health")
        h = json.loads(body)
        if status == 200 and h["slots_busy"] == 0 and h["queued"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"service not idle: {h}")


def wait_busy(srv: Server, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if json.loads(srv.call("GET", "/health")[2])["slots_busy"] > 0:
            return
    raise AssertionError("the request never took a slot")


def test_client_disconnect_cancels_generation(server):
    before = server.metrics()
    s = stream_request(server.port, 450)
    assert b'"token_ids": [' in read_until(s, b"token_ids")
    s.close()  # gone after the first token
    entry = server.wait_log(lambda e: e.get("stream") and e.get("finish_reason") == "cancelled")
    assert entry["completion_tokens"] < 450
    # the same for a non-streaming request whose client leaves while it generates
    body = json.dumps({"model": MODEL_ID, "prompt": PROMPTS[1], "max_tokens": 450, "temperature": 0})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    wait_busy(server)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    entry = server.wait_log(lambda e: e["status"] == 499 and e.get("finish_reason") == "cancelled")
    assert entry["completion_tokens"] < 450
    wait_idle(server)  # both slots came back
    after = server.metrics()
    assert after["colibri_requests_cancelled_total"] - before["colibri_requests_cancelled_total"] == 2


def test_sigterm_finishes_in_flight_requests_and_exits_0(host_colibri, load_model):
    # the two generating requests are long (450 tokens, context 512) so that the queue is still
    # full when SIGTERM arrives on any machine; the two queued ones are short
    lengths = [450, 450, 60, 60]
    srv = Server(host_colibri, load_model, "--slots", "2", "--threads", "1", "--max-queue", "2").start()
    try:
        # the long ones first, and holding their slots, before the short ones queue: sent
        # together, the server may admit any two of the four first
        streams = [stream_request(srv.port, n, p) for n, p in zip(lengths[:2], PROMPTS)]
        firsts = [read_until(s, b"token_ids") for s in streams]
        streams += [stream_request(srv.port, n, p) for n, p in zip(lengths[2:], PROMPTS[2:])]
        end = time.monotonic() + 30  # the queued requests reach the queue late on a loaded machine
        while True:  # both slots busy and the queue full: /health says so, a 5th request is refused
            status, headers, body = srv.call("GET", "/health")
            if json.loads(body)["status"] == "full" or time.monotonic() > end:
                break
        assert status == 503 and headers["retry-after"] == "1", body
        status, _, body = srv.call("POST", "/v1/completions", {"model": MODEL_ID, "prompt": [1], "max_tokens": 1})
        assert status == 503 and json.loads(body)["error"]["code"] == "queue_full"
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
        outs = [f + read_all(s) for f, s in zip(firsts, streams[:2])] + [read_all(s) for s in streams[2:]]
        for s in streams:
            s.close()
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    for out, n in zip(outs, lengths):
        events = out.split(b"\r\n\r\n", 1)[1].split(b"\n\n")
        assert events[-2] == b"data: [DONE]"
        ids = [json.loads(e[6:])["choices"][0]["token_ids"] for e in events[:-2] if json.loads(e[6:])["choices"]]
        assert sum(len(i) for i in ids) == n
    draining = [json.loads(line) for line in srv.lines if '"event": "draining"' in line]
    assert draining and draining[0]["in_flight"] >= 4, srv.lines  # SIGTERM came while all four were open
    assert any('"event": "stopped", "unfinished": 0' in line for line in srv.lines)


def test_sigterm_past_the_drain_deadline_ends_streams_with_an_error(host_colibri, load_model):
    srv = Server(host_colibri, load_model, "--slots", "1", "--threads", "1", "--drain-timeout", "100").start()
    try:
        s = stream_request(srv.port, 450)
        first = read_until(s, b"token_ids")
        srv.proc.send_signal(signal.SIGTERM)
        out = first + read_all(s)
        s.close()
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    events = out.split(b"\r\n\r\n", 1)[1].split(b"\n\n")
    assert b"[DONE]" not in out
    last = json.loads(events[-2][6:])
    assert last["error"]["code"] == "shutting_down"


def test_16_clients_against_4_slots(server, host_colibri, load_model):
    want = [generate_ids(host_colibri, load_model, p, MAX_TOKENS, None) for p in PROMPTS]
    before = server.metrics()
    barrier = threading.Barrier(16)
    results: list[tuple[int, object]] = [(0, None)] * 16

    def client_thread(i: int) -> None:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0, timeout=120)
        barrier.wait()
        try:
            r = client.completions.create(model=MODEL_ID, prompt=PROMPTS[i % 4], max_tokens=MAX_TOKENS,
                                          temperature=0)
            results[i] = (200, r.choices[0].token_ids)
        except openai.APIStatusError as e:
            results[i] = (e.status_code, (e.code, e.response.headers.get("retry-after")))

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    ok = [i for i, (s, _) in enumerate(results) if s == 200]
    rejected = [i for i, (s, _) in enumerate(results) if s == 503]
    assert len(ok) + len(rejected) == 16, results
    for i in ok:
        assert results[i][1] == want[i % 4], f"client {i}"
    for i in rejected:
        assert results[i][1] == ("queue_full", "1")
    # all 16 arrived together: 4 generate, 4 wait, so at least 8 answers, and some refusals
    assert len(ok) >= 8 and rejected, results
    wait_idle(server)
    after = server.metrics()
    assert after["colibri_requests_rejected_total"] - before["colibri_requests_rejected_total"] == len(rejected)
    assert after['colibri_requests_total{code="200"}'] - before['colibri_requests_total{code="200"}'] >= len(ok)
    assert after["colibri_generated_tokens_total"] - before["colibri_generated_tokens_total"] == MAX_TOKENS * len(ok)


def test_a_model_without_tokenizer_takes_ids_only(server):
    status, _, body = server.call("POST", "/v1/completions", {"model": MODEL_ID, "prompt": "hi"})
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "tokenizer_unavailable" and err["param"] == "prompt"
    status, _, body = server.call("POST", "/v1/chat/completions",
                                  {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "tokenizer_unavailable" and err["param"] == "messages"
    status, _, body = server.call("POST", "/v1/completions", {"model": MODEL_ID, "prompt": [5, 6],
                                                             "max_tokens": 2, "stop": ["x"]})
    assert status == 400 and json.loads(body)["error"]["param"] == "stop"
    status, _, body = server.call("POST", "/v1/completions", {"model": MODEL_ID, "prompt": [5, 6],
                                                             "max_tokens": 2, "temperature": 0})
    choice = json.loads(body)["choices"][0]
    assert status == 200 and choice["text"] == "" and len(choice["token_ids"]) == 2


def stream_request(port: int, max_tokens: int, prompt: list[int] | None = None) -> socket.socket:
    body = json.dumps({"model": MODEL_ID, "prompt": prompt or PROMPTS[0], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_until(s: socket.socket, marker: bytes) -> bytes:
    out = b""
    while marker not in out:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out
