/* `colibri generate`: ids or text in, sampled ids or streamed text out (colibri_generate).
 *
 *   colibri [global options] generate MODEL (--ids 1,2,3 | --prompt T [--chat]
 *       [--system S]) [--max-new N] [--temperature X] [--top-k K] [--top-p P] [--min-p P]
 *       [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--stop STR]... [--ignore-eos] [--json]
 *       [--show-reasoning] [--reasoning-effort low|medium|high] [--thinking on|off]
 *
 * With --chat the output of a reasoning model (gpt-oss's harmony channels, the Qwen3 families'
 * <think> block) is split: stdout gets the answer, --show-reasoning puts the reasoning before
 * it between "<reasoning>" and "</reasoning>" lines, --json carries both ("text", "reasoning").
 *
 * --ids keeps the original contract: greedy unless sampling options are given, EOS does not
 * stop it, and stdout is one JSON object {"ids", "new_ids", "prompt_len", "max_new",
 * "decode_ms", ...}. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "colibri.h"

#define MAX_STOPS 16

/* --chat's options for reasoning models, apart so the option table can take them as a group */
typedef struct {
    int show_reasoning;
    int thinking;                 /* -1: the template's default */
    const char *reasoning_effort; /* NULL: the template's default */
} chat_cli;

#define CHAT_USAGE \
    "         [--show-reasoning] [--reasoning-effort low|medium|high] [--thinking on|off]\n"
#define CHAT_HELP                                                                              \
    "  --chat: a reasoning model's answer goes to stdout; --show-reasoning prints its reasoning\n" \
    "  (harmony's analysis channel, the <think> block) first, between <reasoning> lines.\n"     \
    "  --reasoning-effort (gpt-oss) and --thinking (Qwen3, Qwen3.5) go to the chat template.\n"

/* One of chat_cli's options at argv[*i]: 1 taken (value too), 0 not one, -1 bad value. */
static int chat_option(chat_cli *c, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--show-reasoning")) { c->show_reasoning = 1; return 1; }
    if (!strcmp(a, "--reasoning-effort")) {
        if (!v || (strcmp(v, "low") && strcmp(v, "medium") && strcmp(v, "high"))) {
            fprintf(stderr, "colibri: --reasoning-effort must be low, medium or high\n");
            return -1;
        }
        c->reasoning_effort = v;
        ++*i;
        return 1;
    }
    if (!strcmp(a, "--thinking")) {
        if (!v || (strcmp(v, "on") && strcmp(v, "off"))) {
            fprintf(stderr, "colibri: --thinking must be on or off\n");
            return -1;
        }
        c->thinking = !strcmp(v, "on");
        ++*i;
        return 1;
    }
    return 0;
}

typedef struct {
    cli_globals g;
    int json, ignore_eos, chat;
    chat_cli ch;
    const char *model, *ids, *prompt, *system;
    long max_new;
    colibri_sampling sampling;
    const char *stops[MAX_STOPS];
    int n_stops;
} gen_cli;

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int gen_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(f,
            "usage: colibri generate MODEL\n"
            "         (--ids 1,2,3 | --prompt TEXT [--chat] [--system TEXT])\n"
            "         [--max-new N] [--temperature X] [--top-k K] [--top-p P] [--min-p P]\n"
            "         [--repeat-penalty R] [--repeat-last-n N] [--seed S] [--stop STR]...\n"
            "         [--ignore-eos] [--json]\n" CHAT_USAGE
            "  temperature 0 (default) is greedy; the other sampling options apply when > 0.\n"
            "  --ids prints JSON ids (EOS does not stop it); --prompt streams text to stdout,\n"
            "  --json prints ids, text, finish reason and timings instead.\n" CHAT_HELP
            CLI_GLOBAL_HELP);
    return 2;
}

static int gen_usage(const char *msg) { return gen_usage_to(stderr, msg); }

static int num_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return -1;
    *out = (float)v;
    return 0;
}

static int num_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (s[0] == '-') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

