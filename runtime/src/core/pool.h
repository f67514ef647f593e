/* A fixed pool of worker threads created at init. colibri_pool_run(fn) runs fn(arg, t, n) for
 * every worker t in 0..n-1 (the caller is worker 0) and returns when all are done. Work is split
 * by t with fixed partitions, so which thread computes an output never changes its value: the
 * real-time options below (pinning, scheduling policy, spinning) change when and where a worker
 * runs, never what it computes. */
#ifndef COLIBRI_POOL_H
#define COLIBRI_POOL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

typedef void (*colibri_task_fn)(void *arg, int t, int n);

/* How the workers run (docs/runtime.md, "Real-time mode"). Zero = as before: unpinned,
 * SCHED_OTHER, a brief spin then sleep between jobs. */
typedef struct {
    const int *cpus;    /* NULL, or n CPUs: worker t runs on cpus[t] only (t = 0: the caller) */
    int policy;         /* SCHED_OTHER, SCHED_FIFO or SCHED_RR (sched.h) */
    int priority;       /* 1..99 with SCHED_FIFO / SCHED_RR, else 0 */
    int spin;           /* 1: busy-wait at the barriers (see pool.c), never sleep inside a pass */
    int lock_stacks;    /* 1: the helpers fault in and mlock the top of their stacks at start */
} colibri_pool_config;

typedef struct colibri_pool colibri_pool;
typedef struct {
    colibri_pool *pool;
    int t;
    pid_t tid;          /* the helper's thread id (page-fault counts, /proc/self/task/TID) */
    int status;         /* its start-up: 0 ok, else an errno */
    const char *what;   /* what failed at start-up ("affinity", "policy", "mlock") */
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
    int ready;                /* helpers past their start-up (under mu) */
    colibri_pool_config cfg;
    int cpus[64];             /* cfg.cpus, owned */
    pthread_t caller;         /* the thread colibri_pool_enter last set up as worker 0 */
    int caller_set;
};

/* Start n - 1 helpers and wait until each has applied cfg (NULL: defaults). -1 on failure with
 * err naming what (the CPU, the policy, the errno text); the pool is stopped then. */
int colibri_pool_start_ex(colibri_pool *p, int n, const colibri_pool_config *cfg, char *err,
                          size_t err_len);
int colibri_pool_start(colibri_pool *p, int n);
/* The calling thread becomes worker 0: pinned to cfg.cpus[0], given the policy and (lock_stacks)
 * the top of its stack locked, once per thread (a later call from the same thread costs one
 * comparison). -1 with err on failure. */
int colibri_pool_enter(colibri_pool *p, char *err, size_t err_len);
void colibri_pool_run(colibri_pool *p, colibri_task_fn fn, void *arg);
void colibri_pool_stop(colibri_pool *p);
/* Minor and major page faults the helpers have taken since they started (their
 * /proc/self/task/TID/stat); 0 when it cannot be read. */
void colibri_pool_faults(const colibri_pool *p, unsigned long long *minor, unsigned long long *major);

/* [lo, hi) of t's share of `total` items among n workers: contiguous, fixed. */
static inline void colibri_split(unsigned long total, int t, int n, unsigned long *lo,
                                 unsigned long *hi) {
    *lo = total * (unsigned long)t / (unsigned long)n;
    *hi = total * (unsigned long)(t + 1) / (unsigned long)n;
}

#endif
