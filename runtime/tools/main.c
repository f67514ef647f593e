/* colibri: command-line front end of the runtime.
 *
 *   colibri --version | --help
 *   colibri [global options] COMMAND [command options]    (global options may also follow it)
 *
 * The commands are one table (`commands` below: name, run, arguments, summary); each parses its
 * own options, takes the global ones anywhere (cli_global, tools/cli.c) and answers --help with
 * its own usage. `info`, `forward`, `bench`, `dump-routing` and `selftest` live here; the rest in
 * tools/cmd_*.c.
 *
 * Exit status: 0 success, 1 bad input or a runtime failure (one line on stderr), 2 usage. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../kernels/colibri_abi.h"
#include "cli.h"
#include "colibri.h"
#include "colibri_config.h"

/* the commands of the other files (tools/cmd_*.c) */
int colibri_cmd_generate(const cli_globals *g, int argc, char **argv);
int colibri_cmd_bench_contexts(const cli_globals *g, int argc, char **argv);
int colibri_cmd_text(const cli_globals *g, int argc, char **argv);
int cmd_serve(const cli_globals *g, int argc, char **argv);
int cmd_gpuprobe(const cli_globals *g, int argc, char **argv);
int cmd_synth(const cli_globals *g, int argc, char **argv);

#define STR2(x) #x
#define STR(x) STR2(x)

/* What the model commands of this file parse (each allows a subset, `allowed` below). */
typedef struct {
    cli_globals g;
    const char *model, *ids, *logits_out, *out;
    long prompt_len, gen, runs;
    long pace_ms;       /* bench --pace-ms: run r starts at r * pace_ms after the first; 0: back to back */
    const char *trace;  /* bench --trace FILE: every timed sample with its start time */
    int json;
    int stages; /* bench --stages: per-stage times (colibri_set_stage_timing) */
    int last; /* forward --last: only the last token's logits (colibri_forward_last) */
    long decode_from; /* forward --decode-from K: ids[K..] one call each; -1: one call */
    const char *synopsis; /* the command's usage line */
} cli;

enum {
    O_IDS = 1 << 0, O_LAST = 1 << 1, O_DECODE_FROM = 1 << 2, O_LOGITS_OUT = 1 << 3,
    O_OUT = 1 << 4, O_PROMPT_LEN = 1 << 5, O_GEN = 1 << 6, O_RUNS = 1 << 7, O_JSON = 1 << 8,
    O_MODEL = 1 << 9, O_PACE = 1 << 10, O_TRACE = 1 << 11, O_STAGES = 1 << 12
};

/* A command's usage: its synopsis (what follows `colibri`, then what its options mean), then the
 * global options. On stdout for --help (exit 0); on stderr after a usage error (exit 2). */
static int cmd_usage(FILE *f, const char *synopsis, const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(f, "usage: colibri %s\n%s", synopsis, CLI_GLOBAL_HELP);
    return 2;
}

static int usage(const cli *c, const char *msg) { return cmd_usage(stderr, c->synopsis, msg); }

/* Parse argv (argv[0] is the command word) for a command that allows `allowed`. Returns 0 to go
 * on, -1 after --help (exit 0), 2 after a usage error. */
