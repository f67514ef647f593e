/* The model's tokenizer: load and validate the tokenizer.* blobs, encode text to ids and decode
 * ids to text exactly as the `tokenizers` library does for the supported families (see
 * tokenizer.h, docs/runtime.md "Tokenizer"). Every length and offset read from the file is
 * checked before use; encode/decode read the loaded tables only and allocate their own scratch
 * memory, so concurrent calls on one model are safe. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/le.h"

/* Character classes of the pre-tokenizer regexes (unicode_tables.c, colibri_kit/model/unicode_gen.py):
 * \p{L} = UPPER (Lu Lt) | LOWER (Ll) | LETTER (Lm Lo); \p{M} = MARK; \p{N} = NUMBER; \s = SPACE. */
enum { C_OTHER = 0, C_SPACE = 1, C_NUMBER = 2, C_UPPER = 3, C_LOWER = 4, C_LETTER = 5, C_MARK = 6 };
#define C_NFC_MAYBE 8
#define BAD_CP 0x110000u /* an invalid UTF-8 byte b is the unit BAD_CP + b */
#define IS_L(k) ((k) >= C_UPPER && (k) <= C_LETTER)

/* Work counter for the tests' linear-time checks (tests/test_tokenizer_unicode.py builds the
 * tokenizer with -DCOLIBRI_TOK_COUNT_WORK and compares the count of a 64 KiB and a 1 MiB input). */
#ifdef COLIBRI_TOK_COUNT_WORK
unsigned long long colibri_tok_work;
#define WORK(x) (colibri_tok_work += (unsigned long long)(x))
#else
#define WORK(x) ((void)0)
#endif

/* ---- growable buffers (scratch of one call) -------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} bytes_buf;

static int bb_reserve(bytes_buf *b, size_t more) {
    if (b->oom) return 0;
    if (b->n + more <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return 0; }
    b->p = p;
    b->cap = cap;
    return 1;
}
static void bb_put(bytes_buf *b, const void *src, size_t n) {
    if (n && bb_reserve(b, n)) { memcpy(b->p + b->n, src, n); b->n += n; }
}

typedef struct {
    int32_t *p;
    size_t n, cap;
    int oom;
} ids_buf;

static void ib_put(ids_buf *b, uint32_t id) {
    if (b->oom) return;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        int32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = (int32_t)id;
}

/* ---- UTF-8 and Unicode properties ------------------------------------------------------------ */

/* Decode one unit at s[0..n) (n >= 1): a valid UTF-8 character (RFC 3629: no overlongs, no
 * surrogates, <= U+10FFFF), or one invalid byte b as BAD_CP + b. Returns its length. */
static size_t u8dec(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    size_t len;
    uint32_t c, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; c = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3; c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4; c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else { *cp = BAD_CP + b; return 1; }
    if (n < len || s[1] < lo || s[1] > hi) { *cp = BAD_CP + b; return 1; }
    c = c << 6 | (s[1] & 0x3F);
    for (size_t k = 2; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) { *cp = BAD_CP + b; return 1; }
        c = c << 6 | (s[k] & 0x3F);
    }
    *cp = c;
    return len;
}

static size_t u8enc(uint32_t cp, uint8_t *o) {
    if (cp >= BAD_CP) { o[0] = (uint8_t)(cp - BAD_CP); return 1; }
    if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
    if (cp < 0x800) { o[0] = (uint8_t)(0xC0 | cp >> 6); o[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12); o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18); o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)); o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

static const uint8_t *uc_rec(uint32_t cp) {
    static const uint8_t none[2] = {C_OTHER, 0};
    if (cp >= BAD_CP) return none;
    return colibri_uc_records[colibri_uc_stage2[(size_t)colibri_uc_stage1[cp >> 8] * 256 + (cp & 255)]];
}
static int uc_class(uint32_t cp) { return uc_rec(cp)[0] & 7; }
static uint8_t uc_ccc(uint32_t cp) { return uc_rec(cp)[1]; }

/* ---- NFC (Unicode Standard Annex #15: decompose, order marks, compose) ---------------------- */

#define H_SBASE 0xAC00u
#define H_LBASE 0x1100u
#define H_VBASE 0x1161u
#define H_TBASE 0x11A7u
#define H_LCOUNT 19u
#define H_VCOUNT 21u
#define H_TCOUNT 28u
#define H_NCOUNT (H_VCOUNT * H_TCOUNT)
#define H_SCOUNT (H_LCOUNT * H_NCOUNT)

typedef struct {
    uint32_t *p;
    size_t n, cap;
    int oom;
} cps_buf;

static void cb_put(cps_buf *b, uint32_t c) {
    if (b->oom) return;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        uint32_t *p = realloc(b->p, cap * sizeof *p);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    b->p[b->n++] = c;
}

static void decompose(uint32_t c, cps_buf *out) {
    if (c >= H_SBASE && c < H_SBASE + H_SCOUNT) {
        uint32_t s = c - H_SBASE;
        cb_put(out, H_LBASE + s / H_NCOUNT);
        cb_put(out, H_VBASE + (s % H_NCOUNT) / H_TCOUNT);
        if (s % H_TCOUNT) cb_put(out, H_TBASE + s % H_TCOUNT);
        return;
    }
    if (c < BAD_CP && (uc_rec(c)[0] & C_NFC_MAYBE)) {
        uint32_t lo = 0, hi = colibri_uc_ndecomp;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (colibri_uc_decomp[mid][0] == c) {
                for (uint32_t k = 0; k < colibri_uc_decomp[mid][2]; k++)
                    cb_put(out, colibri_uc_decomp_pool[colibri_uc_decomp[mid][1] + k]);
                return;
            }
            if (colibri_uc_decomp[mid][0] < c) lo = mid + 1;
            else hi = mid;
        }
    }
    cb_put(out, c);
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= H_LBASE && a < H_LBASE + H_LCOUNT && b >= H_VBASE && b < H_VBASE + H_VCOUNT)
        return H_SBASE + ((a - H_LBASE) * H_VCOUNT + (b - H_VBASE)) * H_TCOUNT;
    if (a >= H_SBASE && a < H_SBASE + H_SCOUNT && (a - H_SBASE) % H_TCOUNT == 0 && b > H_TBASE &&
        b < H_TBASE + H_TCOUNT)
        return a + (b - H_TBASE);
    if (a >= BAD_CP || b >= BAD_CP) return 0;
    uint64_t key = (uint64_t)a << 21 | b;
    uint32_t lo = 0, hi = colibri_uc_ncomp;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (colibri_uc_comp[mid][0] == key) return (uint32_t)colibri_uc_comp[mid][1];
        if (colibri_uc_comp[mid][0] < key) lo = mid + 1;
        else hi = mid;
    }
    return 0;
}

