/* Test driver for tests/test_sampler.py and tests/test_generate.py (built by those tests with
 * the host cc; not part of the product).
 *
 *   gen_driver sample   < spec     one sampler, prints the ids of n draws (see read_spec)
 *   gen_driver stream MODEL TEXT CUTS MAX_NEW STOP...
 *       greedy colibri_generate with a stand-in detokenizer: after n tokens the text is
 *       TEXT[0 .. CUTS[n]) whatever the ids (CUTS: comma-separated byte offsets), so a test
 *       controls where characters and stop strings are cut between tokens. Prints one line per
 *       callback "id <hex of the text>" and then "finish NAME n_new stop_string".
 *   gen_driver chat BLOB GEN < messages   render lines "ROLE HEX" with a chat.template blob
 *       file; prints the text as hex, or "error STATUS reason".
 *   gen_driver chat-model MODEL GEN < messages   the same with a .colibri file's template */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "colibri.h"

static int sample_main(void) {
    unsigned vocab, n_draws, n_hist;
    colibri_sampling p;
    colibri_default_sampling(&p);
    unsigned long long seed;
    if (scanf("%u %f %d %f %f %f %d %llu %u %u", &vocab, &p.temperature, &p.top_k, &p.top_p,
              &p.min_p, &p.repeat_penalty, &p.repeat_last_n, &seed, &n_draws, &n_hist) != 10)
        return 2;
    p.seed = seed;
    int32_t *hist = calloc(n_hist + 1, sizeof *hist);
    float *logits = calloc(vocab, sizeof *logits), *work = calloc(vocab, sizeof *work);
    for (unsigned i = 0; i < n_hist; i++)
        if (scanf("%d", &hist[i]) != 1) return 2;
    for (unsigned i = 0; i < vocab; i++)
        if (scanf("%a", &logits[i]) != 1) return 2;
    colibri_sampler *s;
    if (colibri_sampler_new(&s, vocab, &p) != COLIBRI_OK) return 3;
    for (unsigned d = 0; d < n_draws; d++) {
        memcpy(work, logits, vocab * sizeof *work);
        printf("%s%d", d ? " " : "", (int)colibri_sampler_sample(s, work, hist, (int)n_hist));
    }
    printf("\n");
    colibri_sampler_free(s);
    free(hist);
    free(logits);
    free(work);
    return 0;
}

typedef struct {
    const char *text;
    size_t cuts[256];
    int n_cuts;
} fake_tok;

static size_t fake_detok(void *user, const int32_t *ids, int n, char *out, size_t cap) {
    const fake_tok *t = user;
    size_t len = t->cuts[n < t->n_cuts ? n : t->n_cuts - 1];
    if (out && cap && len) memcpy(out, t->text, len < cap ? len : cap);
    return len;
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    printf("%d ", (int)id);
    for (size_t i = 0; i < len; i++) printf("%02x", (unsigned char)text[i]);
    printf("\n");
    return 0;
}

static int stream_main(int argc, char **argv) {
    fake_tok t = {argv[3], {0}, 0};
    for (char *p = argv[4]; *p && t.n_cuts < 256;) {
        t.cuts[t.n_cuts++] = strtoul(p, &p, 10);
        if (*p == ',') p++;
    }
    colibri_ctx *ctx;
    if (colibri_init(&ctx, argv[2])) return 3;
    int32_t prompt[3] = {1, 2, 3}, out[256];
    colibri_generate_params p;
    colibri_default_generate_params(&p);
    p.prompt = prompt;
    p.n_prompt = 3;
    p.max_new = atoi(argv[5]);
    p.ignore_eos = 1;
    p.stop_strings = (const char *const *)(argv + 6);
    p.n_stop_strings = argc - 6;
    p.detok = fake_detok;
    p.detok_user = &t;
    p.on_token = on_token;
    colibri_generate_result r;
    colibri_status s = colibri_generate(ctx, &p, out, &r);
    if (s) {
        fprintf(stderr, "%s\n", colibri_last_error(ctx));
        return 4;
    }
    printf("finish %s %d %d\n", colibri_finish_name(r.finish), r.n_new, r.stop_string);
    colibri_free(ctx);
    return 0;
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* path: a blob file, or with from_model a .colibri file (its chat.template metadata). */
static int chat_main(const char *path, int gen, int from_model) {
    static uint8_t blob[1 << 16];
    static char text[1 << 16], store[1 << 16], out[1 << 17];
    size_t blen = 0;
    colibri_model *model = NULL;
    if (from_model) {
        if (colibri_model_load(&model, path, NULL)) return 3;
    } else {
        FILE *f = fopen(path, "rb");
        if (!f) return 2;
        blen = fread(blob, 1, sizeof blob, f);
        fclose(f);
    }
    colibri_chat_message msgs[32];
    char role[32][16];
    int n = 0;
    size_t used = 0;
    while (n < 32 && scanf("%15s %65535s", role[n], text) == 2) {
        size_t tl = strlen(text) / 2;
        if (!strcmp(text, "-")) tl = 0;
        for (size_t i = 0; i < tl; i++)
            store[used + i] = (char)(hexval(text[2 * i]) * 16 + hexval(text[2 * i + 1]));
        store[used + tl] = '\0';
        msgs[n].role = role[n];
        msgs[n].content = store + used;
        used += tl + 1;
        n++;
    }
    size_t len = 0;
    char why[256] = "";
    colibri_status s = model ? colibri_chat_render(model, msgs, n, gen, out, sizeof out, &len, why,
                                                   sizeof why)
                             : colibri_chat_render_blob(blob, blen, msgs, n, gen, out, sizeof out,
                                                        &len, why, sizeof why);
    colibri_model_free(model);
    if (s) {
        printf("error %d %s\n", (int)s, why);
        return 0;
    }
    for (size_t i = 0; i < len; i++) printf("%02x", (unsigned char)out[i]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "chat")) return chat_main(argv[2], atoi(argv[3]), 0);
    if (argc == 4 && !strcmp(argv[1], "chat-model")) return chat_main(argv[2], atoi(argv[3]), 1);
    if (argc >= 2 && !strcmp(argv[1], "sample")) return sample_main();
    if (argc >= 6 && !strcmp(argv[1], "stream")) return stream_main(argc, argv);
    fprintf(stderr, "usage: gen_driver sample < spec | stream MODEL TEXT CUTS MAX_NEW STOP...\n");
    return 2;
}
