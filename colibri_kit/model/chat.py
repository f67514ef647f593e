"""Chat templates: from a checkpoint's Jinja `chat_template` to a table the C runtime renders.

The runtime has no Jinja engine. Instead the converter renders the template with jinja2 (set up
the way transformers' `apply_chat_template` sets it up: sandboxed, `trim_blocks`,
`lstrip_blocks`, `raise_exception`, `strftime_now`) on probe conversations whose contents are
unique markers, and keeps the text the template puts around the contents:

    start.R          before the first message when it has role R (BOS text included)
    between.R.S      between a message of role R and the next one of role S
    last.R.S         the same, when the S message is the conversation's last
    end.R            after the last message (role R), no generation prompt
    gen.R            after the last message (role R) with the generation prompt

Conversations have the shape every supported family uses: an optional system or developer
message, then user and assistant alternating, starting with user. An entry is absent when the
template refuses that step (Mixtral's original template raises on a system message, Qwen's on a
developer one); the runtime then refuses such a conversation naming the step.

What the templates of gpt-oss (harmony) and Qwen3 / Qwen3.5 / Qwen3-Next need besides (docs/format.md):
    placeholders     in a text, NUL + name + NUL: `strftime:FMT` (the template's strftime_now(FMT),
                     the current date in gpt-oss's system message) and `reasoning_effort`
                     (`default.reasoning_effort` holds the template's default, "medium")
    KEY|enable_thinking=true|false   the text of KEY when enable_thinking is set so (Qwen3.5's
                     generation prompt opens or closes the <think> block)
    xf.KEY           what is done to the content after KEY: strip (Jinja's trim), lstrip_nl,
                     after_think (the text after the last </think>), comma-separated, in order
    refuse.KEY       contents the template treats specially that the table cannot reproduce,
                     one rule a line: empty, has:S, wrap:A|B; the runtime refuses them, saying so
    empty.KEY = drop an empty first (system/developer) message is left out (gpt-oss)
    output.format    harmony or think: how the model's output splits into channels (harmony.c)
Tools, tool calls, images and other template variables (builtin_tools, model_identity) are not
expressible: the runtime never sets them, as if the caller had left them undefined.

The table is checked against jinja2 on every conversation of that shape up to 7 messages, with
and without the generation prompt, for every enable_thinking value and reasoning effort the
template uses, on contents with surrounding spaces and newlines; a template whose text depends on
anything else (contents it inspects beyond the rules above, positions further away than the
neighbouring message, a system message placed into a later turn) is refused, naming the first
conversation that differs. `--chat-template FILE` replaces the checkpoint's template.

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

ROLES = ("system", "developer", "user", "assistant")
FIRST_ROLES = ("system", "developer")  # may open a conversation
EFFORTS = ("low", "medium", "high")     # openai-harmony's ReasoningEffort values
VAR = "\x00"                            # placeholder delimiter in the table's texts
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


@dataclass(frozen=True)
class Options:
    """What the runtime passes to the template besides the messages (colibri_chat_options)."""

    enable_thinking: bool | None = None  # None: undefined in the template (its default)
    reasoning_effort: str | None = None  # None: undefined (the template's default)
    now: float = 0.0                     # the time strftime_now formats (local time)


def _strftime_at(now: float) -> Any:
    return lambda fmt: time.strftime(fmt, time.localtime(now))


def _placeholder(name: str) -> str:
    return f"{VAR}{name}{VAR}"


class Renderer:
    """A compiled template plus the special-token strings it refers to."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2
        from jinja2 import meta

        env = _environment()
        try:
            self.template = env.from_string(template)
            names = meta.find_undeclared_variables(env.parse(template))
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise TemplateError(f"chat template: Jinja syntax error at line {e.lineno}: {e.message}") from e
        except (SyntaxError, RecursionError, MemoryError) as e:  # Python refuses the compiled code
            raise TemplateError(f"chat template: cannot be compiled ({type(e).__name__})") from None
        self.bos_token, self.eos_token, self.source = bos_token, eos_token, template
        # the template variables colibri sets (the others stay undefined: tools, builtin_tools, ...)
        self.uses = frozenset(n for n in ("enable_thinking", "reasoning_effort", "strftime_now") if n in names)

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool, opts: Options = Options(),
               strftime: Any = None, effort: str | None = None) -> str | None:
        """The text, or None when the template refuses the conversation (raise_exception etc.).
        strftime / effort: what strftime_now and reasoning_effort give instead of opts' (probing)."""
        import jinja2

        extra: dict[str, Any] = {"strftime_now": strftime or _strftime_at(opts.now)}
        if opts.enable_thinking is not None:
            extra["enable_thinking"] = opts.enable_thinking
        if effort is not None or opts.reasoning_effort is not None:
            extra["reasoning_effort"] = effort if effort is not None else opts.reasoning_effort
        try:
            text = self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except (jinja2.exceptions.TemplateError, TypeError, KeyError, IndexError, AttributeError, ValueError):
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
    """Every role sequence of the supported shape: [system|developer] user assistant user ...
    (1..max_len messages), and a lone system or developer message."""
    out = []
    for n in range(1, max_len + 1):
        turns = tuple(("user", "assistant")[i % 2] for i in range(n))
        out.append(turns)
        if n < max_len:
            out += [(first,) + turns for first in FIRST_ROLES]
    out += [(first,) for first in FIRST_ROLES]
    return out