/* argv[0] is the word "generate"; global options may follow it too. */
static int parse(gen_cli *c, int argc, char **argv) {
    int npos = 0;
    int sampling_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long num;
        int r, taken = chat_option(&c->ch, argc, argv, &i);
        if (taken < 0) return gen_usage(NULL);
        if (taken) continue;
#define VALUE() do { if (!v) return gen_usage("missing value after an option"); i++; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { gen_usage_to(stdout, NULL); return -1; }
        else if ((r = cli_global(&c->g, argc, argv, &i)) != 0) {
            if (r < 0) return gen_usage(NULL);
        } else if (!strcmp(a, "--json")) c->json = 1;
        else if (!strcmp(a, "--chat")) c->chat = 1;
        else if (!strcmp(a, "--ignore-eos")) c->ignore_eos = 1;
        else if (!strcmp(a, "--ids")) { VALUE(); c->ids = v; }
        else if (!strcmp(a, "--prompt")) { VALUE(); c->prompt = v; }
        else if (!strcmp(a, "--system")) { VALUE(); c->system = v; }
        else if (!strcmp(a, "--max-new")) {
            VALUE();
            if (cli_long(v, 0, 1048576, &c->max_new)) return gen_usage("--max-new must be 0..1048576");
        } else if (!strcmp(a, "--temperature")) {
            VALUE();
            if (num_float(v, &c->sampling.temperature) || c->sampling.temperature < 0)
                return gen_usage("--temperature must be a number >= 0");
            sampling_given = 1;
        } else if (!strcmp(a, "--top-k")) {
            VALUE();
            if (cli_long(v, 0, INT_MAX, &num)) return gen_usage("--top-k must be >= 0 (0 = off)");
            c->sampling.top_k = (int)num;
        } else if (!strcmp(a, "--top-p")) {
            VALUE();
            if (num_float(v, &c->sampling.top_p)) return gen_usage("--top-p must be a number in (0, 1]");
        } else if (!strcmp(a, "--min-p")) {
            VALUE();
            if (num_float(v, &c->sampling.min_p)) return gen_usage("--min-p must be a number in [0, 1]");
        } else if (!strcmp(a, "--repeat-penalty")) {
            VALUE();
            if (num_float(v, &c->sampling.repeat_penalty))
                return gen_usage("--repeat-penalty must be a number > 0");
        } else if (!strcmp(a, "--repeat-last-n")) {
            VALUE();
            if (cli_long(v, 0, INT_MAX, &num)) return gen_usage("--repeat-last-n must be >= 0");
            c->sampling.repeat_last_n = (int)num;
        } else if (!strcmp(a, "--seed")) {
            VALUE();
            if (num_u64(v, &c->sampling.seed)) return gen_usage("--seed must be an integer >= 0");
        } else if (!strcmp(a, "--stop")) {
            VALUE();
            if (!v[0]) return gen_usage("--stop needs a non-empty string");
            if (c->n_stops == MAX_STOPS) return gen_usage("at most 16 --stop strings");
            c->stops[c->n_stops++] = v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "colibri: unknown option %s\n", a);
            return gen_usage(NULL);
        } else {
            if (npos == 1) return gen_usage("too many arguments");
            c->model = a;
            npos++;
        }
#undef VALUE
    }
    (void)sampling_given;
    if (!c->model) return gen_usage("MODEL is required");
    if (!c->ids == !c->prompt) return gen_usage("give exactly one of --ids and --prompt");
    if (c->ids && c->max_new < 0) return gen_usage("--max-new N is required");
    if (c->max_new < 0) c->max_new = 128;
    const char *bad = colibri_sampling_check(&c->sampling);
    if (bad) return gen_usage(bad);
    if (c->ids && (c->chat || c->system)) return gen_usage("--chat and --system need --prompt");
    if (c->ids && c->n_stops) return gen_usage("--stop needs --prompt (text)");
    if (c->system && !c->chat) return gen_usage("--system needs --chat");
    if (!c->chat && (c->ch.show_reasoning || c->ch.thinking >= 0 || c->ch.reasoning_effort))
        return gen_usage("--show-reasoning, --reasoning-effort and --thinking need --chat");
    return 0;
}