/* Stable counting sort of run[0..n) by combining class; `tmp` grows to n code points (reused by
 * the caller across runs). Returns non-zero when out of memory. */
static int sort_run(uint32_t *run, size_t n, cps_buf *tmp) {
    size_t count[257] = {0};
    tmp->n = 0;
    for (size_t i = 0; i < n; i++) { count[uc_ccc(run[i]) + 1]++; cb_put(tmp, 0); }
    if (tmp->oom) return 1;
    for (int c = 1; c <= 256; c++) count[c] += count[c - 1];
    for (size_t i = 0; i < n; i++) tmp->p[count[uc_ccc(run[i])]++] = run[i];
    memcpy(run, tmp->p, n * sizeof *run);
    WORK(2 * n + 256);
    return 0;
}

/* NFC of s[0..n) appended to out. Text without any character that NFC can change is copied. */
static void nfc(const uint8_t *s, size_t n, bytes_buf *out) {
    int maybe = 0;
    for (size_t i = 0; i < n && !maybe;) {
        if (s[i] < 0x80) { i++; continue; }
        uint32_t c;
        i += u8dec(s + i, n - i, &c);
        maybe = (uc_rec(c)[0] & C_NFC_MAYBE) != 0;
    }
    if (!maybe) { bb_put(out, s, n); return; }
    cps_buf d = {0}, scratch = {0};
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += u8dec(s + i, n - i, &c);
        decompose(c, &d);
    }
    /* canonical order: stable sort of each run of non-starters by combining class. Linear in
     * the text whatever it holds: short runs by insertion, long runs (an adversarial prompt of
     * a million marks) by a stable counting sort over the 256 classes. */
    for (size_t a = 0; a < d.n;) {
        if (!uc_ccc(d.p[a])) { a++; WORK(1); continue; }
        size_t b = a;
        while (b < d.n && uc_ccc(d.p[b])) b++;
        WORK(b - a);
        if (b - a <= 16) {
            for (size_t i = a + 1; i < b; i++) {
                uint32_t c = d.p[i];
                uint8_t cc = uc_ccc(c);
                size_t j = i;
                while (j > a && uc_ccc(d.p[j - 1]) > cc) { d.p[j] = d.p[j - 1]; j--; WORK(1); }
                d.p[j] = c;
            }
        } else if (sort_run(d.p + a, b - a, &scratch)) {
            d.oom = 1;
        }
        a = b;
    }
    /* canonical composition */
    size_t w = 0, starter = (size_t)-1;
    int last_cc = -1; /* class of the last character kept after the starter, -1: none */
    for (size_t i = 0; i < d.n; i++) {
        uint32_t c = d.p[i];
        int cc = uc_ccc(c);
        WORK(1);
        if (starter != (size_t)-1 && (last_cc == -1 || (last_cc != 0 && last_cc < cc))) {
            uint32_t comp = compose(d.p[starter], c);
            if (comp) { d.p[starter] = comp; continue; }
        }
        if (cc == 0) { starter = w; last_cc = -1; }
        else last_cc = cc;
        d.p[w++] = c;
    }
    if (d.oom) out->oom = 1;
    uint8_t enc[4];
    for (size_t i = 0; i < w; i++) bb_put(out, enc, u8enc(d.p[i], enc));
    free(d.p);
    free(scratch.p);
}

/* ---- pre-tokenizer regexes, hand-compiled --------------------------------------------------- */

/* What each regex calls a letter: the GPT-2, Qwen2 and Llama-3 regexes \p{L} (a mark is OTHER:
 * punctuation to them); Qwen3.5's [\p{L}\p{M}] (a mark joins words and leaves the punctuation
 * class [^\s\p{L}\p{M}\p{N}]). o200k reads the raw classes (its case classes). */
static const uint8_t MAP_L[8] = {C_OTHER, C_SPACE, C_NUMBER, C_LETTER, C_LETTER, C_LETTER, C_OTHER, C_OTHER};
static const uint8_t MAP_LM[8] = {C_OTHER, C_SPACE, C_NUMBER, C_LETTER, C_LETTER, C_LETTER, C_LETTER, C_OTHER};

static int class_at(const uint8_t *s, size_t n, size_t i, const uint8_t *map, uint32_t *cp,
                    size_t *len) {
    *len = u8dec(s + i, n - i, cp);
    return map[uc_class(*cp)];
}

static size_t run_of(const uint8_t *s, size_t n, size_t i, const uint8_t *map, int cls) {
    uint32_t c;
    size_t l;
    while (i < n && class_at(s, n, i, map, &c, &l) == cls) i += l;
    return i;
}

/* 's 't 're 've 'm 'll 'd after the apostrophe at i - 1; `fold`: (?i:...) of Oniguruma, where
 * 's' also matches U+017F LATIN SMALL LETTER LONG S (Unicode simple case folding). */
