"""The text calls of the C API (colibri.h): tokenize/detokenize from several threads sharing one
context give the `tokenizers` library's ids and text, under AddressSanitizer and ThreadSanitizer;
and the short fixed-count libFuzzer run of the tokenizer (runtime/fuzz/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from kit_support import runtime_library_sources

import hf_models as H
from colibri_kit.model import tokenizer as T
from colibri_kit.model.tiny import write_text_model

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime"
CORPUS = json.loads(H.TOKENIZER_CORPUS.read_text(encoding="utf-8"))


def _sources() -> list[str]:
    return runtime_library_sources()


@pytest.fixture(scope="module")
def host_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import render_config

    d = tmp_path_factory.mktemp("cfg")
    (d / "colibri_config.h").write_text(render_config(load_profile("host")))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("family,sanitizer", [("qwen2", "address"), ("mixtral", "address"), ("olmoe", "thread")])
def test_threads_share_one_context(tmp_path: Path, host_config: Path, family: str, sanitizer: str) -> None:
    from tokenizers import Tokenizer

    d = tmp_path / family
    H.train_tokenizer(family, 1500, d)
    spec = T.load_tokenizer(d)
    assert spec is not None
    model = write_text_model(d / "m.colibri", spec.blobs(), 1536)
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    blob = bytearray()
    for text in CORPUS:
        raw = text.encode()
        ids = ref.encode(text).ids
        dec = ref.decode(ids, skip_special_tokens=False).encode()
        blob += struct.pack("<I", len(raw)) + raw + struct.pack(f"<I{len(ids)}i", len(ids), *ids)
        blob += struct.pack("<I", len(dec)) + dec
    (tmp_path / "cases.bin").write_bytes(blob)
    exe = tmp_path / "tokenize_threads"
    cc = subprocess.run(["cc", "-std=c11", "-O1", "-g", "-D_GNU_SOURCE", f"-fsanitize={sanitizer}",
                         f"-I{RUNTIME / 'include'}", f"-I{RUNTIME / 'src'}", f"-I{host_config}", "-o", str(exe),
                         str(ROOT / "tests" / "c" / "tokenize_threads.c"), *_sources(), "-lm", "-lpthread", "-ldl"],
                        capture_output=True, text=True, timeout=600)
    assert cc.returncode == 0, cc.stderr[-3000:]
    p = subprocess.run([str(exe), str(model), str(tmp_path / "cases.bin"), "4"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert f"checked {len(CORPUS)} texts x 4 threads, 0 mismatches" in p.stdout
    assert "WARNING: ThreadSanitizer" not in p.stderr and "ERROR: AddressSanitizer" not in p.stderr


@pytest.mark.slow
def test_fuzz_tokenizer_short_run(host_config: Path, tmp_path: Path) -> None:
    """3000 libFuzzer executions of the tokenizer over the exactness corpus: no crash, no report."""
    assert shutil.which("clang-14"), "clang-14 is required (scripts/bootstrap.sh installs it)"
    proc = subprocess.run(["make", "-s", "-C", str(RUNTIME / "fuzz"), f"CONFIG_DIR={host_config}",
                           f"OUT_DIR={tmp_path}", f"PYTHON={sys.executable}", "RUNS=3000", "run-tok"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Done 3000 runs" in proc.stderr
    assert not list(tmp_path.glob("crash-*"))
