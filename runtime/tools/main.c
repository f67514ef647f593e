/* colibri: command-line front end of the runtime.
 *
 *   colibri --version
 *   colibri [--backend cpu|cuda|auto] [--threads N] [--int8-act] [--kv-cache f32|f16] COMMAND ...
 *     info MODEL                                   JSON: geometry, dtype, padding, backend
 *     forward MODEL --ids 1,2,3 [--last] [--logits-out F]   raw little-endian f32 [n, V] (--last:
 *                                  [1, V], colibri_forward_last) or a JSON summary;
 *                                  [--decode-from K]: ids before K in one call, then one call
 *                                  per token (decode steps: the GPU's CUDA-graph path)
 *     generate MODEL --ids 1,2 --max-new N         greedy or sampled; JSON {"ids", "new_ids", ...}
 *                                                  (tools/cmd_generate.c; `generate --help`)
 *     bench MODEL [--prompt-len N] [--gen N] [--runs N] [--json]
 *     selftest                                     built-in checks, no model needed
 *     dump-routing MODEL --ids ... --out F         routing decisions (builds with COLIBRI_DEBUG)
 *
 * Exit status: 0 success, 1 bad input or a runtime failure (one line on stderr), 2 usage. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "../kernels/colibri_abi.h"
#include "cli.h"
#include "colibri.h"
#include "colibri_config.h"

int colibri_cmd_generate(int argc, char **argv, int skip); /* cmd_generate.c */
int colibri_cmd_bench_contexts(int argc, char **argv, int skip); /* cmd_bench_contexts.c */

#define STR2(x) #x
#define STR(x) STR2(x)

typedef struct {
    colibri_backend backend;
    int threads;
    int int8_act;
    colibri_kv_dtype kv;
    const char *cmd, *model, *ids, *logits_out, *out;
    long max_new, prompt_len, gen, runs;
    int json;
    int last; /* forward --last: only the last token's logits (colibri_forward_last) */
    long decode_from; /* forward --decode-from K: ids[K..] one call each; -1: one call */
} cli;

static int usage(const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(stderr,
            "usage: colibri --version\n"
            "       colibri [--backend cpu|cuda|auto] [--threads N] [--int8-act] [--kv-cache f32|f16]\n"
            "               COMMAND ...\n"
            "  info MODEL\n"
            "  forward MODEL --ids 1,2,3 [--last | --decode-from K] [--logits-out FILE]\n"
            "  generate MODEL (--ids 1,2,3 --max-new N | --prompt T) [sampling...]  (generate --help)\n"
            "  bench MODEL [--prompt-len N] [--gen N] [--runs N] [--json]\n"
            "  dump-routing MODEL --ids 1,2,3 --out FILE\n"
            "  bench-contexts MODEL [--contexts N] [--gen N] [--threads T] [--json]\n"
            "  tokenize MODEL (--text T | --text-file F) [--no-special]\n"
            "  detokenize MODEL --ids 1,2,3 [--skip-special]\n"
            "  selftest\n"
            "  serve MODEL [--host H] [--port P] [--slots N] [--max-queue Q] [--api-key-file F] (serve --help)\n"
            "  gpuprobe [--mib N] [--iters N] [--json]      GPU copy bandwidth (gpuprobe --help)\n"
            "  synth OUT [geometry options]                 random model for speed checks (synth --help)\n");
    return 2;
}

/* "1,2,3" -> ids (malloc'd). Returns count, or -1 with a message. */
static int argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i; /* ties: the lower id */
    return (int)best;
}