static size_t contraction(const uint8_t *s, size_t n, size_t i, int fold) {
    if (i >= n) return 0;
    uint8_t a = s[i], b = i + 1 < n ? s[i + 1] : 0;
    if (fold) {
        if (a >= 'A' && a <= 'Z') a = (uint8_t)(a + 32);
        if (b >= 'A' && b <= 'Z') b = (uint8_t)(b + 32);
        if (a == 0xC5 && b == 0xBF) return i + 2; /* ſ */
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 1;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 2;
    return 0;
}

/* \s+(?!\S)|\s+ from i (a space character): the run, less its last character when a non-space
 * follows and the run is longer than one character. `nl`: first try \s*[\r\n]+ (the regexes of
 * Llama-3 heritage). */
static size_t spaces(const uint8_t *s, size_t n, size_t i, int nl) {
    size_t j = i, last = i, after_nl = 0;
    uint32_t c;
    size_t l;
    while (j < n && class_at(s, n, j, MAP_L, &c, &l) == C_SPACE) {
        last = j;
        j += l;
        if (c == '\r' || c == '\n') after_nl = j;
    }
    if (nl && after_nl) return after_nl;
    if (j == n || last == i) return j;
    return last;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(const uint8_t *s, size_t n, size_t i) {
    uint32_t c, c2;
    size_t l, l2;
    int k = class_at(s, n, i, MAP_L, &c, &l);
    if (c == '\'') {
        size_t e = contraction(s, n, i + 1, 0);
        if (e) return e;
    }
    if (k != C_SPACE) return run_of(s, n, i, MAP_L, k);
    if (c == ' ' && i + 1 < n) {
        int k2 = class_at(s, n, i + 1, MAP_L, &c2, &l2);
        if (k2 != C_SPACE) return run_of(s, n, i + 1, MAP_L, k2);
    }
    return spaces(s, n, i, 0);
}

/* Qwen2 (digits = 1), Llama-3 (digits = 3) with map MAP_L, and Qwen3.5 (digits = 1) with MAP_LM:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}| ?[^\s\p{L}\p{N}]+[\r\n]*
 * |\s*[\r\n]+|\s+(?!\S)|\s+    (Qwen3.5: [\p{L}\p{M}] for \p{L}, a mark is no prefix then: a mark
 * as the optional prefix would be followed by a word that the mark starts anyway) */
static size_t match_llama3(const uint8_t *s, size_t n, size_t i, uint32_t digits, const uint8_t *map) {
    uint32_t c, c2;
    size_t l, l2;
    int k = class_at(s, n, i, map, &c, &l);
    if (c == '\'') {
        size_t e = contraction(s, n, i + 1, 1);
        if (e) return e;
    }
    if (k == C_LETTER) return run_of(s, n, i, map, C_LETTER);
    if (k != C_NUMBER && c != '\r' && c != '\n' && i + l < n &&
        class_at(s, n, i + l, map, &c2, &l2) == C_LETTER)
        return run_of(s, n, i + l, map, C_LETTER);
    if (k == C_NUMBER) {
        size_t j = i;
        for (uint32_t d = 0; d < digits && j < n && class_at(s, n, j, map, &c2, &l2) == C_NUMBER; d++)
            j += l2;
        return j;
    }
    size_t j = (c == ' ' && i + 1 < n) ? i + 1 : i;
    if (class_at(s, n, j, map, &c2, &l2) == C_OTHER) {
        j = run_of(s, n, j, map, C_OTHER);
        while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    return spaces(s, n, i, 1);
}

/* o200k's word classes: UP = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], LO = [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
static int o2_up(int k) { return k == C_UPPER || k == C_LETTER || k == C_MARK; }
static int o2_lo(int k) { return k == C_LOWER || k == C_LETTER || k == C_MARK; }

/* the raw class of the unit at i and its length */
static int raw_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint32_t c;
    *len = u8dec(s + i, n - i, &c);
    return uc_class(c);
}

/* One word alternative of o200k at `a` (after the optional prefix), Oniguruma's backtracking
 * spelled out; 0 when it does not match. alt 1: UP* LO+ ; alt 2: UP+ LO* ; both then the
 * optional (?i:'s|'t|'re|'ve|'m|'ll|'d). UP* takes the longest run; LO+ must then start either
 * at the run's end (a lower-case letter, and LO+ runs on) or, giving back, at the run's last
 * character that is both (Lm Lo M): what follows it in the run is upper-case only. For alt 2,
 * LO* could only extend over a lower-case letter, and then alt 1 would have matched. */
static size_t o200k_word(const uint8_t *s, size_t n, size_t a, int alt) {
    size_t l, b = a, last_both = 0;
    int k = C_OTHER;
    while (b < n && o2_up(k = raw_at(s, n, b, &l))) {
        b += l;
        if (o2_lo(k)) last_both = b;
    }
    size_t e;
    if (alt == 1) {
        if (b < n && k == C_LOWER) {
            e = b;
            while (e < n && o2_lo(raw_at(s, n, e, &l))) e += l;
        } else if (last_both) {
            e = last_both;
        } else {
            return 0;
        }
    } else {
        if (b == a) return 0;
        e = b;
    }
    if (e < n && s[e] == '\'') {
        size_t ce = contraction(s, n, e + 1, 1);
        if (ce) e = ce;
    }
    return e;
}

/* o200k (gpt-oss's o200k_harmony, tiktoken's o200k_base pat_str):
 * [^\r\n\p{L}\p{N}]?UP*LO+C?|[^\r\n\p{L}\p{N}]?UP+LO*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*
 * |\s*[\r\n]+|\s+(?!\S)|\s+   Each alternative is tried with the prefix, then without. */
static size_t match_o200k(const uint8_t *s, size_t n, size_t i) {
    uint32_t c;
    size_t l, l2;
    l = u8dec(s + i, n - i, &c);
    int k = uc_class(c);
    int prefix = !IS_L(k) && k != C_NUMBER && c != '\r' && c != '\n';
    for (int alt = 1; alt <= 2; alt++) {
        size_t e;
        if (prefix && i + l < n && (e = o200k_word(s, n, i + l, alt))) return e;
        if ((e = o200k_word(s, n, i, alt))) return e;
    }
    size_t j = i;
    if (k == C_NUMBER) {
        for (int d = 0; d < 3 && j < n && raw_at(s, n, j, &l2) == C_NUMBER; d++) j += l2;
        return j;
    }
    if (c == ' ' && i + 1 < n) j = i + 1; /*  ?[^\s\p{L}\p{N}]+ : a mark counts as punctuation */
    int kj = raw_at(s, n, j, &l2);
    if (kj != C_SPACE && !IS_L(kj) && kj != C_NUMBER) {
        while (j < n && (kj = raw_at(s, n, j, &l2)) != C_SPACE && !IS_L(kj) && kj != C_NUMBER) j += l2;
        while (j < n && (s[j] == '\r' || s[j] == '\n' || s[j] == '/')) j++;
        return j;
    }
    return spaces(s, n, i, 1);
}

/* ---- hash tables ---------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return mix64(h ^ n);
}

static int merge_find(const colibri_tokenizer *t, uint32_t a, uint32_t b, uint32_t *rank,
                      uint32_t *newid) {
    if (!t->n_merges) return 0;
    uint64_t key = ((uint64_t)a << 32 | b) + 1;
    for (uint32_t h = (uint32_t)mix64(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        if (t->merge_key[h] == 0) return 0;
        if (t->merge_key[h] == key) {
            *rank = t->merge_rank[h];
            *newid = t->merge_new[h];
            return 1;
        }
    }
}

static const uint8_t *piece(const colibri_tokenizer *t, uint32_t id, size_t *len) {
    *len = t->vocab_off[id + 1] - t->vocab_off[id];
    return t->vocab_bytes + t->vocab_off[id];
}

static uint32_t vocab_find(const colibri_tokenizer *t, const uint8_t *p, size_t n) {
    for (uint32_t h = (uint32_t)hash_bytes(p, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slot[h];
        if (!v) return COLIBRI_TOK_NO_ID;
        size_t l;
        const uint8_t *q = piece(t, v - 1, &l);
        if (l == n && memcmp(p, q, n) == 0) return v - 1;
    }
}

/* ---- BPE (the `tokenizers` Word::merge_all order: lowest rank, then leftmost) --------------- */

typedef struct {
    uint32_t id;
    int32_t prev, next;
    uint32_t len;
} symbol;

typedef struct {
    uint32_t rank, pos, newid;
} merge_ent;

static int merge_before(const merge_ent *a, const merge_ent *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}
static void heap_push(merge_ent *h, size_t *n, merge_ent e) {
    size_t i = (*n)++;
    h[i] = e;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_before(&h[i], &h[p])) break;
        merge_ent tmp = h[i]; h[i] = h[p]; h[p] = tmp;
        i = p;
    }
}
static merge_ent heap_pop(merge_ent *h, size_t *n) {
    merge_ent top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && merge_before(&h[l], &h[m])) m = l;
        if (r < *n && merge_before(&h[r], &h[m])) m = r;
        if (m == i) break;
        merge_ent tmp = h[i]; h[i] = h[m]; h[m] = tmp;
        i = m;
    }
    return top;
}

