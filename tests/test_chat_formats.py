"""The chat formats of gpt-oss (harmony) and the Qwen3 families (Qwen3.5 / 3.6, Qwen3-Next's
2507 templates): the stored tables render byte-identically to jinja2 (apply_chat_template's set
up) with every option, gpt-oss's prompt is openai-harmony's, and the runtime's output split
(runtime/src/text/harmony.c, generate.c's <think> split) agrees with openai-harmony's
StreamableParser on real o200k_harmony token streams, cut at every position."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import real_tokenizers as R
from chat_templates import NEW_TEMPLATES, template_text
from colibri_kit.model.chat import Options, Renderer, decode, from_template
from colibri_kit.model.tiny import write_text_model
from kit_support import runtime_library_sources

ROOT = Path(__file__).resolve().parents[1]
NOW = 1751112000  # 2025-06-28 12:00 UTC: the same day in every time zone within +-11 h
SYSTEM = "Be brief.\nAnswer in English."
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
     {"role": "user", "content": "Tell me a joke\nwith two lines."}],
    [{"role": "system", "content": "  spaced system \n"}, {"role": "user", "content": "\n  Ünïcödé 日本語 😀 \u3000"},
     {"role": "assistant", "content": "<think>\nI thought.\n</think>\n\nはい "}, {"role": "user", "content": "ok\t"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "empty system"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "\n\nd"}],
]
# every code point Python's str.strip() removes (Jinja's trim): the C strip must remove the same
SPACES = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


def build_driver(out: Path, sanitize: bool = False) -> Path:
    """runtime/tests/chat_driver.c with every runtime source, the host config header; with
    sanitize under -fsanitize=address,undefined (a finding aborts the run)."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import write_config

    write_config(load_profile("host"), out / "include")
    rt = ROOT / "runtime"
    exe = out / ("chat_driver_asan" if sanitize else "chat_driver")
    san = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"] if sanitize else []
    subprocess.run(["cc", "-std=c11", "-O1", *san, "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{out / 'include'}", "-o", str(exe), str(rt / "tests" / "chat_driver.c"),
                    *runtime_library_sources(), "-lm", "-lpthread", "-ldl"], check=True, capture_output=True)
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_driver(tmp_path_factory.mktemp("chat-driver"))


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat-real")
    return {f: R.family_dir(f, root) for f in ("o200k_harmony", "qwen3_5")} | {"root": root}