static int parse_cmd(cli *c, const cli_globals *g, unsigned allowed, const char *synopsis,
                     int argc, char **argv) {
    memset(c, 0, sizeof *c);
    c->g = *g;
    c->synopsis = synopsis;
    c->decode_from = -1;
    c->prompt_len = 32;
    c->gen = 32;
    c->runs = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r;
#define TAKES(flag, name) ((allowed & (flag)) && !strcmp(a, name))
#define VALUE()                                                                                 \
    do {                                                                                        \
        if (!v) return usage(c, "missing value after an option");                              \
        i++;                                                                                    \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cmd_usage(stdout, synopsis, NULL);
            return -1;
        } else if ((r = cli_global(&c->g, argc, argv, &i)) != 0) {
            if (r < 0) return usage(c, NULL);
        } else if (TAKES(O_JSON, "--json")) {
            c->json = 1;
        } else if (TAKES(O_STAGES, "--stages")) {
            c->stages = 1;
        } else if (TAKES(O_LAST, "--last")) {
            c->last = 1;
        } else if (TAKES(O_DECODE_FROM, "--decode-from")) {
            VALUE();
            if (cli_long(v, 0, INT_MAX, &c->decode_from)) return usage(c, "--decode-from must be >= 0");
        } else if (TAKES(O_IDS, "--ids")) {
            VALUE();
            c->ids = v;
        } else if (TAKES(O_LOGITS_OUT, "--logits-out")) {
            VALUE();
            c->logits_out = v;
        } else if (TAKES(O_OUT, "--out")) {
            VALUE();
            c->out = v;
        } else if (TAKES(O_PROMPT_LEN, "--prompt-len")) {
            VALUE();
            if (cli_long(v, 1, 1048576, &c->prompt_len)) return usage(c, "--prompt-len must be >= 1");
        } else if (TAKES(O_GEN, "--gen")) {
            VALUE();
            if (cli_long(v, 0, 1048576, &c->gen)) return usage(c, "--gen must be >= 0");
        } else if (TAKES(O_RUNS, "--runs")) {
            VALUE();
            if (cli_long(v, 1, 100000, &c->runs)) return usage(c, "--runs must be >= 1");
        } else if (TAKES(O_PACE, "--pace-ms")) {
            VALUE();
            if (cli_long(v, 0, 600000, &c->pace_ms)) return usage(c, "--pace-ms must be 0..600000");
        } else if (TAKES(O_TRACE, "--trace")) {
            VALUE();
            c->trace = v;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "colibri %s: unknown option %s\n", argv[0], a);
            return usage(c, NULL);
        } else if ((allowed & O_MODEL) && !c->model) {
            c->model = a;
        } else {
            return usage(c, (allowed & O_MODEL) ? "too many arguments" : "takes no arguments");
        }
#undef VALUE
#undef TAKES
    }
    if ((allowed & O_MODEL) && !c->model) return usage(c, "MODEL is required");
    return 0;
}

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
    static const char *names[] = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", NULL,
                                  "qwen3_next", "qwen3_5_moe"};
    return f < sizeof names / sizeof names[0] && names[f] ? names[f] : "other";
}