typedef struct {
    symbol *sym;
    merge_ent *heap;
    size_t cap; /* entries of both */
} bpe_scratch;

static int scratch_reserve(bpe_scratch *sc, size_t n) {
    if (n <= sc->cap) return 1;
    size_t cap = sc->cap ? sc->cap : 64;
    while (cap < n) cap *= 2;
    symbol *s = realloc(sc->sym, cap * sizeof *s);
    if (!s) return 0;
    sc->sym = s;
    merge_ent *h = realloc(sc->heap, cap * 2 * sizeof *h); /* each merge pushes at most 2 */
    if (!h) return 0;
    sc->heap = h;
    sc->cap = cap;
    return 1;
}

static void sym_add(symbol *sym, size_t *n, uint32_t id, uint32_t len) {
    sym[*n].id = id;
    sym[*n].len = len;
    sym[*n].prev = (int32_t)*n - 1;
    sym[*n].next = (int32_t)*n + 1;
    (*n)++;
}

/* One word (pre-token) -> ids. Byte-level: units are bytes; SentencePiece: UTF-8 characters
 * (an invalid byte is a unit of its own), unknown ones by byte fallback or the unk token. */
static void bpe_word(const colibri_tokenizer *t, const uint8_t *w, size_t n, bpe_scratch *sc,
                     ids_buf *out) {
    if (n == 0) return;
    if (t->flags & COLIBRI_TOK_F_IGNORE_MERGES) {
        uint32_t id = vocab_find(t, w, n);
        if (id != COLIBRI_TOK_NO_ID) { ib_put(out, id); return; }
    }
    /* units <= n; byte fallback gives at most 4 symbols per unit of <= 4 bytes: <= n symbols */
    if (!scratch_reserve(sc, n + 1)) { out->oom = 1; return; }
    symbol *sym = sc->sym;
    size_t ns = 0;
    int byte_level = t->model == COLIBRI_TOK_MODEL_BYTE_BPE;
    uint32_t unk = COLIBRI_TOK_NO_ID, unk_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t l = byte_level ? 1 : u8dec(w + i, n - i, &c);
        uint32_t id = byte_level ? t->byte_id[w[i]] : vocab_find(t, w + i, l);
        if (id != COLIBRI_TOK_NO_ID) {
            if (unk != COLIBRI_TOK_NO_ID) { sym_add(sym, &ns, unk, unk_len); unk = COLIBRI_TOK_NO_ID; }
            sym_add(sym, &ns, id, (uint32_t)l);
        } else {
            int done = 0;
            if (t->flags & COLIBRI_TOK_F_BYTE_FALLBACK) {
                done = 1;
                for (size_t k = 0; k < l; k++) done &= t->byte_id[w[i + k]] != COLIBRI_TOK_NO_ID;
                if (done)
                    for (size_t k = 0; k < l; k++) sym_add(sym, &ns, t->byte_id[w[i + k]], 1);
            }
            if (!done && t->unk_id != COLIBRI_TOK_NO_ID) {
                if (unk != COLIBRI_TOK_NO_ID && (t->flags & COLIBRI_TOK_F_FUSE_UNK)) {
                    unk_len += (uint32_t)l;
                } else {
                    if (unk != COLIBRI_TOK_NO_ID) sym_add(sym, &ns, unk, unk_len);
                    unk = t->unk_id;
                    unk_len = (uint32_t)l;
                }
            }
        }
        i += l;
    }
    if (unk != COLIBRI_TOK_NO_ID) sym_add(sym, &ns, unk, unk_len);
    if (ns == 0) return;
    sym[ns - 1].next = -1;
    size_t nh = 0;
    uint32_t rank, nid;
    for (size_t i = 0; i + 1 < ns; i++)
        if (merge_find(t, sym[i].id, sym[i + 1].id, &rank, &nid))
            heap_push(sc->heap, &nh, (merge_ent){rank, (uint32_t)i, nid});
    while (nh) {
        merge_ent top = heap_pop(sc->heap, &nh);
        symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next == -1) continue;
        symbol right = sym[cur->next];
        if (!merge_find(t, cur->id, right.id, &rank, &nid) || nid != top.newid) continue;
        sym[cur->next].len = 0;
        cur->id = top.newid;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0) sym[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_find(t, sym[cur->prev].id, cur->id, &rank, &nid))
            heap_push(sc->heap, &nh, (merge_ent){rank, (uint32_t)cur->prev, nid});
        if (cur->next >= 0 && merge_find(t, cur->id, sym[cur->next].id, &rank, &nid))
            heap_push(sc->heap, &nh, (merge_ent){rank, top.pos, nid});
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) ib_put(out, sym[i].id);
}

/* ---- added tokens --------------------------------------------------------------------------- */

/* Leftmost, then longest added token (of the wanted `normalized` kind) in s[from..n), as the
 * `tokenizers` added vocabulary matches (Aho-Corasick, leftmost-longest); returns its index or
 * -1, and the span it covers with lstrip/rstrip white space in [*a, *b). The trie walk from a
 * position is as long as the longest added token that starts there (gpt-oss has 1,090 added
 * tokens, all "<|...|>": a byte that starts none costs one table look-up). */
static int find_added(const colibri_tokenizer *t, const uint8_t *s, size_t from, size_t n,
                      int normalized, size_t *a, size_t *b) {
    const colibri_added_node *nodes = t->trie;
    for (size_t i = from; i < n; i++) {
        uint32_t node = t->trie_root[s[i]];
        WORK(1);
        if (!node) continue;
        int best = -1;
        for (size_t k = i;;) {
            WORK(1);
            if (nodes[node].tok[normalized] >= 0) best = nodes[node].tok[normalized];
            if (++k >= n) break;
            uint32_t c = nodes[node].child;
            while (c && nodes[c].byte != s[k]) c = nodes[c].sibling;
            if (!c) break;
            node = c;
        }
        if (best < 0) continue;
        const colibri_added_token *at = &t->added[best];
        size_t st = i, en = i + at->len;
        if (at->flags & COLIBRI_TOK_A_LSTRIP) { /* absorb white space before it */
            while (st > from) {
                size_t p = st - 1;
                while (p > from && (s[p] & 0xC0) == 0x80 && st - p < 4) p--;
                uint32_t c;
                size_t l = u8dec(s + p, n - p, &c);
                if (p + l != st || uc_class(c) != C_SPACE) break;
                st = p;
            }
        }
        if (at->flags & COLIBRI_TOK_A_RSTRIP) {
            uint32_t c;
            size_t l;
            while (en < n && class_at(s, n, en, MAP_L, &c, &l) == C_SPACE) en += l;
        }
        *a = st;
        *b = en;
        return best;
    }
    return -1;
}

