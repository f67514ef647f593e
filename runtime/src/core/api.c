/* The public API (colibri.h): init (model + arena + pool + backend), forward, reset, info. */
#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_config.h"
#include "context.h"
#include "cpu/kernels.h"
#include "cpu/kernels_mxfp4.h"
#include "cpu/kernels_q4.h"
#include "cpu/q4_pack.h"

#define COLIBRI_MAX_THREADS 64

colibri_status colibri_ctx_fail(colibri_ctx *ctx, colibri_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return s;
}

static colibri_status init_fail(colibri_ctx *ctx, const colibri_options *opt, colibri_status s) {
    if (opt->error && opt->error_len) snprintf(opt->error, opt->error_len, "%s", ctx->err);
    colibri_free(ctx);
    return s;
}

void colibri_default_options(colibri_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->threads = 0;
    opt->backend = COLIBRI_BACKEND_AUTO;
}

colibri_status colibri_init(colibri_ctx **ctx, const char *path) {
    colibri_options opt;
    colibri_default_options(&opt);
    return colibri_init_ex(ctx, path, &opt);
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > COLIBRI_MAX_THREADS ? COLIBRI_MAX_THREADS : (int)n;
}

static void report(const colibri_options *opt, const char *fmt, const char *arg) {
    if (opt && opt->error && opt->error_len) snprintf(opt->error, opt->error_len, fmt, arg);
}

colibri_status colibri_model_load(colibri_model **out, const char *path,
                                  const colibri_options *opt) {
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    if (!path) {
        report(opt, "%s", "model path is NULL");
        return COLIBRI_E_INVALID_ARG;
    }
    colibri_model *m = calloc(1, sizeof *m);
    if (!m) return COLIBRI_E_NO_MEMORY;
    char why[512] = "";
    colibri_status s = colibri_model_open(m, path, why, sizeof why);
    if (s) {
        report(opt, "%s", why);
        free(m);
        return s;
    }
    m->refs = 1;
    pthread_mutex_init(&m->gpu_mu, NULL);
    *out = m;
    return COLIBRI_OK;
}

static void model_unref(colibri_model *m) {
    if (m && __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        colibri_cuda_device_close(m->gpu); /* every context on it is closed by now */
        pthread_mutex_destroy(&m->gpu_mu);
        colibri_model_close(m);
        free(m);
    }
}

/* The model's shared CUDA device, opened on first use; NULL with the reason in why. */
static colibri_cuda_device *model_gpu(colibri_model *model, char *why, size_t why_len) {
    pthread_mutex_lock(&model->gpu_mu);
    if (!model->gpu_tried) {
        model->gpu_tried = 1;
        if (colibri_cuda_device_open(&model->gpu, model, model->gpu_why, sizeof model->gpu_why))
            model->gpu = NULL;
    }
    colibri_cuda_device *dv = model->gpu;
    if (!dv) snprintf(why, why_len, "%s", model->gpu_why);
    pthread_mutex_unlock(&model->gpu_mu);
    return dv;
}

/* A CUDA context for ctx on the model's shared device. */
static int model_cuda_open(colibri_model *model, colibri_cuda **out, int kv_f16, char *why,
                           size_t why_len) {
    colibri_cuda_device *dv = model_gpu(model, why, why_len);
    if (!dv) return -1;
    return colibri_cuda_open_on(out, dv, COLIBRI_STREAM_COUNT, kv_f16, why, why_len);
}

void colibri_model_free(colibri_model *m) { model_unref(m); }

/* ---- Real-time mode (docs/runtime.md, "Real-time mode") ---------------------------------- */

static const char *sched_name(colibri_sched s) {
    return s == COLIBRI_SCHED_FIFO ? "fifo" : s == COLIBRI_SCHED_RR ? "rr" : "other";
}

/* The options against themselves and this process: the threads they imply, CPUs distinct and
 * allowed to it (sched_getaffinity), a priority in the policy's range. */
static colibri_status check_realtime(colibri_ctx *ctx, const colibri_options *o) {
    if (o->n_cpus < 0 || o->n_cpus > COLIBRI_MAX_THREADS || (o->n_cpus && !o->cpus))
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "n_cpus must be 0..%d, with cpus when > 0",
                       COLIBRI_MAX_THREADS);
    if (o->n_cpus && o->threads && o->threads != o->n_cpus)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "threads %d and %d cpus: one worker thread runs "
                       "on each CPU, so give as many CPUs as threads (or threads 0)", o->threads,
                       o->n_cpus);
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (o->n_cpus && sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return colibri_ctx_fail(ctx, COLIBRI_E_REALTIME, "sched_getaffinity: %s", strerror(errno));
    for (int i = 0; i < o->n_cpus; i++) {
        int c = o->cpus[i];
        if (c < 0 || c >= CPU_SETSIZE)
            return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "cpus[%d] = %d is not a CPU number", i, c);
        for (int j = 0; j < i; j++)
            if (o->cpus[j] == c)
                return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "CPU %d is given twice: one worker "
                               "thread per CPU", c);
        if (!CPU_ISSET(c, &allowed)) {
            char list[256] = "";
            size_t n = 0;
            for (int k = 0; k < CPU_SETSIZE && n + 8 < sizeof list; k++)
                if (CPU_ISSET(k, &allowed)) n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? "," : "", k);
            return colibri_ctx_fail(ctx, COLIBRI_E_REALTIME, "CPU %d is not one this process may run on "
                           "(allowed: %s; offline, or outside its CPUAffinity=/cpuset)", c, list);
        }
    }
    if (o->sched != COLIBRI_SCHED_OTHER && o->sched != COLIBRI_SCHED_FIFO && o->sched != COLIBRI_SCHED_RR)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "sched must be other, fifo or rr (0..2), got %d",
                       (int)o->sched);
    if (o->sched == COLIBRI_SCHED_OTHER ? o->sched_priority != 0
                                        : (o->sched_priority < 1 || o->sched_priority > 99))
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "sched_priority %d: 1..99 with fifo or rr, 0 "
                       "with other", o->sched_priority);
    if (o->barrier != COLIBRI_BARRIER_SLEEP && o->barrier != COLIBRI_BARRIER_SPIN)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "barrier must be sleep or spin (0, 1), got %d",
                       (int)o->barrier);
    return COLIBRI_OK;
}

