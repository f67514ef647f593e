/* Thread pool (see pool.h). A job is one generation number, so a worker never runs the same job
 * twice or misses one. Every sleep re-checks its condition under the mutex, so no wake-up is
 * lost.
 *
 * Between jobs, by default (cfg.spin = 0), a worker first spins briefly on the generation (a
 * decode step issues a few dozen short jobs, and a wake-up through the kernel costs tens of
 * microseconds), then sleeps on a condition variable; the caller waits for the helpers the same
 * way. With cfg.spin a worker never sleeps while passes keep coming: it spins until SPIN_GRACE_NS
 * have passed without a new job (longer than the gap between two tokens of a generation:
 * sampling, a callback), and only then sleeps, so an idle service does not keep a core busy
 * (a busy SCHED_FIFO thread that never sleeps would also be throttled by the kernel's RT
 * bandwidth limit); the caller always spins for the helpers. A spin that has waited longer than
 * SPIN_YIELD_NS (far more than the imbalance of one job between workers that both run) means the
 * other side was preempted: from then each check also calls sched_yield, so on a machine with
 * more runnable threads than cores the spinner hands its core to them (perhaps the preempted
 * worker itself) instead of burning its time slice; on isolated cores with nothing else runnable
 * sched_yield returns at once and the spin goes on.
 *
 * Real-time start-up: each helper pins itself, takes the policy and (lock_stacks) faults in and
 * locks the top of its stack before it reports ready, so colibri_pool_start_ex returns only when
 * every worker is set up, and a failure is an error of init, never a surprise in a pass. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_SET, syscall(SYS_gettid) */
#endif
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SPIN_ROUNDS 4000
#define SPIN_GRACE_NS 5000000L        /* spin mode: sleep after 5 ms without a job */
#define SPIN_YIELD_NS 100000L         /* spin mode: sched_yield at each check after 100 us */
#define STACK_TOUCH (64 * 1024)       /* lock_stacks: bytes of stack faulted in and locked */
/* lock_stacks: a helper's whole stack. A pass needs a few KiB of it (the kernels keep their
 * buffers in the arena); under a process-wide mlockall(MCL_FUTURE) (colibri --mlock) every byte
 * of a stack is locked, so glibc's default (RLIMIT_STACK, 8 MiB) would cost 8 MiB each. */
#define HELPER_STACK (512 * 1024)

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static const char *policy_name(int policy) {
    return policy == SCHED_FIFO ? "SCHED_FIFO" : policy == SCHED_RR ? "SCHED_RR" : "SCHED_OTHER";
}

/* Pin the calling thread to one CPU and give it the policy: 0, or an errno with *what set. */
static int setup_thread(const colibri_pool_config *cfg, int t, const char **what) {
    if (cfg->cpus) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cfg->cpus[t], &set);
        int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
        if (e) {
            *what = "affinity";
            return e;
        }
    }
    if (cfg->policy != SCHED_OTHER) {
        struct sched_param sp = {.sched_priority = cfg->priority};
        int e = pthread_setschedparam(pthread_self(), cfg->policy, &sp);
        if (e) {
            *what = "policy";
            return e;
        }
    }
    return 0;
}

/* The top of this thread's stack, touched and locked: the deepest a pass goes stays resident. */
static __attribute__((noinline)) int touch_stack(void) {
    volatile char buf[STACK_TOUCH];
    memset((char *)buf, 0, sizeof buf);
    return mlock((const void *)buf, sizeof buf) ? errno : 0;
}