static const char *dtype_name(uint32_t d) {
    static const char *names[] = COLIBRI_DT_NAMES;
    return d < COLIBRI_DT_COUNT ? names[d] : "unknown";
}
static const char *family_name(uint32_t f) {
    static const char *names[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
    return f < 4 ? names[f] : "other";
}

static void print_backend_json(FILE *f, colibri_ctx *ctx) {
    colibri_runtime_info r;
    colibri_get_runtime_info(ctx, &r);
    fprintf(f, "{\"name\": \"%s\", \"threads\": %d, \"cpu_simd\": \"%s\", \"arena_bytes\": %zu, "
            "\"kv_dtype\": \"%s\", \"kv_cache_bytes\": %zu, ",
            r.backend, r.threads, r.cpu_simd, r.arena_bytes, r.kv_dtype, r.kv_cache_bytes);
    fprintf(f, "\"fallback_reason\": ");
    cli_json_string(f, r.fallback_reason, strlen(r.fallback_reason));
    fprintf(f, ", \"cuda_device\": ");
    cli_json_string(f, r.cuda_device, strlen(r.cuda_device));
    fprintf(f, ", \"cuda_sm\": %d, \"cuda_driver_version\": %d, \"cuda_image\": \"%s\", "
            "\"cuda_weights\": \"%s\", \"cuda_integrated\": %s, \"cuda_device_bytes\": %zu, "
            "\"cuda_prefill\": \"%s\", \"cuda_chunk\": %d, \"cuda_libcuda\": ",
            r.cuda_sm, r.cuda_driver_version, r.cuda_image, r.cuda_weights,
            r.cuda_integrated ? "true" : "false", r.cuda_device_bytes, r.cuda_prefill,
            r.cuda_chunk);
    cli_json_string(f, r.cuda_libcuda, strlen(r.cuda_libcuda));
    fprintf(f, ", \"cuda_weights_why\": ");
    cli_json_string(f, r.cuda_weights_why, strlen(r.cuda_weights_why));
    fprintf(f, "}");
}

/* --backend auto fell back to the CPU: say why in one line on stderr (stdout stays JSON or raw
 * logits, so scripts parsing it are not disturbed). Printed once the model ran, so that a failure
 * still gives exactly one stderr line: its cause. */
static void note_fallback(colibri_ctx *ctx) {
    colibri_runtime_info r;
    colibri_get_runtime_info(ctx, &r);
    if (r.fallback_reason[0])
        fprintf(stderr, "colibri: CUDA unavailable (%s); running on CPU\n", r.fallback_reason);
}

static int cmd_info(const cli *c) {
    colibri_ctx *ctx;
    if (cli_open(c->model, c->backend, c->threads, c->int8_act, c->kv, &ctx)) return 1;
    colibri_model_info m;
    colibri_get_model_info(ctx, &m);
    printf("{\"name\": ");
    cli_json_string(stdout, m.name, strlen(m.name));
    printf(", \"family\": \"%s\", \"dtype\": \"%s\", \"vocab_size\": %u, \"embed_dim\": %u, "
           "\"embed_dim_pad\": %u, \"pad_multiple\": %u, \"n_layers\": %u, \"n_heads\": %u, "
           "\"n_kv_heads\": %u, \"head_dim\": %u, \"num_experts\": %u, \"top_k\": %u, "
           "\"expert_size\": %u, \"shared_expert_size\": %u, \"max_seq_len\": %u, "
           "\"routing\": \"%s\", \"flags\": %u, \"norm_eps\": %.9g, \"rope_theta\": %.9g, "
           "\"bos_token_id\": %d, \"eos_token_id\": %d, \"file_size\": %llu, "
           "\"target\": \"%s\", \"routing_mode\": \"%s\", \"backend\": ",
           family_name(m.family), dtype_name(m.dtype), m.vocab_size, m.embed_dim, m.embed_dim_pad,
           m.pad_multiple, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.num_experts, m.top_k,
           m.expert_size, m.shared_expert_size, m.max_seq_len,
           m.routing == 0 ? "renormalise" : "softmax", m.flags, (double)m.norm_eps,
           (double)m.rope_theta, m.bos_token_id == 0xFFFFFFFFu ? -1 : (int)m.bos_token_id,
           m.eos_token_id == 0xFFFFFFFFu ? -1 : (int)m.eos_token_id,
           (unsigned long long)m.file_size, COLIBRI_TARGET_NAME,
           COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK ? "softmax_topk" : "linear_score");
    print_backend_json(stdout, ctx);
    printf("}\n");
    colibri_free(ctx);
    return 0;
}

/* Load the model and the ids; run them; logits (n x V) malloc'd for the caller. */
static int run_ids(const cli *c, colibri_ctx **ctx, int32_t **ids, int *n, float **logits) {
    if (!c->ids) return usage("--ids is required");
    size_t count;
    if (cli_ids(c->ids, ids, &count)) return usage("--ids must be comma-separated integers, e.g. 1,2,3");
    *n = (int)count;
    if (cli_open(c->model, c->backend, c->threads, c->int8_act, c->kv, ctx)) return 1; /* the caller frees *ids */
    colibri_model_info m;
    colibri_get_model_info(*ctx, &m);
    *logits = malloc((size_t)(c->last ? 1 : *n) * m.vocab_size * sizeof(float));
    if (!*logits) {
        fprintf(stderr, "colibri: out of memory for %d x %u logits\n", *n, m.vocab_size);
        return 1;
    }
    colibri_status s;
    if (c->decode_from >= 0 && !c->last) {
        /* the prompt part in one call, then decode steps of one token each: same logits rows */
        const int k = c->decode_from < *n ? (int)c->decode_from : *n;
        s = k > 0 ? colibri_forward(*ctx, *ids, k, *logits) : COLIBRI_OK;
        for (int i = k; i < *n && s == COLIBRI_OK; i++)
            s = colibri_forward(*ctx, *ids + i, 1, *logits + (size_t)i * m.vocab_size);
    } else {
        s = c->last ? colibri_forward_last(*ctx, *ids, *n, *logits)
                    : colibri_forward(*ctx, *ids, *n, *logits);
    }
    if (s) {
        fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(*ctx));
        return 1;
    }
    return 0;
}