static void fallback_note(colibri_ctx *ctx) {
    colibri_runtime_info r;
    colibri_get_runtime_info(ctx, &r);
    if (r.fallback_reason[0])
        fprintf(stderr, "colibri: CUDA unavailable (%s); running on CPU\n", r.fallback_reason);
}

/* --ids: the JSON contract of the original greedy command, plus the finish reason. */
static int run_ids(const gen_cli *c, colibri_ctx *ctx) {
    int32_t *ids = NULL, *out = NULL;
    size_t count;
    if (cli_ids(c->ids, &ids, &count)) return gen_usage("--ids must be comma-separated integers, e.g. 1,2,3");
    int n = (int)count;
    colibri_model_info m;
    colibri_get_model_info(ctx, &m);
    int rc = 1;
    /* the tokens to run: the prompt plus every new token but the last */
    if (c->max_new > 0 && (long)n + c->max_new - 1 > (long)m.max_seq_len) {
        fprintf(stderr, "colibri: sequence longer than max_seq_len: %d prompt + %ld new tokens "
                        "need %ld positions > max_seq_len %u\n",
                n, c->max_new, (long)n + c->max_new - 1, m.max_seq_len);
        goto done;
    }
    out = malloc(((size_t)c->max_new + 1) * sizeof *out);
    if (!out) goto done;
    colibri_generate_params p;
    colibri_default_generate_params(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_new = (int)c->max_new;
    p.sampling = c->sampling;
    p.ignore_eos = 1; /* raw ids: the caller decides where the text ends */
    colibri_generate_result r;
    colibri_status s = colibri_generate(ctx, &p, out, &r);
    if (s) {
        fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(ctx));
        goto done;
    }
    fallback_note(ctx);
    printf("{\"ids\": [");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
    for (int i = 0; i < r.n_new; i++) printf(", %d", (int)out[i]);
    printf("], \"new_ids\": [");
    for (int i = 0; i < r.n_new; i++) printf("%s%d", i ? ", " : "", (int)out[i]);
    printf("], \"prompt_len\": %d, \"max_new\": %ld, \"finish_reason\": \"%s\", "
           "\"prefill_ms\": %.3f, \"decode_ms\": %.3f}\n",
           n, c->max_new, colibri_finish_name(r.finish), r.prefill_ms, r.decode_ms);
    rc = 0;
done:
    free(ids);
    free(out);
    return rc;
}

typedef struct {
    char *s;
    size_t len, cap;
} buf;

typedef struct {
    int json, show_reasoning, in_reasoning, tool_calls;
    buf text, reasoning, tools; /* --json: the content, the reasoning, the tool calls (JSON) */
    int failed;
} stream_out;

static int buf_add(buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *t = realloc(b->s, cap);
        if (!t) return -1;
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    return 0;
}

static int say(const char *s, size_t n) {
    if (n && fwrite(s, 1, n, stdout) != n) return 1; /* stdout gone: cancel */
    fflush(stdout);
    return 0;
}

/* --chat: every piece of the split output */
static int on_chunk(void *user, const colibri_chunk *c) {
    stream_out *o = user;
    if (o->json) {
        buf *b = c->kind == COLIBRI_TEXT_CONTENT ? &o->text : c->kind == COLIBRI_TEXT_REASONING
                                                              ? &o->reasoning : &o->tools;
        if (buf_add(b, c->text, c->len)) { o->failed = 1; return 1; }
        return 0;
    }
    if (c->kind == COLIBRI_TEXT_TOOL_CALL) {
        if (!o->tool_calls++)
            fprintf(stderr, "colibri: the model called a tool (%s), which colibri does not run\n",
                    c->recipient);
        if (!o->show_reasoning) return 0;
    }
    int reasoning = c->kind != COLIBRI_TEXT_CONTENT;
    if (reasoning && !o->show_reasoning) return 0;
    if (reasoning != o->in_reasoning && o->show_reasoning) {
        if (say(reasoning ? "<reasoning>\n" : "\n</reasoning>\n", reasoning ? 12 : 14)) return 1;
        o->in_reasoning = reasoning;
    }
    return say(c->text, c->len);
}