/* mlock [p, p + n): every page read in (or, anonymous, allocated) and kept. The failure names
 * the limit that refused it and the setting that raises it. */
static colibri_status lock_range(colibri_ctx *ctx, const void *p, size_t n, const char *what) {
    if (!n || mlock(p, n) == 0) return COLIBRI_OK;
    int e = errno;
    struct rlimit rl;
    char limit[48] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY) snprintf(limit, sizeof limit, "unlimited");
        else snprintf(limit, sizeof limit, "%llu KiB", (unsigned long long)rl.rlim_cur / 1024);
    }
    return colibri_ctx_fail(ctx, COLIBRI_E_REALTIME, "locking %s (%.1f MiB) in memory: %s; RLIMIT_MEMLOCK "
                   "is %s (ulimit -l): raise it, e.g. LimitMEMLOCK=infinity in the systemd unit "
                   "(the kit renders it from the profile's realtime.lock_memory), or give the "
                   "process CAP_IPC_LOCK", what, (double)n / (1 << 20), strerror(e), limit);
}

/* The model's mapping and its packed copy, once per model (the contexts share them; munmap
 * unlocks them). */
static colibri_status lock_model(colibri_ctx *ctx) {
    colibri_model *m = ctx->model;
    colibri_status s = COLIBRI_OK;
    pthread_mutex_lock(&m->gpu_mu);
    if (!m->locked) {
        s = lock_range(ctx, m->base, m->size, "the model's mapping");
        if (!s && m->q4_packed &&
            (s = lock_range(ctx, m->q4_packed, m->q4_packed_bytes, "the packed weights")))
            munlock(m->base, m->size);
        if (!s) {
            m->locked = 1;
            ctx->locked_bytes += m->size + m->q4_packed_bytes;
        }
    }
    pthread_mutex_unlock(&m->gpu_mu);
    return s;
}

/* The packed copy (cpu/q4_pack.h: q4, mxfp4 and int8), made once per model by the first CPU
 * context whose int8-activation kernels read it. A model that cannot be packed (no memory) runs
 * in the file's layout, with the same bits. With lock_memory the file pages are kept: they are
 * locked too. */
static void pack_model(colibri_ctx *ctx) {
    colibri_model *m = ctx->model;
    int which = (ctx->use_q8 && colibri_q4_kernels_have_packed() ? COLIBRI_PACK_Q4 : 0) |
                (ctx->use_q8 && colibri_int8_kernels_have_packed() ? COLIBRI_PACK_INT8 : 0) |
                (ctx->mx_a8 && colibri_mxfp4_kernels_have_packed() ? COLIBRI_PACK_MXFP4 : 0);
    if (!which || ctx->opt.q4_file_layout) return;
    pthread_mutex_lock(&m->gpu_mu);
    if (!m->q4_pack_tried) {
        m->q4_pack_tried = 1;
        (void)colibri_model_pack(m, which, ctx->opt.lock_memory || m->locked);
    }
    ctx->q4_packed = m->q4_packed != NULL;
    pthread_mutex_unlock(&m->gpu_mu);
}

static void pool_config(const colibri_options *o, colibri_pool_config *pc) {
    memset(pc, 0, sizeof *pc);
    pc->cpus = o->n_cpus ? o->cpus : NULL;
    pc->policy = o->sched == COLIBRI_SCHED_FIFO ? SCHED_FIFO : o->sched == COLIBRI_SCHED_RR ? SCHED_RR
                                                                                           : SCHED_OTHER;
    pc->priority = o->sched_priority;
    pc->spin = o->barrier == COLIBRI_BARRIER_SPIN;
    pc->lock_stacks = o->lock_memory;
}

/* One forward call on the calling thread: its page faults are counted across the call. */
typedef struct {
    struct rusage ru;
    int counted;
} pass;

/* The calling thread becomes worker 0 (pinned, policy: once per thread). */
static colibri_status pass_begin(colibri_ctx *ctx, pass *p) {
    char why[384] = "";
    if (colibri_pool_enter(&ctx->pool, why, sizeof why) != 0)
        return colibri_ctx_fail(ctx, COLIBRI_E_REALTIME, "%s", why);
    p->counted = getrusage(RUSAGE_THREAD, &p->ru) == 0;
    return COLIBRI_OK;
}

