/* Test driver for tests/test_qwen35.py: colibri_seq_save / colibri_seq_restore on the hybrid
 * (recurrent-state) models (built by that test with the host cc; not part of the product).
 *
 *   state_driver MODEL IDS SPLIT T1 T2 [OTHER_MODEL]
 *
 * IDS: comma-separated token ids; the prefix is IDS[0..SPLIT), the rest the continuation. With a
 * context A on T1 threads and B on T2:
 *   ref    A: the prefix, then the rest                                (the reference logits)
 *   saved  A reset: the prefix, save, then the rest                     (saving changes nothing)
 *   fresh  B: restore, then the rest                                    (a new context)
 *   reused A, which has run past the prefix: restore, then the rest     (a used context)
 * and the refusals: a buffer too small (the size needed), a damaged, a truncated and a
 * bad-magic buffer, a shorter prefix than the snapshot's (a recurrent state cannot be cut), an
 * f16-cache context, a context of OTHER_MODEL; after each the context's position is unchanged.
 * Prints "bytes N", "pos P", "snapshot-pos P", one line "NAME equal|DIFFERENT" per continuation and one
 * "refuse NAME STATUS pos-kept" per refusal; exits 0 when everything held. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

static int parse_ids(const char *s, int32_t *ids, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        ids[n++] = (int32_t)strtol(s, &end, 10);
        s = *end == ',' ? end + 1 : end;
        if (end == s && *s) return -1;
    }
    return n;
}

static colibri_ctx *open_ctx(colibri_model *m, int threads, int kv_f16) {
    colibri_options o;
    colibri_default_options(&o);
    o.threads = threads;
    o.backend = COLIBRI_BACKEND_CPU;
    o.kv_dtype = kv_f16 ? COLIBRI_KV_F16 : COLIBRI_KV_F32;
    colibri_ctx *c = NULL;
    if (colibri_ctx_new(&c, m, &o) != COLIBRI_OK) {
        fprintf(stderr, "cannot create a context\n");
        exit(3);
    }
    return c;
}

static void run(colibri_ctx *c, const int32_t *ids, int n, float *out) {
    colibri_status s = colibri_forward(c, ids, n, out);
    if (s != COLIBRI_OK) {
        fprintf(stderr, "forward: %s: %s\n", colibri_strerror(s), colibri_last_error(c));
        exit(3);
    }
}

static int position(const colibri_ctx *c) {
    colibri_runtime_info r;
    colibri_get_runtime_info(c, &r);
    return r.position;
}

/* A refused restore (to keep positions) must leave the context where it was. */
static int refuse(const char *name, colibri_ctx *c, const void *buf, size_t len, int keep) {
    int before = position(c);
    colibri_status s = colibri_seq_restore(c, buf, len, keep);
    int kept = position(c) == before;
    printf("refuse %s %s %s (%s)\n", name, colibri_strerror(s), kept ? "pos-kept" : "POS-CHANGED",
           colibri_last_error(c));
    return s != COLIBRI_OK && kept;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: state_driver MODEL IDS SPLIT T1 T2 [OTHER_MODEL]\n");
        return 2;
    }
    static int32_t ids[4096];
    int n = parse_ids(argv[2], ids, 4096), split = atoi(argv[3]);
    if (n <= 1 || split < 1 || split >= n) return 2;
    colibri_model *m, *other = NULL;
    if (colibri_model_load(&m, argv[1], NULL) != COLIBRI_OK) return 3;
    if (argc > 6 && colibri_model_load(&other, argv[6], NULL) != COLIBRI_OK) return 3;
    colibri_model_info mi;
    colibri_model_get_info(m, &mi);
    const size_t V = mi.vocab_size, rest = (size_t)(n - split);
    float *prefix = malloc((size_t)split * V * sizeof(float));
    float *out[4];
    for (int i = 0; i < 4; i++) out[i] = malloc(rest * V * sizeof(float));
    colibri_ctx *a = open_ctx(m, atoi(argv[4]), 0), *b = open_ctx(m, atoi(argv[5]), 0);

    run(a, ids, split, prefix);
    run(a, ids + split, (int)rest, out[0]);

    colibri_reset(a);
    run(a, ids, split, prefix);
    size_t bytes = colibri_seq_state_bytes(a), len = 0;
    if (!bytes) return 3;
    uint8_t *st = malloc(bytes), *bad = malloc(bytes);
    int ok = colibri_seq_save(a, st, bytes - 1, &len) == COLIBRI_E_BUFFER_TOO_SMALL && len == bytes;
    printf("too-small %s\n", ok ? "refused-with-size" : "WRONG");
    if (colibri_seq_save(a, st, bytes, &len) != COLIBRI_OK || len != bytes) return 3;
    printf("bytes %zu\npos %d\nsnapshot-pos %d\n", bytes, position(a), colibri_seq_state_pos(st, bytes));
    run(a, ids + split, (int)rest, out[1]);

    if (colibri_seq_restore(b, st, bytes, split) != COLIBRI_OK) return 3;
    run(b, ids + split, (int)rest, out[2]);
    if (colibri_seq_restore(a, st, bytes, split) != COLIBRI_OK) return 3;
    run(a, ids + split, (int)rest, out[3]);

    static const char *names[4] = {"ref", "saved", "fresh", "reused"};
    for (int i = 1; i < 4; i++) {
        int eq = memcmp(out[0], out[i], rest * V * sizeof(float)) == 0;
        printf("%s %s\n", names[i], eq ? "equal" : "DIFFERENT");
        ok &= eq;
    }

    memcpy(bad, st, bytes);
    bad[12] ^= 1; /* another position: the sizes no longer match */
    ok &= refuse("damaged", a, bad, bytes, split);
    ok &= refuse("truncated", a, st, bytes - 1, split);
    memcpy(bad, st, bytes);
    bad[0] = 'X';
    ok &= refuse("magic", a, bad, bytes, split);
    /* a recurrent state holds the whole prefix: no shorter one can be restored */
    ok &= refuse("shorter-prefix", a, st, bytes, split / 2);
    colibri_ctx *h = open_ctx(m, 1, 1);
    ok &= refuse("f16-cache", h, st, bytes, split);
    colibri_free(h);
    if (other) {
        colibri_ctx *o = open_ctx(other, 1, 0);
        ok &= refuse("other-model", o, st, bytes, split);
        colibri_free(o);
        colibri_model_free(other);
    }
    colibri_free(a);
    colibri_free(b);
    colibri_model_free(m);
    free(st);
    free(bad);
    free(prefix);
    for (int i = 0; i < 4; i++) free(out[i]);
    return ok ? 0 : 1;
}
