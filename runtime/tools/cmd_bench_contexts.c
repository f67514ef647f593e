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

static int bc_usage(const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(stderr, "usage: colibri bench-contexts MODEL [--contexts N] [--gen N] [--prompt-len N]"
                    " [--threads T] [--kv-cache f32|f16] [--json]\n"
                    "  one shared model, N contexts decoding at once; --threads is per context\n");
    return 2;
}

int colibri_cmd_bench_contexts(int argc, char **argv, int skip) {
    const char *model = NULL;
    long n = 1, gen = 32, plen = 16, threads = 1;
    int json = 0;
    colibri_backend backend = COLIBRI_BACKEND_CPU;
    colibri_kv_dtype kv = COLIBRI_KV_F32;
    for (int i = 1; i < argc; i++) {
        if (i == skip) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *dst = !strcmp(a, "--contexts") ? &n : !strcmp(a, "--gen") ? &gen
                  : !strcmp(a, "--prompt-len") ? &plen : !strcmp(a, "--threads") ? &threads : NULL;
        if (dst) {
            if (!v || cli_long(v, 1, dst == &n ? MAX_CTX : 1048576, dst))
                return bc_usage("--contexts 1..64, --gen/--prompt-len/--threads >= 1");
            i++;
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--backend")) {
            if (!v) return bc_usage("missing value after --backend");
            backend = !strcmp(v, "cuda") ? COLIBRI_BACKEND_CUDA : !strcmp(v, "auto")
                      ? COLIBRI_BACKEND_AUTO : COLIBRI_BACKEND_CPU;
            i++;
        } else if (!strcmp(a, "--kv-cache")) {
            if (cli_kv_dtype(v, &kv)) return bc_usage(CLI_KV_USAGE);
            i++;
        } else if (a[0] == '-') return bc_usage("unknown option");
        else if (model) return bc_usage("too many arguments");
        else model = a;
    }
    if (!model) return bc_usage("MODEL is required");
    char err[512] = "";
    colibri_options opt;
    colibri_default_options(&opt);
    opt.backend = backend;
    opt.threads = (int)threads;
    opt.kv_dtype = kv;
    opt.error = err;
    opt.error_len = sizeof err;
    double t0 = cli_now_ms();
    colibri_model *m;
    colibri_status s = colibri_model_load(&m, model, &opt);
    if (s) {
        fprintf(stderr, "colibri: %s: %s: %s\n", model, colibri_strerror(s), err);
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
            fprintf(stderr, "colibri: context %d: %s: %s\n", made, colibri_strerror(s), err);
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