static int cmd_forward(const cli *c) {
    colibri_ctx *ctx = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int n = 0, rc = run_ids(c, &ctx, &ids, &n, &logits);
    if (rc) goto done;
    colibri_model_info m;
    colibri_get_model_info(ctx, &m);
    int p0 = c->last ? n - 1 : 0; /* the position of the first row written */
    n -= p0;
    size_t total = (size_t)n * m.vocab_size;
    if (c->logits_out) {
        FILE *f = fopen(c->logits_out, "wb");
        /* little-endian hosts only (x86_64, aarch64): floats are written as they are in memory */
        if (!f || fwrite(logits, sizeof(float), total, f) != total || fclose(f) != 0) {
            fprintf(stderr, "colibri: cannot write %s: %s\n", c->logits_out, strerror(errno));
            rc = 1;
            goto done;
        }
        printf("{\"n\": %d, \"vocab_size\": %u, \"logits_out\": ", n, m.vocab_size);
        cli_json_string(stdout, c->logits_out, strlen(c->logits_out));
        printf("}\n");
    } else {
        printf("{\"n\": %d, \"vocab_size\": %u, \"positions\": [", n, m.vocab_size);
        for (int j = 0; j < n; j++) {
            float *row = logits + (size_t)j * m.vocab_size;
            printf("%s{\"pos\": %d, \"top5\": [", j ? ", " : "", p0 + j);
            for (int r = 0; r < 5 && r < (int)m.vocab_size; r++) {
                int best = argmax(row, m.vocab_size);
                printf("%s[%d, %.6g]", r ? ", " : "", best, (double)row[best]);
                row[best] = -INFINITY;
            }
            printf("]}");
        }
        printf("]}\n");
    }
    note_fallback(ctx);
done:
    free(logits);
    free(ids);
    colibri_free(ctx);
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* Nearest-rank percentile of a sorted array. */
static double pct(const double *v, int n, double p) {
    int r = (int)ceil(p / 100.0 * n);
    if (r < 1) r = 1;
    return v[r - 1];
}

/* A "VmHWM:"/"VmRSS:" line of /proc/self/status in MB (0 when absent). */
static double proc_status_mb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t klen = strlen(key);
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && sscanf(line + klen, " %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024.0;
}

/* VmHWM: unlike getrusage's ru_maxrss it starts afresh at exec, so a parent's footprint (e.g. a
 * Python benchmark driver) is not reported as ours. */
static double peak_rss_mb(void) {
    double kb = proc_status_mb("VmHWM:") * 1024.0;
    if (kb == 0) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        kb = (double)ru.ru_maxrss;
    }
    return kb / 1024.0;
}