static void print_backend_json(FILE *f, colibri_ctx *ctx) {
    colibri_runtime_info r;
    colibri_get_runtime_info(ctx, &r);
    fprintf(f, "{\"name\": \"%s\", \"threads\": %d, \"cpu_simd\": \"%s\", \"arena_bytes\": %zu, "
            "\"kv_dtype\": \"%s\", \"kv_cache_bytes\": %zu, \"state_bytes\": %zu, ",
            r.backend, r.threads, r.cpu_simd, r.arena_bytes, r.kv_dtype, r.kv_cache_bytes,
            r.state_bytes);
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

static int same_layer(const colibri_layer_info *a, const colibri_layer_info *b) {
    return !strcmp(a->mixer, b->mixer) && !strcmp(a->ffn, b->ffn) && a->window == b->window;
}

static void put_layer_label(FILE *f, const colibri_layer_info *l) {
    if (l->window) fprintf(f, "%s(%u) + %s", l->mixer, l->window, l->ffn);
    else fprintf(f, "%s + %s", l->mixer, l->ffn);
}

/* "layers": each layer's kinds; "layer_pattern": the shortest period that repeats, e.g.
 * "12 x [sliding_attention(128) + moe, attention + moe]" (as the kit's model-info prints it) */
static void print_layers_json(FILE *f, const colibri_model *m, uint32_t n) {
    fprintf(f, "\"layers\": [");
    for (uint32_t l = 0; l < n; l++) {
        colibri_layer_info li;
        colibri_model_layer_info(m, l, &li);
        fprintf(f, "%s{\"mixer\": \"%s\", \"ffn\": \"%s\", \"window\": %u, \"kv_positions\": %u}",
                l ? ", " : "", li.mixer, li.ffn, li.window, li.kv_positions);
    }
    uint32_t p = 1;
    for (; p < n; p++) {
        if (n % p) continue;
        int repeats = 1;
        for (uint32_t l = p; l < n && repeats; l++) {
            colibri_layer_info a, b;
            colibri_model_layer_info(m, l, &a);
            colibri_model_layer_info(m, l % p, &b);
            repeats = same_layer(&a, &b);
        }
        if (repeats) break;
    }
    fprintf(f, "], \"layer_pattern\": \"%u x [", n / p);
    for (uint32_t l = 0; l < p; l++) {
        colibri_layer_info li;
        colibri_model_layer_info(m, l, &li);
        if (l) fputs(", ", f);
        put_layer_label(f, &li);
    }
    fputs("]\"", f);
}

static int cmd_info(const cli *c) {
    colibri_ctx *ctx;
    if (cli_open_globals(c->model, &c->g, &ctx)) return 1;
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
    printf(", ");
    print_layers_json(stdout, colibri_ctx_model(ctx), m.n_layers);
    printf("}\n");
    colibri_free(ctx);
    return 0;
}

/* Load the model and the ids; run them; logits (n x V) malloc'd for the caller. */
static int run_ids(const cli *c, colibri_ctx **ctx, int32_t **ids, int *n, float **logits) {
    if (!c->ids) return usage(c, "--ids is required");
    size_t count;
    if (cli_ids(c->ids, ids, &count)) return usage(c, "--ids must be comma-separated integers, e.g. 1,2,3");
    *n = (int)count;
    if (cli_open_globals(c->model, &c->g, ctx)) return 1; /* the caller frees *ids */
    if (c->stages) colibri_set_stage_timing(*ctx, 1);
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
        if (c->stages) { /* the whole run's stage times (one or more forward calls) */
            double ms[COLIBRI_STAGE_COUNT];
            colibri_get_stage_times(ctx, ms);
            printf(", \"stages_ms\": {");
            for (int i = 0; i < COLIBRI_STAGE_COUNT; i++)
                printf("%s\"%s\": %.4f", i ? ", " : "", colibri_stage_name(i), ms[i]);
            printf("}");
        }
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

/* p50 / p99 / p99.9 / max of a sorted array, as JSON or text. */
static void dist_json(const char *name, const double *v, long n) {
    printf(", \"%s\": {\"p50\": %.4f, \"p99\": %.4f, \"p999\": %.4f, \"max\": %.4f, \"n\": %ld}",
           name, pct(v, (int)n, 50), pct(v, (int)n, 99), pct(v, (int)n, 99.9), v[n - 1], n);
}

static void dist_text(const char *name, const double *v, long n) {
    printf("%s: p50 %.3f ms, p99 %.3f ms, p99.9 %.3f ms, max %.3f ms (%ld samples)\n", name,
           pct(v, (int)n, 50), pct(v, (int)n, 99), pct(v, (int)n, 99.9), v[n - 1], n);
}

/* The process's page faults so far (every thread: the workers, the caller). */
static void faults_now(unsigned long long *minor, unsigned long long *major) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) memset(&ru, 0, sizeof ru);
    *minor = (unsigned long long)ru.ru_minflt;
    *major = (unsigned long long)ru.ru_majflt;
}

/* Sleep until CLOCK_MONOTONIC reads t_ms (cli_now_ms's clock); an absolute deadline, so the
 * period of a paced bench does not drift by the time each run took. */
