"""Bits unchanged: dump `colibri forward --logits-out` for a fixed set of models and compare dumps.

A change that restructures the forward pass (issue 19: layer kinds) must leave the CPU logits of
every model bitwise identical. This script makes the evidence, in three steps run from any
checkout (the colibri_kit and tests/ on PYTHONPATH decide which writer makes the models):

    # 1. the models, written by the kit of the checkout before the change
    PYTHONPATH=OLD:OLD/tests python runtime/tests/logits_bits.py models OLD_BIN MODELS
    # 2. the logits of each binary (the old one cannot read files of a newer format version)
    python runtime/tests/logits_bits.py dump OLD_BIN MODELS OUT_OLD
    python runtime/tests/logits_bits.py dump NEW_BIN MODELS OUT_NEW
    # 3. byte comparison of every dump; exit 1 on any difference
    python runtime/tests/logits_bits.py compare OUT_OLD OUT_NEW

The model set: the tiny model in every weight type, random models with every header flag,
`colibri synth` models, and the random-weight Hugging Face checkpoints of tests/hf_models.py
converted to f32/f16/bf16/int8/q4. Each model runs a prompt longer than one 64-token chunk at 1
and 2 threads, as one call, as prompt + token-by-token decode, with an f16 KV cache and (int8/q4)
with int8 activations.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

THREADS = (1, 2)
DTYPES = ("f32", "f16", "bf16", "int8", "q4")


def write_models(binary: Path, out: Path, hf: bool) -> list[Path]:
    """Every model of the set under ``out`` (the importable colibri_kit writes them)."""
    from colibri_kit.model.format import DType, Flag
    from colibri_kit.model.tiny import tiny_header, write_random_model, write_tiny_model

    out.mkdir(parents=True, exist_ok=True)
    paths = [write_tiny_model(out / f"tiny-{d}.colibri", dtype=DType.parse(d)) for d in DTYPES]
    featured = {
        "shared-gate-bias": int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS),
        "qknorm-head-tied": int(Flag.QK_NORM_HEAD | Flag.TIED_EMBEDDINGS),
        "qknorm-full": int(Flag.QK_NORM_FULL),
    }
    for name, flags in featured.items():
        for d in ("f32", "int8", "q4"):
            h = tiny_header(64, DType.parse(d))
            h.flags = flags
            h.shared_expert_size = 40 if flags & Flag.SHARED_EXPERT else 0
            h.routing = 1
            h.max_seq_len = 160
            h.name = name
            paths.append(write_random_model(out / f"{name}-{d}.colibri", h, seed=7))
    for d in ("f32", "f16", "int8"):
        p = out / f"synth-{d}.colibri"
        subprocess.run([str(binary), "synth", str(p), "--dim", "96", "--layers", "3", "--experts",
                        "6", "--top-k", "2", "--ffn", "80", "--heads", "6", "--kv-heads", "2",
                        "--head-dim", "16", "--vocab", "500", "--seq", "160", "--dtype", d],
                       check=True, capture_output=True)
        paths.append(p)
    if hf:
        import hf_models as H
        from colibri_kit.model.convert import TargetModelLimits, convert

        root = out / "hf"
        root.mkdir(exist_ok=True)
        # every family the writing checkout has (sliding windows, gpt-oss, the Qwen3.5 / Next
        # hybrids: compare binaries that both read them), with the released gpt-oss checkpoint's
        # mxfp4 experts kept as mxfp4
        for name in (H.ALL_CASES + list(getattr(H, "GPTOSS_CASES", []))
                     + list(getattr(H, "HYBRID_CASES", []))):
            ck = H.checkpoint(name, root)
            extra = {"expert_dtype": "mxfp4"} if name.endswith("mxfp4") else {}
            for d in DTYPES:
                p = out / f"hf-{name}-{d}.colibri"
                convert(ck, p, dtype=d, limits=TargetModelLimits("host", 64, 64, 8), progress=False,
                        **extra)
                paths.append(p)
    return paths


def prompt(vocab: int, n: int) -> list[int]:
    return [(i * 7919 + 13) % vocab for i in range(n)]


def model_geometry(binary: Path, model: Path) -> tuple[int, int, str]:
    import json

    info = json.loads(subprocess.run([str(binary), "--backend", "cpu", "info", str(model)],
                                     check=True, capture_output=True, text=True).stdout)
    return info["vocab_size"], info["max_seq_len"], info["dtype"]


def dump(binary: Path, models: Path, out: Path) -> int:
    """Logits of every model under ``models`` in every run variant, one file each."""
    out.mkdir(parents=True, exist_ok=True)
    n_files = 0
    for model in sorted(models.glob("*.colibri")):
        vocab, seq, dtype = model_geometry(binary, model)
        ids = ",".join(map(str, prompt(vocab, min(seq, 80))))
        variants = {"one-call": [], "decode-from-70": ["--decode-from", "70"], "last": ["--last"]}
        globals_ = {"": [], "kvf16": ["--kv-cache", "f16"]}
        if dtype in ("int8", "q4"):
            globals_["int8act"] = ["--int8-act"]
        for t in THREADS:
            for gname, gopts in globals_.items():
                for vname, vopts in variants.items():
                    f = out / f"{model.stem}.t{t}{'.' + gname if gname else ''}.{vname}.f32"
                    subprocess.run([str(binary), "--backend", "cpu", "--threads", str(t), *gopts,
                                    "forward", str(model), "--ids", ids, *vopts,
                                    "--logits-out", str(f)], check=True, capture_output=True)
                    n_files += 1
    print(f"{n_files} logits files in {out}")
    return 0


def compare(a: Path, b: Path) -> int:
    names = sorted(p.name for p in a.glob("*.f32"))
    other = sorted(p.name for p in b.glob("*.f32"))
    if names != other:
        print(f"file sets differ: only in {a}: {sorted(set(names) - set(other))[:5]}, "
              f"only in {b}: {sorted(set(other) - set(names))[:5]}")
        return 1
    bad = [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()]
    print(f"{len(names) - len(bad)} of {len(names)} logits files bitwise identical")
    for n in bad[:20]:
        print(f"DIFFERENT: {n}")
    return 1 if bad or not names else 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("models", help="write the model set")
    m.add_argument("binary", type=Path, help="a colibri binary (for `colibri synth`)")
    m.add_argument("out", type=Path)
    m.add_argument("--no-hf", action="store_true", help="skip the Hugging Face checkpoints")
    d = sub.add_parser("dump", help="write the logits of every model and variant")
    d.add_argument("binary", type=Path)
    d.add_argument("models", type=Path)
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="byte-compare two dumps (exit 1 on any difference)")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "models":
        print(f"{len(write_models(args.binary, args.out, not args.no_hf))} models in {args.out}")
        return 0
    if args.cmd == "dump":
        return dump(args.binary, args.models, args.out)
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