static void pass_end(colibri_ctx *ctx, const pass *p) {
    struct rusage now;
    if (!p->counted || getrusage(RUSAGE_THREAD, &now) != 0) return;
    ctx->caller_minflt += (unsigned long long)(now.ru_minflt - p->ru.ru_minflt);
    ctx->caller_majflt += (unsigned long long)(now.ru_majflt - p->ru.ru_majflt);
}

/* The CPU side of a context or an engine: its arena (carved by colibri_arena_plan), the
 * working buffers touched now, the worker threads. */
static colibri_status cpu_setup(colibri_ctx *ctx) {
    const struct colibri_model *m = ctx->model;
    int threads = ctx->opt.threads;
    int kv_f16 = ctx->opt.kv_dtype == COLIBRI_KV_F16;
    if (!ctx->engine) {
        ctx->b.cache = calloc(m->n_layers, sizeof *ctx->b.cache);
        if (!ctx->b.cache)
            return colibri_ctx_fail(ctx, COLIBRI_E_NO_MEMORY, "cannot allocate %u layer caches", m->n_layers);
    }
    int seq_only = ctx->opt.sequence_only;
    size_t bytes = colibri_arena_plan(m, threads, ctx->use_q8, kv_f16, ctx->engine, seq_only, &ctx->b,
                                      NULL);
    if (posix_memalign(&ctx->arena, 4096, bytes) != 0) {
        ctx->arena = NULL;
        return colibri_ctx_fail(ctx, COLIBRI_E_NO_MEMORY,
                       "cannot allocate the %zu-byte arena (max_seq_len %u, %u layers)", bytes,
                       m->max_seq_len, m->n_layers);
    }
    ctx->arena_bytes = bytes;
    colibri_arena_plan(m, threads, ctx->use_q8, kv_f16, ctx->engine, seq_only, &ctx->b, ctx->arena);
    /* Touch the working buffers now (not the KV cache, which can be large and is written
     * before it is read), so forward never takes first-touch page faults on them. */
    size_t kv_lo = (size_t)((uint8_t *)ctx->b.kcache - (uint8_t *)ctx->arena);
    size_t kv_hi = (size_t)((uint8_t *)ctx->b.router - (uint8_t *)ctx->arena);
    memset(ctx->arena, 0, kv_lo);
    memset((uint8_t *)ctx->arena + kv_hi, 0, bytes - kv_hi);
    if (ctx->b.state_bytes) memset(ctx->b.state, 0, ctx->b.state_bytes); /* recurrent kinds */
    if (!seq_only) pack_model(ctx);
    if (ctx->opt.lock_memory) { /* pre-fault and keep every page: weights, buffers, KV cache */
        colibri_status rs = lock_model(ctx);
        if (rs || (rs = lock_range(ctx, ctx->arena, bytes, "the arena"))) return rs;
        ctx->locked_bytes += bytes;
    }
    colibri_pool_config pc;
    pool_config(&ctx->opt, &pc);
    char why[384] = "";
    if (colibri_pool_start_ex(&ctx->pool, threads, &pc, why, sizeof why) != 0) {
        int realtime = pc.cpus || pc.policy != SCHED_OTHER || pc.lock_stacks;
        return colibri_ctx_fail(ctx, realtime ? COLIBRI_E_REALTIME : COLIBRI_E_NO_MEMORY,
                                "cannot start %d threads: %s", threads, why[0] ? why : "out of memory");
    }
    ctx->pool_started = 1;
    return COLIBRI_OK;
}

/* The options every context and engine checks the same way. */
static colibri_status check_options(colibri_ctx *ctx, const colibri_options *opt) {
    if (opt->threads < 0 || opt->threads > COLIBRI_MAX_THREADS ||
        (opt->backend != COLIBRI_BACKEND_AUTO && opt->backend != COLIBRI_BACKEND_CPU &&
         opt->backend != COLIBRI_BACKEND_CUDA))
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                       "threads must be 0..%d and backend auto, cpu or cuda", COLIBRI_MAX_THREADS);
    if (opt->kv_dtype != COLIBRI_KV_F32 && opt->kv_dtype != COLIBRI_KV_F16)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                       "kv_dtype must be COLIBRI_KV_F32 (0) or COLIBRI_KV_F16 (1), got %d",
                       (int)opt->kv_dtype);
    colibri_status rs = check_realtime(ctx, opt);
    if (rs) return rs;
    if (opt->threads == 0) ctx->opt.threads = opt->n_cpus ? opt->n_cpus : default_threads();
    if (opt->n_cpus) { /* the context keeps its own copy of the CPU list */
        memcpy(ctx->cpus, opt->cpus, (size_t)opt->n_cpus * sizeof *ctx->cpus);
        ctx->opt.cpus = ctx->cpus;
    }
    return COLIBRI_OK;
}

/* What a context and an engine start with: the options (opt_in or the defaults, into *opt),
 * checked, and a reference on the model. *ctx is NULL on failure (the reason in opt->error). */