static void sleep_until_ms(double t_ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(t_ms / 1e3);
    ts.tv_nsec = (long)((t_ms - (double)ts.tv_sec * 1e3) * 1e6);
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* bench --trace: one line per timed sample, in the order they ran: kind (first: prompt + pick;
 * token: one decoded token), run, token index, its start in ms since the first timed run, its
 * ms. Unsorted, so slow samples can be lined up with time (e.g. the RT throttling period). */
static int write_trace(const char *path, long runs, long gen, const double *first_at,
                       const double *first, const double *tok_at, const double *tok) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "colibri: --trace %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(f, "kind run token start_ms ms\n");
    for (long r = 0; r < runs; r++) {
        fprintf(f, "first %ld -1 %.3f %.3f\n", r, first_at[r], first[r]);
        for (long g = 0; g < gen; g++)
            fprintf(f, "token %ld %ld %.3f %.3f\n", r, g, tok_at[r * gen + g], tok[r * gen + g]);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "colibri: --trace %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* bench: runs (after one untimed warm-up) of the prompt and gen decoded tokens. Per run: the
 * prefill, the first token (prefill + pick), each decoded token's time and page faults (the
 * whole process's, getrusage RUSAGE_SELF around it); their distributions are printed. */
/* bench --stages: the pass's stages (colibri_stage), then the bench's own two entries */
enum { STAGE_SAMPLING = COLIBRI_STAGE_COUNT, STAGE_TOTAL };

/* add the context's stage sums to acc (and zero them for the next call) */
static void stage_take(colibri_ctx *ctx, double *acc) {
    double ms[COLIBRI_STAGE_COUNT];
    colibri_get_stage_times(ctx, ms);
    for (int i = 0; i < COLIBRI_STAGE_COUNT; i++) acc[i] += ms[i];
    colibri_set_stage_timing(ctx, 1);
}

/* the time no stage accounts for: the API's checks, the calls, the clock reads themselves */
static double stage_other(const double *acc) {
    double sum = 0;
    for (int i = 0; i < STAGE_TOTAL; i++) sum += acc[i];
    return acc[STAGE_TOTAL] - sum;
}

static void stages_json(const double *acc, double per) {
    printf("{\"total_ms\": %.4f", acc[STAGE_TOTAL] / per);
    for (int i = 0; i < COLIBRI_STAGE_COUNT; i++)
        printf(", \"%s\": %.4f", colibri_stage_name(i), acc[i] / per);
    printf(", \"sampling\": %.4f, \"other\": %.4f}", acc[STAGE_SAMPLING] / per,
           stage_other(acc) / per);
}

static void stages_text(const char *what, const double *acc, double per) {
    double t = acc[STAGE_TOTAL] > 0 ? acc[STAGE_TOTAL] : 1.0;
    printf("stages, %s: %.3f ms\n", what, acc[STAGE_TOTAL] / per);
    for (int i = 0; i <= STAGE_SAMPLING; i++)
        printf("  %-14s %9.3f ms %5.1f%%\n", i < COLIBRI_STAGE_COUNT ? colibri_stage_name(i) : "sampling",
               acc[i] / per, 100.0 * acc[i] / t);
    printf("  %-14s %9.3f ms %5.1f%%\n", "other", stage_other(acc) / per, 100.0 * stage_other(acc) / t);
}

static int cmd_bench(const cli *c) {
    double t0 = cli_now_ms();
    colibri_ctx *ctx;
    if (cli_open_globals(c->model, &c->g, &ctx)) return 1;
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
    long ntok = gen * runs;
    int32_t *ids = malloc((size_t)plen * sizeof *ids);
    float *logits = malloc((size_t)plen * m.vocab_size * sizeof(float));
    double *prefill = calloc((size_t)runs, sizeof(double)), *first = calloc((size_t)runs, sizeof(double));
    double *decode = calloc((size_t)runs, sizeof(double));
    double *tok = calloc((size_t)(ntok > 0 ? ntok : 1), sizeof(double));
    /* start times for --trace (ms since the first timed run) */
    double *first_at = calloc((size_t)runs, sizeof(double));
    double *tok_at = calloc((size_t)(ntok > 0 ? ntok : 1), sizeof(double));
    if (!ids || !logits || !prefill || !first || !decode || !tok || !first_at || !tok_at) {
        fprintf(stderr, "colibri: out of memory\n");
        return 1;
    }
    for (long i = 0; i < plen; i++) ids[i] = (int32_t)((i * 7919 + 13) % m.vocab_size);
    int rc = 0;
    unsigned long long minor = 0, major = 0, tok_minor_max = 0, tok_major_max = 0;
    unsigned long long warm_minor = 0, warm_major = 0;
    /* --stages: sums over the timed runs, the pass's stages then sampling and the total */
    double st_pre[STAGE_TOTAL + 1] = {0}, st_dec[STAGE_TOTAL + 1] = {0};
    faults_now(&warm_minor, &warm_major);
    /* --pace-ms: timed run r starts at t_run0 + r * pace_ms (a fixed grid: a run that overran
     * its slot makes the next start at once, counted), so a sample does not start in the state
     * (cache, clocks, RT-throttling budget) the previous one left, as a service's requests */
    double t_run0 = 0;
    long overruns = 0;
    /* one untimed warm-up run pages the weights in (and takes every first-touch fault); run -1 */
    for (long r = -1; r < runs && !rc; r++) {
        if (r == 0) { /* the warm-up's faults: what --mlock moves to init */
            unsigned long long mn, mj;
            faults_now(&mn, &mj);
            warm_minor = mn - warm_minor;
            warm_major = mj - warm_major;
            if (c->pace_ms) sleep_until_ms(cli_now_ms() + (double)c->pace_ms);
            t_run0 = cli_now_ms();
        } else if (r > 0 && c->pace_ms) {
            double due = t_run0 + (double)r * (double)c->pace_ms;
            if (cli_now_ms() > due) overruns++;
            else sleep_until_ms(due);
        }
        colibri_reset(ctx);
        int timing = c->stages && r >= 0; /* the timed runs only */
        if (timing) colibri_set_stage_timing(ctx, 1); /* zeroes the sums */
        double a = cli_now_ms();
        /* the prompt as colibri_generate runs it: the last token's logits only */
        colibri_status s = colibri_forward_last(ctx, ids, (int)plen, logits);
        double b = cli_now_ms();
        int32_t next = argmax(logits, m.vocab_size);
        double cdone = cli_now_ms();
        if (timing) {
            stage_take(ctx, st_pre);
            st_pre[STAGE_SAMPLING] += cdone - b;
            st_pre[STAGE_TOTAL] += cdone - a;
        }
        for (long g = 0; g < gen && !s; g++) {
            unsigned long long mn0, mj0, mn1, mj1;
            faults_now(&mn0, &mj0);
            double ta = cli_now_ms();
            s = colibri_forward(ctx, &next, 1, logits);
            double tp = timing ? cli_now_ms() : 0.0;
            next = argmax(logits, m.vocab_size);
            double tb = cli_now_ms();
            if (timing) {
                stage_take(ctx, st_dec);
                st_dec[STAGE_SAMPLING] += tb - tp;
                st_dec[STAGE_TOTAL] += tb - ta;
            }
            faults_now(&mn1, &mj1);
            if (r >= 0) {
                tok[r * gen + g] = tb - ta;
                tok_at[r * gen + g] = ta - t_run0;
                minor += mn1 - mn0;
                major += mj1 - mj0;
                if (mn1 - mn0 > tok_minor_max) tok_minor_max = mn1 - mn0;
                if (mj1 - mj0 > tok_major_max) tok_major_max = mj1 - mj0;
            }
        }
        if (r >= 0) {
            prefill[r] = b - a;
            first[r] = cdone - a; /* time to the first new token: prefill + pick */
            first_at[r] = a - t_run0;
            decode[r] = cli_now_ms() - cdone;
        }
        if (s) {
            fprintf(stderr, "colibri: %s: %s\n", colibri_strerror(s), colibri_last_error(ctx));
            rc = 1;
        }
    }
    if (!rc && c->trace) rc = write_trace(c->trace, runs, gen, first_at, first, tok_at, tok);
    if (!rc) {
        note_fallback(ctx);
        double dsum = 0;
        for (long r = 0; r < runs; r++) dsum += decode[r];
        qsort(prefill, (size_t)runs, sizeof(double), cmp_double);
        qsort(first, (size_t)runs, sizeof(double), cmp_double);
        qsort(decode, (size_t)runs, sizeof(double), cmp_double);
        if (ntok > 0) qsort(tok, (size_t)ntok, sizeof(double), cmp_double);
        double tok_s = gen > 0 && dsum > 0 ? (double)gen * runs / (dsum / 1e3) : 0.0;
        double per_minor = ntok ? (double)minor / (double)ntok : 0, per_major = ntok ? (double)major / (double)ntok : 0;
        /* resident now: after a CUDA upload of copied weights the file pages are dropped, so
         * this is below the peak (docs/cuda.md, Memory) */
        double rss_now_mb = proc_status_mb("VmRSS:");
        /* the kernel refreshes VmHWM lazily, so it can trail the current VmRSS */
        double rss_mb = fmax(peak_rss_mb(), rss_now_mb);
        colibri_runtime_info ri;
        colibri_get_runtime_info(ctx, &ri);
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
            printf(", \"threads\": %d, \"pace_ms\": %ld, \"pace_overruns\": %ld", ri.threads,
                   c->pace_ms, overruns);
            dist_json("first_token_ms", first, runs);
            if (ntok > 0) dist_json("token_ms", tok, ntok);
            printf(", \"faults_per_token\": {\"minor\": %.4f, \"major\": %.4f, \"max_minor\": %llu, "
                   "\"max_major\": %llu}, \"warmup_faults\": {\"minor\": %llu, \"major\": %llu}",
                   per_minor, per_major, tok_minor_max, tok_major_max, warm_minor, warm_major);
            if (c->stages) {
                printf(", \"stages\": {\"prefill\": ");
                stages_json(st_pre, (double)runs);
                printf(", \"decode\": ");
                stages_json(st_dec, (double)(ntok > 0 ? ntok : 1));
                printf("}");
            }
            printf(", \"realtime\": {\"cpus\": \"%s\", \"sched\": \"%s\", \"priority\": %d, "
                   "\"barrier\": \"%s\", \"memory_locked\": %s, \"locked_mb\": %.1f}}\n", ri.cpus,
                   ri.sched, ri.sched_priority, ri.barrier, ri.memory_locked ? "true" : "false",
                   (double)ri.locked_bytes / (1 << 20));
        } else {
            printf("model %s (%s)\nload %.1f ms\nprefill %ld tokens: p50 %.2f ms, p99 %.2f ms\n",
                   m.name, dtype_name(m.dtype), load_ms, plen, pct(prefill, (int)runs, 50),
                   pct(prefill, (int)runs, 99));
            dist_text("first token", first, runs);
            if (ntok > 0) dist_text("per token", tok, ntok);
            printf("decode: %.2f tok/s\npage faults per decoded token: %.3f minor, %.3f major "
                   "(at most %llu / %llu in one; the warm-up run took %llu / %llu)\n"
                   "peak RSS %.1f MB (now %.1f MB)\n", tok_s, per_minor, per_major, tok_minor_max,
                   tok_major_max, warm_minor, warm_major, rss_mb, rss_now_mb);
            if (c->pace_ms)
                printf("paced: a run every %ld ms (%ld of %ld started late: the run before "
                       "overran)\n", c->pace_ms, overruns, runs - 1);
            if (ri.cpus[0] || strcmp(ri.sched, "other") || ri.memory_locked ||
                strcmp(ri.barrier, "sleep")) {
                char pol[24];
                if (strcmp(ri.sched, "other")) snprintf(pol, sizeof pol, "%s:%d", ri.sched, ri.sched_priority);
                else snprintf(pol, sizeof pol, "other");
                printf("real-time: cpus %s, sched %s, barrier %s, memory %s (%.1f MiB locked)\n",
                       ri.cpus[0] ? ri.cpus : "unpinned", pol, ri.barrier,
                       ri.memory_locked ? "locked" : "not locked", (double)ri.locked_bytes / (1 << 20));
            }
            if (c->stages) {
                stages_text("prefill (per run)", st_pre, (double)runs);
                if (ntok > 0) stages_text("decode (per token)", st_dec, (double)ntok);
            }
        }
    }
    free(ids);
    free(logits);
    free(prefill);
    free(first);
    free(decode);
    free(tok);
    free(first_at);
    free(tok_at);
    colibri_free(ctx);
    return rc;
}

static int cmd_dump_routing(const cli *c) {
    if (!c->out) return usage(c, "--out FILE is required");
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

/* The model commands of this file: parse, then run. */
#define SYN_INFO "info MODEL\n  JSON: geometry, dtype, padding, layers, backend (arena, KV cache bytes)"
#define SYN_FORWARD                                                                               \
    "forward MODEL --ids 1,2,3 [--last | --decode-from K] [--logits-out FILE] [--stages]\n"    \
    "  runs the ids from position 0; --logits-out writes raw little-endian f32 [n, vocab]\n"    \
    "  (else a JSON summary: the top 5 ids per position); --last: only the last token's\n"      \
    "  logits (colibri_forward_last); --decode-from K: ids before K in one call, then one call\n" \
    "  per token (decode steps); --stages (with --logits-out): stage timing on, its sums in\n"   \
    "  the JSON line as stages_ms (the logits keep their bits)"
#define SYN_BENCH                                                                                 \
    "bench MODEL [--prompt-len N] [--gen N] [--runs N] [--pace-ms MS] [--trace FILE] [--stages]\n" \
    "  [--json]\n"                                                                              \
    "  load ms, prefill ms, the latency distribution (p50, p99, p99.9, max) of the first token\n" \
    "  and of every decoded token, decode tok/s, page faults per decoded token (minor, major),\n" \
    "  peak RSS; after one untimed warm-up run; defaults 32, 32, 5. --pace-ms: a run starts\n"  \
    "  every MS ms (a fixed period; 0: back to back); --trace: every sample, unsorted, with\n"  \
    "  its start time (kind run token start_ms ms); --stages: the time of each stage of the\n"  \
    "  pass (embed, norms, mixer, route, ..., head, sampling) per prefill and per decoded\n"    \
    "  token, from the timed runs (the clock is read only with --stages)"
#define SYN_ROUTING                                                                               \
    "dump-routing MODEL --ids 1,2,3 --out FILE\n"                                               \
    "  every routing decision as JSON lines (a build with -DCOLIBRI_DEBUG)"
#define SYN_SELFTEST "selftest\n  built-in checks that need no model file"

static int run_info(const cli_globals *g, int argc, char **argv) {
    cli c;
    int rc = parse_cmd(&c, g, O_MODEL, SYN_INFO, argc, argv);
    return rc ? (rc < 0 ? 0 : rc) : cmd_info(&c);
}

static int run_forward(const cli_globals *g, int argc, char **argv) {
    cli c;
    int rc = parse_cmd(&c, g, O_MODEL | O_IDS | O_LAST | O_DECODE_FROM | O_LOGITS_OUT | O_STAGES, SYN_FORWARD,
                       argc, argv);
    return rc ? (rc < 0 ? 0 : rc) : cmd_forward(&c);
}

static int run_bench(const cli_globals *g, int argc, char **argv) {
    cli c;
    int rc = parse_cmd(&c, g, O_MODEL | O_PROMPT_LEN | O_GEN | O_RUNS | O_JSON | O_PACE | O_TRACE |
                                  O_STAGES, SYN_BENCH, argc, argv);
    return rc ? (rc < 0 ? 0 : rc) : cmd_bench(&c);
}

static int run_dump_routing(const cli_globals *g, int argc, char **argv) {
    cli c;
    int rc = parse_cmd(&c, g, O_MODEL | O_IDS | O_OUT, SYN_ROUTING, argc, argv);
    return rc ? (rc < 0 ? 0 : rc) : cmd_dump_routing(&c);
}

static int run_selftest(const cli_globals *g, int argc, char **argv) {
    cli c;
    int rc = parse_cmd(&c, g, 0, SYN_SELFTEST, argc, argv);
    return rc ? (rc < 0 ? 0 : rc) : colibri_selftest(1) == 0 ? 0 : 1;
}

static const cli_command commands[] = {
    {"info", run_info, "MODEL", "JSON: geometry, dtype, padding, layers, backend"},
    {"forward", run_forward, "MODEL --ids 1,2,3 [--last | --decode-from K] [--logits-out FILE]",
     "logits of the ids (raw f32 or a JSON summary)"},
    {"generate", colibri_cmd_generate, "MODEL (--ids 1,2,3 --max-new N | --prompt T) [sampling...]",
     "greedy or sampled ids or text"},
    {"bench", run_bench,
     "MODEL [--prompt-len N] [--gen N] [--runs N] [--pace-ms MS] [--trace F] [--stages] [--json]",
     "load, prefill, latency distributions (first token, per token), page faults"},
    {"bench-contexts", colibri_cmd_bench_contexts, "MODEL [--contexts N] [--gen N] [--json]",
     "one shared model, N contexts decoding at once"},
    {"dump-routing", run_dump_routing, "MODEL --ids 1,2,3 --out FILE",
     "routing decisions as JSON lines (COLIBRI_DEBUG builds)"},
    {"tokenize", colibri_cmd_text, "MODEL (--text T | --text-file F) [--no-special]",
     "text -> {\"ids\": [...]} with the model's tokenizer"},
    {"detokenize", colibri_cmd_text, "MODEL (--ids 1,2,3 | --ids-file F) [--skip-special]",
     "ids -> text"},
    {"serve", cmd_serve, "MODEL [--host H] [--port P] [--slots N] [--max-queue Q] ...",
     "the OpenAI-compatible HTTP service"},
    {"selftest", run_selftest, "", "built-in checks, no model needed"},
    {"gpuprobe", cmd_gpuprobe, "[--mib N] [--iters N] [--json]", "GPU copy bandwidth"},
    {"synth", cmd_synth, "OUT [geometry options]", "a random model for speed checks"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static int general_usage(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri: %s\n", msg);
    fprintf(f, "usage: colibri --version\n"
               "       colibri " CLI_GLOBAL_OPTIONS " COMMAND ...\n"
               "commands (`colibri COMMAND --help` for each one's options):\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %s%s%s\n      %s\n", commands[i].name, commands[i].args[0] ? " " : "",
                commands[i].args, commands[i].summary);
    fputs(CLI_GLOBAL_HELP, f);
    return 2;
}

int main(int argc, char **argv) {
    cli_globals g;
    cli_default_globals(&g);
    int i = 1;
    for (; i < argc; i++) { /* the global options before the command word */
        const char *a = argv[i];
        int r;
        if (!strcmp(a, "--version")) return print_version();
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            general_usage(stdout, NULL);
            return 0;
        }
        if ((r = cli_global(&g, argc, argv, &i)) < 0) return general_usage(stderr, NULL);
        if (r) continue;
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "colibri: unknown option %s\n", a);
            return general_usage(stderr, NULL);
        }
        break;
    }
    if (i == argc) return general_usage(stderr, "a command is required");
    for (size_t k = 0; k < N_COMMANDS; k++)
        if (!strcmp(argv[i], commands[k].name)) return commands[k].run(&g, argc - i, argv + i);
    fprintf(stderr, "colibri: unknown command %s\n", argv[i]);
    return general_usage(stderr, NULL);
}
