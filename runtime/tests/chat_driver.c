/* Test driver for tests/test_chat_formats.py (built by it with the host cc; not part of the
 * product). Batch commands, one case per input line:
 *
 *   chat_driver render BLOB < cases
 *       case: "GEN THINK EFFORT NOW N" then N lines "ROLE HEX" (THINK -1/0/1, EFFORT "-" for
 *       none, NOW Unix seconds, HEX "-" for empty); prints the text as hex, or
 *       "error STATUS reason".
 *   chat_driver stream MODEL FORMAT START < streams
 *       stream: "END ID ID ..." (END 1: then colibri_out_end). The ids go through colibri_out
 *       (the output side of colibri_generate) with the model's detokenizer, reasoning FORMAT
 *       (0 none, 1 harmony, 2 think) and starts_in_reasoning START; prints one line per chunk
 *       "chunk INDEX KIND MESSAGE CHANNEL RECIPIENT HEX" (INDEX: ids pushed when it came, "-"
 *       for an empty channel or recipient), one line per on_token call "token ID HEX", then
 *       "done". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "text/chat.h"
#include "text/generate.h"

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void put_hex(const char *s, size_t n) {
    if (!n) { printf("-"); return; }
    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);
}

static int render_main(const char *path) {
    static uint8_t blob[1 << 20];
    static char text[1 << 16], store[1 << 17], out[1 << 18];
    FILE *f = fopen(path, "rb");
    if (!f) return 2;
    size_t blen = fread(blob, 1, sizeof blob, f);
    fclose(f);
    int gen, think, n;
    long long now;
    char effort[16];
    while (scanf("%d %d %15s %lld %d", &gen, &think, effort, &now, &n) == 5) {
        colibri_chat_message msgs[32];
        char role[32][16];
        size_t used = 0;
        if (n > 32) return 2;
        for (int k = 0; k < n; k++) {
            if (scanf("%15s %65535s", role[k], text) != 2) return 2;
            size_t tl = strcmp(text, "-") ? strlen(text) / 2 : 0;
            for (size_t i = 0; i < tl; i++)
                store[used + i] = (char)(hexval(text[2 * i]) * 16 + hexval(text[2 * i + 1]));
            store[used + tl] = '\0';
            msgs[k].role = role[k];
            msgs[k].content = store + used;
            used += tl + 1;
        }
        colibri_chat_options o;
        colibri_default_chat_options(&o);
        o.add_generation_prompt = gen;
        o.enable_thinking = think;
        o.reasoning_effort = strcmp(effort, "-") ? effort : NULL;
        o.now = now;
        size_t len = 0;
        char why[256] = "";
        colibri_status s = colibri_chat_render_blob_ex(blob, blen, msgs, n, &o, out, sizeof out, &len,
                                                       why, sizeof why);
        if (s) printf("error %d %s\n", (int)s, why);
        else { put_hex(out, len); printf("\n"); }
    }
    return 0;
}

typedef struct {
    int pushed;
} stream_state;

static int on_chunk(void *user, const colibri_chunk *c) {
    stream_state *st = user;
    printf("chunk %d %d %d %s %s ", st->pushed, (int)c->kind, c->message, c->channel[0] ? c->channel : "-",
           c->recipient[0] ? c->recipient : "-");
    put_hex(c->text, c->len);
    printf("\n");
    return 0;
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    printf("token %d ", (int)id);
    put_hex(text, len);
    printf("\n");
    return 0;
}

static int stream_main(const char *path, int format, int start) {
    colibri_ctx *ctx;
    colibri_options opt;
    colibri_default_options(&opt);
    opt.threads = 1;
    opt.backend = COLIBRI_BACKEND_CPU;
    if (colibri_init_ex(&ctx, path, &opt)) return 3;
    static int32_t ids[1 << 16];
    char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        char *p = line, *e;
        long end_flag = strtol(p, &e, 10);
        if (e == p) continue;
        p = e;
        int n = 0;
        for (;;) {
            long v = strtol(p, &e, 10);
            if (e == p || n == (int)(sizeof ids / sizeof ids[0])) break;
            ids[n++] = (int32_t)v;
            p = e;
        }
        colibri_generate_params gp;
        colibri_default_generate_params(&gp);
        colibri_generate_params_for_text(ctx, &gp);
        gp.reasoning = (colibri_reasoning_format)format;
        gp.starts_in_reasoning = start;
        stream_state st = {0};
        gp.on_chunk = on_chunk;
        gp.chunk_user = &st;
        gp.on_token = on_token;
        colibri_out o;
        char why[256];
        if (colibri_out_begin(&o, ctx, &gp, ids, why, sizeof why)) {
            printf("error %s\n", why);
            continue;
        }
        for (int i = 0; i < n && !o.stopped; i++) {
            int found;
            st.pushed = i + 1;
            colibri_out_push(&o, ids[i], &found);
        }
        if (end_flag) colibri_out_end(&o);
        colibri_out_free(&o);
        printf("done\n");
        fflush(stdout);
    }
    colibri_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "render")) return render_main(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "stream")) return stream_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    fprintf(stderr, "usage: chat_driver render BLOB < cases | stream MODEL FORMAT START < streams\n");
    return 2;
}