typedef struct {
    const colibri_tokenizer *t;
    bpe_scratch sc;
    bytes_buf norm, meta;
    ids_buf out;
} enc_state;

static const uint8_t META[3] = {0xE2, 0x96, 0x81}; /* U+2581 "▁" */
static const uint8_t REPL[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */

/* `first`: the piece starts at offset 0 of the original text (Metaspace prepend_scheme first). */
static void pretok_and_bpe(enc_state *e, const uint8_t *s, size_t n, int first) {
    const colibri_tokenizer *t = e->t;
    if (n == 0) return;
    if (t->pretok == COLIBRI_TOK_PRE_NONE) { bpe_word(t, s, n, &e->sc, &e->out); return; }
    if (t->pretok == COLIBRI_TOK_PRE_METASPACE) { /* spaces -> "▁", maybe one prepended; no split */
        e->meta.n = 0;
        int starts = s[0] == ' ' || (n >= 3 && !memcmp(s, META, 3));
        if (!starts && (t->digits == COLIBRI_TOK_META_ALWAYS ||
                        (t->digits == COLIBRI_TOK_META_FIRST && first)))
            bb_put(&e->meta, META, 3);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') bb_put(&e->meta, META, 3);
            else bb_put(&e->meta, s + i, 1);
        }
        if (e->meta.oom) { e->out.oom = 1; return; }
        bpe_word(t, e->meta.p, e->meta.n, &e->sc, &e->out);
        return;
    }
    for (size_t i = 0; i < n && !e->out.oom;) {
        size_t j = t->pretok == COLIBRI_TOK_PRE_GPT2    ? match_gpt2(s, n, i)
                 : t->pretok == COLIBRI_TOK_PRE_O200K   ? match_o200k(s, n, i)
                 : t->pretok == COLIBRI_TOK_PRE_QWEN35  ? match_llama3(s, n, i, t->digits, MAP_LM)
                                                        : match_llama3(s, n, i, t->digits, MAP_L);
        if (j <= i) j = i + 1; /* cannot happen: every unit matches an alternative */
        bpe_word(t, s + i, j - i, &e->sc, &e->out);
        i = j;
    }
}

/* A stretch of text between non-normalized added tokens: normalize, split at normalized added
 * tokens, pre-tokenize and BPE the rest. */
static void encode_segment(enc_state *e, const uint8_t *s, size_t n, int first) {
    const colibri_tokenizer *t = e->t;
    if (n == 0) return;
    e->norm.n = 0;
    if (t->normalizer == COLIBRI_TOK_NORM_NFC) {
        nfc(s, n, &e->norm);
    } else if (t->normalizer == COLIBRI_TOK_NORM_SP) {
        bb_put(&e->norm, META, 3);
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') bb_put(&e->norm, META, 3);
            else bb_put(&e->norm, s + i, 1);
        }
    } else if (t->normalizer == COLIBRI_TOK_NORM_SP_MODEL) { /* + invalid UTF-8 -> U+FFFD */
        bb_put(&e->norm, META, 3);
        for (size_t i = 0; i < n;) {
            uint32_t c;
            size_t l = s[i] < 0x80 ? 1 : u8dec(s + i, n - i, &c);
            if (s[i] == ' ') bb_put(&e->norm, META, 3);
            else if (s[i] >= 0x80 && c >= BAD_CP) bb_put(&e->norm, REPL, 3);
            else bb_put(&e->norm, s + i, l);
            i += l;
        }
    } else {
        bb_put(&e->norm, s, n);
    }
    if (e->norm.oom) { e->out.oom = 1; return; }
    const uint8_t *p = e->norm.p;
    size_t m = e->norm.n, at = 0, a, b;
    int k;
    while ((k = find_added(t, p, at, m, 1, &a, &b)) >= 0) {
        pretok_and_bpe(e, p + at, a - at, first && at == 0);
        ib_put(&e->out, t->added[k].id);
        at = b;
    }
    pretok_and_bpe(e, p + at, m - at, first && at == 0);
}

colibri_status colibri_tokenizer_encode(const colibri_tokenizer *t, const char *text, size_t len,
                                        int add_special, int32_t *ids, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!t || (!text && len) || !n_out || (!ids && cap)) return COLIBRI_E_INVALID_ARG;
    enc_state e = {.t = t};
    const uint8_t *s = (const uint8_t *)text;
    if (add_special && (t->flags & COLIBRI_TOK_F_ADD_BOS)) ib_put(&e.out, t->bos_id);
    size_t at = 0, a, b;
    int k;
    while (len && (k = find_added(t, s, at, len, 0, &a, &b)) >= 0) {
        encode_segment(&e, s + at, a - at, at == 0);
        ib_put(&e.out, t->added[k].id);
        at = b;
    }
    if (len) encode_segment(&e, s + at, len - at, at == 0);
    if (add_special && (t->flags & COLIBRI_TOK_F_ADD_EOS)) ib_put(&e.out, t->eos_id);
    colibri_status st = COLIBRI_OK;
    if (e.out.oom) {
        st = COLIBRI_E_NO_MEMORY;
    } else {
        *n_out = e.out.n;
        if (e.out.n > cap) st = COLIBRI_E_BUFFER_TOO_SMALL;
        else if (e.out.n) memcpy(ids, e.out.p, e.out.n * sizeof *ids);
    }
    free(e.out.p);
    free(e.norm.p);
    free(e.meta.p);
    free(e.sc.sym);
    free(e.sc.heap);
    return st;
}

/* ---- decoding ------------------------------------------------------------------------------- */


/* Append s[0..n) with each maximal invalid UTF-8 subpart replaced by U+FFFD (what Rust's
 * String::from_utf8_lossy does, which the ByteLevel decoder uses). */
