"""A running `colibri serve` for the service tests (tests/test_serve*.py): start on a free port
(--port 0, read from the ready line), talk to it, stop it with a signal and read its log."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from colibri_kit.model import chat
from colibri_kit.model.format import DType, Family, ModelHeader, Routing, padded_dim
from colibri_kit.model.tiny import tiny_header, tiny_tokenizer, write_random_model


class Server:
    """One `colibri serve` process. `prefix` runs it through another program (qemu-aarch64)."""

    def __init__(self, binary: Path, model: Path, *args: str, prefix: tuple[str, ...] = ()) -> None:
        self.argv = [*prefix, str(binary), "serve", str(model), "--port", "0", *args]
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.port = 0
        self._ready = threading.Event()

    def start(self, timeout: float = 60.0) -> "Server":
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(timeout) or not self.port:
            self.proc.kill()
            raise AssertionError(f"colibri serve did not become ready: {self.lines}")
        return self

    def _read(self) -> None:
        assert self.proc and self.proc.stderr
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if '"event": "ready"' in line:
                self.port = json.loads(line)["port"]
                self._ready.set()
        self._ready.set()  # exited before ready

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.proc
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def request_log(self) -> list[dict]:
        """The per-request JSON log lines so far."""
        out = []
        for line in list(self.lines):
            if line.startswith("{") and '"path"' in line:
                out.append(json.loads(line))
        return out

    def wait_log(self, pred, timeout: float = 10.0) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for entry in self.request_log():
                if pred(entry):
                    return entry
            time.sleep(0.05)
        raise AssertionError(f"no matching log line in {self.request_log()[-5:]}")

    def call(self, method: str, path: str, body: object = None, headers: dict | None = None,
             timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
        """One request with http.client; body: dict (sent as JSON), bytes or None."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        conn.close()
        return out

    def metrics(self, headers: dict | None = None) -> dict[str, float]:
        """GET /metrics parsed into {'name{labels}': value}."""
        status, _, body = self.call("GET", "/metrics", headers=headers)
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values


def generate_ids(binary: Path, model: Path, prompt: list[int], max_new: int, eos: int | None) -> list[int]:
    """`colibri generate` (greedy), cut at the first end-of-sequence id as the service stops there."""
    proc = subprocess.run([str(binary), "--threads", "1", "generate", str(model), "--ids",
                           ",".join(map(str, prompt)), "--max-new", str(max_new)],
                          capture_output=True, text=True, timeout=120, check=True)
    ids = json.loads(proc.stdout)["new_ids"]
    if eos is not None and eos in ids:
        ids = ids[: ids.index(eos)]
    return ids


def write_load_model(path: Path, pad: int = 64, metadata: dict[str, bytes] | None = None) -> Path:
    """A random f32 model big enough that a request takes a noticeable time on one thread
    (hidden 256, 4 layers, 8 experts top-2, vocab 2000, context 512; ~30 MB), and no end-of-
    sequence id, so every generation runs to max_tokens. ``metadata``: e.g. the tiny byte-level
    tokenizer's blobs, for text prompts."""
    d = 256
    h = ModelHeader(num_experts=8, expert_size=384, vocab_size=2000, max_seq_len=512, embed_dim=d,
                    n_layers=4, n_heads=8, n_kv_heads=4, head_dim=32, top_k=2,
                    routing=Routing.RENORMALISE, dtype=int(DType.F32),
                    embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=0, norm_eps=1e-6,
                    rope_theta=10000.0, family=Family.OTHER, name="serve-load")
    return write_random_model(path, h, seed=7, metadata=metadata)


# ChatML, the template Qwen checkpoints use, in the minimal form of transformers' chat templating
# guide (docs "Chat templates": the ChatML example).
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
          " + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_chat_model(path: Path) -> Path:
    """The tiny geometry with its byte-level tokenizer (id = byte) and a ChatML chat template."""
    meta = {**tiny_tokenizer().blobs(), "chat.template": chat.from_template(CHATML).blob()}
    return write_random_model(path, tiny_header(64), seed=3, metadata=meta)


def raw(port: int, data: bytes, wait: float = 5.0, half_close: bool = False) -> bytes:
    """Send bytes on a fresh connection (optionally shutdown(SHUT_WR) after them) and read until
    the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def final_response(out: bytes) -> bytes:
    """The response after any interim 1xx responses (RFC 9110 15.2)."""
    while out.startswith(b"HTTP/1.1 1"):
        out = out.split(b"\r\n\r\n", 1)[1]
    return out


class SlowFlood:
    """``n`` connections that each send one byte of a request head every ``step`` seconds and
    never finish it, reconnecting whenever the server closes one: the slow-client attack of
    issue 21 (about 25 such connections turned /health into 503). ``ready`` is set once ``n``
    connections were opened and have sent a byte."""

    HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60000

    def __init__(self, port: int, n: int = 40, step: float = 0.5) -> None:
        self.port, self.n, self.step = port, n, step
        self.ready = threading.Event()
        self.connects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SlowFlood":
        self._thread.start()
        if not self.ready.wait(60):
            raise AssertionError(f"the flood could not open {self.n} connections ({self.connects} connects)")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        socks: list[tuple[socket.socket, int]] = []
        try:
            while not self._stop.is_set():
                while len(socks) < self.n:
                    try:
                        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    except OSError:
                        break
                    s.setblocking(False)
                    socks.append((s, 0))
                    self.connects += 1
                alive = []
                for s, sent in socks:
                    try:
                        s.recv(1, socket.MSG_PEEK)  # returns only once the server answered or closed
                        s.close()
                        continue
                    except BlockingIOError:
                        pass  # nothing from the server yet: still holding its place
                    except OSError:
                        s.close()
                        continue
                    try:
                        s.send(self.HEAD[sent:sent + 1])
                        alive.append((s, sent + 1))
                    except OSError:
                        s.close()
                socks = alive
                if self.connects >= self.n:  # the server may close some at once: that is its defence
                    self.ready.set()
                self._stop.wait(self.step)
        finally:
            for s, _ in socks:
                s.close()


def adversarial_bodies(size: int) -> dict[str, bytes]:
    """Request bodies of about ``size`` bytes built to make a JSON parser or the request decoder
    do more than linear work."""
    def fill(unit, end: str = "") -> str:
        parts, n, i = [], 0, 0
        while n < size:
            parts.append(unit(i))
            n += len(parts[-1]) + 1
            i += 1
        return ",".join(parts) + end

    prefix = "k" * 48  # long common prefixes: every comparison of two keys reads them
    return {
        "distinct-keys-long-prefix": ("{" + fill(lambda i: f'"{prefix}{i:08d}":0') + "}").encode(),
        "duplicate-last": ("{" + fill(lambda i: f'"{prefix}{i:08d}":0', f',"{prefix}00000000":1') + "}").encode(),
        "short-keys": ("{" + fill(lambda i: f'"{i:x}":0') + "}").encode(),
        "keys-in-nested-objects": ("[" + fill(lambda i: '{"a":{"b":{"c":1,"d":2},"e":[1]},"f":0}') + "]").encode(),
        "prompt-ids": ('{"model":"tiny","prompt":[' + fill(lambda i: "1") + "]}").encode(),
        "chat-text-parts": ('{"model":"tiny","messages":[{"role":"user","content":[' +
                            fill(lambda i: '{"type":"text","text":"a"}') + "]}]}").encode(),
    }