static int cmd_bench(const cli *c) {
    double t0 = cli_now_ms();
    colibri_ctx *ctx;
    if (cli_open(c->model, c->backend, c->threads, c->int8_act, c->kv, &ctx)) return 1;
    double load_ms = cli_now_ms() - t0;
    colibri_model_info m;
    colibri_get_model_info(ctx, &m);
    long plen = c->prompt_len, gen = c->gen, runs = c->runs;
    if (plen + gen > (long)m.max_seq_len) {
        fprintf(stderr, "colibri: --prompt-len %ld + --gen %ld exceeds max_seq_len %u\n", plen, gen,
                m.max_seq_len);
        colibri_free(ctx);
        return 1;
    }
    int32_t *ids = malloc((size_t)plen * sizeof *ids);
    float *logits = malloc((size_t)plen * m.vocab_size * sizeof(float));
    double *prefill = calloc((size_t)runs, sizeof(double)), *first = calloc((size_t)runs, sizeof(double));
    double *decode = calloc((size_t)runs, sizeof(double));
    if (!ids || !logits || !prefill || !first || !decode) {
        fprintf(stderr, "colibri: out of memory\n");
        return 1;
    }
    for (long i = 0; i < plen; i++) ids[i] = (int32_t)((i * 7919 + 13) % m.vocab_size);
    int rc = 0;
    /* one untimed warm-up run pages the weights in; run -1 is it */
    for (long r = -1; r < runs && !rc; r++) {
        colibri_reset(ctx);
        double a = cli_now_ms();
        /* the prompt as colibri_generate runs it: the last token's logits only */
        colibri_status s = colibri_forward_last(ctx, ids, (int)plen, logits);
        double b = cli_now_ms();
        int32_t next = argmax(logits, m.vocab_size);
        double cdone = cli_now_ms();
        for (long g = 0; g < gen && !s; g++) {
            s = colibri_forward(ctx, &next, 1, logits);
            next = argmax(logits, m.vocab_size);
        }
        if (r >= 0) {
            prefill[r] = b - a;
            first[r] = cdone - a; /* time to the first new token: prefill + pick */
            decode[r] = cli_now_ms() - cdone;
        }
        if (s) {
            fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(ctx));
            rc = 1;
        }
    }
    if (!rc) {
        note_fallback(ctx);
        double dsum = 0;
        for (long r = 0; r < runs; r++) dsum += decode[r];
        qsort(prefill, (size_t)runs, sizeof(double), cmp_double);
        qsort(first, (size_t)runs, sizeof(double), cmp_double);
        qsort(decode, (size_t)runs, sizeof(double), cmp_double);
        double tok_s = gen > 0 && dsum > 0 ? (double)gen * runs / (dsum / 1e3) : 0.0;
        /* resident now: after a CUDA upload of copied weights the file pages are dropped, so
         * this is below the peak (docs/cuda.md, Memory) */
        double rss_now_mb = proc_status_mb("VmRSS:");
        /* the kernel refreshes VmHWM lazily, so it can trail the current VmRSS */
        double rss_mb = fmax(peak_rss_mb(), rss_now_mb);
        if (c->json) {
            printf("{\"model\": ");
            cli_json_string(stdout, m.name, strlen(m.name));
            printf(", \"dtype\": \"%s\", \"prompt_len\": %ld, \"gen\": %ld, \"runs\": %ld, "
                   "\"load_ms\": %.3f, \"prefill_ms_p50\": %.3f, \"prefill_ms_p99\": %.3f, "
                   "\"first_token_ms_p50\": %.3f, \"first_token_ms_p99\": %.3f, "
                   "\"decode_tok_s\": %.3f, \"peak_rss_mb\": %.1f, \"rss_mb\": %.1f, "
                   "\"target\": \"%s\", \"backend\": ",
                   dtype_name(m.dtype), plen, gen, runs, load_ms, pct(prefill, (int)runs, 50),
                   pct(prefill, (int)runs, 99), pct(first, (int)runs, 50), pct(first, (int)runs, 99),
                   tok_s, rss_mb, rss_now_mb, COLIBRI_TARGET_NAME);
            print_backend_json(stdout, ctx);
            colibri_runtime_info ri;
            colibri_get_runtime_info(ctx, &ri);
            printf(", \"threads\": %d}\n", ri.threads);
        } else {
            printf("model %s (%s)\nload %.1f ms\nprefill %ld tokens: p50 %.2f ms, p99 %.2f ms\n"
                   "first token: p50 %.2f ms, p99 %.2f ms\ndecode: %.2f tok/s\npeak RSS %.1f MB (now %.1f MB)\n",
                   m.name, dtype_name(m.dtype), load_ms, plen, pct(prefill, (int)runs, 50),
                   pct(prefill, (int)runs, 99), pct(first, (int)runs, 50), pct(first, (int)runs, 99),
                   tok_s, rss_mb, rss_now_mb);
        }
    }
    free(ids);
    free(logits);
    free(prefill);
    free(first);
    free(decode);
    colibri_free(ctx);
    return rc;
}