static void *worker_main(void *v) {
    colibri_worker *wa = v;
    colibri_pool *p = wa->pool;
    int t = wa->t;
    wa->tid = (pid_t)syscall(SYS_gettid);
    wa->status = setup_thread(&p->cfg, t, &wa->what);
    if (!wa->status && p->cfg.lock_stacks && (wa->status = touch_stack())) wa->what = "mlock";
    pthread_mutex_lock(&p->mu);
    p->ready++;
    pthread_cond_broadcast(&p->done);
    pthread_mutex_unlock(&p->mu);
    unsigned long seen = 0, g = 0;
    for (;;) {
        if (p->cfg.spin) {
            long idle_since = 0;
            for (unsigned i = 1;; i++) {
                g = atomic_load_explicit(&p->generation, memory_order_acquire);
                if (g != seen || atomic_load_explicit(&p->stop, memory_order_acquire)) break;
                cpu_relax();
                if ((i & 1023) == 0) { /* the clock every ~1024 pauses: the grace period */
                    long now = now_ns();
                    if (!idle_since) idle_since = now;
                    else if (now - idle_since > SPIN_GRACE_NS) break;
                    else if (now - idle_since > SPIN_YIELD_NS) sched_yield();
                }
            }
        } else {
            for (int i = 0; i < SPIN_ROUNDS; i++) {
                g = atomic_load_explicit(&p->generation, memory_order_acquire);
                if (g != seen || atomic_load_explicit(&p->stop, memory_order_acquire)) break;
                cpu_relax();
            }
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
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1 && !p->cfg.spin) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Why worker t could not be set up (what: "affinity", "policy" or "mlock"; e: its errno). */
static void setup_error(const colibri_pool *p, int t, const char *what, int e, char *err,
                        size_t len) {
    if (!err || !len) return;
    const char *who = t ? "a worker thread" : "the calling thread (worker 0)";
    if (!strcmp(what, "affinity"))
        snprintf(err, len, "pinning %s to CPU %d: %s (is the CPU online and in this process's "
                 "allowed set, e.g. its unit's CPUAffinity= or cpuset?)", who, p->cfg.cpus[t],
                 strerror(e));
    else if (!strcmp(what, "policy"))
        snprintf(err, len, "%s priority %d for %s: %s (an unprivileged process needs "
                 "RLIMIT_RTPRIO >= %d: ulimit -r, LimitRTPRIO= in a systemd unit; or CAP_SYS_NICE)",
                 policy_name(p->cfg.policy), p->cfg.priority, who, strerror(e), p->cfg.priority);
    else
        snprintf(err, len, "locking the stack of %s: %s (RLIMIT_MEMLOCK too low: ulimit -l, "
                 "LimitMEMLOCK= in a systemd unit)", who, strerror(e));
}

static int fail(colibri_pool *p, char *err, size_t len, const char *msg) {
    if (msg && err && len) snprintf(err, len, "%s", msg);
    colibri_pool_stop(p);
    return -1;
}

int colibri_pool_start_ex(colibri_pool *p, int n, const colibri_pool_config *cfg, char *err,
                          size_t err_len) {
    p->n = n < 1 ? 1 : n;
    p->threads = NULL;
    p->workers = NULL;
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    p->started = 0;
    p->ready = 0;
    p->fn = NULL;
    p->arg = NULL;
    p->caller_set = 0;
    memset(&p->cfg, 0, sizeof p->cfg);
    p->cfg.policy = SCHED_OTHER;
    if (cfg) {
        p->cfg = *cfg;
        if (cfg->cpus) {
            if (p->n > (int)(sizeof p->cpus / sizeof p->cpus[0])) return -1;
            memcpy(p->cpus, cfg->cpus, (size_t)p->n * sizeof *p->cpus);
            p->cfg.cpus = p->cpus;
        }
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) return -1;
    if (pthread_cond_init(&p->start, NULL) != 0 || pthread_cond_init(&p->done, NULL) != 0) return -1;
    if (p->n == 1) return 0;
    /* worker arguments live as long as the pool: nothing is allocated or freed once the
     * helpers run (colibri_forward must not allocate, not even in a helper's first wake-up) */
    p->threads = calloc((size_t)p->n - 1, sizeof *p->threads);
    p->workers = calloc((size_t)p->n - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) return fail(p, err, err_len, "out of memory for the worker threads");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (p->cfg.lock_stacks) pthread_attr_setstacksize(&attr, HELPER_STACK);
    for (int t = 1; t < p->n; t++) {
        colibri_worker *wa = &p->workers[t - 1];
        wa->pool = p;
        wa->t = t;
        int e = pthread_create(&p->threads[t - 1], &attr, worker_main, wa);
        if (e != 0) {
            pthread_attr_destroy(&attr);
            char why[192];
            snprintf(why, sizeof why, "cannot create the worker threads: %s%s", strerror(e),
                     p->cfg.lock_stacks && e == EAGAIN ? " (their locked stacks exceed "
                     "RLIMIT_MEMLOCK? LimitMEMLOCK= in a systemd unit)" : "");
            return fail(p, err, err_len, why);
        }
        p->started++;
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_lock(&p->mu);
    while (p->ready < p->started) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->n; t++) {
        const colibri_worker *wa = &p->workers[t - 1];
        if (wa->status) {
            setup_error(p, t, wa->what, wa->status, err, err_len);
            return fail(p, NULL, 0, NULL);
        }
    }
    return 0;
}

int colibri_pool_start(colibri_pool *p, int n) { return colibri_pool_start_ex(p, n, NULL, NULL, 0); }

int colibri_pool_enter(colibri_pool *p, char *err, size_t err_len) {
    if (!p->cfg.cpus && p->cfg.policy == SCHED_OTHER && !p->cfg.lock_stacks) return 0;
    pthread_t self = pthread_self();
    if (p->caller_set && pthread_equal(self, p->caller)) return 0;
    const char *what = NULL;
    int e = setup_thread(&p->cfg, 0, &what);
    if (!e && p->cfg.lock_stacks && (e = touch_stack())) what = "mlock";
    if (e) {
        setup_error(p, 0, what, e, err, err_len);
        return -1;
    }
    p->caller = self;
    p->caller_set = 1;
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

    if (p->cfg.spin) { /* the helpers' share is as short as the caller's: wait for it awake */
        long since = 0;
        for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
            cpu_relax();
            if ((i & 1023) == 0) { /* a helper still busy after SPIN_YIELD_NS was preempted */
                long now = now_ns();
                if (!since) since = now;
                else if (now - since > SPIN_YIELD_NS) sched_yield();
            }
        }
        return;
    }
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

/* minflt (field 10) and majflt (field 12) of /proc/self/task/TID/stat (proc(5)); the command
 * name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'. */
static void task_faults(pid_t tid, unsigned long long *minor, unsigned long long *major) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    char *s = strrchr(buf, ')');
    if (!s) return;
    unsigned long long v[10] = {0};
    /* after ')': state(3) ppid(4) pgrp(5) session(6) tty(7) tpgid(8) flags(9) minflt(10)
     * cminflt(11) majflt(12) */
    if (sscanf(s + 1, " %*c %*d %*d %*d %*d %*d %*u %llu %llu %llu", &v[0], &v[1], &v[2]) == 3) {
        *minor += v[0];
        *major += v[2];
    }
}

void colibri_pool_faults(const colibri_pool *p, unsigned long long *minor, unsigned long long *major) {
    *minor = *major = 0;
    for (int i = 0; i < p->started; i++) task_faults(p->workers[i].tid, minor, major);
}
