"""Chat templates: from a checkpoint's Jinja `chat_template` to a table the C runtime renders.

The runtime has no Jinja engine. Instead the converter renders the template with jinja2 (set up
the way transformers' `apply_chat_template` sets it up: sandboxed, `trim_blocks`,
`lstrip_blocks`, `raise_exception`) on probe conversations whose contents are unique markers,
and keeps the text the template puts around the contents:

    start.R          before the first message when it has role R (BOS text included)
    between.R.S      between a message of role R and the next one of role S
    last.R.S         the same, when the S message is the conversation's last
    end.R            after the last message (role R), no generation prompt
    gen.R            after the last message (role R) with the generation prompt

Conversations have the shape every supported family uses: an optional system message, then
user and assistant alternating, starting with user (a system message alone is refused when the
template drops it). An entry is absent when the template refuses
that step (e.g. Mixtral's original template raises on a system message); the runtime then refuses
such a conversation naming the step. The table is checked against jinja2 on every conversation
of that shape up to 7 messages, with and without the generation prompt, and on contents with
surrounding spaces and newlines; a template whose text depends on anything else (contents it
trims or inspects, positions further away than the neighbouring message, a system message placed
into a later turn) is refused, naming the first conversation that differs. `--chat-template
FILE` replaces the checkpoint's template.

Blob `chat.template` (docs/format.md): "CHT1", u32 entry count, then per entry u32 key length,
key (ASCII), u32 value length, value (UTF-8); little-endian; keys sorted.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri_kit.errors import ModelError

ROLES = ("system", "user", "assistant")
MAGIC = b"CHT1"
MAX_PROBE = 7  # messages in the longest verified conversation


class TemplateError(ModelError):
    """The template cannot be expressed as a chat.template table (the message says why)."""


def _environment() -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env


class Renderer:
    """A compiled template plus the special-token strings it refers to."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2

        try:
            self.template = _environment().from_string(template)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TemplateError(f"chat template: Jinja syntax error at line {e.lineno}: {e.message}") from e
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str | None:
        """The text, or None when the template refuses the conversation (raise_exception etc.)."""
        import jinja2

        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except (jinja2.exceptions.TemplateError, TypeError, KeyError, IndexError, AttributeError):
            return None


def shapes(max_len: int = MAX_PROBE) -> list[tuple[str, ...]]:
    """Every role sequence of the supported shape: [system] user assistant user ... (1..max_len)."""
    out = []
    for n in range(1, max_len + 1):
        turns = tuple(("user", "assistant")[i % 2] for i in range(n))
        out.append(turns)
        if n < max_len:
            out.append(("system",) + turns)
    out.append(("system",))
    return out


def _marker(i: int) -> str:
    return f"@@MSG{i}@@"


def _segments(text: str, n: int) -> list[str] | None:
    """Split text around markers 0..n-1 (each exactly once, in order); None otherwise."""
    segs, pos = [], 0
    for i in range(n):
        m = _marker(i)
        at = text.find(m, pos)
        if at < 0 or text.count(m) != 1:
            return None
        segs.append(text[pos:at])
        pos = at + len(m)
    segs.append(text[pos:])
    return segs


def derive(r: Renderer) -> dict[str, str]:
    """The table, from the minimal probe for each entry (verify() checks it on everything)."""
    table: dict[str, str] = {}
    for roles in shapes(4):
        for gen in (False, True):
            msgs = [{"role": role, "content": _marker(i)} for i, role in enumerate(roles)]
            text = r.render(msgs, gen)
            if text is None:
                continue
            segs = _segments(text, len(roles))
            if segs is None and roles == ("system",):
                continue  # a lone system message that the template drops: not renderable
            if segs is None:
                raise TemplateError(
                    "chat template does not put each message's content into the text once and "
                    f"unchanged (conversation {list(roles)})")
            keys = [f"start.{roles[0]}"]
            for i in range(1, len(roles)):
                kind = "last" if i == len(roles) - 1 else "between"
                keys.append(f"{kind}.{roles[i - 1]}.{roles[i]}")
            keys.append(f"{'gen' if gen else 'end'}.{roles[-1]}")
            for key, seg in zip(keys, segs):
                if key in table and table[key] != seg:
                    raise TemplateError(
                        f"chat template: the text at {key!r} depends on more than the neighbouring "
                        f"messages ({table[key]!r} vs {seg!r} in conversation {list(roles)}, "
                        f"generation prompt {gen})")
                table[key] = seg
    if "start.user" not in table or "last.user.assistant" not in table:
        raise TemplateError("chat template renders no user/assistant conversation "
                            "(it raised on [user] and [user, assistant])")
    return table


