/* `colibri bench-contexts MODEL [--contexts N] [--gen N] [--prompt-len N] [--threads T] [--json]`:
 * the shared-model API measured. One colibri_model_load, then N contexts (colibri_ctx_new, each
 * timed), then N threads each prefilling its own prompt and decoding --gen greedy tokens at the
 * same time. Prints load ms, context creation ms (each), and aggregate / per-context decode
 * tok/s. --threads is per context (default 1, so N contexts use N cores). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "colibri.h"

#define MAX_CTX 64

typedef struct {
    colibri_ctx *ctx;
    int plen, gen;
    uint32_t vocab;
    double decode_ms;
    int failed;
} bench_job;

static void *bench_thread(void *arg) {
    bench_job *j = arg;
    int32_t *ids = malloc((size_t)j->plen * sizeof *ids);
    int32_t *out = malloc(((size_t)j->gen + 1) * sizeof *out);
    if (!ids || !out) { j->failed = 1; free(ids); free(out); return NULL; }
    for (int i = 0; i < j->plen; i++) ids[i] = (int32_t)((i * 7919 + 13) % j->vocab);
    colibri_generate_params p;
    colibri_default_generate_params(&p);
    p.prompt = ids;
    p.n_prompt = j->plen;
    p.max_new = j->gen;
    p.ignore_eos = 1;
    colibri_generate_result r;
    if (colibri_generate(j->ctx, &p, out, &r) != COLIBRI_OK || r.n_new != j->gen) j->failed = 1;
    j->decode_ms = r.decode_ms;
    free(ids);
    free(out);
    return NULL;
}

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int bc_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(f, "usage: colibri bench-contexts MODEL [--contexts N] [--gen N] [--prompt-len N] [--json]\n"
               "  one shared model, N contexts (1..64, default 1) decoding --gen tokens (32) after\n"
               "  --prompt-len (16) at once; here --threads is per context (default 1) and\n"
               "  --backend defaults to cpu\n" CLI_GLOBAL_HELP);
    return 2;
}

static int bc_usage(const char *msg) { return bc_usage_to(stderr, msg); }

/* argv[0] is the word "bench-contexts"; g: the global options before it. */
int colibri_cmd_bench_contexts(const cli_globals *g0, int argc, char **argv) {
    const char *model = NULL;
    long n = 1, gen = 32, plen = 16;
    int json = 0;
    cli_globals g = *g0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *dst = !strcmp(a, "--contexts") ? &n : !strcmp(a, "--gen") ? &gen
                  : !strcmp(a, "--prompt-len") ? &plen : NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bc_usage_to(stdout, NULL);
            return 0;
        } else if (dst) {
            if (!v || cli_long(v, 1, dst == &n ? MAX_CTX : 1048576, dst))
                return bc_usage("--contexts 1..64, --gen/--prompt-len >= 1");
            i++;
        } else if (!strcmp(a, "--json")) json = 1;
        else if ((r = cli_global(&g, argc, argv, &i)) != 0) {
            if (r < 0) return bc_usage(NULL);
        } else if (a[0] == '-') {
            fprintf(stderr, "colibri bench-contexts: unknown option %s\n", a);
            return bc_usage(NULL);
        } else if (model) return bc_usage("too many arguments");
        else model = a;
    }
    if (!model) return bc_usage("MODEL is required");
    long threads = g.threads ? g.threads : 1;
    colibri_backend backend = g.backend_given ? g.backend : COLIBRI_BACKEND_CPU;
    colibri_kv_dtype kv = g.kv;
    char err[512] = "";
    colibri_options opt;
    colibri_default_options(&opt);
    opt.backend = backend;
    opt.threads = (int)threads;
    opt.kv_dtype = kv;
    opt.int8_activations = g.int8_act;
    opt.error = err;
    opt.error_len = sizeof err;
    double t0 = cli_now_ms();
    colibri_model *m;
    colibri_status s = colibri_model_load(&m, model, &opt);
    if (s) {
        cli_report(model, s, err);
        return 1;
    }
    double load_ms = cli_now_ms() - t0;
    colibri_model_info info;
    colibri_model_get_info(m, &info);
    if (plen + gen > (long)info.max_seq_len) {
        fprintf(stderr, "colibri: --prompt-len %ld + --gen %ld exceeds max_seq_len %u\n", plen, gen,
                info.max_seq_len);
        colibri_model_free(m);
        return 1;
    }
    bench_job jobs[MAX_CTX];
    double create_ms[MAX_CTX];
    memset(jobs, 0, sizeof jobs);
    int rc = 0, made = 0;
    for (; made < n; made++) {
        double a = cli_now_ms();
        s = colibri_ctx_new(&jobs[made].ctx, m, &opt);
        create_ms[made] = cli_now_ms() - a;
        if (s) {
            char what[32];
            snprintf(what, sizeof what, "context %d", made);
            cli_report(what, s, err);
            rc = 1;
            break;
        }
        jobs[made].plen = (int)plen;
        jobs[made].gen = (int)gen;
        jobs[made].vocab = info.vocab_size;
    }
    colibri_model_free(m); /* the contexts keep it alive */
    if (!rc) {
        /* warm-up: page the weights in once so the first context does not pay for everyone */
        bench_job warm = jobs[0];
        bench_thread(&warm);
        pthread_t th[MAX_CTX];
        double a = cli_now_ms();
        for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, bench_thread, &jobs[i]);
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        double wall = cli_now_ms() - a;
        double worst = 0, sum_create = 0, max_create = 0;
        for (int i = 0; i < n; i++) {
            if (jobs[i].failed) rc = 1;
            if (jobs[i].decode_ms > worst) worst = jobs[i].decode_ms;
            sum_create += create_ms[i];
            if (create_ms[i] > max_create) max_create = create_ms[i];
        }
        double agg = worst > 0 ? (double)gen * n / (worst / 1e3) : 0;
        if (json) {
            printf("{\"contexts\": %ld, \"threads_per_context\": %ld, \"load_ms\": %.3f, "
                   "\"ctx_create_ms_mean\": %.3f, \"ctx_create_ms_max\": %.3f, \"gen\": %ld, "
                   "\"prompt_len\": %ld, \"wall_ms\": %.3f, \"decode_tok_s_total\": %.3f, "
                   "\"decode_tok_s_per_context\": %.3f, \"failed\": %s}\n",
                   n, threads, load_ms, sum_create / n, max_create, gen, plen, wall, agg, agg / n,
                   rc ? "true" : "false");
        } else {
            printf("model load %.2f ms; %ld context(s), %ld thread(s) each: create mean %.3f ms, "
                   "max %.3f ms\ndecode %ld tokens each at once: %.2f tok/s total, %.2f per context\n",
                   load_ms, n, threads, sum_create / n, max_create, gen, agg, agg / n);
        }
    }
    for (int i = 0; i < made; i++) colibri_free(jobs[i].ctx);
    return rc;
}
