"""colibri_generate (runtime/src/text/generate.c) and `colibri generate`: streaming that never splits a
UTF-8 character, stop strings across token boundaries, finish reasons, seeds that reproduce on
any thread count, and the shared-model API under several threads."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from colibri_kit.model.tiny import write_tiny_model
from gen_support import gen_driver_build


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen_driver_build(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gen-tiny") / "tiny.colibri")


def stream(driver: Path, model: Path, text: str | bytes, cuts: list[int], max_new: int,
           *stops: str) -> tuple[list[tuple[int, bytes]], str, int, int]:
    raw = text if isinstance(text, bytes) else text.encode()
    out = subprocess.run([str(driver).encode(), b"stream", str(model).encode(), raw,
                          ",".join(map(str, cuts)).encode(), str(max_new).encode(),
                          *(x.encode() for x in stops)], capture_output=True, text=True, check=True,
                         timeout=60).stdout.splitlines()
    chunks = []
    for line in out[:-1]:
        parts = line.split()
        chunks.append((int(parts[0]), bytes.fromhex(parts[1]) if len(parts) > 1 else b""))
    _, finish, n_new, stop_idx = out[-1].split()
    return chunks, finish, int(n_new), int(stop_idx)


TEXT = "Hé😀 wörld 日本 STOP tail"
RAW = TEXT.encode()


def one_byte_cuts() -> list[int]:
    return list(range(len(RAW) + 1))  # token n ends after byte n: every character split


def test_stream_never_splits_a_utf8_character(driver: Path, tiny: Path) -> None:
    chunks, finish, n_new, _ = stream(driver, tiny, TEXT, one_byte_cuts(), len(RAW))
    assert finish == "length" and n_new == len(RAW)
    assert [c[0] for c in chunks][-1] == -1 and len(chunks) == n_new + 1
    for _, c in chunks:
        c.decode("utf-8")  # each piece on its own is valid UTF-8
    assert b"".join(c for _, c in chunks) == RAW
    # the 4-byte emoji arrives whole with its last byte, nothing of it before
    emoji_end = RAW.index("😀".encode()) + 4
    assert chunks[emoji_end - 1][1].endswith("😀".encode())


@pytest.mark.parametrize("cuts", [one_byte_cuts(), [0, 3, 9, 15, 21, 24, 30, len(RAW)]])
def test_stop_string_across_token_boundaries(driver: Path, tiny: Path, cuts: list[int]) -> None:
    chunks, finish, n_new, idx = stream(driver, tiny, TEXT, cuts, 200, "NOPE", "STOP")
    assert finish == "stop" and idx == 1
    text = b"".join(c for _, c in chunks)
    assert text == RAW[: RAW.index(b"STOP")]  # the stop string and what follows are dropped
    # it stopped at the token that completed "STOP", not later
    assert cuts[n_new] >= RAW.index(b"STOP") + 4 and cuts[n_new - 1] < RAW.index(b"STOP") + 4
    for _, c in chunks:
        c.decode("utf-8")


@pytest.mark.parametrize("raw", [b"ok\xff\xe3\x81A\xed\xa0\x80 \xf0\x9f\x98", b"\xc3\xa9\x80\x80z\xf4\x90\x80\x80"])
def test_invalid_utf8_from_the_model_becomes_replacement_characters(driver: Path, tiny: Path,
                                                                    raw: bytes) -> None:
    """As `tokenizers` decodes (from_utf8_lossy = Python's errors="replace"), chunk by chunk."""
    chunks, _, _, _ = stream(driver, tiny, raw, list(range(len(raw) + 1)), len(raw))
    assert b"".join(c for _, c in chunks).decode("utf-8") == raw.decode("utf-8", "replace")


def test_held_back_stop_prefix_is_released_at_the_end(driver: Path, tiny: Path) -> None:
    chunks, finish, _, _ = stream(driver, tiny, "abc ST", [0, 1, 2, 3, 4, 5, 6], 6, "STOP")
    assert finish == "length"
    assert chunks[-2][1] == b"" and chunks[-1] == (-1, b"ST")  # "ST" could have become "STOP"
    assert b"".join(c for _, c in chunks) == b"abc ST"


def run_cli(binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120,
                          check=check)


def test_seed_reproduces_on_any_thread_count(host_colibri: Path, tiny: Path) -> None:
    def ids(threads: int, seed: int) -> list[int]:
        out = run_cli(host_colibri, "--threads", str(threads), "generate", str(tiny), "--ids",
                      "3,17,42,5", "--max-new", "24", "--temperature", "1.5", "--top-k", "50",
                      "--top-p", "0.95", "--seed", str(seed)).stdout
        return json.loads(out)["new_ids"]

    a = ids(1, 7)
    assert a == ids(2, 7) == ids(3, 7)
    assert a != ids(1, 8)


def test_greedy_default_and_finish_reason(host_colibri: Path, tiny: Path) -> None:
    out = json.loads(run_cli(host_colibri, "generate", str(tiny), "--ids", "1,2,3", "--max-new",
                             "5").stdout)
    assert out["finish_reason"] == "length" and len(out["new_ids"]) == 5
    same = json.loads(run_cli(host_colibri, "generate", str(tiny), "--ids", "1,2,3", "--max-new",
                              "5", "--temperature", "0", "--seed", "99").stdout)
    assert same["new_ids"] == out["new_ids"]


def test_bad_sampling_options_are_usage_errors(host_colibri: Path, tiny: Path) -> None:
    for opt, val in (("--temperature", "-1"), ("--top-p", "0"), ("--top-p", "1.5"),
                     ("--min-p", "2"), ("--repeat-penalty", "0"), ("--top-k", "-3"),
                     ("--seed", "x")):
        proc = run_cli(host_colibri, "generate", str(tiny), "--ids", "1", "--max-new", "2", opt,
                       val, check=False)
        assert proc.returncode == 2 and "usage:" in proc.stderr, (opt, val, proc.stderr)


def test_contexts_share_one_model(host_colibri: Path, tiny: Path) -> None:
    """bench-contexts: 4 contexts on one colibri_model, decoding on 4 threads at once."""
    out = json.loads(run_cli(host_colibri, "bench-contexts", str(tiny), "--contexts", "4",
                             "--gen", "8", "--json").stdout)
    assert out["contexts"] == 4 and out["failed"] is False and out["decode_tok_s_total"] > 0


def test_generate_sampler_and_chat_under_sanitizers(tmp_path_factory: pytest.TempPathFactory,
                                                    tiny: Path, tmp_path: Path) -> None:
    """The stream, sampler and chat paths (also malformed blobs) under ASan + UBSan."""
    from chat_templates import TEMPLATES
    from colibri_kit.model.chat import from_template
    from gen_support import c_sample, logits_for_test

    asan = gen_driver_build(tmp_path_factory, sanitize=True)
    chunks, finish, _, _ = stream(asan, tiny, TEXT, [0, 3, 9, 15, 21, 24, 30, len(RAW)], 50, "STOP", "日本")
    assert finish == "stop" and b"".join(c for _, c in chunks) == RAW[: RAW.index("日本".encode())]
    stream(asan, tiny, b"\xf0\x9f\x98\xff\xc3", [0, 1, 2, 3, 4, 5], 5)
    l = logits_for_test(500)
    assert c_sample(asan, l, 50, [1, 2, 3], temperature=0.9, top_k=20, top_p=0.9, min_p=0.01,
                    repeat_penalty=1.2, seed=3) == c_sample(asan, l, 50, [1, 2, 3], temperature=0.9,
                                                           top_k=20, top_p=0.9, min_p=0.01,
                                                           repeat_penalty=1.2, seed=3)
    good = from_template(*TEMPLATES["qwen3"]).blob()
    msgs = "system 6869\nuser 6869\nassistant 6869\nuser 6869\n"
    for blob in (good, good[:-1], good[:9], good[:8] + b"\xff" * 4 + good[12:], b"CHT1\xff\xff\xff\xff"):
        f = tmp_path / "blob"
        f.write_bytes(blob)
        out = subprocess.run([str(asan), "chat", str(f), "1"], input=msgs, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr  # a finding would abort with a report
        assert (out.stdout.startswith("error")) == (blob != good)
