"""Encode throughput of the C tokenizer vs the `tokenizers` library (single thread), same texts.

    python benchmarks/tokenizer.py [--families qwen2,olmoe,mixtral] [--vocab 8000] [--repeat 5]

For each family a tokenizer is trained here with `tokenizers` in the family's real configuration
(tests/hf_models.py) and converted into a small carrier model. The C side is the runtime's public
API (colibri_tokenize) from a shared library compiled here with -O2, called through ctypes; the
library side is `tokenizers.Tokenizer.encode` with RAYON_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false. Two workloads over the exactness corpus
(tests/data/tokenizer_corpus.json, 65 texts, 5.4 KB, every script and edge case):

- "prompts": every corpus text encoded by its own call, the corpus passed 40 times;
- "document": the corpus joined 40 times into one ~215 KB text, one call.

The engines run interleaved, best of --repeat; the ids are checked equal. Goal: C >= tokenizers.
Figures go to docs/runtime.md ("Tokenizer"). The machine may be shared: compare within one run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import hf_models as H  # noqa: E402
from colibri_kit.model.tokenizer import load_tokenizer  # noqa: E402
from colibri_kit.model.tiny import write_text_model  # noqa: E402


def build_library(out: Path) -> ctypes.CDLL:
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import render_config

    (out / "colibri_config.h").write_text(render_config(load_profile("host")))
    rt = ROOT / "runtime"
    srcs = [str(p) for p in sorted((rt / "src").glob("*/*.c"))] + [str(rt / "embed" / "kernel_images_empty.c")]
    lib = out / "libcolibri_bench.so"
    subprocess.run(["cc", "-std=c11", "-O2", "-shared", "-fPIC", "-D_GNU_SOURCE", f"-I{rt / 'include'}",
                    f"-I{rt / 'src'}", f"-I{out}", "-o", str(lib), *srcs, "-lm", "-lpthread", "-ldl"], check=True)
    return ctypes.CDLL(str(lib))


class CTokenizer:
    def __init__(self, lib: ctypes.CDLL, model: Path) -> None:
        self.lib = lib
        lib.colibri_tokenize.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int,
                                         ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_size_t)]
        lib.colibri_init.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.ctx = ctypes.c_void_p()
        if lib.colibri_init(ctypes.byref(self.ctx), str(model).encode()) != 0:
            raise RuntimeError(f"cannot load {model}")
        self.cap = 1 << 20
        self.buf = (ctypes.c_int32 * self.cap)()
        self.n = ctypes.c_size_t()

    def encode(self, raw: bytes) -> list[int]:
        st = self.lib.colibri_tokenize(self.ctx, raw, len(raw), 1, self.buf, self.cap, ctypes.byref(self.n))
        if st:
            raise RuntimeError(f"colibri_tokenize: status {st}")
        return self.buf[: self.n.value]

    def encode_only(self, raw: bytes) -> None:
        self.lib.colibri_tokenize(self.ctx, raw, len(raw), 1, self.buf, self.cap, ctypes.byref(self.n))


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="qwen2,olmoe,mixtral")
    ap.add_argument("--vocab", type=int, default=8000, help="trained vocabulary size (default 8000)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--passes", type=int, default=40, help="corpus passes per measurement")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer, __version__ as tk_version

    corpus = json.loads(H.TOKENIZER_CORPUS.read_text(encoding="utf-8"))
    texts = [t for t in corpus if t]
    raws = [t.encode() for t in texts]
    doc = "\n".join(texts * args.passes)
    doc_raw = doc.encode()
    prompt_bytes = sum(len(r) for r in raws) * args.passes
    print(f"tokenizers {tk_version} (RAYON_NUM_THREADS=1), corpus {len(texts)} texts, "
          f"prompts {prompt_bytes / 1e3:.0f} KB ({args.passes} passes), document {len(doc_raw) / 1e3:.0f} KB; best of {args.repeat}")
    print(f"{'family':8} {'workload':9} {'C MB/s':>8} {'tokenizers MB/s':>16} {'ratio':>6}  ids")
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_library(Path(tmp))
        for fam in args.families.split(","):
            d = Path(tmp) / fam
            H.train_tokenizer(fam, args.vocab, d, texts=H.tokenizer_training_texts() * 3)
            spec = load_tokenizer(d)
            assert spec is not None
            model = write_text_model(d / "m.colibri", spec.blobs(), (len(spec.vocab) + 63) // 64 * 64)
            c = CTokenizer(lib, model)
            ref = Tokenizer.from_file(str(d / "tokenizer.json"))
            same = all(c.encode(r) == ref.encode(t).ids for r, t in zip(raws, texts))
            same = same and c.encode(doc_raw) == ref.encode(doc).ids
            for name, nbytes, cfn, rfn in (
                ("prompts", prompt_bytes,
                 lambda: [c.encode_only(r) for _ in range(args.passes) for r in raws],
                 lambda: [ref.encode(t) for _ in range(args.passes) for t in texts]),
                ("document", len(doc_raw), lambda: c.encode_only(doc_raw), lambda: ref.encode(doc)),
            ):
                tc = tr = float("inf")
                for _ in range(args.repeat):  # interleaved
                    tc = min(tc, best(cfn, 1))
                    tr = min(tr, best(rfn, 1))
                print(f"{fam:8} {name:9} {nbytes / tc / 1e6:8.2f} {nbytes / tr / 1e6:16.2f} {tr / tc:6.2f}  "
                      f"{'equal' if same else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
