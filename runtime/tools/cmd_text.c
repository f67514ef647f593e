/* `colibri tokenize MODEL (--text T | --text-file F) [--no-special]` -> {"ids": [...]}
 * `colibri detokenize MODEL (--ids 1,2,3 | --ids-file F) [--skip-special]` -> the text, byte for
 *   byte (no newline); F ("-": standard input) holds the ids as `tokenize` prints them, as a JSON
 *   array, or separated by commas or white space, so a long text's ids need no command line
 * Both use the public text API (colibri.h) on a CPU context; docs/runtime.md "Tokenizer". */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "colibri.h"

int colibri_cmd_text(const cli_globals *g, int argc, char **argv);

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int text_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(f,
            "usage: colibri tokenize MODEL (--text T | --text-file F) [--no-special]\n"
            "         prints {\"ids\": [...]}; BOS/EOS are added as the model's tokenizer does\n"
            "         unless --no-special; any bytes are accepted (invalid UTF-8: byte rules)\n"
            "         --text-file -: the text from standard input\n"
            "       colibri detokenize MODEL (--ids 1,2,3 | --ids-file F) [--skip-special]\n"
            "         prints the text exactly (no newline added); --skip-special drops special tokens;\n"
            "         F (- for standard input) holds {\"ids\": [...]} as tokenize prints it, a JSON\n"
            "         array, or ids separated by commas or white space\n"
            "  (both read only the model's tokenizer: the global options are accepted and unused)\n");
    return 2;
}

static int text_usage(const char *msg) { return text_usage_to(stderr, msg); }