def _shape_ok(roles: tuple[str, ...]) -> bool:
    return bool(roles) and roles in set(shapes(len(roles)))


def step_keys(roles: tuple[str, ...] | list[str], gen: bool) -> list[str]:
    """The table key before each message's content, then the one after the last message."""
    keys = [f"start.{roles[0]}"]
    for i in range(1, len(roles)):
        keys.append(f"{'last' if i == len(roles) - 1 else 'between'}.{roles[i - 1]}.{roles[i]}")
    keys.append(f"{'gen' if gen else 'end'}.{roles[-1]}")
    return keys


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


# ---- what the runtime does to a message's content before it goes between the fixed texts ----
# Each is what a real template does (tests/data/chat_templates): Python's str.strip() (Jinja's
# `trim`, Qwen3.5), .lstrip('\n') (Qwen3's last assistant turn), and the Qwen3 families'
# content.split('</think>')[-1].lstrip('\n') on earlier assistant turns. Each gives a substring.
OPS = ("strip", "lstrip_nl", "after_think")


def _apply(ops: tuple[str, ...], s: str) -> str:
    for op in ops:
        if op == "strip":
            s = s.strip()
        elif op == "lstrip_nl":
            s = s.lstrip("\n")
        elif op == "after_think" and "</think>" in s:
            s = s.split("</think>")[-1].lstrip("\n")
    return s


PIPELINES = [()] + [(a,) for a in OPS] + [(a, b) for a in OPS for b in OPS if a != b]

# Contents the table must render as jinja2 does, whatever transform the slot has.
PLAIN_PROBES = ["message: hello", "  padded  \n\n", "\n\nnewlines first\n", "\t\u3000wide\u00a0\u2003", "a\nb"]
# Contents real templates inspect (raise_exception on, or move elsewhere): where the table cannot
# give jinja2's text, the runtime refuses such a content with this rule: "empty", "has:S" (the
# transformed content contains S) or "wrap:A|B" (it starts with A and ends with B).
RULE_PROBES = [
    ("", "empty"),
    ("<think>\nreason\n</think>\n\nanswer", "has:</think>"), ("a </think> b", "has:</think>"),
    ("<think>open", "has:<think>"),
    ("x<|channel|>analysis<|message|>y", "has:<|channel|>analysis<|message|>"),
    ("x<|channel|>final<|message|>y", "has:<|channel|>final<|message|>"),
    ("<tool_response>\nresult\n</tool_response>", "wrap:<tool_response>|</tool_response>"),
]


