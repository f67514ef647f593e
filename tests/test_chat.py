"""Chat templates: colibri_kit/model/chat.py derives a table from the real templates of every
family (tests/chat_templates.py), and runtime/src/text/chat.c renders conversations byte-identically
to jinja2 (set up as transformers' apply_chat_template sets it up)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from chat_templates import SYSTEM_IN_LAST_TURN, TEMPLATES
from colibri_kit.model.chat import Renderer, TemplateError, decode, from_template
from gen_support import gen_driver_build

SYSTEM = {"role": "system", "content": "You are terse. Answer in one word."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [SYSTEM, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke\nwith two lines."}],
    [SYSTEM, {"role": "user", "content": "  spaced  "}, {"role": "assistant", "content": "ok"},
     {"role": "user", "content": "Ünïcödé 日本語 😀"}, {"role": "assistant", "content": "はい"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"},
     {"role": "user", "content": "g"}, {"role": "assistant", "content": "h"}, {"role": "user", "content": "i"}],
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen_driver_build(tmp_path_factory)


def c_render(driver: Path, blob: Path, messages: list[dict[str, str]], gen: bool) -> str:
    lines = "".join(f"{m['role']} {m['content'].encode().hex() or '-'}\n" for m in messages)
    out = subprocess.run([str(driver), "chat", str(blob), "1" if gen else "0"], input=lines,
                         capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    if out.startswith("error"):
        raise TemplateError(out)
    return bytes.fromhex(out).decode("utf-8")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_c_rendering_is_byte_identical_to_jinja2(driver: Path, tmp_path: Path, name: str) -> None:
    template, bos, eos = TEMPLATES[name]
    ct = from_template(template, bos, eos)
    blob = tmp_path / "chat.template"
    blob.write_bytes(ct.blob())
    assert decode(ct.blob())["source.sha256"] == ct.source_sha256
    jinja = Renderer(template, bos, eos)
    compared = 0
    for conv in CONVERSATIONS:
        for gen in (False, True):
            want = jinja.render(conv, gen)
            if want is None:  # the template refuses it (Mixtral v1: no system role): so must C
                with pytest.raises(TemplateError, match="does not allow"):
                    c_render(driver, blob, conv, gen)
                continue
            assert c_render(driver, blob, conv, gen) == want, (name, conv, gen)
            compared += 1
    assert compared >= 6


def test_known_renderings() -> None:
    """Spot checks against the formats the model cards document."""
    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
            {"role": "user", "content": "Bye"}]
    t, b, e = TEMPLATES["mixtral-v1"]
    assert Renderer(t, b, e).render(conv, False) == "<s>[INST] Hi [/INST]Yo</s>[INST] Bye [/INST]"
    t, b, e = TEMPLATES["qwen2"]
    assert Renderer(t, b, e).render(conv[:1], True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_template_depending_on_far_positions_is_refused() -> None:
    with pytest.raises(TemplateError, match="once and unchanged"):
        from_template(SYSTEM_IN_LAST_TURN, "<s>", "</s>")


def test_template_that_changes_content_is_refused() -> None:
    """Jinja's trim is one of the stored transforms (Qwen3.5 trims every content); upper is not."""
    trim = ("{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] | trim }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}")
    assert from_template(trim).table["xf.start.user"] == "strip"
    upper = trim.replace("| trim", "| upper")
    with pytest.raises(TemplateError, match="changes the content at 'between.user.assistant'|cannot store"):
        from_template(upper)


def test_syntax_error_is_named() -> None:
    with pytest.raises(TemplateError, match="syntax error at line 1"):
        from_template("{% for m in messages %}")


def test_malformed_blob_and_bad_roles_are_errors(driver: Path, tmp_path: Path) -> None:
    t, b, e = TEMPLATES["qwen2"]
    good = from_template(t, b, e).blob()
    blob = tmp_path / "bad"
    for bad in (b"", b"CHT1", good[:-3], b"XXXX" + good[4:], good[:8] + b"\xff\xff\xff\xff" + good[12:]):
        blob.write_bytes(bad)
        with pytest.raises(TemplateError, match="malformed|invalid"):
            c_render(driver, blob, [{"role": "user", "content": "x"}], True)
    blob.write_bytes(good)
    for conv in ([{"role": "assistant", "content": "x"}],
                 [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],
                 [{"role": "tool", "content": "x"}]):
        with pytest.raises(TemplateError, match="expected an optional system|role must be"):
            c_render(driver, blob, conv, True)


@pytest.mark.parametrize("name,template", [("olmoe", "olmoe"), ("qwen3_moe", "qwen3")])
def test_convert_stores_the_template_and_the_runtime_renders_it(
        driver: Path, hf_root: Path, tmp_path: Path, name: str, template: str) -> None:
    """A checkpoint with a chat_template in tokenizer_config.json -> .colibri -> C rendering."""
    import json
    import shutil

    import hf_models
    from colibri_kit.model.convert import TargetModelLimits, convert
    from colibri_kit.model.format import read_model

    src = hf_models.checkpoint(name, hf_root)
    hf = tmp_path / "hf"
    shutil.copytree(src, hf)
    t = TEMPLATES[template][0]
    cfg_path = hf / "tokenizer_config.json"  # the test checkpoints carry trained tokenizers
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    cfg["chat_template"] = t
    if isinstance(cfg.get("eos_token"), str):  # the older {"content": ...} form is read too
        cfg["eos_token"] = {"content": cfg["eos_token"], "special": True}
    cfg_path.write_text(json.dumps(cfg))

    def text(v: object) -> str:
        return (v.get("content", "") if isinstance(v, dict) else v) or ""  # type: ignore[union-attr]

    bos, eos = text(cfg.get("bos_token")), text(cfg.get("eos_token"))
    assert eos
    out = convert(hf, tmp_path / "m.colibri", limits=TargetModelLimits("host", 64, 64, 8),
                  progress=False)
    assert decode(read_model(out).metadata("chat.template"))["start.user"]
    jinja = Renderer(t, bos, eos)
    for conv in CONVERSATIONS[1:4]:
        got = subprocess.run([str(driver), "chat-model", str(out), "1"], capture_output=True, text=True,
                             input="".join(f"{m['role']} {m['content'].encode().hex()}\n" for m in conv),
                             check=True, timeout=30).stdout.strip()
        assert bytes.fromhex(got).decode() == jinja.render(conv, True)
    # --chat-template FILE overrides; a template that cannot be stored fails the conversion
    bad = tmp_path / "bad.jinja"
    bad.write_text(SYSTEM_IN_LAST_TURN)
    with pytest.raises(TemplateError, match="unchanged"):
        convert(hf, tmp_path / "n.colibri", limits=TargetModelLimits("host", 64, 64, 8),
                progress=False, chat_template=bad)
    assert not (tmp_path / "n.colibri").exists()
    # without any template: no blob, and the runtime says so
    del cfg["chat_template"]
    cfg_path.write_text(json.dumps(cfg))
    plain = convert(hf, tmp_path / "p.colibri", limits=TargetModelLimits("host", 64, 64, 8), progress=False)
    assert read_model(plain).metadata("chat.template") is None
    msg = subprocess.run([str(driver), "chat-model", str(plain), "1"], input="user 6869\n",
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert msg.startswith("error") and "no chat template" in msg