static void lossy(bytes_buf *o, const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        if (b < 0x80) { bb_put(o, s + i, 1); i++; continue; }
        size_t len = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b >= 0xE0 && b <= 0xEF) { len = 3; lo = b == 0xE0 ? 0xA0 : 0x80; hi = b == 0xED ? 0x9F : 0xBF; }
        else if (b >= 0xF0 && b <= 0xF4) { len = 4; lo = b == 0xF0 ? 0x90 : 0x80; hi = b == 0xF4 ? 0x8F : 0xBF; }
        if (!len) { bb_put(o, REPL, 3); i++; continue; }
        size_t k = 1;
        if (i + 1 < n && s[i + 1] >= lo && s[i + 1] <= hi) {
            k = 2;
            while (k < len && i + k < n && (s[i + k] & 0xC0) == 0x80) k++;
        }
        if (k == len) bb_put(o, s + i, len);
        else bb_put(o, REPL, 3);
        i += k;
    }
}

static int hexval(uint8_t c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
         : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}
/* "<0xHH>" (validated at load) -> the byte */
static uint8_t byte_value(const uint8_t *p) { return (uint8_t)(hexval(p[3]) * 16 + hexval(p[4])); }

static int utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t c;
        i += u8dec(s + i, n - i, &c);
        if (c >= BAD_CP) return 0;
    }
    return 1;
}

static colibri_status check_id(const colibri_tokenizer *t, int32_t id, int *has) {
    if (id < 0) return COLIBRI_E_TOKEN_RANGE;
    *has = (uint32_t)id < t->n_vocab;
    return COLIBRI_OK;
}

colibri_status colibri_tokenizer_decode(const colibri_tokenizer *t, const int32_t *ids, size_t n,
                                        int skip_special, char *out, size_t cap, size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!t || (!ids && n) || !len_out || (!out && cap)) return COLIBRI_E_INVALID_ARG;
    bytes_buf raw = {0}, o = {0};
    colibri_status st = COLIBRI_OK;
    int sp = t->decoder == COLIBRI_TOK_DEC_SP;
    size_t bytes_from = 0, nbytes = 0; /* pending byte-fallback tokens (SentencePiece) */
    for (size_t i = 0; i <= n; i++) {
        int has = 0;
        if (i < n && (st = check_id(t, ids[i], &has))) break;
        uint32_t id = i < n ? (uint32_t)ids[i] : 0;
        if (i < n && (!has || (skip_special && (t->vocab_flags[id] & COLIBRI_TOK_V_SPECIAL))))
            continue;
        int is_byte = i < n && sp && (t->vocab_flags[id] & COLIBRI_TOK_V_BYTE);
        if (sp && nbytes && !is_byte) { /* flush: valid UTF-8 as is, else one U+FFFD per byte */
            if (utf8_valid(raw.p + bytes_from, nbytes)) {
                bb_put(&o, raw.p + bytes_from, nbytes);
            } else {
                for (size_t k = 0; k < nbytes; k++) bb_put(&o, REPL, 3);
            }
            raw.n = bytes_from;
            nbytes = 0;
        }
        if (i == n) break;
        size_t l;
        const uint8_t *p = piece(t, id, &l);
        if (!sp) { bb_put(&raw, p, l); continue; }
        if (is_byte) {
            if (!nbytes) bytes_from = raw.n;
            uint8_t v = byte_value(p);
            bb_put(&raw, &v, 1);
            nbytes++;
            continue;
        }
        for (size_t k = 0; k < l; k++) { /* Replace "▁" -> " " */
            if (k + 2 < l && p[k] == 0xE2 && p[k + 1] == 0x96 && p[k + 2] == 0x81) {
                bb_put(&o, " ", 1);
                k += 2;
            } else {
                bb_put(&o, p + k, 1);
            }
        }
    }
    if (!st) {
        if (!sp) lossy(&o, raw.p, raw.n);
        size_t skip = 0;
        for (uint32_t k = 0; sp && k < t->strip && skip < o.n && o.p[skip] == ' '; k++) skip++;
        if (o.oom || raw.oom) {
            st = COLIBRI_E_NO_MEMORY;
        } else {
            *len_out = o.n - skip;
            if (o.n - skip > cap) st = COLIBRI_E_BUFFER_TOO_SMALL;
            else if (o.n - skip) memcpy(out, o.p + skip, o.n - skip);
        }
    }
    free(raw.p);
    free(o.p);
    return st;
}

colibri_status colibri_tokenizer_piece(const colibri_tokenizer *t, int32_t id, char *out,
                                       size_t cap, size_t *len_out) {
    if (len_out) *len_out = 0;
    if (!t || !len_out || (!out && cap)) return COLIBRI_E_INVALID_ARG;
    int has;
    colibri_status st = check_id(t, id, &has);
    if (st) return st;
    if (!has) return COLIBRI_OK;
    size_t l, w = 0;
    const uint8_t *p = piece(t, (uint32_t)id, &l);
    uint8_t tmp[COLIBRI_TOK_MAX_PIECE];
    if (t->decoder == COLIBRI_TOK_DEC_SP && (t->vocab_flags[id] & COLIBRI_TOK_V_BYTE)) {
        tmp[w++] = byte_value(p);
    } else if (t->decoder == COLIBRI_TOK_DEC_SP) {
        for (size_t k = 0; k < l; k++) {
            if (k + 2 < l && p[k] == 0xE2 && p[k + 1] == 0x96 && p[k + 2] == 0x81) {
                tmp[w++] = ' ';
                k += 2;
            } else {
                tmp[w++] = p[k];
            }
        }
    } else {
        memcpy(tmp, p, l);
        w = l;
    }
    *len_out = w;
    if (w > cap) return COLIBRI_E_BUFFER_TOO_SMALL;
    memcpy(out, tmp, w);
    return COLIBRI_OK;
}

/* ---- loading and validation ----------------------------------------------------------------- */

static uint32_t table_size(uint32_t n) {
    uint32_t s = 16;
    while (s < 2 * n) s *= 2;
    return s;
}

