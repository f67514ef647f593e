"""Real chat templates of the supported families (test data), each with where it was read.

They are the `chat_template` strings of the checkpoints' tokenizer_config.json, as published on
the Hugging Face Hub; the copies here were checked against the public sources named below.
"""
from __future__ import annotations

from pathlib import Path

# Qwen2 / Qwen1.5-MoE / Qwen2-57B-A14B-Instruct (ChatML with a default system message).
# Source: tokenizer_config.json of Qwen/Qwen2-57B-A14B-Instruct; the same string appears in
# public code, e.g. the Qwen2 fine-tuning TEMPLATE and MothMalone/SLMS-KD-Benchmarks configs.
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen3 / Qwen3-30B-A3B (ChatML with tools and <think> handling).
# Source: https://huggingface.co/Qwen/Qwen3-8B/blob/895c8d171bc03c30e113cd7a28c02494b5e068b7/tokenizer_config.json#L230
# (the Qwen3 MoE checkpoints ship the same template), as quoted in public code such as
# tyler-griggs/SkyRL skyrl_train/utils/templates and the HF blog "The 4 Things Qwen-3's Chat
# Template Teaches Us".
QWEN3 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

# Mixtral-8x7B-Instruct-v0.1, first release (no system role; roles must alternate).
# Source: tokenizer_config.json of mistralai/Mixtral-8x7B-Instruct-v0.1 (initial revision),
# quoted verbatim in public code (e.g. the "swallow" template comparison and llama.cpp's
# llama_chat_apply_template tests).
MIXTRAL_V1 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)

# Mixtral-8x7B-Instruct-v0.1 / Mistral-7B-Instruct-v0.1 later revision: an optional system
# message merged into the first user turn. Source: the checkpoints' tokenizer_config.json as
# quoted in guidance-ai's Mistral7BInstructChatTemplate (guidance/chat.py).
MIXTRAL_V2 = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# OLMoE-1B-7B-0924-Instruct (the Tulu format). Source: tokenizer_config.json of
# allenai/OLMoE-1B-7B-0924-Instruct, as quoted in the model's Hub discussion #8 ("Differences in
# chat template compared to Zephyr"), where the maintainers confirm it is the Tulu template.
OLMOE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] }}{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\\n' + message['content'] + eos_token }}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}{% endfor %}"
)

# The Tulu-2 variant later AllenAI instruct models use: a newline after each turn and a
# different suffix for the last assistant turn (exercises end.* vs between.*).
# Source: allenai tokenizer_config.json files (e.g. OLMo-2 instruct), as quoted in public code.
TULU2 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n' + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}"
)

# name -> (template, bos_token, eos_token)
TEMPLATES = {
    "qwen2": (QWEN2, "", "<|im_end|>"),
    "qwen3": (QWEN3, "", "<|im_end|>"),
    "mixtral-v1": (MIXTRAL_V1, "<s>", "</s>"),
    "mixtral-v2": (MIXTRAL_V2, "<s>", "</s>"),
    "olmoe": (OLMOE, "<|endoftext|>", "<|endoftext|>"),
    "tulu2": (TULU2, "", "<|endoftext|>"),
}

# A template whose text depends on more than the neighbouring message: the system message goes
# into the LAST user turn (Mistral-7B-Instruct-v0.3's format). It must be refused.
SYSTEM_IN_LAST_TURN = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- endif %}
{%- endfor %}"""


# ---- the new families: the templates as files (verbatim), tests/data/chat_templates/ ----------
# gpt-oss.jinja: openai/gpt-oss-20b's chat_template.jinja as transformers' converter
#   (src/transformers/models/gpt_oss/convert_gpt_oss_weights_to_hf.py, write_tokenizer: "Updated
#   Harmony chat template") writes it; the first release (llama.cpp's
#   models/templates/openai-gpt-oss-120b.jinja) put "\n\n" after the developer instructions
#   unconditionally, the updated text only before tools, as openai-harmony renders.
# qwen3_5-moe.jinja: Qwen/Qwen3.5-35B-A3B's chat_template.jinja, as copied into
#   mlx-community/Qwen3.5-35B-A3B-4bit, with the SHA256 published beside that copy.
# qwen3-2507-instruct.jinja / qwen3-2507-thinking.jinja: the Qwen3 2507 templates (Instruct and
#   Thinking) that Qwen3-Next-80B-A3B-Instruct / -Thinking ship (the Thinking one opens <think> in
#   the generation prompt; MERA's published Qwen3-Next-80B-A3B-Thinking submission shows the
#   same text), as unsloth's chat_templates.py carries them ("qwen3-instruct", "qwen3-thinking").
TEMPLATE_DIR = Path(__file__).resolve().parent / "data" / "chat_templates"
TEMPLATE_FILES = {"gpt-oss": "gpt-oss.jinja", "qwen3_5-moe": "qwen3_5-moe.jinja",
                  "qwen3-next-instruct": "qwen3-2507-instruct.jinja",
                  "qwen3-next-thinking": "qwen3-2507-thinking.jinja"}
# name -> (bos_token, eos_token) of the checkpoints' tokenizer_config.json
NEW_TEMPLATES = {"gpt-oss": ("<|startoftext|>", "<|return|>"), "qwen3_5-moe": ("", "<|im_end|>"),
                 "qwen3-next-instruct": ("", "<|im_end|>"), "qwen3-next-thinking": ("", "<|im_end|>")}
SHA256 = {
    "qwen3_5-moe": "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",  # published
    "gpt-oss": "b474759b33c21342e73abceae7fe3789f062e289f69749801f722a508f92180a",
    "qwen3-next-instruct": "db733d157125e57af0ab7b0529d50bd2abd61315b431c53213221930db441edb",
    "qwen3-next-thinking": "3802169b2a02b81e6adb7ab4f64f91ff02db753c8c3a64a01c35192d3a61d8d7",
}


def template_text(name: str) -> str:
    return (TEMPLATE_DIR / TEMPLATE_FILES[name]).read_text(encoding="utf-8")