static colibri_status ctx_begin(colibri_ctx **ctx_out, colibri_model *model, const colibri_options *opt_in,
                                colibri_options *opt, int engine) {
    if (opt_in) *opt = *opt_in;
    else colibri_default_options(opt);
    *ctx_out = NULL;
    if (!model) {
        report(opt, "%s", "model is NULL");
        return COLIBRI_E_INVALID_ARG;
    }
    colibri_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return COLIBRI_E_NO_MEMORY;
    __atomic_add_fetch(&model->refs, 1, __ATOMIC_ACQ_REL);
    ctx->model = model;
    ctx->opt = *opt;
    ctx->engine = engine;
    colibri_status cs = check_options(ctx, opt);
    if (cs) return init_fail(ctx, opt, cs);
    *ctx_out = ctx;
    return COLIBRI_OK;
}

colibri_status colibri_ctx_new(colibri_ctx **out, colibri_model *model,
                               const colibri_options *opt_in) {
    colibri_options opt;
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    colibri_ctx *ctx;
    colibri_status cs = ctx_begin(&ctx, model, opt_in, &opt, 0);
    if (cs) return cs;
    const struct colibri_model *m = ctx->model;
    if (opt.sequence_only) { /* an engine's sequence: its caches on the CPU, nothing else */
        if (opt.backend == COLIBRI_BACKEND_CUDA || opt.threads > 1 || opt.n_cpus > 1)
            return init_fail(ctx, &opt, colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                             "sequence_only: a CPU context for an engine's passes (backend auto or "
                             "cpu, threads 0 or 1, at most one CPU)"));
        ctx->opt.threads = 1;
        opt.backend = ctx->opt.backend = COLIBRI_BACKEND_CPU;
    }

    /* Backend: CUDA when asked for or available; otherwise the CPU with the reason kept. The
     * CUDA context, kernels and weights on the device are the model's, shared by its contexts;
     * streams, arena and KV cache are this context's. */
    if (opt.backend != COLIBRI_BACKEND_CPU) {
        char why[192] = "";
        if (model_cuda_open(model, &ctx->cuda, opt.kv_dtype == COLIBRI_KV_F16, why,
                            sizeof why) != 0) {
            ctx->cuda = NULL;
            if (opt.backend == COLIBRI_BACKEND_CUDA)
                return init_fail(ctx, &opt,
                                 colibri_ctx_fail(ctx, COLIBRI_E_BACKEND, "CUDA: %s", why));
            snprintf(ctx->fallback, sizeof ctx->fallback, "%s", why[0] ? why : "unknown");
        }
    }

    ctx->simd = colibri_kernels_init();
    ctx->use_q8 = opt.int8_activations && (m->dtype == COLIBRI_DT_INT8 || m->dtype == COLIBRI_DT_Q4);
    ctx->mx_a8 = opt.int8_activations && m->has_mxfp4; /* kernels_mxfp4.c quantises per block */
    if (!ctx->cuda) {
        colibri_status st = cpu_setup(ctx);
        if (st) return init_fail(ctx, &opt, st);
    } else {
        /* CUDA: the calling thread is the only CPU worker (cpus[0] and the policy); the model's
         * host mapping is locked when the device reads it in place (mapped weights) */
        colibri_options one = ctx->opt;
        one.n_cpus = opt.n_cpus ? 1 : 0;
        colibri_pool_config pc;
        pool_config(&one, &pc);
        colibri_pool_start_ex(&ctx->pool, 1, &pc, NULL, 0);
        ctx->pool_started = 1;
        if (opt.lock_memory) {
            colibri_cuda_info ci;
            memset(&ci, 0, sizeof ci);
            colibri_cuda_get_info(ctx->cuda, &ci);
            colibri_status rs = strcmp(ci.weights, "mapped") ? COLIBRI_OK : lock_model(ctx);
            if (rs) return init_fail(ctx, &opt, rs);
        }
    }
    ctx->memory_locked = opt.lock_memory;
    *out = ctx;
    return COLIBRI_OK;
}

/* The single-context form: a private model that goes away with the context. */
colibri_status colibri_init_ex(colibri_ctx **out, const char *path, const colibri_options *opt_in) {
    colibri_options opt;
    if (opt_in) opt = *opt_in;
    else colibri_default_options(&opt);
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    colibri_model *m;
    colibri_status s = colibri_model_load(&m, path, &opt);
    if (s) return s;
    s = colibri_ctx_new(out, m, &opt);
    colibri_model_free(m); /* the context holds its own reference */
    return s;
}

colibri_model *colibri_ctx_model(const colibri_ctx *ctx) { return ctx ? ctx->model : NULL; }

/* ---- the batch engine (continuous batching) ------------------------------------------------ */

/* The first layer whose kind cannot share a pass between sequences (kinds.h multi_seq), as a
 * reason; 0 when every layer can. */
static int unbatched_layer(const struct colibri_model *m, char *why, size_t len) {
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer_kind *k = !m->layers[l].mixer->multi_seq ? m->layers[l].mixer
                                      : !m->layers[l].ffn->multi_seq ? m->layers[l].ffn : NULL;
        if (k) {
            snprintf(why, len, "layer %u's %s kind runs one sequence per pass", l, k->name);
            return 1;
        }
    }
    return 0;
}

