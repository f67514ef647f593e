/* Thread pool (see pool.h). A job is one generation number, so a worker never runs the same job
 * twice or misses one. Between jobs a worker first spins briefly on the generation (a decode
 * step issues a few dozen short jobs, and a wake-up through the kernel costs tens of
 * microseconds), then sleeps on a condition variable; the caller waits for the helpers the same
 * way. Every sleep re-checks its condition under the mutex, so no wake-up is lost. */
#include "pool.h"

#include <stdlib.h>

#define SPIN_ROUNDS 4000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *worker_main(void *v) {
    colibri_worker *wa = v;
    colibri_pool *p = wa->pool;
    int t = wa->t;
    unsigned long seen = 0, g = 0;
    for (;;) {
        for (int i = 0; i < SPIN_ROUNDS; i++) {
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_acquire)) break;
            cpu_relax();
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->stop) && (g = atomic_load(&p->generation)) == seen)
                pthread_cond_wait(&p->start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        seen = g;
        /* fn and arg were written before the generation was released */
        p->fn(p->arg, t, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int colibri_pool_start(colibri_pool *p, int n) {
    p->n = n < 1 ? 1 : n;
    p->threads = NULL;
    p->workers = NULL;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    p->started = 0;
    p->fn = NULL;
    p->arg = NULL;
    if (pthread_mutex_init(&p->mu, NULL) != 0) return -1;
    if (pthread_cond_init(&p->start, NULL) != 0 || pthread_cond_init(&p->done, NULL) != 0) return -1;
    if (p->n == 1) return 0;
    /* worker arguments live as long as the pool: nothing is allocated or freed once the
     * helpers run (colibri_forward must not allocate, not even in a helper's first wake-up) */
    p->threads = calloc((size_t)p->n - 1, sizeof *p->threads);
    p->workers = calloc((size_t)p->n - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) return -1;
    for (int t = 1; t < p->n; t++) {
        colibri_worker *wa = &p->workers[t - 1];
        wa->pool = p;
        wa->t = t;
        if (pthread_create(&p->threads[t - 1], NULL, worker_main, wa) != 0) return -1;
        p->started++;
    }
    return 0;
}

void colibri_pool_run(colibri_pool *p, colibri_task_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    fn(arg, 0, p->n);

    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void colibri_pool_stop(colibri_pool *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->workers);
    p->threads = NULL;
    p->workers = NULL;
    p->started = 0;
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
}