def _rule_hits(rule: str, s: str) -> bool:
    kind, _, arg = rule.partition(":")
    if kind == "empty":
        return s == ""
    if kind == "has":
        return arg in s
    a, _, b = arg.partition("|")
    return s.startswith(a) and s.endswith(b)


def _fixed_table(r: Renderer, opts: Options, strftime: Any, effort: str | None) -> dict[str, str]:
    """The fixed texts, from the minimal probe for each entry (verify() checks them)."""
    table: dict[str, str] = {}
    for roles in shapes(4):
        for gen in (False, True):
            msgs = [{"role": role, "content": _marker(i)} for i, role in enumerate(roles)]
            text = r.render(msgs, gen, opts, strftime, effort)
            if text is None:
                continue
            segs = _segments(text, len(roles))
            if segs is None and roles[0] in FIRST_ROLES and _segments(text, 0) is not None and \
                    _marker(0) not in text:
                continue  # the template drops this first message (e.g. Qwen3 a developer one)
            if segs is None:
                raise TemplateError(
                    "chat template does not put each message's content into the text once and unchanged "
                    f"(conversation {list(roles)})")
            for key, seg in zip(step_keys(roles, gen), segs):
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


def _transforms(r: Renderer, table: dict[str, str], strftime: Any, effort: str | None) -> dict[str, str]:
    """For each content slot, the transform (and the refusal rules) under which the table gives
    jinja2's text for every probe content, other messages being markers."""
    cases: dict[str, list[tuple[tuple[str, ...], int, bool]]] = {}
    for roles in shapes(4):
        for gen in (False, True):
            for i, key in enumerate(step_keys(roles, gen)[:-1]):
                cases.setdefault(key, []).append((roles, i, gen))
    out: dict[str, str] = {}
    rules: dict[str, set[str]] = {}
    for key, where in sorted(cases.items()):
        if key not in table:
            continue
        renders = []  # (messages, gen, jinja2's text, rule or None)
        for roles, i, gen in where:
            base = [{"role": role, "content": _marker(j)} for j, role in enumerate(roles)]
            if _render_or_none(table, base, gen, strftime, effort) is None:
                continue  # a step the table does not have (the template refuses it)
            for content, rule in [(c, None) for c in PLAIN_PROBES] + RULE_PROBES:
                msgs = [dict(m) for m in base]
                msgs[i]["content"] = content
                renders.append((msgs, gen, i, r.render(msgs, gen, Options(), strftime, effort), rule))
        best: tuple[int, tuple[str, ...], set[str]] | None = None
        for ops in PIPELINES:
            trial = {**table, f"xf.{key}": ",".join(ops)}
            failed: set[str] = set()
            ok = True
            for msgs, gen, i, want, rule in renders:
                try:
                    got: str | None = render_table(trial, msgs, gen, Options(), strftime, effort)
                except TemplateError:
                    got = None
                if got == want:
                    continue
                if rule is None:
                    ok = False
                    break
                if rule == "empty" and i == 0 and len(msgs) > 1 and want is not None and \
                        want == _render_or_none(trial, msgs[1:], gen, strftime, effort):
                    failed.add("drop")
                    continue
                if rule == "empty" and i == 0 and len(msgs) == 1 and "drop" in failed:
                    continue  # a lone empty first message: refused with empty.KEY = drop
                failed.add(rule)
            if ok and (best is None or len(failed) < best[0]):
                best = (len(failed), ops, failed)
        if best is None:
            raise TemplateError(f"chat template changes the content at {key!r} in a way colibri cannot store "
                                f"(tried {', '.join('+'.join(p) or 'as is' for p in PIPELINES)})")
        _, ops, failed = best
        if ops:
            out[f"xf.{key}"] = ",".join(ops)
        if "drop" in failed:
            out[f"empty.{key}"] = "drop"
            failed.discard("drop")
        rules.setdefault(key.split(".")[-1], set()).update(failed)
    # a rule found for one slot of a role holds for every slot of it: what a template inspects in
    # a content can matter in longer conversations than the probes (Qwen's tool-response scan)
    for key in cases:
        if key in table and rules.get(key.split(".")[-1]):
            out[f"refuse.{key}"] = "\n".join(sorted(rules[key.split(".")[-1]]))
    return out