colibri_status colibri_engine_new(colibri_engine **out, colibri_model *model,
                                  const colibri_options *opt_in) {
    colibri_options opt;
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    colibri_engine *e = calloc(1, sizeof *e);
    if (!e) return COLIBRI_E_NO_MEMORY;
    colibri_ctx *ctx;
    colibri_status st = ctx_begin(&ctx, model, opt_in, &opt, 1);
    if (st) {
        free(e);
        return st;
    }
    if (opt.sequence_only) { /* an engine is what runs the passes: it needs their buffers */
        free(e);
        return init_fail(ctx, &opt, colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                         "sequence_only is for the contexts an engine runs, not the engine"));
    }
    /* The backend is chosen as colibri_ctx_new chooses it for the same options, so contexts made
     * with them run on the engine's backend. A CUDA engine holds nothing of its own: each
     * sequence runs as its own pass on its own CUDA context (docs/runtime.md, "Batching"). */
    if (opt.backend != COLIBRI_BACKEND_CPU) {
        char why[192] = "";
        e->cuda = model_gpu(model, why, sizeof why) != NULL;
        if (!e->cuda && opt.backend == COLIBRI_BACKEND_CUDA)
            st = colibri_ctx_fail(ctx, COLIBRI_E_BACKEND, "CUDA: %s", why);
        else if (!e->cuda)
            snprintf(ctx->fallback, sizeof ctx->fallback, "%s", why[0] ? why : "unknown");
    }
    if (!st && !e->cuda) {
        ctx->simd = colibri_kernels_init();
        ctx->use_q8 = opt.int8_activations &&
                      (model->dtype == COLIBRI_DT_INT8 || model->dtype == COLIBRI_DT_Q4);
        ctx->mx_a8 = opt.int8_activations && model->has_mxfp4;
        st = cpu_setup(ctx);
        ctx->memory_locked = opt.lock_memory;
    }
    if (st) {
        free(e);
        return init_fail(ctx, &opt, st);
    }
    e->ctx = ctx;
    *out = e;
    return COLIBRI_OK;
}

void colibri_engine_free(colibri_engine *e) {
    if (!e) return;
    colibri_free(e->ctx);
    free(e);
}

const char *colibri_engine_last_error(const colibri_engine *e) { return e ? e->ctx->err : ""; }

const char *colibri_engine_unbatched(colibri_engine *e) {
    if (!e) return "no engine";
    if (e->cuda) return "the CUDA engine runs each sequence as its own pass";
    return unbatched_layer(e->ctx->model, e->unbatched, sizeof e->unbatched) ? e->unbatched : NULL;
}

void colibri_engine_get_runtime_info(const colibri_engine *e, colibri_runtime_info *i) {
    colibri_get_runtime_info(e->ctx, i);
    if (e->cuda) snprintf(i->backend, sizeof i->backend, "%s", "cuda");
}

/* Every item against the engine, before any work: so a refused batch changes nothing. */
static colibri_status check_batch(colibri_ctx *eng, int cuda, const colibri_batch_item *it, int n) {
    const struct colibri_model *m = eng->model;
    if (!it || n < 1) return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG, "a batch needs n_items >= 1 items");
    for (int i = 0; i < n; i++) {
        const colibri_ctx *sq = it[i].seq;
        if (!sq || sq->engine || !it[i].ids || it[i].n < 1)
            return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                           "item %d: needs a context (not an engine), ids and n >= 1", i);
        if (sq->model != m)
            return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                           "item %d: its context runs another model than the engine", i);
        if ((sq->cuda != NULL) != cuda)
            return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                           "item %d: its context runs on %s, the engine on %s (make both with "
                           "the same options)", i, sq->cuda ? "cuda" : "cpu", cuda ? "cuda" : "cpu");
        if (!cuda && (sq->opt.kv_dtype != eng->opt.kv_dtype || sq->use_q8 != eng->use_q8 ||
                     sq->mx_a8 != eng->mx_a8))
            return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                           "item %d: its context's kv_dtype or int8_activations differ from the "
                           "engine's (its logits would not be its own)", i);
        if (cuda && !it[i].logits)
            return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                           "item %d: a CUDA engine needs logits for every item", i);
        for (int k = 0; k < i; k++)
            if (it[k].seq == sq)
                return colibri_ctx_fail(eng, COLIBRI_E_INVALID_ARG,
                               "items %d and %d: one context twice in a batch", k, i);
        for (int j = 0; j < it[i].n; j++)
            if (it[i].ids[j] < 0 || (uint32_t)it[i].ids[j] >= m->vocab_size)
                return colibri_ctx_fail(eng, COLIBRI_E_TOKEN_RANGE,
                               "item %d: token id %d at index %d is outside the vocabulary (0..%u)",
                               i, (int)it[i].ids[j], j, m->vocab_size - 1);
        if ((long)sq->pos + it[i].n > (long)m->max_seq_len)
            return colibri_ctx_fail(eng, COLIBRI_E_SEQ_TOO_LONG,
                           "item %d: %d cached + %d new tokens > max_seq_len %u", i, sq->pos,
                           it[i].n, m->max_seq_len);
    }
    return COLIBRI_OK;
}