static int cmd_dump_routing(const cli *c) {
    if (!c->out) return usage("--out FILE is required");
    colibri_ctx *ctx = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    int n = 0, rc = run_ids(c, &ctx, &ids, &n, &logits);
    if (!rc) {
        colibri_status s = colibri_dump_routing(ctx, c->out);
        if (s) {
            fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(ctx));
            rc = 1;
        }
    }
    free(logits);
    free(ids);
    colibri_free(ctx);
    return rc;
}

static int print_version(void) {
    printf("colibri %s target=%s\n", COLIBRI_VERSION_STRING, COLIBRI_TARGET_NAME);
    printf("COLIBRI_EMBED_DIM_PAD=%d COLIBRI_STREAM_COUNT=%d COLIBRI_ROUTING_MODE=%s "
           "COLIBRI_TOP_K=%d COLIBRI_MAX_EXPERTS=%d profile=%s\n",
           COLIBRI_EMBED_DIM_PAD, COLIBRI_STREAM_COUNT,
           COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK ? "softmax_topk" : "linear_score",
           COLIBRI_TOP_K, COLIBRI_MAX_EXPERTS, COLIBRI_PROFILE_HASH);
    printf("COLIBRI_TARGET_ARCH=%s COLIBRI_CUDA_VERSION=%s COLIBRI_CUDA_ARCHS=%s COLIBRI_IGPU=%s "
           "COLIBRI_GLIBC_FLOOR=%s\n",
           STR(COLIBRI_TARGET_ARCH), STR(COLIBRI_CUDA_VERSION), STR(COLIBRI_CUDA_ARCHS),
           STR(COLIBRI_IGPU), STR(COLIBRI_GLIBC_FLOOR));
    return 0;
}