colibri_status colibri_tokenizer_load(colibri_tokenizer *t, const colibri_tokenizer_blobs *b,
                                      uint32_t vocab_limit, char *why, size_t wl) {
    memset(t, 0, sizeof *t);
    size_t cl = b->config_len, vl = b->vocab_len, ml = b->merges_len, al = b->added_len;
    const uint8_t *cfg = b->config, *voc = b->vocab, *mer = b->merges, *add = b->added;
    if (!cfg && !voc && !mer && !add)
        return fail(why, wl, COLIBRI_E_NO_TOKENIZER,
                    "the model file has no tokenizer (format version %u); re-convert it with the "
                    "current kit: `invoke convert --hf-dir <checkpoint> --target <target> --out <file>`",
                    b->file_version);
    if (!cfg || !voc || !mer || !add)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER,
                    "tokenizer blobs incomplete: need tokenizer.config, .vocab, .merges and .added");
    if (cl < 4 * COLIBRI_TOK_CONFIG_WORDS)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config: %zu bytes, need >= %u", cl,
                    4 * COLIBRI_TOK_CONFIG_WORDS);
    uint32_t w[COLIBRI_TOK_CONFIG_WORDS];
    for (uint32_t i = 0; i < COLIBRI_TOK_CONFIG_WORDS; i++) w[i] = rd32(cfg + 4 * i);
    if (w[0] != 1)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config version %u (this runtime reads 1)",
                    w[0]);
    t->model = w[1]; t->normalizer = w[2]; t->pretok = w[3]; t->digits = w[4]; t->decoder = w[5];
    t->flags = w[6]; t->unk_id = w[7]; t->bos_id = w[8]; t->eos_id = w[9]; t->pad_id = w[10];
    t->n_vocab = w[11]; t->n_merges = w[12]; t->n_added = w[13]; t->n_stop = w[14]; t->strip = w[15];
    int bl = t->model == COLIBRI_TOK_MODEL_BYTE_BPE;
    if ((t->model != COLIBRI_TOK_MODEL_BYTE_BPE && t->model != COLIBRI_TOK_MODEL_SP_BPE) ||
        t->normalizer > COLIBRI_TOK_NORM_SP_MODEL || t->pretok > COLIBRI_TOK_PRE_QWEN35 ||
        ((t->pretok == COLIBRI_TOK_PRE_LLAMA3 || t->pretok == COLIBRI_TOK_PRE_METASPACE) &&
         (t->digits < 1 || t->digits > 3)) ||
        (t->pretok == COLIBRI_TOK_PRE_O200K && t->digits != 3) ||
        (t->pretok == COLIBRI_TOK_PRE_QWEN35 && t->digits != 1) ||
        (t->decoder != COLIBRI_TOK_DEC_BYTE_LEVEL && t->decoder != COLIBRI_TOK_DEC_SP) ||
        (bl != (t->decoder == COLIBRI_TOK_DEC_BYTE_LEVEL)) ||
        (bl != (t->pretok == COLIBRI_TOK_PRE_GPT2 || t->pretok == COLIBRI_TOK_PRE_LLAMA3 ||
                t->pretok == COLIBRI_TOK_PRE_O200K || t->pretok == COLIBRI_TOK_PRE_QWEN35)) ||
        (bl && t->normalizer > COLIBRI_TOK_NORM_NFC) ||
        (t->pretok == COLIBRI_TOK_PRE_METASPACE && t->normalizer != COLIBRI_TOK_NORM_NONE) ||
        (t->normalizer == COLIBRI_TOK_NORM_SP_MODEL && t->pretok != COLIBRI_TOK_PRE_NONE) ||
        t->flags > 63 || t->strip > 1)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER,
                    "tokenizer.config: unsupported combination model %u, normalizer %u, "
                    "pre-tokenizer %u (digits %u), decoder %u, flags 0x%x, strip %u",
                    t->model, t->normalizer, t->pretok, t->digits, t->decoder, t->flags, t->strip);
    for (uint32_t i = 16; i < COLIBRI_TOK_CONFIG_WORDS; i++)
        if (w[i]) return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config word %u must be 0", i);
    if (t->n_vocab == 0 || t->n_vocab > vocab_limit)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER,
                    "tokenizer vocabulary has %u pieces, the model's vocab_size is %u", t->n_vocab,
                    vocab_limit);
    if (t->n_stop > 1024 || cl != 4 * ((size_t)COLIBRI_TOK_CONFIG_WORDS + t->n_stop))
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config: %zu bytes for %u stop ids", cl,
                    t->n_stop);
    uint32_t ids4[4] = {t->unk_id, t->bos_id, t->eos_id, t->pad_id};
    for (int i = 0; i < 4; i++)
        if (ids4[i] != COLIBRI_TOK_NO_ID && ids4[i] >= t->n_vocab)
            return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config: special id %u >= %u pieces",
                        ids4[i], t->n_vocab);
    if (((t->flags & COLIBRI_TOK_F_ADD_BOS) && t->bos_id == COLIBRI_TOK_NO_ID) ||
        ((t->flags & COLIBRI_TOK_F_ADD_EOS) && t->eos_id == COLIBRI_TOK_NO_ID))
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config: adds BOS/EOS but has no id");
    /* vocab: u32 n, u32 offsets[n + 1], u8 flags[n], bytes */
    uint64_t head = 4 + 4 * ((uint64_t)t->n_vocab + 1) + t->n_vocab;
    if (vl < head || rd32(voc) != t->n_vocab)
        return fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.vocab: %zu bytes, too short for %u pieces",
                    vl, t->n_vocab);
    colibri_status st = COLIBRI_E_NO_MEMORY;
    t->vocab_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->vocab_off);
    t->stop_ids = malloc(((size_t)t->n_stop + 1) * sizeof *t->stop_ids);
    if (!t->vocab_off || !t->stop_ids) goto oom;
    for (uint32_t i = 0; i <= t->n_vocab; i++) {
        t->vocab_off[i] = rd32(voc + 4 + 4 * (size_t)i);
        if ((i == 0 && t->vocab_off[0] != 0) ||
            (i > 0 && (t->vocab_off[i] < t->vocab_off[i - 1] ||
                       t->vocab_off[i] - t->vocab_off[i - 1] > COLIBRI_TOK_MAX_PIECE))) {
            st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.vocab: offset %u of piece %u is bad",
                      t->vocab_off[i], i);
            goto bad;
        }
    }
    if ((uint64_t)t->vocab_off[t->n_vocab] != vl - head) {
        st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.vocab: pieces end at %u, blob has %llu",
                  t->vocab_off[t->n_vocab], (unsigned long long)(vl - head));
        goto bad;
    }
    t->vocab_flags = voc + 4 + 4 * ((size_t)t->n_vocab + 1);
    t->vocab_bytes = voc + head;
    for (uint32_t i = 0; i < t->n_stop; i++) {
        t->stop_ids[i] = rd32(cfg + 4 * (COLIBRI_TOK_CONFIG_WORDS + (size_t)i));
        if (t->stop_ids[i] >= t->n_vocab) {
            st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.config: stop id %u >= %u pieces",
                      t->stop_ids[i], t->n_vocab);
            goto bad;
        }
    }
    /* vocabulary hash (model pieces) and the byte table */
    for (int b = 0; b < 256; b++) t->byte_id[b] = COLIBRI_TOK_NO_ID;
    uint32_t n_model = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t f = t->vocab_flags[i];
        if (f & ~15u) {
            st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.vocab: piece %u has flags 0x%x", i, f);
            goto bad;
        }
        n_model += (f & COLIBRI_TOK_V_IN_MODEL) != 0;
    }
    t->vocab_mask = table_size(n_model) - 1;
    t->vocab_slot = calloc((size_t)t->vocab_mask + 1, sizeof *t->vocab_slot);
    if (!t->vocab_slot) goto oom;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t f = t->vocab_flags[i];
        size_t l;
        const uint8_t *p = piece(t, i, &l);
        if (f & COLIBRI_TOK_V_BYTE) { /* "<0xHH>" */
            int ok = !bl && l == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
                     hexval(p[3]) >= 0 && hexval(p[4]) >= 0;
            unsigned v = ok ? byte_value(p) : 0;
            if (!ok) {
                st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.vocab: piece %u is marked as a "
                          "byte token but is not <0xHH>", i);
                goto bad;
            }
            if (t->byte_id[v] == COLIBRI_TOK_NO_ID) t->byte_id[v] = i;
        }
        if (!(f & COLIBRI_TOK_V_IN_MODEL)) continue;
        if (bl && l == 1 && t->byte_id[p[0]] == COLIBRI_TOK_NO_ID) t->byte_id[p[0]] = i;
        uint32_t h = (uint32_t)hash_bytes(p, l) & t->vocab_mask;
        int dup = 0;
        for (; t->vocab_slot[h]; h = (h + 1) & t->vocab_mask) {
            size_t l2;
            const uint8_t *q = piece(t, t->vocab_slot[h] - 1, &l2);
            if (l2 == l && !memcmp(p, q, l)) { dup = 1; break; }
        }
        if (!dup) t->vocab_slot[h] = i + 1;
    }
    /* merges: (left, right, merged[, rank]) in rank order; a later duplicate pair wins, as in
     * tokenizers. Without F_RANKED_MERGES the rank is the position. */
    size_t entry = (t->flags & COLIBRI_TOK_F_RANKED_MERGES) ? 16 : 12;
    if (ml != entry * (uint64_t)t->n_merges || t->n_merges > (1u << 26)) {
        st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.merges: %zu bytes for %u merges", ml,
                  t->n_merges);
        goto bad;
    }
    if (t->n_merges) {
        uint32_t sz = table_size(t->n_merges);
        t->merge_mask = sz - 1;
        t->merge_key = calloc(sz, sizeof *t->merge_key);
        t->merge_rank = malloc((size_t)sz * sizeof *t->merge_rank);
        t->merge_new = malloc((size_t)sz * sizeof *t->merge_new);
        if (!t->merge_key || !t->merge_rank || !t->merge_new) goto oom;
        uint32_t prev_rank = 0;
        for (uint32_t r = 0; r < t->n_merges; r++) {
            const uint8_t *e = mer + entry * (size_t)r;
            uint32_t a = rd32(e), b = rd32(e + 4), c = rd32(e + 8);
            uint32_t rank = entry == 16 ? rd32(e + 12) : r;
            if (a >= t->n_vocab || b >= t->n_vocab || c >= t->n_vocab) {
                st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.merges: merge %u names id >= %u", r,
                          t->n_vocab);
                goto bad;
            }
            if (rank < prev_rank || rank >= t->n_merges) {
                st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.merges: merge %u has rank %u "
                          "(ranks must not decrease and stay below %u)", r, rank, t->n_merges);
                goto bad;
            }
            prev_rank = rank;
            uint64_t key = ((uint64_t)a << 32 | b) + 1;
            uint32_t h = (uint32_t)mix64(key) & t->merge_mask;
            while (t->merge_key[h] && t->merge_key[h] != key) h = (h + 1) & t->merge_mask;
            t->merge_key[h] = key;
            t->merge_rank[h] = rank;
            t->merge_new[h] = c;
        }
    }
    /* added: n x (id, flags, offset, len), then the text */
    if (t->n_added > 65536 || al < 16 * (uint64_t)t->n_added) {
        st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.added: %zu bytes for %u tokens", al,
                  t->n_added);
        goto bad;
    }
    t->added = calloc((size_t)t->n_added + 1, sizeof *t->added);
    if (!t->added) goto oom;
    const uint8_t *text = add + 16 * (size_t)t->n_added;
    size_t text_len = al - 16 * (size_t)t->n_added;
    for (uint32_t i = 0; i < t->n_added; i++) {
        const uint8_t *r = add + 16 * (size_t)i;
        uint32_t id = rd32(r), fl = rd32(r + 4), off = rd32(r + 8), len = rd32(r + 12);
        if (id >= t->n_vocab || fl > 15 || len == 0 || len > COLIBRI_TOK_MAX_PIECE || off > text_len ||
            len > text_len - off) {
            st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER,
                      "tokenizer.added: token %u (id %u, flags 0x%x, [%u, +%u)) is out of range", i, id,
                      fl, off, len);
            goto bad;
        }
        t->added[i] = (colibri_added_token){id, fl, len, text + off};
    }
    /* the trie: node 0 is "none"; at most one node per byte of added text */
    t->trie = calloc(text_len + 1, sizeof *t->trie);
    if (!t->trie) goto oom;
    t->n_nodes = 1;
    for (uint32_t i = 0; i < t->n_added; i++) {
        const colibri_added_token *at = &t->added[i];
        uint32_t *link = &t->trie_root[at->text[0]], node = 0;
        for (uint32_t k = 0; k < at->len; k++) {
            node = *link;
            while (node && t->trie[node].byte != at->text[k]) node = t->trie[node].sibling;
            if (!node) {
                if (t->n_nodes > text_len) {
                    st = fail(why, wl, COLIBRI_E_BAD_TOKENIZER, "tokenizer.added: tokens overlap in the text");
                    goto bad;
                }
                node = t->n_nodes++;
                t->trie[node] = (colibri_added_node){.child = 0, .sibling = *link, .tok = {-1, -1},
                                                     .byte = at->text[k]};
                *link = node;
            }
            link = &t->trie[node].child;
        }
        int kind = (at->flags & COLIBRI_TOK_A_NORMALIZED) != 0;
        int32_t *slot = &t->trie[node].tok[kind];
        if (*slot < 0 || t->added[*slot].id > at->id) *slot = (int32_t)i; /* same text: lowest id */
    }
    return COLIBRI_OK;
oom:
    st = fail(why, wl, COLIBRI_E_NO_MEMORY, "out of memory for the tokenizer tables");
bad:
    colibri_tokenizer_free(t);
    return st;
}

void colibri_tokenizer_free(colibri_tokenizer *t) {
    if (!t) return;
    free(t->vocab_off);
    free(t->stop_ids);
    free(t->added);
    free(t->trie);
    free(t->merge_key);
    free(t->merge_rank);
    free(t->merge_new);
    free(t->vocab_slot);
    memset(t, 0, sizeof *t);
}