colibri_status colibri_batch_run(colibri_ctx *eng, int cuda, const colibri_batch_item *it, int n) {
    eng->err[0] = '\0';
    colibri_status st = check_batch(eng, cuda, it, n);
    if (st) return st;
    size_t V = eng->model->vocab_size;
    if (cuda) { /* the fallback: each sequence its own pass, as alone */
        for (int i = 0; i < n; i++) {
            colibri_ctx *sq = it[i].seq;
            st = it[i].all_logits ? colibri_forward(sq, it[i].ids, it[i].n, it[i].logits)
                                  : colibri_forward_last(sq, it[i].ids, it[i].n, it[i].logits);
            if (st) return colibri_ctx_fail(eng, st, "item %d: %s", i, sq->err);
        }
        return COLIBRI_OK;
    }
    /* Passes of at most `chunk` rows: the items in order, an item cut where a pass is full (its
     * rest continues the next pass, from the position the first part reached). */
    pass ps; /* the calling thread is worker 0 of eng's pool (pinned in real-time mode) */
    if ((st = pass_begin(eng, &ps))) return st;
    colibri_pass_item pass[COLIBRI_CHUNK];
    int np = 0, rows = 0;
    char why[160];
    int solo = n > 1 && unbatched_layer(eng->model, why, sizeof why); /* a pass per item */
    for (int i = 0; i < n; i++) {
        if (solo && np) {
            colibri_cpu_pass(eng, pass, np);
            np = rows = 0;
        }
        for (int done = 0; done < it[i].n;) {
            int c = it[i].n - done < eng->b.chunk - rows ? it[i].n - done : eng->b.chunk - rows;
            float *lg = NULL;
            int lrow0 = 0;
            if (it[i].logits && it[i].all_logits) lg = it[i].logits + (size_t)done * V;
            else if (it[i].logits && done + c == it[i].n) lg = it[i].logits, lrow0 = c - 1;
            pass[np++] = (colibri_pass_item){it[i].seq, it[i].ids + done, c, lg, lrow0};
            rows += c;
            done += c;
            if (rows == eng->b.chunk) {
                colibri_cpu_pass(eng, pass, np);
                np = rows = 0;
            }
        }
        it[i].seq->calls++;
    }
    if (np) colibri_cpu_pass(eng, pass, np);
    pass_end(eng, &ps);
    return COLIBRI_OK;
}

colibri_status colibri_forward_batch(colibri_engine *e, const colibri_batch_item *it, int n) {
    if (!e) return COLIBRI_E_INVALID_ARG;
    return colibri_batch_run(e->ctx, e->cuda, it, n);
}

colibri_status colibri_check_runs_itself(colibri_ctx *ctx) {
    if (!ctx->opt.sequence_only) return COLIBRI_OK;
    return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                            "this context was made with sequence_only: it holds its sequence for a "
                            "colibri_engine (colibri_forward_batch, colibri_gen_step) and has no "
                            "buffers for passes of its own");
}

static colibri_status check_forward(colibri_ctx *ctx, const int32_t *ids, int n, const float *logits) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    ctx->err[0] = '\0';
    colibri_status rs = colibri_check_runs_itself(ctx);
    if (rs) return rs;
    if (!ids || !logits || n <= 0)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "forward needs ids, logits and n > 0 (n = %d)", n);
    const struct colibri_model *m = ctx->model;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->vocab_size)
            return colibri_ctx_fail(ctx, COLIBRI_E_TOKEN_RANGE,
                           "token id %d at index %d is outside the vocabulary (0..%u)", (int)ids[i],
                           i, m->vocab_size - 1);
    if ((long)ctx->pos + n > (long)m->max_seq_len)
        return colibri_ctx_fail(ctx, COLIBRI_E_SEQ_TOO_LONG,
                       "%d cached + %d new tokens > max_seq_len %u", ctx->pos, n,
                       m->max_seq_len);
    return COLIBRI_OK;
}

colibri_status colibri_forward(colibri_ctx *ctx, const int32_t *ids, int n, float *logits) {
    colibri_status st = check_forward(ctx, ids, n, logits);
    if (st) return st;
    pass ps;
    if ((st = pass_begin(ctx, &ps))) return st;
    const struct colibri_model *m = ctx->model;
    if (ctx->cuda) {
        char why[192] = "";
        if (colibri_cuda_forward(ctx->cuda, ids, n, ctx->pos, logits, why, sizeof why) != 0)
            return colibri_ctx_fail(ctx, COLIBRI_E_BACKEND, "CUDA forward: %s", why);
        ctx->pos += n;
    } else {
        for (int done = 0; done < n;) {
            int c = n - done < ctx->b.chunk ? n - done : ctx->b.chunk;
            colibri_pass_item it = {ctx, ids + done, c, logits + (size_t)done * m->vocab_size, 0};
            colibri_cpu_pass(ctx, &it, 1);
            done += c;
        }
    }
    pass_end(ctx, &ps);
    ctx->calls++;
    return COLIBRI_OK;
}

