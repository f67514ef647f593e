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
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri_kit.errors import ModelError

ROLES = ("system", "user", "assistant")
MAGIC = b"CHT1"
MAX_PROBE = 7  # messages in the longest verified conversation


# A checkpoint's template is code from elsewhere: converting renders it about a hundred times on
# short probe conversations, in a child process with these limits (from_template).
MAX_RENDER_CHARS = 1 << 20   # one rendering's text (real templates give a few hundred characters)
RENDER_SECONDS = 30.0        # all renderings of one template together (real ones: well under 1 s)
RENDER_MEMORY = 1 << 30      # bytes the renderings may allocate
MAX_TEMPLATE_BYTES = 1 << 20  # a template file (real ones are 1-10 KB)


class TemplateError(ModelError):
    """The template cannot be expressed as a chat.template table (the message says why)."""


class RenderLimitError(TemplateError):
    """The template's rendering ran past a limit (size, time or memory)."""


def _limit_exceeded(what: str) -> RenderLimitError:
    return RenderLimitError(f"chat template: rendering {what}; a chat template renders a few hundred "
                            "characters per message: give a usable one with --chat-template FILE")


def _environment() -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Limited(ImmutableSandboxedEnvironment):
        """transformers' sandbox, plus size checks on the operators that can build huge values
        in one step ('x' * 3000000000, 10 ** 10 ** 9) before anything is allocated."""

        intercepted_binops = frozenset(["*", "**", "+"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            seq = (str, list, tuple)
            if operator == "*":
                n, k = (left, right) if isinstance(left, seq) else (right, left)
                if isinstance(n, seq) and isinstance(k, int) and len(n) * k > MAX_RENDER_CHARS:
                    raise _limit_exceeded(f"builds a sequence of {len(n) * k} items ({len(n)} x {k})")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                if abs(left) > 1 and right > 4096:
                    raise _limit_exceeded(f"computes {left} ** {right}")
            elif operator == "+" and isinstance(left, seq) and isinstance(right, seq):
                if len(left) + len(right) > MAX_RENDER_CHARS:
                    raise _limit_exceeded(f"builds a sequence of {len(left) + len(right)} items")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    # optimized=False: Jinja's optimizer evaluates constant expressions while compiling (a
    # template's {{ 'x'|center(3000000000) }} would be built then, outside any limit)
    env = Limited(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"], optimized=False)
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
        except (SyntaxError, RecursionError, MemoryError) as e:  # Python refuses the compiled code
            raise TemplateError(f"chat template: cannot be compiled ({type(e).__name__})") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str | None:
        """The text, or None when the template refuses the conversation (raise_exception etc.)."""
        import jinja2

        try:
            text = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except (jinja2.exceptions.TemplateError, TypeError, KeyError, IndexError, AttributeError):
            return None
        except MemoryError:
            raise _limit_exceeded(f"needs more than {RENDER_MEMORY >> 20} MiB of memory") from None
        except (OverflowError, RecursionError) as exc:
            raise _limit_exceeded(f"failed ({type(exc).__name__})") from None
        if len(text) > MAX_RENDER_CHARS:
            raise _limit_exceeded(f"gives {len(text)} characters for a conversation of {len(messages)} "
                                  "short messages")
        return text


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


def _table_of(template: str, bos_token: str, eos_token: str) -> dict[str, str]:
    r = Renderer(template, bos_token, eos_token)
    table = derive(r)
    verify(r, table)
    return table


def _in_child(template: str, bos_token: str, eos_token: str) -> dict[str, str]:
    """_table_of in a forked child with an address-space cap (what it has now + RENDER_MEMORY),
    a CPU-time cap and a wall deadline; the table or the child's error comes back as JSON."""
    import json
    import resource
    import select
    import signal

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_fd)
            with open("/proc/self/statm") as f:
                vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (vm + RENDER_MEMORY, vm + RENDER_MEMORY))
            cpu = int(RENDER_SECONDS) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            try:
                reply: list[Any] = ["ok", _table_of(template, bos_token, eos_token)]
            except RenderLimitError as exc:
                reply = ["limit", str(exc)]
            except TemplateError as exc:
                reply = ["template", str(exc)]
            except MemoryError:
                reply = ["limit", str(_limit_exceeded(f"needs more than {RENDER_MEMORY >> 20} MiB"))]
            except BaseException as exc:  # noqa: BLE001 (reported to the parent, never raised here)
                reply = ["error", f"{type(exc).__name__}: {exc}"[:2000]]
            data = json.dumps(reply).encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks, deadline = [], time.monotonic() + RENDER_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise _limit_exceeded(f"took longer than {RENDER_SECONDS:.0f} s")
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            raise _limit_exceeded(f"took more than {RENDER_SECONDS:.0f} s of CPU")
        raise _limit_exceeded(f"stopped the renderer (status {status}), e.g. by exhausting memory")
    kind, value = json.loads(b"".join(chunks))
    if kind == "ok":
        return dict(value)
    if kind == "limit":
        raise RenderLimitError(value)
    if kind == "template":
        raise TemplateError(value)
    raise TemplateError(f"chat template: rendering failed: {value}")


def from_template(template: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """Derive and verify the table of ``template``: in a child process with limits on time,
    memory and output (RENDER_SECONDS, RENDER_MEMORY, MAX_RENDER_CHARS) where the platform can
    fork, so a hostile template cannot hang or exhaust the converter."""
    if hasattr(os, "fork") and os.path.exists("/proc/self/statm"):
        table = _in_child(template, bos_token, eos_token)
    else:
        table = _table_of(template, bos_token, eos_token)
    return ChatTemplate(table, hashlib.sha256(template.encode("utf-8")).hexdigest())


def from_checkpoint(hf_dir: Path, override: Path | None = None) -> ChatTemplate | None:
    """The checkpoint's template (tokenizer_config.json `chat_template`, or chat_template.jinja),
    or `override`'s text; None when there is none. Raises TemplateError when it cannot be stored."""
    from colibri_kit.model.checkpoint_files import read_json_object, read_text

    cfg_path = Path(hf_dir) / "tokenizer_config.json"
    cfg: dict[str, Any] = read_json_object(cfg_path) if os.path.lexists(cfg_path) else {}
    jinja_path = Path(hf_dir) / "chat_template.jinja"
    if override is not None:
        template: Any = read_text(Path(override), MAX_TEMPLATE_BYTES, "chat template")
    elif os.path.lexists(jinja_path):
        template = read_text(jinja_path, MAX_TEMPLATE_BYTES, "chat template")
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