static int on_text(void *user, int32_t id, const char *text, size_t len) {
    stream_out *o = user;
    if (!o->json) return say(text, len);
    if (buf_add(&o->text, text, len)) { o->failed = 1; return 1; }
    return 0;
}

/* The prompt's ids: the chat template's text (which carries its own BOS) or the plain text with
 * the tokenizer's special tokens added, as transformers' tokenizer(prompt) does. */
static int prompt_ids(const gen_cli *c, colibri_ctx *ctx, int32_t **ids, size_t *n,
                      char **rendered_out, size_t *rendered_len) {
    char why[512] = "";
    char *rendered = NULL;
    colibri_chat_options co;
    colibri_default_chat_options(&co);
    co.enable_thinking = c->ch.thinking;
    co.reasoning_effort = c->ch.reasoning_effort;
    const char *text = c->prompt;
    size_t text_len = strlen(c->prompt);
    int add_special = 1;
    if (c->chat) {
        colibri_chat_message msgs[2];
        int nm = 0;
        if (c->system) msgs[nm++] = (colibri_chat_message){"system", c->system};
        msgs[nm++] = (colibri_chat_message){"user", c->prompt};
        size_t need = 0;
        colibri_status s = colibri_chat_render_ex(colibri_ctx_model(ctx), msgs, nm, &co, NULL, 0,
                                                  &need, why, sizeof why);
        if (!s) {
            rendered = malloc(need + 1);
            if (!rendered) return 1;
            s = colibri_chat_render_ex(colibri_ctx_model(ctx), msgs, nm, &co, rendered, need + 1,
                                       &need, why, sizeof why);
        }
        if (s) {
            fprintf(stderr, "colibri: --chat: %s\n", why);
            free(rendered);
            return 1;
        }
        text = rendered;
        text_len = need;
        add_special = 0;
    }
    size_t need = 0;
    colibri_status s = colibri_tokenize(ctx, text, text_len, add_special, NULL, 0, &need);
    if (s == COLIBRI_OK || s == COLIBRI_E_BUFFER_TOO_SMALL) {
        *ids = malloc((need ? need : 1) * sizeof **ids);
        s = *ids ? colibri_tokenize(ctx, text, text_len, add_special, *ids, need, n)
                 : COLIBRI_E_NO_MEMORY;
    }
    if (rendered_out && rendered) {
        *rendered_out = rendered;
        *rendered_len = text_len;
    } else {
        free(rendered);
    }
    if (s) {
        fprintf(stderr, "colibri: %s: %s\n", c->model, colibri_strerror(s));
        return 1;
    }
    if (*n == 0) {
        fprintf(stderr, "colibri: the prompt tokenizes to no ids: give some text\n");
        return 1;
    }
    return 0;
}

static void put_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
}

