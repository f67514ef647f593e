/* Counters, histograms and their Prometheus text (metrics.h). */
#include "metrics.h"

static const double FIRST_TOKEN_BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double TOKEN_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define N_FT (sizeof FIRST_TOKEN_BUCKETS / sizeof FIRST_TOKEN_BUCKETS[0])
#define N_TOK (sizeof TOKEN_BUCKETS / sizeof TOKEN_BUCKETS[0])

static void hist_add(histogram *h, const double *bounds, size_t n, double v) {
    h->count++;
    h->sum += v;
    for (size_t i = 0; i < n; i++)
        if (v <= bounds[i]) { h->bucket[i]++; break; }
}

void metrics_status(metrics *m, int status) {
    if (status >= 100 && status < 600) m->by_status[status]++;
}

void metrics_first_token(metrics *m, double s) { hist_add(&m->first_token, FIRST_TOKEN_BUCKETS, N_FT, s); }

void metrics_next_token(metrics *m, double s) { hist_add(&m->per_token, TOKEN_BUCKETS, N_TOK, s); }

static void hist_text(json_buf *b, const char *name, const char *help, const histogram *h,
                      const double *bounds, size_t n) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += h->bucket[i];
        jb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], acc);
    }
    jb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->count, name,
              h->sum, name, h->count);
}

static void counter(json_buf *b, const char *name, const char *help, unsigned long long v) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void gauge(json_buf *b, const char *name, const char *help, int v) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v);
}

static void gauge_f(json_buf *b, const char *name, const char *help, double v) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.0f\n", name, help, name, name, v);
}

static void seconds(json_buf *b, const char *name, const char *help, double ms) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %.6f\n", name, help, name, name, ms / 1e3);
}

void metrics_text(json_buf *b, const metrics *m, const metrics_gauges *g) {
    jb_puts(b, "# HELP colibri_requests_total HTTP requests answered, by status code.\n"
               "# TYPE colibri_requests_total counter\n");
    for (int s = 100; s < 600; s++)
        if (m->by_status[s]) jb_printf(b, "colibri_requests_total{code=\"%d\"} %llu\n", s, m->by_status[s]);
    counter(b, "colibri_prompt_tokens_total", "Prompt tokens processed.", m->prompt_tokens);
    counter(b, "colibri_generated_tokens_total", "Tokens generated.", m->generated_tokens);
    counter(b, "colibri_requests_cancelled_total", "Generations stopped because the client left.", m->cancelled);
    counter(b, "colibri_requests_rejected_total", "Requests refused with 503 because the queue was full.",
            m->rejected_queue_full);
    counter(b, "colibri_connections_evicted_total",
            "Connections still sending their request head, closed to make room for a new one.", m->conns_evicted);
    counter(b, "colibri_connections_refused_total", "Connections refused at once for lack of room.",
            m->conns_refused);
    counter(b, "colibri_deadline_requests_total",
            "Answers generated under a deadline (the request's deadline_ms or --deadline-ms).",
            m->deadline_answered);
    counter(b, "colibri_deadline_misses_total",
            "Of them, answers whose last token came after the deadline (queue time included).",
            m->deadline_missed);
    jb_puts(b, "# HELP colibri_page_faults_total Page faults the slots' worker threads took while "
               "generating (prompt and decode); over colibri_generated_tokens_total: per token.\n"
               "# TYPE colibri_page_faults_total counter\n");
    jb_printf(b, "colibri_page_faults_total{type=\"minor\"} %llu\ncolibri_page_faults_total{type=\"major\"} %llu\n",
              m->gen_minor_faults, m->gen_major_faults);
    hist_text(b, "colibri_first_token_seconds", "Time from request to first generated token.",
              &m->first_token, FIRST_TOKEN_BUCKETS, N_FT);
    hist_text(b, "colibri_token_seconds", "Time between consecutive generated tokens.", &m->per_token,
              TOKEN_BUCKETS, N_TOK);
    gauge(b, "colibri_queue_depth", "Requests waiting for a slot.", g->queued);
    gauge(b, "colibri_queue_capacity", "Most requests that may wait.", g->max_queue);
    gauge(b, "colibri_slots_busy", "Slots generating.", g->slots_busy);
    gauge(b, "colibri_slots", "Slots (contexts sharing the model).", g->slots);
    gauge(b, "colibri_draining", "1 after SIGTERM while in-flight requests finish.", g->draining);
    gauge(b, "colibri_connections", "Open client connections.", g->connections);
    gauge(b, "colibri_batching", "1 when one pass per step computes every busy slot's tokens.", g->batching);
    counter(b, "colibri_batch_passes_total", "Steps of the batch loop (one forward pass each).", g->batch_passes);
    counter(b, "colibri_batch_rows_total", "Token rows those passes carried (prompt and generated).",
            g->batch_rows);
    counter(b, "colibri_batch_sequences_total", "Sequences those passes carried (per pass, summed).",
            g->batch_seqs);
    /* where the step loop's time goes (docs/serve.md, "Where a step's time goes") */
    seconds(b, "colibri_batch_busy_seconds_total", "The step loop's time with requests to step.", g->batch_busy_ms);
    seconds(b, "colibri_batch_step_seconds_total", "Of it, inside the steps (passes, sampling, output).", g->batch_step_ms);
    seconds(b, "colibri_batch_pass_seconds_total", "Of the steps, the forward passes.", g->batch_times.pass_ms);
    seconds(b, "colibri_batch_mixer_seconds_total", "Of the passes, the token mixers (attention, deltanet).",
            g->batch_times.mixer_ms);
    seconds(b, "colibri_batch_ffn_seconds_total", "Of the passes, the FFNs (routing, experts).", g->batch_times.ffn_ms);
    seconds(b, "colibri_batch_head_seconds_total", "Of the passes, the final norm and LM head.", g->batch_times.head_ms);
    seconds(b, "colibri_batch_sample_seconds_total", "Of the steps, sampling and the output side.",
            g->batch_times.sample_ms);
    counter(b, "colibri_prefix_cache_hits_total", "Requests whose prompt began with a cached prefix.",
            g->prefix_hits);
    counter(b, "colibri_prefix_cache_misses_total", "Requests that found no cached prefix.", g->prefix_misses);
    counter(b, "colibri_prefix_cache_tokens_saved_total", "Prompt tokens restored instead of computed.",
            g->prefix_tokens_saved);
    counter(b, "colibri_prefix_cache_evictions_total", "Cached prefixes dropped to make room.", g->prefix_evictions);
    gauge(b, "colibri_prefix_cache_entries", "Cached prefixes.", g->prefix_entries);
    gauge(b, "colibri_prefix_cache_readers", "Requests reading a cached prefix in place now.",
          g->prefix_readers);
    gauge_f(b, "colibri_prefix_cache_bytes", "Bytes the cached prefixes take.", g->prefix_bytes);
    gauge_f(b, "colibri_prefix_cache_capacity_bytes", "Most bytes the cache may take (0: off).", g->prefix_capacity);
}
