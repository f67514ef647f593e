/* Thread pool (see pool.h). Workers sleep on a condition variable between jobs; a job is one
 * generation number, so a worker never runs the same job twice or misses one. */
#include "pool.h"

#include <stdlib.h>

static void *worker_main(void *v) {
    colibri_worker *wa = v;
    colibri_pool *p = wa->pool;
    int t = wa->t;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        colibri_task_fn fn = p->fn;
        void *arg = p->arg;
        pthread_mutex_unlock(&p->mu);

        fn(arg, t, p->n);

        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

int colibri_pool_start(colibri_pool *p, int n) {
    p->n = n < 1 ? 1 : n;
    p->threads = NULL;
    p->workers = NULL;
    p->generation = 0;
    p->pending = 0;
    p->stop = 0;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);

    fn(arg, 0, p->n);

    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void colibri_pool_stop(colibri_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
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
