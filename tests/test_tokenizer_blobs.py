"""From the stored `tokenizer.*` blobs back to a tokenizer.json: the `tokenizers` library built
from it encodes and decodes exactly as the checkpoint's own tokenizer.json (and so as the C
tokenizer, tests/test_tokenizer.py). `invoke smoke` tokenizes its text prompt this way on the
workstation, from the model file alone."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model import tokenizer as T
from colibri_kit.model.format import read_model
from colibri_kit.model.tiny import tiny_tokenizer, write_tiny_model
from test_tokenizer import FAMILIES, VOCAB, _variant

CORPUS = json.loads(H.TOKENIZER_CORPUS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tokenizer.json, trained with the real `tokenizers` (tests/hf_models.py)."""
    root = tmp_path_factory.mktemp("tokblobs")
    out = {}
    for fam in FAMILIES:
        d = root / fam
        base = {"llama3": "qwen2"}.get(fam, "mixtral" if fam.startswith("mixtral") else fam)
        H.train_tokenizer(base, VOCAB, d)
        tj = _variant(fam, json.loads((d / "tokenizer.json").read_text()))
        (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
        out[fam] = d
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_rebuilt_tokenizer_encodes_and_decodes_as_the_original(trained: dict[str, Path], family: str) -> None:
    from tokenizers import Tokenizer

    d = trained[family]
    original = Tokenizer.from_file(str(d / "tokenizer.json"))
    spec = T.load_tokenizer(d)
    assert spec is not None
    rebuilt = T.reference_tokenizer(spec.blobs())
    assert len(CORPUS) > 50
    for text in CORPUS:
        want = original.encode(text)
        assert rebuilt.encode(text).ids == want.ids, (family, text)
        assert rebuilt.encode(text, add_special_tokens=False).ids == original.encode(
            text, add_special_tokens=False).ids, (family, text)
        for skip in (True, False):
            assert rebuilt.decode(want.ids, skip_special_tokens=skip) == original.decode(
                want.ids, skip_special_tokens=skip), (family, text)
    # the spec read back from the blobs is the spec that wrote them
    assert T.spec_from_blobs(spec.blobs()) == spec


def test_tiny_model_tokenizer_agrees_with_the_c_tokenizer(host_colibri: Path, tmp_path: Path) -> None:
    """The built-in tiny model has no tokenizer.json anywhere: the rebuilt one is compared with
    the C tokenizer reading the same file."""
    model = write_tiny_model(tmp_path / "tiny.colibri")
    blobs = {n: read_model(model).metadata(n) for n in
             ("tokenizer.config", "tokenizer.vocab", "tokenizer.merges", "tokenizer.added")}
    assert blobs == tiny_tokenizer().blobs()
    rebuilt = T.reference_tokenizer(blobs)
    for text in CORPUS[:40]:
        if not text:
            continue
        (tmp_path / "in.txt").write_text(text, encoding="utf-8")
        p = subprocess.run([str(host_colibri), "tokenize", str(model), "--text-file", str(tmp_path / "in.txt")],
                           capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        ids = json.loads(p.stdout)["ids"]
        assert rebuilt.encode(text).ids == ids, text
        p = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids", ",".join(map(str, ids))],
                           capture_output=True, timeout=60)
        assert p.returncode == 0 and p.stdout.decode("utf-8") == rebuilt.decode(ids), text


def test_broken_blobs_name_the_blob() -> None:
    blobs = tiny_tokenizer().blobs()
    with pytest.raises(ModelError, match="no tokenizer.vocab blob"):
        T.tokenizer_json_from_blobs({k: v for k, v in blobs.items() if k != "tokenizer.vocab"})
    with pytest.raises(ModelError, match="tokenizer.merges: 5 bytes for 0 merges"):
        T.tokenizer_json_from_blobs({**blobs, "tokenizer.merges": b"12345"})
    cfg = bytearray(blobs["tokenizer.config"])
    struct.pack_into("<I", cfg, 0, 9)
    with pytest.raises(ModelError, match="version 9"):
        T.tokenizer_json_from_blobs({**blobs, "tokenizer.config": bytes(cfg)})
    with pytest.raises(ModelError, match="tokenizer.vocab: does not hold"):
        T.tokenizer_json_from_blobs({**blobs, "tokenizer.vocab": blobs["tokenizer.vocab"][:100]})


def test_model_info_shows_tokenizer_and_chat_template(trained: dict[str, Path], tmp_path: Path) -> None:
    """`invoke model-info` on a file with a Qwen2 tokenizer and the ChatML template, and on one
    with neither."""
    import hashlib
    import os
    import sys

    from chat_templates import TEMPLATES
    from colibri_kit.model import chat
    from colibri_kit.model.tiny import tiny_header, write_random_model, write_text_model
    from colibri_kit.paths import project_root

    template, bos, eos = TEMPLATES["qwen2"]
    spec = T.load_tokenizer(trained["qwen2"])
    assert spec is not None
    model = write_text_model(tmp_path / "chat.colibri", {
        **spec.blobs(), "chat.template": chat.from_template(template, bos, eos).blob()}, 2048)
    bare = write_random_model(tmp_path / "bare.colibri", tiny_header(64))

    def info(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "invoke", "model-info", str(path)], cwd=project_root(),
                              env={**os.environ, "PYTHONPATH": str(project_root())},
                              capture_output=True, text=True, timeout=120)
    r = info(model)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tokenizer"]["model"] == "byte_level_bpe" and doc["tokenizer"]["vocab"] == len(spec.vocab)
    tpl = doc["chat_template"]
    sha = hashlib.sha256(template.encode()).hexdigest()
    # ChatML renders any role name: a developer message too (colibri_kit/model/chat.py probes it)
    assert tpl["source_sha256"] == sha and tpl["roles"] == ["system", "developer", "user", "assistant"]
    assert "start.system" in tpl["keys"] and "gen.user" in tpl["keys"] and "source.sha256" not in tpl["keys"]
    assert tpl["system_message"] and tpl["generation_prompt"]
    # the example is what jinja2 renders for [user "Hello"] with the generation prompt
    assert tpl["example"] == chat.Renderer(template, bos, eos).render(
        [{"role": "user", "content": "Hello"}], True)
    assert f"tokenizer: byte_level_bpe, {len(spec.vocab)} pieces" in r.stderr
    assert f"chat template: system, developer, user, assistant (sha256 {sha[:12]})" in r.stderr
    r = info(bare)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tokenizer"] is None and doc["chat_template"] is None
    assert "tokenizer: none (--ids commands only); chat template: none" in r.stderr