def _render_or_none(table: dict[str, str], msgs: list[dict[str, str]], gen: bool, strftime: Any,
                    effort: str | None) -> str | None:
    if not msgs:
        return None
    try:
        return render_table(table, msgs, gen, Options(), strftime, effort)
    except TemplateError:
        return None


def derive(r: Renderer) -> dict[str, str]:
    """The table: fixed texts (with the date and reasoning effort as placeholders), per-variant
    texts for enable_thinking, content transforms and refusal rules, the output format."""
    date = (lambda fmt: _placeholder(f"strftime:{fmt}"))
    effort = _placeholder("reasoning_effort") if "reasoning_effort" in r.uses else None
    table = _fixed_table(r, Options(), date, effort)
    if effort is not None and not any(effort in v for v in table.values()):
        effort = None  # referenced only where colibri never goes (tools)
    if effort is not None:
        probe = [{"role": "user", "content": _marker(0)}]
        mark, plain = r.render(probe, True, Options(), date, effort), r.render(probe, True, Options(), date)
        default = None
        if mark is not None and plain is not None and mark.count(effort) == 1:
            a, b = mark.split(effort)
            if plain.startswith(a) and plain.endswith(b) and len(plain) >= len(a) + len(b):
                default = plain[len(a):len(plain) - len(b)]
        if default is None or VAR in default:
            raise TemplateError("chat template uses reasoning_effort in a way colibri cannot store "
                                "(not as text put in place)")
        table["default.reasoning_effort"] = default
    if "enable_thinking" in r.uses:
        for value in (True, False):
            variant = _fixed_table(r, Options(enable_thinking=value), date, effort)
            if set(variant) != set(table):
                raise TemplateError("chat template: enable_thinking changes which conversations it "
                                    "accepts; colibri stores only text that changes with it")
            for k, v in variant.items():
                if v != table[k]:
                    table[f"{k}|enable_thinking={'true' if value else 'false'}"] = v
    table.update(_transforms(r, table, date, effort))
    source = r.source
    gen = table.get("gen.user", "")
    if "<|channel|>" in source and gen.endswith("<|start|>assistant"):
        table["output.format"] = "harmony"
    elif "<think>" in source and "</think>" in source:
        table["output.format"] = "think"
    return table


def _substitute(value: str, opts: Options, table: dict[str, str], strftime: Any, effort: str | None) -> str:
    if VAR not in value:
        return value
    parts = value.split(VAR)
    out = [parts[0]]
    for name, text in zip(parts[1::2], parts[2::2]):
        if name == "reasoning_effort":
            out.append(effort if effort is not None else
                       opts.reasoning_effort or table.get("default.reasoning_effort", ""))
        elif name.startswith("strftime:"):
            out.append((strftime or _strftime_at(opts.now))(name[len("strftime:"):]))
        out.append(text)
    return "".join(out)


def _lookup(table: dict[str, str], key: str, opts: Options) -> str | None:
    if opts.enable_thinking is not None:
        v = table.get(f"{key}|enable_thinking={'true' if opts.enable_thinking else 'false'}")
        if v is not None:
            return v
    return table.get(key)


