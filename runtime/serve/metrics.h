/* The service's counters and histograms, and their Prometheus text (GET /metrics; docs/serve.md,
 * "Metrics"). Plain data: the server guards one `metrics` with its mutex; nothing here locks. */
#ifndef COLIBRI_SERVE_METRICS_H
#define COLIBRI_SERVE_METRICS_H

#include "colibri.h"
#include "json.h"

typedef struct {
    unsigned long long count, bucket[16];
    double sum;
} histogram;

typedef struct {
    unsigned long long by_status[600];
    unsigned long long prompt_tokens, generated_tokens, cancelled, rejected_queue_full;
    unsigned long long conns_evicted;   /* slow connections closed to make room for new ones */
    unsigned long long conns_refused;   /* connections refused at once (no room, even after eviction) */
    unsigned long long deadline_answered; /* answers that had a deadline (the request's or --deadline-ms) */
    unsigned long long deadline_missed;   /* of them, finished after it */
    unsigned long long gen_minor_faults, gen_major_faults; /* the slots' workers, while generating */
    histogram first_token, per_token;
} metrics;

/* The gauges, read under the same locks as the counters they sit next to, and the counters
 * the step loop and the prefix cache keep under their own locks. */
typedef struct {
    int slots, slots_busy, queued, max_queue, draining;
    int connections;                    /* open: reading a head, answering, or in a request */
    int batching;                       /* continuous batching on */
    unsigned long long batch_passes, batch_rows, batch_seqs;
    double batch_busy_ms, batch_step_ms;  /* the step loop's time (batch.h) */
    colibri_step_times batch_times;       /* the engine's split of the steps */
    int prefix_entries, prefix_readers;
    double prefix_bytes, prefix_capacity;
    unsigned long long prefix_hits, prefix_misses, prefix_tokens_saved, prefix_evictions;
} metrics_gauges;

void metrics_status(metrics *m, int status);
void metrics_first_token(metrics *m, double seconds);
void metrics_next_token(metrics *m, double seconds);

/* The Prometheus text format 0.0.4 page for m and g. */
void metrics_text(json_buf *b, const metrics *m, const metrics_gauges *g);

#endif