colibri_status colibri_forward_last(colibri_ctx *ctx, const int32_t *ids, int n, float *logits) {
    colibri_status st = check_forward(ctx, ids, n, logits);
    if (st) return st;
    pass ps;
    if ((st = pass_begin(ctx, &ps))) return st;
    if (ctx->cuda) { /* the backend computes and downloads the last row only */
        char why[192] = "";
        if (colibri_cuda_forward_last(ctx->cuda, ids, n, ctx->pos, logits, why, sizeof why) != 0)
            return colibri_ctx_fail(ctx, COLIBRI_E_BACKEND, "CUDA forward: %s", why);
        ctx->pos += n;
    } else {
        for (int done = 0; done < n;) {
            int c = n - done < ctx->b.chunk ? n - done : ctx->b.chunk;
            colibri_pass_item it = {ctx, ids + done, c, done + c == n ? logits : NULL, c - 1};
            colibri_cpu_pass(ctx, &it, 1);
            done += c;
        }
    }
    pass_end(ctx, &ps);
    ctx->calls++;
    return COLIBRI_OK;
}

colibri_status colibri_reset(colibri_ctx *ctx) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    ctx->pos = 0;
    ctx->calls = 0;
    /* K/V rows need no clearing (a position is written before it is read); a recurrent state
     * starts from zero */
    if (ctx->b.state_bytes) memset(ctx->b.state, 0, ctx->b.state_bytes);
    if (ctx->b.cache) colibri_seq_unshare(ctx);
    if (ctx->cuda) colibri_cuda_reset(ctx->cuda);
    return COLIBRI_OK;
}

void colibri_free(colibri_ctx *ctx) {
    if (!ctx) return;
    if (ctx->pool_started) colibri_pool_stop(&ctx->pool);
    if (ctx->cuda) colibri_cuda_close(ctx->cuda);
    free(ctx->arena);
    free(ctx->b.cache);
    model_unref(ctx->model);
    free(ctx);
}

const char *colibri_strerror(colibri_status s) {
    switch (s) {
    case COLIBRI_OK: return "ok";
    case COLIBRI_E_INVALID_ARG: return "invalid argument";
    case COLIBRI_E_IO: return "cannot read the model file";
    case COLIBRI_E_BAD_MAGIC: return "not a .colibri model (bad magic)";
    case COLIBRI_E_BAD_VERSION: return "unsupported .colibri format version";
    case COLIBRI_E_TRUNCATED: return "model file is truncated";
    case COLIBRI_E_OUT_OF_RANGE: return "model offset or size out of range";
    case COLIBRI_E_ABSURD_DIM: return "model dimension out of limits";
    case COLIBRI_E_BAD_TENSOR: return "model tensor table is invalid";
    case COLIBRI_E_PAD_MISMATCH: return "model padding does not match this build";
    case COLIBRI_E_UNSUPPORTED: return "model not supported by this build";
    case COLIBRI_E_NO_MEMORY: return "out of memory";
    case COLIBRI_E_TOKEN_RANGE: return "token id out of range";
    case COLIBRI_E_SEQ_TOO_LONG: return "sequence longer than max_seq_len";
    case COLIBRI_E_BACKEND: return "backend unavailable or failed";
    case COLIBRI_E_NOT_BUILT: return "feature not built into this binary";
    case COLIBRI_E_NO_TOKENIZER:
        return "the model file has no tokenizer (format version 1?): re-convert it with `invoke "
               "convert --hf-dir <checkpoint> --target <target> --out <file>`";
    case COLIBRI_E_BAD_TOKENIZER: return "the model's tokenizer section is invalid";
    case COLIBRI_E_BUFFER_TOO_SMALL: return "output buffer too small";
    case COLIBRI_E_BAD_LAYER: return "model layer table is invalid";
    case COLIBRI_E_REALTIME: return "the real-time options cannot be applied";
    }
    return "unknown status";
}

const char *colibri_last_error(const colibri_ctx *ctx) { return ctx ? ctx->err : ""; }

void colibri_get_model_info(const colibri_ctx *ctx, colibri_model_info *i) {
    colibri_model_get_info(ctx->model, i);
}

void colibri_model_get_info(const colibri_model *m, colibri_model_info *i) {
    memset(i, 0, sizeof *i);
    i->vocab_size = m->vocab_size;
    i->embed_dim = m->embed_dim;
    i->embed_dim_pad = m->embed_dim_pad;
    i->pad_multiple = m->pad_multiple;
    i->n_layers = m->n_layers;
    i->n_heads = m->n_heads;
    i->n_kv_heads = m->n_kv_heads;
    i->head_dim = m->head_dim;
    i->num_experts = m->num_experts;
    i->top_k = m->top_k;
    i->expert_size = m->expert_size;
    i->shared_expert_size = m->shared_expert_size;
    i->max_seq_len = m->max_seq_len;
    i->routing = m->routing;
    i->dtype = m->dtype;
    i->flags = m->flags;
    i->family = m->family;
    i->bos_token_id = m->bos_token_id;
    i->eos_token_id = m->eos_token_id;
    i->norm_eps = m->norm_eps;
    i->rope_theta = m->rope_theta;
    memcpy(i->name, m->name, sizeof i->name);
    i->file_size = m->file_size;
}

colibri_status colibri_model_layer_info(const colibri_model *m, uint32_t layer,
                                        colibri_layer_info *i) {
    if (!m || !i || layer >= m->n_layers) return COLIBRI_E_INVALID_ARG;
    const colibri_layer *l = &m->layers[layer];
    colibri_cache_need need;
    memset(i, 0, sizeof *i);
    snprintf(i->mixer, sizeof i->mixer, "%s", l->mixer->name);
    snprintf(i->ffn, sizeof i->ffn, "%s", l->ffn->name);
    i->window = l->desc.window;
    l->mixer->cache(m, layer, &need);
    i->kv_positions = need.kv_positions;
    return COLIBRI_OK;
}