int cmd_serve_wanted(int argc, char **argv); /* tools/cmd_serve.c */
int cmd_serve(int argc, char **argv);
int colibri_cmd_text(int argc, char **argv); /* cmd_text.c */
int cmd_gpuprobe(int argc, char **argv);     /* tools/cmd_gpuprobe.c */
int cmd_synth(int argc, char **argv);        /* tools/cmd_synth.c */

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "gpuprobe")) return cmd_gpuprobe(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "synth")) return cmd_synth(argc - 1, argv + 1);
    if (cmd_serve_wanted(argc, argv)) return cmd_serve(argc, argv);
    int text_rc = colibri_cmd_text(argc, argv); /* tokenize / detokenize */
    if (text_rc >= 0) return text_rc;
    cli c;
    memset(&c, 0, sizeof c);
    c.backend = COLIBRI_BACKEND_AUTO;
    c.max_new = -1;
    c.decode_from = -1;
    c.prompt_len = 32;
    c.gen = 32;
    c.runs = 5;
    const char *pos[3] = {0};
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long num;
#define NEED_VALUE() do { if (!v) return usage("missing value after an option"); i++; } while (0)
        if (!strcmp(a, "--version")) return print_version();
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(NULL); return 0; }
        else if (!strcmp(a, "--backend")) {
            NEED_VALUE();
            if (!strcmp(v, "cpu")) c.backend = COLIBRI_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) c.backend = COLIBRI_BACKEND_CUDA;
            else if (!strcmp(v, "auto")) c.backend = COLIBRI_BACKEND_AUTO;
            else return usage("--backend must be cpu, cuda or auto");
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE();
            if (cli_long(v, 1, 64, &num)) return usage("--threads must be 1..64");
            c.threads = (int)num;
        } else if (!strcmp(a, "--int8-act")) c.int8_act = 1;
        else if (!strcmp(a, "--kv-cache")) {
            NEED_VALUE();
            if (cli_kv_dtype(v, &c.kv)) return usage(CLI_KV_USAGE);
        } else if (!strcmp(a, "--json")) c.json = 1;
        else if (!strcmp(a, "--last")) c.last = 1;
        else if (!strcmp(a, "--decode-from")) {
            NEED_VALUE();
            if (cli_long(v, 0, INT_MAX, &c.decode_from)) return usage("--decode-from must be >= 0");
        }
        else if (!strcmp(a, "--ids")) { NEED_VALUE(); c.ids = v; }
        else if (!strcmp(a, "--logits-out")) { NEED_VALUE(); c.logits_out = v; }
        else if (!strcmp(a, "--out")) { NEED_VALUE(); c.out = v; }
        else if (!strcmp(a, "--max-new")) {
            NEED_VALUE();
            if (cli_long(v, 0, 1048576, &c.max_new)) return usage("--max-new must be 0..1048576");
        } else if (!strcmp(a, "--prompt-len")) {
            NEED_VALUE();
            if (cli_long(v, 1, 1048576, &c.prompt_len)) return usage("--prompt-len must be >= 1");
        } else if (!strcmp(a, "--gen")) {
            NEED_VALUE();
            if (cli_long(v, 0, 1048576, &c.gen)) return usage("--gen must be >= 0");
        } else if (!strcmp(a, "--runs")) {
            NEED_VALUE();
            if (cli_long(v, 1, 100000, &c.runs)) return usage("--runs must be >= 1");
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "colibri: unknown option %s\n", a);
            return usage(NULL);
        } else {
            if (npos == 0 && !strcmp(a, "generate")) return colibri_cmd_generate(argc, argv, i);
            if (npos == 0 && !strcmp(a, "bench-contexts"))
                return colibri_cmd_bench_contexts(argc, argv, i);
            if (npos == 2) return usage("too many arguments");
            pos[npos++] = a;
        }
#undef NEED_VALUE
    }
    if (npos == 0) return usage("a command is required");
    c.cmd = pos[0];
    if (!strcmp(c.cmd, "selftest")) {
        if (npos != 1) return usage("selftest takes no model");
        return colibri_selftest(1) == 0 ? 0 : 1;
    }
    if (npos != 2) return usage("MODEL is required");
    c.model = pos[1];
    if (!strcmp(c.cmd, "info")) return cmd_info(&c);
    if (!strcmp(c.cmd, "forward")) return cmd_forward(&c);
    if (!strcmp(c.cmd, "bench")) return cmd_bench(&c);
    if (!strcmp(c.cmd, "dump-routing")) return cmd_dump_routing(&c);
    fprintf(stderr, "colibri: unknown command %s\n", c.cmd);
    return usage(NULL);
}