static char *read_file(const char *path, size_t *len) {
    int is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "colibri: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *p = realloc(buf, cap * 2);
        if (!p) { free(buf); buf = NULL; break; }
        buf = p;
        cap *= 2;
    }
    int err = ferror(f);
    if (!is_stdin) fclose(f);
    if (!buf || err) {
        fprintf(stderr, "colibri: cannot read %s\n", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int fail_status(const char *model, colibri_status s) {
    fprintf(stderr, "colibri: %s: %s\n", model, colibri_strerror(s));
    return 1;
}

/* One encode in the normal case: ids never outnumber the text's bytes plus BOS/EOS and the
 * normalizer's prefix, except where NFC lengthens the text (a few thousand characters such as
 * U+0958 decompose); then the library has said how many ids it needs and a second call fills
 * them. */
static int do_tokenize(const char *model, const char *text, size_t len, int special) {
    colibri_ctx *ctx;
    if (cli_open(model, COLIBRI_BACKEND_CPU, 1, 0, COLIBRI_KV_F32, &ctx)) return 1;
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    colibri_status s = ids ? colibri_tokenize(ctx, text, len, special, ids, cap, &n) : COLIBRI_E_NO_MEMORY;
    if (s == COLIBRI_E_BUFFER_TOO_SMALL) {
        int32_t *more = realloc(ids, n * sizeof *ids);
        s = more ? colibri_tokenize(ctx, text, len, special, more, n, &n) : COLIBRI_E_NO_MEMORY;
        if (more) ids = more;
    }
    if (s) {
        free(ids);
        colibri_free(ctx);
        return fail_status(model, s);
    }
    /* one buffered write: a long text's ids are millions of characters */
    fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    fputs("]}\n", stdout);
    free(ids);
    colibri_free(ctx);
    return 0;
}

/* Ids from text: {"ids": [...]}, [...], or integers separated by commas and/or white space.
 * Returns 0 and a malloc'd array, or -1 with *why set. */
static int parse_ids(const char *s, size_t len, int32_t **out, size_t *n_out, const char **why) {
    size_t i = 0, n = 0, cap = 0;
    int32_t *ids = NULL;
    int wrapped = 0, bracket = 0;
    while (i < len && strchr(" \t\r\n", s[i])) i++;
    if (i < len && s[i] == '{') { /* {"ids": [ */
        static const char key[] = "\"ids\"";
        i++;
        while (i < len && strchr(" \t\r\n", s[i])) i++;
        if (len - i < sizeof key - 1 || memcmp(s + i, key, sizeof key - 1)) { *why = "expected {\"ids\": [...]}"; return -1; }
        i += sizeof key - 1;
        while (i < len && strchr(" \t\r\n", s[i])) i++;
        if (i >= len || s[i] != ':') { *why = "expected ':' after \"ids\""; return -1; }
        i++;
        while (i < len && strchr(" \t\r\n", s[i])) i++;
        wrapped = 1;
    }
    if (i < len && s[i] == '[') { bracket = 1; i++; }
    else if (wrapped) { *why = "expected [ after \"ids\":"; return -1; }
    int closed = 0;
    for (;;) {
        while (i < len && strchr(" \t\r\n,", s[i])) i++;
        if (i >= len) break;
        if (bracket && s[i] == ']') { closed = 1; i++; break; }
        char *end;
        char num[24];
        size_t k = 0;
        while (i + k < len && k < sizeof num - 1 && (s[i + k] == '-' || (s[i + k] >= '0' && s[i + k] <= '9'))) {
            num[k] = s[i + k];
            k++;
        }
        num[k] = 0;
        errno = 0;
        long long v = k ? strtoll(num, &end, 10) : 0;
        if (!k || errno || *end || v < INT32_MIN || v > INT32_MAX ||
            (i + k < len && !strchr(" \t\r\n,]", s[i + k]))) {
            free(ids);
            *why = "ids must be integers separated by commas or white space";
            return -1;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            int32_t *p = realloc(ids, nc * sizeof *p);
            if (!p) { free(ids); *why = "out of memory"; return -1; }
            ids = p;
            cap = nc;
        }
        ids[n++] = (int32_t)v;
        i += k;
    }
    if (bracket && !closed) { free(ids); *why = "missing ]"; return -1; }
    if (wrapped) {
        while (i < len && strchr(" \t\r\n", s[i])) i++;
        if (i >= len || s[i] != '}') { free(ids); *why = "missing }"; return -1; }
        i++;
    }
    while (i < len && strchr(" \t\r\n", s[i])) i++;
    if (i < len) { free(ids); *why = "unexpected text after the ids"; return -1; }
    *out = ids;
    *n_out = n;
    return 0;
}

static int do_detokenize(const char *model, const int32_t *ids, size_t n, int skip) {
    colibri_ctx *ctx;
    if (cli_open(model, COLIBRI_BACKEND_CPU, 1, 0, COLIBRI_KV_F32, &ctx)) return 1;
    size_t len = 0;
    colibri_status s = colibri_detokenize(ctx, ids, n, skip, NULL, 0, &len);
    char *text = NULL;
    if (s == COLIBRI_E_BUFFER_TOO_SMALL) {
        text = malloc(len ? len : 1);
        s = text ? colibri_detokenize(ctx, ids, n, skip, text, len, &len) : COLIBRI_E_NO_MEMORY;
    }
    if (s == COLIBRI_E_TOKEN_RANGE) {
        colibri_model_info mi;
        colibri_get_model_info(ctx, &mi);
        fprintf(stderr, "colibri: %s: token id out of range: ids must be 0..%u\n", model,
                mi.vocab_size - 1);
    } else if (s) {
        fail_status(model, s);
    } else if (len) {
        fwrite(text, 1, len, stdout);
    }
    free(text);
    colibri_free(ctx);
    return s ? 1 : 0;
}

/* argv[0] is the word "tokenize" or "detokenize"; the global options (g, and any after the
 * word) are parsed as for every command; these two run on one CPU thread. */
int colibri_cmd_text(const cli_globals *g, int argc, char **argv) {
    const char *pos[2] = {0}, *text = NULL, *file = NULL, *ids = NULL, *ids_file = NULL;
    int npos = 0, special = 1, skip = 0;
    cli_globals globals = *g;
    int tokenize = !strcmp(argv[0], "tokenize");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { text_usage_to(stdout, NULL); return 0; }
        if (tokenize && !strcmp(a, "--text")) { if (!v) return text_usage("--text needs a value"); text = v; i++; }
        else if (tokenize && !strcmp(a, "--text-file")) { if (!v) return text_usage("--text-file needs a path"); file = v; i++; }
        else if (tokenize && !strcmp(a, "--no-special")) special = 0;
        else if (!tokenize && !strcmp(a, "--ids")) { if (!v) return text_usage("--ids needs a value"); ids = v; i++; }
        else if (!tokenize && !strcmp(a, "--ids-file")) { if (!v) return text_usage("--ids-file needs a path (- for standard input)"); ids_file = v; i++; }
        else if (!tokenize && !strcmp(a, "--skip-special")) skip = 1;
        else if ((r = cli_global(&globals, argc, argv, &i)) != 0) { if (r < 0) return text_usage(NULL); }
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "colibri: unknown option %s\n", a); return text_usage(NULL); }
        else if (npos < 1) pos[npos++] = a;
        else return text_usage("too many arguments");
    }
    if (npos != 1) return text_usage("MODEL is required");
    if (!tokenize) {
        if (!ids == !ids_file) return text_usage("detokenize needs exactly one of --ids and --ids-file");
        size_t len = 0, n = 0;
        char *buf = ids_file ? read_file(ids_file, &len) : NULL;
        if (ids_file && !buf) return 1;
        int32_t *list = NULL;
        const char *why = NULL;
        int bad = parse_ids(buf ? buf : ids, buf ? len : strlen(ids), &list, &n, &why);
        free(buf);
        if (bad) {
            fprintf(stderr, "colibri: %s%s: %s\n", ids_file ? "--ids-file " : "--ids", ids_file ? ids_file : "", why);
            return text_usage(NULL);
        }
        int r = do_detokenize(pos[0], list, n, skip);
        free(list);
        return r;
    }
    if (!text == !file) return text_usage("tokenize needs exactly one of --text and --text-file");
    if (text) return do_tokenize(pos[0], text, strlen(text), special);
    size_t len = 0;
    char *buf = read_file(file, &len);
    if (!buf) return 1;
    int r = do_tokenize(pos[0], buf, len, special);
    free(buf);
    return r;
}