def render_table(table: dict[str, str], messages: list[dict[str, str]], add_generation_prompt: bool,
                 opts: Options = Options(), strftime: Any = None, effort: str | None = None) -> str:
    """What the C runtime does with the table (runtime/src/text/chat.c); raises on a refused step."""
    roles = [m["role"] for m in messages]
    if opts.reasoning_effort is not None and opts.reasoning_effort not in EFFORTS:
        raise TemplateError(f"reasoning effort {opts.reasoning_effort!r}: expected one of {', '.join(EFFORTS)}")
    if not _shape_ok(tuple(roles)):
        raise TemplateError(f"conversation roles {roles}: expected an optional system or developer message, "
                            "then user and assistant alternating, starting with user")
    first = step_keys(roles, add_generation_prompt)[0]
    if messages[0]["content"] == "" and table.get(f"empty.{first}") == "drop":
        if len(messages) == 1:
            raise TemplateError(f"an empty {roles[0]} message alone: the chat template leaves it out")
        messages = messages[1:]
        roles = roles[1:]
    keys = step_keys(roles, add_generation_prompt)
    out = []
    for i, key in enumerate(keys):
        text = _lookup(table, key, opts)
        if text is None:
            raise TemplateError(f"the chat template does not allow this step ({key})")
        out.append(_substitute(text, opts, table, strftime, effort))
        if i == len(messages):
            break
        content = _apply(tuple(x for x in table.get(f"xf.{key}", "").split(",") if x), messages[i]["content"])
        for rule in table.get(f"refuse.{key}", "").split("\n"):
            if rule and _rule_hits(rule, content):
                raise TemplateError(f"message {i} ({roles[i]}): the chat template treats this content specially "
                                    f"({rule}); colibri does not render it")
        out.append(content)
    return "".join(out)


def verify(r: Renderer, table: dict[str, str]) -> None:
    """Every conversation shape up to MAX_PROBE messages, three kinds of content, with and
    without the generation prompt, every enable_thinking value and reasoning effort the template
    uses, at a fixed time: the table gives jinja2's text or refuses where jinja2 refuses."""
    contents = [lambda i: f"message {i}: hello", lambda i: f"  padded {i}\n\n",
                lambda i: PLAIN_PROBES[i % len(PLAIN_PROBES)]]
    thinking = (None, True, False) if "enable_thinking" in r.uses else (None,)
    efforts = (None, "low", "high") if "default.reasoning_effort" in table else (None,)
    now = 1767225600.0 + 86399  # 2025-12-31T23:59:59Z: a date whose local day differs by zone
    for roles, gen, content, think, effort in itertools.product(shapes(), (False, True), contents, thinking, efforts):
        opts = Options(enable_thinking=think, reasoning_effort=effort, now=now)
        msgs = [{"role": role, "content": content(i)} for i, role in enumerate(roles)]
        want = r.render(msgs, gen, opts)
        try:
            got: str | None = render_table(table, msgs, gen, opts)
        except TemplateError:
            got = None
        if got is None and roles[0] in FIRST_ROLES and (len(roles) == 1 or f"start.{roles[0]}" not in table):
            continue  # the template drops this first message (a lone one, Qwen3's developer): refused
        if want is not None and VAR in want:
            raise TemplateError("chat template output contains NUL characters")
        if want != got:
            what = ("renders it but the table refuses it" if got is None else
                    "refuses it but the table renders it" if want is None else
                    "renders it differently from the table")
            raise TemplateError(
                f"chat template cannot be stored as a table: jinja2 {what} for conversation "
                f"{[m['role'] for m in msgs]} (generation prompt {gen}, enable_thinking {think}, "
                f"reasoning effort {effort}, contents like {msgs[0]['content']!r}); it depends on "
                "message contents or on positions beyond the neighbouring message. Give a simpler "
                "template with --chat-template FILE.")


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
    roles = sorted({part for key in table for part in key.split("|")[0].split(".")[1:] if part in ROLES},
                   key=ROLES.index)
    try:
        example: str | None = render_table(table, [{"role": "user", "content": "Hello"}], True,
                                           Options(now=time.time()))
    except TemplateError:
        example = None  # e.g. a template that refuses a lone user message
    return {"roles": roles, "keys": sorted(table), "source_sha256": sha,
            "system_message": "start.system" in table,
            "generation_prompt": any(k.startswith("gen.") for k in table), "example": example,
            "output_format": table.get("output.format"),
            "options": sorted({"enable_thinking" for k in table if "|enable_thinking=" in k}
                              | ({"reasoning_effort"} if "default.reasoning_effort" in table else set())
                              | ({"date"} if any(VAR + "strftime:" in v for v in table.values()) else set()))}