/* --prompt: text in, streamed text out (or one JSON object with --json). */
static int run_prompt(const gen_cli *c, colibri_ctx *ctx) {
    colibri_tokenizer_info ti;
    colibri_get_tokenizer_info(ctx, &ti);
    if (!ti.has_tokenizer) {
        fprintf(stderr, "colibri: %s: %s\n", c->model, colibri_strerror(COLIBRI_E_NO_TOKENIZER));
        return 1;
    }
    int32_t *ids = NULL, *out = NULL;
    size_t n = 0, rendered_len = 0;
    char *rendered = NULL;
    if (prompt_ids(c, ctx, &ids, &n, &rendered, &rendered_len)) { free(ids); free(rendered); return 1; }
    int rc = 1;
    out = malloc(((size_t)c->max_new + 1) * sizeof *out);
    if (!out || n > (size_t)INT32_MAX) goto done;
    colibri_generate_params p;
    colibri_default_generate_params(&p);
    p.prompt = ids;
    p.n_prompt = (int)n;
    p.max_new = (int)c->max_new;
    p.sampling = c->sampling;
    p.ignore_eos = c->ignore_eos;
    /* detokenizer + generation_config eos ids; with --chat the template's output format */
    if (c->chat) colibri_generate_params_for_chat(ctx, &p, rendered, rendered_len);
    else colibri_generate_params_for_text(ctx, &p);
    free(rendered);
    if (c->ignore_eos) p.n_stop_ids = 0;
    p.stop_strings = c->stops;
    p.n_stop_strings = c->n_stops;
    stream_out so;
    memset(&so, 0, sizeof so);
    so.json = c->json;
    so.show_reasoning = c->ch.show_reasoning;
    if (p.reasoning) {
        p.on_chunk = on_chunk;
        p.chunk_user = &so;
    } else {
        p.on_token = on_text;
        p.user = &so;
    }
    colibri_generate_result r;
    colibri_status s = colibri_generate(ctx, &p, out, &r);
    if (s || so.failed) {
        if (!c->json) fputc('\n', stdout);
        if (s) fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(ctx));
        else fprintf(stderr, "colibri: out of memory for the generated text\n");
        goto done_text;
    }
    fallback_note(ctx);
    if (c->json) {
        printf("{\"prompt_ids\": [");
        put_ids(ids, n);
        printf("], \"ids\": [");
        put_ids(out, (size_t)r.n_new);
        printf("], \"text\": ");
        cli_json_string(stdout, so.text.s ? so.text.s : "", so.text.len);
        if (p.reasoning) {
            /* the split output, and all of it as the model wrote it (markers included) */
            printf(", \"reasoning\": ");
            cli_json_string(stdout, so.reasoning.s ? so.reasoning.s : "", so.reasoning.len);
            printf(", \"tool_call_text\": ");
            cli_json_string(stdout, so.tools.s ? so.tools.s : "", so.tools.len);
            printf(", \"reasoning_format\": \"%s\", \"raw\": ",
                   p.reasoning == COLIBRI_REASONING_HARMONY ? "harmony" : "think");
            size_t need = 0;
            colibri_detokenize(ctx, out, (size_t)r.n_new, 0, NULL, 0, &need);
            char *raw = malloc(need + 1);
            if (raw && colibri_detokenize(ctx, out, (size_t)r.n_new, 0, raw, need + 1, &need) == COLIBRI_OK)
                cli_json_string(stdout, raw, need);
            else
                printf("\"\"");
            free(raw);
        }
        printf(", \"finish_reason\": \"%s\", \"prompt_tokens\": %zu, \"new_tokens\": %d, "
               "\"prefill_ms\": %.3f, \"decode_ms\": %.3f, \"decode_tok_s\": %.3f}\n",
               colibri_finish_name(r.finish), n, r.n_new, r.prefill_ms, r.decode_ms,
               r.n_new > 1 && r.decode_ms > 0 ? (r.n_new - 1) / (r.decode_ms / 1e3) : 0.0);
    } else {
        if (so.in_reasoning) fputs("\n</reasoning>", stdout);
        fputc('\n', stdout);
    }
    rc = 0;
done_text:
    free(so.text.s);
    free(so.reasoning.s);
    free(so.tools.s);
done:
    free(ids);
    free(out);
    return rc;
}

/* argv[0] is the word "generate"; g: the global options before it. */
int colibri_cmd_generate(const cli_globals *g, int argc, char **argv) {
    gen_cli c;
    memset(&c, 0, sizeof c);
    c.g = *g;
    c.max_new = -1;
    c.ch.thinking = -1;
    colibri_default_sampling(&c.sampling);
    int rc = parse(&c, argc, argv);
    if (rc) return rc < 0 ? 0 : rc; /* -1: --help */
    colibri_ctx *ctx;
    if (cli_open_globals(c.model, &c.g, &ctx)) return 1;
    rc = c.prompt ? run_prompt(&c, ctx) : run_ids(&c, ctx);
    colibri_free(ctx);
    return rc;
}
