/* A fixed pool of worker threads created at init. colibri_pool_run(fn) runs fn(arg, t, n) for
 * every worker t in 0..n-1 (the caller is worker 0) and returns when all are done. Work is split
 * by t with fixed partitions, so which thread computes an output never changes its value. */
#ifndef COLIBRI_POOL_H
#define COLIBRI_POOL_H

#include <pthread.h>
#include <stdatomic.h>

typedef void (*colibri_task_fn)(void *arg, int t, int n);

typedef struct colibri_pool colibri_pool;
typedef struct {
    colibri_pool *pool;
    int t;
} colibri_worker;

struct colibri_pool {
    int n;                  /* workers including the caller */
    pthread_t *threads;     /* n - 1 helpers */
    colibri_worker *workers; /* their arguments */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    colibri_task_fn fn;
    void *arg;
    atomic_ulong generation;  /* bumped for each job */
    atomic_int pending;       /* helpers still running the current job */
    atomic_int stop;
    int started;              /* helpers actually created (for cleanup after a partial start) */
};

int colibri_pool_start(colibri_pool *p, int n);
void colibri_pool_run(colibri_pool *p, colibri_task_fn fn, void *arg);
void colibri_pool_stop(colibri_pool *p);

/* [lo, hi) of t's share of `total` items among n workers: contiguous, fixed. */
static inline void colibri_split(unsigned long total, int t, int n, unsigned long *lo,
                                 unsigned long *hi) {
    *lo = total * (unsigned long)t / (unsigned long)n;
    *hi = total * (unsigned long)(t + 1) / (unsigned long)n;
}

#endif
