"""The "Done when" bar of text generation: `colibri generate --prompt` (plain and --chat) at
temperature 0 gives the ids transformers' `model.generate(do_sample=False)` gives, on converted
random-weight checkpoints of every family, with the test tokenizers of tests/hf_models.py and the
family's real chat template (tests/chat_templates.py); a seed reproduces on 1 and 2 threads."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import hf_models
from chat_templates import TEMPLATES

FAMILIES = {"mixtral": "mixtral-v2", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3", "olmoe": "olmoe"}
PROMPT = "The engineers deploy the model to every device"
NEW = 12


@pytest.fixture(scope="module")
def text_models(hf_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's checkpoint + trained tokenizer + chat template, and its .colibri file."""
    from colibri_kit.model.convert import TargetModelLimits, convert

    root = tmp_path_factory.mktemp("gen-hf")
    out: dict[str, Path] = {}
    for name, template in FAMILIES.items():
        hf = root / name
        shutil.copytree(hf_models.checkpoint(name, hf_root), hf)
        hf_models.train_tokenizer(hf_models.TOKENIZER_FAMILY[name], hf_models.CASES[name].config["vocab_size"], hf)
        cfg = json.loads((hf / "tokenizer_config.json").read_text())
        cfg["chat_template"] = TEMPLATES[template][0]
        (hf / "tokenizer_config.json").write_text(json.dumps(cfg))
        out[name] = hf
        convert(hf, root / f"{name}.colibri", limits=TargetModelLimits("host", 64, 64, 8), progress=False)
    return out


def hf_generate(hf: Path, ids: list[int], n: int) -> list[int]:
    import torch
    from transformers import GenerationConfig

    model = hf_models.load_hf(hf)
    stop = json.loads((hf / "generation_config.json").read_text())["eos_token_id"]
    stop = stop if isinstance(stop, list) else [stop]
    cfg = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=stop, pad_token_id=stop[0])
    with torch.no_grad():
        seq = model.generate(torch.tensor([ids]), generation_config=cfg)[0, len(ids):].tolist()
    return [t for t in seq[: next((i for i, t in enumerate(seq) if t in stop), len(seq))]]


def colibri(binary: Path, model: Path, *args: str) -> dict:
    proc = subprocess.run([str(binary), "generate", str(model), *args, "--max-new", str(NEW), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_greedy_prompt_matches_transformers_generate(host_colibri: Path, text_models: dict[str, Path],
                                                     name: str) -> None:
    from transformers import AutoTokenizer

    hf = text_models[name]
    model = hf.parent / f"{name}.colibri"
    tok = AutoTokenizer.from_pretrained(hf)
    # plain prompt: tokenizer(prompt) as transformers adds special tokens
    want_prompt = tok(PROMPT)["input_ids"]
    got = colibri(host_colibri, model, "--prompt", PROMPT)
    assert got["prompt_ids"] == want_prompt
    want = hf_generate(hf, want_prompt, NEW)
    assert got["ids"] == want, name
    assert got["finish_reason"] == ("length" if len(want) == NEW else "stop")
    assert got["text"] == tok.decode(want, skip_special_tokens=True)
    # --chat --system: apply_chat_template(add_generation_prompt=True)
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    chat_ids = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
    chat_ids = list(chat_ids["input_ids"] if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys")
                    else chat_ids)
    got = colibri(host_colibri, model, "--prompt", PROMPT, "--chat", "--system", "Be brief.")
    assert got["prompt_ids"] == chat_ids
    assert got["ids"] == hf_generate(hf, chat_ids, NEW), name


def test_seed_reproduces_across_threads_with_text(host_colibri: Path, text_models: dict[str, Path]) -> None:
    model = text_models["qwen3_moe"].parent / "qwen3_moe.colibri"
    runs = [subprocess.run([str(host_colibri), "--threads", str(t), "generate", str(model), "--prompt", PROMPT,
                            "--temperature", "1.2", "--top-p", "0.9", "--seed", "5", "--max-new", "16",
                            "--ignore-eos", "--json"], capture_output=True, text=True, check=True,
                           timeout=120).stdout for t in (1, 2)]
    a, b = (json.loads(r) for r in runs)
    assert a["ids"] == b["ids"] and a["text"] == b["text"] and len(a["ids"]) == 16


def test_streamed_text_equals_json_text(host_colibri: Path, text_models: dict[str, Path]) -> None:
    model = text_models["mixtral"].parent / "mixtral.colibri"
    args = ["generate", str(model), "--prompt", PROMPT, "--max-new", "10", "--ignore-eos"]
    streamed = subprocess.run([str(host_colibri), *args], capture_output=True, check=True, timeout=120).stdout
    as_json = json.loads(subprocess.run([str(host_colibri), *args, "--json"], capture_output=True, text=True,
                                        check=True, timeout=120).stdout)
    assert streamed.decode("utf-8") == as_json["text"] + "\n"


def test_prompt_errors(host_colibri: Path, text_models: dict[str, Path], tmp_path: Path) -> None:
    model = text_models["olmoe"].parent / "olmoe.colibri"
    long = subprocess.run([str(host_colibri), "generate", str(model), "--prompt", "word " * 400],
                          capture_output=True, text=True, timeout=120)
    assert long.returncode == 1 and "max_seq_len" in long.stderr and "tokens" in long.stderr
    from colibri_kit.model.tiny import tiny_header, write_random_model

    old = write_random_model(tmp_path / "plain.colibri", tiny_header())  # no tokenizer section
    proc = subprocess.run([str(host_colibri), "generate", str(old), "--prompt", "hi"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "tokenizer" in proc.stderr