@pytest.fixture(scope="module")
def harmony(real: dict[str, Path]) -> Any:
    """openai-harmony's gpt-oss encoding, reading the o200k file the tests carry (no download)."""
    R.tiktoken_file("o200k_harmony", real["root"])  # writes root/o200k_base.tiktoken
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(real["root"])
    import openai_harmony as H

    return H.load_harmony_encoding(H.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def tables() -> dict[str, Any]:
    return {name: from_template(template_text(name), bos, eos) for name, (bos, eos) in NEW_TEMPLATES.items()}


def carrier(real: dict[str, Path], family: str, template: str, out: Path) -> Path:
    """A small model carrying the family's real tokenizer and the template's table."""
    from colibri_kit.model import tokenizer as T

    spec = T.load_tokenizer(real[family])
    assert spec is not None
    bos, eos = NEW_TEMPLATES[template]
    blobs = {**spec.blobs(), "chat.template": from_template(template_text(template), bos, eos).blob()}
    return write_text_model(out, blobs, len(spec.vocab))


def c_render_many(driver: Path, blob: Path, cases: list[tuple[list[dict[str, str]], bool, Options]]) -> list[str | None]:
    lines = []
    for msgs, gen, o in cases:
        think = -1 if o.enable_thinking is None else int(o.enable_thinking)
        lines.append(f"{int(gen)} {think} {o.reasoning_effort or '-'} {int(o.now)} {len(msgs)}\n")
        lines += [f"{m['role']} {m['content'].encode().hex() or '-'}\n" for m in msgs]
    out = subprocess.run([str(driver), "render", str(blob)], input="".join(lines), capture_output=True,
                         text=True, check=True, timeout=60).stdout.splitlines()
    assert len(out) == len(cases)
    return [None if line.startswith("error") else (bytes.fromhex(line).decode() if line != "-" else "")
            for line in out]


def test_templates_are_the_published_texts() -> None:
    """Qwen3.5-35B-A3B's file hashes to the SHA256 published with its copy (chat_templates.py)."""
    for name in NEW_TEMPLATES:
        from chat_templates import SHA256

        assert hashlib.sha256(template_text(name).encode()).hexdigest() == SHA256[name], name


@pytest.mark.parametrize("name", sorted(NEW_TEMPLATES))
def test_c_renders_the_new_templates_as_jinja2(driver: Path, tables: dict[str, Any], tmp_path: Path, name: str) -> None:
    ct = tables[name]
    blob = tmp_path / "chat.template"
    blob.write_bytes(ct.blob())
    bos, eos = NEW_TEMPLATES[name]
    jinja = Renderer(template_text(name), bos, eos)
    convs = CONVERSATIONS + [[{"role": "user", "content": f"{SPACES}trimmed{SPACES}"}]]
    cases = [(conv, gen, Options(enable_thinking=think, reasoning_effort=effort, now=NOW))
             for conv in convs for gen in (False, True) for think in (None, True, False)
             for effort in (None, "low", "high")]
    got = c_render_many(driver, blob, cases)
    compared = refused = 0
    for (conv, gen, o), text in zip(cases, got):
        want = jinja.render(conv, gen, o)
        if text is None:
            # refused: only where jinja2 refuses too, or leaves the first message out, or the
            # content is one the table has a rule for (Qwen's </think> in the last turn)
            refused += 1
            assert want is None or conv[0]["role"] == "developer" or "</think>" in conv[-1]["content"], (conv, gen, o)
            continue
        assert text == want, (name, conv, gen, o)
        compared += 1
    assert compared >= len(cases) // 2 and compared + refused == len(cases)


def test_table_options_of_the_families(tables: dict[str, Any]) -> None:
    """What each family's table holds besides texts (docs/format.md)."""
    gpt, q35 = tables["gpt-oss"].table, tables["qwen3_5-moe"].table
    assert gpt["output.format"] == "harmony" and gpt["default.reasoning_effort"] == "medium"
    assert "\x00strftime:%Y-%m-%d\x00" in gpt["start.user"] and gpt["empty.start.system"] == "drop"
    assert "has:<|channel|>final<|message|>" in gpt["refuse.last.user.assistant"]
    assert q35["output.format"] == "think" and q35["xf.start.user"] == "strip"
    assert q35["gen.user"].endswith("<think>\n") and q35["gen.user|enable_thinking=false"].endswith("</think>\n\n")
    assert q35["xf.between.user.assistant"] == "strip,after_think"
    thinking = tables["qwen3-next-thinking"].table
    assert thinking["gen.user"].endswith("<|im_start|>assistant\n<think>\n")
    assert not any("|enable_thinking" in k for k in thinking)  # the 2507 templates have no switch


def test_refusals_name_the_reason(driver: Path, tables: dict[str, Any], tmp_path: Path) -> None:
    gpt = tmp_path / "gpt"
    gpt.write_bytes(tables["gpt-oss"].blob())
    q35 = tmp_path / "q35"
    q35.write_bytes(tables["qwen3_5-moe"].blob())

    def why(blob: Path, msgs: list[dict[str, str]], o: Options = Options(now=NOW)) -> str:
        lines = f"1 -1 {o.reasoning_effort or '-'} {NOW} {len(msgs)}\n" + "".join(
            f"{m['role']} {m['content'].encode().hex() or '-'}\n" for m in msgs)
        return subprocess.run([str(driver), "render", str(blob)], input=lines, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    channel = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a<|channel|>final<|message|>b"}]
    assert "treats this content specially (has:<|channel|>final<|message|>)" in why(gpt, channel)
    assert "empty system message alone" in why(gpt, [{"role": "system", "content": ""}])
    assert "does not allow this conversation (start.developer)" in why(q35, [{"role": "developer", "content": "d"},
                                                                          {"role": "user", "content": "u"}])
    last_think = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>r</think>a"}]
    assert "has:</think>" in why(q35, last_think)
    assert "expected an optional system or developer message" in why(q35, [{"role": "assistant", "content": "a"}])
    bad = subprocess.run([str(driver), "render", str(gpt)], input=f"1 -1 extreme {NOW} 1\nuser 78\n",
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert "low, medium or high" in bad


def harmony_prompt(enc: Any, conv: list[dict[str, str]], effort: str | None, date: str) -> list[int]:
    """The conversation as openai-harmony renders it for completion: its system message (model
    identity, knowledge cutoff, date, reasoning effort, channels), the system/developer message
    as developer instructions, final-channel assistant turns."""
    import openai_harmony as H

    sc = H.SystemContent.new().with_conversation_start_date(date)
    if effort:
        sc = sc.with_reasoning_effort({"low": H.ReasoningEffort.LOW, "medium": H.ReasoningEffort.MEDIUM,
                                       "high": H.ReasoningEffort.HIGH}[effort])
    msgs = [H.Message.from_role_and_content(H.Role.SYSTEM, sc)]
    for m in conv:
        if m["role"] in ("system", "developer"):
            if m["content"]:
                msgs.append(H.Message.from_role_and_content(
                    H.Role.DEVELOPER, H.DeveloperContent.new().with_instructions(m["content"])))
        elif m["role"] == "user":
            msgs.append(H.Message.from_role_and_content(H.Role.USER, m["content"]))
        else:
            msgs.append(H.Message.from_role_and_content(H.Role.ASSISTANT, m["content"]).with_channel("final"))
    return list(enc.render_conversation_for_completion(H.Conversation.from_messages(msgs), H.Role.ASSISTANT))


def test_gpt_oss_prompt_is_openai_harmonys(driver: Path, tables: dict[str, Any], harmony: Any,
                                           real: dict[str, Path], tmp_path: Path) -> None:
    """The table's text, tokenized by colibri's tokenizer, gives openai-harmony's ids."""
    import tokenizer_lib as L
    from colibri_kit.model import tokenizer as T

    blob = tmp_path / "gpt"
    blob.write_bytes(tables["gpt-oss"].blob())
    lib = L.build(tmp_path)
    spec = T.load_tokenizer(real["o200k_harmony"])
    tok = L.CTokenizer(lib, spec)
    date = time.strftime("%Y-%m-%d", time.localtime(NOW))
    convs = [c for c in CONVERSATIONS if "</think>" not in "".join(m["content"] for m in c)]
    cases = [(conv, True, Options(reasoning_effort=e, now=NOW)) for conv in convs for e in (None, "low", "high")]
    compared = 0
    for (conv, _, o), text in zip(cases, c_render_many(driver, blob, cases)):
        assert text is not None, conv
        want = harmony_prompt(harmony, conv, o.reasoning_effort, date)
        assert tok.encode(text.encode()) == want, (conv, o, text, harmony.decode(want))
        compared += 1
    assert compared == len(cases)


# ---- the output split -------------------------------------------------------------------------

HARMONY_OUTPUTS = [
    "<|channel|>analysis<|message|>The user greets. Reply with 😀 and 日本語.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! 😀 こんにちは、世界。<|return|>",
    "<|channel|>final<|message|>Just the answer: 42 🎉🎉<|return|>",
    "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant<|channel|>commentary "
    "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Zürich\"}<|call|>",
    "<|channel|>commentary<|message|>Checking…<|end|><|start|>assistant to=functions.lookup<|channel|>commentary "
    "json<|message|>{}<|call|>",
    "<|channel|>analysis<|message|>Long thought\n\nwith blank lines and ünïcödé<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.\n<|return|>",
    "<|channel|>final<|message|>cut off in the midd",
]


def c_stream(driver: Path, model: Path, fmt: int, start: int, streams: list[tuple[bool, list[int]]]) -> list[list[tuple]]:
    text = "".join(f"{int(end)} {' '.join(map(str, ids))}\n" for end, ids in streams)
    out = subprocess.run([str(driver), "stream", str(model), str(fmt), str(start)], input=text,
                         capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()
    runs, cur = [], []
    for line in out:
        if line == "done":
            runs.append(cur)
            cur = []
            continue
        f = line.split(" ")
        if f[0] == "chunk":
            text_ = bytes.fromhex(f[6]).decode() if f[6] != "-" else ""
            cur.append(("chunk", int(f[1]), int(f[2]), int(f[3]), "" if f[4] == "-" else f[4],
                        "" if f[5] == "-" else f[5], text_))
        elif f[0] == "token":
            cur.append(("token", int(f[1]), bytes.fromhex(f[2]).decode() if f[2] != "-" else ""))
        else:
            raise AssertionError(line)
    assert len(runs) == len(streams)
    return runs


def messages_of(chunks: list[tuple]) -> list[tuple[str, str, str]]:
    """(channel, recipient, text) per message from the C chunks."""
    out: dict[int, list[Any]] = {}
    for c in chunks:
        if c[0] == "chunk":
            m = out.setdefault(c[3], [c[4], c[5], ""])
            m[2] += c[6]
    return [tuple(out[k]) for k in sorted(out)]


def harmony_state(enc: Any, ids: list[int], end: bool) -> tuple[list[tuple[str, str, str]], list[tuple[int, str]]]:
    """openai-harmony's StreamableParser on ids: the messages (completed, then the current one as
    far as it decodes) with non-empty text, and the content deltas (token index, text)."""
    import openai_harmony as H

    p = H.StreamableParser(enc, H.Role.ASSISTANT)
    deltas = []
    for i, t in enumerate(ids):
        p.process(t)
        d = p.last_content_delta
        if d:
            deltas.append((i + 1, d))
    msgs = [(m.channel or "", m.recipient or "", m.content[0].text) for m in p.messages]
    if p.state == H.StreamState.CONTENT:
        if end:
            p.process_eos()
            msgs = [(m.channel or "", m.recipient or "", m.content[0].text) for m in p.messages]
        else:
            msgs.append((p.current_channel or "", p.current_recipient or "", p.current_content))
    return [m for m in msgs if m[2]], deltas


def test_harmony_split_is_openai_harmonys_at_every_cut(driver: Path, harmony: Any, real: dict[str, Path],
                                                       tmp_path: Path) -> None:
    model = carrier(real, "o200k_harmony", "gpt-oss", tmp_path / "gpt.colibri")
    streams: list[tuple[bool, list[int]]] = []
    for text in HARMONY_OUTPUTS:
        ids = harmony.encode(text, allowed_special="all")
        streams += [(False, ids[:k]) for k in range(1, len(ids) + 1)] + [(True, ids)]
    runs = c_stream(driver, model, 1, 0, streams)
    for (end, ids), chunks in zip(streams, runs):
        want, deltas = harmony_state(harmony, ids, end)
        assert messages_of(chunks) == want, (harmony.decode(ids), chunks)
        got_deltas = [(c[1], c[6]) for c in chunks if c[0] == "chunk"]
        if not end:  # streamed as openai-harmony streams: the same text at the same token
            assert got_deltas == deltas, harmony.decode(ids)
        # on_token: once per id, the content kinds only
        tokens = [c for c in chunks if c[0] == "token"]
        assert [t[1] for t in tokens][:len(ids)] == ids[:len(tokens)] or not tokens
        content = "".join(t[2] for t in tokens)
        assert content == "".join(m[2] for m in messages_of(chunks) if m[0] in ("final", "commentary", "")
                                  and not m[1])
    # some ids of these texts are parts of a character: the split held them back
    ids = [t for text in HARMONY_OUTPUTS for t in harmony.encode(text, allowed_special="all")]
    assert any(_partial_utf8(harmony, t) for t in ids)


def _partial_utf8(enc: Any, t: int) -> bool:
    try:
        enc.decode_utf8([t])
        return False
    except Exception:  # noqa: BLE001 (openai-harmony raises on a token that is part of a character)
        return True


def think_reference(text: str, start_in_reasoning: bool) -> tuple[str, str]:
    """(reasoning, content) as the Qwen3 families' templates read an assistant message back:
    the text before </think> (after <think>) stripped of newlines, the rest lstripped of them."""
    if not start_in_reasoning:
        if not text.startswith("<think>"):
            return "", text
        text = text[len("<think>"):]
    if "</think>" not in text:
        return text.lstrip("\n"), ""
    r, c = text.split("</think>", 1)
    return r.strip("\n"), c.lstrip("\n")


THINK_OUTPUTS = [
    (True, "Let me think about 😀 and 日本語.\nStep two.\n\n</think>\n\nThe answer is 42."),
    (True, "\n\n</think>\n\nNo reasoning at all."),
    (False, "<think>\nhmm 🤔\n</think>\n\nok"),
    (False, "Plain answer with </think> inside and <think> too."),
    (False, "<thinking is not a tag"),
    (True, "unterminated reasoning\n\n"),
]


def test_think_split_at_every_cut(driver: Path, real: dict[str, Path], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    model = carrier(real, "qwen3_5", "qwen3_5-moe", tmp_path / "q35.colibri")
    tk = Tokenizer.from_file(str(real["qwen3_5"] / "tokenizer.json"))
    for start, text in THINK_OUTPUTS:
        ids = tk.encode(text).ids
        assert tk.decode(ids) == text
        streams = [(False, ids[:k]) for k in range(1, len(ids) + 1)] + [(True, ids)]
        runs = c_stream(driver, model, 2, int(start), streams)
        want_r, want_c = think_reference(text, start)
        final = runs[-1]
        got_r = "".join(c[6] for c in final if c[0] == "chunk" and c[2] == 1)
        got_c = "".join(c[6] for c in final if c[0] == "chunk" and c[2] == 0)
        if "</think>" in text or not start:
            assert (got_r, got_c) == (want_r, want_c), text
        else:  # cut off inside the reasoning: nothing is lost (its trailing newlines included)
            assert got_r == text.lstrip("\n") and got_c == ""
        for (_, prefix), chunks in zip(streams[:-1], runs[:-1]):  # a stream never takes back text
            r = "".join(c[6] for c in chunks if c[0] == "chunk" and c[2] == 1)
            c = "".join(c[6] for c in chunks if c[0] == "chunk" and c[2] == 0)
            assert got_r.startswith(r) and got_c.startswith(c), (prefix, r, c)
            assert "</think>" not in r and ("</think>" not in c or "inside" in text)


def test_hostile_streams_and_blobs_under_sanitizers(tables: dict[str, Any], harmony: Any, real: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """Whatever a model writes (markers anywhere, a header that never ends) and whatever a model
    file holds (a chat.template cut anywhere): no memory error, no undefined behaviour."""
    import random

    exe = build_driver(tmp_path, sanitize=True)
    rng = random.Random(7)
    marks = [harmony.encode(t, allowed_special="all")[0] for t in
             ("<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|constrain|>", "<|return|>", "<|call|>")]
    junk = [(True, [rng.choice(marks) if rng.random() < 0.3 else rng.randrange(0, 199990)
                    for _ in range(rng.randrange(1, 300))]) for _ in range(40)]
    junk.append((True, [marks[0]] + [1000] * 3000 + [marks[3], 1001, marks[5]]))  # a 3000-token header
    model = carrier(real, "o200k_harmony", "gpt-oss", tmp_path / "gpt.colibri")
    assert len(c_stream(exe, model, 1, 0, junk)) == len(junk)
    q35 = carrier(real, "qwen3_5", "qwen3_5-moe", tmp_path / "q35.colibri")
    assert len(c_stream(exe, q35, 2, 1, [(True, [rng.randrange(0, 248000) for _ in range(200)])
                                         for _ in range(10)])) == 10
    blob = tables["gpt-oss"].blob()
    cut = tmp_path / "cut"
    for n in range(0, len(blob), max(1, len(blob) // 150)):
        cut.write_bytes(blob[:n])
        r = subprocess.run([str(exe), "render", str(cut)], input="1 -1 - 0 1\nuser 6869\n", capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.startswith("error"), (n, r.stdout, r.stderr[-2000:])


# ---- colibri generate --chat -----------------------------------------------------------------

def run_cli(colibri: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(colibri), *args], capture_output=True, text=True, timeout=300)


def test_generate_chat_gpt_oss(host_colibri: Path, harmony: Any, real: dict[str, Path], tmp_path: Path) -> None:
    """--chat renders openai-harmony's prompt (today's date, the effort asked) and --json carries
    the split output next to the raw text; the tiny model's weights are random, so its output is
    whatever it is: what is checked is that the split accounts for every message of it."""
    model = carrier(real, "o200k_harmony", "gpt-oss", tmp_path / "gpt.colibri")
    before = time.strftime("%Y-%m-%d")
    r = run_cli(host_colibri, "generate", str(model), "--prompt", "Hi", "--chat", "--system", SYSTEM,
                "--reasoning-effort", "high", "--max-new", "24", "--json", "--threads", "1")
    after = time.strftime("%Y-%m-%d")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    assert out["prompt_ids"] in (harmony_prompt(harmony, conv, "high", before),
                                 harmony_prompt(harmony, conv, "high", after))
    assert out["reasoning_format"] == "harmony" and {"reasoning", "raw", "tool_call_text"} <= set(out)
    want, _ = harmony_state(harmony, out["ids"], True) if _parses(harmony, out["ids"]) else (None, None)
    if want is not None:
        assert out["text"] == "".join(m[2] for m in want if m[0] != "analysis" and not m[1])
        assert out["reasoning"] == "".join(m[2] for m in want if m[0] == "analysis" and not m[1])
    bad = run_cli(host_colibri, "generate", str(model), "--prompt", "Hi", "--show-reasoning")
    assert bad.returncode == 2 and "need --chat" in bad.stderr
    bad = run_cli(host_colibri, "generate", str(model), "--prompt", "Hi", "--chat", "--reasoning-effort", "max")
    assert bad.returncode == 2 and "low, medium or high" in bad.stderr


def _parses(enc: Any, ids: list[int]) -> bool:
    import openai_harmony as H

    p = H.StreamableParser(enc, H.Role.ASSISTANT)
    try:
        for t in ids:
            p.process(t)
        return True
    except Exception:  # noqa: BLE001 (random weights write malformed harmony: no reference)
        return False


def test_generate_chat_qwen35_thinking_switch(host_colibri: Path, real: dict[str, Path], tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    model = carrier(real, "qwen3_5", "qwen3_5-moe", tmp_path / "q35.colibri")
    tk = Tokenizer.from_file(str(real["qwen3_5"] / "tokenizer.json"))
    jinja = Renderer(template_text("qwen3_5-moe"))
    for flag, think in (("on", True), ("off", False)):
        r = run_cli(host_colibri, "generate", str(model), "--prompt", " Hi ", "--chat", "--thinking", flag,
                    "--max-new", "12", "--json", "--threads", "1")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        want = jinja.render([{"role": "user", "content": " Hi "}], True, Options(enable_thinking=think))
        assert out["prompt_ids"] == tk.encode(want).ids
        assert out["reasoning_format"] == "think"
        # the split of what the model wrote (as text): it starts inside <think> when thinking is on
        written = tk.decode(out["ids"], skip_special_tokens=True)
        want_r, want_c = think_reference(written, think)
        if "</think>" not in written and think:
            want_r, want_c = written.lstrip("\n"), ""
        assert (out["reasoning"], out["text"]) == (want_r, want_c)


# ---- colibri serve: reasoning_content ---------------------------------------------------------

@pytest.fixture(scope="module")
def served(host_colibri: Path, real: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    from serve_support import Server

    root = tmp_path_factory.mktemp("chat-serve")
    servers = {}
    for family, template in (("qwen3_5", "qwen3_5-moe"), ("o200k_harmony", "gpt-oss")):
        model = carrier(real, family, template, root / f"{template}.colibri")
        servers[template] = Server(host_colibri, model, "--threads", "1").start()
    yield servers
    for s in servers.values():
        s.stop()


def _client(server: Any) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=120)


def test_serve_qwen35_reasoning_content(served: dict[str, Any], real: dict[str, Path]) -> None:
    """Thinking on (the template opens <think>): what the model writes is reasoning until it
    closes the block; off (chat_template_kwargs, as vLLM takes it): all of it is content. The
    streamed deltas add up to the non-streamed message."""
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(real["qwen3_5"] / "tokenizer.json"))
    client = _client(served["qwen3_5-moe"])
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    for think in (True, False):
        extra = {"chat_template_kwargs": {"enable_thinking": think}, "seed": 3}
        r = client.chat.completions.create(model="qwen3_5-moe", messages=msgs, max_tokens=16,
                                           temperature=0.8, extra_body=extra)
        m = r.choices[0].message
        reasoning = m.model_extra["reasoning_content"]
        written = tk.decode(r.choices[0].model_extra["token_ids"], skip_special_tokens=True)
        want_r, want_c = think_reference(written, think)
        if think and "</think>" not in written:
            want_r, want_c = written.lstrip("\n"), ""
        assert (reasoning, m.content) == (want_r, want_c), written
        stream = client.chat.completions.create(model="qwen3_5-moe", messages=msgs, max_tokens=16,
                                                temperature=0.8, extra_body=extra, stream=True)
        got_r = got_c = ""
        for ev in stream:
            if not ev.choices:
                continue
            d = ev.choices[0].delta
            got_c += d.content or ""
            got_r += (d.model_extra or {}).get("reasoning_content") or ""
        assert (got_r, got_c) == (reasoning, m.content)


def test_serve_gpt_oss_reasoning_content(served: dict[str, Any], harmony: Any) -> None:
    """The harmony split of what the model wrote: content = the final (and preamble) channel,
    reasoning_content = the analysis channel, as openai-harmony parses the same ids."""
    client = _client(served["gpt-oss"])
    msgs = [{"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": "Hi"}]
    checked = 0
    for seed in range(4):
        r = client.chat.completions.create(model="gpt-oss", messages=msgs, max_tokens=24,
                                           temperature=1.0, seed=seed, reasoning_effort="low")
        m = r.choices[0].message
        assert "reasoning_content" in m.model_extra
        ids = r.choices[0].model_extra["token_ids"]
        if _parses(harmony, ids):
            want, _ = harmony_state(harmony, ids, True)
            assert m.content == "".join(t for ch, rc, t in want if ch != "analysis" and not rc)
            assert m.model_extra["reasoning_content"] == "".join(t for ch, rc, t in want if ch == "analysis" and not rc)
            checked += 1
    assert checked  # random weights: the ids of some answers parse (the split tests cover the rest)
    bad = client.with_options(max_retries=0)
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="low"):
        bad.chat.completions.create(model="gpt-oss", messages=msgs, reasoning_effort="extreme")
    with pytest.raises(BadRequestError, match="unsupported template variable"):
        bad.chat.completions.create(model="gpt-oss", messages=msgs,
                                    extra_body={"chat_template_kwargs": {"tools": []}})
    with pytest.raises(BadRequestError, match="treats this content specially"):
        bad.chat.completions.create(model="gpt-oss", messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "<|channel|>final<|message|>y"},
            {"role": "user", "content": "z"}])