def render_table(table: dict[str, str], messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """What the C runtime does with the table (runtime/src/text/chat.c); raises on a refused step."""
    roles = [m["role"] for m in messages]
    if not messages or tuple(roles) not in set(shapes(len(roles))):
        raise TemplateError(f"conversation roles {roles}: expected an optional system message, then "
                            "user and assistant alternating, starting with user")
    out = []
    for i, m in enumerate(messages):
        if i == 0:
            key = f"start.{m['role']}"
        else:
            key = f"{'last' if i == len(messages) - 1 else 'between'}.{roles[i - 1]}.{m['role']}"
        if key not in table:
            raise TemplateError(f"the chat template does not allow this step ({key})")
        out += [table[key], m["content"]]
    key = f"{'gen' if add_generation_prompt else 'end'}.{roles[-1]}"
    if key not in table:
        raise TemplateError(f"the chat template does not allow this step ({key})")
    out.append(table[key])
    return "".join(out)


def verify(r: Renderer, table: dict[str, str]) -> None:
    """Every conversation shape up to MAX_PROBE messages, two kinds of content, both modes."""
    contents = [lambda i: f"message {i}: hello", lambda i: f"  padded {i}\n\n"]
    for roles, gen, content in itertools.product(shapes(), (False, True), contents):
        msgs = [{"role": role, "content": content(i)} for i, role in enumerate(roles)]
        want = r.render(msgs, gen)
        try:
            got = render_table(table, msgs, gen)
        except TemplateError:
            got = None
        if got is None and roles == ("system",):
            continue  # derive() left it out: the template drops a lone system message
        if want != got:
            what = ("renders it but the table refuses it" if got is None else
                    "refuses it but the table renders it" if want is None else
                    "renders it differently from the table")
            raise TemplateError(
                f"chat template cannot be stored as a table: jinja2 {what} for conversation "
                f"{[m['role'] for m in msgs]} (generation prompt {gen}, contents like "
                f"{msgs[0]['content']!r}); it depends on message contents or on positions beyond "
                "the neighbouring message. Give a simpler template with --chat-template FILE.")


def encode(table: dict[str, str]) -> bytes:
    out = [MAGIC, struct.pack("<I", len(table))]
    for key in sorted(table):
        k, v = key.encode("ascii"), table[key].encode("utf-8")
        out += [struct.pack("<I", len(k)), k, struct.pack("<I", len(v)), v]
    return b"".join(out)


def decode(blob: bytes) -> dict[str, str]:
    if blob[:4] != MAGIC or len(blob) < 8:
        raise ModelError("chat.template: bad magic (expected CHT1)")
    (n,), pos, table = struct.unpack_from("<I", blob, 4), 8, {}
    for _ in range(n):
        parts = []
        for _ in range(2):
            if pos + 4 > len(blob):
                raise ModelError("chat.template: truncated")
            (ln,) = struct.unpack_from("<I", blob, pos)
            if pos + 4 + ln > len(blob):
                raise ModelError("chat.template: truncated")
            parts.append(blob[pos + 4:pos + 4 + ln])
            pos += 4 + ln
        table[parts[0].decode("ascii")] = parts[1].decode("utf-8")
    return table


@dataclass(frozen=True)
class ChatTemplate:
    """A derived, verified template: the table and where it came from."""

    table: dict[str, str]
    source_sha256: str

    def blob(self) -> bytes:
        return encode({**self.table, "source.sha256": self.source_sha256})


def _token_text(v: Any) -> str:
    if isinstance(v, dict):  # {"content": "<s>", ...} in older tokenizer_config.json files
        v = v.get("content", "")
    return v if isinstance(v, str) else ""


def from_template(template: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    r = Renderer(template, bos_token, eos_token)
    table = derive(r)
    verify(r, table)
    return ChatTemplate(table, hashlib.sha256(template.encode("utf-8")).hexdigest())


def from_checkpoint(hf_dir: Path, override: Path | None = None) -> ChatTemplate | None:
    """The checkpoint's template (tokenizer_config.json `chat_template`, or chat_template.jinja),
    or `override`'s text; None when there is none. Raises TemplateError when it cannot be stored."""
    import json

    cfg_path = Path(hf_dir) / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    if override is not None:
        template = Path(override).read_text(encoding="utf-8")
    elif (Path(hf_dir) / "chat_template.jinja").is_file():
        template = (Path(hf_dir) / "chat_template.jinja").read_text(encoding="utf-8")
    else:
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
    if not template:
        return None
    if not isinstance(template, str):
        raise TemplateError(f"{cfg_path}: chat_template must be a string")
    return from_template(template, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token")))


def describe(blob: bytes | None) -> dict[str, Any] | None:
    """A short description of a stored `chat.template` (for `invoke model-info`): the roles and
    keys present, the source template's sha256, and a one-message example rendering; None when
    the file has no template."""
    if blob is None:
        return None
    table = decode(blob)
    sha = table.pop("source.sha256", None)
    roles = sorted({part for key in table for part in key.split(".")[1:] if part in ROLES}, key=ROLES.index)
    try:
        example: str | None = render_table(table, [{"role": "user", "content": "Hello"}], True)
    except TemplateError:
        example = None  # e.g. a template that refuses a lone user message
    return {"roles": roles, "keys": sorted(table), "source_sha256": sha,
            "system_message": "start.system" in table,
            "generation_prompt": any(k.startswith("gen.") for k in table), "example": example}
