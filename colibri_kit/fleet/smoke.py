"""`invoke smoke`: prove each device answers correctly and fast with what is deployed on it.

Per host: the device is the kind the target profile describes; the deployed ``current/bin/colibri``
run on the deployed ``current/model.colibri`` with the profile's fixed prompt gives logits that
match the NumPy reference computed here from the same model file (same sha256) within the dtype's
tolerance, the same top-k tokens, and the same greedy continuation; where the model carries a
tokenizer, ``colibri generate --prompt TEXT_PROMPT --json`` gives the prompt ids, new ids and text
that the `tokenizers` library (rebuilt from the file's ``tokenizer.*`` blobs) and the reference's
greedy generation give here (column ``text``: ``same``, ``DIFFERENT`` or ``no tokenizer``);
``colibri bench --json``
reports a first-token p99 under the profile's threshold (or an explicit override, e.g. for
emulated devices running under qemu). Extra per-host columns (the tuning state) come from
``extra_fields`` callables so other concerns can add to the table without changing this module.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet import release as rel
from colibri_kit.fleet.deploy import HostResult, HostState, host_results
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Remote
from colibri_kit.hashing import file_sha256
from colibri_kit.paths import cache_dir
from colibri_kit.profiles import Profile

# Max |device - reference| relative to max |reference logit|, by the model's weight dtype. The
# reference dequantises exactly as the runtime does; what is left is f32 summation order and, for
# narrower types, the runtime's fused dequantise-multiply paths.
# mxfp4 (gpt-oss, the whole model in it): every weight an exact f32 (an E2M1 value times a power of
# two) on the device, the CPU and in the reference alike, so the f32 bound; a model with mxfp4
# experts only is judged by its other weights' dtype (the header's).
TOLERANCE = {"f32": 1e-4, "f16": 1e-3, "bf16": 1e-3, "int8": 1e-2, "q4": 1e-2, "mxfp4": 1e-4}
TOP_K = 5
# The text check: a fixed prompt (letters, punctuation, a digit run, non-ASCII) and a few new
# tokens, to keep the added device time small. Stop ids end the text early, as on the device.
TEXT_PROMPT = "Colibri says: héllo, 世界 42!"
TEXT_TOKENS = 4
TOKENIZER_BLOBS = ("tokenizer.config", "tokenizer.vocab", "tokenizer.merges", "tokenizer.added")
FETCH_MIN_S = 60.0                 # a model fetch gets this long plus 1 s per MiB
FETCH_MIN_BYTES_PER_S = 1 << 20

ExtraFields = Callable[[Remote, Host], dict[str, str]]


@dataclass
class Expected:
    """What the reference says for one model and prompt (computed once per model sha)."""

    logits: np.ndarray        # [n, V] float32
    greedy: list[int]
    dtype: str


@dataclass
class ExpectedText:
    """What the workstation says for the text prompt: `tokenizers` ids, reference greedy ids
    (cut at the first stop id, which the device does not return), and their decoded text."""

    prompt_ids: list[int]
    ids: list[int]
    text: str


class ReferenceCache:
    """Local model copies (content addressed) and their reference outputs, shared by threads."""

    def __init__(self, local_model: Path | None = None, store: Path | None = None) -> None:
        self.local_model = local_model
        self.local_sha = file_sha256(local_model) if local_model else None
        self.store = store or (cache_dir() / "models")
        self.lock = threading.Lock()
        self.expected: dict[tuple[str, tuple[int, ...], int], Expected] = {}
        self.texts: dict[tuple[str, str, int], ExpectedText | None] = {}

    def model_file(self, remote: Remote, remote_path: str, sha: str, size: int) -> Path:
        if self.local_sha == sha and self.local_model is not None:
            return self.local_model
        if self.local_model is not None:
            raise FleetError(f"{remote.name}: the deployed model is {sha[:12]}, the --model given "
                             f"is {self.local_sha[:12] if self.local_sha else '?'}")
        path = self.store / f"{rel.validate_sha(sha)}.colibri"
        with self.lock:
            if not path.exists() or file_sha256(path) != sha:
                # Fetch the device's copy once; it is content addressed, so any device's will do.
                # At most the size its release records, within a deadline; the partial file goes
                # whatever stops the fetch (an error, Ctrl-C).
                self.store.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp-{secrets.token_hex(4)}")
                try:
                    remote.fetch(remote_path, tmp, max_bytes=size,
                                 timeout=FETCH_MIN_S + size / FETCH_MIN_BYTES_PER_S)
                    if file_sha256(tmp) != sha:
                        raise FleetError(f"{remote.name}: the deployed model does not match its "
                                         f"sha256 {sha[:12]}")
                    os.replace(tmp, path)
                finally:
                    tmp.unlink(missing_ok=True)
        return path

    def expect(self, model: Path, sha: str, ids: tuple[int, ...], greedy_tokens: int) -> Expected:
        from colibri_kit.model.reference import Reference

        key = (sha, ids, greedy_tokens)
        with self.lock:
            if key not in self.expected:
                ref = Reference(model)
                logits = ref.forward(list(ids)).astype(np.float32)
                ref = Reference(model)
                greedy = [int(t) for t in ref.generate(list(ids), greedy_tokens)]
                dtype = _dtype_name(ref)
                self.expected[key] = Expected(logits, greedy, dtype)
            return self.expected[key]


    def expect_text(self, model: Path, sha: str, prompt: str, new_tokens: int) -> ExpectedText | None:
        """None when the model file carries no tokenizer (version 1, or converted without one)."""
        key = (sha, prompt, new_tokens)
        with self.lock:
            if key not in self.texts:
                self.texts[key] = reference_text(model, prompt, new_tokens)
            return self.texts[key]


def reference_text(model: Path, prompt: str, new_tokens: int) -> ExpectedText | None:
    """Tokenize ``prompt`` with `tokenizers` (as transformers' tokenizer(prompt): special tokens
    added), generate greedily with the NumPy reference, decode the new ids skipping special
    tokens (what `colibri generate --prompt --json` prints as text)."""
    from colibri_kit.model.format import read_model
    from colibri_kit.model.reference import Reference
    from colibri_kit.model.tokenizer import reference_tokenizer, spec_from_blobs

    m = read_model(model)
    blobs = {name: m.metadata(name) for name in TOKENIZER_BLOBS}
    if blobs["tokenizer.config"] is None:
        return None
    blobs = {k: v for k, v in blobs.items() if v is not None}
    stops = set(spec_from_blobs(blobs).stop_ids)
    tok = reference_tokenizer(blobs)
    prompt_ids = list(tok.encode(prompt).ids)
    ids = [int(t) for t in Reference(m).generate(prompt_ids, new_tokens)]
    ids = ids[:next((i for i, t in enumerate(ids) if t in stops), len(ids))]
    return ExpectedText(prompt_ids, ids, tok.decode(ids, skip_special_tokens=True))


def check_text(got: dict[str, Any], want: ExpectedText) -> list[str]:
    """Problems (empty when the device's `generate --prompt --json` output matches)."""
    problems = []
    if [int(t) for t in got.get("prompt_ids", [])] != want.prompt_ids:
        problems.append(f"prompt {TEXT_PROMPT!r} tokenizes to {got.get('prompt_ids')} on the device, "
                        f"{want.prompt_ids} with `tokenizers`")
    elif [int(t) for t in got.get("ids", [])] != want.ids:
        problems.append(f"text generation ids {got.get('ids')}, reference {want.ids}")
    if got.get("text") != want.text:
        problems.append(f"generated text {got.get('text')!r}, reference {want.text!r}")
    return problems


def _dtype_name(ref: Any) -> str:
    from colibri_kit.model.format import DType

    try:
        return DType(ref.h.dtype).name.lower()
    except (ValueError, AttributeError):
        return "f32"


def compare_logits(got: np.ndarray, want: np.ndarray, dtype: str) -> tuple[list[str], float]:
    """Problems (empty when they agree) and the relative max error."""
    problems = []
    if got.shape != want.shape:
        return [f"logits shape {got.shape}, reference {want.shape}"], float("inf")
    scale = float(np.max(np.abs(want))) or 1.0
    err = float(np.max(np.abs(got - want))) / scale
    tol = TOLERANCE.get(dtype, TOLERANCE["f32"])
    if not np.isfinite(err) or err > tol:
        problems.append(f"logits differ from the reference: rel. error {err:.2e} > {tol:g} ({dtype})")
    for pos in range(want.shape[0]):
        k = min(TOP_K, want.shape[1])
        want_top = np.argsort(-want[pos], kind="stable")[:k]
        got_top = np.argsort(-got[pos], kind="stable")[:k]
        if want_top[0] != got_top[0] or set(want_top.tolist()) != set(got_top.tolist()):
            problems.append(f"top-{k} at position {pos}: device {got_top.tolist()}, reference {want_top.tolist()}")
            break
    return problems, err


def smoke_host(remote: Remote, host: Host, profile: Profile, refs: ReferenceCache, *,
               max_first_token_ms: float | None = None, bench_runs: int = 5,
               extra_fields: list[ExtraFields] | None = None) -> HostResult:
    res = HostResult(host=host.name, result=HostState.FAILED)
    problems: list[str] = []
    info = rel.identify(remote)
    problems += rel.check_device(info, profile, host.name)
    root = host.root
    current = rel.current_release(remote, root)
    if current is None:
        raise FleetError(f"{host.name}: nothing deployed under {root} (run invoke deploy first)")
    res.release = current
    meta = rel.release_meta(remote, root, current) or {}
    if meta.get("target") not in (None, profile.name):
        problems.append(f"deployed release is for {meta.get('target')}, not {profile.name}")
    sha = meta.get("model_sha256")
    if not sha:
        raise FleetError(f"{host.name}: release {current} has no model (deploy with --model FILE)")
    size = meta.get("model_size")
    if not isinstance(size, int) or size <= 0:
        raise FleetError(f"{host.name}: release {current} records no model size; redeploy it")
    res.model = sha[:12]
    binary = posixpath.join(root, "current", "bin", "colibri")
    model_remote = posixpath.join(root, "current", "model.colibri")
    local_model = refs.model_file(remote, model_remote, sha, size)
    spec = profile.smoke
    ids = tuple(int(i) for i in spec.prompt_ids)
    want = refs.expect(local_model, sha, ids, int(spec.greedy_tokens))
    id_arg = ",".join(str(i) for i in ids)

    out = f"/tmp/colibri-smoke-{secrets.token_hex(6)}.f32"
    try:
        remote.run([binary, "forward", model_remote, "--ids", id_arg, "--logits-out", out], timeout=300)
        raw = remote.read_bytes(out, max_bytes=want.logits.nbytes) or b""
    finally:
        remote.run(["rm", "-f", "--", out], check=False)
    got = np.frombuffer(raw, dtype="<f4")
    if got.size % max(1, len(ids)) == 0:
        got = got.reshape(len(ids), -1)
    logit_problems, err = compare_logits(got, want.logits, want.dtype)
    problems += logit_problems
    res.extra["logits"] = f"{err:.1e}"

    gen = json.loads(remote.run([binary, "generate", model_remote, "--ids", id_arg, "--max-new",
                                 str(spec.greedy_tokens)], timeout=300).stdout)
    new_ids = [int(t) for t in gen.get("new_ids", [])]
    res.extra["greedy"] = "same" if new_ids == want.greedy else "DIFFERENT"
    if new_ids != want.greedy:
        problems.append(f"greedy continuation {new_ids}, reference {want.greedy}")

    want_text = refs.expect_text(local_model, sha, TEXT_PROMPT, TEXT_TOKENS)
    if want_text is None:
        res.extra["text"] = "no tokenizer"
    else:
        got_text = json.loads(remote.run([binary, "generate", model_remote, "--prompt", TEXT_PROMPT,
                                          "--max-new", str(TEXT_TOKENS), "--json"], timeout=300).stdout)
        text_problems = check_text(got_text, want_text)
        res.extra["text"] = "DIFFERENT" if text_problems else "same"
        problems += text_problems

    bench = json.loads(remote.run([binary, "bench", model_remote, "--runs", str(bench_runs), "--json"],
                                  timeout=600).stdout)
    p99 = float(bench.get("first_token_ms_p99", float("nan")))
    limit = float(max_first_token_ms if max_first_token_ms is not None else spec.max_first_token_ms_p99)
    res.extra["p99_ms"] = f"{p99:.1f}/{limit:g}"
    backend = bench.get("backend", {})
    res.extra["backend"] = backend.get("name", "?") if isinstance(backend, dict) else str(backend)
    if not p99 <= limit:
        problems.append(f"first-token p99 {p99:.1f} ms > {limit:g} ms")

    for fn in extra_fields or []:
        try:
            res.extra.update(fn(remote, host))
        except KitError as exc:
            res.extra["note"] = str(exc)

    res.result = HostState.FAILED if problems else HostState.OK
    res.detail = "; ".join(problems) if problems else f"device {info.shown}, L4T {info.l4t_version or '?'}"
    if want_text is None:
        res.detail += "; text not checked: the model file has no tokenizer"
    return res


def smoke(fleet: Fleet, profile: Profile, *, model: Path | None = None,
          max_first_token_ms: float | None = None, bench_runs: int = 5,
          extra_fields: list[ExtraFields] | None = None) -> list[HostResult]:
    refs = ReferenceCache(model)

    def one(remote: Remote, host: Host) -> HostResult:
        return smoke_host(remote, host, profile, refs, max_first_token_ms=max_first_token_ms,
                          bench_runs=bench_runs, extra_fields=extra_fields)
    return host_results(fleet.run(one))


SMOKE_COLUMNS = ["logits", "greedy", "text", "p99_ms", "backend"]