void colibri_get_runtime_info(const colibri_ctx *ctx, colibri_runtime_info *i) {
    memset(i, 0, sizeof *i);
    snprintf(i->backend, sizeof i->backend, "%s", ctx->cuda ? "cuda" : "cpu");
    i->threads = ctx->cuda ? 0 : ctx->opt.threads;
    snprintf(i->cpu_simd, sizeof i->cpu_simd, "%s", ctx->simd ? ctx->simd : "scalar");
    snprintf(i->fallback_reason, sizeof i->fallback_reason, "%s", ctx->fallback);
    if (ctx->cuda) {
        colibri_cuda_info ci;
        memset(&ci, 0, sizeof ci);
        colibri_cuda_get_info(ctx->cuda, &ci);
        snprintf(i->cuda_device, sizeof i->cuda_device, "%s", ci.device_name);
        i->cuda_sm = ci.sm;
        i->cuda_driver_version = ci.driver_version;
        i->arena_bytes = ci.device_bytes;
        snprintf(i->cuda_image, sizeof i->cuda_image, "%s", ci.image);
        snprintf(i->cuda_weights, sizeof i->cuda_weights, "%s", ci.weights);
        snprintf(i->cuda_prefill, sizeof i->cuda_prefill, "%s", ci.prefill);
        i->cuda_integrated = ci.integrated;
        i->cuda_device_bytes = ci.device_bytes;
        snprintf(i->kv_dtype, sizeof i->kv_dtype, "%s", ci.kv_f16 ? "f16" : "f32");
        i->kv_cache_bytes = ci.kv_cache_bytes;
        snprintf(i->cuda_libcuda, sizeof i->cuda_libcuda, "%s", ci.libcuda);
        snprintf(i->cuda_weights_why, sizeof i->cuda_weights_why, "%s", ci.weights_why);
        i->cuda_chunk = ci.chunk;
    } else {
        i->arena_bytes = ctx->arena_bytes;
        snprintf(i->kv_dtype, sizeof i->kv_dtype, "%s", ctx->b.kv_f16 ? "f16" : "f32");
        i->kv_cache_bytes = ctx->b.kv_bytes;
        i->state_bytes = ctx->b.state_bytes;
    }
    i->position = ctx->pos;
    size_t n = 0;
    for (int k = 0; k < ctx->opt.n_cpus && n + 6 < sizeof i->cpus; k++)
        n += (size_t)snprintf(i->cpus + n, sizeof i->cpus - n, "%s%d", k ? "," : "", ctx->cpus[k]);
    snprintf(i->sched, sizeof i->sched, "%s", sched_name(ctx->opt.sched));
    i->sched_priority = ctx->opt.sched_priority;
    snprintf(i->barrier, sizeof i->barrier, "%s",
             ctx->opt.barrier == COLIBRI_BARRIER_SPIN ? "spin" : "sleep");
    i->memory_locked = ctx->memory_locked;
    i->locked_bytes = ctx->locked_bytes;
    unsigned long long mn = 0, mj = 0;
    if (ctx->pool_started) colibri_pool_faults(&ctx->pool, &mn, &mj);
    i->minor_faults = mn + ctx->caller_minflt;
    i->major_faults = mj + ctx->caller_majflt;
}

colibri_status colibri_dump_routing(colibri_ctx *ctx, const char *path) {
    if (!ctx || !path) return COLIBRI_E_INVALID_ARG;
#ifndef COLIBRI_DEBUG
    return colibri_ctx_fail(ctx, COLIBRI_E_NOT_BUILT, "routing dump needs a build with -DCOLIBRI_DEBUG");
#else
    if (ctx->cuda)
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED, "routing dump covers the CPU backend only");
    FILE *f = fopen(path, "w");
    if (!f) return colibri_ctx_fail(ctx, COLIBRI_E_IO, "cannot write %s: %s", path, strerror(errno));
    const struct colibri_model *m = ctx->model;
    size_t K = m->top_k, E = m->num_experts, rec = 2 * K + E;
    for (int p = 0; p < ctx->pos; p++)
        for (uint32_t l = 0; l < m->n_layers; l++) {
            const float *d = ctx->b.dump + ((size_t)p * m->n_layers + l) * rec;
            fprintf(f, "{\"call\": %d, \"pos\": %d, \"layer\": %u, \"experts\": [",
                    (int)ctx->b.dump_calls[p], p, l);
            for (size_t i = 0; i < K; i++) fprintf(f, "%s%d", i ? ", " : "", (int)d[i]);
            fprintf(f, "], \"weights\": [");
            for (size_t i = 0; i < K; i++) fprintf(f, "%s%.9g", i ? ", " : "", (double)d[K + i]);
            fprintf(f, "], \"logits\": [");
            for (size_t i = 0; i < E; i++) fprintf(f, "%s%.9g", i ? ", " : "", (double)d[2 * K + i]);
            fprintf(f, "]}\n");
        }
    if (fclose(f) != 0) return colibri_ctx_fail(ctx, COLIBRI_E_IO, "cannot write %s", path);
    return COLIBRI_OK;
#endif
}
